//! [`Owner`], the handle that holds the base reference, and the freeze
//! guard it gives out ([`Frozen`]).

use super::block::{alloc, drop_unit, inner, settle_guard, Inner};
use super::{Killed, Ref, Weak};
use crate::flags::Error;
use crate::percpu::Backend;
use crate::percpu_ref::PercpuRef;
use crate::sync::{self, Ordering};
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

// ----- Owner ----------------------------------------------------------------

/// Owns a `T` counted by a [`PercpuRef`]: holds the base reference, hands out
/// [`Ref`]s and [`Weak`]s, and alone can kill or freeze.
///
/// Dropping an `Owner` kills it (no new live references), and `T` is then
/// dropped by whichever thread drops the last [`Ref`] (this one if there
/// is none) — the same as `drop(owner.kill())`.
///
/// # Examples
///
/// ```
/// use percpu_ref::owned::Owner;
/// let owner = Owner::new(5);
/// let r = owner.get();
/// assert_eq!(*r + *owner, 10);
/// ```
///
/// `&Owner<T>` is unwind safe when `T: RefUnwindSafe` (as `&Arc<T>`); an
/// `Owner` by value is not, since a panic during a freeze unfreezes with
/// `T` half updated for every [`Weak`] to see (use `AssertUnwindSafe` where
/// that cannot happen):
///
/// ```
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(1);
/// assert_eq!(std::panic::catch_unwind(|| *o + 1).unwrap(), 2);
/// ```
///
/// ```compile_fail,E0277
/// use percpu_ref::owned::Owner;
/// let o = Owner::new(1);
/// let _ = std::panic::catch_unwind(move || *o + 1);
/// ```
pub struct Owner<T> {
    pub(super) inner: NonNull<Inner<T>>,
    /// A `Frozen` guard of this owner was leaked (see the module docs).
    pub(super) frozen: bool,
    pub(super) _owns: PhantomData<Inner<T>>,
}

// SAFETY: an `Owner` gives `&T` to every thread that can reach it (so
// `T: Sync`) and may drop `T` on the thread it is dropped on (`T: Send`),
// as `Arc<T>`.
unsafe impl<T: Send + Sync> Send for Owner<T> {}
// SAFETY: as for `Send`; `&Owner` hands out `Ref`s, which need the same.
unsafe impl<T: Send + Sync> Sync for Owner<T> {}

impl<T> Owner<T> {
    /// Puts `value` behind a new ref in percpu mode.
    ///
    /// # Panics
    ///
    /// If the process's backend ([`crate::backend()`]) could not run, which
    /// it picks at first use so that it can; see
    /// [`with_backend`](Self::with_backend) for the fallible form.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(String::from("x"));
    /// assert_eq!(*o, "x");
    /// ```
    #[must_use = "dropping a new Owner kills it and drops the value at once"]
    pub fn new(value: T) -> Self {
        match Self::with_backend(value, crate::backend()) {
            Ok(o) => o,
            Err(e) => panic!("owned::Owner::new: {e}"),
        }
    }

    /// As [`new`](Self::new) on a chosen per-CPU backend; fails (dropping
    /// `value`) where `backend` cannot run.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] when `backend` cannot run in this
    /// process (for example the rseq backend where rseq is not registered).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{owned::Owner, Backend};
    /// let o = Owner::with_backend('x', Backend::Sharded).unwrap();
    /// assert_eq!(*o, 'x');
    /// ```
    pub fn with_backend(value: T, backend: Backend) -> Result<Self, Error> {
        Ok(Owner {
            inner: alloc(value, backend)?,
            frozen: false,
            _owns: PhantomData,
        })
    }

    pub(super) fn inner(&self) -> &Inner<T> {
        // SAFETY: the owner holds an allocation unit.
        unsafe { inner(self.inner) }
    }

    /// A new counted reference: a percpu get on the base reference (as
    /// `Arc::clone`).
    ///
    /// # Panics
    ///
    /// If a [`Frozen`] guard of this owner was leaked.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let r = o.get();
    /// assert_eq!(*r, 1);
    /// ```
    #[inline]
    #[must_use = "a Ref that is dropped at once is a get and a put for nothing"]
    pub fn get(&self) -> Ref<T> {
        assert!(
            !self.frozen,
            "owned::Owner::get: the owner is frozen for good (a Frozen guard was leaked)"
        );
        self.inner().pref.get();
        Ref {
            inner: self.inner,
            _owns: PhantomData,
        }
    }

    /// A lookup handle: keeps the allocation alive, not `T`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let o = Owner::new(1);
    /// let w = o.downgrade();
    /// assert_eq!(*w.tryget_live().unwrap(), 1);
    /// ```
    #[must_use = "a Weak that is dropped at once does nothing"]
    pub fn downgrade(&self) -> Weak<T> {
        Weak::new_unit(self.inner)
    }

    /// Kills the object: from now on [`Weak::tryget_live`] fails, and the
    /// returned [`Killed`] says when the last [`Ref`] is gone and hands `T`
    /// back.
    ///
    /// Returns at once, without a system call: the object is dying when
    /// this returns, and the switch to atomic mode completes on the
    /// process's grace-period engine (the kernel's `percpu_ref_kill`; see
    /// [`PercpuRef::kill`]), which then drops the owner's base
    /// reference. Until then the object cannot be released, so
    /// [`Killed::is_released`] stays false for up to about a millisecond
    /// even when no [`Ref`] exists (the engine gathers kills that long to
    /// share one grace period among them). [`Killed::wait`] and
    /// [`Killed::wait_timeout`] wait for it and hurry the engine, so they
    /// return about one grace period after the last `Ref` is gone; `.await`
    /// and [`Killed::try_take`] do not hurry it, so that many tasks awaiting
    /// their kills still share grace periods. [`crate::flush`] waits for
    /// (and hurries) every kill queued before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let owner = Owner::new(String::from("x"));
    /// let r = owner.get();
    /// let killed = owner.kill();
    /// percpu_ref::flush(); // the kill is complete: only `r` holds the object
    /// assert!(!killed.is_released());
    /// let killed = killed.try_take().unwrap_err(); // still referenced
    /// drop(r);
    /// assert_eq!(killed.try_take().unwrap(), "x");
    /// ```
    ///
    /// If the kernel refuses the grace period the kill needs (a seccomp
    /// filter that blocks `membarrier`, on the rseq backend), the engine
    /// reports it on stderr and retries every 10 ms: the object stays
    /// dying, and a [`Killed::wait`] waits until a grace period passes.
    ///
    /// To get `T` back as `Arc::try_unwrap` or `Arc::into_inner` would, use
    /// the [`Killed`]: [`try_take`](Killed::try_take),
    /// [`wait`](Killed::wait), or `.await` it.
    pub fn kill(self) -> Killed<T> {
        let this = ManuallyDrop::new(self);
        // Frozen for good: already dead, released and claimed.
        if !this.frozen {
            sync::lock(&this.inner().state).claimed = true;
            this.start_kill("owned::Owner::kill");
        }
        // The owner's unit becomes the `Killed`'s.
        Killed {
            inner: Some(this.inner),
            _owns: PhantomData,
        }
    }

    /// Drops the owner without waiting for a grace period, whatever `T`
    /// is: as dropping an `Owner` of a `T` without drop glue does (see
    /// [`Drop`](#impl-Drop-for-Owner<T>)).
    ///
    /// The object is dying when this returns ([`Weak::tryget_live`] fails);
    /// the switch to atomic mode completes on the process's grace-period
    /// engine, and `T` is dropped by whichever thread puts the last
    /// reference: the last [`Ref`]'s, or the engine's own `percpu-ref-gp`
    /// thread when no `Ref` is left by then. Hence `T: Send + 'static`: `T`
    /// may be dropped on another thread, after the caller's scope ended.
    /// [`crate::flush`] waits for every kill queued before it, so after it
    /// `T` is dropped unless a `Ref` still holds it.
    ///
    /// A plain `drop(owner)` of a `T` with drop glue kills synchronously
    /// instead (one grace period, a `membarrier` on the rseq backend:
    /// microseconds with other CPUs busy), because `Owner::new` does not require
    /// `T: Send + 'static`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let owner = Owner::new(vec![1, 2, 3]); // Vec has drop glue
    /// let weak = owner.downgrade();
    /// let r = owner.get();
    /// owner.drop_deferred(); // returns at once
    /// assert!(weak.tryget_live().is_none());
    /// assert_eq!(*r, [1, 2, 3]); // the object lives while referenced
    /// drop(r);
    /// percpu_ref::flush(); // the kill completed: the vector is dropped
    /// assert!(weak.tryget().is_none());
    /// ```
    ///
    /// A `T` that must not leave its thread does not compile:
    ///
    /// ```compile_fail
    /// use percpu_ref::owned::Owner;
    /// Owner::new(std::rc::Rc::new(1)).drop_deferred(); // Rc is not Send
    /// ```
    pub fn drop_deferred(self)
    where
        T: Send + 'static,
    {
        if self.frozen {
            // Frozen for good (a leaked `Frozen`): already dead; `Drop`
            // gives up the unit through the claim, with no grace period.
            return drop(self);
        }
        let mut this = ManuallyDrop::new(self);
        this.let_go_deferred("owned::Owner::drop_deferred");
    }

    /// The deferred `Drop` of an owner that is not frozen: kills through
    /// the engine and gives up the owner's unit; `self` must not be used
    /// afterwards.
    pub(super) fn let_go_deferred(&mut self, op: &'static str) {
        self.start_kill(op);
        // SAFETY: the owner's unit, given up: nothing of `self` is used
        // after this.
        unsafe { drop_unit::<T>(self.inner.as_ptr().cast_const().cast()) };
    }

    /// Kills through the grace-period engine (see [`kill`](Self::kill)).
    pub(super) fn start_kill(&self, op: &'static str) {
        // The ref is percpu, so the engine completes the kill; were it
        // atomic, the kill (and a release) would happen in the call, paid
        // for on the way out as after a put.
        let _settle = settle_guard();
        // SAFETY: the block never moves and is freed only when its last
        // unit goes (our unit is held across the call); its `PercpuRef`'s
        // `Drop` then waits for the engine (`block.rs`, *The grace-period
        // engine*).
        let killed = unsafe {
            PercpuRef::kill_raw(std::ptr::addr_of!((*self.inner.as_ptr()).pref), None, op)
        };
        if let Err(e) = killed {
            unreachable!("{op}: a live owner's ref was dead: {e}");
        }
    }

    /// Kills synchronously and turns the owner's unit into the `Killed`'s;
    /// the caller must not use `self` afterwards unless this fails (then
    /// nothing changed).
    pub(super) fn kill_in_place(&mut self) -> Result<Killed<T>, Error> {
        if !self.frozen {
            self.kill_claimed("owned::Owner::drop")?;
        }
        // Frozen for good: already dead, released and claimed.
        Ok(Killed {
            inner: Some(self.inner),
            _owns: PhantomData,
        })
    }

    /// Claims `T` and kills the ref; on a refused grace period the claim is
    /// undone and the ref is as it was.
    pub(super) fn kill_claimed(&self, op: &str) -> Result<(), Error> {
        let inner = self.inner();
        sync::lock(&inner.state).claimed = true;
        let _settle = settle_guard();
        match inner.pref.kill_sync() {
            Ok(()) => Ok(()),
            Err(e @ Error::GracePeriodFailed { .. }) => {
                sync::lock(&inner.state).claimed = false;
                Err(e)
            }
            Err(e) => unreachable!("{op}: a live owner's ref was dead: {e}"),
        }
    }

    /// Freezes the object: kills it, waits until every [`Ref`] is gone, and
    /// returns a guard that gives `&mut T`. Dropping the guard unfreezes:
    /// the object is live and in percpu mode again.
    ///
    /// The kill is synchronous (its own grace period, shared with those of
    /// concurrent synchronous kills), not deferred: a freeze blocks anyway,
    /// and waiting for the engine's batching (up to a millisecond) would
    /// only add to it.
    ///
    /// While frozen, [`Weak::tryget`] and [`Weak::tryget_live`] fail. While
    /// draining, `tryget_live` fails but `tryget` can still succeed (and
    /// then delays the freeze).
    ///
    /// Blocks forever if a reference is never dropped (for example one held
    /// by this thread); see [`freeze_timeout`](Self::freeze_timeout).
    ///
    /// This is the blocking relative of `Arc::get_mut`, whose exact
    /// counterpart is [`freeze_timeout`](Self::freeze_timeout) with a zero
    /// timeout; unlike `Arc::get_mut`, [`Weak`]s do not prevent it (they
    /// cannot make a reference while the guard lives).
    ///
    /// # Panics
    ///
    /// If a [`Frozen`] guard of this owner was leaked.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// let mut o = Owner::new(vec![1]);
    /// o.freeze().push(2);
    /// assert_eq!(*o.get(), [1, 2]);
    /// ```
    #[doc(alias = "get_mut")]
    pub fn freeze(&mut self) -> Frozen<'_, T> {
        match self.freeze_until(None) {
            Ok(f) => f,
            Err(FreezeTimeout(())) => {
                unreachable!("owned::Owner::freeze timed out with no deadline")
            }
        }
    }

    /// As [`freeze`](Self::freeze), giving up after `timeout`: then the
    /// freeze is undone (the object is live and percpu again, nothing was
    /// lost) and [`FreezeTimeout`] returned. A zero timeout freezes only if
    /// no reference exists now, without blocking.
    ///
    /// `freeze_timeout(Duration::ZERO)` is this layer's `Arc::get_mut`:
    /// `&mut T` exactly when no other reference exists, without waiting.
    /// Unlike `Arc::get_mut`, [`Weak`]s do not make it fail, and the
    /// access is a guard to drop rather than a plain `&mut T`.
    ///
    /// # Panics
    ///
    /// If a [`Frozen`] guard of this owner was leaked.
    ///
    /// # Errors
    ///
    /// [`FreezeTimeout`] if references remained after `timeout`.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::owned::Owner;
    /// use std::time::Duration;
    /// let mut o = Owner::new(0);
    /// let r = o.get();
    /// assert!(o.freeze_timeout(Duration::ZERO).is_err());
    /// drop(r);
    /// *o.freeze_timeout(Duration::ZERO).unwrap() += 1;
    /// assert_eq!(*o, 1);
    /// ```
    #[doc(alias = "get_mut")]
    pub fn freeze_timeout(&mut self, timeout: Duration) -> Result<Frozen<'_, T>, FreezeTimeout> {
        // A deadline too far to represent is no deadline.
        self.freeze_until(Instant::now().checked_add(timeout))
    }

    pub(super) fn freeze_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Frozen<'_, T>, FreezeTimeout> {
        assert!(
            !self.frozen,
            "owned::Owner::freeze: the owner is frozen for good (a Frozen guard was leaked)"
        );
        if let Err(e) = self.kill_claimed("owned::Owner::freeze") {
            panic!("owned::Owner::freeze: {e}");
        }
        let inner = self.inner();
        // mutant owned_freeze_no_drain: hand out `&mut T` without draining.
        let drained = mutated!("owned_freeze_no_drain") || inner.wait_released(deadline);
        if !drained {
            if self.undo_freeze() {
                return Err(FreezeTimeout(()));
            }
            // The count reached zero while we gave up: the releasing put is
            // in flight and its `release` follows at once.
            self.inner().wait_released(None);
        }
        self.frozen = true;
        Ok(Frozen { owner: self })
    }

    /// Revives a freeze that did not drain; false when it cannot because
    /// the count already reached zero (the freeze then completes).
    pub(super) fn undo_freeze(&self) -> bool {
        let inner = self.inner();
        // Hold a reference of our own so the count cannot reach zero (and
        // `release` cannot run) while we revive.
        let _settle = settle_guard();
        if !inner.pref.tryget() {
            return false;
        }
        if let Err(e) = inner.pref.resurrect() {
            unreachable!("owned::Owner::freeze_timeout: the killed ref was not dead: {e}");
        }
        sync::lock(&inner.state).claimed = false;
        // The base reference is back, so this put is never the last.
        inner.pref.put();
        true
    }

    /// Ends a freeze: a new life in percpu mode.
    pub(super) fn unfreeze(&mut self) {
        let inner = self.inner();
        // The count's unit for the new life (the last release dropped it);
        // the owner's unit keeps the block alive, so Relaxed as Arc::clone.
        inner.units.fetch_add(1, Ordering::Relaxed);
        {
            let mut s = sync::lock(&inner.state);
            s.released = false;
            s.claimed = false;
            // Only a `Killed` registers a waker, and none exists while the
            // owner does.
            debug_assert!(s.waker.is_none());
        }
        if let Err(e) = inner.pref.resurrect() {
            unreachable!("owned::Frozen: the frozen ref was not dead: {e}");
        }
        self.frozen = false;
    }
}

impl<T> Deref for Owner<T> {
    type Target = T;

    /// The owner's base reference keeps `T` alive.
    fn deref(&self) -> &T {
        // SAFETY: the base reference keeps `T` alive (invariant 1); a leaked
        // `Frozen` left `T` alive too, and no `&mut T` outlives its guard.
        unsafe { &*self.inner().value.get() }
    }
}

impl<T> Drop for Owner<T> {
    /// Kills, without taking `T` back.
    ///
    /// When `T` has no drop glue (`!mem::needs_drop::<T>()`), the kill is
    /// deferred and the drop returns at once (see [`Owner::kill`]): the
    /// thread that puts the last reference releases the object, maybe the
    /// grace-period engine, where dropping `T` does nothing.
    ///
    /// Otherwise the kill is synchronous (a grace period, as
    /// [`PercpuRef::kill_sync`]), and `T` is dropped by the thread that drops
    /// the last [`Ref`], this one if there is none: `T` need not be `Send`
    /// or `'static`, so the engine thread must never drop it. If the kernel
    /// refuses that grace period the object is leaked instead (never
    /// dropped, references stay valid): a drop does not panic. For a `T:
    /// Send + 'static` with drop glue, [`Owner::drop_deferred`] returns at
    /// once instead.
    fn drop(&mut self) {
        // mutant owned_drop_deferred_always: drop-glue `T` is dropped by the
        // engine thread too (after `Owner` drop returned).
        let defer = !std::mem::needs_drop::<T>() || mutated!("owned_drop_deferred_always");
        if defer && !self.frozen {
            self.let_go_deferred("owned::Owner::drop");
            return;
        }
        if let Ok(killed) = self.kill_in_place() {
            drop(killed);
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Owner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("value", &**self)
            .field("ref", &self.inner().pref)
            .finish()
    }
}

impl<T: fmt::Display> fmt::Display for Owner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T: Default> Default for Owner<T> {
    /// `Owner::new(T::default())`.
    ///
    /// # Panics
    ///
    /// As [`Owner::new`].
    fn default() -> Self {
        Owner::new(T::default())
    }
}

impl<T> From<T> for Owner<T> {
    /// `Owner::new(value)`.
    ///
    /// # Panics
    ///
    /// As [`Owner::new`].
    fn from(value: T) -> Self {
        Owner::new(value)
    }
}

// ----- Frozen ---------------------------------------------------------------

/// Exclusive access to a frozen object's `T`; dropping it unfreezes.
///
/// While it lives no [`Ref`] exists and none can be made. Made by
/// [`Owner::freeze`] and [`Owner::freeze_timeout`].
#[must_use = "dropping the Frozen guard unfreezes at once"]
pub struct Frozen<'a, T> {
    pub(super) owner: &'a mut Owner<T>,
}

impl<T> Deref for Frozen<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.owner
    }
}

impl<T> DerefMut for Frozen<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: frozen: the count is zero and stays zero until this guard
        // unfreezes, so no `Ref` (hence no `&T` through one) exists; the
        // owner is borrowed by us, so no `&T` through it exists either.
        unsafe { &mut *self.owner.inner().value.get() }
    }
}

impl<T> Drop for Frozen<'_, T> {
    fn drop(&mut self) {
        self.owner.unfreeze();
    }
}

impl<T: fmt::Debug> fmt::Debug for Frozen<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Frozen").field(&**self).finish()
    }
}

/// [`Owner::freeze_timeout`] gave up: references remained, and the freeze was
/// undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreezeTimeout(());

impl fmt::Display for FreezeTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "owned::Owner::freeze_timeout: references were still held at the deadline; \
             the freeze was undone",
        )
    }
}

impl std::error::Error for FreezeTimeout {}
