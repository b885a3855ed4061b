//! The one place that chooses between `std` and `loom` primitives.
//!
//! Every other module imports its atomics, locks and thread-locals from
//! here (the tokio `sync` pattern), so that under `--cfg loom` the model
//! checker sees every shared-memory access the protocol makes. Nothing
//! outside this module names `std::sync::atomic` or `loom` directly.
//!
//! State that loom must *not* model is imported from [`unmodeled`]
//! instead, which is always std's: diagnostics that are not part of the
//! protocol (who holds a switch lock or the css model's cgroup mutex, to
//! turn re-entry into a panic), process-wide choices made once (the
//! backend, the rseq registration), ids handed out (hierarchies), the
//! per-CPU arena and thread ids (not built under loom: the models count
//! on a boxed slice), the fork handlers' flags, and test counters.
//! The import names the choice, so a reader (and a reviewer of a new
//! atomic) sees at the `use` line whether loom checks it.

/// Only under loom: a cell whose accesses loom tracks, so that memory that a
/// thread frees can be made visible to the checker as a write (the owned
/// layer's block, see `owned::drop_unit`).
#[cfg(percpu_ref_loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(percpu_ref_loom)]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(all(percpu_ref_loom, feature = "css"))]
pub(crate) use loom::sync::atomic::AtomicPtr;
#[cfg(percpu_ref_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(percpu_ref_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(percpu_ref_loom)]
pub(crate) use loom::thread_local;

#[cfg(not(percpu_ref_loom))]
pub(crate) use std::sync::atomic::AtomicBool;
#[cfg(not(percpu_ref_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
// Only the css model uses this.
#[cfg(all(not(percpu_ref_loom), feature = "css"))]
pub(crate) use std::sync::atomic::AtomicPtr;
#[cfg(not(percpu_ref_loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(percpu_ref_loom))]
pub(crate) use std::thread_local;

/// std's atomics, for state loom must not model (see the module docs).
pub(crate) mod unmodeled {
    #[allow(
        unused_imports,
        reason = "which of them a build uses depends on its target and cfgs"
    )]
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicIsize, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
}

/// Locks `m`, ignoring poisoning.
///
/// The switch state stays consistent even when a user callback panics
/// while the lock is held (every field is written before callbacks run),
/// so a poisoned lock carries no broken invariant.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Waits on `cv`, ignoring poisoning (as [`lock`]).
#[cfg(not(percpu_ref_loom))]
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match cv.wait(g) {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Tries to lock `m` without blocking, ignoring poisoning (as [`lock`]).
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// One step of a wait for another thread that is a few instructions from
/// done (the atomic counter's election, or the give-back of a misused
/// put): lets it run. Under loom, a yield that loom schedules.
pub(crate) fn spin_wait() {
    #[cfg(percpu_ref_loom)]
    loom::thread::yield_now();
    #[cfg(not(percpu_ref_loom))]
    std::thread::yield_now();
}

/// A small number that identifies the calling thread while it lives.
///
/// Used to detect a switch operation called from inside its own confirm
/// callback (which would otherwise deadlock on the switch lock).
pub(crate) fn thread_token() -> usize {
    #[cfg(percpu_ref_loom)]
    loom::thread_local! { static TOKEN: u8 = 0; }
    #[cfg(not(percpu_ref_loom))]
    std::thread_local! { static TOKEN: u8 = const { 0 }; }
    TOKEN.with(|t| std::ptr::from_ref(t) as usize)
}
