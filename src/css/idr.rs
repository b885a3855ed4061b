//! The css id table: the kernel's `ss->css_idr`.
//!
//! One table per subsystem maps a css id to its css. Lookups are lock-free
//! (one atomic load) and must run inside an RCU read section (an epoch
//! guard): a slot is cleared when its css is *released*, and the css is
//! freed only a grace period later, so a pointer loaded under a guard
//! stays valid until the guard is dropped.
//!
//! Ids are allocated cyclically (as `idr_alloc_cyclic`), so a freed id is
//! not handed out again soon; an id is reserved from `alloc` until
//! `remove`, which happens at free time, never before.
//!
//! Writers (`alloc`, `publish`, `unpublish`, `remove`) run under the
//! hierarchy's `cgroup_mutex`; the allocation state has its own lock only
//! to keep the type self-contained.
//!
//! A leaf of the css model (it names no other file of it): the table holds
//! pointers of any type, so that `Inner` in `graph.rs` can keep one per
//! subsystem of `Css` pointers without this file naming `Css`.

use crate::sync::{self, AtomicPtr, Mutex, Ordering};
use std::ptr;

pub(crate) struct Idr<T> {
    slots: Box<[AtomicPtr<T>]>,
    alloc: Mutex<IdAlloc>,
}

struct IdAlloc {
    used: Vec<bool>,
    next: usize,
    in_use: usize,
}

/// `n` null slots, from one zeroed allocation (a loop of `AtomicPtr::new`
/// over the default 65536 slots takes seconds under Miri).
#[cfg(not(percpu_ref_loom))]
fn null_slots<T>(n: usize) -> Box<[AtomicPtr<T>]> {
    use std::alloc::{alloc_zeroed, handle_alloc_error, Layout};
    assert!(n > 0);
    let layout = Layout::array::<AtomicPtr<T>>(n).expect("css idr: table too large");
    #[allow(
        clippy::cast_ptr_alignment,
        reason = "`layout` is the array's, so the allocation has `AtomicPtr`'s alignment"
    )]
    // SAFETY: `layout` has a non-zero size (`n > 0`, and `AtomicPtr` is not
    // zero-sized).
    let p = unsafe { alloc_zeroed(layout) }.cast::<AtomicPtr<T>>();
    if p.is_null() {
        handle_alloc_error(layout);
    }
    // SAFETY: `p` is a fresh allocation of the global allocator with the
    // layout of `[AtomicPtr<T>; n]`, as `Box` expects; `AtomicPtr<T>` has
    // the in-memory representation of `*mut T`, and all-zero bits are the
    // null pointer, so every element is a valid `AtomicPtr`.
    unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(p, n)) }
}

/// loom's `AtomicPtr` is a tracked object, not plain memory.
#[cfg(percpu_ref_loom)]
fn null_slots<T>(n: usize) -> Box<[AtomicPtr<T>]> {
    (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect()
}

impl<T> Idr<T> {
    /// A table for ids `1..capacity`.
    ///
    /// `capacity` is at most 2^32 (ids are `u32`): `Hierarchy::with_options`
    /// refuses a larger `max_css_ids`, naming it, before making any table.
    pub(crate) fn new(capacity: usize) -> Idr<T> {
        let capacity = capacity.max(2);
        Idr {
            slots: null_slots(capacity),
            alloc: Mutex::new(IdAlloc {
                used: vec![false; capacity],
                next: 1,
                in_use: 0,
            }),
        }
    }

    /// Reserves a free id at or above `min` (the slot stays empty until
    /// [`publish`](Self::publish)); `None` when every id is taken.
    pub(crate) fn alloc(&self, min: usize) -> Option<u32> {
        let mut a = sync::lock(&self.alloc);
        let cap = a.used.len();
        let start = a.next.max(min);
        let id = (start..cap).chain(min..start).find(|&i| !a.used[i])?;
        a.used[id] = true;
        a.in_use += 1;
        a.next = if id + 1 >= cap { min } else { id + 1 };
        // Below `cap`, at most 2^32 (see `new`); the check is the last line
        // of defence, not the one users meet.
        Some(
            u32::try_from(id).unwrap_or_else(|_| panic!("css idr: alloc found id {id}, above u32")),
        )
    }

    /// Makes `css` visible to lookups under `id`.
    pub(crate) fn publish(&self, id: u32, css: *mut T) {
        // ordering-audit: Release (rcu_assign_pointer): publishes the css to
        // `css_from_id`, which may race mkdir (loom_css/mkdir_vs_css_from_id).
        // mutant idr_publish_relaxed: publish the css without release.
        let order = mutant!("idr_publish_relaxed", Ordering::Release, Ordering::Relaxed);
        self.slots[id as usize].store(css, order);
    }

    /// Hides the css under `id` from new lookups (`idr_replace(NULL)`); the
    /// id stays reserved.
    pub(crate) fn unpublish(&self, id: u32) {
        // ordering-audit: Relaxed: a null publishes nothing; readers that loaded the old pointer
        // are covered by RCU.
        self.slots[id as usize].store(ptr::null_mut(), Ordering::Relaxed);
    }

    /// Frees `id` for reuse (`idr_remove`).
    pub(crate) fn remove(&self, id: u32) {
        let mut a = sync::lock(&self.alloc);
        let slot = &mut a.used[id as usize];
        assert!(*slot, "css idr: removing id {id}, which is not allocated");
        *slot = false;
        a.in_use -= 1;
        // ordering-audit: Relaxed: a null publishes nothing.
        self.slots[id as usize].store(ptr::null_mut(), Ordering::Relaxed);
    }

    /// The css published under `id`, or null. The caller must be inside an
    /// RCU read section to dereference the result.
    pub(crate) fn find(&self, id: u32) -> *mut T {
        match self.slots.get(id as usize) {
            // ordering-audit: Acquire (rcu_dereference): pairs with `publish`.
            Some(slot) => slot.load(Ordering::Acquire),
            None => ptr::null_mut(),
        }
    }

    /// How many ids are reserved.
    pub(crate) fn in_use(&self) -> usize {
        sync::lock(&self.alloc).in_use
    }
}
