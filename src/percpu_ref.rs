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
//! In atomic mode a get, tryget or put is one unconditional add or sub on
//! the atomic counter, as the kernel's `rcuref_t`: the zone it lands in
//! (zero, live, saturated, biased, released; see [`AtomicCount`]) says
//! whether it needs a repair. The put that lands on zero elects the
//! release (a compare-and-swap to `RELEASED`); a get or tryget that lands
//! on a released counter gives its increment back and fails.
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
//! `kill_deferred` and the other `_deferred` methods do steps 1 and 2 under
//! the switch lock, mark the ref `MODE_PENDING`, drop the lock and queue
//! the ref on the grace-period engine (`src/grace.rs`), which does steps
//! 3-5 after a grace period shared by its whole batch. The pending bit is
//! a switch in progress without the lock: every other switch of the ref
//! (and its `Drop`) waits until the engine clears it, which is the
//! engine's last access to the ref. The synchronous switches share grace
//! periods too: step 3 waits for the first grace period that starts after
//! their `ATOMIC` store, whoever runs it.

use crate::atomic_mode::{
    AddOutcome, AtomicCount, Fold, PutOutcome, Refused, BIAS, MAX_COUNT, RELEASED,
    UNCHECKED_N_LIMIT,
};
use crate::flags::{Error, InitFlags};
use crate::grace::{self, Callback, Entry};
use crate::percpu::{
    backend, Backend, Counters, MODE_ATOMIC, MODE_DEAD, MODE_LIMIT, MODE_PENDING, PERCPU_N_LIMIT,
};
use crate::sync::{self, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::any::Any;
use std::fmt;
use std::marker::PhantomPinned;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;

type ReleaseFn = Box<dyn Fn(&PercpuRef) + Send + Sync + 'static>;

/// A switch's `confirm`, as a deferred switch hands it to the engine.
pub(crate) struct Confirm(Callback);

impl Confirm {
    pub(crate) fn new(f: impl FnOnce(&PercpuRef) + Send + 'static) -> Self {
        Confirm(Callback::new(move |r| {
            // SAFETY: `call` is the only caller, with a live ref's address.
            f(unsafe { &*r.cast::<PercpuRef>() });
        }))
    }

    fn call(self, r: &PercpuRef) {
        // SAFETY: the closure `new` made expects a live ref's address.
        unsafe { self.0.call(r.addr()) }
    }
}

/// Waits until every deferred switch queued before the call (on any
/// thread) has completed: its grace period passed, its `confirm` ran and
/// its temporary reference (and, for a kill, the base reference) was put,
/// so a `release` that was due has run. The kernel's `rcu_barrier`.
///
/// Returns at once when nothing was queued. Cuts the engine's gathering
/// delay short.
///
/// # Panics
///
/// When called from a deferred `confirm` or `release` (on the engine
/// thread): the engine would wait for itself.
///
/// # Examples
///
/// ```
/// use percpu_ref::PercpuRef;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
///
/// let confirmed = Arc::new(AtomicBool::new(false));
/// let r = Box::pin(PercpuRef::new(|_| {}));
/// let c = confirmed.clone();
/// r.as_ref()
///     .kill_and_confirm_deferred(move |_| c.store(true, Ordering::SeqCst))
///     .unwrap();
/// percpu_ref::flush();
/// assert!(confirmed.load(Ordering::SeqCst));
/// assert!(r.is_zero()); // the base reference was put: released
/// ```
pub fn flush() {
    grace::flush();
}

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
/// r.kill().unwrap(); // drops the base reference; two are still held
/// assert!(!r.tryget_live());
/// r.put();
/// assert!(!released.load(Ordering::SeqCst));
/// r.put(); // the last one
/// assert!(released.load(Ordering::SeqCst));
/// assert!(r.is_zero());
/// ```
// `#[repr(C)]`: `mode` and then `counters` first, the two words the
// per-CPU fast path reads (`Counters::try_add_raw`).
#[repr(C)]
pub struct PercpuRef {
    /// `MODE_ATOMIC` / `MODE_DEAD` / `MODE_PENDING` and the rseq bound:
    /// written under `switch`, except that a deferred switch's completion
    /// clears `MODE_PENDING` without it (the engine's last access to the
    /// ref; no switch can hold the lock meanwhile, as every switch waits
    /// for the bit to clear first).
    mode: AtomicUsize,
    counters: Counters,
    count: AtomicCount,
    switch: Mutex<SwitchState>,
    /// The thread holding `switch`, to turn re-entry from `confirm` into a
    /// panic instead of a deadlock. Diagnostic only: not part of the
    /// protocol, so it is a plain std atomic even under loom.
    switch_owner: std::sync::atomic::AtomicUsize,
    release: ReleaseFn,
    /// The deferred switches hand the engine the ref's address: once
    /// pinned, it stays there until `Drop`, which waits for the engine.
    _pinned: PhantomPinned,
}

// The fast path's words: the mode word, then the counters, whose first
// word is the slot's base (`Counters` and `Slot` are `#[repr(C)]`).
const _: () = assert!(
    std::mem::offset_of!(PercpuRef, counters)
        == std::mem::offset_of!(PercpuRef, mode) + std::mem::size_of::<usize>()
);

// The size the docs quote (crate docs, `percpu/arena.rs`,
// docs/performance.md, docs/design.md): 64 bytes on 64-bit Linux, where the
// std mutex is one futex word. Other targets' mutexes differ in size.
#[cfg(all(target_os = "linux", target_pointer_width = "64", not(percpu_ref_loom)))]
const _: () = assert!(
    std::mem::size_of::<PercpuRef>() == 64,
    "PercpuRef is no longer 64 bytes: update the docs that quote its size"
);

/// What the kernel keeps in `percpu_ref_data` besides the count.
struct SwitchState {
    /// Sticky: set by `switch_to_atomic`, cleared by `switch_to_percpu`.
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
            .store(0, std::sync::atomic::Ordering::Relaxed);
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
struct Deferred {
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
            mode: AtomicUsize::new(mode),
            counters,
            count: AtomicCount::new(count),
            switch: Mutex::new(SwitchState {
                force_atomic: flags.contains(InitFlags::INIT_ATOMIC),
                allow_reinit: atomic || flags.contains(InitFlags::ALLOW_REINIT),
            }),
            switch_owner: std::sync::atomic::AtomicUsize::new(0),
            release: Box::new(release),
            _pinned: PhantomPinned,
        })
    }

    // ----- get / put --------------------------------------------------------

    /// Takes a reference. The caller must already hold one.
    ///
    /// # Panics
    ///
    /// If the count is zero (the ref was released): that is a use after
    /// release; use [`tryget`](Self::tryget) to take a first reference. If
    /// the count would pass 2^62 - 1 (an overflow, as `Arc`'s abort): in
    /// atomic mode the count is then saturated (one unconditional add
    /// passed the limit): the ref is miscounted and never releases, as the
    /// kernel's `rcuref_t` leaks a saturated object.
    #[inline]
    pub fn get(&self) {
        self.get_many(1);
    }

    /// Takes `n` references. The caller must already hold one.
    ///
    /// `n` below 2^16 counts per CPU; a larger `n` takes the atomic path
    /// (exact on every backend, and checked for overflow at once).
    ///
    /// # Panics
    ///
    /// If the count is zero, if `n` is above 2^62 - 1, or on an overflow:
    /// as [`get`](Self::get) for `n` below 2^16; a larger `n` is refused
    /// before it writes and leaves the count unchanged.
    #[inline]
    pub fn get_many(&self, n: usize) {
        let n = checked_n("get_many", n);
        if n != 0 && !self.try_add_percpu(n, n) {
            self.get_atomic(n);
        }
    }

    /// The per-CPU path, for deltas small enough that no per-CPU counter
    /// (nor a sharded backend's seal) can be pushed out of its range.
    #[inline(always)]
    fn try_add_percpu(&self, n: u64, delta: u64) -> bool {
        n < PERCPU_N_LIMIT && self.try_add_counters(delta)
    }

    /// The per-CPU add ([`Counters::try_add_raw`]) on a ref that `&self`
    /// keeps alive.
    #[inline(always)]
    fn try_add_counters(&self, delta: u64) -> bool {
        // SAFETY: `&self` keeps the ref alive across the add; both
        // pointers come from it, `mode` first and `counters` right after.
        unsafe { Counters::try_add_raw(&raw const self.counters, &raw const self.mode, delta) }
    }

    /// The atomic-mode get: one `fetch_add` ([`AtomicCount::get`]).
    #[inline(never)]
    fn get_atomic(&self, n: u64) {
        match self.count.get(n) {
            AddOutcome::Added => {}
            AddOutcome::Released { release } => self.get_released(n, release),
            AddOutcome::Overflow { count } => overflow("get_many", n, count, parks(n)),
        }
    }

    /// A get on a released ref: misuse. Runs `release` when the get's
    /// give-back was the last landing on zero (a revival raced it).
    #[cold]
    fn get_released(&self, n: u64, release: bool) -> ! {
        if release {
            (self.release)(self);
        }
        panic!(
            "percpu_ref::get_many({n}): the count is 0 (the ref was released); \
             get needs a reference already held, use tryget"
        )
    }

    /// Drops a reference; the last one runs `release`.
    ///
    /// # Panics
    ///
    /// On an underflow (more puts than gets) found in atomic mode; the count
    /// is left unchanged. In percpu mode an underflow is only found by the
    /// next switch to atomic mode. A panic of `release` propagates (the
    /// count is zero and stays so).
    #[inline]
    pub fn put(&self) {
        self.put_many(1);
    }

    /// Drops `n` references; the last one runs `release`.
    ///
    /// # Panics
    ///
    /// As [`put`](Self::put), or if `n` is above 2^62 - 1.
    #[inline]
    pub fn put_many(&self, n: usize) {
        // SAFETY: `&self` keeps the ref alive, and the caller's `n`
        // references are given up here (the contract of `put_many`).
        unsafe { Self::put_many_raw(self, n) }
    }

    /// [`put_many`](Self::put_many) through a pointer, for owners that free
    /// the ref when it is released (the owned and css layers).
    ///
    /// A put that is not the last can still be running when another
    /// thread's last put releases the ref and the owner frees it. This path
    /// holds no `&PercpuRef` across its decrement: it copies what the
    /// per-CPU add needs first (`Counters::try_add_raw`) and decrements the atomic
    /// counter through a reference to that atomic alone, and it forms
    /// `&PercpuRef` again only to call `release`, when its own put was the
    /// last. A `&self` method would keep a borrow of freed memory alive
    /// until it returned.
    ///
    /// # Safety
    ///
    /// `this` points to a live `PercpuRef` on which the caller holds `n`
    /// references, which it gives up.
    #[inline]
    pub(crate) unsafe fn put_many_raw(this: *const Self, n: usize) {
        let n = checked_n("put_many", n);
        if n == 0 {
            return;
        }
        // SAFETY: the caller's references keep `*this` alive until our
        // decrement; no borrow formed here outlives it, except the mode
        // word's (an atomic: allowed to dangle, as `Arc`'s counter).
        let counted = n < PERCPU_N_LIMIT
            && unsafe {
                Counters::try_add_raw(
                    &raw const (*this).counters,
                    &raw const (*this).mode,
                    n.wrapping_neg(),
                )
            };
        if !counted {
            // SAFETY: as above.
            unsafe { Self::put_atomic_raw(this, n) }
        }
    }

    /// # Safety
    ///
    /// As [`put_many_raw`](Self::put_many_raw).
    #[inline(never)]
    unsafe fn put_atomic_raw(this: *const Self, n: u64) {
        // SAFETY: alive until our decrement; `count` is only atomics.
        let count = unsafe { &(*this).count };
        match count.put(n) {
            PutOutcome::Alive => {}
            PutOutcome::ReachedZero => {
                // SAFETY: ours was the last reference and won the election:
                // nobody can free the ref before its release has run.
                let r = unsafe { &*this };
                (r.release)(r);
            }
            PutOutcome::Underflow { count, release } => {
                if release {
                    // SAFETY: as above: this thread's give-back won the
                    // election, so the release is ours to run.
                    let r = unsafe { &*this };
                    (r.release)(r);
                }
                panic!("{}", underflow_message("put_many", n, count))
            }
        }
    }

    /// Takes a reference unless the count is zero.
    ///
    /// # Panics
    ///
    /// On an overflow, as [`get`](Self::get).
    ///
    /// # Examples
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// let r = percpu_ref::PercpuRef::new(|_| {});
    /// if r.tryget() {
    ///     // ... use what the ref guards ...
    ///     r.put();
    /// }
    /// ```
    ///
    /// A `true` result is a reference: ignoring it leaks one, so it is
    /// `#[must_use]` (a warning by default, an error here):
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// let r = percpu_ref::PercpuRef::new(|_| {});
    /// r.tryget();
    /// ```
    #[inline]
    #[must_use = "a `true` result is a reference taken: dropping it without a matching `put` \
                  leaks that reference, and the ref is never released"]
    pub fn tryget(&self) -> bool {
        self.tryget_many(1)
    }

    /// Takes `n` references unless the count is zero.
    ///
    /// # Panics
    ///
    /// If `n` is above 2^62 - 1, or on an overflow.
    #[inline]
    #[must_use = "a `true` result is `n` references taken: dropping it without a matching `put` \
                  leaks them, and the ref is never released"]
    pub fn tryget_many(&self, n: usize) -> bool {
        let n = checked_n("tryget_many", n);
        self.try_add_percpu(n, n) || self.tryget_atomic("tryget_many", n)
    }

    /// The atomic-mode tryget: one `fetch_add` ([`AtomicCount::tryget`]).
    /// A tryget that lands on a released ref gives its increment back, and
    /// runs `release` itself when that give-back was the last landing on
    /// zero (a revival raced it; see `atomic_mode`, invariant 3).
    #[inline(never)]
    fn tryget_atomic(&self, op: &str, n: u64) -> bool {
        match self.count.tryget(n) {
            AddOutcome::Added => true,
            AddOutcome::Released { release } => {
                if release {
                    (self.release)(self);
                }
                false
            }
            AddOutcome::Overflow { count } => overflow(op, n, count, parks(n)),
        }
    }

    /// Takes a reference unless the ref is dead (killed) or its count is
    /// zero. Once a `kill_and_confirm`'s confirm has run, no `tryget_live`
    /// that starts afterwards on any thread succeeds.
    ///
    /// # Panics
    ///
    /// On an overflow, as [`get`](Self::get).
    #[inline]
    #[must_use = "a `true` result is a reference taken: dropping it without a matching `put` \
                  leaks that reference, and the ref is never released"]
    pub fn tryget_live(&self) -> bool {
        // The mode first: the sharded backend's shards count until they are
        // sealed, which a deferred kill leaves to the engine, but a kill
        // that returned must already fail every tryget_live (the rseq
        // section tests the mode itself; this load shares its cache line).
        // ordering-audit: Relaxed: a snapshot, as `mode()`: a tryget_live
        // ordered after the kill sees ATOMIC by coherence, and one that
        // misses it races with the kill, which may go either way.
        // mutant tryget_live_no_mode_check: count on unsealed shards after a
        // deferred kill returned.
        let percpu = mutant!(
            "tryget_live_no_mode_check",
            self.mode.load(Ordering::Relaxed) & MODE_ATOMIC == 0,
            true
        );
        percpu && self.try_add_counters(1) || self.tryget_live_atomic()
    }

    #[inline(never)]
    fn tryget_live_atomic(&self) -> bool {
        // mutant tryget_live_no_dead_check: behave as tryget.
        let alive = mutant!(
            "tryget_live_no_dead_check",
            self.mode() & MODE_DEAD == 0,
            true
        );
        alive && self.tryget_atomic("tryget_live", 1)
    }

    // ----- kill -------------------------------------------------------------

    /// Kills the ref: no `tryget_live` succeeds any more, the ref switches to
    /// atomic mode, and the base reference is dropped (releasing the ref if
    /// it was the last one). Returns once the switch is complete.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] if the ref is already dead;
    /// [`Error::GracePeriodFailed`] if the kernel refused the grace period.
    /// Nothing changes on error.
    #[must_use = "an `Err` means this call killed nothing and dropped no reference (the ref was \
                  already dead, or the grace period was refused and the ref is unchanged)"]
    pub fn kill(&self) -> Result<(), Error> {
        self.kill_and_confirm(|_| {})
    }

    /// As [`kill`](Self::kill), running `confirm` once the ref is atomic and
    /// no `tryget_live` can succeed; `release` (if due) runs after it.
    ///
    /// `confirm` runs on the calling thread before this returns, with the
    /// switch lock held: it may get, put and tryget on this ref, but a switch
    /// operation (kill, switch, reinit, resurrect) on the same ref panics.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] if the ref is already dead;
    /// [`Error::GracePeriodFailed`] if the kernel refused the grace period.
    /// On error `confirm` is not run and nothing changes.
    ///
    /// # Panics
    ///
    /// If `confirm` panics, after the kill is complete (the base and the
    /// temporary references are put, and `release` has run if it was due):
    /// the panic is resumed. Also on misuse the fold finds (an underflow or
    /// overflow of the count), after the kill is complete.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::PercpuRef;
    /// let r = PercpuRef::new(|_| {});
    /// r.kill_and_confirm(|r| assert!(!r.tryget_live())).unwrap();
    /// assert!(r.kill().is_err());
    /// ```
    #[must_use = "an `Err` means this call killed nothing, dropped no reference and did not run \
                  `confirm` (the ref was already dead, or the grace period was refused)"]
    pub fn kill_and_confirm(&self, confirm: impl FnOnce(&PercpuRef)) -> Result<(), Error> {
        let mut g = self.lock_switch("kill_and_confirm");
        let mode = self.mode();
        if mode & MODE_DEAD != 0 {
            return Err(Error::AlreadyDead {
                op: "kill_and_confirm",
            });
        }
        let mut deferred = Deferred::default();
        // mutant base_put_first: drop the base reference before switching.
        let base_put_first = mutated!("base_put_first");
        if base_put_first {
            self.put_locked(&mut deferred, "kill_and_confirm (base reference)");
        }
        // mutant dead_after_confirm: mark dead only once confirm has run.
        let dead_first = !mutated!("dead_after_confirm");
        // mutant kill_atomic_skips_dead: kill an already-atomic ref without DEAD.
        let mark_dead = mode & MODE_ATOMIC == 0 || !mutated!("kill_atomic_skips_dead");
        if dead_first && mark_dead {
            // ordering-audit: Relaxed: DEAD publishes nothing. A tryget_live ordered
            // after the kill sees it by coherence; one racing the kill may succeed
            // either way, as in the kernel.
            self.mode.store(mode | MODE_DEAD, Ordering::Relaxed);
        }
        let switch = self.switch_to_atomic_locked(&mut g, confirm, mode, "kill_and_confirm")?;
        if !dead_first {
            // ordering-audit: mutant only (dead_after_confirm): never runs in a real build.
            self.mode.store(self.mode() | MODE_DEAD, Ordering::Relaxed);
        }
        self.finish_atomic_switch(&mut deferred, switch, "kill_and_confirm", !base_put_first);
        drop(g);
        self.run_deferred(deferred);
        Ok(())
    }

    // ----- deferred (asynchronous) switches -------------------------------

    /// Kills the ref without waiting for a grace period: the kernel's
    /// `percpu_ref_kill`. Returns without a system call; the switch to
    /// atomic mode is completed later by the process's grace-period engine
    /// (a background thread, `percpu-ref-gp`), which then drops the base
    /// reference (and releases the ref if it was the last).
    ///
    /// As soon as this returns the ref is dying: [`is_dying`](Self::is_dying)
    /// is true and no [`tryget_live`](Self::tryget_live) succeeds. Gets and
    /// puts go on working, on the atomic counter (exact in either mode).
    /// One grace period completes every deferred switch queued in the same
    /// ~1 ms (up to 4096 of them), so a stream of kills costs a few
    /// `membarrier`s instead of one each. [`flush`](crate::flush) waits
    /// for every deferred switch queued before it.
    ///
    /// The engine keeps the ref's address, hence `Pin`: pin the ref where it
    /// lives ([`Box::pin`], [`Arc::pin`](std::sync::Arc::pin),
    /// [`std::pin::pin!`]) and call this through `as_ref()`. Dropping the
    /// ref waits until the engine is done with it; another switch of the
    /// same ref (kill, switch, reinit, resurrect, sync or deferred) waits
    /// for it too.
    ///
    /// A ref already in atomic mode needs no grace period: it is killed on
    /// the calling thread before this returns, as [`kill`](Self::kill).
    ///
    /// The sharded backend needs no grace period either (each shard is
    /// sealed by itself), but its deferred switches go through the engine
    /// all the same, so that both backends behave alike: dying on return,
    /// `confirm` and the puts on the engine thread, [`flush`](crate::flush)
    /// as the barrier. A batch of sharded refs only skips the `membarrier`.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] if the ref is already dead (nothing changes).
    ///
    /// # Panics
    ///
    /// When called from a deferred confirm or release of this same ref
    /// (switches are serialised: it would wait for itself).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::PercpuRef;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let released = Arc::new(AtomicBool::new(false));
    /// let rel = released.clone();
    /// let r = Box::pin(PercpuRef::new(move |_| rel.store(true, Ordering::SeqCst)));
    /// r.get();
    /// r.as_ref().kill_deferred().unwrap();
    /// assert!(r.is_dying() && !r.tryget_live()); // already, before any grace period
    /// percpu_ref::flush(); // the engine completed the kill, put the base reference
    /// assert_eq!(r.atomic_count(), Some(1));
    /// r.put();
    /// assert!(released.load(Ordering::SeqCst));
    /// ```
    ///
    /// Pinned on the stack: the ref must not move (or be forgotten) once
    /// killed, which `pin!` guarantees.
    ///
    /// ```
    /// use percpu_ref::PercpuRef;
    /// let r = std::pin::pin!(PercpuRef::new(|_| {}));
    /// r.as_ref().kill_deferred().unwrap();
    /// assert!(r.as_ref().kill_deferred().is_err()); // already dead
    /// // Dropping `r` here waits for the engine if the kill is still pending.
    /// ```
    #[must_use = "an `Err` means this call killed nothing: the ref was already dead"]
    pub fn kill_deferred(self: Pin<&Self>) -> Result<(), Error> {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::kill_deferred_raw(self.get_ref(), None, "kill_deferred") }
    }

    /// As [`kill_deferred`](Self::kill_deferred), running `confirm` once the
    /// switch is complete (after the grace period, before the base and
    /// temporary references are put, so before any release): the kernel's
    /// `percpu_ref_kill_and_confirm`.
    ///
    /// `confirm` runs on the engine thread (on the calling thread, before
    /// this returns, if the ref was already atomic). It may get, put and
    /// tryget on this ref, and switch *other* refs (deferred or not); a
    /// switch of this ref or [`flush`](crate::flush) from it panics. A
    /// panic of `confirm` (or of `release`) on the engine is caught and
    /// reported on stderr, naming the operation; the kill completes
    /// anyway.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] if the ref is already dead; `confirm` is then
    /// dropped without running.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::PercpuRef;
    /// use std::sync::mpsc;
    ///
    /// let r = std::sync::Arc::pin(PercpuRef::new(|_| {}));
    /// let (tx, rx) = mpsc::channel();
    /// r.as_ref()
    ///     .kill_and_confirm_deferred(move |r| tx.send(r.tryget_live()).unwrap())
    ///     .unwrap();
    /// assert_eq!(rx.recv().unwrap(), false); // confirm ran on the engine thread
    /// ```
    #[must_use = "an `Err` means this call killed nothing and will not run `confirm`"]
    pub fn kill_and_confirm_deferred(
        self: Pin<&Self>,
        confirm: impl FnOnce(&PercpuRef) + Send + 'static,
    ) -> Result<(), Error> {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe {
            Self::kill_deferred_raw(
                self.get_ref(),
                Some(Confirm::new(confirm)),
                "kill_and_confirm_deferred",
            )
        }
    }

    /// Switches to atomic mode (sticky, as [`switch_to_atomic`](Self::switch_to_atomic))
    /// without waiting for the grace period: returns at once with the ref in
    /// atomic mode for every new get and put; the engine folds the per-CPU
    /// counts in later. Pinning, waiting and the already-atomic case are as
    /// for [`kill_deferred`](Self::kill_deferred).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = Box::pin(PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT));
    /// r.get();
    /// r.as_ref().switch_to_atomic_deferred();
    /// assert!(!r.is_percpu());
    /// r.switch_to_percpu().unwrap(); // waits for the pending switch first
    /// assert!(r.is_percpu());
    /// r.put();
    /// ```
    pub fn switch_to_atomic_deferred(self: Pin<&Self>) {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::switch_deferred_raw(self.get_ref(), None) }
    }

    /// As [`switch_to_atomic_deferred`](Self::switch_to_atomic_deferred),
    /// running `confirm` once the switch is complete, on the engine thread
    /// (same rules as for [`kill_and_confirm_deferred`](Self::kill_and_confirm_deferred)).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::PercpuRef;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    ///
    /// let seen = Arc::new(AtomicU64::new(0));
    /// let r = Box::pin(PercpuRef::new(|_| {}));
    /// r.get_many(4);
    /// let s = seen.clone();
    /// r.as_ref().switch_to_atomic_and_confirm_deferred(move |r| {
    ///     s.store(r.atomic_count().unwrap(), Ordering::SeqCst)
    /// });
    /// percpu_ref::flush();
    /// assert_eq!(seen.load(Ordering::SeqCst), 6); // base + 4 + the temporary reference
    /// r.put_many(4);
    /// ```
    pub fn switch_to_atomic_and_confirm_deferred(
        self: Pin<&Self>,
        confirm: impl FnOnce(&PercpuRef) + Send + 'static,
    ) {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::switch_deferred_raw(self.get_ref(), Some(Confirm::new(confirm))) }
    }

    /// Waits until every deferred switch queued before the call has
    /// completed; the same as [`percpu_ref::flush`](crate::flush).
    ///
    /// # Panics
    ///
    /// As [`flush`](crate::flush).
    ///
    /// # Examples
    ///
    /// ```
    /// let r = Box::pin(percpu_ref::PercpuRef::new(|_| {}));
    /// r.as_ref().kill_deferred().unwrap();
    /// percpu_ref::PercpuRef::flush();
    /// assert!(r.is_zero());
    /// ```
    pub fn flush() {
        flush();
    }

    /// [`kill_and_confirm_deferred`](Self::kill_and_confirm_deferred)
    /// through a pointer, for the crate's layers whose refs live at a stable
    /// address without a `Pin` (the owned layer's heap block, the css model).
    ///
    /// # Safety
    ///
    /// `this` points to a live `PercpuRef` that does not move until it is
    /// dropped (its `Drop` then waits for the engine), as `Pin` would
    /// guarantee.
    pub(crate) unsafe fn kill_deferred_raw(
        this: *const Self,
        confirm: Option<Confirm>,
        op: &'static str,
    ) -> Result<(), Error> {
        // SAFETY: live (the caller's contract).
        let r = unsafe { &*this };
        let g = r.lock_switch(op);
        let mode = r.mode();
        if mode & MODE_DEAD != 0 {
            return Err(Error::AlreadyDead { op });
        }
        if mode & MODE_ATOMIC != 0 {
            r.kill_atomic_inline(g, confirm, op);
            return Ok(());
        }
        // mutant engine_dead_late: a deferred kill marks the ref dead only
        // when the engine completes it.
        let mode = mutant!("engine_dead_late", mode | MODE_DEAD, mode);
        r.start_deferred_switch(g, mode);
        // SAFETY: pinned and now pending (the caller's contract).
        unsafe { r.enqueue_deferred(Self::complete_deferred_kill, confirm) };
        Ok(())
    }

    /// [`switch_to_atomic_and_confirm_deferred`](Self::switch_to_atomic_and_confirm_deferred)
    /// through a pointer.
    ///
    /// # Safety
    ///
    /// As [`kill_deferred_raw`](Self::kill_deferred_raw).
    pub(crate) unsafe fn switch_deferred_raw(this: *const Self, confirm: Option<Confirm>) {
        // SAFETY: live (the caller's contract).
        let r = unsafe { &*this };
        let mut g = r.lock_switch("switch_to_atomic_deferred");
        g.state.force_atomic = true;
        let mode = r.mode();
        if mode & MODE_ATOMIC != 0 {
            let s = AtomicSwitch {
                temp_ref: false,
                miscount: None,
                confirm_panic: confirm.and_then(|c| r.run_confirm(|r| c.call(r))),
            };
            let mut deferred = Deferred::default();
            r.finish_atomic_switch(&mut deferred, s, "switch_to_atomic_deferred", false);
            drop(g);
            r.run_deferred(deferred);
            return;
        }
        r.start_deferred_switch(g, mode);
        // SAFETY: pinned and now pending (the caller's contract).
        unsafe { r.enqueue_deferred(Self::complete_deferred_switch, confirm) };
    }

    /// A deferred kill of a ref already in atomic mode: no grace period is
    /// needed, so it completes here, as `kill_and_confirm` does.
    fn kill_atomic_inline(&self, g: SwitchGuard<'_>, confirm: Option<Confirm>, op: &str) {
        // ordering-audit: Relaxed: as in `kill_and_confirm`, DEAD publishes nothing.
        self.mode.store(self.mode() | MODE_DEAD, Ordering::Relaxed);
        let s = AtomicSwitch {
            temp_ref: false,
            miscount: None,
            confirm_panic: confirm.and_then(|c| self.run_confirm(|r| c.call(r))),
        };
        let mut deferred = Deferred::default();
        self.finish_atomic_switch(&mut deferred, s, op, true);
        drop(g);
        self.run_deferred(deferred);
    }

    /// Steps 1 and 2 of the switch (set `ATOMIC`, take the temporary
    /// reference), marking the switch pending; the engine does the rest.
    /// `mode` is the word to start from (with `DEAD` for a kill).
    fn start_deferred_switch(&self, g: SwitchGuard<'_>, mode: usize) {
        // ordering-audit: Relaxed: as in `switch_to_atomic_locked`; the
        // queue's lock orders this store before the engine's grace period,
        // and the engine's cookie RMW before any other that completes it.
        self.mode.store(
            mode & !MODE_LIMIT | MODE_ATOMIC | MODE_PENDING,
            Ordering::Relaxed,
        );
        self.count.add_temp_ref();
        drop(g);
    }

    /// Queues this pending ref's completion on the engine.
    ///
    /// # Safety
    ///
    /// The ref is pinned and pending: it stays at its address until its
    /// `Drop`, which waits until [`complete_deferred`](Self::complete_deferred)
    /// cleared the pending bit (the engine's invariant 4).
    unsafe fn enqueue_deferred(&self, complete: grace::Complete, confirm: Option<Confirm>) {
        let needs_gp = self.counters.needs_grace_period();
        // SAFETY: `complete` is one of this type's completions, for which
        // the ref is alive until it returns (the caller's contract).
        let entry = unsafe { Entry::new(self.addr(), complete, confirm.map(|c| c.0), needs_gp) };
        grace::enqueue(entry);
    }

    /// [`complete_deferred`](Self::complete_deferred) of a kill, as the
    /// engine calls it.
    ///
    /// # Safety
    ///
    /// As `complete_deferred`; `this` is a `PercpuRef`'s address and the
    /// callback its `Confirm`'s.
    unsafe fn complete_deferred_kill(this: *const (), confirm: Option<Callback>) {
        // SAFETY: forwarded.
        unsafe { Self::complete_deferred(this.cast(), true, confirm.map(Confirm)) }
    }

    /// [`complete_deferred`](Self::complete_deferred) of a switch to atomic
    /// mode, as the engine calls it.
    ///
    /// # Safety
    ///
    /// As [`complete_deferred_kill`](Self::complete_deferred_kill).
    unsafe fn complete_deferred_switch(this: *const (), confirm: Option<Callback>) {
        // SAFETY: forwarded.
        unsafe { Self::complete_deferred(this.cast(), false, confirm.map(Confirm)) }
    }

    /// The engine's part of a deferred switch, once the batch's grace
    /// period has passed: sum, fold, `confirm`, put the base reference (a
    /// kill) and the temporary one, release if due, then clear the pending
    /// bit. Panics of `confirm` and `release`, and misuse the fold found,
    /// are reported on stderr (there is no caller to hand them to).
    ///
    /// # Safety
    ///
    /// `this` is pending and pinned (see `enqueue_deferred`): alive until
    /// the pending bit is cleared here, or until its release drops it on
    /// this thread (`grace::freed`); nothing is touched after either.
    unsafe fn complete_deferred(this: *const Self, kill: bool, confirm: Option<Confirm>) {
        // SAFETY: alive until the end (the caller's contract); `r` is not
        // used after `release` if the release dropped the ref.
        let r = unsafe { &*this };
        let op = if kill {
            "kill_deferred"
        } else {
            "switch_to_atomic_deferred"
        };
        if kill && mutated!("engine_dead_late") {
            // ordering-audit: mutant only (engine_dead_late).
            r.mode.fetch_or(MODE_DEAD, Ordering::Relaxed);
        }
        let sum = r.counters.sum_after_grace_period();
        let miscount = miscount_message(r.count.fold_percpu_sum(sum), op);
        let mut d = Deferred::default();
        // mutant engine_temp_put_before_confirm: put the temporary (and
        // base) reference, releasing if due, before confirm.
        let puts_first = mutated!("engine_temp_put_before_confirm");
        if puts_first {
            let s = AtomicSwitch {
                temp_ref: true,
                miscount: None,
                confirm_panic: None,
            };
            r.finish_atomic_switch(&mut d, s, op, kill);
            if std::mem::take(&mut d.release) {
                (r.release)(r);
            }
        }
        let s = AtomicSwitch {
            temp_ref: !puts_first,
            miscount,
            confirm_panic: confirm.and_then(|c| r.run_confirm(|r| c.call(r))),
        };
        r.finish_atomic_switch(&mut d, s, op, kill && !puts_first);
        if let Some(payload) = d.confirm_panic.take() {
            report_engine_panic(op, "confirm", &*payload);
        }
        if let Some(msg) = d.panic.take() {
            eprintln!("percpu_ref: grace-period engine: {msg}");
        }
        if d.release {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (r.release)(r))) {
                report_engine_panic(op, "release", &*payload);
            }
            if grace::freed() {
                return;
            }
        }
        // The engine's last access to the ref (module `grace`, invariant 4).
        // Release: pairs with `is_pending`'s acquire, so everything done to
        // the ref here happens before a waiter's next switch or free.
        // mutant engine_pending_clear_relaxed: clear the pending bit without
        // release.
        let order = mutant!(
            "engine_pending_clear_relaxed",
            Ordering::Release,
            Ordering::Relaxed
        );
        r.mode.fetch_and(!MODE_PENDING, order);
    }

    // ----- for the layers above: a release that runs on the engine -------

    /// Whether this thread is the grace-period engine completing this ref's
    /// deferred switch: the `confirm` or `release` asking runs there, and
    /// no call of the layer's is around it to finish what it starts.
    pub(crate) fn completing_on_engine(&self) -> bool {
        grace::completing(self.addr())
    }

    /// Runs `f` on this thread once the engine no longer touches this ref,
    /// before it completes the next one: for a `confirm` or `release` on
    /// the engine ([`completing_on_engine`](Self::completing_on_engine))
    /// whose work may free the memory that holds the ref. A panic of `f`
    /// is reported on stderr.
    ///
    /// # Panics
    ///
    /// When this thread is not completing this ref's deferred switch.
    pub(crate) fn after_engine_completion(&self, f: Box<dyn FnOnce()>) {
        assert!(
            self.completing_on_engine(),
            "PercpuRef::after_engine_completion outside the completion of this ref's deferred switch"
        );
        grace::after_completion(f);
    }

    /// Waits until the engine completed this ref's deferred switch (at once
    /// if none is pending). False, without waiting, on the engine while the
    /// switch is still pending: it would wait for itself.
    pub(crate) fn wait_deferred_switch(&self) -> bool {
        if !self.is_pending() {
            return true;
        }
        if grace::on_engine() {
            return false;
        }
        grace::wait_until(|| self.is_pending());
        true
    }

    /// Whether a wait on this thread for what this ref's deferred switch
    /// will do would wait for itself: this thread is the engine and the
    /// switch is still pending.
    pub(crate) fn deferred_switch_waits_for_this_thread(&self) -> bool {
        grace::on_engine() && self.is_pending()
    }

    /// A thread is about to block until this ref's deferred switch has
    /// done its part (its release, say): the engine takes its queue now
    /// instead of gathering more switches. Under loom, where there is no
    /// engine thread, this thread completes the queue itself.
    #[cfg_attr(
        loom,
        allow(
            clippy::unused_self,
            reason = "under loom every queued switch is completed"
        )
    )]
    pub(crate) fn hurry_deferred_switch(&self) {
        #[cfg(percpu_ref_loom)]
        while grace::loom_step() {}
        #[cfg(not(percpu_ref_loom))]
        if self.is_pending() {
            grace::hurry();
        }
    }

    // ----- mode switches ----------------------------------------------------

    /// Switches to atomic mode and keeps the ref there (sticky) until
    /// [`switch_to_percpu`](Self::switch_to_percpu). Returns when the switch
    /// is complete: the kernel's `percpu_ref_switch_to_atomic_sync`.
    ///
    /// # Panics
    ///
    /// As [`switch_to_atomic_and_confirm`](Self::switch_to_atomic_and_confirm).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT);
    /// r.get();
    /// r.switch_to_atomic();
    /// assert_eq!(r.atomic_count(), Some(2));
    /// r.switch_to_percpu().unwrap();
    /// assert!(r.is_percpu());
    /// ```
    pub fn switch_to_atomic(&self) {
        self.switch_to_atomic_and_confirm(|_| {});
    }

    /// The kernel's name for [`switch_to_atomic`](Self::switch_to_atomic),
    /// which already waits for the switch to complete.
    ///
    /// # Panics
    ///
    /// As [`switch_to_atomic_and_confirm`](Self::switch_to_atomic_and_confirm).
    pub fn switch_to_atomic_sync(&self) {
        self.switch_to_atomic();
    }

    /// As [`switch_to_atomic`](Self::switch_to_atomic), running `confirm`
    /// once the switch is complete (immediately if already atomic), as the
    /// kernel's `percpu_ref_switch_to_atomic(ref, confirm)`. Same rules for
    /// `confirm` as [`kill_and_confirm`](Self::kill_and_confirm).
    ///
    /// # Panics
    ///
    /// If `confirm` panics (resumed once the switch is complete), on misuse
    /// the fold finds, and if the kernel refused the grace period: the
    /// switch is then undone first, so the ref is exactly as it was, and
    /// `confirm` has not run.
    pub fn switch_to_atomic_and_confirm(&self, confirm: impl FnOnce(&PercpuRef)) {
        let mut g = self.lock_switch("switch_to_atomic");
        let was_forced = std::mem::replace(&mut g.state.force_atomic, true);
        let mode = self.mode();
        let switch = match self.switch_to_atomic_locked(&mut g, confirm, mode, "switch_to_atomic") {
            Ok(s) => s,
            Err(e) => {
                g.state.force_atomic = was_forced;
                drop(g);
                panic!("{e}");
            }
        };
        let mut deferred = Deferred::default();
        self.finish_atomic_switch(&mut deferred, switch, "switch_to_atomic", false);
        drop(g);
        self.run_deferred(deferred);
    }

    /// Clears the sticky atomic mode and goes back to percpu mode, unless the
    /// ref is dead (then it goes percpu when revived).
    ///
    /// # Errors
    ///
    /// [`Error::ReinitNotAllowed`] when the ref is atomic and was made
    /// without `ALLOW_REINIT`; [`Error::Released`] when its count is zero
    /// (a released ref stays released until [`reinit`](Self::reinit));
    /// [`Error::Miscounted`] after an underflow or overflow. Nothing changes
    /// on error.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{Error, InitFlags, PercpuRef};
    /// let r = PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT);
    /// r.switch_to_atomic();
    /// r.put(); // the last reference: released
    /// assert!(matches!(r.switch_to_percpu(), Err(Error::Released { .. })));
    /// assert!(!r.tryget());
    /// ```
    #[must_use = "an `Err` means nothing changed: the ref stays in atomic mode, still sticky"]
    pub fn switch_to_percpu(&self) -> Result<(), Error> {
        let mut g = self.lock_switch("switch_to_percpu");
        let mode = self.mode();
        if mode & MODE_ATOMIC == 0 {
            return Ok(());
        }
        if !g.state.allow_reinit {
            return Err(Error::ReinitNotAllowed {
                op: "switch_to_percpu",
            });
        }
        // mutant percpu_switch_ignores_dead: a dead ref goes back to percpu mode.
        if mode & MODE_DEAD == 0 || mutated!("percpu_switch_ignores_dead") {
            self.switch_to_percpu_locked("switch_to_percpu")?;
        }
        g.state.force_atomic = false;
        Ok(())
    }

    // ----- revival ----------------------------------------------------------

    /// Brings a killed ref back to life: clears dead, takes a new base
    /// reference, and returns to percpu mode unless forced atomic. The count
    /// need not be zero (outstanding references stay counted).
    ///
    /// # Errors
    ///
    /// [`Error::NotDead`] if the ref is not dead; [`Error::ReinitNotAllowed`]
    /// if it would go back to percpu mode and was made without
    /// `ALLOW_REINIT`; [`Error::Miscounted`] after an underflow or overflow.
    /// Nothing changes on error.
    ///
    /// # Panics
    ///
    /// If the new base reference would overflow the count.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT);
    /// r.get();
    /// r.kill().unwrap();
    /// r.resurrect().unwrap();
    /// assert!(r.tryget_live() && r.is_percpu());
    /// ```
    #[must_use = "an `Err` means nothing changed: the ref was not revived and took no new base \
                  reference"]
    pub fn resurrect(&self) -> Result<(), Error> {
        let mut g = self.lock_switch("resurrect");
        if self.mode() & MODE_DEAD == 0 {
            return Err(Error::NotDead { op: "resurrect" });
        }
        self.revive_locked(&mut g, "resurrect", false)
    }

    /// Re-initialises a ref whose count is zero: as
    /// [`resurrect`](Self::resurrect), but requires the count to be zero
    /// (the ref need not be dead).
    ///
    /// # Errors
    ///
    /// [`Error::NotZero`] if the count is not zero;
    /// [`Error::ReinitNotAllowed`] as for `resurrect`. Nothing changes on
    /// error.
    #[must_use = "an `Err` means nothing changed: the ref was not re-initialised and took no new \
                  base reference"]
    pub fn reinit(&self) -> Result<(), Error> {
        let mut g = self.lock_switch("reinit");
        if self.mode() & MODE_ATOMIC == 0 {
            return Err(Error::NotZero {
                op: "reinit",
                count: None,
            });
        }
        // Under the lock, a true count of zero stays zero: only a revival
        // leaves the released zone, and a tryget that lands on a count
        // being released waits for its election (`AtomicCount::revive`).
        match self.count.true_count() {
            Some(0) => self.revive_locked(&mut g, "reinit", true),
            count => Err(Error::NotZero {
                op: "reinit",
                count: Some(count.unwrap_or_else(|| self.count.load())),
            }),
        }
    }

    /// Revives a dead or released ref under the switch lock (`reinit`
    /// with `require_zero`: the count is decided in the same step as the
    /// new base reference, since a tryget may revive a count that a put is
    /// still releasing).
    fn revive_locked(
        &self,
        g: &mut SwitchGuard<'_>,
        op: &'static str,
        require_zero: bool,
    ) -> Result<(), Error> {
        if !g.state.allow_reinit && !g.state.force_atomic {
            return Err(Error::ReinitNotAllowed { op });
        }
        // The new base reference. Release: whoever takes a reference from
        // it (a tryget on the atomic path, before the mode goes percpu)
        // sees what the reviver wrote before reviving. Out of range stays
        // out of range (saturation and parking are sticky), so this refuses
        // a miscounted ref before anything changed.
        // mutant revive_no_base_ref: come back to life without a base reference.
        if !mutated!("revive_no_base_ref") {
            match self.count.revive(require_zero) {
                Ok(_) => {}
                Err(Refused::Overflow(count)) => overflow(op, 1, count, false),
                Err(Refused::Miscounted(count)) => return Err(Error::Miscounted { op, count }),
                Err(Refused::NotZero(count)) => {
                    return Err(Error::NotZero {
                        op,
                        count: Some(count),
                    })
                }
                Err(Refused::Released) => unreachable!("a revival refuses no count as released"),
            }
        }
        // ordering-audit: Relaxed: the count's add above (Release) publishes the revival; a
        // tryget_live that then takes a reference acquires it in its CAS on the count.
        self.mode.store(self.mode() & !MODE_DEAD, Ordering::Relaxed);
        if !g.state.force_atomic {
            self.switch_to_percpu_locked(op)?;
        }
        Ok(())
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
    /// pending (a pending switch is a switch in progress).
    fn lock_switch(&self, op: &'static str) -> SwitchGuard<'_> {
        let me = sync::thread_token();
        assert!(
            self.switch_owner.load(std::sync::atomic::Ordering::Relaxed) != me
                && !grace::completing(self.addr()),
            "percpu_ref::{op} called from inside a confirm callback (or a deferred release) on the same ref: \
             switches are serialised, so this would deadlock"
        );
        loop {
            let state = sync::lock(&self.switch);
            if !self.is_pending() {
                self.switch_owner
                    .store(me, std::sync::atomic::Ordering::Relaxed);
                return SwitchGuard { r: self, state };
            }
            drop(state);
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

    /// Waits until no `try_add` can count any more and returns the sum: the
    /// shared grace period (if the backend needs one), then the sum.
    fn seal_and_sum(&self) -> std::io::Result<u64> {
        if self.counters.needs_grace_period() {
            grace::synchronize_after_store()?;
        }
        Ok(self.counters.sum_after_grace_period())
    }

    /// Steps 1-5 of the switch to atomic mode, except dropping the temporary
    /// reference, which the caller does under the lock via
    /// [`finish_atomic_switch`](Self::finish_atomic_switch).
    ///
    /// `undo_mode` is the mode word to restore if the grace period fails
    /// (a kill has already set `DEAD`); the switch is then undone and
    /// `confirm` not run.
    fn switch_to_atomic_locked(
        &self,
        _g: &mut SwitchGuard<'_>,
        confirm: impl FnOnce(&PercpuRef),
        undo_mode: usize,
        op: &'static str,
    ) -> Result<AtomicSwitch, Error> {
        let mode = self.mode();
        if mode & MODE_ATOMIC != 0 {
            return Ok(AtomicSwitch {
                temp_ref: false,
                miscount: None,
                confirm_panic: self.run_confirm(confirm),
            });
        }
        // The rseq section's CPU bound goes to 0 with it (one compare tests both).
        // ordering-audit: Relaxed: an op that sees ATOMIC goes to the atomic counter, whose RMWs
        // read its latest value whatever this store's order; per-CPU adds made before it reach the
        // fold through the grace period, not through this store.
        self.mode
            .store(mode & !MODE_LIMIT | MODE_ATOMIC, Ordering::Relaxed);
        self.count.add_temp_ref();
        let sum = match self.seal_and_sum() {
            Ok(sum) => sum,
            Err(e) => {
                // Nothing was summed: percpu adds made meanwhile are still in
                // their counters, atomic ones in the biased counter.
                // ordering-audit: Relaxed: restores the word under the switch lock; the failed
                // switch published nothing.
                self.mode.store(undo_mode, Ordering::Relaxed);
                let _ = self.count.put(1);
                return Err(Error::GracePeriodFailed {
                    op,
                    errno: e.raw_os_error().unwrap_or(0),
                });
            }
        };
        let fold = self.count.fold_percpu_sum(sum);
        // mutant underflow_off_by_one: forget that the fold holds the temp ref.
        let fold = mutant!(
            "underflow_off_by_one",
            fold,
            if self.count.load() == 1 {
                Fold::Underflow(0)
            } else {
                fold
            }
        );
        let miscount = miscount_message(fold, op);
        // mutant confirm_after_put: drop the temporary reference before confirm.
        let put_first = mutated!("confirm_after_put");
        if put_first && self.count.put(1) == PutOutcome::ReachedZero {
            (self.release)(self);
        }
        Ok(AtomicSwitch {
            temp_ref: !put_first,
            miscount,
            confirm_panic: self.run_confirm(confirm),
        })
    }

    /// Runs `confirm`, catching a panic so that the switch can finish.
    fn run_confirm(&self, confirm: impl FnOnce(&PercpuRef)) -> Option<Box<dyn Any + Send>> {
        catch_unwind(AssertUnwindSafe(|| confirm(self))).err()
    }

    /// Records misuse the fold found, then puts the base reference (for a
    /// kill) and the temporary one, in the kernel's order. Runs under the
    /// lock; the returned release and panics run after unlock.
    fn finish_atomic_switch(&self, d: &mut Deferred, s: AtomicSwitch, op: &str, put_base: bool) {
        d.panic = s.miscount;
        d.confirm_panic = s.confirm_panic;
        if put_base {
            self.put_locked(d, op);
        }
        if s.temp_ref {
            self.put_locked(d, op);
        }
    }

    /// One put under the switch lock; release and panics are deferred.
    fn put_locked(&self, d: &mut Deferred, op: &str) {
        match self.count.put(1) {
            PutOutcome::Alive => {}
            PutOutcome::ReachedZero => d.release = true,
            PutOutcome::Underflow { count, release } => {
                d.release |= release;
                d.panic.get_or_insert(underflow_message(op, 1, count));
            }
        }
    }

    /// After unlock: release if due, then resume a panic of `confirm`, then
    /// report misuse.
    fn run_deferred(&self, d: Deferred) {
        if d.release {
            (self.release)(self);
        }
        if let Some(payload) = d.confirm_panic {
            resume_unwind(payload);
        }
        if let Some(msg) = d.panic {
            panic!("{msg}");
        }
    }

    /// Back to percpu mode, unless the count is zero (released) or broken;
    /// the caller checked `allow_reinit` and that the ref is alive and not
    /// forced atomic.
    fn switch_to_percpu_locked(&self, op: &'static str) -> Result<(), Error> {
        let mode = self.mode();
        if mode & MODE_ATOMIC == 0 {
            return Ok(());
        }
        // mutant bias_after_mode_store: add the bias once percpu counting has resumed.
        let bias_first = !mutated!("bias_after_mode_store");
        // mutant reset_after_mode_store: zero the counters after going percpu.
        let reset_first = !mutated!("reset_after_mode_store");
        if bias_first {
            self.add_bias(op)?;
        }
        if reset_first {
            self.counters.reset();
        }
        // Release: a percpu op that reads the cleared bit (on rseq, the
        // restored CPU bound) sees zeroed counters.
        let percpu = mode & !MODE_ATOMIC | self.counters.percpu_mode();
        // mutant percpu_mode_store_relaxed: publish the mode without release.
        let order = mutant!(
            "percpu_mode_store_relaxed",
            Ordering::Release,
            Ordering::Relaxed
        );
        self.mode.store(percpu, order);
        if !reset_first {
            self.counters.reset();
        }
        if !bias_first {
            self.add_bias(op)?;
        }
        Ok(())
    }

    /// Adds `BIAS` to the atomic count for percpu mode, unless the count is
    /// zero (released) or broken (miscounted).
    fn add_bias(&self, op: &'static str) -> Result<(), Error> {
        match self.count.add_bias() {
            Ok(_) => Ok(()),
            Err(Refused::Released) => Err(Error::Released { op }),
            Err(Refused::Miscounted(count)) => Err(Error::Miscounted { op, count }),
            Err(refused @ (Refused::Overflow(_) | Refused::NotZero(_))) => {
                unreachable!("percpu_ref::{op}: adding the bias was refused as {refused:?}")
            }
        }
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
        grace::wait_until(|| self.is_pending());
    }
}

/// Reports a panic of a deferred `confirm` or `release` (caught on the
/// engine thread, which goes on).
fn report_engine_panic(op: &str, what: &str, payload: &(dyn Any + Send)) {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a non-string payload)");
    eprintln!("percpu_ref: grace-period engine: the {what} callback of {op} panicked: {msg}");
}

/// On the fast path of every get and put: inlined, with the panic out of line.
#[inline(always)]
fn checked_n(op: &str, n: usize) -> u64 {
    let n = n as u64;
    if n > MAX_COUNT {
        n_too_large(op, n);
    }
    n
}

#[cold]
#[inline(never)]
fn n_too_large(op: &str, n: u64) -> ! {
    panic!("percpu_ref::{op}({n}): n is above the largest count, 2^62 - 1");
}

/// Whether an overflow by `n` parks the counter (one unconditional add,
/// which saturates) rather than being refused before it writes.
fn parks(n: u64) -> bool {
    n < UNCHECKED_N_LIMIT
}

#[cold]
#[inline(never)]
fn overflow(op: &str, n: u64, count: u64, parked: bool) -> ! {
    assert!(
        !parked,
        "percpu_ref::{op}: count overflow: adding {n} to the counter at {count} passed \
         its range (at most 2^62 - 1 references); the count is saturated: the ref will \
         never release"
    );
    panic!(
        "percpu_ref::{op}: count overflow: adding {n} to the counter at {count} would pass \
         its range (at most 2^62 - 1 references); the count is left at {count}"
    );
}

/// What a fold found wrong, as a message (`None` when exact).
fn miscount_message(fold: Fold, op: &str) -> Option<String> {
    match fold {
        Fold::Exact => None,
        // `v` includes the temporary reference.
        Fold::Underflow(v) => Some(format!(
            "percpu_ref::{op}: count underflow found when switching to atomic mode: \
             the count is {} (more puts than gets); the ref will never release",
            v - 1
        )),
        Fold::Overflow(v) => Some(format!(
            "percpu_ref::{op}: count overflow found when switching to atomic mode: \
             {} references, more than 2^62 - 1; the ref will never release",
            v - 1
        )),
    }
}

fn underflow_message(op: &str, n: u64, count: u64) -> String {
    format!(
        "percpu_ref::{op}: count underflow: putting {n} with the count at {count} \
         (more puts than gets); the count is left at {count}"
    )
}
