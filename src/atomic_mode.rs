//! The shared atomic counter a ref uses in atomic mode: one unconditional
//! read-modify-write per get and put, as the kernel's `rcuref_t`, and a
//! compare-and-swap per tryget.
//!
//! While a ref is in percpu mode its atomic counter holds `BIAS + a`, where
//! `a` is whatever was added to it directly (the base ref at init, atomic
//! operations that raced with a switch, `_many` operations too large for
//! the per-CPU path). `BIAS = 2^63` keeps it far from zero, so no put can
//! see zero while per-CPU counts are outstanding. The switch to atomic
//! folds the per-CPU sum in as `sum - BIAS`; from then on the counter holds
//! the true count, and the put that brings it to zero releases the ref.
//!
//! # One add, and the zone it lands in
//!
//! A get or put of `n < 2^16` references (every `get` and `put`, and the
//! small `_many` calls) is one `fetch_add` or `fetch_sub` with no test
//! before it: no compare-and-swap loop, so no retry under contention. A
//! tryget compares first (below, *Why tryget compares*). The value it returns says where the
//! operation landed, because the counter's range is split into zones wide
//! enough that no sequence of such operations can cross from one zone into
//! another unnoticed:
//!
//! | zone | values | what it holds |
//! |---|---|---|
//! | zero | `0` | a put just took the true count to zero; the release is being elected |
//! | live | `1 ..= 2^62` | the true count, plus a switch's temporary reference |
//! | saturated | `2^62 + 1 ..= 2^62 + 2^60` | a true count pushed past [`MAX_COUNT`] (being parked) |
//! | biased | `2^62 + 2^60 + 1 ..= 3·2^62 + 2^60` | `BIAS + a`: percpu mode, a switch before its fold, or a parked counter |
//! | released | `3·2^62 + 2^60 + 1 ..= 2^64 - 1` | [`RELEASED`] (`0xE000…`), give or take operations in flight; a true count below zero |
//!
//! Only a landing outside the zone the caller expects takes the slow path
//! (out of line), which repairs it:
//!
//! - **get** lands in live (the common case: one compare) or biased (a
//!   switch in progress, or parked): counted. From released (misuse: a get
//!   needs a reference held): not counted; it *gives its `n` back* (a
//!   `fetch_sub`), so a dead ref never drifts and no one sees a live
//!   count. Past `MAX_COUNT`: an overflow, and the counter is *parked* in
//!   the biased zone, so saturation is sticky.
//! - **tryget** is a compare-and-swap from a live or biased value: it never
//!   writes to zero or released (fails there, writing nothing) and is
//!   refused before it writes past `MAX_COUNT`.
//! - **put** lands in live or biased: done. On zero: it elects the release
//!   with one compare-and-swap from `0` to [`RELEASED`]; the winner runs
//!   `release`, a loser was overtaken by a reviving tryget. Below zero
//!   (into released): an underflow; the put gives its `n` back and panics.
//! - `_many` calls with `n >= 2^16` keep the checked compare-and-swap loop:
//!   they are refused before they change anything (an overflow or underflow
//!   leaves the count as it was), and a put that empties the counter moves
//!   it straight to `RELEASED`.
//!
//! # Why tryget compares
//!
//! The kernel's `rcuref_get` is one add too, and a get that lands on zero
//! (the final put landed, its election not yet run) revives the object.
//! That is safe there because the object is freed after an RCU grace
//! period, which waits for the put's election (`rcuref_put` runs with
//! preemption disabled). Here the layers free memory as soon as the
//! release has run (`owned`, `shared`): a tryget that revived the count
//! could put again, win the election, release, and have its `Weak` free
//! the block, all before the first put's election, which then wrote to
//! freed memory (loom found it: `owned_tryget_vs_last_put_after_kill` in
//! `loom_tests/engine.rs`). So a tryget is a compare-and-swap that fails
//! on zero, as the kernel's `percpu_ref_tryget` (`atomic_long_inc_not_zero`),
//! and the final put's election is its last access. Gets and puts stay one
//! add: a get needs a reference held, so it never meets zero.
//!
//! # Invariants
//!
//! 1. **Excursions are small and temporary.** Call an unconditional
//!    operation's `n` an *excursion* from the moment it lands until its
//!    thread gives it back (only failed operations give back, right after
//!    they land). A thread has at most one excursion at a time on a
//!    counter, and `n < 2^16`, so excursions in flight sum to less than
//!    `threads · 2^16` (below 2^38 for Linux's 2^22 threads at most), far
//!    inside the 2^60 margins between zones: no excursion makes a value
//!    change zone, and every landing is classified by the zone it left
//!    (the value returned).
//! 2. **The counter is the true count plus the excursions.** Successful
//!    operations change the true count, failed ones give back what they
//!    added, and revival shifts the counter by a constant (`RELEASED` to
//!    the new base reference), so excursions survive every transition.
//!    Without misuse (more puts than gets), the true count and the
//!    excursions are both at least zero, so the counter is zero only when
//!    both are: the release is elected only with no reference left.
//! 3. **The last landing on zero elects.** Only puts and give-backs can
//!    write `0` and leave it (a failed get that lands on `0`, from below,
//!    gives back at once; a tryget never writes there). Each of them tries
//!    the election on landing there, so whichever writes the final `0`
//!    finds it and moves the counter to `RELEASED`: the release runs
//!    exactly once per time the count reaches zero. Without misuse the
//!    final put is alone at zero, so its election succeeds and is its last
//!    access to the ref. A give-back that is the last landing (a misused
//!    get, a reinit in between) elects the same way.
//! 4. **Released is sticky.** Every get and tryget on released fails,
//!    until a reinit or resurrect (under the switch lock) shifts the
//!    counter back to live. Nothing else leaves released: gives-back return
//!    to it, and every checked operation refuses it.
//! 5. **Saturation is sticky.** A true count is at most [`MAX_COUNT`] (a
//!    switch's temporary reference may take the counter one higher). A
//!    small get that lands past it parks the counter at `BIAS + MAX_COUNT`
//!    (room for every reference held to be put back) and panics with an
//!    overflow: atomic mode with a biased value marks the ref *miscounted*
//!    (below), which never releases and never goes back to percpu mode.
//!    Saturated values only come from the live zone, so no fold is pending
//!    when one is parked (a fold works on a biased value).
//! 6. **Percpu mode never sees zero or released.** The biased zone is
//!    entered only by `add_bias` (from live, under the switch lock) and left
//!    only by the fold or by a checked operation; in between every
//!    unconditional operation lands in biased (invariant 1).
//!
//! # The biased range
//!
//! In percpu mode `a` is checked only by the large (`n >= 2^16`) calls,
//! which keep `BIAS + a` within `BIAS - 2^61 ..= BIAS + MAX_COUNT`; that
//! leaves 2^60 of margin to either side of the biased zone. Only `a` is
//! checked, not the true count `a + (per-CPU sum)`: `a` below `-2^61`
//! would take more than 2^61 references counted per CPU and put on the
//! atomic counter (2^45 calls at the least), which no program does.
//!
//! The fold can find the true count out of range only after misuse that
//! the per-CPU counters could not see: more puts than gets (an underflow)
//! or more than [`MAX_COUNT`] references (an overflow, after at least 2^46
//! per-CPU calls). It then *parks* the counter at `BIAS` instead: atomic
//! mode with a biased value marks the ref miscounted. No put can bring a
//! parked counter to zero, so the ref never releases, and nothing can
//! send it back to percpu mode.

use crate::sync::{self, AtomicU64, Ordering};

/// Added to the atomic counter while per-CPU counters are in use.
// mutant no_bias: the atomic counter holds only what was added to it directly.
pub(crate) const BIAS: u64 = mutant!("no_bias", 1 << 63, 0);
/// The largest `n` accepted by the `_many` operations, and the bound on a
/// true count.
pub(crate) const MAX_COUNT: u64 = (1 << 62) - 1;
/// `_many` operations on at least this many references are checked before
/// they write (a compare-and-swap loop); smaller ones are one unconditional
/// read-modify-write, which bounds an excursion (invariant 1). The same
/// bound as the per-CPU path's, so that one number says how far one
/// unchecked operation may move any counter of a ref.
pub(crate) const UNCHECKED_N_LIMIT: u64 = crate::percpu::PERCPU_N_LIMIT;
/// What a released counter holds, give or take operations in flight: the
/// middle of the released zone.
pub(crate) const RELEASED: u64 = 0xE000_0000_0000_0000;

/// The last value of the live zone: `MAX_COUNT` plus a switch's temporary
/// reference.
const TRUE_MAX: u64 = 1 << 62;
/// The last value of the saturated zone.
const SATURATED_END: u64 = TRUE_MAX + (1 << 60);
/// The last value of the biased zone (`BIAS` is `2^63` except in the
/// `no_bias` mutant; the zones do not move with it).
const BIASED_END: u64 = (1 << 63) + (1 << 62) + (1 << 60);
/// The range the checked (large) operations keep a biased counter in.
const BIASED_MIN: u64 = BIAS.wrapping_sub(1 << 61);
const BIASED_MAX: u64 = BIAS.wrapping_add(MAX_COUNT);
/// Where a saturated counter is parked: biased, at the top of the checked
/// range, so that the `MAX_COUNT` references its users hold can all be put
/// back without a false underflow (it never releases either way).
const SATURATED: u64 = BIASED_MAX;

/// The zone a counter value lies in (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Zone {
    Zero,
    Live,
    Saturated,
    Biased,
    Released,
}

/// The zone of `v`.
#[inline]
pub(crate) fn zone(v: u64) -> Zone {
    match v {
        0 => Zone::Zero,
        v if v <= TRUE_MAX => Zone::Live,
        v if v <= SATURATED_END => Zone::Saturated,
        v if v <= BIASED_END => Zone::Biased,
        _ => Zone::Released,
    }
}

/// What a get or tryget did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AddOutcome {
    Added,
    /// The ref was released: nothing was counted. `release` when the
    /// operation's give-back was the last landing on zero (invariant 3):
    /// the caller runs `release`.
    Released {
        release: bool,
    },
    /// The count would pass [`MAX_COUNT`]; `count` is what the counter
    /// held. A small `n` parked the counter (it never releases), a large one
    /// changed nothing.
    Overflow {
        count: u64,
    },
}

/// What a put did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    /// The count is still above zero (or this put was overtaken by a
    /// reviving tryget).
    Alive,
    /// This put took the count to zero and won the election: the caller
    /// must release.
    ReachedZero,
    /// The put would take the count below zero; it was given back, so the
    /// count is as it was (`count`, the true count). `release` as in
    /// [`AddOutcome::Released`].
    Underflow { count: u64, release: bool },
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

/// Why a revival or the switch back to percpu mode refused a counter.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The count is zero.
    Released,
    /// Parked after misuse, or saturated: the counter's value.
    Miscounted(u64),
    /// The new base reference would pass [`MAX_COUNT`].
    Overflow(u64),
    /// A reinit found references: the true count.
    NotZero(u64),
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
    /// A counter holding `v` (a biased count, a true one, or [`RELEASED`]).
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

    /// The true count, as a snapshot: `Some(0)` on zero and released,
    /// `None` while biased or saturated (percpu mode, a switch before its
    /// fold, a miscounted ref).
    pub(crate) fn true_count(&self) -> Option<u64> {
        let v = self.load();
        match zone(v) {
            Zone::Zero | Zone::Released => Some(0),
            Zone::Live => (v <= MAX_COUNT).then_some(v),
            Zone::Saturated | Zone::Biased => None,
        }
    }

    /// Takes a switch's temporary reference. Unchecked: the counter is
    /// biased, whose range leaves room for it.
    pub(crate) fn add_temp_ref(&self) {
        self.value.fetch_add(1, Ordering::Relaxed);
    }

    // ----- gets ----------------------------------------------------------------

    /// `get`: adds `n` references while the caller holds one. Relaxed, as
    /// `Arc::clone`: the caller's own reference already orders its accesses.
    #[inline]
    pub(crate) fn get(&self, n: u64) -> AddOutcome {
        if n >= UNCHECKED_N_LIMIT {
            return self.add_checked(n, false);
        }
        let old = self.value.fetch_add(n, Ordering::Relaxed);
        if old <= MAX_COUNT - n {
            return AddOutcome::Added;
        }
        self.after_add(old, n)
    }

    /// `tryget`: adds `n` references unless the count is zero (released, or
    /// a put electing its release).
    ///
    /// A compare-and-swap, not one unconditional add (the module docs,
    /// "Why tryget compares"): it never writes to a counter at zero, so the
    /// put that landed there is the only thread that can still elect, and
    /// its election is its last access to the ref.
    ///
    /// Acquire: a revival's new base reference publishes what the reviver
    /// wrote before it (a `Frozen` guard's writes); a tryget that takes a
    /// reference from it must see them.
    #[inline]
    pub(crate) fn tryget(&self, n: u64) -> AddOutcome {
        if n >= UNCHECKED_N_LIMIT {
            return self.add_checked(n, true);
        }
        if n == 0 {
            return self.tryget_none();
        }
        // ordering-audit: Relaxed: the value only seeds the compare-and-swap,
        // which acquires.
        let mut cur = self.value.load(Ordering::Relaxed);
        loop {
            let counts = match zone(cur) {
                Zone::Live => cur <= MAX_COUNT - n,
                // Percpu mode, a switch before its fold, or parked: counted,
                // as an unconditional add is (the zone's margins hold it).
                Zone::Biased => true,
                // mutant tryget_revives_zero: a tryget counts on a zero
                // count (a put electing its release): the put's election
                // then fails, and the reviver's own last put may release
                // and free the ref before that election touches it.
                Zone::Zero => mutated!("tryget_revives_zero"),
                // mutant tryget_no_zero_check: a tryget on a released ref
                // counts.
                Zone::Released if mutated!("tryget_no_zero_check") => true,
                Zone::Released => return AddOutcome::Released { release: false },
                Zone::Saturated => false,
            };
            if !counts {
                if cur == 0 {
                    return AddOutcome::Released { release: false };
                }
                return AddOutcome::Overflow { count: cur };
            }
            match self.value.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return AddOutcome::Added,
                Err(actual) => cur = actual,
            }
        }
    }

    /// `tryget_many(0)`: succeeds unless the ref was released, and changes
    /// nothing (a give-back of 0 would be a landing on zero that elects).
    fn tryget_none(&self) -> AddOutcome {
        // ordering-audit: Relaxed: no reference is taken, so nothing is
        // acquired; a snapshot, as `is_zero`.
        if zone(self.value.load(Ordering::Relaxed)) == Zone::Released {
            AddOutcome::Released { release: false }
        } else {
            AddOutcome::Added
        }
    }

    /// The slow path of an unconditional add that landed anywhere but low
    /// in the live zone: `old` is the value it added `n` to.
    #[cold]
    #[inline(never)]
    fn after_add(&self, old: u64, n: u64) -> AddOutcome {
        match zone(old) {
            Zone::Biased => AddOutcome::Added,
            Zone::Released => {
                // mutant dead_zone_no_give_back: a failed get keeps its
                // increment (the counter drifts).
                let release = !mutated!("dead_zone_no_give_back") && self.give_back_get(n);
                AddOutcome::Released { release }
            }
            // Past MAX_COUNT (the fast path admits everything up to it).
            Zone::Zero | Zone::Live | Zone::Saturated => {
                self.park_saturated(n);
                AddOutcome::Overflow { count: old }
            }
        }
    }

    /// Parks a saturated counter at [`SATURATED`] (invariant 5): from the
    /// live or saturated zone, where the landing of an overflow leaves it
    /// (puts racing it may have taken it back below the edge: parked all
    /// the same, since an overflow happened).
    #[cold]
    fn park_saturated(&self, n: u64) {
        // mutant saturation_gives_back: an overflowing get gives its
        // increment back and the ref goes on counting (not sticky).
        if mutated!("saturation_gives_back") {
            self.give_back_get(n);
            return;
        }
        let mut cur = self.load();
        while matches!(zone(cur), Zone::Live | Zone::Saturated) {
            // ordering-audit: Relaxed: the parked ref never releases and
            // publishes nothing.
            match self.value.compare_exchange_weak(
                cur,
                SATURATED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back the `n` of a failed get; true if that was the last landing
    /// on zero and won the election (invariant 3).
    #[cold]
    fn give_back_get(&self, n: u64) -> bool {
        // ordering-audit: Relaxed: a give-back publishes nothing of its own;
        // the election it may lead to acquires.
        let old = self.value.fetch_sub(n, Ordering::Relaxed);
        // mutant give_back_no_election: a give-back that lands on zero does
        // not elect (when it is the last landing there, nobody releases).
        old == n && !mutated!("give_back_no_election") && self.elect_release()
    }

    /// The checked add of a large `n`: refused before it writes.
    #[cold]
    #[inline(never)]
    fn add_checked(&self, n: u64, acquire: bool) -> AddOutcome {
        let mut cur = self.load();
        loop {
            let new = match zone(cur) {
                // A tryget never counts on zero (see `tryget`).
                Zone::Zero if acquire => return AddOutcome::Released { release: false },
                Zone::Zero | Zone::Live if cur + n <= MAX_COUNT => cur + n,
                Zone::Biased if cur.checked_add(n).is_some_and(|v| v <= BIASED_MAX) => cur + n,
                Zone::Released => return AddOutcome::Released { release: false },
                _ => return AddOutcome::Overflow { count: cur },
            };
            // Acquire for a tryget, as in `tryget`.
            let success = if acquire {
                Ordering::Acquire
            } else {
                Ordering::Relaxed
            };
            match self
                .value
                .compare_exchange_weak(cur, new, success, Ordering::Relaxed)
            {
                Ok(_) => return AddOutcome::Added,
                Err(actual) => cur = actual,
            }
        }
    }

    // ----- puts ----------------------------------------------------------------

    /// Drops `n` references.
    ///
    /// Release: everything the caller did under its references happens
    /// before the release, whose election acquires (as `Arc`'s drop).
    #[inline]
    pub(crate) fn put(&self, n: u64) -> PutOutcome {
        if n >= UNCHECKED_N_LIMIT {
            return self.sub_checked(n);
        }
        let old = self.value.fetch_sub(n, Ordering::Release);
        // Landed in live, above zero: `old - n` in `1..TRUE_MAX`.
        if old.wrapping_sub(n + 1) < TRUE_MAX - n {
            return PutOutcome::Alive;
        }
        self.after_sub(old, n)
    }

    /// The slow path of an unconditional put that did not land in the live
    /// zone above zero: `old` is the value it took `n` from.
    #[cold]
    #[inline(never)]
    fn after_sub(&self, old: u64, n: u64) -> PutOutcome {
        // mutant put_many_zero_check_off: "landed on zero" when the old
        // value was 1, right only for n == 1.
        let landed_on_zero = mutant!("put_many_zero_check_off", old == n, old == 1);
        match zone(old) {
            Zone::Live if landed_on_zero => {
                if self.elect_release() {
                    PutOutcome::ReachedZero
                } else {
                    PutOutcome::Alive
                }
            }
            Zone::Zero | Zone::Live if old < n => self.underflow(n, old),
            Zone::Released => self.underflow(n, 0),
            Zone::Live | Zone::Saturated | Zone::Biased => PutOutcome::Alive,
            Zone::Zero => unreachable!("a put of {n} from zero is an underflow"),
        }
    }

    /// A put that took the count below zero: gives its `n` back.
    #[cold]
    fn underflow(&self, n: u64, count: u64) -> PutOutcome {
        // ordering-audit: Relaxed: a give-back publishes nothing of its own;
        // the election it may lead to acquires.
        let old = self.value.fetch_add(n, Ordering::Relaxed);
        let release = old.wrapping_add(n) == 0 && self.elect_release();
        PutOutcome::Underflow { count, release }
    }

    /// The election of invariant 3: the counter is (or was) zero after this
    /// thread's landing; moving it to `RELEASED` makes this thread the one
    /// that releases. Fails when a tryget revived the ref first, or when
    /// another landing on zero won.
    #[inline]
    fn elect_release(&self) -> bool {
        // mutant zero_landing_no_election: a put that lands on zero releases
        // without electing (a reviving tryget's reference is then released
        // under it).
        if mutated!("zero_landing_no_election") {
            // ordering-audit: mutant only (zero_landing_no_election).
            self.value.store(RELEASED, Ordering::Relaxed);
            return true;
        }
        // Acquire: the releasing thread sees every access made under the
        // references put before (their puts are Release, and every
        // read-modify-write since continues their release sequences).
        self.value
            .compare_exchange(0, RELEASED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The put of one reference by compare-and-swap, for a ref that may be
    /// switched to managed percpu mode while it is in atomic mode
    /// (`shared::Shared`'s promotion): `None`, writing nothing, when the
    /// counter is not a true count (biased: a promotion or another switch
    /// is between its bias and its mode store; or parked). A put from 1
    /// moves the counter straight to `RELEASED`: the compare-and-swap is
    /// the election, so the put never lands on zero and nobody can revive
    /// it there.
    ///
    /// Why not one `fetch_sub`: a put that read "atomic, unmanaged" in the
    /// mode word and then lands after the promotion would count on the
    /// biased counter without the mark that the managed scan needs, and the
    /// engine could leave the ref idle with only its stand-in left.
    pub(crate) fn put_one_unless_biased(&self) -> Option<PutOutcome> {
        let mut cur = self.load();
        loop {
            let new = match zone(cur) {
                Zone::Live if cur == 1 => RELEASED,
                Zone::Live => cur - 1,
                Zone::Biased | Zone::Saturated => return None,
                Zone::Zero | Zone::Released => {
                    return Some(PutOutcome::Underflow {
                        count: 0,
                        release: false,
                    })
                }
            };
            match self
                .value
                // ordering-audit: kept: AcqRel: Release as `put`'s (a put's
                // accesses reach the engine's election through the
                // promotion's bias, a read-modify-write that continues this
                // release sequence), Acquire for the put that releases, as
                // `elect_release`. Since the hand-over to the ref is one swap
                // (issue 36), a put meets the ref in atomic mode only between
                // the swap and `promote_to_managed`, where the promoter holds
                // a reference: it is never the last there (a ref left atomic
                // by a promoter that panicked in between is), and the models,
                // bounded at two preemptions, do not reach the engine's
                // election after it unsynchronised. Weakened, the audit of
                // the last session's models (drops in atomic mode on every
                // unpromoted value) caught both.
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if new == RELEASED => return Some(PutOutcome::ReachedZero),
                Ok(_) => return Some(PutOutcome::Alive),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The managed scan's election (`percpu_ref/managed.rs`): from a true
    /// count of exactly 1, the engine's stand-in reference, to `RELEASED`,
    /// in one compare-and-swap, so that it fails if anyone took or dropped
    /// a reference since the count was read. Acquire, as
    /// [`elect_release`](Self::elect_release).
    pub(crate) fn elect_release_of_last(&self) -> bool {
        self.value
            .compare_exchange(1, RELEASED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the true count is exactly 1, in atomic mode after a
    /// switch's fold: `shared::Shared::get_mut`'s check of a promoted
    /// value. Acquire, as [`elect_release_of_last`](Self::elect_release_of_last):
    /// the other references' accesses before their puts happen before the
    /// caller's use of the object.
    pub(crate) fn is_one(&self) -> bool {
        // ordering-audit: kept: Acquire, for a put that lands on the atomic
        // counter between the switch's last read-modify-write and this
        // load (a Release read-modify-write): its holder's accesses come
        // before the caller's. The models cannot show it: the rseq model's
        // sections order a put that found the ref atomic before the ref's
        // hand-back (`counters.reset`), which the caller's use follows
        // (not so on hardware, whose per-CPU counters are plain memory).
        self.value.load(Ordering::Acquire) == 1
    }

    /// Only for the mutant `shared_exact_take_by_check`: the count stored
    /// as released after a check, instead of the election's
    /// compare-and-swap.
    #[cfg(percpu_ref_mutant = "shared_exact_take_by_check")]
    pub(crate) fn store_released(&self) {
        // ordering-audit: kept: only the mutant's store.
        self.value.store(RELEASED, Ordering::Release);
    }

    /// The checked put of a large `n`: refused before it writes; a put that
    /// empties the counter moves it straight to `RELEASED`.
    #[cold]
    #[inline(never)]
    fn sub_checked(&self, n: u64) -> PutOutcome {
        let mut cur = self.load();
        loop {
            let new = match zone(cur) {
                // mutant checked_put_to_zero: a large put that empties the
                // counter leaves it at zero, where no election follows.
                Zone::Live | Zone::Saturated if cur == n => {
                    mutant!("checked_put_to_zero", RELEASED, 0)
                }
                Zone::Live | Zone::Saturated if cur > n => cur - n,
                Zone::Biased if cur.checked_sub(n).is_some_and(|v| v >= BIASED_MIN) => cur - n,
                Zone::Released | Zone::Zero => {
                    return PutOutcome::Underflow {
                        count: 0,
                        release: false,
                    }
                }
                _ => {
                    return PutOutcome::Underflow {
                        count: cur,
                        release: false,
                    }
                }
            };
            // AcqRel: Release as `put`'s, and Acquire for the put that
            // releases, as `elect_release`.
            match self
                .value
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if new == RELEASED => return PutOutcome::ReachedZero,
                Ok(_) => return PutOutcome::Alive,
                Err(actual) => cur = actual,
            }
        }
    }

    // ----- switches and revival (under the switch lock) --------------------------

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
            // mutant fold_not_atomic: the fold stores what it computed from
            // its load, losing the atomic-mode operations that landed between.
            if mutated!("fold_not_atomic") {
                // ordering-audit: mutant only (fold_not_atomic).
                self.value.store(new, Ordering::Relaxed);
                return fold;
            }
            // ordering-audit: Relaxed: the switcher puts its temporary reference
            // (a Release `put`) after the fold, so the put that reaches zero reads
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
    pub(crate) fn add_bias(&self) -> Result<u64, Refused> {
        let mut cur = self.load();
        loop {
            match zone(cur) {
                _ if unsettled(cur) => {
                    sync::spin_wait();
                    cur = self.load();
                    continue;
                }
                Zone::Live => {}
                Zone::Zero | Zone::Released => return Err(Refused::Released),
                Zone::Saturated | Zone::Biased => return Err(Refused::Miscounted(cur)),
            }
            // ordering-audit: Relaxed: an RMW continues the release sequence of the
            // revival's RMW (Release), which is what publishes the reviver's
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

    /// A revival's new base reference: `+1` on a live count (refused when
    /// `require_zero`, for a reinit); on a released one, the shift from
    /// `RELEASED` to one reference, which keeps the excursions of failed
    /// gets in flight (invariant 2: they give back after). Returns the true
    /// count it found.
    ///
    /// Release: the new base reference publishes what the reviver wrote
    /// before it (a `Frozen` guard's writes), so that a tryget that takes
    /// a reference from it (an acquire) sees them.
    pub(crate) fn revive(&self, require_zero: bool) -> Result<u64, Refused> {
        let mut cur = self.load();
        loop {
            let (count, new) = match zone(cur) {
                _ if unsettled(cur) => {
                    sync::spin_wait();
                    cur = self.load();
                    continue;
                }
                Zone::Live if require_zero => return Err(Refused::NotZero(cur)),
                Zone::Live if cur < MAX_COUNT => (cur, cur + 1),
                Zone::Live => return Err(Refused::Overflow(cur)),
                // mutant revive_stores_one: the revival forgets the excursions in flight.
                Zone::Released if mutated!("revive_stores_one") => (0, 1),
                Zone::Released => (0, cur - RELEASED + 1),
                Zone::Zero => unreachable!("zero is unsettled"),
                Zone::Saturated | Zone::Biased => return Err(Refused::Miscounted(cur)),
            };
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
                Ok(_) => return Ok(count),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// Whether `v` is a moment a switch-lock holder cannot decide at, and waits
/// out (`sync::spin_wait`): a landing on zero before its election (neither
/// live nor released yet), or a misused put's underflow before its
/// give-back (a revival from below `RELEASED` would land at or below
/// zero). Both end within a few instructions of the thread that made them.
fn unsettled(v: u64) -> bool {
    v == 0 || (zone(v) == Zone::Released && v < RELEASED)
}

#[cfg(all(test, not(percpu_ref_loom)))]
mod tests;
