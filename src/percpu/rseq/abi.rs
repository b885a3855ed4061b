//! The kernel and glibc interfaces the rseq backend stands on: glibc's
//! registered rseq area, and `membarrier` as the grace period.
//!
//! # The rseq area
//!
//! glibc (2.35 and later) registers one `struct rseq` per thread at thread
//! creation and exports where it is: `__rseq_offset` (from the thread
//! pointer, `%fs:0` on `x86_64`, `tpidr_el0` on `aarch64`) and `__rseq_size` (0 when registration
//! failed or was disabled, e.g. `GLIBC_TUNABLES=glibc.pthread.rseq=0`, or
//! under valgrind). A thread may register only one area, so this crate
//! never registers its own: it uses glibc's or none. The symbols are looked
//! up with `dlsym(RTLD_DEFAULT, ..)` at run time rather than linked, so the
//! crate still links against an older glibc or musl, which then get the
//! portable backend.
//!
//! Fields used (the documented ABI, `linux/rseq.h`): `cpu_id` (u32 at 4)
//! and `mm_cid` (u32 at 24), read only, and `rseq_cs` (u64 at 8, written
//! by the fast path). The kernel owns every other field; nothing here
//! writes them.
//!
//! # The index: `mm_cid` where the kernel writes it
//!
//! Linux 6.3 added `mm_cid`, the thread's *concurrency id*: unique among
//! the threads of the process that are running at that moment, and below
//! both the number of CPUs the process may use and its number of threads.
//! The kernel changes it only when the thread is scheduled, so, as with
//! `cpu_id`, a section that read it and was not aborted commits under the
//! id it read, and no other thread can hold that id while it runs. Indexing
//! the arena by it makes a ref's memory grow with the threads that use it
//! at once, not with the CPUs they ever ran on (see `percpu/arena.rs`).
//!
//! It is detected from the auxiliary vector: `AT_RSEQ_FEATURE_SIZE` (also
//! new in 6.3) is the size of the part of `struct rseq` the kernel fills,
//! and a value of at least 28 covers `mm_cid`. That is the kernel's own
//! statement of what it writes, made once at `exec`, rather than a probe
//! of one thread's field (a `mm_cid` of 0 is also what an older kernel
//! leaves there). The kernel writes `mm_cid` into any registered area, as
//! it lies inside the original 32 bytes: glibc 2.36 to 2.39 say
//! `__rseq_size` = 20 but register 32 bytes, and the field is filled there
//! too. Kernels before 6.3 have no feature size (0): the index is then
//! `cpu_id`. `PERCPU_REF_INDEX=cpu_id` forces `cpu_id` for comparison
//! ([`crate::percpu::index`]).
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

use crate::sync::unmodeled::{AtomicBool, AtomicIsize, AtomicU64, AtomicU8, Ordering};

/// Offset of `cpu_id` in `struct rseq`.
pub(crate) const CPU_ID_OFFSET: usize = 4;
/// Offset of `rseq_cs` in `struct rseq`.
pub(crate) const RSEQ_CS_OFFSET: usize = 8;
/// Offset of `mm_cid` in `struct rseq` (Linux 6.3 and later).
pub(crate) const MM_CID_OFFSET: usize = 24;
/// `AT_RSEQ_FEATURE_SIZE`: the auxiliary-vector entry (Linux 6.3+) giving
/// the size of the part of `struct rseq` the kernel fills in.
const AT_RSEQ_FEATURE_SIZE: libc::c_ulong = 27;
/// The feature size that covers `mm_cid` (its offset plus 4).
const MM_CID_FEATURE_SIZE: libc::c_ulong = MM_CID_OFFSET as libc::c_ulong + 4;
/// The smallest `__rseq_size` that covers the original 32-byte ABI's used
/// part (`cpu_id_start`, `cpu_id`, `rseq_cs`, `flags`).
const MIN_RSEQ_SIZE: u32 = 20;

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;

/// Where the fast path finds this thread's rseq area, the id that indexes
/// the arena and the area's `rseq_cs`, as offsets from the thread pointer
/// (see [`rseq_offset`] and [`index_offset`]); 0 until [`available`] ran.
/// One cache line: the section loads `index` and `rseq_cs` (aarch64 in
/// one `ldp`: they are adjacent, in that order).
static OFFSETS: Offsets = Offsets {
    area: AtomicIsize::new(0),
    index: AtomicIsize::new(0),
    rseq_cs: AtomicIsize::new(0),
};

#[repr(C, align(32))]
pub(crate) struct Offsets {
    /// The rseq area's.
    area: AtomicIsize,
    /// The index's: `area + MM_CID_OFFSET` or `area + CPU_ID_OFFSET`.
    index: AtomicIsize,
    /// `area + RSEQ_CS_OFFSET`.
    rseq_cs: AtomicIsize,
}

/// Stores the offsets of an area at `area` whose index field is at
/// `index` within it. Every thread that stores them stores the same values
/// (the process's C library and kernel decide them), before the answer
/// that publishes them.
fn set_offsets(area: isize, index: usize) {
    OFFSETS.area.store(area, Ordering::Relaxed);
    OFFSETS
        .index
        .store(area + index.cast_signed(), Ordering::Relaxed);
    OFFSETS
        .rseq_cs
        .store(area + RSEQ_CS_OFFSET.cast_signed(), Ordering::Relaxed);
}

/// [`OFFSETS`] itself, for a section that loads two of them with one
/// instruction.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn offsets() -> &'static Offsets {
    &OFFSETS
}

/// Set only by the instruction-counting hook: no membarrier, one thread.
static FORCED: AtomicBool = AtomicBool::new(false);
/// Fast-path attempts the kernel aborted (and that were retried).
static ABORTS: AtomicU64 = AtomicU64::new(0);
/// `membarrier` grace periods issued (`crate::percpu::grace_periods`).
static GRACE_PERIODS: AtomicU64 = AtomicU64::new(0);

/// [`available`]'s answer: [`UNKNOWN`] until decided, then [`NO`] or
/// [`YES`]. It publishes [`OFFSETS`], which also say which id indexes the
/// arena ([`by_mm_cid`]): the backend and its index are decided together,
/// once, before any ref exists.
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
#[inline(always)]
pub(crate) fn available() -> bool {
    answer() == YES
}

/// Whether the rseq section indexes the arena by `mm_cid` (else by
/// `cpu_id`); meaningful where [`available`].
#[inline(always)]
pub(crate) fn by_mm_cid() -> bool {
    available() && index_offset() == rseq_offset() + MM_CID_OFFSET.cast_signed()
}

/// [`AVAILABLE`], decided on first use. Inlined: every ref's constructor
/// asks, so the decided case is one load and one branch.
#[inline(always)]
fn answer() -> u8 {
    // ordering-audit: kept: acquires the offset the answer publishes (YES or
    // NO: every backend arms the section). Not built under loom
    // (src/percpu/model.rs models the backend, not its detection);
    // tests/rseq_* run it, on x86, where no order is weaker.
    match AVAILABLE.load(Ordering::Acquire) {
        UNKNOWN => decide(),
        v => v,
    }
}

/// The first [`answer`]: detects, and publishes what it found unless a
/// racing thread published first.
#[cold]
#[inline(never)]
fn decide() -> u8 {
    let (mine, warning) = detect();
    // ordering-audit: kept: the answer publishes the rseq offset that
    // detect stored (Release); a lost race acquires the winner's (Acquire
    // on failure). Not built under loom, as above.
    match AVAILABLE.compare_exchange(UNKNOWN, mine, Ordering::Release, Ordering::Acquire) {
        Ok(_) => {
            // Only the thread whose answer stood says why.
            if let Some(warning) = warning {
                use std::io::Write;
                // Straight to stderr; nothing to do if it fails.
                let _ = writeln!(std::io::stderr(), "{warning}");
            }
            mine
        }
        Err(first) => first,
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
    OFFSETS.area.load(Ordering::Relaxed)
}

/// Where the fast path reads the id that picks its counter: the offset
/// from the thread pointer of this thread's `mm_cid` where the kernel
/// writes it (and `PERCPU_REF_INDEX` does not say `cpu_id`), else of its
/// `cpu_id`. Valid once [`available`] has run, as [`rseq_offset`].
///
/// A second offset rather than one the section adds a constant to: the
/// section arms `rseq_cs` and reads the id relative to registers, and one
/// register with fixed displacements cannot reach both `rseq_cs` and an
/// id whose place is chosen at run time. The load costs one instruction
/// per operation, from the cache line the first load brought in.
#[inline(always)]
pub(crate) fn index_offset() -> isize {
    OFFSETS.index.load(Ordering::Relaxed)
}

/// Where `cpu_id` is, as an offset from the thread pointer (the aarch64
/// mutants that mix up the ids read it).
#[cfg(all(
    target_arch = "aarch64",
    any(
        percpu_ref_mutant = "rseq_bound_by_cpu_id",
        percpu_ref_mutant = "rseq_add_by_cpu_id"
    )
))]
#[inline(always)]
pub(crate) fn cpu_id_offset() -> isize {
    rseq_offset() + CPU_ID_OFFSET.cast_signed()
}

/// The answer for this process (the index chosen is in [`OFFSETS`]), and a
/// warning about `PERCPU_REF_INDEX` where its value was not honoured.
fn detect() -> (u8, Option<String>) {
    let area = glibc_rseq_area();
    // The same values in every racing thread (the process's glibc and
    // kernel decide them), stored before the answer that publishes them.
    // Until the index is chosen it is `cpu_id`, inside the area: where the
    // answer is NO every bound is 0 and the id is read, never used.
    let offset = area.map_or_else(stand_in_offset, |(offset, _)| offset);
    set_offsets(offset, CPU_ID_OFFSET);
    let Some((offset, size)) = area else {
        return (NO, None);
    };
    if size < MIN_RSEQ_SIZE
        || current_cpu_id(offset) < 0
        || !commit_instruction_available()
        || !membarrier_register()
    {
        return (NO, None);
    }
    // SAFETY: getauxval has no preconditions; it returns 0 for an entry
    // the kernel did not pass.
    let feature_size = unsafe { libc::getauxval(AT_RSEQ_FEATURE_SIZE) };
    let (by_mm_cid, warning) = choose_index(feature_size >= MM_CID_FEATURE_SIZE, feature_size);
    if by_mm_cid {
        set_offsets(offset, MM_CID_OFFSET);
    }
    (YES, warning)
}

/// Whether this CPU has the section's one-instruction commit: always on
/// `x86_64` (`add` to memory); on `aarch64` the LSE atomics (ARMv8.1,
/// `HWCAP_ATOMICS`), whose `stadd` no preemption can split (see
/// `rseq/aarch64.rs`). Without them the process takes the sharded backend.
fn commit_instruction_available() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("lse");
    #[cfg(not(target_arch = "aarch64"))]
    true
}

/// The environment variable that forces the rseq section's index.
pub(crate) const INDEX_VAR: &str = "PERCPU_REF_INDEX";

/// Whether to index by `mm_cid`, given whether the kernel provides it, and
/// the warning to print if [`INDEX_VAR`] asked for what cannot be had or
/// for nothing known.
#[allow(
    clippy::unnecessary_debug_formatting,
    reason = "the value is quoted and escaped on purpose: a stray space or a non-UTF-8 byte shows"
)]
fn choose_index(mm_cid: bool, feature_size: libc::c_ulong) -> (bool, Option<String>) {
    let wanted = std::env::var_os(INDEX_VAR).unwrap_or_default();
    match wanted.to_str() {
        Some("") => (mm_cid, None),
        Some("cpu_id") => (false, None),
        Some("mm_cid") if mm_cid => (true, None),
        Some("mm_cid") => (
            false,
            Some(format!(
                "percpu_ref: warning: {INDEX_VAR}=mm_cid, but this kernel does not provide                  mm_cid (AT_RSEQ_FEATURE_SIZE is {feature_size}, it needs at least                  {MM_CID_FEATURE_SIZE}: Linux 6.3 or later); using cpu_id"
            )),
        ),
        _ => {
            let default = if mm_cid { "mm_cid" } else { "cpu_id" };
            (
                mm_cid,
                Some(format!(
                    "percpu_ref: warning: ignoring {INDEX_VAR}={wanted:?}: valid values are                      `cpu_id` and `mm_cid`; using the default, {default}"
                )),
            )
        }
    }
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
    ".pushsection .tbss.percpu_ref_stand_in_rseq_area,\"awT\",%nobits",
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
        ", %tls_object"
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
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            concat!("mov {}, qword ptr [rip + percpu_ref_stand_in_rseq_area_", env!("CARGO_PKG_VERSION"), "@GOTTPOFF]"),
            out(reg) offset,
            options(nostack, readonly, preserves_flags),
        );
    }
    // SAFETY: as above (the initial-exec sequence of the aarch64 TLS ABI).
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!(
            concat!("adrp {0}, :gottprel:percpu_ref_stand_in_rseq_area_", env!("CARGO_PKG_VERSION")),
            concat!("ldr {0}, [{0}, :gottprel_lo12:percpu_ref_stand_in_rseq_area_", env!("CARGO_PKG_VERSION"), "]"),
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
#[cfg(target_arch = "x86_64")]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the TCB self-pointer, which glibc sets for every thread.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    tp
}

/// The thread pointer (`tpidr_el0`). `pure` and `nomem`: a register that
/// only the thread's own C library sets, once, so the compiler may read it
/// once per function and keep it out of loops.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads a system register that user space may read; touches
    // no memory.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(pure, nomem, nostack, preserves_flags));
    }
    tp
}

/// This thread's `rseq->cpu_id` (negative when not registered).
fn current_cpu_id(offset: isize) -> i32 {
    read_at(offset + CPU_ID_OFFSET.cast_signed())
}

/// The id that indexes the arena for the calling thread at this moment
/// (its `mm_cid` or `cpu_id`, see [`by_mm_cid`]); `None` where the rseq
/// backend is not available. It may change as soon as it is read.
pub(crate) fn current_index() -> Option<u32> {
    if !available() {
        return None;
    }
    Some(read_at(index_offset()).cast_unsigned())
}

/// The `u32` field of this thread's rseq area at `offset` from the thread
/// pointer.
fn read_at(offset: isize) -> i32 {
    let p = thread_pointer().wrapping_add_signed(offset);
    // SAFETY: glibc reserves the rseq area in every thread's TCB, at
    // `__rseq_offset` from the thread pointer, whether or not registration
    // succeeded; `cpu_id` and `mm_cid` are aligned u32s that only the
    // kernel writes, so a volatile read is the right access.
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
    set_offsets(offset, MM_CID_OFFSET);
    FORCED.store(true, Ordering::Relaxed);
    assert!(
        // ordering-audit: kept: publishes the offset (Release); instruction
        // counting only, never under loom. The fake area's `mm_cid` is 0:
        // the index of every kernel since 6.3 (the same instructions as
        // `cpu_id`, only the offset differs).
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
        // x86_64 uses TLS variant II: static TLS blocks lie below the TCB;
        // aarch64 variant I: above the TCB's 16 bytes.
        #[cfg(target_arch = "x86_64")]
        assert!(offset < 0, "stand-in offset {offset} is not in static TLS");
        #[cfg(target_arch = "aarch64")]
        assert!(
            offset >= 16,
            "stand-in offset {offset} is not in static TLS"
        );
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
