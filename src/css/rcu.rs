//! The RCU seam: read sections and the grace period before a css is freed.
//!
//! Outside loom this is crossbeam-epoch: a read section is a pinned
//! [`Guard`](crossbeam_epoch::Guard) and `queue_rcu_work` is
//! [`Guard::defer`](crossbeam_epoch::Guard::defer), which runs the work
//! once every thread pinned at the time has unpinned — the kernel's
//! `rcu_read_lock` and `queue_rcu_work`.
//!
//! crossbeam-epoch cannot run under loom, so under `cfg(loom)` a read
//! section is a no-op token and the hierarchy keeps grace-period work in a
//! list that only `Hierarchy::flush` moves to the destroy queue (see
//! `destroy.rs`). The loom models therefore check the refcount, offline
//! and release ordering, and free only after their threads joined; the
//! grace period itself is crossbeam-epoch's, tested by crossbeam.

/// An RCU read section: css pointers loaded from the id table or a
/// cgroup while it is held stay valid (not freed) until it is dropped.
///
/// Made by [`Hierarchy::rcu_read_lock`](super::Hierarchy::rcu_read_lock).
#[must_use = "the read section ends when the guard is dropped, and a css found under it may \
              then be freed"]
pub struct RcuGuard {
    #[cfg(not(percpu_ref_loom))]
    _guard: crossbeam_epoch::Guard,
    #[cfg(percpu_ref_loom)]
    _guard: (),
}

impl std::fmt::Debug for RcuGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RcuGuard")
    }
}

/// Enters an RCU read section.
pub(crate) fn read_lock() -> RcuGuard {
    RcuGuard {
        #[cfg(not(percpu_ref_loom))]
        _guard: crossbeam_epoch::pin(),
        #[cfg(percpu_ref_loom)]
        _guard: (),
    }
}

/// Runs `f` after a grace period (on whichever thread collects it, inside
/// whatever pinned that thread: `f` must not expect a caller).
///
/// A panic from `f` is caught and dropped (the panic hook reported it):
/// unwinding into crossbeam-epoch's collector would drop the rest of its
/// batch of deferred functions unrun. The css model's callers keep the
/// panics they care about before that (see `Inner::queue_work`).
#[cfg(not(percpu_ref_loom))]
pub(crate) fn call_rcu(f: impl FnOnce() + Send + 'static) {
    let guard = crossbeam_epoch::pin();
    guard.defer(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    });
    // Hand the deferred work to the global queue now, so that another
    // thread's flush can run it even if this thread goes idle.
    guard.flush();
}

/// Helps the grace period along: tries to advance the epoch and runs
/// deferred work that became due.
#[cfg(not(percpu_ref_loom))]
pub(crate) fn advance() {
    crossbeam_epoch::pin().flush();
}
