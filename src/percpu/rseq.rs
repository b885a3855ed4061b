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
//!     bad  = *mode | cpu                 // mode word loaded inside the section
//!     if bad & (MODE_ATOMIC | sign) goto end   (not counted)
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
/// Result bits that mean "not counted": `MODE_ATOMIC`, a negative `cpu_id`,
/// or an abort.
const NOT_COUNTED: u32 = super::MODE_ATOMIC as u32 | (1 << 31) | ABORTED;

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

    /// Runs the critical section once; returns `mode | cpu_id` as loaded in
    /// it, or [`ABORTED`].
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
                "mov {res:e}, dword ptr [{mode}]",
                "or {res:e}, {tmp:e}",
                "test {res:e}, {fail}",
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
                fail = const super::MODE_ATOMIC as u32 | (1 << 31),
                aborted = const ABORTED,
                options(nostack),
            );
        }
        result
    }

    pub(crate) fn seal_and_sum(&self) -> u64 {
        rseq_abi::grace_period();
        self.slot.sum()
    }

    pub(crate) fn reset(&self) {
        self.slot.zero();
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        8 * super::possible_cpus()
    }
}
