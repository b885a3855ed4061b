//! The promises of `PercpuRef` under hostile input: panicking callbacks,
//! released refs sent back to percpu mode, huge `n`
//! and counts at their limit. Each test runs on every available backend.
//! (The css and rseq backends' own promises have their own files.)

mod common;
use common::{backends, counted, counted_with, panic_message};
use percpu_ref::{Error, InitFlags};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// The most references a ref can hold. A `usize` `n` reaches it in one call
/// only where `usize` has 64 bits; on 32-bit targets it would take 2^30
/// calls, so the two overflow tests are 64-bit only.
#[cfg(target_pointer_width = "64")]
const MAX_COUNT: usize = (1 << 62) - 1;

// ----- item 5: panicking callbacks --------------------------------------------

#[test]
fn a_panicking_confirm_still_completes_the_kill() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::empty(), b);
        r.get(); // one reference outstanding
        let msg = panic_message(|| {
            let _ = r.kill_and_confirm_sync(|_| panic!("confirm failed on purpose"));
        });
        assert_eq!(
            msg, "confirm failed on purpose",
            "{b}: the panic propagates"
        );
        assert!(r.is_dying() && !r.tryget_live(), "{b}");
        assert_eq!(
            r.atomic_count(),
            Some(1),
            "{b}: base and temporary references were put"
        );
        assert_eq!(rel.load(SeqCst), 0, "{b}");
        r.put();
        assert_eq!(rel.load(SeqCst), 1, "{b}: released once, by the last put");
        assert!(
            matches!(r.kill_sync(), Err(Error::AlreadyDead { .. })),
            "{b}"
        );
    }
}

#[test]
fn a_panicking_confirm_releases_when_it_was_the_last_reference() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::empty(), b);
        let msg = panic_message(|| {
            let _ = r.kill_and_confirm_sync(|r| {
                assert!(!r.tryget_live());
                panic!("boom");
            });
        });
        assert_eq!(msg, "boom");
        assert_eq!(rel.load(SeqCst), 1, "{b}: the kill released the ref");
        assert!(r.is_zero(), "{b}");
    }
}

#[test]
fn a_panicking_confirm_of_a_switch_leaves_the_count_exact() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::ALLOW_REINIT, b);
        r.get_many(3);
        panic_message(|| r.switch_to_atomic_and_confirm_sync(|_| panic!("confirm")));
        assert_eq!(
            r.atomic_count(),
            Some(4),
            "{b}: no temporary reference left"
        );
        r.switch_to_percpu().unwrap();
        r.put_many(3);
        r.kill_sync().unwrap();
        assert_eq!(rel.load(SeqCst), 1, "{b}");
    }
}

#[test]
fn a_switch_from_inside_confirm_panics_after_the_kill_completes() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::empty(), b);
        let msg = panic_message(|| {
            let _ = r.kill_and_confirm_sync(|r| r.switch_to_atomic_sync());
        });
        assert!(msg.contains("inside a confirm callback"), "{b}: {msg}");
        assert_eq!(rel.load(SeqCst), 1, "{b}: the kill still released");
    }
}

#[test]
fn a_panicking_release_runs_once_and_leaves_the_ref_released() {
    for b in backends() {
        let (r, calls) = counted_with(InitFlags::empty(), b, true);
        r.get();
        r.kill_sync().unwrap();
        let msg = panic_message(|| r.put());
        assert_eq!(msg, "release panics");
        assert!(r.is_zero(), "{b}");
        assert!(!r.tryget(), "{b}: released stays released");
        assert_eq!(calls.load(SeqCst), 1, "{b}");
        // The same from the kill's own put.
        let (r2, calls2) = counted_with(InitFlags::empty(), b, true);
        panic_message(|| {
            let _ = r2.kill_sync();
        });
        assert!(r2.is_zero() && r2.is_dying(), "{b}");
        assert_eq!(calls2.load(SeqCst), 1, "{b}");
    }
}

// ----- item 7: a released ref stays released ------------------------------------

#[test]
fn switch_to_percpu_refuses_a_released_ref() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::ALLOW_REINIT, b);
        r.switch_to_atomic_sync();
        r.put(); // count 1 -> 0
        assert_eq!(rel.load(SeqCst), 1, "{b}");
        assert_eq!(
            r.switch_to_percpu(),
            Err(Error::Released {
                op: "switch_to_percpu"
            }),
            "{b}"
        );
        assert!(!r.is_percpu() && r.is_zero(), "{b}: nothing changed");
        assert!(!r.tryget() && !r.tryget_live(), "{b}");
        assert!(r.switch_to_percpu().is_err(), "{b}: still refused");
        // reinit starts a new life; only that one can release again.
        r.reinit().unwrap();
        assert!(!r.is_zero() && r.tryget(), "{b}");
        r.put();
        assert_eq!(rel.load(SeqCst), 1, "{b}");
        assert_eq!(r.atomic_count(), Some(1), "{b}: still sticky atomic");
        r.kill_sync().unwrap();
        assert_eq!(rel.load(SeqCst), 2, "{b}: one release per life");
    }
}

// ----- item 8: every n counts exactly on every backend --------------------------

#[test]
fn huge_n_counts_exactly() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::empty(), b);
        r.get_many(1 << 61);
        r.get();
        r.kill_sync().unwrap();
        assert_eq!(r.atomic_count(), Some((1 << 61) + 1), "{b}");
        r.put_many((1 << 61) + 1);
        assert_eq!(rel.load(SeqCst), 1, "{b}");

        let (r, rel) = counted(InitFlags::empty(), b);
        r.get_many(1 << 61);
        r.put_many(1 << 61);
        r.kill_sync().unwrap();
        assert_eq!(rel.load(SeqCst), 1, "{b}: no false underflow");

        // Just below and at the per-CPU limit, in every combination.
        let (r, rel) = counted(InitFlags::empty(), b);
        for n in [(1 << 16) - 1, 1 << 16, (1 << 16) + 1, 1 << 40] {
            r.get_many(n);
            assert!(r.tryget_many(n));
        }
        for n in [(1 << 16) - 1, 1 << 16, (1 << 16) + 1, 1 << 40] {
            r.put_many(2 * n);
        }
        r.kill_sync().unwrap();
        assert_eq!(rel.load(SeqCst), 1, "{b}");
    }
}

#[test]
fn huge_n_from_many_threads_counts_exactly() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::ALLOW_REINIT, b);
        let r = Arc::new(r);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for k in 0..if cfg!(miri) { 40 } else { 2000usize } {
                        let n = if k % 2 == 0 {
                            1 << 45
                        } else {
                            (k * 7919 + i) % 70_000
                        };
                        r.get_many(n);
                        if k % 20 == 0 && i == 0 {
                            r.switch_to_atomic_sync();
                            r.switch_to_percpu().unwrap();
                        }
                        r.put_many(n);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        r.kill_sync().unwrap();
        assert_eq!(rel.load(SeqCst), 1, "{b}: exact after huge gets and puts");
    }
}

// ----- item 9: overflow is an overflow, never a wrap ----------------------------

#[test]
#[cfg(target_pointer_width = "64")]
fn a_large_overflow_in_atomic_mode_panics_and_keeps_the_count() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::INIT_ATOMIC, b);
        let msg = panic_message(|| r.get_many(MAX_COUNT));
        assert!(
            msg.contains("get_many") && msg.contains("overflow") && msg.contains("left at 1"),
            "{msg}"
        );
        assert_eq!(r.atomic_count(), Some(1), "{b}: unchanged");
        r.get_many(MAX_COUNT - 1); // exactly at the limit
        assert_eq!(r.atomic_count(), Some(MAX_COUNT as u64));
        // `n >= 2^16`: checked before it writes, refused.
        let msg = panic_message(|| {
            let _ = r.tryget_many(1 << 16); // panics before it returns
        });
        assert!(msg.contains("overflow") && msg.contains("left at"), "{msg}");
        assert!(!r.is_zero() && r.atomic_count() == Some(MAX_COUNT as u64));
        r.put_many(MAX_COUNT);
        assert_eq!(rel.load(SeqCst), 1, "{b}: released once, at zero");
    }
}

/// A get of fewer than 2^16 references in atomic mode is one unconditional
/// add (a tryget compares first, and is refused): past the limit it
/// saturates the count, and saturation is sticky
/// (as the kernel's `rcuref`): the ref is miscounted and never releases,
/// whatever puts follow, and it refuses to go back to percpu mode.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_small_overflow_in_atomic_mode_saturates_for_good() {
    for b in backends() {
        for tryget_first in [false, true] {
            let (r, rel) = counted(InitFlags::ALLOW_REINIT, b);
            r.switch_to_atomic_sync();
            r.get_many(MAX_COUNT - 2); // the base plus this: one below the limit
            assert!(r.tryget());
            assert_eq!(r.atomic_count(), Some(MAX_COUNT as u64));
            if tryget_first {
                // A tryget compares before it writes: refused, count unchanged.
                let msg = panic_message(|| {
                    let _ = r.tryget();
                });
                assert!(
                    msg.contains("overflow") && msg.contains("left at"),
                    "{b}: {msg}"
                );
                assert_eq!(r.atomic_count(), Some(MAX_COUNT as u64), "{b}");
            }
            let msg = panic_message(|| r.get());
            assert!(
                msg.contains("overflow") && msg.contains("saturated"),
                "{b}: {msg}"
            );
            assert_eq!(r.atomic_count(), None, "{b}: parked");
            r.put_many(MAX_COUNT);
            r.put();
            assert!(!r.is_zero(), "{b}");
            assert!(
                matches!(r.switch_to_percpu(), Err(Error::Miscounted { .. })),
                "{b}"
            );
            assert!(matches!(r.kill_sync(), Ok(())), "{b}: a kill still works");
            assert_eq!(rel.load(SeqCst), 0, "{b}: never released");
        }
    }
}

#[test]
#[cfg(target_pointer_width = "64")]
fn overflow_in_percpu_mode_is_caught_at_the_call() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::empty(), b);
        let msg = panic_message(|| r.get_many(MAX_COUNT));
        assert!(msg.contains("overflow"), "{b}: {msg}");
        assert!(r.is_percpu(), "{b}: still alive");
        r.get_many(MAX_COUNT - 1); // the base plus this: exactly the limit
        let msg = panic_message(|| r.get_many(1 << 20));
        assert!(msg.contains("overflow"), "{b}: {msg}");
        r.kill_sync().unwrap();
        assert_eq!(r.atomic_count(), Some(MAX_COUNT as u64 - 1));
        r.put_many(MAX_COUNT - 1);
        assert_eq!(rel.load(SeqCst), 1, "{b}");
    }
}

#[test]
fn a_miscounted_ref_never_releases_and_refuses_to_go_percpu() {
    for b in backends() {
        let (r, rel) = counted(InitFlags::ALLOW_REINIT, b);
        r.put(); // the base reference, in percpu mode: not seen yet
        r.put(); // one more: an underflow
        let msg = panic_message(|| r.switch_to_atomic_sync());
        assert!(
            msg.contains("underflow") && msg.contains("-1"),
            "{b}: {msg}"
        );
        assert_eq!(rel.load(SeqCst), 0, "{b}: never released");
        assert!(matches!(
            r.switch_to_percpu(),
            Err(Error::Miscounted { .. })
        ));
        r.get();
        r.put();
        assert_eq!(rel.load(SeqCst), 0, "{b}");
    }
}

// Item 6 (a refused grace period undoes the switch) is in
// `tests/refused_grace_period.rs`: it needs a binary of its own.
