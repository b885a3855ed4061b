//! The counter's zones, one thread at a time.

use super::*;

#[test]
fn zones() {
    assert_eq!(zone(0), Zone::Zero);
    assert_eq!(zone(1), Zone::Live);
    assert_eq!(zone(TRUE_MAX), Zone::Live);
    assert_eq!(zone(TRUE_MAX + 1), Zone::Saturated);
    assert_eq!(zone(SATURATED_END), Zone::Saturated);
    assert_eq!(zone(SATURATED_END + 1), Zone::Biased);
    assert_eq!(zone(BIASED_MIN), Zone::Biased);
    assert_eq!(zone(BIAS), Zone::Biased);
    assert_eq!(zone(BIASED_MAX + 1), Zone::Biased);
    assert_eq!(zone(BIASED_END), Zone::Biased);
    assert_eq!(zone(BIASED_END + 1), Zone::Released);
    assert_eq!(zone(RELEASED), Zone::Released);
    assert_eq!(zone(u64::MAX), Zone::Released);
    // The margins of invariant 1: 2^60 on every side of every range an
    // operation keeps the counter in.
    assert_eq!(SATURATED_END - TRUE_MAX, 1 << 60);
    assert_eq!(BIASED_MIN - SATURATED_END, 1 << 60);
    assert_eq!(BIASED_END - (BIASED_MAX + 1), 1 << 60);
    assert!(RELEASED - BIASED_END >= 1 << 60 && 0u64.wrapping_sub(RELEASED) >= 1 << 60);
    assert_eq!(classify_fold(1), Fold::Exact);
    assert_eq!(classify_fold(TRUE_MAX), Fold::Exact);
    assert_eq!(classify_fold(TRUE_MAX + 1), Fold::Overflow(TRUE_MAX + 1));
    assert_eq!(classify_fold(1 << 63), Fold::Overflow(1 << 63));
    assert_eq!(classify_fold(0), Fold::Underflow(0));
    assert_eq!(classify_fold(u64::MAX), Fold::Underflow(-1));
}

#[test]
fn the_last_put_elects_and_released_is_sticky() {
    let c = AtomicCount::new(2);
    assert_eq!(c.put(1), PutOutcome::Alive);
    assert_eq!(c.put(1), PutOutcome::ReachedZero);
    assert_eq!(c.load(), RELEASED);
    for _ in 0..3 {
        assert_eq!(c.tryget(1), AddOutcome::Released { release: false });
        assert_eq!(c.get(7), AddOutcome::Released { release: false });
    }
    assert_eq!(c.load(), RELEASED, "failed gets give back");
    assert_eq!(c.tryget(0), AddOutcome::Released { release: false });
    assert_eq!(
        c.put(1),
        PutOutcome::Underflow {
            count: 0,
            release: false
        }
    );
    assert_eq!(c.load(), RELEASED, "an underflow gives back");
    assert_eq!(c.true_count(), Some(0));
}

#[test]
fn a_tryget_on_zero_fails_and_leaves_the_election_to_the_put() {
    // The final put landed (0) but has not elected yet: a tryget fails
    // without writing, so the put's election (its last access) wins.
    let c = AtomicCount::new(0);
    assert_eq!(c.tryget(1), AddOutcome::Released { release: false });
    assert_eq!(
        c.add_checked(1 << 20, true),
        AddOutcome::Released { release: false }
    );
    assert_eq!(c.load(), 0, "nothing written");
    assert!(c.elect_release());
    assert_eq!(c.load(), RELEASED);
}

#[test]
fn a_give_back_that_lands_last_on_zero_elects() {
    // A tryget landed in released; a reinit shifted the counter (with
    // its excursion) to one reference, which the owner then put.
    let c = AtomicCount::new(RELEASED);
    let old = c.value.fetch_add(1, Ordering::Relaxed);
    assert_eq!(zone(old), Zone::Released);
    assert_eq!(c.revive(false), Ok(0));
    assert_eq!(c.load(), 2, "the excursion is kept");
    assert_eq!(c.put(1), PutOutcome::Alive);
    assert!(c.give_back_get(1), "the give-back was the last landing");
    assert_eq!(c.load(), RELEASED);
}

#[test]
fn an_underflow_given_back_onto_zero_elects() {
    // The final put landed on zero; a misused put took it to -1 before
    // the election, which fails; the misused put's give-back elects.
    let c = AtomicCount::new(0);
    assert_eq!(c.value.fetch_sub(1, Ordering::Relaxed), 0);
    assert!(!c.elect_release());
    assert_eq!(
        c.underflow(1, 0),
        PutOutcome::Underflow {
            count: 0,
            release: true
        }
    );
}

#[test]
fn an_overflow_parks_and_a_large_one_is_refused() {
    let c = AtomicCount::new(MAX_COUNT - 1);
    assert_eq!(c.get(1), AddOutcome::Added);
    assert_eq!(
        c.add_checked(2, false),
        AddOutcome::Overflow { count: MAX_COUNT }
    );
    assert_eq!(c.load(), MAX_COUNT, "refused before it wrote");
    assert_eq!(c.tryget(1), AddOutcome::Overflow { count: MAX_COUNT });
    assert_eq!(
        c.load(),
        MAX_COUNT,
        "a tryget compares: refused before it wrote"
    );
    assert_eq!(
        c.get(1),
        AddOutcome::Overflow { count: MAX_COUNT },
        "a get is one add: it lands past the limit"
    );
    assert_eq!(c.load(), SATURATED, "parked");
    assert_eq!(c.put(MAX_COUNT), PutOutcome::Alive, "all put back");
    assert_eq!(c.put(1), PutOutcome::Alive);
    assert_eq!(c.true_count(), None);
    assert_eq!(c.add_bias(), Err(Refused::Miscounted(BIAS - 1)));
    assert_eq!(c.revive(false), Err(Refused::Miscounted(BIAS - 1)));
}

#[test]
fn a_miscounted_fold_parks_the_counter() {
    let c = AtomicCount::new(BIAS + 1);
    // Two per-CPU puts, no gets: the true count is -1.
    assert_eq!(c.fold_percpu_sum(0u64.wrapping_sub(2)), Fold::Underflow(-1));
    assert_eq!(c.load(), BIAS, "parked");
    assert_eq!(c.put(1), PutOutcome::Alive, "never reaches zero");
    // The temporary reference on the counter, MAX_COUNT per CPU.
    let c = AtomicCount::new(BIAS + 1);
    assert_eq!(c.fold_percpu_sum(MAX_COUNT), Fold::Exact, "MAX + temp");
    assert_eq!(c.load(), TRUE_MAX);
    assert_eq!(c.put(1), PutOutcome::Alive);
    assert_eq!(c.load(), MAX_COUNT);
}

#[test]
fn checked_operations_keep_the_biased_range() {
    let c = AtomicCount::new(BIAS + 1);
    assert_eq!(c.get(MAX_COUNT), AddOutcome::Overflow { count: BIAS + 1 });
    assert_eq!(c.get(MAX_COUNT - 1), AddOutcome::Added);
    assert_eq!(c.load(), BIASED_MAX);
    assert_eq!(c.put(MAX_COUNT), PutOutcome::Alive);
    assert_eq!(c.load(), BIAS);
    assert_eq!(c.put(1 << 61), PutOutcome::Alive, "down to BIASED_MIN");
    assert_eq!(
        c.put(UNCHECKED_N_LIMIT),
        PutOutcome::Underflow {
            count: BIASED_MIN,
            release: false
        }
    );
    assert_eq!(c.load(), BIASED_MIN, "refused before it wrote");
}

#[test]
fn a_large_put_that_empties_releases_at_once() {
    let c = AtomicCount::new(UNCHECKED_N_LIMIT + 1);
    assert_eq!(c.put(UNCHECKED_N_LIMIT), PutOutcome::Alive);
    assert_eq!(
        c.put(UNCHECKED_N_LIMIT),
        PutOutcome::Underflow {
            count: 1,
            release: false
        }
    );
    let c = AtomicCount::new(UNCHECKED_N_LIMIT);
    assert_eq!(c.put(UNCHECKED_N_LIMIT), PutOutcome::ReachedZero);
    assert_eq!(c.load(), RELEASED);
    assert_eq!(c.add_bias(), Err(Refused::Released));
    assert_eq!(c.revive(false), Ok(0));
    assert_eq!(c.load(), 1);
}
