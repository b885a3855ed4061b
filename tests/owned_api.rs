//! The owned layer's `Arc`-parity API: `Weak::new`, the raw-pointer round
//! trip, the traits that delegate to `T`, unwind safety, and `Killed` as a
//! future (woken by the last reference's drop on another thread).
//!
//! Run: `cargo test --release --test owned_api`. Sized by `cfg!(miri)` so
//! that `cargo +nightly miri test --test owned_api` finishes in minutes.

use percpu_ref::owned::{Frozen, Killed, Owner, Ref, Weak};
use std::cmp::Ordering as CmpOrdering;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::marker::PhantomPinned;
use std::panic::{catch_unwind, AssertUnwindSafe, RefUnwindSafe, UnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Counts its drops.
#[derive(Debug)]
struct Tracked {
    payload: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn tracked(payload: u64) -> (Tracked, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    (
        Tracked {
            payload,
            drops: drops.clone(),
        },
        drops,
    )
}

fn drops(d: &AtomicUsize) -> usize {
    d.load(Ordering::SeqCst)
}

fn hash_of<T: Hash + ?Sized>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// The message of a caught panic.
fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

// ----- Weak::new ----------------------------------------------------------

/// `Weak::new` is `const`: a table can start with empty slots in a static.
static EMPTY: Weak<u32> = Weak::new();

#[test]
fn empty_weak_never_upgrades() {
    let w: Weak<String> = Weak::new();
    assert!(w.tryget().is_none());
    assert!(w.tryget_live().is_none());
    let c = w.clone();
    assert!(c.tryget().is_none() && c.tryget_live().is_none());
    assert!(Weak::ptr_eq(&w, &c), "two empty Weaks are equal, as in std");
    assert!(Weak::ptr_eq(&w, &Weak::default()));
    assert_eq!(format!("{w:?}"), "(Weak)");
    let p = w.as_ptr();
    assert!(!p.is_null());
    assert!(p.is_aligned());
    assert!(EMPTY.tryget_live().is_none());

    // Never equal to a real object's Weak, which still upgrades.
    let o = Owner::new(String::from("real"));
    let real = o.downgrade();
    assert!(!Weak::ptr_eq(&w, &real));
    assert!(!Weak::ptr_eq(&real, &w));
    assert_ne!(real.as_ptr(), p);
    assert_eq!(*real.tryget_live().unwrap(), "real");
    drop(o);
    assert!(real.tryget().is_none());
}

#[test]
fn empty_weak_moves_between_threads_and_drops_there() {
    let ws: Vec<Weak<Vec<u8>>> = (0..4).map(|_| Weak::new()).collect();
    let t = thread::spawn(move || {
        for w in &ws {
            assert!(w.clone().tryget().is_none());
        }
        ws.len()
    });
    assert_eq!(t.join().unwrap(), 4);
}

#[test]
fn empty_weak_is_a_table_placeholder_filled_later() {
    let mut slot: Weak<u32> = Weak::new();
    assert!(slot.tryget_live().is_none());
    let o = Owner::new(9);
    slot = o.downgrade(); // drops the empty one
    assert_eq!(*slot.tryget_live().unwrap(), 9);
    assert_eq!(o.kill().wait(), 9);
}

// ----- raw pointers -----------------------------------------------------------

#[test]
fn as_ptr_is_the_value_address_for_every_handle() {
    let o = Owner::new(0xabcd_u64);
    let r = o.get();
    let w = o.downgrade();
    let p = Ref::as_ptr(&r);
    assert_eq!(p, std::ptr::from_ref::<u64>(&o));
    assert_eq!(p, std::ptr::from_ref::<u64>(&r));
    assert_eq!(p, Ref::as_ptr(&r.clone()));
    assert_eq!(p, w.as_ptr());
    // SAFETY: `r` keeps the value alive.
    assert_eq!(unsafe { *p }, 0xabcd);
    assert_eq!(format!("{r:p}"), format!("{p:p}"));
    drop(r);
    drop(o);
    // Released: the Weak still knows the address (it keeps the block).
    assert_eq!(w.as_ptr(), p);
    let other = Owner::new(0xabcd_u64);
    assert_ne!(Ref::as_ptr(&other.get()), p, "a different object");
}

#[test]
fn raw_round_trip_keeps_counts_exact() {
    let (v, d) = tracked(7);
    let o = Owner::new(v);
    let w = o.downgrade();
    let n = if cfg!(miri) { 3 } else { 64 };
    let raws: Vec<*const Tracked> = (0..n).map(|_| Ref::into_raw(o.get())).collect();
    let p = raws[0];
    assert!(raws.iter().all(|&q| q == p), "one object, one address");
    let k = o.kill();
    percpu_ref::flush(); // the deferred kill is complete
    for (i, &raw) in raws.iter().enumerate() {
        assert!(
            !k.is_released(),
            "released with {} raw references left",
            n - i
        );
        assert!(w.tryget_live().is_none(), "killed");
        // SAFETY: each pointer came from `into_raw` and is turned back once.
        let r = unsafe { Ref::from_raw(raw) };
        assert_eq!(r.payload, 7);
        assert_eq!(drops(&d), 0);
        drop(r);
    }
    assert!(
        k.is_released(),
        "the last from_raw'd Ref was the last reference"
    );
    assert!(w.tryget().is_none());
    assert_eq!(k.wait().payload, 7);
    assert_eq!(drops(&d), 1);
}

#[test]
fn raw_reference_crosses_threads() {
    let (v, d) = tracked(8);
    let o = Owner::new(v);
    // A raw pointer is not Send: carry the address, as an FFI user would.
    let addr = Ref::into_raw(o.get()) as usize;
    let k = o.kill();
    let t = thread::spawn(move || {
        // SAFETY: from `into_raw`, turned back once, on this thread.
        let r = unsafe { Ref::from_raw(addr as *const Tracked) };
        r.payload
    });
    assert_eq!(t.join().unwrap(), 8);
    assert_eq!(k.wait().payload, 8);
    assert_eq!(drops(&d), 1);
}

#[test]
fn raw_reference_keeps_a_freeze_waiting() {
    let mut o = Owner::new(1u32);
    let raw = Ref::into_raw(o.get());
    assert!(
        o.freeze_timeout(Duration::from_millis(1)).is_err(),
        "the raw reference counts"
    );
    // SAFETY: from `into_raw`, turned back once.
    drop(unsafe { Ref::from_raw(raw) });
    *o.freeze_timeout(Duration::ZERO).unwrap() += 1;
    assert_eq!(*o, 2);
}

// ----- traits that delegate to T -----------------------------------------

#[test]
fn eq_ord_hash_delegate_to_the_value_not_the_address() {
    let a = Owner::new(3);
    let b = Owner::new(3); // another object, equal value
    let c = Owner::new(5);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.get(), b.get());
    assert!(!Ref::ptr_eq(&a.get(), &b.get()));
    assert_ne!(a.get(), c.get());
    // Each operator on its own: `Owner` forwards all four to `T`.
    assert_eq!([a < c, c > a, a <= b, a >= b], [true; 4]);
    assert_eq!([c < a, a > c, c <= a, a > b], [false; 4]);
    assert!(a.get() < c.get() && c.get() >= a.get());
    assert_eq!(a.cmp(&c), CmpOrdering::Less);
    assert_eq!(c.get().cmp(&a.get()), CmpOrdering::Greater);
    assert_eq!(a.partial_cmp(&b), Some(CmpOrdering::Equal));
    assert_eq!(hash_of(&a), hash_of(&3));
    assert_eq!(hash_of(&a.get()), hash_of(&3));
    assert_eq!(hash_of(&a.get()), hash_of(&b.get()));
    assert_ne!(hash_of(&a.get()), hash_of(&c.get()));

    // Sorting and sets go by value.
    let mut refs = vec![c.get(), a.get(), b.get()];
    refs.sort();
    assert_eq!(refs.iter().map(|r| **r).collect::<Vec<_>>(), [3, 3, 5]);
    let set: BTreeSet<Ref<i32>> = refs.into_iter().collect();
    assert_eq!(set.len(), 2);
    let hset: HashSet<Ref<i32>> = [a.get(), b.get(), c.get()].into_iter().collect();
    assert_eq!(hset.len(), 2);
}

#[test]
fn partial_ord_keeps_the_values_own_rules() {
    let nan = Owner::new(f64::NAN);
    let nan2 = Owner::new(f64::NAN);
    let one = Owner::new(1.0f64);
    let (n, x) = (nan.get(), one.get());
    assert_ne!(n, n.clone(), "NaN != NaN, also through a handle");
    assert_ne!(nan, nan2);
    assert_eq!(n.partial_cmp(&x), None);
    assert_eq!([n < x, n > x, n <= x, n >= x], [false; 4]);
    assert_eq!([nan < one, nan > one, nan <= one, nan >= one], [false; 4]);
    assert!(x <= x.clone() && x >= x.clone());
}

#[test]
fn display_and_debug_delegate() {
    let o = Owner::new(String::from("sda"));
    let r = o.get();
    assert_eq!(format!("{o}"), "sda");
    assert_eq!(format!("{r}"), "sda");
    assert_eq!(format!("{r:>5}"), "  sda", "formatter flags reach T");
    assert_eq!(format!("{r:?}"), "\"sda\"");
    let p = Ref::as_ptr(&r);
    assert_eq!(format!("{r:p}"), format!("{p:p}"));
    assert_eq!(format!("{:p}", r.clone()), format!("{p:p}"));
}

#[test]
fn borrow_finds_handles_in_maps_by_value() {
    let sda = Owner::new(String::from("sda"));
    let sdb = Owner::new(String::from("sdb"));
    let mut by_ref: HashMap<Ref<String>, u32> = HashMap::new();
    by_ref.insert(sda.get(), 8);
    by_ref.insert(sdb.get(), 16);
    assert_eq!(by_ref.get(&String::from("sda")), Some(&8));
    assert_eq!(by_ref.get(&String::from("sdb")), Some(&16));
    assert_eq!(by_ref.get(&String::from("sdc")), None);

    let mut owners: HashSet<Owner<String>> = HashSet::new();
    owners.insert(sda);
    assert!(owners.contains(&String::from("sda")));
    assert!(!owners.contains(&String::from("sdb")));
    let sda = owners.take(&String::from("sda")).unwrap();
    drop(by_ref); // the map's references
    assert_eq!(sda.kill().wait(), "sda");
    assert_eq!(sdb.kill().wait(), "sdb");
}

#[test]
fn as_ref_gives_the_value() {
    fn len<S: AsRef<String>>(s: &S) -> usize {
        s.as_ref().len()
    }
    let o = Owner::new(String::from("four"));
    assert_eq!(len(&o), 4);
    assert_eq!(len(&o.get()), 4);
    assert!(std::ptr::eq(o.get().as_ref(), &*o));
}

#[test]
fn default_and_from_make_owners() {
    let d: Owner<Vec<u8>> = Owner::default();
    assert!(d.is_empty());
    let f = Owner::from(String::from("x"));
    assert_eq!(*f, "x");
    let i: Owner<u32> = 5.into();
    assert_eq!(*i.get(), 5);
    assert_eq!(i.kill().wait(), 5);
    assert_eq!(d.kill().wait(), Vec::<u8>::new());
}

// ----- marker traits ----------------------------------------------------------

fn assert_unwind_safe<T: UnwindSafe>() {}
fn assert_ref_unwind_safe<T: RefUnwindSafe>() {}
fn assert_unpin<T: Unpin>() {}
fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn unwind_safety_and_unpin_as_arc() {
    // Compile-time: these lines fail to build if an impl goes missing.
    assert_unwind_safe::<Ref<i32>>();
    assert_ref_unwind_safe::<Ref<i32>>();
    assert_unwind_safe::<Weak<String>>();
    assert_ref_unwind_safe::<Weak<String>>();
    assert_unwind_safe::<&Owner<i32>>();
    assert_ref_unwind_safe::<Owner<i32>>();
    assert_unwind_safe::<Killed<i32>>();
    assert_ref_unwind_safe::<Killed<i32>>();
    assert_unwind_safe::<&Frozen<'static, i32>>();
    assert_unwind_safe::<Ref<std::sync::Mutex<i32>>>();
    assert_unpin::<Killed<PhantomPinned>>();
    assert_unpin::<Ref<PhantomPinned>>();
    assert_unpin::<Weak<PhantomPinned>>();
    assert_unpin::<Owner<PhantomPinned>>();
    assert_send_sync::<Killed<Vec<u8>>>();

    // And they are usable as such: a `Ref` crosses catch_unwind as is.
    let o = Owner::new(41);
    let r = o.get();
    let w = o.downgrade();
    let got = catch_unwind(move || *r + *w.tryget().unwrap());
    assert_eq!(got.unwrap(), 82);
    let e = catch_unwind(|| -> i32 { panic!("after reading {}", *o) }).unwrap_err();
    assert_eq!(panic_message(&*e), "after reading 41");
    assert_eq!(*o, 41, "the owner is intact after a caught panic");
}

// ----- Killed as a future -----------------------------------------------------

/// Unparks a thread and counts its wakes.
struct Unpark {
    thread: Thread,
    wakes: AtomicUsize,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// How long a pending task may go unwoken before the wake-up counts as lost
/// (a lost wake-up would otherwise hang the test instead of failing it).
const LOST_AFTER: Duration = Duration::from_secs(20);

/// Polls `fut` on this thread, parking between polls. Fails (rather than
/// hangs) when a `Pending` poll is not followed by a wake.
fn block_on<F: Future>(fut: F) -> (F::Output, usize) {
    let mut fut = pin!(fut);
    let unpark = Arc::new(Unpark {
        thread: thread::current(),
        wakes: AtomicUsize::new(0),
    });
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let mut polls = 0;
    loop {
        let seen = unpark.wakes.load(Ordering::SeqCst);
        polls += 1;
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return (v, polls);
        }
        let start = Instant::now();
        while unpark.wakes.load(Ordering::SeqCst) == seen {
            let waited = start.elapsed();
            assert!(
                waited < LOST_AFTER,
                "lost wake-up: pending for {waited:?} and never woken"
            );
            thread::park_timeout(LOST_AFTER - waited);
        }
    }
}

/// A waker that counts its wakes and does nothing else.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

#[test]
fn future_is_ready_at_once_without_references() {
    let (v, d) = tracked(1);
    let mut k = Owner::new(v).kill();
    percpu_ref::flush(); // the deferred kill is complete
    let (count, waker) = counting_waker();
    match Pin::new(&mut k).poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(v) => assert_eq!(v.payload, 1),
        Poll::Pending => panic!("nothing references it, yet pending"),
    }
    assert_eq!(drops(&d), 1);
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    assert!(k.is_released());
    drop(k);
    assert_eq!(drops(&d), 1, "a completed Killed drops nothing");
}

#[test]
fn future_pending_until_the_last_ref_then_woken_once() {
    let (v, d) = tracked(2);
    let o = Owner::new(v);
    let r1 = o.get();
    let r2 = r1.clone();
    let mut k = o.kill();
    percpu_ref::flush(); // the deferred kill is complete
    let (count, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut k).poll(&mut cx).is_pending());
    assert!(Pin::new(&mut k).poll(&mut cx).is_pending(), "repolled");
    drop(r1);
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "not the last reference");
    assert!(Pin::new(&mut k).poll(&mut cx).is_pending());
    drop(r2);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "the last drop woke it");
    match Pin::new(&mut k).poll(&mut cx) {
        Poll::Ready(v) => assert_eq!(v.payload, 2),
        Poll::Pending => panic!("released, yet pending"),
    }
    assert_eq!(drops(&d), 1);
}

#[test]
fn future_wakes_the_latest_waker() {
    let o = Owner::new(3);
    let r = o.get();
    let mut k = o.kill();
    percpu_ref::flush(); // the deferred kill is complete
    let (first, w1) = counting_waker();
    let (second, w2) = counting_waker();
    assert!(Pin::new(&mut k)
        .poll(&mut Context::from_waker(&w1))
        .is_pending());
    assert!(Pin::new(&mut k)
        .poll(&mut Context::from_waker(&w2))
        .is_pending());
    // The first waker is no longer held (the task moved to the second).
    assert_eq!(Arc::strong_count(&first), 2);
    drop(r);
    assert_eq!(first.0.load(Ordering::SeqCst), 0);
    assert_eq!(second.0.load(Ordering::SeqCst), 1);
    assert_eq!(
        Pin::new(&mut k).poll(&mut Context::from_waker(&w2)),
        Poll::Ready(3)
    );
}

#[test]
fn polling_after_completion_panics_and_names_the_operation() {
    let mut k = Owner::new(4).kill();
    percpu_ref::flush(); // the deferred kill is complete
    let (_, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(Pin::new(&mut k).poll(&mut cx), Poll::Ready(4));
    let e = catch_unwind(AssertUnwindSafe(|| Pin::new(&mut k).poll(&mut cx))).unwrap_err();
    let msg = panic_message(&*e);
    assert!(msg.contains("Killed polled after"), "{msg}");
    assert!(k.is_released());
    assert!(format!("{k:?}").contains("taken: true"));
    // Each op must panic before returning: what it returns does not matter.
    type Op = Box<dyn Fn(Killed<i32>) -> Option<i32>>;
    for (name, op) in [
        ("wait", Box::new(|k: Killed<i32>| Some(k.wait())) as Op),
        ("try_take", Box::new(|k: Killed<i32>| k.try_take().ok())),
        (
            "wait_timeout",
            Box::new(|k: Killed<i32>| k.wait_timeout(Duration::ZERO).ok()),
        ),
    ] {
        let mut k = Owner::new(5).kill();
        percpu_ref::flush(); // the deferred kill is complete
        assert_eq!(Pin::new(&mut k).poll(&mut cx), Poll::Ready(5));
        let e = catch_unwind(AssertUnwindSafe(|| op(k))).unwrap_err();
        let msg = panic_message(&*e);
        assert!(msg.contains(&format!("Killed::{name}")), "{msg}");
    }
}

#[test]
fn future_of_a_value_that_is_not_unpin() {
    let o = Owner::new((PhantomPinned, 6));
    let r = o.get();
    let k = o.kill();
    let t = thread::spawn(move || drop(r));
    let ((_, v), _) = block_on(k);
    assert_eq!(v, 6);
    t.join().unwrap();
}

#[test]
fn future_resolves_when_the_last_ref_drops_on_another_thread() {
    // More threads than the machine's cores, many rounds. In each round the
    // first poll is made while every thread still holds its reference (so
    // the wake path runs every round); then the threads drop them in a race
    // with the executor's parking.
    let threads = if cfg!(miri) { 3 } else { 8 };
    let rounds = if cfg!(miri) { 2 } else { 300 };
    let mut woken_polls = 0;
    for round in 0..rounds {
        let (v, d) = tracked(round);
        let owner = Owner::new(v);
        let go = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(threads + 1));
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let r = owner.get();
                let go = go.clone();
                let barrier = barrier.clone();
                thread::spawn(move || {
                    barrier.wait();
                    while !go.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                    for _ in 0..(i % 3) {
                        thread::yield_now(); // stagger the drops
                    }
                    assert_eq!(r.payload, round);
                    drop(r);
                })
            })
            .collect();
        barrier.wait();
        let mut killed = owner.kill();
        let (count, waker) = counting_waker();
        assert!(
            Pin::new(&mut killed)
                .poll(&mut Context::from_waker(&waker))
                .is_pending(),
            "round {round}: every thread still holds a reference"
        );
        go.store(true, Ordering::Release);
        let (value, polls) = block_on(&mut killed);
        woken_polls += polls;
        assert_eq!(value.payload, round);
        assert_eq!(drops(&d), 0, "round {round}: release dropped a claimed T");
        // The first waker is woken only when the release came before
        // `block_on` replaced it; once at most either way.
        assert!(
            count.0.load(Ordering::SeqCst) <= 1,
            "round {round}: the first waker was woken twice"
        );
        for w in workers {
            w.join().unwrap();
        }
        drop(killed);
        drop(value);
        assert_eq!(drops(&d), 1, "round {round}");
    }
    assert!(woken_polls >= rounds as usize);
}

#[test]
fn future_moves_to_another_thread_and_resolves_there() {
    let rounds = if cfg!(miri) { 2 } else { 100 };
    for round in 0..rounds {
        let owner = Owner::new(round);
        let refs: Vec<Ref<u64>> = (0..4).map(|_| owner.get()).collect();
        let killed = owner.kill();
        let waiter = thread::spawn(move || block_on(killed).0);
        let droppers: Vec<_> = refs
            .into_iter()
            .map(|r| thread::spawn(move || drop(r)))
            .collect();
        for t in droppers {
            t.join().unwrap();
        }
        assert_eq!(waiter.join().unwrap(), round);
    }
}

#[test]
fn a_poll_racing_the_last_drop_is_always_woken() {
    // One poll against one drop, started together by a spin handshake, many
    // times: whichever comes first, a `Pending` poll must be followed by a
    // wake (a lost wake-up fails after `LOST_AFTER` instead of hanging).
    // `kill` is deferred: most rounds flush it first, so that the drop is
    // the last put and releases on the dropper's thread (the race this test
    // is about); every 8th round leaves it to the engine, so the poll also
    // races the engine's completion (and each such round waits up to the
    // engine's 1 ms batching delay).
    let rounds = if cfg!(miri) { 3 } else { 20_000 };
    let slot: Arc<std::sync::Mutex<Option<Ref<usize>>>> = Arc::default();
    let turn = Arc::new(AtomicUsize::new(0)); // odd: a round is armed
    let dropper = {
        let (slot, turn) = (slot.clone(), turn.clone());
        thread::spawn(move || {
            for round in 0..rounds {
                let armed = 2 * round + 1;
                while turn.load(Ordering::Acquire) != armed {
                    std::hint::spin_loop();
                }
                let r = slot.lock().unwrap().take().unwrap();
                turn.store(armed + 1, Ordering::Release); // go
                drop(r);
            }
        })
    };
    // Polls found pending: [after a flushed kill, with the engine's].
    let (mut pending, mut lost) = ([0usize; 2], 0usize);
    for round in 0..rounds {
        let owner = Owner::new(round);
        *slot.lock().unwrap() = Some(owner.get());
        let mut killed = owner.kill();
        let engine_round = round % 8 == 0;
        if !engine_round {
            percpu_ref::flush();
        }
        let unpark = Arc::new(Unpark {
            thread: thread::current(),
            wakes: AtomicUsize::new(0),
        });
        let waker = Waker::from(unpark.clone());
        let mut cx = Context::from_waker(&waker);
        turn.store(2 * round + 1, Ordering::Release);
        while turn.load(Ordering::Acquire) != 2 * round + 2 {
            std::hint::spin_loop();
        }
        let value = match Pin::new(&mut killed).poll(&mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => {
                pending[usize::from(engine_round)] += 1;
                let start = Instant::now();
                while unpark.wakes.load(Ordering::SeqCst) == 0 && start.elapsed() < LOST_AFTER {
                    thread::park_timeout(Duration::from_millis(100));
                }
                if unpark.wakes.load(Ordering::SeqCst) == 0 {
                    lost += 1;
                }
                match Pin::new(&mut killed).poll(&mut cx) {
                    Poll::Ready(v) => v,
                    Poll::Pending => panic!("round {round}: still pending"),
                }
            }
        };
        assert_eq!(value, round);
        assert_eq!(lost, 0, "round {round}: a Pending poll was never woken");
    }
    dropper.join().unwrap();
    println!(
        "{rounds} races, polls pending before the release: {} of {} against the last drop, \
         {} of {} against the engine",
        pending[0],
        rounds - rounds.div_ceil(8),
        pending[1],
        rounds.div_ceil(8)
    );
}

/// `Owner::drop_deferred` of a `T` with drop glue: the object is dying at
/// once, and `T` is dropped exactly once, by the engine or by the last
/// reference's thread.
#[test]
fn drop_deferred_with_drop_glue_defers_and_drops_once() {
    // Nobody referenced: the engine drops `T` after the kill completes.
    let (v, d) = tracked(7);
    let owner = Owner::new(v);
    let weak = owner.downgrade();
    owner.drop_deferred();
    assert!(
        weak.tryget_live().is_none(),
        "dying once drop_deferred returned"
    );
    percpu_ref::flush();
    assert_eq!(drops(&d), 1, "released by the engine after flush");
    assert!(weak.tryget().is_none());

    // Referenced from another thread: that thread's last put drops `T`.
    let (v, d) = tracked(8);
    let owner = Owner::new(v);
    let r = owner.get();
    owner.drop_deferred();
    percpu_ref::flush();
    assert_eq!(drops(&d), 0, "a Ref still holds it");
    let payload = thread::spawn(move || {
        let p = r.payload;
        drop(r);
        p
    })
    .join()
    .unwrap();
    assert_eq!(payload, 8);
    assert_eq!(drops(&d), 1, "the last Ref's drop released it");
}

/// Many owners of a drop-glue `T` dropped with `drop_deferred` while other
/// threads hold and drop references: each `T` dropped exactly once.
#[test]
fn drop_deferred_races_ref_drops() {
    let n = if cfg!(miri) { 8 } else { 2_000 };
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<Ref<Tracked>>();
    let holder = thread::spawn(move || {
        let mut seen = 0u64;
        for r in rx {
            seen += r.payload;
        }
        seen
    });
    for i in 0..n {
        let owner = Owner::new(Tracked {
            payload: i,
            drops: drops.clone(),
        });
        tx.send(owner.get()).unwrap();
        owner.drop_deferred();
    }
    drop(tx);
    assert_eq!(holder.join().unwrap(), n * (n - 1) / 2);
    percpu_ref::flush();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        n as usize,
        "each T dropped once"
    );
}

/// `drop_deferred` of an owner frozen for good (its `Frozen` guard leaked):
/// already dead and released, so `T` is dropped at once, as a plain drop
/// would.
#[test]
fn drop_deferred_of_an_owner_frozen_for_good() {
    let (v, d) = tracked(9);
    let mut owner = Owner::new(v);
    std::mem::forget(owner.freeze());
    owner.drop_deferred();
    assert_eq!(drops(&d), 1, "T dropped by drop_deferred itself");
}
