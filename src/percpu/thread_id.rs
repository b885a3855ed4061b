//! Compact thread ids: each thread that asks gets the lowest id no live
//! thread holds, and gives it back when it exits.
//!
//! The sharded backend indexes its shards by this id. A thread pool that
//! is torn down and rebuilt then keeps using the same few shards (and the
//! same few pages of every ref's slot), as `mm_cid` does for the rseq
//! backend, where a counter that grew with every thread ever started would
//! walk over every shard of every ref.
//!
//! # Invariants
//!
//! - Ids are below `limit` (the shard count): one bit each in a bitmap of
//!   atomic words, claimed with a compare-and-swap and cleared by the
//!   holder's thread-local guard when its thread exits. No lock, so a fork
//!   while another thread claims cannot leave the child blocked; a child
//!   keeps the bits of the parent's other threads (they never exit there),
//!   which only makes its later threads share shards sooner.
//! - When every id is held, a thread gets a shared one (round-robin) that
//!   it does not own and never gives back. So does a thread that first
//!   asks while its thread-locals are being destroyed (no guard can be
//!   registered then). Sharing an id is always correct: every operation
//!   on a shard is an atomic read-modify-write; it only costs contention.
//! - A thread that keeps using its id in a thread-local destructor that
//!   runs after its guard's may share it with a thread that claimed it
//!   since, with the same consequence.

use crate::sync::unmodeled::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::cell::Cell;

/// The bitmap of held ids: `words` atomic words, bit `i % 64` of word
/// `i / 64` for id `i`; made on first use and never freed.
struct Bitmap {
    words: Box<[AtomicU64]>,
    limit: usize,
}

static BITMAP: AtomicPtr<Bitmap> = AtomicPtr::new(std::ptr::null_mut());
/// Hands out the shared ids of threads that found every id held.
static SHARED: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// This thread's id, or `usize::MAX` until it asked.
    static ID: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Gives an owned id back when the thread exits.
    static GUARD: Guard = Guard::claim();
}

/// This thread's id, below [`limit`].
#[inline(always)]
pub(super) fn current() -> usize {
    let id = ID.with(Cell::get);
    if id != usize::MAX {
        return id;
    }
    first()
}

/// The number of ids: the arena's region count, one shard each.
fn limit() -> usize {
    super::arena::arena_cpus()
}

#[cold]
#[inline(never)]
fn first() -> usize {
    let id = GUARD.try_with(|g| g.id).unwrap_or_else(|_| shared());
    ID.with(|i| i.set(id));
    id
}

/// The bitmap, made on first use. Racing threads each make one; the first
/// published stands and the others are freed.
fn bitmap() -> &'static Bitmap {
    // ordering-audit: kept: acquires the bitmap's words, initialised
    // before the pointer was published. Not built under loom (the loom
    // build indexes shards by loom's thread ids); the churn and thread-id
    // tests run it, on x86, where no order is weaker.
    let p = BITMAP.load(crate::sync::unmodeled::Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published bitmap is never freed, and was initialised
        // before its pointer was published (Release below).
        return unsafe { &*p };
    }
    let limit = limit();
    let mine = Box::into_raw(Box::new(Bitmap {
        words: (0..limit.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        limit,
    }));
    // ordering-audit: kept: publishes the initialised bitmap (Release), or
    // acquires the one a racing thread published (Acquire on failure). Not
    // built under loom, as above.
    match BITMAP.compare_exchange(
        std::ptr::null_mut(),
        mine,
        crate::sync::unmodeled::Ordering::Release,
        crate::sync::unmodeled::Ordering::Acquire,
    ) {
        // SAFETY: just published; never freed.
        Ok(_) => unsafe { &*mine },
        Err(first) => {
            // SAFETY: `mine` was never shared; `first` is published and
            // never freed.
            unsafe {
                drop(Box::from_raw(mine));
                &*first
            }
        }
    }
}

/// The lowest id no thread holds, marked held; `None` when all are.
fn claim() -> Option<usize> {
    let map = bitmap();
    for (w, word) in map.words.iter().enumerate() {
        let mut bits = word.load(Relaxed);
        loop {
            let free = (!bits).trailing_zeros() as usize;
            let id = w * 64 + free;
            if free == 64 || id >= map.limit {
                break;
            }
            // Relaxed: the bit is the only thing shared; nothing is
            // published with it.
            match word.compare_exchange_weak(bits, bits | 1 << free, Relaxed, Relaxed) {
                Ok(_) => return Some(id),
                Err(now) => bits = now,
            }
        }
    }
    None
}

/// Gives `id` back.
fn release(id: usize) {
    let map = bitmap();
    let old = map.words[id / 64].fetch_and(!(1 << (id % 64)), Relaxed);
    debug_assert_ne!(old & 1 << (id % 64), 0, "thread id {id} given back twice");
}

/// An id shared with other threads (never given back).
fn shared() -> usize {
    SHARED.fetch_add(1, Relaxed) % limit()
}

/// A thread's claim on its id.
struct Guard {
    id: usize,
    owned: bool,
}

impl Guard {
    fn claim() -> Guard {
        match claim() {
            Some(id) => Guard { id, owned: true },
            None => Guard {
                id: shared(),
                owned: false,
            },
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.owned {
            release(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads that run one after another all get the same id; threads
    /// alive at once get distinct ones, below the limit. In a child
    /// process of this test binary, so that no other test's threads take
    /// or give back ids meanwhile.
    #[test]
    fn ids_are_compact_and_reused() {
        if !crate::percpu::alone_in_child("percpu::thread_id::tests::ids_are_compact_and_reused") {
            return;
        }
        let mine = current();
        assert!(mine < limit());
        let ids: Vec<usize> = (0..20)
            .map(|_| std::thread::spawn(current).join().unwrap())
            .collect();
        assert!(
            ids.iter().all(|&id| id == ids[0] && id < limit()),
            "sequential threads took ids {ids:?}: an exited thread's id was not reused"
        );
        // Every id but the main thread's held at once: all distinct.
        let n = (limit() - 1).min(64);
        if n >= 2 {
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
            let threads: Vec<_> = (0..n)
                .map(|_| {
                    let b = barrier.clone();
                    std::thread::spawn(move || {
                        let id = current();
                        b.wait();
                        id
                    })
                })
                .collect();
            let mut held: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            held.sort_unstable();
            let expected: Vec<usize> = (0..limit()).filter(|&i| i != mine).take(n).collect();
            assert_eq!(
                held, expected,
                "live threads' ids are not the lowest free ones"
            );
        }
    }
}
