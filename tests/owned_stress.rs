//! Stress tests of the owned layer: more threads than cores cloning,
//! dropping and looking up references while another thread freezes and
//! unfreezes, or while objects are killed and replaced in a lookup table.
//!
//! Every value carries a checksum over its payload. A freeze that let a
//! reader in would show a torn value (the freezer rewrites the payload
//! word by word), and a `T` dropped while referenced shows the poison its
//! `Drop` writes. Drops are counted: each `T` must be dropped exactly once.

use percpu_ref::owned::{Owner, Ref, Weak};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::Duration;

mod common;

/// More threads than cores; Miri runs a few (it is ~10^4 times slower).
const THREADS: usize = if cfg!(miri) { 3 } else { 16 };
const WORDS: usize = 8;
const POISON: u64 = 0xdead_dead_dead_dead;

/// Ops per worker thread: ~10^6 in total in release, less in debug (and
/// in emulated guests: `PERCPU_REF_TEST_SCALE`, set by `scripts/vm-test`,
/// scales this and the event and kill counts below).
fn ops_per_thread() -> usize {
    common::scaled(if cfg!(miri) {
        150
    } else if cfg!(debug_assertions) {
        5_000
    } else {
        100_000
    })
}

/// Freezes (or kills) the background thread must complete while the
/// workers run: workers keep going until it has.
fn min_events() -> usize {
    common::scaled(if cfg!(miri) {
        3
    } else if cfg!(debug_assertions) {
        100
    } else {
        300
    })
}

struct Value {
    /// Atomics so the freezer's word-by-word rewrite is observable (not UB)
    /// if the exclusion were broken.
    words: [AtomicU64; WORDS],
    sum: AtomicU64,
    drops: Arc<AtomicUsize>,
}

impl Value {
    fn new(seed: u64, drops: Arc<AtomicUsize>) -> Value {
        let v = Value {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
            drops,
        };
        v.rewrite(seed);
        v
    }

    fn checksum(words: &[u64; WORDS]) -> u64 {
        words.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, w| {
            (h ^ w).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// Rewrites every word, one at a time (a reader in the middle sees a
    /// mismatch).
    fn rewrite(&self, seed: u64) {
        let mut words = [0u64; WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = seed.wrapping_mul(31).wrapping_add(i as u64);
            self.words[i].store(*w, Ordering::Relaxed);
            std::hint::spin_loop();
        }
        self.sum.store(Self::checksum(&words), Ordering::Relaxed);
    }

    /// Checks the value is whole and not dropped; returns its seed.
    fn check(&self) -> u64 {
        let sum = self.sum.load(Ordering::Relaxed);
        assert_ne!(sum, POISON, "a referenced value was dropped");
        let words: [u64; WORDS] = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        assert_eq!(Self::checksum(&words), sum, "torn value: {words:x?}");
        words[0] / 31
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        self.check();
        self.sum.store(POISON, Ordering::Relaxed);
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// 16 workers clone, drop and look up references while one thread freezes,
/// rewrites and unfreezes in a loop (alternating blocking freezes and
/// freezes with a timeout that may be undone).
#[test]
fn freeze_unfreeze_under_sixteen_threads() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut owner = Owner::new(Value::new(1, drops.clone()));
    let weak = owner.downgrade();
    let stop = Arc::new(AtomicBool::new(false));
    let events = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let weak: Weak<Value> = weak.clone();
            let start = start.clone();
            let events = events.clone();
            std::thread::spawn(move || {
                start.wait();
                let (mut got, mut missed) = (0usize, 0usize);
                let mut held: Vec<Ref<Value>> = Vec::new();
                let mut backing_off = false;
                let mut i = 0;
                while i < ops_per_thread() || events.load(Ordering::Relaxed) < min_events() {
                    i += 1;
                    // `tryget` also succeeds while a freeze drains, so 16
                    // threads calling it back to back could starve the
                    // freezer: after a refused lookup, use only
                    // `tryget_live` until one succeeds, and never hold a
                    // `tryget` reference.
                    let live = i % 2 == 0 || backing_off;
                    let r = if live {
                        weak.tryget_live()
                    } else {
                        weak.tryget()
                    };
                    match r {
                        Some(r) => {
                            got += 1;
                            backing_off = false;
                            let seed = r.check();
                            let c = r.clone();
                            assert_eq!(c.check(), seed, "a clone saw another value");
                            if live && (i + t) % 64 == 0 {
                                held.push(c); // hold a few for a while
                            }
                        }
                        None => {
                            // A freeze is in progress: let go, as a user of a
                            // frozen queue would.
                            missed += 1;
                            backing_off = true;
                            held.clear();
                        }
                    }
                    if held.len() > 4 {
                        held.remove(0);
                    }
                }
                drop(held);
                (got, missed)
            })
        })
        .collect();
    let freezer = {
        let stop = stop.clone();
        let events = events.clone();
        start.wait();
        std::thread::spawn(move || {
            let (mut frozen, mut undone, mut seed) = (0usize, 0usize, 1u64);
            while !stop.load(Ordering::Relaxed) {
                seed += 1;
                if seed.is_multiple_of(2) {
                    owner.freeze().rewrite(seed);
                    frozen += 1;
                } else {
                    match owner.freeze_timeout(Duration::from_micros(50)) {
                        Ok(f) => {
                            f.rewrite(seed);
                            frozen += 1;
                        }
                        Err(_) => undone += 1,
                    }
                }
                owner.check();
                events.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            (owner, frozen, undone)
        })
    };
    let (mut got, mut missed) = (0, 0);
    for w in workers {
        let (g, m) = w.join().unwrap();
        got += g;
        missed += m;
    }
    stop.store(true, Ordering::Relaxed);
    let (owner, frozen, undone) = freezer.join().unwrap();
    println!(
        "freeze stress: {THREADS} threads, {got} refs got, {missed} lookups refused, \
         {frozen} freezes, {undone} freezes undone"
    );
    assert!(frozen + undone >= min_events(), "the freezer did not run");
    assert!(frozen > 0, "the freezer never froze");
    assert!(got > 0, "no lookup ever succeeded");
    assert_eq!(drops.load(Ordering::SeqCst), 0, "T dropped while owned");
    let value = owner.kill().wait();
    value.check();
    drop(value);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert!(weak.tryget().is_none());
    // The engine woke `wait` from inside its release and may still be
    // finishing the batch: under Miri, flush joins its thread, which must
    // have ended when `main` returns.
    percpu_ref::flush();
}

/// A lookup table whose objects are killed and replaced while 16 workers
/// look them up with `tryget_live`, clone and drop the references; half the
/// kills wait for the value, half just drop the owner. Every value is
/// dropped exactly once, never while referenced.
#[test]
fn lookup_table_churn_under_sixteen_threads() {
    const SLOTS: usize = 4;
    let drops = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicUsize::new(0));
    let new_value = {
        let (created, drops) = (created.clone(), drops.clone());
        move |seed: u64| {
            created.fetch_add(1, Ordering::SeqCst);
            Value::new(seed, drops.clone())
        }
    };
    let mut owners: Vec<Owner<Value>> = (0..SLOTS as u64)
        .map(|s| Owner::new(new_value(s)))
        .collect();
    let table: Arc<RwLock<Vec<Weak<Value>>>> =
        Arc::new(RwLock::new(owners.iter().map(Owner::downgrade).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let events = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = table.clone();
            let events = events.clone();
            std::thread::spawn(move || {
                let mut got = 0usize;
                let mut i = 0;
                while i < ops_per_thread() || events.load(Ordering::Relaxed) < min_events() {
                    i += 1;
                    let slot = (i + t) % SLOTS;
                    let r = table.read().unwrap()[slot].tryget_live();
                    if let Some(r) = r {
                        got += 1;
                        let seed = r.check();
                        let clones: Vec<_> = (0..3).map(|_| r.clone()).collect();
                        for c in &clones {
                            assert_eq!(c.check(), seed);
                        }
                    }
                }
                got
            })
        })
        .collect();
    let churner = {
        let stop = stop.clone();
        let table = table.clone();
        let events = events.clone();
        std::thread::spawn(move || {
            let mut seed = SLOTS as u64;
            let mut kills = 0usize;
            while !stop.load(Ordering::Relaxed) {
                seed += 1;
                let slot = seed as usize % SLOTS;
                let fresh = Owner::new(new_value(seed));
                table.write().unwrap()[slot] = fresh.downgrade();
                let old = std::mem::replace(&mut owners[slot], fresh);
                if seed.is_multiple_of(2) {
                    old.kill().wait().check();
                } else {
                    drop(old); // the last reference drops T
                }
                kills += 1;
                events.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            (owners, kills)
        })
    };
    let got: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let (owners, kills) = churner.join().unwrap();
    println!(
        "table churn: {THREADS} threads, {got} lookups hit, {kills} objects killed and replaced"
    );
    assert!(kills >= min_events() && got > 0);
    drop(owners);
    drop(table);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        created.load(Ordering::SeqCst),
        "every value dropped exactly once"
    );
    // As in the freeze test: under Miri, joins the engine thread.
    percpu_ref::flush();
}

/// Several threads kill and drop owners while others look the objects up
/// with `Weak::tryget_live`, hold the `Ref`s a while and drop them: the
/// kills are deferred (the grace-period engine completes them and may make
/// the last put), so `T` may be released by a reader, by the engine (then
/// taken by the `Killed`), or by the `Killed`'s drop. Each `T` is dropped
/// exactly once and never while referenced (its `check` would see the
/// poison), and after `flush` every object was released.
///
/// Caught with `--cfg percpu_ref_mutant="owned_release_ignores_claim"`
/// (release drops a claimed `T`: the `Killed` then takes or drops it a
/// second time).
#[test]
fn deferred_kills_race_lookups_and_ref_drops() {
    const KILLERS: usize = 3;
    const SLOTS: usize = 8;
    let per_killer = common::scaled(if cfg!(miri) { 6 } else { 2_000 });
    // Under Miri THREADS is 3, as many as the killers: keep two readers.
    let readers = if cfg!(miri) { 2 } else { THREADS - KILLERS };
    let drops = Arc::new(AtomicUsize::new(0));
    let table: Arc<RwLock<Vec<Weak<Value>>>> =
        Arc::new(RwLock::new((0..SLOTS).map(|_| Weak::new()).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let killers: Vec<_> = (0..KILLERS)
        .map(|k| {
            let (table, drops) = (table.clone(), drops.clone());
            std::thread::spawn(move || {
                let mut taken = 0usize;
                for i in 0..per_killer {
                    let seed = (k * per_killer + i) as u64;
                    let owner = Owner::new(Value::new(seed, drops.clone()));
                    table.write().unwrap()[(k + i * KILLERS) % SLOTS] = owner.downgrade();
                    std::thread::yield_now();
                    // Three ends: take `T` back (waits for the engine and
                    // the readers), drop the `Killed` at once (it waits for
                    // the engine, then leaves `T` to the last reader), or
                    // drop the `Owner` (a synchronous kill: `Value` has drop
                    // glue).
                    match i % 3 {
                        0 => {
                            // Bounded: a release that forgets the claim (or
                            // never runs) fails here instead of hanging.
                            let value = owner
                                .kill()
                                .wait_timeout(Duration::from_secs(60))
                                .unwrap_or_else(|_| {
                                    panic!(
                                        "Killed::wait_timeout(60 s): object {seed} never released"
                                    )
                                });
                            assert_eq!(value.check(), seed);
                            taken += 1;
                        }
                        1 => drop(owner.kill()),
                        _ => drop(owner),
                    }
                }
                taken
            })
        })
        .collect();
    let workers: Vec<_> = (0..readers)
        .map(|t| {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held: Vec<Ref<Value>> = Vec::new();
                let mut got = 0usize;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let r = table.read().unwrap()[i % SLOTS].tryget_live();
                    if let Some(r) = r {
                        got += 1;
                        r.check();
                        held.push(r);
                    }
                    if held.len() > 4 || i % 7 == 0 {
                        // Oldest first: the last reference of a killed object.
                        if !held.is_empty() {
                            let r = held.remove(0);
                            r.check();
                        }
                    }
                }
                got
            })
        })
        .collect();
    let taken: usize = killers.into_iter().map(|k| k.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let got: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    percpu_ref::flush();
    let table = table.read().unwrap();
    assert!(
        table.iter().all(|w| w.tryget().is_none()),
        "an object was not released"
    );
    let made = KILLERS * per_killer;
    assert_eq!(
        drops.load(Ordering::SeqCst),
        made,
        "each T dropped exactly once"
    );
    assert_eq!(
        taken,
        KILLERS * per_killer.div_ceil(3),
        "every wait returned T"
    );
    assert!(got > 0, "the readers never found a live object");
    common::report_counts();
}
