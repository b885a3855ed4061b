//! The engine thread.
//!
//! A thread named `percpu-ref-gp`, started by the first deferred switch (a
//! process that never uses the deferred API never has it). It sleeps on a
//! condition variable; a deferred switch wakes it only when it sleeps (a
//! flag under the queue lock), so a stream of kills makes no system call
//! on the killing threads. Once woken it gathers for up to
//! [`batch_delay`] (1 ms unless set) or until [`BATCH_FULL`] (4096) switches are
//! queued, whichever comes first, then runs one grace period for the
//! whole queue. A steady stream therefore costs at most about one
//! membarrier per millisecond (a few microseconds of interrupts per CPU,
//! well under 1 %), and a burst of kills one per 4096; a single kill is
//! completed within about a millisecond. [`flush`] cuts the gathering
//! short.
//!
//! A `confirm` or `release` that panics on the engine does not stop it: the
//! panic is caught and reported on stderr, naming the operation, and the
//! batch goes on. A grace period the kernel refuses (a seccomp filter) is
//! reported and retried every 10 ms: a deferred switch cannot be undone
//! once its caller returned.
//!
//! Under Miri the thread ends whenever the queue is empty and whoever waits
//! for the engine joins it (Miri requires every thread to have ended when
//! `main` returns); the next deferred switch starts a new one.

#[cfg(miri)]
use super::Engine;
use super::{
    batch_delay, complete_batch, complete_standing_in, engine, take_batch, Batch, Queue,
    BATCH_FULL, ON_ENGINE,
};
use crate::sync;
#[cfg(all(unix, not(miri)))]
use crate::sync::{AtomicBool, Ordering};

/// Starts the engine thread (queue lock held). If the system refuses a
/// thread, it takes the queue and returns it, for the caller to complete
/// on its own thread once it dropped the lock ([`complete_refused`]), so
/// no ref stays pending.
#[must_use]
pub(super) fn start_engine(q: &mut Queue) -> Option<Batch> {
    // mutant engine_std_thread_after_fork: a forked child starts its engine
    // with std::thread too (plain test: tests/deferred_fork.rs,
    // fork_while_threads_start_and_exit, whose child then hangs).
    #[cfg(all(unix, not(miri)))]
    if in_forked_child() && !mutated!("engine_std_thread_after_fork") {
        return match spawn_engine_after_fork() {
            Ok(()) => {
                q.running = true;
                None
            }
            Err(err) => Some(refuse_engine(q, &err)),
        };
    }
    let spawned = std::thread::Builder::new()
        .name(ENGINE_NAME.into())
        .spawn(engine_main);
    match spawned {
        #[cfg_attr(not(miri), allow(unused_variables))]
        Ok(handle) => {
            q.running = true;
            #[cfg(miri)]
            if let Some(ended) = q.handle.replace(handle) {
                // It gave up the queue and is ending: join it, so that no
                // thread outlives `main`.
                let _ = ended.join();
            }
            None
        }
        Err(err) => Some(refuse_engine(q, &err)),
    }
}

/// The engine thread's name (for `ps`, debuggers and panic messages).
const ENGINE_NAME: &str = "percpu-ref-gp";

/// The system refused a thread: takes the queue, for the caller to complete
/// (see [`start_engine`]).
fn refuse_engine(q: &mut Queue, err: &std::io::Error) -> Batch {
    eprintln!(
        "percpu_ref: cannot start the grace-period engine thread ({err}); completing {} \
         deferred switches on the calling thread",
        q.len()
    );
    // Completing runs user callbacks, which may queue: not under the queue
    // lock; the caller completes it once it dropped it.
    take_batch(q)
}

/// Set by [`child_after_fork`]: this process is a child of a `fork` (of a
/// process that may have had other threads), and starts its engine with
/// [`spawn_engine_after_fork`].
#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
pub(super) static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
fn in_forked_child() -> bool {
    // ordering-audit: Relaxed: written by the child's only thread in its
    // fork handler, before the child runs any other code; every thread of
    // the child is started after that.
    FORKED_CHILD.load(Ordering::Relaxed)
}

/// Starts the engine thread in a child after `fork`, with `pthread_create`
/// rather than `std::thread`.
///
/// std's thread start (and exit) takes `stack_overflow::thread_info::LOCK`,
/// a std mutex with no fork handler. If another thread of the parent
/// was starting or exiting at the `fork`, the child inherits it held by a
/// thread that does not exist there, and every `std::thread` started in the
/// child blocks on it before running its closure. `tests/deferred_fork`'s
/// `fork_while_threads_start_and_exit` hung that way (the engine on that
/// lock, the child's main thread waiting for the engine) on 6 runs of 6
/// before this. This thread has the kernel name `percpu-ref-gp`, but no
/// name for std (a panic message says `<unnamed>`) and no stack-overflow
/// message (an overflow is a plain SIGSEGV); a panic that escapes the
/// engine, which catches those of confirms and releases, aborts the child
/// (it cannot unwind into C).
#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
fn spawn_engine_after_fork() -> std::io::Result<()> {
    extern "C" fn start(_: *mut libc::c_void) -> *mut libc::c_void {
        #[cfg(target_os = "linux")]
        {
            let name = std::ffi::CString::new(ENGINE_NAME).expect("no NUL in the name");
            // SAFETY: names the calling thread; `name` is NUL-terminated,
            // 14 bytes with the NUL (the kernel's limit is 16), and lives
            // across the call.
            unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
        }
        engine_main();
        std::ptr::null_mut()
    }
    let mut thread = std::mem::MaybeUninit::<libc::pthread_t>::uninit();
    // SAFETY: `thread` is written by a successful call; default attributes
    // (the C library's stack size); `start` ignores its argument.
    let rc = unsafe {
        libc::pthread_create(
            thread.as_mut_ptr(),
            std::ptr::null(),
            start,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: the call succeeded, so `thread` is a joinable thread that
    // nothing else joins or detaches.
    unsafe { libc::pthread_detach(thread.assume_init()) };
    Ok(())
}

/// Completes, on the calling thread, a batch that [`start_engine`] could
/// not hand to a thread (the queue lock dropped). The thread stands in for
/// the engine meanwhile: its callbacks see [`on_engine`], so a `flush` or
/// a wait for a queued ref from inside one is refused as on the engine
/// (it would wait for the batch this thread is completing).
pub(super) fn complete_refused(batch: Option<Batch>) {
    if let Some(batch) = batch {
        complete_standing_in(batch);
    }
}

fn engine_main() {
    ON_ENGINE.with(|o| o.set(true));
    while let Some(batch) = wait_for_batch() {
        complete_batch(batch);
    }
}

/// Sleeps until work is queued, gathers for up to [`batch_delay`] or until
/// [`BATCH_FULL`] entries are queued (or a flush waits), and takes the
/// queue.
///
/// Under Miri the thread ends instead of sleeping (`None`), and whoever
/// waits for the engine joins it (`join_idle_engine`): Miri requires
/// every thread to have ended when `main` returns.
fn wait_for_batch() -> Option<Batch> {
    let e = engine();
    let mut q = sync::lock(&e.queue);
    while q.is_empty() {
        if cfg!(miri) {
            q.running = false;
            return None;
        }
        q.sleeping = true;
        q = sync::wait(&e.work, q);
    }
    q.sleeping = false;
    let deadline = std::time::Instant::now() + batch_delay();
    while q.len() < BATCH_FULL && !q.urgent {
        let now = std::time::Instant::now();
        if now >= deadline {
            break;
        }
        q = match e.work.wait_timeout(q, deadline - now) {
            Ok((q, _)) => q,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
    q.urgent = false;
    Some(take_batch(&mut q))
}

/// Under Miri: once the queue is empty, waits for the engine thread to end
/// and joins it (see [`wait_for_batch`]).
#[cfg(miri)]
pub(super) fn join_idle_engine(e: &Engine) {
    loop {
        let mut q = sync::lock(&e.queue);
        if !q.is_empty() {
            return; // more work: whoever queued it waits for it
        }
        if !q.running {
            let handle = q.handle.take();
            drop(q);
            if let Some(h) = handle {
                let _ = h.join();
            }
            return;
        }
        drop(q);
        std::thread::yield_now();
    }
}
