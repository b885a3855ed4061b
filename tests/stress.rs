//! Concurrency: more threads than cores, millions of operations, with
//! switches, kills and revivals in the middle of the stream.
//!
//! Every test checks exact counts and exactly-once, never-early release.

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;

/// Workers per test: more than this machine's 2 cores, so threads are
/// preempted and migrate in the middle of operations.
const THREADS: usize = 8;
/// Operations (get + put pairs) per worker.
const OPS: usize = 1_000_000;

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
                c.r.switch_to_atomic();
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
            run_stream(OPS, two_switches, |k| match k % 4 {
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
    c.r.switch_to_atomic();
    assert_eq!(
        c.r.atomic_count(),
        Some(1 + extra as u64),
        "lost or doubled references"
    );
    c.r.put_many(extra);
    assert_eq!(c.releases.load(SeqCst), 0);
    c.r.kill().unwrap();
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
                OPS,
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
    progress.wait_until(Progress::total(OPS) / 4);
    c.r.kill().unwrap();
    assert!(c.r.is_dying());
    join(workers);
    assert_eq!(c.releases.load(SeqCst), 1);
    assert!(c.r.is_zero());
}

/// tryget_live racing kill_and_confirm: a tryget_live that starts after the
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
                OPS / 4,
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
    progress.wait_until(Progress::total(OPS / 4) / 4);
    let flag = confirmed.clone();
    c.r.kill_and_confirm(move |_| flag.store(true, SeqCst))
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
            run_stream(OPS, two_cycles, |k| {
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
                c.r.kill().unwrap();
                c.r.resurrect().unwrap();
                cycles.fetch_add(1, SeqCst);
            }
        })
    };
    join(workers);
    stop.store(true, SeqCst);
    controller.join().unwrap();
    // Each kill put one base reference, each resurrect took one back.
    c.r.switch_to_atomic();
    assert_eq!(c.r.atomic_count(), Some(1 + THREADS as u64));
    assert_eq!(c.releases.load(SeqCst), 0);
    c.r.put_many(THREADS);
    c.r.kill().unwrap();
    assert_eq!(c.releases.load(SeqCst), 1);
    eprintln!("{} kill/resurrect cycles", cycles.load(SeqCst));
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
                for _ in 0..OPS / 4 {
                    c.r.get();
                    c.r.put();
                }
                c.r.get();
            })
        };
        join(workers);
        c.r.kill().unwrap();
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
    exact_when_confined_to_cpu_1
);
