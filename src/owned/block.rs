//! The shared heap block behind every handle: its two counts, `release`,
//! the owed allocation unit, and the block's allocation and free.
//!
//! # Algorithm
//!
//! One heap block holds the [`PercpuRef`], an allocation count, the
//! release state (a mutex and a condition variable) and `T`. Two counts
//! keep two different things alive:
//!
//! - the **percpu count** keeps `T` alive: every [`Ref`] is one reference,
//!   the [`Owner`] holds the base reference. When it reaches zero the
//!   ref's `release` callback runs: it drops `T`, or, when an owner-side
//!   handle has *claimed* `T` ([`Killed`], or a freeze in progress), marks
//!   the block released and wakes the waiter, who then takes `T`.
//! - the **allocation count** keeps the block alive. It holds one unit per
//!   [`Weak`], one for the owner side ([`Owner`] or [`Killed`]), and one
//!   on behalf of the whole percpu count while it is above zero. A
//!   [`Ref`] therefore needs no unit of its own, which is what makes
//!   cloning a `Ref` a bare percpu get.
//!
//! The percpu count's unit is dropped after `release`, but not *inside* it:
//! `release` runs inside a [`PercpuRef`] method whose `&self` points into the
//! block, so freeing the block there would pull memory from under a live
//! borrow. `release` instead records the unit as owed by this thread, and
//! the wrapper that made the call (a `Ref`'s drop, a kill) pays it as soon
//! as the `PercpuRef` call has returned.
//!
//! A freeze revives the ref with `PercpuRef::resurrect`; it first gives
//! the percpu count its allocation unit back (the release of the previous
//! life dropped it).
//!
//! # The grace-period engine
//!
//! [`Owner::kill`] (and the drop of an `Owner` whose `T` has no drop glue)
//! kills with the kernel's asynchronous `percpu_ref_kill`
//! ([`PercpuRef::kill`]): the ref is dead when it returns, and the
//! process's grace-period engine (a background thread) later completes the
//! switch and puts the base reference, so the engine may make the last
//! put. The block is heap-allocated and never moves, which is what the
//! deferred kill needs of a ref (`Pin`'s guarantee); three rules keep it
//! alive for as long as the engine uses its ref:
//!
//! - While the kill is queued the engine holds a temporary reference, so
//!   the count cannot reach zero, the percpu count keeps its allocation
//!   unit, and the block cannot be freed.
//! - When the engine's own put releases, `release` runs inside the
//!   engine's call, with the ref (and the running release closure, stored
//!   in it) borrowed: the unit it owes is paid by the engine once it no
//!   longer touches the ref (`PercpuRef::after_engine_completion`), never inside.
//! - When another thread's put releases while the engine is still between
//!   its put and its last store to the ref, that thread may free the block:
//!   the `PercpuRef`'s `Drop` then waits for the engine, which runs no user
//!   code there, so it cannot wait for that thread. The freeing thread is
//!   never the engine itself: the engine completes one ref at a time, so
//!   code it runs for another ref (a confirm, a release, a value's drop)
//!   only sees refs whose completion is over.
//!
//! The engine never drops a `T` that has drop glue: `T` need be neither
//! `Send` nor `'static`, and the engine's put is not bound by `T`'s
//! lifetime. So an `Owner` of such a `T` is dropped with a synchronous kill
//! (as before: `T` goes on this thread or with the last [`Ref`]), and a
//! [`Killed`] dropped before its kill completed waits for the engine (about
//! a millisecond) before it lets go of `T`.
//!
//! # Invariants
//!
//! 1. `T` is alive whenever the percpu count is above zero; the count is
//!    above zero while any `Ref` exists or the owner is live (not killed,
//!    not frozen).
//! 2. After the count reached zero in a life (the put that took it there
//!    won the release's election; a tryget that lands before the election
//!    takes a reference and the put is not the last, see
//!    `src/atomic_mode.rs`), it stays zero until the owner revives it
//!    (unfreeze); nothing else can revive it, and `tryget`/`tryget_live`
//!    fail at zero.
//! 3. `T` is dropped or moved out exactly once: by `release` when nobody
//!    claimed it, else by the claimant after `release` (decided under the
//!    state mutex, which both sides take).
//! 4. The block is freed exactly once, by whoever drops the last
//!    allocation unit, after `T` is gone.
//!

use crate::flags::{Error, InitFlags};
use crate::percpu::Backend;
use crate::percpu_ref::{Erased, ErasedPtr, PercpuRef};
use crate::sync::{self, AtomicUsize, Condvar, Mutex, Ordering};
use std::cell::{Cell, UnsafeCell};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;
use std::task::Waker;
use std::time::Instant;

// ----- the shared block -----------------------------------------------------

/// The one allocation behind every handle.
pub(super) struct Inner<T> {
    pub(super) pref: PercpuRef,
    /// Allocation units: one per `Weak`, one for the owner side, one for the
    /// percpu count while it is above zero.
    pub(super) units: AtomicUsize,
    pub(super) state: Mutex<State>,
    pub(super) released_cv: Condvar,
    pub(super) value: UnsafeCell<ManuallyDrop<T>>,
    /// Only under loom, which does not see `Box::from_raw`'s deallocation as
    /// a memory access: every unit holder reads this cell just before it
    /// gives up its unit, and the thread that frees the block writes it just
    /// before freeing, so a free not ordered after every holder's last
    /// access is reported as a race (see [`drop_unit`]).
    #[cfg(percpu_ref_loom)]
    pub(super) freed: sync::UnsafeCell<()>,
}

/// What `release` and the owner side agree on, under `Inner::state`.
pub(super) struct State {
    /// The percpu count reached zero in this life and `release` has run.
    pub(super) released: bool,
    /// An owner-side handle will take `T` after release (`Killed`, or a
    /// freeze in progress); `release` must leave `T` alone.
    pub(super) claimed: bool,
    /// The task polling the `Killed` future, woken by `release`. Kept under
    /// the same lock as `released`, so that the poll's check and its
    /// registration are one step and `release`'s publication and its take
    /// of the waker another: a wake-up cannot fall between them.
    pub(super) waker: Option<Waker>,
}

impl<T> Inner<T> {
    /// `release`: the percpu count reached zero.
    pub(super) fn on_release(&self) {
        let mut s = sync::lock(&self.state);
        s.released = true;
        // mutant owned_release_ignores_claim: drop `T` even when claimed.
        if s.claimed && !mutated!("owned_release_ignores_claim") {
            // Taken in the critical section that published `released`: a
            // poll either saw `released` or registered before this.
            let waker = s.waker.take();
            self.released_cv.notify_all();
            drop(s);
            // Woken outside the lock, so the woken task's poll does not
            // block on it. The percpu count's unit keeps the block alive
            // even if that poll takes `T` and drops the owner's unit.
            if let Some(w) = waker {
                w.wake();
            }
            return;
        }
        drop(s);
        // mutant owned_release_keeps_value: never drop an unclaimed `T`.
        if mutated!("owned_release_keeps_value") {
            return;
        }
        // SAFETY: the count is zero, so no `Ref` exists (invariant 1) and
        // none can be made (invariant 2: the owner side, the only reviver,
        // is gone since nobody claimed `T`). Nobody else drops `T`
        // (invariant 3: unclaimed, decided under the state lock).
        unsafe { self.drop_value() }
    }

    /// Waits until `release` has run, or until `deadline`; true if released.
    pub(super) fn wait_released(&self, deadline: Option<Instant>) -> bool {
        let mut s = sync::lock(&self.state);
        loop {
            if s.released {
                return true;
            }
            s = match deadline {
                None => self
                    .released_cv
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    match self.released_cv.wait_timeout(s, d - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    }
                }
            };
        }
    }

    pub(super) fn is_released(&self) -> bool {
        sync::lock(&self.state).released
    }

    /// [`wait_released`](Self::wait_released) for a [`Killed`]: the
    /// release may have to come from the grace-period engine.
    ///
    /// # Panics
    ///
    /// On the engine thread while this block's kill is still queued (the
    /// engine would wait for itself).
    pub(super) fn wait_killed_released(&self, deadline: Option<Instant>, op: &str) -> bool {
        assert!(
            !self.pref.deferred_switch_waits_for_this_thread(),
            "owned::Killed::{op} called from a deferred confirm or release while its own kill \
             is still queued: the grace-period engine would wait for itself"
        );
        // A thread blocks on this kill: the engine takes the queue now
        // rather than gathering more kills for up to a millisecond (as for
        // `flush` and a pending ref's drop), so that `kill().wait()` of an
        // unreferenced object takes a grace period, not a millisecond more.
        self.pref.hurry_deferred_switch();
        self.wait_released(deadline)
    }

    /// Drops `T` in place.
    ///
    /// # Safety
    ///
    /// `T` is alive, no reference to it exists, and nobody else will drop or
    /// take it.
    pub(super) unsafe fn drop_value(&self) {
        // SAFETY: as the caller promised.
        unsafe { ManuallyDrop::drop(&mut *self.value.get()) }
    }

    /// Moves `T` out.
    ///
    /// # Safety
    ///
    /// As [`drop_value`](Self::drop_value).
    pub(super) unsafe fn take_value(&self) -> T {
        // SAFETY: as the caller promised.
        unsafe { ManuallyDrop::take(&mut *self.value.get()) }
    }
}

/// `release` for an `Inner<T>`: drop or hand over `T`, and owe the percpu
/// count's allocation unit (also when `T`'s `Drop` panics: the unit is owed
/// while unwinding, and the wrapper pays it on its way out).
///
/// # Safety
///
/// `ptr` is a live `Inner<T>` whose percpu count just reached zero.
pub(super) unsafe fn release<T>(erased: ErasedPtr) {
    // SAFETY: `alloc` erased an `Inner<T>`'s address as a `*const ()`.
    let ptr: *const () = unsafe { erased.get() };
    // Run by the engine completing a deferred kill (its put was the last):
    // no wrapper of ours is around that call, so the engine pays the unit
    // once it no longer touches the ref (it may free the block).
    // SAFETY: the block is live (the percpu count's unit); only the field's
    // address is taken.
    let pref = unsafe { std::ptr::addr_of!((*ptr.cast::<Inner<T>>()).pref) };
    // mutant owned_engine_unit_unpaid: nobody pays the unit a release on
    // the engine owes (the block leaks).
    let pay = !mutated!("owned_engine_unit_unpaid");
    // SAFETY: as above; the engine's own borrow of the ref is shared too.
    let pref = unsafe { &*pref };
    if pay && pref.completing_on_engine() {
        pref.after_engine_completion(Box::new(settle_owed));
    }
    let _owe = OnDrop(|| {
        owe_unit(Erased {
            ptr: erased,
            func: drop_erased_unit::<T>,
        });
    });
    // SAFETY: the percpu count's unit keeps the block alive until it is paid.
    let inner = unsafe { &*ptr.cast::<Inner<T>>() };
    inner.on_release();
}

/// Runs its closure when dropped, so that a step also happens while
/// unwinding from a user callback (`T`'s `Drop`) that panicked.
pub(crate) struct OnDrop<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// [`drop_unit`] of an owed unit (`Erased`).
///
/// # Safety
///
/// As [`drop_unit`], for the `*const ()` that `erased` was made from.
unsafe fn drop_erased_unit<T>(erased: ErasedPtr) {
    // SAFETY: the caller's promise.
    unsafe { drop_unit::<T>(erased.get()) }
}

/// Drops one allocation unit of an `Inner<T>`; the last one frees it.
///
/// # Safety
///
/// `ptr` is a live `Inner<T>` made by [`alloc`] and the caller owns one
/// unit, which it gives up.
pub(super) unsafe fn drop_unit<T>(ptr: *const ()) {
    let p = ptr.cast::<Inner<T>>().cast_mut();
    // A model that failed unwinds and loom then drops the closures of the
    // threads it never ran, outside any execution, where every loom access
    // panics: a panic during unwinding aborts the test binary, and with it
    // the report of every other model in it. Leak the unit instead; the
    // model has failed already.
    #[cfg(percpu_ref_loom)]
    if std::thread::panicking() {
        return;
    }
    // The last access made under our unit, as loom sees it.
    // SAFETY: the caller's unit keeps the block alive for this access.
    #[cfg(percpu_ref_loom)]
    unsafe { &(*p).freed }.with(|_| ());
    // mutant owned_unit_put_release_only: the freeing thread acquires nothing.
    #[cfg(not(percpu_ref_mutant = "owned_unit_put_release_only"))]
    let order = Ordering::AcqRel;
    #[cfg(percpu_ref_mutant = "owned_unit_put_release_only")]
    let order = Ordering::Release;
    // SAFETY: the caller's unit keeps the block alive for this access.
    // AcqRel: the last one must see every access made under other units.
    if unsafe { (*p).units.fetch_sub(1, order) } == 1 {
        // The free, as loom sees it: a write that must come after every
        // other holder's read above.
        // SAFETY: that was the last unit: nobody else can reach the block.
        #[cfg(percpu_ref_loom)]
        unsafe { &(*p).freed }.with_mut(|_| ());
        // SAFETY: that was the last unit: no handle can reach the block, and
        // `T` is gone (invariant 4), which `ManuallyDrop` leaves alone.
        drop(unsafe { Box::from_raw(p) });
        #[cfg(all(test, not(percpu_ref_loom)))]
        super::tests::LIVE_BLOCKS.fetch_sub(1, crate::sync::unmodeled::Ordering::SeqCst);
        // ordering-audit: Relaxed: a count that models read after joining
        // every thread.
        #[cfg(percpu_ref_loom)]
        loom_live_blocks().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Under loom: blocks allocated and not yet freed in this execution (a
/// block whose last unit is never paid is a leak no loom check sees).
#[cfg(percpu_ref_loom)]
pub(crate) fn loom_live_blocks() -> &'static AtomicUsize {
    loom::lazy_static! {
        static ref LIVE: AtomicUsize = AtomicUsize::new(0);
    }
    &LIVE
}

/// Under loom: the blocks allocated and not yet freed in this execution,
/// for models that check every block is freed
/// ([`loom_support::live_blocks`](crate::loom_support::live_blocks)).
#[cfg(percpu_ref_loom)]
pub(crate) fn live_blocks() -> usize {
    // ordering-audit: Relaxed: read after joining every thread that
    // allocated or freed.
    loom_live_blocks().load(Ordering::Relaxed)
}

#[cfg(not(percpu_ref_loom))]
sync::thread_local! {
    /// An allocation unit that a `release` on this thread left for the
    /// wrapper around the `PercpuRef` call to drop.
    pub(super) static OWED: Cell<Option<Erased>> = const { Cell::new(None) };
}
// loom's macro takes no `const` block.
#[cfg(percpu_ref_loom)]
sync::thread_local! {
    pub(super) static OWED: Cell<Option<Erased>> = Cell::new(None);
}

pub(crate) fn owe_unit(u: Erased) {
    if let Some(old) = OWED.with(|c| c.replace(Some(u))) {
        // Only after a panic between an earlier release and its wrapper.
        // SAFETY: `old` is an owed unit of a block other than this one (a
        // block releases once per life and its wrapper pays at once).
        unsafe { old.call() }
    }
}

/// Pays the unit a `release` during the last `PercpuRef` call owed, if any.
/// Called through [`settle_guard`] around every `PercpuRef` call that may
/// release, so that it also runs when `release` panicked.
#[inline]
pub(crate) fn settle_owed() {
    // A read first: almost always nothing is owed, and then nothing is
    // written (a `take` would store `None` on every put).
    if OWED.with(Cell::get).is_some() {
        settle_owed_slow();
    }
}

/// Settles owed units when dropped: hold it across a `PercpuRef` call that
/// may release. Unwinding out of that call has ended every borrow of the
/// block by then, so paying the unit (which may free it) is sound.
#[inline(always)]
pub(crate) fn settle_guard() -> OnDrop<fn()> {
    OnDrop(settle_owed as fn())
}

#[cold]
fn settle_owed_slow() {
    if let Some(u) = OWED.with(Cell::take) {
        // SAFETY: a `release` put this unit here; the `PercpuRef` call that
        // ran it has returned, so nothing borrows the block any more.
        unsafe { u.call() }
    }
}

/// Allocates the block for `value` with the owner's and the count's units.
pub(super) fn alloc<T>(value: T, backend: Backend) -> Result<NonNull<Inner<T>>, Error> {
    let slot = Box::into_raw(Box::new(MaybeUninit::<Inner<T>>::uninit())).cast::<Inner<T>>();
    let release = Erased {
        ptr: ErasedPtr::new(slot.cast_const().cast::<()>()),
        func: release::<T>,
    };
    // SAFETY: `release::<T>` of the block that will own this ref, which
    // outlives its `PercpuRef` calls (invariant: the count's unit).
    let made = unsafe { PercpuRef::with_erased_release(release, InitFlags::ALLOW_REINIT, backend) };
    let pref = match made {
        Ok(p) => p,
        Err(e) => {
            // SAFETY: `slot` came from `Box::into_raw` just above, unwritten.
            drop(unsafe { Box::from_raw(slot.cast::<MaybeUninit<Inner<T>>>()) });
            return Err(e);
        }
    };
    // SAFETY: `slot` is a fresh, suitably aligned allocation for `Inner<T>`.
    unsafe {
        slot.write(Inner {
            pref,
            units: AtomicUsize::new(2),
            state: Mutex::new(State {
                released: false,
                claimed: false,
                waker: None,
            }),
            released_cv: Condvar::new(),
            value: UnsafeCell::new(ManuallyDrop::new(value)),
            #[cfg(percpu_ref_loom)]
            freed: sync::UnsafeCell::new(()),
        });
    }
    #[cfg(all(test, not(percpu_ref_loom)))]
    super::tests::LIVE_BLOCKS.fetch_add(1, crate::sync::unmodeled::Ordering::SeqCst);
    // ordering-audit: Relaxed: a count that models read after joining every
    // thread.
    #[cfg(percpu_ref_loom)]
    loom_live_blocks().fetch_add(1, Ordering::Relaxed);
    // SAFETY: `Box::into_raw` never returns null.
    Ok(unsafe { NonNull::new_unchecked(slot) })
}

/// The block behind a handle.
///
/// # Safety
///
/// The caller's handle holds an allocation unit or a percpu reference.
#[inline(always)]
pub(super) unsafe fn inner<'a, T>(p: NonNull<Inner<T>>) -> &'a Inner<T> {
    // SAFETY: forwarded to the caller.
    unsafe { &*p.as_ptr() }
}

/// The address of the `T` in the block at `p` (alive or not), with the
/// block's provenance, so that [`Ref::from_raw`] can step back to the block.
///
/// # Safety
///
/// The block at `p` is allocated (the caller holds a unit or a reference).
#[inline(always)]
pub(super) unsafe fn value_ptr<T>(p: NonNull<Inner<T>>) -> *const T {
    // SAFETY: `p` points to an allocated `Inner<T>` (the caller's promise);
    // `addr_of!` takes the field's address without making a reference, so
    // this reads nothing and claims nothing about `T` being alive.
    // `UnsafeCell` and `ManuallyDrop` are `repr(transparent)`: the field's
    // address is `T`'s.
    unsafe { std::ptr::addr_of!((*p.as_ptr()).value) }.cast::<T>()
}

/// Puts one percpu reference, then pays a unit its release left owed.
///
/// # Safety
///
/// The caller holds one percpu reference on `p` and gives it up.
#[inline(always)]
pub(super) unsafe fn put_ref<T>(p: NonNull<Inner<T>>) {
    let _settle = settle_guard();
    // SAFETY: our reference keeps the count, hence the block, alive until
    // the put gives it up; the raw put holds no borrow of the block past
    // that point (another thread's release may free it right after).
    unsafe { PercpuRef::put_many_raw(std::ptr::addr_of!((*p.as_ptr()).pref), 1) };
}
