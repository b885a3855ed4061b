//! `Counters`: one ref's per-CPU counters, dispatched to its backend.

#[cfg(not(percpu_ref_loom))]
use super::arena;
#[cfg(percpu_ref_loom)]
use super::model;
#[cfg(percpu_ref_rseq)]
use super::rseq;
use super::{sharded, Backend};
use crate::sync::AtomicUsize;

/// One ref's per-CPU counters, on whichever backend it was created with.
///
/// The rseq fast path needs two words of a ref and no branch on the
/// backend: the mode word (whose low half is its CPU bound, see
/// [`MODE_LIMIT`](super::MODE_LIMIT)) and the slot's base, the kernel's `percpu_count_ptr`. Every
/// other backend's mode word has a zero bound, so on those the section
/// finds nothing to count and [`try_add_other`](Self::try_add_other) picks
/// the backend. Where the rseq backend is not built, that is the whole
/// fast path.
///
/// `#[repr(C)]`: the slot (and so its base) is the first word, right
/// after the mode word in `PercpuRef`, so that the aarch64 section loads
/// both with one instruction.
#[repr(C)]
pub(crate) struct Counters {
    /// The ref's arena slot: CPU `c`'s counter (rseq) or shard `c`
    /// (sharded) is at `slot.base() + c * REGION`. On the rseq backend the
    /// base is the kernel's `percpu_count_ptr`.
    /// Its tag is the backend ([`Backend`] as `u8`).
    #[cfg(not(percpu_ref_loom))]
    slot: arena::Slot,
    /// Under loom the counters are loom objects (`percpu/model.rs`, or the
    /// sharded protocol on a boxed slice).
    #[cfg(percpu_ref_loom)]
    kind: Kind,
}

/// Under loom, the backend-specific part.
#[cfg(percpu_ref_loom)]
enum Kind {
    Sharded(sharded::Shards),
    /// The model of the rseq backend.
    Model(model::ModelCpus),
}

impl Counters {
    /// Counters for one ref, all zero, on `backend`, or `None` where that
    /// backend is not available ([`Backend::is_available`]); `atomic` for
    /// a ref that starts in atomic mode (its counters start sealed, as
    /// after a switch to atomic mode). Inlined: with the slot's cache it
    /// is most of a ref's creation.
    #[inline(always)]
    #[cfg_attr(
        loom,
        allow(
            clippy::unnecessary_wraps,
            reason = "under loom both backends are models, always available"
        )
    )]
    pub(crate) fn new(backend: Backend, atomic: bool) -> Option<Self> {
        // Every backend's operations run the rseq section first: it must
        // have an area to arm in this process before any ref exists, so
        // this asks on every backend (one load once decided).
        #[cfg(percpu_ref_rseq)]
        let rseq_available = rseq::abi::available();
        #[cfg(not(percpu_ref_loom))]
        {
            match backend {
                Backend::Sharded => {}
                #[cfg(percpu_ref_rseq)]
                Backend::Rseq if rseq_available => {}
                Backend::Rseq => return None,
            }
            let slot = arena::Slot::alloc_tagged(backend as u8);
            if atomic && backend == Backend::Sharded {
                sharded::seal_fresh(&slot);
            }
            Some(Counters { slot })
        }
        #[cfg(percpu_ref_loom)]
        {
            let kind = match backend {
                Backend::Sharded => {
                    let s = sharded::Shards::new();
                    if atomic {
                        sharded::seal_fresh(&s);
                    }
                    Kind::Sharded(s)
                }
                Backend::Rseq => Kind::Model(model::ModelCpus::new()),
            };
            Some(Counters { kind })
        }
    }

    /// The backend these counters live on.
    #[inline]
    pub(crate) fn backend(&self) -> Backend {
        #[cfg(not(percpu_ref_loom))]
        {
            if self.slot.tag() == Backend::Rseq as u8 {
                Backend::Rseq
            } else {
                Backend::Sharded
            }
        }
        #[cfg(percpu_ref_loom)]
        match self.kind {
            Kind::Sharded(_) => Backend::Sharded,
            Kind::Model(_) => Backend::Rseq,
        }
    }

    /// The mode word of this ref in percpu mode: the CPU bound of the rseq
    /// section ([`MODE_LIMIT`](super::MODE_LIMIT)) on the rseq backend, 0 on the others.
    #[cfg_attr(
        not(percpu_ref_rseq),
        allow(clippy::unused_self, reason = "only the rseq backend has a bound")
    )]
    #[inline]
    pub(crate) fn percpu_mode(&self) -> usize {
        // The arena's region count, at most i32::MAX: every CPU below it
        // has a counter in the slot's chunk, and every negative `cpu_id`
        // (an unregistered thread), read as unsigned, is above it.
        #[cfg(percpu_ref_rseq)]
        if self.backend() == Backend::Rseq {
            return arena::arena_cpus();
        }
        0
    }

    /// Adds `delta` (wrapping) to this CPU's counter if the mode word at
    /// `mode` is percpu. Through pointers, for the put path as well as the
    /// get path.
    ///
    /// A put that is not the last one can still be running when another
    /// thread's last put releases the ref and its owner frees it. Nothing
    /// is read after the add commits, but a `&Counters` (or `&PercpuRef`)
    /// held as a function argument across the add would still be a live
    /// borrow of freed memory (undefined behaviour under Stacked and Tree
    /// Borrows). So this copies out what the add needs (the slot address,
    /// which the rseq section loads itself; on the other backends, the
    /// shard) and commits through that; the only references held across
    /// the add are to atomics (the mode word, a shard), whose interior
    /// mutability makes that allowed, as for `Arc`'s own counter.
    ///
    /// # Safety
    ///
    /// `this` points to live counters, and they stay alive until the add
    /// commits (the caller holds a reference on the ref). `mode` points to
    /// the ref's mode word, and the ref's counters follow it in memory
    /// (`PercpuRef` is `#[repr(C)]` and starts with `mode` and `counters`,
    /// checked at compile time there); both pointers come from one pointer
    /// to the whole ref, so that the section may read the slot's base
    /// through `mode` ([`rseq::try_add_at`]).
    #[inline(always)]
    pub(crate) unsafe fn try_add_raw(
        this: *const Self,
        mode: *const AtomicUsize,
        delta: u64,
    ) -> bool {
        // SAFETY: `mode` is followed by `(*this).slot`, whose base is its
        // first word (`Counters` and `Slot` are `#[repr(C)]`), and both are
        // live until the add commits (the caller's contract).
        #[cfg(percpu_ref_rseq)]
        if unsafe { rseq::try_add_at(mode, delta) } {
            return true;
        }
        // SAFETY: as above; the mode word is an atomic, which may be
        // borrowed across the add.
        unsafe { Self::try_add_other(this, &*mode, delta) }
    }

    /// The backends other than rseq; on the rseq backend (whose section
    /// found the mode atomic, or this CPU without a counter), nothing.
    ///
    /// # Safety
    ///
    /// As [`try_add_raw`](Self::try_add_raw).
    #[inline(always)]
    #[cfg_attr(not(percpu_ref_loom), allow(unused_variables))] // `mode`: only the model reads it
    unsafe fn try_add_other(this: *const Self, mode: &AtomicUsize, delta: u64) -> bool {
        #[cfg(not(percpu_ref_loom))]
        let shard: *const crate::sync::AtomicU64 = {
            // SAFETY: the caller's reference keeps `*this` alive; this
            // borrow ends before the add, which goes through an atomic.
            let slot = unsafe { &(*this).slot };
            if slot.tag() != Backend::Sharded as u8 {
                return false;
            }
            sharded::shard(slot)
        };
        // SAFETY: as above.
        #[cfg(percpu_ref_loom)]
        let shard: *const crate::sync::AtomicU64 = match unsafe { &(*this).kind } {
            Kind::Sharded(s) => sharded::shard(s),
            // Not run under Miri: the borrow may last across the add.
            Kind::Model(m) => return m.try_add(mode, delta),
        };
        // SAFETY: the caller keeps the shard alive up to the add.
        sharded::try_add_at(unsafe { &*shard }, delta)
    }

    /// Whether these counters need the process-wide grace period
    /// ([`grace_period`]) before [`sum_after_grace_period`](Self::sum_after_grace_period):
    /// true on the rseq backend (and its loom model), false on the sharded
    /// backend, which seals each ref by itself.
    pub(crate) fn needs_grace_period(&self) -> bool {
        self.backend() == Backend::Rseq
    }

    /// The wrapping sum of every counter, once no `try_add` can count any
    /// more: on the rseq backend a grace period must have passed since the
    /// mode went atomic (the caller waited for one, see
    /// [`needs_grace_period`](Self::needs_grace_period)); the sharded
    /// backend seals its shards here.
    pub(crate) fn sum_after_grace_period(&self) -> u64 {
        #[cfg(not(percpu_ref_loom))]
        match self.backend() {
            Backend::Rseq => self.slot.sum(),
            Backend::Sharded => sharded::seal_and_sum(&self.slot),
        }
        #[cfg(percpu_ref_loom)]
        match &self.kind {
            Kind::Sharded(s) => sharded::seal_and_sum(s),
            Kind::Model(s) => s.sum(),
        }
    }

    /// The wrapping sum of every counter while adds may still commit: a
    /// racy snapshot, for the managed scan's guess (`percpu_ref/managed.rs`)
    /// on the rseq backend (and its model), the only one whose refs are
    /// scanned.
    pub(crate) fn racy_sum(&self) -> u64 {
        debug_assert_eq!(self.backend(), Backend::Rseq, "only rseq refs are scanned");
        #[cfg(not(percpu_ref_loom))]
        {
            self.slot.sum()
        }
        #[cfg(percpu_ref_loom)]
        match &self.kind {
            Kind::Sharded(_) => unreachable!("only rseq refs are scanned"),
            Kind::Model(s) => s.racy_sum(),
        }
    }

    /// Zeroes every counter (mode is atomic and sealed, lock held).
    pub(crate) fn reset(&self) {
        #[cfg(not(percpu_ref_loom))]
        match self.backend() {
            // After the grace period nothing writes the slot: plain zeroes.
            Backend::Rseq => self.slot.zero(),
            Backend::Sharded => sharded::reset(&self.slot),
        }
        #[cfg(percpu_ref_loom)]
        match &self.kind {
            Kind::Sharded(s) => sharded::reset(s),
            Kind::Model(s) => s.reset(),
        }
    }

    /// Bytes of per-CPU storage this ref owns (for accounting and docs).
    #[cfg_attr(
        not(loom),
        allow(
            clippy::unused_self,
            reason = "every ref's slot is the same size; under loom it depends on the backend"
        )
    )]
    pub(crate) fn storage_bytes(&self) -> usize {
        #[cfg(not(percpu_ref_loom))]
        {
            8 * arena::arena_cpus()
        }
        #[cfg(percpu_ref_loom)]
        match &self.kind {
            Kind::Sharded(_) => 8 * sharded::shard_count(),
            Kind::Model(s) => s.storage_bytes(),
        }
    }
}
