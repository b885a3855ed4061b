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
//!     if cpu >= ncpu (unsigned) goto out (not counted)
//!     mode = *mode_word                  // loaded inside the section
//!     if mode & MODE_ATOMIC goto end     (not counted)
//!     *(slot + (cpu << REGION_SHIFT)) += delta // the commit: one instruction
//! end:                                   // post-commit
//! ...
//! out:                                   // outside the section
//!     result = cpu < 0 ? UNREGISTERED : OUT_OF_ARENA; goto end
//! abort:                                 // preceded by the 4-byte signature
//!     result = ABORTED; goto end
//! ```
//!
//! No atomic read-modify-write: the add is a plain `add` to memory that only
//! threads running on this CPU touch, and the kernel guarantees that a
//! thread interrupted before the commit never commits (it restarts at
//! `abort`, and the Rust side retries).
//!
//! # The bound
//!
//! `ncpu` is the number of regions the arena's chunks were sized with
//! ([`arena::fast_path_cpus`](super::arena::fast_path_cpus)), passed in a
//! register. The possible-CPU count it comes from is trusted for speed,
//! never for memory safety: a container can under-report it, and then a
//! thread on a CPU above it would add past the end of its chunk. The one
//! unsigned compare sends every such `cpu_id` to the atomic path, and also
//! every negative one (a thread whose rseq registration failed: `cpu_id`
//! is -1 or -2), so the section indexes only regions that exist. Inside
//! the section it costs nothing: its compare and branch replace the sign
//! test that an unregistered thread needs anyway. Outside it, each
//! operation loads the bound with a relaxed load from the read-mostly
//! static that also holds the rseq offset (`rseq_abi::FAST_PATH`: one base
//! address, one cache line) and passes it in a register: one instruction
//! per operation (callgrind: 38 to 40 instructions per get+put pair).
//!
//! # Threads
//!
//! Every thread that uses a ref must have been made by the C library
//! (`pthread_create`) or by Rust's `std::thread`, so that it has its own
//! rseq area registered by glibc (or none, and `cpu_id` < 0). A thread made
//! with a raw `clone` system call shares its parent's area (or has an
//! unregistered copy whose `cpu_id` is stale): the kernel does not know it
//! runs a critical section, never aborts it, and its add could commit on a
//! CPU it no longer runs on, racing with that CPU's own adds or with a
//! switch's sum. That cannot be detected cheaply, so it is a documented
//! requirement.
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

use super::arena::{self, Slot, REGION_SHIFT};
use super::rseq_abi::{self, CPU_ID_OFFSET, RSEQ_CS_OFFSET};
use crate::sync::AtomicUsize;
use std::arch::asm;

/// Result bit: the kernel aborted the section; retry.
const ABORTED: u32 = 1 << 30;
/// Result bit: this thread has no registered rseq area (`cpu_id` < 0).
const UNREGISTERED: u32 = 1 << 31;
/// Result bit: `cpu_id` is at or above the arena's CPU count (the
/// possible-CPU count was under-reported): this CPU has no region.
const OUT_OF_ARENA: u32 = 1 << 29;
/// Result bits that mean "not counted": `MODE_ATOMIC`, an unregistered
/// thread, a CPU without a region, or an abort.
const NOT_COUNTED: u32 = super::MODE_ATOMIC as u32 | UNREGISTERED | OUT_OF_ARENA | ABORTED;

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

    /// The slot's CPU-0 counter, for [`try_add_at`].
    #[inline(always)]
    pub(crate) fn base(&self) -> *mut u8 {
        self.slot.base()
    }

    #[cfg(test)]
    fn try_add(&self, mode: &AtomicUsize, delta: u64) -> bool {
        try_add_at(self.base(), mode, delta)
    }

    #[cfg(test)]
    fn section(&self, mode: &AtomicUsize, delta: u64, ncpu: u32) -> u32 {
        section(self.base(), mode, delta, ncpu)
    }

    pub(crate) fn seal_and_sum(&self) -> std::io::Result<u64> {
        rseq_abi::grace_period()?;
        Ok(self.slot.sum())
    }

    pub(crate) fn reset(&self) {
        self.slot.zero();
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        8 * arena::arena_cpus()
    }
}

/// Adds `delta` to this CPU's counter of the slot at `base` if `mode` is
/// percpu (the backend's `try_add`). Takes the slot's address rather than
/// `&RseqCounters`, so that no borrow of the ref is live while the add
/// commits (see `percpu::Target`); arena memory itself is never freed.
#[inline(always)]
pub(crate) fn try_add_at(base: *mut u8, mode: &AtomicUsize, delta: u64) -> bool {
    let ncpu = arena::fast_path_cpus();
    let r = section(base, mode, delta, ncpu);
    r & NOT_COUNTED == 0 || try_add_slow(base, mode, delta, ncpu, r)
}

/// After an abort, retry until the section commits or finds the mode
/// atomic (or this thread unregistered, or on a CPU without a region).
#[cold]
#[inline(never)]
fn try_add_slow(base: *mut u8, mode: &AtomicUsize, delta: u64, ncpu: u32, mut r: u32) -> bool {
    while r & ABORTED != 0 {
        rseq_abi::record_abort();
        r = section(base, mode, delta, ncpu);
    }
    r & NOT_COUNTED == 0
}

/// Runs the critical section once on the slot whose CPU-0 counter is at
/// `base` (an arena slot), with `ncpu` as the bound on `cpu_id`;
/// returns the mode word as loaded in it (counted when `MODE_ATOMIC` is
/// clear), [`UNREGISTERED`], [`OUT_OF_ARENA`] or [`ABORTED`].
///
/// `ncpu` must be at most [`arena::arena_cpus`] (the regions this
/// slot's chunk has) and at most `i32::MAX`; the fast path passes
/// exactly [`arena::fast_path_cpus`], tests pass less.
///
/// `cpu_id` and the mode are tested separately: or-ing them into one
/// word (one instruction less) would read CPU 1's id as `MODE_ATOMIC`
/// and send every operation on odd CPUs to the atomic path.
#[inline(always)]
fn section(base: *mut u8, mode: &AtomicUsize, delta: u64, ncpu: u32) -> u32 {
    debug_assert!(ncpu as usize <= arena::arena_cpus() && ncpu <= i32::MAX as u32);
    let result: u32;
    // SAFETY: `rseq_offset` locates glibc's registered rseq area of this
    // thread (`available()` held when these counters were made); the
    // section writes only `rseq_cs` there, as the ABI intends. The
    // descriptor lives in the `__rseq_cs` section, 32-byte aligned, with
    // `abort_ip` outside [start_ip, post_commit) and preceded by glibc's
    // x86 signature 0x53053053. The store that arms the section is the
    // instruction right before `start_ip`, so an interrupt after it
    // lands inside the section. The commit writes the slot's counter
    // for `cpu_id` only when `cpu_id` < `ncpu` as unsigned numbers
    // (every negative id, read as unsigned, is above `ncpu` <=
    // i32::MAX), and `ncpu` is at most the number of regions the slot's
    // chunk has, so the write is inside the chunk whatever the kernel
    // reports; only this CPU's threads write that counter, and the
    // kernel aborts any that is interrupted before the commit. `mode` is
    // read, never written.
    unsafe {
        asm!(
            "lea {tmp}, [rip + 3f]",
            "mov qword ptr fs:[{off} + {cs}], {tmp}",
            "4:",
            "mov {tmp:e}, dword ptr fs:[{off} + {cpu_id}]",
            "cmp {tmp:e}, {ncpu:e}",
            "jae 7f",
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
            "mov {res:e}, {out_of_arena}",
            "test {tmp:e}, {tmp:e}",
            "jns 5b",
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
            slot = in(reg) base,
            delta = in(reg) delta,
            ncpu = in(reg) ncpu,
            tmp = out(reg) _,
            res = out(reg) result,
            cs = const RSEQ_CS_OFFSET,
            cpu_id = const CPU_ID_OFFSET,
            shift = const REGION_SHIFT,
            atomic = const super::MODE_ATOMIC as u32,
            unregistered = const UNREGISTERED,
            out_of_arena = const OUT_OF_ARENA,
            aborted = const ABORTED,
            options(nostack),
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPUs this thread may run on.
    fn allowed_cpus() -> Vec<usize> {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it, and
        // CPU_ISSET reads it with an index below its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0,
                "sched_getaffinity failed"
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Pins the calling thread to `cpu`.
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t with one bit set; sched_setaffinity(0,
        // ..) reads it and pins this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0,
                "cannot pin to CPU {cpu}"
            );
        }
    }

    /// Runs the section until the kernel does not abort it.
    fn section_once(c: &RseqCounters, mode: &AtomicUsize, delta: u64, ncpu: u32) -> u32 {
        loop {
            let r = c.section(mode, delta, ncpu);
            if r & ABORTED == 0 {
                return r;
            }
        }
    }

    /// Issue 10, item 4: the arena believes there is one CPU (a container
    /// that under-reports the possible CPUs) and the thread runs on CPU 1.
    /// The section must not count, must say why, and must write nothing:
    /// without the bound it added into the region of CPU 1, which such an
    /// arena does not have (heap memory past the chunk).
    #[test]
    fn cpu_at_or_above_the_arena_bound_is_not_counted_and_writes_nothing() {
        if !rseq_abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        if !allowed_cpus().contains(&1) || arena::arena_cpus() < 2 {
            eprintln!("skipped: CPU 1 is not available to this process");
            return;
        }
        std::thread::spawn(|| {
            pin_to(1);
            let c = RseqCounters::new();
            let percpu = AtomicUsize::new(0);
            // Bound 1: CPU 1 has no region.
            for _ in 0..10_000 {
                let r = section_once(&c, &percpu, 1, 1);
                assert_eq!(r, OUT_OF_ARENA, "CPU 1 counted past a 1-CPU bound");
                assert!(!try_add_slow(c.base(), &percpu, 1, 1, r));
            }
            for cpu in 0..arena::arena_cpus() {
                assert_eq!(c.slot.load(cpu), 0, "region of CPU {cpu} was written");
            }
            // Bound 0 (no chunk sized yet): nothing counts anywhere.
            assert_eq!(section_once(&c, &percpu, 1, 0), OUT_OF_ARENA);
            // The arena's own bound: CPU 1 counts in its region, in place.
            let r = section_once(&c, &percpu, 5, arena::fast_path_cpus());
            assert_eq!(r & NOT_COUNTED, 0, "CPU 1 refused below the bound");
            assert_eq!(c.slot.load(1), 5);
            assert_eq!(c.slot.load(0), 0);
            // The bound applies to a mode word that is atomic too.
            let atomic = AtomicUsize::new(super::super::MODE_ATOMIC);
            assert_eq!(section_once(&c, &atomic, 1, 1), OUT_OF_ARENA);
            assert_eq!(
                section_once(&c, &atomic, 1, 2),
                super::super::MODE_ATOMIC as u32
            );
            assert_eq!(c.seal_and_sum().unwrap(), 5);
        })
        .join()
        .unwrap();
    }

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
