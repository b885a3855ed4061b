//! Each thread's cache of free slots: creating and dropping a ref on one
//! thread takes no lock and no atomic read-modify-write.
//!
//! A thread keeps a stack of up to [`CACHE_MAX`] free (zeroed) slots in a
//! thread-local that is initialised at compile time and has no
//! destructor, so reaching it is one address computation (no "is it
//! initialised yet" check, no registration) and it can be used at every
//! point of the thread's life, from other thread-locals' destructors too.
//! Taking a slot with one cached, or keeping one with room left, is a
//! load, a compare and two stores: that and the slot's zeroing are all a
//! ref's create and drop cost in the arena. The rest is the slow path, once
//! every [`BATCH`] creations or drops at most: an empty cache takes
//! `BATCH` slots from the pool, a full one gives `BATCH` back, under the
//! arena lock.
//!
//! # Thread exit
//!
//! The stack's thread-local has no destructor; a second thread-local, the
//! *guard*, has one. A thread registers its guard on the slow path, the
//! first time it would keep a slot in an empty cache, and the guard's
//! destructor gives the cached slots back to the pool and *closes* the
//! cache: from then on (a later thread-local destructor that creates or
//! drops a ref) every slot goes to and comes from the pool directly. A
//! thread that first needs its cache while its thread-locals are being
//! destroyed cannot register a guard, and never caches.
//!
//! # Invariants
//!
//! - `len` is the whole state: `slots[..len]` hold free, zeroed slots owned
//!   by this thread, with `len <= CACHE_MAX`, or `len` is [`CLOSED`] and
//!   nothing is cached. A non-zero `len` below `CLOSED` implies a
//!   registered guard, which gives those slots back.
//! - Only the owning thread touches `slots` and writes `len`; other threads
//!   read `len` (a statistic, [`cached`]) through the registry, under the
//!   arena lock, and the guard removes its thread's entry under that lock
//!   before the thread's thread-locals can go away.
//! - No code outside this crate runs while `slots` is being read or
//!   written, so a cache is never re-entered, with one exception a signal
//!   handler could make: creating or dropping a ref is not
//!   async-signal-safe (neither is `Box::new`).

use super::{arena, Arena, FreeSlot, BATCH, CACHE_MAX};
use crate::sync::unmodeled::{AtomicUsize, Ordering::Relaxed};
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;

/// `len` of a cache whose guard has run: nothing is kept any more.
const CLOSED: usize = usize::MAX;

/// A thread's free slots: `slots[..len]`.
pub(super) struct Cache {
    slots: UnsafeCell<[MaybeUninit<FreeSlot>; CACHE_MAX]>,
    /// The number of slots cached, or [`CLOSED`]. Atomic only so that
    /// [`cached`] can read it from another thread, and Relaxed everywhere:
    /// its owner is the only writer, and to others it is a statistic. Its
    /// owner's loads and stores are plain moves.
    len: AtomicUsize,
}

std::thread_local! {
    static CACHE: Cache = const {
        Cache {
            slots: UnsafeCell::new([MaybeUninit::uninit(); CACHE_MAX]),
            len: AtomicUsize::new(0),
        }
    };
    /// Gives this thread's cached slots back when it exits.
    static GUARD: Guard = Guard::register();
}

/// A free slot from this thread's cache: the caller owns it.
#[inline(always)]
pub(super) fn pop() -> FreeSlot {
    CACHE.with(|c| {
        let n = c.len.load(Relaxed);
        // 1..=CACHE_MAX: a slot is cached (CLOSED and 0 wrap above).
        if n.wrapping_sub(1) < CACHE_MAX {
            c.len.store(n - 1, Relaxed);
            // SAFETY: slots[..n] are initialised (the invariant), and only
            // this thread touches them; no reference to the array is held.
            return unsafe { *c.slots.get().cast::<FreeSlot>().add(n - 1) };
        }
        pop_slow(c, n)
    })
}

/// Keeps a free, zeroed `slot` in this thread's cache (or gives it back
/// to the pool).
#[inline(always)]
pub(super) fn push(slot: FreeSlot) {
    CACHE.with(|c| {
        let n = c.len.load(Relaxed);
        // 1..CACHE_MAX: a guard is registered and there is room.
        if n.wrapping_sub(1) < CACHE_MAX - 1 {
            // SAFETY: `n < CACHE_MAX`, inside the array; only this thread
            // touches it.
            unsafe { c.slots.get().cast::<FreeSlot>().add(n).write(slot) };
            c.len.store(n + 1, Relaxed);
            return;
        }
        push_slow(c, n, slot);
    });
}

/// [`pop`] from an empty or closed cache: refills from the pool, or takes
/// one slot from it where the cache cannot keep any.
#[cold]
#[inline(never)]
fn pop_slow(c: &Cache, n: usize) -> FreeSlot {
    if n == 0 && guarded() {
        let slots = c.slots.get().cast::<FreeSlot>();
        let mut got = 0;
        arena().take(BATCH, |s| {
            // SAFETY: `take` gives at most BATCH <= CACHE_MAX slots; the
            // array is this thread's and nothing else refers to it.
            unsafe { slots.add(got).write(s) };
            got += 1;
        });
        // `take` gives at least one slot.
        c.len.store(got - 1, Relaxed);
        // SAFETY: slots[..got] were just written.
        return unsafe { *slots.add(got - 1) };
    }
    take_one()
}

/// [`push`] to an empty, full or closed cache.
#[cold]
#[inline(never)]
fn push_slow(c: &Cache, n: usize, slot: FreeSlot) {
    let slots = c.slots.get().cast::<FreeSlot>();
    match n {
        0 if guarded() => {
            // SAFETY: slot 0 is in the array, which only this thread touches.
            unsafe { slots.write(slot) };
            c.len.store(1, Relaxed);
        }
        CACHE_MAX => {
            // Full: the newest BATCH go back (the oldest stay, warm in
            // this thread's pages), then this one is kept.
            let keep = CACHE_MAX - BATCH;
            // SAFETY: slots[keep..CACHE_MAX] are initialised and this
            // thread's; they are copied out, then forgotten (len drops).
            let spill = (keep..CACHE_MAX).map(|i| unsafe { *slots.add(i) });
            arena().give(spill);
            // SAFETY: `keep < CACHE_MAX`, inside the array.
            unsafe { slots.add(keep).write(slot) };
            c.len.store(keep + 1, Relaxed);
        }
        _ => arena().give(std::iter::once(slot)),
    }
}

/// One slot straight from the pool.
fn take_one() -> FreeSlot {
    let mut one = None;
    arena().take(1, |s| one = Some(s));
    one.expect("the arena's take gives at least one slot")
}

/// Whether this thread's guard is registered (registering it if it is
/// not yet and still can be).
fn guarded() -> bool {
    GUARD.try_with(|_| ()).is_ok()
}

/// The slots in every registered thread's cache (a statistic: each cache
/// may change as it is read).
pub(super) fn cached(a: &Arena) -> usize {
    a.caches
        .iter()
        // SAFETY: a registered cache's thread has not yet run its guard's
        // destructor, which unregisters it under the lock the caller
        // holds, so its thread-locals are alive.
        .map(|&len| unsafe { (*len).load(Relaxed) })
        .filter(|&n| n != CLOSED)
        .sum()
}

/// In a child after `fork` (the caller holds the lock): unregisters every
/// cache but this thread's. The other threads did not survive the fork and
/// never run their guards, and the C library may reuse or unmap their
/// stacks, thread-locals included, so [`cached`] must not read them. Their
/// cached slots stay out of the pool in the child (at most [`CACHE_MAX`]
/// per thread), as slots in a vanished thread's hands must.
#[cfg(all(unix, not(miri)))]
pub(super) fn forget_other_threads(a: &mut Arena) {
    let mine = CACHE.with(|c| &raw const c.len);
    a.caches.retain(|&p| p == mine);
}

/// A thread's registration of its cache (see "Thread exit" above).
struct Guard;

impl Guard {
    fn register() -> Guard {
        let len = CACHE.with(|c| &raw const c.len);
        arena().caches.push(len);
        Guard
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        CACHE.with(|c| {
            let mine = &raw const c.len;
            let mut a = arena();
            let n = c.len.load(Relaxed);
            let slots = c.slots.get().cast::<FreeSlot>();
            // SAFETY: slots[..n] are initialised and this thread's; the
            // cache is closed below, so they are given away exactly once.
            a.give((0..n).map(|i| unsafe { *slots.add(i) }));
            a.caches.retain(|&p| p != mine);
            c.len.store(CLOSED, Relaxed);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::{arena, Slot};
    use super::*;
    use crate::sync::unmodeled::AtomicBool;

    /// Whether this thread's cache was closed when a thread-local
    /// destructor that runs after the guard's looked.
    static SAW_CLOSED: AtomicBool = AtomicBool::new(false);

    /// Slots dropped and created in a thread-local destructor that runs
    /// after the thread's guard (registered after it, so destroyed
    /// before it) go to and come from the pool: after the thread exits,
    /// every slot ever handed out is back in the pool, none lost in a
    /// closed cache. In a child process of this test binary, so that no
    /// other test's slots are out meanwhile.
    #[test]
    #[cfg_attr(miri, ignore = "runs a child process")]
    fn exited_threads_lose_no_slot() {
        if !crate::percpu::alone_in_child(
            "percpu::arena::cache::tests::exited_threads_lose_no_slot",
        ) {
            return;
        }

        struct Holder(std::cell::RefCell<Vec<Slot>>);
        impl Drop for Holder {
            fn drop(&mut self) {
                SAW_CLOSED.store(CACHE.with(|c| c.len.load(Relaxed)) == CLOSED, Relaxed);
                // Dropped into a closed cache, then one more taken from it
                // and dropped.
                self.0.borrow_mut().clear();
                drop(Slot::alloc());
            }
        }
        std::thread_local! {
            static HOLDER: Holder = const { Holder(std::cell::RefCell::new(Vec::new())) };
        }

        std::thread::spawn(|| {
            // The holder first, so that its destructor is registered
            // before the guard's and runs after it.
            HOLDER.with(|_| {});
            let mut slots: Vec<Slot> = (0..3 * CACHE_MAX).map(|_| Slot::alloc()).collect();
            // Most go back through the cache (full, it spills); some stay
            // for the holder's destructor.
            let kept: Vec<Slot> = slots.drain(..CACHE_MAX / 2).collect();
            drop(slots);
            HOLDER.with(|h| h.0.borrow_mut().extend(kept));
        })
        .join()
        .unwrap();

        assert!(
            SAW_CLOSED.load(Relaxed),
            "the holder's destructor ran before the cache's guard: this test no longer \
             exercises a closed cache"
        );
        let a = arena();
        assert_eq!(a.out, 0, "slots lost with the exited thread");
        assert_eq!(a.free.len(), a.fresh_next, "every slot handed out is free");
        assert!(
            a.caches.is_empty(),
            "the exited thread's cache is still registered"
        );
    }

    /// A thread alive at a fork, with slots in its cache: the child keeps
    /// no registration of it (the child's C library may unmap that
    /// thread's stack, and `stats` would read it), only its own.
    #[test]
    #[cfg(all(unix, not(miri)))]
    fn a_fork_child_forgets_other_threads_caches() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let slots: Vec<Slot> = (0..8).map(|_| Slot::alloc()).collect();
            drop(slots);
            ready_tx.send(()).unwrap();
            rx.recv().unwrap();
        });
        ready_rx.recv().unwrap();
        assert!(
            !arena().caches.is_empty(),
            "the thread's cache is registered"
        );
        let mine = CACHE.with(|c| &raw const c.len);
        // SAFETY: the child only takes the arena's spin lock, reads the
        // registry and exits without running destructors.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let a = arena();
            let ok = a.caches.iter().all(|&p| p == mine);
            // SAFETY: ends the child at once, as a forked child must.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        tx.send(()).unwrap();
        t.join().unwrap();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child still had other threads' caches registered (status {status})"
        );
    }
}
