//! A hand-written SVG plot: throughput against thread count, one line per
//! kind at the smallest copy size (solid) and at the largest (dashed), and
//! the ideal linear scaling of percpu as a dotted grey line. The floor is
//! one of the kinds: its line is the ceiling the counters are measured
//! against.

use crate::harness::Kind;
use crate::options::Scale;
use crate::results::Results;
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 450.0;
const LEFT: f64 = 80.0;
/// The legend lives in the right margin, clear of the data.
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

/// Maps values to pixels.
struct Axes {
    x_max: f64,
    y_lo: f64,
    y_hi: f64,
    scale: Scale,
}

impl Axes {
    fn x(&self, threads: f64) -> f64 {
        let span = (self.x_max - 1.0).max(1.0);
        LEFT + (threads - 1.0) / span * (W - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Log => {
                (v.max(self.y_lo).log10() - self.y_lo.log10())
                    / (self.y_hi.log10() - self.y_lo.log10())
            }
            Scale::Linear => (v - self.y_lo) / (self.y_hi - self.y_lo),
        };
        H - BOTTOM - f * (H - TOP - BOTTOM)
    }

    /// Tick values on the y axis.
    fn y_ticks(&self) -> Vec<f64> {
        match self.scale {
            Scale::Log => {
                let (lo, hi) = (
                    self.y_lo.log10().round() as i32,
                    self.y_hi.log10().round() as i32,
                );
                // Decades, and 2x / 5x marks when there are few decades.
                let marks: &[f64] = if hi - lo <= 2 {
                    &[1.0, 2.0, 5.0]
                } else {
                    &[1.0]
                };
                (lo..=hi)
                    .flat_map(|e| marks.iter().map(move |m| m * 10f64.powi(e)))
                    .filter(|v| *v <= self.y_hi * 1.0001)
                    .collect()
            }
            Scale::Linear => (0..=5).map(|i| self.y_hi * i as f64 / 5.0).collect(),
        }
    }
}

/// `1.5e9` → `1.5G`, `2e8` → `200M`.
pub fn si(v: f64) -> String {
    let (div, unit) = match v.abs() {
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / div;
    let s = if (x - x.round()).abs() < 0.05 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    };
    format!("{s}{unit}")
}

fn axes(r: &Results, sizes: &[usize], scale: Scale) -> Axes {
    let vals: Vec<f64> = r
        .cells
        .iter()
        .filter(|c| sizes.contains(&c.size))
        .map(|c| c.median())
        .filter(|v| *v > 0.0)
        .chain(ideal(r, sizes).into_iter().map(|(_, v)| v))
        .collect();
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo, hi)
    } else {
        (1.0, 10.0)
    };
    let x_max = r.max_threads() as f64;
    match scale {
        Scale::Log => Axes {
            x_max,
            y_lo: 10f64.powf(lo.log10().floor()),
            y_hi: 10f64
                .powf(hi.log10().ceil())
                .max(10f64.powf(lo.log10().floor() + 1.0)),
            scale,
        },
        Scale::Linear => {
            let step = 10f64.powf(hi.log10().floor());
            Axes {
                x_max,
                y_lo: 0.0,
                y_hi: (hi / step).ceil() * step,
                scale,
            }
        }
    }
}

/// Perfect scaling of the first percpu kind at the smallest size.
fn ideal(r: &Results, sizes: &[usize]) -> Vec<(usize, f64)> {
    let (Some(&k), Some(&s)) = (r.percpu_kinds().first(), sizes.first()) else {
        return Vec::new();
    };
    let one = r.median(k, 1, s);
    if one <= 0.0 || r.max_threads() == 1 {
        return Vec::new();
    }
    r.threads.iter().map(|&t| (t, one * t as f64)).collect()
}

/// The plot as an SVG document.
pub fn render(r: &Results, scale: Scale) -> String {
    let sizes = plotted_sizes(r);
    let ax = axes(r, &sizes, scale);
    let mut s = heading(r, scale);
    s += &busy_note(r);
    s += &frame(r, &ax);
    let (lines, legend) = series(r, &ax, &sizes);
    s += &lines;
    s += &legend_box(&legend);
    s += "</svg>\n";
    s
}

/// The smallest copy size and the largest: the two ends show how the copy
/// changes the picture without crowding the plot with every size.
fn plotted_sizes(r: &Results) -> Vec<usize> {
    let mut sizes = vec![];
    sizes.extend(r.sizes.first());
    sizes.extend(r.sizes.last().filter(|l| Some(*l) != r.sizes.first()));
    sizes
}

/// The document's opening, with a title that names the machine and the
/// runs, so that a plot shared alone still says where it came from.
fn heading(r: &Results, scale: Scale) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">get + memcpy + put \
         loops per second, atomic vs percpu vs floor ({} y axis)</text>",
        (LEFT + W - RIGHT) / 2.0,
        if scale == Scale::Log { "log" } else { "linear" }
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"38\" text-anchor=\"middle\" fill=\"#555\">{}; median of {} runs of {} ms</text>",
        (LEFT + W - RIGHT) / 2.0,
        escape(&r.meta.machine()),
        r.meta.reps,
        r.meta.duration.as_millis()
    );
    s
}

/// A warning under the title when the machine was busy, since the lines
/// then understate throughput and scaling; empty otherwise.
fn busy_note(r: &Results) -> String {
    let share = r.min_cpu_share();
    if share >= crate::table::BUSY_SHARE {
        return String::new();
    }
    format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#d62728\">busy machine: \
         a thread was on a CPU only {:.0}% of the time in some runs</text>\n",
        (LEFT + W - RIGHT) / 2.0,
        TOP + 12.0,
        share * 100.0
    )
}

/// Axes, grid and labels.
fn frame(r: &Results, ax: &Axes) -> String {
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let mut s = String::new();
    for v in ax.y_ticks() {
        let y = ax.y(v);
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 6.0,
            y + 4.0,
            si(v)
        );
    }
    for &t in &r.threads {
        let x = ax.x(t as f64);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t}</text>",
            y0 + 5.0,
            y0 + 20.0
        );
    }
    let _ = writeln!(
        s,
        "<polyline points=\"{x0},{y1} {x0},{y0} {x1},{y0}\" fill=\"none\" stroke=\"#333\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">threads (one per CPU, one shared object)</text>\n\
         <text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">loops per second (all threads)</text>",
        (x0 + x1) / 2.0,
        H - 18.0,
        (y0 + y1) / 2.0
    );
    s
}

/// A legend entry: colour, dash pattern, label.
type Entry = (&'static str, &'static str, String);

/// Every line of the plot, and the legend entries in the order drawn: the
/// ideal scaling first, so that the measured lines are drawn over it.
fn series(r: &Results, ax: &Axes, sizes: &[usize]) -> (String, Vec<Entry>) {
    let mut s = String::new();
    let mut legend = Vec::new();
    let ideal = ideal(r, sizes);
    if !ideal.is_empty() {
        s += &polyline(ax, &ideal, "#999", "2,4");
        legend.push(("#999", "2,4", "percpu, ideal linear scaling".to_string()));
    }
    for (i, &k) in r.kinds.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for (j, &size) in sizes.iter().enumerate() {
            let dash = if j == 0 { "" } else { "8,4" };
            s += &kind_line(r, ax, k, size, colour, dash);
            legend.push((colour, dash, format!("{}, copy size {size}", name(r, k))));
        }
    }
    (s, legend)
}

/// One kind at one size against threads, each point with a tooltip that
/// gives the measured rate, which the log axis makes hard to read off.
fn kind_line(r: &Results, ax: &Axes, k: Kind, size: usize, colour: &str, dash: &str) -> String {
    let pts: Vec<(usize, f64)> = r
        .threads
        .iter()
        .map(|&t| (t, r.median(k, t, size)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let mut s = polyline(ax, &pts, colour, dash);
    for (t, v) in &pts {
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{} copy {size}, {t} threads: {:.0}/s</title></circle>",
            ax.x(*t as f64),
            ax.y(*v),
            escape(&name(r, k)),
            v
        );
    }
    s
}

/// The legend, in the right margin, clear of the data.
fn legend_box(legend: &[Entry]) -> String {
    let mut s = String::new();
    for (i, (colour, dash, label)) in legend.iter().enumerate() {
        let y = TOP + 8.0 + 18.0 * i as f64;
        let x0 = W - RIGHT + 10.0;
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
             stroke-width=\"2\" stroke-dasharray=\"{dash}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x0 + 10.0,
            x0 + 40.0,
            x0 + 46.0,
            y + 4.0,
            escape(label)
        );
    }
    s
}

fn name(r: &Results, k: Kind) -> String {
    match k {
        Kind::Atomic => "atomic".to_string(),
        Kind::Percpu(b) => format!("{} ({b})", r.heading(k)),
        Kind::None => "floor (no counting)".to_string(),
    }
}

fn polyline(ax: &Axes, pts: &[(usize, f64)], colour: &str, dash: &str) -> String {
    let p: Vec<String> = pts
        .iter()
        .map(|&(t, v)| format!("{:.1},{:.1}", ax.x(t as f64), ax.y(v)))
        .collect();
    format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" \
         stroke-dasharray=\"{dash}\"/>\n",
        p.join(" ")
    )
}

/// XML text escaping.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample_results;

    #[test]
    fn si_labels() {
        assert_eq!(si(1.5e9), "1.5G");
        assert_eq!(si(2e8), "200M");
        assert_eq!(si(1e3), "1k");
        assert_eq!(si(7.0), "7");
    }

    #[test]
    fn plot_has_every_series_and_stays_in_the_frame() {
        let r = sample_results();
        for scale in [Scale::Log, Scale::Linear] {
            let svg = render(&r, scale);
            assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
            // 3 kinds x 2 sizes, plus the ideal line, plus the frame.
            assert_eq!(svg.matches("<polyline").count(), 6 + 1 + 1, "{svg}");
            assert_eq!(svg.matches("<circle").count(), 3 * 2 * 2);
            assert!(svg.contains("floor (no counting), copy size 0"));
            assert!(svg.contains("Test &quot;CPU&quot;"));
            assert!(svg.contains("atomic, copy size 512"));
            assert!(!svg.contains("busy machine"));
            for cap in svg.split("cy=\"").skip(1) {
                let y: f64 = cap.split('"').next().unwrap().parse().unwrap();
                assert!(
                    (TOP - 0.5..=H - BOTTOM + 0.5).contains(&y),
                    "{scale:?} y {y}"
                );
            }
        }
    }

    #[test]
    fn log_axis_spans_whole_decades() {
        let r = sample_results();
        let ax = axes(&r, &[0, 512], Scale::Log);
        // The floor on 2 CPUs at size 0 (2e9) sets the top.
        assert_eq!(ax.y_lo, 1e7);
        assert_eq!(ax.y_hi, 1e10);
        assert_eq!(ax.y_ticks(), vec![1e7, 1e8, 1e9, 1e10]);
        assert!((ax.y(1e7) - (H - BOTTOM)).abs() < 1e-9);
        assert!((ax.y(1e10) - TOP).abs() < 1e-9);
        // Without the floor, few decades get 2x and 5x marks too.
        let mut r = r;
        r.kinds.retain(|&k| k != Kind::None);
        r.cells.retain(|c| c.kind != Kind::None);
        let ax = axes(&r, &[0, 512], Scale::Log);
        assert_eq!(ax.y_ticks(), vec![1e7, 2e7, 5e7, 1e8, 2e8, 5e8, 1e9]);
    }
}
