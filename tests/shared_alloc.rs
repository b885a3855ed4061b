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
    /// Bytes freed on this thread.
    static FREED: Cell<usize> = const { Cell::new(0) };
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
        let _ = FREED.try_with(|f| f.set(f.get() + layout.size()));
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

/// `new_cyclic` allocates what `Arc::new_cyclic` does (the same block), and
/// a panic in its function frees it once the last `Weak` is gone.
#[test]
fn new_cyclic_allocates_what_arc_new_cyclic_does_and_a_panic_frees_it() {
    struct ArcNode {
        _me: std::sync::Weak<ArcNode>,
        _v: u64,
    }
    struct SharedNode {
        _me: percpu_ref::shared::Weak<SharedNode>,
        _v: u64,
    }
    let arc = allocated(|| {
        drop(Arc::new_cyclic(|me| ArcNode {
            _me: me.clone(),
            _v: 1,
        }));
    });
    let shared = allocated(|| {
        drop(Shared::new_cyclic(|me| SharedNode {
            _me: me.clone(),
            _v: 1,
        }));
    });
    assert_eq!(shared, arc, "(allocations, bytes) of new_cyclic vs Arc's");
    // A panicking `new_cyclic` of a 4 KiB value, 20 times after a first
    // one (the panic machinery's one-time allocations), against
    // `Arc::new_cyclic`'s in the same conditions (the harness keeps each
    // panic's captured message): a block leaked each time would leave
    // 80 KiB more behind.
    let kept = |panicking: &dyn Fn()| {
        panicking();
        let freed = FREED.with(Cell::get);
        let (_, bytes) = allocated(|| (0..20).for_each(|_| panicking()));
        bytes as isize - (FREED.with(Cell::get) - freed) as isize
    };
    let arc = kept(&|| {
        let r = std::panic::catch_unwind(|| {
            Arc::new_cyclic(|_: &std::sync::Weak<[u8; 4096]>| -> [u8; 4096] {
                panic!("new_cyclic_allocates_what_arc_new_cyclic_does: a panic, as planned")
            })
        });
        assert!(r.is_err());
    });
    let shared = kept(&|| {
        let r = std::panic::catch_unwind(|| {
            Shared::new_cyclic(|_: &percpu_ref::shared::Weak<[u8; 4096]>| -> [u8; 4096] {
                panic!("new_cyclic_allocates_what_arc_new_cyclic_does: a panic, as planned")
            })
        });
        assert!(r.is_err());
    });
    assert!(
        shared < arc + 4096,
        "20 new_cyclic that panicked kept {shared} bytes, Arc's {arc}: blocks were not freed"
    );
}
