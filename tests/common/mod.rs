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
