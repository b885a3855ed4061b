//! The section on `aarch64`: the thread pointer comes from `tpidr_el0`
//! (read outside the section, once per function: it is the thread's, and
//! no register of the section depends on where it runs), `rseq_cs` and the
//! id are reached from it by register offsets, and the commit is one LSE
//! atomic add, `stadd` (ARMv8.1).
//!
//! Eleven instructions per operation in a loop of gets and puts, as on
//! `x86_64` (`scripts/aarch64-pair` prints them): two `ldp`s load the two
//! offsets (adjacent in `abi`'s `Offsets`) and the mode word with the
//! slot's base after it (adjacent in `PercpuRef`), where three or four
//! loads would be needed otherwise; the descriptor's address takes
//! `adrp` + `add`, as it must live in a writable section (it holds
//! absolute addresses, which a position-independent executable relocates
//! at load time: in the code's own section they would make it writable).
//!
//! # Why `stadd` and not load, add, store
//!
//! The kernel restarts a section when it preempts, migrates or signals the
//! thread inside it, so a commit of three instructions (`ldr`, `add`,
//! `str`) is exact only if *every* preemption aborts. Linux 6.19's rseq
//! rework was reported to stop aborting on arm64 when a thread is
//! preempted and resumed on the same CPU; a load/add/store interrupted
//! there by another thread of the same CPU (or, under `mm_cid`, the thread
//! the id passed to) would lose that thread's adds. One instruction cannot
//! be split by any preemption, whatever the kernel does: the only commits
//! of this section are `stadd`s, atomic with respect to every other write
//! of the counter: no exclusive monitor, no loop, no barrier, and two
//! instructions fewer than load, add, store. What it costs on hardware was
//! not measured (no aarch64 machine here): a core that performs the atomic
//! in its own L1 (the line is this CPU's, written by no other) pays about
//! a store; one that sends every LSE atomic out to the interconnect would
//! pay more, and then load, add, store on a kernel proven to abort on every
//! preemption is the alternative to measure.
//!
//! A CPU without LSE (ARMv8.0: Cortex-A53/A57/A72, Graviton 1) gets the
//! sharded backend instead ([`abi`](super::abi) checks
//! `HWCAP_ATOMICS` before it says the backend is available): every
//! process there arms sections (the sharded refs' bound of 0), but none
//! reaches the `stadd`.
//!
//! # Ordering
//!
//! The bound is loaded with a plain load (the `ldp` that also loads the
//! slot's base, which never changes while a ref lives). The switch to percpu mode
//! zeroes the slot's counters and then stores the bound with a release
//! store; a section that loaded that bound commits only after its compare
//! and branch, to an address computed from the base the same `ldp`
//! loaded, and Arm never lets a store (nor an atomic's write) become
//! visible before a load it depends on through a branch or an address:
//! the zeroes are therefore ordered before the `stadd`'s write, which adds
//! to them. No acquire: the kernel's `percpu_ref_get` relies on the same
//! address dependency from its `READ_ONCE` of the counter pointer. The switch back to atomic mode is covered, as on `x86_64`, by the
//! `membarrier` grace period, not by any order of the section's loads.

use super::super::arena::REGION_SHIFT;
use super::abi;
use super::Section;
use crate::sync::AtomicUsize;
use std::arch::asm;

/// The section's instructions (see [`section`]): arm, then `$check` (which
/// loads the id into `tmp` and branches to `not_counted` unless it may
/// count), then the commit. `$after_arm` and `$before_commit` are empty but
/// in the delay-injection build.
///
/// The signature `0xd428bc00` before the abort handler is glibc's (and
/// librseq's) for aarch64, a `brk` that traps if ever executed; the kernel
/// checks it against the registered one before it jumps to the handler.
macro_rules! section_asm {
    ($mode:ident, $delta:ident, $tp:ident, [$($check:literal),+ $(,)?],
     $after_arm:literal, $before_commit:literal; $($extra:tt)*) => {
        asm!(
            ".arch_extension lse",
            "ldp {index}, {cs}, [{offsets}, #8]",
            "adrp {tmp}, 3f",
            "add {tmp}, {tmp}, :lo12:3f",
            "str {tmp}, [{tp}, {cs}]",
            "4:",
            $after_arm,
            $($check,)+
            $before_commit,
            "add {tmp}, {base}, {tmp}, lsl {shift}",
            "stadd {delta}, [{tmp}]",
            "5:",
            ".pushsection __rseq_cs, \"aw\"",
            ".balign 32",
            "3:",
            ".long 0, 0",
            ".quad 4b, 5b - 4b, 6f",
            ".popsection",
            ".pushsection .text.unlikely.percpu_ref_rseq_abort, \"ax\"",
            ".balign 4",
            ".inst 0xd428bc00",
            "6:",
            "b {aborted}",
            ".popsection",
            tp = in(reg) $tp,
            offsets = in(reg) abi::offsets(),
            index = out(reg) _,
            cs = out(reg) _,
            mode = in(reg) $mode,
            delta = in(reg) $delta,
            tmp = out(reg) _,
            bound = out(reg) _,
            base = out(reg) _,
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
/// preemptions and grace periods. They write only a scratch register and
/// the flags.
#[cfg(percpu_ref_delay)]
macro_rules! section_asm_delayed {
    ($mode:ident, $delta:ident, $tp:ident, [$($check:literal),+ $(,)?]; $($extra:tt)*) => {
        section_asm!(
            $mode, $delta, $tp, [$($check),+],
            "mov {spin}, {loops}\n 7:\n subs {spin}, {spin}, #1\n b.hs 7b",
            "mov {spin}, {loops}\n 8:\n subs {spin}, {spin}, #1\n b.hs 8b";
            spin = out(reg) _,
            loops = in(reg) super::super::delay::loops(),
            $($extra)*
        )
    };
}

/// The section with the delay build's spins where that build is chosen.
macro_rules! run_section {
    ($mode:ident, $delta:ident, $tp:ident, [$($check:literal),+ $(,)?]; $($extra:tt)*) => {{
        #[cfg(not(percpu_ref_delay))]
        section_asm!($mode, $delta, $tp, [$($check),+], "", ""; $($extra)*);
        #[cfg(percpu_ref_delay)]
        section_asm_delayed!($mode, $delta, $tp, [$($check),+]; $($extra)*);
    }};
}

/// Runs the critical section once: adds `delta` to the counter of this
/// thread's id (its `mm_cid` or `cpu_id`: [`abi::index_offset`]) at
/// `base + (id << REGION_SHIFT)` if the id is below the bound in the low
/// 32 bits of `*mode`, where `base` is the word after `*mode`: one `ldp`
/// loads both.
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
    let tp = abi::thread_pointer();
    // SAFETY: `tp + rseq_cs_offset()` is this thread's `rseq_cs` in its
    // rseq area: glibc's, registered or not, or the stand-in in static TLS
    // (`abi`), set before any ref existed; the section writes only
    // `rseq_cs` there, as the ABI intends. `tp + index_offset()` is that
    // area's `mm_cid` or `cpu_id`, an aligned u32, read only. The
    // descriptor lives in the `__rseq_cs` section, 32-byte aligned, with
    // `abort_ip` outside [start_ip, post_commit) and preceded by glibc's
    // aarch64 signature 0xd428bc00. The store that arms the section is the
    // instruction right before `start_ip`. The commit writes the slot's
    // counter for the id only when the id is below the mode word's bound
    // as unsigned 32-bit numbers (every negative id is above any bound <=
    // i32::MAX), and a non-zero bound is at most the number of regions of
    // the slot's chunk, so the write is inside the chunk whatever the
    // kernel reports. A non-zero bound exists only where `abi`
    // found LSE (`HWCAP_ATOMICS`), so `stadd` is only ever executed on a
    // CPU that has it. Only one running thread holds an id at a time, the
    // kernel aborts any section interrupted before the commit, and the
    // commit is one atomic instruction, so no add is lost. `mode` is read,
    // never written (little-endian: the word at its address is the bound).
    // The delay build's spins write only a scratch register and the flags
    // and lie inside the section.
    unsafe {
        // No test that the thread is registered: see the x86_64 section.
        #[cfg(not(any(
            percpu_ref_mutant = "rseq_bound_by_cpu_id",
            percpu_ref_mutant = "rseq_add_by_cpu_id"
        )))]
        run_section!(mode, delta, tp, [
            "ldr {tmp:w}, [{tp}, {index}]",
            "ldp {bound}, {base}, [{mode}]",
            "cmp {tmp:w}, {bound:w}",
            "b.hs {not_counted}",
        ];);
        // mutant rseq_bound_by_cpu_id: the bound is checked on `cpu_id`,
        // the add indexed by the process's index (`mm_cid`).
        #[cfg(percpu_ref_mutant = "rseq_bound_by_cpu_id")]
        run_section!(mode, delta, tp, [
            "ldr {tmp:w}, [{tp}, {cpu_id}]",
            "ldp {bound}, {base}, [{mode}]",
            "cmp {tmp:w}, {bound:w}",
            "b.hs {not_counted}",
            "ldr {tmp:w}, [{tp}, {index}]",
        ]; cpu_id = in(reg) abi::cpu_id_offset(),);
        // mutant rseq_add_by_cpu_id: the bound is checked on the process's
        // index (`mm_cid`), the add indexed by `cpu_id`.
        #[cfg(percpu_ref_mutant = "rseq_add_by_cpu_id")]
        run_section!(mode, delta, tp, [
            "ldr {tmp:w}, [{tp}, {index}]",
            "ldp {bound}, {base}, [{mode}]",
            "cmp {tmp:w}, {bound:w}",
            "b.hs {not_counted}",
            "ldr {tmp:w}, [{tp}, {cpu_id}]",
        ]; cpu_id = in(reg) abi::cpu_id_offset(),);
    }
    Section::Counted
}
