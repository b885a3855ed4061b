//! Values written after allocation: [`Shared::new_uninit`],
//! [`Shared::new_uninit_slice`] and `assume_init`, as `Arc`'s (a large
//! slice filled in place, with no `Vec` to copy from).
//!
//! A value made uninitialised is not promoted while it is one: its ref's
//! erased `release` would be `MaybeUninit<T>`'s, which drops nothing, and
//! would stay so after `assume_init`. So its block starts with promotion
//! held (`PROMOTING` set with nobody handing anything over, the state of a
//! value on a backend that never promotes): clones and upgrades count in
//! the word, and [`Shared::promote`] answers `false`. `assume_init` of the
//! value's only handle, with no `Weak` (`get_mut`'s check), ends the hold,
//! and the value is promoted as any other from then on. A value that was
//! shared before its `assume_init` stays in the word for good, an `Arc`:
//! one of its other handles may still be a `MaybeUninit` one.

use super::block::{alloc_held, alloc_slice_held, block, Block};
use super::Shared;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

impl<T: Send + 'static> Shared<T> {
    /// A new value, not yet written, as `Arc::new_uninit`: write it through
    /// [`Shared::get_mut`], then [`assume_init`](Shared::assume_init).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let mut s = Shared::<u64>::new_uninit();
    /// Shared::get_mut(&mut s).unwrap().write(5);
    /// // SAFETY: written just above.
    /// let s = unsafe { s.assume_init() };
    /// assert_eq!(*s, 5);
    /// ```
    #[must_use]
    pub fn new_uninit() -> Shared<MaybeUninit<T>> {
        Shared::from_block(alloc_held::<T>())
    }
}

impl<U: Send + 'static> Shared<[U]> {
    /// A new slice of `len` elements, not yet written, as
    /// `Arc::new_uninit_slice`: one allocation, filled in place.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// let mut s = Shared::<[u32]>::new_uninit_slice(3);
    /// for (i, e) in Shared::get_mut(&mut s).unwrap().iter_mut().enumerate() {
    ///     e.write(i as u32 * 10);
    /// }
    /// // SAFETY: every element written just above.
    /// let s = unsafe { s.assume_init() };
    /// assert_eq!(*s, [0, 10, 20]);
    /// ```
    #[must_use]
    pub fn new_uninit_slice(len: usize) -> Shared<[MaybeUninit<U>]> {
        Shared::from_block(alloc_slice_held::<U>(len))
    }
}

impl<T> Shared<MaybeUninit<T>> {
    /// The same value as a `T`, as `Arc::assume_init`. If this is its only
    /// handle and no `Weak` exists, the value can be promoted from now on;
    /// otherwise it stays in atomic mode, an `Arc`, for good (module docs).
    ///
    /// # Safety
    ///
    /// The value is initialised, as for `MaybeUninit::assume_init`.
    #[must_use]
    pub unsafe fn assume_init(self) -> Shared<T> {
        let p = ManuallyDrop::new(self).ptr;
        // SAFETY: our reference keeps the block alive.
        unsafe { block(p) }.end_promotion_hold();
        // A `MaybeUninit<T>` has `T`'s size and alignment, so the block
        // has `Block<T>`'s layout; the caller's promise makes the value a
        // `T`. The handle's reference moves to the new one.
        Shared::from_block(p.cast::<Block<T>>())
    }
}

impl<U> Shared<[MaybeUninit<U>]> {
    /// The same slice as `[U]`, as `Arc<[MaybeUninit<T>]>::assume_init`;
    /// the value can be promoted from now on if this is its only handle
    /// and no `Weak` exists (as [`Shared::assume_init`] of one value).
    ///
    /// # Safety
    ///
    /// Every element is initialised.
    #[must_use]
    pub unsafe fn assume_init(self) -> Shared<[U]> {
        let p = ManuallyDrop::new(self).ptr;
        // SAFETY: our reference keeps the block alive.
        unsafe { block(p) }.end_promotion_hold();
        // SAFETY: as for one value, element by element; the cast keeps the
        // length, and a pointer cast never makes null.
        Shared::from_block(unsafe { NonNull::new_unchecked(p.as_ptr() as *mut Block<[U]>) })
    }
}
