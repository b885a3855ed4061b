use super::block::*;
use super::*;
use crate::sync::unmodeled::AtomicUsize as StdAtomicUsize;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Blocks allocated and not yet freed, over every test in this binary.
pub(super) static LIVE_BLOCKS: StdAtomicUsize = StdAtomicUsize::new(0);

/// Serialises the tests that check `LIVE_BLOCKS` (tests run in parallel).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // An earlier test's kill completed by the engine may free its block
    // now, under this test's count: let every queued kill finish first.
    crate::flush();
    g
}

/// Counts its drops.
#[derive(Debug)]
struct Tracked {
    drops: Arc<StdAtomicUsize>,
    payload: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops
            .fetch_add(1, crate::sync::unmodeled::Ordering::SeqCst);
    }
}

fn tracked(payload: u64) -> (Tracked, Arc<StdAtomicUsize>) {
    let drops = Arc::new(StdAtomicUsize::new(0));
    (
        Tracked {
            drops: drops.clone(),
            payload,
        },
        drops,
    )
}

fn drops(d: &StdAtomicUsize) -> usize {
    d.load(crate::sync::unmodeled::Ordering::SeqCst)
}

fn live_blocks() -> usize {
    LIVE_BLOCKS.load(crate::sync::unmodeled::Ordering::SeqCst)
}

#[test]
fn owner_drop_without_refs_drops_value_and_block() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(1);
    let o = Owner::new(v);
    let w = o.downgrade();
    assert_eq!(live_blocks(), before + 1);
    drop(o);
    assert_eq!(drops(&d), 1, "implicit kill with no Ref drops T at once");
    assert!(w.tryget().is_none());
    assert_eq!(live_blocks(), before + 1, "the Weak keeps the block");
    drop(w);
    assert_eq!(live_blocks(), before, "block freed with the last unit");
}

#[test]
fn owner_drop_of_a_value_without_drop_glue_is_deferred_and_frees_the_block() {
    let _s = serial();
    let before = live_blocks();
    // No Ref, no Weak: the engine's put releases, and it alone can pay
    // the count's unit, after it is done with the ref.
    drop(Owner::new(1u64));
    let o = Owner::new(2u64);
    let w = o.downgrade();
    let r = o.get();
    drop(o);
    assert!(w.tryget_live().is_none(), "dying once the drop returned");
    crate::flush();
    assert!(w.tryget().is_some(), "r still holds it");
    drop(r);
    assert!(w.tryget().is_none());
    drop(w);
    assert_eq!(live_blocks(), before, "every block freed, none twice");
}

#[test]
fn killed_of_a_value_with_drop_glue_dropped_at_once_drops_it_here() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(6);
    let o = Owner::new(v);
    // Waits for the engine, which must not drop a `T` that may be
    // neither `Send` nor `'static`: `T` goes on this thread.
    drop(o.kill());
    assert_eq!(drops(&d), 1);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn owner_drop_with_refs_last_ref_drops_value() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(2);
    let o = Owner::new(v);
    let r = o.get();
    let r2 = r.clone();
    drop(o);
    assert_eq!(drops(&d), 0);
    assert_eq!(r.payload, 2);
    drop(r);
    assert_eq!(drops(&d), 0);
    let t = std::thread::spawn(move || drop(r2));
    t.join().unwrap();
    assert_eq!(drops(&d), 1, "the last Ref dropped T");
    assert_eq!(live_blocks(), before);
}

#[test]
fn killed_wait_takes_value_without_dropping() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(3);
    let o = Owner::new(v);
    let r = o.get();
    let k = o.kill();
    assert!(!k.is_released());
    let k = k.wait_timeout(Duration::from_millis(1)).unwrap_err();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        drop(r);
    });
    let v = k.wait();
    t.join().unwrap();
    assert_eq!(v.payload, 3);
    assert_eq!(drops(&d), 0, "wait hands T back, release left it alone");
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
    drop(v);
    assert_eq!(drops(&d), 1);
}

#[test]
fn killed_dropped_before_release_leaves_value_to_last_ref() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(4);
    let o = Owner::new(v);
    let r = o.get();
    drop(o.kill());
    assert_eq!(drops(&d), 0);
    drop(r);
    assert_eq!(drops(&d), 1);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn killed_dropped_after_release_drops_value() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(5);
    let o = Owner::new(v);
    let r = o.get();
    let k = o.kill();
    crate::flush(); // the deferred kill is complete
    drop(r);
    assert!(k.is_released());
    assert_eq!(drops(&d), 0, "claimed: release must not drop T");
    drop(k);
    assert_eq!(drops(&d), 1);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn tryget_and_tryget_live_follow_kill_and_release() {
    let _s = serial();
    let o = Owner::new(7u32);
    let w = o.downgrade();
    let r = w.tryget_live().expect("live");
    let k = o.kill();
    crate::flush(); // the deferred kill is complete
    assert!(w.tryget_live().is_none());
    let r2 = w.tryget().expect("dying but referenced");
    drop(r);
    assert!(!k.is_released());
    drop(r2);
    assert!(w.tryget().is_none());
    assert_eq!(k.try_take().unwrap(), 7);
}

#[test]
fn freeze_excludes_refs_and_unfreeze_revives() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(10);
    let mut o = Owner::new(v);
    let w = o.downgrade();
    for round in 0..5u64 {
        let r = o.get();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            drop(r);
        });
        {
            let mut f = o.freeze();
            assert!(w.tryget_live().is_none());
            assert!(w.tryget().is_none());
            f.payload += 1;
        }
        t.join().unwrap();
        assert_eq!(w.tryget_live().unwrap().payload, 11 + round);
    }
    assert_eq!(drops(&d), 0, "freeze never drops T");
    drop(o);
    assert_eq!(drops(&d), 1);
    drop(w);
    assert_eq!(live_blocks(), before);
}

#[test]
fn freeze_timeout_undoes_cleanly() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(20);
    let mut o = Owner::new(v);
    let w = o.downgrade();
    let r = o.get();
    let e = o.freeze_timeout(Duration::from_millis(5)).unwrap_err();
    assert!(e.to_string().contains("freeze_timeout"));
    assert_eq!(r.payload, 20);
    assert!(w.tryget_live().is_some(), "live again after the undo");
    drop(r);
    // The undo left the counts consistent: a freeze now drains at once.
    o.freeze_timeout(Duration::ZERO).unwrap().payload = 21;
    assert_eq!(o.payload, 21);
    let k = o.kill();
    assert_eq!(k.wait().payload, 21);
    assert_eq!(drops(&d), 1);
    drop(w);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn leaked_freeze_guard_stays_frozen_and_drops_value_with_owner() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(30);
    let mut o = Owner::new(v);
    let w = o.downgrade();
    std::mem::forget(o.freeze());
    assert!(w.tryget().is_none());
    assert_eq!(o.payload, 30);
    let msg = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(o.get()))).unwrap_err();
    assert!(msg
        .downcast_ref::<&str>()
        .is_some_and(|m| m.contains("Owner::get")));
    drop(o);
    assert_eq!(drops(&d), 1);
    drop(w);
    assert_eq!(live_blocks(), before);
}

#[test]
fn weak_inside_value_pointing_to_itself() {
    let _s = serial();
    let before = live_blocks();
    struct Node {
        me: Option<Weak<std::sync::Mutex<Node>>>,
    }
    let o = Owner::new(std::sync::Mutex::new(Node { me: None }));
    o.lock().unwrap().me = Some(o.downgrade());
    let r = o
        .lock()
        .unwrap()
        .me
        .as_ref()
        .unwrap()
        .tryget_live()
        .unwrap();
    drop(o);
    drop(r); // release drops T, which drops a Weak of its own block
    assert_eq!(live_blocks(), before);
}

#[test]
fn value_may_borrow_from_the_stack() {
    let _s = serial();
    let s = String::from("borrowed");
    let o = Owner::new(s.as_str());
    let r = o.get();
    assert_eq!(*r, "borrowed");
    drop(o);
    drop(r);
}

/// Panics in its `Drop` (after counting the drop).
struct PanicsOnDrop(Arc<StdAtomicUsize>);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.0
            .fetch_add(1, crate::sync::unmodeled::Ordering::SeqCst);
        panic!("T::drop failed on purpose");
    }
}

#[test]
fn a_panicking_value_drop_in_release_still_frees_the_block() {
    let _s = serial();
    let before = live_blocks();
    let d = Arc::new(StdAtomicUsize::new(0));
    // Released by the last Ref's drop.
    let o = Owner::new(PanicsOnDrop(d.clone()));
    let r = o.get();
    drop(o);
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(r))).unwrap_err();
    assert_eq!(e.downcast_ref::<&str>(), Some(&"T::drop failed on purpose"));
    assert_eq!(drops(&d), 1);
    assert_eq!(live_blocks(), before, "the block was freed all the same");
    // Released by the owner's own kill.
    let o = Owner::new(PanicsOnDrop(d.clone()));
    let w = o.downgrade();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(o))).unwrap_err();
    assert_eq!(drops(&d), 2);
    assert!(w.tryget().is_none());
    drop(w);
    assert_eq!(live_blocks(), before);
    // Dropped by a `Killed` after the release.
    let o = Owner::new(PanicsOnDrop(d.clone()));
    let r = o.get();
    let k = o.kill();
    drop(r);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(k))).unwrap_err();
    assert_eq!(drops(&d), 3);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
    // No unit was left owed on this thread.
    assert!(OWED.with(Cell::take).is_none());
}

#[test]
fn raw_round_trip_keeps_the_reference_and_the_block() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(50);
    let o = Owner::new(v);
    let w = o.downgrade();
    let p = Ref::into_raw(o.get());
    let k = o.kill();
    crate::flush(); // the deferred kill is complete
    assert!(!k.is_released(), "the raw reference still counts");
    assert!(
        w.tryget().is_some(),
        "and keeps the object dying, not released"
    );
    // SAFETY: `p` came from `into_raw` and is turned back once.
    let r = unsafe { Ref::from_raw(p) };
    assert_eq!(r.payload, 50);
    drop(r);
    assert!(k.is_released(), "from_raw's Ref put the raw reference");
    assert_eq!(k.wait().payload, 50);
    assert_eq!(drops(&d), 1);
    drop(w);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn empty_weak_allocates_and_frees_nothing() {
    let _s = serial();
    let before = live_blocks();
    let w: Weak<Tracked> = Weak::new();
    let w2 = w.clone();
    assert!(w2.tryget().is_none() && w2.tryget_live().is_none());
    assert_eq!(live_blocks(), before);
    drop((w, w2));
    assert_eq!(live_blocks(), before);
}

/// Counts its wakes.
struct CountWakes(StdAtomicUsize);

impl std::task::Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0
            .fetch_add(1, crate::sync::unmodeled::Ordering::SeqCst);
    }
}

#[test]
fn killed_future_takes_the_value_and_gives_up_the_unit() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(60);
    let o = Owner::new(v);
    let r = o.get();
    let mut k = o.kill();
    crate::flush(); // the deferred kill is complete
    let wakes = Arc::new(CountWakes(StdAtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut k).poll(&mut cx).is_pending());
    assert_eq!(wakes.0.load(crate::sync::unmodeled::Ordering::SeqCst), 0);
    drop(r);
    assert_eq!(wakes.0.load(crate::sync::unmodeled::Ordering::SeqCst), 1);
    match Pin::new(&mut k).poll(&mut cx) {
        Poll::Ready(v) => assert_eq!(v.payload, 60),
        Poll::Pending => panic!("released but pending"),
    }
    assert_eq!(drops(&d), 1, "the value was handed out and dropped once");
    assert_eq!(
        live_blocks(),
        before,
        "the owner's unit went with the value"
    );
    assert!(k.is_released());
    drop(k); // a completed future drops nothing more
    assert_eq!(drops(&d), 1);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn killed_dropped_while_pending_drops_its_waker_and_leaves_value_to_last_ref() {
    let _s = serial();
    let before = live_blocks();
    let (v, d) = tracked(70);
    let o = Owner::new(v);
    let r = o.get();
    let mut k = o.kill();
    let wakes = Arc::new(CountWakes(StdAtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    assert!(Pin::new(&mut k)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    assert_eq!(Arc::strong_count(&wakes), 3, "registered");
    drop(k);
    assert_eq!(
        Arc::strong_count(&wakes),
        2,
        "the waker went with the Killed"
    );
    drop(r);
    assert_eq!(wakes.0.load(crate::sync::unmodeled::Ordering::SeqCst), 0);
    assert_eq!(drops(&d), 1);
    // A release run by the engine frees the block once the engine is
    // done with it, maybe just after the waiter woke.
    crate::flush();
    assert_eq!(live_blocks(), before);
}

#[test]
fn ref_drops_inside_value_drop_settle_their_own_units() {
    let _s = serial();
    let before = live_blocks();
    // T of the outer object holds the last Ref of an inner object: the
    // outer release runs the inner release on the same thread.
    let (v, d) = tracked(40);
    let inner_owner = Owner::new(v);
    let inner_ref = inner_owner.get();
    drop(inner_owner);
    let outer = Owner::new(inner_ref);
    let outer_ref = outer.get();
    drop(outer);
    drop(outer_ref);
    assert_eq!(drops(&d), 1);
    assert_eq!(live_blocks(), before);
}
