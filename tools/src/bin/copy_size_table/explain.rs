//! The paragraph after the tables: what the one-CPU and all-CPU diff
//! columns compare, computed from this run's numbers.
//!
//! Why it exists: the diff columns compare loops per second, and a loop is
//! the copy (the floor) plus a counter's overhead, so percpu / atomic - 1 is
//! (floor + atomic's overhead) / (floor + percpu's overhead) - 1. Where the
//! copy costs several ns and both counters add well under one, that is a
//! few percent either way; where atomic's locked instructions cost more
//! than the copy, it is hundreds of percent. The same code gives both on
//! different CPUs, so the output says which case this run is, with its own
//! numbers: nothing below is a constant about some CPU.

use crate::harness::Kind;
use crate::results::{Overhead, Results};
use crate::table::{diff_pct, ns, pct};

/// `x` in ns, as the tables print it.
fn nsu(x: f64) -> String {
    format!("{} ns", ns(x))
}

/// "1 CPU", "2 CPUs".
pub fn cpus(t: usize) -> String {
    if t == 1 {
        "1 CPU".to_string()
    } else {
        format!("{t} CPUs")
    }
}

/// An overhead as the paragraph quotes it: the median, and the range over
/// the runs when that holds zero, so that a small or negative value is not
/// read as a measured cost.
fn quote(o: &Overhead) -> String {
    if o.within_noise() {
        format!(
            "{} (within noise: the runs give {} to {})",
            nsu(o.ns),
            ns(o.lo),
            nsu(o.hi)
        )
    } else {
        nsu(o.ns)
    }
}

/// How overhead `to` compares with `from`, judged by their ranges over the
/// runs: only ranges that do not overlap count as a change, and one run per
/// cell (a range that is a point) cannot show one.
pub fn trend(from: &Overhead, to: &Overhead) -> &'static str {
    if from.lo == from.hi || to.lo == to.hi {
        "is"
    } else if to.lo > from.hi {
        "grows to"
    } else if to.hi < from.lo {
        "falls to"
    } else {
        "stays at"
    }
}

/// `part` as a percentage of `whole`, no decimals.
fn pct_of(part: f64, whole: f64) -> String {
    format!("{:.0}%", part / whole * 100.0)
}

/// The explanation, one paragraph, unwrapped; `None` when the run lacks
/// what it needs (the floor, a percpu kind, a measured cell).
pub fn paragraph(r: &Results) -> Option<String> {
    let b = Base::of(r)?;
    let mut s = smallest_size(r, &b);
    s += &largest_size(r, &b).unwrap_or_default();
    s += &across_cpus(r, &b).unwrap_or_default();
    s += " ";
    s += &noise_sentence(r);
    if let Some(busy) = busy_sentence(r) {
        s += " ";
        s += &busy;
    }
    Some(s)
}

/// What every sentence compares against: the first thread count and copy
/// size, where the copy weighs least, and the first percpu kind there.
struct Base {
    t1: usize,
    s0: usize,
    pk: Kind,
    atomic: String,
    percpu: String,
    /// The floor, in ns per loop.
    x: f64,
    a: Overhead,
    p: Overhead,
}

impl Base {
    /// `None` unless the floor and both overheads were measured: the
    /// paragraph's arithmetic needs all three.
    fn of(r: &Results) -> Option<Base> {
        if !r.has_floor() {
            return None;
        }
        let t1 = *r.threads.first()?;
        let s0 = *r.sizes.first()?;
        let pk = *r.percpu_kinds().first()?;
        let x = r.ns_per_loop(Kind::None, t1, s0);
        let a = r.overhead(Kind::Atomic, t1, s0)?;
        let p = r.overhead(pk, t1, s0)?;
        if !(x.is_finite() && a.ns.is_finite() && p.ns.is_finite()) {
            return None;
        }
        let (atomic, percpu) = (r.heading(Kind::Atomic), r.heading(pk));
        Some(Base {
            t1,
            s0,
            pk,
            atomic,
            percpu,
            x,
            a,
            p,
        })
    }

    /// The diff column's value in one cell, percpu over atomic.
    fn diff(&self, r: &Results, threads: usize, size: usize) -> f64 {
        diff_pct(
            r.median(self.pk, threads, size),
            r.median(Kind::Atomic, threads, size),
        )
    }
}

/// Further backends (--backends): what each adds, beside percpu.
fn other_backends(r: &Results, b: &Base) -> String {
    r.percpu_kinds()[1..]
        .iter()
        .filter_map(|&k| {
            let o = r.overhead(k, b.t1, b.s0)?;
            Some(format!(" ({} adds {})", r.heading(k), quote(&o)))
        })
        .collect()
}

/// The diff column worked out from the floor and the two overheads, since
/// the reader cannot see from the column alone which of them dominates.
fn smallest_size(r: &Results, b: &Base) -> String {
    let (t1, s0, x) = (b.t1, b.s0, b.x);
    let (atomic, percpu) = (&b.atomic, &b.percpu);
    let others = other_backends(r, b);
    format!(
        "On {} the copy itself (the floor: the same loop, no counting) costs {} per loop \
         at copy size {s0}; \
         {atomic} adds {} and {percpu} adds {}{others} above it, so the {t1}-CPU diff column, \
         ({} + {}) / ({} + {}) - 1 = {}, compares the two overheads under a copy of {}. \
         On CPUs where an uncontended lock instruction is cheap and overlaps with the \
         copy, both are small beside the copy and the diff can go either way; here \
         {atomic}'s overhead is {} of the floor and {percpu}'s {}.",
        cpus(t1),
        nsu(x),
        quote(&b.a),
        quote(&b.p),
        ns(x),
        ns(b.a.ns),
        ns(x),
        ns(b.p.ns),
        pct(b.diff(r, t1, s0)),
        nsu(x),
        pct_of(b.a.ns, x),
        pct_of(b.p.ns, x),
    )
}

/// The largest size, where the copy weighs most against the counting.
fn largest_size(r: &Results, b: &Base) -> Option<String> {
    let sn = *r.sizes.last().filter(|&&sn| sn != b.s0)?;
    let an = r.overhead(Kind::Atomic, b.t1, sn)?;
    let pn = r.overhead(b.pk, b.t1, sn)?;
    let (atomic, percpu) = (&b.atomic, &b.percpu);
    Some(format!(
        " At copy size {sn} the floor is {}, {atomic} adds {} and {percpu} {}: \
         the diff column is {} there.",
        nsu(r.ns_per_loop(Kind::None, b.t1, sn)),
        nsu(an.ns),
        nsu(pn.ns),
        pct(b.diff(r, b.t1, sn))
    ))
}

/// Across CPUs: what contention does to each overhead.
fn across_cpus(r: &Results, b: &Base) -> Option<String> {
    let (t1, s0, x) = (b.t1, b.s0, b.x);
    let tm = r.max_threads();
    if tm <= t1 {
        return None;
    }
    let am = r.overhead(Kind::Atomic, tm, s0)?;
    let pm = r.overhead(b.pk, tm, s0)?;
    let xm = r.ns_per_loop(Kind::None, tm, s0);
    let (ta, tp) = (trend(&b.a, &am), trend(&b.p, &pm));
    let (atomic, percpu) = (&b.atomic, &b.percpu);
    let s = format!(
        " Across CPUs the {atomic} overhead {ta} {} per loop per thread on {} \
         ({} on {}) while {percpu}'s {tp} {} ({}), over a floor of {} ({}), \
         so the {tm}-CPU diff column at copy size {s0} is \
         ({} + {}) / ({} + {}) - 1 = {}.",
        nsu(am.ns),
        cpus(tm),
        nsu(b.a.ns),
        cpus(t1),
        nsu(pm.ns),
        nsu(b.p.ns),
        nsu(xm),
        nsu(x),
        ns(xm),
        ns(am.ns),
        ns(xm),
        ns(pm.ns),
        pct(b.diff(r, tm, s0)),
    );
    Some(s + contention_cause(ta, tp))
}

/// Why, where the numbers show it: only a growing atomic overhead points
/// at the shared cache line.
fn contention_cause(ta: &str, tp: &str) -> &'static str {
    match (ta, tp) {
        ("grows to", "grows to") => {
            " The shared atomic's cache line moves between CPUs on every get and put."
        }
        ("grows to", _) => {
            " The shared atomic's cache line moves between CPUs on every get and put; \
             each CPU's percpu count stays in its own cache line."
        }
        _ => "",
    }
}

/// On a busy machine the per-loop times are wall time, off-CPU time
/// included: say where, since it inflates the floor and both overheads
/// alike and can pass for a cost of the counting.
fn busy_sentence(r: &Results) -> Option<String> {
    let hit: Vec<(usize, f64)> = r
        .threads
        .iter()
        .map(|&t| {
            let share = r
                .cells
                .iter()
                .filter(|c| c.threads == t)
                .map(|c| c.min_cpu_share())
                .fold(1.0, f64::min);
            (t, share)
        })
        .filter(|&(_, share)| share < crate::table::BUSY_SHARE)
        .collect();
    if hit.is_empty() {
        return None;
    }
    let on: Vec<String> = hit
        .iter()
        .map(|&(t, share)| format!("on {} down to {:.0}%", cpus(t), share * 100.0))
        .collect();
    Some(format!(
        "The machine was busy (a thread's share of time on a CPU fell {}): \
         there the ns per loop include time off CPU, which inflates the floor and \
         the overheads alike.",
        on.join(", ")
    ))
}

/// How many of the printed overheads the runs cannot tell from zero, and
/// which: those are the ones to read as "no measurable cost", whatever
/// their sign.
fn noise_sentence(r: &Results) -> String {
    let (mut total, mut within, mut single) = (0, 0, false);
    let mut groups: Vec<String> = Vec::new();
    for k in r.counter_kinds() {
        for &t in &r.threads {
            let sizes: Vec<String> = r
                .sizes
                .iter()
                .filter(|&&s| {
                    let o = r.overhead(k, t, s);
                    total += o.is_some() as usize;
                    single |= o.is_some_and(|o| o.lo == o.hi);
                    o.is_some_and(|o| o.within_noise())
                })
                .map(usize::to_string)
                .collect();
            within += sizes.len();
            if !sizes.is_empty() {
                let plural = if sizes.len() == 1 { "" } else { "s" };
                groups.push(format!(
                    "{}@{t} at size{plural} {}",
                    r.heading(k),
                    sizes.join(", ")
                ));
            }
        }
    }
    if single {
        "With one run per cell the run-to-run noise is unknown: read small differences \
         between overheads as possibly noise (--reps 3 or more measures it)."
            .to_string()
    } else if groups.is_empty() {
        format!(
            "None of the {total} overheads in the tables is within the run-to-run noise \
             (each one's range over the runs excludes zero)."
        )
    } else {
        format!(
            "{within} of the {total} overheads in the tables are within the run-to-run noise \
             (their range over the runs holds zero; read them as no measurable cost): {}.",
            groups.join("; ")
        )
    }
}

/// `text` wrapped at `width` columns, words kept whole, with a final newline.
pub fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out += &line;
            out += "\n";
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    if !line.is_empty() {
        out += &line;
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample_results;
    use percpu_ref::Backend;

    #[test]
    fn paragraph_quotes_the_measured_numbers() {
        let p = paragraph(&sample_results()).unwrap();
        // Size 0, 1 CPU: floor 1 ns, atomic 10 (adds 9), percpu 3.33
        // (adds 2.33); the diff column's +200% is (1 + 9) / (1 + 2.33) - 1.
        for want in [
            "On 1 CPU the copy itself (the floor: the same loop, no counting) costs 1.00 ns \
             per loop at copy size 0;",
            "atomic adds 9.00 ns and percpu adds 2.33 ns above it",
            "(1.00 + 9.00) / (1.00 + 2.33) - 1 = +200.00%, compares the two overheads \
             under a copy of 1.00 ns.",
            "atomic's overhead is 900% of the floor and percpu's 233%",
            "At copy size 512 the floor is 5.00 ns, atomic adds 45.00 ns and percpu 11.67 ns: \
             the diff column is +200.00% there.",
            // 2 threads: atomic 40 ns per loop per thread, percpu unchanged.
            "the atomic overhead grows to 39.00 ns per loop per thread on 2 CPUs \
             (9.00 ns on 1 CPU) while percpu's stays at 2.33 ns (2.33 ns)",
            "(1.00 + 39.00) / (1.00 + 2.33) - 1 = +1,100.00%.",
            "each CPU's percpu count stays in its own cache line",
            "None of the 8 overheads in the tables is within the run-to-run noise",
        ] {
            assert!(p.contains(want), "missing {want:?} in\n{p}");
        }
    }

    #[test]
    fn noise_is_quoted_with_its_range() {
        let mut r = sample_results();
        let floor = r.cell(Kind::None, 1, 0).unwrap().samples.clone();
        r.cell_mut(Kind::Percpu(Backend::Sharded), 1, 0)
            .unwrap()
            .samples = floor.iter().map(|x| x * 1.01).collect();
        let p = paragraph(&r).unwrap();
        // Negative, printed as measured, with the range that holds zero.
        assert!(
            p.contains("percpu adds -0.01 ns (within noise: the runs give -0.04 to 0.02 ns)"),
            "{p}"
        );
        assert!(p.contains("1 of the 8 overheads"), "{p}");
        assert!(p.contains("percpu@1 at size 0."), "{p}");
    }

    #[test]
    fn a_busy_thread_count_is_named() {
        let mut r = sample_results();
        assert!(!paragraph(&r).unwrap().contains("busy"));
        r.cell_mut(Kind::Atomic, 2, 512).unwrap().cpu_shares[0] = 0.42;
        let p = paragraph(&r).unwrap();
        assert!(
            p.contains("The machine was busy (a thread's share of time on a CPU fell on 2 CPUs down to 42%)"),
            "{p}"
        );
    }

    #[test]
    fn one_run_per_cell_claims_no_noise_level() {
        let mut r = sample_results();
        for c in &mut r.cells {
            c.samples.truncate(1);
        }
        let p = paragraph(&r).unwrap();
        assert!(
            p.contains("With one run per cell the run-to-run noise is unknown"),
            "{p}"
        );
        assert!(p.contains("the atomic overhead is "), "{p}");
        assert!(!p.contains("cache line"), "{p}");
    }

    #[test]
    fn further_backends_are_quoted() {
        let mut r = sample_results();
        let rseq = Kind::Percpu(Backend::Rseq);
        r.kinds.insert(2, rseq);
        let floor = r.cell(Kind::None, 1, 0).unwrap().clone();
        r.cells.push(crate::results::Cell {
            kind: rseq,
            // Half the floor's rate: 1 ns above it.
            samples: floor.samples.iter().map(|x| x / 2.0).collect(),
            ..floor
        });
        let p = paragraph(&r).unwrap();
        assert!(
            p.contains("percpu adds 2.33 ns (rseq adds 1.00 ns) above it"),
            "{p}"
        );
    }

    #[test]
    fn no_floor_no_paragraph() {
        let mut r = sample_results();
        r.kinds.retain(|&k| k != Kind::None);
        assert_eq!(paragraph(&r), None);
    }

    #[test]
    fn trend_needs_ranges_apart() {
        let o = |lo, hi| Overhead {
            ns: (lo + hi) / 2.0,
            lo,
            hi,
        };
        assert_eq!(trend(&o(1.0, 2.0), &o(3.0, 4.0)), "grows to");
        assert_eq!(trend(&o(1.0, 2.0), &o(1.5, 4.0)), "stays at");
        assert_eq!(trend(&o(3.0, 4.0), &o(1.0, 2.0)), "falls to");
        // One run per cell: a point, no trend.
        assert_eq!(trend(&o(1.0, 1.0), &o(3.0, 3.0)), "is");
    }

    #[test]
    fn wrap_keeps_words_whole() {
        assert_eq!(wrap("aa bb cc", 5), "aa bb\ncc\n");
        assert_eq!(wrap("", 5), "");
        assert_eq!(wrap("abcdefgh x", 5), "abcdefgh\nx\n");
    }
}
