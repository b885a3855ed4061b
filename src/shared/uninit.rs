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
//!
//! A `Shared<MaybeUninit<T>>` can also be made with `Shared::new` (or a
//! slice of them with `From`), unheld, and promoted before its
//! `assume_init`. `assume_init` never writes a promoted word (it holds the
//! ref's address); the only handle of such a value moves it into a new
//! block (an exact `try_unwrap`), and otherwise `T` is leaked, never
//! dropped twice.

use super::block::{alloc_held, alloc_slice_held, Block};
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

impl<T: Send + 'static> Shared<MaybeUninit<T>> {
    /// The same value as a `T`, as `Arc::assume_init`. If this is its only
    /// handle and no `Weak` exists, the value can be promoted from now on;
    /// otherwise it stays in atomic mode, an `Arc`, for good (module docs).
    ///
    /// A `Shared<MaybeUninit<T>>` made with [`Shared::new`] rather than
    /// [`Shared::new_uninit`] may have been promoted already, with a
    /// `release` that drops nothing: the only handle of such a value moves
    /// it into a new block (an exact `try_unwrap`, and an allocation); if
    /// other handles exist, `T` is never dropped (leaked, as with std when
    /// the last handle is a `MaybeUninit` one).
    ///
    /// # Safety
    ///
    /// The value is initialised, as for `MaybeUninit::assume_init`.
    #[must_use]
    pub unsafe fn assume_init(self) -> Shared<T> {
        if !self.block().end_promotion_hold() {
            match Shared::try_unwrap(self) {
                // SAFETY: the caller's promise.
                Ok(value) => return Shared::new(unsafe { value.assume_init() }),
                // SAFETY: as below.
                Err(shared) => return unsafe { cast_init(shared) },
            }
        }
        // SAFETY: the caller's promise.
        unsafe { cast_init(self) }
    }
}

/// The handle as a `Shared<T>`.
///
/// # Safety
///
/// The value is initialised.
unsafe fn cast_init<T>(s: Shared<MaybeUninit<T>>) -> Shared<T> {
    let p = ManuallyDrop::new(s).ptr;
    // A `MaybeUninit<T>` has `T`'s size and alignment, so the block has
    // `Block<T>`'s layout; the caller's promise makes the value a `T`. The
    // handle's reference moves to the new one.
    Shared::from_block(p.cast::<Block<T>>())
}

impl<U> Shared<[MaybeUninit<U>]> {
    /// The same slice as `[U]`, as `Arc<[MaybeUninit<T>]>::assume_init`;
    /// the value can be promoted from now on if this is its only handle
    /// and no `Weak` exists (as [`Shared::assume_init`] of one value).
    ///
    /// A slice of `MaybeUninit`s made with `From` (a `Vec`, an iterator)
    /// rather than [`Shared::new_uninit_slice`] and promoted before this
    /// call keeps a `release` that drops nothing: its elements are never
    /// dropped (leaked, not freed twice).
    ///
    /// # Safety
    ///
    /// Every element is initialised.
    #[must_use]
    pub unsafe fn assume_init(self) -> Shared<[U]> {
        // False only for a slice of `MaybeUninit`s made with `From` and
        // promoted: its elements are never dropped (the docs above).
        self.block().end_promotion_hold();
        let p = ManuallyDrop::new(self).ptr;
        // SAFETY: as for one value, element by element; the cast keeps the
        // length, and a pointer cast never makes null.
        Shared::from_block(unsafe { NonNull::new_unchecked(p.as_ptr() as *mut Block<[U]>) })
    }
}
