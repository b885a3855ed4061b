//! The heap block behind a [`Shared`] and its [`Weak`]s: a state word, the
//! allocation count and `T` (the layout of `Arc`'s block); once promoted,
//! the [`PercpuRef`] the state word points to; `release`, and the
//! block's allocation and free.
//!
//! # Two counts
//!
//! - The **strong count** keeps `T` alive: every `Shared` is one reference
//!   (there is no owner and no base reference of anyone else's). It lives
//!   in the state word until promotion and in the ref after. When it
//!   reaches zero, `T` is dropped.
//! - The **allocation count** (`units`) keeps the block alive: one unit per
//!   `Weak` and one on behalf of the whole strong count while it is above
//!   zero, so a `Shared` needs no unit of its own and a clone is a bare
//!   get. Whoever drops `T` pays the strong count's unit once nothing of
//!   its own touches the block any more: the thread whose drop was the last
//!   in atomic mode, or, once promoted, the grace-period engine after it
//!   let go of the ref (the owned layer's owed-unit slot, `owned::block`).
//!
//! # Two lives of a `Shared`: atomic, then managed
//!
//! A block starts as `Arc`'s does: 16 bytes of counts and `T`, nothing
//! else. The **state word** holds the strong count in its high bits, and in
//! its low bits the clones counted toward promotion:
//!
//! ```text
//!   count (bits 8..)  | PROMOTING (bit 7) | clones (bits 1..=6) | TAGGED (bit 0) = 0
//!   address of the PercpuRef (aligned to 16)                    | TAGGED (bit 0) = 1
//! ```
//!
//! Before promotion a clone adds one to the count and one to the clones in
//! one compare-and-swap; a drop subtracts one from the count, and the drop
//! from one to none drops `T` at once, on its thread, as `Arc`. Both are
//! compare-and-swaps rather than `Arc`'s add, because the word may become
//! an address under them; on one thread that costs `Arc`'s cost. Most
//! shared values are short-lived or cloned a few times, and never allocate
//! more or meet the grace-period engine.
//!
//! The clone that brings the clones to [`PROMOTE_AFTER`] sets `PROMOTING`
//! in the same compare-and-swap (an explicit [`Shared::promote`] sets it
//! alone), and that thread alone **hands the count over**: it makes a
//! `PercpuRef` in atomic mode holding a provisional count larger than the
//! word can hold, swaps the word for the ref's address, tagged (one swap:
//! a compare-and-swap loop could be starved by the other handles), and
//! then puts the provisional count less the count the swap returned. No
//! put in between can take the ref to zero: each gives up a reference
//! that the word counted or that a get on the ref added. Until the swap,
//! the others keep counting in the word (count only: the clones no longer
//! matter); after it, everybody counts on the ref. Then
//! the promoter switches the ref to percpu mode under the engine's
//! management (`PercpuRef::promote_to_managed`, one hold of the switch
//! lock, no grace period), racing drops that meet the ref while it is
//! still atomic (`PercpuRef::put_promotable`). From then on clones and
//! drops are per-CPU and the engine releases the value a few of its
//! rounds after the last drop (`src/percpu_ref/managed.rs`). A promoted
//! value never goes back. On a backend that cannot manage refs (sharded)
//! nothing is handed over: `PROMOTING` stays set and the count stays in
//! the word, as an `Arc`'s.
//!
//! # Unsized values
//!
//! The block is `repr(C)` with `T` last, as `Arc`'s, so a `Block<[U]>` or
//! `Block<str>` is the same block behind a wide pointer: the counts at the
//! same offsets, then the elements at the next multiple of their
//! alignment ([`alloc_slice`], [`block_of_live`]). Nothing above depends
//! on `T`'s size; what needs the wide pointer gets it whole: the handles
//! hold it, and a promoted ref's `release` and the unit it owes carry it
//! in an `ErasedPtr` (two words), so the engine drops `[U]`'s elements
//! and `Box` frees the block with the layout it was allocated with. A
//! `Block<dyn Trait>` (`shared_unsize!`) is a sized `T`'s block whose
//! pointer carries `T`'s vtable: its alignment and size are `T`'s, so
//! the offset and the layout are too.
//!
//! # Invariants
//!
//! 1. `T` is alive while the strong count is above zero; the count is the
//!    number of `Shared`s (plus the engine's stand-in once promoted, and a
//!    `Weak::upgrade`'s reference for as long as it takes).
//! 2. `T` is dropped exactly once, or moved out once instead: by the drop
//!    that takes the word's count from one to zero (`try_unwrap` and
//!    `into_inner` move it out there), by the ref's `release` (which
//!    leaves it to a waiting `into_inner`: below, "`Shared::into_inner` of
//!    a promoted value"), or moved out by a promoted value's `try_unwrap`,
//!    whose election from exactly one in the ref's exact window runs no
//!    `release` (`PercpuRef::with_exact_count`). The count reaches
//!    zero once: nothing adds to a count of zero (an upgrade compares, a
//!    tryget fails at zero), and a word whose count is zero is never
//!    handed over (the promoter holds a reference). The one count that
//!    leaves zero is `Shared::new_cyclic`'s, which starts there before `T`
//!    exists and is stored as one once `T` is written (`publish`).
//! 3. Only the thread that set `PROMOTING` makes the ref and swaps the
//!    word; the word holds the count of every reference not counted on the
//!    ref (none once swapped), so the two never both count one.
//! 4. The block is freed exactly once, by whoever drops the last
//!    allocation unit, after `T` is gone and after the last `PercpuRef`
//!    call that touches it has returned; the ref is freed with it.
//! 5. Promotion happens with a reference held (the promoting handle's), so
//!    the count cannot reach zero during it.

use super::Weak;
use crate::flags::InitFlags;
use crate::owned::block::{owe_unit, settle_guard, settle_owed, OnDrop};
use crate::percpu::Backend;
use crate::percpu_ref::{Erased, ErasedPtr, PercpuRef};
use crate::sync::{AtomicUsize, Ordering};
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::ptr::NonNull;

#[cfg(doc)]
use super::Shared;

/// Clones (and upgrades) counted in the state word after which a value is
/// promoted to per-CPU counting. A value cloned this often is likely shared
/// and hot; one cloned less costs what an `Arc` costs and never allocates
/// more or waits for the engine.
pub const PROMOTE_AFTER: u32 = 64;

/// The state word holds the ref's address, not a count.
const TAGGED: usize = 1;
/// One clone counted toward promotion (bits 1..=6).
const CLONE_ONE: usize = 2;
/// Set with the clone that reached [`PROMOTE_AFTER`] (the carry out of the
/// clones' bits), or by `Shared::promote`: its setter hands the count over.
const PROMOTING: usize = CLONE_ONE * PROMOTE_AFTER as usize;
/// One reference in the word's count (bits 8..).
const ONE: usize = 1 << 8;
/// A clone before `PROMOTING`: one reference and one clone counted.
const CLONE: usize = ONE + CLONE_ONE;
/// The most references the word counts (2^56 - 1 on 64-bit targets); only
/// reachable with `PROMOTING` set on a backend that never hands over.
const MAX_COUNT: usize = usize::MAX / ONE;
/// The hand-over's provisional count on the new ref: more than the word
/// can hold (2^56 on 64-bit targets, within the ref's 2^62 - 1).
const PROVISIONAL: usize = MAX_COUNT + 1;

const _: () = assert!(PROMOTE_AFTER.is_power_of_two() && PROMOTING < ONE && PROMOTING > CLONE_ONE);
// The tag needs the ref's address to be even (it is aligned to 16 bytes).
const _: () = assert!(std::mem::align_of::<PercpuRef>() > TAGGED);

/// What [`Block::take_last`] did.
#[derive(Clone, Copy)]
pub(super) enum Taken {
    /// Not the only reference: nothing changed.
    No,
    /// The word's count, from one to zero.
    InWord,
    /// A promoted value's ref, elected from one to released: `release`
    /// does not run ([`move_out_last`] pays its unit).
    Elected,
}

/// The allocation count while [`Block::is_unique`] holds it locked (as
/// `Arc`'s weak count): a `downgrade` waits, so no `Weak` can appear
/// between its two loads.
pub(super) const UNITS_LOCKED: usize = usize::MAX;

/// The low byte of an untagged word at which the next clone sets
/// `PROMOTING` (the clones' bits all set); it and every larger one (with
/// `PROMOTING`) make [`Block::get`] go out of line.
const LAST_CLONE_BEFORE_PROMOTING: u8 = low_byte(PROMOTING - CLONE_ONE);
const _: () = assert!(PROMOTING < 0x100 && ONE == 0x100);

/// The byte of a state word below the count: `PROMOTING`, the clones and
/// `TAGGED` (one compare of a byte register on `x86_64`).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "the truncation is the point: bits 0..=7"
)]
const fn low_byte(w: usize) -> u8 {
    w as u8
}

/// The references counted in a state word that is not tagged.
#[inline(always)]
fn count(w: usize) -> usize {
    w / ONE
}

/// The ref a tagged state word points to.
///
/// # Safety
///
/// `w` was read from a block's state word, tagged, and the caller holds a
/// reference or an allocation unit (the ref lives as long as the block).
#[inline(always)]
unsafe fn ref_at<'a>(w: usize) -> &'a PercpuRef {
    debug_assert!(w & TAGGED != 0);
    // SAFETY: the caller's promise; the word was published by the
    // hand-over's release and read with acquire.
    unsafe { &*((w & !TAGGED) as *const PercpuRef) }
}

/// The one allocation behind a `Shared` and its `Weak`s. `repr(C)`, with
/// `value` last, as `Arc`'s: the counts come first at fixed offsets, so
/// that a `Block<[T]>` or `Block<str>` (a wide pointer) has them where a
/// `Block<T>` has, and [`block_of`] finds the block from `T`'s address and
/// alignment alone.
#[repr(C)]
pub(super) struct Block<T: ?Sized> {
    /// The strong count and the clones toward promotion, or the ref's
    /// address once promoted (module docs).
    pub(super) state: AtomicUsize,
    /// Allocation units: one per `Weak`, one for the strong count while it
    /// is above zero.
    pub(super) units: AtomicUsize,
    /// Only under loom, where each model chooses (the default, sharded,
    /// never promotes).
    #[cfg(percpu_ref_loom)]
    backend: Backend,
    /// Only under loom, as the owned layer's (`owned::block`): every unit
    /// holder reads it just before giving up its unit and the freeing
    /// thread writes it just before the free, so a free not ordered after
    /// every holder's last access is reported as a race.
    #[cfg(percpu_ref_loom)]
    freed: crate::sync::UnsafeCell<()>,
    /// Not in an `UnsafeCell`, so that handles are covariant in `T` (as
    /// `Arc`'s): `T` is dropped through the block's raw pointer, when no
    /// handle can form a reference to it, and code that may run while it is
    /// dropped (a `Weak`, the engine) only forms references to the other
    /// fields (as std's `Weak::inner`).
    pub(super) value: ManuallyDrop<T>,
}

impl<T: ?Sized> Block<T> {
    /// The backend a promotion uses.
    #[inline]
    #[cfg_attr(
        not(percpu_ref_loom),
        allow(clippy::unused_self, reason = "a field under loom only")
    )]
    fn backend(&self) -> Backend {
        #[cfg(percpu_ref_loom)]
        {
            self.backend
        }
        #[cfg(not(percpu_ref_loom))]
        {
            crate::backend()
        }
    }

    /// The ref once promoted.
    pub(super) fn promoted_ref(&self) -> Option<&PercpuRef> {
        // ordering-audit: kept: Acquire, as `get`'s first load (the ref's
        // publication); no model asks `is_percpu`.
        let w = self.state.load(Ordering::Acquire);
        // SAFETY: tagged; `self` is borrowed from a handle.
        (w & TAGGED != 0).then(|| unsafe { ref_at(w) })
    }

    /// A clone's get: on the ref once promoted, else in the word (counted
    /// toward promotion, and promoting at the threshold). Inlined whole, as
    /// `PercpuRef::get`.
    ///
    /// # Safety
    ///
    /// `p` is the handle's pointer (the block's own provenance, which a
    /// promotion hands to `release`) and the caller holds a reference.
    #[inline(always)]
    pub(super) unsafe fn get(p: NonNull<Self>) {
        // SAFETY: the caller's reference keeps the block alive.
        let this = unsafe { p.as_ref() };
        // ordering-audit: kept: Acquire: a tagged word's ref was made (its
        // plain fields: the counters' base, the release) before the
        // hand-over's release published it, the message-passing pattern (a
        // plain load on x86_64, `ldar` on aarch64). The models cannot show
        // it: loom does not treat a plain field's initialisation as an
        // access, and the ref's atomics carry their own orderings.
        let mut w = this.state.load(Ordering::Acquire);
        if w & TAGGED != 0 {
            // SAFETY: tagged; the caller's reference keeps the block.
            return unsafe { ref_at(w) }.get();
        }
        loop {
            // The clone that carries the clones into `PROMOTING` and every
            // one after it go out of line: one compare of the low byte
            // here, where a test of `PROMOTING` before the compare-and-swap
            // and one of the result after it took two.
            if low_byte(w) >= LAST_CLONE_BEFORE_PROMOTING {
                // SAFETY: the caller's pointer and reference.
                return unsafe { Self::get_at_threshold(p) };
            }
            // Relaxed: a new reference from an existing one (as
            // `Arc::clone`); a failure that finds the word tagged goes to
            // `get_slow`, which loads it again (acquire).
            match this
                .state
                .compare_exchange(w, w + CLONE, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) if now & TAGGED != 0 => return this.get_slow(),
                Err(now) => w = now,
            }
        }
    }

    /// A get at or past the promotion threshold: the clone whose
    /// compare-and-swap sets `PROMOTING` hands the count over; after it,
    /// `get_slow`.
    ///
    /// # Safety
    ///
    /// As [`Block::get`]'s.
    #[cold]
    #[inline(never)]
    unsafe fn get_at_threshold(p: NonNull<Self>) {
        // SAFETY: the caller's reference keeps the block alive.
        let this = unsafe { p.as_ref() };
        loop {
            // ordering-audit: kept: Acquire, as `get`'s first load (the
            // ref's publication); no model clones to the threshold.
            let w = this.state.load(Ordering::Acquire);
            if w & (TAGGED | PROMOTING) != 0 {
                return this.get_slow();
            }
            // Relaxed: as in `get`; the winner of the threshold alone
            // sets `PROMOTING` (invariant 3).
            if this
                .state
                .compare_exchange(w, w + CLONE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                if (w + CLONE) & PROMOTING != 0 {
                    // SAFETY: the caller's pointer and reference.
                    unsafe { Self::promote_claimed(p) };
                }
                return;
            }
        }
    }

    /// A get with `PROMOTING` set or the word tagged: on the ref once the
    /// hand-over is done, else a reference (only) in the word.
    #[inline(never)]
    fn get_slow(&self) {
        loop {
            // ordering-audit: kept: Acquire, as `get`'s first load (the ref's
            // publication); no model clones during a hand-over.
            let w = self.state.load(Ordering::Acquire);
            if w & TAGGED != 0 {
                // SAFETY: tagged; the caller's reference keeps the block.
                return unsafe { ref_at(w) }.get();
            }
            let n = count(w);
            assert!(
                n < MAX_COUNT,
                "percpu_ref::shared::Shared::clone: the value has {n} handles, the most it can count"
            );
            // Relaxed: as in `get`; a failure loads again.
            if self
                .state
                .compare_exchange(w, w + ONE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// A `Weak::upgrade`'s get: fails once the count reached zero.
    /// The caller holds an allocation unit; only the block's atomics are
    /// borrowed (`T` may be being dropped).
    ///
    /// # Safety
    ///
    /// `p` is allocated for the call (the caller's unit).
    #[inline]
    pub(super) unsafe fn tryget(p: NonNull<Self>) -> bool {
        // SAFETY: the caller's unit; only the field is borrowed.
        let state = unsafe { &(*p.as_ptr()).state };
        loop {
            // Acquire: the ref's publication, as `get`'s first load, and
            // `T`'s by `Shared::new_cyclic` (`publish`).
            let w = state.load(Ordering::Acquire);
            if w & TAGGED != 0 {
                // Settles a unit in case a failed tryget's give-back ran
                // `release` (it cannot here: nothing revives a `Shared`'s
                // count at zero; the guard costs one thread-local load).
                let _settle = settle_guard();
                // SAFETY: tagged, and the caller's unit keeps the block.
                return unsafe { ref_at(w) }.tryget();
            }
            let n = count(w);
            if n == 0 {
                return false;
            }
            assert!(
                n < MAX_COUNT,
                "percpu_ref::shared::Weak::upgrade: the value has {n} handles, the most it can count"
            );
            let next = if w & PROMOTING != 0 {
                w + ONE
            } else {
                w + CLONE
            };
            // Relaxed: the load above acquired the count it compares, and
            // with it `T` (`new_cyclic` writes `T` before its release store
            // of the first count, and every later change of the count is a
            // read-modify-write, in that store's release sequence); a
            // failure loads again.
            if state
                .compare_exchange(w, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                if w & PROMOTING == 0 && next & PROMOTING != 0 {
                    // SAFETY: the reference just taken keeps `T` alive: the
                    // whole block may be borrowed now.
                    unsafe { Self::promote_claimed(p) };
                }
                return true;
            }
        }
    }

    /// Whether the caller's handle is the value's only reference and no
    /// `Weak` exists, as `Arc::is_unique`: exact in the word; false once
    /// promoted (the count is per CPU: knowing it exactly takes a grace
    /// period). The caller holds a reference and `&mut` of its handle, so
    /// no clone of it can run meanwhile.
    pub(super) fn is_unique(&self) -> bool {
        // The allocation count locked first: once it is, no `Weak` exists
        // and none can be made (`downgrade` waits), so no upgrade can add to
        // the count between the check below and the caller's use of `T`.
        // Acquire: a `Weak` dropped before this read its `T` under an
        // upgrade; its release (the unit's `fetch_sub`) orders that read
        // before the caller's writes.
        // mutant shared_get_mut_ignores_weak: no look at the allocation
        // count (a `Weak` of a value whose other handles are gone upgrades
        // and reads `T` while the caller writes it).
        if mutated!("shared_get_mut_ignores_weak") {
            // ordering-audit: mutant only (shared_get_mut_ignores_weak).
            let w = self.state.load(Ordering::Acquire);
            return w & TAGGED == 0 && count(w) == 1;
        }
        if self
            .units
            .compare_exchange(1, UNITS_LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Acquire: the other handles' drops released their reads of `T`
        // with their compare-and-swaps on the word (as `Arc`'s strong count).
        // mutant shared_get_mut_check_relaxed: the check reads the word
        // relaxed (another handle's read of `T` before its drop is not
        // ordered before the caller's writes).
        #[cfg(not(percpu_ref_mutant = "shared_get_mut_check_relaxed"))]
        let check = Ordering::Acquire;
        #[cfg(percpu_ref_mutant = "shared_get_mut_check_relaxed")]
        let check = Ordering::Relaxed;
        let w = self.state.load(check);
        if w & TAGGED != 0 {
            // Promoted (for good): the count is per CPU. Unlocked first
            // (no `Weak` waits through a grace period); the exact check
            // locks it again once the count is exact.
            // ordering-audit: Relaxed: nothing was checked under this hold.
            self.units.store(1, Ordering::Relaxed);
            // SAFETY: tagged; the caller's reference keeps the block and
            // its ref.
            return self.is_unique_promoted(unsafe { ref_at(w) });
        }
        let unique = count(w) == 1;
        // ordering-audit: kept: Release (as `Arc::is_unique`'s unlock): the
        // check's load above stays before the unlock, so it cannot read a
        // drop by a handle whose `downgrade` read the unlocked count (and
        // whose `Weak` may upgrade and read `T` under the caller's `&mut`).
        // That is the load-buffering shape, a load reading a store that
        // follows it causally, which loom does not model (it never returns
        // a value stored later in its schedule).
        self.units.store(1, Ordering::Release);
        unique
    }

    /// [`is_unique`](Self::is_unique) of a promoted value: `Arc`'s check
    /// (the allocation count locked, then the strong count read), made in
    /// the ref's exact window: atomic mode, after a grace period, under
    /// its switch lock (`PercpuRef::with_exact_count`), which then hands
    /// the ref back to the engine. False on the engine's thread (a release
    /// or confirm there may not wait for a grace period of its own: the
    /// engine may be what it waits on) and if the kernel refused the grace
    /// period.
    #[cold]
    #[inline(never)]
    fn is_unique_promoted(&self, r: &PercpuRef) -> bool {
        // ordering-audit: Relaxed: a first look (a `Weak` exists now, or a
        // taker's unit: not unique at this instant); decided below.
        if self.units.load(Ordering::Relaxed) != 1 || crate::grace::on_engine() {
            return false;
        }
        // SAFETY: the ref is boxed and never moves until the block is freed.
        let pref = unsafe { Pin::new_unchecked(r) };
        pref.with_exact_count("shared::Shared::get_mut", |exact| {
            // As above: locked, so that no `Weak` upgrades between the
            // count's read and the caller's use of `T`.
            // mutant shared_exact_ignores_weak: the promoted check reads the
            // count without locking the allocation count (an upgrade through
            // a `Weak` that is then dropped goes unseen).
            if mutated!("shared_exact_ignores_weak") {
                return exact.is_one();
            }
            // ordering-audit: kept: Acquire, as `Arc::is_unique`'s: the
            // `Weak` whose drop this reads may have upgraded meanwhile (a
            // get and a put on the count); acquired, the count's load below
            // cannot read a value from before them, which would let the
            // upgraded handle's read of `T` race the caller's write. No
            // model finds that stale read within its bounds.
            if self
                .units
                .compare_exchange(1, UNITS_LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
            let unique = exact.is_one();
            // ordering-audit: kept: Release, as the unlock above (the
            // load-buffering shape that loom does not model).
            self.units.store(1, Ordering::Release);
            unique
        })
        .unwrap_or(false)
    }

    /// Takes the strong count from one to zero if the caller's handle is
    /// the value's only reference, as `Arc::try_unwrap`: `T` is then the
    /// caller's to move out, and the caller owes the strong count's unit
    /// ([`move_out_last`] does both). A `Weak` cannot stop it: its
    /// upgrades fail from the zero on. Once promoted, the count is taken in
    /// the ref's exact window ([`take_last_promoted`](Self::take_last_promoted)).
    pub(super) fn take_last(&self) -> Taken {
        // ordering-audit: Relaxed: a first read, checked by the
        // compare-and-swap.
        let w = self.state.load(Ordering::Relaxed);
        if w & TAGGED != 0 {
            // SAFETY: tagged; the caller's reference keeps the block and
            // its ref.
            return if Self::take_last_promoted(unsafe { ref_at(w) }) {
                Taken::Elected
            } else {
                Taken::No
            };
        }
        if count(w) != 1 {
            return Taken::No;
        }
        // mutant shared_take_last_by_store: the count is zeroed by a store
        // after the load (an upgrade in between reads `T` after it was
        // moved out, and its drop takes the count below zero).
        if mutated!("shared_take_last_by_store") {
            // ordering-audit: kept: only the mutant's load, as the
            // compare-and-swap's acquire.
            let w = self.state.load(Ordering::Acquire);
            if count(w) != 1 {
                return Taken::No;
            }
            // ordering-audit: Relaxed: only the mutant's store.
            self.state.store(w - ONE, Ordering::Relaxed);
            return Taken::InWord;
        }
        // Acquire: the other handles' drops released their reads of `T`
        // with their compare-and-swaps on the word (as `Arc::try_unwrap`'s
        // fence). One try: with one reference, only an upgrade or a
        // promotion of someone else's handle can change the word, and
        // either means the count is no longer one.
        // mutant shared_take_last_relaxed: the compare-and-swap acquires
        // nothing (another handle's read of `T` before its drop is not
        // ordered before the caller's use of the value it moved out).
        #[cfg(not(percpu_ref_mutant = "shared_take_last_relaxed"))]
        let order = Ordering::Acquire;
        #[cfg(percpu_ref_mutant = "shared_take_last_relaxed")]
        let order = Ordering::Relaxed;
        match self
            .state
            .compare_exchange(w, w - ONE, order, Ordering::Relaxed)
        {
            Ok(_) => Taken::InWord,
            Err(_) => Taken::No,
        }
    }

    /// [`take_last`](Self::take_last) of a promoted value: in the ref's
    /// exact window, the election from exactly one reference (the
    /// caller's) to released, without `release` (the caller moves `T`
    /// out instead); the ref stays dead, and the block frees it. False on
    /// the engine's thread and if the kernel refused the grace period (as
    /// [`is_unique_promoted`](Self::is_unique_promoted)).
    #[cold]
    #[inline(never)]
    fn take_last_promoted(r: &PercpuRef) -> bool {
        if crate::grace::on_engine() {
            return false;
        }
        // SAFETY: the ref is boxed and never moves until the block is freed.
        let pref = unsafe { Pin::new_unchecked(r) };
        pref.with_exact_count("shared::Shared::try_unwrap", |exact| {
            // mutant shared_exact_take_by_check: the promoted election is a
            // check of the count and no compare-and-swap (an upgrade
            // through a `Weak` after the check holds a value moved out).
            #[cfg(percpu_ref_mutant = "shared_exact_take_by_check")]
            return exact.is_one() && exact.mark_elected();
            #[cfg(not(percpu_ref_mutant = "shared_exact_take_by_check"))]
            exact.elect_last()
        })
        .unwrap_or(false)
    }

    /// The strong count, as `Arc::strong_count`: exact in the word (a
    /// snapshot); once promoted, a racy sum of the ref's counts, exact
    /// only while no handle is cloned or dropped (the engine's stand-in
    /// not counted). From a `Weak` too: only the word (and the ref, which
    /// lives as long as the block) is borrowed, as `T` may be being
    /// dropped.
    ///
    /// # Safety
    ///
    /// The caller holds a reference or an allocation unit of `p`.
    pub(super) unsafe fn strong_count(p: NonNull<Self>) -> usize {
        // SAFETY: the caller's reference or unit; only the field is borrowed.
        let state = unsafe { &(*p.as_ptr()).state };
        // ordering-audit: kept: Acquire, as `get`'s first load (the ref's
        // publication); no model asks `strong_count`.
        let w = state.load(Ordering::Acquire);
        if w & TAGGED == 0 {
            return count(w);
        }
        // SAFETY: tagged; the caller's reference or unit keeps the block,
        // and the ref with it (its per-CPU counters are freed with it).
        let r = unsafe { ref_at(w) };
        let n = r.count_snapshot();
        let n = if r.is_managed() {
            n.saturating_sub(1)
        } else {
            n
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The allocation units less the strong count's, as `Arc::weak_count`:
    /// a snapshot, 0 while the count is locked by
    /// [`is_unique`](Self::is_unique) (there are no `Weak`s then). Exact
    /// while the strong count is above zero (it holds one unit); a `Weak`
    /// asks only then.
    ///
    /// # Safety
    ///
    /// The caller holds a reference or an allocation unit of `p`.
    pub(super) unsafe fn weak_count(p: NonNull<Self>) -> usize {
        // SAFETY: the caller's reference or unit; only the field is
        // borrowed (`T` may be being dropped under a `Weak`).
        let units = unsafe { &(*p.as_ptr()).units };
        // ordering-audit: Relaxed: a snapshot, as `Arc::weak_count`'s.
        match units.load(Ordering::Relaxed) {
            UNITS_LOCKED => 0,
            u => u.saturating_sub(1),
        }
    }

    /// Ends the promotion hold of a value made uninitialised ([`HELD`]) if
    /// the caller's handle is its only one and no `Weak` exists (the check
    /// of `get_mut`): nobody else can reach the word, and the value will be
    /// promoted as any other. A value shared before stays held: another
    /// handle, or one a `Weak` upgrades to, may still be the
    /// `MaybeUninit` one whose clone would promote it.
    ///
    /// False if the value was promoted as a `MaybeUninit` (one made with
    /// `Shared::new`, not `new_uninit`): its word holds the ref's address,
    /// which this leaves alone, and its ref's `release` drops nothing.
    pub(super) fn end_promotion_hold(&self) -> bool {
        if !self.is_unique() {
            // Relaxed: a hint for the caller, which makes the value's
            // count exact itself before it relies on it (`try_unwrap`).
            return self.state.load(Ordering::Relaxed) & TAGGED == 0;
        }
        // Relaxed: no other handle or `Weak` exists to read or write the
        // word; whatever the next one is made from (this handle) is ordered
        // after this on its own thread or by the send that moves it.
        let w = self.state.load(Ordering::Relaxed);
        if w & TAGGED != 0 {
            return false;
        }
        // Relaxed: as above.
        self.state.store(w & !PROMOTING, Ordering::Relaxed);
        true
    }

    /// Switches to per-CPU counting under the engine's management, unless
    /// done; true if the block counts per CPU now (false while another
    /// thread is handing the count over). The caller holds a reference
    /// (invariant 5).
    ///
    /// # Safety
    ///
    /// As [`Block::get`]'s.
    pub(super) unsafe fn promote(p: NonNull<Self>) -> bool {
        // SAFETY: the caller's reference keeps the block alive.
        let this = unsafe { p.as_ref() };
        if this.backend() != Backend::Rseq {
            return false;
        }
        loop {
            let w = this.state.load(Ordering::Acquire);
            if w & TAGGED != 0 {
                // SAFETY: tagged; the caller's reference keeps the block.
                return Self::manage(unsafe { ref_at(w) });
            }
            if w & PROMOTING != 0 {
                // Another handle is handing the count over (not per CPU
                // yet: no wait for a thread that may be preempted).
                return false;
            }
            if this
                .state
                .compare_exchange(w, w | PROMOTING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: the caller's pointer and reference.
                return unsafe { Self::promote_claimed(p) };
            }
        }
    }

    /// Hands the word's count over to a new ref and has the engine manage
    /// it; called by the thread that set `PROMOTING` (invariant 3), which
    /// holds a reference. True if the block counts per CPU now.
    ///
    /// # Safety
    ///
    /// `p` is a handle's pointer (the block's own provenance: `release`
    /// drops `T` through it) and the caller holds a reference.
    #[inline(never)]
    unsafe fn promote_claimed(p: NonNull<Self>) -> bool {
        // SAFETY: the caller's reference keeps the block alive.
        let this = unsafe { p.as_ref() };
        let backend = this.backend();
        // mutant shared_never_promoted: the clone count never promotes (a hot
        // value stays in the word: an `Arc`).
        if backend != Backend::Rseq || mutated!("shared_never_promoted") {
            // No per-CPU sections to scan: stay in the word, as an `Arc`.
            return false;
        }
        let release = Erased {
            ptr: ErasedPtr::new(p.as_ptr().cast_const()),
            func: release::<T>,
        };
        // SAFETY: `release::<T>` of this block, which outlives its ref
        // (invariant 4) and whose `T` is alive until the ref's count reaches
        // zero (invariant 1).
        let made =
            unsafe { PercpuRef::with_erased_release(release, InitFlags::INIT_ATOMIC, backend) }
                .unwrap_or_else(|e| panic!("percpu_ref::shared::Shared::promote: {e}"));
        let r: *mut PercpuRef = Box::into_raw(Box::new(made));
        // SAFETY: a fresh allocation, never moved until freed with the block.
        let pref = unsafe { Pin::new_unchecked(&*r) };
        // A provisional count above anything the word can hold, so that no
        // put between the swap and the adjustment below can take the ref to
        // zero (each of them gives up a reference the word counted or a get
        // on the ref added); nobody else sees the ref until the swap.
        pref.get_many(PROVISIONAL);
        let tagged = r as usize | TAGGED;
        // mutant shared_handoff_by_store: the hand-over reads the word and
        // then stores the address over whatever it holds (a clone or drop
        // that got in between is lost: the value is dropped while held, or
        // never).
        let w = if mutated!("shared_handoff_by_store") {
            // ordering-audit: Relaxed: only the mutant's read.
            let w = this.state.load(Ordering::Relaxed);
            // ordering-audit: kept: only the mutant's store, as the swap.
            this.state.store(tagged, Ordering::Release);
            w
        } else {
            // One swap, not a compare-and-swap loop, which the other
            // handles' clones and drops in the word could starve (seen in an
            // emulated guest). Release: publishes the ref. No acquire: the
            // drops counted in the word before it released their accesses to
            // `T` with their own compare-and-swaps, and this swap continues
            // their release sequence, so every acquire load that reads the
            // tagged word (the promoter's own drop's, at the latest, which
            // the ref's release follows) synchronises with them.
            this.state.swap(tagged, Ordering::Release)
        };
        let n = count(w);
        debug_assert!(n >= 1 && w & TAGGED == 0, "the promoter holds a reference");
        // From 1 + PROVISIONAL (and whatever came since) to the word's
        // count: never zero, the promoter's own reference stays.
        pref.put_many(1 + PROVISIONAL - n);
        Self::manage(pref.get_ref())
    }

    /// Has the engine manage the (handed-over) ref; true if it counts per
    /// CPU now.
    fn manage(r: &PercpuRef) -> bool {
        // SAFETY: the ref is boxed and never moves until the block is freed;
        // the engine may keep its address for as long as the count is above
        // zero, and the block outlives that (invariant 4).
        let pref = unsafe { Pin::new_unchecked(r) };
        if pref.promote_to_managed() {
            // Back-pressure: values made and promoted faster than the engine
            // completes their scans wait here rather than pile up.
            crate::percpu_ref::wait_for_backlog();
        }
        r.is_managed() || r.is_percpu()
    }
}

/// A handle's drop: on the ref once promoted, else one compare-and-swap on
/// the word, and the last drops `T` here.
///
/// # Safety
///
/// The caller holds one reference on `p` and gives it up.
#[inline(always)]
pub(super) unsafe fn put_ref<T: ?Sized>(p: NonNull<Block<T>>) {
    // SAFETY: forwarded.
    match unsafe { put_in_word(p) } {
        // SAFETY: tagged; our reference keeps the ref until the put.
        InWord::Promoted(pref) => unsafe { put_on_ref(pref) },
        InWord::Others => {}
        // SAFETY: ours was the last reference (invariant 2).
        InWord::Last => unsafe { release_in_word(p) },
    }
}

/// What [`put_in_word`] did.
pub(super) enum InWord {
    /// Nothing: the word holds this ref's address, and the reference is
    /// still the caller's, to give up on the ref.
    Promoted(*const PercpuRef),
    /// Gave the reference up; others remain.
    Others,
    /// Gave up the last reference: `T` is the caller's to drop
    /// ([`release_in_word`]) or move out ([`move_out_last`]), then the
    /// strong count's unit.
    Last,
}

/// Gives up the caller's reference in the word (one compare-and-swap),
/// unless the word holds the ref's address. Inlined whole into `put_ref`.
///
/// # Safety
///
/// The caller holds one reference on `p`.
#[inline(always)]
pub(super) unsafe fn put_in_word<T: ?Sized>(p: NonNull<Block<T>>) -> InWord {
    // Only the word is borrowed across the count: once it is given up,
    // another thread may free the block.
    // SAFETY: our reference keeps the block allocated until the put.
    let state = unsafe { &(*p.as_ptr()).state };
    // ordering-audit: kept: Acquire, as `get`'s first load (the ref's
    // publication), and the acquire that a drop after a hand-over needs
    // (see the swap in `promote_claimed`).
    let mut w = state.load(Ordering::Acquire);
    loop {
        if w & TAGGED != 0 {
            return InWord::Promoted((w & !TAGGED) as *const PercpuRef);
        }
        debug_assert!(count(w) >= 1, "a Shared's drop with the count at zero");
        // ordering-audit: kept: AcqRel: release our accesses to `T`, and the
        // last drop acquires everyone's (as `Arc::drop`'s release and
        // fence). The models cannot show the acquire: the load before this
        // one acquires the value it replaces whenever it is the value that
        // load read, and only an upgrade and a drop in between that restore
        // it (three more steps) make them differ.
        match state.compare_exchange(w, w - ONE, Ordering::AcqRel, Ordering::Relaxed) {
            // `count(w) == 1`, in one comparison (`w` is not tagged).
            Ok(_) if w < 2 * ONE => return InWord::Last,
            Ok(_) => return InWord::Others,
            // ordering-audit: kept: Acquire, as the first load (a failure
            // is contention: the load is cheap beside it).
            Err(_) => w = state.load(Ordering::Acquire),
        }
    }
}

/// A put on the ref: per CPU where the section counts it, else the slow
/// path, which may release.
///
/// # Safety
///
/// `pref` is the block's ref and the caller gives up a reference on it.
#[inline(never)]
unsafe fn put_on_ref(pref: *const PercpuRef) {
    // SAFETY: our reference keeps the ref alive until the put gives it up;
    // the raw put holds no borrow of it past that point. The per-CPU path
    // runs no `release`, so only the slow one settles.
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

/// The word's count reached zero: drops `T` on this thread, then the strong
/// count's allocation unit (also while unwinding from a panic in `T`'s
/// `Drop`). No `PercpuRef` call is running on the block.
///
/// # Safety
///
/// `p` is live and the caller's drop took its count to zero.
#[inline(never)]
unsafe fn release_in_word<T: ?Sized>(p: NonNull<Block<T>>) {
    let _unit = OnDrop(move || {
        // SAFETY: the strong count's unit, given up once, after `T` is gone;
        // the count reached zero in the word (invariant 2).
        unsafe { drop_count_unit(p) }
    });
    // SAFETY: the count is zero, once (invariant 2): `T` is alive and no
    // handle remains that could read it. `p` has the block's own provenance
    // (`alloc`'s `Box::into_raw`), writable.
    unsafe { ManuallyDrop::drop(&mut *std::ptr::addr_of_mut!((*p.as_ptr()).value)) }
}

/// The ref's `release` for a `Block<T>` (promoted): drops `T` and owes the
/// strong count's allocation unit (also while unwinding from a panic in
/// `T`'s `Drop`).
///
/// # Safety
///
/// `erased` is a live, promoted `Block<T>`'s pointer whose ref's count
/// just reached zero.
unsafe fn release<T: ?Sized>(erased: ErasedPtr) {
    // SAFETY: `promote_claimed` erased a handle's `*const Block<T>`.
    let p = unsafe { erased.get::<Block<T>>() }.cast_mut();
    // SAFETY: the count's unit keeps the block alive until it is paid;
    // only the word is borrowed.
    let w = unsafe { &(*p).state }.load(Ordering::Relaxed);
    // SAFETY: a release of the ref: the word holds its address (the ref
    // was made by the thread that stored it, which this one follows).
    let pref = unsafe { ref_at(w) };
    if pref.completing_on_engine() {
        // A promoted value: the engine pays once it no longer touches the
        // ref (it may free the block).
        pref.after_engine_completion(Box::new(settle_owed));
    }
    let _owe = OnDrop(|| {
        owe_unit(Erased {
            ptr: erased,
            func: drop_erased_unit::<T>,
        });
    });
    if leave_to_taker(pref) {
        return;
    }
    // SAFETY: the count is zero (this is `release`), once (invariant 2):
    // `T` is alive and no handle remains that could read it. `p` has the
    // block's own provenance (`alloc`'s `Box::into_raw`), writable.
    unsafe { ManuallyDrop::drop(&mut *std::ptr::addr_of_mut!((*p).value)) }
}

// ----- `Shared::into_inner` of a promoted value ------------------------------
//
// Only the engine learns which put of a promoted value was the last, after
// a grace period, so `into_inner` asks it: the caller registers as a
// *taker* in the ref's layer word, gives up its reference, and waits for
// the engine ([`crate::flush`], which runs every release of a value whose
// last put came before it). A `release` that finds a taker registered
// leaves `T` in the block (`ORPHANED`) instead of dropping it; the first
// taker to leave after that takes it. So:
//
// - `T` is dropped once or taken once: `release` orphans it only while a
//   taker is registered, in the same read-modify-write of the word as its
//   look, and every taker leaves with a read-modify-write that takes an
//   orphaned `T`;
// - if every handle goes through `into_inner`, exactly one gets `T`: the
//   last put is some taker's, and that taker's flush returns only after the
//   release, which finds it still registered;
// - a taker holds an allocation unit of its own (a `Weak`) until it has
//   left, so the block, its ref and an orphaned `T` outlive its put.
//
// The registration needs no ordering of its own: it comes before the
// taker's put, and the protocol orders every access before a put before
// the release (the promise that lets `release` drop `T`).

/// Set in the layer word by a `release` that left `T` to a taker.
const ORPHANED: usize = 1;
/// One taker registered in the layer word.
const TAKER: usize = 2;

/// `release`'s question: does an `into_inner` wait for the value? Then `T`
/// is left in the block for it (true), not dropped.
fn leave_to_taker(pref: &PercpuRef) -> bool {
    // mutant shared_release_ignores_takers: `release` drops `T` whether or
    // not an `into_inner` waits for it (when every handle goes through
    // `into_inner`, none gets `T`).
    if mutated!("shared_release_ignores_takers") {
        return false;
    }
    // SAFETY: a `Shared`'s ref is made by `with_erased_release`.
    let word = unsafe { pref.layer_word() };
    // ordering-audit: kept: Release: the taker that takes `T` (its acquire
    // in `leave_as_taker`) sees every access that this release follows, as
    // the drop would have. The models cannot show it: their releases run
    // on the engine, and the taker's wait for the engine (`flush`, a lock
    // the engine's completion released) orders them as well; this pair
    // orders a release run off the engine, by a put that found the ref in
    // atomic mode. Relaxed failure: no taker, `T` is dropped here.
    word.fetch_update(Ordering::Release, Ordering::Relaxed, |v| {
        (v >= TAKER).then_some(v | ORPHANED)
    })
    .is_ok()
}

/// [`Shared::into_inner`] of a promoted value: registers as a taker, gives
/// up the caller's reference, waits for the engine to release the value if
/// that was its last reference, and moves `T` out if the release left it.
///
/// # Safety
///
/// `p`'s word is tagged, holding `pref`; the caller gives up one reference
/// on it and `unit` holds one allocation unit of it.
#[cold]
pub(super) unsafe fn into_inner_promoted<T>(
    p: NonNull<Block<T>>,
    pref: *const PercpuRef,
    unit: Weak<T>,
) -> Option<T> {
    if crate::grace::on_engine() {
        // SAFETY: the caller's reference, given up here (nothing is lost).
        unsafe { put_on_ref(pref) };
        panic!(
            "percpu_ref::shared::Shared::into_inner of a promoted value on the grace-period \
             engine's thread (in a deferred release or confirm): it would wait for itself"
        );
    }
    // SAFETY: `unit` keeps the block, and its ref, until it is dropped;
    // a `Shared`'s ref is made by `with_erased_release`.
    let word = unsafe { (*pref).layer_word() };
    // ordering-audit: Relaxed: ordered before the put below, which the
    // release follows (module comment above).
    word.fetch_add(TAKER, Ordering::Relaxed);
    let taker = OnDrop(|| {
        // A panic while waiting: leave, and drop `T` if it was left to us.
        if leave_as_taker(word) {
            // SAFETY: as the read below.
            drop(unsafe { std::ptr::read(value_ptr(p)) });
        }
    });
    // SAFETY: the caller's reference, given up once.
    unsafe { put_on_ref(pref) };
    // mutant shared_into_inner_no_flush: the taker leaves without waiting
    // for the engine (two last handles' `into_inner`s may both miss `T`).
    if !mutated!("shared_into_inner_no_flush") {
        crate::flush();
    }
    std::mem::forget(taker);
    let took = leave_as_taker(word);
    let value = took.then(|| {
        // SAFETY: `release` left `T` in the block, once, and we took it
        // (`ORPHANED` cleared): nobody else reads or drops it; `unit` keeps
        // the block. `value_ptr` has the block's own provenance.
        unsafe { std::ptr::read(value_ptr(p)) }
    });
    drop(unit);
    value
}

/// A taker leaves: true if it takes an orphaned `T`.
fn leave_as_taker(word: &AtomicUsize) -> bool {
    // ordering-audit: kept: Acquire: the release that orphaned `T` (its
    // release read-modify-write), and with it every access to `T` before
    // the last put; the models cannot show it (see `leave_to_taker`).
    let prev = word
        .fetch_update(Ordering::Acquire, Ordering::Relaxed, |v| {
            Some((v - TAKER) & !ORPHANED)
        })
        .unwrap_or_else(|v| v);
    prev & ORPHANED != 0
}

/// Drops the strong count's allocation unit once the count reached zero
/// in the word and `T` is gone (dropped by the last drop, or moved out by
/// [`Block::take_last`]'s caller); the last unit frees the block.
///
/// # Safety
///
/// The word's count reached zero (it was never handed over), `T` is gone,
/// and the unit is given up once.
#[inline(always)]
unsafe fn drop_count_unit<T: ?Sized>(p: NonNull<Block<T>>) {
    // SAFETY: the count reached zero in the word, which was never handed
    // over (invariant 2): no ref to free; the unit is the caller's.
    unsafe { drop_unit_of(p, false) }
}

/// Moves `T` out of a block whose strong count the caller took from one
/// to zero, then gives up the strong count's unit: `how` is
/// [`Taken::InWord`] for the word's compare-and-swap (`try_unwrap`,
/// `into_inner`), [`Taken::Elected`] for a promoted value's election
/// (`release` never runs, so the last unit frees the ref with the block).
///
/// # Safety
///
/// The caller took the count to zero, once, as `how` says (not
/// [`Taken::No`]), and its `PercpuRef` call, if any, has returned.
pub(super) unsafe fn move_out_last<T>(p: NonNull<Block<T>>, how: Taken) -> T {
    debug_assert!(
        !matches!(how, Taken::No),
        "move_out_last of a count not taken"
    );
    // SAFETY: the count reached zero, once (invariant 2): `T` is alive,
    // nobody else can reach it (upgrades fail at zero, and no `release`
    // runs after an election), and it is moved out once. `value_ptr` has
    // the block's own provenance.
    let value = unsafe { std::ptr::read(value_ptr(p)) };
    // SAFETY: `T` was moved out: the strong count's unit is ours to give
    // up, once (after the read: the last unit frees the block). A word
    // whose count reached zero was never handed over; an elected ref is
    // touched by nobody any more (its management ended in the window).
    unsafe {
        drop_unit_of(p, matches!(how, Taken::Elected));
    }
    value
}

/// Drops one allocation unit of a `Block<T>`; the last one frees it (and
/// its ref).
///
/// # Safety
///
/// `p` is a live block (a handle's pointer) and the caller owns one unit,
/// which it gives up; no `PercpuRef` call on the block is running on this
/// thread.
pub(super) unsafe fn drop_unit<T: ?Sized>(p: NonNull<Block<T>>) {
    // SAFETY: forwarded.
    unsafe { drop_unit_of(p, true) }
}

/// [`drop_unit`] of a unit that `release` owed (`Erased`).
///
/// # Safety
///
/// As [`drop_unit`], for the handle's pointer that `erased` was made from.
unsafe fn drop_erased_unit<T: ?Sized>(erased: ErasedPtr) {
    // SAFETY: the caller's promise.
    let p = unsafe { erased.get::<Block<T>>() }.cast_mut();
    // SAFETY: as above; a handle's pointer is never null.
    unsafe { drop_unit(NonNull::new_unchecked(p)) }
}

/// [`drop_unit`], where `may_be_promoted` is false when the caller knows
/// the word was never handed over (its count reached zero in the word):
/// the last unit then frees the block without looking for a ref.
///
/// # Safety
///
/// As [`drop_unit`]; the word is not tagged if `may_be_promoted` is false.
#[inline(always)]
unsafe fn drop_unit_of<T: ?Sized>(p: NonNull<Block<T>>, may_be_promoted: bool) {
    let p = p.as_ptr();
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
    let (order, sole) = (Ordering::AcqRel, Ordering::Acquire);
    #[cfg(percpu_ref_mutant = "shared_unit_put_release_only")]
    let (order, sole) = (Ordering::Release, Ordering::Relaxed);
    // SAFETY: the caller's unit keeps the block alive for these accesses.
    let units = unsafe { &(*p).units };
    // The sole unit (no `Weak`, the usual case) needs no write: nobody can
    // make another without holding one or a `Shared`. Acquire / AcqRel: the
    // last one must see every access made under other units.
    if units.load(sole) == 1 || units.fetch_sub(1, order) == 1 {
        // SAFETY: that was the last unit: nobody else can reach the block.
        #[cfg(percpu_ref_loom)]
        unsafe { &(*p).freed }.with_mut(|_| ());
        if may_be_promoted {
            // SAFETY: that was the last unit: nobody else can reach the block.
            let w = unsafe { &(*p).state }.load(Ordering::Relaxed);
            if w & TAGGED != 0 {
                // SAFETY: the ref was boxed by the hand-over, and nothing
                // touches it any more (invariant 4).
                drop(unsafe { Box::from_raw((w & !TAGGED) as *mut PercpuRef) });
            }
        }
        // SAFETY: as above; `T` is gone (invariant 4), which `ManuallyDrop`
        // leaves alone.
        drop(unsafe { Box::from_raw(p) });
        // ordering-audit: Relaxed: a count that models read after joining
        // every thread.
        #[cfg(percpu_ref_loom)]
        crate::owned::block::loom_live_blocks().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Allocates the block for `value`, with one reference (the first
/// `Shared`'s) and the count's unit: `Arc::new`'s work.
pub(super) fn alloc<T: Send + 'static>(
    value: T,
    #[cfg(percpu_ref_loom)] backend: Backend,
) -> NonNull<Block<T>> {
    let p = alloc_counts::<T>(
        ONE,
        #[cfg(percpu_ref_loom)]
        backend,
    );
    // SAFETY: a fresh block that nobody else can reach yet; only the field
    // is written, with the block's own provenance.
    unsafe { std::ptr::addr_of_mut!((*p.as_ptr()).value).write(ManuallyDrop::new(value)) };
    p
}

/// The state word of a value made uninitialised (`Shared::new_uninit`):
/// one reference, and `PROMOTING` set with nobody handing anything over,
/// so that it is not promoted before `assume_init` ends the hold
/// ([`Block::end_promotion_hold`]): the ref's erased `release` would be
/// `MaybeUninit<T>`'s, which drops nothing, for good. Clones count in the
/// word meanwhile, as on a backend that never promotes.
const HELD: usize = ONE | PROMOTING;

/// Allocates the block of a `MaybeUninit<T>` with one reference, the
/// count's unit and promotion held ([`HELD`]).
pub(super) fn alloc_held<T: Send + 'static>() -> NonNull<Block<std::mem::MaybeUninit<T>>> {
    alloc_counts::<std::mem::MaybeUninit<T>>(
        HELD,
        #[cfg(percpu_ref_loom)]
        crate::backend(),
    )
}

/// [`alloc_held`] for a slice of `len` elements.
pub(super) fn alloc_slice_held<U: Send + 'static>(
    len: usize,
) -> NonNull<Block<[std::mem::MaybeUninit<U>]>> {
    alloc_slice_with::<std::mem::MaybeUninit<U>>(
        len,
        HELD,
        #[cfg(percpu_ref_loom)]
        crate::backend(),
    )
}

/// Allocates the block for [`Shared::new_cyclic`]: the count at zero (an
/// upgrade fails, as from a value already dropped), one allocation unit
/// (the `Weak` that `new_cyclic` lends to its function) and `T` not yet
/// written; [`publish`] writes it.
pub(super) fn alloc_unpublished<T: Send + 'static>(
    #[cfg(percpu_ref_loom)] backend: Backend,
) -> NonNull<Block<T>> {
    alloc_counts::<T>(
        0,
        #[cfg(percpu_ref_loom)]
        backend,
    )
}

/// Allocates a block with the state word `state`, one allocation unit and
/// `T` not yet written, which the caller writes before anyone reads it
/// (nothing reads it while the count is zero: an upgrade fails first,
/// `Weak`s only take its address; and a free before then, a
/// `new_cyclic` whose function panicked, leaves the `ManuallyDrop` alone).
#[inline(always)]
fn alloc_counts<T: Send + 'static>(
    state: usize,
    #[cfg(percpu_ref_loom)] backend: Backend,
) -> NonNull<Block<T>> {
    let mut b = Box::<Block<T>>::new_uninit();
    let raw = b.as_mut_ptr();
    // SAFETY: `raw` is the box's allocation, aligned for a `Block<T>`.
    unsafe {
        init_counts(
            raw,
            state,
            #[cfg(percpu_ref_loom)]
            backend,
        );
    }
    // `MaybeUninit<Block<T>>` has `Block<T>`'s layout, so the block is
    // freed as any other.
    // SAFETY: `Box::into_raw` never returns null.
    unsafe { NonNull::new_unchecked(Box::into_raw(b).cast::<Block<T>>()) }
}

/// Writes a new block's fields but `value`: the state word `state` and one
/// allocation unit.
///
/// # Safety
///
/// `raw` is a fresh allocation with a `Block<T>`'s layout (its metadata
/// included), which nobody else can reach yet.
#[inline(always)]
unsafe fn init_counts<T: ?Sized>(
    raw: *mut Block<T>,
    state: usize,
    #[cfg(percpu_ref_loom)] backend: Backend,
) {
    // SAFETY: the caller's promise; each field but `value` is written once,
    // through raw places (no reference to the unfinished block is formed).
    unsafe {
        std::ptr::addr_of_mut!((*raw).state).write(AtomicUsize::new(state));
        std::ptr::addr_of_mut!((*raw).units).write(AtomicUsize::new(1));
        #[cfg(percpu_ref_loom)]
        std::ptr::addr_of_mut!((*raw).backend).write(backend);
        #[cfg(percpu_ref_loom)]
        std::ptr::addr_of_mut!((*raw).freed).write(crate::sync::UnsafeCell::new(()));
    }
    // ordering-audit: Relaxed: a count that models read after joining every
    // thread.
    #[cfg(percpu_ref_loom)]
    crate::owned::block::loom_live_blocks().fetch_add(1, Ordering::Relaxed);
}

/// The layout of a `Block<[U]>` of `len` elements: `repr(C)`'s, the
/// counts then the elements (what `Box` frees it with: `Layout::for_value`).
fn slice_layout<U>(len: usize) -> std::alloc::Layout {
    let counts = std::alloc::Layout::from_size_align(
        std::mem::offset_of!(Block<()>, value),
        std::mem::align_of::<Block<()>>(),
    )
    .expect("the counts' layout");
    std::alloc::Layout::array::<U>(len)
        .and_then(|elements| counts.extend(elements))
        .map_or_else(
            |_| {
                panic!(
                    "percpu_ref::shared::Shared::from: a slice of {len} elements of {} bytes is too large to allocate",
                    std::mem::size_of::<U>()
                )
            },
            |(layout, _)| layout.pad_to_align(),
        )
}

/// Allocates the block of a slice of `len` elements with one reference
/// (the first `Shared`'s) and the count's unit, the elements not yet
/// written: the caller writes all `len` before anyone reads them, or frees
/// the block with [`free_unwritten_slice`].
pub(super) fn alloc_slice<U: Send + 'static>(
    len: usize,
    #[cfg(percpu_ref_loom)] backend: Backend,
) -> NonNull<Block<[U]>> {
    alloc_slice_with(
        len,
        ONE,
        #[cfg(percpu_ref_loom)]
        backend,
    )
}

/// [`alloc_slice`] with the state word `state`.
fn alloc_slice_with<U: Send + 'static>(
    len: usize,
    state: usize,
    #[cfg(percpu_ref_loom)] backend: Backend,
) -> NonNull<Block<[U]>> {
    let layout = slice_layout::<U>(len);
    // SAFETY: the layout is never zero-sized (it holds the counts).
    let mem = unsafe { std::alloc::alloc(layout) };
    if mem.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // The length goes with the address: a `*mut [U]` cast to the block
    // whose last field is `[U]` keeps it.
    let raw = std::ptr::slice_from_raw_parts_mut(mem.cast::<U>(), len) as *mut Block<[U]>;
    // SAFETY: a fresh allocation with a `Block<[U]>` of `len`'s layout
    // (`slice_layout`, `repr(C)`).
    unsafe {
        init_counts(
            raw,
            state,
            #[cfg(percpu_ref_loom)]
            backend,
        );
    }
    // SAFETY: `alloc` returned non-null.
    unsafe { NonNull::new_unchecked(raw) }
}

/// Frees a block from [`alloc_slice`] whose elements were not all written
/// (those that were are the caller's to drop first).
///
/// # Safety
///
/// `p` came from [`alloc_slice`], nobody else can reach it, and it is freed
/// once.
pub(super) unsafe fn free_unwritten_slice<U>(p: NonNull<Block<[U]>>) {
    #[cfg(percpu_ref_loom)]
    crate::owned::block::loom_live_blocks().fetch_sub(1, Ordering::Relaxed);
    // SAFETY: the caller's promise; `ManuallyDrop` leaves the elements
    // alone, and the layout is the one `alloc_slice` allocated with.
    drop(unsafe { Box::from_raw(p.as_ptr()) });
}

/// Writes `T` into a block from [`alloc_unpublished`] and makes its count
/// one, the first `Shared`'s, which takes over the allocation unit of the
/// `Weak` that `new_cyclic` lent (as `Arc::new_cyclic`).
///
/// # Safety
///
/// `p` came from [`alloc_unpublished`], is published once, and the caller
/// holds its lent `Weak`'s unit, which it hands to the count.
pub(super) unsafe fn publish<T>(p: NonNull<Block<T>>, value: T) {
    // SAFETY: the block is allocated (the caller's unit) and its count is
    // zero: no handle reads `T`. Only the field is written, with the
    // block's own provenance (`Box::into_raw`), while `Weak`s on other
    // threads may be reading the counts beside it.
    unsafe { std::ptr::addr_of_mut!((*p.as_ptr()).value).write(ManuallyDrop::new(value)) };
    // Release: an upgrade that reads the count (its acquire load, or a
    // later value of the count's release sequence) sees `T` written, as
    // `Arc::new_cyclic`'s store. A store, not a compare-and-swap: nothing
    // writes a count of zero (an upgrade fails there, and no `Shared`
    // exists to clone, drop or promote).
    // mutant shared_cyclic_publish_relaxed: the count is published relaxed
    // (an upgrade on another thread may read `T` before it is written).
    #[cfg(not(percpu_ref_mutant = "shared_cyclic_publish_relaxed"))]
    let order = Ordering::Release;
    #[cfg(percpu_ref_mutant = "shared_cyclic_publish_relaxed")]
    let order = Ordering::Relaxed;
    // SAFETY: the caller's unit keeps the block; only the field is borrowed.
    unsafe { &(*p.as_ptr()).state }.store(ONE, order);
}

/// The block behind a handle.
///
/// # Safety
///
/// The caller's handle holds an allocation unit or a reference.
#[inline(always)]
pub(super) unsafe fn block<'a, T: ?Sized>(p: NonNull<Block<T>>) -> &'a Block<T> {
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
pub(super) unsafe fn value_ptr<T: ?Sized>(p: NonNull<Block<T>>) -> *const T {
    // SAFETY: `p` points to an allocated `Block<T>`; `addr_of!` reads
    // nothing. `ManuallyDrop` is `repr(transparent)`.
    (unsafe { std::ptr::addr_of!((*p.as_ptr()).value) }) as *const T
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

/// [`block_of`] for any `T`, sized or not (`[T]`, `str`): the block's
/// counts are `repr(C)`'s prefix, and `value` follows them at the next
/// multiple of `T`'s alignment, which is read from the value itself.
///
/// # Safety
///
/// `ptr` came from [`value_ptr`] of a block whose `T` is alive (a
/// reference is held): the alignment is read through `&T`.
pub(super) unsafe fn block_of_live<T: ?Sized>(ptr: *const T) -> NonNull<Block<T>> {
    // SAFETY: `T` is alive (the caller's promise): a shared borrow for
    // the length of this call.
    let align = std::mem::align_of_val(unsafe { &*ptr });
    let counts = std::mem::offset_of!(Block<()>, value);
    let offset = counts.next_multiple_of(align);
    // SAFETY: `ptr` points `offset` bytes into an allocated block (the
    // caller's promise), so stepping back stays inside it, never null; the
    // cast keeps the metadata (`value` is the block's last field).
    unsafe { NonNull::new_unchecked(ptr.byte_sub(offset).cast_mut() as *mut Block<T>) }
}
