//! Loom models of every kill/confirm race of the percpu_ref protocol.
//!
//! Each model runs the crate's real protocol code (through the `sync`
//! facade) with 2-3 threads and checks, in every interleaving loom explores,
//! the property named in its doc comment. Most run on both backends: the
//! sealed-shard backend as it ships, and the loom model of the rseq backend
//! (`Backend::Rseq` under `--cfg loom`, see `src/percpu/model.rs`).
//!
//! Run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --test loom_protocol
//! ```
//!
//! Each model sets its own default preemption bound (3; 2 for the 3-thread
//! ones); `LOOM_MAX_PREEMPTIONS` overrides it. `scripts/loom-mutants`
//! runs every model against every mutant (`--cfg percpu_ref_mutant="..."`)
//! and prints which models catch which mutant.

#![cfg(percpu_ref_loom)]

mod common;
use common::models;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use percpu_ref::{Backend, Error, InitFlags, PercpuRef};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What the release callback and the threads of a model observe.
#[derive(Default)]
struct Probe {
    /// Set by the kill's or switch's `confirm`.
    confirmed: AtomicBool,
    /// References the model's threads hold (decremented before each put,
    /// incremented after each successful get).
    held: AtomicUsize,
    /// How many times `release` ran.
    releases: AtomicUsize,
}

impl Probe {
    fn new(held: usize) -> Arc<Probe> {
        let p = Probe::default();
        p.held.store(held, SeqCst);
        Arc::new(p)
    }

    fn confirm(&self) {
        assert!(!self.confirmed.swap(true, SeqCst), "confirm ran twice");
    }

    /// One put, accounted: the reference stops being held first.
    fn put(&self, r: &PercpuRef) {
        self.held.fetch_sub(1, SeqCst);
        r.put();
    }

    fn releases(&self) -> usize {
        self.releases.load(SeqCst)
    }
}

/// A ref whose release asserts that it is the only one, that confirm ran
/// first, and that no reference is still held.
fn strict_ref(p: &Arc<Probe>, flags: InitFlags, backend: Backend) -> Arc<PercpuRef> {
    let p = p.clone();
    Arc::new(
        PercpuRef::with_backend(
            move |_| {
                assert!(p.confirmed.load(SeqCst), "release ran before confirm");
                assert_eq!(
                    p.held.load(SeqCst),
                    0,
                    "release ran while a reference is held"
                );
                assert_eq!(p.releases.fetch_add(1, SeqCst), 0, "release ran twice");
            },
            flags,
            backend,
        )
        .unwrap(),
    )
}

/// A ref whose release only counts (for models that release more than once
/// or where confirm is not the point).
fn counting_ref(p: &Arc<Probe>, flags: InitFlags, backend: Backend) -> Arc<PercpuRef> {
    let p = p.clone();
    Arc::new(
        PercpuRef::with_backend(
            move |_| {
                assert_eq!(
                    p.held.load(SeqCst),
                    0,
                    "release ran while a reference is held"
                );
                p.releases.fetch_add(1, SeqCst);
            },
            flags,
            backend,
        )
        .unwrap(),
    )
}

fn spawn(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::spawn(f)
}

/// A thread that tries `tryget_live` once, asserts it did not succeed after
/// a confirm it had already seen, and puts what it got.
fn spawn_tryget_live_checker(r: &Arc<PercpuRef>, p: &Arc<Probe>) -> thread::JoinHandle<()> {
    let (r, p) = (r.clone(), p.clone());
    spawn(move || {
        let confirmed = p.confirmed.load(SeqCst);
        if r.tryget_live() {
            assert!(!confirmed, "tryget_live succeeded after confirm");
            p.held.fetch_add(1, SeqCst);
            p.put(&r);
        }
    })
}

/// A thread that tries `tryget` once and, if it got a reference, counts it
/// as held (the probe's release checks that none is) and puts it.
fn spawn_tryer(r: &Arc<PercpuRef>, p: &Arc<Probe>) -> thread::JoinHandle<()> {
    let (r, p) = (r.clone(), p.clone());
    spawn(move || {
        if r.tryget() {
            p.held.fetch_add(1, SeqCst);
            p.put(&r);
        }
    })
}

// ----- 1. get/put concurrent with kill ------------------------------------

/// Model 1a: a thread holding one reference does get, put, put (percpu
/// while it can) while the owner kills the ref. Release runs exactly once,
/// after confirm, after the last put.
fn kill_vs_get_put(backend: Backend) {
    let p = Probe::new(2); // base + the worker's reference
    let r = strict_ref(&p, InitFlags::empty(), backend);
    r.get(); // the worker's reference
    let w = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || {
            r.get();
            p.held.fetch_add(1, SeqCst);
            p.put(&r);
            p.put(&r);
        })
    };
    p.held.fetch_sub(1, SeqCst); // the base reference goes with the kill
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

/// Model 1b: the owner dropped the base reference in percpu mode (allowed:
/// zero is found once atomic) and switches to atomic mode while the last
/// holder puts. Release runs exactly once, after the switch's confirm.
fn switch_vs_final_put(backend: Backend) {
    let p = Probe::new(1); // the worker's reference
    let r = strict_ref(&p, InitFlags::empty(), backend);
    r.get(); // the worker's reference
    r.put(); // the base reference, in percpu mode
    let w = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    r.switch_to_atomic_and_confirm_sync(|_| p.confirm());
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

/// Model 1c: kill of a ref already in atomic mode (no fold, no temporary
/// reference) while the other holder puts. Release still waits for confirm.
fn kill_atomic_vs_put(backend: Backend) {
    let p = Probe::new(1);
    let r = strict_ref(&p, InitFlags::INIT_ATOMIC, backend);
    r.get();
    let w = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

// ----- 2. tryget_live concurrent with kill_and_confirm_sync ---------------------

/// Model 2: once confirm has run (seen through its flag), no tryget_live
/// succeeds; one that succeeded holds a counted reference (release waits
/// for its put).
fn tryget_live_vs_kill(backend: Backend) {
    let p = Probe::new(0);
    let r = strict_ref(&p, InitFlags::empty(), backend);
    let w = spawn_tryget_live_checker(&r, &p);
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

// ----- 3. tryget concurrent with the final put -----------------------------

/// Model 3: kill and the last holder's put race with a tryget. A tryget
/// never succeeds once release has run, and one that succeeds keeps the
/// ref alive until it puts.
fn tryget_vs_final_put(backend: Backend) {
    let p = Probe::new(1); // the worker's reference
    let r = strict_ref(&p, InitFlags::empty(), backend);
    r.get();
    let holder = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    let tryer = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || {
            let released = p.releases() > 0;
            if r.tryget() {
                assert!(!released, "tryget succeeded after release");
                p.held.fetch_add(1, SeqCst);
                p.put(&r);
            }
        })
    };
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    holder.join().unwrap();
    tryer.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

// ----- 4. concurrent switches with get/put ---------------------------------

/// Model 4: switch_to_atomic_sync, switch_to_percpu and a get/put pair race
/// (ALLOW_REINIT). A switch waits for the one in progress (its confirm sees
/// the ref atomic and folded), and the count stays exact: no per-CPU count
/// is lost or counted twice.
fn switch_vs_switch_and_get_put(backend: Backend) {
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::ALLOW_REINIT, backend);
    r.get(); // the worker's reference, held throughout
    let to_percpu = {
        let r = r.clone();
        spawn(move || r.switch_to_percpu().unwrap())
    };
    let worker = {
        let r = r.clone();
        spawn(move || {
            r.get();
            r.put();
        })
    };
    r.switch_to_atomic_and_confirm_sync(|r| {
        assert!(!r.is_percpu(), "a switch ran during another's confirm");
        // base + the worker's reference + the temporary one (+ its get).
        let count = r.atomic_count();
        assert!(matches!(count, Some(3 | 4)), "count at confirm: {count:?}");
    });
    to_percpu.join().unwrap();
    worker.join().unwrap();
    r.switch_to_atomic_sync();
    assert_eq!(r.atomic_count(), Some(2), "base + the worker's reference");
    r.put();
    r.kill_sync().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

// ----- 5. kill then resurrect / reinit, against tryget and tryget_live -----

/// Model 5a: kill then resurrect while another thread tries tryget_live
/// and then tryget. A tryget_live that runs wholly between confirm and the
/// start of resurrect fails; tryget never fails (the owner holds a
/// reference throughout); afterwards the ref is alive, percpu, and its
/// count exact.
fn kill_resurrect_vs_trygets(backend: Backend) {
    const ALIVE: usize = 0;
    const DEAD: usize = 1;
    const REVIVING: usize = 2;
    let phase = Arc::new(AtomicUsize::new(ALIVE));
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::ALLOW_REINIT, backend);
    r.get(); // held by the owner across kill and resurrect
    let tryer = {
        let (r, phase) = (r.clone(), phase.clone());
        spawn(move || {
            let before = phase.load(SeqCst);
            let live = r.tryget_live();
            let after = phase.load(SeqCst);
            if before == DEAD && after == DEAD {
                assert!(!live, "tryget_live succeeded on a dead ref");
            }
            assert!(r.tryget(), "tryget failed with a reference held");
            r.put();
            if live {
                r.put();
            }
        })
    };
    r.kill_and_confirm_sync(|_| phase.store(DEAD, SeqCst))
        .unwrap();
    phase.store(REVIVING, SeqCst);
    r.resurrect().unwrap();
    r.put();
    tryer.join().unwrap();
    assert_eq!(p.releases(), 0, "released while a reference was held");
    assert!(r.is_percpu() && !r.is_dying());
    r.kill_sync().unwrap();
    assert_eq!(
        p.releases(),
        1,
        "the revived base must be the last reference"
    );
}

/// Model 5b: kill then reinit while a tryget runs. reinit succeeds exactly
/// when the count was zero (the tryget failed or already put); either way
/// the ref can be reinitialised afterwards and counts exactly.
fn kill_reinit_vs_tryget(backend: Backend) {
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::ALLOW_REINIT, backend);
    let tryer = {
        let r = r.clone();
        spawn(move || {
            if r.tryget() {
                r.put();
            }
        })
    };
    r.kill_sync().unwrap();
    let first = r.reinit();
    tryer.join().unwrap();
    assert_eq!(p.releases(), 1, "the kill or the tryget's put released");
    match first {
        Ok(()) => {}
        Err(Error::NotZero { count: Some(1), .. }) => r.reinit().unwrap(),
        Err(e) => panic!("unexpected reinit error: {e}"),
    }
    assert!(r.is_percpu() && r.tryget_live());
    r.put();
    r.kill_sync().unwrap();
    assert_eq!(p.releases(), 2, "the reinitialised ref releases once more");
}

// ----- 6. late operations on a sealed shard --------------------------------

/// Model 6: get/put racing a switch to atomic, so that operations land on
/// shards (CPUs) already sealed: each is counted exactly once, on the
/// atomic counter, and the count after the switch is exact.
fn late_ops_vs_switch(backend: Backend) {
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::empty(), backend);
    r.get(); // the worker's reference
    let w = {
        let r = r.clone();
        spawn(move || {
            r.get();
            r.put();
            r.put();
        })
    };
    r.switch_to_atomic_sync();
    w.join().unwrap();
    assert_eq!(r.atomic_count(), Some(1), "only the base reference is left");
    assert_eq!(p.releases(), 0);
    r.kill_sync().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

// ----- 7. no false underflow alarm -----------------------------------------

/// Model 7: references taken on one CPU and put on another, some put in
/// percpu mode and some in atomic mode during the switch, the count
/// reaching zero exactly at the fold: underflow detection never fires, and
/// release runs once.
fn no_false_underflow(backend: Backend) {
    let p = Probe::new(2);
    let r = counting_ref(&p, InitFlags::empty(), backend);
    r.get_many(2); // the worker's two references
    r.put(); // the base reference, in percpu mode
    let w = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || {
            p.put(&r);
            p.put(&r);
        })
    };
    r.switch_to_atomic_sync();
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
    assert!(r.is_zero());
}

// ----- 8. paths no other model reaches -------------------------------------

/// Model 8a: `switch_to_percpu` on a killed ref races `tryget_live` and the
/// last holder's put (ALLOW_REINIT). A dead ref stays atomic and dead until
/// it is revived: the switch only clears the sticky flag, every
/// `tryget_live` fails, and the holder's put releases the ref, once.
/// Catches `percpu_switch_ignores_dead` (the switch sends the dead ref back
/// to percpu mode: `tryget_live` counts per CPU and the put never releases).
fn percpu_switch_vs_tryget_live_on_dead(backend: Backend) {
    let p = Probe::new(1); // the holder's reference
    let r = strict_ref(&p, InitFlags::ALLOW_REINIT, backend);
    r.get(); // the holder's reference
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    let switcher = {
        let r = r.clone();
        spawn(move || r.switch_to_percpu().unwrap())
    };
    let holder = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    let live = r.tryget_live();
    switcher.join().unwrap();
    holder.join().unwrap();
    assert!(!live, "tryget_live succeeded on a dead ref");
    assert!(
        r.is_dying() && !r.is_percpu(),
        "a dead ref left atomic mode"
    );
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

/// Model 8b: the last references go with one `put_many(2)` while the owner
/// kills. Whether that put counts per CPU (folded by the kill) or on the
/// atomic counter, the put that takes the count to zero releases, exactly
/// once and after confirm. Catches `put_many_zero_check_off` (the atomic
/// put tests the old value against 1 instead of `n`: a `put_many(2)` that
/// empties the counter never releases).
fn put_many_vs_kill(backend: Backend) {
    let p = Probe::new(2); // the worker's two references
    let r = strict_ref(&p, InitFlags::empty(), backend);
    r.get_many(2); // the worker's two references
    let w = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || {
            p.held.fetch_sub(2, SeqCst);
            r.put_many(2);
        })
    };
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    w.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

/// Model 8c, d: the kill of a ref that is already atomic (`INIT_ATOMIC`, or
/// percpu made sticky-atomic by `switch_to_atomic_sync`) races `tryget_live` on
/// another thread. The kill folds nothing, so `DEAD` is all that stops a
/// `tryget_live` on the atomic path: once confirm has run (seen through its
/// flag), none succeeds; one that succeeded holds a counted reference, and
/// release runs once, after the last put. Catches `kill_atomic_skips_dead`.
fn tryget_live_vs_kill_already_atomic(backend: Backend, init_atomic: bool) {
    let p = Probe::new(1); // the owner's extra reference, put at the end
    let flags = if init_atomic {
        InitFlags::INIT_ATOMIC
    } else {
        InitFlags::ALLOW_REINIT
    };
    let r = strict_ref(&p, flags, backend);
    if !init_atomic {
        r.switch_to_atomic_sync(); // sticky
    }
    r.get(); // keeps the count above zero after the kill
    let w = spawn_tryget_live_checker(&r, &p);
    r.kill_and_confirm_sync(|_| p.confirm()).unwrap();
    w.join().unwrap();
    assert!(!r.tryget_live(), "tryget_live succeeded after the kill");
    assert_eq!(p.releases(), 0, "released while a reference is held");
    p.put(&r);
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

fn tryget_live_vs_kill_init_atomic(backend: Backend) {
    tryget_live_vs_kill_already_atomic(backend, true)
}

fn tryget_live_vs_kill_sticky_atomic(backend: Backend) {
    tryget_live_vs_kill_already_atomic(backend, false)
}

/// Model 8e: the switch back to percpu mode races a put by a thread that
/// may still read the old (atomic) mode and a tryget by one that may read
/// the new mode. The base reference was put in percpu mode, so the put's
/// reference is the only one counted in the atomic counter: only the bias,
/// added *before* percpu counting resumes, keeps an atomic-path put from
/// taking the counter to zero while the tryget's per-CPU reference is
/// held. Either the put came first (released in atomic mode: the switch
/// fails and the ref stays atomic at zero) or the switch did (no release).
/// Catches `bias_after_mode_store` on both backends: the rseq model's mode
/// load may return the old mode, as the real section's load can.
fn percpu_switch_vs_atomic_put_and_tryget(backend: Backend) {
    let p = Probe::new(1); // the putter's reference
    let r = counting_ref(&p, InitFlags::ALLOW_REINIT, backend);
    r.get(); // the putter's reference
    r.put(); // the base reference, in percpu mode
    r.switch_to_atomic_sync(); // the count is now exactly the putter's reference
    let putter = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    let tryer = spawn_tryer(&r, &p);
    let switched = r.switch_to_percpu();
    putter.join().unwrap();
    tryer.join().unwrap();
    match switched {
        Ok(()) => {
            assert!(r.is_percpu());
            assert_eq!(p.releases(), 0, "released in percpu mode");
        }
        Err(Error::Released { .. }) => {
            assert!(r.is_zero(), "a released ref left atomic mode");
            assert_eq!(p.releases(), 1, "release must run exactly once");
        }
        Err(e) => panic!("unexpected switch_to_percpu error: {e}"),
    }
}

// ----- 9. the atomic counter's zones ----------------------------------------
//
// Atomic-mode operations are one unconditional add or sub each, classified
// by the zone the value they return lies in (src/atomic_mode.rs). These
// models race the transitions between zones; they run in atomic mode only
// (`INIT_ATOMIC`), so on the sharded backend alone, as `kill_atomic_vs_put`.

/// Model 9a: the last holder's put races a tryget. The put's `fetch_sub`
/// lands on zero and elects the release (a compare-and-swap from 0 to
/// `RELEASED`); the tryget's `fetch_add` may land before the election (it
/// counts, and the put finds itself not the last) or after it (it lands in
/// the released zone, fails, and gives its increment back). The release
/// runs exactly once, never while a reference is held, and no tryget
/// succeeds once it has run. Catches `zero_landing_no_election`.
fn final_put_vs_tryget_atomic(backend: Backend) {
    let p = Probe::new(1); // the holder's (base) reference
    let r = counting_ref(&p, InitFlags::INIT_ATOMIC, backend);
    let holder = {
        let (r, p) = (r.clone(), p.clone());
        spawn(move || p.put(&r))
    };
    let released = p.releases() > 0;
    if r.tryget() {
        assert!(!released, "tryget succeeded after release");
        p.held.fetch_add(1, SeqCst);
        p.put(&r);
    }
    holder.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
    assert!(r.is_zero() && !r.tryget(), "released is sticky");
}

/// Model 9b: a tryget on a released count while the owner revives it
/// (`reinit`) and puts the new base reference. Since issue 36 a tryget
/// compares and fails on released without writing (no excursion: those
/// now come only from a misused get, and the unit tests of `atomic_mode`
/// check the revival keeps them, `revive_stores_one`); it either fails or
/// takes a reference of the new life. Exactly two releases, never with a
/// reference held. Catches `tryget_no_zero_check` and
/// `revive_no_base_ref`.
fn tryget_in_released_zone_vs_reinit(backend: Backend) {
    let p = Probe::new(1); // the base reference
    let r = counting_ref(&p, InitFlags::INIT_ATOMIC, backend);
    p.put(&r); // released
    let tryer = spawn_tryer(&r, &p);
    // The revived base reference, counted as held from before it exists.
    p.held.fetch_add(1, SeqCst);
    r.reinit().unwrap();
    p.put(&r);
    tryer.join().unwrap();
    assert_eq!(p.releases(), 2, "each life releases exactly once");
    assert!(r.is_zero() && r.atomic_count() == Some(0));
}

/// Model 9c: two gets push a count at `MAX_COUNT` past it while a put
/// races them, so that a get or the put may land from the saturated zone.
/// At least one get overflows (it panics), and saturation is sticky: the
/// counter is parked for good, whatever lands after, so putting every
/// reference back never releases the ref. Catches `saturation_gives_back`.
fn saturation_vs_put(backend: Backend) {
    const MAX_COUNT: usize = (1 << 62) - 1;
    quiet_overflow_panics();
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::INIT_ATOMIC, backend);
    r.get_many(MAX_COUNT - 1); // with the base reference: the limit
    let get = |r: &PercpuRef| catch_unwind(AssertUnwindSafe(|| r.get())).is_err();
    let getter = {
        let r = r.clone();
        thread::spawn(move || get(&r))
    };
    let putter = {
        let r = r.clone();
        spawn(move || r.put())
    };
    let mine = get(&r);
    let theirs = getter.join().unwrap();
    putter.join().unwrap();
    assert!(mine || theirs, "MAX_COUNT + 1 references counted");
    assert_eq!(r.atomic_count(), None, "the saturated count is parked");
    r.put_many(MAX_COUNT);
    r.put();
    assert_eq!(p.releases(), 0, "a saturated ref released");
    assert!(matches!(
        r.switch_to_percpu(),
        Err(Error::Miscounted { .. })
    ));
}

/// Memory written and read without synchronisation of its own, so that
/// loom reports every access the ref's orderings do not order.
#[derive(Default)]
struct Payload(loom::cell::UnsafeCell<u64>);

// SAFETY: every access goes through loom's checked `with`/`with_mut`; a
// model that lets two race fails.
unsafe impl Sync for Payload {}

impl Payload {
    fn write(&self) {
        // SAFETY: loom checks that no other access races this one.
        self.0.with_mut(|v| unsafe { *v += 1 });
    }

    fn read(&self) -> u64 {
        // SAFETY: as in `write`.
        self.0.with(|v| unsafe { *v })
    }
}

/// Model 9d: `_many` calls with `n >= 2^16` are checked compare-and-swap
/// loops, not one add; their orderings must do what the small path's do.
/// Two holders each write their own payload and then put: one with a large
/// `put_many`, one with a small `put`, so either may be the last. The
/// release reads both payloads: the last put must acquire the other's
/// writes, and the other's put must publish them.
fn large_put_publishes_and_acquires(backend: Backend) {
    const N: usize = 1 << 16;
    let (mine, theirs) = (Arc::new(Payload::default()), Arc::new(Payload::default()));
    let p = Probe::new(0);
    let r = {
        let (mine, theirs, p) = (mine.clone(), theirs.clone(), p.clone());
        Arc::new(
            PercpuRef::with_backend(
                move |_| {
                    assert_eq!(mine.read() + theirs.read(), 2, "a write not yet made");
                    p.releases.fetch_add(1, SeqCst);
                },
                InitFlags::INIT_ATOMIC,
                backend,
            )
            .unwrap(),
        )
    };
    r.get_many(N); // the other holder's references
    let other = {
        let (r, theirs) = (r.clone(), theirs.clone());
        spawn(move || {
            theirs.write();
            r.put_many(N);
        })
    };
    mine.write();
    r.put(); // the base reference
    other.join().unwrap();
    assert_eq!(p.releases(), 1, "release must run exactly once");
}

/// Model 9e: the owner writes a payload, then revives a released ref;
/// another thread's `tryget_many` of `n >= 2^16` that succeeds takes its
/// references from the revival's base reference, so it must see the
/// payload (the revival publishes, the checked tryget acquires).
fn large_tryget_sees_the_revival(backend: Backend) {
    const N: usize = 1 << 16;
    let payload = Arc::new(Payload::default());
    let p = Probe::new(0);
    let r = counting_ref(&p, InitFlags::INIT_ATOMIC, backend);
    r.put(); // released
    let tryer = {
        let (r, payload) = (r.clone(), payload.clone());
        spawn(move || {
            if r.tryget_many(N) {
                assert_eq!(payload.read(), 1, "the revival's write not seen");
                r.put_many(N);
            }
        })
    };
    payload.write();
    r.reinit().unwrap();
    tryer.join().unwrap();
    assert_eq!(r.atomic_count(), Some(1), "the revived base reference");
}

/// Silences the default panic message of the overflows `saturation_vs_put`
/// expects (one per execution); every other panic is reported as before.
fn quiet_overflow_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .map_or("", String::as_str);
            if !msg.contains("count overflow") {
                report(info);
            }
        }));
    });
}

// ----- the tests ------------------------------------------------------------

// One test per backend for a model: `MODEL::sharded` and `MODEL::rseq_model`
// (`kill_atomic_vs_put` never counts per CPU, so it runs once).
models! {
    kill_vs_get_put: preemptions 3, backends [sharded, rseq_model];
    switch_vs_final_put: preemptions 3, backends [sharded, rseq_model];
    kill_atomic_vs_put: preemptions 3, backends [sharded];
    tryget_live_vs_kill: preemptions 3, backends [sharded, rseq_model];
    tryget_vs_final_put: preemptions 2, backends [sharded, rseq_model];
    switch_vs_switch_and_get_put: preemptions 3, backends [sharded, rseq_model];
    kill_resurrect_vs_trygets: preemptions 3, backends [sharded, rseq_model];
    kill_reinit_vs_tryget: preemptions 3, backends [sharded, rseq_model];
    late_ops_vs_switch: preemptions 3, backends [sharded, rseq_model];
    no_false_underflow: preemptions 3, backends [sharded, rseq_model];
    percpu_switch_vs_tryget_live_on_dead: preemptions 2, backends [sharded, rseq_model];
    put_many_vs_kill: preemptions 3, backends [sharded, rseq_model];
    tryget_live_vs_kill_init_atomic: preemptions 3, backends [sharded];
    tryget_live_vs_kill_sticky_atomic: preemptions 3, backends [sharded, rseq_model];
    percpu_switch_vs_atomic_put_and_tryget: preemptions 2, backends [sharded, rseq_model];
    final_put_vs_tryget_atomic: preemptions 3, backends [sharded];
    tryget_in_released_zone_vs_reinit: preemptions 3, backends [sharded];
    saturation_vs_put: preemptions 2, backends [sharded];
    large_put_publishes_and_acquires: preemptions 3, backends [sharded];
    large_tryget_sees_the_revival: preemptions 3, backends [sharded];
}
