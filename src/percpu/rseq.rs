//! The rseq backend: true per-CPU counters, as the kernel's `this_cpu_add`.
//!
//! # The fast path
//!
//! One restartable sequence (a critical section the kernel aborts if the
//! thread is preempted, migrated or signalled inside it), inlined into
//! every get and put:
//!
//! ```text
//!     rseq->rseq_cs = &descriptor             // arms the section
//! start:
//!     cpu = rseq->cpu_id
//!     if cpu >= (u32)*mode_word goto not_counted   // unsigned
//!     *(base + (cpu << REGION_SHIFT)) += delta    // the commit: one instruction
//! end:                                        // post-commit: counted
//! ...
//! abort:                                      // preceded by the 4-byte signature
//!     goto aborted                            // the Rust side retries
//! ```
//!
//! Nine instructions per operation, with the loads of the rseq offset and
//! of the slot address (`scripts/callgrind-pair` counts them), and no
//! atomic read-modify-write: the add is a plain `add` to memory that only
//! threads running on this CPU touch, and the kernel guarantees that a
//! thread interrupted before the commit never commits (it restarts at
//! `abort`). `not_counted` and `aborted` are Rust labels (`asm!` goto), so
//! the counted case falls through with no result to test.
//!
//! # One compare for the mode, the bound and the backend
//!
//! The low half of the mode word is the ref's CPU bound
//! ([`MODE_LIMIT`](super::MODE_LIMIT)): the arena's region count while a
//! ref on this backend is in percpu mode, 0 in atomic mode and on every
//! other backend. `cpu_id < bound`, unsigned, is therefore false for
//!
//! - a ref in atomic mode (the kernel's `__PERCPU_REF_ATOMIC` test);
//! - a CPU at or above the arena's region count: the possible-CPU count
//!   the arena was sized with is trusted for speed, never for memory
//!   safety (a container can under-report it, and a thread on a CPU above
//!   it would otherwise add past the end of its chunk);
//! - a thread whose rseq registration failed (`cpu_id` is -1 or -2, above
//!   any bound <= `i32::MAX` as unsigned);
//! - a ref on another backend, which then counts its own way
//!   (`Counters::try_add_other`): choosing the backend costs the rseq path
//!   nothing.
//!
//! The kernel needs no bound (its per-CPU offsets come from a segment
//! register) and keeps the mode bits in the low bits of
//! `percpu_count_ptr`; here the bound shares the mode's load and branch
//! instead, and the slot address is a second word (`Counters::fast_base`).
//!
//! # Every process has an area to arm
//!
//! Refs on the sharded backend run the section too, so it must be safe to
//! arm in every process, including one where rseq is not available: the
//! offset is then glibc's unregistered area, which glibc reserves in every
//! thread whatever the registration did, or, where the C library has none
//! (glibc before 2.35, musl), a stand-in area in this crate's own
//! thread-local storage (`rseq_abi::rseq_offset`). No kernel reads either,
//! and every bound is 0 there, so the section only ever finds "not
//! counted".
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
//! The switcher stores `MODE_ATOMIC` (and a bound of 0), then waits out
//! [`grace_period`](super::rseq_abi::grace_period) (`membarrier` with the
//! RSEQ flag). A section that loaded the old bound is then either
//! committed, and its add visible to the switcher's sum, or aborted and
//! retried, in which case it loads the new one and is not counted. After
//! the grace period nothing writes the slot until the mode goes back to
//! percpu, which first zeroes it (`Counters::reset`) and then
//! stores the bound with a release store; x86's loads are acquire loads,
//! so a section that sees the bound sees the zeroes.

#[cfg(any(test, doc))]
use super::arena;
#[cfg(test)]
use super::arena::Slot;
use super::arena::REGION_SHIFT;
use super::rseq_abi::{self, CPU_ID_OFFSET, RSEQ_CS_OFFSET};
use crate::sync::AtomicUsize;
use std::arch::asm;

/// Waits until no section can count on `slot` any more (a grace period of
/// its own) and returns its sum; the protocol shares grace periods instead
/// (the grace-period engine).
#[cfg(test)]
fn seal_and_sum(slot: &Slot) -> std::io::Result<u64> {
    rseq_abi::grace_period()?;
    Ok(slot.sum())
}

/// What one run of the section did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Counted,
    /// The bound in the mode word is at or below `cpu_id` (see the module
    /// docs); nothing was written.
    NotCounted,
    /// The kernel restarted the section; nothing was written.
    Aborted,
}

/// Adds `delta` to this CPU's counter of the slot at `base` if the bound in
/// `mode` admits this CPU (the backend's `try_add`). Takes the slot's
/// address rather than `&Slot`, so that no borrow of the ref is
/// live while the add commits (see `Counters::try_add_raw`); arena memory
/// itself is never freed. `base` may be anything when the bound is 0.
#[inline(always)]
pub(crate) fn try_add_at(base: *mut u8, mode: &AtomicUsize, delta: u64) -> bool {
    match section(base, mode, delta) {
        Section::Counted => true,
        Section::NotCounted => false,
        Section::Aborted => retry_after_abort(base, mode, delta),
    }
}

/// After an abort, retry until the section commits or finds the bound
/// below this CPU.
#[cold]
#[inline(never)]
fn retry_after_abort(base: *mut u8, mode: &AtomicUsize, delta: u64) -> bool {
    loop {
        rseq_abi::record_abort();
        match section(base, mode, delta) {
            Section::Counted => return true,
            Section::NotCounted => return false,
            Section::Aborted => {}
        }
    }
}

/// The section's instructions (see [`section`]); `$after_arm` and
/// `$before_commit` are empty but in the delay-injection build.
macro_rules! section_asm {
    ($base:ident, $mode:ident, $delta:ident, $after_arm:literal, $before_commit:literal;
     $($extra:tt)*) => {
        asm!(
            "lea {tmp}, [rip + 3f]",
            "mov qword ptr fs:[{off} + {cs}], {tmp}",
            "4:",
            $after_arm,
            "mov {tmp:e}, dword ptr fs:[{off} + {cpu_id}]",
            "cmp {tmp:e}, dword ptr [{mode}]",
            "jae {not_counted}",
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
            off = in(reg) rseq_abi::rseq_offset(),
            mode = in(reg) $mode.as_ptr(),
            base = in(reg) $base,
            delta = in(reg) $delta,
            tmp = out(reg) _,
            cs = const RSEQ_CS_OFFSET,
            cpu_id = const CPU_ID_OFFSET,
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

/// Runs the critical section once: adds `delta` to the counter of this
/// CPU at `base + (cpu_id << REGION_SHIFT)` if `cpu_id` is below the bound
/// in the low 32 bits of `mode`.
///
/// The bound is either 0 or at most `arena::arena_cpus()` (the regions
/// the slot's chunk has) and at most `i32::MAX`: `Counters::percpu_mode`
/// is the only non-zero value a mode word holds.
#[inline(always)]
fn section(base: *mut u8, mode: &AtomicUsize, delta: u64) -> Section {
    // SAFETY: `rseq_offset` locates this thread's rseq area: glibc's,
    // registered or not, or the stand-in in static TLS (`rseq_abi`), set
    // before any ref existed; the section writes only `rseq_cs` there, as
    // the ABI intends. The descriptor lives in the `__rseq_cs` section,
    // 32-byte aligned, with `abort_ip` outside [start_ip, post_commit) and
    // preceded by glibc's x86 signature 0x53053053. The store that arms the
    // section is the instruction right before `start_ip`, so an interrupt
    // after it lands inside the section. The commit writes the slot's
    // counter for `cpu_id` only when `cpu_id` is below the mode word's
    // bound as unsigned 32-bit numbers (every negative id is above any
    // bound <= i32::MAX), and a non-zero bound is at most the number of
    // regions of the slot's chunk, so the write is inside the chunk
    // whatever the kernel reports; only this CPU's threads write that
    // counter, and the kernel aborts any that is interrupted before the
    // commit. `mode` is read, never written (x86 is little-endian: the
    // dword at its address is the bound). The delay build's spins write
    // only a scratch register and lie inside the section, before the
    // commit, so an abort during them restarts it as any other.
    unsafe {
        #[cfg(not(percpu_ref_delay))]
        section_asm!(base, mode, delta, "", "";);
        // `percpu_ref_delay` (scripts/vm-test): a spin after arming and one
        // between the check and the commit, inside the section, so that
        // the kernel aborts it on most preemptions and grace periods.
        #[cfg(percpu_ref_delay)]
        section_asm!(
            base, mode, delta,
            "mov {spin}, {loops}\n 7:\n sub {spin}, 1\n jae 7b",
            "mov {spin}, {loops}\n 8:\n sub {spin}, 1\n jae 8b";
            spin = out(reg) _,
            loops = in(reg) super::delay::loops(),
        );
    }
    Section::Counted
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
    fn section_once(c: &Slot, mode: &AtomicUsize, delta: u64) -> Section {
        loop {
            let r = section(c.base(), mode, delta);
            if r != Section::Aborted {
                return r;
            }
        }
    }

    /// The arena believes there is one CPU (a container that under-reports
    /// the possible CPUs) and the thread runs on CPU 1. The section must
    /// not count and must write nothing: without the bound (the mode
    /// word's low half) it would add into the region of CPU 1, which such
    /// an arena does not have (memory past the chunk).
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
            let c = Slot::alloc();
            // Bound 1: CPU 1 has no region.
            let bound_1 = AtomicUsize::new(1);
            for _ in 0..10_000 {
                let r = section_once(&c, &bound_1, 1);
                assert_eq!(r, Section::NotCounted, "CPU 1 counted past a 1-CPU bound");
                assert!(!try_add_at(c.base(), &bound_1, 1));
            }
            for cpu in 0..arena::arena_cpus() {
                assert_eq!(c.load(cpu), 0, "region of CPU {cpu} was written");
            }
            // Bound 0 (atomic mode, or another backend): nothing counts.
            let bound_0 = AtomicUsize::new(0);
            assert_eq!(section_once(&c, &bound_0, 1), Section::NotCounted);
            // The mode word of a percpu ref: CPU 1 counts in its region.
            let percpu = AtomicUsize::new(arena::arena_cpus());
            assert_eq!(section_once(&c, &percpu, 5), Section::Counted);
            assert_eq!(c.load(1), 5);
            assert_eq!(c.load(0), 0);
            // Atomic mode: the flag sits above the bound, which is 0.
            let atomic = AtomicUsize::new(super::super::MODE_ATOMIC | super::super::MODE_DEAD);
            assert_eq!(section_once(&c, &atomic, 1), Section::NotCounted);
            // Only the low half is the bound: a flag above it is not one.
            let flags_only = AtomicUsize::new(super::super::MODE_ATOMIC | 1);
            assert_eq!(section_once(&c, &flags_only, 1), Section::NotCounted);
            assert_eq!(seal_and_sum(&c).unwrap(), 5);
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
                let c = Slot::alloc();
                let percpu = AtomicUsize::new(arena::arena_cpus());
                for _ in 0..1000 {
                    assert!(
                        try_add_at(c.base(), &percpu, 1),
                        "the fast path refused to count on CPU {cpu}"
                    );
                }
                let atomic = AtomicUsize::new(super::super::MODE_ATOMIC);
                assert!(
                    !try_add_at(c.base(), &atomic, 1),
                    "counted in atomic mode on CPU {cpu}"
                );
                assert_eq!(seal_and_sum(&c).unwrap(), 1000);
            })
            .join()
            .unwrap();
        }
    }
}
