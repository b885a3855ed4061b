//! Command-line options: parsing and validation, nothing else.
//!
//! Every refusal names the option and the value, and `main` turns it into
//! exit status 2.

use crate::harness::Kind;
use percpu_ref::Backend;
use std::time::Duration;

/// The copy sizes of the kernel's table.
pub const DEFAULT_SIZES: [usize; 6] = [0, 32, 64, 128, 256, 512];
/// Default wall-clock budget for all runs together.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);
/// Bounds of the per-run duration the budget is spread into.
const MIN_DEFAULT_RUN: Duration = Duration::from_millis(200);
const MAX_DEFAULT_RUN: Duration = Duration::from_millis(1000);
const MAX_SIZE: usize = 1 << 24;

pub const HELP: &str = "\
copy_size_table: the kernel's atomic vs percpu_ref copy-size tables, measured here.

Every thread, pinned to its own CPU, loops on: take a reference, copy SIZE
bytes, drop the reference, on one object shared by all threads. 'atomic' is
an AtomicUsize (fetch_add / fetch_sub + zero test, as atomic_t), 'percpu' is
PercpuRef::get / put, and 'floor' is the same loop with no counting (always
measured, interleaved with the others). Loops per second are summed over
threads; each cell is the median of several timed runs. Beside the kernel's
columns, each counter's overhead is printed in ns per loop per thread above
the floor (1e9 x threads / loops per second, minus the floor's), and a
paragraph after the tables explains the columns from these numbers.

USAGE:
    cargo run --release --example copy_size_table -- [OPTIONS]

OPTIONS:
    --duration-ms N     length of one timed run (default: the 60 s budget
                        spread over all runs, the floor's included, within
                        200..1000 ms: 555 ms on 2 CPUs with one backend)
    --reps N            timed runs per cell; the median is shown (default 3)
    --threads LIST      thread counts, e.g. 1,2,4 (default 1,2,4,... up to
                        the CPU count, and the CPU count itself)
    --sizes LIST        copy sizes in bytes (default 0,32,64,128,256,512)
    --backends LIST     percpu backends to measure: default, rseq, sharded
                        (default: the process default backend only)
    --json              print JSON instead of the tables
    --markdown          print one markdown table instead of the tables
    --svg PATH          also write a plot of throughput against threads
    --svg-scale S       y axis of the plot: log (default) or linear
    -h, --help          print this help

Progress goes to stderr. Exit status 2 means a bad option.
";

/// Output format on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tables,
    Json,
    Markdown,
}

/// Plot y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Log,
    Linear,
}

/// Parsed and validated options.
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

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Run(Options),
    Help,
}

/// Parses `args` (without the program name). `cpus` is how many CPUs the
/// process may run on (threads are pinned one per CPU).
pub fn parse(args: &[String], cpus: usize) -> Result<Parsed, String> {
    let mut duration = None;
    let mut reps = 3;
    let mut threads = None;
    let mut sizes = DEFAULT_SIZES.to_vec();
    let mut backends: Option<Vec<Backend>> = None;
    let mut format = Format::Tables;
    let mut svg = None;
    let mut scale = Scale::Log;

    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name}: missing value"))
        };
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--duration-ms" => {
                let ms = number(name, &value()?, 1, 600_000)?;
                duration = Some(Duration::from_millis(ms as u64));
            }
            "--reps" => reps = number(name, &value()?, 1, 1000)?,
            "--threads" => threads = Some(list(name, &value()?, 1, cpus)?),
            "--sizes" => sizes = list(name, &value()?, 0, MAX_SIZE)?,
            "--backends" => backends = Some(backend_list(name, &value()?)?),
            "--json" => set_format(&mut format, Format::Json, name)?,
            "--markdown" => set_format(&mut format, Format::Markdown, name)?,
            "--svg" => {
                let v = value()?;
                if v.is_empty() {
                    return Err(format!("{name}: empty path"));
                }
                svg = Some(v);
            }
            "--svg-scale" => {
                scale = match value()?.as_str() {
                    "log" => Scale::Log,
                    "linear" => Scale::Linear,
                    v => return Err(format!("{name} '{v}': expected log or linear")),
                }
            }
            _ => return Err(format!("unknown option '{arg}'")),
        }
    }

    let threads = threads.unwrap_or_else(|| default_threads(cpus));
    let mut kinds = vec![Kind::Atomic];
    kinds.extend(
        backends
            .unwrap_or_else(|| vec![percpu_ref::backend()])
            .into_iter()
            .map(Kind::Percpu),
    );
    // The floor is not optional: without it the throughput columns cannot
    // say how much of a loop is the counting. It counts in the budget, so
    // the default run stays about a minute with shorter runs.
    kinds.push(Kind::None);
    let runs = threads.len() * sizes.len() * kinds.len() * reps;
    Ok(Parsed::Run(Options {
        duration: duration.unwrap_or_else(|| default_duration(runs)),
        reps,
        threads,
        sizes,
        kinds,
        format,
        svg,
        scale,
    }))
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

fn set_format(format: &mut Format, want: Format, name: &str) -> Result<(), String> {
    if *format != Format::Tables && *format != want {
        return Err(format!("{name}: only one of --json and --markdown"));
    }
    *format = want;
    Ok(())
}

fn number(name: &str, v: &str, min: usize, max: usize) -> Result<usize, String> {
    let n: usize = v
        .trim()
        .parse()
        .map_err(|_| format!("{name} '{v}': not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{name} '{v}': must be between {min} and {max}"));
    }
    Ok(n)
}

/// A comma-separated list of numbers in `min..=max`, sorted, no duplicates.
fn list(name: &str, v: &str, min: usize, max: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in v.split(',') {
        let n: usize = part
            .trim()
            .parse()
            .map_err(|_| format!("{name} '{v}': '{part}' is not a whole number"))?;
        if n < min || n > max {
            let why = if name == "--threads" {
                format!("threads are pinned one per CPU and this process may run on {max} CPUs")
            } else {
                format!("must be between {min} and {max}")
            };
            return Err(format!("{name} '{v}': {n} is out of range: {why}"));
        }
        out.push(n);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn backend_list(name: &str, v: &str) -> Result<Vec<Backend>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let b = match part {
            "default" => percpu_ref::backend(),
            "rseq" => Backend::Rseq,
            "sharded" => Backend::Sharded,
            _ => {
                return Err(format!(
                    "{name} '{v}': unknown backend '{part}' (expected default, rseq or sharded)"
                ))
            }
        };
        if !b.is_available() {
            return Err(format!(
                "{name} '{v}': the {b} backend is not available in this process"
            ));
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

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn run(s: &str, cpus: usize) -> Options {
        match parse(&args(s), cpus) {
            Ok(Parsed::Run(o)) => o,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn defaults_fit_the_budget() {
        let o = run("", 2);
        assert_eq!(o.threads, vec![1, 2]);
        assert_eq!(o.sizes, DEFAULT_SIZES);
        assert_eq!(o.reps, 3);
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
        assert!(matches!(parse(&args("-h"), 2), Ok(Parsed::Help)));
    }

    #[test]
    fn bad_options_name_option_and_value() {
        for (line, want) in [
            ("--reps 0", "--reps '0'"),
            ("--reps x", "--reps 'x': not a whole number"),
            ("--duration-ms", "--duration-ms: missing value"),
            ("--threads 1,3", "--threads '1,3': 3 is out of range"),
            ("--threads 0", "--threads '0'"),
            ("--sizes 1,,2", "--sizes '1,,2': '' is not"),
            ("--backends foo", "unknown backend 'foo'"),
            ("--json --markdown", "only one of"),
            ("--svg-scale cubic", "--svg-scale 'cubic'"),
            ("--frobnicate", "unknown option '--frobnicate'"),
        ] {
            match parse(&args(line), 2) {
                Err(e) => assert!(e.contains(want), "{line}: {e}"),
                Ok(p) => panic!("{line} accepted: {p:?}"),
            }
        }
        if !Backend::Rseq.is_available() {
            let e = parse(&args("--backends rseq"), 2).unwrap_err();
            assert!(e.contains("rseq backend is not available"), "{e}");
        }
    }
}
