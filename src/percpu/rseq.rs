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
//! Ten instructions per operation, with the loads of the offsets and of
//! the slot address, plus the caller's loop: 22 per get + put pair on
//! both architectures (`scripts/callgrind-pair` counts the `x86_64` pair by
//! running it, `scripts/aarch64-pair` the aarch64 one in the disassembly).
//! The kernel guarantees that a thread interrupted before the commit never
//! commits (it restarts at `abort`), so the add needs no atomicity against
//! other CPUs: only the running thread holding this id writes its counter.
//!
//! The instructions are per architecture, each in a module of its own:
//!
//! - `x86_64` (`rseq/x86_64.rs`): a plain `add` to memory commits, no
//!   atomic read-modify-write; `%fs` reaches the rseq area.
//! - `aarch64` (`rseq/aarch64.rs`): an LSE `stadd` commits, one instruction
//!   that no preemption can split, including one that a kernel fails to
//!   abort; CPUs without LSE take the sharded backend. Why, and its memory
//!   ordering, are that module's docs.
//!
//! # Which id
//!
//! `mm_cid` where the kernel writes it (Linux 6.3+), else `cpu_id`; decided
//! once per process before any ref exists (`rseq/abi.rs`, "The index"). Both
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
//! thread-local storage (`abi::rseq_offset`). No kernel reads either,
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
//! [`grace_period`](super::abi::grace_period) (`membarrier` with the
//! RSEQ flag). A section that loaded the old bound is then either
//! committed, and its add visible to the switcher's sum, or aborted and
//! retried, in which case it loads the new one and is not counted. After
//! the grace period nothing writes the slot until the mode goes back to
//! percpu, which first zeroes it (`Counters::reset`) and then
//! stores the bound with a release store, so a section that sees the
//! bound sees the zeroes: on x86 every load is an acquire load; on aarch64
//! the commit depends on the bound through the section's branch (see
//! `rseq/aarch64.rs`).

#[cfg(any(test, doc))]
use super::arena;
#[cfg(test)]
use super::arena::Slot;
use crate::sync::AtomicUsize;

#[cfg(target_arch = "aarch64")]
mod aarch64;
pub(super) mod abi;
#[cfg(target_arch = "aarch64")]
use aarch64::section;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
use x86_64::section;

/// Waits until no section can count on `slot` any more (a grace period of
/// its own) and returns its sum; the protocol shares grace periods instead
/// (the grace-period engine).
#[cfg(test)]
fn seal_and_sum(slot: &Slot) -> std::io::Result<u64> {
    abi::grace_period()?;
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

/// Adds `delta` to this CPU's counter of a ref's slot if the bound in its
/// mode word admits this CPU (the backend's `try_add`).
///
/// `mode` points to the mode word, and the word after it is the slot's
/// base ([`Words`]: a ref's `mode` and `counters`). Through a pointer, so
/// that no borrow of the ref is live while the add commits (see
/// `Counters::try_add_raw`); arena memory itself is never freed. The base
/// may be anything when the bound is 0.
///
/// # Safety
///
/// `mode` and the base after it are live and may be read through `mode`
/// until the add commits.
#[inline(always)]
pub(crate) unsafe fn try_add_at(mode: *const AtomicUsize, delta: u64) -> bool {
    // SAFETY: the caller's contract, as the section's.
    match unsafe { section(mode, delta) } {
        Section::Counted => true,
        Section::NotCounted => false,
        // SAFETY: as above.
        Section::Aborted => unsafe { retry_after_abort(mode, delta) },
    }
}

/// After an abort, retry until the section commits or finds the bound
/// below this CPU.
///
/// # Safety
///
/// As [`try_add_at`].
#[cold]
#[inline(never)]
unsafe fn retry_after_abort(mode: *const AtomicUsize, delta: u64) -> bool {
    loop {
        abi::record_abort();
        // SAFETY: the caller's contract.
        match unsafe { section(mode, delta) } {
            Section::Counted => return true,
            Section::NotCounted => return false,
            Section::Aborted => {}
        }
    }
}

/// The two words the section reads, in the order it reads them: a ref's
/// mode word and its slot's base. `PercpuRef` starts with them (its `mode`
/// and `counters`, `#[repr(C)]`); the tests build them alone.
#[cfg(any(test, doc))]
#[repr(C)]
struct Words {
    mode: AtomicUsize,
    base: *mut u8,
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

    impl Words {
        /// A mode word holding `mode`, and `slot`'s base.
        fn new(mode: usize, slot: &Slot) -> Self {
            Words {
                mode: AtomicUsize::new(mode),
                base: slot.base(),
            }
        }

        /// Runs the section until the kernel does not abort it.
        fn section_once(&self, delta: u64) -> Section {
            loop {
                // SAFETY: both words are `self`'s, live for the call.
                let r = unsafe { section(&raw const self.mode, delta) };
                if r != Section::Aborted {
                    return r;
                }
            }
        }

        /// [`try_add_at`] on these words.
        fn try_add(&self, delta: u64) -> bool {
            // SAFETY: as above.
            unsafe { try_add_at(&raw const self.mode, delta) }
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
        if !abi::available() {
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
                let id = abi::current_index().unwrap() as usize;
                let at_result = Words::new(id, &c).section_once(1);
                let above_result = Words::new(id + 1, &c).section_once(5);
                if abi::current_index() != Some(id as u32) {
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
            assert_flags_count_nothing(&c);
        })
        .join()
        .unwrap();
    }

    /// A bound of 0 (atomic mode, or another backend) or flags above the
    /// bound: the section counts nothing, anywhere.
    fn assert_flags_count_nothing(c: &Slot) {
        let before = c.sum();
        // Bound 0 (atomic mode, or another backend): nothing counts.
        let bound_0 = Words::new(0, c);
        assert_eq!(bound_0.section_once(1), Section::NotCounted);
        // Atomic mode: the flag sits above the bound, which is 0.
        let atomic = Words::new(super::super::MODE_ATOMIC | super::super::MODE_DEAD, c);
        assert_eq!(atomic.section_once(1), Section::NotCounted);
        // Only the low half is the bound: a flag above it is not one.
        let flags_only = Words::new(super::super::MODE_ATOMIC | 1, c);
        if abi::current_index() != Some(0) {
            assert_eq!(flags_only.section_once(1), Section::NotCounted);
        }
        assert!(!bound_0.try_add(1));
        assert_eq!(seal_and_sum(c).unwrap(), before);
    }

    /// The index in use is the kernel's `mm_cid` where the auxiliary
    /// vector says it is written, unless forced to `cpu_id`; the id read
    /// then is below the CPUs this process may use (`mm_cid`) or is the
    /// CPU the thread runs on (`cpu_id`).
    #[test]
    fn the_index_is_the_one_detected() {
        if !abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        // SAFETY: getauxval has no preconditions.
        let feature_size = unsafe { libc::getauxval(27) };
        let forced_cpu_id = std::env::var("PERCPU_REF_INDEX").as_deref() == Ok("cpu_id");
        assert_eq!(abi::by_mm_cid(), feature_size >= 28 && !forced_cpu_id);
        let cpus = allowed_cpus();
        std::thread::spawn(move || {
            pin_to(*cpus.last().unwrap());
            let id = abi::current_index().unwrap() as usize;
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() } as usize;
            if abi::by_mm_cid() {
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
        if !abi::available() {
            eprintln!("skipped: rseq not available");
            return;
        }
        let cpus = std::thread::spawn(allowed_cpus).join().unwrap();
        for cpu in cpus {
            std::thread::spawn(move || {
                pin_to(cpu);
                let c = Slot::alloc();
                let percpu = Words::new(arena::arena_cpus(), &c);
                for _ in 0..1000 {
                    assert!(
                        percpu.try_add(1),
                        "the fast path refused to count on CPU {cpu}"
                    );
                }
                let atomic = Words::new(super::super::MODE_ATOMIC, &c);
                assert!(!atomic.try_add(1), "counted in atomic mode on CPU {cpu}");
                assert_eq!(seal_and_sum(&c).unwrap(), 1000);
            })
            .join()
            .unwrap();
        }
    }
}
