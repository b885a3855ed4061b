//! The measured matrix and its statistics; what every output reads.
//!
//! Besides loops per second, every cell converts to *ns per loop per
//! thread*, `1e9 x threads / loops per second`, because that is the unit in
//! which costs add up: a counter's overhead is its ns per loop minus the
//! floor's (the same loop with no counting), in the same cell.

use crate::harness::Kind;
use std::time::Duration;

/// Every timed run of one (kind, threads, size) cell, in loops per second.
#[derive(Clone, Debug)]
pub struct Cell {
    pub kind: Kind,
    pub threads: usize,
    pub size: usize,
    pub samples: Vec<f64>,
    /// Per run, the smallest share of wall time a thread was on a CPU.
    pub cpu_shares: Vec<f64>,
}

impl Cell {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    /// The median (mean of the middle two for an even count).
    pub fn median(&self) -> f64 {
        let s = self.sorted();
        match s.len() {
            0 => 0.0,
            n if n % 2 == 1 => s[n / 2],
            n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(0.0)
    }

    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(0.0)
    }

    /// The smallest CPU share of any thread in any run (1.0 if unknown).
    pub fn min_cpu_share(&self) -> f64 {
        self.cpu_shares.iter().copied().fold(1.0, f64::min)
    }

    /// The median in ns per loop per thread (NaN when not measured).
    pub fn ns_per_loop(&self) -> f64 {
        ns_per_loop(self.median(), self.threads)
    }

    /// The fastest and the slowest run, in ns per loop per thread.
    pub fn ns_range(&self) -> (f64, f64) {
        (
            ns_per_loop(self.max(), self.threads),
            ns_per_loop(self.min(), self.threads),
        )
    }

    /// (max - min) / median, in percent.
    pub fn spread_pct(&self) -> f64 {
        let m = self.median();
        if m > 0.0 {
            (self.max() - self.min()) / m * 100.0
        } else {
            0.0
        }
    }
}

/// `loops_per_sec` (summed over `threads`) as ns per loop per thread; NaN
/// when nothing was counted, so that a missing cell never reads as "free".
pub fn ns_per_loop(loops_per_sec: f64, threads: usize) -> f64 {
    if loops_per_sec > 0.0 {
        1e9 * threads as f64 / loops_per_sec
    } else {
        f64::NAN
    }
}

/// What a counter adds to one loop on one thread, above the floor, in ns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overhead {
    /// The counter's median minus the floor's median: what the tables
    /// print, as measured (negative when the counting costs less than the
    /// run-to-run noise).
    pub ns: f64,
    /// The smallest overhead any pair of runs gives: the counter's fastest
    /// run minus the floor's slowest.
    pub lo: f64,
    /// The largest: the counter's slowest run minus the floor's fastest.
    pub hi: f64,
}

impl Overhead {
    /// The runs cannot tell this overhead from zero: their range holds it.
    pub fn within_noise(&self) -> bool {
        self.lo <= 0.0 && self.hi >= 0.0
    }
}

/// Where and how the matrix was measured.
#[derive(Clone, Debug)]
pub struct Meta {
    pub cpu_model: String,
    pub allowed_cpus: Vec<usize>,
    pub kernel: String,
    pub default_backend: String,
    pub duration: Duration,
    pub reps: usize,
}

impl Meta {
    /// Facts about this machine and run.
    pub fn here(duration: Duration, reps: usize, allowed_cpus: Vec<usize>) -> Meta {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("Linux {}", s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_string());
        Meta {
            cpu_model,
            allowed_cpus,
            kernel,
            default_backend: percpu_ref::backend().to_string(),
            duration,
            reps,
        }
    }

    /// One line naming the machine, e.g. for a markdown heading.
    pub fn machine(&self) -> String {
        format!(
            "{}, {} CPUs, {}",
            self.cpu_model,
            self.allowed_cpus.len(),
            self.kernel
        )
    }
}

/// The whole matrix.
#[derive(Clone, Debug)]
pub struct Results {
    pub meta: Meta,
    pub kinds: Vec<Kind>,
    pub threads: Vec<usize>,
    pub sizes: Vec<usize>,
    pub cells: Vec<Cell>,
}

impl Results {
    /// An empty matrix with one cell per (kind, threads, size).
    pub fn new(meta: Meta, kinds: &[Kind], threads: &[usize], sizes: &[usize]) -> Results {
        let mut cells = Vec::new();
        for &kind in kinds {
            for &t in threads {
                for &size in sizes {
                    cells.push(Cell {
                        kind,
                        threads: t,
                        size,
                        samples: Vec::new(),
                        cpu_shares: Vec::new(),
                    });
                }
            }
        }
        Results {
            meta,
            kinds: kinds.to_vec(),
            threads: threads.to_vec(),
            sizes: sizes.to_vec(),
            cells,
        }
    }

    pub fn cell(&self, kind: Kind, threads: usize, size: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.kind == kind && c.threads == threads && c.size == size)
    }

    pub fn cell_mut(&mut self, kind: Kind, threads: usize, size: usize) -> Option<&mut Cell> {
        self.cells
            .iter_mut()
            .find(|c| c.kind == kind && c.threads == threads && c.size == size)
    }

    /// The median of a cell, 0 when it was not measured.
    pub fn median(&self, kind: Kind, threads: usize, size: usize) -> f64 {
        self.cell(kind, threads, size).map_or(0.0, Cell::median)
    }

    /// The median of a cell in ns per loop per thread, NaN when not measured.
    pub fn ns_per_loop(&self, kind: Kind, threads: usize, size: usize) -> f64 {
        self.cell(kind, threads, size)
            .map_or(f64::NAN, Cell::ns_per_loop)
    }

    /// What `kind` adds above the floor in this cell; `None` when either
    /// cell was not measured (or `kind` is the floor itself).
    pub fn overhead(&self, kind: Kind, threads: usize, size: usize) -> Option<Overhead> {
        if kind == Kind::None {
            return None;
        }
        let (c, f) = (
            self.cell(kind, threads, size)?,
            self.cell(Kind::None, threads, size)?,
        );
        if c.samples.is_empty() || f.samples.is_empty() {
            return None;
        }
        let ((c_fast, c_slow), (f_fast, f_slow)) = (c.ns_range(), f.ns_range());
        Some(Overhead {
            ns: c.ns_per_loop() - f.ns_per_loop(),
            lo: c_fast - f_slow,
            hi: c_slow - f_fast,
        })
    }

    /// Whether the floor was measured (every run of the program measures
    /// it; a matrix built without it prints no overhead columns).
    pub fn has_floor(&self) -> bool {
        self.kinds.contains(&Kind::None)
    }

    /// The kinds that count: atomic and the percpu backends, not the floor.
    pub fn counter_kinds(&self) -> Vec<Kind> {
        self.kinds
            .iter()
            .copied()
            .filter(|&k| k != Kind::None)
            .collect()
    }

    /// The smallest CPU share seen in any run.
    pub fn min_cpu_share(&self) -> f64 {
        self.cells
            .iter()
            .map(Cell::min_cpu_share)
            .fold(1.0, f64::min)
    }

    /// The largest thread count ("all CPUs").
    pub fn max_threads(&self) -> usize {
        self.threads.iter().copied().max().unwrap_or(1)
    }

    /// Column heading of a kind: the first percpu backend is "percpu" as in
    /// the kernel's table, further ones are named by their backend.
    pub fn heading(&self, kind: Kind) -> String {
        match kind {
            Kind::Atomic => "atomic".to_string(),
            Kind::Percpu(_) if self.first_percpu() == Some(kind) => "percpu".to_string(),
            Kind::Percpu(b) => b.to_string(),
            Kind::None => "floor".to_string(),
        }
    }

    /// The percpu kinds, in column order.
    pub fn percpu_kinds(&self) -> Vec<Kind> {
        self.kinds
            .iter()
            .copied()
            .filter(|k| matches!(k, Kind::Percpu(_)))
            .collect()
    }

    fn first_percpu(&self) -> Option<Kind> {
        self.percpu_kinds().first().copied()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use percpu_ref::Backend;

    /// A small matrix with made-up samples, for the output tests.
    pub(crate) fn sample_results() -> Results {
        let meta = Meta {
            cpu_model: "Test \"CPU\"".to_string(),
            allowed_cpus: vec![0, 1],
            kernel: "Linux 6.0".to_string(),
            default_backend: "sharded".to_string(),
            duration: Duration::from_millis(50),
            reps: 3,
        };
        let kinds = [Kind::Atomic, Kind::Percpu(Backend::Sharded), Kind::None];
        let mut r = Results::new(meta, &kinds, &[1, 2], &[0, 512]);
        for c in &mut r.cells {
            // In ns per loop per thread at size 0: atomic 10 (1 thread) and
            // 40 (2 threads), percpu 3.33, floor 1; all x5 at size 512.
            let base = match c.kind {
                Kind::Atomic => 100e6 / c.threads as f64,
                Kind::Percpu(_) => 300e6 * c.threads as f64,
                Kind::None => 1000e6 * c.threads as f64,
            } / (1.0 + c.size as f64 / 128.0);
            c.samples = vec![base * 0.99, base, base * 1.02];
            c.cpu_shares = vec![1.0, 0.99, 1.0];
        }
        r
    }

    #[test]
    fn median_min_max_spread() {
        let c = Cell {
            kind: Kind::Atomic,
            threads: 1,
            size: 0,
            samples: vec![5.0, 1.0, 3.0, 100.0],
            cpu_shares: vec![0.5, 0.9],
        };
        assert_eq!(c.min_cpu_share(), 0.5);
        assert_eq!(c.median(), 4.0);
        assert_eq!((c.min(), c.max()), (1.0, 100.0));
        assert!((c.spread_pct() - 99.0 / 4.0 * 100.0).abs() < 1e-9);
        let odd = Cell {
            samples: vec![9.0, 2.0, 4.0],
            ..c
        };
        assert_eq!(odd.median(), 4.0);
    }

    #[test]
    fn headings_follow_the_kernel() {
        let r = sample_results();
        assert_eq!(r.heading(Kind::Atomic), "atomic");
        assert_eq!(r.heading(Kind::Percpu(Backend::Sharded)), "percpu");
        assert_eq!(r.heading(Kind::None), "floor");
        assert_eq!(r.counter_kinds().len(), 2);
        assert_eq!(r.percpu_kinds(), [Kind::Percpu(Backend::Sharded)]);
        assert_eq!(r.max_threads(), 2);
        assert_eq!(r.median(Kind::Atomic, 2, 0), 50e6);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn ns_per_loop_is_per_thread() {
        assert!(close(ns_per_loop(1e9, 1), 1.0));
        // Two threads doing 1e9 loops a second together: 2 ns each.
        assert!(close(ns_per_loop(1e9, 2), 2.0));
        assert!(ns_per_loop(0.0, 1).is_nan());
        let r = sample_results();
        assert!(close(r.ns_per_loop(Kind::Atomic, 2, 0), 40.0));
        assert!(close(r.ns_per_loop(Kind::None, 1, 512), 5.0));
        // The fastest run is 1.02x the median rate.
        let (fast, slow) = r.cell(Kind::None, 1, 0).unwrap().ns_range();
        assert!(close(fast, 1.0 / 1.02) && close(slow, 1.0 / 0.99));
    }

    #[test]
    fn overhead_is_ns_above_the_floor() {
        let r = sample_results();
        let sharded = Kind::Percpu(Backend::Sharded);
        let o = |k, t, s| r.overhead(k, t, s).unwrap();
        // 1e9 x threads / loops per second, minus the same for the floor.
        assert!(close(o(Kind::Atomic, 1, 0).ns, 10.0 - 1.0));
        assert!(close(o(Kind::Atomic, 2, 0).ns, 40.0 - 1.0));
        assert!(close(o(sharded, 1, 0).ns, 10.0 / 3.0 - 1.0));
        assert!(close(o(sharded, 2, 512).ns, 50.0 / 3.0 - 5.0));
        assert!(close(o(Kind::Atomic, 1, 512).ns, 50.0 - 5.0));
        // The range pairs the counter's extreme runs with the floor's.
        let a = o(Kind::Atomic, 1, 0);
        assert!(close(a.lo, 10.0 / 1.02 - 1.0 / 0.99));
        assert!(close(a.hi, 10.0 / 0.99 - 1.0 / 1.02));
        assert!(!a.within_noise());
        assert_eq!(r.overhead(Kind::None, 1, 0), None);
        assert_eq!(r.overhead(Kind::Atomic, 3, 0), None);
    }

    #[test]
    fn an_overhead_below_the_noise_stays_negative() {
        let mut r = sample_results();
        let floor = r.cell(Kind::None, 1, 0).unwrap().samples.clone();
        // The counter's runs a little faster than the floor's: noise.
        let c = r.cell_mut(Kind::Atomic, 1, 0).unwrap();
        c.samples = floor.iter().map(|x| x * 1.01).collect();
        let o = r.overhead(Kind::Atomic, 1, 0).unwrap();
        assert!(close(o.ns, 1.0 / 1.01 - 1.0), "{o:?}");
        assert!(o.ns < 0.0 && o.within_noise(), "{o:?}");
        // No floor cell, no overhead.
        let mut no_floor = sample_results();
        no_floor.cell_mut(Kind::None, 1, 0).unwrap().samples.clear();
        assert_eq!(no_floor.overhead(Kind::Atomic, 1, 0), None);
    }
}
