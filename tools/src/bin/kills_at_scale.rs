//! Kills at scale: what a stream of kills costs the killing
//! thread and the other CPUs, synchronous against deferred, in one run:
//! `cargo run --release -p percpu-ref-tools --bin kills_at_scale [-- --help]`.
//!
//! One thread (the *killer*, pinned to the first allowed CPU) kills
//! `--kills` refs one after another while a second thread (the *busy*
//! one, pinned to the last allowed CPU) runs get + put on a ref of its own
//! the whole time. Each row is measured `--reps` times, rows interleaved,
//! and the median is shown:
//!
//! - **synchronous kill**: `PercpuRef::kill_sync` on each ref; each returns once
//!   its switch is complete (one grace period each, unless it shares one).
//! - **deferred kill**: `PercpuRef::kill` on each ref, then
//!   `percpu_ref::flush()`. The rate is the killer's loop alone; the busy
//!   thread's share covers the whole window until `flush` returned, so it
//!   includes the engine's grace periods and completions.
//! - **`Owner` drop**: dropping `--kills` `Owner<u64>`s (each drop is a
//!   deferred kill; the value is dropped when the engine puts the last
//!   reference), then `flush`, beside dropping as many `Arc<u64>`s and
//!   beside an `Owner` drop done synchronously: a synchronous kill,
//!   then the free (`Box<PercpuRef>` killed and dropped).
//! - **two killers**: two threads, one per CPU, each doing `--kills / 2`
//!   synchronous kills at once (no busy thread): concurrent synchronous
//!   callers share grace periods, so there are fewer grace periods than
//!   kills.
//!
//! A second table gives the latency of one kill until its release, the
//! killer doing `--latency-kills` of them one at a time (the busy thread
//! still running; the median per kill is shown): a `kill_sync`; a
//! `kill` then `flush`; `Owner::kill().wait()`, which hurries the
//! engine; and, as the baseline (what the engine's batching costs a lone
//! kill that nothing hurries), `Owner::kill()` then `try_take` until it
//! succeeds.
//!
//! Grace periods are counted with `percpu_ref::percpu::grace_periods()`
//! (each one is a `membarrier` on the rseq backend). The busy thread's
//! share is its get + put rate during the row's window over its rate in a
//! window of the same length just before, with the killer idle.
//!
//! **Limits.** On the sharded backend there is no `membarrier`: every
//! switch seals its own shards, and the rows show the engine's overhead
//! alone. With one allowed CPU the killer and the busy thread share it,
//! and the busy share mostly measures the scheduler. Timings are as noisy
//! as the machine.

#[path = "../../../benches/common/affinity.rs"]
mod affinity;
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use percpu_ref::owned::Owner;
use percpu_ref::percpu::grace_periods;
use percpu_ref::{backend, flush, PercpuRef};
use std::fmt::Write as _;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The targets.
const DEFERRED_RATE_TARGET: f64 = 5_000_000.0;
const GP_PER_1000_TARGET: f64 = 1.0;
const BUSY_SHARE_TARGET: f64 = 0.95;
const OWNER_SPEEDUP_TARGET: f64 = 20.0;

/// kills_at_scale: synchronous against deferred kills, with another CPU busy.
///
/// Prints one markdown table of medians with its targets.
#[derive(Parser, Debug)]
#[command(
    name = "kills_at_scale",
    verbatim_doc_comment,
    override_usage = "cargo run --release -p percpu-ref-tools --bin kills_at_scale -- [OPTIONS]",
    after_help = "Progress goes to stderr. Exit status 2 means a bad option."
)]
struct Args {
    /// Refs killed (or owners dropped) per row
    #[arg(
        long,
        value_name = "N",
        default_value_t = 20_000,
        value_parser = RangedU64ValueParser::<usize>::new().range(2..=10_000_000)
    )]
    kills: usize,

    /// Repetitions of every row; the median is shown
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=100)
    )]
    reps: usize,

    /// Single kills timed one at a time for the latency table, per rep
    #[arg(
        long,
        value_name = "N",
        default_value_t = 200,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000)
    )]
    latency_kills: usize,

    /// Counts only, no times (for emulated guests, where times mean
    /// nothing: scripts/vm-test): the grace periods of each row's kills,
    /// every release checked, and no busy thread
    #[arg(long)]
    counts_only: bool,
}

/// The busy thread: get + put on its own ref, counting pairs.
struct Busy {
    pairs: AtomicU64,
    stop: AtomicBool,
}

impl Busy {
    fn run(&self, cpu: usize) {
        let _ = affinity::pin_to(cpu);
        let r = PercpuRef::new(|_| {});
        while !self.stop.load(Relaxed) {
            for _ in 0..1024 {
                r.get();
                r.put();
            }
            self.pairs.fetch_add(1024, Relaxed);
        }
    }

    /// Pairs per second over `f`, and what `f` returned.
    fn rate_during<R>(&self, f: impl FnOnce() -> R) -> (f64, Duration, R) {
        let p0 = self.pairs.load(Relaxed);
        let t0 = Instant::now();
        let out = f();
        let dt = t0.elapsed();
        let p1 = self.pairs.load(Relaxed);
        ((p1 - p0) as f64 / dt.as_secs_f64(), dt, out)
    }

    /// Pairs per second over `d` with nothing else running here.
    fn rate_alone(&self, d: Duration) -> f64 {
        self.rate_during(|| std::thread::sleep(d)).0
    }
}

/// One measurement of one row.
#[derive(Clone, Copy, Default)]
struct Sample {
    /// Seconds of the killer's loop.
    loop_s: f64,
    /// Seconds until everything the loop queued was done (`flush`).
    done_s: f64,
    grace_periods: u64,
    /// The busy thread's rate over the window, over its rate alone.
    busy_share: f64,
}

/// `n` refs whose releases count into `released`.
fn refs(n: usize, released: &Arc<AtomicUsize>) -> Vec<Pin<Box<PercpuRef>>> {
    (0..n)
        .map(|_| {
            let released = released.clone();
            Box::pin(PercpuRef::new(move |_| {
                released.fetch_add(1, Relaxed);
            }))
        })
        .collect()
}

/// Times `kill` over fresh refs (then `flush`), checking every ref released.
fn kill_row(busy: &Busy, n: usize, kill: impl Fn(Pin<&PercpuRef>)) -> Sample {
    let released = Arc::new(AtomicUsize::new(0));
    let v = refs(n, &released);
    let gp0 = grace_periods();
    let (rate, done, loop_s) = busy.rate_during(|| {
        let t0 = Instant::now();
        for r in &v {
            kill(r.as_ref());
        }
        let loop_s = t0.elapsed().as_secs_f64();
        flush();
        loop_s
    });
    let grace_periods = grace_periods() - gp0;
    let alone = busy.rate_alone(done);
    assert_eq!(released.load(Relaxed), n, "every killed ref released");
    Sample {
        loop_s,
        done_s: done.as_secs_f64(),
        grace_periods,
        busy_share: share(rate, alone),
    }
}

/// Times dropping `make`'s `n` values (then `flush`).
fn drop_row<T>(busy: &Busy, n: usize, make: impl Fn() -> T) -> Sample {
    let v: Vec<T> = (0..n).map(|_| make()).collect();
    let gp0 = grace_periods();
    let (rate, done, loop_s) = busy.rate_during(|| {
        let t0 = Instant::now();
        drop(v);
        let loop_s = t0.elapsed().as_secs_f64();
        flush();
        loop_s
    });
    let grace_periods = grace_periods() - gp0;
    let alone = busy.rate_alone(done);
    Sample {
        loop_s,
        done_s: done.as_secs_f64(),
        grace_periods,
        busy_share: share(rate, alone),
    }
}

/// Two threads, one per CPU, each killing `n / 2` refs synchronously.
fn two_killers(cpus: &[usize], n: usize) -> Sample {
    let released = Arc::new(AtomicUsize::new(0));
    let halves = [refs(n / 2, &released), refs(n - n / 2, &released)];
    let start = Barrier::new(2);
    let gp0 = grace_periods();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (i, half) in halves.iter().enumerate() {
            let (start, cpu) = (&start, cpus[i % cpus.len()]);
            s.spawn(move || {
                let _ = affinity::pin_to(cpu);
                start.wait();
                for r in half {
                    r.kill_sync().unwrap();
                }
            });
        }
    });
    let loop_s = t0.elapsed().as_secs_f64();
    assert_eq!(released.load(Relaxed), n, "every killed ref released");
    Sample {
        loop_s,
        done_s: loop_s,
        grace_periods: grace_periods() - gp0,
        busy_share: f64::NAN,
    }
}

/// Latency of one kill until its release, one at a time: the median over
/// `n` kills of `kill_one`'s seconds.
fn latency_row(n: usize, kill_one: impl Fn()) -> f64 {
    median(
        (0..n)
            .map(|_| {
                let t0 = Instant::now();
                kill_one();
                t0.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The latency table's rows, in the order printed.
const LATENCY_ROWS: [&str; 4] = [
    "`kill_sync` (the release runs inside it)",
    "`kill`, then `flush`",
    "`Owner::kill().wait()`, no `Ref` left",
    "`Owner::kill()`, then `try_take` until it succeeds (the engine not hurried)",
];

/// Every latency row's samples, killing one at a time with `busy` running.
fn measure_latency(n: usize, samples: &mut [Vec<f64>]) {
    samples[0].push(latency_row(n, || {
        let r = PercpuRef::new(|_| {});
        r.kill_sync().unwrap();
        assert!(r.is_zero());
    }));
    samples[1].push(latency_row(n, || {
        let r = Box::pin(PercpuRef::new(|_| {}));
        r.as_ref().kill().unwrap();
        flush();
        assert!(r.is_zero());
    }));
    samples[2].push(latency_row(n, || {
        assert_eq!(Owner::new(7u64).kill().wait(), 7);
    }));
    samples[3].push(latency_row(n, || {
        let mut k = Owner::new(7u64).kill();
        let v = loop {
            match k.try_take() {
                Ok(v) => break v,
                Err(again) => k = again,
            }
            std::hint::spin_loop();
        };
        assert_eq!(v, 7);
    }));
}

/// The rows, in the order printed.
const ROWS: [&str; 6] = [
    "`kill_sync`",
    "`kill`, then `flush`",
    "drop `Owner<u64>`, then `flush`",
    "`Owner` drop done synchronously: `kill_sync`, then free",
    "drop `Arc<u64>`",
    "two threads, `kill_sync`, at once",
];

/// Every row's samples, and the CPUs the process was allowed (read before
/// this thread pins itself).
fn measure(args: &Args) -> (Vec<Vec<Sample>>, Vec<Vec<f64>>, Vec<usize>) {
    let cpus = affinity::allowed_cpus();
    let (killer_cpu, busy_cpu) = (cpus[0], *cpus.last().unwrap());
    let n = args.kills;
    let mut samples = vec![Vec::new(); ROWS.len()];
    let mut latency = vec![Vec::new(); LATENCY_ROWS.len()];
    for rep in 0..args.reps {
        eprintln!("kills_at_scale: rep {} of {}", rep + 1, args.reps);
        let busy = Busy {
            pairs: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        };
        std::thread::scope(|s| {
            s.spawn(|| busy.run(busy_cpu));
            let _ = affinity::pin_to(killer_cpu);
            std::thread::sleep(Duration::from_millis(20)); // the busy loop warms up
            samples[0].push(kill_row(&busy, n, |r| r.kill_sync().unwrap()));
            samples[1].push(kill_row(&busy, n, |r| r.kill().unwrap()));
            samples[2].push(drop_row(&busy, n, || Owner::new(0u64)));
            samples[3].push(drop_row(&busy, n, || {
                let r = Box::pin(PercpuRef::new(|_| {}));
                OldOwnerDrop(r)
            }));
            samples[4].push(drop_row(&busy, n, || Arc::new(0u64)));
            measure_latency(args.latency_kills, &mut latency);
            busy.stop.store(true, Relaxed);
        });
        samples[5].push(two_killers(&cpus, n));
    }
    (samples, latency, cpus)
}

/// An `Owner::drop` done synchronously: a synchronous kill, then the
/// free (the baseline of the deferred drop's speed-up).
struct OldOwnerDrop(Pin<Box<PercpuRef>>);

impl Drop for OldOwnerDrop {
    fn drop(&mut self) {
        self.0.kill_sync().unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "**no**"
    }
}

/// The markdown report: the rows, the targets, what the columns mean, and
/// the latencies.
fn report(args: &Args, samples: &[Vec<Sample>], latency: &[Vec<f64>], cpus: &[usize]) -> String {
    let mut w = rows_table(args, samples, cpus);
    w += &targets_table(args.kills, samples);
    w += COLUMNS_NOTE;
    w += &latency_table(args.latency_kills, latency);
    w
}

/// The median over the reps of one of row `row`'s measures.
fn row_median(samples: &[Vec<Sample>], row: usize, f: fn(&Sample) -> f64) -> f64 {
    median(samples[row].iter().map(f).collect())
}

/// The heading and one line per row of `ROWS`.
fn rows_table(args: &Args, samples: &[Vec<Sample>], cpus: &[usize]) -> String {
    let n = args.kills;
    let med = |row: usize, f: fn(&Sample) -> f64| row_median(samples, row, f);
    let mut w = String::new();
    let _ = writeln!(
        w,
        "## percpu-ref: kills at scale\n\n{} backend; {} allowed CPUs; {n} kills per row; \
         median of {} runs.\n",
        backend(),
        cpus.len(),
        args.reps
    );
    let _ = writeln!(
        w,
        "| | killer's loop | per second | until done | grace periods | per 1,000 | other CPU's get + put |"
    );
    let _ = writeln!(w, "|---|--:|--:|--:|--:|--:|--:|");
    for (i, name) in ROWS.iter().enumerate() {
        let loop_s = med(i, |s| s.loop_s);
        let gps = med(i, |s| s.grace_periods as f64);
        let _ = writeln!(
            w,
            "| {name} | {:.2} ms | {:.2} M/s | {:.2} ms | {gps:.0} | {:.2} | {} |",
            loop_s * 1e3,
            n as f64 / loop_s / 1e6,
            med(i, |s| s.done_s) * 1e3,
            gps * 1000.0 / n as f64,
            busy_share(med(i, |s| s.busy_share)),
        );
    }
    w
}

/// The busy thread's rate during a row over its rate alone; NaN (a dash in
/// the table) when it counted nothing alone, which only a machine busy with
/// other work does: the ratio would read as infinite.
fn share(rate: f64, alone: f64) -> f64 {
    if alone > 0.0 {
        rate / alone
    } else {
        f64::NAN
    }
}

/// The busy thread's share as a percentage; a dash for the rows that run
/// no busy thread, or where it did not run alone (see [`share`]).
fn busy_share(share: f64) -> String {
    if share.is_nan() {
        "—".to_string()
    } else {
        format!("{:.1} %", share * 100.0)
    }
}

/// Each target against the rows that measure it (the indices are `ROWS`'s).
fn targets_table(n: usize, samples: &[Vec<Sample>]) -> String {
    let med = |row: usize, f: fn(&Sample) -> f64| row_median(samples, row, f);
    let deferred_rate = n as f64 / med(1, |s| s.loop_s);
    let deferred_gps = med(1, |s| s.grace_periods as f64) * 1000.0 / n as f64;
    let deferred_share = med(1, |s| s.busy_share);
    let owner_speedup = med(3, |s| s.done_s) / med(2, |s| s.done_s);
    let two_gps = med(5, |s| s.grace_periods as f64);
    format!(
        "\nTargets:\n\n\
         | target | measured | met |\n|---|--:|:-:|\n\
         | deferred kills ≥ 5 M/s on the killing thread | {:.2} M/s | {} |\n\
         | ≤ 1 grace period per 1,000 deferred kills | {deferred_gps:.2} | {} |\n\
         | the other CPU keeps ≥ 95 % of its get + put while deferred kills are processed | {:.1} % | {} |\n\
         | dropping {n} `Owner`s ≥ 20× faster than with a sync kill each, until done | {owner_speedup:.1}× | {} |\n\
         | two threads of synchronous kills: fewer grace periods than kills | {two_gps:.0} < {n} | {} |\n",
        deferred_rate / 1e6,
        verdict(deferred_rate >= DEFERRED_RATE_TARGET),
        verdict(deferred_gps <= GP_PER_1000_TARGET),
        deferred_share * 100.0,
        verdict(deferred_share >= BUSY_SHARE_TARGET),
        verdict(owner_speedup >= OWNER_SPEEDUP_TARGET),
        verdict(two_gps < n as f64),
    )
}

/// What the rows' columns measure, which their headings are too short to say.
const COLUMNS_NOTE: &str = "\n\"until done\": the loop and then `flush()`, so every switch it \
    queued has completed, its confirm has run and its ref released. \"Other CPU\": the busy \
    thread's get + put rate during \"until done\" over its rate in as long a window with the \
    killer idle. Grace periods: `percpu::grace_periods()` (one `membarrier` each on rseq).\n";

/// One kill until its release, per `LATENCY_ROWS`.
fn latency_table(latency_kills: usize, latency: &[Vec<f64>]) -> String {
    let mut w = format!(
        "\nOne kill until its release, {latency_kills} one at a time, the other CPU busy \
         (median per kill):\n\n| | latency |\n|---|--:|\n"
    );
    for (name, s) in LATENCY_ROWS.iter().zip(latency) {
        let _ = writeln!(w, "| {name} | {:.1} µs |", median(s.clone()) * 1e6);
    }
    w
}

/// The grace periods `f` issued.
fn grace_periods_of(f: impl FnOnce()) -> u64 {
    let gp0 = grace_periods();
    f();
    grace_periods() - gp0
}

/// `--counts-only`: each row's kills once, counting grace periods (the
/// killer is not pinned and nothing else runs: under emulation only the
/// counts are meaningful).
fn counts(args: &Args) -> String {
    let n = args.kills;
    let released = Arc::new(AtomicUsize::new(0));
    let sync = {
        let v = refs(n, &released);
        grace_periods_of(|| v.iter().for_each(|r| r.kill_sync().unwrap()))
    };
    let deferred = {
        let v = refs(n, &released);
        grace_periods_of(|| {
            v.iter().for_each(|r| r.as_ref().kill().unwrap());
            flush();
        })
    };
    assert_eq!(released.load(Relaxed), 2 * n, "every killed ref released");
    let owners = {
        let v: Vec<_> = (0..n).map(|_| Owner::new(0u64)).collect();
        grace_periods_of(|| {
            drop(v);
            flush();
        })
    };
    let two = two_killers(&affinity::allowed_cpus(), n).grace_periods;
    let mut w = String::new();
    let _ = writeln!(
        w,
        "kills_at_scale --counts-only: {n} kills per row, backend {}, {} CPUs allowed\n\n\
         | {n} kills | grace periods |\n|---|--:|\n\
         | `kill_sync` | {sync} |\n\
         | `kill`, then `flush` | {deferred} |\n\
         | drop `Owner<u64>`, then `flush` | {owners} |\n\
         | two threads, {} sync kills each | {two} |\n\n\
         vm-counts: kills={n} sync_kill_gps={sync} deferred_kill_gps={deferred} \
         owner_drop_gps={owners} two_killer_gps={two} grace_periods={}",
        backend(),
        affinity::allowed_cpus().len(),
        n / 2,
        grace_periods()
    );
    w
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let t0 = Instant::now();
    if args.counts_only {
        print!("{}", counts(&args));
        return ExitCode::SUCCESS;
    }
    let (samples, latency, cpus) = measure(&args);
    print!("{}", report(&args, &samples, &latency, &cpus));
    eprintln!(
        "kills_at_scale: done in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
    }

    #[test]
    fn a_busy_thread_that_never_ran_alone_has_no_share() {
        assert_eq!(share(1.0, 2.0), 0.5);
        assert!(share(5.0, 0.0).is_nan());
        assert_eq!(busy_share(share(5.0, 0.0)), "—");
    }

    #[test]
    fn a_tiny_run_counts_every_release_and_prints_every_row() {
        let args = Args::try_parse_from([
            "kills_at_scale",
            "--kills",
            "64",
            "--reps",
            "1",
            "--latency-kills",
            "4",
        ])
        .unwrap();
        let (samples, latency, cpus) = measure(&args);
        assert!(samples.iter().all(|s| s.len() == 1));
        assert!(latency.iter().all(|s| s.len() == 1));
        let md = report(&args, &samples, &latency, &cpus);
        for row in ROWS.iter().chain(&LATENCY_ROWS) {
            assert!(md.contains(row), "{row} missing from\n{md}");
        }
    }

    /// The report of fixed samples, so that its text is checked without
    /// timing anything: medians over the reps, the targets judged from
    /// them, and a dash where a row runs no busy thread.
    #[test]
    fn report_of_fixed_samples() {
        let args = Args::try_parse_from(["k", "--kills", "1000", "--latency-kills", "5"]).unwrap();
        let row = |loop_s, done_s, grace_periods, busy_share| {
            let s = Sample {
                loop_s,
                done_s,
                grace_periods,
                busy_share,
            };
            // An outlier among three reps: the median leaves it out.
            let far = Sample {
                loop_s: loop_s * 9.0,
                ..s
            };
            vec![s, far, s]
        };
        let samples = [
            row(0.01, 0.01, 1000, 0.5),
            row(0.0001, 0.001, 0, 0.97),
            row(0.0001, 0.001, 0, 0.97),
            row(0.05, 0.05, 1000, 0.5),
            row(0.00001, 0.00001, 0, 0.99),
            row(0.005, 0.005, 400, f64::NAN),
        ];
        let latency = vec![vec![12e-6, 1.0, 11e-6, 13e-6, 0.0]; LATENCY_ROWS.len()];
        let md = report(&args, &samples, &latency, &[0, 1]);
        for want in [
            " backend; 2 allowed CPUs; 1000 kills per row; median of 3 runs.\n\n| |",
            "\n| `kill`, then `flush` | 0.10 ms | 10.00 M/s | 1.00 ms | 0 | 0.00 | 97.0 % |\n",
            "\n| two threads, `kill_sync`, at once | 5.00 ms | 0.20 M/s | 5.00 ms | 400 | 400.00 | — |\n",
            "\n| deferred kills ≥ 5 M/s on the killing thread | 10.00 M/s | yes |\n",
            "| 97.0 % | yes |\n",
            "\n| dropping 1000 `Owner`s ≥ 20× faster than with a sync kill each, until done | 50.0× | yes |\n",
            "\n| two threads of synchronous kills: fewer grace periods than kills | 400 < 1000 | yes |\n",
            "released. \"Other CPU\": the busy thread's get + put rate",
            "\nOne kill until its release, 5 one at a time, the other CPU busy (median per kill):\n",
            "\n| `kill_sync` (the release runs inside it) | 12.0 µs |\n",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        assert!(!md.contains("**no**"), "{md}");
    }

    #[test]
    fn counts_only_prints_counts_and_no_times() {
        let args = Args::try_parse_from(["k", "--counts-only", "--kills", "64"]).unwrap();
        let out = counts(&args);
        assert!(out.contains("vm-counts: kills=64 sync_kill_gps="), "{out}");
        assert!(!out.contains(" s |") && !out.contains("µs"), "{out}");
    }

    #[test]
    fn options_are_checked() {
        assert!(Args::try_parse_from(["k", "--kills", "1"]).is_err());
        assert!(Args::try_parse_from(["k", "--reps", "0"]).is_err());
        assert!(Args::try_parse_from(["k", "--latency-kills", "0"]).is_err());
        let a = Args::try_parse_from(["k"]).unwrap();
        assert_eq!((a.kills, a.reps), (20_000, 3));
    }
}
