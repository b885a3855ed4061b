//! Delay injection (`--cfg percpu_ref_delay`), for `scripts/vm-test` only.
//!
//! The kernel's rseq selftests (`param_test -1 .. -9`) widen each critical
//! section with a spin loop so that preemption, migration and `membarrier`
//! land inside it on most runs instead of almost never. This build does the
//! same to both backends: the rseq section spins after it is armed and
//! again between its bound check and its commit, and the sharded path spins
//! between its room check and its add. A protocol that only holds because
//! its windows are a few instructions wide fails here.
//!
//! The spin count is read once from `PERCPU_REF_DELAY_LOOPS` (default
//! [`DEFAULT_LOOPS`]). Never built by default: it lengthens the fast path.

use crate::sync::unmodeled::{AtomicU64, Ordering::Relaxed};

/// Spins per delay point when `PERCPU_REF_DELAY_LOOPS` is not set.
pub(crate) const DEFAULT_LOOPS: u64 = 100;

/// The spin count, read from the environment on first use.
#[inline(always)]
pub(crate) fn loops() -> u64 {
    static LOOPS: AtomicU64 = AtomicU64::new(u64::MAX);
    let n = LOOPS.load(Relaxed);
    if n != u64::MAX {
        return n;
    }
    let n = std::env::var("PERCPU_REF_DELAY_LOOPS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(DEFAULT_LOOPS)
        .min(u64::MAX - 1);
    LOOPS.store(n, Relaxed);
    n
}

/// One delay point of the sharded path.
#[inline(always)]
pub(crate) fn spin() {
    for _ in 0..loops() {
        std::hint::spin_loop();
    }
}
