//! What managed refs cost (`PercpuRef::switch_to_managed`), in one run:
//! `cargo run --release -p percpu-ref-tools --bin managed_costs [-- --help]`.
//!
//! Three measurements, each repeated `--reps` times (interleaved where
//! two rows compare), medians shown:
//!
//! - **release delay**: a managed ref's last put, on an otherwise idle
//!   process, to its `release` on the engine thread, with nothing calling
//!   `flush`: `--delays` refs one at a time; the median, p99 and largest
//!   delay of each rep, and the engine's grace periods per release.
//! - **idle refs**: `--refs` managed refs, each got and put once (so each
//!   was scanned once) and then left alone with its base reference held:
//!   the process's CPU time (user + system, `getrusage`) over `--idle-ms`
//!   of sleep, as a share of one core, and the grace periods meanwhile.
//!   The engine's work follows the refs put since its last look, so idle
//!   refs should cost it nothing.
//! - **hot ref**: one thread per allowed CPU (pinned) does get + put pairs
//!   on one shared ref for `--hot-ms`, managed against unmanaged, rows
//!   interleaved: the managed ref's pairs per second over the unmanaged
//!   one's (the marks a busy managed ref pays once per engine round), and
//!   the engine's grace periods per second while it runs.
//!
//! **Limits.** The engine scans only on the rseq backend; on the sharded
//! backend a managed ref is kept in atomic mode and the rows measure that.
//! Times are as noisy as the machine (`--counts-only` prints counts alone,
//! for emulated guests).

#[path = "../../../benches/common/affinity.rs"]
mod affinity;
#[path = "../common/costs.rs"]
mod costs;
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use costs::{cpu_time, median, percentile};
use percpu_ref::percpu::grace_periods;
use percpu_ref::{backend, flush, PercpuRef};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// managed_costs: a managed ref's release delay, the engine's cost for
/// idle managed refs, and a hot managed ref against an unmanaged one.
#[derive(Parser, Debug)]
#[command(
    name = "managed_costs",
    verbatim_doc_comment,
    override_usage = "cargo run --release -p percpu-ref-tools --bin managed_costs -- [OPTIONS]",
    after_help = "Exit status 2 means a bad option."
)]
struct Args {
    /// Refs released one at a time per rep, for the delay
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    delays: usize,

    /// Idle managed refs
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    refs: usize,

    /// Milliseconds of idle time over which their CPU cost is read
    #[arg(long, value_name = "MS", default_value_t = 3_000,
          value_parser = RangedU64ValueParser::<u64>::new().range(10..=600_000))]
    idle_ms: u64,

    /// Milliseconds of each hot-ref row
    #[arg(long, value_name = "MS", default_value_t = 500,
          value_parser = RangedU64ValueParser::<u64>::new().range(10..=600_000))]
    hot_ms: u64,

    /// Repetitions; medians are shown
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    reps: usize,

    /// Counts only, no times (for emulated guests): every release checked,
    /// the grace periods counted
    #[arg(long)]
    counts_only: bool,
}

/// A managed ref whose release records when it ran (nanoseconds after
/// `epoch`, plus one, in `at`).
fn timed_ref(epoch: Instant, at: &Arc<AtomicU64>) -> Pin<Box<PercpuRef>> {
    let at = at.clone();
    let r = Box::pin(PercpuRef::new(move |_| {
        let ns = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        assert_eq!(at.swap(ns + 1, SeqCst), 0, "released twice");
    }));
    r.as_ref().switch_to_managed().expect("a fresh ref");
    r
}

/// One rep of the release delay: delays in milliseconds, and the grace
/// periods they took.
fn release_delays(n: usize) -> (Vec<f64>, u64) {
    let epoch = Instant::now();
    let gp0 = grace_periods();
    let mut delays = Vec::with_capacity(n);
    for _ in 0..n {
        let at = Arc::new(AtomicU64::new(0));
        let r = timed_ref(epoch, &at);
        // Idle: the engine has nothing of this ref yet.
        std::thread::sleep(Duration::from_micros(200));
        let t0 = epoch.elapsed();
        r.put();
        let limit = Instant::now() + Duration::from_secs(10);
        while at.load(SeqCst) == 0 {
            assert!(
                Instant::now() < limit,
                "a managed ref not released 10 s after its last put"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        let done = Duration::from_nanos(at.load(SeqCst) - 1);
        delays.push((done.saturating_sub(t0)).as_secs_f64() * 1e3);
    }
    (delays, grace_periods() - gp0)
}

/// One rep of the idle cost: CPU share of one core (`None` where it is
/// not read), and grace periods, over `idle` with `n` idle managed refs.
fn idle_cost(n: usize, idle: Duration) -> (Option<f64>, u64) {
    // Until the kills below, no release may run: each base is held.
    let killing = Arc::new(AtomicBool::new(false));
    let refs: Vec<Pin<Box<PercpuRef>>> = (0..n)
        .map(|_| {
            let killing = killing.clone();
            let r = Box::pin(PercpuRef::new(move |_| {
                assert!(killing.load(SeqCst), "an idle managed ref was released");
            }));
            r.as_ref().switch_to_managed().expect("a fresh ref");
            r.get();
            r.put();
            r
        })
        .collect();
    // Every ref scanned once and idle again.
    flush();
    std::thread::sleep(Duration::from_millis(50));
    let (c0, g0) = (cpu_time(), grace_periods());
    std::thread::sleep(idle);
    let (c1, g1) = (cpu_time(), grace_periods());
    for r in &refs {
        assert!(r.is_managed() || r.backend() != percpu_ref::Backend::Rseq);
    }
    // Kill them (the kill takes over): each released once, as any ref.
    killing.store(true, SeqCst);
    for r in &refs {
        r.kill_sync().expect("alive");
    }
    let share = c0
        .zip(c1)
        .map(|(c0, c1)| (c1 - c0).as_secs_f64() / idle.as_secs_f64());
    (share, g1 - g0)
}

/// One hot row: pairs per second on one shared ref by `cpus.len()`
/// pinned threads for `d`, and the grace periods meanwhile.
fn hot_rate(managed: bool, cpus: &[usize], d: Duration) -> (f64, u64) {
    let r = Arc::pin(PercpuRef::new(|_| {}));
    if managed {
        r.as_ref().switch_to_managed().expect("a fresh ref");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(cpus.len() + 1));
    let threads: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            let (r, stop, start) = (r.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                let _ = affinity::pin_to(cpu);
                start.wait();
                let mut pairs = 0u64;
                while !stop.load(Relaxed) {
                    for _ in 0..1024 {
                        r.get();
                        r.put();
                    }
                    pairs += 1024;
                }
                pairs
            })
        })
        .collect();
    start.wait();
    let (t0, g0) = (Instant::now(), grace_periods());
    std::thread::sleep(d);
    stop.store(true, Relaxed);
    let pairs: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("a hot thread"))
        .sum();
    let (dt, g1) = (t0.elapsed(), grace_periods());
    r.kill_sync().expect("alive");
    (pairs as f64 / dt.as_secs_f64(), g1 - g0)
}

fn main() {
    let a = Args::parse();
    let cpus = affinity::allowed_cpus();
    println!(
        "managed_costs: backend {:?}, {} allowed CPUs, {} reps",
        backend(),
        cpus.len(),
        a.reps
    );
    let (mut p50, mut p99, mut max, mut gps) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.reps {
        let (mut d, g) = release_delays(a.delays);
        p50.push(median(&mut d));
        p99.push(percentile(&mut d, 99.0));
        max.push(percentile(&mut d, 100.0));
        gps.push(g as f64 / a.delays as f64);
    }
    println!();
    if a.counts_only {
        println!(
            "release: {} refs x {} reps, every one released once; grace periods per release {:.1}",
            a.delays,
            a.reps,
            median(&mut gps)
        );
    } else {
        println!(
            "| release delay, idle process (ms) | median | p99 | max | grace periods per release |"
        );
        println!("|---|--:|--:|--:|--:|");
        println!(
            "| last put to `release`, {} refs a rep | {:.2} | {:.2} | {:.2} | {:.1} |",
            a.delays,
            median(&mut p50),
            median(&mut p99),
            median(&mut max),
            median(&mut gps)
        );
    }
    let (mut share, mut idle_gps) = (vec![], vec![]);
    for _ in 0..a.reps {
        let (s, g) = idle_cost(a.refs, Duration::from_millis(a.idle_ms));
        if let Some(s) = s {
            share.push(s * 100.0);
        }
        idle_gps.push(g as f64);
    }
    println!();
    if a.counts_only {
        println!(
            "idle: {} managed refs, grace periods while idle {}",
            a.refs,
            median(&mut idle_gps)
        );
    } else {
        println!(
            "| {} idle managed refs, {} ms | CPU, % of one core | grace periods |",
            a.refs, a.idle_ms
        );
        println!("|---|--:|--:|");
        let cpu = if share.is_empty() {
            "n/a (no getrusage here)".to_string()
        } else {
            format!("{:.3}", median(&mut share))
        };
        println!(
            "| the whole process (the engine included) | {cpu} | {} |",
            median(&mut idle_gps)
        );
    }
    if a.counts_only {
        return;
    }
    let d = Duration::from_millis(a.hot_ms);
    let (mut ratio, mut plain, mut man, mut hot_gps) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.reps {
        let (u, _) = hot_rate(false, &cpus, d);
        let (m, g) = hot_rate(true, &cpus, d);
        ratio.push(m / u);
        plain.push(u / 1e6);
        man.push(m / 1e6);
        hot_gps.push(g as f64 / d.as_secs_f64());
    }
    println!();
    println!(
        "| hot ref, {} threads, {} ms a row | M pairs/s | managed / unmanaged | grace periods/s |",
        cpus.len(),
        a.hot_ms
    );
    println!("|---|--:|--:|--:|");
    println!("| unmanaged | {:.1} | | |", median(&mut plain));
    println!(
        "| managed | {:.1} | {:.3} | {:.0} |",
        median(&mut man),
        median(&mut ratio),
        median(&mut hot_gps)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert_eq!(percentile(&mut v, 100.0), 100.0);
        assert_eq!(median(&mut v), 50.0);
        assert_eq!(median(&mut []), 0.0);
        let mut one = [7.0];
        assert_eq!(percentile(&mut one, 99.0), 7.0);
    }

    /// A short end-to-end run: every ref released once, none early.
    #[test]
    fn a_short_run_releases_every_ref() {
        let (d, _) = release_delays(5);
        assert_eq!(d.len(), 5);
        assert!(d.iter().all(|&ms| ms >= 0.0));
        let (share, _) = idle_cost(100, Duration::from_millis(20));
        assert!(share.is_none_or(|s| s >= 0.0));
    }
}
