//! `Killed` awaited on tokio's multi-threaded runtime, with `Ref`s held
//! across `.await` points by thousands of tasks: what async users do.
//!
//! The runtime has more worker threads than the machine has cores, so tasks
//! migrate between threads (and CPUs) at every `.await`; a `Ref` moved to
//! another thread is put there, on that CPU's counter. Each test checks
//! counts that only come out right if the future resolves exactly when
//! the last reference is gone: every task's work is in the value the
//! `Killed` returns, and the value is dropped exactly once.
#![cfg(not(miri))] // tokio's runtime: threads, timers and epoll under Miri are out of scope

use percpu_ref::owned::{Owner, Ref};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

mod common;

/// Worker threads: more than the cores, at least 4.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 2 + 2
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers())
        .enable_time()
        .build()
        .unwrap()
}

/// A value that counts the work done through its references and its drops.
struct Hits {
    hits: AtomicU64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Hits {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

fn hits() -> (Owner<Hits>, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    (hits_counted_in(&drops), drops)
}

/// An owner of `Hits` whose drop is counted in `drops`.
fn hits_counted_in(drops: &Arc<AtomicUsize>) -> Owner<Hits> {
    Owner::new(Hits {
        hits: AtomicU64::new(0),
        drops: drops.clone(),
    })
}

/// Thousands of tasks each take a `Ref` through a `Weak` and hold it, and
/// clones of it, across `.await`s (yields and timer sleeps, so they resume
/// on other worker threads); the owner kills midway and awaits the value.
/// The tasks spawned after the kill find nothing (`tryget_live` fails from
/// the kill on, although references are still held). The value must hold every
/// hit of every task that got in: the future resolved only after the last
/// `Ref` was dropped, on whatever thread.
#[test]
fn killed_awaited_while_thousands_of_tasks_hold_refs() {
    let tasks = common::scaled(10_000);
    let rt = runtime();
    let (owner, drops) = hits();
    let weak = owner.downgrade();
    let killed_yet = Arc::new(AtomicBool::new(false));
    let (value, per_task) = rt.block_on(async move {
        let spawn = |i: usize| {
            let (weak, killed_yet) = (weak.clone(), killed_yet.clone());
            tokio::spawn(async move {
                let dead_before = killed_yet.load(SeqCst);
                let r = weak.tryget_live()?;
                assert!(!dead_before, "task {i}: a live Ref after the kill returned");
                let mut mine = 0;
                for round in 0..4 {
                    let r2: Ref<Hits> = r.clone();
                    if (i + round).is_multiple_of(3) {
                        tokio::time::sleep(Duration::from_micros(50)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    r2.hits.fetch_add(1, SeqCst);
                    mine += 1;
                }
                drop(r);
                Some(mine)
            })
        };
        // Half the tasks before the kill, half after: those must all find
        // nothing, while the first half's references are still held.
        let mut handles: Vec<_> = (0..tasks / 2).map(spawn).collect();
        // Kill once some task is inside (a fixed sleep let none in on a
        // loaded host): most of the first half still holds its `Ref`s.
        while owner.hits.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        let killed = owner.kill();
        killed_yet.store(true, SeqCst);
        handles.extend((tasks / 2..tasks).map(spawn));
        let value = killed.await;
        let mut per_task = Vec::with_capacity(handles.len());
        for h in handles {
            per_task.push(h.await.unwrap());
        }
        (value, per_task)
    });
    let got_in = per_task.iter().flatten().count();
    let total: u64 = per_task.iter().flatten().sum();
    assert_eq!(
        value.hits.load(SeqCst),
        total,
        "the Killed resolved before every task's last hit"
    );
    assert!(got_in > 0, "no task got a Ref before the kill");
    eprintln!(
        "{got_in} of {tasks} tasks got a Ref before the kill, {total} hits; {} workers",
        workers()
    );
    assert_eq!(drops.load(SeqCst), 0);
    drop(value);
    assert_eq!(drops.load(SeqCst), 1);
    drop(rt);
    common::report_counts();
}

/// One task awaits the kill of an object whose last `Ref` another task
/// holds until told; the future is pending until that task drops it, on
/// another worker thread, and then resolves with the value.
#[test]
fn awaiting_a_kill_whose_last_ref_another_task_drops() {
    let rt = runtime();
    for round in 0..common::scaled(200) {
        let (owner, drops) = hits();
        let r = owner.get();
        let (go, wait_go) = oneshot::channel::<()>();
        rt.block_on(async move {
            let holder = tokio::spawn(async move {
                wait_go.await.unwrap();
                r.hits.fetch_add(1, SeqCst);
                // The last reference, dropped on this task's thread.
                drop(r);
            });
            let waiter = tokio::spawn(async move {
                let mut killed = owner.kill();
                // Pending while `r` lives: a short timeout elapses.
                let early = tokio::time::timeout(Duration::from_millis(1), &mut killed).await;
                assert!(early.is_err(), "round {round}: resolved with a Ref alive");
                go.send(()).unwrap();
                killed.await
            });
            let value = waiter.await.unwrap();
            holder.await.unwrap();
            assert_eq!(value.hits.load(SeqCst), 1, "round {round}");
            drop(value);
        });
        assert_eq!(
            drops.load(SeqCst),
            1,
            "round {round}: the value dropped once"
        );
    }
}

/// `tokio::time::timeout` around an await that never completes (a `Ref`
/// held throughout) elapses and leaves the `Killed` usable; awaiting it
/// again after the `Ref` is gone gives the value. A `Killed` dropped while
/// pending (the timeout's future cancelled with it) gives up the value,
/// which the last `Ref` then drops, once.
#[test]
fn timeout_around_an_await_that_never_completes() {
    let rt = runtime();
    rt.block_on(async {
        // Timed out, then awaited to the end.
        let (owner, drops) = hits();
        let r = owner.get();
        let mut killed = owner.kill();
        for _ in 0..3 {
            let t = tokio::time::timeout(Duration::from_millis(5), &mut killed).await;
            assert!(t.is_err(), "resolved while a Ref is held");
        }
        assert!(!killed.is_released());
        let dropper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(r);
        });
        let value = tokio::time::timeout(Duration::from_secs(30), killed)
            .await
            .expect("the Ref is gone but the Killed did not resolve");
        dropper.await.unwrap();
        drop(value);
        assert_eq!(drops.load(SeqCst), 1);

        // Timed out, then the pending `Killed` dropped: the Ref's drop
        // drops the value.
        let (owner, drops) = hits();
        let r = owner.get();
        let killed = owner.kill();
        let t = tokio::time::timeout(Duration::from_millis(5), killed).await;
        assert!(t.is_err());
        drop(t); // the Killed inside the elapsed timeout is gone already
        assert_eq!(drops.load(SeqCst), 0, "dropped while a Ref is held");
        let r2 = tokio::spawn(async move {
            tokio::task::yield_now().await;
            r.hits.fetch_add(1, SeqCst);
            r
        })
        .await
        .unwrap();
        drop(r2);
        assert_eq!(drops.load(SeqCst), 1, "the last Ref dropped the value once");
    });
}

/// Many objects, each killed and awaited by its own task while other tasks
/// drop its references: every future resolves, every value is dropped
/// once.
#[test]
fn many_kills_awaited_concurrently() {
    let objects = common::scaled(2_000);
    let rt = runtime();
    let drops = Arc::new(AtomicUsize::new(0));
    let gp_before = percpu_ref::percpu::grace_periods();
    rt.block_on(async {
        let mut waiters = Vec::with_capacity(objects);
        for _ in 0..objects {
            let owner = hits_counted_in(&drops);
            let refs: Vec<_> = (0..3).map(|_| owner.get()).collect();
            for r in refs {
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    r.hits.fetch_add(1, SeqCst);
                });
            }
            waiters.push(tokio::spawn(async move { owner.kill().await }));
        }
        for w in waiters {
            let v = w.await.unwrap();
            assert_eq!(v.hits.load(SeqCst), 3);
        }
    });
    assert_eq!(drops.load(SeqCst), objects);
    // Process-wide, so the other tests' kills count too: a report, not a
    // check (tests/grace_batching.rs checks the sharing).
    let gps = percpu_ref::percpu::grace_periods() - gp_before;
    eprintln!("{objects} kills awaited, {gps} grace periods in the process meanwhile");
}
