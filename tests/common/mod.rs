//! Helpers shared by the protocol test files.
#![allow(dead_code)] // each test file uses a subset

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// Every backend this process can run.
pub fn backends() -> Vec<Backend> {
    [Backend::Sharded, Backend::Rseq]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// A ref on `backend` whose release calls are counted; with
/// `release_panics`, each release panics with "release panics" after
/// counting.
pub fn counted_with(
    flags: InitFlags,
    backend: Backend,
    release_panics: bool,
) -> (PercpuRef, Arc<AtomicUsize>) {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        PercpuRef::with_backend(
            move |_| {
                releases.fetch_add(1, SeqCst);
                if release_panics {
                    panic!("release panics");
                }
            },
            flags,
            backend,
        )
        .unwrap()
    };
    (r, releases)
}

/// A ref on `backend` whose release calls are counted.
pub fn counted(flags: InitFlags, backend: Backend) -> (PercpuRef, Arc<AtomicUsize>) {
    counted_with(flags, backend, false)
}

/// What `f` panicked with (empty for a non-string payload), or `None`.
pub fn try_panic_message(f: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(f)).err().map(|err| {
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// What `f` panicked with; fails the test if it did not panic.
pub fn panic_message(f: impl FnOnce()) -> String {
    try_panic_message(f).expect("expected a panic")
}

/// Waits for child `pid` at most `timeout`; its wait status, or `None` if
/// it was still running (it is then killed and reaped). For the fork tests.
#[cfg(all(unix, not(miri)))]
pub fn wait_or_kill(pid: libc::pid_t, timeout: std::time::Duration) -> Option<libc::c_int> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if r == pid {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// `n` scaled by the factor in `PERCPU_REF_TEST_SCALE` (default 1), at
/// least 1. `scripts/vm-test` sets it for tests whose every round starts
/// threads: in an emulated guest a thread start costs milliseconds, so the
/// full round count would not fit CI; the workload of each round, where
/// the races are, keeps its size.
pub fn scaled(n: usize) -> usize {
    let factor = std::env::var("PERCPU_REF_TEST_SCALE")
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|f| *f > 0.0 && f.is_finite())
                .unwrap_or_else(|| panic!("PERCPU_REF_TEST_SCALE={s:?}: not a positive number"))
        })
        .unwrap_or(1.0);
    ((n as f64 * factor).round() as usize).max(1)
}

/// Prints the process's rseq aborts and grace periods so far, in the form
/// `scripts/vm-test` sums into its matrix (`vm-counts: key=value ...`; the
/// counters only grow, so it keeps the largest of a binary's lines).
pub fn report_counts() {
    eprintln!(
        "vm-counts: backend={} rseq_aborts={} grace_periods={}",
        percpu_ref::backend(),
        percpu_ref::percpu::rseq_aborts(),
        percpu_ref::percpu::grace_periods()
    );
}
