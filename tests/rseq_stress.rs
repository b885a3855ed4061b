//! The rseq backend under hostile scheduling: exact counts and one release
//! while workers are migrated between CPUs, hammered with signals, and the
//! ref is switched and killed under them.
//!
//! The same workload runs four more ways, each as a subprocess of this
//! test binary: with glibc's rseq registration disabled through
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0` (the sharded fallback must be
//! chosen and stay exact), as if the C library had no rseq area at all
//! (the sections arm the crate's stand-in area), pinned to CPU 1 (as
//! `taskset -c 1`: one CPU whose id is not 0), and in a forked child.
//!
//! And subprocesses play a container that under-reports the possible
//! CPUs: the possible-CPU count capped at 1, so the arena has one region,
//! pinned to CPU 1 (under `cpu_id` indexing every operation must take the
//! atomic path; without the bound it would add past the end of the arena)
//! or on every CPU (under `mm_cid` indexing the thread that holds id 1
//! while another runs must take it).
//!
//! Sizes: 16 workers; 10^7 get+put operations each in release builds,
//! 2 * 10^5 in debug builds (run `cargo test --release --test rseq_stress`
//! for the full size).
#![cfg(percpu_ref_rseq)]

use percpu_ref::percpu::{arena_stats, rseq_aborts};
use percpu_ref::{backend, possible_cpus, Backend, InitFlags, PercpuRef};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

mod common;

const WORKERS: usize = 16;
/// Get/put operations per worker (scaled by `PERCPU_REF_TEST_SCALE`, which
/// `scripts/vm-test` sets in guests with many emulated vCPUs).
fn ops() -> u64 {
    common::scaled(if cfg!(debug_assertions) {
        200_000
    } else {
        10_000_000
    }) as u64
}
/// Atomic<->percpu round trips made while the workers run, before the kill.
const SWITCHES: usize = 200;
/// How long each switch stays atomic, in turn (see the switch loop).
const ATOMIC_PAUSES: [Duration; 3] = [
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(4),
];

/// Which backend this process must have chosen, set by the parent test for
/// subprocess runs; rseq otherwise, where the CPU has the section's commit
/// instruction.
fn expected_backend() -> Backend {
    match std::env::var("PERCPU_REF_STRESS_EXPECT").as_deref() {
        Ok("sharded") => Backend::Sharded,
        _ if !cpu_has_rseq_commit() => Backend::Sharded,
        _ => Backend::Rseq,
    }
}

/// The rseq section commits with one instruction: x86_64's `add` (every
/// CPU), aarch64's LSE `stadd` (ARMv8.1; an ARMv8.0 CPU such as QEMU's
/// `cortex-a57` has none, and the crate falls back to sharded there).
/// Detected here independently of the crate's own check.
fn cpu_has_rseq_commit() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("lse");
    #[cfg(not(target_arch = "aarch64"))]
    true
}

extern "C" fn ignore_signal(_: libc::c_int) {}

fn install_noop_handler() {
    // SAFETY: a zeroed sigaction with a handler that does nothing, no flags
    // but SA_RESTART, and an empty mask is valid for SIGUSR1.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn pin(tid: libc::pid_t, cpu: usize) -> bool {
    // SAFETY: as above; sched_setaffinity reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) == 0
    }
}

fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    unsafe { libc::sched_getcpu() as usize }
}

struct Report {
    aborts: u64,
    signals: u64,
    flips: u64,
    cpus_seen: u64,
}

/// 16 workers each hold one reference and make `ops()` get/put operations
/// (at least; pairs of get_many(k)/put_many(k), k in 1..=3) on one shared ref. Meanwhile
/// a helper flips every worker between the allowed CPUs, another sends them
/// SIGUSR1 (a no-op handler) in a storm, and the main thread switches the
/// ref to atomic and back `SWITCHES` times and then kills it halfway.
/// Checks: the count is exactly the workers' references after they stop,
/// and release runs once, after every worker dropped its reference.
fn stress() -> Report {
    install_noop_handler();
    let cpus = allowed_cpus();
    if std::env::var_os("PERCPU_REF_STRESS_PIN").is_some() {
        assert_eq!(cpus, [1], "the child runs under taskset -c 1");
        assert_eq!(current_cpu(), 1);
    }
    let released = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let released_early = Arc::new(AtomicBool::new(false));
    let r = Arc::new({
        let (released, finished, early) =
            (released.clone(), finished.clone(), released_early.clone());
        PercpuRef::with_flags(
            move |_| {
                if finished.load(SeqCst) != WORKERS {
                    early.store(true, SeqCst);
                }
                released.fetch_add(1, SeqCst);
            },
            InitFlags::ALLOW_REINIT,
        )
    });
    assert_eq!(r.backend(), expected_backend());
    let aborts_before = rseq_aborts();
    let progress = Arc::new(AtomicU64::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let stop_helpers = Arc::new(AtomicBool::new(false));
    let threads: Arc<Mutex<Vec<(libc::pid_t, libc::pthread_t)>>> = Arc::default();
    let cpus_seen = Arc::new(AtomicU64::new(0));
    // A worker's panic (a protocol bug: an underflow, a get on a released
    // ref) as a message: the main thread fails the test with it instead of
    // waiting for progress or at a barrier that worker never reaches.
    let worker_panic: Arc<Mutex<Option<String>>> = Arc::default();
    let looped = Arc::new(AtomicUsize::new(0));
    let loops_done = Arc::new(Barrier::new(WORKERS + 1));
    let may_finish = Arc::new(Barrier::new(WORKERS + 1));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (r, progress, threads, cpus_seen) = (
                r.clone(),
                progress.clone(),
                threads.clone(),
                cpus_seen.clone(),
            );
            let (finished, loops_done, may_finish) =
                (finished.clone(), loops_done.clone(), may_finish.clone());
            let (killed, ops, worker_panic, looped) =
                (killed.clone(), ops(), worker_panic.clone(), looped.clone());
            std::thread::spawn(move || {
                // SAFETY: pthread_self has no preconditions.
                threads
                    .lock()
                    .unwrap()
                    .push((gettid(), unsafe { libc::pthread_self() }));
                r.get(); // this worker's own reference
                let work = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut k = w % 3 + 1;
                    let mut done = 0u64;
                    loop {
                        r.get_many(k);
                        r.put_many(k);
                        done += 2;
                        k = k % 3 + 1;
                        if done.is_multiple_of(65_536) {
                            progress.fetch_add(65_536, SeqCst);
                            cpus_seen.fetch_or(1 << (current_cpu() % 64), SeqCst);
                            let stop =
                                killed.load(SeqCst) || worker_panic.lock().unwrap().is_some();
                            if done >= ops && stop {
                                break;
                            }
                        }
                    }
                }));
                if let Err(e) = work {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_string()))
                        .unwrap_or_default();
                    worker_panic.lock().unwrap().get_or_insert(msg);
                    return; // the main thread fails the test
                }
                looped.fetch_add(1, SeqCst);
                loops_done.wait();
                may_finish.wait();
                finished.fetch_add(1, SeqCst);
                r.put();
            })
        })
        .collect();
    while threads.lock().unwrap().len() < WORKERS {
        std::thread::yield_now();
    }
    let flipper = {
        let (threads, stop) = (threads.clone(), stop_helpers.clone());
        let cpus = cpus.clone();
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(SeqCst) {
                for (i, &(tid, _)) in threads.lock().unwrap().iter().enumerate() {
                    let cpu = cpus[(i + flips as usize) % cpus.len()];
                    // Fails harmlessly (ESRCH) once a worker has exited.
                    pin(tid, cpu);
                }
                flips += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            flips
        })
    };
    let storm = {
        let (threads, stop) = (threads.clone(), stop_helpers.clone());
        std::thread::spawn(move || {
            let mut signals = 0u64;
            let list = threads.lock().unwrap().clone();
            while !stop.load(SeqCst) {
                for &(_, pt) in &list {
                    // SAFETY: the workers are alive until they pass
                    // `may_finish`, which is after `stop` is set and this
                    // thread was joined.
                    unsafe { libc::pthread_kill(pt, libc::SIGUSR1) };
                    signals += 1;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            signals
        })
    };
    // Switch back and forth while the workers run, then kill halfway.
    let total = WORKERS as u64 * ops();
    for i in 0..SWITCHES {
        r.switch_to_atomic_sync();
        // Stay atomic a moment: an add that a broken grace period let
        // commit after the sum lands now, on a counter that the switch
        // back zeroes unread (without the pause it mostly landed after the
        // zeroing and counted: scripts/vm-test's mutant rseq_no_grace_period
        // was caught in 4 of 6 runs). The pauses vary because the section
        // in flight may belong to a vCPU its host has preempted for
        // milliseconds (32 vCPUs on a 2-core host under TCG).
        std::thread::sleep(ATOMIC_PAUSES[i % ATOMIC_PAUSES.len()]);
        r.switch_to_percpu().unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    // Kill halfway, but on rseq not before the storm has aborted a section
    // (in debug builds the section is a small part of each operation, so
    // that can take longer than half the work).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let fail_on_worker_panic = || {
        if let Some(msg) = worker_panic.lock().unwrap().as_ref() {
            panic!("a worker panicked: {msg}");
        }
    };
    while progress.load(SeqCst) < total / 2
        || (expected_backend() == Backend::Rseq
            && rseq_aborts() == aborts_before
            && std::time::Instant::now() < deadline)
    {
        fail_on_worker_panic();
        std::thread::sleep(Duration::from_millis(1));
    }
    r.kill_sync().unwrap();
    killed.store(true, SeqCst);
    assert!(!r.is_percpu() && r.is_dying());
    // The workers end their loops once killed; one that panicked never
    // reaches the barrier.
    while looped.load(SeqCst) < WORKERS {
        fail_on_worker_panic();
        std::thread::sleep(Duration::from_millis(1));
    }
    loops_done.wait();
    stop_helpers.store(true, SeqCst);
    let flips = flipper.join().unwrap();
    let signals = storm.join().unwrap();
    assert_eq!(
        r.atomic_count(),
        Some(WORKERS as u64),
        "every get was matched by a put: only the workers' own references remain"
    );
    assert_eq!(released.load(SeqCst), 0);
    may_finish.wait();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(released.load(SeqCst), 1, "release runs exactly once");
    assert!(
        !released_early.load(SeqCst),
        "release ran before the last put"
    );
    assert!(r.is_zero());
    Report {
        aborts: rseq_aborts() - aborts_before,
        signals,
        flips,
        cpus_seen: cpus_seen.load(SeqCst),
    }
}

#[test]
fn default_backend_is_rseq_unless_disabled() {
    assert_eq!(backend(), expected_backend());
    assert_eq!(
        Backend::Rseq.is_available(),
        expected_backend() == Backend::Rseq
    );
}

#[test]
fn exact_under_migration_signals_switches_and_kill() {
    let rep = stress();
    eprintln!(
        "backend {}: {} signals, {} affinity flips, {} rseq aborts, cpus seen {:#b}",
        backend(),
        rep.signals,
        rep.flips,
        rep.aborts,
        rep.cpus_seen
    );
    common::report_counts();
    assert!(rep.signals > 0 && rep.flips > 0);
    if expected_backend() == Backend::Rseq {
        assert!(
            rep.aborts > 0,
            "the storm must have aborted some rseq sections"
        );
    } else {
        assert_eq!(rep.aborts, 0, "no rseq section runs on the fallback");
    }
    if allowed_cpus().len() >= 2 {
        assert!(rep.cpus_seen.count_ones() >= 2, "workers were migrated");
    } else {
        assert_eq!(rep.cpus_seen, 1 << allowed_cpus()[0]);
    }
}

/// Runs this binary's `exact_under_migration...` and
/// `default_backend...` tests in a subprocess with `env` set.
fn run_child(wrapper: &[&str], env: &[(&str, &str)]) {
    run_child_tests(
        wrapper,
        env,
        &[
            "exact_under_migration_signals_switches_and_kill",
            "default_backend_is_rseq_unless_disabled",
        ],
    );
}

/// Runs `tests` of this binary in a subprocess with `env` set, under
/// `wrapper` (a command such as `taskset -c 1`) if any; they must all pass.
fn run_child_tests(wrapper: &[&str], env: &[(&str, &str)], tests: &[&str]) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((prog, args)) => {
            let mut c = Command::new(prog);
            c.args(args).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(["--exact", "--test-threads=1", "--nocapture"])
        .args(tests)
        .env_remove("PERCPU_REF_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child with {env:?} failed:\n{text}");
    assert!(
        text.contains(&format!("{} passed", tests.len())),
        "child with {env:?} did not run all of {tests:?}:\n{text}"
    );
    eprintln!("child with {env:?}:\n{text}");
}

#[test]
fn fallback_when_glibc_rseq_is_disabled() {
    if std::env::var_os("PERCPU_REF_STRESS_EXPECT").is_some() {
        return; // already a child
    }
    run_child(
        &[],
        &[
            ("GLIBC_TUNABLES", "glibc.pthread.rseq=0"),
            ("PERCPU_REF_STRESS_EXPECT", "sharded"),
        ],
    );
}

/// A C library that reserves no rseq area (musl, glibc before 2.35): every
/// ref's operations still run the rseq section first (its bound of 0 sends
/// them on to the sharded backend), armed on the crate's stand-in area in
/// static TLS. An invalid area (offset 0 arms `%fs:8`, glibc's `dtv`
/// pointer) crashes this child.
#[test]
fn fallback_without_a_libc_rseq_area() {
    if std::env::var_os("PERCPU_REF_STRESS_EXPECT").is_some() {
        return; // already a child
    }
    run_child(
        &[],
        &[
            ("PERCPU_REF_TEST_NO_LIBC_RSEQ_AREA", "1"),
            ("PERCPU_REF_STRESS_EXPECT", "sharded"),
        ],
    );
}

#[test]
fn pinned_to_cpu_1() {
    if std::env::var_os("PERCPU_REF_STRESS_EXPECT").is_some() {
        return; // already a child
    }
    if !allowed_cpus().contains(&1) {
        eprintln!("skipped: CPU 1 is not available to this process");
        return;
    }
    // `taskset -c 1` restricts the whole child, harness threads included.
    run_child(
        &["taskset", "-c", "1"],
        &[
            ("PERCPU_REF_STRESS_PIN", "1"),
            ("PERCPU_REF_STRESS_EXPECT", "rseq"),
        ],
    );
}

/// Refs and threads of the capped-arena child: enough refs for three
/// chunks of 8,192 slots, and 300,000 operations per thread.
const CAPPED_REFS: usize = 20_000;
const CAPPED_THREADS: usize = 4;
const CAPPED_ROUNDS: usize = 15;

/// Child only (`PERCPU_REF_STRESS_CAPPED`): the possible-CPU count is
/// capped at 1, so the arena has one region per chunk, and every thread
/// runs on CPU 1, which has none. Each operation must take the atomic path:
/// counts stay exact over several chunks of refs, with switches in the
/// middle, and no memory past a chunk is written (before the bound, CPU 1's
/// adds landed past each chunk: lost from the sums, corrupting neighbours
/// and the allocator).
#[test]
fn capped_arena_on_cpu_1_counts_exactly() {
    if std::env::var_os("PERCPU_REF_STRESS_CAPPED").is_none() {
        return; // only meaningful in the child that `arena_capped_at_1_cpu_on_cpu_1` runs
    }
    assert_eq!(possible_cpus(), 1, "the cap did not apply");
    // "cpu1": under taskset -c 1 (`cpu_id` 1 has no region); "all": on
    // every CPU, where two threads running at once have `mm_cid`s 0 and
    // 1 (and 1 has no region).
    let on_cpu_1 = std::env::var("PERCPU_REF_STRESS_CAPPED").as_deref() == Ok("cpu1");
    if on_cpu_1 {
        assert_eq!(allowed_cpus(), [1], "the child runs under taskset -c 1");
    }
    assert_eq!(backend(), Backend::Rseq);
    let released = Arc::new(AtomicUsize::new(0));
    let refs: Arc<Vec<PercpuRef>> = Arc::new(
        (0..CAPPED_REFS)
            .map(|_| {
                let released = released.clone();
                PercpuRef::with_flags(
                    move |_| {
                        released.fetch_add(1, SeqCst);
                    },
                    InitFlags::ALLOW_REINIT,
                )
            })
            .collect(),
    );
    let stats = arena_stats();
    assert_eq!(stats.bytes_per_slot, 8, "one region per chunk");
    assert!(stats.chunks >= 2, "the refs span several chunks");
    assert!(refs.iter().all(|r| r.percpu_bytes() == 8));
    // Every thread leaves `i % 7 + 1` references on ref `i` per round, with
    // balanced get/put pairs in between.
    let stop = Arc::new(AtomicBool::new(false));
    // On every CPU: four phases, each with the workers on one CPU and a
    // spinner holding an id on the other, alternating. Two threads run at
    // once, so the workers' `mm_cid` is 0 or 1 and, in some phase, not
    // their CPU's number (the kernel caches an id per CPU): in one
    // arrangement the running worker holds id 1 (no region) on CPU 0, in
    // another id 0 on CPU 1 (no region under `cpu_id`).
    let phases = if on_cpu_1 { 1 } else { 4 };
    let mut switches = 0;
    let mut ids = std::collections::BTreeSet::new();
    for phase in 0..phases {
        let (work_cpu, spin_cpu) = if phase % 2 == 0 { (0, 1) } else { (1, 0) };
        let spinner = (!on_cpu_1).then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                assert!(pin(0, spin_cpu), "cannot pin to CPU {spin_cpu}");
                while !stop.load(SeqCst) {
                    std::hint::spin_loop();
                }
            })
        });
        let workers: Vec<_> = (0..CAPPED_THREADS)
            .map(|_| {
                let refs = refs.clone();
                std::thread::spawn(move || {
                    if on_cpu_1 {
                        assert_eq!(current_cpu(), 1);
                    } else {
                        assert!(pin(0, work_cpu), "cannot pin to CPU {work_cpu}");
                    }
                    let mut ids = std::collections::BTreeSet::new();
                    for _ in 0..CAPPED_ROUNDS {
                        for (i, r) in refs.iter().enumerate() {
                            r.get_many(i % 7 + 1);
                            r.get();
                            r.put();
                        }
                        ids.insert((current_cpu(), percpu_ref::percpu::current_index()));
                    }
                    ids
                })
            })
            .collect();
        // Switches on a few refs while the workers count.
        let switcher = {
            let (refs, stop) = (refs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(SeqCst) {
                    let r = &refs[n * 97 % CAPPED_REFS];
                    r.switch_to_atomic_sync();
                    r.switch_to_percpu().unwrap();
                    n += 1;
                }
                n
            })
        };
        for w in workers {
            ids.extend(w.join().unwrap());
        }
        stop.store(true, SeqCst);
        switches += switcher.join().unwrap();
        if let Some(s) = spinner {
            s.join().unwrap();
        }
        stop.store(false, SeqCst);
    }
    eprintln!("capped arena: (CPU, id) pairs the workers saw: {ids:?}");
    for (i, r) in refs.iter().enumerate() {
        r.kill_sync().unwrap();
        let left = (phases * CAPPED_THREADS * CAPPED_ROUNDS * (i % 7 + 1)) as u64;
        assert_eq!(r.atomic_count(), Some(left), "ref {i}: inexact count");
        r.put_many(left as usize);
    }
    assert_eq!(released.load(SeqCst), CAPPED_REFS, "each ref released once");
    eprintln!(
        "capped arena ({}, index {:?}): {CAPPED_REFS} refs in {} chunks of one region, \
         {switches} switches, exact",
        if on_cpu_1 { "on CPU 1" } else { "on every CPU" },
        percpu_ref::percpu::index(),
        stats.chunks
    );
}

/// Whether this is a child run, or the machine lacks what the capped-arena
/// runs need (the rseq backend, and CPU 1).
fn capped_runs_skipped() -> bool {
    if std::env::var_os("PERCPU_REF_STRESS_EXPECT").is_some()
        || std::env::var_os("PERCPU_REF_STRESS_CAPPED").is_some()
    {
        return true; // already a child
    }
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: the rseq backend is not available");
        return true;
    }
    if !allowed_cpus().contains(&1) {
        eprintln!("skipped: CPU 1 is not available to this process");
        return true;
    }
    false
}

/// On CPU 1 with an arena of one region, under both indices: `cpu_id` is 1
/// (no region), `mm_cid` is 0 (the one region) as only one thread runs at
/// a time; either way every count is exact.
#[test]
fn arena_capped_at_1_cpu_on_cpu_1() {
    if capped_runs_skipped() {
        return;
    }
    for index in ["", "cpu_id"] {
        run_child_tests(
            &["taskset", "-c", "1"],
            &[
                ("PERCPU_REF_TEST_POSSIBLE_CPUS", "1"),
                ("PERCPU_REF_STRESS_CAPPED", "cpu1"),
                ("PERCPU_REF_INDEX", index),
            ],
            &["capped_arena_on_cpu_1_counts_exactly"],
        );
    }
}

/// On every CPU with an arena of one region: threads running at once on
/// two CPUs have two `mm_cid`s, and the one at the bound must take the
/// atomic path (with the bound checked on `cpu_id` instead, a thread on
/// CPU 0 whose `mm_cid` is 1 adds past the chunk).
#[test]
fn arena_capped_at_1_cpu_on_every_cpu() {
    if capped_runs_skipped() {
        return;
    }
    run_child_tests(
        &[],
        &[
            ("PERCPU_REF_TEST_POSSIBLE_CPUS", "1"),
            ("PERCPU_REF_STRESS_CAPPED", "all"),
        ],
        &["capped_arena_on_cpu_1_counts_exactly"],
    );
}

/// A thread whose rseq registration is refused (made after a seccomp
/// filter that refuses `rseq`, as a sandbox applied after start-up) never
/// runs in a process whose first thread glibc registered: glibc aborts
/// the process. The section relies on it: under `mm_cid` indexing such a
/// thread's id would read 0 or a stale value (only its `cpu_id` is
/// negative) and no kernel would abort its sections. Run in a child; should
/// a C library let the thread run, its counts must still be exact.
#[test]
fn a_thread_refused_rseq_does_not_run() {
    if std::env::var_os("PERCPU_REF_STRESS_REFUSED").is_some() {
        refused_thread_counts();
        return;
    }
    if std::env::var_os("PERCPU_REF_STRESS_EXPECT").is_some()
        || std::env::var_os("PERCPU_REF_STRESS_CAPPED").is_some()
    {
        return; // another child
    }
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: the rseq backend is not available");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_thread_refused_rseq_does_not_run",
            "--nocapture",
        ])
        .env("PERCPU_REF_STRESS_REFUSED", "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if text.contains("rseq registration failed") {
        assert!(
            !out.status.success(),
            "glibc reported the failure but went on:\n{text}"
        );
        eprintln!("the C library aborted the process, as the section relies on");
    } else {
        assert!(out.status.success(), "the refused thread's counts:\n{text}");
        eprintln!("the C library let a refused thread run, and its counts were exact:\n{text}");
    }
}

/// The child of `a_thread_refused_rseq_does_not_run`: two registered
/// threads and two refused ones count on the same refs.
fn refused_thread_counts() {
    let refs: Arc<Vec<PercpuRef>> = Arc::new(
        (0..64)
            .map(|_| PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT))
            .collect(),
    );
    let n = ops() as usize / 4;
    let held = Arc::new(AtomicUsize::new(0));
    let worker = move |refs: Arc<Vec<PercpuRef>>, held: Arc<AtomicUsize>| {
        move || {
            for i in 0..n {
                let r = &refs[i % refs.len()];
                r.get();
                r.get();
                r.put();
            }
            held.fetch_add(n, SeqCst);
        }
    };
    let mut threads: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(worker(refs.clone(), held.clone())))
        .collect();
    let w = (
        worker(refs.clone(), held.clone()),
        worker(refs.clone(), held.clone()),
    );
    threads.push(std::thread::spawn(move || {
        common::fail_syscalls_on_this_thread(&[libc::SYS_rseq], libc::EPERM);
        let a = std::thread::spawn(w.0);
        let b = std::thread::spawn(w.1);
        a.join().unwrap();
        b.join().unwrap();
    }));
    for t in threads {
        t.join().unwrap();
    }
    let mut left = 0;
    for r in refs.iter() {
        r.kill_sync().unwrap();
        left += r.atomic_count().unwrap();
    }
    assert_eq!(left as usize, held.load(SeqCst), "counts were lost");
}
