//! Throughput rows: create + get + put + drop per second, and the targets
//! each row is checked against.

use crate::RSS_SLACK;
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What a throughput row loops on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// create + get + put + drop of a `PercpuRef` on this backend.
    Percpu(Backend),
    /// `Arc<u64>` new + clone + drop.
    Arc,
}

impl Subject {
    pub(crate) fn name(self) -> String {
        match self {
            Subject::Percpu(b) => b.name().to_string(),
            Subject::Arc => "Arc<u64>".to_string(),
        }
    }
}

/// Operations between two reads of the stop flag: a relaxed load per loop
/// would be noise, and 64 loops overshoot the stop by microseconds.
pub(crate) const BATCH: u64 = 64;

pub(crate) fn churn_percpu(backend: Backend, stop: &AtomicBool) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..BATCH {
            let r = PercpuRef::with_backend(|_| {}, InitFlags::empty(), backend)
                .expect("backend checked available");
            black_box(&r).get();
            black_box(&r).put();
            drop(r);
        }
        n += BATCH;
    }
    n
}

pub(crate) fn churn_arc(stop: &AtomicBool) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..BATCH {
            // black_box lets the pointer escape, so the allocation stays.
            let a = Arc::new(black_box(i));
            let c = Arc::clone(black_box(&a));
            drop(black_box(c));
            drop(a);
        }
        n += BATCH;
    }
    n
}

/// One timed run: operations per second of all `threads` together.
pub(crate) fn timed_run(subject: Subject, threads: usize, duration: Duration) -> f64 {
    let stop = AtomicBool::new(false);
    // The main thread joins the barrier too, so the clock starts when every
    // worker is ready rather than while the last ones are being spawned.
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    match subject {
                        Subject::Percpu(b) => churn_percpu(b, &stop),
                        Subject::Arc => churn_arc(&stop),
                    }
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .sum();
        ops as f64 / t0.elapsed().as_secs_f64()
    })
}

/// Median, min and max of the runs of one cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stats {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Stats {
    pub(crate) fn of(runs: &[f64]) -> Option<Stats> {
        Some(Stats {
            median: median(runs)?,
            min: runs.iter().copied().reduce(f64::min)?,
            max: runs.iter().copied().reduce(f64::max)?,
        })
    }
}

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// One throughput row; `all` is `None` when all threads is one thread.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TputRow {
    pub(crate) subject: Subject,
    pub(crate) one: Stats,
    pub(crate) all: Option<Stats>,
}

// ----- targets ---------------------------------------------------------------

/// `a / b`, where it means something.
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

pub(crate) fn at_most(value: Option<f64>, limit: f64) -> Option<bool> {
    value.map(|v| v <= limit)
}

pub(crate) fn at_least(value: Option<f64>, limit: f64) -> Option<bool> {
    value.map(|v| v >= limit)
}

pub(crate) fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "n/a",
    }
}

/// Counter storage per ref that the target allows: 8 B per possible CPU.
pub(crate) fn counter_target(cpus: usize) -> usize {
    8 * cpus
}

/// RSS growth per ref, object included, that the target allows.
pub(crate) fn rss_target(cpus: usize) -> usize {
    counter_target(cpus) + RSS_SLACK
}
