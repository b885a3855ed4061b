//! Every operation, flag and misuse of `PercpuRef`, single-threaded.

use percpu_ref::{Error, InitFlags, PercpuRef};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// A ref whose release calls are counted.
fn counted(flags: InitFlags) -> (PercpuRef, Arc<AtomicUsize>) {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        PercpuRef::with_flags(
            move |_| {
                releases.fetch_add(1, SeqCst);
            },
            flags,
        )
    };
    (r, releases)
}

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn new_ref_is_percpu_alive_with_one_reference() {
    let (r, rel) = counted(InitFlags::empty());
    assert!(r.is_percpu());
    assert!(!r.is_dying());
    assert!(!r.is_zero());
    assert_eq!(r.atomic_count(), None);
    assert!(r.tryget() && r.tryget_live());
    r.put();
    r.put();
    r.switch_to_atomic_sync();
    assert_eq!(r.atomic_count(), Some(1), "only the base reference is left");
    assert_eq!(rel.load(SeqCst), 0);
}

#[test]
fn kill_drops_the_base_reference_and_releases_once() {
    let (r, rel) = counted(InitFlags::empty());
    r.kill_sync().unwrap();
    assert_eq!(rel.load(SeqCst), 1);
    assert!(r.is_zero() && r.is_dying() && !r.is_percpu());
    assert!(!r.tryget());
    assert!(!r.tryget_live());
    assert_eq!(rel.load(SeqCst), 1, "failed trygets never release");
}

#[test]
fn release_waits_for_the_last_put_in_any_mode() {
    let (r, rel) = counted(InitFlags::empty());
    r.get_many(3); // counted per CPU
    r.kill_sync().unwrap();
    assert_eq!(
        r.atomic_count(),
        Some(3),
        "the per-CPU counts were folded in exactly"
    );
    r.put();
    r.put_many(1);
    assert_eq!(rel.load(SeqCst), 0);
    assert!(r.tryget(), "tryget works until the count is zero");
    assert!(!r.tryget_live(), "tryget_live fails once dead");
    r.put_many(2);
    assert_eq!(rel.load(SeqCst), 1);
    assert!(r.is_zero());
}

#[test]
fn release_runs_after_confirm() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let r = {
        let log = log.clone();
        PercpuRef::new(move |_| log.lock().unwrap().push("release"))
    };
    let l2 = log.clone();
    r.kill_and_confirm_sync(move |r| {
        assert!(
            !r.tryget_live(),
            "no tryget_live succeeds once confirm runs"
        );
        assert!(r.is_dying());
        l2.lock().unwrap().push("confirm");
    })
    .unwrap();
    assert_eq!(*log.lock().unwrap(), ["confirm", "release"]);
}

#[test]
fn confirm_may_use_the_ref_but_not_switch_it() {
    let r = PercpuRef::new(|_| {});
    r.kill_and_confirm_sync(|r| {
        // get/put/tryget from confirm must not deadlock.
        assert!(r.tryget());
        r.get();
        r.put_many(2);
    })
    .unwrap();
    let r = PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT);
    let msg =
        panic_message(|| r.switch_to_atomic_and_confirm_sync(|r| r.switch_to_percpu().unwrap()));
    assert!(
        msg.contains("switch_to_percpu") && msg.contains("confirm"),
        "{msg}"
    );
    // The failed re-entry left the ref usable.
    r.switch_to_percpu().unwrap();
    assert!(r.is_percpu());
}

#[test]
fn release_may_call_back_into_the_ref() {
    let reinits = Arc::new(AtomicUsize::new(0));
    let r = {
        let reinits = reinits.clone();
        PercpuRef::with_flags(
            move |r| {
                // Recycle the ref from its own release, as a freelist would.
                if reinits.fetch_add(1, SeqCst) == 0 {
                    r.reinit().unwrap();
                }
            },
            InitFlags::ALLOW_REINIT,
        )
    };
    r.kill_sync().unwrap();
    assert_eq!(reinits.load(SeqCst), 1);
    assert!(r.is_percpu() && !r.is_dying(), "revived by its release");
    r.kill_sync().unwrap();
    assert_eq!(reinits.load(SeqCst), 2, "each lifecycle releases once");
}

#[test]
fn init_atomic_is_sticky_and_allows_reinit() {
    let (r, rel) = counted(InitFlags::INIT_ATOMIC);
    assert!(!r.is_percpu());
    assert_eq!(r.atomic_count(), Some(1));
    r.get();
    r.kill_sync().unwrap();
    r.resurrect().unwrap();
    assert!(!r.is_percpu(), "force-atomic survives resurrect");
    assert_eq!(r.atomic_count(), Some(2));
    r.switch_to_percpu().unwrap();
    assert!(r.is_percpu(), "INIT_ATOMIC implies ALLOW_REINIT");
    r.put();
    r.kill_sync().unwrap();
    assert_eq!(rel.load(SeqCst), 1);
}

#[test]
fn init_dead_starts_zero_and_revives_to_percpu() {
    let (r, rel) = counted(InitFlags::INIT_DEAD);
    assert!(r.is_dying() && r.is_zero() && !r.is_percpu());
    assert!(!r.tryget() && !r.tryget_live());
    assert_eq!(
        r.kill_sync(),
        Err(Error::AlreadyDead {
            op: "kill_and_confirm_sync"
        })
    );
    r.reinit().unwrap();
    assert!(
        r.is_percpu() && !r.is_dying(),
        "INIT_DEAD alone does not force atomic"
    );
    r.kill_sync().unwrap();
    assert_eq!(rel.load(SeqCst), 1);

    let (r, _) = counted(InitFlags::INIT_DEAD | InitFlags::INIT_ATOMIC);
    r.resurrect().unwrap();
    assert!(!r.is_percpu() && r.tryget_live());
    assert_eq!(r.atomic_count(), Some(2));
}

#[test]
fn switch_round_trips_keep_counts_exact() {
    let (r, rel) = counted(InitFlags::ALLOW_REINIT);
    let mut held = 1u64;
    for i in 0..50 {
        r.get_many(i % 4);
        held += (i % 4) as u64;
        r.switch_to_atomic_sync();
        assert_eq!(r.atomic_count(), Some(held));
        r.get_many(2);
        r.put();
        held += 1;
        r.switch_to_percpu().unwrap();
        assert!(r.is_percpu());
    }
    r.switch_to_atomic_sync();
    assert_eq!(r.atomic_count(), Some(held));
    r.put_many(held as usize - 1);
    assert_eq!(rel.load(SeqCst), 0);
    r.kill_sync().unwrap();
    assert_eq!(rel.load(SeqCst), 1);
}

#[test]
fn switch_to_atomic_when_atomic_confirms_at_once() {
    let r = PercpuRef::with_flags(|_| {}, InitFlags::INIT_ATOMIC);
    let mut confirmed = false;
    r.switch_to_atomic_and_confirm_sync(|_| confirmed = true);
    assert!(confirmed);
    assert_eq!(
        r.atomic_count(),
        Some(1),
        "no temporary reference left behind"
    );
}

#[test]
fn switch_to_percpu_while_dead_waits_for_revival() {
    let (r, _) = counted(InitFlags::ALLOW_REINIT);
    r.get();
    r.switch_to_atomic_sync();
    r.kill_sync().unwrap();
    r.switch_to_percpu().unwrap();
    assert!(!r.is_percpu(), "a dead ref stays atomic");
    r.resurrect().unwrap();
    assert!(
        r.is_percpu(),
        "force-atomic was cleared, so revival goes percpu"
    );
}

#[test]
fn double_kill_is_refused_and_changes_nothing() {
    let (r, rel) = counted(InitFlags::empty());
    r.get();
    r.kill_sync().unwrap();
    let mut ran = false;
    let err = r.kill_and_confirm_sync(|_| ran = true).unwrap_err();
    assert_eq!(
        err,
        Error::AlreadyDead {
            op: "kill_and_confirm_sync"
        }
    );
    assert!(!ran, "confirm of a refused kill never runs");
    assert_eq!(
        r.atomic_count(),
        Some(1),
        "the base reference is not put twice"
    );
    assert_eq!(rel.load(SeqCst), 0);
    assert!(err.to_string().contains("already dead"), "{err}");
}

#[test]
fn resurrect_needs_a_dead_ref() {
    let (r, _) = counted(InitFlags::ALLOW_REINIT);
    let err = r.resurrect().unwrap_err();
    assert_eq!(err, Error::NotDead { op: "resurrect" });
    assert!(r.is_percpu());
    assert!(err.to_string().contains("resurrect"));
}

#[test]
fn reinit_needs_a_zero_count() {
    let (r, _) = counted(InitFlags::ALLOW_REINIT);
    assert_eq!(
        r.reinit(),
        Err(Error::NotZero {
            op: "reinit",
            count: None
        })
    );
    r.get();
    r.kill_sync().unwrap();
    let err = r.reinit().unwrap_err();
    assert_eq!(
        err,
        Error::NotZero {
            op: "reinit",
            count: Some(1)
        }
    );
    assert!(err.to_string().contains("count is 1"), "{err}");
    assert!(r.is_dying(), "a refused reinit leaves the ref dead");
    assert_eq!(r.atomic_count(), Some(1));
    r.put();
    r.reinit().unwrap();
    assert!(r.is_percpu() && !r.is_dying());
}

#[test]
fn going_percpu_needs_allow_reinit() {
    let (r, _) = counted(InitFlags::empty());
    r.switch_to_percpu().unwrap(); // already percpu: nothing to do
    r.switch_to_atomic_sync();
    let err = r.switch_to_percpu().unwrap_err();
    assert_eq!(
        err,
        Error::ReinitNotAllowed {
            op: "switch_to_percpu"
        }
    );
    assert!(err.to_string().contains("ALLOW_REINIT"));
    assert!(!r.is_percpu());
    r.get();
    r.kill_sync().unwrap();
    // Forced atomic (by switch_to_atomic_sync): revival stays atomic, so it is fine.
    r.resurrect().unwrap();
    assert!(!r.is_percpu() && !r.is_dying());
    assert_eq!(r.atomic_count(), Some(2));

    let (r, _) = counted(InitFlags::empty());
    r.get();
    r.kill_sync().unwrap();
    assert_eq!(
        r.resurrect(),
        Err(Error::ReinitNotAllowed { op: "resurrect" })
    );
    assert!(r.is_dying(), "a refused resurrect leaves the ref dead");
    assert_eq!(r.atomic_count(), Some(1));
}

#[test]
fn underflow_in_atomic_mode_panics_and_keeps_the_count() {
    let (r, rel) = counted(InitFlags::INIT_ATOMIC);
    r.get();
    let msg = panic_message(|| r.put_many(3));
    assert!(
        msg.contains("put_many") && msg.contains("count at 2"),
        "{msg}"
    );
    assert_eq!(r.atomic_count(), Some(2), "a refused put changes nothing");
    r.put_many(2);
    assert_eq!(
        rel.load(SeqCst),
        1,
        "the correct puts still release exactly once"
    );
    let msg = panic_message(|| r.put());
    assert!(msg.contains("count at 0"), "{msg}");
    assert_eq!(rel.load(SeqCst), 1, "never released twice");
}

#[test]
fn underflow_in_percpu_mode_is_found_at_the_switch() {
    let (r, rel) = counted(InitFlags::empty());
    r.put(); // the base reference, which only kill may drop
    r.put(); // and one more: the true count is -1
    let msg = panic_message(|| r.kill_sync().unwrap());
    assert!(msg.contains("underflow") && msg.contains("-1"), "{msg}");
    assert_eq!(rel.load(SeqCst), 0, "an underflowed count never releases");
    assert!(!r.tryget_live());
}

#[test]
fn get_on_a_released_ref_panics() {
    let (r, _) = counted(InitFlags::empty());
    r.kill_sync().unwrap();
    let msg = panic_message(|| r.get());
    assert!(
        msg.contains("get_many(1)") && msg.contains("count is 0"),
        "{msg}"
    );
    assert!(r.is_zero(), "the failed get changed nothing");
}

#[test]
fn many_forms_and_zero_counts() {
    let (r, rel) = counted(InitFlags::empty());
    r.get_many(0);
    r.put_many(0);
    assert!(r.tryget_many(5));
    r.kill_sync().unwrap();
    assert_eq!(r.atomic_count(), Some(5));
    assert!(r.tryget_many(2));
    r.put_many(7);
    assert_eq!(rel.load(SeqCst), 1);
    r.put_many(0);
    r.get_many(0);
    assert_eq!(
        rel.load(SeqCst),
        1,
        "put_many(0) on a zero count is a no-op"
    );
    assert!(!r.tryget_many(3));
    let msg = panic_message(|| r.get_many(usize::MAX));
    assert!(
        msg.contains("get_many") && msg.contains(&usize::MAX.to_string()),
        "{msg}"
    );
}

#[test]
fn debug_shows_mode_and_count() {
    let r = PercpuRef::with_flags(|_| {}, InitFlags::INIT_ATOMIC);
    let s = format!("{r:?}");
    assert!(s.contains("atomic") && s.contains("Some(1)"), "{s}");
    assert!(format!("{:?}", PercpuRef::new(|_| {})).contains("percpu"));
}

#[test]
fn storage_is_sized_by_possible_cpus() {
    let r = PercpuRef::new(|_| {});
    assert!(r.percpu_bytes() >= 8 * percpu_ref::possible_cpus());
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PercpuRef>();
    check::<Error>();
}

// ----- deferred switches ------------------------------------------------------
//
// Small enough for Miri, which runs them on the sharded backend with the
// engine thread.

#[test]
fn kill_returns_dying_and_the_engine_completes_it() {
    let (r, rel) = counted(InitFlags::empty());
    let r = Box::pin(r);
    r.get();
    r.as_ref().kill().unwrap();
    assert!(r.is_dying() && !r.is_percpu(), "dying and atomic on return");
    assert!(!r.tryget_live());
    assert!(r.tryget(), "tryget works until zero");
    r.put();
    assert_eq!(r.as_ref().kill(), Err(Error::AlreadyDead { op: "kill" }));
    assert!(matches!(r.kill_sync(), Err(Error::AlreadyDead { .. })));
    percpu_ref::flush();
    assert_eq!(r.atomic_count(), Some(1), "the base reference was put");
    assert_eq!(rel.load(SeqCst), 0);
    r.put();
    assert_eq!(rel.load(SeqCst), 1);
}

#[test]
fn deferred_confirm_runs_on_the_engine_thread_before_release() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let r = Box::pin(PercpuRef::new(move |_| o.lock().unwrap().push("release")));
    let o = order.clone();
    r.as_ref()
        .kill_and_confirm(move |r| {
            assert!(!r.tryget_live());
            let name = std::thread::current().name().map(str::to_owned);
            o.lock()
                .unwrap()
                .push(if name.as_deref() == Some("percpu-ref-gp") {
                    "confirm on percpu-ref-gp"
                } else {
                    "confirm elsewhere"
                });
        })
        .unwrap();
    percpu_ref::flush();
    assert_eq!(
        *order.lock().unwrap(),
        ["confirm on percpu-ref-gp", "release"]
    );
}

#[test]
fn a_deferred_switch_then_switch_to_percpu_waits_for_it() {
    let (r, rel) = counted(InitFlags::ALLOW_REINIT);
    let r = std::pin::pin!(r);
    r.get_many(3);
    r.as_ref().switch_to_atomic();
    assert!(!r.is_percpu());
    r.switch_to_percpu().unwrap(); // waits for the engine
    assert!(r.is_percpu());
    r.put_many(3);
    r.kill_sync().unwrap();
    assert_eq!(rel.load(SeqCst), 1);
}

#[test]
fn a_panicking_deferred_confirm_does_not_stop_the_engine() {
    let (r, rel) = counted(InitFlags::empty());
    let r = Box::pin(r);
    r.as_ref()
        .kill_and_confirm(|_| panic!("confirm panics on purpose"))
        .unwrap();
    percpu_ref::flush();
    assert_eq!(rel.load(SeqCst), 1, "the kill completed anyway");
    let (r2, rel2) = counted(InitFlags::empty());
    let r2 = Box::pin(r2);
    r2.as_ref().kill().unwrap();
    percpu_ref::flush();
    assert_eq!(rel2.load(SeqCst), 1, "the engine goes on");
}

#[test]
fn dropping_a_ref_right_after_its_deferred_kill_waits_for_the_engine() {
    let confirmed = Arc::new(AtomicUsize::new(0));
    let (r, rel) = counted(InitFlags::empty());
    let r = Box::pin(r);
    let c = confirmed.clone();
    r.as_ref()
        .kill_and_confirm(move |_| {
            c.fetch_add(1, SeqCst);
        })
        .unwrap();
    drop(r);
    assert_eq!((confirmed.load(SeqCst), rel.load(SeqCst)), (1, 1));
}

/// Not under Miri: the `&PercpuRef` that `release` receives is a live
/// (protected) borrow while the release runs, so freeing the ref inside it
/// is outside Rust's aliasing rules whatever the engine does; what this
/// checks is that the engine neither deadlocks nor touches the ref again.
#[test]
#[cfg_attr(miri, ignore = "frees the ref during its own release call")]
fn a_release_on_the_engine_may_drop_its_own_ref() {
    static SLOT: Mutex<Option<std::pin::Pin<Box<PercpuRef>>>> = Mutex::new(None);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    let r = Box::pin(PercpuRef::new(|_| {
        let mine = SLOT.lock().unwrap().take();
        drop(mine); // the ref being completed: its Drop must not wait
        DROPPED.fetch_add(1, SeqCst);
    }));
    let p: *const PercpuRef = &*r;
    *SLOT.lock().unwrap() = Some(r);
    // SAFETY: the ref lives in SLOT, pinned, until its release drops it.
    let r = unsafe { std::pin::Pin::new_unchecked(&*p) };
    r.kill().unwrap();
    percpu_ref::flush();
    assert_eq!(DROPPED.load(SeqCst), 1);
    assert!(SLOT.lock().unwrap().is_none());
}

#[test]
fn a_switch_of_the_same_ref_from_a_deferred_confirm_is_refused() {
    let (r, rel) = counted(InitFlags::empty());
    let r = Box::pin(r);
    let msg = Arc::new(Mutex::new(String::new()));
    let m = msg.clone();
    r.as_ref()
        .kill_and_confirm(move |r| {
            let e = catch_unwind(AssertUnwindSafe(|| {
                let _ = r.resurrect();
            }))
            .expect_err("a switch of the same ref from its confirm must panic");
            *m.lock().unwrap() = e.downcast_ref::<String>().cloned().unwrap_or_default();
        })
        .unwrap();
    percpu_ref::flush();
    let msg = msg.lock().unwrap();
    assert!(
        msg.contains("resurrect") && msg.contains("same ref"),
        "{msg}"
    );
    assert_eq!(rel.load(SeqCst), 1);
}

#[test]
#[should_panic(expected = "percpu_ref::set_batch_delay: 2s is longer than the most accepted, 1s")]
fn a_batch_delay_over_the_maximum_is_refused_by_name() {
    percpu_ref::set_batch_delay(std::time::Duration::from_secs(2));
}

#[test]
fn the_batch_delay_is_read_back_as_set() {
    // The default is restored: other tests in this binary use the engine.
    let was = percpu_ref::batch_delay();
    assert_eq!(was, percpu_ref::DEFAULT_BATCH_DELAY);
    let d = std::time::Duration::from_micros(1500);
    percpu_ref::set_batch_delay(d);
    assert_eq!(percpu_ref::batch_delay(), d);
    percpu_ref::set_batch_delay(was);
}
