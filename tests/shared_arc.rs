//! std's own `Arc` tests, rewritten for `percpu_ref::shared` (our code,
//! their cases): rust-lang/rust library/alloc/src/sync/tests.rs and
//! library/alloctests/tests/arc.rs. Each test runs on a fresh value (atomic
//! mode, as an `Arc`) and, where the behaviour could differ, on a promoted
//! one as well (`both`), with `percpu_ref::flush()` where `Arc` would
//! have dropped the value at once: a promoted value is dropped by the
//! engine a few milliseconds after its last handle.
//!
//! The unsized ones (`Arc<str>`, `Arc<[T]>`) are in tests/shared_unsized.rs,
//! with the list of those that cannot apply.
//!
//! Where `Shared` differs on purpose, the test says so: `make_mut` of a
//! unique value that has `Weak`s clones it (where `Arc` moves it), and the
//! exact checks of a promoted value (`get_mut`, `try_unwrap`, hence
//! `make_mut` and `unwrap_or_clone`) give the conservative answer on the
//! grace-period engine's own thread.
//!
//! Tests that cannot apply, and why:
//! - allocator tests (`Arc::new_in`, `allocator_api`): no allocators.
//! - `eq` (the `Eq` specialisation that skips `T::eq` for one pointer):
//!   a nightly specialisation; `Shared` always compares `T`.

use percpu_ref::shared::{Shared, Weak};
use percpu_ref::Backend;
use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::thread;

/// Runs `f` with a constructor of fresh values in atomic mode, then with
/// one of promoted values (where the backend can promote).
fn both(f: impl Fn(&dyn Fn(usize) -> Shared<Canary>)) {
    f(&|v| made(Canary::new(v), false));
    f(&|v| made(Canary::new(v), true));
}

/// Runs `round` up to `max` times, and stops early (after at least 3) once
/// `budget` has passed: a promoted value's `into_inner` waits for the
/// engine's grace periods, which in an emulated guest with many vCPUs take
/// a large part of a second each. Returns the rounds run.
fn rounds_within(max: usize, budget: std::time::Duration, mut round: impl FnMut()) -> usize {
    let start = std::time::Instant::now();
    let max = if cfg!(miri) { max.min(2) } else { max };
    for done in 0..max {
        if done >= 3 && start.elapsed() > budget {
            return done;
        }
        round();
    }
    max
}

/// A value made in atomic mode, or promoted (where the backend can).
fn made<T: Send + 'static>(v: T, promote: bool) -> Shared<T> {
    let s = Shared::new(v);
    if promote {
        let promoted = Shared::promote(&s);
        assert!(promoted || percpu_ref::backend() != Backend::Rseq);
        assert_eq!(Shared::is_percpu(&s), promoted);
    }
    s
}

/// A value whose drops are counted (`Arc`'s tests use one of their own).
struct Canary {
    v: usize,
    drops: Arc<AtomicUsize>,
}

impl Canary {
    fn new(v: usize) -> Canary {
        Canary {
            v,
            drops: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

#[test]
fn manually_share_arc() {
    let v = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let arc_v = Shared::new(v);
    let (tx, rx) = channel();
    let t = thread::spawn(move || {
        let arc_v: Shared<Vec<i32>> = rx.recv().unwrap();
        assert_eq!((*arc_v)[3], 4);
    });
    tx.send(arc_v.clone()).unwrap();
    assert_eq!((*arc_v)[2], 3);
    assert_eq!((*arc_v)[4], 5);
    t.join().unwrap();
}

#[test]
fn into_from_raw() {
    both(|new| {
        let x = new(7);
        let drops = x.drops.clone();
        let x_ptr = &*x as *const Canary;
        let ptr = Shared::into_raw(x);
        assert_eq!(x_ptr, ptr);
        // SAFETY: from `into_raw`, once.
        let x = unsafe { Shared::from_raw(ptr) };
        assert_eq!(x.v, 7);
        assert_eq!(Shared::as_ptr(&x), ptr);
        drop(x);
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
    });
}

#[test]
fn test_live() {
    both(|new| {
        let x = new(5);
        let y = Shared::downgrade(&x);
        assert!(y.upgrade().is_some());
    });
}

#[test]
fn test_dead() {
    both(|new| {
        let x = new(5);
        let y = Shared::downgrade(&x);
        drop(x);
        percpu_ref::flush();
        assert!(y.upgrade().is_none());
    });
}

#[test]
fn drop_arc() {
    both(|new| {
        let x = new(0);
        let canary = x.drops.clone();
        drop(x);
        percpu_ref::flush();
        assert_eq!(canary.load(SeqCst), 1);
    });
}

#[test]
fn drop_arc_weak() {
    both(|new| {
        let x = new(0);
        let canary = x.drops.clone();
        let arc_weak = Shared::downgrade(&x);
        assert_eq!(canary.load(SeqCst), 0);
        drop(x);
        percpu_ref::flush();
        assert_eq!(canary.load(SeqCst), 1);
        drop(arc_weak);
        assert_eq!(canary.load(SeqCst), 1);
    });
}

#[test]
fn show_arc() {
    let a = Shared::new(5);
    assert_eq!(format!("{a:?}"), "5");
    assert_eq!(format!("{a}"), "5");
    assert_eq!(format!("{:?}", Shared::downgrade(&a)), "(Weak)");
    let p = format!("{a:p}");
    assert_eq!(p, format!("{:p}", Shared::as_ptr(&a)));
}

// Make sure deriving works with Shared<T>.
#[derive(Eq, Ord, PartialEq, PartialOrd, Clone, Debug, Default)]
struct Foo {
    inner: Shared<i32>,
}

#[test]
fn test_derive() {
    let a = Foo::default();
    let b = a.clone();
    assert_eq!(a, b);
    assert_eq!(*a.inner, 0);
}

#[test]
fn test_from_owned() {
    let foo = 123;
    let foo_arc = Shared::from(foo);
    assert!(123 == *foo_arc);
}

#[test]
fn test_from_box() {
    let b: Box<u32> = Box::new(123);
    let r: Shared<u32> = Shared::from(b);
    assert_eq!(*r, 123);
}

#[test]
fn pinned_values_are_dropped_in_place() {
    for promote in [false, true] {
        let a = Shared::pin(Canary::new(1));
        let drops = a.drops.clone();
        let place = std::ptr::from_ref::<Canary>(&a);
        if promote {
            // `Canary: Unpin`, so the handle can be had back to promote.
            let promoted = Shared::promote(&std::pin::Pin::into_inner(a.clone()));
            assert!(promoted || percpu_ref::backend() != Backend::Rseq);
        }
        let clones: Vec<_> = (0..10).map(|_| a.clone()).collect();
        assert!(clones.iter().all(|c| std::ptr::eq(&**c, place)));
        drop((a, clones));
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
    }
}

#[test]
fn test_new_weak() {
    let foo: Weak<usize> = Weak::new();
    assert!(foo.upgrade().is_none());
    let d: Weak<usize> = Weak::default();
    assert!(d.upgrade().is_none());
}

#[test]
fn test_ptr_eq() {
    both(|new| {
        let five = new(5);
        let same_five = five.clone();
        let other_five = new(5);
        assert!(Shared::ptr_eq(&five, &same_five));
        assert!(!Shared::ptr_eq(&five, &other_five));
    });
}

#[test]
fn test_weak_ptr_eq() {
    let five = Shared::new(5);
    let first = Shared::downgrade(&five);
    let second = Shared::downgrade(&five);
    let third = Shared::downgrade(&Shared::new(5));
    assert!(Weak::ptr_eq(&first, &second));
    assert!(!Weak::ptr_eq(&first, &third));
    let (a, b): (Weak<i32>, Weak<i32>) = (Weak::new(), Weak::new());
    assert!(Weak::ptr_eq(&a, &b));
    assert_eq!(a.as_ptr(), b.as_ptr());
}

#[test]
fn test_weak_as_ptr_after_drop() {
    both(|new| {
        let x = new(1);
        let p = Shared::as_ptr(&x);
        let w = Shared::downgrade(&x);
        drop(x);
        percpu_ref::flush();
        assert_eq!(w.as_ptr(), p); // the allocation is still there
    });
}

#[test]
fn float_nan_ne() {
    let x = Shared::new(f32::NAN);
    assert!(x != x);
    assert!(!(x == x));
}

#[test]
fn partial_eq() {
    struct TestPEq(RefCell<usize>);
    impl PartialEq for TestPEq {
        fn eq(&self, other: &TestPEq) -> bool {
            *self.0.borrow_mut() += 1;
            *other.0.borrow_mut() += 1;
            true
        }
    }
    // `RefCell` is `Send`: a `Shared` of it lives on this thread only.
    let x = Shared::new(TestPEq(RefCell::new(0)));
    assert!(x == x);
    assert!(!(x != x));
    assert_eq!(*x.0.borrow(), 4);
}

#[test]
fn test_ord_and_hash() {
    let a = Shared::new(1);
    let b = Shared::new(2);
    assert!(a < b);
    assert!(b > a);
    assert!(a <= a.clone());
    assert_eq!(a.cmp(&b), std::cmp::Ordering::Less);
    let h = |v: &dyn Fn(&mut DefaultHasher)| {
        let mut s = DefaultHasher::new();
        v(&mut s);
        s.finish()
    };
    assert_eq!(h(&|s| a.hash(s)), h(&|s| 1.hash(s)));
    let set: std::collections::HashSet<Shared<i32>> = [a.clone(), b.clone(), a.clone()].into();
    assert_eq!(set.len(), 2);
    assert!(set.contains(&1)); // `Borrow<T>`
}

#[test]
fn test_as_ref_borrow_deref() {
    let s = Shared::new(String::from("abc"));
    let r: &String = s.as_ref();
    let b: &String = std::borrow::Borrow::borrow(&s);
    assert_eq!(r, b);
    assert_eq!(s.len(), 3);
}

#[test]
fn uninhabited() {
    enum Void {}
    let mut a = Weak::<Void>::new();
    a = a.clone();
    assert!(a.upgrade().is_none());
}

#[test]
fn zero_sized() {
    let a = Shared::new(());
    let b = a.clone();
    assert!(Shared::ptr_eq(&a, &b));
    assert!(Shared::promote(&a) || !Shared::is_percpu(&a));
    drop((a, b));
    percpu_ref::flush();
}

#[test]
fn default_and_from() {
    let d: Shared<Vec<u8>> = Shared::default();
    assert!(d.is_empty());
    let f: Shared<String> = String::from("x").into();
    assert_eq!(*f, "x");
}

#[test]
fn weak_upgrade_from_many_threads() {
    both(|new| {
        let x = new(9);
        let w = Shared::downgrade(&x);
        let seen = Mutex::new(0);
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        let u = w.upgrade().unwrap();
                        assert_eq!(u.v, 9);
                    }
                    *seen.lock().unwrap() += 1;
                });
            }
        });
        assert_eq!(*seen.lock().unwrap(), 4);
        let drops = x.drops.clone();
        drop(x);
        percpu_ref::flush();
        assert!(w.upgrade().is_none());
        assert_eq!(drops.load(SeqCst), 1);
    });
}

/// `Shared` and `Weak` are covariant in `T`, as `Arc` (a compile check).
#[test]
fn variance() {
    fn shorten<'a>(s: Shared<&'static str>) -> Shared<&'a str> {
        s
    }
    fn shorten_weak<'a>(w: Weak<&'static str>) -> Weak<&'a str> {
        w
    }
    let s = shorten(Shared::new("static"));
    assert_eq!(*s, "static");
    assert!(shorten_weak(Weak::new()).upgrade().is_none());
}

#[test]
fn test_arc_get_mut() {
    for promote in [false, true] {
        let mut x = made(3, promote);
        *Shared::get_mut(&mut x).unwrap() = 4;
        assert_eq!(*x, 4);
        let y = x.clone();
        assert!(Shared::get_mut(&mut x).is_none());
        drop(y);
        assert!(Shared::get_mut(&mut x).is_some());
        let _w = Shared::downgrade(&x);
        assert!(Shared::get_mut(&mut x).is_none());
    }
}

/// A promoted value's exact check hands it back to the engine: still per
/// CPU after a `get_mut` (unique or not), and dropped by the engine later.
#[test]
fn exact_get_mut_hands_the_value_back_to_the_engine() {
    let mut x = made(Canary::new(3), true);
    if !Shared::is_percpu(&x) {
        return; // the backend cannot promote
    }
    let drops = x.drops.clone();
    Shared::get_mut(&mut x).expect("the only handle").v = 4;
    assert!(
        Shared::is_percpu(&x),
        "get_mut left the value in atomic mode"
    );
    let y = x.clone();
    assert!(Shared::get_mut(&mut x).is_none());
    assert!(
        Shared::is_percpu(&x),
        "get_mut left the value in atomic mode"
    );
    drop(y);
    assert_eq!(x.v, 4);
    drop(x);
    assert_eq!(
        drops.load(SeqCst),
        0,
        "a promoted value is dropped by the engine"
    );
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1);
}

/// `get_mut` of a promoted value while other threads (more than cores)
/// clone, read and drop it, and make `Weak`s that upgrade after their
/// handle is gone: a `&mut T` never coexists with a reader (no check finds
/// the value unique while they live), and once they are gone it is `Some`.
#[test]
fn exact_get_mut_against_clones_drops_and_upgrades() {
    use std::sync::atomic::AtomicBool;
    struct Guarded {
        readers: AtomicUsize,
        writing: AtomicBool,
    }
    impl Guarded {
        fn read(&self) {
            self.readers.fetch_add(1, SeqCst);
            assert!(!self.writing.load(SeqCst), "a reader beside get_mut's &mut");
            self.readers.fetch_sub(1, SeqCst);
        }
    }
    let mut x = made(
        Guarded {
            readers: AtomicUsize::new(0),
            writing: AtomicBool::new(false),
        },
        true,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (mine, stop) = (x.clone(), stop.clone());
            thread::spawn(move || {
                for i in 0usize.. {
                    let c = mine.clone();
                    c.read();
                    if i % 16 == 0 {
                        // A `Weak` for a moment, upgraded after its
                        // handle is gone (`get_mut` must lock it out).
                        let w = Shared::downgrade(&c);
                        drop(c);
                        if let Some(u) = w.upgrade() {
                            u.read();
                        }
                    }
                    if stop.load(SeqCst) {
                        break;
                    }
                }
                mine // dropped once joined, after the loop below
            })
        })
        .collect();
    // Each check of a promoted value is a grace period: a count of them,
    // within a bound of time (an emulated guest's are slow).
    let (mut unique, mut checks) = (0, 0);
    let start = std::time::Instant::now();
    let target = if cfg!(miri) { 3 } else { 2_000 };
    while checks < target && start.elapsed() < std::time::Duration::from_secs(3) {
        checks += 1;
        if let Some(m) = Shared::get_mut(&mut x) {
            // `&mut`: nobody else can look; the flag is for the readers'
            // asserts, which would fail if one ran beside this.
            m.writing.store(true, SeqCst);
            assert_eq!(m.readers.load(SeqCst), 0);
            m.writing.store(false, SeqCst);
            unique += 1;
        }
    }
    stop.store(true, SeqCst);
    assert_eq!(unique, 0, "unique while other handles and Weaks lived");
    for h in hs {
        drop(h.join().unwrap());
    }
    assert!(Shared::get_mut(&mut x).is_some());
}

#[test]
fn test_cowarc_clone_make_mut() {
    for promote in [false, true] {
        let mut cow0 = made(75, promote);
        let mut cow1 = cow0.clone();
        let mut cow2 = cow1.clone();
        assert_eq!(75, *Shared::make_mut(&mut cow0));
        assert_eq!(75, *Shared::make_mut(&mut cow1));
        assert_eq!(75, *Shared::make_mut(&mut cow2));
        *Shared::make_mut(&mut cow0) += 1;
        *Shared::make_mut(&mut cow1) += 2;
        *Shared::make_mut(&mut cow2) += 3;
        assert_eq!((*cow0, *cow1, *cow2), (76, 77, 78));
        // none shares with another any more
        assert!(!Shared::ptr_eq(&cow0, &cow1) && !Shared::ptr_eq(&cow1, &cow2));
        assert!(!Shared::ptr_eq(&cow0, &cow2));
    }
}

#[test]
fn test_cowarc_clone_unique2() {
    for promote in [false, true] {
        let mut cow0 = made(75, promote);
        let cow1 = cow0.clone();
        let cow2 = cow1.clone();
        assert_eq!((*cow0, *cow1, *cow2), (75, 75, 75));
        *Shared::make_mut(&mut cow0) += 1;
        assert_eq!((*cow0, *cow1, *cow2), (76, 75, 75));
        // cow1 and cow2 still share the original
        assert!(!Shared::ptr_eq(&cow0, &cow1));
        assert!(Shared::ptr_eq(&cow1, &cow2));
    }
}

#[test]
fn test_cowarc_clone_weak() {
    for promote in [false, true] {
        let mut cow0 = made(75, promote);
        let cow1_weak = Shared::downgrade(&cow0);
        assert_eq!(75, *cow0);
        assert_eq!(75, *cow1_weak.upgrade().unwrap());
        *Shared::make_mut(&mut cow0) += 1;
        assert_eq!(76, *cow0);
        percpu_ref::flush(); // a promoted original is dropped by the engine
        assert!(cow1_weak.upgrade().is_none());
    }
}

/// `make_mut` of a unique value changes it in place, as `Arc`'s (no clone:
/// `T::clone` would panic), promoted or not.
#[test]
fn make_mut_of_a_unique_value_does_not_clone() {
    struct NoClone(u32);
    impl Clone for NoClone {
        fn clone(&self) -> Self {
            panic!("make_mut cloned a unique value")
        }
    }
    for promote in [false, true] {
        let mut x = made(NoClone(1), promote);
        Shared::make_mut(&mut x).0 = 2;
        let p = Shared::as_ptr(&x);
        Shared::make_mut(&mut x).0 = 3;
        assert_eq!((x.0, Shared::as_ptr(&x)), (3, p));
    }
}

#[test]
fn test_strong_count() {
    for promote in [false, true] {
        let a = made(0u32, promote);
        assert_eq!(Shared::strong_count(&a), 1);
        let w = Shared::downgrade(&a);
        assert_eq!(Shared::strong_count(&a), 1);
        let b = w.upgrade().expect("");
        assert_eq!(Shared::strong_count(&b), 2);
        assert_eq!(Shared::strong_count(&a), 2);
        drop(w);
        drop(a);
        assert_eq!(Shared::strong_count(&b), 1);
        let c = b.clone();
        assert_eq!(Shared::strong_count(&b), 2);
        assert_eq!(Shared::strong_count(&c), 2);
    }
}

/// A promoted value's count, quiescent, after many clones on several
/// threads (each thread's counts are in its CPU's slot): exact.
#[test]
fn strong_count_of_a_promoted_value_sums_every_cpu() {
    let a = made(0u32, true);
    let held: Vec<Shared<u32>> = thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..100).map(|_| a.clone()).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(Shared::strong_count(&a), 401);
    drop(held);
    assert_eq!(Shared::strong_count(&a), 1);
}

#[test]
fn test_weak_count() {
    for promote in [false, true] {
        let a = made(0u32, promote);
        assert_eq!(Shared::strong_count(&a), 1);
        assert_eq!(Shared::weak_count(&a), 0);
        let w = Shared::downgrade(&a);
        assert_eq!(Shared::strong_count(&a), 1);
        assert_eq!(Shared::weak_count(&a), 1);
        let x = w.clone();
        assert_eq!(Shared::weak_count(&a), 2);
        drop(w);
        drop(x);
        assert_eq!(Shared::strong_count(&a), 1);
        assert_eq!(Shared::weak_count(&a), 0);
        let c = a.clone();
        assert_eq!(Shared::strong_count(&a), 2);
        assert_eq!(Shared::weak_count(&a), 0);
        let d = Shared::downgrade(&c);
        assert_eq!(Shared::weak_count(&c), 1);
        assert_eq!(Shared::strong_count(&c), 2);
        drop(a);
        drop(c);
        drop(d);
    }
}

/// `weak_count` never shows the lock that `get_mut` holds for an instant,
/// and a `downgrade` waits for it: one thread calls `get_mut` over and over
/// (it locks the count each time, then finds the other handle), another
/// reads the count and makes and drops `Weak`s.
#[test]
fn test_weak_count_locked() {
    let mut a = Shared::new(std::sync::atomic::AtomicBool::new(false));
    let a2 = a.clone();
    let t = thread::spawn(move || {
        for _ in 0..if cfg!(miri) { 300 } else { 1_000_000 } {
            assert!(Shared::weak_count(&a2) <= 1, "weak_count showed the lock");
            drop(Shared::downgrade(&a2));
        }
        a2.store(true, SeqCst);
        a2 // kept until joined: `a` is not unique before
    });
    while !a.load(SeqCst) {
        assert!(Shared::get_mut(&mut a).is_none());
    }
    drop(t.join().unwrap());
    assert!(Shared::get_mut(&mut a).is_some());
    assert_eq!(Shared::weak_count(&a), 0);
}

#[test]
fn try_unwrap() {
    for promote in [false, true] {
        let x = made(3, promote);
        assert_eq!(Shared::try_unwrap(x), Ok(3));
        let x = made(4, promote);
        let _y = x.clone();
        let x = Shared::try_unwrap(x).unwrap_err();
        assert_eq!(*x, 4);
        // Handed back to the engine, still shared by two handles.
        assert_eq!(Shared::is_percpu(&x), promote && Shared::is_percpu(&_y));
        let x = made(5, promote);
        let _w = Shared::downgrade(&x);
        assert_eq!(Shared::try_unwrap(x), Ok(5));
    }
}

/// The value moved out is not dropped by the block (once, by its new
/// owner, also for a promoted value: no release runs), the block is freed
/// with the last `Weak`, and the `Weak`s fail to upgrade from the unwrap on.
#[test]
fn try_unwrap_moves_the_value_out_once() {
    for promote in [false, true] {
        let x = made(Canary::new(7), promote);
        let drops = x.drops.clone();
        let w = Shared::downgrade(&x);
        let c = Shared::try_unwrap(x).ok().expect("the only handle");
        assert_eq!((c.v, drops.load(SeqCst)), (7, 0));
        assert!(w.upgrade().is_none());
        assert_eq!((w.strong_count(), w.weak_count()), (0, 0));
        percpu_ref::flush();
        drop(w);
        assert_eq!(drops.load(SeqCst), 0);
        drop(c);
        assert_eq!(drops.load(SeqCst), 1);
    }
}

/// On the engine's thread (here: a promoted value's `Drop`, run by its
/// release) a promoted value's exact checks give the conservative answer,
/// `None` and `Err`, without waiting for the engine; nothing is lost.
#[test]
fn exact_checks_on_the_engine_thread_are_conservative() {
    struct Holder {
        inner: Option<Shared<Canary>>,
        said: std::sync::mpsc::Sender<(bool, bool)>,
    }
    impl Drop for Holder {
        fn drop(&mut self) {
            let mut inner = self.inner.take().unwrap();
            let got_mut = Shared::get_mut(&mut inner).is_some();
            let unwrapped = Shared::try_unwrap(inner).is_ok();
            self.said.send((got_mut, unwrapped)).unwrap();
        }
    }
    let inner = made(Canary::new(1), true);
    if !Shared::is_percpu(&inner) {
        return;
    }
    let drops = inner.drops.clone();
    let (said, heard) = channel();
    let holder = made(
        Holder {
            inner: Some(inner),
            said,
        },
        true,
    );
    drop(holder);
    percpu_ref::flush();
    assert_eq!(heard.recv().unwrap(), (false, false));
    percpu_ref::flush(); // the inner value, dropped by its `Err` handle
    assert_eq!(drops.load(SeqCst), 1);
}

/// The last of many handles dropped on several threads while the main one
/// unwraps in a loop: it succeeds once the others are gone, and the value
/// is dropped once, by the test.
#[test]
fn try_unwrap_after_other_threads_drop() {
    for promote in [false, true] {
        let rounds = if cfg!(miri) { 3 } else { 2_000 };
        rounds_within(rounds, std::time::Duration::from_secs(3), || {
            try_unwrap_round(promote);
        });
    }
}

/// One round of [`try_unwrap_after_other_threads_drop`]: three threads
/// drop their handles while this one unwraps in a loop.
fn try_unwrap_round(promote: bool) {
    let mut x = made(Canary::new(1), promote);
    let drops = x.drops.clone();
    let hs: Vec<_> = (0..3)
        .map(|_| {
            let y = x.clone();
            thread::spawn(move || drop(y))
        })
        .collect();
    let value = loop {
        match Shared::try_unwrap(x) {
            Ok(v) => break v,
            Err(back) => {
                x = back;
                thread::yield_now();
            }
        }
    };
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(drops.load(SeqCst), 0);
    drop(value);
    assert_eq!(drops.load(SeqCst), 1);
}

/// std's `into_inner`, on both kinds: of two handles given to two threads,
/// exactly one gets the value (once promoted, through the engine).
#[test]
fn into_inner() {
    for promote in [false, true] {
        rounds_within(100, std::time::Duration::from_secs(3), || {
            let x = made(3, promote);
            let y = Shared::clone(&x);
            let r_thread = thread::spawn(|| Shared::into_inner(x));
            let s_thread = thread::spawn(|| Shared::into_inner(y));
            let r = r_thread.join().expect("r_thread panicked");
            let s = s_thread.join().expect("s_thread panicked");
            assert!(
                matches!((r, s), (None, Some(3)) | (Some(3), None)),
                "unexpected result `{:?}`, expected `(None, Some(3))` or `(Some(3), None)`",
                (r, s),
            );
        });
        let x = made(3, promote);
        assert_eq!(Shared::into_inner(x), Some(3));
        let x = made(4, promote);
        let y = Shared::clone(&x);
        assert_eq!(Shared::into_inner(x), None);
        assert_eq!(Shared::into_inner(y), Some(4));
        let x = made(5, promote);
        let _w = Shared::downgrade(&x);
        assert_eq!(Shared::into_inner(x), Some(5));
    }
}

/// Every handle of a value, on more threads than cores, cloned and dropped
/// meanwhile, ends in `into_inner`: exactly one gets the value, which is
/// never dropped by the block (once, by the test), and a `Weak` then fails
/// to upgrade.
#[test]
fn into_inner_of_every_handle_gives_the_value_once() {
    for (promote, rounds) in [(false, 500), (true, 60)] {
        rounds_within(rounds, std::time::Duration::from_secs(3), || {
            let x = made(Canary::new(9), promote);
            let drops = x.drops.clone();
            let w = Shared::downgrade(&x);
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let y = x.clone();
                    thread::spawn(move || {
                        for _ in 0..100 {
                            drop(black_box(y.clone()));
                        }
                        Shared::into_inner(y)
                    })
                })
                .collect();
            let mut got: Vec<Canary> = Shared::into_inner(x).into_iter().collect();
            for h in hs {
                got.extend(h.join().unwrap());
            }
            assert_eq!(got.len(), 1, "the value given to {} handles", got.len());
            assert!(w.upgrade().is_none());
            assert_eq!((got[0].v, drops.load(SeqCst)), (9, 0));
            drop(got);
            percpu_ref::flush();
            assert_eq!(drops.load(SeqCst), 1);
        });
    }
}

/// `into_inner` racing a plain drop of the other handle: the value goes to
/// `into_inner` or is dropped by the block, never both and never neither.
#[test]
fn into_inner_against_a_plain_last_drop() {
    for (promote, rounds) in [(false, 1_000), (true, 100)] {
        let mut taken = 0;
        let rounds = rounds_within(rounds, std::time::Duration::from_secs(3), || {
            let x = made(Canary::new(1), promote);
            let drops = x.drops.clone();
            let y = x.clone();
            let t = thread::spawn(move || drop(y));
            let got = Shared::into_inner(x);
            t.join().unwrap();
            percpu_ref::flush();
            match got {
                Some(c) => {
                    taken += 1;
                    assert_eq!(drops.load(SeqCst), 0, "taken and dropped");
                    drop(c);
                }
                None => assert_eq!(drops.load(SeqCst), 1, "neither taken nor dropped"),
            }
            assert_eq!(drops.load(SeqCst), 1);
        });
        eprintln!(
            "into_inner against a plain drop (promoted: {promote}): taken {taken} of {rounds}"
        );
    }
}

/// On the engine's thread (here: the `Drop` of another promoted value) the
/// `into_inner` of a promoted value would wait for itself: it panics,
/// naming the operation, after dropping the handle, whose value the engine
/// then drops as usual.
#[test]
fn into_inner_on_the_engine_thread_panics_and_loses_nothing() {
    if percpu_ref::backend() != Backend::Rseq || cfg!(miri) {
        return;
    }
    struct Outer {
        inner: Mutex<Option<Shared<Canary>>>,
        message: Arc<Mutex<String>>,
    }
    impl Drop for Outer {
        fn drop(&mut self) {
            let inner = self.inner.lock().unwrap().take().unwrap();
            let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Shared::into_inner(inner)
            })) else {
                panic!("into_inner on the engine's thread returned");
            };
            *self.message.lock().unwrap() = e
                .downcast_ref::<&str>()
                .map(|m| (*m).to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
        }
    }
    let inner = made(Canary::new(2), true);
    let drops = inner.drops.clone();
    let message = Arc::new(Mutex::new(String::new()));
    let outer = made(
        Outer {
            inner: Mutex::new(Some(inner)),
            message: message.clone(),
        },
        true,
    );
    drop(outer);
    percpu_ref::flush();
    percpu_ref::flush();
    let message = message.lock().unwrap().clone();
    assert!(
        message.contains("Shared::into_inner") && message.contains("engine"),
        "{message}"
    );
    assert_eq!(drops.load(SeqCst), 1);
}

#[test]
fn test_unwrap_or_clone() {
    for promote in [false, true] {
        let a = made(5, promote);
        assert_eq!(Shared::unwrap_or_clone(a), 5);
        let a = made(5, promote);
        let _b = Shared::clone(&a);
        assert_eq!(Shared::unwrap_or_clone(a), 5);
        let a = made(5, promote);
        let _w = Shared::downgrade(&a);
        assert_eq!(Shared::unwrap_or_clone(a), 5);
    }
}

#[test]
fn weak_counts() {
    assert_eq!(Weak::weak_count(&Weak::<u64>::new()), 0);
    assert_eq!(Weak::strong_count(&Weak::<u64>::new()), 0);
    for promote in [false, true] {
        let a = made(0u64, promote);
        let w = Shared::downgrade(&a);
        assert_eq!(Weak::strong_count(&w), 1);
        assert_eq!(Weak::weak_count(&w), 1);
        let w2 = w.clone();
        assert_eq!(Weak::strong_count(&w), 1);
        assert_eq!(Weak::weak_count(&w), 2);
        assert_eq!(Weak::strong_count(&w2), 1);
        assert_eq!(Weak::weak_count(&w2), 2);
        drop(w);
        assert_eq!(Weak::strong_count(&w2), 1);
        assert_eq!(Weak::weak_count(&w2), 1);
        let a2 = a.clone();
        assert_eq!(Weak::strong_count(&w2), 2);
        assert_eq!(Weak::weak_count(&w2), 1);
        drop(a2);
        drop(a);
        // A promoted value waiting for the engine counts no `Shared` (and
        // so no `Weak`) already; dropped, the same.
        assert_eq!(Weak::strong_count(&w2), 0);
        assert_eq!(Weak::weak_count(&w2), 0);
        percpu_ref::flush();
        assert_eq!(Weak::strong_count(&w2), 0);
        assert_eq!(Weak::weak_count(&w2), 0);
        drop(w2);
    }
}

#[test]
fn into_from_weak_raw() {
    for promote in [false, true] {
        let x = made(Box::new("hello"), promote);
        let y = Shared::downgrade(&x);
        let y_ptr = Weak::into_raw(y);
        // SAFETY: `x` keeps the value alive; `y_ptr` is from `into_raw`, once.
        unsafe {
            assert_eq!(**y_ptr, "hello");
            let y = Weak::from_raw(y_ptr);
            let y_up = Weak::upgrade(&y).unwrap();
            assert_eq!(**y_up, "hello");
            drop(y_up);
            assert_eq!(Shared::try_unwrap(x).map(|x| *x), Ok("hello"));
            assert!(y.upgrade().is_none());
        }
    }
}

/// A `Weak::new` survives the round trip (std's sentinel address is ours:
/// `as_ptr`'s dangling one), and a dropped value's `Weak` keeps its block
/// through it.
#[test]
fn weak_raw_of_new_and_of_a_dropped_value() {
    // SAFETY: each pointer from `into_raw`, once.
    unsafe {
        let w = Weak::<u64>::from_raw(Weak::<u64>::new().into_raw());
        assert!(w.upgrade().is_none() && Weak::ptr_eq(&w, &Weak::new()));
        let s = Shared::new(Canary::new(3));
        let drops = s.drops.clone();
        let p = Shared::downgrade(&s).into_raw();
        drop(s);
        assert_eq!(drops.load(SeqCst), 1);
        let w = Weak::from_raw(p);
        assert!(w.upgrade().is_none());
        assert_eq!((w.strong_count(), w.weak_count()), (0, 0));
    }
}

// `new_cyclic` and self-referential values.

/// A value that keeps a `Weak` of itself, set after it was made: dropped
/// once (by the last handle, or by the engine once promoted), its block
/// freed with the `Weak` inside it.
#[test]
fn weak_self_cyclic() {
    struct Cycle {
        me: Mutex<Option<Weak<Cycle>>>,
        drops: Canary,
    }
    for promote in [false, true] {
        let a = made(
            Cycle {
                me: Mutex::new(None),
                drops: Canary::new(0),
            },
            promote,
        );
        let drops = a.drops.drops.clone();
        let b = Shared::downgrade(&a.clone());
        *a.me.lock().unwrap() = Some(b);
        drop(a);
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
    }
}

#[test]
fn test_arc_cyclic_with_zero_refs() {
    struct ZeroRefs {
        inner: Weak<ZeroRefs>,
    }
    for promote in [false, true] {
        let zero_refs = Shared::new_cyclic(|inner| {
            assert_eq!(inner.strong_count(), 0);
            assert!(inner.upgrade().is_none());
            ZeroRefs { inner: Weak::new() }
        });
        if promote {
            Shared::promote(&zero_refs);
        }
        assert_eq!(Shared::strong_count(&zero_refs), 1);
        assert_eq!(Shared::weak_count(&zero_refs), 0);
        assert_eq!(zero_refs.inner.strong_count(), 0);
        assert_eq!(zero_refs.inner.weak_count(), 0);
    }
}

#[test]
fn test_arc_new_cyclic_one_ref() {
    struct OneRef {
        inner: Weak<OneRef>,
    }
    for promote in [false, true] {
        let one_ref = Shared::new_cyclic(|inner| {
            assert_eq!(inner.strong_count(), 0);
            assert!(inner.upgrade().is_none());
            OneRef {
                inner: inner.clone(),
            }
        });
        if promote {
            Shared::promote(&one_ref);
        }
        assert_eq!(Shared::strong_count(&one_ref), 1);
        assert_eq!(Shared::weak_count(&one_ref), 1);

        let one_ref2 = Weak::upgrade(&one_ref.inner).unwrap();
        assert!(Shared::ptr_eq(&one_ref, &one_ref2));

        assert_eq!(Shared::strong_count(&one_ref), 2);
        assert_eq!(Shared::weak_count(&one_ref), 1);
    }
}

#[test]
fn test_arc_cyclic_two_refs() {
    struct TwoRefs {
        inner1: Weak<TwoRefs>,
        inner2: Weak<TwoRefs>,
    }
    for promote in [false, true] {
        let two_refs = Shared::new_cyclic(|inner| {
            assert_eq!(inner.strong_count(), 0);
            assert!(inner.upgrade().is_none());

            let inner1 = inner.clone();
            let inner2 = inner1.clone();

            TwoRefs { inner1, inner2 }
        });
        if promote {
            Shared::promote(&two_refs);
        }
        assert_eq!(Shared::strong_count(&two_refs), 1);
        assert_eq!(Shared::weak_count(&two_refs), 2);

        let two_refs1 = Weak::upgrade(&two_refs.inner1).unwrap();
        assert!(Shared::ptr_eq(&two_refs, &two_refs1));

        let two_refs2 = Weak::upgrade(&two_refs.inner2).unwrap();
        assert!(Shared::ptr_eq(&two_refs, &two_refs2));

        assert_eq!(Shared::strong_count(&two_refs), 3);
        assert_eq!(Shared::weak_count(&two_refs), 2);
    }
}

/// A value made by `new_cyclic` that holds its own `Weak` is dropped
/// once, by its last handle or, promoted, by the engine (which drops the
/// `Weak` inside `T` while the count's unit still keeps the block).
#[test]
fn a_cyclic_value_is_dropped_once_in_either_mode() {
    struct Node {
        me: Weak<Node>,
        canary: Canary,
    }
    for promote in [false, true] {
        let n = Shared::new_cyclic(|me| Node {
            me: me.clone(),
            canary: Canary::new(1),
        });
        if promote {
            assert!(Shared::promote(&n) || percpu_ref::backend() != Backend::Rseq);
        }
        let drops = n.canary.drops.clone();
        let clones: Vec<_> = (0..100).map(|_| n.me.upgrade().unwrap()).collect();
        assert!(clones.iter().all(|c| c.canary.v == 1));
        let w = n.me.clone();
        drop((n, clones));
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
        assert!(w.upgrade().is_none());
        assert_eq!((w.strong_count(), w.weak_count()), (0, 0));
    }
}

/// A panic in `new_cyclic`'s function propagates; a `Weak` it kept cannot
/// upgrade, counts nothing, and frees the block when dropped (Miri reports
/// a leak or a double free).
#[test]
fn new_cyclic_panic_leaves_a_dead_weak() {
    let kept: Mutex<Option<Weak<Canary>>> = Mutex::new(None);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Shared::new_cyclic(|w: &Weak<Canary>| {
            *kept.lock().unwrap() = Some(w.clone());
            panic!("the value cannot be made");
        })
    }));
    assert!(r.is_err());
    let w = kept.lock().unwrap().take().unwrap();
    assert!(w.upgrade().is_none());
    assert_eq!((w.strong_count(), w.weak_count()), (0, 0));
    drop(w);
}

/// `Weak`s sent to other threads from inside `new_cyclic` upgrade only
/// once the value is made, and then see all of it.
#[test]
fn new_cyclic_weaks_upgrade_on_other_threads_once_made() {
    let rounds = if cfg!(miri) { 3 } else { 300 };
    for _ in 0..rounds {
        let mut threads = vec![];
        let s = Shared::new_cyclic(|w: &Weak<Vec<u64>>| {
            for _ in 0..3 {
                let w = w.clone();
                threads.push(thread::spawn(move || loop {
                    if let Some(v) = w.upgrade() {
                        return v.iter().sum::<u64>();
                    }
                    thread::yield_now();
                }));
            }
            thread::yield_now();
            (1..=100).collect()
        });
        for t in threads {
            assert_eq!(t.join().unwrap(), 5050);
        }
        assert_eq!(Shared::strong_count(&s), 1);
    }
}

// `Wake`: std's `Waker::from(Arc<W>)` tests (library/alloctests/tests/
// task.rs), and our own.

#[test]
#[cfg_attr(miri, ignore)] // as std's: `will_wake` compares vtable addresses, which Miri may duplicate
fn test_waker_will_wake_clone() {
    struct NoopWaker;

    impl percpu_ref::shared::Wake for NoopWaker {
        fn wake(_: Shared<Self>) {}
    }

    let waker = std::task::Waker::from(Shared::new(NoopWaker));
    let clone = waker.clone();

    assert!(waker.will_wake(&clone));
    assert!(clone.will_wake(&waker));
}

/// A task that counts its wakes; `wake_by_ref` is the trait's default
/// (a clone, then `wake`) unless `BY_REF`.
struct Counted<const BY_REF: bool> {
    wakes: AtomicUsize,
    canary: Canary,
}

impl<const BY_REF: bool> percpu_ref::shared::Wake for Counted<BY_REF> {
    fn wake(this: Shared<Self>) {
        this.wakes.fetch_add(1, SeqCst);
    }
    fn wake_by_ref(this: &Shared<Self>) {
        if BY_REF {
            this.wakes.fetch_add(1, SeqCst);
        } else {
            Self::wake(this.clone());
        }
    }
}

/// Wakers cloned on several threads (more than there are CPUs here),
/// woken by value and by reference, with and without the default
/// `wake_by_ref`: every wake counted, and the task dropped once, after the
/// last waker (by the engine once promoted: its clones promote it).
#[test]
fn wakers_count_every_wake_and_drop_the_task_once() {
    fn run<const BY_REF: bool>() {
        let per_thread = if cfg!(miri) { 20 } else { 5_000 };
        let task = Shared::new(Counted::<BY_REF> {
            wakes: AtomicUsize::new(0),
            canary: Canary::new(0),
        });
        let drops = task.canary.drops.clone();
        let waker = std::task::Waker::from(task.clone());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = waker.clone();
                thread::spawn(move || {
                    for i in 0..per_thread {
                        let c = w.clone();
                        if i % 16 == 0 {
                            c.wake();
                        } else {
                            c.wake_by_ref();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(task.wakes.load(SeqCst), 4 * per_thread);
        assert!(Shared::is_percpu(&task) || percpu_ref::backend() != Backend::Rseq || cfg!(miri));
        drop((task, waker));
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
    }
    run::<false>();
    run::<true>();
}

/// The raw waker's clone and drop are `increment_strong_count` and
/// `decrement_strong_count`: the counts move with them, and the last
/// reference, raw or not, drops the value.
#[test]
fn increment_and_decrement_strong_count() {
    for promote in [false, true] {
        let s = made(Canary::new(1), promote);
        let drops = s.drops.clone();
        let p = Shared::into_raw(s.clone());
        // SAFETY: `p` from `into_raw`, its reference held until the last
        // decrement; two increments, three decrements.
        unsafe {
            Shared::increment_strong_count(p);
            Shared::increment_strong_count(p);
            assert_eq!(Shared::strong_count(&s), 4);
            Shared::decrement_strong_count(p);
            Shared::decrement_strong_count(p);
            assert_eq!(Shared::strong_count(&s), 2);
            Shared::decrement_strong_count(p);
        }
        assert_eq!(Shared::strong_count(&s), 1);
        drop(s);
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1);
    }
}

/// A minimal executor on a `Shared` waker: the future is woken from
/// another thread, and every poll stores a clone of the waker (what a
/// runtime's channel or timer does), so the task's waker is promoted and
/// its later clones count per CPU.
#[test]
fn a_shared_waker_drives_a_future_woken_from_another_thread() {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::AtomicBool;
    use std::task::{Context, Poll, Waker};

    struct Unpark(thread::Thread);
    impl percpu_ref::shared::Wake for Unpark {
        fn wake(this: Shared<Self>) {
            this.0.unpark();
        }
        fn wake_by_ref(this: &Shared<Self>) {
            this.0.unpark();
        }
    }

    /// Ready once `done` is set; each poll before leaves a waker clone.
    struct Flag<'a> {
        done: &'a AtomicBool,
        waker: &'a Mutex<Option<Waker>>,
    }
    impl Future for Flag<'_> {
        type Output = ();
        fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.done.load(SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    let task = Shared::new(Unpark(thread::current()));
    let waker = Waker::from(task.clone());
    let mut cx = Context::from_waker(&waker);
    let rounds = if cfg!(miri) { 5 } else { 2_000 };
    for _ in 0..rounds {
        let done = AtomicBool::new(false);
        let slot: Mutex<Option<Waker>> = Mutex::new(None);
        let mut f = pin!(Flag {
            done: &done,
            waker: &slot,
        });
        thread::scope(|s| {
            s.spawn(|| {
                done.store(true, SeqCst);
                if let Some(w) = slot.lock().unwrap().take() {
                    w.wake();
                }
            });
            while f.as_mut().poll(&mut cx).is_pending() {
                thread::park();
            }
        });
    }
    assert!(Shared::is_percpu(&task) || percpu_ref::backend() != Backend::Rseq || cfg!(miri));
    drop(waker);
    assert_eq!(Shared::strong_count(&task), 1);
}
