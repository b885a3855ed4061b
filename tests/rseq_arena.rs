//! The per-CPU arena's accounting: what a ref on the rseq backend costs,
//! and that slots are reused after drop. One test in this binary, so no
//! other test allocates from the arena meanwhile. Skipped, saying why, when
//! the rseq backend is unavailable (e.g. `GLIBC_TUNABLES=glibc.pthread.rseq=0`).
#![cfg(percpu_ref_rseq)]

use percpu_ref::percpu::arena_stats;
use percpu_ref::{possible_cpus, Backend, InitFlags, PercpuRef};

const REFS: usize = 100_000;

#[test]
fn hundred_thousand_refs_cost_8_bytes_per_cpu_and_slots_are_reused() {
    if !Backend::Rseq.is_available() {
        eprintln!(
            "skipped: the rseq backend is not available in this process (glibc without an \
             rseq registration, e.g. GLIBC_TUNABLES=glibc.pthread.rseq=0 or valgrind, or no \
             membarrier RSEQ support)"
        );
        return;
    }
    let cpus = possible_cpus();
    let before = arena_stats();
    assert_eq!(before.bytes_per_slot, 8 * cpus);
    let refs: Vec<PercpuRef> = (0..REFS)
        .map(|_| PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Rseq).unwrap())
        .collect();
    let full = arena_stats();
    assert_eq!(full.live_slots, before.live_slots + REFS);
    assert!(refs.iter().all(|r| r.percpu_bytes() == 8 * cpus));
    // Reserved memory is the slots plus at most one partly used chunk.
    let slot_bytes = full.live_slots * full.bytes_per_slot;
    let chunk_bytes = full.reserved_bytes / full.chunks;
    assert!(full.reserved_bytes >= slot_bytes);
    assert!(
        full.reserved_bytes - slot_bytes < chunk_bytes,
        "reserved {} B for {} B of live slots (chunk {} B)",
        full.reserved_bytes,
        slot_bytes,
        chunk_bytes
    );
    // Every ref counts in its own slot.
    for (i, r) in refs.iter().enumerate().step_by(997) {
        r.get_many(i + 1);
    }
    for (i, r) in refs.iter().enumerate().step_by(997) {
        r.kill_sync().unwrap();
        assert_eq!(r.atomic_count(), Some(i as u64 + 1));
    }
    let header = std::mem::size_of::<PercpuRef>();
    eprintln!(
        "{REFS} refs: {} chunks, {} B reserved = {:.1} B per ref on {cpus} possible CPUs \
         (+ {header} B PercpuRef)",
        full.chunks,
        full.reserved_bytes,
        full.reserved_bytes as f64 / REFS as f64
    );
    drop(refs);
    let dropped = arena_stats();
    assert_eq!(dropped.live_slots, before.live_slots);
    assert_eq!(dropped.free_slots, before.free_slots + REFS);
    // A second round reuses the freed slots: no new chunk.
    let again: Vec<PercpuRef> = (0..REFS)
        .map(|_| PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Rseq).unwrap())
        .collect();
    let reused = arena_stats();
    assert_eq!(
        reused.chunks, full.chunks,
        "slots were reused, no chunk added"
    );
    assert_eq!(reused.live_slots, full.live_slots);
    // Reused slots (some left non-zero by the first round) start at zero:
    // a fresh ref killed at once has count 0.
    for r in &again {
        r.kill_sync().unwrap();
        assert_eq!(r.atomic_count(), Some(0));
    }
}
