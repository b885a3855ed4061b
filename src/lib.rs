//! The Linux kernel's per-CPU reference counter (`percpu_ref`,
//! lib/percpu-refcount.c) for user space.
//!
//! # The idea
//!
//! A shared atomic reference count stops scaling as soon as two cores use
//! it: every get and put moves one cache line between them. A
//! [`PercpuRef`] instead counts in one counter per CPU while the object is
//! alive ("percpu mode"): a get adds one to the current CPU's counter, a put
//! subtracts one, possibly on another CPU. No single counter means anything
//! alone, so the count cannot be seen to reach zero — and it does not need
//! to, because the owner still holds the *base reference*.
//!
//! When the owner is done it *kills* the ref: the ref switches to one shared
//! atomic counter ("atomic mode"), waits out a grace period so that no
//! per-CPU operation is in flight, folds the per-CPU counters into the
//! atomic one, runs the caller's `confirm`, and drops the base reference.
//! From then on puts decrement the atomic counter, and the one that takes
//! it to zero runs `release`, exactly once and never before `confirm`.
//!
//! The kernel measured this for cgroup css refcounts in 2013 on an 8-core
//! Opteron: a get/put pair in percpu mode was 2.8x faster than an atomic
//! pair on one CPU and scaled 8.2x on eight CPUs, while the atomic counter
//! *lost* throughput (0.22x) as CPUs were added.
//!
//! # Modes and operations
//!
//! | kernel | here | notes |
//! |---|---|---|
//! | `percpu_ref_init(ref, release, flags, gfp)` | [`PercpuRef::with_flags`] | [`InitFlags`]: `INIT_ATOMIC`, `INIT_DEAD`, `ALLOW_REINIT` |
//! | `percpu_ref_exit` | `Drop` | frees the per-CPU counters |
//! | `percpu_ref_get` / `_get_many` | [`get`](PercpuRef::get) / [`get_many`](PercpuRef::get_many) | caller holds a reference |
//! | `percpu_ref_put` / `_put_many` | [`put`](PercpuRef::put) / [`put_many`](PercpuRef::put_many) | last put runs `release` |
//! | `percpu_ref_tryget` / `_tryget_many` | [`tryget`](PercpuRef::tryget) / [`tryget_many`](PercpuRef::tryget_many) | fails only at zero |
//! | `percpu_ref_tryget_live` | [`tryget_live`](PercpuRef::tryget_live) | fails once dead |
//! | `percpu_ref_kill` | [`kill`](PercpuRef::kill) | synchronous |
//! | `percpu_ref_kill_and_confirm` | [`kill_and_confirm`](PercpuRef::kill_and_confirm) | `confirm` has run on return |
//! | `percpu_ref_switch_to_atomic` | [`switch_to_atomic_and_confirm`](PercpuRef::switch_to_atomic_and_confirm) | sticky |
//! | `percpu_ref_switch_to_atomic_sync` | [`switch_to_atomic`](PercpuRef::switch_to_atomic) | also [`switch_to_atomic_sync`](PercpuRef::switch_to_atomic_sync) |
//! | `percpu_ref_switch_to_percpu` | [`switch_to_percpu`](PercpuRef::switch_to_percpu) | needs `ALLOW_REINIT` |
//! | `percpu_ref_reinit` | [`reinit`](PercpuRef::reinit) | count must be zero |
//! | `percpu_ref_resurrect` | [`resurrect`](PercpuRef::resurrect) | must be dead |
//! | `percpu_ref_is_zero` | [`is_zero`](PercpuRef::is_zero) | |
//! | `percpu_ref_is_dying` | [`is_dying`](PercpuRef::is_dying) | |
//! | `__ref_is_percpu` | [`is_percpu`](PercpuRef::is_percpu) | |
//!
//! Where the kernel only warns on misuse, this crate returns an [`Error`]
//! and changes nothing (double kill, resurrect when not dead, reinit with a
//! count, going percpu without `ALLOW_REINIT`), or panics with a message
//! that names the operation and the count (underflow, get on a released
//! ref). It never releases twice and never lets the count wrap silently.
//!
//! # Backends
//!
//! The per-CPU counters have two implementations behind one interface (see
//! [`Backend`] and the `percpu` module): restartable sequences on Linux
//! (no atomic instruction on the fast path, `membarrier` as the grace
//! period) and portable cache-padded shards sealed by the switcher. The
//! process picks one at first use; [`backend()`] says which.
//!
//! # Layers
//!
//! - [`PercpuRef`]: the kernel's counter, method for method (table above).
//! - [`owned`]: an owning RAII layer — [`Owner`], [`Ref`], [`Weak`],
//!   [`Killed`], [`Frozen`] — in which the type system does the counting:
//!   hot shared objects, lookup tables with `tryget_live`, and the block
//!   layer's freeze/unfreeze, with no `unsafe` for the user.
//! - [`css`]: the cgroup `cgroup_subsys_state` lifecycle that `percpu_ref`
//!   was built for (mkdir, rmdir, kill, offline, release, free), modelled on
//!   `PercpuRef`.
//!
//! # Performance
//!
//! On a 2-vCPU x86_64 VM with the rseq backend, a get+put pair costs
//! 1.5 ns on one thread and stays 1.5 ns per thread on two, where an
//! `AtomicUsize` pair goes from 9.3 ns to 29 ns; a kill costs one
//! `membarrier` (0.3 µs alone, about 10 µs when another CPU is running one
//! of the process's threads). Each ref costs 8 bytes per possible CPU plus
//! 72 bytes. The README has the tables and the commands that measure them.
//!
//! # Reliability
//!
//! What holds whatever safe code does (each item is tested; the README's
//! *Reliability* section names the tests):
//!
//! - **No undefined behaviour from safe code.** Misuse gets an [`Error`]
//!   that names the operation, or a panic that names the operation and
//!   the count; nothing is corrupted.
//! - **`release` runs exactly once per life and never before `confirm`,**
//!   also when `confirm` or `release` panics: a panicking `confirm` is
//!   caught, the switch completes (fold, base and temporary references
//!   put, release if due), and the panic is then resumed on the caller. A
//!   released ref stays released until [`reinit`](PercpuRef::reinit):
//!   [`switch_to_percpu`](PercpuRef::switch_to_percpu) refuses it
//!   ([`Error::Released`]) and `tryget` keeps failing.
//! - **The count never wraps.** Every `n` up to `2^62 - 1` counts exactly
//!   on every backend (`_many` calls with `n >= 2^16` take the atomic
//!   path). An add past `2^62 - 1` references panics as an overflow and
//!   changes nothing, as `Arc` aborts; in atomic mode so does a put below
//!   zero. Misuse the per-CPU counters hide (an underflow in percpu mode)
//!   is found by the next switch, which panics after completing; the ref
//!   is then *miscounted*: it never releases and stays atomic
//!   ([`Error::Miscounted`]).
//! - **A refused grace period changes nothing.** If the kernel refuses
//!   `membarrier` after start-up (a seccomp filter installed later, on one
//!   thread), the switch is undone before anything was summed:
//!   [`kill`](PercpuRef::kill) returns [`Error::GracePeriodFailed`] and
//!   [`switch_to_atomic`](PercpuRef::switch_to_atomic) panics, with the ref
//!   exactly as it was.
//!
//! # Limitations
//!
//! - Switches are synchronous: `kill` and `switch_to_atomic` return after
//!   the grace period and `confirm`. They are meant to be rare.
//! - In percpu mode an underflow cannot be seen until the next switch to
//!   atomic mode; it is then reported by a panic. So is an overflow made
//!   of more than 2^46 per-CPU calls; one of more than about 2^47 such
//!   calls between two switches would read as an underflow.
//! - Dropping a `PercpuRef` does not run `release` (as `percpu_ref_exit`).
//!
//! # Example
//!
//! ```
//! use percpu_ref::PercpuRef;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! let releases = Arc::new(AtomicUsize::new(0));
//! let r = Arc::new({
//!     let releases = releases.clone();
//!     PercpuRef::new(move |_| {
//!         releases.fetch_add(1, Ordering::SeqCst);
//!     })
//! });
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let r = r.clone();
//!         std::thread::spawn(move || {
//!             for _ in 0..10_000 {
//!                 r.get();
//!                 r.put();
//!             }
//!         })
//!     })
//!     .collect();
//! for w in workers {
//!     w.join().unwrap();
//! }
//! r.kill().unwrap(); // the base reference was the last one
//! assert_eq!(releases.load(Ordering::SeqCst), 1);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod atomic_mode;
#[cfg(feature = "css")]
#[cfg_attr(docsrs, doc(cfg(feature = "css")))]
pub mod css;
mod flags;
pub mod owned;
pub mod percpu;
mod percpu_ref;
mod sync;

#[cfg(doctest)]
mod readme_doctests;

pub use flags::{Error, InitFlags};
pub use owned::{FreezeTimeout, Frozen, Killed, Owner, Ref, Weak};
pub use percpu::{backend, possible_cpus, Backend};
pub use percpu_ref::PercpuRef;
