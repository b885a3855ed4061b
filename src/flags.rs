//! Init flags and the error type.

use crate::percpu::Backend;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Flags for [`PercpuRef::with_flags`](crate::PercpuRef::with_flags), as the
/// kernel's `PERCPU_REF_INIT_*` and `PERCPU_REF_ALLOW_REINIT`.
///
/// # Examples
///
/// ```
/// use percpu_ref::InitFlags;
/// let f = InitFlags::INIT_ATOMIC | InitFlags::ALLOW_REINIT;
/// assert!(f.contains(InitFlags::INIT_ATOMIC));
/// assert!(!f.contains(InitFlags::INIT_DEAD));
/// assert_eq!(format!("{f:?}"), "InitFlags(INIT_ATOMIC | ALLOW_REINIT)");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InitFlags(u8);

impl InitFlags {
    /// Start in atomic mode, and stay there (sticky "force atomic") until
    /// [`switch_to_percpu`](crate::PercpuRef::switch_to_percpu). Implies
    /// `ALLOW_REINIT`.
    pub const INIT_ATOMIC: InitFlags = InitFlags(1);
    /// Start killed: atomic mode, dying, count 0, until
    /// [`reinit`](crate::PercpuRef::reinit) or
    /// [`resurrect`](crate::PercpuRef::resurrect). Implies `ALLOW_REINIT`.
    pub const INIT_DEAD: InitFlags = InitFlags(2);
    /// Allow going back to percpu mode after a switch to atomic mode
    /// (needed by `switch_to_percpu`, `reinit` and `resurrect`).
    pub const ALLOW_REINIT: InitFlags = InitFlags(4);

    const NAMES: [(InitFlags, &'static str); 3] = [
        (Self::INIT_ATOMIC, "INIT_ATOMIC"),
        (Self::INIT_DEAD, "INIT_DEAD"),
        (Self::ALLOW_REINIT, "ALLOW_REINIT"),
    ];

    /// No flags: percpu mode, count 1, no reinit.
    #[must_use]
    pub const fn empty() -> InitFlags {
        InitFlags(0)
    }

    /// Whether every flag in `other` is set in `self`.
    #[must_use]
    pub const fn contains(self, other: InitFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    #[must_use]
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl BitOr for InitFlags {
    type Output = InitFlags;
    fn bitor(self, rhs: InitFlags) -> InitFlags {
        InitFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for InitFlags {
    fn bitor_assign(&mut self, rhs: InitFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for InitFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InitFlags(")?;
        let mut first = true;
        for (flag, name) in Self::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("empty")?;
        }
        f.write_str(")")
    }
}

/// Misuse of a [`PercpuRef`](crate::PercpuRef) operation. An operation that
/// returns an error has changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `kill` on a ref that is already dead (the kernel's "called more than
    /// once" warning).
    AlreadyDead {
        /// The operation that was refused.
        op: &'static str,
    },
    /// `switch_to_managed` on a ref that is already managed.
    AlreadyManaged {
        /// The operation that was refused.
        op: &'static str,
    },
    /// `resurrect` on a ref that is not dead.
    NotDead {
        /// The operation that was refused.
        op: &'static str,
    },
    /// `reinit` while the count is not zero.
    NotZero {
        /// The operation that was refused.
        op: &'static str,
        /// The count, or `None` when the ref is in percpu mode (the count is
        /// then spread over the CPUs and certainly not zero).
        count: Option<u64>,
    },
    /// Going back to percpu mode on a ref made without `ALLOW_REINIT`
    /// (`INIT_ATOMIC` and `INIT_DEAD` imply it).
    ReinitNotAllowed {
        /// The operation that was refused.
        op: &'static str,
    },
    /// The requested per-CPU backend cannot run in this process.
    BackendUnavailable(Backend),
    /// Going back to percpu mode on a ref whose count is zero: it was
    /// released, and stays released until [`reinit`](crate::PercpuRef::reinit).
    Released {
        /// The operation that was refused.
        op: &'static str,
    },
    /// The count under- or overflowed earlier (the switch to atomic mode
    /// that found it panicked): the ref stays in atomic mode and never
    /// releases.
    Miscounted {
        /// The operation that was refused.
        op: &'static str,
        /// The counter's raw value, out of the true count's range.
        count: u64,
    },
    /// The kernel refused the grace period a switch to atomic mode needs
    /// (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`, for example
    /// blocked by a seccomp filter): the switch was undone before anything
    /// was counted twice or lost, and the ref is as it was.
    GracePeriodFailed {
        /// The operation that was refused.
        op: &'static str,
        /// The OS error number the kernel returned.
        errno: i32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::AlreadyDead { op } => write!(
                f,
                "percpu_ref::{op}: the ref is already dead (killed twice, or made with INIT_DEAD)"
            ),
            Error::AlreadyManaged { op } => write!(
                f,
                "percpu_ref::{op}: the ref is already managed (the grace-period engine holds \
                 its stand-in reference)"
            ),
            Error::NotDead { op } => write!(
                f,
                "percpu_ref::{op}: the ref is not dead; only a killed ref can be resurrected"
            ),
            Error::NotZero { op, count: Some(c) } => write!(
                f,
                "percpu_ref::{op}: the count is {c}, not zero; reinit needs every reference dropped"
            ),
            Error::NotZero { op, count: None } => write!(
                f,
                "percpu_ref::{op}: the ref is in percpu mode, so its count is not zero; \
                 kill it and drop every reference first"
            ),
            Error::ReinitNotAllowed { op } => write!(
                f,
                "percpu_ref::{op}: the ref was made without ALLOW_REINIT, so it cannot go back \
                 to percpu mode after a switch to atomic mode"
            ),
            Error::Released { op } => write!(
                f,
                "percpu_ref::{op}: the count is zero (the ref was released); \
                 reinit it before going back to percpu mode"
            ),
            Error::Miscounted { op, count } => write!(
                f,
                "percpu_ref::{op}: the count under- or overflowed earlier (counter {count:#x}); \
                 the ref stays atomic and never releases"
            ),
            Error::GracePeriodFailed { op, errno } => write!(
                f,
                "percpu_ref::{op}: the kernel refused the grace period \
                 (membarrier PRIVATE_EXPEDITED_RSEQ: {}); the switch was undone and the ref \
                 is unchanged",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Error::BackendUnavailable(b) => {
                write!(
                    f,
                    "percpu_ref: the {b} backend is not available in this process"
                )
            }
        }
    }
}

impl std::error::Error for Error {}
