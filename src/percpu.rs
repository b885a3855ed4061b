//! Per-CPU counters: the backend interface the protocol is written against,
//! and the choice of backend.
//!
//! # The contract
//!
//! A ref's *mode word* (owned by [`PercpuRef`](crate::PercpuRef)) is in
//! percpu mode exactly when its `MODE_ATOMIC` bit is clear. A backend owns
//! one counter per possible CPU (or per shard) for one ref and offers three
//! operations:
//!
//! - `try_add(mode, delta) -> bool`: add `delta` (wrapping) to the calling
//!   CPU's counter *only if the ref is still in percpu mode*, atomically
//!   with respect to a switch. `false` means nothing was counted and the
//!   caller must take the atomic path.
//! - `seal_and_sum() -> io::Result<u64>`: called by the switcher after
//!   it set `MODE_ATOMIC`. Returns, with the wrapping sum of all counters,
//!   once no further `try_add` can be counted (the grace period). An error
//!   (the rseq backend's `membarrier` refused) means nothing was sealed:
//!   every counter still counts, and the switcher undoes the switch.
//! - `new(atomic)`: counters for a ref starting in percpu mode (all zero),
//!   or in atomic mode (sealed, as `seal_and_sum` leaves them).
//! - `reset()`: zero every counter. Called with the switch
//!   lock held while the mode is atomic and sealed, just before the mode
//!   word is cleared with a release store.
//!
//! The invariant the protocol relies on: every `try_add` that returned
//! `true` is included in exactly one `seal_and_sum`, and every `try_add`
//! that returned `false` changed no counter that a later sum will read.
//!
//! # Backends
//!
//! - [`Backend::Sharded`] (`percpu/sharded.rs`): cache-padded atomic shards
//!   that the switcher *seals*; portable, loom-checkable as is.
//! - [`Backend::Rseq`] (`percpu/rseq.rs`, Linux x86_64): true per-CPU
//!   counting with a restartable sequence on glibc's rseq area, a
//!   `membarrier` grace period (`percpu/rseq_abi.rs`) and counters in a
//!   per-CPU arena (`percpu/arena.rs`, see [`arena_stats`]). Other targets,
//!   aarch64 included for now, use the sharded backend.
//!
//! The backend is chosen once per process ([`backend`]) and can be overridden
//! per ref for comparisons ([`PercpuRef::with_backend`](crate::PercpuRef::with_backend)).

#[cfg(percpu_ref_rseq)]
mod arena;
pub(crate) mod cpus;
#[cfg(loom)]
mod model;
#[cfg(percpu_ref_rseq)]
mod rseq;
#[cfg(percpu_ref_rseq)]
mod rseq_abi;
mod sharded;

use crate::sync::AtomicUsize;
use std::fmt;

#[cfg(percpu_ref_rseq)]
pub use arena::{arena_stats, ArenaStats};
pub use cpus::possible_cpus;
#[cfg(all(percpu_ref_rseq, percpu_ref_callgrind))]
#[doc(hidden)]
pub use rseq_abi::force_fake_area_for_instruction_counting;
#[cfg(percpu_ref_rseq)]
pub use rseq_abi::rseq_aborts;

/// Mode bit: the ref counts in its shared atomic counter.
pub(crate) const MODE_ATOMIC: usize = 1;
/// Mode bit: the ref was killed (always set together with `MODE_ATOMIC`).
pub(crate) const MODE_DEAD: usize = 2;
/// `_many` operations on at least this many references take the atomic
/// path even in percpu mode. Per-CPU deltas therefore stay below 2^16 in
/// magnitude, which bounds how far one operation (or every thread racing
/// at once) can move a counter: the sharded backend's seal test relies on
/// it, and an overflow by a large `n` is caught by the call that makes it.
/// Below the limit the per-CPU path is taken as usual (`get`/`put` test
/// the constant 1 against it, which compiles away).
pub(crate) const PERCPU_N_LIMIT: u64 = 1 << 16;

/// Which per-CPU counter implementation a ref uses.
///
/// # Examples
///
/// ```
/// use percpu_ref::{backend, Backend};
/// // Every process has one default backend; it never changes once chosen.
/// let b = backend();
/// assert!(matches!(b, Backend::Rseq | Backend::Sharded));
/// assert_eq!(b, backend());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Restartable-sequence per-CPU counters with a `membarrier` grace
    /// period: no atomic instruction on the fast path (Linux only).
    Rseq,
    /// Cache-padded atomic shards indexed per thread, sealed by the
    /// switcher: one uncontended `lock xadd` on the fast path. Portable.
    Sharded,
}

impl Backend {
    /// The backend's name as used by `PERCPU_REF_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rseq => "rseq",
            Backend::Sharded => "sharded",
        }
    }

    /// Whether this backend can be used in this process.
    ///
    /// For [`Backend::Rseq`] this is decided once per process: Linux x86_64,
    /// glibc registered its rseq area for this thread (glibc >= 2.35, not
    /// disabled by `GLIBC_TUNABLES=glibc.pthread.rseq=0`, not under
    /// valgrind), and the kernel accepts the `membarrier` RSEQ registration.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::Backend;
    /// assert!(Backend::Sharded.is_available());
    /// if Backend::Rseq.is_available() {
    ///     assert_eq!(percpu_ref::backend(), Backend::Rseq);
    /// }
    /// # // (unless PERCPU_REF_BACKEND=sharded overrides the default)
    /// # let _ = std::env::var("PERCPU_REF_BACKEND");
    /// ```
    pub fn is_available(self) -> bool {
        match self {
            Backend::Sharded => true,
            // Under loom, `Rseq` is the model of the rseq backend.
            #[cfg(loom)]
            Backend::Rseq => true,
            #[cfg(percpu_ref_rseq)]
            Backend::Rseq => rseq_abi::available(),
            #[cfg(not(any(loom, percpu_ref_rseq)))]
            Backend::Rseq => false,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The backend that [`PercpuRef::new`](crate::PercpuRef::new) uses in this
/// process.
///
/// Detected once, at first use: the rseq backend where it is available,
/// else the sharded one. The environment variable `PERCPU_REF_BACKEND`
/// (`rseq` or `sharded`) overrides the choice. Asking for `rseq` where it is
/// unavailable falls back to `sharded`, and any other non-empty value is
/// ignored (the default is used); either prints one warning line on stderr,
/// once per process, naming the variable, its value and the valid values.
/// An empty value is the same as none.
pub fn backend() -> Backend {
    #[cfg(loom)]
    {
        Backend::Sharded
    }
    #[cfg(not(loom))]
    {
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
        // 0 until chosen, then RSEQ or SHARDED. Not a `OnceLock`: a fork
        // while another thread runs the detection would leave the child
        // waiting for it forever. Racing threads each detect; the first
        // choice stored is everyone's.
        const RSEQ: u8 = 1;
        const SHARDED: u8 = 2;
        static CHOSEN: AtomicU8 = AtomicU8::new(0);
        let chosen = match CHOSEN.load(Relaxed) {
            0 => {
                let (backend, warning) = detect_backend();
                let mine = match backend {
                    Backend::Rseq => RSEQ,
                    Backend::Sharded => SHARDED,
                };
                match CHOSEN.compare_exchange(0, mine, Relaxed, Relaxed) {
                    Ok(_) => {
                        // Only the thread whose choice stood says why.
                        if let Some(warning) = warning {
                            use std::io::Write;
                            // Straight to stderr (not captured by test
                            // harnesses); nothing to do if it fails.
                            let _ = writeln!(std::io::stderr(), "{warning}");
                        }
                        mine
                    }
                    Err(first) => first,
                }
            }
            c => c,
        };
        if chosen == RSEQ {
            Backend::Rseq
        } else {
            Backend::Sharded
        }
    }
}

/// The environment variable that overrides the default backend.
#[cfg(not(loom))]
const BACKEND_VAR: &str = "PERCPU_REF_BACKEND";

/// The backend for this process, and the warning to print about
/// `PERCPU_REF_BACKEND` if its value was not honoured.
#[cfg(not(loom))]
fn detect_backend() -> (Backend, Option<String>) {
    let default = if Backend::Rseq.is_available() {
        Backend::Rseq
    } else {
        Backend::Sharded
    };
    let wanted = std::env::var_os(BACKEND_VAR).unwrap_or_default();
    match wanted.to_str() {
        Some("") => (default, None), // unset or empty
        Some("sharded") => (Backend::Sharded, None),
        Some("rseq") if default == Backend::Rseq => (Backend::Rseq, None),
        Some("rseq") => (
            default,
            Some(format!(
                "percpu_ref: warning: {BACKEND_VAR}=rseq, but the rseq backend is not available \
                 in this process (it needs Linux x86_64, glibc >= 2.35 with its rseq \
                 registration enabled, and membarrier RSEQ support); using {default}"
            )),
        ),
        // Anything else, or not UTF-8.
        _ => (
            default,
            Some(format!(
                "percpu_ref: warning: ignoring {BACKEND_VAR}={:?}: valid values are `rseq` and \
                 `sharded`; using the default, {default}",
                wanted
            )),
        ),
    }
}

/// What one `try_add` needs of a ref's counters, as plain pointers.
///
/// A put that is not the last one can still be running when another
/// thread's last put releases the ref and its owner frees it. Nothing is
/// read after the add commits, but a `&Counters` (or `&PercpuRef`) held as
/// a function argument across the add would still be a live borrow of
/// freed memory (undefined behaviour under Stacked and Tree Borrows). So
/// the put path copies these pointers out first and commits through them;
/// the only references it holds across the add are to atomics (the mode
/// word, a shard), whose interior mutability makes that allowed, as for
/// `Arc`'s own counter.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    /// The slot's CPU-0 counter in the per-CPU arena.
    #[cfg(percpu_ref_rseq)]
    Rseq(*mut u8),
    /// This thread's shard.
    Sharded(*const crate::sync::AtomicU64),
    /// The loom model (not run under Miri).
    #[cfg(loom)]
    Model(*const model::ModelCpus),
}

impl Target {
    /// As [`Counters::try_add`].
    ///
    /// # Safety
    ///
    /// The counters this was taken from are alive until the add commits
    /// (the caller holds a reference on the ref).
    #[inline(always)]
    pub(crate) unsafe fn try_add(self, mode: &AtomicUsize, delta: u64) -> bool {
        match self {
            #[cfg(percpu_ref_rseq)]
            Target::Rseq(base) => rseq::try_add_at(base, mode, delta),
            // SAFETY: the caller keeps the shard alive up to the add.
            Target::Sharded(shard) => sharded::try_add_at(unsafe { &*shard }, delta),
            // SAFETY: as above.
            #[cfg(loom)]
            Target::Model(m) => unsafe { &*m }.try_add(mode, delta),
        }
    }
}

/// One ref's per-CPU counters, on whichever backend it was created with.
///
/// An enum rather than a trait object: the match on the fast path is one
/// perfectly predicted branch, and every variant inlines.
pub(crate) enum Counters {
    #[cfg(percpu_ref_rseq)]
    Rseq(rseq::RseqCounters),
    Sharded(sharded::Shards),
    /// Under loom, the model of the rseq backend (`percpu/model.rs`).
    #[cfg(loom)]
    Model(model::ModelCpus),
}

impl Counters {
    /// Counters for one ref, all zero, on `backend` (which must be
    /// available); `atomic` for a ref that starts in atomic mode (its
    /// counters start sealed, as after a switch to atomic mode).
    pub(crate) fn new(backend: Backend, atomic: bool) -> Self {
        match backend {
            Backend::Sharded => Counters::Sharded(sharded::Shards::new(atomic)),
            #[cfg(loom)]
            Backend::Rseq => Counters::Model(model::ModelCpus::new()),
            #[cfg(percpu_ref_rseq)]
            Backend::Rseq if rseq_abi::available() => Counters::Rseq(rseq::RseqCounters::new()),
            #[cfg(not(loom))]
            Backend::Rseq => unreachable!("rseq backend requested but not available"),
        }
    }

    /// The backend these counters live on.
    pub(crate) fn backend(&self) -> Backend {
        match self {
            #[cfg(percpu_ref_rseq)]
            Counters::Rseq(_) => Backend::Rseq,
            Counters::Sharded(_) => Backend::Sharded,
            #[cfg(loom)]
            Counters::Model(_) => Backend::Rseq,
        }
    }

    /// Adds `delta` (wrapping) to this CPU's counter if `mode` is percpu.
    #[inline(always)]
    pub(crate) fn try_add(&self, mode: &AtomicUsize, delta: u64) -> bool {
        // SAFETY: `&self` keeps the counters alive across the add.
        unsafe { self.target().try_add(mode, delta) }
    }

    /// Where this thread's add goes, copied out so that the add itself
    /// holds no reference to the counters (see [`Target`]).
    #[inline(always)]
    pub(crate) fn target(&self) -> Target {
        match self {
            #[cfg(percpu_ref_rseq)]
            Counters::Rseq(r) => Target::Rseq(r.base()),
            Counters::Sharded(s) => Target::Sharded(s.shard()),
            #[cfg(loom)]
            Counters::Model(s) => Target::Model(s),
        }
    }

    /// Waits until no `try_add` can count any more; returns the sum. On an
    /// error nothing was sealed.
    pub(crate) fn seal_and_sum(&self) -> std::io::Result<u64> {
        match self {
            #[cfg(percpu_ref_rseq)]
            Counters::Rseq(r) => r.seal_and_sum(),
            Counters::Sharded(s) => Ok(s.seal_and_sum()),
            #[cfg(loom)]
            Counters::Model(s) => Ok(s.seal_and_sum()),
        }
    }

    /// Zeroes every counter (mode is atomic and sealed, lock held).
    pub(crate) fn reset(&self) {
        match self {
            #[cfg(percpu_ref_rseq)]
            Counters::Rseq(r) => r.reset(),
            Counters::Sharded(s) => s.reset(),
            #[cfg(loom)]
            Counters::Model(s) => s.reset(),
        }
    }

    /// Bytes of per-CPU storage this ref owns (for accounting and docs).
    pub(crate) fn storage_bytes(&self) -> usize {
        match self {
            #[cfg(percpu_ref_rseq)]
            Counters::Rseq(r) => r.storage_bytes(),
            Counters::Sharded(s) => s.storage_bytes(),
            #[cfg(loom)]
            Counters::Model(s) => s.storage_bytes(),
        }
    }
}
