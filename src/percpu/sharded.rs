//! The portable backend: atomic shards that the switcher seals.
//!
//! Each ref owns one shard per possible CPU, as an arena slot
//! (`percpu/arena.rs`): shard `k` of every ref lives in region `k`, 8 bytes
//! per shard, so a ref costs 8 bytes per possible CPU and shards of
//! different indices never share a cache line. A thread always uses the
//! shard given by its compact thread id (`percpu/thread_id.rs`: the lowest
//! id no live thread holds, reused when a thread exits), so in the common
//! case a shard is touched by one thread and its cache line never moves,
//! and a ref's pages are touched only in the regions of the threads that
//! use it at once, not of every thread the process ever started. (Under loom, which cannot place its atomics in raw memory, the
//! shards are a boxed slice; the protocol is the same code.)
//!
//! # Sealing instead of a grace period
//!
//! A percpu operation is one `fetch_add` on the thread's shard, and the
//! *old value it returns* says whether it counted. The switcher seals each
//! shard with `swap(SEALED)`, collecting its value. `SEALED` (2^62) is far
//! from every live value (live per-shard magnitudes stay below 2^61), so:
//!
//! - an add ordered before the swap returned a live value and is in the sum;
//! - an add ordered after it returned a sealed value: it did not count, and
//!   the caller takes the atomic path. The sealed shard drifts by that
//!   delta, which is harmless: it is never summed again, and
//!   [`reset`] overwrites it before the next percpu period.
//!
//! Because each shard's operations are totally ordered RMWs, no in-flight
//! tracking and no grace period are needed, and loom checks this backend
//! exactly as it runs.
//!
//! # Ranges
//!
//! Before its `fetch_add` an operation loads its shard and goes straight to
//! the atomic path unless the value is within `±2^60` ([`COMFORT`]). That
//! load is only a filter, so it may be stale and relaxed: it can send an
//! operation to the (always exact) atomic path, never make one count. It
//! does two jobs:
//!
//! - a sealed shard fails it, so atomic-mode operations leave the shards
//!   alone (the mode word need not be read at all);
//! - live values stay far from the seal: every per-CPU delta is below 2^16
//!   in magnitude (the protocol sends larger `n` to the atomic path), so a
//!   shard can pass `2^60` only by the adds of threads that passed the
//!   filter before it did, at most `threads * 2^16`. Reaching `2^61`, where
//!   a live value would read as sealed, would take 2^44 threads racing on
//!   one shard; likewise a sealed shard's drift stays far below `2^61`.
//!   Any `n` the API accepts therefore counts exactly, and a shard that a
//!   long run pushed to the edge just sends its thread to the atomic path.

#[cfg(not(percpu_ref_loom))]
use super::arena::{arena_cpus, Slot};
#[cfg(percpu_ref_loom)]
use super::cpus::possible_cpus;
use crate::sync::{AtomicU64, Ordering};

/// The value a sealed shard holds (plus the drift of late adds).
const SEALED: u64 = 1 << 62;
/// Live per-shard values stay within `(-LIVE_LIMIT, LIVE_LIMIT)` as `i64`.
const LIVE_LIMIT: u64 = 1 << 61;
/// Operations add to a shard only while it is within (-COMFORT, COMFORT).
const COMFORT: u64 = 1 << 60;

/// Whether a shard value (loaded before adding) leaves room to add.
#[inline(always)]
fn has_room(v: u64) -> bool {
    v.wrapping_add(COMFORT) < 2 * COMFORT
}

/// Whether a shard value returned by `fetch_add` belongs to a sealed shard.
#[inline(always)]
fn is_sealed(old: u64) -> bool {
    // Live values are in (-2^61, 2^61); shifting by 2^61 maps them to
    // [1, 2^62), anything else is sealed (2^62 ± drift).
    old.wrapping_add(LIVE_LIMIT) >= 2 * LIVE_LIMIT
}

/// Where one ref's shards live. On real builds an arena slot (shard `k` is
/// its counter in region `k`); under loom, which cannot place its atomics
/// in raw memory, a boxed slice. The protocol below is the same code for
/// both.
pub(crate) trait ShardStore {
    /// Shard `k` (`k < shard_count()`).
    fn at(&self, k: usize) -> &AtomicU64;

    /// This thread's shard: [`at`](Self::at) without re-checking an index
    /// that is in range by construction.
    fn this_threads(&self) -> &AtomicU64;
}

#[cfg(not(percpu_ref_loom))]
impl ShardStore for Slot {
    #[inline(always)]
    fn at(&self, k: usize) -> &AtomicU64 {
        self.counter(k)
    }

    #[inline(always)]
    fn this_threads(&self) -> &AtomicU64 {
        // SAFETY: `thread_shard` is a thread id below `arena_cpus()` (the
        // bitmap has that many ids; a shared one is taken modulo it), fixed
        // for the life of the process, which is `shard_count()`.
        unsafe { self.counter_unchecked(thread_shard()) }
    }
}

/// Under loom: the shards of one ref.
#[cfg(percpu_ref_loom)]
pub(crate) struct Shards(Box<[AtomicU64]>);

#[cfg(percpu_ref_loom)]
impl Shards {
    pub(crate) fn new() -> Shards {
        Shards((0..shard_count()).map(|_| AtomicU64::new(0)).collect())
    }
}

#[cfg(percpu_ref_loom)]
impl ShardStore for Shards {
    fn at(&self, k: usize) -> &AtomicU64 {
        &self.0[k]
    }

    fn this_threads(&self) -> &AtomicU64 {
        self.at(thread_shard())
    }
}

/// How many shards every ref has: one per arena region (possible CPU).
#[inline(always)]
pub(crate) fn shard_count() -> usize {
    #[cfg(not(percpu_ref_loom))]
    {
        arena_cpus()
    }
    #[cfg(percpu_ref_loom)]
    {
        possible_cpus()
    }
}

/// Seals fresh (zero) shards, for a ref that starts in atomic mode: no
/// operation may count on them until a switch to percpu resets them.
/// Out of line: refs made in atomic mode are the rare case, and inlined
/// into every ref's creation its loop would cost each one.
#[inline(never)]
pub(crate) fn seal_fresh(s: &impl ShardStore) {
    for k in 0..shard_count() {
        // Relaxed: the ref is not shared yet; whatever publishes it
        // orders these stores before any use.
        s.at(k).store(SEALED, Ordering::Relaxed);
    }
}

/// This thread's shard.
#[inline(always)]
pub(crate) fn shard(s: &impl ShardStore) -> &AtomicU64 {
    s.this_threads()
}

/// Seals every shard and returns their sum (see the module docs).
pub(crate) fn seal_and_sum(store: &impl ShardStore) -> u64 {
    (0..shard_count())
        .map(|k| store.at(k))
        .fold(0u64, |sum, s| {
            // ordering-audit: Acquire: the seal collects what per-CPU ops did
            // before their (releasing) adds. Nothing of the switcher's must reach
            // an op that finds the shard sealed: it goes to the atomic counter,
            // whose RMWs read its latest value, and DEAD is a snapshot.
            #[cfg(not(percpu_ref_mutant = "no_grace_period"))]
            let v = s.swap(SEALED, Ordering::Acquire);
            // mutant no_grace_period: read, then seal; an add in between is lost.
            #[cfg(percpu_ref_mutant = "no_grace_period")]
            let v = {
                let v = s.load(Ordering::Acquire);
                s.store(SEALED, Ordering::Release);
                v
            };
            debug_assert!(!is_sealed(v), "percpu_ref: shard sealed twice");
            sum.wrapping_add(v)
        })
}

/// Zeroes every shard (the ref is atomic and sealed, the switch lock held).
pub(crate) fn reset(store: &impl ShardStore) {
    for s in (0..shard_count()).map(|k| store.at(k)) {
        // A swap, not a store: a late add from the previous percpu period
        // may hit the shard now, and must be ordered wholly before or
        // after the reset. A store would be equally correct, but loom
        // lets a plain store land between the read and the write of a
        // concurrent RMW (tokio-rs/loom#254) and then reports a shard
        // sealed twice; with a swap loom checks exactly the shipped code.
        // Reset runs once per switch to percpu mode, so the cost is nil.
        s.swap(0, Ordering::Release);
    }
}

/// One percpu operation on this thread's `shard`: add `delta` unless the
/// shard is sealed (or at the edge of its range); true if it counted.
/// `delta` is below 2^16 in magnitude (see the module docs); the mode word
/// is not read: a sealed shard says "atomic" by itself.
#[inline(always)]
pub(crate) fn try_add_at(shard: &AtomicU64, delta: u64) -> bool {
    if !has_room(shard.load(Ordering::Relaxed)) {
        return false;
    }
    #[cfg(all(percpu_ref_delay, not(percpu_ref_loom)))]
    super::delay::spin();
    // AcqRel: release so the switcher's swap sees everything before a
    // put; acquire so an op that counts after a reset (a Release swap)
    // sees what preceded the switch back (a revival's writes).
    let old = shard.fetch_add(delta, Ordering::AcqRel);
    let counted = !is_sealed(old);
    // mutant seal_check_inverted: count exactly the adds that did not.
    let counted = mutant!("seal_check_inverted", counted, !counted);
    // mutant seal_check_ignored: a late add on a sealed shard "counts".
    mutant!("seal_check_ignored", counted, true)
}

/// This thread's shard index, below [`shard_count`]: its compact thread
/// id (`percpu/thread_id.rs`), the lowest no live thread holds, given back
/// when the thread exits.
#[cfg(not(percpu_ref_loom))]
#[inline(always)]
fn thread_shard() -> usize {
    super::thread_id::current()
}

#[cfg(percpu_ref_loom)]
#[inline(always)]
fn thread_shard() -> usize {
    thread_index() % shard_count()
}

/// Under loom the index must be the same in every execution: use the loom
/// thread id (main = 0, spawned threads 1, 2, ...).
#[cfg(percpu_ref_loom)]
pub(super) fn thread_index() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.trim_start_matches("ThreadId(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or(0)
}

#[cfg(all(test, not(percpu_ref_loom)))]
mod tests {
    use super::*;
    use crate::percpu::MODE_ATOMIC;
    use crate::sync::AtomicUsize;

    fn try_add(s: &Slot, _mode: &AtomicUsize, delta: u64) -> bool {
        try_add_at(shard(s), delta)
    }

    #[test]
    fn sealed_classification() {
        for live in [
            0u64,
            1,
            1000,
            (LIVE_LIMIT - 1),
            0u64.wrapping_sub(1),
            0u64.wrapping_sub(LIVE_LIMIT - 1),
        ] {
            assert!(!is_sealed(live), "{live:#x} is live");
        }
        for drift in [
            0i64,
            1,
            -1,
            1 << 40,
            -(1 << 40),
            (1 << 61) - 1,
            -((1 << 61) - 1),
        ] {
            assert!(
                is_sealed(SEALED.wrapping_add(drift as u64)),
                "SEALED{drift:+} is sealed"
            );
        }
    }

    #[test]
    fn room_classification() {
        for v in [0u64, 1, COMFORT - 1, 0u64.wrapping_sub(COMFORT - 1)] {
            assert!(has_room(v), "{v:#x} has room");
        }
        for v in [
            COMFORT,
            0u64.wrapping_sub(COMFORT + 1),
            SEALED,
            SEALED - (1 << 40),
        ] {
            assert!(!has_room(v), "{v:#x} has no room");
        }
    }

    #[test]
    fn a_shard_at_the_edge_sends_its_thread_to_the_atomic_path() {
        let mode = AtomicUsize::new(0);
        let s = Slot::alloc();
        // Push this thread's shard to the edge, 2^16 at a time would take
        // too long: set it directly, as 2^44 maximal adds would.
        shard(&s).store(COMFORT - 1, Ordering::Relaxed);
        assert!(try_add(&s, &mode, 1), "still room");
        assert!(!try_add(&s, &mode, 1), "at the edge: atomic path");
        assert_eq!(seal_and_sum(&s), COMFORT);
    }

    #[test]
    fn late_add_after_seal_is_not_counted() {
        let mode = AtomicUsize::new(0);
        let s = Slot::alloc();
        assert!(try_add(&s, &mode, 5));
        assert!(try_add(&s, &mode, 2u64.wrapping_neg()));
        // The switcher sealed: the filter (or, for an op that passed it
        // before the seal, the returned old value) refuses the add.
        assert_eq!(seal_and_sum(&s), 3);
        assert!(
            !try_add(&s, &mode, 1),
            "a late add on a sealed shard must not count"
        );
        mode.store(MODE_ATOMIC, Ordering::Relaxed);
        assert!(!try_add(&s, &mode, 1));
        reset(&s);
        mode.store(0, Ordering::Relaxed);
        assert!(try_add(&s, &mode, 7));
        assert_eq!(seal_and_sum(&s), 7);
    }
}
