//! What a `Shared` allocates, counted by a global allocator on the test's
//! own thread: an unpromoted value exactly what an `Arc` does (one block
//! of `Arc`'s size; clones and drops nothing), a promotion the ref once
//! (its release is the block's function, kept in the ref). Its own binary: the allocator counts for every test in
//! it.

use percpu_ref::shared::Shared;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

struct Counting;

thread_local! {
    /// Allocations and bytes requested on this thread (no destructor, so
    /// the allocator may touch it at any time).
    static COUNTS: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

// SAFETY: forwards to `System`; only counts besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = COUNTS.try_with(|c| {
            let (n, b) = c.get();
            c.set((n + 1, b + layout.size()));
        });
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations and bytes `f` requests on this thread.
fn allocated(f: impl FnOnce()) -> (usize, usize) {
    let (n0, b0) = COUNTS.with(Cell::get);
    f();
    let (n1, b1) = COUNTS.with(Cell::get);
    (n1 - n0, b1 - b0)
}

#[test]
fn an_unpromoted_value_allocates_what_an_arc_does() {
    for _ in 0..2 {
        let arc = allocated(|| {
            let a = Arc::new(7u64);
            let b = Arc::clone(&a);
            drop((a, b));
        });
        let shared = allocated(|| {
            let a = Shared::new(7u64);
            let b = Shared::clone(&a);
            drop((a, b));
        });
        assert_eq!(shared, arc, "(allocations, bytes) of Shared vs Arc");
        assert_eq!(arc.0, 1);
    }
    // A larger `T` too: the block is the counts and `T`.
    let arc = allocated(|| drop(Arc::new([0u8; 100])));
    let shared = allocated(|| drop(Shared::new([0u8; 100])));
    assert_eq!(shared, arc);
}

#[test]
fn clones_and_drops_allocate_nothing_before_or_after_promotion() {
    let s = Shared::new(String::from("hot"));
    assert_eq!(allocated(|| drop(s.clone())), (0, 0), "an unpromoted clone");
    if Shared::promote(&s) {
        // The first per-CPU use may take an arena slot for this thread.
        drop(s.clone());
        assert_eq!(
            allocated(|| {
                for _ in 0..1000 {
                    drop(s.clone());
                }
            }),
            (0, 0),
            "a promoted clone + drop"
        );
    }
    drop(s);
    percpu_ref::flush();
}

#[test]
fn promotion_allocates_the_ref_once() {
    // The process's first promotion sets up what every ref shares (the
    // backend's detection, the arena, this thread's registration): not
    // counted.
    let warm = Shared::new(0u64);
    Shared::promote(&warm);
    drop(warm.clone());
    drop(warm);
    let s = Shared::new(1u64);
    let (n, bytes) = allocated(|| {
        Shared::promote(&s);
    });
    if Shared::is_percpu(&s) {
        // The ref alone (its release is the block's function, kept in the
        // ref: no callback to box); an arena chunk at most besides.
        assert!((1..=2).contains(&n), "{n} allocations to promote");
        assert!(
            bytes >= std::mem::size_of::<percpu_ref::PercpuRef>(),
            "{bytes} bytes"
        );
        // A second promotion allocates nothing.
        assert_eq!(allocated(|| assert!(Shared::promote(&s))), (0, 0));
    } else {
        assert_eq!((n, bytes), (0, 0), "a value that cannot be promoted");
    }
    drop(s);
    percpu_ref::flush();
}
