//! The report's markdown tables.

use crate::index::index_table;
use crate::memory::OBJECT;
use crate::report::{mops, Report};
use crate::thp::thp_table;
use crate::throughput::{at_least, at_most, counter_target, rss_target, verdict, Subject};
use crate::{REUSE_TARGET, RSS_SLACK, SCALING_TARGET, VS_ARC_TARGET};
use std::fmt::Write as _;

impl Report {
    /// The report as markdown: the memory, throughput, index and huge-page
    /// tables.
    pub(crate) fn markdown(&self) -> String {
        let cpus = self.possible_cpus;
        let (ct, rt) = (counter_target(cpus), rss_target(cpus));
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "## percpu-ref footprint\n");
        let _ = writeln!(
            w,
            "{cpus} possible CPUs (`possible_cpus()`), {} threads, page {}; \
             `size_of::<PercpuRef>()` = {OBJECT} B; default backend {}.\n",
            self.threads,
            self.page_size.map_or("n/a".into(), |p| format!("{p} B")),
            self.default_backend
        );
        let _ = writeln!(
            w,
            "Targets: counters ≤ 8 B × {cpus} CPUs = {ct} B per ref; RSS ≤ {ct} + {RSS_SLACK} \
             = {rt} B per ref; all threads ≥ {SCALING_TARGET}× one thread; one thread ≥ \
             {VS_ARC_TARGET}× `Arc`; a second batch of refs grows RSS by < {:.0} % of the first's.\n",
            REUSE_TARGET * 100.0
        );
        self.memory_table(w);
        self.throughput_table(w);
        s.push_str(&index_table(&self.index));
        s.push_str(&thp_table(&self.thp));
        s
    }

    /// The memory rows, with their targets, and what the columns mean.
    fn memory_table(&self, w: &mut String) {
        let cpus = self.possible_cpus;
        let (ct, rt) = (counter_target(cpus), rss_target(cpus));
        let _ = writeln!(w, "### Memory per ref\n");
        let _ = writeln!(
            w,
            "| backend | refs | RSS growth + object | ≤ {rt} B | `percpu_bytes` + object | ≤ {ct} B \
             | arena reserved (chunks) | kept after drop | 2nd batch growth | < {:.0} % \
             | 2nd peak above 1st |",
            REUSE_TARGET * 100.0
        );
        let _ = writeln!(w, "|---|--:|--:|:-:|--:|:-:|--:|--:|--:|:-:|--:|");
        for m in &self.memory {
            let pct = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{:.1} %", x * 100.0));
            let arena = format!(
                "{:.2} B ({}; 2nd batch {:+} B)",
                m.arena_bytes as f64 / m.refs as f64,
                m.arena_chunks,
                m.arena_bytes_again
            );
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.1} + {OBJECT} = {:.1} B | {} | {arena} | {} | {} | {} | {} |",
                m.backend,
                m.refs,
                m.rss_per_ref().map_or("n/a".into(), |x| format!(
                    "{x:.2} + {OBJECT} = {:.2} B",
                    x + OBJECT as f64
                )),
                verdict(at_most(m.total_per_ref(), rt as f64)),
                m.percpu_per_ref(),
                m.percpu_per_ref() + OBJECT as f64,
                verdict(at_most(Some(m.percpu_per_ref()), ct as f64)),
                pct(m.kept_after_drop()),
                pct(m.reuse_growth()),
                verdict(at_most(m.reuse_growth(), REUSE_TARGET)),
                pct(m.peak_above_first()),
            );
        }
        let _ = writeln!(
            w,
            "\nRSS growth: resident memory (`/proc/self/statm`) after creating the refs minus \
             before, over the refs, each row the median of {} new processes. The `Vec` holding the refs \
             ({OBJECT} B × refs) is resident before the first reading, so it is not in the \
             growth; \"+ object\" adds it back. Kept after drop, 2nd batch growth and 2nd peak \
             are shares of the first batch's growth: RSS after dropping it, the growth while \
             creating a second batch (the reuse target), and the second batch's peak \
             above the first's (near 0 \
             both when freed memory is reused and when it was returned to the system and \
             taken again; near 100 % when it leaked).\n",
            self.reps
        );
    }

    /// The throughput rows, with their targets, and how they were timed.
    fn throughput_table(&self, w: &mut String) {
        let all = self.threads;
        let _ = writeln!(w, "### Create + get + put + drop per second\n");
        let _ = writeln!(
            w,
            "| | 1 thread | {all} threads | {all} / 1 | ≥ {SCALING_TARGET}× | 1 thread / `Arc` | ≥ {VS_ARC_TARGET} \
             | instructions / iteration |"
        );
        let _ = writeln!(w, "|---|--:|--:|--:|:-:|--:|:-:|--:|");
        for t in &self.throughput {
            let percpu = t.subject != Subject::Arc;
            let scaling = Self::scaling(t);
            let vs_arc = self.vs_arc(t);
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                match t.subject {
                    Subject::Arc => "`Arc<u64>` new + clone + drop".to_string(),
                    s => s.name(),
                },
                mops(Some(t.one)),
                mops(t.all),
                scaling.map_or("n/a".into(), |x| format!("{x:.2}×")),
                if percpu {
                    verdict(at_least(scaling, SCALING_TARGET))
                } else {
                    "—"
                },
                vs_arc.map_or("n/a".into(), |x| format!("{x:.2}")),
                if percpu {
                    verdict(at_least(vs_arc, VS_ARC_TARGET))
                } else {
                    "—"
                },
                self.instructions(t.subject)
                    .map_or("n/a".into(), |n| format!("{n:.1}")),
            );
        }
        let _ = writeln!(
            w,
            "\nMillions per second, all threads together: median of {} runs of {} ms \
             (min–max), threads started together at a barrier. Instructions per iteration: \
             {}.",
            self.reps,
            self.duration.as_millis(),
            if self.instructions.is_empty() {
                "n/a without `--callgrind FILE` (the output of `scripts/callgrind-pair`, which \
                 counts them exactly under valgrind)"
            } else {
                "counted by callgrind (`scripts/callgrind-pair`, given as `--callgrind`) on one \
                 thread, in loops of the same shape (`pair_loop`)"
            }
        );
    }
}
