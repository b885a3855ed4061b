//! The engine across `fork`.
//!
//! The process's `pthread_atfork` handlers (`src/fork.rs`, which says in
//! what order they call each subsystem) call [`prepare_fork`] first: it
//! waits in the parent until no batch is in flight, then hold the queue, the
//! gp mutex and the completion mutex across the `fork`, so the child finds
//! them free and no batch half done. In the child the engine thread does
//! not exist: it is marked not running, and the next deferred switch or
//! `flush` starts a new one; entries queued but not yet taken stay queued.
//! That one is started with `pthread_create`, not `std::thread`: std's
//! thread start and exit take a lock of std's own (the stack-overflow
//! handler's table of threads) that no fork handler takes, so a `fork`
//! while any other thread of the parent starts or exits leaves it held in
//! the child for good, and a `std::thread` started there blocks on it
//! before running a line of its closure (`engine.rs`, `spawn_engine_after_fork`).
//! A fork from inside a `confirm` or `release` on the engine thread does
//! not wait for its own batch: the child's only thread is then the engine
//! itself, which finishes the batch there.

use super::engine::FORKED_CHILD;
use super::{engine, on_engine, Done, Queue};
use crate::sync::{self, Ordering};

/// The engine's locks, held by the forking thread across `fork`.
struct ForkLocks {
    queue: sync::MutexGuard<'static, Queue>,
    _done: sync::MutexGuard<'static, Done>,
    _gp: sync::MutexGuard<'static, ()>,
}

/// Where the forking thread keeps [`ForkLocks`] from [`prepare_fork`] to
/// the `*_after_fork` handler. A static, not a thread-local: a `fork` from a
/// thread-local's destructor would find a thread-local destroyed.
struct ForkSlot(std::cell::UnsafeCell<Option<ForkLocks>>);

// SAFETY: only the thread that holds the engine's queue lock touches the
// slot: `prepare_fork` fills it after taking the lock, the `*_after_fork`
// handler of the same `fork` (on the same thread, still holding it) empties
// it and drops the guards. A second forking thread blocks on the lock
// before it reaches the slot.
unsafe impl Sync for ForkSlot {}

static FORK_LOCKS: ForkSlot = ForkSlot(std::cell::UnsafeCell::new(None));

/// Takes the locks out of [`FORK_LOCKS`].
///
/// # Safety
///
/// The caller is the thread that holds them (an `*_after_fork` handler).
unsafe fn take_fork_locks() -> Option<ForkLocks> {
    // SAFETY: the caller holds the queue lock (see `ForkSlot`).
    unsafe { (*FORK_LOCKS.0.get()).take() }
}

/// Before `fork`: waits until no batch is in flight (unless this thread is
/// the engine), then takes the queue, completion and gp locks, so that the
/// child finds them free and no batch half done.
pub(crate) fn prepare_fork() {
    let e = engine();
    let engine_thread = on_engine();
    let (q, d) = loop {
        if !engine_thread {
            let mut d = sync::lock(&e.done);
            while d.in_flight {
                d = sync::wait(&e.done_cv, d);
            }
        }
        // A batch is taken under the queue lock: holding it, none starts.
        let q = sync::lock(&e.queue);
        let d = sync::lock(&e.done);
        if engine_thread || !d.in_flight {
            break (q, d);
        }
    };
    let gp = sync::lock(&e.gp);
    let locks = ForkLocks {
        queue: q,
        _done: d,
        _gp: gp,
    };
    // SAFETY: this thread holds the queue lock (`locks.queue`), so no other
    // thread touches the slot (see `ForkSlot`).
    unsafe { *FORK_LOCKS.0.get() = Some(locks) };
}

/// After `fork`, in the parent: releases the locks.
pub(crate) fn parent_after_fork() {
    // SAFETY: `fork` runs this on the thread whose `prepare_fork` took them.
    drop(unsafe { take_fork_locks() });
}

/// After `fork`, in the child: the engine thread is gone (unless the child
/// is it), so the next deferred switch or flush starts one; then releases
/// the locks.
pub(crate) fn child_after_fork() {
    // ordering-audit: Relaxed: see `in_forked_child`.
    FORKED_CHILD.store(true, Ordering::Relaxed);
    let engine_thread = on_engine();
    // SAFETY: `fork` runs this in the child on the thread whose
    // `prepare_fork` took them (the child's only thread).
    if let Some(mut locks) = unsafe { take_fork_locks() } {
        locks.queue.running = engine_thread;
        locks.queue.sleeping = false;
        locks.queue.urgent = false;
    }
}
