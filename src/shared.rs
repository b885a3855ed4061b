//! [`Shared<T>`]: a reference-counted value with no owner and no end, that
//! counts per CPU once it is hot and frees itself. A per-CPU `Arc`.
//!
//! `Arc<T>` keeps its count in one cache line that every clone and drop
//! writes: on one thread that is two locked instructions per clone + drop,
//! and with several CPUs on one value the line moves between them on
//! every operation. A [`PercpuRef`] counts per CPU, but is released only
//! after someone kills it. `Shared` needs neither an owner nor a kill: it
//! is a managed ref (the kernel's managed `percpu_ref` RFC, 2024; see
//! [`PercpuRef::switch_to_managed`]) whose last handle's drop is found by
//! the grace-period engine.
//!
//! # How
//!
//! - **Born an `Arc`.** [`Shared::new`] allocates what `Arc::new` does:
//!   16 bytes of counts and `T`. A clone is one compare-and-swap on the
//!   count, a drop another, and the last drop drops `T` at once on its own
//!   thread, as `Arc`. A value that is cloned a few times and dropped
//!   never allocates more or meets the engine.
//! - **Promoted when hot.** After [`PROMOTE_AFTER`] clones (or
//!   [`Shared::promote`]) one thread hands the count over to a
//!   [`PercpuRef`] it allocates, and switches that to percpu mode under
//!   the engine's management, without a grace period: from then on a
//!   clone and a drop are per-CPU (on the rseq backend: no atomic
//!   instruction).
//! - **Released by the engine.** The engine holds a stand-in reference and
//!   looks only at values dropped since its last look (a drop *marks* the
//!   value on its first drop after each look, one compare-and-swap): a
//!   racy sum guesses, and an exact check in atomic mode decides, when
//!   only the stand-in is left. Then it drops `T`, on the engine's thread.
//!   Idle values cost the engine nothing; a hot one costs one
//!   compare-and-swap per engine round (docs/design.md, "Managed refs").
//!
//! # Where `T` is dropped
//!
//! By the last `Shared`'s drop, on its thread, while the value is in atomic
//! mode (never promoted, or on the sharded backend), unless
//! [`Shared::try_unwrap`] or [`Shared::into_inner`] moved it out of its
//! last handle (a promoted value's `try_unwrap` too: it elects the last
//! handle in an exact window, and the engine never sees it). Once
//! promoted: on the
//! grace-period engine's thread, about 3 ms (three engine rounds, each
//! [`batch_delay`](crate::batch_delay) and a grace period; set it with
//! [`set_batch_delay`](crate::set_batch_delay)) after the last `Shared`
//! is dropped; [`percpu_ref::flush`](crate::flush) makes
//! every such drop happen before it returns (for tests and shutdown), and
//! a promoted value's last [`Shared::into_inner`] takes `T` back from the
//! engine instead. That
//! is why [`Shared::new`] requires `T: Send + 'static`, which `Arc` does
//! not. A panic in `T`'s `Drop` propagates to the dropping thread in
//! atomic mode and is reported on stderr by the engine.
//!
//! # Compared with `Arc`
//!
//! | `Arc<T>` / `sync::Weak<T>` | here |
//! |---|---|
//! | `Arc::new`, `Arc::pin`, `From<T>`, `From<Box<T>>`, `Default` | the same (`T: Send + 'static`) |
//! | `Arc::new_uninit`, `Arc::new_uninit_slice`, `assume_init` | the same; a value is not promoted before its `assume_init`, and one shared (or with a `Weak`) at its `assume_init` never is: it stays an `Arc` (another handle may still be a `MaybeUninit` one, whose promotion would never drop `T`); a `Shared<MaybeUninit<T>>` made with `Shared::new` and promoted before `assume_init` is moved into a new block by its only handle, and leaks `T` if shared |
//! | `Clone`, `Drop`, `Deref` | the same; per CPU once promoted |
//! | `Arc::downgrade`, `Weak::upgrade`, `Weak::new` | the same; an upgrade of a promoted value succeeds until the engine dropped it (it revives the value), not only until the last `Shared` is gone |
//! | `ptr_eq`, `as_ptr`, `into_raw`, `from_raw` (of `Arc` and of `Weak`) | the same |
//! | `Debug`, `Display`, `{:p}`, `Hash`, `==`, `<`, `Borrow`, `AsRef` | the same, delegated to `T` |
//! | `Send`, `Sync`, `Unpin`, `UnwindSafe` | the same conditions |
//! | `strong_count`, `weak_count`, `Weak::strong_count`, `Weak::weak_count` | the same (snapshots); a promoted value's strong count is a racy sum of its per-CPU counts, exact while nobody clones or drops it |
//! | `get_mut`, `make_mut`, `try_unwrap`, `unwrap_or_clone` | the same (`Arc`'s lock on the allocation count; `Arc`'s compare-and-swap of the count from one to zero); on a promoted value they run in an exact window: the ref is switched to atomic mode (a grace period, about 1 µs on an idle 2-vCPU machine, more when the value waits for the engine) and handed back to the engine after. On the engine's own thread a promoted value's checks give the conservative answer (`None`, `Err`, a clone) |
//! | `into_inner` | the same ([`Shared::into_inner`]: exactly one of the last handles gets `T`); on a promoted value it waits for the engine, which alone learns which drop was the last (as [`flush`](crate::flush): about 0.1 ms on an idle 2-vCPU machine) |
//! | `Arc::new_cyclic` | the same ([`Shared::new_cyclic`]: its `Weak`s cannot upgrade until the value is made) |
//! | `increment_strong_count`, `decrement_strong_count` | the same |
//! | `std::task::Wake`, `Waker::from(Arc<W>)` | [`Wake`] (associated functions `wake(this: Shared<Self>)` and `wake_by_ref`: a `self: Shared<Self>` receiver is not stable Rust), `Waker::from(Shared<W>)`: a waker whose clones count per CPU once promoted |
//! | `Arc<str>`, `Arc<[T]>`: `From<&str>`, `From<String>`, `From<Box<str>>`, `From<Cow<str>>`, `From<&[T]>`, `From<Vec<T>>`, `From<Box<[T]>>`, `From<[T; N]>`, `From<Cow<[T]>>`, `FromIterator`, `Default`, `Arc<[u8]>::from(Arc<str>)` | the same: `Shared<str>` and `Shared<[T]>` (`T: Send + 'static`), one allocation, the elements after the counts, a wide handle; `FromIterator` collects into a `Vec` first (std skips it for iterators of a trusted length, a nightly trait). Clones, drops, `Weak`s, promotion, `get_mut` and `from_raw` as for a sized value |
//! | `Arc<dyn Trait>`: the implicit unsized coercion (`let a: Arc<dyn Any> = arc;`), `downcast`, `TryFrom<Arc<[T]>> for Arc<[T; N]>` | [`shared_unsize!`](crate::shared_unsize)`(shared, dyn Trait)` (the coercion, spelled out: `CoerceUnsized` is nightly; safe, as only an unsizing coercion compiles), [`Shared::downcast`] of a `Shared<dyn Any + Send + Sync>`, the same `TryFrom` |
//! | `Arc<dyn Trait>::from(Box<dyn Trait>)`, `Weak::new`, `as_ptr`, `into_raw` and `from_raw` of an unsized `Weak`, `make_mut` of a slice, allocators | absent: a wide pointer to a new allocation with a box's metadata, and the alignment of a dropped unsized value that a `Weak`'s `from_raw` needs, are nightly functions |
//!
//! # Performance
//!
//! Measured in docs/performance.md ("`Shared`"). In short: a promoted
//! value's clone + drop costs what a [`PercpuRef`] get + put costs plus one
//! load (the state word, never written once promoted), flat in the number
//! of CPUs (on a 2-vCPU Xeon VM: 1.00× the `PercpuRef` pair, 4.1× faster
//! than `Arc`'s on one thread, 29× on two); an unpromoted one costs about
//! `Arc`'s (compare-and-swaps instead of adds: the same time on one
//! thread, more instructions: `new` + clone + two drops take 200 where
//! `Arc` takes 178, and a value that can be promoted in place cannot take
//! fewer than about 184, since each clone and drop must first learn where
//! to count). Making and dropping a value costs about what `Arc`'s does
//! (the block is `Arc`'s); a promotion allocates the 128-byte ref (whose
//! release is the block's function, kept in the ref's spare bytes) and a
//! per-CPU slot in the arena.
//!
//! # Limitations
//!
//! - Memory: an unpromoted value takes what an `Arc` takes (16 bytes and
//!   `T`). A promoted one adds the ref (128 bytes, a 144-byte `malloc`
//!   chunk: its atomic count has a cache line to itself) and 8 bytes per
//!   CPU that has counted on it, in the per-CPU arena: measured, about 200
//!   bytes per idle promoted `Shared<u64>` used on one CPU where an
//!   `Arc<u64>` takes 32; hence a value is promoted only after
//!   [`PROMOTE_AFTER`] clones.
//! - A promoted value keeps its memory for a few milliseconds after its
//!   last drop. Values that are never promoted are dropped at once, so a
//!   storm of short-lived values piles nothing up. Promoted ones are bounded
//!   by back-pressure: while more than 65,536 managed scans wait for the
//!   engine, a promotion waits until the engine has completed every scan
//!   queued before it (as [`flush`](crate::flush)), so the values awaiting
//!   their drop stay near that many (plus what other threads promote
//!   meanwhile), at the price of that promotion's latency.
//! - On the sharded backend (no rseq) nothing is promoted: every `Shared`
//!   is an `Arc` (whose clones and drops compare and swap).
//! - Before promotion the count has 56 bits on 64-bit targets (24 on
//!   32-bit); a clone past that panics, naming it (only reachable on the
//!   sharded backend, where nothing is handed over).
//! - A `Shared` dropped after `main` returned, while the process exits, may
//!   never have its `T` dropped (as a value left in a static).
//!
//! # Examples
//!
//! ```
//! use percpu_ref::shared::{Shared, Weak};
//! use std::collections::HashMap;
//! use std::sync::RwLock;
//!
//! let routes = Shared::new(HashMap::from([("/", 1), ("/api", 2)]));
//! let cache: RwLock<Weak<HashMap<&str, i32>>> = RwLock::new(Shared::downgrade(&routes));
//! let handlers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let r = routes.clone();
//!         std::thread::spawn(move || *r.get("/api").unwrap())
//!     })
//!     .collect();
//! for h in handlers {
//!     assert_eq!(h.join().unwrap(), 2);
//! }
//! assert!(cache.read().unwrap().upgrade().is_some());
//! drop(routes); // the last handle
//! percpu_ref::flush(); // dropped now, even if it had been promoted
//! assert!(cache.read().unwrap().upgrade().is_none());
//! ```

#[cfg(doc)]
use crate::percpu_ref::PercpuRef;
use std::panic::{RefUnwindSafe, UnwindSafe};

mod block;
mod handle;
mod slice;
mod uninit;
mod unsize;
mod wake;
mod weak;

pub use block::PROMOTE_AFTER;
pub use handle::Shared;
#[cfg(percpu_ref_loom)]
pub(crate) use slice::from_vec_on as slice_from_vec_on;
pub use wake::Wake;
pub use weak::Weak;

// No handle pins anything: `T` lives in the heap block (as `Arc<T>: Unpin`).
impl<T: ?Sized> Unpin for Shared<T> {}
impl<T: ?Sized> Unpin for Weak<T> {}

// Stated as `Arc<T>`'s (the auto impls would also ask `T: UnwindSafe`,
// through the `PhantomData` of the block): a handle gives `&T` and nothing
// else, so it is unwind safe when `T: RefUnwindSafe`.
impl<T: ?Sized + RefUnwindSafe> UnwindSafe for Shared<T> {}
impl<T: ?Sized + RefUnwindSafe> RefUnwindSafe for Shared<T> {}
impl<T: ?Sized + RefUnwindSafe> UnwindSafe for Weak<T> {}
impl<T: ?Sized + RefUnwindSafe> RefUnwindSafe for Weak<T> {}
