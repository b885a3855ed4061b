//! The copy-size measurement, shared by the `copy_size_table` program
//! (`tools/src/bin/copy_size_table/`) and `benches/copy_size.rs` (both
//! include this file with `#[path]`; `benches/ops.rs` uses its counters).
//!
//! It reproduces the loop the kernel used in 2013 to justify converting
//! cgroup css refcounts to `percpu_ref`: every thread, pinned to its own
//! CPU, repeats *take a reference, copy `size` bytes, drop the reference*
//! on one object shared by all threads, and the loops completed are
//! counted.
//!
//! - "atomic" is one shared `AtomicUsize`: get = `fetch_add(1)`, put =
//!   `fetch_sub(1)` and a zero test, as the kernel's `atomic_t` css refcount
//!   (`atomic_inc` / `atomic_dec_and_test`).
//! - "percpu" is [`PercpuRef::get`] / [`PercpuRef::put`] on one ref, on a
//!   chosen backend.
//! - "floor" is the same loop with no counting at all (get and put do
//!   nothing): what the copy, the loop and the stop-flag checks cost by
//!   themselves. Subtracting it from the other two is what makes the table
//!   comparable across CPUs: where the copy costs several ns and a counter
//!   adds well under one, the one-CPU throughput columns compare two small
//!   overheads hidden under the copy.
//!
//! For atomic and percpu the object holds a base reference for the whole
//! run, so the count never reaches zero, and after the run the harness
//! checks that every get was matched by a put (the count is exactly the
//! base again).
//!
//! The copy is a real `memcpy` of `size` bytes between two buffers owned by
//! the thread; `black_box` on the size and on both buffers keeps the
//! optimiser from removing or specialising it.
//!
//! This file is included as a module rather than exported from the crate
//! so that the library's public API carries no benchmark code.

#![allow(dead_code)] // each includer uses a different part

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[path = "affinity.rs"]
mod affinity;
pub use affinity::{allowed_cpus, pin_to};

/// Iterations between two looks at the stop flag.
const BATCH: u64 = 64;

/// What is counted: the kernel's two columns, and the floor under them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One shared `AtomicUsize` (`atomic_t`).
    Atomic,
    /// A [`PercpuRef`] on this backend.
    Percpu(Backend),
    /// No counting: the same loop with a get and put that do nothing.
    None,
}

impl Kind {
    /// A short name: `atomic`, `percpu/<backend>` or `floor`.
    pub fn name(self) -> String {
        match self {
            Kind::Atomic => "atomic".to_string(),
            Kind::Percpu(b) => format!("percpu/{b}"),
            Kind::None => "floor".to_string(),
        }
    }
}

/// A reference count the loop can take and drop.
pub trait Counter: Send + Sync + 'static {
    /// Takes a reference (the caller holds one: the base reference).
    fn get(&self);
    /// Drops a reference taken by `get`.
    fn put(&self);
    /// After the run: checks that the count is back to the base reference
    /// alone (the percpu ref is killed to read it; call once).
    fn check_balanced(&self) -> Result<(), String>;
}

/// The kernel's `atomic_t` css refcount.
pub struct AtomicCounter {
    count: crossbeam_utils::CachePadded<AtomicUsize>,
}

impl AtomicCounter {
    /// A count holding the base reference.
    pub fn new() -> Self {
        AtomicCounter {
            count: crossbeam_utils::CachePadded::new(AtomicUsize::new(1)),
        }
    }
}

impl Default for AtomicCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl Counter for AtomicCounter {
    #[inline(always)]
    fn get(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    #[inline(always)]
    fn put(&self) {
        // atomic_dec_and_test: fully ordered, and the zero test is the
        // release path (never taken here: the base reference is held).
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            panic!("copy_size: atomic count reached zero while the base reference was held");
        }
    }

    fn check_balanced(&self) -> Result<(), String> {
        match self.count.load(Ordering::SeqCst) {
            1 => Ok(()),
            c => Err(format!(
                "atomic: count is {c} after the run, expected 1 (the base reference)"
            )),
        }
    }
}

/// The floor: a counter that counts nothing, so that the loop around it is
/// the other kinds' loop minus their get and put.
pub struct NoCounter;

impl Counter for NoCounter {
    #[inline(always)]
    fn get(&self) {}

    #[inline(always)]
    fn put(&self) {}

    fn check_balanced(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A [`PercpuRef`] whose release is counted, to check it runs once.
pub struct PercpuCounter {
    r: PercpuRef,
    released: Arc<AtomicUsize>,
}

impl PercpuCounter {
    /// A ref in percpu mode on `backend`.
    pub fn new(backend: Backend) -> Result<Self, String> {
        let released = Arc::new(AtomicUsize::new(0));
        let seen = released.clone();
        let r = PercpuRef::with_backend(
            move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            },
            InitFlags::empty(),
            backend,
        )
        .map_err(|e| e.to_string())?;
        Ok(PercpuCounter { r, released })
    }
}

impl Counter for PercpuCounter {
    #[inline(always)]
    fn get(&self) {
        self.r.get();
    }

    #[inline(always)]
    fn put(&self) {
        self.r.put();
    }

    fn check_balanced(&self) -> Result<(), String> {
        // Killing drops the base reference: with every get matched by a put
        // the ref releases exactly once, right now.
        self.r.kill_sync().map_err(|e| e.to_string())?;
        match self.released.load(Ordering::SeqCst) {
            1 => Ok(()),
            n => Err(format!(
                "percpu/{}: release ran {n} times after kill, expected once \
                 (gets and puts do not balance)",
                self.r.backend()
            )),
        }
    }
}

/// CPU time consumed by the calling thread so far.
#[cfg(unix)]
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// No per-thread CPU clock: report none.
#[cfg(not(unix))]
pub fn thread_cpu_time() -> Duration {
    Duration::ZERO
}

/// One thread's loop: get, copy `size` bytes, put. Inlined per counter type
/// so that the loop holds no indirect call.
#[inline(always)]
fn one_op<C: Counter>(c: &C, src: &[u8], dst: &mut [u8]) {
    c.get();
    dst.copy_from_slice(black_box(src));
    black_box(&mut *dst);
    c.put();
}

/// What one timed run measured.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Loops completed, all threads together.
    pub ops: u64,
    /// Sum over threads of each thread's loops per second.
    pub ops_per_sec: f64,
    /// The smallest share of its wall time that a thread was on a CPU
    /// (1.0 = never descheduled). Below ~0.9 the machine was busy and the
    /// run understates what these threads can do.
    pub cpu_share: f64,
    /// Sum over threads of loops per second *of CPU time*: on a busy
    /// machine, a rough estimate of the undisturbed rate (exact for one
    /// thread; for several it misses contention while a peer was off CPU).
    pub ops_per_cpu_sec: f64,
}

/// What one worker measured.
#[derive(Clone, Copy, Debug)]
struct Worker {
    loops: u64,
    wall: Duration,
    cpu: Duration,
}

/// How to run the workers.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Until the main thread raises the stop flag after this long.
    After(Duration),
    /// Exactly this many loops per thread.
    Iters(u64),
}

/// Runs `threads` pinned workers on one shared counter of `kind`; returns
/// each worker's (loops, busy time). The counter's balance is checked.
fn run(kind: Kind, threads: usize, size: usize, stop: Stop) -> Result<Vec<Worker>, String> {
    match kind {
        Kind::Atomic => run_on(Arc::new(AtomicCounter::new()), threads, size, stop),
        Kind::Percpu(b) => run_on(Arc::new(PercpuCounter::new(b)?), threads, size, stop),
        Kind::None => run_on(Arc::new(NoCounter), threads, size, stop),
    }
}

fn run_on<C: Counter>(
    counter: Arc<C>,
    threads: usize,
    size: usize,
    stop: Stop,
) -> Result<Vec<Worker>, String> {
    let cpus = allowed_cpus();
    if threads == 0 || threads > cpus.len() {
        return Err(format!(
            "copy_size: {threads} threads asked, but threads are pinned one per CPU and \
             this process may run on {} CPUs ({cpus:?})",
            cpus.len()
        ));
    }
    let start = Arc::new(Barrier::new(threads + 1));
    let stop_flag = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = cpus[..threads]
        .iter()
        .map(|&cpu| {
            let (counter, start, stop_flag) = (counter.clone(), start.clone(), stop_flag.clone());
            std::thread::spawn(move || -> Result<Worker, String> {
                let pinned = pin_to(cpu);
                let src = vec![0x5au8; size];
                let mut dst = vec![0u8; size];
                let size = black_box(size);
                let (src, dst) = (&src[..size], &mut dst[..size]);
                start.wait();
                pinned?;
                let (t0, cpu0) = (Instant::now(), thread_cpu_time());
                let mut n = 0u64;
                match stop {
                    Stop::After(_) => {
                        while !stop_flag.load(Ordering::Relaxed) {
                            for _ in 0..BATCH {
                                one_op(&*counter, src, dst);
                            }
                            n += BATCH;
                        }
                    }
                    Stop::Iters(iters) => {
                        for _ in 0..iters {
                            one_op(&*counter, src, dst);
                        }
                        n = iters;
                    }
                }
                Ok(Worker {
                    loops: n,
                    wall: t0.elapsed(),
                    cpu: thread_cpu_time().saturating_sub(cpu0),
                })
            })
        })
        .collect();
    start.wait();
    if let Stop::After(d) = stop {
        std::thread::sleep(d);
        stop_flag.store(true, Ordering::Relaxed);
    }
    let mut results = Vec::with_capacity(threads);
    let mut first_err = None;
    for w in workers {
        match w.join() {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert("copy_size: a worker thread panicked".to_string());
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    counter.check_balanced()?;
    Ok(results)
}

/// One timed run of `duration`: the kernel's "operations in a fixed time".
pub fn measure(
    kind: Kind,
    threads: usize,
    size: usize,
    duration: Duration,
) -> Result<Sample, String> {
    let per_thread = run(kind, threads, size, Stop::After(duration))?;
    let secs = |d: Duration| d.as_secs_f64().max(1e-9);
    Ok(Sample {
        ops: per_thread.iter().map(|w| w.loops).sum(),
        ops_per_sec: per_thread
            .iter()
            .map(|w| w.loops as f64 / secs(w.wall))
            .sum(),
        ops_per_cpu_sec: per_thread
            .iter()
            .map(|w| w.loops as f64 / secs(w.cpu))
            .sum(),
        cpu_share: per_thread
            .iter()
            .map(|w| secs(w.cpu) / secs(w.wall))
            .fold(f64::INFINITY, f64::min)
            .min(1.0),
    })
}

/// For criterion's `iter_custom`: every thread does `iters` loops; returns
/// the longest thread's busy time (spawning and pinning are not timed).
pub fn time_iters(kind: Kind, threads: usize, size: usize, iters: u64) -> Duration {
    match run(kind, threads, size, Stop::Iters(iters)) {
        Ok(per_thread) => per_thread.iter().map(|w| w.wall).max().unwrap_or_default(),
        Err(e) => panic!("{e}"),
    }
}
