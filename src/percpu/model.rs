//! Loom model of the rseq backend (built only under `--cfg loom`).
//!
//! Loom cannot run a restartable sequence or a `membarrier`, so this module
//! models what they guarantee (DESIGN.md §3c):
//!
//! - a *CPU* is a slot with a plain counter (a `loom::cell::UnsafeCell`, so
//!   loom reports any access that is not ordered by the protocol) and a
//!   *section lock*;
//! - an rseq section is a critical section on that CPU's lock: it reads the
//!   mode word inside, returns `false` when `MODE_ATOMIC` is set, else adds
//!   with a plain read-modify-write. A section runs on one CPU from start to
//!   commit, as abort-and-restart guarantees;
//! - the grace period (`membarrier(PRIVATE_EXPEDITED_RSEQ)`) takes and
//!   drops every CPU's lock in turn: a section either committed before the
//!   grace period passed its CPU, or starts after and sees `MODE_ATOMIC`;
//! - the sum and the reset are plain reads and writes outside any lock,
//!   as in the real backend.
//!
//! Threads are mapped to CPUs by loom thread id plus the number of sections
//! the thread has run, so a thread migrates to the other CPU between any
//! two of its operations, and CPUs are shared by several threads (2 CPUs
//! for up to 3 threads).

use super::{cpus::possible_cpus, sharded::thread_index, MODE_ATOMIC};
use crate::sync::{self, AtomicUsize, Mutex, Ordering};
use loom::cell::UnsafeCell;
use std::cell::Cell;

struct Cpu {
    /// Held for the duration of one rseq section on this CPU.
    section: Mutex<()>,
    /// This CPU's counter; plain memory, as in the per-CPU arena.
    count: UnsafeCell<u64>,
}

// SAFETY: `count` is written only inside a section (holding `section`) or by
// `reset`, and read by `seal_and_sum` after the grace period; loom checks
// that these accesses are ordered and fails the model otherwise.
unsafe impl Sync for Cpu {}

pub(crate) struct ModelCpus {
    cpus: Box<[Cpu]>,
}

impl ModelCpus {
    pub(crate) fn new() -> Self {
        ModelCpus {
            cpus: (0..possible_cpus())
                .map(|_| Cpu {
                    section: Mutex::new(()),
                    count: UnsafeCell::new(0),
                })
                .collect(),
        }
    }

    /// One rseq section: on this CPU, add `delta` unless the mode is atomic.
    pub(crate) fn try_add(&self, mode: &AtomicUsize, delta: u64) -> bool {
        let cpu = &self.cpus[current_cpu() % self.cpus.len()];
        let _section = sync::lock(&cpu.section);
        // Acquire (as the aarch64 section's load): a section that sees
        // percpu mode must see the zeroed counters `reset` left.
        if mode.load(Ordering::Acquire) & MODE_ATOMIC != 0 {
            return false;
        }
        // SAFETY: inside this CPU's section; no other section runs here, and
        // the switcher reads only after its grace period passed this lock.
        cpu.count
            .with_mut(|c| unsafe { *c = (*c).wrapping_add(delta) });
        true
    }

    /// The grace period, then the sum of every CPU's counter.
    pub(crate) fn seal_and_sum(&self) -> u64 {
        // mutant no_grace_period: sum without waiting for sections in flight.
        #[cfg(not(percpu_ref_mutant = "no_grace_period"))]
        for cpu in self.cpus.iter() {
            drop(sync::lock(&cpu.section));
        }
        self.cpus.iter().fold(0u64, |sum, cpu| {
            // SAFETY: every section on this CPU either ended before the grace
            // period took its lock or saw MODE_ATOMIC and wrote nothing.
            sum.wrapping_add(cpu.count.with(|c| unsafe { *c }))
        })
    }

    /// Zeroes every counter (mode atomic, grace period passed, lock held).
    pub(crate) fn reset(&self) {
        for cpu in self.cpus.iter() {
            // SAFETY: the mode is atomic and a grace period has passed since
            // it was set, so no section writes; the release store of the
            // cleared mode publishes this write to the next sections.
            cpu.count.with_mut(|c| unsafe { *c = 0 });
        }
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        self.cpus.len() * std::mem::size_of::<u64>()
    }
}

/// The model CPU the calling thread runs its next section on: its loom
/// thread id, moved on by one CPU after every section (a migration).
fn current_cpu() -> usize {
    loom::thread_local! {
        static SECTIONS: Cell<usize> = Cell::new(0);
    }
    SECTIONS.with(|n| {
        let k = n.get();
        n.set(k + 1);
        thread_index() + k
    })
}
