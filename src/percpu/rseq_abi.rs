//! The kernel and glibc interfaces the rseq backend stands on: glibc's
//! registered rseq area, and `membarrier` as the grace period.
//!
//! # The rseq area
//!
//! glibc (2.35 and later) registers one `struct rseq` per thread at thread
//! creation and exports where it is: `__rseq_offset` (from the thread
//! pointer, `%fs:0` on `x86_64`) and `__rseq_size` (0 when registration
//! failed or was disabled, e.g. `GLIBC_TUNABLES=glibc.pthread.rseq=0`, or
//! under valgrind). A thread may register only one area, so this crate
//! never registers its own: it uses glibc's or none. The symbols are looked
//! up with `dlsym(RTLD_DEFAULT, ..)` at run time rather than linked, so the
//! crate still links against an older glibc or musl, which then get the
//! portable backend.
//!
//! Fields used (the documented ABI, `linux/rseq.h`): `cpu_id` (u32 at 4,
//! read only) and `rseq_cs` (u64 at 8, written by the fast path). The
//! kernel owns every other field; nothing here writes them.
//!
//! Requirement: every thread that uses a ref comes from the C library
//! (`pthread_create`) or Rust's `std::thread`, so that glibc registered its
//! own area (or none: then `cpu_id` is negative and the thread takes the
//! atomic path). A thread made with a raw `clone` system call shares its
//! creator's area or has an unregistered copy with a stale `cpu_id`: the
//! kernel never aborts its critical sections, so it could commit a per-CPU
//! add on a CPU it no longer runs on, or after a grace period. This cannot
//! be detected cheaply; it is documented instead.
//!
//! # The grace period
//!
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)` interrupts every CPU
//! that runs a thread of this process, restarting any rseq critical section
//! there, and is a full memory barrier on each. After it returns, every
//! per-CPU add either committed and is visible to the caller, or will
//! restart and read the new mode. Threads that are not running are covered
//! too: they restart when next scheduled, and a context switch is a full
//! barrier. The process registers its intent once (the kernel refuses the
//! command with `EPERM` otherwise). The registration belongs to the address
//! space; a forked child inherits it (checked on Linux 6.18 and by
//! `tests/rseq_fork.rs`), and should a kernel refuse the command in a child
//! anyway, [`grace_period`] registers again and retries.
//!
//! # Detection
//!
//! [`available`] decides once per process: glibc's area is registered
//! (`__rseq_size` >= 20 and this thread's `cpu_id` valid), and the kernel
//! accepts the membarrier registration. Otherwise the whole process uses
//! the sharded backend.

use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicU8, Ordering};

/// Offset of `cpu_id` in `struct rseq`.
pub(crate) const CPU_ID_OFFSET: usize = 4;
/// Offset of `rseq_cs` in `struct rseq`.
pub(crate) const RSEQ_CS_OFFSET: usize = 8;
/// The smallest `__rseq_size` that covers the original 32-byte ABI's used
/// part (`cpu_id_start`, `cpu_id`, `rseq_cs`, `flags`).
const MIN_RSEQ_SIZE: u32 = 20;

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;

/// Where the fast path finds this thread's rseq area, as an offset from
/// the thread pointer (see [`rseq_offset`]); 0 until [`available`] ran.
static RSEQ_OFFSET: AtomicIsize = AtomicIsize::new(0);
/// Set only by the instruction-counting hook: no membarrier, one thread.
static FORCED: AtomicBool = AtomicBool::new(false);
/// Fast-path attempts the kernel aborted (and that were retried).
static ABORTS: AtomicU64 = AtomicU64::new(0);
/// `membarrier` grace periods issued (`crate::percpu::grace_periods`).
static GRACE_PERIODS: AtomicU64 = AtomicU64::new(0);

/// [`available`]'s answer: [`UNKNOWN`] until decided, then [`NO`] or [`YES`].
static AVAILABLE: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const NO: u8 = 1;
const YES: u8 = 2;

/// Whether the rseq backend can run in this process (decided once).
///
/// Not a `OnceLock`: a fork while another thread runs the detection would
/// leave the child waiting for it forever. Threads that race here each
/// detect (idempotent: lookups, and a membarrier registration the kernel
/// accepts again) and the first answer stored is everyone's.
pub(crate) fn available() -> bool {
    // ordering-audit: kept: acquires the offset the answer publishes (YES or
    // NO: every backend arms the section). Not built under loom
    // (src/percpu/model.rs models the backend, not its detection);
    // tests/rseq_* run it, on x86, where no order is weaker.
    match AVAILABLE.load(Ordering::Acquire) {
        UNKNOWN => {
            let mine = if detect() { YES } else { NO };
            // ordering-audit: kept: the answer publishes the rseq offset
            // that detect stored (Release); a lost race acquires the
            // winner's (Acquire on failure). Not built under loom, as above.
            match AVAILABLE.compare_exchange(UNKNOWN, mine, Ordering::Release, Ordering::Acquire) {
                Ok(_) => mine == YES,
                Err(first) => first == YES,
            }
        }
        v => v == YES,
    }
}

/// Where the fast path arms its section: glibc's `__rseq_offset` when
/// glibc exports it (registered or not: glibc reserves the area in every
/// thread), else the offset of [`STAND_IN`]. Valid in every process once
/// [`available`] has run, which every ref's constructor calls first: refs
/// on the sharded backend run the section too (their bound of 0 makes it
/// count nothing), so an area to arm must exist even where rseq does not.
#[inline(always)]
pub(crate) fn rseq_offset() -> isize {
    RSEQ_OFFSET.load(Ordering::Relaxed)
}

fn detect() -> bool {
    let area = glibc_rseq_area();
    // The same value in every racing thread (the process's glibc decides
    // it), stored before the answer that publishes it.
    RSEQ_OFFSET.store(
        area.map_or_else(stand_in_offset, |(offset, _)| offset),
        Ordering::Relaxed,
    );
    let Some((offset, size)) = area else {
        return false;
    };
    if size < MIN_RSEQ_SIZE || current_cpu_id(offset) < 0 {
        return false;
    }
    membarrier_register()
}

// The stand-in rseq area: 32 zeroed bytes in every thread's static TLS
// block, for processes whose C library reserves none (musl, glibc before
// 2.35). No kernel knows it, so the only effect of arming a section there
// is the store itself, and a `cpu_id` of 0 never passes a bound of 0,
// the only bound a mode word holds in such a process. The initial-exec
// model (`@GOTTPOFF`) makes its offset from the thread pointer the same
// in every thread: a library loaded with `dlopen` gets it from the static
// TLS surplus, or fails to load, but is never handed an area at a
// different offset. The symbol is hidden and carries the crate version,
// so that two copies of the crate in one program do not clash.
std::arch::global_asm!(
    ".pushsection .tbss.percpu_ref_stand_in_rseq_area,\"awT\",@nobits",
    ".balign 32",
    concat!(
        ".globl percpu_ref_stand_in_rseq_area_",
        env!("CARGO_PKG_VERSION")
    ),
    concat!(
        ".hidden percpu_ref_stand_in_rseq_area_",
        env!("CARGO_PKG_VERSION")
    ),
    concat!(
        ".type percpu_ref_stand_in_rseq_area_",
        env!("CARGO_PKG_VERSION"),
        ", @tls_object"
    ),
    concat!(
        ".size percpu_ref_stand_in_rseq_area_",
        env!("CARGO_PKG_VERSION"),
        ", 32"
    ),
    concat!(
        "percpu_ref_stand_in_rseq_area_",
        env!("CARGO_PKG_VERSION"),
        ":"
    ),
    ".zero 32",
    ".popsection",
);

/// The offset of the stand-in area from the thread pointer.
fn stand_in_offset() -> isize {
    let offset: isize;
    // SAFETY: loads the linker-provided TLS offset of the area defined
    // above from the GOT; reads nothing else.
    unsafe {
        std::arch::asm!(
            concat!("mov {}, qword ptr [rip + percpu_ref_stand_in_rseq_area_", env!("CARGO_PKG_VERSION"), "@GOTTPOFF]"),
            out(reg) offset,
            options(nostack, readonly, preserves_flags),
        );
    }
    offset
}

/// `(__rseq_offset, __rseq_size)`, when this glibc exports them.
///
/// The hidden variable `PERCPU_REF_TEST_NO_LIBC_RSEQ_AREA` (tests only)
/// makes it answer as musl or a glibc before 2.35 would, so that the
/// stand-in area is tested on this machine.
fn glibc_rseq_area() -> Option<(isize, u32)> {
    if std::env::var_os("PERCPU_REF_TEST_NO_LIBC_RSEQ_AREA").is_some() {
        return None;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only looks
    // symbols up; it returns null when they are absent.
    let (off, size) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
        )
    };
    if off.is_null() || size.is_null() {
        return None;
    }
    // SAFETY: glibc defines `__rseq_offset` as a `const ptrdiff_t` and
    // `__rseq_size` as a `const unsigned int`, initialised before any user
    // code runs and never written afterwards.
    unsafe { Some((*(off as *const isize), *(size as *const u32))) }
}

/// The thread pointer (`%fs:0`, which the `x86_64` TLS ABI makes point to
/// itself).
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the TCB self-pointer, which glibc sets for every thread.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    tp
}

/// This thread's `rseq->cpu_id` (negative when not registered).
fn current_cpu_id(offset: isize) -> i32 {
    let p = thread_pointer().wrapping_add_signed(offset) + CPU_ID_OFFSET;
    // SAFETY: glibc reserves the rseq area in every thread's TCB, at
    // `__rseq_offset` from the thread pointer, whether or not registration
    // succeeded; `cpu_id` is an aligned u32 that only the kernel writes, so
    // a volatile read is the right access.
    unsafe { std::ptr::read_volatile(p as *const i32) }
}

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches no
    // user memory.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

fn membarrier_register() -> bool {
    let supported = membarrier(MEMBARRIER_CMD_QUERY);
    let needed =
        MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ;
    supported >= 0
        && supported & libc::c_long::from(needed) == libc::c_long::from(needed)
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ) == 0
}

/// The grace period: on return, every fast-path add on any thread of this
/// process either committed (and is visible here) or will restart.
///
/// # Errors
///
/// The kernel's error when it refuses the command even after registering
/// again (a seccomp filter that blocks `membarrier` on this thread, say).
/// Nothing was waited for then: the caller must not sum.
pub(crate) fn grace_period() -> std::io::Result<()> {
    if FORCED.load(Ordering::Relaxed) {
        // One thread and no kernel rseq: nothing can be in flight.
        return Ok(());
    }
    GRACE_PERIODS.fetch_add(1, Ordering::Relaxed);
    // mutant rseq_no_grace_period: no membarrier; a section in flight may
    // commit after the sum (scripts/vm-test's delay build catches it).
    if mutated!("rseq_no_grace_period") {
        return Ok(());
    }
    if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) == 0 {
        return Ok(());
    }
    // EPERM: this address space is not registered (a kernel that does not
    // carry the registration over fork): register it and try again.
    let first = std::io::Error::last_os_error();
    if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ) == 0
        && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) == 0
    {
        return Ok(());
    }
    Err(first)
}

/// Records one aborted fast-path attempt (it is retried).
#[cold]
pub(crate) fn record_abort() {
    ABORTS.fetch_add(1, Ordering::Relaxed);
}

/// The count behind [`crate::percpu::grace_periods`].
pub(crate) fn grace_periods() -> u64 {
    GRACE_PERIODS.load(Ordering::Relaxed)
}

/// The count behind [`crate::percpu::rseq_aborts`].
pub(crate) fn aborts() -> u64 {
    ABORTS.load(Ordering::Relaxed)
}

/// Makes the rseq backend run on a fake, never-registered area whose
/// `cpu_id` is 0, so that valgrind (which disables rseq) executes exactly
/// the fast path's instructions. Built only with
/// `--cfg percpu_ref_callgrind`, for `scripts/callgrind-pair`.
///
/// # Safety
///
/// Must be called before anything chose a backend, and afterwards only the
/// calling thread may use per-CPU refs, and no ref may switch modes while
/// another thread could use it: nothing restarts a section any more.
#[cfg(percpu_ref_callgrind)]
#[doc(hidden)]
pub unsafe fn force_fake_area_for_instruction_counting() {
    let area: &'static mut [u64; 4] = Box::leak(Box::new([0u64; 4]));
    let offset = (area.as_mut_ptr() as usize).wrapping_sub(thread_pointer()) as isize;
    RSEQ_OFFSET.store(offset, Ordering::Relaxed);
    FORCED.store(true, Ordering::Relaxed);
    assert!(
        // ordering-audit: kept: publishes the offset (Release); instruction
        // counting only, never under loom.
        AVAILABLE
            .compare_exchange(UNKNOWN, YES, Ordering::Release, Ordering::Relaxed)
            .is_ok(),
        "force_fake_area_for_instruction_counting: the backend was already chosen"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's stand-in area.
    fn stand_in_area() -> *mut u64 {
        thread_pointer().wrapping_add_signed(stand_in_offset()) as *mut u64
    }

    /// The stand-in area is 32 zeroed, aligned bytes of static TLS, one per
    /// thread at the same offset: an offset that pointed anywhere else
    /// (such as 0, the TCB itself) would have the sections of a process
    /// without an rseq area write into memory that is not theirs.
    #[test]
    fn stand_in_area_is_this_threads_own_static_tls() {
        let offset = stand_in_offset();
        // x86_64 uses TLS variant II: static TLS blocks lie below the TCB.
        assert!(offset < 0, "stand-in offset {offset} is not in static TLS");
        let mine = stand_in_area();
        assert_eq!(mine as usize % 32, 0, "stand-in area misaligned");
        // SAFETY: the area is this thread's 32 bytes of TLS, 8-aligned;
        // nothing else in this test process touches it.
        unsafe {
            assert_eq!(std::slice::from_raw_parts(mine, 4), &[0; 4]);
            mine.add(1).write_volatile(0x5eed);
        }
        let (theirs, seen) = std::thread::spawn(move || {
            assert_eq!(stand_in_offset(), offset, "the offset is per process");
            let area = stand_in_area();
            // SAFETY: as above, for the new thread's own area.
            (area as usize, unsafe { area.add(1).read_volatile() })
        })
        .join()
        .unwrap();
        assert_ne!(theirs, mine as usize, "two threads share one area");
        assert_eq!(seen, 0, "a new thread's area is not zeroed");
        // SAFETY: as above.
        assert_eq!(unsafe { mine.add(1).read_volatile() }, 0x5eed);
        // SAFETY: as above; the area goes back to its initial state.
        unsafe { mine.add(1).write_volatile(0) };
    }
}
