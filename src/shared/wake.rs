//! [`Wake`]: a [`Waker`] whose clones count per CPU, as std's
//! `Waker::from(Arc<W>)`.
//!
//! An async runtime clones a task's waker whenever a future registers
//! interest (a channel, a timer, a socket) and drops the clone once woken.
//! With `std::task::Wake` every one of those is an `Arc` clone or drop, on
//! the task's one shared cache line, from every worker thread that polls
//! or wakes it. A waker made from a [`Shared`] is the same `RawWaker` over
//! a `Shared` instead: a task cloned [`PROMOTE_AFTER`](super::PROMOTE_AFTER)
//! times is promoted, and from then its clones and drops are per CPU.
//!
//! The vtable's four functions are [`Shared::increment_strong_count`]
//! (clone), [`Shared::from_raw`] then [`Wake::wake`] (wake),
//! [`Wake::wake_by_ref`] on a borrowed handle (wake by reference), and
//! [`Shared::decrement_strong_count`] (drop). Where the task's value is
//! dropped follows [`Shared`]'s rules: by the last waker's drop on its
//! thread, or by the grace-period engine once promoted.

use super::Shared;
use std::mem::ManuallyDrop;
use std::task::{RawWaker, RawWakerVTable, Waker};

/// A task that can be woken through a [`Shared`] of itself: the
/// counterpart of `std::task::Wake` (whose methods take `self: Arc<Self>`,
/// a receiver only `Arc` may be on stable Rust; here they are associated
/// functions). `Waker::from(shared)` makes a [`Waker`] of it.
///
/// # Examples
///
/// ```
/// use percpu_ref::shared::{Shared, Wake};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::task::Waker;
///
/// struct Task {
///     wakes: AtomicUsize,
/// }
///
/// impl Wake for Task {
///     fn wake(this: Shared<Self>) {
///         Self::wake_by_ref(&this);
///     }
///     fn wake_by_ref(this: &Shared<Self>) {
///         this.wakes.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let task = Shared::new(Task { wakes: AtomicUsize::new(0) });
/// let waker = Waker::from(task.clone());
/// let clones: Vec<Waker> = (0..100).map(|_| waker.clone()).collect(); // per CPU from the 64th
/// for w in clones {
///     w.wake();
/// }
/// waker.wake_by_ref();
/// assert_eq!(task.wakes.load(Ordering::Relaxed), 101);
/// ```
pub trait Wake: Send + Sync + Sized + 'static {
    /// Wakes the task, consuming this handle (a [`Waker::wake`]).
    fn wake(this: Shared<Self>);

    /// Wakes the task through a borrowed handle (a [`Waker::wake_by_ref`]).
    /// The default clones the handle and calls [`wake`](Self::wake), as
    /// std's.
    fn wake_by_ref(this: &Shared<Self>) {
        Self::wake(Shared::clone(this));
    }
}

impl<W: Wake> From<Shared<W>> for Waker {
    /// A waker that owns `task`'s handle; its clones are the task's
    /// clones.
    fn from(task: Shared<W>) -> Waker {
        // SAFETY: `raw_waker`'s vtable keeps `RawWaker`'s contract: each
        // function takes the pointer `into_raw` gave and the reference it
        // holds, and clone and drop add and give back one reference each;
        // `W: Send + Sync` lets any thread wake or drop it.
        unsafe { Waker::from_raw(raw_waker(task)) }
    }
}

impl<W: Wake> From<Shared<W>> for RawWaker {
    /// The raw waker of `task` (for a runtime that builds its own `Waker`):
    /// it owns `task`'s handle.
    fn from(task: Shared<W>) -> RawWaker {
        raw_waker(task)
    }
}

/// The raw waker that owns `task`'s reference, through its raw pointer.
#[inline(always)]
fn raw_waker<W: Wake>(task: Shared<W>) -> RawWaker {
    raw_waker_at::<W>(Shared::into_raw(task).cast())
}

/// The raw waker of a pointer from `Shared::<W>::into_raw`. The one place
/// that names `W`'s vtable (promoted to a static), so that a waker and its
/// clones carry the same vtable address, which `Waker::will_wake` compares.
#[inline(never)]
fn raw_waker_at<W: Wake>(data: *const ()) -> RawWaker {
    RawWaker::new(
        data,
        &RawWakerVTable::new(
            clone_waker::<W>,
            wake::<W>,
            wake_by_ref::<W>,
            drop_waker::<W>,
        ),
    )
}

/// The vtable's clone: one more reference, the same pointer.
///
/// # Safety
///
/// `data` is a waker's pointer from `raw_waker`, its reference held.
unsafe fn clone_waker<W: Wake>(data: *const ()) -> RawWaker {
    // SAFETY: the waker's reference keeps the value; `data` came from
    // `Shared::<W>::into_raw`.
    unsafe { Shared::<W>::increment_strong_count(data.cast()) };
    raw_waker_at::<W>(data)
}

/// The vtable's wake: takes the waker's reference back as a handle and
/// hands it to [`Wake::wake`].
///
/// # Safety
///
/// As `clone_waker`; the waker's reference is given up.
unsafe fn wake<W: Wake>(data: *const ()) {
    // SAFETY: the waker's reference, taken back once (the waker is consumed).
    W::wake(unsafe { Shared::<W>::from_raw(data.cast()) });
}

/// The vtable's wake by reference: a borrowed handle that is never dropped.
///
/// # Safety
///
/// As `clone_waker`.
unsafe fn wake_by_ref<W: Wake>(data: *const ()) {
    // SAFETY: the waker's reference keeps the value; `ManuallyDrop` keeps
    // the handle from giving that reference back.
    let task = ManuallyDrop::new(unsafe { Shared::<W>::from_raw(data.cast()) });
    W::wake_by_ref(&task);
}

/// The vtable's drop: gives back the waker's reference.
///
/// # Safety
///
/// As `clone_waker`; the waker's reference is given up.
unsafe fn drop_waker<W: Wake>(data: *const ()) {
    // SAFETY: the waker's reference, given back once (the waker is dropped).
    unsafe { Shared::<W>::decrement_strong_count(data.cast()) };
}
