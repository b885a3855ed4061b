//! The rseq backend in a forked child.
//!
//! The parent chose the backend (and registered for the membarrier RSEQ
//! command) before forking. The child has a new address space: the test
//! checks that its grace periods still work (re-registering when the
//! kernel refused the command) and its counts stay exact with threads of
//! its own. One test in this binary, so no other test thread holds a lock
//! at the fork.
#![cfg(percpu_ref_rseq)]

use percpu_ref::{backend, Backend, InitFlags, PercpuRef};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

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
        r.switch_to_atomic();
        r.switch_to_percpu().unwrap();
    }
    for w in workers {
        w.join().unwrap();
    }
    r.kill().unwrap();
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
    // Choose the backend and register in the parent, before the fork.
    assert_eq!(backend(), Backend::Rseq);
    let r = PercpuRef::new(|_| {});
    r.kill().unwrap();
    // SAFETY: the child runs only this crate's code and std threads; no
    // lock of this process is held across the fork (one test per binary).
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
    r.kill().unwrap();
    assert_eq!(r.atomic_count(), Some(1));
}
