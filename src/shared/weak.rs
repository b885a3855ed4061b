//! [`Weak`], the handle that keeps the allocation but not `T`.

use super::block::{drop_unit, value_ptr, Block, UNITS_LOCKED};
use super::Shared;
use crate::sync::Ordering;
use std::fmt;
use std::marker::PhantomData;
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
pub struct Weak<T> {
    /// The block, or `None` for [`Weak::new`].
    pub(super) ptr: Option<NonNull<Block<T>>>,
    pub(super) _owns: PhantomData<Block<T>>,
}

// SAFETY: a `Weak` can make a `Shared` on any thread: the rules of `Shared`.
unsafe impl<T: Send + Sync> Send for Weak<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for Weak<T> {}

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
        Weak {
            ptr: Some(p),
            _owns: PhantomData,
        }
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
        this.ptr == other.ptr
    }

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
}

impl<T> Default for Weak<T> {
    /// [`Weak::new`].
    fn default() -> Self {
        Weak::new()
    }
}

impl<T> Clone for Weak<T> {
    fn clone(&self) -> Self {
        match self.ptr {
            Some(p) => Weak::new_unit(p),
            None => Weak::new(),
        }
    }
}

impl<T> Drop for Weak<T> {
    fn drop(&mut self) {
        if let Some(p) = self.ptr {
            // SAFETY: this `Weak` owns one unit and is going away; it is
            // not inside a `PercpuRef` call of the block (a `T` that holds a
            // `Weak` to itself drops it inside `release`, but the count's
            // unit is still held then, so this is not the last).
            unsafe { drop_unit::<T>(p.as_ptr().cast_const().cast()) }
        }
    }
}

impl<T> fmt::Debug for Weak<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(Weak)")
    }
}
