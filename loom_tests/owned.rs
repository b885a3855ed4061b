//! Loom models of the owned layer (`percpu_ref::owned`): the races between
//! the last reference's drop and kill / the waiter / a dropped `Killed`, and
//! between freeze and `tryget_live`.
//!
//! `T` holds a `loom::cell::UnsafeCell`, so a `Ref` reading it while a
//! `Frozen` guard writes it is reported as a data race, and a drop counter,
//! so a double or missing drop of `T` fails the model.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test loom_owned`
#![cfg(percpu_ref_loom)]

mod common;
use common::check;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize as LoomAtomicUsize, Ordering as LoomOrdering};
use loom::thread;
use percpu_ref::owned::Owner;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// A value whose two halves must agree, and which counts its drops.
struct Checked {
    a: UnsafeCell<u64>,
    b: UnsafeCell<u64>,
    drops: Arc<AtomicUsize>,
}

impl Checked {
    fn new(v: u64) -> (Checked, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        (
            Checked {
                a: UnsafeCell::new(v),
                b: UnsafeCell::new(!v),
                drops: drops.clone(),
            },
            drops,
        )
    }

    /// Reads both halves (a tracked read: loom reports a racing write).
    fn read(&self) -> u64 {
        // SAFETY: loom checks this read against every write for a race.
        let a = self.a.with(|p| unsafe { *p });
        // SAFETY: as above.
        let b = self.b.with(|p| unsafe { *p });
        assert_eq!(a, !b, "torn value: {a:#x} / {b:#x}");
        a
    }

    /// Writes both halves (`&mut self`: callers need exclusive access).
    fn bump(&mut self) {
        let v = self.read() + 1;
        // SAFETY: `&mut self`; loom reports any access racing this write.
        self.a.with_mut(|p| unsafe { *p = v });
        // SAFETY: as above.
        self.b.with_mut(|p| unsafe { *p = !v });
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        self.read(); // also a tracked access: a drop racing a reader is a race
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn drops(d: &AtomicUsize) -> usize {
    d.load(Ordering::SeqCst)
}

/// The last `Ref` is dropped on another thread while the owner kills and
/// waits: the waiter gets `T` back intact, and nobody drops it.
#[test]
fn ref_drop_races_kill_and_wait() {
    loom::model(|| {
        let (v, d) = Checked::new(1);
        let owner = Owner::new(v);
        let r = owner.get();
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 1);
            drop(r);
        });
        let killed = owner.kill();
        let value = killed.wait();
        assert_eq!(value.read(), 1);
        assert_eq!(drops(&d), 0, "release dropped a claimed T");
        t.join().unwrap();
        drop(value);
        assert_eq!(drops(&d), 1);
    });
}

/// The last `Ref`'s drop races the owner's drop (implicit kill): `T` is
/// dropped exactly once, by whichever thread was last.
#[test]
fn ref_drop_races_owner_drop() {
    loom::model(|| {
        let (v, d) = Checked::new(2);
        let owner = Owner::new(v);
        let r = owner.get();
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 2);
            drop(r);
        });
        drop(owner);
        t.join().unwrap();
        assert_eq!(drops(&d), 1);
    });
}

/// An `Owner` of a value without drop glue is dropped with a deferred kill
/// while the last `Ref` is dropped on another thread and the engine
/// completes the kill on a third: whichever put is last, the object is
/// released once and the block freed once, after every holder's last
/// access (the block's loom-only `freed` cell) and after the engine's
/// (the ref's `Drop` waits for it; the engine pays a unit its release
/// owes only once it is done). Catches a release on the engine that pays
/// its unit inside the engine's call, or never.
#[test]
fn deferred_owner_drop_races_ref_drop_and_engine() {
    check(2, || {
        let owner = Owner::new(5u64);
        let r = owner.get();
        let w = owner.downgrade();
        let t = thread::spawn(move || {
            assert_eq!(*r, 5);
            drop(r);
        });
        drop(owner);
        assert!(w.tryget_live().is_none(), "dying once the drop returned");
        let engine = thread::spawn(|| {
            percpu_ref::loom_support::step();
        });
        t.join().unwrap();
        engine.join().unwrap();
        percpu_ref::flush();
        assert!(w.tryget().is_none(), "not released");
        drop(w);
        assert_eq!(percpu_ref::loom_support::live_blocks(), 0, "a block leaked");
    });
}

/// The last `Ref`'s drop races dropping the `Killed` (no waiter): the hand
/// over of `T` under the state lock drops it exactly once.
#[test]
fn ref_drop_races_killed_drop() {
    loom::model(|| {
        let (v, d) = Checked::new(3);
        let owner = Owner::new(v);
        let r = owner.get();
        let killed = owner.kill();
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 3);
            drop(r);
        });
        drop(killed);
        t.join().unwrap();
        assert_eq!(drops(&d), 1);
    });
}

/// A lookup with `tryget_live` races a freeze/unfreeze: a `Ref` that it
/// gets never overlaps the `&mut T` (loom would report the race on the
/// cells), and it sees either the old or the new value, whole.
#[test]
fn freeze_races_tryget_live() {
    // Bounded (3 preemptions), as the other tryget models: the tryget's
    // compare-and-swap loop (a load, then the CAS, retried when the freeze
    // moves the count) made the exhaustive search take minutes.
    check(3, || {
        let (v, d) = Checked::new(10);
        let mut owner = Owner::new(v);
        let weak = owner.downgrade();
        let t = thread::spawn(move || {
            if let Some(r) = weak.tryget_live() {
                let x = r.read();
                assert!(x == 10 || x == 11, "saw {x}");
            }
        });
        owner.freeze().bump();
        assert_eq!(owner.read(), 11);
        t.join().unwrap();
        drop(owner);
        assert_eq!(drops(&d), 1);
    });
}

/// A lookup with `tryget` (not `tryget_live`) races a freeze/unfreeze.
/// `tryget` succeeds on the atomic path as soon as the unfreeze has put the
/// new base reference back, before the mode word goes percpu: it must then
/// see the writes made through the `Frozen` guard (the revival's add is a
/// release, the tryget's CAS an acquire). Fails on the mutant
/// `revive_base_ref_relaxed` with a causality violation on the cells.
#[test]
fn freeze_races_tryget() {
    // Bounded (3 preemptions), as the other tryget models: the tryget's
    // compare-and-swap loop (a load, then the CAS, retried when the freeze
    // moves the count) made the exhaustive search take minutes.
    check(3, || {
        let (v, d) = Checked::new(30);
        let mut owner = Owner::new(v);
        let weak = owner.downgrade();
        let t = thread::spawn(move || {
            if let Some(r) = weak.tryget() {
                let x = r.read();
                assert!(x == 30 || x == 31, "saw {x}");
            }
        });
        owner.freeze().bump();
        assert_eq!(owner.read(), 31);
        t.join().unwrap();
        drop(owner);
        assert_eq!(drops(&d), 1);
    });
}

/// A non-blocking freeze (`freeze_timeout(0)`) races the last `Ref`'s drop:
/// either it freezes (the drop came first, or the count reached zero while
/// it gave up), or it undoes the freeze with the count intact. Either way
/// a later freeze drains and `T` is dropped once.
#[test]
fn try_freeze_races_last_ref_drop() {
    loom::model(|| {
        let (v, d) = Checked::new(20);
        let mut owner = Owner::new(v);
        let r = owner.get();
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 20);
            drop(r);
        });
        if let Ok(mut f) = owner.freeze_timeout(Duration::ZERO) {
            f.bump();
        }
        t.join().unwrap();
        // No reference is left: a freeze now cannot block, and the count
        // came back whole from whichever path was taken.
        owner.freeze().bump();
        let x = owner.read();
        assert!(x == 21 || x == 22, "saw {x}");
        assert_eq!(drops(&d), 0);
        drop(owner);
        assert_eq!(drops(&d), 1);
    });
}

/// `Weak::tryget_live` on another thread after `Owner::kill` has returned
/// (seen through a release/acquire flag) fails, even while a `Ref` keeps
/// the killed object referenced; one that ran before the kill holds a
/// reference to an intact, undropped `T`, and the waiter gets `T` back only
/// after it is dropped. The `Weak` is dropped on that thread, racing the
/// waiter's free of the block. Catches `owned_tryget_live_as_tryget` (a
/// killed object still referenced hands out new references) and, with the
/// block's loom-visible free, `owned_unit_put_release_only`.
#[test]
fn tryget_live_after_kill_returned() {
    check(3, || {
        let (v, d) = Checked::new(40);
        let owner = Owner::new(v);
        let weak = owner.downgrade();
        let r = owner.get(); // keeps the killed object referenced
        let killed_flag = loom::sync::Arc::new(LoomAtomicUsize::new(0));
        let t = {
            let killed_flag = killed_flag.clone();
            let d = d.clone();
            thread::spawn(move || {
                let killed = killed_flag.load(LoomOrdering::Acquire) == 1;
                if let Some(x) = weak.tryget_live() {
                    assert!(!killed, "tryget_live succeeded after kill returned");
                    assert_eq!(x.read(), 40);
                    assert_eq!(drops(&d), 0, "a live Ref to a dropped T");
                }
                drop(weak);
            })
        };
        let killed = owner.kill();
        killed_flag.store(1, LoomOrdering::Release);
        drop(r);
        let value = killed.wait();
        assert_eq!(value.read(), 40);
        t.join().unwrap();
        assert_eq!(drops(&d), 0, "release dropped a claimed T");
        drop(value);
        assert_eq!(drops(&d), 1);
    });
}

/// `Weak::tryget_live` on another thread while the object is frozen (after
/// `Owner::freeze` has returned and before the guard unfreezes, seen
/// through a release/acquire phase word) fails, and a `Ref` that thread
/// held before is gone before the guard writes `T` (loom reports a read
/// racing the write otherwise). Catches `owned_freeze_no_drain`: no
/// owned-layer mutant can make a tryget_live succeed while frozen without
/// also breaking the zero check, since the count is zero then.
#[test]
fn tryget_live_while_frozen() {
    const LIVE: usize = 0;
    const FROZEN: usize = 1;
    const UNFROZEN: usize = 2;
    check(3, || {
        let (v, d) = Checked::new(50);
        let mut owner = Owner::new(v);
        let weak = owner.downgrade();
        let r = owner.get();
        let phase = loom::sync::Arc::new(LoomAtomicUsize::new(LIVE));
        let t = {
            let phase = phase.clone();
            thread::spawn(move || {
                assert_eq!(r.read(), 50);
                drop(r);
                let before = phase.load(LoomOrdering::Acquire);
                let got = weak.tryget_live();
                let after = phase.load(LoomOrdering::Acquire);
                if let Some(x) = got {
                    assert!(
                        !(before == FROZEN && after == FROZEN),
                        "tryget_live succeeded while frozen"
                    );
                    let x = x.read();
                    assert!(x == 50 || x == 51, "saw {x}");
                }
            })
        };
        {
            let mut f = owner.freeze();
            phase.store(FROZEN, LoomOrdering::Release);
            f.bump();
            phase.store(UNFROZEN, LoomOrdering::Release);
        }
        t.join().unwrap();
        assert_eq!(owner.read(), 51);
        drop(owner);
        assert_eq!(drops(&d), 1);
    });
}

/// Counts its wakes in a loom atomic (the waker hand-off is what is checked).
struct CountWakes(LoomAtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, LoomOrdering::Release);
    }
}

/// The `Killed` future's waker hand-off: the last `Ref` is dropped on one
/// thread while the other polls the future once and, if it is pending,
/// waits for the other thread (a task parked until woken). The poll either
/// returned `T`, or registered a waker that the last drop woke — never
/// neither (a lost wake-up: the task would sleep for good) — and a poll
/// after the wake returns `T` intact, undropped. Catches
/// `owned_future_no_recheck` (the poll checks, then registers its waker in
/// a second critical section: a release in between finds no waker).
#[test]
fn killed_future_wakes_after_last_ref_drop() {
    loom::model(|| {
        let (v, d) = Checked::new(60);
        let owner = Owner::new(v);
        let r = owner.get();
        let mut killed = owner.kill();
        // The engine completes the kill (puts the base reference): the
        // future then waits for `r` alone.
        percpu_ref::flush();
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 60);
            drop(r);
        });
        let wakes = Arc::new(CountWakes(LoomAtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let value = match Pin::new(&mut killed).poll(&mut cx) {
            Poll::Ready(v) => {
                t.join().unwrap();
                v
            }
            Poll::Pending => {
                t.join().unwrap(); // the last reference is gone now
                assert_eq!(
                    wakes.0.load(LoomOrdering::Acquire),
                    1,
                    "pending, and the last drop did not wake the task"
                );
                match Pin::new(&mut killed).poll(&mut cx) {
                    Poll::Ready(v) => v,
                    Poll::Pending => panic!("woken, released, and still pending"),
                }
            }
        };
        assert_eq!(value.read(), 60);
        assert_eq!(drops(&d), 0, "release dropped a claimed T");
        drop(killed); // completed: drops nothing
        drop(value);
        assert_eq!(drops(&d), 1);
    });
}

/// A `Killed` future that was polled (its waker registered) is dropped
/// while the last `Ref` is dropped on another thread: `T` is dropped exactly
/// once, by whichever side came second, and the waker is woken at most
/// once. (A release that took the waker before the drop may wake it just
/// after the `Killed` is gone: a spurious wake of a finished task, which
/// wakers must tolerate.)
#[test]
fn pending_killed_future_dropped_races_last_ref_drop() {
    loom::model(|| {
        let (v, d) = Checked::new(70);
        let owner = Owner::new(v);
        let r = owner.get();
        let mut killed = owner.kill();
        let wakes = Arc::new(CountWakes(LoomAtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let polled = Pin::new(&mut killed).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending(), "`r` still holds the object");
        let t = thread::spawn(move || {
            assert_eq!(r.read(), 70);
            drop(r);
        });
        drop(killed);
        t.join().unwrap();
        assert_eq!(drops(&d), 1);
        let woken = wakes.0.load(LoomOrdering::Acquire);
        assert!(woken <= 1, "woken {woken} times");
        drop(waker);
        assert_eq!(Arc::strong_count(&wakes), 1, "a registered waker leaked");
    });
}
