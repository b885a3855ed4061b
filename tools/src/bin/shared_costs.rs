//! What `percpu_ref::shared::Shared` costs, in one run:
//! `cargo run --release -p percpu-ref-tools --bin shared_costs [-- --help]`.
//!
//! Each measurement is repeated `--reps` times (rows that compare are
//! interleaved), medians shown:
//!
//! - **release delay**: a promoted value's last drop, on an otherwise idle
//!   process, to its `Drop` on the engine thread, with nothing calling
//!   `flush`: `--delays` values one at a time; median, p99 and largest;
//!   one row per engine batch delay in `--batch-delay-us`
//!   (`percpu_ref::set_batch_delay`; the default, 1000, alone).
//! - **into_inner**: `Shared::into_inner` of a promoted value's handles on
//!   an otherwise idle process, which waits for the engine: `--into-inner`
//!   values one at a time, each with two handles, the first `into_inner`
//!   (not the last: `None`) and the second (the last: `T` back), in ms;
//!   median and p99.
//! - **exact checks**: `Shared::get_mut` and `Shared::try_unwrap` of a
//!   promoted value, each of which switches its ref to atomic mode (a
//!   grace period) and back: the same `--into-inner` values, one at a
//!   time, in µs, median and p99, with an unpromoted value's `get_mut` as
//!   the floor (`Arc`'s check); the last row while another thread clones
//!   and drops a handle of the value on another CPU.
//! - **idle values**: `--values` promoted values, each cloned and dropped
//!   (so each was scanned once), then left alone: the process's CPU time
//!   over `--idle-ms` of sleep, as a share of one core.
//! - **churn**: `Shared::new` + clone + drop of both, `--churn` times on
//!   one thread, against `Arc`'s same loop, the values' drops included
//!   (an unpromoted value is dropped by its last drop; the run ends with a
//!   `flush`): values per second, `Shared` over `Arc`.
//! - **hot under a storm**: a thread pinned to the first allowed CPU clones
//!   and drops one promoted value for `--hot-ms`, alone, then while a
//!   second thread (pinned to the second CPU) creates `--storm` values,
//!   promotes every one, clones and drops it (so the engine has a release
//!   to find for each): the hot thread's rate with the storm over its rate
//!   alone, and how many of the storm's values at most awaited their drop
//!   (made and dropped, not yet dropped by the engine).
//!
//! - **memory**: growth of the anonymous memory (exact, from
//!   /proc/self/smaps_rollup) per idle value over `--memory` values, and
//!   `malloc`'s share of it: `Arc<u64>`, an unpromoted `Shared<u64>`, and
//!   promoted ones cloned and dropped on 1, 2, 4, ... and every allowed
//!   CPU (by threads pinned there, made before the first reading so that
//!   their own costs are not the values'), each row in fresh processes
//!   (medians of `--reps`), beside the bound `Arc`'s + 64 + 8 per CPU, and
//!   the cost of a promotion and of each further CPU.
//!
//! **Limits.** Values are promoted only on the rseq backend; elsewhere the
//! rows measure the atomic phase. Times are as noisy as the machine; on a
//! 2-CPU machine the storm's thread and the engine share the CPUs with the
//! hot thread (`--counts-only` prints counts alone, for emulated guests).

#[path = "../../../benches/common/affinity.rs"]
mod affinity;
#[path = "../common/costs.rs"]
mod costs;
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use costs::{cpu_time, median, percentile};
use percpu_ref::shared::Shared;
use percpu_ref::{backend, flush};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// shared_costs: a promoted `Shared`'s release delay, the engine's cost
/// for idle values, churn against `Arc`, and a hot value under a storm.
#[derive(Parser, Debug)]
#[command(
    name = "shared_costs",
    verbatim_doc_comment,
    override_usage = "cargo run --release -p percpu-ref-tools --bin shared_costs -- [OPTIONS]",
    after_help = "Exit status 2 means a bad option."
)]
struct Args {
    /// Values released one at a time per rep, for the delay
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    delays: usize,

    /// The engine's batch delays to measure the release delay at
    /// (`percpu_ref::set_batch_delay`), in microseconds, comma-separated
    #[arg(long, value_name = "US,..", value_delimiter = ',', default_value = "1000",
          value_parser = RangedU64ValueParser::<u64>::new().range(0..=1_000_000))]
    batch_delay_us: Vec<u64>,

    /// Promoted values given back one at a time per rep by `into_inner`
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    into_inner: usize,

    /// Idle promoted values
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    values: usize,

    /// Milliseconds of idle time over which their CPU cost is read
    #[arg(long, value_name = "MS", default_value_t = 3_000,
          value_parser = RangedU64ValueParser::<u64>::new().range(10..=600_000))]
    idle_ms: u64,

    /// Values made and dropped per churn row
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = RangedU64ValueParser::<u64>::new().range(1..=1_000_000_000))]
    churn: u64,

    /// Values the storm makes, promotes and drops
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = RangedU64ValueParser::<u64>::new().range(1..=1_000_000_000))]
    storm: u64,

    /// Milliseconds of the hot thread's row alone
    #[arg(long, value_name = "MS", default_value_t = 500,
          value_parser = RangedU64ValueParser::<u64>::new().range(10..=600_000))]
    hot_ms: u64,

    /// Repetitions; medians are shown
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    reps: usize,

    /// Values per memory row (0: no memory rows)
    #[arg(long, value_name = "N", default_value_t = 200_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(0..=10_000_000))]
    memory: usize,

    /// Counts only, no times (for emulated guests)
    #[arg(long)]
    counts_only: bool,

    /// Internal: measure one memory row in this process (`arc`, `plain`
    /// or the number of CPUs a promoted value is used on) and print it
    #[arg(long, hide = true)]
    memory_row: Option<String>,
}

/// A value that records when it was dropped (ns after `epoch`, plus one).
struct Timed {
    epoch: Instant,
    at: Arc<AtomicU64>,
}

impl Drop for Timed {
    fn drop(&mut self) {
        let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        assert_eq!(self.at.swap(ns + 1, SeqCst), 0, "dropped twice");
    }
}

/// One rep of the release delay, in milliseconds per value.
fn release_delays(n: usize) -> Vec<f64> {
    let epoch = Instant::now();
    (0..n)
        .map(|_| {
            let at = Arc::new(AtomicU64::new(0));
            let s = Shared::new(Timed {
                epoch,
                at: at.clone(),
            });
            Shared::promote(&s);
            drop(s.clone()); // scanned once, then idle
            std::thread::sleep(Duration::from_millis(5));
            let t0 = epoch.elapsed();
            drop(s);
            let limit = Instant::now() + Duration::from_secs(10);
            while at.load(SeqCst) == 0 {
                assert!(
                    Instant::now() < limit,
                    "a value not dropped 10 s after its last handle"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
            let done = Duration::from_nanos(at.load(SeqCst) - 1);
            done.saturating_sub(t0).as_secs_f64() * 1e3
        })
        .collect()
}

/// One rep of `into_inner`'s wait, in milliseconds per value: (the first
/// of two handles, the last).
fn into_inner_waits(n: usize) -> (Vec<f64>, Vec<f64>) {
    (0..n)
        .map(|i| {
            let s = Shared::new(i);
            Shared::promote(&s);
            let other = s.clone();
            std::thread::sleep(Duration::from_millis(2)); // scanned, idle
            let t0 = Instant::now();
            assert_eq!(Shared::into_inner(other), None, "not the last handle");
            let t1 = Instant::now();
            assert_eq!(Shared::into_inner(s), Some(i), "the last handle");
            let t2 = Instant::now();
            ((t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3)
        })
        .unzip()
}

/// One rep of the exact checks, in µs per value: a promoted value's
/// `get_mut` with another handle alive (`None`), with none (`Some`), its
/// `try_unwrap` (`Ok`), an unpromoted value's `get_mut` (`Some`, the
/// floor), and a promoted value's `get_mut` while a thread on another CPU
/// clones and drops a handle of it (`None`).
fn exact_checks(n: usize, cpus: &[usize]) -> [Vec<f64>; 5] {
    let us = |t: Instant| t.elapsed().as_secs_f64() * 1e6;
    let mut rows: [Vec<f64>; 5] = Default::default();
    for i in 0..n {
        let mut s = Shared::new(i);
        let t = Instant::now();
        assert!(Shared::get_mut(&mut s).is_some(), "unpromoted, unique");
        rows[3].push(us(t));
        Shared::promote(&s);
        let other = s.clone();
        let t = Instant::now();
        assert!(Shared::get_mut(&mut s).is_none(), "another handle");
        rows[0].push(us(t));
        drop(other);
        let t = Instant::now();
        assert!(Shared::get_mut(&mut s).is_some(), "the only handle");
        rows[1].push(us(t));
        let t = Instant::now();
        assert_eq!(Shared::try_unwrap(s), Ok(i), "the only handle");
        rows[2].push(us(t));
    }
    let mut s = Shared::new(0usize);
    Shared::promote(&s);
    let stop = Arc::new(AtomicBool::new(false));
    let spins = Arc::new(AtomicU64::new(0));
    let busy = std::thread::spawn({
        let (h, stop, spins) = (s.clone(), stop.clone(), spins.clone());
        let cpu = cpus.get(1).copied();
        move || {
            if let Some(cpu) = cpu {
                let _ = affinity::pin_to(cpu);
            }
            while !stop.load(Relaxed) {
                drop(black_box(h.clone()));
                spins.fetch_add(1, Relaxed);
            }
            h
        }
    });
    while spins.load(Relaxed) < 100_000 {
        std::hint::spin_loop(); // running on its CPU before the first check
    }
    // On the first CPU, beside the busy one (not sharing its CPU, where
    // the scheduler would run the checks while the busy thread waits).
    rows[4] = std::thread::scope(|scope| {
        let (s, first) = (&mut s, cpus.first().copied());
        scope
            .spawn(move || {
                if let Some(cpu) = first {
                    let _ = affinity::pin_to(cpu);
                }
                (0..n)
                    .map(|_| {
                        let t = Instant::now();
                        assert!(Shared::get_mut(s).is_none(), "another handle");
                        us(t)
                    })
                    .collect()
            })
            .join()
            .expect("the checking thread")
    });
    stop.store(true, Relaxed);
    drop(busy.join().expect("the busy thread"));
    rows
}

/// A value whose drop is counted.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Relaxed);
    }
}

/// One rep of the idle cost: CPU share of one core over `idle` with `n`
/// idle promoted values (`None` where it is not read).
fn idle_cost(n: usize, idle: Duration) -> Option<f64> {
    let drops = Arc::new(AtomicUsize::new(0));
    let values: Vec<Shared<Counted>> = (0..n)
        .map(|_| {
            let s = Shared::new(Counted(drops.clone()));
            Shared::promote(&s);
            drop(s.clone());
            s
        })
        .collect();
    flush();
    std::thread::sleep(Duration::from_millis(50));
    let c0 = cpu_time();
    std::thread::sleep(idle);
    let c1 = cpu_time();
    assert_eq!(drops.load(SeqCst), 0, "an idle value was dropped");
    drop(values);
    flush();
    assert_eq!(drops.load(SeqCst), n, "not every value dropped");
    c0.zip(c1)
        .map(|(c0, c1)| (c1 - c0).as_secs_f64() / idle.as_secs_f64())
}

/// Anonymous resident memory in bytes (`Anonymous` of
/// /proc/self/smaps_rollup, else `RssAnon` of /proc/self/status).
fn anon_rss() -> Option<u64> {
    // smaps_rollup's count walks the page tables: exact. `RssAnon` in
    // /proc/self/status is the kernel's per-CPU counters read without
    // summing them (since Linux 6.2), off by up to a batch of pages for
    // each CPU that faulted: tens of bytes per value in a 32-vCPU row.
    let exact = |f: &str, key: &str| -> Option<u64> {
        let text = std::fs::read_to_string(f).ok()?;
        let line = text.lines().find(|l| l.starts_with(key))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    exact("/proc/self/smaps_rollup", "Anonymous:")
        .or_else(|| exact("/proc/self/status", "RssAnon:"))
}

/// Gives freed heap memory back to the system (glibc keeps it otherwise,
/// and the next row would reuse it without growing the RSS).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: no preconditions; it only returns free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The bytes `malloc` has handed out and not had back (all its arenas),
/// where glibc says.
fn heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: no preconditions; it only reads the allocator's statistics.
    return Some(unsafe { libc::mallinfo2() }.uordblks);
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Bytes per value that `make` adds to the anonymous RSS, and of those the
/// bytes `malloc` handed out (the rest is the per-CPU arena's pages and
/// the allocator's slack), `n` values kept alive until the reading (then
/// dropped and flushed). `None` without /proc.
fn bytes_per_value<V>(
    n: usize,
    make: impl Fn() -> V,
    then: impl Fn(&[V]),
) -> Option<(f64, Option<f64>)> {
    let mut v: Vec<V> = Vec::with_capacity(n);
    // Fault the `Vec` in first: its pages are not the values' cost.
    // SAFETY: writes bytes into the spare capacity, which is allocated.
    unsafe {
        v.as_mut_ptr()
            .cast::<u8>()
            .write_bytes(1, n * std::mem::size_of::<V>())
    };
    flush();
    trim_heap();
    let before = anon_rss()?;
    let heap_before = heap_in_use();
    for _ in 0..n {
        v.push(make());
    }
    then(&v);
    flush();
    // Free memory that the engine's queues or another thread's malloc
    // arena still hold goes back first: only what the values hold counts.
    trim_heap();
    let after = anon_rss()?;
    let heap = heap_before
        .zip(heap_in_use())
        .map(|(b, a)| (a as f64 - b as f64) / n as f64);
    drop(v);
    flush();
    trim_heap();
    Some((after.saturating_sub(before) as f64 / n as f64, heap))
}

/// One thread pinned to each CPU, made before a memory row's reading, so that a
/// thread's one-time costs (its stack, which glibc's cache keeps for a few
/// threads only, its malloc arena, its registration) are paid before the
/// first reading and not divided among the values.
struct Workers {
    jobs: Vec<std::sync::mpsc::Sender<(usize, usize)>>,
    done: std::sync::mpsc::Receiver<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn new(cpus: &[usize]) -> Self {
        let (done_tx, done) = std::sync::mpsc::channel();
        let mut jobs = vec![];
        let mut threads = vec![];
        for &cpu in cpus {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, usize)>();
            let done_tx = done_tx.clone();
            threads.push(std::thread::spawn(move || {
                let _ = affinity::pin_to(cpu);
                for (ptr, len) in rx {
                    // SAFETY: `use_on` sent a live slice of `Shared<u64>`
                    // (which is `Sync`) and waits for every worker's `done`
                    // before it returns, so the slice outlives this use.
                    let values =
                        unsafe { std::slice::from_raw_parts(ptr as *const Shared<u64>, len) };
                    for s in values {
                        drop(black_box(s.clone()));
                    }
                    let _ = done_tx.send(());
                }
            }));
            jobs.push(tx);
        }
        Workers {
            jobs,
            done,
            threads,
        }
    }

    /// Clones and drops every value on the first `k` workers' CPUs, so that
    /// each value is counted on by that many CPUs.
    fn use_on(&self, values: &[Shared<u64>], k: usize) {
        for tx in &self.jobs[..k] {
            tx.send((values.as_ptr() as usize, values.len()))
                .expect("shared_costs: a memory worker exited");
        }
        for _ in 0..k {
            self.done
                .recv()
                .expect("shared_costs: a memory worker exited");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.jobs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `n` times `Shared::new` + clone + drop both, then a flush: values per
/// second.
#[inline(never)]
fn shared_churn(n: u64) -> f64 {
    let t0 = Instant::now();
    for i in 0..n {
        let s = Shared::new(i);
        drop(black_box(Shared::clone(black_box(&s))));
        drop(s);
    }
    flush();
    n as f64 / t0.elapsed().as_secs_f64()
}

/// The same with `Arc`.
#[inline(never)]
fn arc_churn(n: u64) -> f64 {
    let t0 = Instant::now();
    for i in 0..n {
        let a = Arc::new(i);
        drop(black_box(Arc::clone(black_box(&a))));
        drop(a);
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

/// The hot thread's clone + drop pairs per second on one promoted value,
/// for `d` alone or, with `storm`, until a second thread has made,
/// promoted and dropped `storm` values; and the most of those that
/// awaited their drop at once.
fn hot_rate(cpus: &[usize], d: Duration, storm: Option<u64>) -> (f64, usize) {
    let hot = Shared::new(0u64);
    Shared::promote(&hot);
    let stop = Arc::new(AtomicBool::new(false));
    let hot_cpu = cpus[0];
    let t = {
        let (hot, stop) = (hot.clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = affinity::pin_to(hot_cpu);
            let t0 = Instant::now();
            let mut pairs = 0u64;
            while !stop.load(Relaxed) {
                for _ in 0..1024 {
                    drop(black_box(Shared::clone(&hot)));
                }
                pairs += 1024;
            }
            pairs as f64 / t0.elapsed().as_secs_f64()
        })
    };
    let mut most_pending = 0;
    match storm {
        None => std::thread::sleep(d),
        Some(n) => {
            let storm_cpu = *cpus.get(1).unwrap_or(&cpus[0]);
            let drops = Arc::new(AtomicUsize::new(0));
            let d2 = drops.clone();
            let most = std::thread::spawn(move || {
                let _ = affinity::pin_to(storm_cpu);
                let mut most = 0;
                for i in 0..n {
                    let s = Shared::new(Counted(d2.clone()));
                    Shared::promote(&s);
                    drop(s.clone());
                    drop(s);
                    if i % 1024 == 0 {
                        most = most.max(i as usize + 1 - d2.load(Relaxed));
                    }
                }
                most
            })
            .join()
            .expect("the storm");
            most_pending = most;
            flush();
            assert_eq!(drops.load(SeqCst), n as usize, "a storm value not dropped");
        }
    }
    stop.store(true, Relaxed);
    let rate = t.join().expect("the hot thread");
    (rate, most_pending)
}

/// One memory row, measured in this process: bytes per value and of those
/// `malloc`'s, or `None` without /proc.
fn memory_row(n: usize, cpus: &[usize], what: &str) -> Option<(f64, Option<f64>)> {
    match what {
        "arc" => return bytes_per_value(n, || Arc::new(0u64), |_| {}),
        "plain" => return bytes_per_value(n, || Shared::new(0u64), |_| {}),
        _ => {}
    }
    let k: usize = what
        .parse()
        .ok()
        .filter(|k| (1..=cpus.len()).contains(k))
        .unwrap_or_else(|| {
            panic!(
                "shared_costs --memory-row: {what:?} is not arc, plain or 1..={}",
                cpus.len()
            )
        });
    // Each CPU's first use has one-time costs that are not per value (the
    // workers' threads, their registration): paid before the reading.
    let workers = Workers::new(&cpus[..k]);
    let warm = Shared::new(0u64);
    Shared::promote(&warm);
    workers.use_on(std::slice::from_ref(&warm), k);
    drop(warm);
    bytes_per_value(
        n,
        || {
            let s = Shared::new(0u64);
            Shared::promote(&s);
            s
        },
        |v| workers.use_on(v, k),
    )
}

/// The memory rows, against `Arc<u64>` and the bound (`Arc`'s +
/// 64 + 8 per CPU that used it), each in fresh processes of this program:
/// the arena keeps a dropped value's slot (and its resident pages) for the
/// next one, so a row measured after another would not pay for the slots'
/// memory.
fn memory_rows(n: usize, cpus: &[usize], reps: usize) {
    let once = |what: &str| -> Option<(f64, f64)> {
        let out = std::process::Command::new(std::env::current_exe().ok()?)
            .args(["--memory", &n.to_string(), "--memory-row", what])
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "shared_costs: the memory row {what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = String::from_utf8_lossy(&out.stdout);
        let mut words = out.split_whitespace().map(|w| w.parse::<f64>().ok());
        Some((words.next()??, words.next()??))
    };
    // The median of `reps` processes: the heap's and the arena's layouts
    // differ from run to run by a few percent (`malloc`'s count does not).
    let measure = |what: &str| -> Option<(f64, f64)> {
        let (mut rss, mut heap): (Vec<f64>, Vec<f64>) =
            (0..reps).filter_map(|_| once(what)).unzip();
        (!rss.is_empty()).then(|| (median(&mut rss), median(&mut heap)))
    };
    let Some((arc, arc_heap)) = measure("arc") else {
        println!("\nmemory: n/a (no /proc/self/status here)");
        return;
    };
    println!();
    println!("| memory per idle value, {n} values, each row in fresh processes (median of {reps}) | anonymous RSS, bytes | of which `malloc`'s | bound: `Arc` + 64 + 8 x CPUs |");
    println!("|---|--:|--:|--:|");
    println!("| `Arc<u64>` | {arc:.1} | {arc_heap:.1} | |");
    let row = |what: String, b: Option<(f64, f64)>, cpus_used: usize| {
        let bound = arc + 64.0 + 8.0 * cpus_used as f64;
        let (b, h) = b.map_or(("n/a".into(), "n/a".into()), |(b, h)| {
            (format!("{b:.1}"), format!("{h:.1}"))
        });
        println!("| {what} | {b} | {h} | {bound:.0} |");
    };
    row(
        "`Shared<u64>`, never cloned (atomic)".into(),
        measure("plain"),
        0,
    );
    // 1, 2, 4, ... and every allowed CPU: the growth per CPU shows apart
    // from what a promotion costs once.
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k < cpus.len())
        .collect();
    ks.push(cpus.len());
    let mut rows = vec![];
    for k in ks {
        let b = measure(&k.to_string());
        row(format!("`Shared<u64>`, promoted, used on {k} CPU(s)"), b, k);
        rows.extend(b.map(|(b, _)| (k, b)));
    }
    if let (Some(&(k0, b0)), Some(&(k1, b1))) = (rows.first(), rows.last()) {
        if k1 > k0 {
            println!(
                "\npromoted: {:.1} bytes per value on its first CPU over `Arc`'s, {:.1} per further CPU",
                b0 - arc,
                (b1 - b0) / (k1 - k0) as f64
            );
        }
    }
}

fn main() {
    let a = Args::parse();
    let cpus = affinity::allowed_cpus();
    if let Some(what) = &a.memory_row {
        if let Some((b, h)) = memory_row(a.memory.max(1), &cpus, what) {
            println!("{b} {}", h.unwrap_or(f64::NAN));
        }
        return;
    }
    println!(
        "shared_costs: backend {:?}, {} allowed CPUs, {} reps",
        backend(),
        cpus.len(),
        a.reps
    );

    let mut rows = vec![];
    for &us in &a.batch_delay_us {
        percpu_ref::set_batch_delay(Duration::from_micros(us));
        let (mut p50, mut p99, mut max) = (vec![], vec![], vec![]);
        for _ in 0..a.reps {
            let mut d = release_delays(a.delays);
            p50.push(median(&mut d));
            p99.push(percentile(&mut d, 99.0));
            max.push(percentile(&mut d, 100.0));
        }
        rows.push((us, median(&mut p50), median(&mut p99), median(&mut max)));
    }
    percpu_ref::set_batch_delay(percpu_ref::DEFAULT_BATCH_DELAY);
    println!();
    if a.counts_only {
        println!(
            "release: {} values x {} reps x {} batch delays, every one dropped once",
            a.delays,
            a.reps,
            rows.len()
        );
    } else {
        println!("| release delay, idle process (ms), {} values a rep | batch delay (us) | median | p99 | max |", a.delays);
        println!("|---|--:|--:|--:|--:|");
        for (us, p50, p99, max) in rows {
            println!("| last drop of a promoted value to its `Drop` | {us} | {p50:.2} | {p99:.2} | {max:.2} |");
        }
    }

    let (mut first, mut last): (Vec<[f64; 2]>, Vec<[f64; 2]>) = (vec![], vec![]);
    for _ in 0..a.reps {
        let (mut f, mut l) = into_inner_waits(a.into_inner);
        first.push([median(&mut f), percentile(&mut f, 99.0)]);
        last.push([median(&mut l), percentile(&mut l, 99.0)]);
    }
    println!();
    if a.counts_only {
        println!(
            "into_inner: {} values x {} reps, each given back once, to its last handle",
            a.into_inner, a.reps
        );
    } else {
        let row = |rows: &[[f64; 2]], k: usize| {
            median(&mut rows.iter().map(|r| r[k]).collect::<Vec<_>>())
        };
        println!("| `into_inner` of a promoted value, idle process (ms), {} values a rep | median | p99 |", a.into_inner);
        println!("|---|--:|--:|");
        println!(
            "| first of two handles (`None`) | {:.2} | {:.2} |",
            row(&first, 0),
            row(&first, 1)
        );
        println!(
            "| the last (`Some`) | {:.2} | {:.2} |",
            row(&last, 0),
            row(&last, 1)
        );
    }

    let mut exact: [Vec<[f64; 2]>; 5] = Default::default();
    for _ in 0..a.reps {
        for (k, mut d) in exact_checks(a.into_inner, &cpus).into_iter().enumerate() {
            exact[k].push([median(&mut d), percentile(&mut d, 99.0)]);
        }
    }
    println!();
    if a.counts_only {
        println!(
            "exact checks: {} values x {} reps, each unique once its other handle was dropped",
            a.into_inner, a.reps
        );
    } else {
        println!(
            "| exact checks of a promoted value (µs), {} values a rep | median | p99 |",
            a.into_inner
        );
        println!("|---|--:|--:|");
        let names = [
            "`get_mut`, another handle alive (`None`)",
            "`get_mut`, the only handle (`Some`)",
            "`try_unwrap`, the only handle (`Ok`)",
            "floor: `get_mut` of an unpromoted value (`Arc`'s check)",
            "`get_mut` while another CPU clones and drops (`None`)",
        ];
        for (name, rows) in names.iter().zip(&exact) {
            let col = |k: usize| median(&mut rows.iter().map(|r| r[k]).collect::<Vec<_>>());
            println!("| {name} | {:.2} | {:.2} |", col(0), col(1));
        }
    }

    if a.memory > 0 {
        memory_rows(a.memory, &cpus, a.reps);
    }

    let mut share = vec![];
    for _ in 0..a.reps {
        if let Some(s) = idle_cost(a.values, Duration::from_millis(a.idle_ms)) {
            share.push(s * 100.0);
        }
    }
    println!();
    if a.counts_only {
        println!(
            "idle: {} promoted values, none dropped while held, all after",
            a.values
        );
        return;
    }
    let cpu = if share.is_empty() {
        "n/a (no getrusage here)".to_string()
    } else {
        format!("{:.3}", median(&mut share))
    };
    println!(
        "| {} idle promoted values, {} ms | CPU, % of one core |",
        a.values, a.idle_ms
    );
    println!("|---|--:|");
    println!("| the whole process (the engine included) | {cpu} |");

    let (mut s_rate, mut a_rate, mut ratio) = (vec![], vec![], vec![]);
    for _ in 0..a.reps {
        let arc = arc_churn(a.churn);
        let shared = shared_churn(a.churn);
        a_rate.push(arc / 1e6);
        s_rate.push(shared / 1e6);
        ratio.push(shared / arc);
    }
    println!();
    println!("| churn, 1 thread, new + clone + drop + the value's drop | M values/s | / `Arc` |");
    println!("|---|--:|--:|");
    println!("| `Arc` | {:.2} | |", median(&mut a_rate));
    println!(
        "| `Shared` (never promoted; ends with a flush) | {:.2} | {:.3} |",
        median(&mut s_rate),
        median(&mut ratio)
    );

    let d = Duration::from_millis(a.hot_ms);
    let (mut alone, mut with, mut kept, mut pend) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.reps {
        let (r0, _) = hot_rate(&cpus, d, None);
        let (r1, p) = hot_rate(&cpus, d, Some(a.storm));
        alone.push(r0 / 1e6);
        with.push(r1 / 1e6);
        kept.push(r1 / r0);
        pend.push(p as f64);
    }
    println!();
    println!(
        "| hot value, 1 thread on CPU {}; storm of {} promoted values on CPU {} | M pairs/s | kept | most values awaiting their drop |",
        cpus[0],
        a.storm,
        cpus.get(1).unwrap_or(&cpus[0])
    );
    println!("|---|--:|--:|--:|");
    println!("| alone | {:.1} | | |", median(&mut alone));
    println!(
        "| during the storm | {:.1} | {:.3} | {:.0} |",
        median(&mut with),
        median(&mut kept),
        median(&mut pend)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short end-to-end run: every value dropped once, none early.
    #[test]
    fn a_short_run_drops_every_value() {
        let d = release_delays(3);
        assert_eq!(d.len(), 3);
        assert!(idle_cost(100, Duration::from_millis(20)).is_none_or(|s| s >= 0.0));
        assert!(shared_churn(1000) > 0.0);
        let cpus = affinity::allowed_cpus();
        let (_, most) = hot_rate(&cpus, Duration::from_millis(10), Some(2000));
        assert!(most <= 2000);
    }
}
