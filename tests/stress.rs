//! Concurrency: more threads than cores, millions of operations, with
//! switches, kills and revivals in the middle of the stream.
//!
//! Every test checks exact counts and exactly-once, never-early release.

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod common;

/// Workers per test: more than this machine's 2 cores, so threads are
/// preempted and migrate in the middle of operations.
const THREADS: usize = 8;
/// Operations (get + put pairs) per worker (scaled, as the round counts
/// below, by `PERCPU_REF_TEST_SCALE` in emulated guests: `common::scaled`).
fn ops() -> usize {
    common::scaled(1_000_000)
}

struct Counted {
    r: PercpuRef,
    releases: Arc<AtomicUsize>,
}

fn counted(
    backend: Backend,
    flags: InitFlags,
    on_release: impl Fn() + Send + Sync + 'static,
) -> Arc<Counted> {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        PercpuRef::with_backend(
            move |_| {
                on_release();
                releases.fetch_add(1, SeqCst);
            },
            flags,
            backend,
        )
        .expect("backend checked by the caller")
    };
    Arc::new(Counted { r, releases })
}

fn spawn_workers(
    n: usize,
    f: impl Fn(usize) + Send + Sync + 'static,
) -> Vec<thread::JoinHandle<()>> {
    let f = Arc::new(f);
    (0..n)
        .map(|i| {
            let f = f.clone();
            thread::spawn(move || f(i))
        })
        .collect()
}

fn join(handles: Vec<thread::JoinHandle<()>>) {
    for h in handles {
        h.join().expect("worker panicked");
    }
}

/// Counts worker iterations in coarse steps, so that the main thread acts
/// only once the streams are well under way.
struct Progress(AtomicUsize);

impl Progress {
    const STEP: usize = 1 << 12;

    fn new() -> Arc<Self> {
        Arc::new(Progress(AtomicUsize::new(0)))
    }

    fn tick(&self, k: usize) {
        if k % Self::STEP == Self::STEP - 1 {
            self.0.fetch_add(Self::STEP, SeqCst);
        }
    }

    fn wait_until(&self, n: usize) {
        while self.0.load(SeqCst) < n {
            thread::yield_now();
        }
    }

    /// What `now` reads once every worker finished `ops` iterations.
    fn total(ops: usize) -> usize {
        THREADS * (ops / Self::STEP) * Self::STEP
    }
}

/// Runs `op(k)` for `k = 0, 1, ...`: at least `min_ops` times, and then on
/// until `event` has been seen to hold at two checks in a row (checks come
/// every 256 operations). So, whatever the scheduler does, every worker runs
/// at least 256 operations after the event it waits for: a kill or a switch
/// lands in the middle of every stream by construction.
fn run_stream(min_ops: usize, event: impl Fn() -> bool, mut op: impl FnMut(usize)) {
    let mut seen = false;
    let mut k = 0;
    loop {
        op(k);
        k += 1;
        if k % 256 == 0 && k >= min_ops {
            let now = event();
            if seen && now {
                return;
            }
            seen = now;
        }
    }
}

/// Each worker ends holding `i % 4` extra references, taken with every form
/// of get, while a switcher flips the mode back and forth.
fn counts_stay_exact_across_switch_round_trips(backend: Backend) {
    let c = counted(backend, InitFlags::ALLOW_REINIT, || {});
    let stop = Arc::new(AtomicBool::new(false));
    let switches = Arc::new(AtomicUsize::new(0));
    let switcher = {
        let (c, stop, switches) = (c.clone(), stop.clone(), switches.clone());
        thread::spawn(move || {
            while !stop.load(SeqCst) {
                c.r.switch_to_atomic_sync();
                thread::yield_now();
                c.r.switch_to_percpu().unwrap();
                switches.fetch_add(1, SeqCst);
                thread::yield_now();
            }
        })
    };
    let workers = {
        let (c, switches) = (c.clone(), switches.clone());
        spawn_workers(THREADS, move |i| {
            let at_start = switches.load(SeqCst);
            // On until two round trips completed during this stream.
            let two_switches = || switches.load(SeqCst) >= at_start + 2;
            run_stream(ops(), two_switches, |k| match k % 4 {
                0 => {
                    c.r.get();
                    c.r.put();
                }
                1 => {
                    c.r.get_many(3);
                    c.r.put_many(3);
                }
                2 => {
                    assert!(c.r.tryget());
                    c.r.put();
                }
                _ => {
                    assert!(
                        c.r.tryget_live(),
                        "the ref is alive: tryget_live must succeed"
                    );
                    c.r.put();
                }
            });
            c.r.get_many(i % 4);
        })
    };
    join(workers);
    stop.store(true, SeqCst);
    switcher.join().unwrap();

    let extra: usize = (0..THREADS).map(|i| i % 4).sum();
    c.r.switch_to_atomic_sync();
    assert_eq!(
        c.r.atomic_count(),
        Some(1 + extra as u64),
        "lost or doubled references"
    );
    c.r.put_many(extra);
    assert_eq!(c.releases.load(SeqCst), 0);
    c.r.kill_sync().unwrap();
    assert_eq!(c.releases.load(SeqCst), 1);
    eprintln!(
        "{} switch round trips during the run",
        switches.load(SeqCst)
    );
}

/// Workers hold a reference while they get/put; the owner kills the ref in
/// the middle. Release must run once, after the last worker's final put.
fn kill_mid_stream_releases_once_after_the_last_put(backend: Backend) {
    let finished = Arc::new(AtomicUsize::new(0));
    let c = {
        let finished = finished.clone();
        counted(backend, InitFlags::empty(), move || {
            assert_eq!(
                finished.load(SeqCst),
                THREADS,
                "released before every worker was done"
            );
        })
    };
    let progress = Progress::new();
    c.r.get_many(THREADS); // one per worker, taken before the kill
    let workers = {
        let (c, finished, progress) = (c.clone(), finished.clone(), progress.clone());
        spawn_workers(THREADS, move |_| {
            run_stream(
                ops(),
                || c.r.is_dying(),
                |k| {
                    c.r.get();
                    c.r.put();
                    progress.tick(k);
                },
            );
            finished.fetch_add(1, SeqCst);
            c.r.put();
        })
    };
    progress.wait_until(Progress::total(ops()) / 4);
    c.r.kill_sync().unwrap();
    assert!(c.r.is_dying());
    join(workers);
    assert_eq!(c.releases.load(SeqCst), 1);
    assert!(c.r.is_zero());
}

/// tryget_live racing kill_and_confirm_sync: a tryget_live that starts after the
/// confirm was seen never succeeds; the ones that succeeded hold real
/// references (the final count is exact).
fn no_tryget_live_succeeds_after_confirm(backend: Backend) {
    let c = counted(backend, InitFlags::empty(), || {});
    let confirmed = Arc::new(AtomicBool::new(false));
    let late_successes = Arc::new(AtomicUsize::new(0));
    let progress = Progress::new();
    c.r.get_many(THREADS); // keeps the ref from releasing while they work
    let workers = {
        let (c, confirmed, late, progress) = (
            c.clone(),
            confirmed.clone(),
            late_successes.clone(),
            progress.clone(),
        );
        spawn_workers(THREADS, move |_| {
            run_stream(
                ops() / 4,
                || confirmed.load(SeqCst),
                |k| {
                    let seen = confirmed.load(SeqCst);
                    if c.r.tryget_live() {
                        if seen {
                            late.fetch_add(1, SeqCst);
                        }
                        c.r.put();
                    }
                    progress.tick(k);
                },
            );
            c.r.put();
        })
    };
    progress.wait_until(Progress::total(ops() / 4) / 4);
    let flag = confirmed.clone();
    c.r.kill_and_confirm_sync(move |_| flag.store(true, SeqCst))
        .unwrap();
    join(workers);
    assert_eq!(
        late_successes.load(SeqCst),
        0,
        "tryget_live succeeded after confirm"
    );
    assert_eq!(c.releases.load(SeqCst), 1);
}

/// Kill / resurrect cycles while workers hold references and get/put; the
/// ref never reaches zero until the very end, then releases once.
fn kill_and_resurrect_cycles_keep_the_count(backend: Backend) {
    let c = counted(backend, InitFlags::ALLOW_REINIT, || {});
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers = {
        let (c, start, cycles) = (c.clone(), start.clone(), cycles.clone());
        spawn_workers(THREADS, move |_| {
            c.r.get();
            start.wait();
            let at_start = cycles.load(SeqCst);
            // On until two kill/resurrect cycles completed during this stream.
            let two_cycles = || cycles.load(SeqCst) >= at_start + 2;
            run_stream(ops(), two_cycles, |k| {
                if k % 2 == 0 {
                    c.r.get();
                    c.r.put();
                } else {
                    assert!(
                        c.r.tryget(),
                        "count is never zero while we hold a reference"
                    );
                    c.r.put();
                }
            });
        })
    };
    start.wait();
    let controller = {
        let (c, stop, cycles) = (c.clone(), stop.clone(), cycles.clone());
        thread::spawn(move || {
            while !stop.load(SeqCst) {
                c.r.kill_sync().unwrap();
                c.r.resurrect().unwrap();
                cycles.fetch_add(1, SeqCst);
            }
        })
    };
    join(workers);
    stop.store(true, SeqCst);
    controller.join().unwrap();
    // Each kill put one base reference, each resurrect took one back.
    c.r.switch_to_atomic_sync();
    assert_eq!(c.r.atomic_count(), Some(1 + THREADS as u64));
    assert_eq!(c.releases.load(SeqCst), 0);
    c.r.put_many(THREADS);
    c.r.kill_sync().unwrap();
    assert_eq!(c.releases.load(SeqCst), 1);
    eprintln!("{} kill/resurrect cycles", cycles.load(SeqCst));
}

// ----- the final put, raced -------------------------------------------------
//
// The two tests below kill a fresh ref in every round, many rounds over, so
// that the moments that matter (the final put, the fold window) are hit
// thousands of times rather than once per test. Under Miri they run a few
// small rounds.

/// Rounds per test; each round kills one fresh ref.
fn rounds() -> usize {
    common::scaled(if cfg!(miri) { 2 } else { 2_000 })
}
/// Threads per round: more than the 2 cores, so they are preempted (and
/// migrate) between and inside operations.
const ROUND_THREADS: usize = if cfg!(miri) { 3 } else { THREADS };
/// References each holder takes in percpu mode before the round starts.
const HOLD: usize = if cfg!(miri) { 2 } else { 8 };
/// Get/put pairs, counted over all workers, before the kill of round `r`:
/// varies with the round, so the kill lands at different points of the
/// streams.
fn kill_after(round: usize) -> usize {
    if cfg!(miri) {
        4
    } else {
        (round % 16 + 1) * 256
    }
}
/// Pairs (or trygets) one worker makes before the kill at most; then it only
/// polls. Workers also yield every `BATCH` operations. Without both, eight
/// spinning workers on two (shared) cores can keep the killer off the CPU
/// for seconds per round.
const PAIRS_CAP: usize = if cfg!(miri) { 8 } else { 2048 };
const BATCH: usize = if cfg!(miri) { 1 } else { 16 };

/// A worker takes its `HOLD` references in percpu mode, records them, and
/// waits for the round to start.
fn hold_and_start(c: &Counted, round: &Round, start: &Barrier) {
    for _ in 0..HOLD {
        c.r.get();
    }
    round.held.fetch_add(HOLD, SeqCst);
    start.wait();
}

/// A worker's get/put pairs while `go()` holds: at most `PAIRS_CAP`, then it
/// only polls; counted into `pairs` every `BATCH`, with a yield. Returns the
/// pairs made.
fn churn_while(r: &PercpuRef, pairs: &AtomicUsize, go: impl Fn() -> bool) -> usize {
    let mut k = 0;
    while go() {
        if k == PAIRS_CAP {
            thread::yield_now();
            continue;
        }
        r.get();
        r.put();
        k += 1;
        if k % BATCH == 0 {
            pairs.fetch_add(BATCH, SeqCst);
            thread::yield_now();
        }
    }
    k
}

/// What one round saw, checked once every thread of the round has joined (a
/// failed check never leaves a thread waiting).
#[derive(Default)]
struct Round {
    /// Set by the kill's confirm.
    confirmed: AtomicBool,
    /// Set by release.
    released: AtomicBool,
    /// References the test knows to be held: raised after a get (or a
    /// successful tryget), lowered before the matching put. The count is
    /// exact if and only if release finds this at zero.
    held: AtomicUsize,
    /// The role (thread name) of the thread that ran release.
    released_by: Mutex<Option<String>>,
    /// Violations, from release and from the workers.
    errors: Mutex<Vec<String>>,
}

impl Round {
    /// Records a violation (the first few; a broken ref can make millions).
    fn fail(&self, msg: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 4 {
            errors.push(msg);
        }
    }

    /// The release callback: never before confirm, never while a reference
    /// is held, once.
    fn on_release(&self) {
        if !self.confirmed.load(SeqCst) {
            self.fail("released before confirm".into());
        }
        let held = self.held.load(SeqCst);
        if held != 0 {
            self.fail(format!("released with {held} references still held"));
        }
        if self.released.swap(true, SeqCst) {
            self.fail("released twice".into());
        }
        let role = thread::current().name().unwrap_or("").to_string();
        let role = if role == "holder" || role == "trygetter" || role == "worker" {
            role
        } else {
            "killer".to_string()
        };
        *self.released_by.lock().unwrap() = Some(role);
    }

    /// Release ran exactly once, and the ref stays released.
    fn check(&self, round: usize, c: &Counted, by_role: &mut BTreeMap<String, usize>) {
        let errors = self.errors.lock().unwrap();
        assert!(
            errors.is_empty(),
            "round {round}: violations (the first ones): {errors:?}"
        );
        assert_eq!(
            c.releases.load(SeqCst),
            1,
            "round {round}: release must run exactly once"
        );
        assert!(c.r.is_zero(), "round {round}: released but not zero");
        assert!(!c.r.tryget(), "round {round}: tryget after release");
        let role = self.released_by.lock().unwrap().clone().unwrap();
        *by_role.entry(role).or_default() += 1;
    }
}

/// A fresh ref for one round, whose release runs `round.on_release`.
fn round_ref(backend: Backend) -> (Arc<Round>, Arc<Counted>) {
    let round = Arc::new(Round::default());
    let c = {
        let round = round.clone();
        counted(backend, InitFlags::empty(), move || round.on_release())
    };
    (round, c)
}

fn spawn_named<'scope, 'env>(
    s: &'scope thread::Scope<'scope, 'env>,
    name: &str,
    f: impl FnOnce() + Send + 'scope,
) {
    thread::Builder::new()
        .name(name.into())
        .spawn_scoped(s, f)
        .expect("spawn");
}

/// `tryget` racing the final put. In each round, holders keep `HOLD`
/// references each (taken in percpu mode) and get/put around them until
/// the ref is killed, then drop them one by one; meanwhile trygetters
/// hammer `tryget` and put what they get, until they have seen release.
/// So the last put is sometimes a holder's, sometimes a trygetter's, and
/// trygets run into the count's zero crossing from both sides.
///
/// Checks: release runs exactly once per round, never before confirm and
/// never while a reference is held (a tryget that succeeded is counted
/// until its put: release exactly at true zero); after release every
/// tryget fails.
fn tryget_races_the_final_put(backend: Backend) {
    let holders = ROUND_THREADS / 2;
    let ops = AtomicUsize::new(0);
    let (late_hits, zero_misses) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut by_role = BTreeMap::new();
    for round_no in 0..rounds() {
        let (round, c) = round_ref(backend);
        let (round, c) = (&*round, &*c);
        let start = Barrier::new(ROUND_THREADS + 1);
        let (pairs, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        let (start, pairs, stop, ops) = (&start, &pairs, &stop, &ops);
        let (late_hits, zero_misses) = (&late_hits, &zero_misses);
        thread::scope(|s| {
            for _ in 0..holders {
                spawn_named(s, "holder", move || {
                    hold_and_start(c, round, start);
                    let k = churn_while(&c.r, pairs, || !c.r.is_dying());
                    for _ in 0..HOLD {
                        round.held.fetch_sub(1, SeqCst);
                        c.r.put();
                    }
                    ops.fetch_add(2 * k + HOLD, SeqCst);
                });
            }
            for _ in holders..ROUND_THREADS {
                spawn_named(s, "trygetter", move || {
                    start.wait();
                    let (mut k, mut tries_after_release) = (0, 0);
                    // Every tryget after release must fail: try a few.
                    while tries_after_release < 16 && !stop.load(SeqCst) {
                        let released = round.released.load(SeqCst);
                        tries_after_release += usize::from(released);
                        let dying = c.r.is_dying();
                        // Yield now and then, dying or not: trygetters that
                        // never pause can keep the count from ever reaching
                        // zero (each holds a reference most of the time).
                        if k % BATCH == 0 {
                            thread::yield_now();
                        }
                        if k >= PAIRS_CAP && !dying {
                            continue;
                        }
                        k += 1;
                        if c.r.tryget() {
                            round.held.fetch_add(1, SeqCst);
                            if released {
                                round.fail("a tryget succeeded after release".into());
                            }
                            if dying {
                                late_hits.fetch_add(1, SeqCst);
                                // Hold it a moment: the holders' last puts
                                // then often find a trygetter still holding,
                                // whose put becomes the final one.
                                for _ in 0..32 {
                                    std::hint::spin_loop();
                                }
                            }
                            round.held.fetch_sub(1, SeqCst);
                            c.r.put();
                        } else {
                            zero_misses.fetch_add(1, SeqCst);
                        }
                    }
                    ops.fetch_add(2 * k, SeqCst);
                });
            }
            start.wait();
            while pairs.load(SeqCst) < kill_after(round_no) {
                thread::yield_now();
            }
            c.r.kill_and_confirm_sync(|_| round.confirmed.store(true, SeqCst))
                .unwrap();
            // The trygetters stop once they have seen release; should it
            // never come (a lost put), stop them so the check can report it.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !round.released.load(SeqCst) {
                if Instant::now() > deadline {
                    stop.store(true, SeqCst);
                    break;
                }
                thread::yield_now();
            }
        });
        round.check(round_no, c, &mut by_role);
    }
    eprintln!(
        "{} rounds, {} operations; trygets that succeeded on a dying ref: {}, \
         that found the count at zero: {}; release ran on: {by_role:?}",
        rounds(),
        ops.load(SeqCst),
        late_hits.load(SeqCst),
        zero_misses.load(SeqCst)
    );
    common::report_counts();
}

/// Puts that land on the atomic counter while a kill folds. In each round,
/// workers hold `HOLD` references each, taken in percpu mode, and get/put
/// around them until they see the ref leave percpu mode; then they drop
/// them at once (a get/put pair and a final put each), so that their last
/// puts land on the atomic counter between the switch to atomic and the
/// fold of the per-CPU sum (the biased counter keeps them from reaching
/// zero there) or just after it.
///
/// Checks, every round: release runs exactly once, after confirm, only
/// when every reference was put (never while one is held), and the ref
/// stays released.
fn puts_land_while_a_kill_folds(backend: Backend) {
    let ops = AtomicUsize::new(0);
    let before_fold = AtomicUsize::new(0);
    let mut by_role = BTreeMap::new();
    for round_no in 0..rounds() {
        let (round, c) = round_ref(backend);
        let (round, c) = (&*round, &*c);
        let start = Barrier::new(ROUND_THREADS + 1);
        let pairs = AtomicUsize::new(0);
        let (start, pairs, ops, before_fold) = (&start, &pairs, &ops, &before_fold);
        thread::scope(|s| {
            for _ in 0..ROUND_THREADS {
                spawn_named(s, "worker", move || {
                    hold_and_start(c, round, start);
                    let k = churn_while(&c.r, pairs, || c.r.is_percpu());
                    for _ in 0..HOLD {
                        c.r.get();
                        c.r.put();
                        round.held.fetch_sub(1, SeqCst);
                        c.r.put();
                        // Atomic mode with the counter still biased: the
                        // kill has not folded the per-CPU sum in yet.
                        if c.r.atomic_count().is_none() {
                            before_fold.fetch_add(1, SeqCst);
                        }
                    }
                    ops.fetch_add(2 * k + 3 * HOLD, SeqCst);
                });
            }
            start.wait();
            while pairs.load(SeqCst) < kill_after(round_no) {
                thread::yield_now();
            }
            c.r.kill_and_confirm_sync(|_| round.confirmed.store(true, SeqCst))
                .unwrap();
        });
        round.check(round_no, c, &mut by_role);
    }
    eprintln!(
        "{} rounds, {} operations; final puts made before the fold: {} of {}; \
         release ran on: {by_role:?}",
        rounds(),
        ops.load(SeqCst),
        before_fold.load(SeqCst),
        rounds() * ROUND_THREADS * HOLD
    );
    common::report_counts();
}

std::thread_local! {
    /// Set by a release that ran on this thread (read by the trygetters).
    static RELEASED_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Trygets on a released ref racing its revival, in atomic mode, where
/// each operation is one unconditional add (src/atomic_mode.rs): a tryget
/// that lands on a released count fails, and its increment stays in the
/// counter until it gives it back; `reinit` keeps such increments (it
/// shifts the counter back to one reference), so when the owner then puts
/// its base reference, whichever lands last on zero, that put or a
/// tryget's give-back, runs the next release.
///
/// In each life the owner puts its base reference, waits for the release,
/// and revives the ref with `reinit`; trygetters hammer `tryget` (holding
/// what they get for a moment) throughout. Checks: one release per life,
/// never while a reference is held; a tryget that starts after a release
/// and ends before the next revival starts fails.
///
/// The count reaches zero only at a moment when no trygetter holds a
/// reference, which with every trygetter on a CPU of its own (an 8-vCPU
/// guest and more) may take long; so when no release came within
/// `PAUSE_AFTER`, the owner pauses the trygetters (each finishes what it
/// holds) and the release must then follow within 10 s.
fn trygets_race_reinit_in_atomic_mode(backend: Backend) {
    let lives = common::scaled(if cfg!(miri) { 4 } else { 20_000 });
    let trygetters = if cfg!(miri) { 2 } else { THREADS - 1 };
    let (releases, revivals) = (Arc::new(AtomicUsize::new(0)), AtomicUsize::new(0));
    // The owner's base reference counts as held from before each revival
    // until its put.
    let held = Arc::new(AtomicUsize::new(1));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let c = {
        let (releases, held, errors) = (releases.clone(), held.clone(), errors.clone());
        counted(backend, InitFlags::INIT_ATOMIC, move || {
            let h = held.load(SeqCst);
            if h != 0 {
                errors
                    .lock()
                    .unwrap()
                    .push(format!("released with {h} held"));
            }
            RELEASED_HERE.with(|r| r.set(true));
            releases.fetch_add(1, SeqCst);
        })
    };
    const PAUSE_AFTER: Duration = Duration::from_millis(50);
    let (stop, tries, hits) = (
        AtomicBool::new(false),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let (pause, paused_lives) = (AtomicBool::new(false), AtomicUsize::new(0));
    // Lives start once every trygetter runs (thread starts are slow in an
    // emulated guest, where the lives are few).
    let started = AtomicUsize::new(0);
    // Releases run by a trygetter's put, and by a failed tryget's give-back.
    let (by_put, by_give_back) = (AtomicUsize::new(0), AtomicUsize::new(0));
    thread::scope(|s| {
        for _ in 0..trygetters {
            spawn_named(s, "trygetter", || {
                let mut k = 0usize;
                started.fetch_add(1, SeqCst);
                while !stop.load(SeqCst) {
                    if pause.load(SeqCst) {
                        thread::yield_now();
                        continue;
                    }
                    let rev = revivals.load(SeqCst);
                    let released = releases.load(SeqCst) > rev;
                    RELEASED_HERE.with(|r| r.set(false));
                    let got = c.r.tryget();
                    if !got && RELEASED_HERE.with(Cell::get) {
                        by_give_back.fetch_add(1, SeqCst);
                    }
                    if got {
                        held.fetch_add(1, SeqCst);
                        if released && revivals.load(SeqCst) == rev {
                            errors.lock().unwrap().push(
                                "a tryget succeeded between a release and the next revival".into(),
                            );
                        }
                        hits.fetch_add(1, SeqCst);
                        for _ in 0..16 {
                            std::hint::spin_loop();
                        }
                        held.fetch_sub(1, SeqCst);
                        c.r.put();
                        if RELEASED_HERE.with(Cell::get) {
                            by_put.fetch_add(1, SeqCst);
                        }
                    }
                    k += 1;
                    if k.is_multiple_of(BATCH) {
                        tries.fetch_add(BATCH, SeqCst);
                        thread::yield_now();
                    }
                }
            });
        }
        while started.load(SeqCst) < trygetters {
            thread::yield_now();
        }
        'lives: for life in 0..lives {
            held.fetch_sub(1, SeqCst);
            c.r.put(); // the base reference
            let put_at = Instant::now();
            let mut paused_at = None;
            while releases.load(SeqCst) <= life {
                if paused_at.is_none() && put_at.elapsed() > PAUSE_AFTER {
                    pause.store(true, SeqCst);
                    paused_lives.fetch_add(1, SeqCst);
                    paused_at = Some(Instant::now());
                }
                if paused_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10)) {
                    errors.lock().unwrap().push(format!(
                        "life {life}: no release 10 s after the trygetters paused"
                    ));
                    break 'lives;
                }
                thread::yield_now();
            }
            pause.store(false, SeqCst);
            // Let trygets land on the released count (odd lives) or on the
            // revived one (even lives) before the next put.
            if life % 2 == 1 {
                thread::yield_now();
            }
            held.fetch_add(1, SeqCst);
            revivals.fetch_add(1, SeqCst);
            c.r.reinit().unwrap();
            if life % 2 == 0 {
                thread::yield_now();
            }
        }
        stop.store(true, SeqCst);
    });
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "violations (the first): {:?}",
        &errors[..errors.len().min(4)]
    );
    assert_eq!(c.releases.load(SeqCst), lives, "one release per life");
    assert_eq!(
        c.r.atomic_count(),
        Some(1),
        "the last life's base reference"
    );
    eprintln!(
        "{lives} lives, {} trygets ({} succeeded); releases run by a trygetter's put: \
         {}, by a failed tryget's give-back: {}; lives that paused the trygetters: {}",
        tries.load(SeqCst),
        hits.load(SeqCst),
        by_put.load(SeqCst),
        by_give_back.load(SeqCst),
        paused_lives.load(SeqCst)
    );
    common::report_counts();
}

/// Per-CPU storage is indexed by possible CPUs: a process confined to CPU 1
/// (as under `taskset -c 1`) counts exactly.
#[cfg(not(target_os = "linux"))]
fn exact_when_confined_to_cpu_1(_: Backend) {
    eprintln!("skipped: CPU affinity is Linux-only here");
}

#[cfg(target_os = "linux")]
fn exact_when_confined_to_cpu_1(backend: Backend) {
    if percpu_ref::possible_cpus() < 2 {
        eprintln!("skipped: one possible CPU");
        return;
    }
    // Children inherit the affinity of the thread that spawns them.
    let confined = thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data, zero is a valid empty set, and
        // sched_setaffinity(0, ...) affects only the calling thread.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(1, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        if !ok {
            eprintln!("skipped: cannot run on CPU 1");
            return;
        }
        let c = counted(backend, InitFlags::empty(), || {});
        let workers = {
            let c = c.clone();
            spawn_workers(THREADS, move |_| {
                // SAFETY: sched_getcpu has no preconditions.
                assert_eq!(unsafe { libc::sched_getcpu() }, 1);
                for _ in 0..ops() / 4 {
                    c.r.get();
                    c.r.put();
                }
                c.r.get();
            })
        };
        join(workers);
        c.r.kill_sync().unwrap();
        assert_eq!(c.r.atomic_count(), Some(THREADS as u64));
        c.r.put_many(THREADS);
        assert_eq!(c.releases.load(SeqCst), 1);
    });
    confined.join().unwrap();
}

/// Runs every scenario above on each backend this process can use.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod rseq {
            $(
                #[test]
                fn $name() {
                    if !super::Backend::Rseq.is_available() {
                        eprintln!("skipped: rseq backend not available here");
                        return;
                    }
                    super::$name(super::Backend::Rseq);
                }
            )*
        }
        mod sharded {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::Sharded);
                }
            )*
        }
    };
}

on_every_backend!(
    counts_stay_exact_across_switch_round_trips,
    kill_mid_stream_releases_once_after_the_last_put,
    no_tryget_live_succeeds_after_confirm,
    kill_and_resurrect_cycles_keep_the_count,
    exact_when_confined_to_cpu_1,
    tryget_races_the_final_put,
    puts_land_while_a_kill_folds,
    trygets_race_reinit_in_atomic_mode
);
