//! `fork`: one set of `pthread_atfork` handlers for every subsystem that
//! holds a lock another thread could hold at the moment of a `fork`.
//!
//! A child process has only the forking thread: a lock that another thread
//! held at the `fork` stays held forever there, and state half updated
//! under it stays half updated. So the forking thread takes every such
//! lock before the `fork` (`prepare`) and releases it after, in the parent
//! and in the child, which then finds the locks free and the state whole.
//!
//! The order is written here, not left to the order of registration:
//!
//! ```text
//! prepare:  1. grace-period engine: wait until no batch is in flight,
//!              then hold its queue, completion and gp locks
//!           2. arena: hold its lock
//! parent:   arena, then engine: release
//! child:    arena: release;  engine: mark its thread gone (the next
//!           deferred switch or flush starts one), release
//! ```
//!
//! The engine comes first because waiting for its batch in flight runs
//! that batch's releases, which drop refs and so take the arena lock: the
//! other order would deadlock. After the `fork` the locks are released in
//! the reverse order of their taking.
//!
//! The handlers are registered once, when the program (or the library,
//! through `dlopen`) is loaded: the loader runs `.init_array` entries on
//! one thread, before `main` and before any code of this crate can take a
//! lock. Registering at first use would leave a window: a `fork` that had
//! already listed the handlers (without ours) could happen while another
//! thread, just registered, holds a lock.

use crate::grace;
use crate::percpu::{arena_child_after_fork, arena_parent_after_fork, arena_prepare_fork};
use crate::sync::unmodeled::{AtomicBool, Ordering};

/// Whether `pthread_atfork` accepted the handlers (at load time).
static REGISTERED: AtomicBool = AtomicBool::new(false);

// mutant engine_no_fork_handlers: the engine takes no part in a fork, so
// the child inherits a queue whose engine thread it does not have (plain
// test: tests/deferred_fork.rs).
const ENGINE_TAKES_PART: bool = !mutated!("engine_no_fork_handlers");

extern "C" fn prepare() {
    if ENGINE_TAKES_PART {
        grace::prepare_fork();
    }
    arena_prepare_fork();
}

extern "C" fn parent() {
    arena_parent_after_fork();
    if ENGINE_TAKES_PART {
        grace::parent_after_fork();
    }
}

extern "C" fn child() {
    arena_child_after_fork();
    if ENGINE_TAKES_PART {
        grace::child_after_fork();
    }
}

extern "C" fn register() {
    let (prepare, parent, child): (
        unsafe extern "C" fn(),
        unsafe extern "C" fn(),
        unsafe extern "C" fn(),
    ) = (prepare, parent, child);
    // SAFETY: the handlers are plain functions that live for the whole
    // process; they take and release the crate's own locks in the forking
    // thread. pthread_atfork fails only with ENOMEM; then forks are not
    // protected (`REGISTERED` says so).
    let ok = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) } == 0;
    // ordering-audit: Relaxed: written once by the loader's thread before
    // `main`; read by a test.
    REGISTERED.store(ok, Ordering::Relaxed);
}

#[used]
#[cfg_attr(target_vendor = "apple", link_section = "__DATA,__mod_init_func")]
#[cfg_attr(not(target_vendor = "apple"), link_section = ".init_array")]
static REGISTER: extern "C" fn() = register;

#[cfg(test)]
mod tests {
    use super::*;

    /// The `.init_array` entry survived linking and registered the handlers
    /// before `main`.
    #[test]
    fn handlers_are_registered_at_load() {
        assert!(REGISTERED.load(Ordering::Relaxed));
    }
}
