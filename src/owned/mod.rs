//! An owning layer over [`PercpuRef`]: the type system does the counting and
//! `T`'s lifetime follows the count.
//!
//! # The types
//!
//! | type | holds | kernel analogue |
//! |---|---|---|
//! | [`Owner<T>`] | the base reference and the right to kill or freeze | the object's creator holding `percpu_ref_init`'s reference |
//! | [`Ref<T>`] | one counted reference; derefs to `T` | a reference taken with `percpu_ref_get` |
//! | [`Weak<T>`] | the allocation only, not `T` | a pointer in an RCU-protected lookup table |
//! | [`Killed<T>`] | the owner's claim on `T` after [`Owner::kill`] | the waiter on `release` |
//! | [`Frozen<'_, T>`] | `&mut T` while no reference exists | `blk_mq_freeze_queue` .. `blk_mq_unfreeze_queue` |
//!
//! `Ref::clone` is a percpu get and `Ref`'s drop a put; nothing else happens
//! on those paths in percpu mode (see *Cost* below).
//!
//! # Which pattern when
//!
//! - **Hot shared object** — many threads read one long-lived object
//!   (a device, a table, a configuration) and clone handles to it often:
//!   hand out [`Ref`]s from the [`Owner`]; kill when done and
//!   [`wait`](Killed::wait) for the last user to get `T` back.
//! - **Lookup table** — objects are found by key and may be going away:
//!   store [`Weak`]s in the table and turn a hit into a reference with
//!   [`Weak::tryget_live`], which fails as soon as the object was killed
//!   (as `css_tryget_online`). Use [`Weak::tryget`] for "alive or dying,
//!   but not yet released" (as `css_tryget`).
//! - **Freeze / unfreeze** — an object is used through references all the
//!   time but must sometimes be changed with nobody looking (the block
//!   layer's queue freeze around an elevator switch): [`Owner::freeze`]
//!   kills, drains, and hands out `&mut T`; dropping the [`Frozen`] guard
//!   brings the object back to percpu mode. [`Owner::freeze_timeout`] gives
//!   up cleanly when references do not drain.
//!
//! Plain `Arc<T>` is the better choice when clones are rare or the object
//! is never killed: a `PercpuRef` costs per-CPU storage and a switch to
//! atomic mode (a grace period, shared with every kill queued in the same
//! millisecond; see [`Owner::kill`]) to kill.
//!
//! # Examples
//!
//! A hot shared object, killed and drained:
//!
//! ```
//! use percpu_ref::owned::Owner;
//!
//! let owner = Owner::new(vec![1u64, 2, 3]);
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let r = owner.get(); // a counted reference
//!         std::thread::spawn(move || {
//!             let mut sum = 0;
//!             for _ in 0..1000 {
//!                 let r2 = r.clone(); // percpu get
//!                 sum += r2.iter().sum::<u64>();
//!             } // percpu put
//!             sum
//!         })
//!     })
//!     .collect();
//! let killed = owner.kill(); // no new live references from here on
//! for w in workers {
//!     assert_eq!(w.join().unwrap(), 6000);
//! }
//! assert_eq!(killed.wait(), vec![1, 2, 3]); // every reference is gone
//! ```
//!
//! A lookup table of [`Weak`]s (a lock-free table would store them the same
//! way, read under a crossbeam-epoch guard):
//!
//! ```
//! use percpu_ref::owned::{Owner, Weak};
//! use std::collections::HashMap;
//! use std::sync::RwLock;
//!
//! let table: RwLock<HashMap<u32, Weak<String>>> = RwLock::new(HashMap::new());
//! let dev = Owner::new(String::from("sda"));
//! table.write().unwrap().insert(8, dev.downgrade());
//!
//! let lookup = |id| table.read().unwrap().get(&id).and_then(|w| w.tryget_live());
//! assert_eq!(lookup(8).as_deref().map(String::as_str), Some("sda"));
//!
//! let killed = dev.kill(); // the device goes away
//! assert!(lookup(8).is_none()); // no new users, even before it is freed
//! table.write().unwrap().remove(&8);
//! assert_eq!(killed.wait(), "sda");
//! ```
//!
//! Freeze / unfreeze:
//!
//! ```
//! use percpu_ref::owned::Owner;
//! use std::time::Duration;
//!
//! let mut queue = Owner::new(String::from("mq-deadline"));
//! let weak = queue.downgrade();
//! {
//!     let mut frozen = queue.freeze(); // waits until no Ref exists
//!     assert!(weak.tryget_live().is_none()); // and none can be made
//!     frozen.replace_range(.., "bfq"); // exclusive access
//! } // unfreeze: percpu mode again
//! assert_eq!(*weak.tryget_live().unwrap(), "bfq");
//!
//! let busy = queue.get();
//! assert!(queue.freeze_timeout(Duration::from_millis(10)).is_err()); // undone
//! assert_eq!(*weak.tryget_live().unwrap(), "bfq"); // live again
//! drop(busy);
//! ```
//!
//! # Compared with `Arc`
//!
//! | `Arc<T>` / `sync::Weak<T>` | here |
//! |---|---|
//! | `Arc::new`, `From<T>`, `Default` | [`Owner::new`], `Owner::from`, `Owner::default` |
//! | `Arc::clone` | [`Owner::get`], `Ref::clone` |
//! | `Arc::downgrade` | [`Owner::downgrade`], [`Ref::downgrade`] |
//! | `Weak::upgrade` | [`Weak::tryget`] (alive or dying); [`Weak::tryget_live`] (not killed) |
//! | `Weak::new` | [`Weak::new`] |
//! | `Arc::try_unwrap`, `Arc::into_inner` | [`Owner::kill`] (returns at once; the grace-period engine completes the kill), then [`Killed::try_take`], [`Killed::wait`] or `.await` |
//! | dropping the last `Arc` | dropping the [`Owner`] kills: deferred (returns at once) when `T` has no drop glue, else a synchronous kill (one grace period) so that `T` is dropped by a user thread |
//! | `Arc::get_mut` | [`Owner::freeze_timeout`] with a zero timeout; [`Owner::freeze`] waits |
//! | `Arc::as_ptr`, `into_raw`, `from_raw` | [`Ref::as_ptr`], [`Ref::into_raw`], [`Ref::from_raw`]; [`Weak::as_ptr`] |
//! | `Arc::ptr_eq` | [`Ref::ptr_eq`], [`Weak::ptr_eq`] |
//! | `==`, `<`, `Hash`, `Display`, `Borrow<T>`, `AsRef<T>` | the same on [`Owner`] and [`Ref`], delegated to `T`; `{:p}` on `Ref` |
//! | `UnwindSafe`, `RefUnwindSafe`, `Unpin` | the same for `Ref` and `Weak`; `&Owner` but not an `Owner` by value is unwind safe (see [`Owner`]) |
//!
//! # Cost
//!
//! `Ref::clone` compiles to `PercpuRef::get` and nothing else: no second
//! atomic, because the percpu count itself keeps the allocation alive.
//! `Ref`'s drop is `PercpuRef::put` plus a read of one thread-local slot
//! (the owed unit, almost always empty).
//!
//! # Caveats
//!
//! - If `T`'s `Drop` panics (inside `release` or when a [`Killed`] is
//!   dropped), the panic propagates to the thread that dropped the last
//!   reference, `T` counts as dropped, and the block is still freed with
//!   its last unit (`Arc` leaks it).
//! - If the kernel refuses the grace period a kill needs (a seccomp filter
//!   that blocks `membarrier`, on the rseq backend): [`Owner::kill`]
//!   returns as usual and the engine reports the refusal on stderr and
//!   retries every 10 ms, so the object stays dying (no new live
//!   references) and is released once a grace period passes; an `Owner`
//!   dropped with a deferred kill does the same. The synchronous kills
//!   cannot wait like that: [`Owner::freeze`] panics, and dropping an
//!   `Owner` whose `T` has drop glue leaks the object (the kill is undone,
//!   so every reference stays valid, but `T` is never dropped).
//! - Leaking a [`Frozen`] guard (`mem::forget`) leaves the object frozen
//!   for good: [`Owner::get`] then panics, lookups fail, and `T` is dropped
//!   with the owner.
//!
//! How it works (the shared block, its two counts, the engine's part, the
//! invariants) is in the source: `src/owned/block.rs`.

#[cfg(doc)]
use crate::percpu_ref::PercpuRef;
use std::panic::{RefUnwindSafe, UnwindSafe};

pub(crate) mod block;
mod handle;
mod killed;
mod owner;
#[cfg(all(test, not(percpu_ref_loom)))]
mod tests;
mod weak;

#[cfg(percpu_ref_loom)]
pub(crate) use block::live_blocks;
pub use handle::Ref;
pub use killed::Killed;
pub use owner::{FreezeTimeout, Frozen, Owner};
pub use weak::Weak;

// ----- marker traits --------------------------------------------------------

// Unpin: no handle pins anything. `T` lives in the heap block and no method
// gives out `Pin<&mut T>`, so moving a handle never moves `T` (as `Arc<T>:
// Unpin` for every `T`). Without these, `PhantomData<Inner<T>>` would make a
// handle `Unpin` only when `T` is, and a `Killed` of a `!Unpin` value could
// not be polled through `Pin::new(&mut killed)`.
impl<T> Unpin for Owner<T> {}
impl<T> Unpin for Ref<T> {}
impl<T> Unpin for Weak<T> {}
impl<T> Unpin for Killed<T> {}

// Unwind safety. The auto impls are missing for every handle because the
// block holds `T` in an `UnsafeCell` (and the ref, with its switch lock), not
// because a panic could tear anything of ours: the counts and the state
// lock are consistent at every point where user code can panic (`T`'s
// `Drop` inside `release` or a `Killed`'s drop, a waker), which the module
// handles, and the state lock ignores poisoning on purpose. What a handle
// shares across a `catch_unwind` boundary is then `&T` alone:
//
// - `Ref` and `Weak` give `&T` (now or after a `tryget`) and nothing else,
//   so they are unwind safe when `T: RefUnwindSafe`, as `Arc<T>`.
// - `&Owner` gives `&T`, `Ref`s and `Weak`s: `Owner: RefUnwindSafe` on the
//   same terms. An `Owner` by value is *not* `UnwindSafe`: it can freeze,
//   and a panic while the `Frozen` guard's `&mut T` is half way through an
//   update unfreezes on the way out (there is no poisoning), so the other
//   handles (`Weak`s outside the closure) could see the torn `T` — the
//   reason `Arc::get_mut` refuses while any `Weak` exists. Wrap it in
//   `AssertUnwindSafe` when that cannot happen.
// - `Killed` never gives `&T`; it is `T` in waiting, so it is unwind safe
//   as `T` is (as `Option<T>`).
// - `Frozen` keeps its auto impls: `&mut Owner` is never `UnwindSafe`, and
//   `&Frozen` gives `&T` (via `Owner: RefUnwindSafe`).
impl<T: RefUnwindSafe> UnwindSafe for Ref<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Ref<T> {}
impl<T: RefUnwindSafe> UnwindSafe for Weak<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Weak<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Owner<T> {}
impl<T: UnwindSafe> UnwindSafe for Killed<T> {}
impl<T: RefUnwindSafe> RefUnwindSafe for Killed<T> {}
