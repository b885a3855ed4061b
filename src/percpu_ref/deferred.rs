//! The deferred switches: steps 1 and 2 under the switch lock, steps 3-5
//! on the grace-period engine.

use super::switch::miscount_message;
use super::{AfterUnlock, AtomicSwitch, PercpuRef, SwitchGuard};
use crate::flags::Error;
use crate::grace::{self, Callback, Entry};
use crate::percpu::{MODE_ATOMIC, MODE_DEAD, MODE_LIMIT, MODE_PENDING};
use crate::sync::Ordering;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

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
/// Also every managed ref ([`PercpuRef::switch_to_managed`]) whose last
/// reference was put before the call has been released: the engine's
/// rounds are run until one queued no managed ref's scan, at most eight
/// (a managed ref that other threads go on using keeps being scanned, and
/// is left to the engine).
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
///     .kill_and_confirm(move |_| c.store(true, Ordering::SeqCst))
///     .unwrap();
/// percpu_ref::flush();
/// assert!(confirmed.load(Ordering::SeqCst));
/// assert!(r.is_zero()); // the base reference was put: released
/// ```
pub fn flush() {
    super::managed::flush();
}

impl PercpuRef {
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
    /// the calling thread before this returns, as [`kill_sync`](Self::kill_sync).
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
    /// r.as_ref().kill().unwrap();
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
    /// r.as_ref().kill().unwrap();
    /// assert!(r.as_ref().kill().is_err()); // already dead
    /// // Dropping `r` here waits for the engine if the kill is still pending.
    /// ```
    #[must_use = "an `Err` means this call killed nothing: the ref was already dead"]
    pub fn kill(self: Pin<&Self>) -> Result<(), Error> {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::kill_raw(self.get_ref(), None, "kill") }
    }

    /// As [`kill`](Self::kill), running `confirm` once the
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
    ///     .kill_and_confirm(move |r| tx.send(r.tryget_live()).unwrap())
    ///     .unwrap();
    /// assert_eq!(rx.recv().unwrap(), false); // confirm ran on the engine thread
    /// ```
    #[must_use = "an `Err` means this call killed nothing and will not run `confirm`"]
    pub fn kill_and_confirm(
        self: Pin<&Self>,
        confirm: impl FnOnce(&PercpuRef) + Send + 'static,
    ) -> Result<(), Error> {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe {
            Self::kill_raw(
                self.get_ref(),
                Some(Confirm::new(confirm)),
                "kill_and_confirm",
            )
        }
    }

    /// Switches to atomic mode (sticky, as [`switch_to_atomic_sync`](Self::switch_to_atomic_sync))
    /// without waiting for the grace period: returns at once with the ref in
    /// atomic mode for every new get and put; the engine folds the per-CPU
    /// counts in later. Pinning, waiting and the already-atomic case are as
    /// for [`kill`](Self::kill).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = Box::pin(PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT));
    /// r.get();
    /// r.as_ref().switch_to_atomic();
    /// assert!(!r.is_percpu());
    /// r.switch_to_percpu().unwrap(); // waits for the pending switch first
    /// assert!(r.is_percpu());
    /// r.put();
    /// ```
    pub fn switch_to_atomic(self: Pin<&Self>) {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::switch_raw(self.get_ref(), None) }
    }

    /// As [`switch_to_atomic`](Self::switch_to_atomic),
    /// running `confirm` once the switch is complete, on the engine thread
    /// (same rules as for [`kill_and_confirm`](Self::kill_and_confirm)).
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
    /// r.as_ref().switch_to_atomic_and_confirm(move |r| {
    ///     s.store(r.atomic_count().unwrap(), Ordering::SeqCst)
    /// });
    /// percpu_ref::flush();
    /// assert_eq!(seen.load(Ordering::SeqCst), 6); // base + 4 + the temporary reference
    /// r.put_many(4);
    /// ```
    pub fn switch_to_atomic_and_confirm(
        self: Pin<&Self>,
        confirm: impl FnOnce(&PercpuRef) + Send + 'static,
    ) {
        // SAFETY: pinned: the ref stays at this address until its `Drop`.
        unsafe { Self::switch_raw(self.get_ref(), Some(Confirm::new(confirm))) }
    }

    /// [`kill_and_confirm`](Self::kill_and_confirm)
    /// through a pointer, for the crate's layers whose refs live at a stable
    /// address without a `Pin` (the owned layer's heap block, the css model).
    ///
    /// # Safety
    ///
    /// `this` points to a live `PercpuRef` that does not move until it is
    /// dropped (its `Drop` then waits for the engine), as `Pin` would
    /// guarantee.
    pub(crate) unsafe fn kill_raw(
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
            r.kill_already_atomic(g, confirm, op);
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

    /// [`switch_to_atomic_and_confirm`](Self::switch_to_atomic_and_confirm)
    /// through a pointer.
    ///
    /// # Safety
    ///
    /// As [`kill_raw`](Self::kill_raw).
    pub(crate) unsafe fn switch_raw(this: *const Self, confirm: Option<Confirm>) {
        // SAFETY: live (the caller's contract).
        let r = unsafe { &*this };
        let mut g = r.lock_switch("switch_to_atomic");
        g.state.force_atomic = true;
        let mode = r.mode();
        if mode & MODE_ATOMIC != 0 {
            let s = AtomicSwitch {
                temp_ref: false,
                miscount: None,
                confirm_panic: confirm.and_then(|c| r.run_confirm(|r| c.call(r))),
            };
            let mut after = AfterUnlock::default();
            r.finish_atomic_switch(&mut after, s, "switch_to_atomic", false);
            drop(g);
            r.run_after_unlock(after);
            return;
        }
        r.start_deferred_switch(g, mode);
        // SAFETY: pinned and now pending (the caller's contract).
        unsafe { r.enqueue_deferred(Self::complete_deferred_switch, confirm) };
    }

    /// A deferred kill of a ref already in atomic mode: no grace period is
    /// needed, so it completes here, as `kill_and_confirm_sync` does.
    fn kill_already_atomic(&self, g: SwitchGuard<'_>, confirm: Option<Confirm>, op: &str) {
        // ordering-audit: Relaxed: as in `kill_and_confirm_sync`, DEAD publishes nothing.
        self.mode.store(self.mode() | MODE_DEAD, Ordering::Relaxed);
        let s = AtomicSwitch {
            temp_ref: false,
            miscount: None,
            confirm_panic: confirm.and_then(|c| self.run_confirm(|r| c.call(r))),
        };
        let mut after = AfterUnlock::default();
        self.finish_atomic_switch(&mut after, s, op, true);
        drop(g);
        self.run_after_unlock(after);
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
        let op = if kill { "kill" } else { "switch_to_atomic" };
        if kill && mutated!("engine_dead_late") {
            // ordering-audit: mutant only (engine_dead_late).
            r.mode.fetch_or(MODE_DEAD, Ordering::Relaxed);
        }
        let sum = r.counters.sum_after_grace_period();
        let miscount = miscount_message(r.count.fold_percpu_sum(sum), op);
        let mut d = AfterUnlock::default();
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
        report_on_engine(&mut d, op);
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
}

/// Reports what a deferred switch's completion would have handed its
/// caller, if it had one: a panic of `confirm`, and misuse the fold found.
fn report_on_engine(d: &mut AfterUnlock, op: &str) {
    if let Some(payload) = d.confirm_panic.take() {
        report_engine_panic(op, "confirm", &*payload);
    }
    if let Some(msg) = d.panic.take() {
        eprintln!("percpu_ref: grace-period engine: {msg}");
    }
}

/// Reports a panic of a deferred `confirm` or `release` (caught on the
/// engine thread, which goes on).
pub(super) fn report_engine_panic(op: &str, what: &str, payload: &(dyn Any + Send)) {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a non-string payload)");
    eprintln!("percpu_ref: grace-period engine: the {what} callback of {op} panicked: {msg}");
}
