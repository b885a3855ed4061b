//! `percpu_ref::shared` under concurrency: values promoted while in use,
//! dropped exactly once and never while a handle exists; dropped from
//! thread-local destructors, in a forked child, and with a panicking
//! `Drop`.
//!
//! The stress tests run more threads than cores and millions of
//! operations, with promotions and engine scans in the middle of them.

use percpu_ref::shared::{Shared, Weak, PROMOTE_AFTER};
use percpu_ref::Backend;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

mod common;

/// A value that records its drop: `dead` is set by `Drop` (a use after it
/// is a use after free as far as the test can see), and `drops` counts.
struct Canary {
    dead: AtomicBool,
    drops: Arc<AtomicUsize>,
}

impl Canary {
    fn new(drops: &Arc<AtomicUsize>) -> Canary {
        Canary {
            dead: AtomicBool::new(false),
            drops: drops.clone(),
        }
    }

    fn check(&self) {
        assert!(!self.dead.load(SeqCst), "a value was used after its drop");
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        assert!(!self.dead.swap(true, SeqCst), "a value was dropped twice");
        self.drops.fetch_add(1, SeqCst);
    }
}

/// More threads than cores clone and drop fresh values (each promoted in
/// the middle of the stream, by whichever clone crosses the threshold)
/// and upgrade `Weak`s to them, millions of times: every value is dropped
/// once, after the last handle, never while one exists.
#[test]
fn stress_promoted_in_use_dropped_once() {
    const THREADS: usize = 8;
    const VALUES: usize = 16;
    let ops = common::scaled(1_000_000) / VALUES;
    let drops = Arc::new(AtomicUsize::new(0));
    for round in 0..VALUES {
        let value = Shared::new(Canary::new(&drops));
        let weak = Shared::downgrade(&value);
        let start = Arc::new(Barrier::new(THREADS));
        let done = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (mine, weak, start) = (value.clone(), weak.clone(), start.clone());
                let done = done.clone();
                thread::spawn(move || {
                    start.wait();
                    for i in 0..ops {
                        let h = if i % 3 == 0 {
                            weak.upgrade()
                                .expect("an upgrade failed while a handle exists")
                        } else {
                            mine.clone()
                        };
                        h.check();
                        drop(h);
                        if i % 50_000 == t {
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                    mine.check();
                    // Promoted by the stream's clones (where the backend can),
                    // once every worker's clones have returned: the clone that
                    // crossed the threshold promotes before it returns, and it
                    // may be another thread's, preempted.
                    done.wait();
                    assert!(
                        Shared::is_percpu(&mine) || percpu_ref::backend() != Backend::Rseq,
                        "a value cloned {ops} times on {THREADS} threads was not promoted"
                    );
                })
            })
            .collect();
        // The creator's handle goes early: the workers' own keep it alive.
        drop(value);
        for w in workers {
            w.join().unwrap();
        }
        percpu_ref::flush();
        // `flush` runs at most 8 engine rounds; with the other tests of
        // this binary keeping the engine busy, the value's scan may need a
        // few more: wait, bounded (a lost release never comes).
        let t0 = std::time::Instant::now();
        let mut flushes = 1;
        while drops.load(SeqCst) == round && t0.elapsed() < Duration::from_secs(20) {
            thread::sleep(Duration::from_millis(1));
            percpu_ref::flush();
            flushes += 1;
        }
        assert_eq!(
            drops.load(SeqCst),
            round + 1,
            "value {round} not dropped once after {flushes} flushes ({:?})",
            t0.elapsed()
        );
        if flushes > 1 {
            eprintln!(
                "value {round}: dropped after {flushes} flushes ({:?})",
                t0.elapsed()
            );
        }
        assert!(weak.upgrade().is_none());
    }
}

/// Values made, cloned (some past the promotion threshold), sent to other
/// threads and dropped there, by many threads at once: each dropped once.
#[test]
fn stress_churn() {
    const THREADS: usize = 6;
    let per = common::scaled(20_000);
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Shared<Canary>>>();
    let sink = thread::spawn(move || {
        for batch in rx {
            for s in &batch {
                s.check();
            }
        }
    });
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (drops, tx) = (drops.clone(), tx.clone());
            thread::spawn(move || {
                let mut batch = Vec::new();
                for i in 0..per {
                    let s = Shared::new(Canary::new(&drops));
                    // 0 to 2 * PROMOTE_AFTER clones: about half promoted.
                    let clones = (i * 7 + t) % (2 * PROMOTE_AFTER as usize);
                    for _ in 0..clones {
                        drop(s.clone());
                    }
                    if i % 2 == 0 {
                        batch.push(s);
                    }
                    if batch.len() == 100 {
                        tx.send(std::mem::take(&mut batch)).unwrap();
                    }
                }
                tx.send(batch).unwrap();
            })
        })
        .collect();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    sink.join().unwrap();
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), THREADS * per);
}

thread_local! {
    static KEPT: RefCell<Vec<Shared<Canary>>> = const { RefCell::new(Vec::new()) };
}

/// Handles dropped by a thread-local's destructor, as the thread exits
/// (promoted and not): the values are dropped once, nothing aborts.
#[test]
fn dropped_in_thread_local_destructors() {
    let drops = Arc::new(AtomicUsize::new(0));
    let hot = Shared::new(Canary::new(&drops));
    Shared::promote(&hot);
    let cold = Shared::new(Canary::new(&drops));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (hot, cold) = (hot.clone(), cold.clone());
            thread::spawn(move || {
                for _ in 0..1000 {
                    drop(hot.clone());
                }
                KEPT.with(|k| k.borrow_mut().extend([hot, cold]));
            })
        })
        .collect();
    drop((hot, cold));
    for t in threads {
        t.join().unwrap();
    }
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 2);
}

/// A value whose `Drop` panics: in atomic mode the panic reaches the
/// dropping thread; once promoted the engine reports it. Either way the
/// other values go on.
#[test]
fn a_panicking_drop() {
    struct Bomb(Arc<AtomicUsize>);
    impl Drop for Bomb {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            panic!("Bomb::drop panics");
        }
    }
    let n = Arc::new(AtomicUsize::new(0));
    let cold = Shared::new(Bomb(n.clone()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(cold)));
    assert!(r.is_err());
    assert_eq!(n.load(SeqCst), 1);
    let hot = Shared::new(Bomb(n.clone()));
    let promoted = Shared::promote(&hot);
    if promoted {
        drop(hot); // the engine drops it, and reports the panic on stderr
        percpu_ref::flush();
        assert_eq!(n.load(SeqCst), 2);
    } else {
        std::mem::forget(hot);
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let after = Shared::new(Canary::new(&drops));
    Shared::promote(&after);
    drop(after);
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1);
}

/// An upgrade between the last drop of a promoted value and the engine's
/// look revives it (documented: `Weak::upgrade`); the value is still
/// dropped once, after the revived handle.
#[test]
fn an_upgrade_may_revive_a_promoted_value() {
    let drops = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let s = Shared::new(Canary::new(&drops));
        Shared::promote(&s);
        let w: Weak<Canary> = Shared::downgrade(&s);
        let before = drops.load(SeqCst);
        drop(s);
        if let Some(again) = w.upgrade() {
            again.check();
            assert_eq!(drops.load(SeqCst), before);
        }
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), before + 1);
        assert!(w.upgrade().is_none());
    }
}

/// A child forked while the parent's values are in use drops the handles
/// it inherited: each copy is dropped once, in the child, by its own
/// engine; the parent's values are untouched.
#[cfg(all(unix, not(miri)))]
#[test]
fn a_forked_child_drops_what_it_inherited() {
    const VALUES: usize = 32;
    for _ in 0..common::scaled(10).max(2) {
        let drops = Arc::new(AtomicUsize::new(0));
        let values: Vec<Shared<Canary>> = (0..VALUES)
            .map(|i| {
                let s = Shared::new(Canary::new(&drops));
                if i % 2 == 0 {
                    Shared::promote(&s);
                    drop(s.clone()); // a scan queued across the fork
                }
                s
            })
            .collect();
        let copies = values.clone();
        // SAFETY: the child runs this crate's code and std allocation, then
        // `_exit`s without unwinding.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                drop(values);
                drop(copies);
                percpu_ref::flush();
                if drops.load(SeqCst) == VALUES {
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
            "the child failed (exit 2: a drop missing, 3: a panic): {status:?}"
        );
        assert_eq!(drops.load(SeqCst), 0, "the parent saw a drop");
        drop(copies);
        assert_eq!(drops.load(SeqCst), 0);
        drop(values);
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), VALUES);
    }
}
