//! The rseq backend: true per-CPU counters, as the kernel's `this_cpu_add`.
//!
//! # The fast path
//!
//! One restartable sequence (a critical section the kernel aborts if the
//! thread is preempted, migrated or signalled inside it):
//!
//! ```text
//!     rseq->rseq_cs = &descriptor        // arms the section
//! start:
//!     cpu  = rseq->cpu_id
//!     if cpu < 0 goto unregistered       (not counted)
//!     mode = *mode_word                  // loaded inside the section
//!     if mode & MODE_ATOMIC goto end     (not counted)
//!     *(slot + (cpu << REGION_SHIFT)) += delta // the commit: one instruction
//! end:                                   // post-commit
//! ...
//! abort:                                 // preceded by the 4-byte signature
//!     result = ABORTED; goto end
//! ```
//!
//! No atomic read-modify-write: the add is a plain `add` to memory that only
//! threads running on this CPU touch, and the kernel guarantees that a
//! thread interrupted before the commit never commits (it restarts at
//! `abort`, and the Rust side retries). A negative `cpu_id` (a thread that
//! glibc failed to register) also fails the test, so such a thread only ever
//! takes the atomic path and never indexes outside the arena.
//!
//! # Why a switch is exact
//!
//! The switcher stores `MODE_ATOMIC`, then waits out
//! [`grace_period`](super::rseq_abi::grace_period) (`membarrier` with the
//! RSEQ flag). A section that loaded the old mode is then either committed,
//! and its add visible to the switcher's sum, or aborted and retried, in
//! which case it loads `MODE_ATOMIC` and is not counted. After the grace
//! period nothing writes the slot until the mode goes back to percpu, which
//! first zeroes it ([`reset`](RseqCounters::reset)) and then clears the bit
//! with a release store; x86's loads are acquire loads, so a section that
//! sees the bit clear sees the zeroes.

use super::arena::{Slot, REGION_SHIFT};
use super::rseq_abi::{self, CPU_ID_OFFSET, RSEQ_CS_OFFSET};
use crate::sync::AtomicUsize;
use std::arch::asm;

/// Result bit: the kernel aborted the section; retry.
const ABORTED: u32 = 1 << 30;
/// Result bit: this thread has no registered rseq area (`cpu_id` < 0).
const UNREGISTERED: u32 = 1 << 31;
/// Result bits that mean "not counted": `MODE_ATOMIC`, an unregistered
/// thread, or an abort.
const NOT_COUNTED: u32 = super::MODE_ATOMIC as u32 | UNREGISTERED | ABORTED;

pub(crate) struct RseqCounters {
    slot: Slot,
}

impl RseqCounters {
    pub(crate) fn new() -> Self {
        debug_assert!(rseq_abi::available());
        RseqCounters {
            slot: Slot::alloc(),
        }
    }

    #[inline(always)]
    pub(crate) fn try_add(&self, mode: &AtomicUsize, delta: u64) -> bool {
        let r = self.section(mode, delta);
        r & NOT_COUNTED == 0 || self.try_add_slow(mode, delta, r)
    }

    /// After an abort, retry until the section commits or finds the mode
    /// atomic (or this thread unregistered).
    #[cold]
    #[inline(never)]
    fn try_add_slow(&self, mode: &AtomicUsize, delta: u64, mut r: u32) -> bool {
        while r & ABORTED != 0 {
            rseq_abi::record_abort();
            r = self.section(mode, delta);
        }
        r & NOT_COUNTED == 0
    }

    /// Runs the critical section once; returns the mode word as loaded in
    /// it (counted when `MODE_ATOMIC` is clear), [`UNREGISTERED`] or
    /// [`ABORTED`].
    ///
    /// `cpu_id` and the mode are tested separately: or-ing them into one
    /// word (one instruction less) would read CPU 1's id as `MODE_ATOMIC`
    /// and send every operation on odd CPUs to the atomic path.
    #[inline(always)]
    fn section(&self, mode: &AtomicUsize, delta: u64) -> u32 {
        let result: u32;
        // SAFETY: `rseq_offset` locates glibc's registered rseq area of this
        // thread (`available()` held when these counters were made); the
        // section writes only `rseq_cs` there, as the ABI intends. The
        // descriptor lives in the `__rseq_cs` section, 32-byte aligned, with
        // `abort_ip` outside [start_ip, post_commit) and preceded by glibc's
        // x86 signature 0x53053053. The store that arms the section is the
        // instruction right before `start_ip`, so an interrupt after it
        // lands inside the section. The commit writes the slot's counter
        // for `cpu_id`, which is < possible_cpus (a negative id branches
        // out), inside the slot's chunk; only this CPU's threads write it,
        // and the kernel aborts any that is interrupted before the commit.
        // `mode` is read, never written.
        unsafe {
            asm!(
                "lea {tmp}, [rip + 3f]",
                "mov qword ptr fs:[{off} + {cs}], {tmp}",
                "4:",
                "mov {tmp:e}, dword ptr fs:[{off} + {cpu_id}]",
                "test {tmp:e}, {tmp:e}",
                "js 7f",
                "mov {res:e}, dword ptr [{mode}]",
                "test {res:e}, {atomic}",
                "jnz 5f",
                "shl {tmp}, {shift}",
                "add qword ptr [{slot} + {tmp}], {delta}",
                "5:",
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4b, 5b - 4b, 6f",
                ".popsection",
                ".pushsection .text.unlikely.percpu_ref_rseq_abort, \"ax\"",
                "7:",
                "mov {res:e}, {unregistered}",
                "jmp 5b",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "6:",
                "mov {res:e}, {aborted}",
                "jmp 5b",
                ".popsection",
                off = in(reg) rseq_abi::rseq_offset(),
                mode = in(reg) mode.as_ptr(),
                slot = in(reg) self.slot.base(),
                delta = in(reg) delta,
                tmp = out(reg) _,
                res = out(reg) result,
                cs = const RSEQ_CS_OFFSET,
                cpu_id = const CPU_ID_OFFSET,
                shift = const REGION_SHIFT,
                atomic = const super::MODE_ATOMIC as u32,
                unregistered = const UNREGISTERED,
                aborted = const ABORTED,
                options(nostack),
            );
        }
        result
    }

    pub(crate) fn seal_and_sum(&self) -> std::io::Result<u64> {
        rseq_abi::grace_period()?;
        Ok(self.slot.sum())
    }

    pub(crate) fn reset(&self) {
        self.slot.zero();
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        8 * super::possible_cpus()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path must count on every CPU this process may use, not
    /// just fall back to the (correct but slow) atomic path somewhere.
    #[test]
    fn counts_per_cpu_on_every_allowed_cpu() {
        if !rseq_abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        let cpus: Vec<usize> = std::thread::spawn(|| {
            // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: a valid set of the size passed; 0 = this thread.
            let ok = unsafe {
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
            } == 0;
            assert!(ok, "sched_getaffinity failed");
            // SAFETY: CPU_ISSET reads the set with an index below its size.
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect()
        })
        .join()
        .unwrap();
        for cpu in cpus {
            std::thread::spawn(move || {
                // SAFETY: as above; sched_setaffinity(0, ..) pins this thread.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    assert_eq!(
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                        0
                    );
                }
                let c = RseqCounters::new();
                let percpu = AtomicUsize::new(0);
                for _ in 0..1000 {
                    assert!(
                        c.try_add(&percpu, 1),
                        "the fast path refused to count on CPU {cpu}"
                    );
                }
                let atomic = AtomicUsize::new(super::super::MODE_ATOMIC);
                assert!(
                    !c.try_add(&atomic, 1),
                    "counted in atomic mode on CPU {cpu}"
                );
                assert_eq!(c.seal_and_sum().unwrap(), 1000);
            })
            .join()
            .unwrap();
        }
    }
}
