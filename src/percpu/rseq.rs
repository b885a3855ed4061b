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
//!     id = rseq->mm_cid (or rseq->cpu_id)
//!     if id >= (u32)*mode_word goto not_counted    // unsigned
//!     *(base + (id << REGION_SHIFT)) += delta     // the commit: one instruction
//! end:                                        // post-commit: counted
//! ...
//! abort:                                      // preceded by the 4-byte signature
//!     goto aborted                            // the Rust side retries
//! ```
//!
//! Ten instructions per operation, with the loads of the rseq offset, of
//! the id's offset and of the slot address (`scripts/callgrind-pair`
//! counts them), and no atomic read-modify-write: the add is a plain `add`
//! to memory that only the running thread holding this id touches, and
//! the kernel guarantees that a thread interrupted before the commit never
//! commits (it restarts at `abort`).
//!
//! # Which id
//!
//! `mm_cid` where the kernel writes it (Linux 6.3+), else `cpu_id`; decided
//! once per process before any ref exists (`rseq_abi`, "The index"). Both
//! are exact for the same reason: one running thread holds an id at a
//! time, and the kernel changes a thread's id only when it schedules it,
//! which aborts a section in flight. `mm_cid` is below the number of the
//! process's threads running at once, so a ref's pages are touched only in
//! that many regions, where `cpu_id` touches one per CPU its users ever ran
//! on. `not_counted` and `aborted` are Rust labels (`asm!` goto), so
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
//! - an id at or above the arena's region count: the possible-CPU count
//!   the arena was sized with is trusted for speed, never for memory
//!   safety (a container can under-report it, and a thread on a CPU above
//!   it, or holding an `mm_cid` above it, would otherwise add past the end
//!   of its chunk);
//! - under `cpu_id` indexing, a thread whose rseq registration failed
//!   (`cpu_id` is -1 or -2, above any bound <= `i32::MAX` as unsigned;
//!   under `mm_cid` no such thread runs: see [`section`]);
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
#[cfg(any(
    percpu_ref_mutant = "rseq_bound_by_cpu_id",
    percpu_ref_mutant = "rseq_add_by_cpu_id"
))]
use super::rseq_abi::CPU_ID_OFFSET;
use super::rseq_abi::{self, RSEQ_CS_OFFSET};
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
            off = in(reg) rseq_abi::rseq_offset(),
            mode = in(reg) $mode.as_ptr(),
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
            loops = in(reg) super::delay::loops(),
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
/// thread's id (its `mm_cid` or `cpu_id`: [`rseq_abi::index_offset`]) at
/// `base + (id << REGION_SHIFT)` if the id is below the bound in the low
/// 32 bits of `mode`.
///
/// The bound is either 0 or at most `arena::arena_cpus()` (the regions
/// the slot's chunk has) and at most `i32::MAX`: `Counters::percpu_mode`
/// is the only non-zero value a mode word holds.
#[inline(always)]
fn section(base: *mut u8, mode: &AtomicUsize, delta: u64) -> Section {
    // SAFETY: `rseq_offset` locates this thread's rseq area: glibc's,
    // registered or not, or the stand-in in static TLS (`rseq_abi`), set
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
        ]; index = in(reg) rseq_abi::index_offset(),);
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
        ]; index = in(reg) rseq_abi::index_offset(), cpu_id = const CPU_ID_OFFSET,);
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
        ]; index = in(reg) rseq_abi::index_offset(), cpu_id = const CPU_ID_OFFSET,);
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

    /// The section counts at the thread's id (under the process's index)
    /// exactly when the id is below the bound: at the id's own region for
    /// a bound of `id + 1`, nowhere for a bound of `id` (the arena of a
    /// container that under-reports the possible CPUs, or more threads
    /// running than it has regions: without the check the add would land
    /// past the chunk), nor for a bound of 0 or a flag above the bound.
    #[test]
    fn id_at_or_above_the_bound_is_not_counted_and_writes_nothing() {
        if !rseq_abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        if !allowed_cpus().contains(&1) || arena::arena_cpus() < 2 {
            eprintln!("skipped: CPU 1 is not available to this process");
            return;
        }
        std::thread::spawn(|| {
            // Pinned, so that `cpu_id` is 1 and no migration changes it; a
            // thread alone on its CPU also keeps its `mm_cid`.
            pin_to(1);
            let c = Slot::alloc();
            let mut expected = vec![0u64; arena::arena_cpus()];
            let mut checked = 0;
            for _ in 0..10_000 {
                let id = rseq_abi::current_index().unwrap() as usize;
                let at = AtomicUsize::new(id);
                let above = AtomicUsize::new(id + 1);
                let at_result = section_once(&c, &at, 1);
                let above_result = section_once(&c, &above, 5);
                if rseq_abi::current_index() != Some(id as u32) {
                    // The id changed in between: the results say nothing.
                    expected = (0..arena::arena_cpus()).map(|i| c.load(i)).collect();
                    continue;
                }
                assert_eq!(
                    at_result,
                    Section::NotCounted,
                    "id {id} counted under a bound of {id}"
                );
                assert_eq!(
                    above_result,
                    Section::Counted,
                    "id {id} not counted under {}",
                    id + 1
                );
                expected[id] += 5;
                for (i, &e) in expected.iter().enumerate() {
                    assert_eq!(
                        c.load(i),
                        e,
                        "region {i} (id {id}) holds what was not added there"
                    );
                }
                checked += 1;
            }
            assert!(
                checked > 5_000,
                "the id kept changing: {checked} of 10,000 checked"
            );
            let before = c.sum();
            // Bound 0 (atomic mode, or another backend): nothing counts.
            let bound_0 = AtomicUsize::new(0);
            assert_eq!(section_once(&c, &bound_0, 1), Section::NotCounted);
            // Atomic mode: the flag sits above the bound, which is 0.
            let atomic = AtomicUsize::new(super::super::MODE_ATOMIC | super::super::MODE_DEAD);
            assert_eq!(section_once(&c, &atomic, 1), Section::NotCounted);
            // Only the low half is the bound: a flag above it is not one.
            let flags_only = AtomicUsize::new(super::super::MODE_ATOMIC | 1);
            if rseq_abi::current_index() != Some(0) {
                assert_eq!(section_once(&c, &flags_only, 1), Section::NotCounted);
            }
            assert!(!try_add_at(c.base(), &bound_0, 1));
            assert_eq!(seal_and_sum(&c).unwrap(), before);
        })
        .join()
        .unwrap();
    }

    /// The index in use is the kernel's `mm_cid` where the auxiliary
    /// vector says it is written, unless forced to `cpu_id`; the id read
    /// then is below the CPUs this process may use (`mm_cid`) or is the
    /// CPU the thread runs on (`cpu_id`).
    #[test]
    fn the_index_is_the_one_detected() {
        if !rseq_abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        // SAFETY: getauxval has no preconditions.
        let feature_size = unsafe { libc::getauxval(27) };
        let forced_cpu_id = std::env::var("PERCPU_REF_INDEX").as_deref() == Ok("cpu_id");
        assert_eq!(rseq_abi::by_mm_cid(), feature_size >= 28 && !forced_cpu_id);
        let cpus = allowed_cpus();
        std::thread::spawn(move || {
            pin_to(*cpus.last().unwrap());
            let id = rseq_abi::current_index().unwrap() as usize;
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() } as usize;
            if rseq_abi::by_mm_cid() {
                assert!(
                    id < cpus.len(),
                    "mm_cid {id} not below the {} CPUs allowed",
                    cpus.len()
                );
            } else {
                assert_eq!(id, cpu, "cpu_id is not the CPU");
            }
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
        let cpus = std::thread::spawn(allowed_cpus).join().unwrap();
        for cpu in cpus {
            std::thread::spawn(move || {
                pin_to(cpu);
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
