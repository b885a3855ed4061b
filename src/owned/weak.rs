//! [`Weak`], the handle that keeps the block but not `T`.

use super::block::{drop_unit, inner, settle_guard, value_ptr, Inner};
#[cfg(doc)]
use super::Owner;
use super::Ref;
use crate::sync::Ordering;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

// ----- Weak -----------------------------------------------------------------

/// A lookup handle: keeps the allocation alive but not `T`, and turns into
/// a [`Ref`] with [`tryget`](Self::tryget) or
/// [`tryget_live`](Self::tryget_live). Store these in lookup tables.
///
/// [`Weak::new`] makes one that belongs to no object and never gives a
/// reference.
///
/// `Send` and `Sync` exactly when `T` is both:
///
/// ```compile_fail
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(std::rc::Rc::new(1));
/// let w = o.downgrade();
/// std::thread::spawn(move || drop(w));
/// ```
pub struct Weak<T> {
    /// The block, or `None` for [`Weak::new`]: no block to point to, and no
    /// sentinel block either (a `PercpuRef` cannot be made in a `static`
    /// for every `T`). The non-empty paths pay one test for null.
    pub(super) inner: Option<NonNull<Inner<T>>>,
    pub(super) _owns: PhantomData<Inner<T>>,
}

// SAFETY: a `Weak` can make a `Ref` on any thread: the same rules as `Ref`.
unsafe impl<T: Send + Sync> Send for Weak<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for Weak<T> {}

impl<T> Weak<T> {
    /// A `Weak` that belongs to no object: [`tryget`](Self::tryget) and
    /// [`tryget_live`](Self::tryget_live) always return `None`. Allocates
    /// nothing, as `std::sync::Weak::new`; a placeholder for a table slot
    /// or a back pointer set later.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Weak;
    /// let w: Weak<u32> = Weak::new();
    /// assert!(w.tryget().is_none());
    /// assert!(w.tryget_live().is_none());
    /// assert!(Weak::ptr_eq(&w, &w.clone()));
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        Weak {
            inner: None,
            _owns: PhantomData,
        }
    }

    /// Takes one more allocation unit of the block at `p`, which the caller
    /// keeps alive.
    pub(super) fn new_unit(p: NonNull<Inner<T>>) -> Self {
        // SAFETY: the caller's handle keeps the block alive.
        // Relaxed: a new unit from an existing one, as Arc::clone.
        unsafe { inner(p) }.units.fetch_add(1, Ordering::Relaxed);
        Weak {
            inner: Some(p),
            _owns: PhantomData,
        }
    }

    /// The block, unless this is an empty [`Weak::new`].
    #[inline]
    pub(super) fn inner(&self) -> Option<(NonNull<Inner<T>>, &Inner<T>)> {
        // SAFETY: a non-empty `Weak` holds an allocation unit.
        self.inner.map(|p| (p, unsafe { inner(p) }))
    }

    /// A reference unless the object is dead (killed, or frozen or being
    /// frozen): as `css_tryget_online`. Once [`Owner::kill`] or
    /// [`Owner::freeze`] has returned, this fails on every thread. Always
    /// fails on a [`Weak::new`].
    ///
    /// `Arc`'s `Weak::upgrade` succeeds on any object not yet dropped, as
    /// [`tryget`](Self::tryget) does; this is the one a lookup table wants.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let w = o.downgrade();
    /// let r = w.tryget_live().unwrap();
    /// let killed = o.kill();
    /// assert!(w.tryget_live().is_none());
    /// assert!(w.tryget().is_some()); // dying, not yet released
    /// drop(r);
    /// percpu_ref::flush(); // the kill completed: the base reference is put
    /// assert!(w.tryget().is_none()); // released
    /// assert_eq!(killed.wait(), 1);
    /// ```
    #[inline]
    #[doc(alias = "upgrade")]
    #[must_use = "a Ref that is dropped at once is a get and a put for nothing"]
    pub fn tryget_live(&self) -> Option<Ref<T>> {
        // mutant owned_tryget_live_as_tryget: a killed object still referenced
        // hands out new references.
        if mutated!("owned_tryget_live_as_tryget") {
            return self.tryget();
        }
        let (p, inner) = self.inner()?;
        // A failed tryget may run `release` (see `tryget`).
        let _settle = settle_guard();
        inner.pref.tryget_live().then(|| make_ref(p))
    }

    /// A reference unless the object was released (its last reference is
    /// gone): succeeds on a killed object still in use, as `css_tryget`
    /// and as `Arc`'s `Weak::upgrade`. Always fails on a [`Weak::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let w = o.downgrade();
    /// let r = o.get();
    /// drop(o); // killed (deferred: `i32` has no drop glue), but `r` keeps it
    /// assert_eq!(*w.tryget().unwrap(), 1);
    /// percpu_ref::flush(); // the kill completed: the base reference is put
    /// drop(r); // released
    /// assert!(w.tryget().is_none());
    /// ```
    #[inline]
    #[doc(alias = "upgrade")]
    #[must_use = "a Ref that is dropped at once is a get and a put for nothing"]
    pub fn tryget(&self) -> Option<Ref<T>> {
        let (p, inner) = self.inner()?;
        // A tryget that lands on a released count gives its increment back,
        // and runs `release` when that give-back is the last landing on
        // zero (the object was revived by an unfreeze meanwhile, and its new
        // life ended): the unit that release owes is paid here, as a put's.
        let _settle = settle_guard();
        inner.pref.tryget().then(|| make_ref(p))
    }

    /// Whether two handles point to the same object; two [`Weak::new`]s
    /// are equal (as in `std`).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Weak};
    /// let o = Owner::new(1);
    /// assert!(Weak::ptr_eq(&o.downgrade(), &o.downgrade()));
    /// assert!(!Weak::ptr_eq(&o.downgrade(), &Weak::new()));
    /// ```
    #[must_use]
    pub fn ptr_eq(a: &Weak<T>, b: &Weak<T>) -> bool {
        a.inner == b.inner
    }

    /// The address of the object's `T`, as [`Ref::as_ptr`] (also after
    /// `T` was dropped: the `Weak` keeps the allocation, not the value), or
    /// a dangling, aligned, non-null address for a [`Weak::new`]. As
    /// `Arc`'s `Weak::as_ptr`, reading through it is only valid while a
    /// reference keeps `T` alive.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Ref};
    /// let o = Owner::new(1);
    /// let w = o.downgrade();
    /// assert_eq!(w.as_ptr(), Ref::as_ptr(&o.get()));
    /// ```
    #[must_use]
    pub fn as_ptr(&self) -> *const T {
        match self.inner {
            // SAFETY: our allocation unit keeps the block allocated.
            Some(p) => unsafe { value_ptr(p) },
            None => NonNull::dangling().as_ptr(),
        }
    }
}

/// A `Ref` for the block at `p`, whose reference the caller just took.
#[inline(always)]
pub(super) fn make_ref<T>(p: NonNull<Inner<T>>) -> Ref<T> {
    Ref {
        inner: p,
        _owns: PhantomData,
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
        match self.inner {
            Some(p) => Weak::new_unit(p),
            None => Weak::new(),
        }
    }
}

impl<T> Drop for Weak<T> {
    fn drop(&mut self) {
        if let Some(p) = self.inner {
            // SAFETY: this `Weak` owns one allocation unit and is going away.
            unsafe { drop_unit::<T>(p.as_ptr().cast_const().cast()) }
        }
    }
}

impl<T> fmt::Debug for Weak<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(Weak)")
    }
}
