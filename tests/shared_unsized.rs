//! `Shared<[T]>`, `Shared<str>` and `Shared<dyn Trait>`: std's own unsized
//! `Arc` tests, rewritten for `percpu_ref::shared` (our code, their cases:
//! rust-lang/rust library/alloctests/tests/arc.rs and
//! library/alloc/src/sync/tests.rs), and the layout, promotion and
//! concurrency cases of our own, and `new_uninit`. Where the behaviour could differ, each
//! runs on a fresh value (atomic mode, as an `Arc`) and on a promoted one,
//! with `percpu_ref::flush()` where `Arc` would have dropped the value at
//! once. `Arc`'s implicit unsized coercion (`let a: Arc<dyn Any> = arc;`,
//! the nightly `CoerceUnsized`) is `percpu_ref::shared_unsize!` here.
//!
//! Tests that cannot apply, and why:
//! - `test_from_box_trait`, `test_from_box_trait_zero_sized`
//!   (`Arc<dyn Trait>::from(Box<dyn Trait>)`): making a wide pointer to a
//!   new allocation from another one's metadata needs the nightly
//!   `ptr::from_raw_parts`; `shared_unsize!` of a `Shared::new` instead.
//! - `test_maybe_thin_unsized` (`CStr`) and `Weak::new` of an unsized `T`:
//!   not provided. `test_into_from_weak_raw_unsized`: `Weak::into_raw` is
//!   for sized `T` only (finding the block from a dropped value's address
//!   needs its alignment, which std reads with a nightly function).
//! - `make_mut_unsized` (`CloneToUninit`, nightly), allocator tests: not
//!   provided.

mod common;

use percpu_ref::shared::{Shared, Weak};
use percpu_ref::{shared_unsize, Backend};
use std::any::Any;
use std::collections::hash_map::DefaultHasher;
use std::fmt::Display;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;

/// Promotes `s` where the backend can, and says whether it did.
fn promote<T: ?Sized>(s: &Shared<T>) -> bool {
    let promoted = Shared::promote(s);
    assert!(promoted || percpu_ref::backend() != Backend::Rseq);
    assert_eq!(Shared::is_percpu(s), promoted);
    promoted
}

/// An element whose clones and drops are counted.
struct Counted {
    v: usize,
    live: Arc<AtomicUsize>,
}

impl Counted {
    fn new(v: usize, live: &Arc<AtomicUsize>) -> Counted {
        live.fetch_add(1, SeqCst);
        Counted {
            v,
            live: live.clone(),
        }
    }
}

impl Clone for Counted {
    fn clone(&self) -> Counted {
        assert!(self.v != 1000, "Counted: a clone of 1000 panics");
        Counted::new(self.v, &self.live)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let before = self.live.fetch_sub(1, SeqCst);
        assert!(before > 0, "Counted {} dropped twice", self.v);
    }
}

fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

#[test]
fn test_from_str() {
    let r: Shared<str> = Shared::from("foo");
    assert_eq!(&r[..], "foo");
    assert_eq!(r.len(), 3);
}

#[test]
fn test_copy_from_slice() {
    let s: &[u32] = &[1, 2, 3];
    let r: Shared<[u32]> = Shared::from(s);
    assert_eq!(&r[..], [1, 2, 3]);
}

#[test]
fn test_clone_from_slice() {
    #[derive(Clone, Debug, Eq, PartialEq)]
    struct X(u32);
    let s: &[X] = &[X(1), X(2), X(3)];
    let r: Shared<[X]> = Shared::from(s);
    assert_eq!(&r[..], s);
}

#[test]
fn test_clone_from_slice_panic() {
    let live = Arc::new(AtomicUsize::new(0));
    let s = [
        Counted::new(0, &live),
        Counted::new(1, &live),
        Counted::new(1000, &live),
        Counted::new(2, &live),
    ];
    let r = catch_unwind(AssertUnwindSafe(|| Shared::<[Counted]>::from(&s[..])));
    let err = r.err().expect("the third clone panics");
    assert_eq!(
        err.downcast_ref::<&str>().copied(),
        Some("Counted: a clone of 1000 panics")
    );
    // The two clones made before the panic were dropped, once each, and
    // the originals are untouched.
    assert_eq!(live.load(SeqCst), 4);
    drop(s);
    assert_eq!(live.load(SeqCst), 0);
}

#[test]
fn test_from_box_str() {
    let s = String::from("foo").into_boxed_str();
    let r: Shared<str> = Shared::from(s);
    assert_eq!(&r[..], "foo");
}

#[test]
fn test_from_string() {
    let r: Shared<str> = Shared::from(String::from("a string that is moved"));
    assert_eq!(&*r, "a string that is moved");
}

#[test]
fn from_cow() {
    use std::borrow::Cow;
    let b: Shared<str> = Shared::from(Cow::Borrowed("borrowed"));
    let o: Shared<str> = Shared::from(Cow::<str>::Owned(String::from("owned")));
    assert_eq!((&*b, &*o), ("borrowed", "owned"));
    let live = Arc::new(AtomicUsize::new(0));
    let v = vec![Counted::new(1, &live), Counted::new(2, &live)];
    let cloned: Shared<[Counted]> = Shared::from(Cow::Borrowed(&v[..]));
    assert_eq!(live.load(SeqCst), 4, "a borrowed slice is cloned");
    let moved: Shared<[Counted]> = Shared::from(Cow::<[Counted]>::Owned(v));
    assert_eq!(live.load(SeqCst), 4, "an owned one is moved");
    assert_eq!((cloned[1].v, moved[0].v), (2, 1));
    drop((cloned, moved));
    assert_eq!(live.load(SeqCst), 0);
}

#[test]
fn test_from_box_slice() {
    let s = vec![1, 2, 3].into_boxed_slice();
    let r: Shared<[u32]> = Shared::from(s);
    assert_eq!(&r[..], [1, 2, 3]);
}

#[test]
fn test_from_vec() {
    let v = vec![1, 2, 3];
    let r: Shared<[u32]> = Shared::from(v);
    assert_eq!(&r[..], [1, 2, 3]);
}

#[test]
fn test_from_array() {
    let live = Arc::new(AtomicUsize::new(0));
    let r: Shared<[Counted]> = Shared::from([Counted::new(7, &live), Counted::new(8, &live)]);
    assert_eq!(r.iter().map(|c| c.v).collect::<Vec<_>>(), [7, 8]);
    assert_eq!(live.load(SeqCst), 2, "moved, not cloned");
    drop(r);
    assert_eq!(live.load(SeqCst), 0);
}

#[test]
fn shared_from_iter() {
    let exact: Shared<[u32]> = (0..5).collect();
    assert_eq!(&*exact, [0, 1, 2, 3, 4]);
    let inexact: Shared<[u32]> = (0..100).filter(|i| i % 7 == 0).collect();
    assert_eq!(inexact.len(), 15);
    let empty: Shared<[String]> = std::iter::empty().collect();
    assert!(empty.is_empty());
}

#[test]
fn test_into_from_raw_unsized() {
    let arc: Shared<str> = Shared::from("foo");
    let ptr = Shared::into_raw(arc.clone());
    // SAFETY: from `into_raw`, once.
    let arc2 = unsafe { Shared::from_raw(ptr) };
    // SAFETY: `arc` keeps the value alive.
    assert_eq!(unsafe { &*ptr }, "foo");
    assert_eq!(arc, arc2);

    let s: Shared<[u64]> = Shared::from(vec![4, 5, 6]);
    let p = Shared::into_raw(Shared::clone(&s));
    assert_eq!(Shared::strong_count(&s), 2);
    // SAFETY: `p` is from `into_raw`, its reference still held; each of
    // the two references is given back once.
    unsafe {
        Shared::increment_strong_count(p);
        assert_eq!(Shared::strong_count(&s), 3);
        Shared::decrement_strong_count(p);
        let back = Shared::from_raw(p);
        assert!(Shared::ptr_eq(&back, &s));
        assert_eq!(&*back, [4, 5, 6]);
    }
    assert_eq!(Shared::strong_count(&s), 1);
}

#[test]
fn default_and_traits() {
    let e: Shared<str> = Shared::default();
    assert_eq!(&*e, "");
    let z: Shared<[u8]> = Shared::default();
    assert!(z.is_empty());

    let a: Shared<str> = Shared::from("abc");
    let b: Shared<str> = Shared::from(String::from("abd"));
    assert!(a < b);
    assert_eq!(a.cmp(&a.clone()), std::cmp::Ordering::Equal);
    assert_eq!(hash_of(&a), hash_of("abc"));
    assert_eq!(format!("{a}/{a:?}"), "abc/\"abc\"");
    let s: Shared<[i32]> = Shared::from(&[1, 2][..]);
    assert_eq!(format!("{s:?}"), "[1, 2]");
    let borrowed: &[i32] = std::borrow::Borrow::borrow(&s);
    assert_eq!(borrowed, s.as_ref());
    // As `Arc`'s: the value's pointer, wide (its length shown).
    assert_eq!(format!("{s:p}"), format!("{:p}", Shared::as_ptr(&s)));

    fn assert_send_sync<T: Send + Sync + Unpin + std::panic::UnwindSafe>() {}
    assert_send_sync::<Shared<str>>();
    assert_send_sync::<Shared<[u64]>>();
    assert_send_sync::<Weak<str>>();
    fn assert_shareable<T: Send + Sync + Unpin>() {}
    assert_shareable::<Shared<dyn Display + Send + Sync>>();
    // As `Arc<T>`: `Unpin` whatever `T` is (the value lives in the block).
    fn assert_unpin<T: Unpin + ?Sized>() {}
    assert_unpin::<Shared<[std::marker::PhantomPinned]>>();
    assert_unpin::<Weak<dyn Display>>();
}

#[test]
fn str_to_bytes_shares_the_allocation() {
    let s: Shared<str> = Shared::from("ok");
    let p = Shared::as_ptr(&s).cast::<u8>();
    let bytes: Shared<[u8]> = Shared::from(s);
    assert_eq!(&*bytes, b"ok");
    assert_eq!(Shared::as_ptr(&bytes).cast::<u8>(), p);
}

#[test]
fn test_ptr_eq_unsized() {
    let a: Shared<str> = Shared::from("same");
    let b = Shared::clone(&a);
    let c: Shared<str> = Shared::from("same");
    assert!(Shared::ptr_eq(&a, &b));
    assert!(!Shared::ptr_eq(&a, &c));
    assert_eq!(a, c);
    let w = Shared::downgrade(&a);
    assert!(Weak::ptr_eq(&w, &Shared::downgrade(&b)));
    assert!(!Weak::ptr_eq(&w, &Shared::downgrade(&c)));
}

#[test]
fn zero_sized_and_empty() {
    let units: Shared<[()]> = Shared::from(vec![(); 1000]);
    assert_eq!(units.len(), 1000);
    let c = units.clone();
    drop(units);
    assert_eq!(c.len(), 1000);
    let none: Shared<[String]> = Shared::from(Vec::new());
    assert_eq!(none.len(), 0);
    assert_eq!(Shared::strong_count(&none), 1);
}

#[test]
fn over_aligned_elements() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    #[repr(align(128))]
    struct Line(u8);
    let s: Shared<[Line]> = Shared::from(vec![Line(1), Line(2)]);
    let p = Shared::as_ptr(&s);
    assert_eq!(p.cast::<Line>() as usize % 128, 0);
    let raw = Shared::into_raw(s);
    // SAFETY: from `into_raw`, once.
    let back = unsafe { Shared::from_raw(raw) };
    assert_eq!(&*back, [Line(1), Line(2)]);
    let one: Shared<[u8]> = Shared::from(vec![9u8]);
    assert_eq!(Shared::as_ptr(&one).cast::<u8>() as usize % 8, 0);
}

#[test]
fn weak_of_a_slice() {
    for promoted in [false, true] {
        let live = Arc::new(AtomicUsize::new(0));
        let s: Shared<[Counted]> = (0..3).map(|v| Counted::new(v, &live)).collect();
        let promoted = promoted && promote(&s);
        let w = Shared::downgrade(&s);
        assert_eq!((w.strong_count(), w.weak_count()), (1, 1));
        let up = w.upgrade().expect("alive");
        assert_eq!(up[2].v, 2);
        let w2 = w.clone();
        drop((s, up));
        if promoted {
            percpu_ref::flush();
        }
        assert_eq!(live.load(SeqCst), 0, "dropped once the handles are gone");
        assert!(w.upgrade().is_none());
        assert_eq!((w2.strong_count(), w2.weak_count()), (0, 0));
    }
}

#[test]
fn get_mut_of_a_slice() {
    for promoted in [false, true] {
        let mut s: Shared<[u32]> = Shared::from(vec![1, 2, 3]);
        promoted.then(|| promote(&s));
        let c = s.clone();
        assert!(Shared::get_mut(&mut s).is_none());
        drop(c);
        if let Some(v) = Shared::get_mut(&mut s) {
            v[0] = 10;
        } else {
            // A promoted value's check is conservative only on the engine's
            // thread; anywhere else it is exact.
            panic!("get_mut of the only handle (promoted: {promoted}) is None");
        }
        assert_eq!(&*s, [10, 2, 3]);
        let w = Shared::downgrade(&s);
        assert!(Shared::get_mut(&mut s).is_none(), "a Weak exists");
        drop(w);
    }
}

#[test]
fn promoted_slice_is_dropped_once_by_the_engine() {
    let live = Arc::new(AtomicUsize::new(0));
    let s: Shared<[Counted]> = (0..64).map(|v| Counted::new(v, &live)).collect();
    if !promote(&s) {
        return;
    }
    let name: Shared<str> = Shared::from("promoted");
    promote(&name);
    let clones: Vec<_> = (0..10).map(|_| (s.clone(), name.clone())).collect();
    drop(s);
    assert_eq!(live.load(SeqCst), 64);
    drop((clones, name));
    percpu_ref::flush();
    assert_eq!(live.load(SeqCst), 0);
}

/// More threads than cores clone, read, drop and upgrade one slice and one
/// string, promoted at the threshold while they run; every element is
/// dropped exactly once, after the last handle.
#[test]
fn threads_share_a_slice_and_a_string() {
    let threads = 2 * std::thread::available_parallelism()
        .map_or(2, usize::from)
        .max(2);
    let rounds = if cfg!(miri) {
        50
    } else {
        common::scaled(500_000)
    };
    let live = Arc::new(AtomicUsize::new(0));
    let s: Shared<[Counted]> = (0..16).map(|v| Counted::new(v, &live)).collect();
    let name: Shared<str> = Shared::from("shared name");
    let weak = Shared::downgrade(&s);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (s, name, weak) = (s.clone(), name.clone(), weak.clone());
            thread::spawn(move || {
                let mut sum = 0;
                for i in 0..rounds {
                    let c = Shared::clone(&s);
                    sum += c[i % 16].v;
                    if i % 1024 == t {
                        let up = weak.upgrade().expect("a handle is held");
                        sum += up.len();
                    }
                    let n = Shared::clone(&name);
                    sum += n.len();
                }
                sum
            })
        })
        .collect();
    drop((s, name));
    for w in workers {
        assert!(w.join().expect("worker") > 0);
    }
    percpu_ref::flush();
    assert_eq!(live.load(SeqCst), 0);
    assert!(weak.upgrade().is_none());
}

#[test]
fn test_unsized() {
    let x: Shared<[i32]> = shared_unsize!(Shared::new([1, 2, 3]), [i32]);
    assert_eq!(format!("{x:?}"), "[1, 2, 3]");
    let y = Shared::downgrade(&x.clone());
    drop(x);
    assert!(y.upgrade().is_none());
}

#[test]
fn trait_object() {
    let a: Shared<u32> = Shared::new(4);
    let a: Shared<dyn Any + Send + Sync> = shared_unsize!(a, dyn Any + Send + Sync);
    let weak: Weak<dyn Any + Send + Sync> = Shared::downgrade(&a);
    assert!(weak.upgrade().is_some());
    assert_eq!(weak.upgrade().unwrap().downcast_ref::<u32>(), Some(&4));
    drop(a);
    assert!(weak.upgrade().is_none());
}

#[test]
fn test_downcast() {
    let r1: Shared<dyn Any + Send + Sync> =
        shared_unsize!(Shared::new(i32::MAX), dyn Any + Send + Sync);
    let r2: Shared<dyn Any + Send + Sync> =
        shared_unsize!(Shared::new("abc"), dyn Any + Send + Sync);
    assert!(r1.clone().downcast::<u32>().is_err());
    let r1i32 = r1.downcast::<i32>();
    assert!(r1i32.is_ok());
    assert_eq!(r1i32.unwrap(), Shared::new(i32::MAX));
    assert!(r2.clone().downcast::<i32>().is_err());
    let r2str = r2.downcast::<&'static str>();
    assert!(r2str.is_ok());
    assert_eq!(r2str.unwrap(), Shared::new("abc"));
}

#[test]
fn test_into_from_raw_dyn() {
    let arc: Shared<dyn Display + Send + Sync> =
        shared_unsize!(Shared::new(123), dyn Display + Send + Sync);
    let ptr = Shared::into_raw(arc.clone());
    // SAFETY: from `into_raw`, once.
    let arc2 = unsafe { Shared::from_raw(ptr) };
    // SAFETY: `arc` keeps the value alive.
    assert_eq!(unsafe { &*ptr }.to_string(), "123");
    assert_eq!(arc2.to_string(), "123");
}

#[test]
fn test_array_from_slice() {
    let v = vec![1, 2, 3];
    let r: Shared<[u32]> = Shared::from(v);
    let a: Result<Shared<[u32; 3]>, _> = r.clone().try_into();
    assert!(a.is_ok());
    let a: Result<Shared<[u32; 2]>, _> = r.clone().try_into();
    assert!(a.is_err());
}

/// A trait object of an over-aligned value finds its block (the vtable's
/// alignment gives the value's offset), and is dropped through the vtable
/// once, whether the value was promoted before the coercion (the erased
/// `release` is the concrete type's) or after it (the trait object's).
#[test]
fn dyn_values_promoted_before_and_after_the_coercion() {
    #[repr(align(64))]
    struct Wide(Counted);
    impl Display for Wide {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "wide {}", self.0.v)
        }
    }
    for promote_first in [false, true] {
        let live = Arc::new(AtomicUsize::new(0));
        let s = Shared::new(Wide(Counted::new(5, &live)));
        let promoted = promote_first && promote(&s);
        let d: Shared<dyn Display + Send + Sync> = shared_unsize!(s, dyn Display + Send + Sync);
        let promoted = promoted || promote(&d);
        assert_eq!(Shared::as_ptr(&d).cast::<u8>() as usize % 64, 0);
        let raw = Shared::into_raw(d.clone());
        // SAFETY: from `into_raw`, once.
        let back = unsafe { Shared::from_raw(raw) };
        assert!(Shared::ptr_eq(&back, &d));
        let w = Shared::downgrade(&d);
        let clones: Vec<_> = (0..100).map(|_| Shared::clone(&d)).collect();
        assert_eq!(clones[99].to_string(), "wide 5");
        drop((d, back, clones));
        if promoted {
            percpu_ref::flush();
        }
        assert_eq!(live.load(SeqCst), 0, "dropped once the handles are gone");
        assert!(w.upgrade().is_none());
    }
}

/// Handlers behind trait objects, shared by more threads than cores; each
/// value is dropped once after the last clone.
#[test]
fn threads_share_trait_objects() {
    trait Handler: Send + Sync {
        fn handle(&self, x: usize) -> usize;
    }
    struct Add(usize, #[allow(dead_code)] Counted);
    struct Mul(usize, #[allow(dead_code)] Counted);
    impl Handler for Add {
        fn handle(&self, x: usize) -> usize {
            x + self.0
        }
    }
    impl Handler for Mul {
        fn handle(&self, x: usize) -> usize {
            x * self.0
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let handlers: Vec<Shared<dyn Handler>> = vec![
        shared_unsize!(Shared::new(Add(1, Counted::new(0, &live))), dyn Handler),
        shared_unsize!(Shared::new(Mul(2, Counted::new(1, &live))), dyn Handler),
    ];
    let threads = 2 * std::thread::available_parallelism()
        .map_or(2, usize::from)
        .max(2);
    let rounds = if cfg!(miri) {
        50
    } else {
        common::scaled(200_000)
    };
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let hs: Vec<_> = handlers.iter().map(Shared::clone).collect();
            thread::spawn(move || {
                let mut x = 0usize;
                for i in 0..rounds {
                    let h = Shared::clone(&hs[i % 2]);
                    x = h.handle(x) % 1_000_003;
                }
                x
            })
        })
        .collect();
    drop(handlers);
    let results: Vec<_> = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    percpu_ref::flush();
    assert_eq!(live.load(SeqCst), 0);
}

/// `new_uninit`: written through `get_mut`, then promoted as any value
/// once `assume_init` found its handle the only one.
#[test]
fn new_uninit_then_promoted() {
    let live = Arc::new(AtomicUsize::new(0));
    let mut u = Shared::<Counted>::new_uninit();
    // Held: not promoted while uninitialised, whatever the clones.
    assert!(!Shared::promote(&u));
    let clones: Vec<_> = (0..200).map(|_| u.clone()).collect();
    assert!(!Shared::is_percpu(&u));
    drop(clones);
    Shared::get_mut(&mut u)
        .expect("the only handle")
        .write(Counted::new(3, &live));
    // SAFETY: written just above.
    let s = unsafe { u.assume_init() };
    assert_eq!(s.v, 3);
    let promoted = promote(&s);
    let c = s.clone();
    drop(s);
    assert_eq!(live.load(SeqCst), 1);
    drop(c);
    if promoted {
        percpu_ref::flush();
    }
    assert_eq!(live.load(SeqCst), 0, "dropped once, through T's release");
}

/// A value shared (or with a `Weak`) before its `assume_init` is never
/// promoted: another handle may still be a `MaybeUninit` one.
#[test]
fn assume_init_of_a_shared_value_keeps_it_in_the_word() {
    let live = Arc::new(AtomicUsize::new(0));
    let mut u = Shared::<Counted>::new_uninit();
    Shared::get_mut(&mut u)
        .unwrap()
        .write(Counted::new(4, &live));
    let other = u.clone();
    // SAFETY: written above.
    let s = unsafe { u.assume_init() };
    assert!(!Shared::promote(&s));
    let clones: Vec<_> = (0..200).map(|_| s.clone()).collect();
    assert!(!Shared::is_percpu(&s));
    drop((other, clones));
    drop(s); // the last handle is a `Shared<Counted>`: dropped here, at once
    assert_eq!(live.load(SeqCst), 0);

    let mut u = Shared::<u8>::new_uninit();
    Shared::get_mut(&mut u).unwrap().write(1);
    let w = Shared::downgrade(&u);
    // SAFETY: written above.
    let s = unsafe { u.assume_init() };
    assert!(!Shared::promote(&s), "a Weak existed at assume_init");
    drop(w);
}

#[test]
fn new_uninit_slice_filled_in_place() {
    let live = Arc::new(AtomicUsize::new(0));
    let n = if cfg!(miri) { 10 } else { 1000 };
    let mut u = Shared::<[Counted]>::new_uninit_slice(n);
    for (i, e) in Shared::get_mut(&mut u).unwrap().iter_mut().enumerate() {
        e.write(Counted::new(i, &live));
    }
    // SAFETY: every element written above.
    let s = unsafe { u.assume_init() };
    assert_eq!((s.len(), s[n - 1].v), (n, n - 1));
    let promoted = promote(&s);
    let clones: Vec<_> = (0..10).map(|_| s.clone()).collect();
    drop((s, clones));
    if promoted {
        percpu_ref::flush();
    }
    assert_eq!(live.load(SeqCst), 0);
    let empty = Shared::<[String]>::new_uninit_slice(0);
    // SAFETY: no element to write.
    assert!(unsafe { empty.assume_init() }.is_empty());
}

/// A `Shared<MaybeUninit<T>>` made with `Shared::new` can be promoted
/// before its `assume_init` (its ref's `release` then drops nothing): the
/// only handle moves the value into a new block, so `T` is dropped once;
/// with other handles alive the promoted word is left as it is (`T` is
/// leaked, never dropped twice or read freed).
#[test]
fn assume_init_of_a_value_promoted_uninitialised() {
    use std::mem::MaybeUninit;
    let live = Arc::new(AtomicUsize::new(0));
    let u = Shared::new(MaybeUninit::new(Counted::new(8, &live)));
    promote(&u);
    let clones: Vec<_> = (0..100).map(|_| u.clone()).collect();
    drop(clones);
    // SAFETY: made initialised.
    let s = unsafe { u.assume_init() };
    assert_eq!(s.v, 8);
    // Moved into a new block: in atomic mode again, as a fresh value.
    assert!(!Shared::is_percpu(&s));
    let c = s.clone();
    drop((s, c));
    percpu_ref::flush();
    assert_eq!(live.load(SeqCst), 0, "dropped once, as a T");

    let u = Shared::new(MaybeUninit::new(Counted::new(9, &live)));
    let promoted = promote(&u);
    let other = u.clone();
    // SAFETY: made initialised.
    let s = unsafe { u.assume_init() };
    let more: Vec<_> = (0..100).map(|_| s.clone()).collect();
    assert!(more.iter().all(|m| m.v == 9));
    // The `MaybeUninit` handle first: as with std, a value whose last
    // handle is a `MaybeUninit` one is never dropped.
    drop(other);
    drop((s, more));
    percpu_ref::flush();
    // Promoted as a `MaybeUninit` and shared at `assume_init`: leaked
    // (its ref's `release` is `MaybeUninit`'s); else dropped by the last.
    assert_eq!(live.load(SeqCst), usize::from(promoted));
}
