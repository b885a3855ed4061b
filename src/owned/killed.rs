//! [`Killed`], the owner side after a kill: waits for the last `Ref`
//! and hands `T` back.

use super::block::{drop_unit, inner, Inner, OnDrop};
#[cfg(doc)]
use super::{Owner, Ref};
use crate::sync;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

// ----- Killed ---------------------------------------------------------------

/// A killed object's claim on its `T`: wait for the last [`Ref`] to go and
/// take `T` back, or drop this to let the last `Ref` drop `T`.
///
/// Dropping a `Killed` before release leaves `T` to the thread that drops
/// the last reference; dropping it after release drops `T` here. The kill
/// completes on the grace-period engine (see [`Owner::kill`]), whose put of
/// the base reference may be the last: a `Killed` of a `T` with drop glue
/// dropped before that waits for it (about a millisecond), so that `T` is
/// dropped here, never on the engine thread.
///
/// # As a future
///
/// `Killed<T>` is a [`Future`] with `Output = T`: it resolves once the last
/// reference is gone, as [`wait`](Self::wait) returns, without blocking a
/// thread. The last reference's drop wakes the task that polled it last.
/// Once it has returned `T`, polling it again panics (as most `std`
/// futures do), and so do [`wait`](Self::wait),
/// [`wait_timeout`](Self::wait_timeout) and [`try_take`](Self::try_take);
/// dropping it then does nothing.
///
/// Awaiting does not hurry the engine as a blocked [`wait`](Self::wait)
/// does: the kill completes with its batch (within about a millisecond,
/// sharing one grace period with the kills around it), which is what a
/// server shutting down many connections at once wants. It works on any
/// executor; tokio's multi-threaded runtime is tested (thousands of tasks
/// holding `Ref`s across `.await`s, `tokio::time::timeout` around a
/// `&mut Killed`, which can be awaited again after it elapses), and the
/// crate's `examples/service.rs` is a tokio server that kills and awaits
/// each connection's state. A tiny executor, one thread parked between
/// polls:
///
/// ```
/// use percpu_ref::owned::Owner;
/// use std::future::Future;
/// use std::pin::pin;
/// use std::sync::Arc;
/// use std::task::{Context, Poll, Wake, Waker};
/// use std::thread::{self, Thread};
///
/// struct Unpark(Thread);
/// impl Wake for Unpark {
///     fn wake(self: Arc<Self>) {
///         self.0.unpark();
///     }
/// }
///
/// fn block_on<F: Future>(fut: F) -> F::Output {
///     let mut fut = pin!(fut);
///     let waker = Waker::from(Arc::new(Unpark(thread::current())));
///     let mut cx = Context::from_waker(&waker);
///     loop {
///         match fut.as_mut().poll(&mut cx) {
///             Poll::Ready(v) => return v,
///             Poll::Pending => thread::park(), // until the wake (or spuriously)
///         }
///     }
/// }
///
/// let owner = Owner::new(vec![1, 2, 3]);
/// let r = owner.get();
/// let user = thread::spawn(move || {
///     thread::sleep(std::time::Duration::from_millis(10));
///     r.len() // the last reference is dropped here
/// });
/// let value = block_on(owner.kill()); // resolves once `r` is gone
/// assert_eq!(value, [1, 2, 3]);
/// assert_eq!(user.join().unwrap(), 3);
/// ```
///
/// `Send` and `Sync` when `T: Send` (it never gives out `&T`):
///
/// ```compile_fail
/// use percpu_ref::owned::Owner;
/// let k = Owner::new(std::rc::Rc::new(1)).kill();
/// std::thread::spawn(move || k.wait());
/// ```
#[must_use = "dropping a Killed gives up `T` (the last Ref drops it); to kill without taking `T` back, drop the Owner"]
pub struct Killed<T> {
    /// The block, or `None` once the future has returned `T` and given up
    /// the owner side's unit with it.
    pub(super) inner: Option<NonNull<Inner<T>>>,
    pub(super) _owns: PhantomData<Inner<T>>,
}

// SAFETY: a `Killed` moves or drops `T` on its thread (`T: Send`) and never
// gives out `&T`; `release` hands over to it under the state lock. The
// waker it stores is `Send + Sync`.
unsafe impl<T: Send> Send for Killed<T> {}
// SAFETY: `&Killed` only reads the released flag.
unsafe impl<T: Send> Sync for Killed<T> {}

impl<T> Killed<T> {
    /// The block, unless the future has already returned `T`.
    pub(super) fn inner(&self) -> Option<&Inner<T>> {
        // SAFETY: until then a `Killed` holds the owner side's unit.
        self.inner.map(|p| unsafe { inner(p) })
    }

    /// The block, for an operation that needs `T` still here.
    pub(super) fn block_for(&self, op: &str) -> NonNull<Inner<T>> {
        match self.inner {
            Some(p) => p,
            None => panic!("owned::Killed::{op}: the Killed future already returned the value"),
        }
    }

    /// Whether the last reference is gone, so that `T` can be taken without
    /// blocking (also true once the future has returned `T`).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let r = o.get();
    /// let k = o.kill();
    /// percpu_ref::flush(); // the kill completed: only `r` holds the object
    /// assert!(!k.is_released());
    /// drop(r);
    /// assert!(k.is_released());
    /// # drop(k);
    /// ```
    #[must_use]
    pub fn is_released(&self) -> bool {
        self.inner().is_none_or(Inner::is_released)
    }

    /// Blocks until the last reference is gone, then returns `T`.
    ///
    /// `Arc::into_inner` returns `T` only when called on the last
    /// reference (and drops it otherwise); a killed object can gain no new
    /// reference, so this waits for the others instead. Await the `Killed`
    /// to wait without blocking a thread; drop it for `into_inner`'s `None`
    /// (the last `Ref` then drops `T`).
    ///
    /// # Panics
    ///
    /// If the future has already returned `T` (see *As a future*).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(String::from("v"));
    /// let r = o.get();
    /// let k = o.kill();
    /// std::thread::spawn(move || drop(r));
    /// assert_eq!(k.wait(), "v");
    /// ```
    #[doc(alias = "into_inner")]
    #[must_use = "the value is dropped at once; write `drop(killed.wait())` if that is the point"]
    pub fn wait(self) -> T {
        let p = self.block_for("wait");
        // SAFETY: a `Killed` holds the owner side's unit.
        unsafe { inner(p) }.wait_killed_released(None, "wait");
        self.take(p)
    }

    /// As [`wait`](Self::wait), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// Gives `self` back when references remain after `timeout`.
    ///
    /// # Panics
    ///
    /// If the future has already returned `T` (see *As a future*).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// use std::time::Duration;
    /// let o = Owner::new(1);
    /// let r = o.get();
    /// let k = o.kill().wait_timeout(Duration::from_millis(1)).unwrap_err();
    /// drop(r);
    /// percpu_ref::flush(); // the engine's put of the base reference
    /// assert_eq!(k.wait_timeout(Duration::ZERO).unwrap(), 1);
    /// ```
    pub fn wait_timeout(self, timeout: Duration) -> Result<T, Self> {
        let p = self.block_for("wait_timeout");
        // SAFETY: a `Killed` holds the owner side's unit.
        if unsafe { inner(p) }
            .wait_killed_released(Instant::now().checked_add(timeout), "wait_timeout")
        {
            Ok(self.take(p))
        } else {
            Err(self)
        }
    }

    /// `T` if the last reference is gone, else `self` back; never blocks.
    ///
    /// The counterpart of `Arc::try_unwrap` (and of `Arc::into_inner` on
    /// the last reference): `T` if no other reference exists. Unlike
    /// `Arc`, the owner must kill first ([`Owner::kill`]), so none can be
    /// made while the caller retries.
    ///
    /// # Errors
    ///
    /// Gives `self` back when references remain.
    ///
    /// # Panics
    ///
    /// If the future has already returned `T` (see *As a future*).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let r = o.get();
    /// let k = o.kill().try_take().unwrap_err();
    /// drop(r);
    /// percpu_ref::flush(); // the engine's put of the base reference
    /// assert_eq!(k.try_take().unwrap(), 1);
    /// ```
    #[doc(alias = "try_unwrap", alias = "into_inner")]
    pub fn try_take(self) -> Result<T, Self> {
        let p = self.block_for("try_take");
        // SAFETY: a `Killed` holds the owner side's unit.
        if unsafe { inner(p) }.is_released() {
            Ok(self.take(p))
        } else {
            Err(self)
        }
    }

    /// Moves `T` out of the released block `p` (this `Killed`'s, which the
    /// caller found released) and gives up the owner's unit with `self`.
    pub(super) fn take(self, p: NonNull<Inner<T>>) -> T {
        // The unit goes with `T`: `self` must not drop it again.
        std::mem::forget(self);
        // SAFETY: released (the caller checked) and still ours.
        unsafe { take_released(p) }
    }
}

/// Moves `T` out of the block at `p` and gives up the owner side's unit.
///
/// # Safety
///
/// The caller holds the owner side's unit of a released block whose `T` it
/// claimed and has not taken, and gives the unit up.
pub(super) unsafe fn take_released<T>(p: NonNull<Inner<T>>) -> T {
    // SAFETY: released and claimed by us: no reference exists, none can be
    // made (dead, count zero, and the owner is gone), and `release` left `T`
    // to us. The unit keeps the block alive.
    let value = unsafe { inner(p).take_value() };
    // SAFETY: the caller's unit, given up here.
    unsafe { drop_unit::<T>(p.as_ptr().cast_const().cast()) };
    value
}

impl<T> Future for Killed<T> {
    type Output = T;

    /// `T` once the last reference is gone; until then registers the
    /// task's waker, which that reference's drop wakes.
    ///
    /// # Panics
    ///
    /// If polled again after returning `T`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(p) = self.inner else {
            panic!("owned::Killed polled after it returned the value");
        };
        // SAFETY: until it returns `T`, the `Killed` holds the owner side's
        // unit.
        let inner = unsafe { inner(p) };
        // mutant owned_future_no_recheck: check, then register in a second
        // critical section without checking again; a release in between
        // finds no waker, and the task sleeps for good.
        if mutated!("owned_future_no_recheck") {
            if !sync::lock(&inner.state).released {
                let old = sync::lock(&inner.state).waker.replace(cx.waker().clone());
                drop(old);
                return Poll::Pending;
            }
        } else {
            let mut s = sync::lock(&inner.state);
            if !s.released {
                // Registered in the critical section that saw `released`
                // false, so `release` (which sets it under this lock and
                // then takes the waker) takes this waker or a later one.
                let old = match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => None,
                    _ => s.waker.replace(cx.waker().clone()),
                };
                drop(s);
                drop(old); // a waker's drop is user code: not under our lock
                return Poll::Pending;
            }
        }
        // `Killed` is `Unpin`: no pinned field is touched.
        self.inner = None;
        // SAFETY: released, and the unit and the claim were ours until the
        // line above gave them to this call.
        Poll::Ready(unsafe { take_released(p) })
    }
}

impl<T> Drop for Killed<T> {
    fn drop(&mut self) {
        // The future returned `T` and gave up the unit already.
        let Some(p) = self.inner else { return };
        let ptr = p.as_ptr().cast_const().cast();
        // SAFETY: a `Killed` holds the owner side's unit and is going away;
        // dropped last, also if `T`'s `Drop` panics.
        let _unit = OnDrop(|| unsafe { drop_unit::<T>(ptr) });
        // SAFETY: the unit keeps the block alive.
        let inner = unsafe { inner(p) };
        // Once the engine is done with the kill, the last put is made by a
        // thread that drops a handle, never by the engine.
        if std::mem::needs_drop::<T>() && !inner.pref.wait_deferred_switch() {
            // On the engine, inside another ref's confirm or release, while
            // this kill waits in the engine's queue: waiting would deadlock,
            // and unclaiming would let the engine drop `T`, which may be
            // neither `Send` nor `'static`. `T` stays claimed: leaked.
            eprintln!(
                "percpu_ref: owned::Killed dropped on the grace-period engine while its own \
                 kill was still queued; the value is leaked"
            );
            return;
        }
        let mut s = sync::lock(&inner.state);
        // Nobody will poll again: do not keep the task alive until release.
        let waker = s.waker.take();
        let released = s.released;
        if !released {
            // `release` has not run: it will drop `T` itself.
            s.claimed = false;
        }
        drop(s);
        drop(waker);
        if released {
            // SAFETY: as in `take_released`.
            unsafe { inner.drop_value() };
        }
    }
}

impl<T> fmt::Debug for Killed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Killed")
            .field("released", &self.is_released())
            .field("taken", &self.inner.is_none())
            .finish()
    }
}
