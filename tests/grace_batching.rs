//! Grace periods are shared, counted with
//! `percpu::grace_periods()` (membarriers issued by the rseq backend).
//!
//! One test function, so that no other test of this binary issues grace
//! periods meanwhile:
//! - 20,000 `kill`s by one thread issue no more grace periods
//!   than the engine's batching allows, and never one per kill: a batch
//!   ends when it is full (4096 switches), when it has gathered for 1 ms,
//!   or when `flush` cuts it short, so a run of `t` ms issues at most
//!   `ceil(20,000 / 4096) + t + 2`. How many of those it takes depends on
//!   timing: a killer that outruns the engine's wake fills a batch every
//!   4096 kills (5 in all), one that does not leaves it all to one batch;
//!   the kill rate and the count are printed;
//! - two threads doing synchronous kills at once issue no more grace
//!   periods than kills, and print how many they shared (a waiter whose
//!   grace period someone else ran skips its own; how often that happens
//!   depends on the two threads really running at once, which a loaded
//!   machine does not give: the loom model `sync_kills_share_a_grace_period`
//!   shows the sharing deterministically);
//! - one thread alone issues exactly one per synchronous kill (nothing to
//!   share, nothing added).
//!
//! Skipped where the rseq backend is not available (the sharded backend
//! needs no grace period at all).
#![cfg(not(miri))]

use percpu_ref::percpu::grace_periods;
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::pin::Pin;
use std::time::Instant;

mod common;

const DEFERRED: usize = 20_000;
/// The engine's `BATCH_FULL`: a batch this large runs its grace period at
/// once (`src/grace.rs`, "The engine thread").
const BATCH_FULL: usize = 4096;
const SYNC_PER_THREAD: usize = 2_000;

fn rseq_refs(n: usize) -> Vec<Pin<Box<PercpuRef>>> {
    (0..n)
        .map(|_| {
            Box::pin(PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Rseq).unwrap())
        })
        .collect()
}

#[test]
fn grace_periods_are_shared() {
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: the rseq backend is not available");
        return;
    }
    // Deferred kills: batched.
    let refs = rseq_refs(DEFERRED);
    let before = grace_periods();
    let start = Instant::now();
    for r in &refs {
        r.as_ref().kill().unwrap();
    }
    let killing = start.elapsed();
    percpu_ref::flush();
    let elapsed = start.elapsed();
    let gps = grace_periods() - before;
    eprintln!(
        "{DEFERRED} kill: {:.0} kills/s on the killing thread ({killing:?}), \
         {gps} grace periods, all complete after {elapsed:?}",
        DEFERRED as f64 / killing.as_secs_f64()
    );
    // Batches that filled up, plus those that gathered for 1 ms each
    // (disjoint windows inside `elapsed`, the first and the flush's cut
    // short).
    let bound = DEFERRED.div_ceil(BATCH_FULL) as u64 + elapsed.as_millis() as u64 + 2;
    assert!(
        gps <= bound,
        "{gps} grace periods for {DEFERRED} deferred kills in {elapsed:?}: more than one per \
         full batch of {BATCH_FULL} and one per millisecond (bound {bound})"
    );
    assert!(refs.iter().all(|r| r.is_zero()));
    drop(refs);

    // One thread of synchronous kills: one grace period each.
    let refs = rseq_refs(SYNC_PER_THREAD);
    let before = grace_periods();
    for r in &refs {
        r.kill_sync().unwrap();
    }
    assert_eq!(grace_periods() - before, SYNC_PER_THREAD as u64);

    // Two threads of synchronous kills at once: shared.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let before = grace_periods();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let refs = rseq_refs(SYNC_PER_THREAD);
                barrier.wait();
                for r in refs {
                    r.kill_sync().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let gps = grace_periods() - before;
    let kills = 2 * SYNC_PER_THREAD as u64;
    eprintln!("2 threads x {SYNC_PER_THREAD} synchronous kills: {gps} grace periods");
    common::report_counts();
    assert!(
        gps <= kills,
        "{gps} grace periods for {kills} concurrent synchronous kills"
    );
}
