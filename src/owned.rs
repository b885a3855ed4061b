//! An owning layer over [`PercpuRef`]: the type system does the counting and
//! `T`'s lifetime follows the count.
//!
//! # The types
//!
//! | type | holds | kernel analogue |
//! |---|---|---|
//! | [`Owner<T>`] | the base reference and the right to kill or freeze | the object's creator holding `percpu_ref_init`'s reference |
//! | [`Ref<T>`] | one counted reference; derefs to `T` | a reference taken with `percpu_ref_get` |
//! | [`Weak<T>`] | the allocation only, not `T` | a pointer in an RCU-protected lookup table |
//! | [`Killed<T>`] | the owner's claim on `T` after [`Owner::kill`] | the waiter on `release` |
//! | [`Frozen<'_, T>`] | `&mut T` while no reference exists | `blk_mq_freeze_queue` .. `blk_mq_unfreeze_queue` |
//!
//! `Ref::clone` is a percpu get and `Ref`'s drop a put; nothing else happens
//! on those paths in percpu mode (see *Cost* below).
//!
//! # Which pattern when
//!
//! - **Hot shared object** — many threads read one long-lived object
//!   (a device, a table, a configuration) and clone handles to it often:
//!   hand out [`Ref`]s from the [`Owner`]; kill when done and
//!   [`wait`](Killed::wait) for the last user to get `T` back.
//! - **Lookup table** — objects are found by key and may be going away:
//!   store [`Weak`]s in the table and turn a hit into a reference with
//!   [`Weak::tryget_live`], which fails as soon as the object was killed
//!   (as `css_tryget_online`). Use [`Weak::tryget`] for "alive or dying,
//!   but not yet released" (as `css_tryget`).
//! - **Freeze / unfreeze** — an object is used through references all the
//!   time but must sometimes be changed with nobody looking (the block
//!   layer's queue freeze around an elevator switch): [`Owner::freeze`]
//!   kills, drains, and hands out `&mut T`; dropping the [`Frozen`] guard
//!   brings the object back to percpu mode. [`Owner::freeze_timeout`] gives
//!   up cleanly when references do not drain.
//!
//! Plain `Arc<T>` is the better choice when clones are rare or the object
//! is never killed: a `PercpuRef` costs per-CPU storage and a switch to
//! atomic mode (a grace period, shared with every kill queued in the same
//! millisecond; see *The grace-period engine*) to kill.
//!
//! # Examples
//!
//! A hot shared object, killed and drained:
//!
//! ```
//! use percpu_ref::owned::Owner;
//!
//! let owner = Owner::new(vec![1u64, 2, 3]);
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let r = owner.get(); // a counted reference
//!         std::thread::spawn(move || {
//!             let mut sum = 0;
//!             for _ in 0..1000 {
//!                 let r2 = r.clone(); // percpu get
//!                 sum += r2.iter().sum::<u64>();
//!             } // percpu put
//!             sum
//!         })
//!     })
//!     .collect();
//! let killed = owner.kill(); // no new live references from here on
//! for w in workers {
//!     assert_eq!(w.join().unwrap(), 6000);
//! }
//! assert_eq!(killed.wait(), vec![1, 2, 3]); // every reference is gone
//! ```
//!
//! A lookup table of [`Weak`]s (a lock-free table would store them the same
//! way, read under a crossbeam-epoch guard):
//!
//! ```
//! use percpu_ref::owned::{Owner, Weak};
//! use std::collections::HashMap;
//! use std::sync::RwLock;
//!
//! let table: RwLock<HashMap<u32, Weak<String>>> = RwLock::new(HashMap::new());
//! let dev = Owner::new(String::from("sda"));
//! table.write().unwrap().insert(8, dev.downgrade());
//!
//! let lookup = |id| table.read().unwrap().get(&id).and_then(|w| w.tryget_live());
//! assert_eq!(lookup(8).as_deref().map(String::as_str), Some("sda"));
//!
//! let killed = dev.kill(); // the device goes away
//! assert!(lookup(8).is_none()); // no new users, even before it is freed
//! table.write().unwrap().remove(&8);
//! assert_eq!(killed.wait(), "sda");
//! ```
//!
//! Freeze / unfreeze:
//!
//! ```
//! use percpu_ref::owned::Owner;
//! use std::time::Duration;
//!
//! let mut queue = Owner::new(String::from("mq-deadline"));
//! let weak = queue.downgrade();
//! {
//!     let mut frozen = queue.freeze(); // waits until no Ref exists
//!     assert!(weak.tryget_live().is_none()); // and none can be made
//!     frozen.replace_range(.., "bfq"); // exclusive access
//! } // unfreeze: percpu mode again
//! assert_eq!(*weak.tryget_live().unwrap(), "bfq");
//!
//! let busy = queue.get();
//! assert!(queue.freeze_timeout(Duration::from_millis(10)).is_err()); // undone
//! assert_eq!(*weak.tryget_live().unwrap(), "bfq"); // live again
//! drop(busy);
//! ```
//!
//! # Compared with `Arc`
//!
//! | `Arc<T>` / `sync::Weak<T>` | here |
//! |---|---|
//! | `Arc::new`, `From<T>`, `Default` | [`Owner::new`], `Owner::from`, `Owner::default` |
//! | `Arc::clone` | [`Owner::get`], `Ref::clone` |
//! | `Arc::downgrade` | [`Owner::downgrade`], [`Ref::downgrade`] |
//! | `Weak::upgrade` | [`Weak::tryget`] (alive or dying); [`Weak::tryget_live`] (not killed) |
//! | `Weak::new` | [`Weak::new`] |
//! | `Arc::try_unwrap`, `Arc::into_inner` | [`Owner::kill`] (returns at once; the grace-period engine completes the kill), then [`Killed::try_take`], [`Killed::wait`] or `.await` |
//! | dropping the last `Arc` | dropping the [`Owner`] kills: deferred (returns at once) when `T` has no drop glue, else a synchronous kill (one grace period) so that `T` is dropped by a user thread |
//! | `Arc::get_mut` | [`Owner::freeze_timeout`] with a zero timeout; [`Owner::freeze`] waits |
//! | `Arc::as_ptr`, `into_raw`, `from_raw` | [`Ref::as_ptr`], [`Ref::into_raw`], [`Ref::from_raw`]; [`Weak::as_ptr`] |
//! | `Arc::ptr_eq` | [`Ref::ptr_eq`], [`Weak::ptr_eq`] |
//! | `==`, `<`, `Hash`, `Display`, `Borrow<T>`, `AsRef<T>` | the same on [`Owner`] and [`Ref`], delegated to `T`; `{:p}` on `Ref` |
//! | `UnwindSafe`, `RefUnwindSafe`, `Unpin` | the same for `Ref` and `Weak`; `&Owner` but not an `Owner` by value is unwind safe (see [`Owner`]) |
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
//! ([`PercpuRef::kill_deferred`]): the ref is dead when it returns, and the
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
//! 2. After the count reached zero in a life, it stays zero until the
//!    owner revives it (unfreeze); nothing else can revive it, and
//!    `tryget`/`tryget_live` fail at zero.
//! 3. `T` is dropped or moved out exactly once: by `release` when nobody
//!    claimed it, else by the claimant after `release` (decided under the
//!    state mutex, which both sides take).
//! 4. The block is freed exactly once, by whoever drops the last
//!    allocation unit, after `T` is gone.
//!
//! # Cost
//!
//! `Ref::clone` compiles to `PercpuRef::get` and nothing else: no second
//! atomic, because the percpu count itself keeps the allocation alive.
//! `Ref`'s drop is `PercpuRef::put` plus a read of one thread-local slot
//! (the owed unit, almost always empty).
//!
//! # Caveats
//!
//! - If `T`'s `Drop` panics (inside `release` or when a [`Killed`] is
//!   dropped), the panic propagates to the thread that dropped the last
//!   reference, `T` counts as dropped, and the block is still freed with
//!   its last unit (`Arc` leaks it).
//! - If the kernel refuses the grace period a kill needs (a seccomp filter
//!   that blocks `membarrier`, on the rseq backend): [`Owner::kill`]
//!   returns as usual and the engine reports the refusal on stderr and
//!   retries every 10 ms, so the object stays dying (no new live
//!   references) and is released once a grace period passes; an `Owner`
//!   dropped with a deferred kill does the same. The synchronous kills
//!   cannot wait like that: [`Owner::freeze`] panics, and dropping an
//!   `Owner` whose `T` has drop glue leaks the object (the kill is undone,
//!   so every reference stays valid, but `T` is never dropped).
//! - Leaking a [`Frozen`] guard (`mem::forget`) leaves the object frozen
//!   for good: [`Owner::get`] then panics, lookups fail, and `T` is dropped
//!   with the owner.

use crate::flags::{Error, InitFlags};
use crate::percpu::Backend;
use crate::percpu_ref::PercpuRef;
use crate::sync::{self, AtomicUsize, Condvar, Mutex, Ordering};
use std::borrow::Borrow;
use std::cell::{Cell, UnsafeCell};
use std::cmp::Ordering as CmpOrdering;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

// ----- the shared block -----------------------------------------------------

/// The one allocation behind every handle.
struct Inner<T> {
    pref: PercpuRef,
    /// Allocation units: one per `Weak`, one for the owner side, one for the
    /// percpu count while it is above zero.
    units: AtomicUsize,
    state: Mutex<State>,
    released_cv: Condvar,
    value: UnsafeCell<ManuallyDrop<T>>,
    /// Only under loom, which does not see `Box::from_raw`'s deallocation as
    /// a memory access: every unit holder reads this cell just before it
    /// gives up its unit, and the thread that frees the block writes it just
    /// before freeing, so a free not ordered after every holder's last
    /// access is reported as a race (see [`drop_unit`]).
    #[cfg(loom)]
    freed: sync::UnsafeCell<()>,
}

/// What `release` and the owner side agree on, under `Inner::state`.
struct State {
    /// The percpu count reached zero in this life and `release` has run.
    released: bool,
    /// An owner-side handle will take `T` after release (`Killed`, or a
    /// freeze in progress); `release` must leave `T` alone.
    claimed: bool,
    /// The task polling the `Killed` future, woken by `release`. Kept under
    /// the same lock as `released`, so that the poll's check and its
    /// registration are one step and `release`'s publication and its take
    /// of the waker another: a wake-up cannot fall between them.
    waker: Option<Waker>,
}

impl<T> Inner<T> {
    /// `release`: the percpu count reached zero.
    fn on_release(&self) {
        let mut s = sync::lock(&self.state);
        s.released = true;
        // mutant owned_release_ignores_claim: drop `T` even when claimed.
        if s.claimed && cfg!(not(percpu_ref_mutant = "owned_release_ignores_claim")) {
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
        if cfg!(percpu_ref_mutant = "owned_release_keeps_value") {
            return;
        }
        // SAFETY: the count is zero, so no `Ref` exists (invariant 1) and
        // none can be made (invariant 2: the owner side, the only reviver,
        // is gone since nobody claimed `T`). Nobody else drops `T`
        // (invariant 3: unclaimed, decided under the state lock).
        unsafe { self.drop_value() }
    }

    /// Waits until `release` has run, or until `deadline`; true if released.
    fn wait_released(&self, deadline: Option<Instant>) -> bool {
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

    fn is_released(&self) -> bool {
        sync::lock(&self.state).released
    }

    /// Waits until the grace-period engine is done with a deferred kill of
    /// this block's ref (at once if none is queued): from then on the last
    /// put is made by a thread that drops a handle, never by the engine.
    /// False, without waiting, on the engine thread while the kill is still
    /// queued (it would wait for itself).
    fn wait_engine_done(&self) -> bool {
        self.pref.wait_deferred_switch()
    }

    /// [`wait_released`](Self::wait_released) for a [`Killed`]: the
    /// release may have to come from the grace-period engine.
    ///
    /// # Panics
    ///
    /// On the engine thread while this block's kill is still queued (the
    /// engine would wait for itself).
    fn wait_killed_released(&self, deadline: Option<Instant>, op: &str) -> bool {
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
    unsafe fn drop_value(&self) {
        // SAFETY: as the caller promised.
        unsafe { ManuallyDrop::drop(&mut *self.value.get()) }
    }

    /// Moves `T` out.
    ///
    /// # Safety
    ///
    /// As [`drop_value`](Self::drop_value).
    unsafe fn take_value(&self) -> T {
        // SAFETY: as the caller promised.
        unsafe { ManuallyDrop::take(&mut *self.value.get()) }
    }
}

/// A type-erased pointer to an `Inner<T>` with one of its functions.
#[derive(Clone, Copy)]
struct Erased {
    ptr: *const (),
    func: unsafe fn(*const ()),
}

// SAFETY: an `Erased` lives in the release callback (which `PercpuRef`
// requires to be `Send + Sync`) and in this thread's owed slot. Its function
// only runs as the release of the block's own `PercpuRef` or to pay an owed
// unit, i.e. on a thread that made the last put or dropped a handle; the
// handles' `Send`/`Sync` bounds already allow `T` to be dropped there.
unsafe impl Send for Erased {}
// SAFETY: as for `Send`; `Erased` has no interior state.
unsafe impl Sync for Erased {}

impl Erased {
    /// # Safety
    ///
    /// `func`'s own contract for `ptr`.
    unsafe fn call(self) {
        // SAFETY: forwarded to the caller.
        unsafe { (self.func)(self.ptr) }
    }
}

/// The `PercpuRef` release callback for an `Inner<T>` at `e.ptr`. Not
/// generic, so the callback is `'static` whatever `T`'s lifetime.
fn release_callback(e: Erased) -> impl Fn(&PercpuRef) + Send + Sync + 'static {
    // SAFETY: `e` is `release::<T>` for the block that owns this callback's
    // `PercpuRef`; the block outlives its `PercpuRef` calls.
    move |_| unsafe { e.call() }
}

/// `release` for an `Inner<T>`: drop or hand over `T`, and owe the percpu
/// count's allocation unit (also when `T`'s `Drop` panics: the unit is owed
/// while unwinding, and the wrapper pays it on its way out).
///
/// # Safety
///
/// `ptr` is a live `Inner<T>` whose percpu count just reached zero.
unsafe fn release<T>(ptr: *const ()) {
    // Run by the engine completing a deferred kill (its put was the last):
    // no wrapper of ours is around that call, so the engine pays the unit
    // once it no longer touches the ref (it may free the block).
    // SAFETY: the block is live (the percpu count's unit); only the field's
    // address is taken.
    let pref = unsafe { std::ptr::addr_of!((*ptr.cast::<Inner<T>>()).pref) };
    // mutant owned_engine_unit_unpaid: nobody pays the unit a release on
    // the engine owes (the block leaks).
    let pay = cfg!(not(percpu_ref_mutant = "owned_engine_unit_unpaid"));
    // SAFETY: as above; the engine's own borrow of the ref is shared too.
    let pref = unsafe { &*pref };
    if pay && pref.completing_on_engine() {
        pref.after_engine_completion(Box::new(settle_owed));
    }
    let _owe = OnDrop(|| {
        owe_unit(Erased {
            ptr,
            func: drop_unit::<T>,
        });
    });
    // SAFETY: the percpu count's unit keeps the block alive until it is paid.
    let inner = unsafe { &*ptr.cast::<Inner<T>>() };
    inner.on_release();
}

/// Runs its closure when dropped, so that a step also happens while
/// unwinding from a user callback (`T`'s `Drop`) that panicked.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Drops one allocation unit of an `Inner<T>`; the last one frees it.
///
/// # Safety
///
/// `ptr` is a live `Inner<T>` made by [`alloc`] and the caller owns one
/// unit, which it gives up.
unsafe fn drop_unit<T>(ptr: *const ()) {
    let p = ptr.cast::<Inner<T>>().cast_mut();
    // The last access made under our unit, as loom sees it.
    // SAFETY: the caller's unit keeps the block alive for this access.
    #[cfg(loom)]
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
        #[cfg(loom)]
        unsafe { &(*p).freed }.with_mut(|_| ());
        // SAFETY: that was the last unit: no handle can reach the block, and
        // `T` is gone (invariant 4), which `ManuallyDrop` leaves alone.
        drop(unsafe { Box::from_raw(p) });
        #[cfg(all(test, not(loom)))]
        tests::LIVE_BLOCKS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        // ordering-audit: Relaxed: a count that models read after joining
        // every thread.
        #[cfg(loom)]
        loom_live_blocks().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Under loom: blocks allocated and not yet freed in this execution (a
/// block whose last unit is never paid is a leak no loom check sees).
#[cfg(loom)]
fn loom_live_blocks() -> &'static AtomicUsize {
    loom::lazy_static! {
        static ref LIVE: AtomicUsize = AtomicUsize::new(0);
    }
    &LIVE
}

/// Under loom: the blocks allocated and not yet freed in this execution,
/// for models that check every block is freed.
#[cfg(loom)]
#[doc(hidden)]
#[must_use]
pub fn __loom_live_blocks() -> usize {
    // ordering-audit: Relaxed: read after joining every thread that
    // allocated or freed.
    loom_live_blocks().load(Ordering::Relaxed)
}

#[cfg(not(loom))]
sync::thread_local! {
    /// An allocation unit that a `release` on this thread left for the
    /// wrapper around the `PercpuRef` call to drop.
    static OWED: Cell<Option<Erased>> = const { Cell::new(None) };
}
// loom's macro takes no `const` block.
#[cfg(loom)]
sync::thread_local! {
    static OWED: Cell<Option<Erased>> = Cell::new(None);
}

fn owe_unit(u: Erased) {
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
fn settle_owed() {
    if let Some(u) = OWED.with(Cell::take) {
        settle_owed_slow(u);
    }
}

/// Settles owed units when dropped: hold it across a `PercpuRef` call that
/// may release. Unwinding out of that call has ended every borrow of the
/// block by then, so paying the unit (which may free it) is sound.
#[inline(always)]
fn settle_guard() -> OnDrop<fn()> {
    OnDrop(settle_owed as fn())
}

#[cold]
fn settle_owed_slow(u: Erased) {
    // SAFETY: a `release` put this unit here; the `PercpuRef` call that ran
    // it has returned, so nothing borrows the block any more.
    unsafe { u.call() }
}

/// Allocates the block for `value` with the owner's and the count's units.
fn alloc<T>(value: T, backend: Backend) -> Result<NonNull<Inner<T>>, Error> {
    let slot = Box::into_raw(Box::new(MaybeUninit::<Inner<T>>::uninit())).cast::<Inner<T>>();
    let callback = release_callback(Erased {
        ptr: slot.cast_const().cast(),
        func: release::<T>,
    });
    let pref = match PercpuRef::with_backend(callback, InitFlags::ALLOW_REINIT, backend) {
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
            #[cfg(loom)]
            freed: sync::UnsafeCell::new(()),
        });
    }
    #[cfg(all(test, not(loom)))]
    tests::LIVE_BLOCKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // ordering-audit: Relaxed: a count that models read after joining every
    // thread.
    #[cfg(loom)]
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
unsafe fn inner<'a, T>(p: NonNull<Inner<T>>) -> &'a Inner<T> {
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
unsafe fn value_ptr<T>(p: NonNull<Inner<T>>) -> *const T {
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
unsafe fn put_ref<T>(p: NonNull<Inner<T>>) {
    let _settle = settle_guard();
    // SAFETY: our reference keeps the count, hence the block, alive until
    // the put gives it up; the raw put holds no borrow of the block past
    // that point (another thread's release may free it right after).
    unsafe { PercpuRef::put_many_raw(std::ptr::addr_of!((*p.as_ptr()).pref), 1) };
}

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
    inner: NonNull<Inner<T>>,
    /// A `Frozen` guard of this owner was leaked (see the module docs).
    frozen: bool,
    _owns: PhantomData<Inner<T>>,
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

    fn inner(&self) -> &Inner<T> {
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
    /// [`PercpuRef::kill_deferred`]), which then drops the owner's base
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
            this.kill_deferred("owned::Owner::kill");
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
    /// instead (one grace period, a `membarrier` on the rseq backend, about
    /// 10 us with other CPUs busy), because `Owner::new` does not require
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
    fn let_go_deferred(&mut self, op: &'static str) {
        self.kill_deferred(op);
        // SAFETY: the owner's unit, given up: nothing of `self` is used
        // after this.
        unsafe { drop_unit::<T>(self.inner.as_ptr().cast_const().cast()) };
    }

    /// Kills through the grace-period engine (see [`kill`](Self::kill)).
    fn kill_deferred(&self, op: &'static str) {
        // The ref is percpu, so the engine completes the kill; were it
        // atomic, the kill (and a release) would happen in the call, paid
        // for on the way out as after a put.
        let _settle = settle_guard();
        // SAFETY: the block never moves and is freed only when its last
        // unit goes (our unit is held across the call); its `PercpuRef`'s
        // `Drop` then waits for the engine (module docs, *The grace-period
        // engine*).
        let killed = unsafe {
            PercpuRef::kill_deferred_raw(std::ptr::addr_of!((*self.inner.as_ptr()).pref), None, op)
        };
        if let Err(e) = killed {
            unreachable!("{op}: a live owner's ref was dead: {e}");
        }
    }

    /// Kills synchronously and turns the owner's unit into the `Killed`'s;
    /// the caller must not use `self` afterwards unless this fails (then
    /// nothing changed).
    fn kill_in_place(&mut self) -> Result<Killed<T>, Error> {
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
    fn kill_claimed(&self, op: &str) -> Result<(), Error> {
        let inner = self.inner();
        sync::lock(&inner.state).claimed = true;
        let _settle = settle_guard();
        match inner.pref.kill() {
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

    fn freeze_until(&mut self, deadline: Option<Instant>) -> Result<Frozen<'_, T>, FreezeTimeout> {
        assert!(
            !self.frozen,
            "owned::Owner::freeze: the owner is frozen for good (a Frozen guard was leaked)"
        );
        if let Err(e) = self.kill_claimed("owned::Owner::freeze") {
            panic!("owned::Owner::freeze: {e}");
        }
        let inner = self.inner();
        // mutant owned_freeze_no_drain: hand out `&mut T` without draining.
        let drained =
            cfg!(percpu_ref_mutant = "owned_freeze_no_drain") || inner.wait_released(deadline);
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
    fn undo_freeze(&self) -> bool {
        let inner = self.inner();
        // Hold a reference of our own so the count cannot reach zero (and
        // `release` cannot run) while we revive.
        if !inner.pref.tryget() {
            return false;
        }
        if let Err(e) = inner.pref.resurrect() {
            unreachable!("owned::Owner::freeze_timeout: the killed ref was not dead: {e}");
        }
        sync::lock(&inner.state).claimed = false;
        // The base reference is back, so this put is never the last.
        let _settle = settle_guard();
        inner.pref.put();
        true
    }

    /// Ends a freeze: a new life in percpu mode.
    fn unfreeze(&mut self) {
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
    /// [`PercpuRef::kill`]), and `T` is dropped by the thread that drops
    /// the last [`Ref`], this one if there is none: `T` need not be `Send`
    /// or `'static`, so the engine thread must never drop it. If the kernel
    /// refuses that grace period the object is leaked instead (never
    /// dropped, references stay valid): a drop does not panic. For a `T:
    /// Send + 'static` with drop glue, [`Owner::drop_deferred`] returns at
    /// once instead.
    fn drop(&mut self) {
        // mutant owned_drop_deferred_always: drop-glue `T` is dropped by the
        // engine thread too (after `Owner` drop returned).
        let defer =
            !std::mem::needs_drop::<T>() || cfg!(percpu_ref_mutant = "owned_drop_deferred_always");
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
    inner: NonNull<Inner<T>>,
    _owns: PhantomData<Inner<T>>,
}

// SAFETY: a `Ref` gives `&T` on any thread (`T: Sync`) and the last one may
// drop `T` on its thread (`T: Send`), as `Arc<T>`.
unsafe impl<T: Send + Sync> Send for Ref<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for Ref<T> {}

impl<T> Ref<T> {
    fn inner(&self) -> &Inner<T> {
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
    inner: Option<NonNull<Inner<T>>>,
    _owns: PhantomData<Inner<T>>,
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
    fn new_unit(p: NonNull<Inner<T>>) -> Self {
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
    fn inner(&self) -> Option<(NonNull<Inner<T>>, &Inner<T>)> {
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
        #[cfg(percpu_ref_mutant = "owned_tryget_live_as_tryget")]
        return self.tryget();
        #[cfg(not(percpu_ref_mutant = "owned_tryget_live_as_tryget"))]
        {
            let (p, inner) = self.inner()?;
            inner.pref.tryget_live().then(|| make_ref(p))
        }
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
fn make_ref<T>(p: NonNull<Inner<T>>) -> Ref<T> {
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
/// dropping it then does nothing. A tiny executor, one thread parked
/// between polls:
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
    inner: Option<NonNull<Inner<T>>>,
    _owns: PhantomData<Inner<T>>,
}

// SAFETY: a `Killed` moves or drops `T` on its thread (`T: Send`) and never
// gives out `&T`; `release` hands over to it under the state lock. The
// waker it stores is `Send + Sync`.
unsafe impl<T: Send> Send for Killed<T> {}
// SAFETY: `&Killed` only reads the released flag.
unsafe impl<T: Send> Sync for Killed<T> {}

impl<T> Killed<T> {
    /// The block, unless the future has already returned `T`.
    fn inner(&self) -> Option<&Inner<T>> {
        // SAFETY: until then a `Killed` holds the owner side's unit.
        self.inner.map(|p| unsafe { inner(p) })
    }

    /// The block, for an operation that needs `T` still here.
    fn block_for(&self, op: &str) -> NonNull<Inner<T>> {
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
    fn take(self, p: NonNull<Inner<T>>) -> T {
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
unsafe fn take_released<T>(p: NonNull<Inner<T>>) -> T {
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
        #[cfg(percpu_ref_mutant = "owned_future_no_recheck")]
        {
            if !sync::lock(&inner.state).released {
                let old = sync::lock(&inner.state).waker.replace(cx.waker().clone());
                drop(old);
                return Poll::Pending;
            }
        }
        #[cfg(not(percpu_ref_mutant = "owned_future_no_recheck"))]
        {
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
        if std::mem::needs_drop::<T>() && !inner.wait_engine_done() {
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

// ----- marker traits --------------------------------------------------------

// Unpin: no handle pins anything. `T` lives in the heap block and no method
// gives out `Pin<&mut T>`, so moving a handle never moves `T` (as `Arc<T>:
// Unpin` for every `T`). Without these, `PhantomData<Inner<T>>` would make a
// handle `Unpin` only when `T` is, and a `Killed` of a `!Unpin` value could
// not be polled through `Pin::new(&mut killed)`.
impl<T> Unpin for Owner<T> {}
impl<T> Unpin for Ref<T> {}
impl<T> Unpin for Weak<T> {}
impl<T> Unpin for Killed<T> {}

// Unwind safety. The auto impls are missing for every handle because the
// block holds `T` in an `UnsafeCell` (and the ref's boxed callback), not
// because a panic could tear anything of ours: the counts and the state
// lock are consistent at every point where user code can panic (`T`'s
// `Drop` inside `release` or a `Killed`'s drop, a waker), which the module
// handles, and the state lock ignores poisoning on purpose. What a handle
// shares across a `catch_unwind` boundary is then `&T` alone:
//
// - `Ref` and `Weak` give `&T` (now or after a `tryget`) and nothing else,
//   so they are unwind safe when `T: RefUnwindSafe`, as `Arc<T>`.
// - `&Owner` gives `&T`, `Ref`s and `Weak`s: `Owner: RefUnwindSafe` on the
//   same terms. An `Owner` by value is *not* `UnwindSafe`: it can freeze,
//   and a panic while the `Frozen` guard's `&mut T` is half way through an
//   update unfreezes on the way out (there is no poisoning), so the other
//   handles (`Weak`s outside the closure) could see the torn `T` — the
//   reason `Arc::get_mut` refuses while any `Weak` exists. Wrap it in
//   `AssertUnwindSafe` when that cannot happen.
// - `Killed` never gives `&T`; it is `T` in waiting, so it is unwind safe
//   as `T` is (as `Option<T>`).
// - `Frozen` keeps its auto impls: `&mut Owner` is never `UnwindSafe`, and
//   `&Frozen` gives `&T` (via `Owner: RefUnwindSafe`).
impl<T: RefUnwindSafe> UnwindSafe for Ref<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Ref<T> {}
impl<T: RefUnwindSafe> UnwindSafe for Weak<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Weak<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Owner<T> {}
impl<T: UnwindSafe> UnwindSafe for Killed<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Killed<T> {}

// ----- Frozen ---------------------------------------------------------------

/// Exclusive access to a frozen object's `T`; dropping it unfreezes.
///
/// While it lives no [`Ref`] exists and none can be made. Made by
/// [`Owner::freeze`] and [`Owner::freeze_timeout`].
#[must_use = "dropping the Frozen guard unfreezes at once"]
pub struct Frozen<'a, T> {
    owner: &'a mut Owner<T>,
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::Arc;

    /// Blocks allocated and not yet freed, over every test in this binary.
    pub(super) static LIVE_BLOCKS: StdAtomicUsize = StdAtomicUsize::new(0);

    /// Serialises the tests that check `LIVE_BLOCKS` (tests run in parallel).
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // An earlier test's kill completed by the engine may free its block
        // now, under this test's count: let every queued kill finish first.
        crate::flush();
        g
    }

    /// Counts its drops.
    #[derive(Debug)]
    struct Tracked {
        drops: Arc<StdAtomicUsize>,
        payload: u64,
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.drops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn tracked(payload: u64) -> (Tracked, Arc<StdAtomicUsize>) {
        let drops = Arc::new(StdAtomicUsize::new(0));
        (
            Tracked {
                drops: drops.clone(),
                payload,
            },
            drops,
        )
    }

    fn drops(d: &StdAtomicUsize) -> usize {
        d.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn live_blocks() -> usize {
        LIVE_BLOCKS.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn owner_drop_without_refs_drops_value_and_block() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(1);
        let o = Owner::new(v);
        let w = o.downgrade();
        assert_eq!(live_blocks(), before + 1);
        drop(o);
        assert_eq!(drops(&d), 1, "implicit kill with no Ref drops T at once");
        assert!(w.tryget().is_none());
        assert_eq!(live_blocks(), before + 1, "the Weak keeps the block");
        drop(w);
        assert_eq!(live_blocks(), before, "block freed with the last unit");
    }

    #[test]
    fn owner_drop_of_a_value_without_drop_glue_is_deferred_and_frees_the_block() {
        let _s = serial();
        let before = live_blocks();
        // No Ref, no Weak: the engine's put releases, and it alone can pay
        // the count's unit, after it is done with the ref.
        drop(Owner::new(1u64));
        let o = Owner::new(2u64);
        let w = o.downgrade();
        let r = o.get();
        drop(o);
        assert!(w.tryget_live().is_none(), "dying once the drop returned");
        crate::flush();
        assert!(w.tryget().is_some(), "r still holds it");
        drop(r);
        assert!(w.tryget().is_none());
        drop(w);
        assert_eq!(live_blocks(), before, "every block freed, none twice");
    }

    #[test]
    fn killed_of_a_value_with_drop_glue_dropped_at_once_drops_it_here() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(6);
        let o = Owner::new(v);
        // Waits for the engine, which must not drop a `T` that may be
        // neither `Send` nor `'static`: `T` goes on this thread.
        drop(o.kill());
        assert_eq!(drops(&d), 1);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn owner_drop_with_refs_last_ref_drops_value() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(2);
        let o = Owner::new(v);
        let r = o.get();
        let r2 = r.clone();
        drop(o);
        assert_eq!(drops(&d), 0);
        assert_eq!(r.payload, 2);
        drop(r);
        assert_eq!(drops(&d), 0);
        let t = std::thread::spawn(move || drop(r2));
        t.join().unwrap();
        assert_eq!(drops(&d), 1, "the last Ref dropped T");
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn killed_wait_takes_value_without_dropping() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(3);
        let o = Owner::new(v);
        let r = o.get();
        let k = o.kill();
        assert!(!k.is_released());
        let k = k.wait_timeout(Duration::from_millis(1)).unwrap_err();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            drop(r);
        });
        let v = k.wait();
        t.join().unwrap();
        assert_eq!(v.payload, 3);
        assert_eq!(drops(&d), 0, "wait hands T back, release left it alone");
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
        drop(v);
        assert_eq!(drops(&d), 1);
    }

    #[test]
    fn killed_dropped_before_release_leaves_value_to_last_ref() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(4);
        let o = Owner::new(v);
        let r = o.get();
        drop(o.kill());
        assert_eq!(drops(&d), 0);
        drop(r);
        assert_eq!(drops(&d), 1);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn killed_dropped_after_release_drops_value() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(5);
        let o = Owner::new(v);
        let r = o.get();
        let k = o.kill();
        crate::flush(); // the deferred kill is complete
        drop(r);
        assert!(k.is_released());
        assert_eq!(drops(&d), 0, "claimed: release must not drop T");
        drop(k);
        assert_eq!(drops(&d), 1);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn tryget_and_tryget_live_follow_kill_and_release() {
        let _s = serial();
        let o = Owner::new(7u32);
        let w = o.downgrade();
        let r = w.tryget_live().expect("live");
        let k = o.kill();
        crate::flush(); // the deferred kill is complete
        assert!(w.tryget_live().is_none());
        let r2 = w.tryget().expect("dying but referenced");
        drop(r);
        assert!(!k.is_released());
        drop(r2);
        assert!(w.tryget().is_none());
        assert_eq!(k.try_take().unwrap(), 7);
    }

    #[test]
    fn freeze_excludes_refs_and_unfreeze_revives() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(10);
        let mut o = Owner::new(v);
        let w = o.downgrade();
        for round in 0..5u64 {
            let r = o.get();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                drop(r);
            });
            {
                let mut f = o.freeze();
                assert!(w.tryget_live().is_none());
                assert!(w.tryget().is_none());
                f.payload += 1;
            }
            t.join().unwrap();
            assert_eq!(w.tryget_live().unwrap().payload, 11 + round);
        }
        assert_eq!(drops(&d), 0, "freeze never drops T");
        drop(o);
        assert_eq!(drops(&d), 1);
        drop(w);
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn freeze_timeout_undoes_cleanly() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(20);
        let mut o = Owner::new(v);
        let w = o.downgrade();
        let r = o.get();
        let e = o.freeze_timeout(Duration::from_millis(5)).unwrap_err();
        assert!(e.to_string().contains("freeze_timeout"));
        assert_eq!(r.payload, 20);
        assert!(w.tryget_live().is_some(), "live again after the undo");
        drop(r);
        // The undo left the counts consistent: a freeze now drains at once.
        o.freeze_timeout(Duration::ZERO).unwrap().payload = 21;
        assert_eq!(o.payload, 21);
        let k = o.kill();
        assert_eq!(k.wait().payload, 21);
        assert_eq!(drops(&d), 1);
        drop(w);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn leaked_freeze_guard_stays_frozen_and_drops_value_with_owner() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(30);
        let mut o = Owner::new(v);
        let w = o.downgrade();
        std::mem::forget(o.freeze());
        assert!(w.tryget().is_none());
        assert_eq!(o.payload, 30);
        let msg =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(o.get()))).unwrap_err();
        assert!(msg
            .downcast_ref::<&str>()
            .is_some_and(|m| m.contains("Owner::get")));
        drop(o);
        assert_eq!(drops(&d), 1);
        drop(w);
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn weak_inside_value_pointing_to_itself() {
        let _s = serial();
        let before = live_blocks();
        struct Node {
            me: Option<Weak<std::sync::Mutex<Node>>>,
        }
        let o = Owner::new(std::sync::Mutex::new(Node { me: None }));
        o.lock().unwrap().me = Some(o.downgrade());
        let r = o
            .lock()
            .unwrap()
            .me
            .as_ref()
            .unwrap()
            .tryget_live()
            .unwrap();
        drop(o);
        drop(r); // release drops T, which drops a Weak of its own block
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn value_may_borrow_from_the_stack() {
        let _s = serial();
        let s = String::from("borrowed");
        let o = Owner::new(s.as_str());
        let r = o.get();
        assert_eq!(*r, "borrowed");
        drop(o);
        drop(r);
    }

    /// Panics in its `Drop` (after counting the drop).
    struct PanicsOnDrop(Arc<StdAtomicUsize>);

    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            panic!("T::drop failed on purpose");
        }
    }

    #[test]
    fn a_panicking_value_drop_in_release_still_frees_the_block() {
        let _s = serial();
        let before = live_blocks();
        let d = Arc::new(StdAtomicUsize::new(0));
        // Released by the last Ref's drop.
        let o = Owner::new(PanicsOnDrop(d.clone()));
        let r = o.get();
        drop(o);
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(r))).unwrap_err();
        assert_eq!(e.downcast_ref::<&str>(), Some(&"T::drop failed on purpose"));
        assert_eq!(drops(&d), 1);
        assert_eq!(live_blocks(), before, "the block was freed all the same");
        // Released by the owner's own kill.
        let o = Owner::new(PanicsOnDrop(d.clone()));
        let w = o.downgrade();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(o))).unwrap_err();
        assert_eq!(drops(&d), 2);
        assert!(w.tryget().is_none());
        drop(w);
        assert_eq!(live_blocks(), before);
        // Dropped by a `Killed` after the release.
        let o = Owner::new(PanicsOnDrop(d.clone()));
        let r = o.get();
        let k = o.kill();
        drop(r);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(k))).unwrap_err();
        assert_eq!(drops(&d), 3);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
        // No unit was left owed on this thread.
        assert!(OWED.with(Cell::take).is_none());
    }

    #[test]
    fn raw_round_trip_keeps_the_reference_and_the_block() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(50);
        let o = Owner::new(v);
        let w = o.downgrade();
        let p = Ref::into_raw(o.get());
        let k = o.kill();
        crate::flush(); // the deferred kill is complete
        assert!(!k.is_released(), "the raw reference still counts");
        assert!(
            w.tryget().is_some(),
            "and keeps the object dying, not released"
        );
        // SAFETY: `p` came from `into_raw` and is turned back once.
        let r = unsafe { Ref::from_raw(p) };
        assert_eq!(r.payload, 50);
        drop(r);
        assert!(k.is_released(), "from_raw's Ref put the raw reference");
        assert_eq!(k.wait().payload, 50);
        assert_eq!(drops(&d), 1);
        drop(w);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn empty_weak_allocates_and_frees_nothing() {
        let _s = serial();
        let before = live_blocks();
        let w: Weak<Tracked> = Weak::new();
        let w2 = w.clone();
        assert!(w2.tryget().is_none() && w2.tryget_live().is_none());
        assert_eq!(live_blocks(), before);
        drop((w, w2));
        assert_eq!(live_blocks(), before);
    }

    /// Counts its wakes.
    struct CountWakes(StdAtomicUsize);

    impl std::task::Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn killed_future_takes_the_value_and_gives_up_the_unit() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(60);
        let o = Owner::new(v);
        let r = o.get();
        let mut k = o.kill();
        crate::flush(); // the deferred kill is complete
        let wakes = Arc::new(CountWakes(StdAtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut k).poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(r);
        assert_eq!(wakes.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        match Pin::new(&mut k).poll(&mut cx) {
            Poll::Ready(v) => assert_eq!(v.payload, 60),
            Poll::Pending => panic!("released but pending"),
        }
        assert_eq!(drops(&d), 1, "the value was handed out and dropped once");
        assert_eq!(
            live_blocks(),
            before,
            "the owner's unit went with the value"
        );
        assert!(k.is_released());
        drop(k); // a completed future drops nothing more
        assert_eq!(drops(&d), 1);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn killed_dropped_while_pending_drops_its_waker_and_leaves_value_to_last_ref() {
        let _s = serial();
        let before = live_blocks();
        let (v, d) = tracked(70);
        let o = Owner::new(v);
        let r = o.get();
        let mut k = o.kill();
        let wakes = Arc::new(CountWakes(StdAtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        assert!(Pin::new(&mut k)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert_eq!(Arc::strong_count(&wakes), 3, "registered");
        drop(k);
        assert_eq!(
            Arc::strong_count(&wakes),
            2,
            "the waker went with the Killed"
        );
        drop(r);
        assert_eq!(wakes.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(drops(&d), 1);
        // A release run by the engine frees the block once the engine is
        // done with it, maybe just after the waiter woke.
        crate::flush();
        assert_eq!(live_blocks(), before);
    }

    #[test]
    fn ref_drops_inside_value_drop_settle_their_own_units() {
        let _s = serial();
        let before = live_blocks();
        // T of the outer object holds the last Ref of an inner object: the
        // outer release runs the inner release on the same thread.
        let (v, d) = tracked(40);
        let inner_owner = Owner::new(v);
        let inner_ref = inner_owner.get();
        drop(inner_owner);
        let outer = Owner::new(inner_ref);
        let outer_ref = outer.get();
        drop(outer);
        drop(outer_ref);
        assert_eq!(drops(&d), 1);
        assert_eq!(live_blocks(), before);
    }
}
