//! The per-CPU arena: where every ref's counters live, on both backends.
//!
//! The kernel's percpu allocator layout: memory comes in *chunks*, each
//! chunk is one *region* of [`REGION`] bytes per possible CPU, and a ref owns
//! one 8-byte *slot* at the same offset in every region. Its counter on CPU
//! `c` (the rseq backend), or its shard `c` (the sharded backend), is at
//!
//! ```text
//! chunk_base + c * REGION + offset
//! ```
//!
//! so the fast path turns a CPU id into an address with one shift and one
//! add, counters of different CPUs never share a cache line, and a ref costs
//! 8 bytes per possible CPU (plus its 128-byte `PercpuRef`, which holds the
//! slot). Cache-padding each ref's counters instead would cost 128 bytes
//! per CPU per ref (32 KiB per ref on a 192-CPU machine, against 1.5 KiB
//! here).
//!
//! # What memory goes back to the system
//!
//! None, while the process lives: a chunk, once mapped, stays mapped, and a
//! dropped ref's slot (zeroed) is kept for the next ref. A process that
//! once held a million refs on 2 CPUs keeps their 16 MB of counters, plus
//! 4 bytes per free slot in the pool's free list, and a new million refs
//! reuse them without growing (`cargo run --release -p percpu-ref-tools
//! --bin footprint` measures both). Pages of a region that no CPU has written since the
//! chunk was mapped are never backed, so a CPU that never runs a user of a
//! ref costs nothing. The kernel's percpu allocator can free an empty
//! chunk; this arena does not: a chunk's free slots are spread over the
//! pool and every thread's cache, so finding an empty one needs per-chunk
//! live counts that every create and drop would pay to keep, and a pointer
//! into the arena could no longer be trusted for the life of the process
//! (an invariant below).
//!
//! # Invariants
//!
//! - A slot is owned by at most one live [`Slot`] handle; it returns to a
//!   thread cache or the pool only when that handle drops, zeroed on every
//!   CPU by the dropping thread, so every free slot is zero.
//! - Chunks are mapped lazily with `mmap` (zero-filled, so a CPU's page
//!   costs nothing until a counter on it is written) and never unmapped: a
//!   pointer into the arena stays valid for the life of the process.
//! - Every chunk has the same number of regions, [`arena_cpus`]: read once
//!   from [`possible_cpus`] (never from the CPUs this process may run on)
//!   and fixed for the life of the process. [`Slot::sum`] and [`Slot::zero`]
//!   cover exactly those regions, and a ref's mode word holds the same
//!   number as the rseq fast path's bound while it is in percpu mode
//!   (`Counters::percpu_mode`).
//!
//! # What the sizing trusts
//!
//! The possible-CPU count is trusted for *speed*, never for *memory
//! safety*. It normally covers every `cpu_id` the kernel can report, so
//! every CPU counts in its own region. But it can be under-reported: a
//! container that hides or trims `/sys/devices/system/cpu/possible` (and
//! `/proc/stat`, `/proc/cpuinfo`) makes `sysconf` fall back to the
//! affinity count, so a process allowed on CPU 1 alone may believe there is
//! one CPU. The fast path therefore compares `cpu_id` with that bound
//! inside the critical section and takes the atomic path for any id at or
//! above it: a wrong count costs speed (operations on the CPUs above it
//! are atomic), never a write outside a chunk.
//!
//! # Thread caches
//!
//! Creating and dropping refs must scale with threads (a ref per
//! connection or request), so the create/drop path takes no lock: each
//! thread keeps a cache of up to [`CACHE_MAX`] free slots and moves
//! [`BATCH`] of them at a time to or from the shared pool, under the lock,
//! once every `BATCH` creations or drops at most ([`cache`] says how a
//! thread reaches its cache in a few instructions and gives it back when
//! it exits). A slot in a cache is free and zeroed; it moves between
//! threads only through the pool, so the lock orders its zeroing before
//! its next owner's use. Memory is never returned to the system: chunks
//! live for the process, and a dropped ref's slot is reused by the next ref
//! created (on this thread first).
//!
//! # Fork
//!
//! The bookkeeping (chunks, free list) sits behind a small spin lock of our
//! own rather than a `std::sync::Mutex`, so that it can be taken around a
//! `fork`: the process's `pthread_atfork` handlers (`src/fork.rs`,
//! registered when the program is loaded, so before any thread can take
//! the lock) acquire it in the forking thread before the fork
//! ([`prepare_fork`]) and release it in the parent and in the child
//! afterwards ([`after_fork`]). A fork therefore never happens while
//! another thread holds it, and the child (which has only the forking
//! thread) finds it free: its first ref alloc or drop cannot deadlock. (A
//! `Mutex` held by another thread at the fork stays locked forever in the
//! child.) The lock is held only for a few bookkeeping steps and, once per
//! chunk, an allocation; waiters spin briefly, then yield.

use super::cpus::possible_cpus;
use super::ArenaStats;
mod cache;

use crate::sync::unmodeled::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::alloc::{self, Layout};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// log2 of [`REGION`].
pub(crate) const REGION_SHIFT: u32 = 16;
/// Bytes of one CPU's region in a chunk: 64 KiB, 8192 slots. Pages are
/// backed only when first written, so a large region costs address space,
/// not memory; what it saves is bookkeeping: one chunk pointer per 8192
/// refs instead of per 512 (at 4 KiB regions the chunk table alone added
/// 0.016 B per ref, enough to put a million refs over the 8 B × CPUs
/// budget that `tools/src/bin/footprint/` checks).
pub(crate) const REGION: usize = 1 << REGION_SHIFT;
/// The alignment a chunk needs: a page at most (what `mmap` gives), not a
/// region. Counters need only 8-byte alignment, and counters of different
/// CPUs are a region apart, so they never share a cache line; nothing
/// computes a chunk from an address by masking.
const CHUNK_ALIGN: usize = 4096;
/// Slots per chunk.
const SLOTS_PER_CHUNK: usize = REGION / 8;
/// Slots moved between a thread's cache and the pool at a time.
const BATCH: usize = 32;
/// The most free slots a thread keeps; one more returns [`BATCH`] of them.
const CACHE_MAX: usize = 2 * BATCH;

/// A free slot: its index (for the pool) and its CPU-0 address (so that a
/// thread can hand it out without reading `chunks` under the lock).
#[derive(Clone, Copy)]
struct FreeSlot {
    index: u32,
    base: NonNull<u8>,
}

struct Arena {
    chunks: Vec<NonNull<u8>>,
    /// Zeroed slots released by dropped refs, reused before fresh ones
    /// (indices only: 4 bytes per free slot, the address is recomputed).
    free: Vec<u32>,
    /// Slots handed out at least once: `0..fresh_next`.
    fresh_next: usize,
    /// Slots outside the pool: owned by live refs or in a thread's cache.
    out: usize,
    /// Each registered thread cache's length, for [`stats`] (see
    /// [`cache::cached`]).
    caches: Vec<*const AtomicUsize>,
}

/// The arena's bookkeeping and the lock that guards it (see "Fork" above).
struct ArenaLock {
    held: AtomicBool,
    arena: UnsafeCell<Arena>,
}

// SAFETY: `arena` is only reached through an `ArenaGuard`, and at most one
// guard exists at a time (`held`); the chunk pointers in it are plain heap
// memory owned by the arena, usable from any thread, and the cache
// lengths are atomics that their threads unregister before they go away
// (`cache`).
unsafe impl Sync for ArenaLock {}

static ARENA: ArenaLock = ArenaLock {
    held: AtomicBool::new(false),
    arena: UnsafeCell::new(Arena {
        chunks: Vec::new(),
        free: Vec::new(),
        fresh_next: 0,
        out: 0,
        caches: Vec::new(),
    }),
};

impl ArenaLock {
    fn acquire(&self) {
        let mut spins = 0u32;
        // ordering-audit: kept: a lock's acquire. The arena is the rseq
        // backend's and is not built under loom; tests/rseq_arena and
        // rseq_fork run it, on x86 only.
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.held.load(Ordering::Relaxed) {
                if spins < 100 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    fn release(&self) {
        // ordering-audit: kept: the lock's release (not built under loom).
        self.held.store(false, Ordering::Release);
    }
}

/// Exclusive access to the bookkeeping; releases the lock on drop (also
/// when unwinding: the bookkeeping is updated only after every fallible
/// step, so a panic under the lock leaves no broken invariant).
struct ArenaGuard(());

impl Deref for ArenaGuard {
    type Target = Arena;
    fn deref(&self) -> &Arena {
        // SAFETY: this guard holds the lock, so no other reference to the
        // bookkeeping exists.
        unsafe { &*ARENA.arena.get() }
    }
}

impl DerefMut for ArenaGuard {
    fn deref_mut(&mut self) -> &mut Arena {
        // SAFETY: as above; `&mut self` makes this the only access through
        // the guard.
        unsafe { &mut *ARENA.arena.get() }
    }
}

impl Drop for ArenaGuard {
    fn drop(&mut self) {
        ARENA.release();
    }
}

fn arena() -> ArenaGuard {
    ARENA.acquire();
    ArenaGuard(())
}

/// Before `fork`, in the forking thread (`crate::fork`): waits until no
/// other thread holds the lock and takes it. Two threads forking at once
/// are serialised here (glibc does not hold its own lock while it runs
/// the handlers).
#[cfg(all(unix, not(miri)))]
pub(crate) fn prepare_fork() {
    ARENA.acquire();
}

/// After `fork`, in the parent: releases the lock taken by
/// [`prepare_fork`].
#[cfg(all(unix, not(miri)))]
pub(crate) fn parent_after_fork() {
    ARENA.release();
}

/// After `fork`, in the child, on behalf of its only thread: forgets the
/// thread caches of the threads that did not survive the fork (their
/// memory is the C library's to reuse or unmap now), then releases the
/// lock taken by [`prepare_fork`].
#[cfg(all(unix, not(miri)))]
pub(crate) fn child_after_fork() {
    // SAFETY: this thread took the lock in `prepare_fork` and is the only
    // thread of the child, so nothing else refers to the bookkeeping.
    cache::forget_other_threads(unsafe { &mut *ARENA.arena.get() });
    ARENA.release();
}

/// The number of per-CPU regions in every chunk of the arena: CPU ids
/// `0..arena_cpus()` have a counter, no other id has one.
///
/// Taken once from [`possible_cpus`] (clamped to `1..=i32::MAX`, so that
/// the fast path's unsigned compare also rejects every negative `cpu_id`)
/// and never changed, so chunk sizes, sums, resets and the fast path's
/// bound all agree.
#[inline(always)]
pub(crate) fn arena_cpus() -> usize {
    let n = ARENA_CPUS.load(Ordering::Relaxed);
    if n != 0 {
        return n;
    }
    count_arena_cpus()
}

static ARENA_CPUS: AtomicUsize = AtomicUsize::new(0);

/// The first [`arena_cpus`].
#[cold]
#[inline(never)]
fn count_arena_cpus() -> usize {
    let want = possible_cpus().clamp(1, i32::MAX as usize);
    // The first value stored wins (every caller computes the same one).
    match ARENA_CPUS.compare_exchange(0, want, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => want,
        Err(first) => first,
    }
}

/// A new zeroed chunk, straight from the kernel: `mmap` returns
/// page-aligned memory, which is all a chunk needs (`REGION` is whole pages),
/// and costs nothing beyond the chunk's own pages. Through the global
/// allocator a 4 KiB-aligned chunk cost up to one more page (`memalign`
/// rounds up), 8 bytes per slot on a 2-CPU machine. Untouched pages stay
/// unbacked until a CPU's counter on them is first written.
#[cfg(all(unix, not(miri)))]
fn map_chunk() -> NonNull<u8> {
    let layout = chunk_layout();
    // SAFETY: an anonymous private mapping of a non-zero length; no
    // existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            layout.size(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        alloc::handle_alloc_error(layout)
    }
    no_huge_pages(p, layout.size());
    debug_assert_eq!(
        p as usize % CHUNK_ALIGN,
        0,
        "mmap returns page-aligned memory"
    );
    NonNull::new(p.cast()).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

/// Keeps transparent huge pages out of a chunk: a chunk of 32 regions is
/// exactly one 2 MiB huge page, and under THP `always` (or after
/// khugepaged collapses it) the first write to any CPU's counter would make
/// every region of 8,192 refs resident, so that the memory a ref costs
/// would no longer grow with the ids that touched it. `MADV_NOHUGEPAGE`
/// is kept by the mapping, so khugepaged honours it too. A refusal (a
/// kernel without THP) changes nothing: the pages are small already.
///
/// For measuring what huge pages change (the `footprint` program, in
/// guests and here), `PERCPU_REF_ARENA_THP` chooses another advice, read
/// once, before the first chunk: `system` gives none (the system's policy
/// decides), `always` gives `MADV_HUGEPAGE` (huge pages where the policy
/// is `madvise`); `never` or unset is the default.
#[cfg(all(unix, not(miri)))]
fn no_huge_pages(chunk: *mut libc::c_void, len: usize) {
    #[cfg(target_os = "linux")]
    {
        static ADVICE: std::sync::OnceLock<Option<libc::c_int>> = std::sync::OnceLock::new();
        let advice = *ADVICE.get_or_init(|| {
            match std::env::var_os("PERCPU_REF_ARENA_THP")
                .as_deref()
                .and_then(|v| v.to_str())
            {
                Some("system") => None,
                Some("always") => Some(libc::MADV_HUGEPAGE),
                _ => Some(libc::MADV_NOHUGEPAGE),
            }
        });
        if let Some(advice) = advice {
            // SAFETY: advice on a mapping this function's caller just
            // made, of its exact length; it changes no contents.
            let _ = unsafe { libc::madvise(chunk, len, advice) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (chunk, len);
}

/// A new zeroed chunk from the global allocator, where there is no `mmap`
/// (Windows) or it is not modelled (Miri).
#[cfg(not(all(unix, not(miri))))]
fn map_chunk() -> NonNull<u8> {
    let layout = chunk_layout();
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc::alloc_zeroed(layout) };
    NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

fn chunk_layout() -> Layout {
    let bytes = arena_cpus()
        .checked_mul(REGION)
        .expect("percpu_ref: arena chunk size overflows usize");
    Layout::from_size_align(bytes, CHUNK_ALIGN).expect("percpu_ref: arena chunk layout")
}

/// One ref's 8-byte slot in every CPU's region. `#[repr(C)]`: the base is
/// its first word, which the rseq section loads (`Counters`).
#[repr(C)]
pub(crate) struct Slot {
    /// `chunk_base + offset`: CPU 0's counter; CPU `c`'s is `REGION * c`
    /// bytes further.
    base: NonNull<u8>,
    index: u32,
    /// Eight bits for the owner (the backend), kept in what would be
    /// padding so that a ref's counters stay two words.
    tag: u8,
}

const _: () = assert!(std::mem::offset_of!(Slot, base) == 0);

// SAFETY: a slot is only a position in arena memory that lives for the
// whole process; all access to it goes through atomics or the rseq
// critical section.
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

impl Arena {
    /// Moves between 1 and `n` free slots (released ones first, then
    /// fresh ones, allocating at most one chunk) from the pool to `into`.
    fn take(&mut self, n: usize, mut into: impl FnMut(FreeSlot)) {
        let reused = n.min(self.free.len());
        let start = self.free.len() - reused;
        for i in start..self.free.len() {
            let index = self.free[i];
            into(FreeSlot {
                index,
                base: self.slot_base(index as usize),
            });
        }
        self.free.truncate(start);
        let mut fresh = n - reused;
        if fresh > 0 && self.fresh_next == self.chunks.len() * SLOTS_PER_CHUNK {
            self.chunks.push(map_chunk());
        }
        fresh = fresh.min(self.chunks.len() * SLOTS_PER_CHUNK - self.fresh_next);
        for i in self.fresh_next..self.fresh_next + fresh {
            let index = u32::try_from(i)
                .unwrap_or_else(|_| panic!("percpu_ref: the arena is full ({i} slots)"));
            into(FreeSlot {
                index,
                base: self.slot_base(i),
            });
        }
        self.fresh_next += fresh;
        self.out += reused + fresh;
    }

    /// Returns zeroed slots to the pool.
    fn give(&mut self, slots: impl ExactSizeIterator<Item = FreeSlot>) {
        self.out -= slots.len();
        self.free.extend(slots.map(|s| s.index));
    }

    /// CPU 0's counter of slot `i` (of an allocated chunk).
    fn slot_base(&self, i: usize) -> NonNull<u8> {
        let chunk = self.chunks[i / SLOTS_PER_CHUNK];
        // SAFETY: the offset is below REGION, inside CPU 0's region of an
        // allocated chunk.
        unsafe { chunk.add(i % SLOTS_PER_CHUNK * 8) }
    }
}

impl Slot {
    /// Takes a free slot, zeroed on every CPU: from this thread's cache,
    /// or from the pool when the cache cannot be used (the thread is
    /// exiting).
    #[cfg(test)]
    pub(crate) fn alloc() -> Slot {
        Self::alloc_tagged(0)
    }

    /// [`alloc`](Self::alloc), with the owner's `tag` (see [`tag`](Self::tag)).
    #[inline]
    pub(crate) fn alloc_tagged(tag: u8) -> Slot {
        let free = cache::pop();
        Slot {
            base: free.base,
            index: free.index,
            tag,
        }
    }

    /// The address of CPU 0's counter; the fast path adds `cpu << REGION_SHIFT`.
    ///
    /// The rseq section reads the base itself, as the word after the mode
    /// word (`Counters`); the rseq tests build such words with this.
    #[cfg(test)]
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The tag given at [`alloc_tagged`](Self::alloc_tagged).
    #[inline(always)]
    pub(crate) fn tag(&self) -> u8 {
        self.tag
    }

    /// [`counter`](Self::counter) without the bound check, for the
    /// sharded backend's hot path, whose shard index is below
    /// `arena_cpus()` by construction.
    ///
    /// # Safety
    ///
    /// `cpu < arena_cpus()`.
    #[inline(always)]
    pub(crate) unsafe fn counter_unchecked(&self, cpu: usize) -> &AtomicU64 {
        debug_assert!(cpu < arena_cpus());
        // SAFETY: `cpu` indexes a region of this slot's chunk (the
        // caller's promise); otherwise as in `counter`.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(cpu * REGION).cast()) }
    }

    /// This slot's counter in region `cpu` (`cpu < arena_cpus()`): the
    /// rseq backend's counter of CPU `cpu`, or the sharded backend's shard.
    #[inline(always)]
    pub(crate) fn counter(&self, cpu: usize) -> &AtomicU64 {
        assert!(
            cpu < arena_cpus(),
            "percpu_ref: CPU {cpu} has no arena region"
        );
        // SAFETY: `cpu` indexes a region of this slot's chunk, the address
        // is 8-byte aligned, and arena memory lives for the whole process.
        // Other writers use atomics too (the sharded backend's RMWs) or are
        // rseq sections on that CPU, which the callers exclude (after a
        // grace period, or while the slot is not yet / no longer used by a
        // ref).
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(cpu * REGION).cast()) }
    }

    /// This slot's counter on `cpu` (`cpu < arena_cpus()`).
    #[cfg(all(test, percpu_ref_rseq))]
    pub(crate) fn load(&self, cpu: usize) -> u64 {
        self.counter(cpu).load(Ordering::Relaxed)
    }

    /// The wrapping sum of this slot over every region of its chunk.
    #[cfg_attr(
        not(percpu_ref_rseq),
        allow(
            dead_code,
            reason = "the rseq backend's; shards are reached through `counter`"
        )
    )]
    pub(crate) fn sum(&self) -> u64 {
        (0..arena_cpus()).fold(0u64, |s, cpu| {
            s.wrapping_add(self.counter(cpu).load(Ordering::Relaxed))
        })
    }

    /// Zeroes this slot in every region of its chunk. Writes only the
    /// counters that are not zero: a region page no CPU ever counted on
    /// stays unbacked (reading it maps the shared zero page).
    #[inline]
    pub(crate) fn zero(&self) {
        for cpu in 0..arena_cpus() {
            // SAFETY: `cpu` is below `arena_cpus()`, the chunk's regions.
            let c = unsafe { self.counter_unchecked(cpu) };
            // Read first: a region no id wrote is still the shared zero
            // page (or unmapped), and a store would make it resident.
            if c.load(Ordering::Relaxed) != 0 {
                c.store(0, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Slot {
    #[inline]
    fn drop(&mut self) {
        // Zeroed here, by the thread that owned it last, so that every
        // free slot is zero: a cached slot needs nothing at hand-out.
        self.zero();
        cache::push(FreeSlot {
            index: self.index,
            base: self.base,
        });
    }
}

/// The arena's accounting, behind [`crate::percpu::arena_stats`].
pub(super) fn stats() -> ArenaStats {
    let a = arena();
    let capacity = a.chunks.len() * SLOTS_PER_CHUNK;
    let cached = cache::cached(&a);
    ArenaStats {
        live_slots: a.out.saturating_sub(cached),
        free_slots: a.free.len() + cached,
        unused_slots: capacity - a.fresh_next,
        chunks: a.chunks.len(),
        reserved_bytes: a.chunks.len() * arena_cpus() * REGION,
        bytes_per_slot: 8 * arena_cpus(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_slot_is_zeroed_and_distinct() {
        let a = Slot::alloc();
        let b = Slot::alloc();
        assert_ne!(a.base(), b.base());
        for cpu in 0..arena_cpus() {
            a.counter(cpu).store(cpu as u64 + 5, Ordering::Relaxed);
        }
        let n = arena_cpus() as u64;
        assert_eq!(a.sum(), n * 5 + n * (n - 1) / 2);
        assert_eq!(b.sum(), 0, "neighbouring slot untouched");
        drop(a);
        // Some slot is reused (maybe by a concurrent test); ours is zeroed.
        let c = Slot::alloc();
        assert_eq!(c.sum(), 0);
    }

    /// Slots dropped on one thread go back through the pool (the cache is
    /// full, then the thread exits) and come out zeroed on another.
    #[test]
    fn slots_cross_threads_zeroed() {
        const N: usize = 5 * CACHE_MAX;
        let bases: Vec<usize> = std::thread::spawn(|| {
            let slots: Vec<Slot> = (0..N).map(|_| Slot::alloc()).collect();
            for s in &slots {
                for cpu in 0..arena_cpus() {
                    s.counter(cpu).store(7, Ordering::Relaxed);
                }
            }
            slots.iter().map(|s| s.base() as usize).collect()
        })
        .join()
        .unwrap();
        assert_eq!(bases.len(), N);
        let slots: Vec<Slot> = (0..N).map(|_| Slot::alloc()).collect();
        for s in &slots {
            assert_eq!(s.sum(), 0, "a reused slot is zero on every CPU");
        }
    }

    /// Many threads allocate and drop slots through their caches: no slot
    /// is ever owned twice, and an exited thread's cache is given back.
    #[test]
    fn no_slot_has_two_owners() {
        use std::collections::HashSet;
        use std::sync::Mutex;
        let live = Mutex::new(HashSet::new());
        let threads = 4 * std::thread::available_parallelism().map_or(2, |n| n.get());
        // Under Miri (CI's `--lib percpu::arena`), 300 rounds per thread
        // keep it to seconds.
        let rounds = if cfg!(miri) {
            300
        } else if cfg!(debug_assertions) {
            2_000
        } else {
            20_000
        };
        std::thread::scope(|s| {
            for t in 0..threads {
                let live = &live;
                s.spawn(move || {
                    let mut held: Vec<Slot> = Vec::new();
                    for i in 0..rounds {
                        // Hold a varying number so that caches fill, spill
                        // and refill.
                        if (i * 7 + t) % 3 == 0 || held.len() > 3 * CACHE_MAX {
                            let n = held.len() / 2;
                            for slot in held.drain(..n) {
                                assert!(live.lock().unwrap().remove(&(slot.base() as usize)));
                            }
                        } else {
                            let slot = Slot::alloc();
                            assert_eq!(slot.sum(), 0);
                            slot.counter(0).store(1, Ordering::Relaxed);
                            assert!(
                                live.lock().unwrap().insert(slot.base() as usize),
                                "slot {:p} handed out twice",
                                slot.base()
                            );
                            held.push(slot);
                        }
                    }
                    for slot in held {
                        assert!(live.lock().unwrap().remove(&(slot.base() as usize)));
                    }
                });
            }
        });
        assert!(live.lock().unwrap().is_empty());
    }
}
