//! Text outputs: the kernel's three tables, and one markdown table, each
//! with the floor and the overhead columns beside the kernel's, and the
//! paragraph of `explain` after them.
//!
//! The kernel's format (2013 cgroup css refcount measurement):
//!
//! ```text
//! One CPU.
//! copy size      atomic      percpu   diff in pct
//! 0           534583387  1521561724   +184.63%
//! All eight CPUs.
//! 0           117213982 12488998111 +10,554.87%
//! Ratio of all cores / single core.
//! copy size  atomic  percpu
//! 0            0.22    8.21
//! ```

use crate::explain::cpus;
use crate::harness::Kind;
use crate::results::Results;
use std::fmt::Write;

/// `x` with two decimals and thousands separators: `10554.873` → `10,554.87`.
pub fn thousands(x: f64) -> String {
    let fixed = format!("{:.2}", x.abs());
    let (int, frac) = fixed.split_once('.').unwrap_or((&fixed, "00"));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    let sign = if x < 0.0 && fixed != "0.00" { "-" } else { "" };
    format!("{sign}{grouped}.{frac}")
}

/// Percent difference of `new` over `base`, e.g. `+184.63%`.
pub fn diff_pct(new: f64, base: f64) -> f64 {
    if base > 0.0 {
        (new / base - 1.0) * 100.0
    } else {
        f64::NAN
    }
}

/// A percent difference with its sign and separators: `+10,554.87%`.
pub fn pct(d: f64) -> String {
    if d.is_nan() {
        return "n/a".to_string();
    }
    let sign = if d < 0.0 { "-" } else { "+" };
    format!("{sign}{}%", thousands(d.abs()))
}

/// A column of percent differences, sign first and magnitudes aligned
/// after it, as the kernel prints them: `+10,554.87%`, `+ 4,671.51%`.
fn diff_column(diffs: &[f64]) -> Vec<String> {
    let mags: Vec<String> = diffs
        .iter()
        .map(|d| {
            if d.is_nan() {
                "n/a".to_string()
            } else {
                thousands(d.abs())
            }
        })
        .collect();
    let w = mags.iter().map(String::len).max().unwrap_or(0);
    diffs
        .iter()
        .zip(mags)
        .map(|(d, m)| {
            let sign = if *d < 0.0 { '-' } else { '+' };
            format!("{sign}{m:>w$}%")
        })
        .collect()
}

/// ns with two decimals, as measured (negative included); `n/a` when a
/// cell was not measured.
pub fn ns(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "n/a".to_string()
    }
}

/// A counter's overhead above the floor, as [`ns`] prints it.
fn overhead_ns(r: &Results, k: Kind, threads: usize, size: usize) -> String {
    ns(r.overhead(k, threads, size).map_or(f64::NAN, |o| o.ns))
}

/// Lays out rows under headings: the first column left-aligned, the others
/// right-aligned and at least `min` wide (so that successive tables line
/// up), at least two spaces apart.
fn layout(headings: &[String], columns: &[Vec<String>], min: usize) -> String {
    let widths: Vec<usize> = headings
        .iter()
        .zip(columns)
        .enumerate()
        .map(|(i, (h, col))| {
            let w = col
                .iter()
                .map(String::len)
                .chain([h.len()])
                .max()
                .unwrap_or(0);
            if i == 0 {
                w
            } else {
                w.max(min)
            }
        })
        .collect();
    let rows = columns.first().map_or(0, Vec::len);
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(s, "{c:<w$}");
            } else {
                let _ = write!(s, "  {c:>w$}");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headings.iter().map(String::as_str).collect());
    for r in 0..rows {
        out += &line(columns.iter().map(|c| c[r].as_str()).collect());
    }
    out
}

/// The throughput table for one thread count: atomic, then each percpu
/// kind with its difference to atomic.
fn count_table(r: &Results, threads: usize) -> String {
    let mut headings = vec!["copy size".to_string()];
    let mut columns = vec![r.sizes.iter().map(usize::to_string).collect::<Vec<_>>()];
    let atomic: Vec<f64> = r
        .sizes
        .iter()
        .map(|&s| r.median(Kind::Atomic, threads, s))
        .collect();
    headings.push("atomic".into());
    columns.push(atomic.iter().map(|v| format!("{v:.0}")).collect());
    for k in r.percpu_kinds() {
        let vals: Vec<f64> = r.sizes.iter().map(|&s| r.median(k, threads, s)).collect();
        headings.push(r.heading(k));
        columns.push(vals.iter().map(|v| format!("{v:.0}")).collect());
        let diffs: Vec<f64> = vals
            .iter()
            .zip(&atomic)
            .map(|(v, a)| diff_pct(*v, *a))
            .collect();
        headings.push("diff in pct".into());
        columns.push(diff_column(&diffs));
    }
    // Beside the kernel's columns: the floor, and what each counter adds to
    // it, in the unit in which they add up.
    if r.has_floor() {
        headings.push("floor".into());
        columns.push(
            r.sizes
                .iter()
                .map(|&s| format!("{:.0}", r.median(Kind::None, threads, s)))
                .collect(),
        );
        headings.push("floor ns".into());
        columns.push(
            r.sizes
                .iter()
                .map(|&s| ns(r.ns_per_loop(Kind::None, threads, s)))
                .collect(),
        );
        for k in r.counter_kinds() {
            headings.push(format!("{} +ns", r.heading(k)));
            columns.push(
                r.sizes
                    .iter()
                    .map(|&s| overhead_ns(r, k, threads, s))
                    .collect(),
            );
        }
    }
    layout(&headings, &columns, 11)
}

/// Throughput at `threads` over throughput at one thread, per kind.
fn ratio_table(r: &Results, threads: usize) -> String {
    let mut headings = vec!["copy size".to_string()];
    let mut columns = vec![r.sizes.iter().map(usize::to_string).collect::<Vec<_>>()];
    for &k in &r.kinds {
        headings.push(r.heading(k));
        columns.push(
            r.sizes
                .iter()
                .map(|&s| format!("{:.2}", ratio(r, k, threads, s)))
                .collect(),
        );
    }
    layout(&headings, &columns, 6)
}

/// Median at `threads` / median at one thread.
pub fn ratio(r: &Results, k: Kind, threads: usize, size: usize) -> f64 {
    let one = r.median(k, 1, size);
    if one > 0.0 {
        r.median(k, threads, size) / one
    } else {
        f64::NAN
    }
}

/// (max - min) / median of every cell, to judge the medians.
fn spread_table(r: &Results) -> String {
    let mut headings = vec!["copy size".to_string()];
    let mut columns = vec![r.sizes.iter().map(usize::to_string).collect::<Vec<_>>()];
    for &t in &r.threads {
        for &k in &r.kinds {
            headings.push(format!("{}@{t}", r.heading(k)));
            columns.push(
                r.sizes
                    .iter()
                    .map(|&s| match r.cell(k, t, s) {
                        Some(c) => format!("{:.1}%", c.spread_pct()),
                        None => "-".into(),
                    })
                    .collect(),
            );
        }
    }
    layout(&headings, &columns, 6)
}

fn title(r: &Results, threads: usize) -> String {
    match threads {
        1 => "One CPU.".to_string(),
        t if t == r.max_threads() => format!("All {t} CPUs."),
        t => format!("{t} CPUs."),
    }
}

/// What the numbers are, ahead of the tables.
fn preamble(r: &Results) -> String {
    let m = &r.meta;
    let mut s = format!("Machine: {}.\n", m.machine());
    for k in r.percpu_kinds() {
        if let Kind::Percpu(b) = k {
            let default = if b.to_string() == m.default_backend {
                " (the process default)"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "{} = PercpuRef get/put on the {b} backend{default}.",
                r.heading(k)
            );
        }
    }
    let _ = writeln!(
        s,
        "atomic = one shared AtomicUsize, fetch_add / fetch_sub + zero test.\n\
         Loops (get, memcpy of copy size bytes, put) per second, summed over threads \
         pinned one per CPU on one shared object;\nmedian of {} run(s) of {} ms each.",
        m.reps,
        m.duration.as_millis()
    );
    if r.has_floor() {
        let _ = writeln!(
            s,
            "floor = the same loop with no counting (get and put do nothing), measured \
             alongside.\n\
             floor ns = its ns per loop per thread (1e9 x threads / loops per second); \
             atomic +ns, percpu +ns = ns per loop per thread\nabove the floor, as measured \
             (negative where the counting costs less than the run-to-run noise)."
        );
    }
    let share = r.min_cpu_share();
    if share < BUSY_SHARE {
        let _ = writeln!(
            s,
            "WARNING: in some runs a thread was on a CPU only {:.0}% of the time: \
             the machine was busy, so these numbers understate throughput and scaling.",
            share * 100.0
        );
    }
    s
}

/// Below this CPU share a run was disturbed by other work on the machine.
pub const BUSY_SHARE: f64 = 0.9;

/// The kernel's tables, one per thread count, the ratio and the spread.
pub fn tables(r: &Results) -> String {
    let mut out = preamble(r);
    for &t in &r.threads {
        out += "\n";
        out += &title(r, t);
        out += "\n";
        out += &count_table(r, t);
    }
    let max = r.max_threads();
    if r.threads.contains(&1) && max > 1 {
        out += "\nRatio of all cores / single core.\n";
        out += &ratio_table(r, max);
    }
    let _ = write!(
        out,
        "\nSpread (max - min) / median over {} runs.\n",
        r.meta.reps
    );
    out += &spread_table(r);
    out += &explanation(r);
    out
}

/// The paragraph of `explain`, wrapped, after a blank line; empty when the
/// run cannot support it.
fn explanation(r: &Results) -> String {
    crate::explain::paragraph(r).map_or(String::new(), |p| {
        "\n".to_string() + &crate::explain::wrap(&p, 78)
    })
}

/// One markdown table: one CPU, all CPUs and their ratio side by side.
pub fn markdown(r: &Results) -> String {
    let g = Groups::of(r);
    let mut out = markdown_intro(r);
    let head = markdown_head(r, &g);
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", head.iter().map(|_| "---:|").collect::<String>());
    for &s in &r.sizes {
        let _ = writeln!(out, "| {} |", markdown_row(r, &g, s).join(" | "));
    }
    out += &markdown_notes(r);
    out += &explanation(r);
    out
}

/// What the numbers are, in one line above the markdown table.
fn markdown_intro(r: &Results) -> String {
    let m = &r.meta;
    format!(
        "Measured on {}; percpu backend: {}; median of {} runs of {} ms; \
         loops per second summed over threads.\n\n",
        m.machine(),
        r.percpu_kinds()
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        m.reps,
        m.duration.as_millis()
    )
}

/// The thread counts the markdown table shows: one CPU and all of them,
/// as the kernel's table does, each only where measured and once when
/// they are the same.
struct Groups {
    threads: Vec<usize>,
    max: usize,
}

impl Groups {
    fn of(r: &Results) -> Groups {
        let max = r.max_threads();
        let mut threads = Vec::new();
        for t in [1, max] {
            if r.threads.contains(&t) && !threads.contains(&t) {
                threads.push(t);
            }
        }
        Groups { threads, max }
    }

    /// The ratio columns need both ends measured.
    fn with_ratio(&self) -> bool {
        self.threads.len() == 2
    }
}

/// The markdown table's headings, in the order `markdown_row` fills them.
fn markdown_head(r: &Results, g: &Groups) -> Vec<String> {
    let mut head = vec!["copy size".to_string()];
    for &t in &g.threads {
        head.push(format!("{} atomic", cpus(t)));
        for k in r.percpu_kinds() {
            head.push(format!("{} {}", cpus(t), r.heading(k)));
            head.push("diff".into());
        }
    }
    if g.with_ratio() {
        for &k in &r.kinds {
            head.push(format!("{}/1 {}", g.max, r.heading(k)));
        }
    }
    // After the kernel's columns (so that they line up with the kernel's
    // own table): the floor and each counter's overhead above it, in ns.
    if r.has_floor() {
        for &t in &g.threads {
            head.push(format!("{} floor ns", cpus(t)));
            for k in r.counter_kinds() {
                head.push(format!("{} {} +ns", cpus(t), r.heading(k)));
            }
        }
    }
    head
}

/// One copy size's cells, under `markdown_head`'s headings.
fn markdown_row(r: &Results, g: &Groups, s: usize) -> Vec<String> {
    let mut row = vec![s.to_string()];
    for &t in &g.threads {
        let a = r.median(Kind::Atomic, t, s);
        row.push(format!("{a:.0}"));
        for k in r.percpu_kinds() {
            let p = r.median(k, t, s);
            row.push(format!("{p:.0}"));
            row.push(pct(diff_pct(p, a)));
        }
    }
    if g.with_ratio() {
        for &k in &r.kinds {
            row.push(format!("{:.2}", ratio(r, k, g.max, s)));
        }
    }
    if r.has_floor() {
        for &t in &g.threads {
            row.push(ns(r.ns_per_loop(Kind::None, t, s)));
            for k in r.counter_kinds() {
                row.push(overhead_ns(r, k, t, s));
            }
        }
    }
    row
}

/// Under the markdown table: a busy machine, which makes every number
/// suspect, and what the ns columns mean, which their headings cannot say.
fn markdown_notes(r: &Results) -> String {
    let mut out = String::new();
    let share = r.min_cpu_share();
    if share < BUSY_SHARE {
        let _ = writeln!(
            out,
            "\nWarning: a thread was on a CPU only {:.0}% of the time in some runs (busy machine).",
            share * 100.0
        );
    }
    if r.has_floor() {
        out += "\n\"floor ns\" is the loop with no counting, in ns per loop per thread; \
                \"+ns\" columns are what each counter adds above it, as measured.\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample_results;

    #[test]
    fn thousands_separators_as_the_kernel() {
        assert_eq!(thousands(10554.873), "10,554.87");
        assert_eq!(thousands(4671.51), "4,671.51");
        assert_eq!(thousands(184.634), "184.63");
        assert_eq!(thousands(999.999), "1,000.00");
        assert_eq!(thousands(1234567.0), "1,234,567.00");
        assert_eq!(thousands(-15.0), "-15.00");
        assert_eq!(thousands(0.0), "0.00");
    }

    #[test]
    fn diff_column_aligns_after_the_sign() {
        let col = diff_column(&[10554.87, 4671.51, -3.2]);
        assert_eq!(col, ["+10,554.87%", "+ 4,671.51%", "-     3.20%"]);
        assert!((diff_pct(1521561724.0, 534583387.0) - 184.63).abs() < 0.01);
    }

    #[test]
    fn tables_have_the_kernel_sections() {
        let r = sample_results();
        let t = tables(&r);
        for want in [
            "One CPU.\ncopy size       atomic       percpu  diff in pct        floor     floor ns   \
             atomic +ns   percpu +ns\n",
            "All 2 CPUs.\ncopy size       atomic       percpu  diff in pct        floor",
            "Ratio of all cores / single core.\ncopy size  atomic  percpu   floor\n",
            // percpu = 300e6 / (1 + 512 / 128) at 2 threads = 120e6; ratio 2.
            "512          0.50    2.00    2.00\n",
            "floor = the same loop with no counting",
            "floor@2\n",
            "\nOn 1 CPU the copy itself",
            "+200.00%",
            "sharded backend (the process default)",
            "Spread (max - min) / median over 3 runs.",
            "3.0%",
        ] {
            assert!(!t.contains("WARNING"), "{t}");
            assert!(t.contains(want), "missing {want:?} in\n{t}");
        }
        // One CPU, size 0: atomic 100e6, percpu 300e6, floor 1e9, i.e.
        // 10, 3.33 and 1 ns per loop: 9 and 2.33 ns above the floor.
        assert!(
            t.contains(
                "0            100000000    300000000     +200.00%   1000000000         1.00         \
                 9.00         2.33\n"
            ),
            "{t}"
        );
        // Two CPUs: atomic 40 ns per loop per thread, 39 above the floor.
        assert!(
            t.contains(
                "0             50000000    600000000   +1,100.00%   2000000000         1.00        \
                 39.00         2.33\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn markdown_has_one_row_per_size() {
        let md = markdown(&sample_results());
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(rows.len(), 2 + 2, "{md}");
        assert!(rows[0].contains("| 1 CPU atomic | 1 CPU percpu | diff | 2 CPUs atomic"));
        // The kernel's columns first, as in the kernel's own table, then the
        // floor and the overheads.
        assert!(rows[0].contains("| 2/1 atomic | 2/1 percpu | 2/1 floor | 1 CPU floor ns |"));
        assert!(rows[0].ends_with(
            "| 1 CPU floor ns | 1 CPU atomic +ns | 1 CPU percpu +ns \
             | 2 CPUs floor ns | 2 CPUs atomic +ns | 2 CPUs percpu +ns |"
        ));
        assert!(
            rows[2].starts_with("| 0 | 100000000 | 300000000 | +200.00% |"),
            "{md}"
        );
        assert!(
            rows[2].ends_with("| 0.50 | 2.00 | 2.00 | 1.00 | 9.00 | 2.33 | 1.00 | 39.00 | 2.33 |"),
            "{md}"
        );
        assert!(md.contains("\nOn 1 CPU the copy itself"), "{md}");
        assert!(md.contains("Test \"CPU\", 2 CPUs, Linux 6.0"));
        assert!(!md.contains("Warning"));
    }

    #[test]
    fn overheads_print_as_measured() {
        assert_eq!(ns(-0.126), "-0.13");
        assert_eq!(ns(f64::NAN), "n/a");
        assert_eq!(pct(-3.2), "-3.20%");
        assert_eq!(pct(10554.873), "+10,554.87%");
        // A counter measured faster than the floor: printed negative, not 0.
        let mut r = sample_results();
        let floor = r.cell(Kind::None, 1, 0).unwrap().samples.clone();
        r.cell_mut(Kind::Atomic, 1, 0).unwrap().samples = floor.iter().map(|x| x * 1.25).collect();
        assert!(tables(&r).contains("1.00        -0.20         2.33\n"));
        assert!(markdown(&r).contains("| 1.00 | -0.20 | 2.33 |"));
        // Without a floor, no overhead columns (and no paragraph).
        r.kinds.retain(|&k| k != Kind::None);
        assert!(!tables(&r).contains("+ns"));
        assert!(!markdown(&r).contains("+ns"));
    }

    #[test]
    fn a_busy_machine_is_reported() {
        let mut r = sample_results();
        r.cells[3].cpu_shares[1] = 0.42;
        assert!(tables(&r).contains("WARNING: in some runs a thread was on a CPU only 42%"));
        assert!(markdown(&r).contains("only 42% of the time"));
    }
}
