//! `PercpuRef` against the crates a Rust user would pick instead, and
//! against the floor of its own design.
//!
//! Rows, each at 1 thread and at all CPUs (`available_parallelism`; with
//! more than one thread, each is pinned to its own allowed CPU), all
//! threads on *one* shared object:
//! - `floor`: a minimal restartable sequence written inline below (Linux
//!   x86_64 with glibc's rseq area registered; otherwise the row is skipped
//!   with the reason printed);
//! - `percpu_ref`: [`PercpuRef::get`] + [`PercpuRef::put`] on one ref made
//!   by [`PercpuRef::new`], so on the process default backend;
//! - `arc`: `Arc::clone` + drop;
//! - `shared`: `percpu_ref::shared::Shared` clone + drop on a promoted
//!   value (per CPU, managed by the engine; on the sharded backend it
//!   cannot be promoted and the row measures its atomic mode);
//! - `arc_swap_load`: `ArcSwap::load` and drop of its guard, on one
//!   `ArcSwap<u64>` (arc-swap's read side: a thread-local debt slot, no
//!   shared write while the slot is free);
//! - `epoch_pin`: `crossbeam_epoch::pin` and drop of its guard (the shared
//!   object is crossbeam's default collector);
//! - `arc_waker` and `shared_waker`: a `Waker` clone + drop, the waker made
//!   by `Waker::from` of an `Arc` (`std::task::Wake`) and of a promoted
//!   `Shared` (`percpu_ref::shared::Wake`): what an async runtime pays each
//!   time a future stores its task's waker.
//!
//! One criterion iteration is one operation pair *per thread*, timed as the
//! slowest thread from a common start, as in `benches/fast_path.rs`.
//!
//! # Why the floor is the floor
//!
//! It is the crate's fast path with everything taken away that the design
//! does not need: per operation, arm the section, read `cpu_id`, one
//! unsigned compare of it against a limit held in the mode word (which
//! rejects atomic mode, an unregistered thread and a CPU without a
//! counter in one branch), one shift and one add to this CPU's counter.
//! The rseq offset, the counter base and the mode word's address are
//! loaded once before the timed loop, not per operation, and there is no
//! backend dispatch and no result to test after the section. No per-CPU
//! refcount that keeps the kernel's guarantees can do less per operation,
//! so `percpu_ref / floor` is what the rest of the crate's fast path costs.
//!
//! It is the floor in instructions, not necessarily in time: a get and
//! its put add to the same CPU's counter, each add a load-add-store that
//! waits for the previous one's store, and where that chain bounds the
//! pair the fast path's extra loads hide in its shadow. The floor can
//! then measure level with `percpu_ref` or a little above it (it did on
//! the 2-vCPU development machine, where reloading its handle before every
//! add brought it level): a ratio at or below 1 says the extra
//! instructions cost nothing there, not that the crate beats its floor.
//!
//! # Output
//!
//! After criterion, a summary table: ns per operation pair per thread,
//! median of 5 runs per row and thread count (the runs together last about
//! `PERCPU_REF_SUMMARY_MS` milliseconds, default 200; 0 skips the summary),
//! then the ratios the project's issue sets targets for: `percpu_ref /
//! floor`, and each peer over `percpu_ref`. The ratios depend on the CPU
//! (how much a locked read-modify-write and a contended cache line cost
//! against a plain add), on how many CPUs there are and, in a VM, on the
//! hypervisor: compare them on one machine, not across machines.
//!
//! ```text
//! cargo bench --bench peers -- --warm-up-time 0.3 --measurement-time 1
//! ```
//!
//! The floor's section jumps to Rust labels from `asm!` (asm goto), as the
//! crate's own fast path does: Rust 1.87 or newer.

#[path = "common/affinity.rs"]
mod affinity;

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, Throughput};
use percpu_ref::shared::Shared;
use percpu_ref::{InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

/// The summary's runs per row and thread count (odd, for a plain median).
const RUNS: usize = 5;

/// One operation pair on a shared object.
trait Pair: Sync {
    fn pair(&self);

    /// `iters` pairs: the timed loop. `black_box` on the object each pair,
    /// as in `benches/fast_path.rs`, keeps the optimiser from hoisting work
    /// on it out of the loop; the floor overrides this, since hoisting the
    /// constant loads is what makes it the floor.
    #[inline(always)]
    fn pairs(&self, iters: u64) {
        for _ in 0..iters {
            black_box(self).pair();
        }
    }

    /// Runs after every timed run, with no thread inside the object.
    fn check(&self) {}
}

struct Percpu(PercpuRef);
impl Pair for Percpu {
    #[inline(always)]
    fn pair(&self) {
        self.0.get();
        self.0.put();
    }
}

struct ArcPair(Arc<u64>);
impl Pair for ArcPair {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(Arc::clone(&self.0)));
    }
}

struct SharedPair(Shared<u64>);
impl Pair for SharedPair {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(Shared::clone(&self.0)));
    }
}

/// A task whose wake does nothing, for the waker rows.
struct Task;
impl std::task::Wake for Task {
    fn wake(self: Arc<Self>) {}
}
impl percpu_ref::shared::Wake for Task {
    fn wake(_: Shared<Self>) {}
}

struct WakerPair(Waker);
impl Pair for WakerPair {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(self.0.clone()));
    }
}

struct ArcSwapLoad(ArcSwap<u64>);
impl Pair for ArcSwapLoad {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(self.0.load()));
    }
}

struct EpochPin;
impl Pair for EpochPin {
    #[inline(always)]
    fn pair(&self) {
        drop(black_box(crossbeam_epoch::pin()));
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod floor {
    //! The floor: one restartable sequence per operation, inline.

    use crossbeam_utils::CachePadded;
    use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
    use std::arch::asm;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// log2 of the bytes between two CPUs' counters: one page per CPU, as
    /// the crate's arena lays them out, so no two CPUs share a line.
    const SHIFT: u32 = 12;

    pub struct Floor {
        /// glibc's `__rseq_offset`: the rseq area from the thread pointer.
        off: isize,
        /// CPU c's counter is the u64 at `base + (c << SHIFT)`.
        base: *mut u8,
        layout: Layout,
        ncpu: usize,
        /// The mode word and, beside it on one cache line as in a
        /// `PercpuRef`, the count the fallback adds to.
        near: ModeAndCount,
        /// The fallback's count on a cache line of its own, for `FAR`.
        far: CachePadded<AtomicU64>,
        kind: Kind,
        /// Operations that took the fallback in percpu mode (a diagnostic,
        /// not kept in atomic mode, where that is every operation).
        not_counted: AtomicU64,
    }

    /// The words every operation of the floor reads and writes.
    #[repr(C, align(16))]
    struct ModeAndCount {
        /// The low 32 bits are the limit `cpu_id` must be below: `ncpu`
        /// (percpu mode), or 0 (atomic mode: nothing counts per CPU). Read
        /// by the section only.
        mode: AtomicUsize,
        /// What the section could not count: nothing in percpu mode, every
        /// operation in atomic mode (the floor of atomic mode: a section
        /// that finds the bound at 0, then one atomic add).
        fallback: AtomicU64,
    }

    /// Which floor.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// Percpu mode: every add counts in the section.
        Percpu,
        /// Atomic mode, the count on the mode word's cache line (a
        /// one-line ref's layout, 24 bytes apart: a `PercpuRef`'s before
        /// its count got a line of its own).
        Near,
        /// Atomic mode, the count on a cache line of its own (a
        /// `PercpuRef`'s layout).
        Far,
    }

    // SAFETY: `base` is owned by the `Floor` and only written through the
    // section, each CPU's counter by the threads on that CPU, the kernel
    // restarting any add that is interrupted; it is read in `balance` only
    // after the writing threads were joined. The other fields are atomics
    // or never written after `new`.
    unsafe impl Sync for Floor {}

    /// The per-thread copy of what the section needs, taken before the
    /// timed loop so that the loop holds it in registers.
    #[derive(Clone, Copy)]
    struct Handle<'a> {
        off: isize,
        base: *mut u8,
        mode: *const usize,
        /// Where the fallback adds ([`Floor::fallback`]).
        fallback: &'a AtomicU64,
        floor: &'a Floor,
    }

    impl Floor {
        /// The floor of `kind`, or why this process cannot run it.
        pub fn new(kind: Kind) -> Result<Floor, String> {
            let off = rseq_offset()?;
            let cpu = current_cpu_id(off);
            if cpu < 0 {
                return Err(format!(
                    "this thread's rseq area is not registered (cpu_id {cpu})"
                ));
            }
            // The crate's own count (highest possible CPU id + 1, from
            // /sys/devices/system/cpu/possible): the arena it sizes is
            // what the crate's fast path indexes, so the floor indexes the
            // same number of pages.
            let ncpu = percpu_ref::possible_cpus();
            // Below i32::MAX, every negative `cpu_id` (unregistered) reads
            // as unsigned at or above the limit.
            let limit = u32::try_from(ncpu)
                .ok()
                .filter(|&n| n < i32::MAX as u32)
                .ok_or_else(|| format!("{ncpu} possible CPUs"))?;
            let layout =
                Layout::from_size_align(ncpu << SHIFT, 1 << SHIFT).map_err(|e| e.to_string())?;
            // SAFETY: the layout's size is at least one page (ncpu >= 1).
            let base = unsafe { alloc_zeroed(layout) };
            if base.is_null() {
                handle_alloc_error(layout);
            }
            let floor = Floor {
                off,
                base,
                layout,
                ncpu,
                near: ModeAndCount {
                    mode: AtomicUsize::new(if kind == Kind::Percpu {
                        limit as usize
                    } else {
                        0
                    }),
                    fallback: AtomicU64::new(0),
                },
                far: CachePadded::new(AtomicU64::new(0)),
                kind,
                not_counted: AtomicU64::new(0),
            };
            // The balance check after each run passes if nothing is ever
            // counted; show once that one add counts, and where.
            let h = floor.handle();
            h.add(1);
            let counted = floor.balance();
            let in_fallback = floor.fallback().load(Ordering::Relaxed);
            h.add(1u64.wrapping_neg());
            if counted != 1 || in_fallback != u64::from(kind != Kind::Percpu) {
                return Err(format!(
                    "self-test: one add counted {counted} ({in_fallback} in the fallback)"
                ));
            }
            Ok(floor)
        }

        fn handle(&self) -> Handle<'_> {
            Handle {
                off: self.off,
                base: self.base,
                mode: self.near.mode.as_ptr(),
                fallback: self.fallback(),
                floor: self,
            }
        }

        /// The count the fallback adds to.
        #[inline(always)]
        fn fallback(&self) -> &AtomicU64 {
            if self.kind == Kind::Far {
                &self.far
            } else {
                &self.near.fallback
            }
        }

        /// Gets minus puts, over every CPU's counter and the fallback.
        fn balance(&self) -> u64 {
            (0..self.ncpu)
                .map(|c| {
                    // SAFETY: CPU c's counter is inside the allocation
                    // (c < ncpu), 8-aligned, and no thread is inside a
                    // section (the runs joined their threads).
                    unsafe { self.base.add(c << SHIFT).cast::<u64>().read() }
                })
                .fold(self.fallback().load(Ordering::Relaxed), u64::wrapping_add)
        }

        /// Operations that took the fallback so far.
        pub fn not_counted(&self) -> u64 {
            self.not_counted.load(Ordering::Relaxed)
        }
    }

    impl Drop for Floor {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(self.base, self.layout) }
        }
    }

    impl Handle<'_> {
        /// Adds `delta` (wrapping) to this CPU's counter.
        #[inline(always)]
        fn add(self, delta: u64) {
            loop {
                // SAFETY: `off` is glibc's `__rseq_offset` and this
                // thread's area is registered (glibc registers every
                // thread; an unregistered one has cpu_id -1 and is sent
                // to the fallback by the compare); the section writes only
                // `rseq_cs` there, as the ABI intends. The descriptor is
                // in `__rseq_cs`, 32-byte aligned, and `abort_ip` lies
                // outside [start_ip, post_commit) right after glibc's x86
                // signature 0x53053053. The arming store is the last
                // instruction before `start_ip`, so a preemption after it
                // lands in the section. The add writes CPU `cpu_id`'s
                // counter only when `cpu_id` < the limit in `mode` (= ncpu
                // < i32::MAX, unsigned), so inside the allocation; only
                // this CPU's threads write it, and the kernel restarts an
                // add that is interrupted before it commits.
                unsafe {
                    asm!(
                        "lea {tmp}, [rip + 3f]",
                        "mov qword ptr fs:[{off} + 8], {tmp}",
                        "4:",
                        "mov {tmp:e}, dword ptr fs:[{off} + 4]",
                        "cmp {tmp:e}, dword ptr [{mode}]",
                        "jae {not_counted}",
                        "shl {tmp}, {shift}",
                        "add qword ptr [{base} + {tmp}], {delta}",
                        "5:",
                        ".pushsection __rseq_cs, \"aw\"",
                        ".balign 32",
                        "3:",
                        ".long 0, 0",
                        ".quad 4b, 5b - 4b, 6f",
                        ".popsection",
                        ".pushsection .text.unlikely.peers_floor_abort, \"ax\"",
                        ".byte 0x0f, 0xb9, 0x3d",
                        ".long 0x53053053",
                        "6:",
                        "jmp {aborted}",
                        ".popsection",
                        off = in(reg) self.off,
                        mode = in(reg) self.mode,
                        base = in(reg) self.base,
                        delta = in(reg) delta,
                        shift = const SHIFT,
                        tmp = out(reg) _,
                        not_counted = label {
                            self.fallback.fetch_add(delta, Ordering::Relaxed);
                            if self.floor.kind == Kind::Percpu {
                                self.floor.not_counted.fetch_add(1, Ordering::Relaxed);
                            }
                        },
                        aborted = label {
                            continue;
                        },
                        options(nostack),
                    );
                }
                return;
            }
        }
    }

    impl super::Pair for Floor {
        #[inline(always)]
        fn pair(&self) {
            self.pairs(1);
        }

        #[inline(always)]
        fn pairs(&self, iters: u64) {
            let h = self.handle();
            for _ in 0..iters {
                h.add(1);
                h.add(1u64.wrapping_neg());
            }
        }

        fn check(&self) {
            assert_eq!(self.balance(), 0, "floor: gets and puts do not balance");
        }
    }

    /// glibc's `__rseq_offset`, if glibc registered an rseq area.
    fn rseq_offset() -> Result<isize, String> {
        // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only
        // looks symbols up; it returns null when they are absent.
        let (off, size) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
            )
        };
        if off.is_null() || size.is_null() {
            return Err("no __rseq_offset / __rseq_size (not glibc >= 2.35)".into());
        }
        // SAFETY: glibc defines them as `const ptrdiff_t` and `const
        // unsigned int`, set before user code runs and never written again.
        let (off, size) = unsafe { (*off.cast::<isize>(), *size.cast::<u32>()) };
        if size == 0 {
            return Err("glibc did not register rseq (__rseq_size = 0)".into());
        }
        Ok(off)
    }

    /// This thread's `rseq->cpu_id` (negative when not registered).
    fn current_cpu_id(off: isize) -> i32 {
        let cpu: i32;
        // SAFETY: glibc reserves the rseq area at `off` from the thread
        // pointer in every thread; this reads its `cpu_id` field.
        unsafe {
            asm!(
                "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                off = in(reg) off,
                cpu = out(reg) cpu,
                options(nostack, readonly, preserves_flags),
            );
        }
        cpu
    }
}

/// The thread counts measured: 1 and all CPUs.
fn thread_counts() -> Vec<usize> {
    let n = std::thread::available_parallelism().map_or(1, |p| p.get());
    if n > 1 {
        vec![1, n]
    } else {
        vec![1]
    }
}

/// `threads` threads each do `iters` pairs on `obj`; returns the slowest
/// thread's time, measured from a common start.
fn run<P: Pair>(obj: &P, threads: usize, iters: u64, cpus: &[usize]) -> Duration {
    let slowest = affinity::run_pinned(threads, cpus, || obj.pairs(iters));
    obj.check();
    slowest
}

/// The objects of every row, shared by criterion and the summary. The
/// floor is `Err` with the reason where it cannot run.
struct Rows {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    floor: Result<floor::Floor, String>,
    percpu: Percpu,
    arc: ArcPair,
    shared: SharedPair,
    arc_swap: ArcSwapLoad,
    epoch: EpochPin,
    arc_waker: WakerPair,
    shared_waker: WakerPair,
}

impl Rows {
    fn new() -> Rows {
        Rows {
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            floor: floor::Floor::new(floor::Kind::Percpu),
            percpu: Percpu(PercpuRef::new(|_| {})),
            arc: ArcPair(Arc::new(0)),
            shared: {
                let s = Shared::new(0);
                Shared::promote(&s);
                SharedPair(s)
            },
            arc_swap: ArcSwapLoad(ArcSwap::from_pointee(0)),
            epoch: EpochPin,
            arc_waker: WakerPair(Waker::from(Arc::new(Task))),
            shared_waker: WakerPair(Waker::from({
                let s = Shared::new(Task);
                Shared::promote(&s);
                s
            })),
        }
    }

    fn floor_skipped(&self) -> Option<String> {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        return self.floor.as_ref().err().cloned();
        #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
        Some("needs Linux on x86_64".into())
    }

    /// Calls `f` with each runnable row's criterion id, summary label and
    /// a runner `(threads, iters) -> slowest thread's time`.
    fn each(&self, cpus: &[usize], mut f: impl FnMut(&str, &str, &dyn Fn(usize, u64) -> Duration)) {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        if let Ok(fl) = &self.floor {
            f("floor", FLOOR, &|t, n| run(fl, t, n, cpus));
        }
        f("percpu_ref", PERCPU, &|t, n| run(&self.percpu, t, n, cpus));
        f("arc", ARC, &|t, n| run(&self.arc, t, n, cpus));
        f("shared", SHARED, &|t, n| run(&self.shared, t, n, cpus));
        f("arc_swap_load", "ArcSwap::load", &|t, n| {
            run(&self.arc_swap, t, n, cpus)
        });
        f("epoch_pin", "crossbeam_epoch::pin", &|t, n| {
            run(&self.epoch, t, n, cpus)
        });
        f("arc_waker", ARC_WAKER, &|t, n| {
            run(&self.arc_waker, t, n, cpus)
        });
        f("shared_waker", SHARED_WAKER, &|t, n| {
            run(&self.shared_waker, t, n, cpus)
        });
    }

    /// Prints how many floor operations took the fallback, if any did.
    fn report_not_counted(&self) {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        if let Ok(fl) = &self.floor {
            if fl.not_counted() != 0 {
                println!(
                    "floor: {} operations took the atomic fallback (cpu_id at or above the \
                     limit)",
                    fl.not_counted()
                );
            }
        }
    }
}

const FLOOR: &str = "floor (inline rseq)";
const PERCPU: &str = "percpu_ref get+put";
const ARC: &str = "Arc clone+drop";
const SHARED: &str = "Shared clone+drop";
const ARC_WAKER: &str = "Waker(Arc) clone+drop";
const SHARED_WAKER: &str = "Waker(Shared) clone+drop";

fn bench_peers(c: &mut Criterion, rows: &Rows, cpus: &[usize]) {
    let mut g = c.benchmark_group("peers");
    if let Some(why) = rows.floor_skipped() {
        println!("peers/floor skipped: {why}");
    }
    for threads in thread_counts() {
        g.throughput(Throughput::Elements(threads as u64));
        rows.each(cpus, |id, _, runner| {
            g.bench_function(BenchmarkId::new(id, threads), |b| {
                b.iter_custom(|n| runner(threads, n))
            });
        });
    }
    g.finish();
}

/// Median ns per pair per thread of [`RUNS`] runs lasting about
/// `ms / RUNS` each, and the pairs per run.
fn measure(runner: &dyn Fn(usize, u64) -> Duration, threads: usize, ms: u64) -> (f64, u64) {
    let ns = |pairs: u64| runner(threads, pairs).as_secs_f64() * 1e9 / pairs as f64;
    let probe = (0..3).map(|_| ns(20_000)).fold(f64::INFINITY, f64::min);
    let pairs = ((ms as f64 * 1e6 / RUNS as f64) / probe).max(10_000.0) as u64;
    let mut samples: Vec<f64> = (0..RUNS).map(|_| ns(pairs)).collect();
    samples.sort_by(f64::total_cmp);
    (samples[RUNS / 2], pairs)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `PERCPU_REF_SUMMARY_MS`: about how long each summary row runs (0: no
/// summary).
fn summary_ms() -> u64 {
    std::env::var("PERCPU_REF_SUMMARY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// A table's rows, one cell per thread count.
fn print_table(table: &[(String, Vec<f64>)], counts: &[usize]) {
    let mut header = format!("{:<24}{:>10}", "", "1 thread");
    if counts.len() > 1 {
        header += &format!("{:>12}", format!("{} threads", counts.last().unwrap()));
    }
    println!("{header}");
    for (label, cells) in table {
        let mut line = format!("{label:<24}{:>10.2}", cells[0]);
        if let Some(c) = cells.get(1) {
            line += &format!("{c:>12.2}");
        }
        println!("{line}");
    }
}

fn summary(rows: &Rows, cpus: &[usize], ms: u64) {
    let counts = thread_counts();
    let mut table: Vec<(String, Vec<f64>)> = Vec::new();
    let (mut fewest, mut most) = (u64::MAX, 0);
    rows.each(cpus, |_, label, runner| {
        let cells = counts
            .iter()
            .map(|&t| {
                let (ns, pairs) = measure(runner, t, ms);
                fewest = fewest.min(pairs);
                most = most.max(pairs);
                ns
            })
            .collect();
        table.push((label.to_string(), cells));
    });
    let all = *counts.last().unwrap();
    let mega = |p: u64| p as f64 / 1e6;
    println!(
        "\npeers (ns per operation pair per thread, median of {RUNS} runs of {:.1}M to {:.1}M \
         pairs; machine: {}, {all} CPUs)",
        mega(fewest),
        mega(most),
        cpu_model()
    );
    print_table(&table, &counts);
    if let Some(why) = rows.floor_skipped() {
        println!("{FLOOR}: skipped: {why}");
    }
    println!("percpu_ref backend: {}", rows.percpu.0.backend());
    rows.report_not_counted();

    let get = |label: &str| table.iter().find(|r| r.0 == label).map(|r| &r.1);
    let at_all = |v: &[f64]| *v.last().unwrap();
    let percpu = get(PERCPU).expect("percpu_ref row measured");
    match get(FLOOR) {
        Some(floor) => println!(
            "percpu_ref / floor: {:.2} at 1 thread (target <= 1.15), {:.2} at {all} threads",
            percpu[0] / floor[0],
            at_all(percpu) / at_all(floor)
        ),
        None => println!("percpu_ref / floor: not measured (floor skipped)"),
    }
    if let (Some(shared), Some(arc)) = (get(SHARED), get(ARC)) {
        println!(
            "Shared / percpu_ref: {:.2} at 1 thread, {:.2} at {all} threads (target <= 1.2; \
             promoted: {})",
            shared[0] / percpu[0],
            at_all(shared) / at_all(percpu),
            Shared::is_percpu(&rows.shared.0)
        );
        println!(
            "Arc / Shared: {:.2} at 1 thread (target >= 2.5), {:.2} at {all} threads \
             (target >= 10 at 2)",
            arc[0] / shared[0],
            at_all(arc) / at_all(shared)
        );
    }
    if let (Some(shared), Some(arc)) = (get(SHARED_WAKER), get(ARC_WAKER)) {
        println!(
            "Waker(Arc) / Waker(Shared): {:.2} at 1 thread, {:.2} at {all} threads",
            arc[0] / shared[0],
            at_all(arc) / at_all(shared)
        );
    }
    for (label, cells) in table
        .iter()
        .filter(|r| ![FLOOR, PERCPU, SHARED, ARC_WAKER, SHARED_WAKER].contains(&r.0.as_str()))
    {
        println!(
            "{label} / percpu_ref: {:.2} at 1 thread (target >= 1.3), {:.2} at {all} threads \
             (target >= 1.5)",
            cells[0] / percpu[0],
            at_all(cells) / at_all(percpu)
        );
    }
}

// ----- atomic mode ------------------------------------------------------------

/// How a timed loop of the atomic-mode tables runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loop {
    /// Pairs back to back, the object's address passed through a register
    /// the optimiser cannot see into: no memory write but the pair's own.
    BackToBack,
    /// One store of the loop's own per pair, as any caller's loop body has.
    WithStore,
}

/// `r`, through a register the optimiser cannot see into, so that nothing
/// loaded through it is hoisted out of the timed loop, without the store
/// to the stack that `black_box(r)` makes (on x86, a locked RMW waits for
/// every earlier store to drain, so that store would be timed too).
#[inline(always)]
fn opaque<T>(r: &T) -> &T {
    #[allow(unused_mut)]
    let mut p = std::ptr::from_ref(r);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    // The pointer is only passed through a register, never dereferenced.
    #[allow(clippy::pointers_in_nomem_asm_block)]
    // SAFETY: an empty instruction string: `p` is left as it was, and the
    // asm touches no memory, stack or flags.
    unsafe {
        std::arch::asm!("/* {0} */", inout(reg) p, options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        p = black_box(p);
    }
    // SAFETY: `p` is `r`, unchanged.
    unsafe { &*p }
}

/// `iters` pairs on `obj` in the way `lp` says.
#[inline(never)]
fn atomic_pairs<P: Pair>(obj: &P, iters: u64, lp: Loop) {
    for i in 0..iters {
        opaque(obj).pair();
        if lp == Loop::WithStore {
            black_box(i);
        }
    }
}

/// A bare `AtomicU64` used as a refcount: the cheapest counter that can
/// see zero, and the row the atomic-mode targets compare with.
struct AtomicBare(AtomicU64);
impl Pair for AtomicBare {
    #[inline(always)]
    fn pair(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// `tryget` + `put`; `check` asserts every tryget succeeded.
struct TryPair(PercpuRef);
impl Pair for TryPair {
    #[inline(always)]
    fn pair(&self) {
        if self.0.tryget() {
            self.0.put();
        }
    }
    fn check(&self) {
        assert_eq!(self.0.atomic_count(), Some(1), "tryget + put: unbalanced");
    }
}

/// `tryget_live` + `put`.
struct TryLivePair(PercpuRef);
impl Pair for TryLivePair {
    #[inline(always)]
    fn pair(&self) {
        if self.0.tryget_live() {
            self.0.put();
        }
    }
    fn check(&self) {
        assert_eq!(
            self.0.atomic_count(),
            Some(1),
            "tryget_live + put: unbalanced"
        );
    }
}

/// `Arc` clone + drop, the clone's pointer kept in a register (no store:
/// see [`opaque`]).
struct ArcInRegister(Arc<u64>);
impl Pair for ArcInRegister {
    #[inline(always)]
    fn pair(&self) {
        let p = Arc::into_raw(Arc::clone(&self.0));
        // SAFETY: `p` came from `Arc::into_raw` just above; this gives the
        // clone's count back.
        drop(unsafe { Arc::from_raw(opaque(&*p)) });
    }
}

/// A row's object at the start of a cache line of its own, so that where
/// its words fall is the same in every run (a `PercpuRef`: its count on
/// the first line, its mode word on the second; a floor's words as its
/// kind says; the bare counter alone on its line).
#[repr(align(64))]
struct Line<P>(P);

impl<P: Pair> Pair for Line<P> {
    #[inline(always)]
    fn pair(&self) {
        self.0.pair();
    }
    fn check(&self) {
        self.0.check();
    }
}

/// The atomic-mode rows: one shared object each, in atomic mode.
struct AtomicRows {
    bare: Line<AtomicBare>,
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    floor_near: Result<floor::Floor, String>,
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    floor_far: Result<floor::Floor, String>,
    init_atomic: Line<Percpu>,
    tryget: Line<TryPair>,
    tryget_live: Line<TryLivePair>,
    killed: Line<Percpu>,
    arc: ArcInRegister,
}

const ATOMIC_BARE: &str = "AtomicU64 add+sub";
const ATOMIC_FLOOR: &str = "floor (section+add)";
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const ATOMIC_FLOOR_FAR: &str = "floor, count own line";
const ATOMIC_REFS: [&str; 4] = [
    "INIT_ATOMIC get+put",
    "tryget+put",
    "tryget_live+put",
    "killed, held: get+put",
];

impl AtomicRows {
    fn new() -> AtomicRows {
        let atomic = || PercpuRef::with_flags(|_| {}, InitFlags::INIT_ATOMIC);
        // Killed while a reference is held: atomic and dying, count 1.
        let killed = PercpuRef::new(|_| {});
        killed.get();
        killed.kill_sync().expect("a new ref is alive");
        AtomicRows {
            bare: Line(AtomicBare(AtomicU64::new(1))),
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            floor_near: floor::Floor::new(floor::Kind::Near),
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            floor_far: floor::Floor::new(floor::Kind::Far),
            init_atomic: Line(Percpu(atomic())),
            tryget: Line(TryPair(atomic())),
            tryget_live: Line(TryLivePair(atomic())),
            killed: Line(Percpu(killed)),
            arc: ArcInRegister(Arc::new(0)),
        }
    }

    /// Each runnable row's criterion id, summary label and runner
    /// `(threads, iters) -> slowest thread's time`, for loop `lp`.
    fn runners<'a>(&'a self, cpus: &'a [usize], lp: Loop) -> Vec<Row<'a>> {
        fn runner<'a, P: Pair>(obj: &'a P, cpus: &'a [usize], lp: Loop) -> Runner<'a> {
            Box::new(move |t, n| {
                let slowest = affinity::run_pinned(t, cpus, || atomic_pairs(obj, n, lp));
                obj.check();
                slowest
            })
        }
        let mut rows: Vec<Row<'a>> = vec![("bare", ATOMIC_BARE, runner(&self.bare, cpus, lp))];
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        for (id, label, fl) in [
            ("floor", ATOMIC_FLOOR, &self.floor_near),
            ("floor_far", ATOMIC_FLOOR_FAR, &self.floor_far),
        ] {
            if let Ok(fl) = fl {
                rows.push((id, label, runner(fl, cpus, lp)));
            }
        }
        rows.extend([
            (
                "init_atomic",
                ATOMIC_REFS[0],
                runner(&self.init_atomic, cpus, lp),
            ),
            ("tryget", ATOMIC_REFS[1], runner(&self.tryget, cpus, lp)),
            (
                "tryget_live",
                ATOMIC_REFS[2],
                runner(&self.tryget_live, cpus, lp),
            ),
            ("killed", ATOMIC_REFS[3], runner(&self.killed, cpus, lp)),
            ("arc", "Arc clone+drop", runner(&self.arc, cpus, lp)),
        ]);
        rows
    }
}

/// `(threads, iters) -> slowest thread's time`.
type Runner<'a> = Box<dyn Fn(usize, u64) -> Duration + 'a>;
/// A row's criterion id, summary label and runner.
type Row<'a> = (&'static str, &'static str, Runner<'a>);

fn bench_atomic(c: &mut Criterion, rows: &AtomicRows, cpus: &[usize]) {
    let mut g = c.benchmark_group("atomic_mode");
    for threads in thread_counts() {
        g.throughput(Throughput::Elements(threads as u64));
        for (id, _, runner) in rows.runners(cpus, Loop::BackToBack) {
            g.bench_function(BenchmarkId::new(id, threads), |b| {
                b.iter_custom(|n| runner(threads, n))
            });
        }
    }
    g.finish();
}

/// Runs per row and thread count in the atomic-mode tables: more than the
/// peers table's, since two threads on one cache line vary by half from
/// one run to the next on a shared VM.
const ATOMIC_RUNS: usize = 9;

/// Median ns per pair per thread of every runner at every thread count,
/// measured in [`ATOMIC_RUNS`] rounds that each run every row once (so that
/// a slow phase of the machine lands on every row alike), each run lasting
/// about `ms / ATOMIC_RUNS`.
fn interleaved(runners: &[Runner<'_>], counts: &[usize], ms: u64) -> Vec<Vec<f64>> {
    let ns = |r: &dyn Fn(usize, u64) -> Duration, t, pairs: u64| {
        r(t, pairs).as_secs_f64() * 1e9 / pairs as f64
    };
    // Pairs per run, from the fastest of three short probes.
    let pairs: Vec<Vec<u64>> = runners
        .iter()
        .map(|r| {
            counts
                .iter()
                .map(|&t| {
                    let probe = (0..3)
                        .map(|_| ns(&**r, t, 20_000))
                        .fold(f64::INFINITY, f64::min);
                    ((ms as f64 * 1e6 / ATOMIC_RUNS as f64) / probe).max(10_000.0) as u64
                })
                .collect()
        })
        .collect();
    let mut samples = vec![vec![Vec::new(); counts.len()]; runners.len()];
    for _ in 0..ATOMIC_RUNS {
        for (i, r) in runners.iter().enumerate() {
            for (j, &t) in counts.iter().enumerate() {
                samples[i][j].push(ns(&**r, t, pairs[i][j]));
            }
        }
    }
    samples
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|mut s| {
                    s.sort_by(f64::total_cmp);
                    s[s.len() / 2]
                })
                .collect()
        })
        .collect()
}

/// The atomic-mode tables (both loops) and their ratios to the bare pair
/// (the target: at most 1.15) and to the floor.
fn atomic_summary(rows: &AtomicRows, cpus: &[usize], ms: u64) {
    let counts = thread_counts();
    let all = *counts.last().unwrap();
    for (lp, title) in [
        (Loop::BackToBack, "pairs back to back"),
        (Loop::WithStore, "one store of the loop's own per pair"),
    ] {
        let (labels, runners): (Vec<_>, Vec<_>) = rows
            .runners(cpus, lp)
            .into_iter()
            .map(|(_, label, runner)| (label.to_string(), runner))
            .unzip();
        let cells = interleaved(&runners, &counts, ms);
        let table: Vec<(String, Vec<f64>)> = labels.into_iter().zip(cells).collect();
        println!(
            "\natomic mode, {title} (ns per operation pair per thread, median of \
             {ATOMIC_RUNS} runs, the rows interleaved; machine: {}, {all} CPUs)",
            cpu_model()
        );
        print_table(&table, &counts);
        let get = |label: &str| table.iter().find(|r| r.0 == label).map(|r| r.1.clone());
        let bare = get(ATOMIC_BARE).expect("bare row measured");
        let floor = get(ATOMIC_FLOOR);
        for label in ATOMIC_REFS {
            let Some(cells) = get(label) else { continue };
            let ratio = |base: &[f64]| {
                cells
                    .iter()
                    .zip(base)
                    .map(|(c, b)| format!("{:.2}", c / b))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let to_floor = floor
                .as_deref()
                .map_or_else(|| "not measured".into(), ratio);
            println!(
                "{label} / bare: {} (target <= 1.15); / floor: {to_floor}  (1 / {all} threads)",
                ratio(&bare)
            );
        }
    }
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if let Err(why) = &rows.floor_near {
        println!("atomic-mode floors skipped: {why}");
    }
    println!("percpu_ref backend: {}", rows.init_atomic.0 .0.backend());
}

fn main() {
    let rows = Rows::new();
    let atomic = AtomicRows::new();
    let cpus = affinity::allowed_cpus();
    let mut c = Criterion::default().configure_from_args();
    bench_peers(&mut c, &rows, &cpus);
    bench_atomic(&mut c, &atomic, &cpus);
    c.final_summary();
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--test" || a == "--list") {
        let ms = summary_ms();
        if ms != 0 {
            summary(&rows, &cpus, ms);
            atomic_summary(&atomic, &cpus, ms);
        }
    }
}
