//! Command-line options: the clap definition, and the defaults that only the
//! machine can give (thread counts, backend, run length) resolved into
//! `Options`.
//!
//! clap names the option and the value in every refusal and exits with
//! status 2 through `main`.

use crate::harness::Kind;
use clap::builder::RangedU64ValueParser;
use clap::{Command, CommandFactory, FromArgMatches, Parser, ValueEnum};
use percpu_ref::Backend;
use std::ffi::OsString;
use std::time::Duration;

/// The copy sizes of the kernel's table, as clap parses a default.
const DEFAULT_SIZES: &str = "0,32,64,128,256,512";
/// Default wall-clock budget for all runs together.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);
/// Bounds of the per-run duration the budget is spread into.
const MIN_DEFAULT_RUN: Duration = Duration::from_millis(200);
const MAX_DEFAULT_RUN: Duration = Duration::from_millis(1000);
const MAX_SIZE: usize = 1 << 24;

/// copy_size_table: the kernel's atomic vs percpu_ref copy-size tables, measured here.
///
/// Every thread, pinned to its own CPU, loops on: take a reference, copy SIZE
/// bytes, drop the reference, on one object shared by all threads. 'atomic' is
/// an AtomicUsize (fetch_add / fetch_sub + zero test, as atomic_t), 'percpu' is
/// PercpuRef::get / put, and 'floor' is the same loop with no counting (always
/// measured, interleaved with the others). Loops per second are summed over
/// threads; each cell is the median of several timed runs. Beside the kernel's
/// columns, each counter's overhead is printed in ns per loop per thread above
/// the floor (1e9 x threads / loops per second, minus the floor's), and a
/// paragraph after the tables explains the columns from these numbers.
#[derive(Parser, Debug)]
#[command(
    name = "copy_size_table",
    verbatim_doc_comment,
    override_usage = "cargo run --release -p percpu-ref-tools --bin copy_size_table -- [OPTIONS]",
    // The hand-written parser let a repeated option replace the earlier
    // value; scripts may rely on appending an override.
    args_override_self = true,
    after_help = "Progress goes to stderr. Exit status 2 means a bad option."
)]
pub struct Args {
    /// Length of one timed run in ms [default: the 60 s
    /// budget spread over all runs, the floor's included,
    /// within 200..1000 ms: 555 ms on 2 CPUs with one backend]
    #[arg(
        long,
        value_name = "N",
        verbatim_doc_comment,
        value_parser = RangedU64ValueParser::<u64>::new().range(1..=600_000)
    )]
    duration_ms: Option<u64>,

    /// Timed runs per cell; the median is shown
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=1000)
    )]
    reps: usize,

    /// Thread counts, e.g. 1,2,4 [default: 1,2,4,... up to
    /// the CPU count, and the CPU count itself]
    // `std::vec::Vec` rather than `Vec`: clap would otherwise take one number
    // per occurrence, and the list is one comma-separated value.
    #[arg(long, value_name = "LIST", verbatim_doc_comment, value_parser = threads_parser(usize::MAX))]
    threads: Option<std::vec::Vec<usize>>,

    /// Copy sizes in bytes
    #[arg(
        long,
        value_name = "LIST",
        default_value = DEFAULT_SIZES,
        value_parser = sizes_parser
    )]
    sizes: std::vec::Vec<usize>,

    /// Percpu backends to measure: default, rseq, sharded
    /// [default: the process default backend only]
    #[arg(long, value_name = "LIST", verbatim_doc_comment, value_parser = backends_parser)]
    backends: Option<std::vec::Vec<Backend>>,

    /// Print JSON instead of the tables
    #[arg(long, conflicts_with = "markdown")]
    json: bool,

    /// Print one markdown table instead of the tables
    #[arg(long)]
    markdown: bool,

    /// Also write a plot of throughput against threads
    #[arg(long, value_name = "PATH", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    svg: Option<String>,

    /// Y axis of the plot
    #[arg(long, value_name = "S", value_enum, default_value_t = Scale::Log)]
    svg_scale: Scale,
}

/// Output format on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tables,
    Json,
    Markdown,
}

/// Plot y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scale {
    Log,
    Linear,
}

/// Parsed options with every default resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub duration: Duration,
    pub reps: usize,
    pub threads: Vec<usize>,
    pub sizes: Vec<usize>,
    pub kinds: Vec<Kind>,
    pub format: Format,
    pub svg: Option<String>,
    pub scale: Scale,
}

/// The command line, with `--threads` bounded by `cpus`: threads are pinned
/// one per CPU, so a count above it can only fail later, after measuring.
pub fn command(cpus: usize) -> Command {
    Args::command().mut_arg("threads", |a| a.value_parser(threads_parser(cpus)))
}

/// Parses a command line (program name first). `cpus` is how many CPUs the
/// process may run on. Help is an `Err` too, of kind `DisplayHelp`, as clap
/// reports it; `Error::exit_code` tells it from a refusal.
pub fn parse<I, T>(args: I, cpus: usize) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = command(cpus);
    let matches = cmd.try_get_matches_from_mut(args)?;
    let args = Args::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
    Ok(resolve(args, cpus))
}

fn resolve(args: Args, cpus: usize) -> Options {
    let threads = args.threads.unwrap_or_else(|| default_threads(cpus));
    let mut kinds = vec![Kind::Atomic];
    kinds.extend(
        args.backends
            .unwrap_or_else(|| vec![percpu_ref::backend()])
            .into_iter()
            .map(Kind::Percpu),
    );
    // The floor is not optional: without it the throughput columns cannot
    // say how much of a loop is the counting. It counts in the budget, so
    // the default run stays about a minute with shorter runs.
    kinds.push(Kind::None);
    let runs = threads.len() * args.sizes.len() * kinds.len() * args.reps;
    let format = match (args.json, args.markdown) {
        (true, _) => Format::Json,
        (_, true) => Format::Markdown,
        _ => Format::Tables,
    };
    Options {
        duration: args
            .duration_ms
            .map_or_else(|| default_duration(runs), Duration::from_millis),
        reps: args.reps,
        threads,
        sizes: args.sizes,
        kinds,
        format,
        svg: args.svg,
        scale: args.svg_scale,
    }
}

/// 1, 2, 4, ... below `cpus`, then `cpus`.
pub fn default_threads(cpus: usize) -> Vec<usize> {
    let mut t: Vec<usize> = std::iter::successors(Some(1usize), |&n| n.checked_mul(2))
        .take_while(|&n| n < cpus)
        .collect();
    t.push(cpus.max(1));
    t
}

/// The default budget spread over `runs` timed runs, within bounds.
pub fn default_duration(runs: usize) -> Duration {
    (DEFAULT_BUDGET / runs.max(1) as u32).clamp(MIN_DEFAULT_RUN, MAX_DEFAULT_RUN)
}

fn threads_parser(cpus: usize) -> impl Fn(&str) -> Result<Vec<usize>, String> + Clone {
    move |v| {
        list(v, 1, cpus, |max| {
            format!("threads are pinned one per CPU and this process may run on {max} CPUs")
        })
    }
}

fn sizes_parser(v: &str) -> Result<Vec<usize>, String> {
    list(v, 0, MAX_SIZE, |max| format!("must be between 0 and {max}"))
}

/// A comma-separated list of numbers in `min..=max`, sorted, no duplicates,
/// since the tables have one row or column per value.
fn list(
    v: &str,
    min: usize,
    max: usize,
    why: impl Fn(usize) -> String,
) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in v.split(',') {
        let n: usize = part
            .trim()
            .parse()
            .map_err(|_| format!("'{part}' is not a whole number"))?;
        if n < min || n > max {
            return Err(format!("{n} is out of range: {}", why(max)));
        }
        out.push(n);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Backends in the order given (they are table columns), each once.
fn backends_parser(v: &str) -> Result<Vec<Backend>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let b = match part {
            "default" => percpu_ref::backend(),
            "rseq" => Backend::Rseq,
            "sharded" => Backend::Sharded,
            _ => {
                return Err(format!(
                    "unknown backend '{part}' (expected default, rseq or sharded)"
                ))
            }
        };
        if !b.is_available() {
            return Err(format!("the {b} backend is not available in this process"));
        }
        if !out.contains(&b) {
            out.push(b);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn try_run(s: &str, cpus: usize) -> Result<Options, clap::Error> {
        parse(
            std::iter::once("copy_size_table").chain(s.split_whitespace()),
            cpus,
        )
    }

    fn run(s: &str, cpus: usize) -> Options {
        try_run(s, cpus).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        Args::command().debug_assert();
        command(2).debug_assert();
    }

    #[test]
    fn defaults_fit_the_budget() {
        let o = run("", 2);
        assert_eq!(o.threads, vec![1, 2]);
        assert_eq!(o.sizes, [0, 32, 64, 128, 256, 512]);
        assert_eq!(o.reps, 3);
        assert_eq!(o.format, Format::Tables);
        assert_eq!((o.svg, o.scale), (None, Scale::Log));
        assert_eq!(
            o.kinds,
            vec![
                Kind::Atomic,
                Kind::Percpu(percpu_ref::backend()),
                Kind::None
            ]
        );
        // The floor is one of the kinds the budget is spread over.
        let runs = 2 * 6 * 3 * 3;
        assert_eq!(o.duration.as_millis(), 555, "as the help text says");
        let total = o.duration * runs;
        assert!(
            total <= DEFAULT_BUDGET && total >= DEFAULT_BUDGET * 9 / 10,
            "{total:?}"
        );
        assert_eq!(default_threads(1), vec![1]);
        assert_eq!(default_threads(6), vec![1, 2, 4, 6]);
        assert_eq!(default_threads(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(default_duration(1), Duration::from_millis(1000));
        assert_eq!(default_duration(10_000), Duration::from_millis(200));
    }

    #[test]
    fn parses_every_option() {
        let o = run(
            "--duration-ms 50 --reps=2 --threads 2,1,2 --sizes 64,0 --backends sharded,default \
             --svg out.svg --svg-scale linear --markdown",
            2,
        );
        assert_eq!(o.duration, Duration::from_millis(50));
        assert_eq!(o.reps, 2);
        assert_eq!(o.threads, vec![1, 2]);
        assert_eq!(o.sizes, vec![0, 64]);
        assert_eq!(o.kinds[..2], [Kind::Atomic, Kind::Percpu(Backend::Sharded)]);
        assert_eq!(o.kinds.last(), Some(&Kind::None));
        assert_eq!(o.svg.as_deref(), Some("out.svg"));
        assert_eq!(o.scale, Scale::Linear);
        assert_eq!(o.format, Format::Markdown);
        assert_eq!(run("--json", 2).format, Format::Json);
        // What CI runs.
        let ci = run("--duration-ms 50 --reps 1", 2);
        assert_eq!((ci.duration.as_millis(), ci.reps), (50, 1));
        // A repeated option replaces the earlier value, as before clap.
        assert_eq!(run("--reps 2 --reps 5 --json --json", 2).reps, 5);
        assert_eq!(run("--threads 1 --threads 2", 2).threads, vec![2]);
        for h in ["-h", "--help"] {
            let e = try_run(h, 2).unwrap_err();
            assert_eq!((e.kind(), e.exit_code()), (ErrorKind::DisplayHelp, 0));
        }
    }

    #[test]
    fn help_lists_every_option() {
        let help = command(2).render_long_help().to_string();
        for flag in [
            "--duration-ms <N>",
            "--reps <N>",
            "--threads <LIST>",
            "--sizes <LIST>",
            "--backends <LIST>",
            "--json",
            "--markdown",
            "--svg <PATH>",
            "--svg-scale <S>",
            "--help",
            "555 ms on 2 CPUs",
            "[default: 0,32,64,128,256,512]",
            "[possible values: log, linear]",
            "Exit status 2 means a bad option",
        ] {
            assert!(help.contains(flag), "{flag} missing from\n{help}");
        }
    }

    #[test]
    fn bad_options_name_option_and_value() {
        for (line, want) in [
            ("--reps 0", "'0' for '--reps <N>': 0 is not in 1..=1000"),
            ("--reps x", "'x' for '--reps <N>'"),
            ("--duration-ms 600001", "'600001' for '--duration-ms <N>'"),
            (
                "--duration-ms",
                "a value is required for '--duration-ms <N>'",
            ),
            (
                "--threads 1,3",
                "'1,3' for '--threads <LIST>': 3 is out of range: threads are pinned one per CPU \
                 and this process may run on 2 CPUs",
            ),
            (
                "--threads 0",
                "'0' for '--threads <LIST>': 0 is out of range",
            ),
            (
                "--sizes 1,,2",
                "'1,,2' for '--sizes <LIST>': '' is not a whole number",
            ),
            ("--sizes 16777217", "16777217 is out of range"),
            (
                "--backends foo",
                "'foo' for '--backends <LIST>': unknown backend 'foo'",
            ),
            (
                "--json --markdown",
                "'--json' cannot be used with '--markdown'",
            ),
            ("--svg-scale cubic", "'cubic' for '--svg-scale <S>'"),
            ("--svg=", "'--svg <PATH>'"),
            ("--frobnicate", "unexpected argument '--frobnicate'"),
        ] {
            match try_run(line, 2) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(want), "{line}: {msg}");
                    assert_eq!(e.exit_code(), 2, "{line}: {msg}");
                }
                Ok(o) => panic!("{line} accepted: {o:?}"),
            }
        }
        if !Backend::Rseq.is_available() {
            let e = try_run("--backends rseq", 2).unwrap_err().to_string();
            assert!(e.contains("rseq backend is not available"), "{e}");
        }
    }
}
