//! [`Shared`], the handle, and the traits it delegates to `T`.

use super::block::{
    alloc, alloc_unpublished, block, block_of_live, into_inner_promoted, move_out_last, publish,
    put_in_word, put_ref, value_ptr, Block, InWord, Taken,
};
use super::Weak;
use std::borrow::Borrow;
use std::cmp::Ordering as CmpOrdering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::pin::Pin;
use std::ptr::NonNull;

/// A shared, reference-counted `T` that frees itself, counted per CPU once
/// it is hot: `std::sync::Arc` without the shared cache line on every
/// clone.
///
/// `Shared::new` makes a value in atomic mode (a clone is one atomic add,
/// as `Arc`'s); after [`PROMOTE_AFTER`](super::PROMOTE_AFTER) clones (or
/// at [`Shared::promote`]) it counts per CPU, and the grace-period engine
/// drops `T` a few milliseconds after the last `Shared` is gone (at once
/// with [`percpu_ref::flush`](crate::flush)). See the [module
/// docs](super) for where `T` is dropped and what differs from `Arc`.
///
/// `Send` and `Sync` exactly when `T` is both, as `Arc<T>`:
///
/// ```compile_fail
/// use percpu_ref::shared::Shared;
/// let s = Shared::new(std::cell::Cell::new(1)); // Send but not Sync
/// std::thread::spawn(move || s.set(2));
/// ```
///
/// `T: Send + 'static` is required to make one (unlike `Arc`), because
/// the engine may drop `T` on its own thread:
///
/// ```compile_fail
/// use percpu_ref::shared::Shared;
/// let s = Shared::new(std::rc::Rc::new(1)); // not Send
/// ```
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let config = Shared::new(vec![1u64, 2, 3]);
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let c = Shared::clone(&config);
///         std::thread::spawn(move || (0..1000).map(|_| Shared::clone(&c).iter().sum::<u64>()).sum::<u64>())
///     })
///     .collect();
/// drop(config); // nobody owns it: the last handle frees it
/// for w in workers {
///     assert_eq!(w.join().unwrap(), 6000);
/// }
/// ```
pub struct Shared<T: ?Sized> {
    pub(super) ptr: NonNull<Block<T>>,
    pub(super) _owns: PhantomData<Block<T>>,
}

// SAFETY: a `Shared` gives `&T` on any thread (`T: Sync`) and the last one
// may drop `T` on its thread or on the engine's (`T: Send`), as `Arc<T>`.
unsafe impl<T: ?Sized + Send + Sync> Send for Shared<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: ?Sized + Send + Sync> Sync for Shared<T> {}

impl<T: Send + 'static> Shared<T> {
    /// A new value, in atomic mode, with this one handle; as `Arc::new`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(5);
    /// assert_eq!(*s, 5);
    /// assert!(!Shared::is_percpu(&s)); // not cloned yet
    /// ```
    #[must_use]
    pub fn new(value: T) -> Self {
        Shared::from_block(alloc(
            value,
            #[cfg(percpu_ref_loom)]
            crate::backend(),
        ))
    }

    /// A new value that can never be moved out of its block again, as
    /// `Arc::pin`: `T` is dropped in place (by the last handle, or by the
    /// engine), and nothing hands out `&mut T` or `T` through a pinned
    /// handle.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// use std::marker::PhantomPinned;
    ///
    /// struct Node {
    ///     value: u32,
    ///     _pinned: PhantomPinned, // say, a list others point into
    /// }
    /// let a = Shared::pin(Node { value: 1, _pinned: PhantomPinned });
    /// let b = a.clone(); // the clones share the one pinned value
    /// assert_eq!(b.value, 1);
    /// assert!(std::ptr::eq(&*a, &*b));
    /// ```
    #[must_use]
    pub fn pin(value: T) -> Pin<Self> {
        // SAFETY: the block never moves `T`: it is dropped in place, and
        // what moves it out (`try_unwrap`, `into_inner`, `make_mut`) or
        // lends `&mut T` (`get_mut`) needs the `Shared` itself, which a
        // `Pin` gives only for `T: Unpin`.
        unsafe { Pin::new_unchecked(Shared::new(value)) }
    }

    /// A new value that can hold [`Weak`]s of itself, as `Arc::new_cyclic`:
    /// `data_fn` gets a `Weak` of the value being made and returns the
    /// value. Until it returns, that `Weak` (and its clones) cannot
    /// upgrade and count no `Shared`; afterwards they upgrade as any
    /// other. The value starts in atomic mode, as with [`Shared::new`].
    ///
    /// If `data_fn` panics, the panic propagates, the allocation is freed
    /// once the last of those `Weak`s is dropped, and nothing is leaked.
    ///
    /// # Examples
    ///
    /// A graph node that hands out handles to itself:
    ///
    /// ```
    /// use percpu_ref::shared::{Shared, Weak};
    ///
    /// struct Node {
    ///     name: &'static str,
    ///     me: Weak<Node>,
    /// }
    ///
    /// impl Node {
    ///     fn handle(&self) -> Shared<Node> {
    ///         self.me.upgrade().expect("called through a live handle")
    ///     }
    /// }
    ///
    /// let root = Shared::new_cyclic(|me| {
    ///     assert!(me.upgrade().is_none()); // not made yet
    ///     Node { name: "root", me: me.clone() }
    /// });
    /// let h = root.handle();
    /// assert!(Shared::ptr_eq(&h, &root));
    /// assert_eq!((h.name, Shared::strong_count(&root), Shared::weak_count(&root)), ("root", 2, 1));
    /// ```
    #[must_use]
    pub fn new_cyclic<F: FnOnce(&Weak<T>) -> T>(data_fn: F) -> Self {
        Self::cyclic_on(
            data_fn,
            #[cfg(percpu_ref_loom)]
            crate::backend(),
        )
    }

    /// [`Shared::new_cyclic`] on a backend (a loom model's choice; the
    /// process's otherwise).
    pub(crate) fn cyclic_on<F: FnOnce(&Weak<T>) -> T>(
        data_fn: F,
        #[cfg(percpu_ref_loom)] backend: crate::Backend,
    ) -> Self {
        let p = alloc_unpublished::<T>(
            #[cfg(percpu_ref_loom)]
            backend,
        );
        // The block's one allocation unit: if `data_fn` panics, this
        // `Weak`'s drop (or its clones') frees the block, `T` unwritten.
        let lent = Weak::holding(p);
        let value = data_fn(&lent);
        // SAFETY: `p` came from `alloc_unpublished` and is published once;
        // `lent` holds its unit, which the count takes over below.
        unsafe { publish(p, value) };
        // Its unit is the strong count's now (`block`'s module docs: one
        // unit for the whole count while it is above zero).
        std::mem::forget(lent);
        Shared::from_block(p)
    }

    /// [`Shared::new`] on a chosen backend, for loom models (where the
    /// default is the sharded backend, which never promotes).
    #[cfg(percpu_ref_loom)]
    pub(crate) fn new_on(value: T, backend: crate::Backend) -> Self {
        Shared::from_block(alloc(value, backend))
    }
}

impl<T: ?Sized> Shared<T> {
    /// A handle for a reference the caller just took on the block.
    #[inline(always)]
    pub(super) fn from_block(ptr: NonNull<Block<T>>) -> Self {
        Shared {
            ptr,
            _owns: PhantomData,
        }
    }

    #[inline(always)]
    pub(super) fn block(&self) -> &Block<T> {
        // SAFETY: our reference keeps the block alive.
        unsafe { block(self.ptr) }
    }

    /// A [`Weak`] for the same value, as `Arc::downgrade`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(1);
    /// let w = Shared::downgrade(&s);
    /// assert!(Shared::ptr_eq(&w.upgrade().unwrap(), &s));
    /// drop(s);
    /// assert!(w.upgrade().is_none()); // atomic mode: released at once
    /// ```
    #[must_use = "a Weak that is dropped at once does nothing"]
    pub fn downgrade(this: &Self) -> Weak<T> {
        Weak::downgraded(this.ptr)
    }

    /// Whether two handles point to the same value, as `Arc::ptr_eq`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let a = Shared::new(1);
    /// assert!(Shared::ptr_eq(&a, &a.clone()));
    /// assert!(!Shared::ptr_eq(&a, &Shared::new(1)));
    /// ```
    #[must_use]
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        std::ptr::addr_eq(this.ptr.as_ptr(), other.ptr.as_ptr())
    }

    /// Counts clones per CPU from now on (the engine releases the value),
    /// instead of after [`PROMOTE_AFTER`](super::PROMOTE_AFTER) clones; for
    /// a value known to be hot. True if the value counts per CPU now;
    /// false where it cannot (the sharded backend, which has no per-CPU
    /// sections to scan: the value stays in atomic mode, as an `Arc`), and
    /// while another thread is promoting it (a clone that reached the
    /// threshold, or another `promote`), which this call does not wait
    /// for.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(String::from("hot"));
    /// if Shared::promote(&s) {
    ///     assert!(Shared::is_percpu(&s));
    /// }
    /// drop(s);
    /// percpu_ref::flush(); // a promoted value is dropped by the engine
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the result only says whether it applied"
    )]
    pub fn promote(this: &Self) -> bool {
        // SAFETY: our pointer and reference.
        unsafe { Block::promote(this.ptr) }
    }

    /// Whether the value counts per CPU (promoted), a snapshot.
    #[must_use]
    pub fn is_percpu(this: &Self) -> bool {
        this.block()
            .promoted_ref()
            .is_some_and(|r| r.is_managed() || r.is_percpu())
    }

    /// The address of `T`, valid for reads while a handle keeps it alive;
    /// as `Arc::as_ptr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(7);
    /// let p = Shared::as_ptr(&s);
    /// // SAFETY: `s` keeps the value alive.
    /// assert_eq!(unsafe { *p }, 7);
    /// ```
    #[must_use]
    pub fn as_ptr(this: &Self) -> *const T {
        // SAFETY: our reference keeps the block alive.
        unsafe { value_ptr(this.ptr) }
    }

    /// Turns the handle into a raw pointer to `T` without dropping its
    /// reference, as `Arc::into_raw`: the value stays alive until
    /// [`from_raw`](Self::from_raw) makes a `Shared` of it again.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let p = Shared::into_raw(Shared::new(String::from("raw")));
    /// // SAFETY: from `into_raw`, and only once.
    /// let s = unsafe { Shared::from_raw(p) };
    /// assert_eq!(*s, "raw");
    /// ```
    #[must_use = "dropping the pointer leaks the reference: the value is never dropped"]
    pub fn into_raw(this: Self) -> *const T {
        let this = ManuallyDrop::new(this);
        Shared::as_ptr(&this)
    }

    /// Takes back a reference given up by [`into_raw`](Self::into_raw), as
    /// `Arc::from_raw`.
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned by `Shared::<T>::into_raw` (the same
    /// `T`; for a `Shared<[U]>` or `Shared<str>`, the very wide pointer,
    /// its length unchanged; or an unsizing coercion of such a pointer, as
    /// [`shared_unsize!`](crate::shared_unsize) makes: `*const X` to
    /// `*const dyn Trait` or `*const [X; N]` to `*const [X]`), and each
    /// pointer `into_raw` returned must be passed here at
    /// most once (the `Shared` made here drops the reference `into_raw`
    /// kept). Anything else is undefined behaviour, as for `Arc`.
    #[must_use = "dropping the Shared drops the reference at once"]
    pub unsafe fn from_raw(ptr: *const T) -> Self {
        // SAFETY: `ptr` came from `value_ptr` of a block its reference keeps
        // allocated (the caller's promise).
        Shared::from_block(unsafe { block_of_live(ptr) })
    }

    /// Adds a reference to the value behind a pointer from
    /// [`into_raw`](Self::into_raw), as `Arc::increment_strong_count`: a
    /// clone whose handle stays raw (for a `RawWaker` of your own, say;
    /// [`Wake`](super::Wake) makes a whole `Waker`). Per CPU once the value
    /// is promoted, as any clone.
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned by `Shared::<T>::into_raw`, and the
    /// reference it kept must still be held (not yet given back by
    /// [`from_raw`](Self::from_raw) or
    /// [`decrement_strong_count`](Self::decrement_strong_count)).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let p = Shared::into_raw(Shared::new(5));
    /// // SAFETY: `p` is from `into_raw`, its reference still held; each of
    /// // the two references is given back once.
    /// unsafe {
    ///     Shared::increment_strong_count(p);
    ///     let s = Shared::from_raw(p);
    ///     assert_eq!(Shared::strong_count(&s), 2);
    ///     Shared::decrement_strong_count(p);
    ///     assert_eq!(Shared::strong_count(&s), 1);
    /// }
    /// ```
    pub unsafe fn increment_strong_count(ptr: *const T) {
        // SAFETY: the caller's promise: the reference `into_raw` kept is
        // held, so the block is alive and a clone may be taken from it.
        let held = ManuallyDrop::new(unsafe { Shared::from_raw(ptr) });
        let _added = ManuallyDrop::new(Shared::clone(&held));
    }

    /// Gives back one reference to the value behind a pointer from
    /// [`into_raw`](Self::into_raw), as `Arc::decrement_strong_count`: a
    /// drop of a raw handle (the last one drops `T`, or leaves it to the
    /// engine once promoted).
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned by `Shared::<T>::into_raw`, and the
    /// caller gives up one reference that it holds through it (kept by
    /// `into_raw` or added by
    /// [`increment_strong_count`](Self::increment_strong_count)).
    pub unsafe fn decrement_strong_count(ptr: *const T) {
        // SAFETY: the caller's promise: one reference held through `ptr`,
        // given up by this drop.
        drop(unsafe { Shared::from_raw(ptr) });
    }
}

impl<T: ?Sized> Shared<T> {
    /// `&mut T` if this is the value's only handle and no [`Weak`] exists,
    /// as `Arc::get_mut`; `None` otherwise. An unpromoted value's check is
    /// `Arc`'s (a compare-and-swap on the allocation count, which a
    /// concurrent [`downgrade`](Self::downgrade) waits for, and a load).
    ///
    /// **A promoted value's count is per CPU**, so its check first makes
    /// the count exact: the value's ref is switched to atomic mode (a grace
    /// period: under 1 µs on an idle 2-vCPU machine; tens of µs when a drop
    /// has just queued the value for the engine, whose hand-back it waits
    /// for; docs/performance.md), `Arc`'s check runs there, and the
    /// ref goes back to per-CPU counting under the engine, unique or not.
    /// Meanwhile the other handles' clones and drops count on one shared
    /// counter. Not for a hot loop on a promoted value: check once, or keep
    /// the `&mut`.
    ///
    /// On the grace-period engine's own thread (in a deferred `release` or
    /// `confirm`, such as another promoted value's `Drop`) a promoted
    /// value's check is `None` without looking: it may not wait there. It
    /// is `None` too if the kernel refuses the grace period (the value
    /// stays as it was).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let mut s = Shared::new(3);
    /// *Shared::get_mut(&mut s).unwrap() = 4;
    /// assert_eq!(*s, 4);
    /// let other = s.clone();
    /// assert!(Shared::get_mut(&mut s).is_none()); // not the only handle
    /// drop(other);
    /// assert!(Shared::get_mut(&mut s).is_some());
    /// Shared::promote(&s); // per CPU (where the backend can)
    /// *Shared::get_mut(&mut s).unwrap() = 5; // exact: a grace period
    /// assert_eq!(*s, 5);
    /// ```
    #[must_use]
    pub fn get_mut(this: &mut Self) -> Option<&mut T> {
        if this.block().is_unique() {
            // SAFETY: just checked.
            Some(unsafe { Shared::value_mut(this) })
        } else {
            None
        }
    }

    /// `&mut T`, for a handle found unique.
    ///
    /// # Safety
    ///
    /// No other handle and no `Weak` of the value exist (none can be made
    /// while `this` is borrowed mutably).
    unsafe fn value_mut(this: &mut Self) -> &mut T {
        // SAFETY: the caller's promise; `ptr` has the block's own provenance
        // (`alloc`'s `Box::into_raw`), writable, and `T` is alive (our
        // reference). Only `value` is borrowed.
        unsafe { &mut *std::ptr::addr_of_mut!((*this.ptr.as_ptr()).value) }
    }

    /// The number of `Shared`s of this value, as `Arc::strong_count`: a
    /// snapshot, exact for a value in atomic mode. Once promoted it is a
    /// racy sum of the per-CPU counts, exact only while no handle of the
    /// value is cloned or dropped (it may then be off by the operations in
    /// flight, as the engine's own guess; it is never the basis of a
    /// release). For diagnostics and tests.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(0);
    /// let t = s.clone();
    /// assert_eq!(Shared::strong_count(&s), 2);
    /// Shared::promote(&s);
    /// assert_eq!(Shared::strong_count(&s), 2); // quiescent: exact
    /// drop(t);
    /// assert_eq!(Shared::strong_count(&s), 1);
    /// ```
    #[must_use]
    pub fn strong_count(this: &Self) -> usize {
        // SAFETY: our reference keeps the block.
        unsafe { Block::strong_count(this.ptr) }
    }

    /// The number of [`Weak`]s of this value, as `Arc::weak_count`: a
    /// snapshot (0 while a [`get_mut`](Self::get_mut) holds the count,
    /// when there are none).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(0);
    /// let w = Shared::downgrade(&s);
    /// assert_eq!(Shared::weak_count(&s), 1);
    /// drop(w);
    /// assert_eq!(Shared::weak_count(&s), 0);
    /// ```
    #[must_use]
    pub fn weak_count(this: &Self) -> usize {
        // SAFETY: our reference keeps the block.
        unsafe { Block::weak_count(this.ptr) }
    }
}

impl<T> Shared<T> {
    /// `T`, if this is the value's only handle, as `Arc::try_unwrap`
    /// (`Weak`s do not stop it: they fail to upgrade from then on); the
    /// handle back otherwise. It is `Arc`'s one compare-and-swap on the
    /// count; once the value was promoted, the same compare-and-swap on the
    /// ref's count made exact first, as [`get_mut`](Self::get_mut) does (a
    /// grace period), and the ref goes back to per-CPU counting if the
    /// value stays. On the grace-period engine's own thread a promoted
    /// value's `try_unwrap` fails without looking (as `get_mut`).
    ///
    /// If all handles may be given up at once, on several threads, use
    /// [`into_inner`](Self::into_inner): exactly one of them gets `T`,
    /// where each `try_unwrap` may fail.
    ///
    /// # Errors
    ///
    /// `this`, if another `Shared` of the value exists (or the value was
    /// promoted and this is the engine's thread, or the kernel refused the
    /// grace period).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(String::from("only"));
    /// let t = s.clone();
    /// let s = Shared::try_unwrap(s).unwrap_err(); // `t` shares it
    /// drop(t);
    /// assert_eq!(Shared::try_unwrap(s).unwrap(), "only");
    /// ```
    pub fn try_unwrap(this: Self) -> Result<T, Self> {
        let how = this.block().take_last();
        if let Taken::No = how {
            return Err(this);
        }
        let this = ManuallyDrop::new(this);
        // SAFETY: `take_last` took the count from one (ours) to zero, as
        // `how` says, and its call returned.
        Ok(unsafe { move_out_last(this.ptr, how) })
    }
}

impl<T> Shared<T> {
    /// `T` if this was the value's last handle, as `Arc::into_inner`:
    /// drops this handle, and returns `T` instead of dropping it when no
    /// other handle remains. If every handle of a value goes through
    /// `into_inner`, exactly one of them gets `T`, whatever the order and
    /// the threads (where [`try_unwrap`](Self::try_unwrap) could fail for
    /// all of them). `Weak`s do not stop it.
    ///
    /// In atomic mode (never promoted) it is `Arc`'s one read-modify-write
    /// of the count. **Once the value was promoted it waits for the
    /// grace-period engine**, which alone learns whether a per-CPU put was
    /// the last: the handle registers as waiting for `T` and is dropped,
    /// and the call waits as [`flush`](crate::flush) does (a few grace
    /// periods: about 0.1 ms on an idle 2-vCPU machine, docs/performance.md;
    /// longer while other threads keep the engine busy), then
    /// takes `T` if the engine's release left it for a waiting
    /// `into_inner`. An upgrade of a `Weak` that gets in before the
    /// engine's look keeps the value alive (`None`), as an upgrade before
    /// `Arc::into_inner` would.
    ///
    /// # Panics
    ///
    /// Called on the grace-period engine's thread (from a deferred
    /// `release` or `confirm`, such as another promoted value's `Drop`) on
    /// a promoted value: the engine would wait for itself. The handle is
    /// dropped first, so nothing is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(String::from("last"));
    /// let t = s.clone();
    /// let other = std::thread::spawn(move || Shared::into_inner(t));
    /// let mine = Shared::into_inner(s);
    /// let theirs = other.join().unwrap();
    /// assert!(matches!((mine.as_deref(), theirs.as_deref()), (Some("last"), None) | (None, Some("last"))));
    ///
    /// let hot = Shared::new(7);
    /// Shared::promote(&hot); // per CPU (where the backend can): the engine decides
    /// let other = hot.clone();
    /// assert_eq!(Shared::into_inner(other), None);
    /// assert_eq!(Shared::into_inner(hot), Some(7));
    /// ```
    #[must_use]
    pub fn into_inner(this: Self) -> Option<T> {
        let this = ManuallyDrop::new(this);
        let p = this.ptr;
        // SAFETY: this handle's reference, given up here or (promoted) by
        // `into_inner_promoted`.
        match unsafe { put_in_word(p) } {
            InWord::Others => None,
            // SAFETY: our drop took the word's count to zero.
            InWord::Last => Some(unsafe { move_out_last(p, Taken::InWord) }),
            InWord::Promoted(pref) => {
                let unit = Shared::downgrade(&this);
                // SAFETY: the word holds `pref`; our reference is given up
                // there, and `unit` holds the block.
                unsafe { into_inner_promoted(p, pref, unit) }
            }
        }
    }
}

impl<T: Clone + Send + 'static> Shared<T> {
    /// `T`, moved out if this is the value's only handle and cloned
    /// otherwise, as `Arc::unwrap_or_clone` (a promoted value's check is a
    /// grace period: see [`try_unwrap`](Self::try_unwrap)).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(vec![1, 2]);
    /// let t = s.clone();
    /// assert_eq!(Shared::unwrap_or_clone(s), [1, 2]); // cloned: `t` shares it
    /// assert_eq!(Shared::unwrap_or_clone(t), [1, 2]); // the last: moved out
    /// ```
    #[must_use]
    pub fn unwrap_or_clone(this: Self) -> T {
        Shared::try_unwrap(this).unwrap_or_else(|s| T::clone(&s))
    }

    /// `&mut T`, cloning `T` into a new value first unless this is its only
    /// handle and no [`Weak`] exists (clone-on-write), as `Arc::make_mut`.
    /// A promoted value's check is [`get_mut`](Self::get_mut)'s (a grace
    /// period); a clone starts unpromoted, so the next `make_mut` on it is
    /// `Arc`'s. Where `Arc` moves a unique value away from its `Weak`s,
    /// this clones it and drops the original (the `Weak`s end up the same:
    /// dangling).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let mut a = Shared::new(vec![1]);
    /// let b = a.clone();
    /// Shared::make_mut(&mut a).push(2); // cloned: `b` is shared
    /// Shared::make_mut(&mut a).push(3); // unique now: no clone
    /// assert_eq!(*a, [1, 2, 3]);
    /// assert_eq!(*b, [1]);
    /// ```
    pub fn make_mut(this: &mut Self) -> &mut T {
        if !this.block().is_unique() {
            *this = Shared::new(T::clone(this));
        }
        // SAFETY: found unique, or a value just made, whose one handle is
        // `this`, with no `Weak`.
        unsafe { Shared::value_mut(this) }
    }
}

impl<T: ?Sized> Clone for Shared<T> {
    /// A get: per CPU once promoted, one atomic add before (counted toward
    /// promotion). Inlined whole, as `PercpuRef::get` (scripts/callgrind-pair
    /// counts it: `shared`).
    #[inline(always)]
    fn clone(&self) -> Self {
        // SAFETY: our pointer and reference.
        unsafe { Block::get(self.ptr) };
        Shared::from_block(self.ptr)
    }
}

impl<T: ?Sized> Drop for Shared<T> {
    /// A put: per CPU once promoted (the engine then drops `T` after the
    /// last one), else one compare-and-swap, and the last drops `T` here.
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: this handle's reference is given up here.
        unsafe { put_ref(self.ptr) }
    }
}

impl<T: ?Sized> Deref for Shared<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: our reference keeps `T` alive (invariant 1 of `block`);
        // nobody has `&mut T` (no method gives one out).
        unsafe { &*Shared::as_ptr(self) }
    }
}

impl<T: ?Sized> AsRef<T> for Shared<T> {
    fn as_ref(&self) -> &T {
        self
    }
}

impl<T: ?Sized> Borrow<T> for Shared<T> {
    fn borrow(&self) -> &T {
        self
    }
}

impl<T: Send + 'static> From<T> for Shared<T> {
    /// [`Shared::new`].
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T: Send + 'static> From<Box<T>> for Shared<T> {
    /// The boxed value moved into a new block (the box is freed), as
    /// `Arc::from(Box<T>)`; a boxed slice or `str` has its own `From`
    /// (`Shared<[T]>`, `Shared<str>`).
    fn from(value: Box<T>) -> Self {
        Shared::new(*value)
    }
}

impl<T: Default + Send + 'static> Default for Shared<T> {
    /// A `Shared` of `T::default()`.
    fn default() -> Self {
        Shared::new(T::default())
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T: ?Sized> fmt::Pointer for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&Shared::as_ptr(self), f)
    }
}

impl<T: ?Sized + Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl<T: ?Sized + PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: ?Sized + Eq> Eq for Shared<T> {}

impl<T: ?Sized + PartialOrd> PartialOrd for Shared<T> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        (**self).partial_cmp(&**other)
    }
}

impl<T: ?Sized + Ord> Ord for Shared<T> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (**self).cmp(&**other)
    }
}
