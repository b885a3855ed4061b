//! [`Ref`], the counted handle, and the traits that [`Owner`] and `Ref`
//! delegate to `T`.

use super::block::{inner, put_ref, value_ptr, Inner};
#[cfg(doc)]
use super::Killed;
use super::{Owner, Weak};
use std::borrow::Borrow;
use std::cmp::Ordering as CmpOrdering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

// ----- Ref ------------------------------------------------------------------

/// A counted reference to a live or dying `T`.
///
/// `Clone` is a percpu get, `Drop` a put; while any `Ref` exists, `T` is
/// alive and cannot be frozen. Made by [`Owner::get`], [`Weak::tryget`] and
/// [`Weak::tryget_live`].
///
/// `Ref<T>` is `Send` and `Sync` exactly when `T` is both, as `Arc<T>`:
///
/// ```compile_fail
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(std::rc::Rc::new(1)); // Rc is neither Send nor Sync
/// let r = o.get();
/// std::thread::spawn(move || drop(r));
/// ```
///
/// ```compile_fail
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(std::cell::Cell::new(1)); // Send but not Sync
/// let r = o.get();
/// std::thread::spawn(move || r.set(2));
/// ```
///
/// Unwind safe when `T: RefUnwindSafe`, as `Arc<T>`:
///
/// ```
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(1);
/// let r = o.get();
/// assert_eq!(std::panic::catch_unwind(move || *r).unwrap(), 1);
/// ```
///
/// ```compile_fail,E0277
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(std::cell::Cell::new(1)); // not RefUnwindSafe
/// let r = o.get();
/// let _ = std::panic::catch_unwind(move || r.get());
/// ```
///
/// # Examples
///
/// ```
/// use percpu_ref::owned::{Owner, Ref};
/// let o = Owner::new(3);
/// let a = o.get();
/// let b = a.clone();
/// assert!(Ref::ptr_eq(&a, &b));
/// std::thread::spawn(move || assert_eq!(*b, 3)).join().unwrap();
/// ```
pub struct Ref<T> {
    pub(super) inner: NonNull<Inner<T>>,
    pub(super) _owns: PhantomData<Inner<T>>,
}

// SAFETY: a `Ref` gives `&T` on any thread (`T: Sync`) and the last one may
// drop `T` on its thread (`T: Send`), as `Arc<T>`.
unsafe impl<T: Send + Sync> Send for Ref<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for Ref<T> {}

impl<T> Ref<T> {
    pub(super) fn inner(&self) -> &Inner<T> {
        // SAFETY: our percpu reference keeps the block alive.
        unsafe { inner(self.inner) }
    }

    /// A lookup handle for the same object.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Ref};
    /// let o = Owner::new(1);
    /// let r = o.get();
    /// let w = Ref::downgrade(&r);
    /// assert!(Ref::ptr_eq(&w.tryget().unwrap(), &r));
    /// ```
    #[must_use = "a Weak that is dropped at once does nothing"]
    pub fn downgrade(this: &Ref<T>) -> Weak<T> {
        Weak::new_unit(this.inner)
    }

    /// Whether two references point to the same object (see the type's
    /// example).
    #[must_use]
    pub fn ptr_eq(a: &Ref<T>, b: &Ref<T>) -> bool {
        a.inner == b.inner
    }

    /// The address of `T`, valid for reads as long as a reference to the
    /// object exists; as `Arc::as_ptr`. The same address for every handle
    /// of the object ([`Weak::as_ptr`] too).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Ref};
    /// let o = Owner::new(7);
    /// let r = o.get();
    /// let p = Ref::as_ptr(&r);
    /// assert_eq!(p, &*o as *const i32);
    /// // SAFETY: `r` keeps the value alive.
    /// assert_eq!(unsafe { *p }, 7);
    /// ```
    #[must_use]
    pub fn as_ptr(this: &Ref<T>) -> *const T {
        // SAFETY: our reference keeps the block alive.
        unsafe { value_ptr(this.inner) }
    }

    /// Turns the reference into a raw pointer to `T` without putting it, as
    /// `Arc::into_raw`: the object keeps the reference (it stays alive, a
    /// kill's [`Killed`] waits for it, a freeze blocks) until
    /// [`from_raw`](Self::from_raw) makes a `Ref` of it again.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Ref};
    /// let o = Owner::new(String::from("raw"));
    /// let p = Ref::into_raw(o.get());
    /// let killed = o.kill();
    /// assert!(!killed.is_released()); // the raw reference still counts
    /// // SAFETY: `p` came from `Ref::into_raw` and is turned back once.
    /// let r = unsafe { Ref::from_raw(p) };
    /// assert_eq!(*r, "raw");
    /// drop(r);
    /// assert_eq!(killed.wait(), "raw");
    /// ```
    #[must_use = "dropping the pointer leaks the reference: the object can never be released"]
    pub fn into_raw(this: Ref<T>) -> *const T {
        let this = ManuallyDrop::new(this);
        Ref::as_ptr(&this)
    }

    /// Takes back a reference given up by [`into_raw`](Self::into_raw), as
    /// `Arc::from_raw`.
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned by `Ref::<T>::into_raw` (the same `T`),
    /// and each pointer that `into_raw` returned must be passed to
    /// `from_raw` at most once: the `Ref` made here puts the reference that
    /// `into_raw` kept, so a second `from_raw` of it would put one
    /// reference too many.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::{Owner, Ref};
    /// let o = Owner::new([1u8, 2]);
    /// let p = Ref::into_raw(o.get());
    /// // SAFETY: from `into_raw`, and only once.
    /// let r = unsafe { Ref::from_raw(p) };
    /// assert_eq!(*r, [1, 2]);
    /// ```
    #[must_use = "dropping the Ref puts the reference at once"]
    pub unsafe fn from_raw(ptr: *const T) -> Ref<T> {
        // `into_raw` gave out the address of the `value` field with the
        // block's provenance (see `value_ptr`): step back to the block.
        let offset = std::mem::offset_of!(Inner<T>, value);
        // SAFETY: `ptr` points `offset` bytes into a block that its
        // reference keeps allocated (the caller's promise), so stepping back
        // stays inside that allocation and lands on its start, never null.
        let inner = unsafe { NonNull::new_unchecked(ptr.byte_sub(offset).cast_mut().cast()) };
        Ref {
            inner,
            _owns: PhantomData,
        }
    }
}

impl<T> Clone for Ref<T> {
    /// A percpu get, nothing else.
    #[inline]
    fn clone(&self) -> Self {
        self.inner().pref.get();
        Ref {
            inner: self.inner,
            _owns: PhantomData,
        }
    }
}

impl<T> Drop for Ref<T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this `Ref` holds one percpu reference and is going away.
        unsafe { put_ref(self.inner) }
    }
}

impl<T> Deref for Ref<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: our reference keeps `T` alive (invariant 1) and excludes
        // a freeze, the only source of `&mut T`.
        unsafe { &*self.inner().value.get() }
    }
}

impl<T: fmt::Debug> fmt::Debug for Ref<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: fmt::Display> fmt::Display for Ref<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T> fmt::Pointer for Ref<T> {
    /// The address of `T`, as [`Ref::as_ptr`] (as `Arc`'s `{:p}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&Ref::as_ptr(self), f)
    }
}

/// Comparison, ordering, hashing and borrowing delegate to `T`, as for
/// `Arc<T>`: a handle compares, orders and hashes as its value (never by
/// address; [`Ref::ptr_eq`] does that), so `Borrow<T>` is consistent and a
/// map keyed by handles can be searched with `&T`.
macro_rules! delegate_to_value {
    ($handle:ident) => {
        impl<T: PartialEq> PartialEq for $handle<T> {
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                **self == **other
            }
        }

        impl<T: Eq> Eq for $handle<T> {}

        impl<T: PartialOrd> PartialOrd for $handle<T> {
            #[inline]
            fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
                (**self).partial_cmp(&**other)
            }
            // Forwarded too, so that `T`'s own `<` (a float's NaN rules, a
            // faster comparison) is the one used.
            #[inline]
            fn lt(&self, other: &Self) -> bool {
                **self < **other
            }
            #[inline]
            fn le(&self, other: &Self) -> bool {
                **self <= **other
            }
            #[inline]
            fn gt(&self, other: &Self) -> bool {
                **self > **other
            }
            #[inline]
            fn ge(&self, other: &Self) -> bool {
                **self >= **other
            }
        }

        impl<T: Ord> Ord for $handle<T> {
            #[inline]
            fn cmp(&self, other: &Self) -> CmpOrdering {
                (**self).cmp(&**other)
            }
        }

        impl<T: Hash> Hash for $handle<T> {
            #[inline]
            fn hash<H: Hasher>(&self, state: &mut H) {
                (**self).hash(state);
            }
        }

        impl<T> Borrow<T> for $handle<T> {
            #[inline]
            fn borrow(&self) -> &T {
                self
            }
        }

        impl<T> AsRef<T> for $handle<T> {
            #[inline]
            fn as_ref(&self) -> &T {
                self
            }
        }
    };
}

delegate_to_value!(Owner);
delegate_to_value!(Ref);
