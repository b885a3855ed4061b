//! Ref churn at scale: many threads create, use, kill and drop
//! refs at once, so that arena slots move between thread caches and the
//! shared pool and are reused while other refs live, with a fork in the
//! middle.
//!
//! What must hold: every killed ref releases exactly once (counted per
//! thread, compared with the kills), a ref never sees another ref's counts
//! (each checks its own atomic count after the kill: a slot shared by two
//! live refs, or one handed out unzeroed, shows up as a wrong count), the
//! forked child can churn refs of its own, and once every thread has exited
//! the arena's live slots are back where they started (thread caches are
//! given back at thread exit).
//!
//! Runs on every available backend; the arena checks only where the rseq
//! backend is built.

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

mod common;

fn backends() -> Vec<Backend> {
    [Backend::Rseq, Backend::Sharded]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// Rounds per thread (scaled down by `PERCPU_REF_TEST_SCALE` in emulated
/// guests, where every third round's synchronous kill is a grace period
/// that interrupts every vCPU).
fn rounds() -> usize {
    common::scaled(if cfg!(debug_assertions) {
        5_000
    } else {
        100_000
    })
}

/// One thread's churn: returns (refs killed, releases seen).
fn churn(backend: Backend, seed: usize, stop_early: &AtomicBool) -> (usize, usize) {
    let releases = Arc::new(AtomicUsize::new(0));
    let mut killed = 0;
    // A few refs are held across rounds so that slots stay live while
    // others are dropped and reused around them.
    let mut held: Vec<(PercpuRef, u64)> = Vec::new();
    for i in 0..rounds() {
        if stop_early.load(SeqCst) {
            break;
        }
        let rel = releases.clone();
        let r = PercpuRef::with_backend(
            move |_| {
                rel.fetch_add(1, SeqCst);
            },
            InitFlags::empty(),
            backend,
        )
        .unwrap();
        // Each ref gets its own number of outstanding references.
        let extra = ((i * 31 + seed) % 5) as u64;
        for _ in 0..extra {
            r.get();
        }
        r.get();
        r.put();
        held.push((r, extra));
        if held.len() > 8 || i % 3 == 0 {
            let (r, extra) = held.swap_remove((i + seed) % held.len());
            r.kill_sync().unwrap();
            assert_eq!(
                r.atomic_count(),
                Some(extra),
                "{backend}: the folded count is this ref's own"
            );
            r.put_many(extra as usize);
            assert!(r.is_zero());
            killed += 1;
        }
        // Refs dropped without a kill never release (as percpu_ref_exit).
        if i % 7 == 0 {
            held.truncate(held.len().saturating_sub(1));
        }
    }
    drop(held);
    (killed, releases.load(SeqCst))
}

#[test]
fn many_threads_churn_refs_with_exact_releases() {
    let threads = 4 * std::thread::available_parallelism().map_or(2, |n| n.get());
    for backend in backends() {
        let before = percpu_ref::percpu::arena_stats();
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || churn(backend, t, &stop))
            })
            .collect();
        #[cfg(target_os = "linux")]
        fork_in_the_middle(backend);
        for h in handles {
            // `join` returns after the thread's TLS destructors ran, so
            // its slot cache is back in the pool.
            let (killed, releases) = h.join().unwrap();
            assert_eq!(releases, killed, "{backend}: one release per killed ref");
            assert!(killed > 0);
        }
        let after = percpu_ref::percpu::arena_stats();
        assert_eq!(
            after.live_slots, before.live_slots,
            "{backend}: every slot of an exited thread is free again"
        );
    }
    common::report_counts();
}

/// Forks while the other threads churn: the child (which has only this
/// thread; the others' caches are simply gone) churns refs of its own and
/// exits 0 if every check held.
#[cfg(target_os = "linux")]
fn fork_in_the_middle(backend: Backend) {
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: the child runs this crate's code (whose locks are fork-safe:
    // the arena's is taken around the fork) and std allocation (glibc's
    // malloc is fork-safe), then `_exit`s without unwinding.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(|| {
            let (killed, releases) = churn(backend, 99, &AtomicBool::new(false));
            killed > 0 && killed == releases
        }) {
            Ok(true) => 0,
            _ => 1,
        };
        // SAFETY: ends the child at once, running no destructors.
        unsafe { libc::_exit(code) };
    }
    // A child that fails may also hang: a panic in a forked child of a
    // threaded process can block on a lock (stderr's) that another thread
    // held at the fork. So the wait is bounded, and a hang is a failure.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if r == pid {
            break;
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{backend}: the forked child hung for 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{backend}: the forked child failed (wait status {status:#x})"
    );
}
