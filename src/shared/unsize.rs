//! Trait objects: [`shared_unsize!`](crate::shared_unsize) turns a
//! `Shared<T>` into a `Shared<dyn Trait>` (or a `Shared<[T; N]>` into a
//! `Shared<[T]>`), the coercion `Arc` gets from the nightly
//! `CoerceUnsized`; [`Shared::downcast`] goes back.
//!
//! The handle is the same block behind a wide pointer: `from_raw` finds
//! the block from the value's address and its alignment, read through the
//! vtable, which is the concrete `T`'s, so the offset is the one `T`'s
//! block has; `Box` frees the block with `Layout::for_value`, which the
//! vtable's size and alignment make `T`'s block's layout; and the value
//! is dropped through the vtable, by whoever drops the last handle, or by
//! the engine (whose erased `release` is `T`'s, if the value was promoted
//! before the coercion, or the trait object's, which drops the same `T`).

use super::Shared;
use std::any::Any;

/// Turns a [`Shared<T>`](crate::shared::Shared) into a `Shared<U>` where
/// `T` unsizes to `U`: a trait object (`dyn Trait`, which `T`
/// implements) or a slice (`[T]` from `[T; N]`). The same value, the same
/// count, no allocation: the coercion that `Arc<T>` gets implicitly from
/// the nightly `CoerceUnsized`, spelled out.
///
/// Only an unsizing coercion compiles (the handle's pointer is coerced,
/// not cast), so the macro is safe to use. `T: Send + 'static` as ever
/// (the engine may drop the value through the trait object); the new
/// handle is `Send` and `Sync` when `U` is both, so write
/// `dyn Trait + Send + Sync` to share it across threads.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// use std::fmt::Display;
///
/// let handlers: Vec<Shared<dyn Display + Send + Sync>> = vec![
///     percpu_ref::shared_unsize!(Shared::new(42), dyn Display + Send + Sync),
///     percpu_ref::shared_unsize!(Shared::new("text"), dyn Display + Send + Sync),
/// ];
/// let copy = Shared::clone(&handlers[0]);
/// std::thread::spawn(move || assert_eq!(copy.to_string(), "42")).join().unwrap();
/// assert_eq!(handlers[1].to_string(), "text");
///
/// let array = Shared::new([1u8, 2, 3]);
/// let slice = percpu_ref::shared_unsize!(array, [u8]);
/// assert_eq!(slice.len(), 3);
/// ```
///
/// A cast that is not an unsizing coercion does not compile:
///
/// ```compile_fail
/// use percpu_ref::shared::Shared;
/// let wrong = percpu_ref::shared_unsize!(Shared::new(1u32), u64);
/// ```
#[macro_export]
macro_rules! shared_unsize {
    ($shared:expr, $target:ty $(,)?) => {{
        // Its own statement, so that `T` comes from the handle, not from
        // the target.
        let raw = $crate::shared::Shared::into_raw($shared);
        // A coercion, not a cast: only unsizing turns `*const T` into
        // another pointee type.
        let coerced: *const $target = raw;
        // SAFETY: `into_raw`'s pointer, unsized (the same address; the
        // value's own alignment and size), given back once.
        unsafe { $crate::shared::Shared::<$target>::from_raw(coerced) }
    }};
}

impl Shared<dyn Any + Send + Sync> {
    /// The value as a `Shared<T>` if it is a `T`, as `Arc::downcast`;
    /// else the handle back.
    ///
    /// # Errors
    ///
    /// The handle itself, unchanged, when the value is not a `T`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::shared::Shared;
    /// use std::any::Any;
    ///
    /// let any = percpu_ref::shared_unsize!(Shared::new(7u32), dyn Any + Send + Sync);
    /// let any = any.downcast::<String>().unwrap_err();
    /// let n: Shared<u32> = any.downcast().unwrap();
    /// assert_eq!(*n, 7);
    /// ```
    pub fn downcast<T: Any + Send + Sync>(self) -> Result<Shared<T>, Self> {
        if (*self).is::<T>() {
            let ptr = Shared::into_raw(self).cast::<T>();
            // SAFETY: the value is a `T` (its `TypeId`): the pointer is
            // `into_raw`'s of the `Shared<T>` this one was coerced from, so
            // its block is a `Block<T>`.
            Ok(unsafe { Shared::from_raw(ptr) })
        } else {
            Err(self)
        }
    }
}
