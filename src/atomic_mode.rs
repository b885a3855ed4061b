//! The shared atomic counter a ref uses in atomic mode.
//!
//! While a ref is in percpu mode its atomic counter holds `BIAS + a`, where
//! `a` is whatever was added to it directly (the base ref at init, atomic
//! operations that raced with a switch, `_many` operations too large for
//! the per-CPU path). `BIAS = 2^63` keeps it far from zero, so no put can
//! see zero while per-CPU counts are outstanding. The switch to atomic
//! folds the per-CPU sum in as `sum - BIAS`; from then on the counter holds
//! the true count, and the put that brings it to zero releases the ref.
//!
//! # Ranges
//!
//! A true count is at most [`MAX_COUNT`] (`2^62 - 1`); a switch's temporary
//! reference may take it one higher. The counter's value says what it
//! holds:
//!
//! | value | meaning |
//! |---|---|
//! | `0 ..= 2^62` | the true count (atomic mode, folded), plus a switch's temporary reference |
//! | `2^62 + 1 ..= BIAS + 2^62` | `BIAS + a` with `a` in `(-2^62, 2^62]`: percpu mode or a switch in progress; in atomic mode, a *miscounted* ref (below) |
//!
//! Every operation keeps the counter inside its range and exact even on
//! misuse: an add or a put that would leave it is refused *before* it
//! changes anything (a compare-and-swap loop rather than `fetch_add` /
//! `fetch_sub`), so one bad operation cannot hide the zero crossing of a
//! correct one, and the counter never wraps. A refused add is an overflow
//! (a true count above `MAX_COUNT`, or `a` above it), a refused put an
//! underflow; the caller panics with the count. In percpu mode only `a` is
//! checked, not the true count `a + (per-CPU sum)`: `a` alone passing
//! `MAX_COUNT` means more references than a count can hold, unless per-CPU
//! puts had dropped about 2^62 references that were taken on the atomic
//! counter first (2^46 calls at the least), which no program does.
//!
//! The fold can find the true count out of range only after misuse that
//! the per-CPU counters could not see: more puts than gets (an underflow)
//! or more than [`MAX_COUNT`] references (an overflow, after at least 2^46
//! per-CPU calls). It then *parks* the counter at `BIAS` instead: atomic
//! mode with a biased value marks the ref miscounted. No put can bring a
//! parked counter to zero, so the ref never releases, and nothing can
//! send it back to percpu mode.

use crate::sync::{AtomicU64, Ordering};

/// Added to the atomic counter while per-CPU counters are in use.
// mutant no_bias: the atomic counter holds only what was added to it directly.
pub(crate) const BIAS: u64 = mutant!("no_bias", 1 << 63, 0);
/// The largest `n` accepted by the `_many` operations, and the bound on a
/// true count.
pub(crate) const MAX_COUNT: u64 = (1 << 62) - 1;
/// The largest value of the true range: `MAX_COUNT` plus a switch's
/// temporary reference. Anything above is biased.
const TRUE_MAX: u64 = 1 << 62;
/// The largest biased value an operation may leave (`a = MAX_COUNT`); the
/// temporary reference may add one more.
const BIASED_MAX: u64 = BIAS.wrapping_add(MAX_COUNT);

/// What an add did to the atomic counter.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AddOutcome {
    Added,
    /// `add_unless_zero` found the count at zero; nothing was changed.
    Zero,
    /// The add would take the count above its range; nothing was changed.
    Overflow {
        count: u64,
    },
}

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

/// What the fold found (the value includes the switch's temporary reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fold {
    /// A true count in `1..=MAX_COUNT`.
    Exact,
    /// More references than `MAX_COUNT`: the value read as unsigned.
    Overflow(u64),
    /// More puts than gets: the value read as signed (`<= 0`).
    Underflow(i64),
}

/// `cur + n` (`n <= MAX_COUNT`) if that stays in `cur`'s range.
#[inline]
fn checked_add(cur: u64, n: u64) -> Option<u64> {
    let limit = if cur <= TRUE_MAX {
        MAX_COUNT
    } else {
        BIASED_MAX
    };
    cur.checked_add(n).filter(|&v| v <= limit)
}

/// `cur - n` if that stays in `cur`'s range.
#[inline]
fn checked_sub(cur: u64, n: u64) -> Option<u64> {
    if cur <= TRUE_MAX {
        cur.checked_sub(n)
    } else {
        cur.checked_sub(n).filter(|&v| v > TRUE_MAX)
    }
}

/// What a folded counter value (true count plus the temporary reference)
/// means; see the module docs.
pub(crate) fn classify_fold(v: u64) -> Fold {
    match v {
        1..=TRUE_MAX => Fold::Exact,
        _ if v != 0 && v <= 1 << 63 => Fold::Overflow(v),
        _ => Fold::Underflow(v.cast_signed()),
    }
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
        // ordering-audit: Relaxed: every caller reads a snapshot (queries) or
        // decides under the switch lock and then changes the count by an RMW,
        // which reads its latest value whatever this load's order.
        self.value.load(Ordering::Relaxed)
    }

    /// Takes a switch's temporary reference. Unchecked: the range leaves
    /// room for it (`a` is at most `MAX_COUNT` before, `2^62` after).
    pub(crate) fn add_temp_ref(&self) {
        self.value.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` unless that leaves the range; returns the previous value.
    ///
    /// Release: a revival's new base reference publishes what the reviver
    /// wrote before it (a `Frozen` guard's writes), so that a `tryget` that
    /// takes a reference from it (an acquire CAS) sees them.
    pub(crate) fn add(&self, n: u64) -> Result<u64, AddOutcome> {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            let new = checked_add(cur, n).ok_or(AddOutcome::Overflow { count: cur })?;
            // mutant revive_base_ref_relaxed: the revival publishes nothing.
            let success = mutant!(
                "revive_base_ref_relaxed",
                Ordering::Release,
                Ordering::Relaxed
            );
            match self
                .value
                .compare_exchange_weak(cur, new, success, Ordering::Relaxed)
            {
                Ok(_) => return Ok(cur),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Adds `n` unless the counter is zero or the add leaves the range.
    #[inline]
    pub(crate) fn add_unless_zero(&self, n: u64) -> AddOutcome {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return AddOutcome::Zero;
            }
            let Some(new) = checked_add(cur, n) else {
                return AddOutcome::Overflow { count: cur };
            };
            match self
                .value
                .compare_exchange_weak(cur, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return AddOutcome::Added,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Subtracts `n` unless that would underflow a true (unbiased) count or
    /// leave the biased range.
    #[inline]
    pub(crate) fn sub(&self, n: u64) -> PutOutcome {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            let Some(new) = checked_sub(cur, n) else {
                return PutOutcome::Underflow { count: cur };
            };
            // AcqRel: the put that reaches zero must see every access made
            // under the references put before it (as Arc's drop does).
            // mutant put_many_zero_check_off: "reached zero" when the old
            // value was 1, right only for n == 1.
            let reached_zero = mutant!("put_many_zero_check_off", new == 0, cur == 1);
            match self
                .value
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if reached_zero => return PutOutcome::ReachedZero,
                Ok(_) => return PutOutcome::Alive,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Folds the per-CPU `sum` into a biased counter, in one RMW; says what
    /// the true count (plus the temporary reference) is. A miscounted
    /// counter is parked at `BIAS` instead (see the module docs).
    pub(crate) fn fold_percpu_sum(&self, sum: u64) -> Fold {
        let delta = sum.wrapping_sub(BIAS);
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            let folded = cur.wrapping_add(delta);
            let fold = classify_fold(folded);
            let new = if fold == Fold::Exact { folded } else { BIAS };
            // ordering-audit: Relaxed: the switcher puts its temporary reference
            // (an AcqRel `sub`) after the fold, so the put that reaches zero reads
            // from that release's sequence and sees the per-CPU history the
            // switcher collected (grace period / the seal's acquire) as well.
            match self
                .value
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return fold,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Adds the bias before per-CPU counting resumes, unless the count is
    /// zero (a released ref stays released) or out of the true range (a
    /// broken count stays atomic). Returns the count it found.
    pub(crate) fn add_bias_unless_zero(&self) -> Result<u64, u64> {
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            if cur == 0 || cur > TRUE_MAX {
                return Err(cur);
            }
            // ordering-audit: Relaxed: an RMW continues the release sequence of the
            // revival's `add` (Release), which is what publishes the reviver's
            // writes to a tryget that reads this value or a later one.
            match self.value.compare_exchange_weak(
                cur,
                cur + BIAS,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur),
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(all(test, not(percpu_ref_loom)))]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(checked_add(MAX_COUNT - 1, 1), Some(MAX_COUNT));
        assert_eq!(checked_add(MAX_COUNT, 1), None);
        assert_eq!(checked_add(TRUE_MAX, 1), None);
        assert_eq!(checked_add(BIAS, MAX_COUNT), Some(BIAS + MAX_COUNT));
        assert_eq!(checked_add(BIAS + 1, MAX_COUNT), None);
        assert_eq!(checked_add(u64::MAX, 1), None);
        assert_eq!(checked_sub(0, 1), None);
        assert_eq!(checked_sub(TRUE_MAX, 1), Some(MAX_COUNT));
        assert_eq!(checked_sub(TRUE_MAX + 1, 1), None);
        assert_eq!(checked_sub(BIAS, MAX_COUNT), Some(BIAS - MAX_COUNT));
        assert_eq!(checked_sub(BIAS, 1 << 62), None);
        assert_eq!(classify_fold(1), Fold::Exact);
        assert_eq!(classify_fold(TRUE_MAX), Fold::Exact);
        assert_eq!(classify_fold(TRUE_MAX + 1), Fold::Overflow(TRUE_MAX + 1));
        assert_eq!(classify_fold(1 << 63), Fold::Overflow(1 << 63));
        assert_eq!(classify_fold(0), Fold::Underflow(0));
        assert_eq!(classify_fold(u64::MAX), Fold::Underflow(-1));
    }

    #[test]
    fn a_miscounted_fold_parks_the_counter() {
        let c = AtomicCount::new(BIAS + 1);
        // Two per-CPU puts, no gets: the true count is -1.
        assert_eq!(c.fold_percpu_sum(0u64.wrapping_sub(2)), Fold::Underflow(-1));
        assert_eq!(c.load(), BIAS, "parked");
        assert_eq!(c.sub(1), PutOutcome::Alive, "never reaches zero");
        // The temporary reference on the counter, MAX_COUNT per CPU.
        let c = AtomicCount::new(BIAS + 1);
        assert_eq!(c.fold_percpu_sum(MAX_COUNT), Fold::Exact, "MAX + temp");
        assert_eq!(c.load(), TRUE_MAX);
        assert_eq!(
            c.add_unless_zero(1),
            AddOutcome::Overflow { count: TRUE_MAX }
        );
        assert_eq!(c.sub(1), PutOutcome::Alive);
        assert_eq!(c.load(), MAX_COUNT);
    }

    #[test]
    fn refused_operations_change_nothing() {
        let c = AtomicCount::new(MAX_COUNT);
        assert_eq!(
            c.add_unless_zero(1),
            AddOutcome::Overflow { count: MAX_COUNT }
        );
        assert_eq!(c.add(1), Err(AddOutcome::Overflow { count: MAX_COUNT }));
        assert_eq!(c.load(), MAX_COUNT);
        let z = AtomicCount::new(0);
        assert_eq!(z.add_unless_zero(1), AddOutcome::Zero);
        assert_eq!(z.sub(1), PutOutcome::Underflow { count: 0 });
        assert_eq!(z.add_bias_unless_zero(), Err(0));
        assert_eq!(z.load(), 0);
    }
}
