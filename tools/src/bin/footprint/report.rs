//! One run's report: what it measured, and its counts and JSON outputs.

use crate::affinity;
use crate::index::{index_table, IndexRow};
use crate::memory::{check_fits, median_row, memory_limit, page_size, MemRow, OBJECT};
use crate::thp::ThpRow;
use crate::throughput::{
    at_least, at_most, counter_target, ratio, rss_target, timed_run, Stats, Subject, TputRow,
};
use crate::{Options, REUSE_TARGET, SCALING_TARGET, VS_ARC_TARGET};
use percpu_ref::{Backend, InitFlags, PercpuRef};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::Duration;

/// Everything one run measured.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    pub(crate) possible_cpus: usize,
    pub(crate) threads: usize,
    pub(crate) page_size: Option<u64>,
    pub(crate) default_backend: Backend,
    pub(crate) duration: Duration,
    pub(crate) reps: usize,
    pub(crate) memory: Vec<MemRow>,
    pub(crate) throughput: Vec<TputRow>,
    /// RSS per ref under each index of the rseq backend (`main` adds them).
    pub(crate) index: Vec<IndexRow>,
    /// get + put ns over many refs with and without huge pages under the
    /// arena (`main` adds them, not in `--counts-only`).
    pub(crate) thp: Vec<ThpRow>,
    /// Instructions per iteration by loop name, from `--callgrind`.
    pub(crate) instructions: Vec<(String, f64)>,
}

/// The `variant instr/iter` lines of scripts/callgrind-pair's output.
pub(crate) fn callgrind_counts(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, n) = (w.next()?, w.next()?.parse().ok()?);
            w.next().is_none().then(|| (name.to_string(), n))
        })
        .collect()
}

/// Measures memory (through `measure`, a child process per row in `main`)
/// and throughput for every available backend.
pub(crate) fn run(
    opts: &Options,
    measure: &mut dyn FnMut(Backend, usize) -> Result<MemRow, String>,
    progress: &mut dyn FnMut(String),
) -> Result<Report, String> {
    let backends: Vec<Backend> = [Backend::Rseq, Backend::Sharded]
        .into_iter()
        .filter(|b| b.is_available())
        .collect();
    // Refuse a configuration that cannot fit before measuring anything.
    let limit = memory_limit();
    for &b in &backends {
        let per_ref = PercpuRef::with_backend(|_| {}, InitFlags::empty(), b)
            .map_err(|e| e.to_string())?
            .percpu_bytes();
        for &n in &opts.refs {
            check_fits(b, n, per_ref, limit)?;
        }
    }
    let memory = memory_rows(opts, &backends, measure, progress)?;
    let mut subjects: Vec<Subject> = backends.iter().map(|&b| Subject::Percpu(b)).collect();
    subjects.push(Subject::Arc);
    if opts.counts_only {
        subjects.clear();
    }
    Ok(Report {
        possible_cpus: percpu_ref::possible_cpus(),
        threads: opts.threads,
        page_size: page_size(),
        default_backend: percpu_ref::backend(),
        duration: opts.duration,
        reps: opts.reps,
        memory,
        throughput: throughput_rows(opts, &subjects, progress),
        index: Vec::new(),
        thp: Vec::new(),
        instructions: Vec::new(),
    })
}

/// The memory rows: each `--refs` count on each backend, the median of
/// `--reps` measurements.
fn memory_rows(
    opts: &Options,
    backends: &[Backend],
    measure: &mut dyn FnMut(Backend, usize) -> Result<MemRow, String>,
    progress: &mut dyn FnMut(String),
) -> Result<Vec<MemRow>, String> {
    let mut memory = Vec::new();
    for &n in &opts.refs {
        for &b in backends {
            progress(format!(
                "footprint: memory, {n} refs on {b}, {} processes",
                opts.reps
            ));
            let mut rows = (0..opts.reps.max(1))
                .map(|_| measure(b, n))
                .collect::<Result<Vec<_>, _>>()?;
            memory.push(median_row(&mut rows));
        }
    }
    Ok(memory)
}

/// The throughput rows: each subject at one thread and at all threads.
fn throughput_rows(
    opts: &Options,
    subjects: &[Subject],
    progress: &mut dyn FnMut(String),
) -> Vec<TputRow> {
    let counts: Vec<usize> = if opts.threads > 1 {
        vec![1, opts.threads]
    } else {
        vec![1]
    };
    progress(format!(
        "footprint: throughput, {} runs of {} ms",
        opts.reps * subjects.len() * counts.len(),
        opts.duration.as_millis()
    ));
    // runs[subject][count] collects one number per rep. Reps are the outer
    // loop so that a slow phase of the machine spreads over every cell.
    let mut runs = vec![vec![Vec::new(); counts.len()]; subjects.len()];
    for _ in 0..opts.reps {
        for (s, &subject) in subjects.iter().enumerate() {
            for (c, &threads) in counts.iter().enumerate() {
                runs[s][c].push(timed_run(subject, threads, opts.duration));
            }
        }
    }
    subjects
        .iter()
        .zip(&runs)
        .map(|(&subject, r)| TputRow {
            subject,
            one: Stats::of(&r[0]).expect("reps >= 1"),
            all: r.get(1).and_then(|x| Stats::of(x)),
        })
        .collect()
}

impl Report {
    /// `--counts-only`: the memory rows, and one `vm-counts:` line of whole
    /// bytes per ref for scripts/vm-test.
    pub(crate) fn counts(&self) -> String {
        let cpus = self.possible_cpus;
        let mut s = format!(
            "footprint --counts-only: {cpus} possible CPUs, {} CPUs allowed, \
             `size_of::<PercpuRef>()` = {OBJECT} B\n\n\
             | backend | refs | RSS growth per ref | counters per ref | 8 B × {cpus} CPUs |\n\
             |---|--:|--:|--:|--:|\n",
            affinity::allowed_cpus().len()
        );
        let mut kv = format!("vm-counts: possible_cpus={cpus}");
        for m in &self.memory {
            let rss = m
                .rss_per_ref()
                .map_or("n/a".into(), |r| format!("{r:.1} B"));
            let _ = writeln!(
                s,
                "| {} | {} | {rss} | {:.0} B | {} B |",
                m.backend,
                m.refs,
                m.percpu_per_ref(),
                8 * cpus
            );
            if let Some(r) = m.rss_per_ref() {
                let _ = write!(
                    kv,
                    " rss_per_ref_{}={}",
                    m.backend,
                    r.round().max(0.0) as u64
                );
            }
        }
        s.push_str(&index_table(&self.index));
        for r in &self.index {
            if let Some(g) = r.growth {
                let _ = write!(
                    kv,
                    " rss_{}_{}t={} ids_{}_{}t={}",
                    r.index,
                    r.threads,
                    g.round().max(0.0) as u64,
                    r.index,
                    r.threads,
                    r.ids
                );
            }
        }
        s + "\n" + &kv + "\n"
    }

    /// The churn loop's instructions per iteration, if `--callgrind` gave
    /// them.
    pub(crate) fn instructions(&self, subject: Subject) -> Option<f64> {
        let name = match subject {
            Subject::Percpu(b) => format!("{}-churn", b.name()),
            Subject::Arc => "arc-churn".into(),
        };
        self.instructions
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
    }

    pub(crate) fn arc_one(&self) -> Option<f64> {
        self.throughput
            .iter()
            .find(|t| t.subject == Subject::Arc)
            .map(|t| t.one.median)
    }

    /// all threads / one thread.
    pub(crate) fn scaling(t: &TputRow) -> Option<f64> {
        ratio(t.all?.median, t.one.median)
    }

    /// one thread / `Arc`'s one thread.
    pub(crate) fn vs_arc(&self, t: &TputRow) -> Option<f64> {
        ratio(t.one.median, self.arc_one()?)
    }

    pub(crate) fn to_json(&self) -> Value {
        let cpus = self.possible_cpus;
        json!({
            "possible_cpus": cpus,
            "threads": self.threads,
            "page_size": self.page_size,
            "object_bytes": OBJECT,
            "default_backend": self.default_backend.name(),
            "duration_ms": self.duration.as_millis() as u64,
            "reps": self.reps,
            "targets": {
                "counter_bytes_per_ref": counter_target(cpus),
                "rss_bytes_per_ref": rss_target(cpus),
                "scaling": SCALING_TARGET,
                "vs_arc": VS_ARC_TARGET,
                "reuse_growth": REUSE_TARGET,
            },
            "memory": self.memory.iter().map(|m| memory_json(m, cpus)).collect::<Vec<_>>(),
            "throughput": self.throughput.iter().map(|t| self.throughput_json(t)).collect::<Vec<_>>(),
            "index": self.index.iter().map(IndexRow::to_json).collect::<Vec<_>>(),
            "thp": self.thp.iter().map(|t| json!({
                "advice": t.advice, "refs": t.refs,
                "sequential_ns": t.sequential, "strided_ns": t.strided,
            })).collect::<Vec<_>>(),
        })
    }

    /// One throughput row, with its ratios and whether they meet the targets.
    fn throughput_json(&self, t: &TputRow) -> Value {
        let stats =
            |s: Option<Stats>| s.map(|s| json!({"median": s.median, "min": s.min, "max": s.max}));
        let percpu = t.subject != Subject::Arc;
        json!({
            "subject": t.subject.name(),
            "one_thread": stats(Some(t.one)),
            "all_threads": stats(t.all),
            "scaling": Self::scaling(t),
            "scaling_met": percpu.then(|| at_least(Self::scaling(t), SCALING_TARGET)).flatten(),
            "vs_arc": self.vs_arc(t),
            "vs_arc_met": percpu.then(|| at_least(self.vs_arc(t), VS_ARC_TARGET)).flatten(),
            "instructions_per_iter": self.instructions(t.subject),
        })
    }
}

/// One memory row with its per-ref figures and whether they meet the
/// targets at `cpus` possible CPUs.
fn memory_json(m: &MemRow, cpus: usize) -> Value {
    let mut v = m.to_json();
    v["object_bytes"] = json!(OBJECT);
    v["rss_per_ref"] = json!(m.rss_per_ref());
    v["total_per_ref"] = json!(m.total_per_ref());
    v["total_per_ref_met"] = json!(at_most(m.total_per_ref(), rss_target(cpus) as f64));
    v["percpu_per_ref"] = json!(m.percpu_per_ref());
    v["percpu_per_ref_met"] = json!(m.percpu_per_ref() <= counter_target(cpus) as f64);
    v["kept_after_drop"] = json!(m.kept_after_drop());
    v["reuse_growth"] = json!(m.reuse_growth());
    v["reuse_met"] = json!(at_most(m.reuse_growth(), REUSE_TARGET));
    v["peak_above_first"] = json!(m.peak_above_first());
    v
}

pub(crate) fn mops(s: Option<Stats>) -> String {
    s.map_or("n/a".into(), |s| {
        format!(
            "{:.1} M/s ({:.1}–{:.1})",
            s.median / 1e6,
            s.min / 1e6,
            s.max / 1e6
        )
    })
}
