//! Loom model of the rseq backend (built only under `--cfg loom`).
//!
//! Loom cannot run a restartable sequence or a `membarrier`, so this module
//! models what they guarantee (docs/design.md §4):
//!
//! - a *CPU* is a *section lock*, shared by every ref (one per model CPU,
//!   process-wide), and each ref has a plain counter per CPU (a
//!   `loom::cell::UnsafeCell`, so loom reports any access that is not
//!   ordered by the protocol);
//! - an rseq section is a critical section on that CPU's lock: it reads the
//!   mode word inside, returns `false` when `MODE_ATOMIC` is set, else adds
//!   with a plain read-modify-write. A section runs on one CPU from start to
//!   commit, as abort-and-restart guarantees. (The real section compares
//!   `cpu_id` with the CPU bound in the mode word's low half, which is 0
//!   exactly when `MODE_ATOMIC` is set, and is non-zero for every modelled
//!   CPU otherwise; a CPU above the bound takes the atomic path, which is
//!   exact in either mode, so testing the flag loses no behaviour);
//! - the grace period (`membarrier(PRIVATE_EXPEDITED_RSEQ)`, one for the
//!   whole process, run by the grace-period engine, `src/grace.rs`) takes and
//!   drops every CPU's lock in turn: a section either committed before the
//!   grace period passed its CPU, or starts after and sees `MODE_ATOMIC`;
//! - the sum and the reset are plain reads and writes outside any lock,
//!   as in the real backend.
//!
//! Threads are mapped to CPUs by loom thread id plus the number of sections
//! the thread has run, so a thread migrates to the other CPU between any
//! two of its operations, and CPUs are shared by several threads (2 CPUs
//! for up to 3 threads).
//!
//! # Is the model weaker than the real fast path?
//!
//! No, for the switch back to percpu mode: the orders it lets a section see
//! are the ones the real section can see, and the mutants of that switch's
//! order fail here for the reason they would fail on the machine.
//!
//! - `reset_after_mode_store` (the counters zeroed *after* the mode store):
//!   possible on the real path. A section that loads the cleared bit
//!   commits its `add` to its CPU's slot, and the switcher's later zeroing
//!   store (a plain store from another CPU) overwrites it: a lost per-CPU
//!   count. Here the section's write and the reset's write are unordered
//!   writes to the CPU's cell, which loom reports (`kill_reinit_vs_tryget`,
//!   `kill_resurrect_vs_trygets`, `switch_vs_switch_and_get_put`). It is
//!   the *sharded* backend that cannot show this interleaving: its fast
//!   path never reads the mode word, and its shards stay sealed until
//!   `reset` swaps them to zero, so the reset itself is what lets percpu
//!   counting resume and its order against the mode store is irrelevant.
//! - `bias_after_mode_store` (the bias added after the mode store):
//!   possible on the real path. A thread whose section loaded the mode
//!   before the store (earlier in time, or a stale value) puts on the
//!   atomic path; if the base reference was put in percpu mode earlier,
//!   its put can take the unbiased counter to zero, releasing the ref,
//!   while another thread that saw the new mode holds a reference counted
//!   per CPU. The model allows it too, since the section's acquire load may
//!   return the old mode; no model exercised that shape until
//!   `percpu_switch_vs_atomic_put_and_tryget`, which catches the mutant on
//!   both backends.
//!
//! What the model does *not* reproduce is timing: a real section can also
//! be aborted and restarted by preemption or a signal, which the model
//! folds into "the section runs later"; the grace period is the only abort
//! the protocol relies on.

use super::{cpus::possible_cpus, sharded::thread_index, MODE_ATOMIC, MODE_UNMARKED};
use crate::sync::{self, AtomicUsize, Mutex, Ordering};
use loom::cell::UnsafeCell;
use std::cell::Cell;

loom::lazy_static! {
    /// One section lock per model CPU, shared by every ref: a CPU runs one
    /// section at a time whatever ref it counts on, and the grace period
    /// (one `membarrier` for the whole process) passes every CPU once for
    /// every ref. Reset by loom for every execution.
    static ref SECTIONS: Box<[Mutex<()>]> = (0..possible_cpus()).map(|_| Mutex::new(())).collect();
}

/// One ref's counters, one per model CPU; plain memory, as in the per-CPU
/// arena.
pub(crate) struct ModelCpus {
    cpus: Box<[UnsafeCell<u64>]>,
}

// SAFETY: a counter is written only inside a section (holding its CPU's
// lock in `SECTIONS`) or by `reset`, and read by `sum` after a grace
// period; loom checks that these accesses are ordered and fails the model
// otherwise.
unsafe impl Sync for ModelCpus {}

impl ModelCpus {
    pub(crate) fn new() -> Self {
        ModelCpus {
            cpus: (0..possible_cpus()).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    /// One rseq section: on this CPU, add `delta` unless the mode is atomic.
    pub(crate) fn try_add(&self, mode: &AtomicUsize, delta: u64) -> bool {
        let cpu = current_cpu() % self.cpus.len();
        let _section = sync::lock(&SECTIONS[cpu]);
        // Acquire (as the aarch64 section's load): a section that sees
        // percpu mode must see the zeroed counters `reset` left.
        // An unmarked managed ref has a bound of 0 on the real backend: the
        // model refuses it as the section's compare does.
        if mode.load(Ordering::Acquire) & (MODE_ATOMIC | MODE_UNMARKED) != 0 {
            return false;
        }
        // SAFETY: inside this CPU's section; no other section runs here, and
        // the switcher reads only after a grace period passed this lock.
        self.cpus[cpu].with_mut(|c| unsafe { *c = (*c).wrapping_add(delta) });
        true
    }

    /// The sum of every CPU's counter; a grace period has passed since the
    /// mode went atomic.
    pub(crate) fn sum(&self) -> u64 {
        self.cpus.iter().fold(0u64, |sum, cpu| {
            // SAFETY: every section on this CPU either ended before the grace
            // period took its lock or saw MODE_ATOMIC and wrote nothing.
            sum.wrapping_add(cpu.with(|c| unsafe { *c }))
        })
    }

    /// The sum of every CPU's counter while sections may still count: each
    /// counter is read inside its CPU's section (as the real backend's
    /// plain loads read each whole), so the sum is a racy snapshot, exact
    /// only once nothing counts any more.
    pub(crate) fn racy_sum(&self) -> u64 {
        self.cpus.iter().enumerate().fold(0u64, |sum, (cpu, c)| {
            let _section = sync::lock(&SECTIONS[cpu]);
            // SAFETY: inside this CPU's section, where no other runs.
            sum.wrapping_add(c.with(|c| unsafe { *c }))
        })
    }

    /// Zeroes every counter (mode atomic, grace period passed, lock held).
    pub(crate) fn reset(&self) {
        for cpu in &*self.cpus {
            // SAFETY: the mode is atomic and a grace period has passed since
            // it was set, so no section writes; the release store of the
            // cleared mode publishes this write to the next sections.
            cpu.with_mut(|c| unsafe { *c = 0 });
        }
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        self.cpus.len() * std::mem::size_of::<u64>()
    }
}

/// The grace period (`membarrier(PRIVATE_EXPEDITED_RSEQ)`): takes and drops
/// every CPU's section lock in turn, for every ref at once.
pub(crate) fn grace_period() {
    // mutant no_grace_period: sum without waiting for sections in flight.
    if mutated!("no_grace_period") {
        return;
    }
    for cpu in SECTIONS.iter() {
        drop(sync::lock(cpu));
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
