//! Concurrency: more threads than cores, millions of operations, with
//! switches, kills and revivals in the middle of the stream.
//!
//! Every test checks exact counts and exactly-once, never-early release.

use percpu_ref::{InitFlags, PercpuRef};
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

fn counted(flags: InitFlags, on_release: impl Fn() + Send + Sync + 'static) -> Arc<Counted> {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        PercpuRef::with_flags(
            move |_| {
                on_release();
                releases.fetch_add(1, SeqCst);
            },
            flags,
        )
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

/// Each worker ends holding `i % 4` extra references, taken with every form
/// of get, while a switcher flips the mode back and forth.
#[test]
fn counts_stay_exact_across_switch_round_trips() {
    let c = counted(InitFlags::ALLOW_REINIT, || {});
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
        let c = c.clone();
        spawn_workers(THREADS, move |i| {
            for k in 0..OPS {
                match k % 4 {
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
                }
            }
            c.r.get_many(i % 4);
        })
    };
    join(workers);
    stop.store(true, SeqCst);
    switcher.join().unwrap();
    assert!(
        switches.load(SeqCst) > 0,
        "no switch happened during the run"
    );

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
#[test]
fn kill_mid_stream_releases_once_after_the_last_put() {
    let finished = Arc::new(AtomicUsize::new(0));
    let c = {
        let finished = finished.clone();
        counted(InitFlags::empty(), move || {
            assert_eq!(
                finished.load(SeqCst),
                THREADS,
                "released before every worker was done"
            );
        })
    };
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers = {
        let (c, start, finished) = (c.clone(), start.clone(), finished.clone());
        spawn_workers(THREADS, move |_| {
            c.r.get();
            start.wait();
            for _ in 0..OPS {
                c.r.get();
                c.r.put();
            }
            finished.fetch_add(1, SeqCst);
            c.r.put();
        })
    };
    start.wait();
    thread::sleep(std::time::Duration::from_millis(5));
    c.r.kill().unwrap();
    assert!(c.r.is_dying());
    join(workers);
    assert_eq!(c.releases.load(SeqCst), 1);
    assert!(c.r.is_zero());
}

/// tryget_live racing kill_and_confirm: a tryget_live that starts after the
/// confirm was seen never succeeds; the ones that succeeded hold real
/// references (the final count is exact).
#[test]
fn no_tryget_live_succeeds_after_confirm() {
    let c = counted(InitFlags::empty(), || {});
    let confirmed = Arc::new(AtomicBool::new(false));
    let late_successes = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers = {
        let (c, confirmed, late, start) = (
            c.clone(),
            confirmed.clone(),
            late_successes.clone(),
            start.clone(),
        );
        spawn_workers(THREADS, move |_| {
            c.r.get(); // keep the ref from releasing while we work
            start.wait();
            for _ in 0..OPS / 4 {
                let seen = confirmed.load(SeqCst);
                if c.r.tryget_live() {
                    if seen {
                        late.fetch_add(1, SeqCst);
                    }
                    c.r.put();
                }
            }
            c.r.put();
        })
    };
    start.wait();
    thread::sleep(std::time::Duration::from_millis(5));
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
#[test]
fn kill_and_resurrect_cycles_keep_the_count() {
    let c = counted(InitFlags::ALLOW_REINIT, || {});
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers = {
        let (c, start) = (c.clone(), start.clone());
        spawn_workers(THREADS, move |_| {
            c.r.get();
            start.wait();
            for k in 0..OPS {
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
            }
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
    assert!(cycles.load(SeqCst) > 0);
    eprintln!("{} kill/resurrect cycles", cycles.load(SeqCst));
}

/// Per-CPU storage is indexed by possible CPUs: a process confined to CPU 1
/// (as under `taskset -c 1`) counts exactly.
#[cfg(target_os = "linux")]
#[test]
fn exact_when_confined_to_cpu_1() {
    if percpu_ref::possible_cpus() < 2 {
        eprintln!("skipped: one possible CPU");
        return;
    }
    // Children inherit the affinity of the thread that spawns them.
    let confined = thread::spawn(|| {
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
        let c = counted(InitFlags::empty(), || {});
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
