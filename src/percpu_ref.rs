//! The `percpu_ref` protocol: modes, switches, kill and release.
//!
//! This is lib/percpu-refcount.c, with synchronous switches (each waits
//! for its grace period) beside deferred ones (the kernel's: queued on the
//! grace-period engine). A ref is a mode word,
//! per-CPU counters ([`Counters`]) and one atomic counter
//! ([`AtomicCount`]). In percpu mode get/put touch only the caller's CPU
//! counter; the atomic counter holds `BIAS + a` so it cannot reach zero.
//!
//! Switching to atomic mode (the kernel's `__percpu_ref_switch_to_atomic`
//! plus its RCU callback, run in one go):
//!
//! 1. set `ATOMIC` in the mode word; new operations take the atomic path;
//! 2. take a temporary reference on the atomic counter, so that nothing
//!    can release the ref before step 5;
//! 3. `seal_and_sum`: wait out the grace period (no percpu add that read
//!    the old mode is still in flight) and sum every CPU's counter;
//! 4. fold `sum - BIAS` into the atomic counter in one RMW: it now holds
//!    the true count (plus the temporary reference);
//! 5. run `confirm`, then drop the temporary reference, which releases the
//!    ref if that was the last one. Release therefore never precedes
//!    confirm.
//!
//! Switching back (only with `ALLOW_REINIT`, never while dead or forced
//! atomic) needs no grace period: add `BIAS`, zero the per-CPU counters,
//! clear `ATOMIC` with a release store.
//!
//! Kill = set `DEAD`, switch to atomic with the caller's confirm, put the
//! base reference. After the confirm, every `tryget_live` reads `DEAD`.
//!
//! In atomic mode a get or put is one unconditional add or sub on the
//! atomic counter, as the kernel's `rcuref_t`: the zone it lands in (zero,
//! live, saturated, biased, released; see [`AtomicCount`]) says whether it
//! needs a repair. The put that lands on zero elects the release (a
//! compare-and-swap to `RELEASED`); a get that lands on a released counter
//! gives its increment back and fails. A tryget is a compare-and-swap that
//! fails on zero, so nothing revives a count under the final put's
//! election (`atomic_mode`, "Why tryget compares").
//!
//! # What cannot go wrong half-way
//!
//! - A `confirm` that panics does not stop the switch: the panic is caught,
//!   the switch finishes (fold, base and temporary references put, release
//!   if due), and the panic is then resumed on the caller.
//! - A grace period that the kernel refuses (`membarrier` blocked by a
//!   seccomp filter installed after detection) undoes the switch before
//!   anything was summed: the mode word and the counter go back to what
//!   they were, and the caller gets [`Error::GracePeriodFailed`]. Operations
//!   that saw the transient atomic mode counted on the biased atomic
//!   counter, which is exact in either mode. Grace periods are shared, so
//!   a switch that another thread's grace period serves (one that started
//!   after the switch's store) completes even on a thread whose own
//!   `membarrier` would be refused.
//! - `_many` operations with `n >= PERCPU_N_LIMIT` take the atomic path even
//!   in percpu mode, so one call can never push a per-CPU counter, or the
//!   sharded backend's seal, out of its range, and an overflow is caught
//!   at the call that makes it.
//! - A released ref stays released: its counter sits in the released
//!   zone, where every get and tryget fails and gives back what it added,
//!   and going back to percpu mode adds the bias only to a live count, in
//!   one compare-and-swap; only `reinit` and `resurrect` (under the switch
//!   lock) shift it back to live.
//! - Saturation is sticky: a small get that pushes the count past
//!   2^62 - 1 in atomic mode parks the counter in the biased zone (a
//!   miscounted ref, which never releases) and panics.
//!
//! # Locking
//!
//! Switches, kills and revivals of one ref are serialised by its switch
//! lock, held across the grace period and `confirm` (which is why a switch
//! that starts while another is pending waits for its confirm). `release`
//! is never called with the lock held: puts made under the lock only
//! record that the count reached zero, and the release runs after unlock.
//! Calling a switch operation from inside `confirm` on the same ref would
//! deadlock; it panics with a message instead.
//!
//! # Deferred switches
//!
//! `kill` and the other switches without `_sync` do steps 1 and 2 under
//! the switch lock, mark the ref `MODE_PENDING`, drop the lock and queue
//! the ref on the grace-period engine (`src/grace.rs`), which does steps
//! 3-5 after a grace period shared by its whole batch. The pending bit is
//! a switch in progress without the lock: every other switch of the ref
//! (and its `Drop`) waits until the engine clears it, which is the
//! engine's last access to the ref. The synchronous switches share grace
//! periods too: step 3 waits for the first grace period that starts after
//! their `ATOMIC` store, whoever runs it.
//!
//! # Where each part lives
//!
//! This file holds the ref, its construction, its queries and its drop;
//! `ops.rs` the gets, puts and trygets; `switch.rs` the synchronous
//! switches, kill and revival with the steps under the switch lock that
//! every switch shares; `deferred.rs` the deferred switches and what the
//! engine calls back.

use crate::atomic_mode::{AtomicCount, BIAS, RELEASED};
use crate::flags::{Error, InitFlags};
use crate::grace;
use crate::percpu::{backend, Backend, Counters, MODE_ATOMIC, MODE_DEAD, MODE_PENDING};
use crate::sync::{self, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::any::Any;
use std::fmt;
use std::marker::PhantomPinned;
use std::mem::MaybeUninit;

type ReleaseFn = Box<dyn Fn(&PercpuRef) + Send + Sync + 'static>;

/// A type-erased function with the pointer it runs on: the release of a ref
/// made by the owned layers ([`PercpuRef::with_erased_release`]), and a
/// unit they owe (`owned::block`).
#[derive(Clone, Copy)]
pub(crate) struct Erased {
    pub(crate) ptr: ErasedPtr,
    pub(crate) func: unsafe fn(ErasedPtr),
}

/// A raw pointer to any type, thin or wide, with its type erased: its
/// bytes are kept whole (a slice's length with its address, `shared`'s
/// `Block<[T]>` and `Block<str>`), so that the function it is handed to
/// gets back the very pointer it was made from, provenance included.
#[derive(Clone, Copy)]
pub(crate) struct ErasedPtr(MaybeUninit<[*const (); 2]>);

impl ErasedPtr {
    /// Erases `p`'s type.
    pub(crate) fn new<U: ?Sized>(p: *const U) -> Self {
        const {
            assert!(
                std::mem::size_of::<*const U>() <= std::mem::size_of::<[*const (); 2]>()
                    && std::mem::align_of::<*const U>() <= std::mem::align_of::<*const ()>(),
                "a pointer wider than two words"
            );
        }
        let mut bytes = MaybeUninit::<[*const (); 2]>::uninit();
        // SAFETY: the storage is large and aligned enough for `*const U`
        // (asserted above); a typed write keeps the pointer's provenance.
        unsafe { bytes.as_mut_ptr().cast::<*const U>().write(p) };
        ErasedPtr(bytes)
    }

    /// The pointer it was made from.
    ///
    /// # Safety
    ///
    /// Made by [`ErasedPtr::new`] with this `U` (so the bytes read are the
    /// ones written).
    pub(crate) unsafe fn get<U: ?Sized>(self) -> *const U {
        // SAFETY: the caller's promise: `new::<U>` wrote these bytes.
        unsafe { self.0.as_ptr().cast::<*const U>().read() }
    }
}

// SAFETY: an `Erased` lives in a ref's count line (a `PercpuRef` is `Send +
// Sync`) and in a thread's owed slot. Its function only runs as the release
// of the block's own `PercpuRef` or to pay an owed unit, i.e. on a thread
// that made the last put or dropped a handle; the handles' `Send`/`Sync`
// bounds already allow `T` to be dropped there.
unsafe impl Send for Erased {}
// SAFETY: as for `Send`; `Erased` has no interior state.
unsafe impl Sync for Erased {}

/// The `release` of a ref made by `with_erased_release`.
fn call_erased_release(r: &PercpuRef) {
    // SAFETY: installed only by `with_erased_release`, which writes the
    // field before the ref is returned; calling it when the count reached
    // zero is that constructor's caller's promise.
    unsafe { r.erased_release.assume_init_read().call() }
}

impl Erased {
    /// # Safety
    ///
    /// `func`'s own contract for `ptr`.
    pub(crate) unsafe fn call(self) {
        // SAFETY: forwarded to the caller.
        unsafe { (self.func)(self.ptr) }
    }
}

mod deferred;
mod managed;
mod ops;
mod switch;

pub use deferred::flush;
#[cfg(feature = "css")]
pub(crate) use deferred::Confirm;
pub(crate) use managed::wait_for_backlog;

/// A reference count whose get/put scale with cores, with the Linux
/// kernel's kill semantics.
///
/// See the [crate documentation](crate) for the idea, the modes and a map
/// from kernel functions to these methods.
///
/// # Examples
///
/// ```
/// use percpu_ref::PercpuRef;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
///
/// let released = Arc::new(AtomicBool::new(false));
/// let r = {
///     let released = released.clone();
///     PercpuRef::new(move |_| released.store(true, Ordering::SeqCst))
/// };
/// r.get(); // percpu mode: touches only this CPU's counter
/// assert!(r.tryget_live());
/// r.kill_sync().unwrap(); // drops the base reference; two are still held
/// assert!(!r.tryget_live());
/// r.put();
/// assert!(!released.load(Ordering::SeqCst));
/// r.put(); // the last one
/// assert!(released.load(Ordering::SeqCst));
/// assert!(r.is_zero());
/// ```
// The layout (why: docs/design.md §3): two cache lines' worth, so that the
// counter atomic mode writes never shares a line with the words every
// operation reads first. `#[repr(C)]`: the atomic counter alone, padded to
// 64 bytes; then `mode` and `counters`, the two words the per-CPU fast
// path reads (`Counters::try_add_raw`), and the fields only switches
// touch, padded to 128 bytes. `align(16)` (what `malloc` gives anyway)
// keeps the mode word off its own and a neighbour's counter's line
// wherever an array of refs starts (`layout_tests` below).
#[repr(C, align(16))]
pub struct PercpuRef {
    count: AtomicCount,
    /// The release of a ref made by
    /// [`with_erased_release`](Self::with_erased_release), whose `release`
    /// is then `call_erased_release`; unwritten otherwise. In the count line's
    /// spare bytes, so that the owned layers' release (a block pointer and
    /// a function) costs no allocation of its own; read only by `release`.
    erased_release: MaybeUninit<Erased>,
    /// A word for the layer that made the ref with
    /// [`with_erased_release`](Self::with_erased_release) (`shared`: the
    /// `Shared::into_inner` calls waiting for the value); written there,
    /// unwritten otherwise. In the count line: touched only by rare slow
    /// paths, never by a get or put.
    layer_word: MaybeUninit<AtomicUsize>,
    /// The managed ref's place in the engine's queue while one of its scan
    /// steps is queued (`managed.rs`): in the count line's spare bytes, so
    /// that a mark allocates nothing. Touched only by the engine's queue.
    link: crate::grace::Link,
    _count_line: MaybeUninit<[u8; COUNT_LINE_PAD]>,
    /// `MODE_ATOMIC` / `MODE_DEAD` / `MODE_PENDING` and the rseq bound:
    /// written under `switch`, except that a deferred switch's completion
    /// clears `MODE_PENDING` without it (the engine's last access to the
    /// ref; no switch can hold the lock meanwhile, as every switch waits
    /// for the bit to clear first).
    mode: AtomicUsize,
    counters: Counters,
    switch: Mutex<SwitchState>,
    /// The thread holding `switch`, to turn re-entry from `confirm` into a
    /// panic instead of a deadlock. Diagnostic only: not part of the
    /// protocol, so it is a plain std atomic even under loom.
    switch_owner: crate::sync::unmodeled::AtomicUsize,
    release: ReleaseFn,
    /// A switch or `Drop` waits for the engine to hand this managed ref
    /// back (`managed.rs`, invariant 4).
    manager_stop: AtomicBool,
    _mode_line: MaybeUninit<[u8; MODE_LINE_PAD]>,
    /// The deferred switches hand the engine the ref's address: once
    /// pinned, it stays there until `Drop`, which waits for the engine.
    _pinned: PhantomPinned,
}

/// The bytes after the atomic counter (and the spare release, the layer
/// word and the queue link) that fill its
/// 64-byte line (never written: padding costs `new` no stores).
const COUNT_LINE_PAD: usize = 64usize.saturating_sub(
    std::mem::size_of::<AtomicCount>()
        + std::mem::size_of::<MaybeUninit<Erased>>()
        + std::mem::size_of::<MaybeUninit<AtomicUsize>>()
        + std::mem::size_of::<crate::grace::Link>(),
);

/// The bytes after the fields of the second line that fill it to 64 (none
/// where those fields are larger, as under loom). The sum names every
/// field of that line: a field added there without its term here makes
/// the ref larger than 128 bytes, which the assertion below refuses.
const MODE_LINE_PAD: usize = 64usize.saturating_sub(
    std::mem::size_of::<AtomicUsize>()
        + std::mem::size_of::<Counters>()
        + std::mem::size_of::<Mutex<SwitchState>>()
        + std::mem::size_of::<crate::sync::unmodeled::AtomicUsize>()
        + std::mem::size_of::<ReleaseFn>()
        + std::mem::size_of::<AtomicBool>(),
);

// The fast path's words: the mode word, then the counters, whose first
// word is the slot's base (`Counters` and `Slot` are `#[repr(C)]`).
const _: () = assert!(
    std::mem::offset_of!(PercpuRef, counters)
        == std::mem::offset_of!(PercpuRef, mode) + std::mem::size_of::<usize>()
);
const _: () = assert!(std::mem::offset_of!(PercpuRef, mode) == 64);
// On Linux (the rseq targets) the sum is exact: the ref is two lines
// whenever the second line's fields fit in 64 bytes. Elsewhere padding
// between fields (Windows' mutex) can make the ref a little longer than 128
// bytes: the count keeps its own line, but the next ref in an array may put
// its count on this one's last line.
#[cfg(all(target_os = "linux", not(percpu_ref_loom)))]
const _: () = assert!(
    MODE_LINE_PAD == 0 || std::mem::size_of::<PercpuRef>() == 128,
    "PercpuRef's second line is not padded to 64 bytes: add the new field to MODE_LINE_PAD"
);

// The size the docs quote (README, `percpu/arena.rs`, docs/performance.md,
// docs/design.md): 128 bytes on 64-bit Linux, where the std mutex is one
// futex word. Other targets' mutexes differ in size.
#[cfg(all(target_os = "linux", target_pointer_width = "64", not(percpu_ref_loom)))]
const _: () = assert!(
    std::mem::size_of::<PercpuRef>() == 128,
    "PercpuRef is no longer 128 bytes: update the docs that quote its size"
);

/// What the kernel keeps in `percpu_ref_data` besides the count.
struct SwitchState {
    /// Sticky: set by `switch_to_atomic_sync`, cleared by `switch_to_percpu`.
    force_atomic: bool,
    allow_reinit: bool,
}

/// The switch lock, with the owner recorded for re-entry detection.
struct SwitchGuard<'a> {
    r: &'a PercpuRef,
    state: MutexGuard<'a, SwitchState>,
}

impl Drop for SwitchGuard<'_> {
    fn drop(&mut self) {
        self.r
            .switch_owner
            .store(0, crate::sync::unmodeled::Ordering::Relaxed);
    }
}

/// What a completed switch to atomic mode left for its caller.
#[must_use]
struct AtomicSwitch {
    /// The temporary reference taken in step 2 (absent when the ref was
    /// already atomic), still to be put.
    temp_ref: bool,
    /// Misuse the fold found (an underflow or overflow), as a message.
    miscount: Option<String>,
    /// What `confirm` panicked with, to be resumed once the switch is done.
    confirm_panic: Option<Box<dyn Any + Send>>,
}

/// The outcome of puts made under the switch lock, acted on after unlock.
#[derive(Default)]
#[must_use]
struct AfterUnlock {
    release: bool,
    panic: Option<String>,
    confirm_panic: Option<Box<dyn Any + Send>>,
}

impl PercpuRef {
    /// A ref in percpu mode holding one (base) reference, on the process's
    /// default [`backend`](crate::backend). `release` runs when the count
    /// reaches zero, which can only happen after [`kill`](Self::kill).
    #[must_use]
    #[inline]
    pub fn new(release: impl Fn(&PercpuRef) + Send + Sync + 'static) -> Self {
        Self::with_flags(release, InitFlags::empty())
    }

    /// A ref made with the kernel's init flags (see [`InitFlags`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = PercpuRef::with_flags(|_| {}, InitFlags::INIT_DEAD);
    /// assert!(r.is_zero() && r.is_dying());
    /// assert!(!r.tryget());
    /// r.reinit().unwrap(); // alive again, count 1, percpu mode
    /// assert!(r.is_percpu() && r.tryget_live());
    /// ```
    #[must_use]
    #[inline]
    pub fn with_flags(
        release: impl Fn(&PercpuRef) + Send + Sync + 'static,
        flags: InitFlags,
    ) -> Self {
        match Self::with_backend(release, flags, backend()) {
            Ok(r) => r,
            // `backend()` only picks a backend that is available, and
            // availability is decided once per process.
            Err(e) => unreachable!("the default backend is available: {e}"),
        }
    }

    /// A ref on a chosen per-CPU backend, for comparing backends side by
    /// side.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] when `backend` cannot run in this
    /// process (see [`Backend::is_available`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{Backend, InitFlags, PercpuRef};
    /// let r = PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Sharded).unwrap();
    /// assert_eq!(r.backend(), Backend::Sharded);
    /// ```
    #[inline]
    pub fn with_backend(
        release: impl Fn(&PercpuRef) + Send + Sync + 'static,
        flags: InitFlags,
        backend: Backend,
    ) -> Result<Self, Error> {
        let atomic = flags.contains(InitFlags::INIT_ATOMIC) || flags.contains(InitFlags::INIT_DEAD);
        let dead = flags.contains(InitFlags::INIT_DEAD);
        let Some(counters) = Counters::new(backend, atomic) else {
            return Err(Error::BackendUnavailable(backend));
        };
        let mode = if dead {
            MODE_ATOMIC | MODE_DEAD
        } else if atomic {
            MODE_ATOMIC
        } else {
            counters.percpu_mode()
        };
        let count = if dead {
            RELEASED
        } else if atomic {
            1
        } else {
            BIAS + 1
        };
        Ok(PercpuRef {
            count: AtomicCount::new(count),
            erased_release: MaybeUninit::uninit(),
            layer_word: MaybeUninit::uninit(),
            link: crate::grace::Link::new(),
            _count_line: MaybeUninit::uninit(),
            mode: AtomicUsize::new(mode),
            counters,
            switch: Mutex::new(SwitchState {
                force_atomic: flags.contains(InitFlags::INIT_ATOMIC),
                allow_reinit: atomic || flags.contains(InitFlags::ALLOW_REINIT),
            }),
            switch_owner: crate::sync::unmodeled::AtomicUsize::new(0),
            release: Box::new(release),
            manager_stop: AtomicBool::new(false),
            _mode_line: MaybeUninit::uninit(),
            _pinned: PhantomPinned,
        })
    }

    /// [`with_backend`](Self::with_backend) whose `release` calls
    /// `release` (a block's function on the block), kept in the count
    /// line's spare bytes: no allocation for the callback.
    ///
    /// # Safety
    ///
    /// Calling `release` is sound whenever this ref's count reaches zero,
    /// for as long as the ref lives (as a callback's own promise).
    pub(crate) unsafe fn with_erased_release(
        release: Erased,
        flags: InitFlags,
        backend: Backend,
    ) -> Result<Self, Error> {
        // A function item: boxed, it allocates nothing.
        let mut r = Self::with_backend(call_erased_release, flags, backend)?;
        r.erased_release = MaybeUninit::new(release);
        r.layer_word = MaybeUninit::new(AtomicUsize::new(0));
        Ok(r)
    }

    /// The word kept for the layer that made this ref (its `layer_word`
    /// field), zero when made.
    ///
    /// # Safety
    ///
    /// The ref was made by [`with_erased_release`](Self::with_erased_release).
    pub(crate) unsafe fn layer_word(&self) -> &AtomicUsize {
        // SAFETY: the caller's promise: `with_erased_release` wrote it.
        unsafe { self.layer_word.assume_init_ref() }
    }

    // ----- queries ----------------------------------------------------------

    /// True when the ref is in atomic mode with a count of zero (released,
    /// or made with `INIT_DEAD`). Always false in percpu mode.
    ///
    /// A snapshot, as the kernel's `percpu_ref_is_zero` (a plain read): it
    /// does not synchronise with the last put. Hand data over through the
    /// `release` callback (which runs after the last put) instead.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.mode() & MODE_ATOMIC != 0 && self.count.true_count() == Some(0)
    }

    /// True once the ref was killed (until revived).
    #[must_use]
    pub fn is_dying(&self) -> bool {
        self.mode() & MODE_DEAD != 0
    }

    /// True while get/put count per CPU.
    #[must_use]
    pub fn is_percpu(&self) -> bool {
        self.mode() & MODE_ATOMIC == 0
    }

    /// The count in atomic mode, `None` in percpu mode, while a switch to
    /// atomic is folding the per-CPU counts in, or after an underflow or
    /// overflow. The value can be stale as soon as it is returned; it is
    /// meant for diagnostics and tests.
    #[must_use]
    pub fn atomic_count(&self) -> Option<u64> {
        if self.is_percpu() {
            return None;
        }
        self.count.true_count()
    }

    /// The count as a racy snapshot in either mode (for `Shared`'s
    /// `strong_count`): in percpu mode the atomic counter less `BIAS` plus
    /// the per-CPU counters read while sections may commit, which is exact
    /// only while nobody gets or puts. Saturated (a miscounted ref):
    /// `u64::MAX`.
    pub(crate) fn count_snapshot(&self) -> u64 {
        use crate::atomic_mode::{zone, Zone, BIAS};
        let c = self.count.load();
        match zone(c) {
            Zone::Biased => c.wrapping_sub(BIAS).wrapping_add(self.counters.racy_sum()),
            Zone::Zero | Zone::Released => 0,
            Zone::Live => c,
            Zone::Saturated => u64::MAX,
        }
    }

    /// The per-CPU backend this ref counts on.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.counters.backend()
    }

    /// Bytes of per-CPU counter storage this ref owns.
    #[must_use]
    pub fn percpu_bytes(&self) -> usize {
        self.counters.storage_bytes()
    }

    // ----- internals --------------------------------------------------------

    /// The mode word, as the switch-lock holder (its only writer) and the
    /// queries read it. The fast paths read it on their own (the rseq
    /// section; the loom model with an acquire load).
    fn mode(&self) -> usize {
        // ordering-audit: Relaxed: the lock holder reads its own writes; the
        // queries (`is_dying`, `is_percpu`, `is_zero`, `tryget_live`'s DEAD
        // check) take snapshots, as the kernel's plain reads do: DEAD and
        // ATOMIC publish nothing, and a tryget_live that goes on acquires
        // through its CAS on the count.
        self.mode.load(Ordering::Relaxed)
    }

    /// Takes the switch lock, once no deferred switch of this ref is
    /// pending (a pending switch is a switch in progress), and ends a
    /// management (`managed.rs`, invariant 5: every switch takes over).
    fn lock_switch(&self, op: &'static str) -> SwitchGuard<'_> {
        loop {
            let g = self.lock_switch_keeping_manager(op);
            if self.end_management(&g) {
                return g;
            }
            drop(g);
            self.request_stop();
            self.wait_not_pending(op);
        }
    }

    /// [`lock_switch`](Self::lock_switch), leaving a managed ref managed.
    fn lock_switch_keeping_manager(&self, op: &'static str) -> SwitchGuard<'_> {
        let me = sync::thread_token();
        assert!(
            self.switch_owner.load(crate::sync::unmodeled::Ordering::Relaxed) != me
                && !grace::completing(self.addr()),
            "percpu_ref::{op} called from inside a confirm callback (or a deferred release) on the same ref: \
             switches are serialised, so this would deadlock"
        );
        loop {
            let state = sync::lock(&self.switch);
            if !self.is_pending() {
                self.switch_owner
                    .store(me, crate::sync::unmodeled::Ordering::Relaxed);
                return SwitchGuard { r: self, state };
            }
            drop(state);
            self.request_stop();
            self.wait_not_pending(op);
        }
    }

    /// The ref's address, as the engine knows it.
    fn addr(&self) -> *const () {
        std::ptr::from_ref(self).cast()
    }

    /// Whether a deferred switch of this ref is queued or being completed.
    #[inline]
    pub(crate) fn is_pending(&self) -> bool {
        // Acquire: pairs with the engine's release when it clears the bit,
        // so what it did to the ref (the sum, the fold, the puts) happens
        // before what the caller does next (reset the counters, free them).
        self.mode.load(Ordering::Acquire) & MODE_PENDING != 0
    }

    /// Waits until the engine completed this ref's deferred switch.
    fn wait_not_pending(&self, op: &str) {
        assert!(
            self.wait_deferred_switch(),
            "percpu_ref::{op} called from a deferred confirm or release on a ref whose own \
             deferred switch is still queued: the grace-period engine would wait for itself"
        );
    }
}

impl fmt::Debug for PercpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = self.mode();
        f.debug_struct("PercpuRef")
            .field(
                "mode",
                &if mode & MODE_ATOMIC == 0 {
                    "percpu"
                } else {
                    "atomic"
                },
            )
            .field("dead", &(mode & MODE_DEAD != 0))
            .field("managed", &(mode & crate::percpu::MODE_MANAGED != 0))
            .field("atomic_count", &self.atomic_count())
            .field("backend", &self.backend())
            .finish()
    }
}

/// Dropping a ref whose deferred switch is pending waits until the engine
/// is done with it (the `Pin` drop guarantee makes this the last moment the
/// engine may use the address). A ref dropped by its own `release`, run by
/// the engine, does not wait: the engine touches nothing of it afterwards.
impl Drop for PercpuRef {
    #[inline]
    fn drop(&mut self) {
        if self.is_pending() {
            self.drop_pending();
        }
    }
}

impl PercpuRef {
    /// [`Drop`] of a ref whose deferred switch is pending (out of line:
    /// every ref's drop checks, few wait).
    #[cold]
    #[inline(never)]
    fn drop_pending(&self) {
        if grace::completing(self.addr()) {
            grace::mark_freed();
            return;
        }
        if grace::on_engine() {
            // The engine would wait for itself, and unwinding would free
            // memory the queue still points to: neither is acceptable.
            eprintln!(
                "percpu_ref: a PercpuRef whose deferred switch is still queued was dropped \
                 from a deferred confirm or release of another ref; aborting (the engine \
                 would wait for itself)"
            );
            std::process::abort();
        }
        self.request_stop();
        grace::wait_until(|| self.is_pending());
    }
}

#[cfg(all(test, not(percpu_ref_loom)))]
mod layout_tests {
    use super::PercpuRef;

    /// The 64-byte block an address falls in.
    fn line(p: *const u8) -> usize {
        p as usize / 64
    }

    /// In an array, boxed or embedded at any 16-byte offset, no ref's
    /// atomic counter shares a cache line with its own or a neighbour's
    /// mode word and slot (what the layout comment above `PercpuRef`
    /// promises; reordering the fields breaks it).
    #[test]
    fn the_count_never_shares_a_line_with_a_mode_word() {
        let hot = |r: &PercpuRef| {
            let mode = (&raw const r.mode).cast::<u8>();
            // The mode word and the slot's base, the 16 bytes the fast
            // path reads.
            [line(mode), line(mode.wrapping_add(15))]
        };
        let count = |r: &PercpuRef| line((&raw const r.count).cast::<u8>());
        let check = |refs: &[PercpuRef]| {
            let hot_lines: Vec<usize> = refs.iter().flat_map(hot).collect();
            for r in refs {
                assert!(
                    !hot_lines.contains(&count(r)),
                    "a count at {:p} shares a line with a mode word",
                    &raw const r.count
                );
            }
        };
        let v: Vec<PercpuRef> = (0..8).map(|_| PercpuRef::new(|_| {})).collect();
        check(&v);
        // Behind a 16-byte header, as in an allocation of (header, ref).
        #[repr(C)]
        struct Embedded {
            _header: [u128; 1],
            r: PercpuRef,
        }
        for _ in 0..4 {
            let b = Box::new(Embedded {
                _header: [0],
                r: PercpuRef::new(|_| {}),
            });
            check(std::slice::from_ref(&b.r));
        }
        let boxed: Vec<Box<PercpuRef>> = (0..8).map(|_| Box::new(PercpuRef::new(|_| {}))).collect();
        for b in &boxed {
            check(std::slice::from_ref(&**b));
        }
    }
}

#[cfg(all(test, not(percpu_ref_loom)))]
mod erased_tests {
    use super::ErasedPtr;

    /// A wide pointer comes back whole (address, length and provenance: the
    /// value is dropped and freed through it, which Miri checks), and a
    /// thin one as it went in.
    #[test]
    fn erased_ptr_keeps_wide_pointers() {
        let words: Box<[String]> = vec![String::from("a"), String::from("bc")].into_boxed_slice();
        let wide: *mut [String] = Box::into_raw(words);
        let e = ErasedPtr::new(wide.cast_const());
        // SAFETY: made from this very type.
        let back = unsafe { e.get::<[String]>() }.cast_mut();
        assert_eq!(back.len(), 2);
        // SAFETY: the pointer `Box::into_raw` gave, whole.
        let words = unsafe { Box::from_raw(back) };
        assert_eq!(words[1], "bc");

        let name: *const str = "name";
        // SAFETY: made from this very type.
        assert_eq!(unsafe { &*ErasedPtr::new(name).get::<str>() }, "name");
        let thin = Box::into_raw(Box::new(7u64));
        // SAFETY: as above; freed once.
        let thin =
            unsafe { Box::from_raw(ErasedPtr::new(thin.cast_const()).get::<u64>().cast_mut()) };
        assert_eq!(*thin, 7);
    }
}
