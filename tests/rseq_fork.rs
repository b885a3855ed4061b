//! The rseq backend in a forked child.
//!
//! `rseq_backend_works_in_a_forked_child`: the parent chose the backend
//! (and registered for the membarrier RSEQ command) before forking. The
//! child has a new address space: the test checks that its grace periods
//! still work (re-registering when the kernel refused the command) and its
//! counts stay exact with threads of its own.
//!
//! `fork_while_another_thread_allocates_and_drops_refs`: a fork must never
//! leave the arena's lock held by a thread that the child does not have
//! (without the fork handlers the child deadlocks at its first ref alloc
//! or drop).
//!
//! `fork_during_first_detection`: the same for the process's one-time
//! detection (backend, possible CPUs): a fork while another thread runs it
//! must not leave the child waiting for it forever.
//!
//! All skip, saying why, when the rseq backend is unavailable (e.g.
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`).
#![cfg(percpu_ref_rseq)]

mod common;
use common::wait_or_kill;

use percpu_ref::{backend, possible_cpus, Backend, InitFlags, PercpuRef};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// Whether the rseq tests can run here; prints why not.
fn rseq_or_skip() -> bool {
    let ok = Backend::Rseq.is_available();
    if !ok {
        eprintln!(
            "skipped: the rseq backend is not available in this process (glibc without an \
             rseq registration, e.g. GLIBC_TUNABLES=glibc.pthread.rseq=0 or valgrind, or no \
             membarrier RSEQ support)"
        );
    }
    ok
}

/// A ref on the rseq backend.
fn rseq_ref() -> PercpuRef {
    PercpuRef::with_backend(|_| {}, InitFlags::empty(), Backend::Rseq).unwrap()
}

const THREADS: usize = 8;
const PAIRS: usize = if cfg!(debug_assertions) {
    50_000
} else {
    1_000_000
};

/// Runs in the child: exits 0 when every check held.
fn child() -> i32 {
    if backend() != Backend::Rseq {
        return 10;
    }
    let released = Arc::new(AtomicUsize::new(0));
    let r = Arc::new({
        let released = released.clone();
        PercpuRef::with_flags(
            move |_| {
                released.fetch_add(1, SeqCst);
            },
            InitFlags::ALLOW_REINIT,
        )
    });
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let r = r.clone();
            std::thread::spawn(move || {
                r.get();
                for _ in 0..PAIRS {
                    r.get();
                    r.put();
                }
            })
        })
        .collect();
    // Grace periods in the child while its threads count.
    for _ in 0..50 {
        r.switch_to_atomic_sync();
        r.switch_to_percpu().unwrap();
    }
    for w in workers {
        w.join().unwrap();
    }
    r.kill_sync().unwrap();
    if r.atomic_count() != Some(THREADS as u64) {
        return 11;
    }
    for _ in 0..THREADS {
        r.put();
    }
    if released.load(SeqCst) != 1 {
        return 12;
    }
    0
}

#[test]
fn rseq_backend_works_in_a_forked_child() {
    if !rseq_or_skip() {
        return;
    }
    if backend() != Backend::Rseq {
        eprintln!("skipped: PERCPU_REF_BACKEND chose {}", backend());
        return;
    }
    // Choose the backend and register in the parent, before the fork.
    let r = PercpuRef::new(|_| {});
    r.kill_sync().unwrap();
    // SAFETY: the child runs only this crate's code and std threads, which
    // hold no lock across a fork (the other test of this binary may be
    // allocating refs meanwhile: that is what the crate makes safe).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(child).unwrap_or(13);
        // SAFETY: _exit ends the child without running the parent's
        // atexit handlers or test harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child failed (10: not rseq, 11: inexact count, 12: release count, 13: panic)"
    );
    // And the parent still works after the fork.
    let r = PercpuRef::new(|_| {});
    r.get();
    r.kill_sync().unwrap();
    assert_eq!(r.atomic_count(), Some(1));
}

/// Forks while the arena is being hammered, from two threads at once.
const FORKS: usize = 200;
/// A child does a few microseconds of work; far more means it hangs.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// Forks once; the child allocates, uses and drops refs, then `_exit`s.
/// `Err` when the child failed or hung (it is then killed).
fn fork_a_child_that_uses_refs(i: usize) -> Result<(), String> {
    // SAFETY: the child runs only this crate's code on this thread and
    // leaves with _exit; the crate's locks are fork-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let r = rseq_ref(); // alloc
            r.get_many(3);
            r.put_many(3);
            r.kill_sync().unwrap();
            assert_eq!(r.atomic_count(), Some(0));
            drop(r); // drop
            drop(rseq_ref());
        })
        .is_ok();
        // SAFETY: ends the child without running the parent's atexit
        // handlers or test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    match wait_or_kill(pid, CHILD_TIMEOUT) {
        Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => Ok(()),
        Some(st) => Err(format!("child {i} failed: wait status {st:#x}")),
        None => Err(format!(
            "child {i} hung for {CHILD_TIMEOUT:?} (deadlocked at its first ref alloc or \
             drop?) and was killed"
        )),
    }
}

/// Forks `FORKS` times, from two threads at once, while a third allocates
/// and drops refs in a loop (so the arena's lock is often held at a fork,
/// and forks overlap); each child allocates, uses and drops refs, then
/// `_exit(0)`s. A child that does not exit within `CHILD_TIMEOUT`
/// deadlocked: it is killed and the test fails.
#[test]
fn fork_while_another_thread_allocates_and_drops_refs() {
    if !rseq_or_skip() {
        return;
    }
    drop(rseq_ref()); // the arena exists before the first fork
    let stop = AtomicBool::new(false);
    let churned = AtomicUsize::new(0);
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        s.spawn(|| {
            let mut keep = VecDeque::new();
            while !stop.load(SeqCst) {
                let r = rseq_ref();
                r.get();
                r.put();
                keep.push_back(r);
                if keep.len() > 16 {
                    keep.pop_front();
                }
                churned.fetch_add(1, SeqCst);
            }
        });
        while churned.load(SeqCst) < 1000 {
            std::thread::yield_now();
        }
        let forker = |first: usize| {
            (first..FORKS)
                .step_by(2)
                .try_for_each(fork_a_child_that_uses_refs)
        };
        let other = s.spawn(move || forker(1));
        let mine = forker(0);
        let other = other.join().unwrap();
        stop.store(true, SeqCst);
        vec![mine, other]
    });
    for o in outcomes {
        o.unwrap();
    }
    eprintln!(
        "{FORKS} forks from two threads while another made and dropped {} refs",
        churned.load(SeqCst)
    );
}

/// Fresh processes (each detects once) in `fork_during_first_detection`.
const DETECTION_RUNS: usize = 20;
/// Set in the subprocesses of `fork_during_first_detection`.
const DETECTION_CHILD: &str = "PERCPU_REF_FORK_DETECTION_CHILD";

/// Runs in a fresh process, where nothing detected anything yet: one
/// thread makes the first ref (detecting the backend, rseq and the possible
/// CPUs) while this one forks as fast as it can; every child makes and
/// drops a ref and must exit. Prints how many forks overlapped detection.
#[test]
fn detection_child() {
    if std::env::var_os(DETECTION_CHILD).is_none() {
        return; // only meaningful in `fork_during_first_detection`'s subprocesses
    }
    let done = AtomicBool::new(false);
    let mut overlapped = 0usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            drop(PercpuRef::new(|_| {}));
            done.store(true, SeqCst);
        });
        while !done.load(SeqCst) {
            // SAFETY: the child runs only this crate's code on this thread
            // and leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
            if pid == 0 {
                let ok = std::panic::catch_unwind(|| {
                    let _ = (backend(), possible_cpus());
                    drop(PercpuRef::new(|_| {}));
                })
                .is_ok();
                // SAFETY: ends the child without running the harness.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            match wait_or_kill(pid, CHILD_TIMEOUT) {
                Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => overlapped += 1,
                Some(st) => panic!("child failed: wait status {st:#x}"),
                None => {
                    done.store(true, SeqCst);
                    panic!("a child forked during detection hung for {CHILD_TIMEOUT:?}")
                }
            }
        }
    });
    println!("forks during detection: {overlapped}");
}

#[test]
fn fork_during_first_detection() {
    if std::env::var_os(DETECTION_CHILD).is_some() || !rseq_or_skip() {
        return;
    }
    let mut overlapped = 0;
    for run in 0..DETECTION_RUNS {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "detection_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DETECTION_CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "run {run}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        overlapped += text
            .split("forks during detection: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
            .expect("the child reports its forks");
    }
    eprintln!("{overlapped} forks overlapped a first detection in {DETECTION_RUNS} processes");
}
