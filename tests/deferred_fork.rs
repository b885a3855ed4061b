//! The grace-period engine across `fork`.
//!
//! `fork_during_a_stream_of_deferred_kills`: threads kill refs with the
//! deferred API (and drop them, which waits for the engine) while the main
//! thread forks again and again. The fork handlers wait for a batch in
//! flight and hold the engine's locks across the fork, so each child finds
//! them free; its engine thread is gone and must restart on the child's
//! first deferred kill or flush. The child kills refs of its own (rseq and
//! sharded), flushes, and checks every confirm and release ran; it must
//! neither hang nor fail. The parent's stream must finish exactly too.
//!
//! `fork_from_a_deferred_confirm`: a confirm running on the engine thread
//! forks. The prepare handler must not wait for the batch in flight (its
//! own), and the child, whose only thread is the engine in the middle of
//! that batch, must be able to queue and exit.
//!
//! `fork_while_threads_start_and_exit`: a child forked while other threads
//! of the parent start and exit must be able to start its engine (std's
//! own thread start takes a lock no fork handler takes; see the test).
#![cfg(all(unix, not(miri)))]

mod common;
use common::{backends, scaled, wait_or_kill};

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// A child does milliseconds of work natively, and up to 2 s in an 8-vCPU
/// arm64 guest emulated on 2 host cores (its grace periods interrupt every
/// vCPU while the parent's streams, and the other tests' threads, run); a
/// child still running after a minute hangs (the timeout is paid only by a
/// failing run).
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);
const FORKS: usize = if cfg!(debug_assertions) { 10 } else { 40 };
/// Forks in `fork_while_threads_start_and_exit` (scaled in emulated
/// guests): before the fix, a child hung within the first 800 in each of
/// 6 runs on the 2-vCPU development host.
const CHURN_FORKS: usize = if cfg!(debug_assertions) { 300 } else { 3000 };
/// Threads of the parent that start and exit threads without pause.
const CHURNERS: usize = 8;

/// Kills `n` fresh refs on `backend` with the deferred API, dropping each
/// at once (waits for the engine); returns (confirms, releases).
fn kill_and_drop(n: usize, backend: Backend) -> (usize, usize) {
    let confirms = Arc::new(AtomicUsize::new(0));
    let releases = Arc::new(AtomicUsize::new(0));
    for i in 0..n {
        let rel = releases.clone();
        let r = Box::pin(
            PercpuRef::with_backend(
                move |_| {
                    rel.fetch_add(1, SeqCst);
                },
                InitFlags::empty(),
                backend,
            )
            .unwrap(),
        );
        r.get();
        let c = confirms.clone();
        r.as_ref()
            .kill_and_confirm(move |_| {
                c.fetch_add(1, SeqCst);
            })
            .unwrap();
        r.put();
        if i % 2 == 0 {
            drop(r); // waits for the engine
        } else {
            percpu_ref::flush();
        }
    }
    (confirms.load(SeqCst), releases.load(SeqCst))
}

/// The child's work: exits 0 when every check held.
fn child() -> i32 {
    for b in backends() {
        // Queued without a flush first: the engine must restart by itself.
        let pending = Box::pin(PercpuRef::with_backend(|_| {}, InitFlags::empty(), b).unwrap());
        pending.as_ref().kill().unwrap();
        drop(pending);
        if kill_and_drop(50, b) != (50, 50) {
            return 2;
        }
    }
    0
}

#[test]
fn fork_during_a_stream_of_deferred_kills() {
    let stop = Arc::new(AtomicBool::new(false));
    let streams: Vec<_> = backends()
        .into_iter()
        .map(|b| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut total = 0;
                while !stop.load(SeqCst) {
                    let (c, r) = kill_and_drop(100, b);
                    assert_eq!((c, r), (100, 100), "{b}: the parent's stream lost a switch");
                    total += 100;
                }
                total
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(10));
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..FORKS {
        let forked = std::time::Instant::now();
        // SAFETY: the child runs this crate's code (whose locks are taken
        // around the fork by its handlers) and std allocation, then
        // `_exit`s without unwinding.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(child).unwrap_or(3);
            // SAFETY: ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let status = wait_or_kill(pid, CHILD_TIMEOUT);
        slowest = slowest.max(forked.elapsed());
        match status {
            Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => {}
            Some(st) => failures.push(format!(
                "child {i}: wait status {st:#x} (exit 2: a confirm or release missing, 3: panic)"
            )),
            None => failures.push(format!("child {i} hung for {CHILD_TIMEOUT:?}")),
        }
        if !failures.is_empty() {
            break; // one is enough (a hang costs the timeout each)
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, SeqCst);
    let kills: usize = streams.into_iter().map(|s| s.join().unwrap()).sum();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(kills > 0);
    eprintln!("{FORKS} forks during {kills} deferred kills; the slowest child took {slowest:?}");
}

#[test]
fn fork_from_a_deferred_confirm() {
    let child_status = Arc::new(AtomicUsize::new(usize::MAX));
    let r = Box::pin(PercpuRef::new(|_| {}));
    let status = child_status.clone();
    r.as_ref()
        .kill_and_confirm(move |_| {
            // SAFETY: the child (the engine thread alone) queues a kill of
            // a ref of its own and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                let ok = std::panic::catch_unwind(|| {
                    let r = Box::pin(PercpuRef::new(|_| {}));
                    r.as_ref().kill().unwrap();
                    std::mem::forget(r); // its completion would need this very thread
                })
                .is_ok();
                // SAFETY: as above.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let st = wait_or_kill(pid, CHILD_TIMEOUT).map_or(999, |st| st as usize);
            status.store(st, SeqCst);
        })
        .unwrap();
    percpu_ref::flush();
    let st = child_status.load(SeqCst);
    assert_eq!(
        st, 0,
        "the child forked from a confirm failed or hung (status {st:#x})"
    );
    assert!(r.is_zero());
}

/// `fork_while_threads_start_and_exit`: other threads of the parent start
/// and exit without pause while the main thread forks, and each child
/// queues a deferred kill and flushes, which starts the child's engine
/// thread. Rust's `std::thread` start and exit take a lock of its own (the
/// stack-overflow handler's thread table); a `fork` while another thread
/// holds it leaves it held in the child forever, so an engine started with
/// `std::thread` there would block before running a line (as seen in an
/// arm64 guest: the engine on that lock, the child's main thread waiting
/// for it). The child must neither hang nor fail.
#[test]
fn fork_while_threads_start_and_exit() {
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..CHURNERS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut started = 0usize;
                while !stop.load(SeqCst) {
                    std::thread::spawn(|| {}).join().unwrap();
                    started += 1;
                }
                started
            })
        })
        .collect();
    let forks = scaled(CHURN_FORKS);
    let mut failures = Vec::new();
    for i in 0..forks {
        // SAFETY: as in `fork_during_a_stream_of_deferred_kills`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                let r = Box::pin(PercpuRef::new(|_| {}));
                r.as_ref().kill().unwrap();
                percpu_ref::flush(); // starts the child's engine and waits for it
                r.is_zero()
            });
            // SAFETY: as above.
            unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
        }
        match wait_or_kill(pid, CHILD_TIMEOUT) {
            Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => {}
            Some(st) => failures.push(format!("child {i}: wait status {st:#x}")),
            None => failures.push(format!("child {i} hung for {CHILD_TIMEOUT:?}")),
        }
        if !failures.is_empty() {
            break;
        }
    }
    stop.store(true, SeqCst);
    let started: usize = churn.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(failures.is_empty(), "{failures:?}");
    eprintln!("{forks} forks while {started} threads started and exited");
}
