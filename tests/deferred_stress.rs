//! Deferred kills under load: thousands of refs killed with the
//! asynchronous API by several threads while more threads (4x the cores in
//! all, so the engine thread is preempted and migrated) get, put and
//! tryget on them.
//!
//! Checked on every backend, for every ref:
//! - `tryget_live` fails once the kill returned (a flag set after the
//!   kill, read before the tryget);
//! - `confirm` runs exactly once, and `release` exactly once, after
//!   `confirm` and only when no reference is held (exact counts);
//! - after `flush`, every ref is released;
//! - refs dropped right after their deferred kill: `Drop` waits for the
//!   engine, so confirm and release have run when the drop returns.
//!
//! Violations inside callbacks run on the engine thread (where a panic is
//! only reported) are recorded and asserted at the end.

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

/// Refs killed under load. Miri (~10^4 times slower) runs a tenth of the
/// debug size (400 refs took 75 s for one seed there); emulated guests
/// scale it down too.
fn ref_count() -> usize {
    common::scaled(if cfg!(miri) {
        40
    } else if cfg!(debug_assertions) {
        400
    } else {
        4000
    })
}
/// Refs killed and dropped one at a time: each drop waits out a grace
/// period, which in an emulated guest interrupts every vCPU running the
/// test's 4x-the-cores threads, so `scripts/vm-test` scales it down
/// (`PERCPU_REF_TEST_SCALE`).
fn dropped_refs() -> usize {
    common::scaled(if cfg!(miri) {
        20
    } else if cfg!(debug_assertions) {
        200
    } else {
        2000
    })
}

/// What one ref's callbacks and users observe.
#[derive(Default)]
struct Track {
    confirms: AtomicUsize,
    releases: AtomicUsize,
    /// References the users hold (incremented after a successful tryget,
    /// decremented before the put).
    held: AtomicIsize,
    /// Set once the deferred kill returned.
    killed: AtomicBool,
}

/// Violations seen in callbacks (on the engine thread) or by users.
#[derive(Default)]
struct Violations(Mutex<Vec<String>>);

impl Violations {
    fn add(&self, msg: String) {
        self.0.lock().unwrap().push(msg);
    }

    fn assert_none(&self, backend: Backend) {
        let v = self.0.lock().unwrap();
        assert!(
            v.is_empty(),
            "{backend}: {} violations, first: {:?}",
            v.len(),
            &v[..v.len().min(5)]
        );
    }
}

struct Tracked {
    r: Pin<Arc<PercpuRef>>,
    t: Arc<Track>,
}

fn tracked(i: usize, backend: Backend, v: &Arc<Violations>) -> Tracked {
    let (r, t) = tracked_ref(i, backend, v);
    Tracked { r: Arc::pin(r), t }
}

/// A ref whose release checks the order and the count, and its track.
fn tracked_ref(i: usize, backend: Backend, v: &Arc<Violations>) -> (PercpuRef, Arc<Track>) {
    let t = Arc::new(Track::default());
    let (tr, vr) = (t.clone(), v.clone());
    let r = PercpuRef::with_backend(
        move |_| {
            if tr.confirms.load(SeqCst) != 1 {
                vr.add(format!("ref {i}: release before confirm"));
            }
            let held = tr.held.load(SeqCst);
            if held != 0 {
                vr.add(format!("ref {i}: release with {held} references held"));
            }
            if tr.releases.fetch_add(1, SeqCst) != 0 {
                vr.add(format!("ref {i}: released twice"));
            }
        },
        InitFlags::empty(),
        backend,
    )
    .unwrap();
    (r, t)
}

fn confirm_for(i: usize, t: &Arc<Track>, v: &Arc<Violations>) -> impl FnOnce(&PercpuRef) + Send {
    let (t, v) = (t.clone(), v.clone());
    move |r| {
        if r.tryget_live() {
            v.add(format!("ref {i}: tryget_live succeeded in confirm"));
            r.put();
        }
        if t.confirms.fetch_add(1, SeqCst) != 0 {
            v.add(format!("ref {i}: confirmed twice"));
        }
    }
}

/// A user: picks refs pseudo-randomly, takes a reference with `tryget`,
/// gets and puts more on it (percpu or atomic, whatever the mode), checks
/// `tryget_live` against the kill flag, and puts everything back.
fn user(seed: usize, refs: &[Tracked], stop: &AtomicBool, v: &Violations) -> u64 {
    let mut x = seed as u64 | 1;
    let mut ops = 0;
    while !stop.load(SeqCst) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = &refs[(x % refs.len() as u64) as usize];
        let killed = k.t.killed.load(SeqCst);
        if k.r.tryget_live() {
            if killed {
                v.add("tryget_live succeeded after kill returned".into());
            }
            k.t.held.fetch_add(1, SeqCst);
        } else if k.r.tryget() {
            k.t.held.fetch_add(1, SeqCst);
        } else {
            continue; // released
        }
        let n = (x >> 20) as usize % 3 + 1;
        k.r.get_many(n);
        k.r.put_many(n);
        k.t.held.fetch_sub(1, SeqCst);
        k.r.put();
        ops += 1;
    }
    ops
}

fn run(backend: Backend) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = 4 * cores;
    let killers = threads / 4;
    let users = threads - killers - 1;
    let v = Arc::new(Violations::default());
    let refs: Arc<Vec<Tracked>> =
        Arc::new((0..ref_count()).map(|i| tracked(i, backend, &v)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let user_threads: Vec<_> = (0..users)
        .map(|u| {
            let (refs, stop, v) = (refs.clone(), stop.clone(), v.clone());
            std::thread::spawn(move || user(u * 7919 + 1, &refs, &stop, &v))
        })
        .collect();

    // One thread kills refs it owns and drops each right away.
    let dropper = {
        let v = v.clone();
        std::thread::spawn(move || {
            for i in 0..dropped_refs() {
                let (r, t) = tracked_ref(ref_count() + i, backend, &v);
                let r = Box::pin(r);
                r.get();
                r.as_ref()
                    .kill_and_confirm(confirm_for(ref_count() + i, &t, &v))
                    .unwrap();
                r.put();
                drop(r); // waits for the engine
                if t.confirms.load(SeqCst) != 1 || t.releases.load(SeqCst) != 1 {
                    v.add(format!(
                        "dropped ref {i}: drop returned before the engine was done"
                    ));
                }
            }
        })
    };

    // Give the users a head start on percpu refs, then kill.
    std::thread::sleep(Duration::from_millis(20));
    let killer_threads: Vec<_> = (0..killers)
        .map(|k| {
            let (refs, v) = (refs.clone(), v.clone());
            std::thread::spawn(move || {
                for (i, tr) in refs.iter().enumerate().skip(k).step_by(killers) {
                    let confirm = confirm_for(i, &tr.t, &v);
                    if i % 5 == 0 {
                        // A deferred switch first: the kill waits for it.
                        tr.r.as_ref().switch_to_atomic();
                    }
                    tr.r.as_ref().kill_and_confirm(confirm).unwrap();
                    tr.t.killed.store(true, SeqCst);
                    if tr.r.as_ref().kill().is_ok() {
                        v.add(format!("ref {i}: killed twice"));
                    }
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for k in killer_threads {
        k.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, SeqCst);
    let ops: u64 = user_threads.into_iter().map(|u| u.join().unwrap()).sum();
    dropper.join().unwrap();
    percpu_ref::flush();

    for (i, tr) in refs.iter().enumerate() {
        assert_eq!(tr.t.confirms.load(SeqCst), 1, "{backend}: ref {i} confirms");
        assert_eq!(tr.t.releases.load(SeqCst), 1, "{backend}: ref {i} releases");
        assert!(
            tr.r.is_zero(),
            "{backend}: ref {i} count {:?}",
            tr.r.atomic_count()
        );
    }
    v.assert_none(backend);
    eprintln!(
        "{backend}: {} refs killed by {killers} threads, {} dropped after \
         their kill, {ops} user rounds by {users} threads, {:?}",
        ref_count(),
        dropped_refs(),
        start.elapsed()
    );
    common::report_counts();
}

#[test]
fn deferred_kills_under_load_sharded() {
    run(Backend::Sharded);
}

#[test]
fn deferred_kills_under_load_rseq() {
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: the rseq backend is not available");
        return;
    }
    run(Backend::Rseq);
}
