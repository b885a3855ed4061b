//! The fast path: a get+put pair on one shared object, and how long a kill
//! takes.
//!
//! Compared, at 1 and 2 threads on the *same* object:
//! - `percpu_rseq`: `PercpuRef` on the rseq backend (Linux x86_64);
//! - `percpu_sharded`: `PercpuRef` on the portable sealed-shard backend;
//! - `atomic_pair`: `AtomicUsize::fetch_add` + `fetch_sub` (what a plain
//!   shared refcount costs);
//! - `arc_clone_drop`: `Arc::clone` + drop.
//!
//! One criterion iteration is one pair *per thread*, so with perfect scaling
//! the time per iteration stays flat from 1 to 2 threads.
//!
//! `kill_latency`: `kill_sync()` until the switch to atomic mode is complete
//! (grace period, fold, confirm), while another thread on the other CPU
//! does get/put on the same ref; the ref is resurrected between samples.
//!
//! After criterion, a summary measured the same way prints the ratios that
//! docs/performance.md quotes (set `PERCPU_REF_SUMMARY_MS` to change its
//! length, 0 to skip). Run: `cargo bench --bench fast_path --
//! --warm-up-time 0.3 --measurement-time 1`.

#[path = "common/affinity.rs"]
mod affinity;

use criterion::{BenchmarkId, Criterion, Throughput};
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

trait Pair: Sync {
    fn pair(&self);
}

struct Percpu(PercpuRef);
impl Pair for Percpu {
    #[inline(always)]
    fn pair(&self) {
        self.0.get();
        self.0.put();
    }
}

struct AtomicPair(AtomicUsize);
impl Pair for AtomicPair {
    #[inline(always)]
    fn pair(&self) {
        // As Arc: relaxed increment, release decrement.
        self.0.fetch_add(1, Ordering::Relaxed);
        self.0.fetch_sub(1, Ordering::Release);
    }
}

struct ArcPair(Arc<u64>);
impl Pair for ArcPair {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(Arc::clone(&self.0)));
    }
}

/// Pins the calling thread; a failure (CPU not allowed) leaves it floating.
fn pin_to(cpu: usize) {
    let _ = affinity::pin_to(cpu);
}

/// `threads` threads each do `iters` pairs on `obj`; returns the slowest
/// thread's time, measured from a common start.
fn run<P: Pair>(obj: &P, threads: usize, iters: u64) -> Duration {
    let cpus: Vec<usize> = (0..threads).collect();
    affinity::run_pinned(threads, &cpus, || {
        for _ in 0..iters {
            black_box(obj).pair();
        }
    })
}

fn percpu(backend: Backend) -> Option<Percpu> {
    PercpuRef::with_backend(|_| {}, InitFlags::empty(), backend)
        .ok()
        .map(Percpu)
}

fn bench_pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("get_put_pair");
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64));
        if let Some(p) = percpu(Backend::Rseq) {
            g.bench_function(BenchmarkId::new("percpu_rseq", threads), |b| {
                b.iter_custom(|n| run(&p, threads, n))
            });
        }
        let p = percpu(Backend::Sharded).unwrap();
        g.bench_function(BenchmarkId::new("percpu_sharded", threads), |b| {
            b.iter_custom(|n| run(&p, threads, n))
        });
        let a = AtomicPair(AtomicUsize::new(1));
        g.bench_function(BenchmarkId::new("atomic_pair", threads), |b| {
            b.iter_custom(|n| run(&a, threads, n))
        });
        let arc = ArcPair(Arc::new(0));
        g.bench_function(BenchmarkId::new("arc_clone_drop", threads), |b| {
            b.iter_custom(|n| run(&arc, threads, n))
        });
    }
    g.finish();
}

/// Times `iters` kills of a ref that a thread pinned to the other CPU keeps
/// using; returns the total time spent inside `kill`.
fn kill_loop(backend: Backend, iters: u64) -> Duration {
    let r = PercpuRef::with_backend(|_| {}, InitFlags::ALLOW_REINIT, backend).unwrap();
    let stop = AtomicBool::new(false);
    let busy_cpu = usize::from(percpu_ref::possible_cpus() > 1);
    // The busy thread's own reference, taken before any kill, so that no
    // kill can release the ref (taken inside the thread, it could come
    // after a kill on a loaded machine).
    r.get();
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_to(busy_cpu);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    r.get();
                    r.put();
                }
            }
            r.put();
        });
        let killer = s.spawn(|| {
            pin_to(0);
            // Let the busy thread start spinning.
            std::thread::sleep(Duration::from_millis(2));
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                r.kill_sync().unwrap();
                total += t0.elapsed();
                r.resurrect().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            total
        });
        killer.join().unwrap()
    })
}

fn bench_kill(c: &mut Criterion) {
    let mut g = c.benchmark_group("kill_latency");
    for backend in [Backend::Rseq, Backend::Sharded] {
        if backend.is_available() {
            g.bench_function(backend.name(), |b| b.iter_custom(|n| kill_loop(backend, n)));
        }
    }
    g.finish();
}

/// Nanoseconds per pair per thread: the best of 5 runs of `pairs` pairs.
fn ns_per_pair<P: Pair>(obj: &P, threads: usize, pairs: u64) -> f64 {
    (0..5)
        .map(|_| run(obj, threads, pairs).as_secs_f64() * 1e9 / pairs as f64)
        .fold(f64::INFINITY, f64::min)
}

fn summary() {
    let ms: u64 = std::env::var("PERCPU_REF_SUMMARY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    if ms == 0 {
        return;
    }
    // Calibrate the pair count on the atomic pair (~ms/5 per run).
    let a = AtomicPair(AtomicUsize::new(1));
    let probe = ns_per_pair(&a, 1, 100_000);
    let pairs = ((ms as f64 * 1e6 / 5.0) / probe).max(10_000.0) as u64;
    println!("\nsummary ({pairs} pairs per thread per run, best of 5; ns per pair per thread):");
    println!(
        "{:<16} {:>10} {:>10} {:>14}",
        "", "1 thread", "2 threads", "2T/1T thrpt"
    );
    let mut rows = Vec::new();
    let mut row = |name: &str, one: f64, two: f64| {
        println!(
            "{name:<16} {one:>10.2} {two:>10.2} {:>14.2}",
            2.0 * one / two
        );
        rows.push((name.to_string(), one, two));
    };
    if let Some(p) = percpu(Backend::Rseq) {
        row(
            "percpu_rseq",
            ns_per_pair(&p, 1, pairs),
            ns_per_pair(&p, 2, pairs),
        );
    }
    let p = percpu(Backend::Sharded).unwrap();
    row(
        "percpu_sharded",
        ns_per_pair(&p, 1, pairs),
        ns_per_pair(&p, 2, pairs),
    );
    row(
        "atomic_pair",
        ns_per_pair(&a, 1, pairs),
        ns_per_pair(&a, 2, pairs),
    );
    let arc = ArcPair(Arc::new(0));
    row(
        "arc_clone_drop",
        ns_per_pair(&arc, 1, pairs),
        ns_per_pair(&arc, 2, pairs),
    );
    let get = |n: &str| rows.iter().find(|r| r.0 == n).map(|r| (r.1, r.2));
    let atomic = get("atomic_pair").unwrap();
    for name in ["percpu_rseq", "percpu_sharded"] {
        if let Some((one, two)) = get(name) {
            println!(
                "{name}: {:.1}x the atomic pair on 1 thread (target >= 3), {:.1}x on 2 threads \
                 (target >= 25), 2-thread/1-thread throughput {:.2} (target >= 1.9)",
                atomic.0 / one,
                atomic.1 / two,
                2.0 * one / two
            );
        }
    }
    for backend in [Backend::Rseq, Backend::Sharded] {
        if backend.is_available() {
            let mut samples: Vec<f64> = (0..200)
                .map(|_| kill_loop(backend, 10).as_secs_f64() * 1e6 / 10.0)
                .collect();
            samples.sort_by(f64::total_cmp);
            println!(
                "kill latency ({}, other CPU busy on the same ref): median {:.2} us, p90 {:.2} us \
                 (target <= 10 us)",
                backend,
                samples[samples.len() / 2],
                samples[samples.len() * 9 / 10]
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench_pairs(&mut c);
    bench_kill(&mut c);
    c.final_summary();
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--test" || a == "--list") {
        summary();
    }
}
