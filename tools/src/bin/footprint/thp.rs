//! Huge pages under the arena: get + put over many refs with and without
//! them.

use crate::index::thp_policy;
use crate::memory::child_json;
use crate::throughput::median;
use percpu_ref::{InitFlags, PercpuRef};
use std::fmt::Write as _;
use std::process::Stdio;
use std::time::Instant;

/// Refs of the huge-page rows: 64 MiB of counters on a 2-CPU machine, far
/// more than any TLB covers in 4 KiB pages.
pub(crate) const THP_REFS: usize = 1 << 20;
/// Refs between two consecutive accesses of the strided walk: 8 KiB of
/// one region apart, a new page (and TLB entry) every access.
pub(crate) const STRIDE: usize = 1021;

/// The median ns per get + put of each walk under one arena advice.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ThpRow {
    /// `PERCPU_REF_ARENA_THP`: `never` (the default, `MADV_NOHUGEPAGE`) or
    /// `always` (`MADV_HUGEPAGE`).
    pub(crate) advice: &'static str,
    pub(crate) refs: usize,
    pub(crate) sequential: Option<f64>,
    pub(crate) strided: Option<f64>,
}

/// ns per get + put over `refs` refs on this thread: walking them in order,
/// and with a stride of [`STRIDE`] refs. Each walk runs once untimed (it
/// makes the pages resident), then timed.
pub(crate) fn time_walks(refs: usize) -> (f64, f64) {
    let v: Vec<PercpuRef> = (0..refs)
        .map(|_| PercpuRef::with_backend(|_| {}, InitFlags::empty(), percpu_ref::backend()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("footprint --thp-child {refs}: {e}"));
    let walk = |strided: bool| {
        let t = Instant::now();
        let mut k = 0;
        for _ in 0..refs {
            let r = &v[k];
            r.get();
            r.put();
            k = if strided {
                (k + STRIDE) % refs
            } else {
                (k + 1) % refs
            };
        }
        t.elapsed().as_secs_f64() * 1e9 / refs as f64
    };
    walk(false);
    walk(true);
    (walk(false), walk(true))
}

/// The huge-page rows: each advice in its own child, `reps` times,
/// alternating, medians.
pub(crate) fn thp_rows(
    reps: usize,
    progress: &mut dyn FnMut(String),
) -> Result<Vec<ThpRow>, String> {
    let advices = ["never", "always"];
    progress(format!(
        "footprint: get + put over {THP_REFS} refs, arena advice {advices:?}, {reps} runs each"
    ));
    let mut runs = vec![(Vec::new(), Vec::new()); advices.len()];
    for _ in 0..reps.max(1) {
        for (a, advice) in advices.iter().enumerate() {
            let v = child_json(
                &["--thp-child", &THP_REFS.to_string()],
                Some(("PERCPU_REF_ARENA_THP", advice)),
                Stdio::inherit(),
                &format!("get + put under huge-page advice {advice}"),
            )?;
            runs[a].0.extend(v["sequential_ns"].as_f64());
            runs[a].1.extend(v["strided_ns"].as_f64());
        }
    }
    Ok(advices
        .iter()
        .zip(runs)
        .map(|(&advice, (seq, strided))| ThpRow {
            advice,
            refs: THP_REFS,
            sequential: median(&seq),
            strided: median(&strided),
        })
        .collect())
}

pub(crate) fn thp_table(rows: &[ThpRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\nget + put over {THP_REFS} refs on one thread (ns, median), by the advice on the \
         arena's chunks (`PERCPU_REF_ARENA_THP`; system policy `{}`): in order, and {STRIDE} \
         refs apart (a new page every access). A TLB question: the answer depends on the CPU.\n\n\
         | advice | in order | strided |\n|---|--:|--:|\n",
        thp_policy()
    );
    for r in rows {
        let f = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            r.advice,
            f(r.sequential),
            f(r.strided)
        );
    }
    s
}
