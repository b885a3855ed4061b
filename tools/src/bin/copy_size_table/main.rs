//! Reproduces the kernel's 2013 atomic-vs-percpu copy-size tables on this
//! machine: `cargo run --release -p percpu-ref-tools --bin copy_size_table [-- --help]`.
//!
//! Modules, one job each:
//! - `harness` (`benches/common/copy_size.rs`, shared with the criterion
//!   bench): the pinned threads, the timed loop, the balance check;
//! - `options`: the command line;
//! - `results`: the measured matrix and its medians;
//! - `table`: the kernel's text tables and a markdown table, with the
//!   floor and each counter's overhead above it beside the kernel's columns;
//! - `explain`: the paragraph after the tables, computed from the run;
//! - `json`, `svg`: the other outputs.

mod explain;
#[path = "../../../../benches/common/copy_size.rs"]
mod harness;
mod json;
mod options;
mod results;
mod svg;
mod table;

use options::{Format, Options};
use results::{Meta, Results};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cpus = harness::allowed_cpus();
    let opts = match options::parse(std::env::args_os(), cpus.len()) {
        Ok(o) => o,
        // Help on stdout with status 0, a refusal on stderr with status 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    // Open the plot file first, so that a bad path fails before a minute
    // of measuring rather than after.
    let svg_file = match opts.svg.as_deref().map(std::fs::File::create).transpose() {
        Ok(f) => f,
        Err(e) => {
            let path = opts.svg.as_deref().unwrap_or_default();
            eprintln!("copy_size_table: --svg {path}: cannot write: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&opts, cpus, &mut |line| eprintln!("{line}")) {
        Ok(r) => match output(&opts, &r, svg_file) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("copy_size_table: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("copy_size_table: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Measures the whole matrix. Repetitions are the outer loop so that a
/// slow phase of the machine spreads over all cells instead of biasing one.
fn run(
    opts: &Options,
    cpus: Vec<usize>,
    progress: &mut dyn FnMut(String),
) -> Result<Results, String> {
    let meta = Meta::here(opts.duration, opts.reps, cpus);
    let mut r = Results::new(meta, &opts.kinds, &opts.threads, &opts.sizes);
    let total = opts.reps * opts.sizes.len() * opts.threads.len() * opts.kinds.len();
    progress(format!(
        "copy_size_table: {total} runs of {} ms (about {:.0} s) on CPUs {:?}, default backend {}",
        opts.duration.as_millis(),
        (opts.duration * total as u32).as_secs_f64(),
        r.meta.allowed_cpus,
        r.meta.default_backend
    ));
    let mut done = 0;
    for rep in 1..=opts.reps {
        for &size in &opts.sizes {
            for &threads in &opts.threads {
                for &kind in &opts.kinds {
                    let sample = harness::measure(kind, threads, size, opts.duration)?;
                    done += 1;
                    progress(format!(
                        "[{done}/{total}] rep {rep}/{} size {size:>4} threads {threads:>3} \
                         {:<16} {:>14.0} loops/s  cpu {:>3.0}%  ({:.0} per cpu-s, {} loops)",
                        opts.reps,
                        kind.name(),
                        sample.ops_per_sec,
                        sample.cpu_share * 100.0,
                        sample.ops_per_cpu_sec,
                        sample.ops
                    ));
                    if let Some(c) = r.cell_mut(kind, threads, size) {
                        c.samples.push(sample.ops_per_sec);
                        c.cpu_shares.push(sample.cpu_share);
                    }
                }
            }
        }
    }
    Ok(r)
}

fn output(opts: &Options, r: &Results, svg_file: Option<std::fs::File>) -> Result<(), String> {
    match opts.format {
        Format::Tables => print!("{}", table::tables(r)),
        Format::Json => print!("{}", json::render(r)),
        Format::Markdown => print!("{}", table::markdown(r)),
    }
    if let (Some(path), Some(mut f)) = (&opts.svg, svg_file) {
        f.write_all(svg::render(r, opts.scale).as_bytes())
            .map_err(|e| format!("--svg {path}: cannot write: {e}"))?;
        eprintln!("copy_size_table: wrote {path}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness::Kind;
    use std::time::Duration;

    /// The whole pipeline on real threads, briefly: every cell measured
    /// `reps` times, every count balanced (the harness checks it), every
    /// output rendered.
    #[test]
    fn end_to_end_with_tiny_runs() {
        let cpus = harness::allowed_cpus();
        let threads = options::default_threads(cpus.len());
        let opts = Options {
            duration: Duration::from_millis(20),
            reps: 2,
            threads: threads.clone(),
            sizes: vec![0, 64],
            kinds: vec![
                Kind::Atomic,
                Kind::Percpu(percpu_ref::backend()),
                Kind::None,
            ],
            format: Format::Tables,
            svg: None,
            scale: options::Scale::Log,
        };
        let mut lines = Vec::new();
        let r = run(&opts, cpus, &mut |l| lines.push(l)).unwrap();
        assert_eq!(lines.len(), 1 + 2 * 2 * threads.len() * 3);
        // The floor is measured like the others, interleaved with them: every
        // cell's atomic run is followed by its percpu run, then its floor run.
        for three in lines[1..].chunks(3) {
            let names = ["atomic", "percpu/", "floor"];
            for (line, name) in three.iter().zip(names) {
                assert!(line.contains(&format!(" {name}")), "{name}: {line}");
            }
        }
        assert_eq!(r.cells.len(), 2 * threads.len() * 3);
        for c in &r.cells {
            assert_eq!(c.samples.len(), 2, "{c:?}");
            assert!(c.samples.iter().all(|&s| s > 0.0), "{c:?}");
            assert_eq!(c.cpu_shares.len(), 2, "{c:?}");
            assert!(c.cpu_shares.iter().all(|&s| s > 0.0 && s <= 1.0), "{c:?}");
        }
        for &t in &threads {
            for s in [0, 64] {
                let o = r.overhead(Kind::Atomic, t, s).expect("floor measured");
                assert!(o.ns.is_finite() && o.lo <= o.ns && o.ns <= o.hi, "{o:?}");
                assert!(r.ns_per_loop(Kind::None, t, s) > 0.0);
            }
        }
        let t = table::tables(&r);
        assert!(t.contains("One CPU.\ncopy size"), "{t}");
        assert!(t.contains("   floor ns   atomic +ns   percpu +ns\n"), "{t}");
        assert!(t.contains("\nOn 1 CPU the copy itself"), "{t}");
        assert!(json::render(&r).contains("\"reps\": 2"));
        assert!(table::markdown(&r).contains("| 1 CPU floor ns | 1 CPU atomic +ns |"));
        assert!(svg::render(&r, options::Scale::Log).contains("<polyline"));
    }

    #[test]
    fn more_threads_than_cpus_is_an_error() {
        let n = harness::allowed_cpus().len();
        let e = harness::measure(Kind::Atomic, n + 1, 0, Duration::from_millis(1)).unwrap_err();
        assert!(e.contains("pinned one per CPU"), "{e}");
        let e = harness::measure(Kind::None, n + 1, 0, Duration::from_millis(1)).unwrap_err();
        assert!(e.contains("pinned one per CPU"), "{e}");
    }

    /// The floor runs the loop for real, on every CPU: timed (the table) and
    /// for a fixed number of loops (the criterion bench).
    #[test]
    fn the_floor_runs_the_same_loop() {
        let n = harness::allowed_cpus().len();
        let s = harness::measure(Kind::None, n, 64, Duration::from_millis(20)).unwrap();
        assert!(s.ops > 0 && s.ops_per_sec > 0.0, "{s:?}");
        assert!(s.cpu_share > 0.0 && s.cpu_share <= 1.0, "{s:?}");
        assert!(harness::time_iters(Kind::None, n, 64, 1000) > Duration::ZERO);
        assert_eq!(Kind::None.name(), "floor");
    }
}
