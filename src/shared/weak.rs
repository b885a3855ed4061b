//! [`Weak`], the handle that keeps the allocation but not `T`.

use super::block::{block_of, drop_unit, value_ptr, Block, UNITS_LOCKED};
use super::Shared;
use crate::sync::Ordering;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

/// A handle that keeps the allocation of a [`Shared`] value but not the
/// value; [`upgrade`](Self::upgrade) turns it into a `Shared` while the
/// value has not been dropped. As `std::sync::Weak`.
///
/// `Send` and `Sync` exactly when `T` is both:
///
/// ```compile_fail
/// use percpu_ref::shared::Shared;
/// let s = Shared::new(std::cell::Cell::new(1));
/// let w = Shared::downgrade(&s);
/// std::thread::spawn(move || drop(w));
/// ```
pub struct Weak<T: ?Sized> {
    /// The block, or `None` for [`Weak::new`].
    pub(super) ptr: Option<NonNull<Block<T>>>,
    pub(super) _owns: PhantomData<Block<T>>,
}

// SAFETY: a `Weak` can make a `Shared` on any thread: the rules of `Shared`.
unsafe impl<T: ?Sized + Send + Sync> Send for Weak<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: ?Sized + Send + Sync> Sync for Weak<T> {}

impl<T> Weak<T> {
    /// A `Weak` that belongs to no value: [`upgrade`](Self::upgrade)
    /// always returns `None`. Allocates nothing, as `std::sync::Weak::new`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Weak;
    /// let w: Weak<u32> = Weak::new();
    /// assert!(w.upgrade().is_none());
    /// assert!(Weak::ptr_eq(&w, &w.clone()));
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        Weak {
            ptr: None,
            _owns: PhantomData,
        }
    }
}

impl<T: ?Sized> Weak<T> {
    /// One more allocation unit of the block at `p`, for a `Shared`'s
    /// `downgrade`: waits while `Shared::get_mut` holds the count locked.
    pub(super) fn downgraded(p: NonNull<Block<T>>) -> Self {
        // SAFETY: the caller's `Shared` keeps the block alive; only the
        // field is borrowed.
        let units = unsafe { &(*p.as_ptr()).units };
        // mutant shared_downgrade_ignores_lock: a downgrade adds to the
        // allocation count even while `get_mut` holds it locked (its unit is
        // lost in the unlock, and its upgrade reads `T` while the `&mut`
        // writes it).
        if mutated!("shared_downgrade_ignores_lock") {
            return Weak::new_unit(p);
        }
        // ordering-audit: Relaxed: the first read, checked by the
        // compare-and-swap.
        let mut u = units.load(Ordering::Relaxed);
        loop {
            if u == UNITS_LOCKED {
                crate::sync::spin_wait();
                // ordering-audit: Relaxed: as the first read.
                u = units.load(Ordering::Relaxed);
                continue;
            }
            assert!(
                u < UNITS_LOCKED - 1,
                "percpu_ref::shared::Shared::downgrade: the value has {u} allocation units, the most it can count"
            );
            // ordering-audit: kept: Acquire (as `Arc::downgrade`): a
            // `get_mut` that unlocked the count (release) finished its
            // check before this unit exists (the load-buffering shape of
            // the unlock's justification in `Block::is_unique`, which loom
            // does not model); otherwise a new unit from an existing one.
            match units.compare_exchange_weak(u, u + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => u = now,
            }
        }
        Weak::holding(p)
    }

    /// The `Weak` for an allocation unit of the block at `p` that the
    /// caller took or holds, and hands over to it.
    pub(super) fn holding(p: NonNull<Block<T>>) -> Self {
        Weak {
            ptr: Some(p),
            _owns: PhantomData,
        }
    }

    /// One more allocation unit of the block at `p`, for a `Weak`'s clone,
    /// whose own unit keeps the block alive and the count off the lock
    /// (`get_mut` locks it only when the strong count's unit is the only
    /// one).
    fn new_unit(p: NonNull<Block<T>>) -> Self {
        // SAFETY: the caller's `Weak` keeps the block alive; only the field
        // is borrowed (`T` may be being dropped).
        // Relaxed: a new unit from an existing one, as `Weak::clone`'s.
        unsafe { (*p.as_ptr()).units.fetch_add(1, Ordering::Relaxed) };
        Weak::holding(p)
    }

    /// A `Shared` unless the value was dropped; as `Weak::upgrade`.
    ///
    /// A value in atomic mode (not promoted) is dropped by its last
    /// `Shared`'s drop, and this fails from then on, as with `Arc`. A
    /// promoted value is dropped by the engine a few milliseconds after
    /// the last `Shared` is gone ([`percpu_ref::flush`](crate::flush)
    /// makes that happen at once); until then an upgrade succeeds and the
    /// value lives on (Refcache's weak references revive it the same way).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(String::from("cache"));
    /// let w = Shared::downgrade(&s);
    /// assert_eq!(*w.upgrade().unwrap(), "cache");
    /// drop(s);
    /// percpu_ref::flush();
    /// assert!(w.upgrade().is_none());
    /// ```
    #[inline]
    #[must_use = "a Shared that is dropped at once is a get and a put for nothing"]
    pub fn upgrade(&self) -> Option<Shared<T>> {
        let p = self.ptr?;
        // SAFETY: our allocation unit keeps the block allocated.
        if unsafe { Block::tryget(p) } {
            Some(Shared::from_block(p))
        } else {
            None
        }
    }

    /// The number of [`Shared`]s of the value, as `std::sync::Weak::strong_count`:
    /// 0 for [`Weak::new`] and once the value was dropped; a snapshot
    /// otherwise ([`Shared::strong_count`]'s, a racy sum once promoted).
    /// A promoted value whose last `Shared` is gone counts 0 here while it
    /// waits for the engine, and an upgrade still revives it then.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(1);
    /// let w = Shared::downgrade(&s);
    /// assert_eq!(w.strong_count(), 1);
    /// drop(s);
    /// assert_eq!(w.strong_count(), 0);
    /// ```
    #[must_use]
    pub fn strong_count(&self) -> usize {
        match self.ptr {
            // SAFETY: our allocation unit keeps the block.
            Some(p) => unsafe { Block::strong_count(p) },
            None => 0,
        }
    }

    /// The number of `Weak`s of the value, as `std::sync::Weak::weak_count`:
    /// 0 for [`Weak::new`] and when no `Shared` is left (by
    /// [`strong_count`](Self::strong_count)); a snapshot otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(1);
    /// let w = Shared::downgrade(&s);
    /// let v = w.clone();
    /// assert_eq!(w.weak_count(), 2);
    /// drop(v);
    /// assert_eq!(w.weak_count(), 1);
    /// drop(s);
    /// assert_eq!(w.weak_count(), 0); // no Shared left
    /// ```
    #[must_use]
    pub fn weak_count(&self) -> usize {
        match self.ptr {
            // 0 once no `Shared` is left, as std's (whose count may also
            // be one off while the last `Shared` is being dropped).
            Some(_) if self.strong_count() == 0 => 0,
            // SAFETY: our allocation unit keeps the block (and the count
            // off `get_mut`'s lock, which needs a sole unit).
            Some(p) => unsafe { Block::weak_count(p) },
            None => 0,
        }
    }

    /// Whether two handles point to the same allocation; two
    /// [`Weak::new`]s are equal (as in `std`).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::{Shared, Weak};
    /// let s = Shared::new(1);
    /// assert!(Weak::ptr_eq(&Shared::downgrade(&s), &Shared::downgrade(&s)));
    /// assert!(!Weak::ptr_eq(&Shared::downgrade(&s), &Weak::new()));
    /// ```
    #[must_use]
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        match (this.ptr, other.ptr) {
            (Some(a), Some(b)) => std::ptr::addr_eq(a.as_ptr(), b.as_ptr()),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

/// Raw pointers, for sized `T` only: a [`Weak::new`] has no block, and its
/// dangling address carries no slice length.
impl<T> Weak<T> {
    /// The address of `T` (also after it was dropped), or a dangling,
    /// aligned, non-null address for a [`Weak::new`]; as `Weak::as_ptr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let s = Shared::new(1);
    /// assert_eq!(Shared::downgrade(&s).as_ptr(), Shared::as_ptr(&s));
    /// ```
    #[must_use]
    pub fn as_ptr(&self) -> *const T {
        match self.ptr {
            // SAFETY: our allocation unit keeps the block allocated.
            Some(p) => unsafe { value_ptr(p) },
            None => NonNull::dangling().as_ptr(),
        }
    }

    /// Turns the `Weak` into a raw pointer to `T` without giving up its
    /// allocation unit, as `std::sync::Weak::into_raw`: the pointer is
    /// [`as_ptr`](Self::as_ptr)'s (dangling for a [`Weak::new`]), and the
    /// block stays allocated until [`from_raw`](Self::from_raw) makes a
    /// `Weak` of it again. `T` may be dropped meanwhile: read through the
    /// pointer only while a `Shared` of the value is held.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::{Shared, Weak};
    /// let s = Shared::new(5);
    /// let p = Shared::downgrade(&s).into_raw();
    /// assert_eq!(p, Shared::as_ptr(&s));
    /// // SAFETY: from `into_raw`, once.
    /// let w = unsafe { Weak::from_raw(p) };
    /// assert_eq!(*w.upgrade().unwrap(), 5);
    /// ```
    #[must_use = "dropping the pointer leaks the allocation unit: the block is never freed"]
    pub fn into_raw(self) -> *const T {
        let this = ManuallyDrop::new(self);
        this.as_ptr()
    }

    /// Takes back an allocation unit given up by
    /// [`into_raw`](Self::into_raw), as `std::sync::Weak::from_raw`.
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned by `Weak::<T>::into_raw` (the same
    /// `T`), and each pointer `into_raw` returned must be passed here at
    /// most once (the `Weak` made here drops the unit `into_raw` kept).
    /// Anything else is undefined behaviour, as for std's `Weak`.
    #[must_use = "dropping the Weak drops the allocation unit at once"]
    pub unsafe fn from_raw(ptr: *const T) -> Self {
        if ptr == NonNull::<T>::dangling().as_ptr() {
            // A `Weak::new`'s: no block is ever at that address (it is
            // `T`'s alignment, far below any heap allocation).
            return Weak::new();
        }
        // SAFETY: `ptr` came from `value_ptr` of a block its unit keeps
        // allocated (the caller's promise).
        Weak::holding(unsafe { block_of(ptr) })
    }
}

impl<T> Default for Weak<T> {
    /// [`Weak::new`].
    fn default() -> Self {
        Weak::new()
    }
}

impl<T: ?Sized> Clone for Weak<T> {
    fn clone(&self) -> Self {
        match self.ptr {
            Some(p) => Weak::new_unit(p),
            None => Weak {
                ptr: None,
                _owns: PhantomData,
            },
        }
    }
}

impl<T: ?Sized> Drop for Weak<T> {
    fn drop(&mut self) {
        if let Some(p) = self.ptr {
            // SAFETY: this `Weak` owns one unit and is going away; it is
            // not inside a `PercpuRef` call of the block (a `T` that holds a
            // `Weak` to itself drops it inside `release`, but the count's
            // unit is still held then, so this is not the last).
            unsafe { drop_unit(p) }
        }
    }
}

impl<T: ?Sized> fmt::Debug for Weak<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(Weak)")
    }
}
