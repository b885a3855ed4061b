//! Index rows: RSS per ref under `cpu_id` and `mm_cid` indexing, with
//! threads that hop over every CPU.

use crate::affinity;
use crate::memory::{anon_rss_bytes, child_json};
use percpu_ref::{Backend, InitFlags, PercpuRef};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Barrier;

/// Refs a hopping thread counts on between two moves to another CPU, and
/// the passes it makes over all the refs (as the targets' measurement).
pub(crate) const HOP: usize = 1024;
pub(crate) const PASSES: usize = 16;

/// Anonymous RSS growth per ref while `threads` threads that hop over
/// every allowed CPU do a get + put on each ref, under one index of the
/// rseq backend (code pages the loop faults in are not counted).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IndexRow {
    /// The index the child used (`percpu::index()`), as named by
    /// `PERCPU_REF_INDEX`.
    pub(crate) index: String,
    pub(crate) threads: usize,
    pub(crate) refs: usize,
    /// RSS growth per ref over the passes; `None` without `statm`.
    pub(crate) growth: Option<f64>,
    /// Distinct ids (`percpu::current_index()`) and CPUs the threads saw.
    pub(crate) ids: usize,
    pub(crate) cpus: usize,
    /// The system's transparent-huge-page policy (`[always]`, ...).
    pub(crate) thp: String,
}

impl IndexRow {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "index": self.index, "threads": self.threads, "refs": self.refs,
            "rss_growth_per_ref": self.growth, "ids": self.ids, "cpus": self.cpus,
            "thp": self.thp,
        })
    }

    pub(crate) fn from_json(v: &Value) -> Result<Self, String> {
        let n = |k: &str| {
            v[k].as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| format!("no {k}"))
        };
        Ok(IndexRow {
            index: v["index"].as_str().ok_or("no index")?.to_string(),
            threads: n("threads")?,
            refs: n("refs")?,
            growth: v["rss_growth_per_ref"].as_f64(),
            ids: n("ids")?,
            cpus: n("cpus")?,
            thp: v["thp"].as_str().unwrap_or("?").to_string(),
        })
    }
}

/// `<threads>:<refs>`, as the parent passes it to the child.
pub(crate) fn index_spec(spec: &str) -> Result<(usize, usize), String> {
    let (t, n) = spec.split_once(':').ok_or("expected THREADS:REFS")?;
    let t: usize = t.parse().map_err(|e| format!("threads {t:?}: {e}"))?;
    let n: usize = n.parse().map_err(|e| format!("refs {n:?}: {e}"))?;
    if t == 0 || n == 0 {
        return Err("threads and refs must be at least 1".into());
    }
    Ok((t, n))
}

/// The transparent-huge-page policy, as the kernel shows it.
pub(crate) fn thp_policy() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| {
            let (_, rest) = s.split_once('[')?;
            Some(rest.split_once(']')?.0.to_string())
        })
        .unwrap_or_else(|| "n/a".into())
}

/// One index row, in this process (a fresh child per row: the arena's
/// pages, once resident, stay so).
pub(crate) fn measure_index(threads: usize, refs: usize) -> Result<IndexRow, String> {
    let index = percpu_ref::percpu::index().ok_or("the rseq backend is not available here")?;
    let cpus = affinity::allowed_cpus();
    let v = (0..refs)
        .map(|_| PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Rseq))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let barrier = Barrier::new(threads + 1);
    let blocks = refs.div_ceil(HOP);
    let (base, after, seen) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (v, cpus, barrier) = (&v, &cpus, &barrier);
                s.spawn(move || {
                    // Allocated before the first reading, like the stack.
                    let mut seen = Vec::with_capacity(PASSES * blocks);
                    barrier.wait();
                    barrier.wait();
                    for pass in 0..PASSES {
                        for (k, block) in v.chunks(HOP).enumerate() {
                            let _ = affinity::pin_to(cpus[(k + pass + t * 7) % cpus.len()]);
                            for r in block {
                                r.get();
                                r.put();
                            }
                            let cpu = affinity::current_cpu();
                            seen.push((percpu_ref::percpu::current_index(), cpu));
                        }
                    }
                    seen
                })
            })
            .collect();
        barrier.wait();
        let base = anon_rss_bytes();
        barrier.wait();
        let seen: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("an index worker panicked"))
            .collect();
        (base, anon_rss_bytes(), seen)
    });
    let ids: std::collections::BTreeSet<_> = seen.iter().map(|s| s.0).collect();
    let visited: std::collections::BTreeSet<_> = seen.iter().filter_map(|s| s.1).collect();
    drop(v);
    Ok(IndexRow {
        index: index.name().into(),
        threads,
        refs,
        growth: match (base, after) {
            (Some(b), Some(a)) => Some((a as f64 - b as f64) / refs as f64),
            _ => None,
        },
        ids: ids.len(),
        cpus: visited.len(),
        thp: thp_policy(),
    })
}

/// The index rows: `cpu_id` and, where the kernel provides it, `mm_cid`,
/// each at 1, 4, half and all allowed CPUs' threads, each in a child.
pub(crate) fn index_rows(
    refs: usize,
    progress: &mut dyn FnMut(String),
) -> Result<Vec<IndexRow>, String> {
    if refs == 0 || percpu_ref::percpu::index().is_none() {
        return Ok(Vec::new());
    }
    let n = affinity::allowed_cpus().len();
    let mut counts = vec![1, 4.min(n), (n / 2).max(1), n];
    counts.sort_unstable();
    counts.dedup();
    let mut rows = Vec::new();
    for index in ["cpu_id", "mm_cid"] {
        for &t in &counts {
            progress(format!(
                "footprint: index {index}, {t} threads over {n} CPUs, {refs} refs"
            ));
            let spec = format!("{t}:{refs}");
            let row = child_json(
                &["--index-child", &spec],
                Some(("PERCPU_REF_INDEX", index)),
                Stdio::null(),
                &format!("index {index} at {t} threads"),
            )
            .and_then(|v| IndexRow::from_json(&v))?;
            if row.index != index {
                // This kernel has no `mm_cid`: the child fell back.
                progress(format!(
                    "footprint: no {index} here (the child used {})",
                    row.index
                ));
                break;
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The index rows as a markdown table, beside 8 B per thread and per CPU.
pub(crate) fn index_table(rows: &[IndexRow]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut s = format!(
        "\nAnonymous RSS growth per ref by index (rseq backend; `statm` resident minus \
         file-backed): threads that hop over every \
         allowed CPU (a move every {HOP} refs, {PASSES} passes) doing get + put on each of \
         {} refs; THP `{}`.\n\n\
         | index | threads | CPUs visited | ids seen | RSS growth per ref | 8 B × threads |\n\
         |---|--:|--:|--:|--:|--:|\n",
        first.refs, first.thp
    );
    for r in rows {
        let g = r.growth.map_or("n/a".into(), |g| format!("{g:.1} B"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {g} | {} B |",
            r.index,
            r.threads,
            r.cpus,
            r.ids,
            8 * r.threads
        );
    }
    s
}
