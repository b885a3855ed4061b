//! The heap block behind a [`Shared`] and its [`Weak`]s: the ref, the
//! allocation count, the promotion hint and `T`; `release`, and the
//! block's allocation and free.
//!
//! # Two counts
//!
//! - The **percpu count** keeps `T` alive: every `Shared` is one
//!   reference (there is no owner and no base reference of anyone
//!   else's). When it reaches zero, `release` drops `T`.
//! - The **allocation count** keeps the block alive: one unit per `Weak`
//!   and one on behalf of the whole percpu count while it is above zero,
//!   so a `Shared` needs no unit of its own and a clone is a bare get.
//!   `release` owes the count's unit, and whoever made the call that ran
//!   it pays it once that call has returned (the owned layer's owed-unit
//!   slot, `owned::block`): the thread whose drop was the last in atomic
//!   mode, or the grace-period engine once it no longer touches the ref.
//!
//! # Two lives of a `Shared`: atomic, then managed
//!
//! A block starts in atomic mode (`INIT_ATOMIC`): a clone is one atomic
//! add, a drop one compare-and-swap (`PercpuRef::put_promotable`: a
//! drop that read "atomic" just before a promotion must not count on the
//! promoted counter unmarked), and the drop from one to none runs
//! `release` at once, on its thread, as `Arc` does. Most shared values
//! are short-lived or cloned a few times, and they never meet the
//! grace-period engine. A value cloned [`PROMOTE_AFTER`] times (counted by
//! a racy hint, see [`Block::count_clone`]) is *promoted*: switched to
//! percpu mode and handed to the engine as a managed ref
//! (`PercpuRef::promote_to_managed`, one hold of the switch lock, no grace
//! period), after which clones and drops are per-CPU and the engine
//! releases the value a few of its rounds after the last drop
//! (`src/percpu_ref/managed.rs`). A promoted value never goes back.
//!
//! # Invariants
//!
//! 1. `T` is alive while the percpu count is above zero; the count is the
//!    number of `Shared`s (plus the engine's stand-in once promoted, and a
//!    `Weak::upgrade`'s reference for as long as it takes).
//! 2. `T` is dropped exactly once, by `release`: the count reaches zero
//!    once (no base reference to revive it; a tryget at zero fails).
//! 3. The block is freed exactly once, by whoever drops the last
//!    allocation unit, after `T` is gone and after the last `PercpuRef`
//!    call that touches it has returned.
//! 4. Promotion happens with a reference held (the cloning handle's), so
//!    the count cannot reach zero during it.

use crate::flags::InitFlags;
use crate::owned::block::{owe_unit, release_callback, settle_guard, settle_owed, Erased, OnDrop};
use crate::percpu::Backend;
use crate::percpu_ref::PercpuRef;
use crate::sync::{AtomicU32, AtomicUsize, Ordering};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::pin::Pin;
use std::ptr::NonNull;

#[cfg(doc)]
use super::{Shared, Weak};

/// Clones (and upgrades) in atomic mode after which a value is promoted
/// to per-CPU counting. A value cloned this often is likely shared and
/// hot; one cloned less costs what an `Arc` costs and never waits for
/// the engine. Each clone in atomic mode pays a load and a store of the
/// hint on the block's third cache line.
pub const PROMOTE_AFTER: u32 = 64;

/// The hint's value once promotion was tried (or done): never counted
/// again.
const PROMOTED: u32 = u32::MAX;

/// The one allocation behind a `Shared` and its `Weak`s.
pub(super) struct Block<T> {
    pub(super) pref: PercpuRef,
    /// Allocation units: one per `Weak`, one for the percpu count while it
    /// is above zero.
    pub(super) units: AtomicUsize,
    /// Clones counted toward promotion; [`PROMOTED`] once tried. A hint:
    /// racing clones may lose counts (a load and a store, no RMW).
    pub(super) clones: AtomicU32,
    /// Not in an `UnsafeCell`, so that handles are covariant in `T` (as
    /// `Arc`'s): `release` drops it through the block's raw pointer, when
    /// no handle can form a reference to it, and code that may run while
    /// it is dropped (a `Weak`, the engine) only forms references to the
    /// other fields (as std's `Weak::inner`).
    pub(super) value: ManuallyDrop<T>,
    /// Only under loom, as the owned layer's (`owned::block`): every unit
    /// holder reads it just before giving up its unit and the freeing
    /// thread writes it just before the free, so a free not ordered after
    /// every holder's last access is reported as a race.
    #[cfg(percpu_ref_loom)]
    freed: crate::sync::UnsafeCell<()>,
}

impl<T> Block<T> {
    /// After a clone or an upgrade took a reference: counts it toward
    /// promotion, and promotes once there were enough.
    #[inline(always)]
    pub(super) fn count_clone(&self) {
        // ordering-audit: Relaxed: a hint; promotion itself is decided
        // under the switch lock.
        let c = self.clones.load(Ordering::Relaxed);
        if c < PROMOTE_AFTER {
            self.count_clone_slow(c);
        }
    }

    #[inline(never)]
    fn count_clone_slow(&self, c: u32) {
        // mutant shared_never_promoted: the clone count never promotes (a
        // hot value stays in atomic mode: an `Arc` with a larger block).
        if c + 1 < PROMOTE_AFTER || mutated!("shared_never_promoted") {
            // ordering-audit: Relaxed: a hint (lost counts only delay it).
            self.clones.store(c + 1, Ordering::Relaxed);
        } else {
            self.promote();
        }
    }

    /// Switches to per-CPU counting under the engine's management, unless
    /// done; true if the block counts per CPU now. The caller holds a
    /// reference (invariant 4).
    pub(super) fn promote(&self) -> bool {
        // ordering-audit: Relaxed: a hint, as in `count_clone`.
        self.clones.store(PROMOTED, Ordering::Relaxed);
        // SAFETY: the block is heap-allocated and never moves while any
        // handle exists; the engine may keep the ref's address for as long
        // as the count is above zero, and the block outlives that
        // (invariant 3).
        let pref = unsafe { Pin::new_unchecked(&self.pref) };
        if pref.promote_to_managed() {
            // Back-pressure: values made and promoted faster than the engine
            // completes their scans wait here rather than pile up.
            crate::percpu_ref::wait_for_backlog();
        }
        self.pref.is_managed() || self.pref.is_percpu()
    }
}

/// The ref of the block at `p`, without a reference to `T` (which may be
/// being dropped).
///
/// # Safety
///
/// The block at `p` is allocated for `'a` (a unit or a reference).
#[inline(always)]
pub(super) unsafe fn pref<'a, T>(p: *const Block<T>) -> &'a PercpuRef {
    // SAFETY: the caller's promise; only the field is borrowed.
    unsafe { &*std::ptr::addr_of!((*p).pref) }
}

/// `release` for a `Block<T>`: drops `T` and owes the percpu count's
/// allocation unit (also while unwinding from a panic in `T`'s `Drop`).
///
/// # Safety
///
/// `ptr` is a live `Block<T>` whose percpu count just reached zero.
unsafe fn release<T>(ptr: *const ()) {
    let p = ptr.cast::<Block<T>>().cast_mut();
    // SAFETY: the count's unit keeps the block alive until it is paid.
    let pref = unsafe { pref(p) };
    if pref.completing_on_engine() {
        // A promoted value: the engine pays once it no longer touches the
        // ref (it may free the block).
        pref.after_engine_completion(Box::new(settle_owed));
    }
    let _owe = OnDrop(|| {
        owe_unit(Erased {
            ptr,
            func: drop_unit::<T>,
        });
    });
    // SAFETY: the count is zero (this is `release`), once (invariant 2):
    // `T` is alive and no handle remains that could read it. `p` has the
    // block's own provenance (`alloc`'s `Box::into_raw`), writable.
    unsafe { ManuallyDrop::drop(&mut *std::ptr::addr_of_mut!((*p).value)) }
}

/// Drops one allocation unit of a `Block<T>`; the last one frees it.
///
/// # Safety
///
/// `ptr` is a live `Block<T>` made by [`alloc`] and the caller owns one
/// unit, which it gives up; no `PercpuRef` call on the block is running
/// on this thread.
pub(super) unsafe fn drop_unit<T>(ptr: *const ()) {
    let p = ptr.cast::<Block<T>>().cast_mut();
    // A failed model unwinds outside any execution, where loom accesses
    // panic (an abort): leak instead (as `owned::block::drop_unit`).
    #[cfg(percpu_ref_loom)]
    if std::thread::panicking() {
        return;
    }
    // SAFETY: the caller's unit keeps the block alive for this access.
    #[cfg(percpu_ref_loom)]
    unsafe { &(*p).freed }.with(|_| ());
    // mutant shared_unit_put_release_only: the freeing thread acquires
    // nothing (the free may overtake another unit holder's last access).
    #[cfg(not(percpu_ref_mutant = "shared_unit_put_release_only"))]
    let order = Ordering::AcqRel;
    #[cfg(percpu_ref_mutant = "shared_unit_put_release_only")]
    let order = Ordering::Release;
    // SAFETY: the caller's unit keeps the block alive for this access.
    // AcqRel: the last one must see every access made under other units.
    if unsafe { (*p).units.fetch_sub(1, order) } == 1 {
        // SAFETY: that was the last unit: nobody else can reach the block.
        #[cfg(percpu_ref_loom)]
        unsafe { &(*p).freed }.with_mut(|_| ());
        // SAFETY: that was the last unit: nobody else can reach the block,
        // and `T` is gone (invariant 3), which `ManuallyDrop` leaves alone.
        drop(unsafe { Box::from_raw(p) });
        // ordering-audit: Relaxed: a count that models read after joining
        // every thread.
        #[cfg(percpu_ref_loom)]
        crate::owned::block::loom_live_blocks().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Allocates the block for `value`, in atomic mode on `backend`, with one
/// reference (the first `Shared`'s) and the count's unit.
///
/// # Panics
///
/// When `backend` is not available (only loom models choose one).
pub(super) fn alloc<T: Send + 'static>(value: T, backend: Backend) -> NonNull<Block<T>> {
    let slot = Box::into_raw(Box::new(MaybeUninit::<Block<T>>::uninit())).cast::<Block<T>>();
    let callback = release_callback(Erased {
        ptr: slot.cast_const().cast(),
        func: release::<T>,
    });
    let pref = PercpuRef::with_backend(callback, InitFlags::INIT_ATOMIC, backend)
        .unwrap_or_else(|e| panic!("percpu_ref::shared::Shared::new: {e}"));
    // SAFETY: `slot` is a fresh, suitably aligned allocation for `Block<T>`.
    unsafe {
        slot.write(Block {
            pref,
            units: AtomicUsize::new(1),
            clones: AtomicU32::new(0),
            value: ManuallyDrop::new(value),
            #[cfg(percpu_ref_loom)]
            freed: crate::sync::UnsafeCell::new(()),
        });
    }
    // ordering-audit: Relaxed: a count that models read after joining every
    // thread.
    #[cfg(percpu_ref_loom)]
    crate::owned::block::loom_live_blocks().fetch_add(1, Ordering::Relaxed);
    // SAFETY: `Box::into_raw` never returns null.
    unsafe { NonNull::new_unchecked(slot) }
}

/// The block behind a handle.
///
/// # Safety
///
/// The caller's handle holds an allocation unit or a percpu reference.
#[inline(always)]
pub(super) unsafe fn block<'a, T>(p: NonNull<Block<T>>) -> &'a Block<T> {
    // SAFETY: forwarded to the caller.
    unsafe { &*p.as_ptr() }
}

/// The address of the `T` in the block at `p` (alive or not), with the
/// block's provenance, so that `Shared::from_raw` can step back.
///
/// # Safety
///
/// The block at `p` is allocated (the caller holds a unit or a reference).
#[inline(always)]
pub(super) unsafe fn value_ptr<T>(p: NonNull<Block<T>>) -> *const T {
    // SAFETY: `p` points to an allocated `Block<T>`; `addr_of!` reads
    // nothing. `ManuallyDrop` is `repr(transparent)`.
    unsafe { std::ptr::addr_of!((*p.as_ptr()).value) }.cast::<T>()
}

/// The block whose `T` is at `ptr` (from [`value_ptr`]).
///
/// # Safety
///
/// `ptr` came from [`value_ptr`] of a block that is still allocated.
pub(super) unsafe fn block_of<T>(ptr: *const T) -> NonNull<Block<T>> {
    let offset = std::mem::offset_of!(Block<T>, value);
    // SAFETY: `ptr` points `offset` bytes into an allocated block (the
    // caller's promise), so stepping back stays inside it, never null.
    unsafe { NonNull::new_unchecked(ptr.byte_sub(offset).cast_mut().cast()) }
}

/// Puts one reference, then pays a unit its release left owed.
///
/// # Safety
///
/// The caller holds one reference on `p` and gives it up.
#[inline(always)]
pub(super) unsafe fn put_ref<T>(p: NonNull<Block<T>>) {
    // SAFETY: the block is allocated (our reference); no reference is made.
    let pref = unsafe { std::ptr::addr_of!((*p.as_ptr()).pref) };
    // SAFETY: our reference keeps the block alive until the put gives it
    // up; the raw put holds no borrow of the block past that point. The
    // per-CPU path runs no `release`, so only the slow one settles.
    if !unsafe { PercpuRef::try_put_percpu_raw(pref, 1) } {
        // SAFETY: as above.
        unsafe { put_slow(pref) }
    }
}

/// A put that its section did not count, then a unit its release owed.
///
/// # Safety
///
/// As `PercpuRef::put_promotable`.
#[inline(never)]
unsafe fn put_slow(pref: *const PercpuRef) {
    let _settle = settle_guard();
    // SAFETY: forwarded.
    unsafe { PercpuRef::put_promotable(pref) }
}
