//! The shared atomic counter a ref uses in atomic mode.
//!
//! While a ref is in percpu mode its atomic counter holds `BIAS + a`, where
//! `a` is whatever was added to it directly (the base ref at init, atomic
//! operations that raced with a switch). `BIAS = 2^63` keeps it far from
//! zero, so no put can see zero while per-CPU counts are outstanding. The
//! switch to atomic folds the per-CPU sum in as `sum - BIAS`; from then on
//! the counter holds the true count, and the put that brings it to zero
//! releases the ref.
//!
//! A true count is always below `2^62`, so a counter value `>= 2^62` can
//! only mean "biased" (percpu mode, or a switch in progress) or, after the
//! fold, a count that went negative: an underflow, which is reported, never
//! released on.
//!
//! Every operation here keeps the counter exact even on misuse: a put that
//! would take a true count below zero is refused *before* it changes
//! anything (a compare-and-swap loop rather than `fetch_sub`), so one bad
//! put cannot hide the zero crossing of a correct one.

use crate::sync::{AtomicU64, Ordering};

/// Added to the atomic counter while per-CPU counters are in use.
#[cfg(not(percpu_ref_mutant = "no_bias"))]
pub(crate) const BIAS: u64 = 1 << 63;
// mutant no_bias: the atomic counter holds only what was added to it directly.
#[cfg(percpu_ref_mutant = "no_bias")]
pub(crate) const BIAS: u64 = 0;
/// The largest `n` accepted by the `_many` operations, and the bound on a
/// true count.
pub(crate) const MAX_COUNT: u64 = (1 << 62) - 1;

/// What a put did to the atomic counter.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    /// The count is still above zero.
    Alive,
    /// This put took the count to zero: the caller must release.
    ReachedZero,
    /// The put would take the count below zero; nothing was changed.
    Underflow { count: u64 },
}

pub(crate) struct AtomicCount {
    value: AtomicU64,
}

impl AtomicCount {
    pub(crate) fn new(v: u64) -> Self {
        AtomicCount {
            value: AtomicU64::new(v),
        }
    }

    pub(crate) fn load(&self) -> u64 {
        self.value.load(Ordering::Acquire)
    }

    /// Adds `n`; returns the previous value.
    #[inline]
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.value.fetch_add(n, Ordering::Relaxed)
    }

    /// Adds `n` unless the counter is zero; true when it added.
    #[inline]
    pub(crate) fn add_unless_zero(&self, n: u64) -> bool {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return false;
            }
            match self.value.compare_exchange_weak(
                cur,
                cur.wrapping_add(n),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Subtracts `n` unless that would underflow a true (unbiased) count.
    #[inline]
    pub(crate) fn sub(&self, n: u64) -> PutOutcome {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            if cur < n {
                return PutOutcome::Underflow { count: cur };
            }
            // AcqRel: the put that reaches zero must see every access made
            // under the references put before it (as Arc's drop does).
            match self.value.compare_exchange_weak(
                cur,
                cur - n,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) if cur == n => return PutOutcome::ReachedZero,
                Ok(_) => return PutOutcome::Alive,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Folds the per-CPU `sum` into a biased counter; returns the new value
    /// read as a signed true count (negative means an underflow).
    pub(crate) fn fold_percpu_sum(&self, sum: u64) -> i64 {
        let delta = sum.wrapping_sub(BIAS);
        self.value
            .fetch_add(delta, Ordering::AcqRel)
            .wrapping_add(delta) as i64
    }

    /// Adds the bias before per-CPU counting resumes.
    pub(crate) fn add_bias(&self) {
        self.value.fetch_add(BIAS, Ordering::Relaxed);
    }
}
