//! Managed refs (`PercpuRef::switch_to_managed`): released by the engine
//! once nobody holds a reference, exactly once, never early, with no kill.
//!
//! The concurrency tests run more threads than cores and millions of
//! operations, with the engine scanning in the middle of the stream.

use percpu_ref::{Backend, Error, InitFlags, PercpuRef};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

mod common;

/// What a managed ref's release saw: how often it ran, and whether anyone
/// still held a reference then (`held` is raised before each get and
/// lowered after each put's caller stops using the ref... see `Held`).
struct Probe {
    releases: AtomicUsize,
    held: AtomicUsize,
    early: AtomicBool,
}

impl Probe {
    fn new(held: usize) -> Arc<Probe> {
        Arc::new(Probe {
            releases: AtomicUsize::new(0),
            held: AtomicUsize::new(held),
            early: AtomicBool::new(false),
        })
    }

    fn releases(&self) -> usize {
        self.releases.load(SeqCst)
    }
}

/// A managed ref on `backend`, with its base reference counted in the
/// probe's `held`.
fn managed(backend: Backend) -> (Pin<Arc<PercpuRef>>, Arc<Probe>) {
    let p = Probe::new(1);
    let r = {
        let p = p.clone();
        Arc::pin(
            PercpuRef::with_backend(
                move |_| {
                    if p.held.load(SeqCst) != 0 {
                        p.early.store(true, SeqCst);
                    }
                    p.releases.fetch_add(1, SeqCst);
                },
                InitFlags::empty(),
                backend,
            )
            .unwrap(),
        )
    };
    r.as_ref().switch_to_managed().unwrap();
    // Managed by the engine on the rseq backend; kept atomic on the other.
    assert_eq!(r.is_managed(), backend == Backend::Rseq);
    assert_eq!(r.is_percpu(), backend == Backend::Rseq);
    (r, p)
}

/// A managed ref on the default backend whose releases `released` counts.
fn counting_managed(released: &Arc<AtomicUsize>) -> Pin<Box<PercpuRef>> {
    let released = released.clone();
    let r = Box::pin(PercpuRef::new(move |_| {
        released.fetch_add(1, SeqCst);
    }));
    r.as_ref().switch_to_managed().unwrap();
    r
}

/// One accounted put: the reference stops being held, then is put.
fn put(r: &PercpuRef, p: &Probe) {
    p.held.fetch_sub(1, SeqCst);
    r.put();
}

/// One accounted get: counted as held before it is taken.
fn get(r: &PercpuRef, p: &Probe) {
    p.held.fetch_add(1, SeqCst);
    r.get();
}

/// Waits (flushing) until `p` saw a release, at most `limit`.
fn wait_released(p: &Probe, limit: Duration) -> Duration {
    let start = Instant::now();
    while p.releases() == 0 && start.elapsed() < limit {
        percpu_ref::flush();
        thread::sleep(Duration::from_millis(1));
    }
    start.elapsed()
}

#[test]
fn released_after_the_last_put_with_no_kill() {
    for b in common::backends() {
        let (r, p) = managed(b);
        get(&r, &p);
        get(&r, &p);
        put(&r, &p);
        percpu_ref::flush();
        assert_eq!(p.releases(), 0, "{b:?}: released while two were held");
        put(&r, &p);
        percpu_ref::flush();
        assert_eq!(p.releases(), 0, "{b:?}: released while the base was held");
        put(&r, &p);
        percpu_ref::flush();
        assert_eq!(p.releases(), 1, "{b:?}: not released by flush");
        assert!(!p.early.load(SeqCst));
        assert!(!r.tryget(), "{b:?}: a tryget after the release succeeded");
        assert!(r.is_zero() && !r.is_managed());
        percpu_ref::flush();
        assert_eq!(p.releases(), 1);
    }
}

/// Without `flush`, the engine finds the ref on its own, within
/// milliseconds on an idle process (the bound the docs give is for the
/// engine's rounds; this allows for a loaded CI machine).
#[test]
fn released_by_the_engine_alone() {
    let (r, p) = managed(percpu_ref::backend());
    put(&r, &p);
    let start = Instant::now();
    while p.releases() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not released 10 s after the last put"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_tryget_before_the_release_revives_it() {
    for b in common::backends() {
        let (r, p) = managed(b);
        p.held.fetch_add(1, SeqCst);
        assert!(r.tryget());
        put(&r, &p); // the base
        percpu_ref::flush();
        assert_eq!(
            p.releases(),
            0,
            "{b:?}: released while a tryget's reference was held"
        );
        put(&r, &p);
        percpu_ref::flush();
        assert_eq!(p.releases(), 1, "{b:?}");
    }
}

#[test]
fn errors_and_queries() {
    let Some(r) = rseq_managed() else { return };
    assert_eq!(
        r.as_ref().switch_to_managed(),
        Err(Error::AlreadyManaged {
            op: "switch_to_managed"
        })
    );
    let dead = Box::pin(PercpuRef::with_flags(|_| {}, InitFlags::INIT_DEAD));
    assert_eq!(
        dead.as_ref().switch_to_managed(),
        Err(Error::AlreadyDead {
            op: "switch_to_managed"
        })
    );
    let msg = Error::AlreadyManaged {
        op: "switch_to_managed",
    }
    .to_string();
    assert!(msg.contains("switch_to_managed") && msg.contains("already managed"));
    r.put();
    // In atomic mode there is nothing to manage: the count releases it.
    let (a, releases) = common::counted_with(InitFlags::INIT_ATOMIC, Backend::Sharded, false);
    let a = Box::pin(a);
    a.as_ref().switch_to_managed().unwrap();
    assert!(!a.is_managed());
    a.put();
    assert_eq!(releases.load(SeqCst), 1);
}

/// A second `switch_to_managed` that finds the ref in a scan waits for
/// the engine to hand it back, is refused, and leaves it managed: still
/// released after its last put.
#[test]
fn a_refused_second_switch_while_scanned_keeps_it_managed() {
    for _ in 0..200 {
        let Some(r) = rseq_managed() else { return };
        r.get();
        r.put(); // marks it: a scan is queued
        assert!(r.as_ref().switch_to_managed().is_err());
        assert!(r.is_managed());
        r.put();
        percpu_ref::flush();
        assert!(
            r.is_zero(),
            "not released after a refused switch_to_managed"
        );
    }
}

/// A managed ref on the rseq backend, where it can run.
fn rseq_managed() -> Option<Pin<Arc<PercpuRef>>> {
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: rseq not available");
        return None;
    }
    Some(managed(Backend::Rseq).0)
}

/// A kill takes over: the engine's stand-in is dropped, the kill puts the
/// base reference, and the last put releases as for any killed ref.
#[test]
fn a_kill_takes_over() {
    for b in common::backends() {
        let (r, p) = managed(b);
        get(&r, &p);
        r.kill_sync().unwrap();
        p.held.fetch_sub(1, SeqCst); // the kill's base reference
        assert!(!r.is_managed());
        assert_eq!(
            r.atomic_count(),
            Some(1),
            "{b:?}: the stand-in was not dropped"
        );
        assert_eq!(p.releases(), 0);
        put(&r, &p);
        assert_eq!(p.releases(), 1, "{b:?}");
        assert!(!p.early.load(SeqCst));
    }
}

/// A deferred kill while the engine scans the ref (puts keep marking it).
#[test]
fn a_deferred_kill_while_scanned() {
    let (r, p) = managed(percpu_ref::backend());
    for _ in 0..1000 {
        get(&r, &p);
        put(&r, &p);
    }
    r.as_ref().kill().unwrap();
    p.held.fetch_sub(1, SeqCst);
    percpu_ref::flush();
    assert_eq!(p.releases(), 1);
    assert!(!p.early.load(SeqCst));
}

/// Dropping a managed ref the engine is scanning waits for its step and
/// does not release it.
#[test]
fn drop_while_scanned_does_not_release() {
    for _ in 0..100 {
        let (r, p) = managed(percpu_ref::backend());
        get(&r, &p);
        put(&r, &p); // marks it: queued
        drop(r);
        assert_eq!(p.releases(), 0);
    }
}

/// A put that cannot count per CPU (`n >= 2^16`) polls the ref: it is
/// released all the same.
#[test]
fn a_large_put_is_seen() {
    for b in common::backends() {
        let (r, p) = managed(b);
        p.held.fetch_add(1 << 17, SeqCst);
        r.get_many(1 << 17);
        percpu_ref::flush();
        p.held.fetch_sub(1 << 17, SeqCst);
        r.put_many(1 << 17);
        put(&r, &p);
        percpu_ref::flush();
        assert_eq!(p.releases(), 1, "{b:?}");
    }
}

/// Many refs, half of them put: exactly those released by one flush, once each.
#[test]
fn many_refs_each_released_once() {
    let released = Arc::new(AtomicUsize::new(0));
    let n = common::scaled(10_000).max(2) & !1;
    let refs: Vec<Pin<Box<PercpuRef>>> = (0..n).map(|_| counting_managed(&released)).collect();
    for (i, r) in refs.iter().enumerate() {
        if i % 2 == 0 {
            r.put();
        }
    }
    percpu_ref::flush();
    assert_eq!(released.load(SeqCst), n / 2);
    for (i, r) in refs.iter().enumerate() {
        assert_eq!(r.is_zero(), i % 2 == 0, "ref {i}");
        if i % 2 == 1 {
            r.put();
        }
    }
    percpu_ref::flush();
    assert_eq!(released.load(SeqCst), n);
}

/// More threads than cores get and put a managed ref millions of times,
/// each holding a reference throughout, while the base reference is put
/// early: the engine scans it all along, and releases it once, only after
/// the last thread's last put.
#[test]
fn stress_never_early_exactly_once() {
    const THREADS: usize = 8;
    let ops = common::scaled(1_000_000);
    for b in common::backends() {
        let (r, p) = managed(b);
        // Each worker's own reference, taken before the base goes.
        for _ in 0..THREADS {
            get(&r, &p);
        }
        put(&r, &p);
        let start = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (r, p, start) = (r.clone(), p.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    for i in 0..ops {
                        if i % 3 == 0 {
                            p.held.fetch_add(1, SeqCst);
                            assert!(r.tryget(), "a tryget failed while a reference was held");
                        } else {
                            get(&r, &p);
                        }
                        put(&r, &p);
                        if i % 100_000 == t {
                            // A pause: other threads' puts bring the count down
                            // to the held references while this one sleeps.
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                    assert_eq!(p.releases(), 0, "released while this worker held one");
                    put(&r, &p);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let waited = wait_released(&p, Duration::from_secs(20));
        assert_eq!(
            p.releases(),
            1,
            "{b:?}: not released {waited:?} after the last put"
        );
        assert!(
            !p.early.load(SeqCst),
            "{b:?}: released while a reference was held"
        );
    }
}

/// Refs created, handed to the engine, used and dropped by many threads at
/// once (the engine's queue from every side): each released exactly once.
#[test]
fn stress_churn() {
    const THREADS: usize = 6;
    let per = common::scaled(20_000);
    let released = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let released = released.clone();
            thread::spawn(move || {
                let mut keep = Vec::new();
                for i in 0..per {
                    let r = counting_managed(&released);
                    r.get();
                    r.put();
                    r.put();
                    keep.push(r);
                    if i % 1000 == 999 {
                        percpu_ref::flush();
                        // Dropped once released (the engine is done with
                        // them: `Drop` waits for anything still pending).
                        keep.retain(|r| !r.is_zero());
                    }
                }
                keep
            })
        })
        .collect();
    let kept: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    percpu_ref::flush();
    assert_eq!(released.load(SeqCst), THREADS * per);
    assert!(kept.iter().all(|r| r.is_zero()));
}

/// A child forked while the parent's managed refs are in use, half of
/// them with a scan queued at that moment, puts the references it
/// inherited: each copy is released once, in the child, by the child's
/// own engine (started there anew); the parent's refs are untouched, and
/// released in the parent once it puts its own.
#[cfg(all(unix, not(miri)))]
#[test]
fn a_forked_child_puts_what_it_inherited() {
    const REFS: usize = 64;
    for _ in 0..common::scaled(20).max(2) {
        let released = Arc::new(AtomicUsize::new(0));
        let refs: Vec<Pin<Box<PercpuRef>>> = (0..REFS)
            .map(|_| {
                let r = counting_managed(&released);
                r.get();
                r
            })
            .collect();
        for r in refs.iter().step_by(2) {
            r.get();
            r.put(); // marks it: a scan queued across the fork
        }
        // SAFETY: the child runs this crate's code (its fork handlers hold
        // the engine's and the arena's locks across the fork) and std
        // allocation, then `_exit`s without unwinding.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for r in &refs {
                    r.put();
                    r.put();
                }
                percpu_ref::flush();
                if released.load(SeqCst) == REFS {
                    0
                } else {
                    2
                }
            }))
            .unwrap_or(3);
            // SAFETY: ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let status = common::wait_or_kill(pid, Duration::from_secs(60));
        assert!(
            matches!(status, Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0),
            "the child failed (exit 2: a release missing, 3: a panic): {status:?}"
        );
        assert_eq!(released.load(SeqCst), 0, "the parent saw a release");
        for r in &refs {
            r.put();
            r.put();
        }
        percpu_ref::flush();
        assert_eq!(released.load(SeqCst), REFS);
    }
}
