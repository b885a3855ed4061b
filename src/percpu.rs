//! Per-CPU counters: the backend interface the protocol is written against,
//! and the choice of backend.
//!
//! # The contract
//!
//! A ref's *mode word* is written by [`PercpuRef`](crate::PercpuRef)
//! (under its switch lock), but its layout, the `MODE_*` constants, is
//! defined here: the backends' fast path reads it. It is in
//! percpu mode exactly when its `MODE_ATOMIC` bit is clear; in percpu mode
//! its low half is the backend's `Counters::percpu_mode` (the rseq
//! section's CPU bound, `MODE_LIMIT`), in atomic mode it is 0. A backend
//! owns one counter per possible CPU (or per shard) for one ref. The
//! protocol uses `Counters` (`percpu/counters.rs`, which dispatches to the
//! ref's backend) through these methods, and one function:
//!
//! - `Counters::new(backend, atomic)`: counters for a ref starting in
//!   percpu mode (all zero), or in atomic mode (sealed, as
//!   `sum_after_grace_period` leaves them).
//! - `try_add(mode, delta) -> bool`: add `delta` (wrapping) to the calling
//!   CPU's counter *only if the ref is still in percpu mode*, atomically
//!   with respect to a switch. `false` means nothing was counted and the
//!   caller must take the atomic path.
//! - `needs_grace_period()`: whether a switcher must wait for the
//!   process-wide grace period (`grace_period`) between its `MODE_ATOMIC`
//!   store and the sum (rseq: the `membarrier`). The grace-period engine
//!   runs it, shared by many switches; an error (the `membarrier` refused) means nothing
//!   was sealed: every counter still counts, and the switcher undoes the
//!   switch. The sharded backend needs none: it seals each ref by itself.
//! - `sum_after_grace_period() -> u64`: the wrapping sum of all counters,
//!   once no further `try_add` can be counted (the sharded backend seals
//!   its shards here).
//! - `reset()`: zero every counter. Called with the switch lock held while
//!   the mode is atomic and sealed, just before the mode word is cleared
//!   with a release store.
//! - `percpu_mode()`: the mode word's low half in percpu mode.
//!
//! The invariant the protocol relies on: every `try_add` that returned
//! `true` is included in exactly one `seal_and_sum`, and every `try_add`
//! that returned `false` changed no counter that a later sum will read.
//!
//! # Backends
//!
//! - [`Backend::Sharded`] (`percpu/sharded.rs`): atomic shards, one per
//!   possible CPU in the per-CPU arena, that the switcher *seals*;
//!   portable, and its protocol is what loom checks (under loom the shards
//!   are a boxed slice of loom atomics instead of arena memory).
//! - [`Backend::Rseq`] (`percpu/rseq.rs`, Linux on `x86_64`, and on
//!   `aarch64` with LSE atomics): true per-CPU counting with a restartable
//!   sequence on glibc's rseq area, a `membarrier` grace period
//!   (`percpu/rseq/abi.rs`) and counters in the per-CPU arena
//!   (`percpu/arena.rs`, see [`arena_stats`]). Other targets use the
//!   sharded backend.
//!
//! The backend is chosen once per process ([`backend`]) and can be overridden
//! per ref for comparisons ([`PercpuRef::with_backend`](crate::PercpuRef::with_backend)).

#[cfg(not(percpu_ref_loom))]
mod arena;
mod counters;
pub(crate) mod cpus;
#[cfg(all(percpu_ref_delay, not(percpu_ref_loom)))]
mod delay;
#[cfg(percpu_ref_loom)]
mod model;
#[cfg(percpu_ref_rseq)]
mod rseq;
mod sharded;
#[cfg(not(percpu_ref_loom))]
mod thread_id;

use std::fmt;

#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
pub(crate) use arena::{
    child_after_fork as arena_child_after_fork, parent_after_fork as arena_parent_after_fork,
    prepare_fork as arena_prepare_fork,
};
pub(crate) use counters::Counters;
pub use cpus::possible_cpus;
#[cfg(all(percpu_ref_rseq, percpu_ref_callgrind))]
#[doc(hidden)]
pub use rseq::abi::force_fake_area_for_instruction_counting;

/// Accounting of the per-CPU arena that holds every ref's counters.
///
/// Every ref owns one slot: 8 bytes in each possible CPU's region (the rseq
/// backend's per-CPU counters, or the sharded backend's shards). See
/// [`arena_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArenaStats {
    /// Slots owned by live refs.
    pub live_slots: usize,
    /// Slots released by dropped refs and waiting to be reused.
    pub free_slots: usize,
    /// Slots not handed out yet in the allocated chunks.
    pub unused_slots: usize,
    /// Chunks allocated (never freed).
    pub chunks: usize,
    /// Bytes of all chunks (`chunks * possible_cpus * REGION`).
    pub reserved_bytes: usize,
    /// Bytes one slot costs: 8 per possible CPU (the number of regions in a
    /// chunk).
    pub bytes_per_slot: usize,
}

/// The per-CPU arena's accounting, for the whole process.
///
/// Both backends keep their counters in the arena: every ref owns one
/// slot, 8 bytes per possible CPU. The slot counts are zero until a ref is
/// made. (Only under loom, which models its own counters, is every field
/// 0.)
///
/// # Examples
///
/// ```
/// use percpu_ref::{percpu::arena_stats, Backend, InitFlags, PercpuRef};
/// let s = arena_stats();
/// assert_eq!(s.bytes_per_slot, 8 * percpu_ref::possible_cpus());
/// let r = PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Sharded).unwrap();
/// assert_eq!(r.percpu_bytes(), s.bytes_per_slot);
/// assert!(arena_stats().live_slots >= 1);
/// ```
#[must_use]
pub fn arena_stats() -> ArenaStats {
    #[cfg(not(percpu_ref_loom))]
    {
        arena::stats()
    }
    #[cfg(percpu_ref_loom)]
    {
        ArenaStats::default()
    }
}

/// How many rseq fast-path attempts the kernel aborted (preemption,
/// migration, signal delivery, or a grace period) and that were retried,
/// since the process started.
///
/// A diagnostic: it shows that the restart path is exercised. Always 0 on
/// the sharded backend, and on targets where the rseq backend is not built.
///
/// # Examples
///
/// ```
/// let before = percpu_ref::percpu::rseq_aborts();
/// // ... per-CPU traffic ...
/// assert!(percpu_ref::percpu::rseq_aborts() >= before);
/// ```
#[must_use]
pub fn rseq_aborts() -> u64 {
    #[cfg(percpu_ref_rseq)]
    {
        rseq::abi::aborts()
    }
    #[cfg(not(percpu_ref_rseq))]
    {
        0
    }
}

/// How many grace periods (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`
/// system calls, each an interrupt to every CPU that runs a thread of this
/// process) the rseq backend has issued since the process started.
///
/// Every switch to atomic mode on the rseq backend needs one, but they are
/// shared: one grace period completes every deferred switch of a batch
/// ([`PercpuRef::kill`](crate::PercpuRef::kill)) and
/// every synchronous switch waiting for it (see the `grace` module docs).
/// A diagnostic for benchmarks and tests; always 0 where the rseq backend
/// is not built or not used.
///
/// # Examples
///
/// ```
/// use percpu_ref::{percpu::grace_periods, Backend, InitFlags, PercpuRef};
/// let before = grace_periods();
/// let r = PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Sharded).unwrap();
/// r.kill_sync().unwrap(); // the sharded backend seals the ref itself
/// assert_eq!(grace_periods(), before);
/// ```
#[must_use]
pub fn grace_periods() -> u64 {
    #[cfg(percpu_ref_rseq)]
    {
        rseq::abi::grace_periods()
    }
    #[cfg(not(percpu_ref_rseq))]
    {
        0
    }
}

/// Which id of the calling thread picks its counter in the rseq backend's
/// per-CPU arena (see [`index`]).
///
/// # Examples
///
/// ```
/// use percpu_ref::percpu::Index;
/// assert_eq!(Index::MmCid.name(), "mm_cid");
/// assert_eq!(Index::CpuId.to_string(), "cpu_id");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Index {
    /// The CPU the thread runs on (`rseq->cpu_id`), as the kernel's
    /// `percpu_ref`: a ref's memory grows with every CPU that any thread
    /// using it ever ran on, up to 8 bytes per possible CPU.
    CpuId,
    /// The thread's concurrency id (`rseq->mm_cid`, Linux 6.3 and later):
    /// unique among the process's threads running at one moment and below
    /// their number, so a ref's memory grows with the threads that use it
    /// at once, not with the CPUs they pass through.
    MmCid,
}

impl Index {
    /// The name `PERCPU_REF_INDEX` takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Index::CpuId => "cpu_id",
            Index::MmCid => "mm_cid",
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The id that indexes the rseq backend's counters in this process, or
/// `None` where that backend is not available.
///
/// Decided once, with the backend's availability: [`Index::MmCid`] where
/// the kernel writes `mm_cid` into the rseq area (its
/// `AT_RSEQ_FEATURE_SIZE` is at least 28: Linux 6.3 and later), else
/// [`Index::CpuId`]. The environment variable `PERCPU_REF_INDEX=cpu_id`
/// forces `cpu_id` (for comparisons); `mm_cid` where the kernel lacks it,
/// or any other non-empty value, prints one warning line on stderr and is
/// not honoured.
///
/// Both are exact (a counter is written only by the one running thread
/// that holds its id, and a grace period aborts every section in flight)
/// and run the same instructions: only the offset the section reads the
/// id from differs.
///
/// # Examples
///
/// ```
/// use percpu_ref::{percpu::index, Backend};
/// assert_eq!(index().is_some(), Backend::Rseq.is_available());
/// ```
#[must_use]
pub fn index() -> Option<Index> {
    #[cfg(percpu_ref_rseq)]
    if rseq::abi::available() {
        return Some(if rseq::abi::by_mm_cid() {
            Index::MmCid
        } else {
            Index::CpuId
        });
    }
    None
}

/// The calling thread's id under [`index`] at this moment (its `mm_cid` or
/// its CPU), or `None` where the rseq backend is not available. A
/// diagnostic (the `footprint` program counts the distinct ids its
/// threads had): the kernel may change it as soon as it is read.
///
/// # Examples
///
/// ```
/// use percpu_ref::percpu::{current_index, index};
/// assert_eq!(current_index().is_some(), index().is_some());
/// ```
#[must_use]
pub fn current_index() -> Option<u32> {
    #[cfg(percpu_ref_rseq)]
    {
        rseq::abi::current_index()
    }
    #[cfg(not(percpu_ref_rseq))]
    {
        None
    }
}

/// The process-wide grace period of the backends that need one: on return,
/// every rseq section of every ref that read a percpu mode before this call
/// started has committed (and is visible here) or will restart and see the
/// new mode. Nothing on the sharded backend.
///
/// # Errors
///
/// The kernel refused the `membarrier`: nothing was waited for.
#[cfg_attr(
    not(percpu_ref_rseq),
    allow(
        clippy::unnecessary_wraps,
        reason = "only the rseq backend's grace period (membarrier) can fail"
    )
)]
pub(crate) fn grace_period() -> std::io::Result<()> {
    #[cfg(percpu_ref_loom)]
    model::grace_period();
    #[cfg(percpu_ref_rseq)]
    rseq::abi::grace_period()?;
    Ok(())
}

/// Where the mode word's flags start: above the CPU bound ([`MODE_LIMIT`])
/// where the rseq backend is built, at bit 0 elsewhere.
const FLAG_SHIFT: u32 = if cfg!(percpu_ref_rseq) { 32 } else { 0 };
/// Mode bit: the ref counts in its shared atomic counter.
pub(crate) const MODE_ATOMIC: usize = 1 << FLAG_SHIFT;
/// Mode bit: the ref was killed (always set together with `MODE_ATOMIC`).
pub(crate) const MODE_DEAD: usize = 2 << FLAG_SHIFT;
/// Mode bit: a deferred switch to atomic mode of this ref is queued or being
/// completed by the grace-period engine. Set with `MODE_ATOMIC` under the
/// switch lock; cleared without it by the ref's deferred completion, as
/// the engine's last access to the ref. While it is set, no other switch may start and
/// `Drop` waits.
pub(crate) const MODE_PENDING: usize = 4 << FLAG_SHIFT;
/// Mode bit: the ref is managed (`percpu_ref/managed.rs`): the
/// grace-period engine holds a stand-in reference and releases the ref
/// once its count is down to that stand-in.
pub(crate) const MODE_MANAGED: usize = 8 << FLAG_SHIFT;
/// Mode bit, only with `MODE_MANAGED` in percpu mode: the engine cleared
/// the ref's mark and no put has marked it since. The CPU bound is 0
/// meanwhile, so the first put after the clear misses the per-CPU path,
/// marks the ref (clears this bit, restores the bound) and tries again.
pub(crate) const MODE_UNMARKED: usize = 16 << FLAG_SHIFT;
/// Mode bit, only with `MODE_MANAGED`: a put counted on the atomic counter
/// of this managed ref in percpu mode (its thread had no per-CPU counter,
/// or `n` was large), which no mark can follow; the engine scans the ref
/// every round until it is released.
pub(crate) const MODE_POLLED: usize = 32 << FLAG_SHIFT;
/// The low half of the mode word (rseq builds only): the rseq section's
/// CPU bound. It holds the arena's CPU count while a ref on the rseq
/// backend is in percpu mode and 0 otherwise (atomic mode, or another
/// backend), so that the section tests the mode and the `cpu_id` bound in
/// one unsigned compare, `cpu_id < limit`: one load and one branch that
/// reject atomic mode, a CPU without a counter in the arena, an
/// unregistered thread (negative `cpu_id`) and every other backend.
pub(crate) const MODE_LIMIT: usize = (1 << FLAG_SHIFT) - 1;
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
    /// period (Linux on `x86_64`, and on `aarch64` with LSE atomics): one
    /// `add` to this CPU's counter on `x86_64`, no atomic instruction; one
    /// `stadd` on `aarch64`.
    Rseq,
    /// Atomic shards, one per possible CPU in the per-CPU arena, indexed
    /// per thread and sealed by the switcher: one uncontended `lock xadd`
    /// on the fast path. Portable.
    Sharded,
}

impl Backend {
    /// The backend's name as used by `PERCPU_REF_BACKEND`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rseq => "rseq",
            Backend::Sharded => "sharded",
        }
    }

    /// Whether this backend can be used in this process.
    ///
    /// For [`Backend::Rseq`] this is decided once per process: Linux on
    /// `x86_64`, or on `aarch64` with the LSE atomics (ARMv8.1: every
    /// Neoverse core; not Cortex-A72 / Graviton 1), glibc registered its
    /// rseq area for this thread (glibc >= 2.35, not disabled by
    /// `GLIBC_TUNABLES=glibc.pthread.rseq=0`, not under valgrind), and the
    /// kernel accepts the `membarrier` RSEQ registration.
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
    #[must_use]
    pub fn is_available(self) -> bool {
        match self {
            Backend::Sharded => true,
            // Under loom, `Rseq` is the model of the rseq backend.
            #[cfg(percpu_ref_loom)]
            Backend::Rseq => true,
            #[cfg(percpu_ref_rseq)]
            Backend::Rseq => rseq::abi::available(),
            #[cfg(not(any(percpu_ref_loom, percpu_ref_rseq)))]
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
/// An empty value is the same as none. Beside it, `PERCPU_REF_INDEX=cpu_id`
/// makes the rseq backend index its counters by CPU rather than by
/// `mm_cid` ([`index`]).
#[must_use]
#[inline]
pub fn backend() -> Backend {
    #[cfg(percpu_ref_loom)]
    {
        Backend::Sharded
    }
    #[cfg(not(percpu_ref_loom))]
    {
        // Inlined: `PercpuRef::new` asks on every creation, and once
        // chosen this is one load and one compare.
        let chosen = match CHOSEN.load(crate::sync::unmodeled::Ordering::Relaxed) {
            0 => choose_backend(),
            c => c,
        };
        if chosen == RSEQ {
            Backend::Rseq
        } else {
            Backend::Sharded
        }
    }
}

/// [`backend`]'s choice: 0 until made, then [`RSEQ`] or [`SHARDED`]. Not a
/// `OnceLock`: a fork while another thread runs the detection would leave
/// the child waiting for it forever. Racing threads each detect; the first
/// choice stored is everyone's.
#[cfg(not(percpu_ref_loom))]
static CHOSEN: crate::sync::unmodeled::AtomicU8 = crate::sync::unmodeled::AtomicU8::new(0);
#[cfg(not(percpu_ref_loom))]
const RSEQ: u8 = 1;
#[cfg(not(percpu_ref_loom))]
const SHARDED: u8 = 2;

/// The first [`backend`]: detects, stores the choice unless a racing
/// thread stored first, and prints the warning of the choice that stood.
#[cfg(not(percpu_ref_loom))]
#[cold]
#[inline(never)]
fn choose_backend() -> u8 {
    use crate::sync::unmodeled::Ordering::Relaxed;
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
                // Straight to stderr (not captured by test harnesses);
                // nothing to do if it fails.
                let _ = writeln!(std::io::stderr(), "{warning}");
            }
            mine
        }
        Err(first) => first,
    }
}

/// The environment variable that overrides the default backend.
#[cfg(not(percpu_ref_loom))]
const BACKEND_VAR: &str = "PERCPU_REF_BACKEND";

/// The backend for this process, and the warning to print about
/// `PERCPU_REF_BACKEND` if its value was not honoured.
#[cfg(not(percpu_ref_loom))]
#[allow(
    clippy::unnecessary_debug_formatting,
    reason = "the value is quoted and escaped on purpose: a stray space or a non-UTF-8 byte shows"
)]
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
                 in this process (it needs Linux on x86_64, or on aarch64 with LSE atomics, \
                 glibc >= 2.35 with its rseq registration enabled, and membarrier RSEQ \
                 support); using {default}"
            )),
        ),
        // Anything else, or not UTF-8.
        _ => (
            default,
            Some(format!(
                "percpu_ref: warning: ignoring {BACKEND_VAR}={wanted:?}: valid values are `rseq` \
                 and `sharded`; using the default, {default}"
            )),
        ),
    }
}

/// Runs the unit test `test` (its path, as `cargo test --exact` takes it)
/// alone in a child process of this test binary, for tests of process-wide
/// state (thread ids, the arena's pool) that other tests' threads would
/// change meanwhile. True in that child, which runs the test's body; false
/// in the parent, once the child passed (it panics with the child's
/// output if not).
#[cfg(all(test, not(percpu_ref_loom)))]
fn alone_in_child(test: &str) -> bool {
    const VAR: &str = "PERCPU_REF_TEST_CHILD";
    if std::env::var_os(VAR).is_some_and(|v| v == test) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(VAR, test)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} failed in its child process:\n{text}"
    );
    false
}
