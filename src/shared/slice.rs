//! `Shared<[T]>` and `Shared<str>`: one allocation holding the counts and
//! the elements, as `Arc<[T]>` and `Arc<str>`, made from slices, strings,
//! vectors, boxes, arrays and iterators.
//!
//! The handle is a wide pointer (address and length, 16 bytes); clones,
//! drops, [`Weak`](super::Weak)s and promotion are the sized value's. The
//! block is `repr(C)`: the counts, then the elements at the next multiple
//! of their alignment, in one allocation of the exact size. Made from a
//! `Vec`, a `Box` or an iterator, the elements are moved into the new
//! block and the old buffer is freed (one copy, as `Arc::from(Vec)`);
//! made from `&[T]`, each element is cloned, and a clone that panics drops
//! the ones made before it and frees the block.

use super::block::{alloc_slice, free_unwritten_slice, value_ptr, Block};
use super::Shared;
use std::ptr::NonNull;

/// A block whose first `written` elements are written, freed with them if
/// the rest never are (a `T::clone` that panicked).
struct Unfinished<U> {
    block: NonNull<Block<[U]>>,
    written: usize,
}

impl<U> Drop for Unfinished<U> {
    fn drop(&mut self) {
        // SAFETY: the block is ours alone (no handle was made yet); its
        // first `written` elements are initialised, the rest are not.
        unsafe {
            let first = value_ptr(self.block).cast::<U>().cast_mut();
            std::ptr::slice_from_raw_parts_mut(first, self.written).drop_in_place();
            free_unwritten_slice(self.block);
        }
    }
}

/// A value of `len` elements, the `i`th made by `element(i)`.
fn from_fn<U: Send + 'static>(len: usize, mut element: impl FnMut(usize) -> U) -> Shared<[U]> {
    let mut unfinished = Unfinished {
        block: alloc_slice::<U>(
            len,
            #[cfg(percpu_ref_loom)]
            crate::backend(),
        ),
        written: 0,
    };
    // SAFETY: the block is allocated for `len` elements; only the elements'
    // place is addressed, with the block's own provenance.
    let first = unsafe { value_ptr(unfinished.block) }
        .cast::<U>()
        .cast_mut();
    while unfinished.written < len {
        let value = element(unfinished.written);
        // SAFETY: element `written` is in bounds and not written yet.
        unsafe { first.add(unfinished.written).write(value) };
        unfinished.written += 1;
    }
    let block = unfinished.block;
    std::mem::forget(unfinished);
    // The block's one reference (`alloc_slice`'s count) is this handle's.
    Shared::from_block(block)
}

/// A value with `v`'s elements, moved (one copy; `v`'s buffer is freed).
fn from_vec<U: Send + 'static>(v: Vec<U>) -> Shared<[U]> {
    from_vec_on(
        v,
        #[cfg(percpu_ref_loom)]
        crate::backend(),
    )
}

/// [`from_vec`] on a backend (a loom model's choice; the process's
/// otherwise).
pub(crate) fn from_vec_on<U: Send + 'static>(
    mut v: Vec<U>,
    #[cfg(percpu_ref_loom)] backend: crate::Backend,
) -> Shared<[U]> {
    let len = v.len();
    let block = alloc_slice::<U>(
        len,
        #[cfg(percpu_ref_loom)]
        backend,
    );
    // SAFETY: the new block has room for `len` elements and is ours alone;
    // `v`'s `len` are initialised and moved bitwise, after which `v` is
    // made empty so that its drop frees the buffer without dropping them.
    unsafe {
        let first = value_ptr(block).cast::<U>().cast_mut();
        std::ptr::copy_nonoverlapping(v.as_ptr(), first, len);
        v.set_len(0);
    }
    Shared::from_block(block)
}

/// A value with a copy of `elements` (one `memcpy`).
fn from_copied<U: Copy + Send + 'static>(elements: &[U]) -> Shared<[U]> {
    let len = elements.len();
    let block = alloc_slice::<U>(
        len,
        #[cfg(percpu_ref_loom)]
        crate::backend(),
    );
    // SAFETY: the new block has room for `len` elements and is ours alone;
    // `U: Copy`, so a bitwise copy is a copy.
    unsafe {
        let first = value_ptr(block).cast::<U>().cast_mut();
        std::ptr::copy_nonoverlapping(elements.as_ptr(), first, len);
    }
    Shared::from_block(block)
}

/// Clones each element into one new allocation, as `Arc::from(&[T])`.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let s: Shared<[String]> = Shared::from(&[String::from("a"), String::from("b")][..]);
/// assert_eq!(s.len(), 2);
/// assert_eq!(s[1], "b");
/// ```
impl<U: Clone + Send + 'static> From<&[U]> for Shared<[U]> {
    fn from(elements: &[U]) -> Self {
        from_fn(elements.len(), |i| elements[i].clone())
    }
}

/// Moves the elements into one new allocation, as `Arc::from(Vec<T>)`.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let s: Shared<[u64]> = Shared::from(vec![1, 2, 3]);
/// let c = Shared::clone(&s);
/// assert_eq!(c.iter().sum::<u64>(), 6);
/// ```
impl<U: Send + 'static> From<Vec<U>> for Shared<[U]> {
    fn from(v: Vec<U>) -> Self {
        from_vec(v)
    }
}

/// Moves the elements into one new allocation, as `Arc::from(Box<[T]>)`.
impl<U: Send + 'static> From<Box<[U]>> for Shared<[U]> {
    fn from(b: Box<[U]>) -> Self {
        from_vec(Vec::from(b))
    }
}

/// Moves the elements into one new allocation, as `Arc::from([T; N])`.
impl<U: Send + 'static, const N: usize> From<[U; N]> for Shared<[U]> {
    fn from(a: [U; N]) -> Self {
        let mut elements = a.into_iter();
        from_fn(N, |_| {
            elements
                .next()
                .expect("an array yields its length of elements")
        })
    }
}

/// Collects into a `Vec`, then moves it into one allocation, as
/// `Arc<[T]>`'s `FromIterator` (which std spares the `Vec` for iterators
/// of a trusted length, an unstable trait).
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let squares: Shared<[u32]> = (1..=4).map(|i| i * i).collect();
/// assert_eq!(&*squares, &[1, 4, 9, 16]);
/// ```
impl<U: Send + 'static> FromIterator<U> for Shared<[U]> {
    fn from_iter<I: IntoIterator<Item = U>>(iter: I) -> Self {
        from_vec(iter.into_iter().collect())
    }
}

/// An empty slice (still one allocation: the counts), as `Arc<[T]>`'s.
impl<U: Send + 'static> Default for Shared<[U]> {
    fn default() -> Self {
        from_vec(Vec::new())
    }
}

/// The string's bytes, viewed as a `str` (they came from one).
fn from_str_bytes(bytes: Shared<[u8]>) -> Shared<str> {
    let block = std::mem::ManuallyDrop::new(bytes).ptr;
    // SAFETY: the bytes are valid UTF-8 (the callers copy a `str`), and a
    // `Block<[u8]>` and a `Block<str>` have one layout and one metadata
    // (the length in bytes). The handle's reference moves to the new one.
    Shared::from_block(unsafe { NonNull::new_unchecked(block.as_ptr() as *mut Block<str>) })
}

/// Copies the string into one new allocation, as `Arc::from(&str)`: an
/// interned name or key that many threads clone.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let name: Shared<str> = Shared::from("eth0");
/// let other = Shared::clone(&name);
/// assert_eq!(&*other, "eth0");
/// assert_eq!(name, other);
/// ```
impl From<&str> for Shared<str> {
    fn from(s: &str) -> Self {
        from_str_bytes(from_copied(s.as_bytes()))
    }
}

/// Copies the string's bytes into one new allocation (the `String`'s
/// buffer is freed), as `Arc::from(String)`.
impl From<String> for Shared<str> {
    fn from(s: String) -> Self {
        from_str_bytes(from_vec(s.into_bytes()))
    }
}

/// Copies the string's bytes into one new allocation, as
/// `Arc::from(Box<str>)`.
impl From<Box<str>> for Shared<str> {
    fn from(s: Box<str>) -> Self {
        Shared::from(String::from(s))
    }
}

/// Copies a borrowed string, or moves an owned one's bytes, into one new
/// allocation, as `Arc::from(Cow<str>)`.
impl From<std::borrow::Cow<'_, str>> for Shared<str> {
    fn from(s: std::borrow::Cow<'_, str>) -> Self {
        match s {
            std::borrow::Cow::Borrowed(s) => Shared::from(s),
            std::borrow::Cow::Owned(s) => Shared::from(s),
        }
    }
}

/// Clones a borrowed slice's elements, or moves an owned one's, into one
/// new allocation, as `Arc::from(Cow<[T]>)`.
impl<U: Clone + Send + 'static> From<std::borrow::Cow<'_, [U]>> for Shared<[U]> {
    fn from(v: std::borrow::Cow<'_, [U]>) -> Self {
        match v {
            std::borrow::Cow::Borrowed(v) => Shared::from(v),
            std::borrow::Cow::Owned(v) => from_vec(v),
        }
    }
}

/// An empty string, as `Arc<str>`'s `Default`.
impl Default for Shared<str> {
    fn default() -> Self {
        Shared::from("")
    }
}

/// The same allocation, its bytes viewed as `[u8]`, as
/// `Arc<[u8]>::from(Arc<str>)`.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let bytes: Shared<[u8]> = Shared::from(Shared::<str>::from("ok"));
/// assert_eq!(&*bytes, b"ok");
/// ```
impl From<Shared<str>> for Shared<[u8]> {
    fn from(s: Shared<str>) -> Self {
        let block = std::mem::ManuallyDrop::new(s).ptr;
        // SAFETY: one layout and one metadata (as in `from_str_bytes`); any
        // bytes are valid `u8`s. The handle's reference moves to the new one.
        Shared::from_block(unsafe { NonNull::new_unchecked(block.as_ptr() as *mut Block<[u8]>) })
    }
}

/// The same allocation as an array, if the slice has `N` elements, as
/// `Arc<[T; N]>::try_from(Arc<[T]>)`; else the handle back.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::Shared;
/// let s: Shared<[u8]> = Shared::from(vec![1, 2, 3]);
/// let s = Shared::<[u8; 4]>::try_from(s).unwrap_err();
/// let a: Shared<[u8; 3]> = s.try_into().unwrap();
/// assert_eq!(*a, [1, 2, 3]);
/// ```
impl<U, const N: usize> TryFrom<Shared<[U]>> for Shared<[U; N]> {
    type Error = Shared<[U]>;

    fn try_from(s: Shared<[U]>) -> Result<Self, Self::Error> {
        if s.len() != N {
            return Err(s);
        }
        let block = std::mem::ManuallyDrop::new(s).ptr;
        // SAFETY: a `Block<[U]>` of `N` elements has a `Block<[U; N]>`'s
        // layout (`repr(C)`: the counts, then the elements at `U`'s
        // alignment, padded alike); the handle's reference moves to the
        // new one.
        Ok(Shared::from_block(unsafe {
            NonNull::new_unchecked(block.as_ptr().cast::<Block<[U; N]>>())
        }))
    }
}
