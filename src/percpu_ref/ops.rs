//! Get, put and tryget: the per-CPU fast path, and the atomic counter
//! when it is not taken.

use super::PercpuRef;
use crate::atomic_mode::{AddOutcome, PutOutcome, MAX_COUNT, UNCHECKED_N_LIMIT};
use crate::percpu::{Counters, MODE_ATOMIC, MODE_DEAD, MODE_MANAGED, PERCPU_N_LIMIT};
use crate::sync::Ordering;

impl PercpuRef {
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
    #[inline(always)]
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
    #[inline(always)]
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
    ///
    /// Inlined into every caller, as the atomic-mode put is, with only the
    /// misuse paths out of line: a call pushes its return address, a store
    /// that the locked add then waits to drain, and with two CPUs on one
    /// ref that lengthens each CPU's hold of the counter's line. The cost
    /// is code at every call site (both measured: docs/performance.md,
    /// "Atomic mode").
    #[inline(always)]
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
    #[inline(always)]
    pub fn put(&self) {
        self.put_many(1);
    }

    /// Drops `n` references; the last one runs `release`.
    ///
    /// # Panics
    ///
    /// As [`put`](Self::put), or if `n` is above 2^62 - 1.
    #[inline(always)]
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
    #[inline(always)]
    pub(crate) unsafe fn put_many_raw(this: *const Self, n: usize) {
        let n = checked_n("put_many", n);
        // SAFETY: forwarded.
        unsafe { Self::put_checked_raw(this, n) }
    }

    /// [`put_many_raw`](Self::put_many_raw) of an `n` already checked.
    ///
    /// # Safety
    ///
    /// As `put_many_raw`.
    #[inline(always)]
    pub(super) unsafe fn put_checked_raw(this: *const Self, n: u64) {
        if n == 0 {
            return;
        }
        // SAFETY: the caller's contract.
        if !unsafe { Self::try_put_percpu_raw(this, n) } {
            // A managed ref: its put must be seen by the engine
            // (`managed.rs`, invariant 1), before it counts. One bit
            // tested, so that an atomic-mode put pays two instructions.
            // SAFETY: as above.
            let mode = unsafe { &(*this).mode }.load(Ordering::Relaxed);
            if mode & MODE_MANAGED != 0 {
                // SAFETY: as above.
                return unsafe { Self::put_managed(this, n) };
            }
            // SAFETY: as above.
            unsafe { Self::put_atomic_raw(this, n) }
        }
    }

    /// The per-CPU put of `n` (below [`PERCPU_N_LIMIT`], else nothing),
    /// through a pointer; true if it counted. Nothing of the ref is touched
    /// after the counting add.
    ///
    /// # Safety
    ///
    /// As [`put_many_raw`](Self::put_many_raw).
    #[inline(always)]
    pub(crate) unsafe fn try_put_percpu_raw(this: *const Self, n: u64) -> bool {
        // SAFETY: the caller's references keep `*this` alive until our
        // decrement; no borrow formed here outlives it, except the mode
        // word's (an atomic: allowed to dangle, as `Arc`'s counter).
        n < PERCPU_N_LIMIT
            && unsafe {
                Counters::try_add_raw(
                    &raw const (*this).counters,
                    &raw const (*this).mode,
                    n.wrapping_neg(),
                )
            }
    }

    /// # Safety
    ///
    /// As [`put_many_raw`](Self::put_many_raw).
    #[inline(always)]
    pub(super) unsafe fn put_atomic_raw(this: *const Self, n: u64) {
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
            // SAFETY: as `put_underflow` requires.
            PutOutcome::Underflow { count, release } => unsafe {
                Self::put_underflow(this, n, count, release)
            },
        }
    }

    /// A put that found fewer references than it gives up: panics.
    ///
    /// # Safety
    ///
    /// As [`put_many_raw`](Self::put_many_raw); `release` says that this
    /// thread's give-back won the release election.
    #[cold]
    #[inline(never)]
    unsafe fn put_underflow(this: *const Self, n: u64, count: u64, release: bool) -> ! {
        if release {
            // SAFETY: this thread's give-back won the election, so the
            // release is ours to run and nobody frees the ref before it.
            let r = unsafe { &*this };
            (r.release)(r);
        }
        panic!("{}", underflow_message("put_many", n, count))
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

    /// The atomic-mode tryget: a compare-and-swap that fails on zero or
    /// released ([`AtomicCount::tryget`]); `release` is never its to run
    /// (the arm stays for the contract of `AddOutcome`).
    ///
    /// Out of line, unlike the get and put: inlining it measured no
    /// difference (docs/performance.md, "Atomic mode").
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
            // A tryget compares before it writes: refused, never parked.
            AddOutcome::Overflow { count } => overflow(op, n, count, false),
        }
    }

    /// Takes a reference unless the ref is dead (killed) or its count is
    /// zero. Once a `kill_and_confirm_sync`'s confirm has run, no `tryget_live`
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
pub(super) fn overflow(op: &str, n: u64, count: u64, parked: bool) -> ! {
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

pub(super) fn underflow_message(op: &str, n: u64, count: u64) -> String {
    format!(
        "percpu_ref::{op}: count underflow: putting {n} with the count at {count} \
         (more puts than gets); the count is left at {count}"
    )
}
