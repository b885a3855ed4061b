//! The section on `x86_64`: `rseq_cs` and the id are reached through `%fs`
//! (the thread pointer's segment), so the thread pointer costs nothing; the
//! bound is compared straight from memory, and the commit is one `add` to
//! memory, which no interrupt can split. x86's loads are acquire loads:
//! a section that sees a ref's bound sees the zeroes stored before it.

use super::super::arena::REGION_SHIFT;
#[cfg(any(
    percpu_ref_mutant = "rseq_bound_by_cpu_id",
    percpu_ref_mutant = "rseq_add_by_cpu_id"
))]
use super::abi::CPU_ID_OFFSET;
use super::abi::{self, RSEQ_CS_OFFSET};
use super::Section;
use crate::sync::AtomicUsize;
use std::arch::asm;

/// The section's instructions (see [`section`]): arm, then `$check` (which
/// loads the id into `tmp` and jumps to `not_counted` unless it may count),
/// then the commit. `$after_arm` and `$before_commit` are empty but in the
/// delay-injection build.
macro_rules! section_asm {
    ($base:ident, $mode:ident, $delta:ident, [$($check:literal),+ $(,)?],
     $after_arm:literal, $before_commit:literal; $($extra:tt)*) => {
        asm!(
            "lea {tmp}, [rip + 3f]",
            "mov qword ptr fs:[{off} + {cs}], {tmp}",
            "4:",
            $after_arm,
            $($check,)+
            $before_commit,
            "shl {tmp}, {shift}",
            "add qword ptr [{base} + {tmp}], {delta}",
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
            "jmp {aborted}",
            ".popsection",
            off = in(reg) abi::rseq_offset(),
            mode = in(reg) $mode,
            base = in(reg) $base,
            delta = in(reg) $delta,
            tmp = out(reg) _,
            cs = const RSEQ_CS_OFFSET,
            shift = const REGION_SHIFT,
            not_counted = label {
                return Section::NotCounted;
            },
            aborted = label {
                return Section::Aborted;
            },
            $($extra)*
            options(nostack),
        )
    };
}

/// [`section_asm`] with the delay build's spins (`percpu_ref_delay`,
/// scripts/vm-test): one after arming and one between the check and the
/// commit, inside the section, so that the kernel aborts it on most
/// preemptions and grace periods. They write only a scratch register.
#[cfg(percpu_ref_delay)]
macro_rules! section_asm_delayed {
    ($base:ident, $mode:ident, $delta:ident, [$($check:literal),+ $(,)?]; $($extra:tt)*) => {
        section_asm!(
            $base, $mode, $delta, [$($check),+],
            "mov {spin}, {loops}\n 7:\n sub {spin}, 1\n jae 7b",
            "mov {spin}, {loops}\n 8:\n sub {spin}, 1\n jae 8b";
            spin = out(reg) _,
            loops = in(reg) super::super::delay::loops(),
            $($extra)*
        )
    };
}

/// The section with the delay build's spins where that build is chosen.
macro_rules! run_section {
    ($base:ident, $mode:ident, $delta:ident, [$($check:literal),+ $(,)?]; $($extra:tt)*) => {{
        #[cfg(not(percpu_ref_delay))]
        section_asm!($base, $mode, $delta, [$($check),+], "", ""; $($extra)*);
        #[cfg(percpu_ref_delay)]
        section_asm_delayed!($base, $mode, $delta, [$($check),+]; $($extra)*);
    }};
}

/// Runs the critical section once: adds `delta` to the counter of this
/// thread's id (its `mm_cid` or `cpu_id`: [`abi::index_offset`]) at
/// `base + (id << REGION_SHIFT)` if the id is below the bound in the low
/// 32 bits of `*mode`, where `base` is the word after `*mode`.
///
/// The bound is either 0 or at most `arena::arena_cpus()` (the regions
/// the slot's chunk has) and at most `i32::MAX`: `Counters::percpu_mode`
/// is the only non-zero value a mode word holds.
///
/// # Safety
///
/// As [`try_add_at`](super::try_add_at).
#[inline(always)]
pub(super) unsafe fn section(mode: *const AtomicUsize, delta: u64) -> Section {
    // SAFETY: the base is the word after the mode word (the caller's
    // contract), never written while the ref lives.
    let base = unsafe { mode.add(1).cast::<*mut u8>().read() };
    // SAFETY: `rseq_offset` locates this thread's rseq area: glibc's,
    // registered or not, or the stand-in in static TLS (`abi`), set
    // before any ref existed; the section writes only `rseq_cs` there, as
    // the ABI intends. `index_offset` is that area's `mm_cid` or `cpu_id`,
    // an aligned u32, read only. The descriptor lives in the `__rseq_cs`
    // section, 32-byte aligned, with `abort_ip` outside [start_ip,
    // post_commit) and preceded by glibc's x86 signature 0x53053053. The
    // store that arms the section is the instruction right before
    // `start_ip`, so an interrupt after it lands inside the section. The
    // commit writes the slot's counter for the id only when the id is
    // below the mode word's bound as unsigned 32-bit numbers (every
    // negative id is above any bound <= i32::MAX), and a non-zero bound is
    // at most the number of regions of the slot's chunk, so the write is
    // inside the chunk whatever the kernel reports. Only one running
    // thread holds an id at a time (a CPU runs one thread; the kernel
    // gives an `mm_cid` to one running thread of the process at a time and
    // changes a thread's only when it is scheduled), and the kernel aborts
    // any section interrupted before the commit, so no two commits to one
    // counter race. `mode` is read, never written (x86 is little-endian:
    // the dword at its address is the bound). The delay build's spins
    // write only a scratch register and lie inside the section.
    unsafe {
        // No test that the thread is registered: under `mm_cid` indexing
        // an unregistered thread's id would be 0 or stale (not negative,
        // as its `cpu_id`), but glibc aborts the process when it cannot
        // register a thread of a process whose first thread it registered
        // ("Fatal glibc error: rseq registration failed"), so no such
        // thread runs here (tests/rseq_stress.rs,
        // `a_thread_refused_rseq_does_not_run`).
        #[cfg(not(any(
            percpu_ref_mutant = "rseq_bound_by_cpu_id",
            percpu_ref_mutant = "rseq_add_by_cpu_id"
        )))]
        run_section!(base, mode, delta, [
            "mov {tmp:e}, dword ptr fs:[{index}]",
            "cmp {tmp:e}, dword ptr [{mode}]",
            "jae {not_counted}",
        ]; index = in(reg) abi::index_offset(),);
        // mutant rseq_bound_by_cpu_id: the bound is checked on `cpu_id`,
        // the add indexed by the process's index (`mm_cid`): a thread whose
        // `mm_cid` is at or above the bound (more threads running than the
        // arena has regions) adds past the chunk.
        #[cfg(percpu_ref_mutant = "rseq_bound_by_cpu_id")]
        run_section!(base, mode, delta, [
            "mov {tmp:e}, dword ptr fs:[{off} + {cpu_id}]",
            "cmp {tmp:e}, dword ptr [{mode}]",
            "jae {not_counted}",
            "mov {tmp:e}, dword ptr fs:[{index}]",
        ]; index = in(reg) abi::index_offset(), cpu_id = const CPU_ID_OFFSET,);
        // mutant rseq_add_by_cpu_id: the bound is checked on the process's
        // index (`mm_cid`), the add indexed by `cpu_id`: a thread on a CPU
        // at or above the bound (an arena capped below the CPU's id, where
        // the thread's `mm_cid` is 0) adds past the chunk.
        #[cfg(percpu_ref_mutant = "rseq_add_by_cpu_id")]
        run_section!(base, mode, delta, [
            "mov {tmp:e}, dword ptr fs:[{index}]",
            "cmp {tmp:e}, dword ptr [{mode}]",
            "jae {not_counted}",
            "mov {tmp:e}, dword ptr fs:[{off} + {cpu_id}]",
        ]; index = in(reg) abi::index_offset(), cpu_id = const CPU_ID_OFFSET,);
    }
    Section::Counted
}
