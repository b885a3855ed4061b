//! The synchronous switches: kill, switch to atomic and back, revival,
//! and the steps under the switch lock that the deferred switches share.

use super::ops::{overflow, underflow_message};
use super::{AfterUnlock, AtomicSwitch, PercpuRef, SwitchGuard};
use crate::atomic_mode::{Fold, PutOutcome, Refused};
use crate::flags::Error;
use crate::grace;
use crate::percpu::{MODE_ATOMIC, MODE_DEAD, MODE_LIMIT};
use crate::sync::Ordering;
use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

impl PercpuRef {
    // ----- kill -------------------------------------------------------------

    /// Kills the ref and waits: no `tryget_live` succeeds any more, the ref
    /// switches to atomic mode, and the base reference is dropped
    /// (releasing the ref if it was the last one). Returns once the switch
    /// is complete; [`kill`](Self::kill), the kernel's `percpu_ref_kill`,
    /// returns at once and leaves the switch to the grace-period engine.
    /// Needs no pinning: nothing keeps the ref's address after the call.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyDead`] if the ref is already dead;
    /// [`Error::GracePeriodFailed`] if the kernel refused the grace period.
    /// Nothing changes on error.
    #[must_use = "an `Err` means this call killed nothing and dropped no reference (the ref was \
                  already dead, or the grace period was refused and the ref is unchanged)"]
    pub fn kill_sync(&self) -> Result<(), Error> {
        self.kill_and_confirm_sync(|_| {})
    }

    /// As [`kill_sync`](Self::kill_sync), running `confirm` once the ref is atomic and
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
    /// r.kill_and_confirm_sync(|r| assert!(!r.tryget_live())).unwrap();
    /// assert!(r.kill_sync().is_err());
    /// ```
    #[must_use = "an `Err` means this call killed nothing, dropped no reference and did not run \
                  `confirm` (the ref was already dead, or the grace period was refused)"]
    pub fn kill_and_confirm_sync(&self, confirm: impl FnOnce(&PercpuRef)) -> Result<(), Error> {
        let mut g = self.lock_switch("kill_and_confirm_sync");
        let mode = self.mode();
        if mode & MODE_DEAD != 0 {
            return Err(Error::AlreadyDead {
                op: "kill_and_confirm_sync",
            });
        }
        let mut after = AfterUnlock::default();
        // mutant base_put_first: drop the base reference before switching.
        let base_put_first = mutated!("base_put_first");
        if base_put_first {
            self.put_locked(&mut after, "kill_and_confirm_sync (base reference)");
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
        let switch =
            self.switch_to_atomic_locked(&mut g, confirm, mode, "kill_and_confirm_sync")?;
        if !dead_first {
            // ordering-audit: mutant only (dead_after_confirm): never runs in a real build.
            self.mode.store(self.mode() | MODE_DEAD, Ordering::Relaxed);
        }
        self.finish_atomic_switch(&mut after, switch, "kill_and_confirm_sync", !base_put_first);
        drop(g);
        self.run_after_unlock(after);
        Ok(())
    }

    // ----- mode switches ----------------------------------------------------

    /// Switches to atomic mode and keeps the ref there (sticky) until
    /// [`switch_to_percpu`](Self::switch_to_percpu). Returns when the switch
    /// is complete: the kernel's `percpu_ref_switch_to_atomic_sync`.
    ///
    /// # Panics
    ///
    /// As [`switch_to_atomic_and_confirm_sync`](Self::switch_to_atomic_and_confirm_sync).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::{InitFlags, PercpuRef};
    /// let r = PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT);
    /// r.get();
    /// r.switch_to_atomic_sync();
    /// assert_eq!(r.atomic_count(), Some(2));
    /// r.switch_to_percpu().unwrap();
    /// assert!(r.is_percpu());
    /// ```
    pub fn switch_to_atomic_sync(&self) {
        self.switch_to_atomic_and_confirm_sync(|_| {});
    }

    /// As [`switch_to_atomic_sync`](Self::switch_to_atomic_sync), running `confirm`
    /// once the switch is complete (immediately if already atomic), as the
    /// kernel's `percpu_ref_switch_to_atomic(ref, confirm)`. Same rules for
    /// `confirm` as [`kill_and_confirm_sync`](Self::kill_and_confirm_sync).
    ///
    /// # Panics
    ///
    /// If `confirm` panics (resumed once the switch is complete), on misuse
    /// the fold finds, and if the kernel refused the grace period: the
    /// switch is then undone first, so the ref is exactly as it was, and
    /// `confirm` has not run.
    pub fn switch_to_atomic_and_confirm_sync(&self, confirm: impl FnOnce(&PercpuRef)) {
        let mut g = self.lock_switch("switch_to_atomic_sync");
        let was_forced = std::mem::replace(&mut g.state.force_atomic, true);
        let mode = self.mode();
        let switch =
            match self.switch_to_atomic_locked(&mut g, confirm, mode, "switch_to_atomic_sync") {
                Ok(s) => s,
                Err(e) => {
                    g.state.force_atomic = was_forced;
                    drop(g);
                    panic!("{e}");
                }
            };
        let mut after = AfterUnlock::default();
        self.finish_atomic_switch(&mut after, switch, "switch_to_atomic_sync", false);
        drop(g);
        self.run_after_unlock(after);
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
    /// r.switch_to_atomic_sync();
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
    /// r.kill_sync().unwrap();
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
    pub(super) fn switch_to_atomic_locked(
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
    pub(super) fn run_confirm(
        &self,
        confirm: impl FnOnce(&PercpuRef),
    ) -> Option<Box<dyn Any + Send>> {
        catch_unwind(AssertUnwindSafe(|| confirm(self))).err()
    }

    /// Records misuse the fold found, then puts the base reference (for a
    /// kill) and the temporary one, in the kernel's order. Runs under the
    /// lock; the returned release and panics run after unlock.
    pub(super) fn finish_atomic_switch(
        &self,
        d: &mut AfterUnlock,
        s: AtomicSwitch,
        op: &str,
        put_base: bool,
    ) {
        d.panic = s.miscount;
        d.confirm_panic = s.confirm_panic;
        if put_base {
            self.put_locked(d, op);
        }
        if s.temp_ref {
            self.put_locked(d, op);
        }
    }

    /// One put under the switch lock; release and panics wait for the unlock.
    fn put_locked(&self, d: &mut AfterUnlock, op: &str) {
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
    pub(super) fn run_after_unlock(&self, d: AfterUnlock) {
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

/// What a fold found wrong, as a message (`None` when exact).
pub(super) fn miscount_message(fold: Fold, op: &str) -> Option<String> {
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
