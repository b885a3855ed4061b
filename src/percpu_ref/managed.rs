//! Managed refs: released by the grace-period engine once nobody holds a
//! reference, with no kill (the kernel's managed `percpu_ref` RFC, 2024).
//!
//! A ref with an owner and an end is killed, and its atomic count then
//! sees the last put. Most shared objects have neither. A managed ref
//! stays in percpu mode; the engine holds a *stand-in* reference of its
//! own and looks, now and then, whether the count is down to that
//! stand-in. The RFC scans every managed ref each period (a switch to
//! atomic mode and back for each, alive or not). Here the engine looks
//! only at refs a put has *marked* since its last look (Refcache's
//! "only objects whose count changed"), a guess filters out the live
//! ones, and only a ref the guess finds at the stand-in pays for an exact
//! check:
//!
//! ```text
//!   IDLE  ---- put: mark -------------------> MARKED (queued: clear)
//!    ^                                           | engine: clear
//!    |                                           v
//!    +---- guess: alive (no put since) ---- SCANNING (bound 0; grace period)
//!                                                | guess: count = stand-in
//!                                                v
//!          release <--- exactly 1 ----------- WINDOW (atomic; grace period, fold)
//!                       else: back to percpu, SCANNING again
//! ```
//!
//! **The mark rides on the rseq section's one compare.** The engine's
//! *clear* sets `MODE_UNMARKED` and the section's CPU bound to 0. The next
//! put's section then finds no counter (the same compare that rejects
//! atomic mode), and the put's slow path marks the ref: one
//! compare-and-swap clears the bit and restores the bound (queueing the
//! ref if it was idle), and the put runs its section again. The per-CPU
//! fast path gains no instruction; a busy ref pays one compare-and-swap
//! per engine round. Queueing allocates nothing: each step is the ref's
//! own `grace::Link`, pushed under the queue's lock (a ref has one step
//! queued at most, invariant 4). Gets and trygets need no mark (only a
//! put can bring the count down to the stand-in): while unmarked they
//! count on the biased atomic counter, exact in either mode.
//!
//! **The guess** is a racy sum: the atomic counter less `BIAS`, plus the
//! per-CPU counters read while sections may still commit. It can be wrong
//! either way, so it only decides where to look next; the release is
//! decided in the window, which is a real switch to atomic mode (grace
//! period, exact fold) and an election from exactly 1, the stand-in, to
//! `RELEASED`.
//!
//! # Invariants
//!
//! 1. **No put goes unseen.** A put that lowers the count is either in the
//!    sum of the scan that follows the clear, or marks the ref after the
//!    clear. The clear precedes a grace period and the scan follows it: a
//!    section that read the old bound committed before the grace period
//!    (its add is in the sum) or was aborted and runs again with bound 0,
//!    and takes the slow path, which marks before it counts. A put that
//!    cannot count per CPU (its thread has no counter in the arena, or
//!    `n >= 2^16`) sets `MODE_POLLED` before its atomic put, and a polled
//!    ref is scanned every round until it is released.
//! 2. **A ref goes idle, and a ref enters the window, only by a
//!    compare-and-swap from the unmarked mode word that its scan read**:
//!    a mark or a poll in between makes it fail, and the engine clears
//!    and scans again. So an idle ref's last put was in a sum that showed
//!    more than the stand-in, and every later put marks it.
//! 3. **Release exactly once, never while a reference is held**: only the
//!    window elects, from an exact count of 1 (after a grace period no
//!    per-CPU add is in flight, and the fold is one RMW), by a
//!    compare-and-swap that fails if any get, tryget or put landed since;
//!    after it every tryget lands on `RELEASED` and fails.
//! 4. **The engine owns a managed ref's mode while `MODE_PENDING` is set**
//!    (from the mark that queues it to the end of its scan): no switch
//!    starts, and `Drop` waits (invariant 4 of `grace`). A switch, or
//!    `Drop`, that finds it pending sets `stop`, and the engine hands the
//!    ref back at its next step, marked and unreleased; the engine takes
//!    the request with a swap (a load could read one its waiter already
//!    withdrew), and a waiter that leaves the ref managed (a refused
//!    `switch_to_managed`, a second promotion) withdraws it and queues a
//!    handed-back ref again (`resume_management`). A put touches
//!    nothing of the ref after its counting add, so a release may free the
//!    ref as soon as it is elected.
//! 5. **Any switch ends the management** (the kill takes over): under the
//!    switch lock and with nothing pending, one compare-and-swap clears
//!    `MANAGED`, `UNMARKED` and `POLLED` and restores the bound, and the
//!    stand-in is put. From then on the ref is an ordinary ref whose base
//!    reference its caller holds. The one switch that hands the ref back
//!    is `with_exact_count`'s (`shared::Shared`'s `get_mut` and
//!    `try_unwrap` of a promoted value): under the same hold of the lock
//!    it switches to atomic mode, lets its caller read the exact count or
//!    elect from exactly 1 without `release`, and, unless it elected,
//!    takes a new stand-in and goes back to managed percpu mode.
//!
//! Where nothing is per CPU (the sharded backend, or a ref already in
//! atomic mode) `switch_to_managed` keeps the ref in atomic mode (a
//! sharded ref is switched, sticky) and sets no bit: the put that lands
//! on zero releases it at once, on its own thread, and the engine never
//! sees it.

use super::deferred::report_engine_panic;
use super::switch::miscount_message;
use super::{AfterUnlock, PercpuRef, SwitchGuard};
use crate::atomic_mode::{AtomicCount, PutOutcome};
use crate::flags::Error;
use crate::grace::{self, Callback};
use crate::percpu::{
    Backend, MODE_ATOMIC, MODE_DEAD, MODE_LIMIT, MODE_MANAGED, MODE_PENDING, MODE_POLLED,
    MODE_UNMARKED,
};
use crate::sync::Ordering;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

/// Managed entries queued so far, for [`flush`]'s loop (a count, not a
/// part of the protocol).
#[cfg(not(percpu_ref_loom))]
static QUEUED: crate::sync::unmodeled::AtomicU64 = crate::sync::unmodeled::AtomicU64::new(0);

/// Under loom, one count per execution (a process-wide one would let the
/// models that run at the same time on other test threads change how many
/// rounds a model's `flush` runs: an execution loom cannot replay). Not a
/// modelled atomic: it is no part of the protocol.
#[cfg(percpu_ref_loom)]
fn queued() -> &'static crate::sync::unmodeled::AtomicU64 {
    loom::lazy_static! {
        static ref QUEUED: crate::sync::unmodeled::AtomicU64 =
            crate::sync::unmodeled::AtomicU64::new(0);
    }
    &QUEUED
}

#[cfg(not(percpu_ref_loom))]
fn queued() -> &'static crate::sync::unmodeled::AtomicU64 {
    &QUEUED
}

/// Managed steps queued and not yet begun: how far the engine is behind
/// (a gauge for back-pressure, not a part of the protocol).
static BACKLOG: crate::sync::unmodeled::AtomicUsize = crate::sync::unmodeled::AtomicUsize::new(0);

/// The backlog above which [`wait_for_backlog`] makes its caller wait. A
/// step costs the queue nothing (it is the ref's own link,
/// `grace::Link`); the values behind them (`shared::Shared`s awaiting
/// their drop) are what it bounds.
const MAX_BACKLOG: usize = 1 << 16;

/// Back-pressure for a layer that hands refs to the engine faster than it
/// completes them (`shared::Shared`'s promotion): while more than
/// [`MAX_BACKLOG`] managed steps wait, the caller waits for the engine to
/// complete everything queued so far (as [`crate::flush`] does). Not on
/// the engine itself (a value dropped there may promote another).
pub(crate) fn wait_for_backlog() {
    if BACKLOG.load(crate::sync::unmodeled::Ordering::Relaxed) > MAX_BACKLOG && !grace::on_engine()
    {
        grace::flush();
    }
}

/// The most engine rounds a managed ref whose last put came before a
/// [`flush`] can need: the entry queued then, a clear, a scan that finds
/// it marked, a scan, the window.
const FLUSH_ROUNDS: usize = 8;

/// The engine's part of [`crate::flush`]: runs flushes until a round
/// queued no managed entry (a ref released, or found alive and left
/// idle), at most [`FLUSH_ROUNDS`] (a ref in use on another thread keeps
/// being scanned).
pub(super) fn flush() {
    for _ in 0..FLUSH_ROUNDS {
        let before = queued().load(crate::sync::unmodeled::Ordering::Relaxed);
        grace::flush();
        if queued().load(crate::sync::unmodeled::Ordering::Relaxed) == before {
            return;
        }
    }
}

/// The count of a ref in [`PercpuRef::with_exact_count`]'s window: atomic
/// mode, exact, under the switch lock.
pub(crate) struct ExactCount<'a> {
    count: &'a AtomicCount,
    elected: Cell<bool>,
}

impl ExactCount<'_> {
    /// Whether the count is exactly 1 (the caller's reference), with
    /// acquire: every other reference's accesses before its put happen
    /// before the caller's next ones.
    pub(crate) fn is_one(&self) -> bool {
        self.count.is_one()
    }

    /// Elects the release of the caller's reference if it is the last, in
    /// one compare-and-swap from exactly 1 that fails against any get,
    /// tryget or put since, as the managed window's election; `release`
    /// then does not run: the caller takes over what it would do.
    pub(crate) fn elect_last(&self) -> bool {
        let elected = self.count.elect_release_of_last();
        self.elected.set(elected);
        elected
    }

    /// Only for the mutant `shared_exact_take_by_check`: released by a
    /// store after [`is_one`](Self::is_one). True.
    #[cfg(percpu_ref_mutant = "shared_exact_take_by_check")]
    pub(crate) fn mark_elected(&self) -> bool {
        self.count.store_released();
        self.elected.set(true);
        true
    }
}

/// The operation named in what the engine reports of a managed ref.
const OP: &str = "managed scan";

/// The steps of a managed ref's scan, each an engine completion.
#[derive(Clone, Copy)]
enum Step {
    Clear,
    Scan,
    Decide,
}

impl PercpuRef {
    /// Hands the ref to the grace-period engine, which releases it once no
    /// reference is held: the kernel's managed `percpu_ref`
    /// (`percpu_ref_switch_to_managed`, RFC 2024). The caller keeps its
    /// base reference and drops it with [`put`](Self::put) like any other;
    /// no kill is needed. The engine takes a stand-in reference of its own
    /// and, after a put, finds within a few of its rounds (about a
    /// millisecond each) whether the count is down to the stand-in; then
    /// it runs `release` on its thread, once. [`flush`](crate::flush)
    /// makes that happen before it returns.
    ///
    /// In percpu mode on the rseq backend the gets and puts stay per-CPU;
    /// the engine looks only at refs put since its last look (module docs
    /// of `percpu_ref::managed`, in docs/design.md). On the sharded
    /// backend, or in atomic mode, the ref is kept in atomic mode instead
    /// (the sharded backend is switched, sticky): the put that reaches
    /// zero releases it, on its own thread.
    ///
    /// Any switch ends the management ([`kill`](Self::kill) takes over:
    /// the engine drops its stand-in and the kill puts the base reference,
    /// as for an unmanaged ref). `tryget` keeps working until the release
    /// (a managed ref can be revived by a tryget before the engine saw its
    /// count at the stand-in, which `Arc`'s `Weak` cannot).
    ///
    /// The engine keeps the ref's address, hence `Pin`, as for
    /// [`kill`](Self::kill); dropping a managed ref that the engine is
    /// scanning waits for its step and does not release it.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] on a dead ref, [`Error::AlreadyManaged`] on a
    /// managed one ([`is_managed`](Self::is_managed)); nothing changes.
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
    /// r.as_ref().switch_to_managed().unwrap();
    /// r.get(); // per CPU, as before
    /// r.put();
    /// r.put(); // the base reference: no kill
    /// percpu_ref::flush(); // the engine saw the count at its stand-in
    /// assert!(released.load(Ordering::SeqCst));
    /// assert!(!r.tryget());
    /// ```
    pub fn switch_to_managed(self: Pin<&Self>) -> Result<(), Error> {
        const OP: &str = "switch_to_managed";
        let r = self.get_ref();
        let g = r.lock_switch_keeping_manager(OP);
        let mode = r.mode();
        if mode & MODE_DEAD != 0 {
            return Err(Error::AlreadyDead { op: OP });
        }
        if mode & MODE_MANAGED != 0 {
            r.resume_management(&g);
            return Err(Error::AlreadyManaged { op: OP });
        }
        if mode & MODE_ATOMIC != 0 {
            // The atomic count releases the ref at zero by itself.
            return Ok(());
        }
        if r.counters.backend() != Backend::Rseq {
            // Nothing to scan without per-CPU sections: atomic for good.
            drop(g);
            r.switch_to_atomic_sync();
            return Ok(());
        }
        // The stand-in, then idle and unmarked: the first put marks it.
        r.get();
        // ordering-audit: Relaxed: under the switch lock with nothing
        // pending, no one else writes the word; a section that reads the
        // bound of 0 goes to the atomic counter, exact in either mode.
        r.mode.store(
            mode & !MODE_LIMIT | MODE_MANAGED | MODE_UNMARKED,
            Ordering::Relaxed,
        );
        drop(g);
        Ok(())
    }

    /// For `shared::Shared`, which starts in atomic mode (`INIT_ATOMIC`) and
    /// moves here once it is cloned often: from atomic mode straight to
    /// managed percpu mode, under one hold of the switch lock. False,
    /// changing nothing, where that cannot be done (the sharded backend, a
    /// ref not in plain atomic mode).
    ///
    /// The caller holds a reference throughout, so the atomic count stays
    /// above zero: the bias cannot be refused and no put in between can
    /// release. The stand-in is taken on the atomic counter before the mode
    /// word leaves atomic mode, and that word is the one `switch_to_managed`
    /// leaves (managed, unmarked, bound 0): the next put marks it.
    pub(crate) fn promote_to_managed(self: Pin<&Self>) -> bool {
        const OP: &str = "shared::Shared::promote";
        let r = self.get_ref();
        if r.counters.backend() != Backend::Rseq || r.is_managed() {
            // Promoted already (a second promoter, or `Shared::promote` on
            // a promoted value): not the lock, which would stop a scan.
            return false;
        }
        let mut g = r.lock_switch_keeping_manager(OP);
        let mode = r.mode();
        // mutant shared_promote_no_resume: a promoter that lost the race to
        // another leaves the ref as the lock found it (handed back by the
        // engine, marked and unqueued: never released).
        if mode & MODE_MANAGED != 0 && !mutated!("shared_promote_no_resume") {
            // Another thread promoted it after our check, and the engine
            // may have handed it back to our lock: queue it again.
            r.resume_management(&g);
            return false;
        }
        if mode & (MODE_ATOMIC | MODE_DEAD | MODE_MANAGED) != MODE_ATOMIC {
            return false;
        }
        r.promote_locked(&mut g, mode);
        true
    }

    /// [`promote_to_managed`](Self::promote_to_managed)'s switch, under the
    /// switch lock, from plain atomic mode (`mode`), with the caller's
    /// reference held.
    fn promote_locked(&self, g: &mut SwitchGuard<'_>, mode: usize) {
        const OP: &str = "shared::Shared::promote";
        if self.count.add_bias().is_err() {
            unreachable!("percpu_ref: {OP}: the caller's reference keeps the count above zero");
        }
        self.counters.reset();
        // The stand-in, on the atomic counter (still atomic mode here).
        // mutant shared_promote_no_stand_in: promote without the engine's
        // stand-in (the count can reach zero in percpu mode, unseen, or
        // the engine releases a value still held).
        if !mutated!("shared_promote_no_stand_in") {
            self.get();
        }
        // ordering-audit: kept: Release, as `switch_to_percpu_locked`'s
        // store (whose weakening is caught: `percpu_mode_store_relaxed`),
        // for the section that reads the bound the first mark restores (the
        // mark's RMW continues this release sequence): it must see the
        // zeroed counters, the bias and the stand-in. A first promotion's
        // counters are a fresh slot's zeroes; a ref handed back by
        // `with_exact_count` counted per CPU before, and this store
        // publishes their zeroing. No model tells the difference: the rseq
        // model's sections take the modelled CPU lock that
        // `counters.reset` takes, which orders them already.
        self.mode.store(
            mode & !(MODE_ATOMIC | MODE_LIMIT) | MODE_MANAGED | MODE_UNMARKED,
            Ordering::Release,
        );
        g.state.force_atomic = false;
    }

    /// For `shared::Shared`'s exact answers on a promoted value (`get_mut`,
    /// `try_unwrap`): ends the management and switches to atomic mode (a
    /// grace period), runs `f` on the now exact count under the same hold
    /// of the switch lock, and hands the ref back to the engine in managed
    /// percpu mode, as [`promote_to_managed`](Self::promote_to_managed),
    /// unless `f` elected the release of the caller's last reference
    /// ([`ExactCount::elect_last`]): the ref is then dead and released, and
    /// `release` does not run (the caller does what it would have done).
    ///
    /// The caller holds a reference throughout, so the count stays above
    /// zero until `f` elects; no other switch can run between the switch
    /// and `f`'s answer, which would make the count per CPU again.
    ///
    /// # Errors
    ///
    /// [`Error::GracePeriodFailed`] if the kernel refused the grace period:
    /// `f` has not run and the ref is managed again.
    ///
    /// # Panics
    ///
    /// On misuse the fold finds (more puts than gets: a `from_raw` of a
    /// pointer that `into_raw` did not give); the ref is then left parked,
    /// as any ref whose fold finds it.
    pub(crate) fn with_exact_count<R>(
        self: Pin<&Self>,
        op: &'static str,
        f: impl FnOnce(&ExactCount<'_>) -> R,
    ) -> Result<R, Error> {
        let r = self.get_ref();
        // Ends the management: the stand-in is put (the caller's reference
        // keeps the count above zero).
        let mut g = r.lock_switch(op);
        let mode = r.mode();
        let switch = match r.switch_to_atomic_locked(&mut g, |_| {}, mode, op) {
            Ok(s) => s,
            Err(e) => {
                // Still percpu, unmanaged: managed again, as it was.
                r.manage_locked(&g, mode);
                return Err(e);
            }
        };
        let mut after = AfterUnlock::default();
        // The temporary reference is put: never the last (the caller's).
        r.finish_atomic_switch(&mut after, switch, op, false);
        if after.panic.is_some() {
            drop(g);
            r.run_after_unlock(after);
            unreachable!("percpu_ref::{op}: a miscounted fold panics");
        }
        let exact = ExactCount {
            count: &r.count,
            elected: Cell::new(false),
        };
        let out = f(&exact);
        if exact.elected.get() {
            // As the window's election: dead, so that no `tryget_live`
            // succeeds either.
            // ordering-audit: Relaxed: under the switch lock with nothing
            // pending; the election's compare-and-swap decided the count.
            r.mode.store(r.mode() | MODE_DEAD, Ordering::Relaxed);
        } else {
            // mutant shared_exact_stays_atomic: the ref is left in atomic
            // mode, unmanaged, after a check that elected nothing (correct,
            // but never per CPU again: no model can tell, and the test
            // `exact_get_mut_hands_the_value_back_to_the_engine` does).
            if !mutated!("shared_exact_stays_atomic") {
                r.promote_locked(&mut g, r.mode());
            }
        }
        drop(g);
        r.run_after_unlock(after);
        Ok(out)
    }

    /// Makes a ref in percpu mode (`mode`, not managed) managed again,
    /// under the switch lock, as `switch_to_managed` does.
    fn manage_locked(&self, _g: &SwitchGuard<'_>, mode: usize) {
        // The stand-in, then idle and unmarked: the first put marks it.
        self.get();
        // ordering-audit: Relaxed: as `switch_to_managed`'s store.
        self.mode.store(
            mode & !MODE_LIMIT | MODE_MANAGED | MODE_UNMARKED,
            Ordering::Relaxed,
        );
    }

    /// The put of `shared::Shared` that its per-CPU section did not count
    /// (`try_put_percpu_raw` first, in the caller): the ref may be promoted
    /// (above) while a put is between reading the mode word and counting.
    /// The managed put once managed; in atomic mode a compare-and-swap on
    /// a true count
    /// ([`AtomicCount::put_one_unless_biased`](crate::atomic_mode::AtomicCount::put_one_unless_biased)),
    /// which a promotion's bias makes fail, so that the put then finds the
    /// ref managed and marks it.
    ///
    /// # Safety
    ///
    /// As `put_many_raw` with `n` = 1.
    #[inline(never)]
    pub(crate) unsafe fn put_promotable(this: *const Self) {
        loop {
            // Only the atomics are borrowed across the count (as in
            // `put_atomic_raw`): another thread's release may free the ref
            // right after it.
            // SAFETY: our reference keeps the ref alive until we count.
            let (mode, count) = unsafe { (&(*this).mode, &(*this).count) };
            // ordering-audit: Relaxed: picks the branch; a promotion after
            // this load makes the compare-and-swap below fail (its bias).
            let m = mode.load(Ordering::Relaxed);
            // mutant shared_put_by_fetch_sub: the atomic phase's put is one
            // unconditional sub, so a put that read the mode before a
            // promotion counts on the biased counter unmarked.
            if m & MODE_MANAGED != 0 || m & MODE_ATOMIC == 0 || mutated!("shared_put_by_fetch_sub")
            {
                // SAFETY: forwarded (the managed put, or an ordinary one).
                return unsafe { Self::put_checked_raw(this, 1) };
            }
            match count.put_one_unless_biased() {
                Some(PutOutcome::Alive) => return,
                Some(PutOutcome::ReachedZero) => {
                    // SAFETY: ours was the last reference and won the
                    // election: nobody frees the ref before its release.
                    let r = unsafe { &*this };
                    return (r.release)(r);
                }
                Some(PutOutcome::Underflow { count, .. }) => {
                    panic!("{}", super::ops::underflow_message("put", 1, count))
                }
                None => {
                    // Biased in atomic mode: a promotion between its bias and
                    // its mode store, which holds the switch mutex (wait for
                    // it: the bare mutex, not `lock_switch`, which would ask
                    // the engine to hand back a ref it is scanning), or a
                    // parked counter (then the ordinary put, which never
                    // releases it).
                    // SAFETY: our reference, not yet counted, keeps it alive.
                    let r = unsafe { &*this };
                    drop(crate::sync::lock(&r.switch));
                    if r.mode() & (MODE_ATOMIC | MODE_MANAGED) == MODE_ATOMIC {
                        // SAFETY: forwarded.
                        return unsafe { Self::put_checked_raw(this, 1) };
                    }
                }
            }
        }
    }

    /// True while the engine manages the ref ([`switch_to_managed`](Self::switch_to_managed)
    /// of a ref in percpu mode on the rseq backend), until its release or a
    /// switch; false for a ref that `switch_to_managed` kept in atomic
    /// mode (its atomic count releases it by itself). A snapshot.
    #[must_use]
    pub fn is_managed(&self) -> bool {
        self.mode() & MODE_MANAGED != 0
    }

    // ----- the put's side -------------------------------------------------

    /// A put of `n` on a managed ref in percpu mode that its section did
    /// not count: marks the ref if the engine cleared it (invariant 1) and
    /// runs the section again; polls it if this put cannot count per CPU.
    ///
    /// # Safety
    ///
    /// As `put_many_raw`: `this` is live while the caller's `n` references
    /// are held, and they are given up here. Nothing of the ref is touched
    /// after the counting add (invariant 4).
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn put_managed(this: *const Self, n: u64) {
        // SAFETY: the caller's references keep the ref alive until the
        // counting add below, after which it is not used.
        let r = unsafe { &*this };
        loop {
            // ordering-audit: Relaxed: this load only picks the branch; the
            // section reads the word again itself, with the order the
            // switch back needs (its zeroed counters before the bound).
            let m = r.mode.load(Ordering::Relaxed);
            if m & MODE_ATOMIC != 0 {
                // In the window (which holds the stand-in, so the atomic
                // counter cannot reach zero there), or released.
                // SAFETY: forwarded.
                return unsafe { Self::put_atomic_raw(this, n) };
            }
            if m & MODE_MANAGED == 0 {
                // No longer managed: the ordinary put.
                // SAFETY: forwarded.
                return unsafe { Self::put_checked_raw(this, n) };
            }
            if m & MODE_UNMARKED != 0 {
                r.mark(m);
                continue;
            }
            // SAFETY: forwarded; the add is this function's last access to
            // the ref.
            if unsafe { Self::try_put_percpu_raw(this, n) } {
                return;
            }
            if r.mode.load(Ordering::Relaxed) != m {
                continue;
            }
            // Marked and still refused: this thread has no counter in the
            // arena, or `n` is large. Poll before the atomic put, which is
            // this function's last access (invariant 1).
            if r.poll(m) {
                // SAFETY: forwarded.
                return unsafe { Self::put_atomic_raw(this, n) };
            }
        }
    }

    /// Marks an unmarked ref (`m` is its mode word as read): clears
    /// `UNMARKED`, restores the bound and sets `PENDING`, in one
    /// compare-and-swap; the winner on an idle ref queues its clear. A
    /// lost race changes nothing: the caller reads the word again.
    fn mark(&self, m: usize) {
        let bound = self.counters.percpu_mode();
        let new = m & !(MODE_UNMARKED | MODE_LIMIT) | MODE_PENDING | bound;
        // ordering-audit: Relaxed: an RMW continues the release sequence of
        // the engine's store it read (so a section that reads this bound
        // sees the counters zeroed before that store) whatever its own
        // order, and the put's section reads the word again itself.
        if self
            .mode
            .compare_exchange(m, new, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && m & MODE_PENDING == 0
            // mutant managed_mark_not_queued: the mark of an idle ref does
            // not queue its scan (the engine never looks at it again).
            && !mutated!("managed_mark_not_queued")
        {
            // SAFETY: managed refs are pinned (`switch_to_managed`), and
            // now pending: the engine owns the mode until it clears the
            // bit, and `Drop` waits for that.
            unsafe { self.enqueue_step(Step::Clear) };
        }
    }

    /// Sets `POLLED` on a marked managed ref (`m` as read); false if the
    /// word changed (the caller reads it again). An idle ref is queued.
    fn poll(&self, m: usize) -> bool {
        let new = m | MODE_POLLED | MODE_PENDING;
        // Relaxed: the flag publishes nothing; the engine reads it by a
        // compare-and-swap on this word (invariant 2).
        if self
            .mode
            .compare_exchange(m, new, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if m & MODE_PENDING == 0 {
            // SAFETY: as in `mark`.
            unsafe { self.enqueue_step(Step::Clear) };
        }
        true
    }

    // ----- the engine's side ----------------------------------------------

    /// Queues the next step of this ref's scan.
    ///
    /// # Safety
    ///
    /// The ref is managed, pinned and pending (invariant 4).
    unsafe fn enqueue_step(&self, step: Step) {
        let complete: grace::Complete = match step {
            Step::Clear => Self::step_clear,
            Step::Scan => Self::step_scan,
            Step::Decide => Self::step_decide,
        };
        queued().fetch_add(1, crate::sync::unmodeled::Ordering::Relaxed);
        BACKLOG.fetch_add(1, crate::sync::unmodeled::Ordering::Relaxed);
        // The clear needs no grace period before it, the scan and the
        // window do (after the clear, after the window's ATOMIC store).
        let needs_gp = !matches!(step, Step::Clear);
        // SAFETY: the ref stays at its address while pending (the caller's
        // contract), and each step either queues the next or clears the bit:
        // its link is queued once at a time, the next step queued only by
        // the completion of the one before. Its address is aligned.
        unsafe { grace::enqueue_link(&self.link, self.addr(), complete, needs_gp) };
    }

    /// Step 1: clear the mark (and the bound), so that the next put marks
    /// it again; the scan follows a grace period.
    ///
    /// # Safety
    ///
    /// An engine completion: `this` is a managed ref, pending and pinned.
    unsafe fn step_clear(this: *const (), _: Option<Callback>) {
        BACKLOG.fetch_sub(1, crate::sync::unmodeled::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        let r = unsafe { &*this.cast::<Self>() };
        if r.take_stop() {
            return r.hand_back();
        }
        r.clear_mark();
    }

    /// Clears the mark and queues the scan.
    fn clear_mark(&self) {
        // The scan that reads after this follows a grace period that
        // starts after it (the queue's lock and the engine's cookie order
        // them, as for a deferred switch's ATOMIC store); marks and polls
        // may land meanwhile, hence the compare-and-swap.
        self.update_mode(|m| m & !MODE_LIMIT | MODE_UNMARKED);
        // SAFETY: still managed, pinned and pending.
        unsafe { self.enqueue_step(Step::Scan) };
    }

    /// Step 2, a grace period after the clear: the guess (module docs).
    ///
    /// # Safety
    ///
    /// As [`step_clear`](Self::step_clear).
    unsafe fn step_scan(this: *const (), _: Option<Callback>) {
        BACKLOG.fetch_sub(1, crate::sync::unmodeled::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        let r = unsafe { &*this.cast::<Self>() };
        if r.take_stop() {
            return r.hand_back();
        }
        // ordering-audit: Relaxed: what the guess reads is atomic (the
        // count) or read under each CPU's section (the counters), and the
        // compare-and-swap below acts only if the word is still this one.
        let m = r.mode.load(Ordering::Relaxed);
        // mutant managed_scan_ignores_mark: guess on a ref a put marked
        // since the clear, as if unmarked (a put after the sum goes unseen).
        if m & MODE_UNMARKED == 0 && !mutated!("managed_scan_ignores_mark") {
            return r.clear_mark();
        }
        let guess = r
            .count
            .load()
            .wrapping_sub(crate::atomic_mode::BIAS)
            .wrapping_add(r.counters.racy_sum());
        let next = if guess == 1 {
            // The window: atomic mode, as a switch's step 1 (puts there
            // need no mark: the window ends in another scan).
            m & !(MODE_LIMIT | MODE_UNMARKED) | MODE_ATOMIC
        } else if m & MODE_POLLED != 0 {
            // Polled: scanned again next round, still unmarked.
            // SAFETY: still managed, pinned and pending.
            return unsafe { r.enqueue_step(Step::Scan) };
        } else {
            // Alive: idle until the next put.
            m & !MODE_PENDING
        };
        // mutant managed_idle_by_store: go idle (or atomic) by a store, so
        // that a put marking the ref in between is lost.
        let moved = if mutated!("managed_idle_by_store") {
            // ordering-audit: mutant only (managed_idle_by_store).
            r.mode.store(next, Ordering::Relaxed);
            true
        } else {
            // ordering-audit: kept: Release, as the engine's last access
            // when the ref goes idle: the guess's reads of the counters and
            // the count happen before a `Drop` that sees PENDING clear
            // (`is_pending`'s acquire) frees them. Loom does not treat a
            // free as an access; the same pairing for the release is
            // caught (`managed_release_before_drop_returns`).
            r.mode
                .compare_exchange(m, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        };
        if !moved {
            // Marked or polled since the read: look again (invariant 2).
            return r.clear_mark();
        }
        if next & MODE_ATOMIC != 0 {
            // SAFETY: still managed, pinned and pending.
            unsafe { r.enqueue_step(Step::Decide) };
        }
    }

    /// Step 3, a grace period after the window opened: the exact count,
    /// and the release if it is the stand-in alone.
    ///
    /// # Safety
    ///
    /// As [`step_clear`](Self::step_clear).
    unsafe fn step_decide(this: *const (), _: Option<Callback>) {
        BACKLOG.fetch_sub(1, crate::sync::unmodeled::Ordering::Relaxed);
        // SAFETY: the caller's contract; not used after a release that
        // dropped the ref (`grace::freed`).
        let r = unsafe { &*this.cast::<Self>() };
        let sum = r.counters.sum_after_grace_period();
        if let Some(msg) = miscount_message(r.count.fold_percpu_sum(sum), OP) {
            // More puts than gets (or an overflow): parked, never
            // released, as any ref whose fold finds it; no longer managed.
            eprintln!("percpu_ref: grace-period engine: {msg}");
            r.update_mode(|m| m & !(MODE_MANAGED | MODE_POLLED | MODE_UNMARKED | MODE_PENDING));
            return;
        }
        // mutant managed_no_window: release on the guess alone, without the
        // election from exactly 1 (a reference taken since is released
        // under, and the counter never reaches RELEASED).
        let stop = r.take_stop();
        let elected = !stop && (mutated!("managed_no_window") || r.count.elect_release_of_last());
        if elected {
            r.update_mode(|m| m & !(MODE_MANAGED | MODE_POLLED | MODE_UNMARKED) | MODE_DEAD);
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (r.release)(r))) {
                report_engine_panic(OP, "release", &*payload);
            }
            if grace::freed() {
                return;
            }
            // The engine's last access (as a deferred switch's). Release: the
            // release callback's work happens before a `Drop` or switch that
            // sees PENDING clear goes on.
            r.mode.fetch_and(!MODE_PENDING, Ordering::Release);
            return;
        }
        // Someone holds a reference: back to percpu mode (as
        // `switch_to_percpu_locked`: bias, zeroes, then the word), unmarked,
        // and scanned again, since puts made in the window marked nothing.
        if r.count.add_bias().is_err() {
            unreachable!("percpu_ref: {OP}: the stand-in keeps the count above zero");
        }
        r.counters.reset();
        if stop || r.take_stop() {
            return r.hand_back();
        }
        // Release: a section that reads the bound a mark restores sees the
        // zeroed counters (the mark's RMW continues this release sequence).
        r.mode.store(
            r.mode() & !(MODE_ATOMIC | MODE_LIMIT) | MODE_UNMARKED,
            Ordering::Release,
        );
        // SAFETY: still managed, pinned and pending.
        unsafe { r.enqueue_step(Step::Scan) };
    }

    /// Applies `f` to the mode word by compare-and-swap (marks and polls
    /// may land meanwhile; each retry applies `f` to what they left).
    fn update_mode(&self, f: impl Fn(usize) -> usize) {
        let mut m = self.mode();
        loop {
            // ordering-audit: kept: Release for the callers that end the
            // engine's access by clearing PENDING (`hand_back`, a parked
            // miscount): what the engine did to the ref (a hand-back after
            // the window zeroes the counters) happens before the waiting
            // switch or `Drop` (`is_pending`'s acquire) goes on, as for a
            // deferred switch's last store. No model reaches a hand-back
            // from the window; the same pairing is caught for the release
            // (`managed_release_before_drop_returns`).
            match self
                .mode
                .compare_exchange_weak(m, f(m), Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => m = actual,
            }
        }
    }

    /// Whether a switch or `Drop` asked the engine to let go; the request
    /// is consumed, so the caller hands the ref back when this is true.
    ///
    /// A read-modify-write, not a load: a waiter whose ref went idle
    /// without a step seeing its request clears it itself (under the
    /// switch lock, `resume_management`), and a later step must not act on
    /// the stale `true` (it would hand the ref back with nobody waiting to
    /// queue it again: found by loom, two promotions of one `Shared`). An
    /// RMW reads the latest value; a load may read an older one.
    fn take_stop(&self) -> bool {
        // ordering-audit: Relaxed: a request, which publishes nothing: the
        // hand-back's release and the waiter's acquire of PENDING order the
        // ref's state.
        self.manager_stop.swap(false, Ordering::Relaxed)
    }

    /// Ends a scan at a switch's or `Drop`'s request: percpu mode, marked,
    /// not pending, not released (invariant 4). The counters are valid in
    /// percpu mode here (the window, if any, was closed first).
    fn hand_back(&self) {
        let bound = self.counters.percpu_mode();
        self.update_mode(|m| {
            m & !(MODE_UNMARKED | MODE_LIMIT | MODE_PENDING | MODE_ATOMIC) | bound
        });
    }

    // ----- switches end the management ------------------------------------

    /// Asks the engine to hand this pending managed ref back (a switch or
    /// `Drop` waits for it).
    pub(super) fn request_stop(&self) {
        if self.mode() & MODE_MANAGED != 0 {
            // ordering-audit: Relaxed: as `take_stop`.
            self.manager_stop.store(true, Ordering::Relaxed);
        }
    }

    /// Under the switch lock, with nothing pending, for a caller that
    /// leaves the ref managed: if the engine handed the ref back at its
    /// request (marked, so no put would queue it again), queue it again.
    fn resume_management(&self, _g: &SwitchGuard<'_>) {
        self.manager_stop.store(false, Ordering::Relaxed);
        let m = self.mode();
        // ordering-audit: Relaxed: under the switch lock, after the
        // engine's release of the ref (the caller's wait acquired it); the
        // queue's lock orders the step after this store.
        if m & (MODE_UNMARKED | MODE_PENDING | MODE_ATOMIC) == 0
            && self
                .mode
                .compare_exchange(m, m | MODE_PENDING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // SAFETY: managed refs are pinned, and this one is now pending.
            unsafe { self.enqueue_step(Step::Clear) };
        }
    }

    /// Under the switch lock, with nothing pending: ends the management
    /// (invariant 5) and puts the stand-in. False if a put queued the ref
    /// meanwhile: the caller waits for the engine and tries again.
    pub(super) fn end_management(&self, _g: &SwitchGuard<'_>) -> bool {
        let mut m = self.mode();
        let bound = self.counters.percpu_mode();
        loop {
            if m & MODE_MANAGED == 0 {
                return true;
            }
            if m & MODE_PENDING != 0 {
                return false;
            }
            let percpu = m & MODE_ATOMIC == 0;
            let mut new = m & !(MODE_MANAGED | MODE_UNMARKED | MODE_POLLED);
            if percpu {
                new = new & !MODE_LIMIT | bound;
            }
            // ordering-audit: Relaxed: the caller's wait for PENDING to
            // clear (`is_pending`'s acquire) already ordered the engine's
            // work before this; the new word publishes nothing new.
            match self
                .mode
                .compare_exchange(m, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.manager_stop.store(false, Ordering::Relaxed);
                    if percpu {
                        // The stand-in (an atomic-mode managed ref has none).
                        self.put();
                    }
                    return true;
                }
                Err(actual) => m = actual,
            }
        }
    }
}
