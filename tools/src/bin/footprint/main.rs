//! What a ref costs at scale: memory per ref and how fast refs
//! are created and dropped, on each available backend, in one run:
//! `cargo run --release -p percpu-ref-tools --bin footprint [-- --help]`.
//!
//! **Memory.** For each backend and each `--refs` N, `--reps` fresh child
//! processes (this program re-executed with a hidden `--child` option;
//! the row shown is the one with the median RSS growth) each create N refs
//! with `PercpuRef::with_backend` into a `Vec`, and reports:
//! - RSS growth per ref: resident memory from `/proc/self/statm` after
//!   creating the refs minus before, over N. The `Vec`'s storage (N ×
//!   `size_of::<PercpuRef>()`) is allocated and written before the first
//!   reading, so it is not in the growth, which is thus what a ref
//!   allocates outside its object; the "total" column adds the object's
//!   size back, since the object lives wherever its owner puts it.
//! - the crate's own accounting: `percpu_bytes()` summed over the refs, plus
//!   `size_of::<PercpuRef>()`, and the growth of `percpu::arena_stats()`
//!   (reserved bytes and chunks; both backends keep their counters in the
//!   arena).
//! - reuse: the refs are dropped and N more created; the second batch's RSS
//!   growth, as a fraction of the first's, says whether freed memory is
//!   reused (the target is less than 10 %). Memory returned to the
//!   system on drop fails that check too; the second batch's peak above
//!   the first's tells such a return (near 0) from a leak (near 100 %).
//!
//! **Throughput.** create + get + put + drop of a ref per second, every
//! thread in its own loop, at 1 thread and at all threads (started together
//! at a barrier, stopped after `--duration-ms`), median of `--reps` runs;
//! beside it `Arc<u64>`'s new + clone + drop. Each ratio the targets set a
//! target for is printed with whether this run meets it.
//!
//! **Limits.** RSS is counted in whole pages, so a row is exact only to a
//! page over N (0.04 B at 10^5 refs). RSS shows what the allocator took
//! from the system, not what it handed out: malloc's per-allocation
//! overhead and alignment padding are included (as they should be: they
//! are what a ref costs), and memory freed but kept by the allocator is
//! invisible, which is why every row runs in a new process. Transparent
//! huge pages set to `always` would make RSS grow by 2 MiB steps. Elsewhere
//! than Linux there is no `statm` and the RSS columns print "n/a". The
//! throughput numbers are as noisy as the machine: a busy machine lowers
//! the all-threads column most.

#[path = "../../../../benches/common/affinity.rs"]
mod affinity;
mod index;
mod markdown;
mod memory;
mod report;
mod thp;
mod throughput;

#[cfg(test)]
mod tests;

use crate::index::{index_rows, index_spec, measure_index};
use crate::memory::{child_spec, measure_in_child, measure_memory};
use crate::report::{callgrind_counts, run};
use crate::thp::{thp_rows, time_walks};
use clap::builder::RangedU64ValueParser;
use clap::{CommandFactory, FromArgMatches, Parser};
use serde_json::json;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Ref counts of the memory rows.
const DEFAULT_REFS: &str = "100000,1000000";
/// The targets: create + drop scaling with threads, create + drop at
/// `Arc`'s speed or better on one thread, and memory reused.
const SCALING_TARGET: f64 = 1.8;
const VS_ARC_TARGET: f64 = 1.0;
const REUSE_TARGET: f64 = 0.10;
/// Bytes per ref beyond the counters that the RSS target allows: the
/// `PercpuRef` itself (its two cache lines), so that the RSS growth
/// proper must fit in the counters.
const RSS_SLACK: usize = memory::OBJECT;
/// Where `/proc/meminfo` cannot be read: refuse a row that may need more.
const FALLBACK_MEMORY_LIMIT: u64 = 4 << 30;

/// footprint: memory per ref and create+drop throughput on each backend.
///
/// For each --refs count and each available backend, a child process
/// creates that many refs and reports RSS growth per ref, the crate's own
/// accounting (percpu_bytes, the arena), and whether a second batch
/// reuses the first one's memory. Then every thread loops on create + get +
/// put + drop at 1 and at all threads, beside Arc<u64>'s new + clone +
/// drop. Prints markdown tables with their targets.
#[derive(Parser, Debug)]
#[command(
    name = "footprint",
    verbatim_doc_comment,
    override_usage = "cargo run --release -p percpu-ref-tools --bin footprint -- [OPTIONS]",
    after_help = "Progress goes to stderr. Exit status 2 means a bad option."
)]
struct Args {
    /// Ref counts of the memory rows, comma-separated
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = DEFAULT_REFS,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000_000)
    )]
    refs: Vec<usize>,

    /// Length of one timed throughput run in ms
    #[arg(
        long,
        value_name = "N",
        default_value_t = 500,
        value_parser = RangedU64ValueParser::<u64>::new().range(1..=60_000)
    )]
    duration_ms: u64,

    /// Timed runs per throughput cell; the median is shown
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=100)
    )]
    reps: usize,

    /// Threads of the "all threads" column [default: available parallelism]
    #[arg(
        long,
        value_name = "N",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024)
    )]
    threads: Option<usize>,

    /// Print one JSON document instead of the markdown tables
    #[arg(long)]
    json: bool,

    /// The memory rows only, no throughput (for emulated guests, where
    /// times mean nothing: scripts/vm-test); ends with a `vm-counts:` line
    #[arg(long)]
    counts_only: bool,

    /// Refs of the index rows (RSS per ref under `cpu_id` and `mm_cid`
    /// indexing with threads that hop over every CPU); 0 skips them
    #[arg(
        long,
        value_name = "N",
        default_value_t = 100_000,
        value_parser = RangedU64ValueParser::<usize>::new().range(0..=10_000_000)
    )]
    index_refs: usize,

    /// Instructions per iteration of the churn loops, from FILE: the output
    /// of scripts/callgrind-pair for the same commit (rseq-churn,
    /// sharded-churn, arc-churn), shown beside the churn rows
    #[arg(long, value_name = "FILE")]
    callgrind: Option<std::path::PathBuf>,

    /// Internal: measure BACKEND:REFS in this process, print one JSON line
    #[arg(long, hide = true, value_name = "BACKEND:REFS")]
    child: Option<String>,

    /// Internal: measure an index row THREADS:REFS in this process
    #[arg(long, hide = true, value_name = "THREADS:REFS")]
    index_child: Option<String>,

    /// Internal: time get + put over REFS refs in this process
    #[arg(long, hide = true, value_name = "REFS")]
    thp_child: Option<usize>,
}

/// Parsed options with the defaults that only the machine can give.
#[derive(Clone, Debug, PartialEq)]
struct Options {
    refs: Vec<usize>,
    duration: Duration,
    reps: usize,
    threads: usize,
    json: bool,
    counts_only: bool,
    index_refs: usize,
    callgrind: Option<std::path::PathBuf>,
    child: Option<String>,
    index_child: Option<String>,
    thp_child: Option<usize>,
}

/// Parses a command line (program name first); help is an `Err` too.
fn parse<I, T>(args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = Args::command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    let a = Args::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
    Ok(Options {
        refs: a.refs,
        duration: Duration::from_millis(a.duration_ms),
        reps: a.reps,
        threads: a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        json: a.json,
        counts_only: a.counts_only,
        index_refs: a.index_refs,
        callgrind: a.callgrind,
        child: a.child,
        index_child: a.index_child,
        thp_child: a.thp_child,
    })
}

fn main() -> ExitCode {
    let opts = match parse(std::env::args_os()) {
        Ok(o) => o,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    if let Some(status) = child(&opts) {
        return status;
    }
    let start = Instant::now();
    let report = run(&opts, &mut measure_in_child, &mut |l| eprintln!("{l}")).and_then(|mut r| {
        r.index = index_rows(opts.index_refs, &mut |l| eprintln!("{l}"))?;
        if let Some(path) = &opts.callgrind {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--callgrind {}: {e}", path.display()))?;
            r.instructions = callgrind_counts(&text);
        }
        if !opts.counts_only && opts.index_refs > 0 {
            r.thp = thp_rows(opts.reps, &mut |l| eprintln!("{l}"))?;
        }
        Ok(r)
    });
    match report {
        Ok(report) => {
            if opts.counts_only {
                print!("{}", report.counts());
            } else if opts.json {
                println!("{:#}", report.to_json());
            } else {
                print!("{}", report.markdown());
            }
            eprintln!("footprint: done in {:.1} s", start.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("footprint: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The hidden child modes (`--child`, `--index-child`, `--thp-child`):
/// measures one row in this process and prints it as one JSON line; `None`
/// when this process is not a child.
fn child(opts: &Options) -> Option<ExitCode> {
    let (option, spec, row) = if let Some(spec) = &opts.child {
        let row = child_spec(spec).and_then(|(b, n)| measure_memory(b, n));
        ("--child", spec, row.map(|r| r.to_json()))
    } else if let Some(spec) = &opts.index_child {
        let row = index_spec(spec).and_then(|(t, n)| measure_index(t, n));
        ("--index-child", spec, row.map(|r| r.to_json()))
    } else {
        let (seq, strided) = time_walks(opts.thp_child?.max(1));
        println!("{}", json!({ "sequential_ns": seq, "strided_ns": strided }));
        return Some(ExitCode::SUCCESS);
    };
    Some(match row {
        Ok(row) => {
            println!("{row}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("footprint {option} {spec}: {e}");
            ExitCode::FAILURE
        }
    })
}
