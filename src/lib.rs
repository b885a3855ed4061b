//! The Linux kernel's per-CPU reference counter (`percpu_ref`,
//! lib/percpu-refcount.c) for user space, with its kill semantics and an
//! owning layer that does the counting for you.
//!
//! # Which type do I want
//!
//! - **[`Owner`], [`Ref`], [`Weak`]** ([`owned`]): one owner, many handles,
//!   and an end. Start here. The [`Owner`] holds `T` next to the counter,
//!   and the base reference; [`Owner::get`] hands out [`Ref`]s, which deref
//!   to `T` (a clone is a per-CPU get, a drop a put). A [`Weak`] keeps only
//!   the allocation, for lookup tables; [`Weak::tryget_live`] turns it into
//!   a [`Ref`] until the owner kills. [`Owner::kill`] stops new live
//!   references and [`Killed::wait`] hands `T` back after the last [`Ref`]
//!   is dropped; [`Owner::freeze`] is the block layer's queue freeze. No
//!   `unsafe` in your code. The [`owned`] module docs show the patterns and
//!   their costs.
//! - **[`PercpuRef`]**: the kernel's API, method for method ([table
//!   below](#modes-and-operations)). You do the counting (every `get` and
//!   every successful `tryget` needs its `put`) and you manage the object.
//!   `release` is called with only `&PercpuRef`: there is no
//!   `container_of`, so it cannot reach the object around the counter.
//!   Pair the counter with storage of your own that `release` signals (a
//!   flag, a channel, a slot it empties), or use [`Owner`], which is that
//!   pairing done once. Use it when one owner with many handles is not
//!   your shape: sticky atomic mode, `reinit`/`resurrect` cycles, `_many`
//!   counts, your own release protocol.
//! - **Something else** is the better pick when (figures from
//!   [*Performance*](#performance)):
//!   - [`std::sync::Arc`]: clones are rare, or the users stay on one core,
//!     or objects are many, small or short-lived. What a `PercpuRef` buys
//!     is scaling: a get + put costs each thread the same however many
//!     threads share the object, where an `Arc` clone + drop becomes
//!     several times slower once two cores share its count. It costs 8
//!     bytes per possible CPU plus 64 per object (an `Arc`: 16 bytes of
//!     counts) and a kill that waits for a grace period, where an `Arc`
//!     simply frees at the last drop.
//!   - [arc-swap](https://docs.rs/arc-swap): a pointer read often and
//!     replaced now and then (configuration, a routing table). A reader's
//!     `load` touches no shared count, and the old value goes when its last
//!     reader drops it. There is no kill; you replace.
//!   - [crossbeam-epoch](https://docs.rs/crossbeam-epoch): deferred free of
//!     nodes in a lock-free data structure. A reader pins the epoch once
//!     instead of counting each object; a removed node is freed when every
//!     pinned thread has moved on. There is no per-object count, so nothing
//!     says that the last user of one object has left.
//!
//! # Quick start
//!
//! ```
//! use percpu_ref::owned::{Owner, Weak};
//! use std::collections::HashMap;
//! use std::sync::RwLock;
//!
//! let owner = Owner::new(vec![1u64, 2, 3]);
//!
//! // Each thread gets a counted reference. Cloning and dropping it touch
//! // only the current CPU's counter.
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let r = owner.get();
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
//!
//! // Lookups hold `Weak`s: they keep the allocation, not the value.
//! let table: RwLock<HashMap<u32, Weak<Vec<u64>>>> = RwLock::new(HashMap::new());
//! table.write().unwrap().insert(7, owner.downgrade());
//! let lookup = |id| table.read().unwrap().get(&id).and_then(Weak::tryget_live);
//! assert_eq!(lookup(7).map(|r| r.len()), Some(3));
//!
//! // Shut down. After kill no new live reference can be made, so lookups
//! // fail at once; references already held stay valid (and can still be
//! // cloned) until dropped. wait() returns the value after the last one.
//! let killed = owner.kill();
//! assert!(lookup(7).is_none());
//! table.write().unwrap().remove(&7);
//! for w in workers {
//!     assert_eq!(w.join().unwrap(), 6000);
//! }
//! assert_eq!(killed.wait(), vec![1, 2, 3]);
//! ```
//!
//! The same with the raw counter, where you count and `release` reports to
//! storage of your own:
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
//!                 if r.tryget_live() {
//!                     r.put();
//!                 }
//!             }
//!         })
//!     })
//!     .collect();
//! r.kill_sync().unwrap(); // drops the base reference; tryget_live fails from here on
//! for w in workers {
//!     w.join().unwrap();
//! }
//! assert_eq!(releases.load(Ordering::SeqCst), 1); // the last put released, once
//! ```
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
//! | `percpu_ref_kill` | [`kill`](PercpuRef::kill); [`kill_sync`](PercpuRef::kill_sync) | on a pinned ref, returns at once (dying; the grace-period engine completes it); or waits for the switch |
//! | `percpu_ref_kill_and_confirm` | [`kill_and_confirm`](PercpuRef::kill_and_confirm); [`kill_and_confirm_sync`](PercpuRef::kill_and_confirm_sync) | `confirm` runs on the engine thread; or has run on return |
//! | `percpu_ref_switch_to_atomic` | [`switch_to_atomic`](PercpuRef::switch_to_atomic), [`switch_to_atomic_and_confirm`](PercpuRef::switch_to_atomic_and_confirm); [`switch_to_atomic_and_confirm_sync`](PercpuRef::switch_to_atomic_and_confirm_sync) | sticky |
//! | `percpu_ref_switch_to_atomic_sync` | [`switch_to_atomic_sync`](PercpuRef::switch_to_atomic_sync) | |
//! | `percpu_ref_switch_to_percpu` | [`switch_to_percpu`](PercpuRef::switch_to_percpu) | needs `ALLOW_REINIT` |
//! | `percpu_ref_reinit` | [`reinit`](PercpuRef::reinit) | count must be zero |
//! | `percpu_ref_resurrect` | [`resurrect`](PercpuRef::resurrect) | must be dead |
//! | `percpu_ref_is_zero` | [`is_zero`](PercpuRef::is_zero) | |
//! | `percpu_ref_is_dying` | [`is_dying`](PercpuRef::is_dying) | |
//! | `__ref_is_percpu` | [`is_percpu`](PercpuRef::is_percpu) | |
//! | `rcu_barrier` (after kills) | [`flush`] | every deferred switch queued before it has completed |
//!
//! Where the kernel only warns on misuse, this crate returns an [`Error`]
//! and changes nothing (double kill, resurrect when not dead, reinit with a
//! count, going percpu without `ALLOW_REINIT`), or panics with a message
//! that names the operation and the count (underflow, get on a released
//! ref). It never releases twice and never lets the count wrap silently.
//!
//! **Which calls wait.** One rule, the kernel's, on every type: a call
//! returns at once unless its name says it waits. `_sync` marks the
//! waiting twin of a call that returns at once
//! ([`kill`](PercpuRef::kill) and [`kill_sync`](PercpuRef::kill_sync),
//! [`switch_to_atomic`](PercpuRef::switch_to_atomic) and
//! [`switch_to_atomic_sync`](PercpuRef::switch_to_atomic_sync)); a call
//! whose whole job is to wait is named for the wait ([`flush`],
//! [`Killed::wait`] and `wait_timeout`, [`Owner::freeze`] and
//! `freeze_timeout`, which waits for the references to drain as the block
//! layer's `blk_mq_freeze_queue` does). [`Owner::kill`] returns at once,
//! as [`PercpuRef::kill`] does; the [`Killed`] it returns is the wait.
//! Drops are the waits without a name: dropping a [`PercpuRef`] whose
//! deferred switch is still pending waits for the engine, and dropping an
//! [`Owner`] whose `T` has drop glue kills synchronously (`T` must be
//! dropped on the dropping thread); [`Owner::drop_deferred`] is that
//! drop's twin that returns at once.
//!
//! # Backends
//!
//! The per-CPU counters have two implementations behind one interface (see
//! [`Backend`] and the [`percpu`] module): restartable sequences on Linux
//! with glibc ≥ 2.35, on `x86_64` (no atomic instruction on the fast path)
//! and on `aarch64` with LSE atomics (one `stadd`, no exclusive loop, no
//! barrier), with `membarrier` as the grace period; and portable atomic
//! shards sealed by the switcher. Both keep a ref's counters in one per-CPU arena, 8 bytes
//! per possible CPU per ref, as the kernel's percpu allocator. The process picks one at first use;
//! [`backend()`] says which.
//!
//! # Features
//!
//! The core crate has one runtime dependency, on unix only: libc (rseq,
//! `membarrier`, `mmap`, `sysconf`, `pthread_atfork`).
//!
//! - **`css`** (off by default): [`css`], the cgroup
//!   `cgroup_subsys_state` lifecycle that `percpu_ref` was built for
//!   (mkdir, rmdir, kill, offline, release, free; tasks and charged
//!   pages), with the kernel's names, on [`PercpuRef`]. It adds
//!   crossbeam-epoch (the free one grace period after release, the RCU
//!   analogue) and arc-swap (the RCU-style `task->cgroups` pointer).
//!
//! # Performance
//!
//! What the cost depends on:
//!
//! - **get and put** on the rseq backend are a restartable sequence that
//!   ends in one plain `add` to this CPU's counter (aarch64: one LSE
//!   `stadd`): 22 instructions for a get + put pair and, on `x86_64`, no
//!   atomic instruction (CI counts them with callgrind on `x86_64` and in
//!   the disassembly on `aarch64`, and fails above 22; every time quoted
//!   here is `x86_64`'s). The counter is picked by the thread's
//!   `mm_cid` (Linux 6.3+) or its CPU ([`percpu::index`]), so a ref's
//!   memory grows with the threads that use it at once, not with every CPU
//!   they ran on. Nothing is shared between CPUs, so the
//!   cost per thread stays flat as threads on one object are added; an
//!   `Arc`'s shared count slows every core that touches it. The sharded
//!   backend (other targets) pays one atomic RMW on the thread's own shard.
//! - **atomic mode** (`INIT_ATOMIC`, or killed while users still hold
//!   references): each get, tryget and put is one unconditional atomic
//!   `fetch_add` or `fetch_sub` on the ref's shared counter, as the
//!   kernel's `rcuref_t`, with no compare-and-swap loop to retry under
//!   contention: about a bare atomic counter's cost on one thread, and as
//!   any shared counter, slower as threads contend for it (the mode word
//!   shares the counter's cache line, which costs a contended pair about
//!   twice a bare counter's).
//! - **a kill** needs one grace period: a `membarrier`, an interrupt to
//!   each CPU that runs a thread of the process (microseconds; more in a
//!   VM, where each is a VM exit). `kill_sync` and the other `_sync`
//!   switches wait for it, and those that overlap share one; `kill` and
//!   the other switches that return at once batch up to 4,096 per grace
//!   period.
//! - **memory**: 8 bytes per possible CPU per ref, backed only where a CPU
//!   has written, plus the `PercpuRef`, 64 bytes on 64-bit Linux (a
//!   compile-time assertion keeps that figure true).
//! - **create and drop** take a slot from, and give it back to, the
//!   thread's own cache of free slots (no lock, no atomic read-modify-write
//!   but once per 32): a ref's whole life, new + get + put + drop, is 142
//!   instructions on the rseq backend against 178 for `Arc::new` + clone +
//!   drop (callgrind; CI fails if it is more than `Arc`'s). The drop zeroes
//!   the ref's counter on every possible CPU, so that part grows with the
//!   machine (a load per possible CPU).
//!
//! Measured figures, beside `Arc`, arc-swap and crossbeam-epoch on the
//! same machine, with the machine and the commands; the kernel's 2013
//! copy-size table reproduced:
//! [docs/performance.md](https://docs.rs/crate/percpu-ref/latest/source/docs/performance.md).
//!
//! # Reliability
//!
//! What holds whatever safe code does (each item is tested;
//! [docs/reliability.md](https://docs.rs/crate/percpu-ref/latest/source/docs/reliability.md) names the tests):
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
//!   path). An add past `2^62 - 1` references panics as an overflow, as
//!   `Arc` aborts: a `_many` of `2^16` or more is refused and changes
//!   nothing; a smaller one in atomic mode (one unconditional add, as the
//!   kernel's `rcuref_t`) leaves the count *saturated*, for good. A put
//!   below zero in atomic mode panics as an underflow and changes nothing.
//!   Misuse the per-CPU counters hide (an underflow in percpu mode) is
//!   found by the next switch, which panics after completing. A saturated
//!   or misused ref is then *miscounted*: it never releases and stays
//!   atomic ([`Error::Miscounted`]).
//! - **A refused grace period changes nothing.** If the kernel refuses
//!   `membarrier` after start-up (a seccomp filter installed later, on one
//!   thread), the switch is undone before anything was summed:
//!   [`kill_sync`](PercpuRef::kill_sync) returns [`Error::GracePeriodFailed`] and
//!   [`switch_to_atomic_sync`](PercpuRef::switch_to_atomic_sync) panics, with the ref
//!   exactly as it was. A grace period serves the whole process, though:
//!   a switch on the blocked thread that another thread's grace period
//!   serves (one that started after the switch) completes normally.
//!
//! # Model-checking code that uses percpu-ref
//!
//! Code built on this crate can be checked with [loom] together with the
//! crate itself: under loom every atomic, lock and condition variable the
//! crate uses is loom's, so a model explores the interleavings of your
//! threads *and* of the crate's protocol (get, put, kill, the grace period,
//! release), and loom's checks (data races on `loom::cell`s, causality,
//! deadlocks) cover both.
//!
//! **What to set.** Build with `RUSTFLAGS="--cfg loom"` and add `loom =
//! "0.7"` to your own `[target.'cfg(loom)'.dev-dependencies]`; this crate
//! pulls its loom dependency only under that cfg. It must be loom 0.7,
//! this crate's: the primitives of one loom series cannot join a model
//! that another series runs. `--cfg loom` also switches every other crate
//! in the build that reads it; where one of
//! them must not switch (tokio reads bare `cfg(loom)` for its own tests),
//! give your code a cfg of its own and set `--cfg percpu_ref_loom`, which
//! switches this crate alone. Both are supported: bare `loom` selects
//! `percpu_ref_loom` (build.rs), so that a model of code that uses this
//! crate never runs it on `std`'s primitives where loom cannot see them.
//!
//! **What runs differently.** There is no background engine thread: a
//! deferred kill ([`Owner::kill`], dropping an [`Owner`],
//! [`PercpuRef::kill`]) is queued, and it completes (confirm, the
//! put of the base reference, `release`) at the first of a
//! `percpu_ref::loom_support::step()` on any model thread, [`flush`], or a
//! blocking wait for it ([`Killed::wait`], [`Killed::wait_timeout`], the
//! drop of a ref whose deferred switch is queued), which runs the queued
//! steps itself. Polling a [`Killed`] as a future does not step: a model
//! that awaits one spawns a thread that calls `step()`. To explore the
//! kill completing at every point of your threads' work, spawn one model
//! thread that calls `step()` once. The rseq fast path is not built under
//! loom: `Backend::Rseq` runs a model of it (a section is a critical
//! section that a grace period waits out), and the default backend is the
//! sharded one, which is the portable protocol itself.
//! `loom_support::live_blocks()` returns the owned layer's allocations not
//! yet freed in the execution: zero at the end of a model that dropped
//! everything and flushed, which checks for leaks loom does not report.
//!
//! **An example.** `examples/session-table` in the repository is a small
//! dependent (a table of live sessions: lookups by `Weak::tryget_live`,
//! close by kill, reopen of the id while requests are still inside the old
//! session) with two models and two deliberately broken variants, each
//! caught:
//!
//! ```text
//! cd examples/session-table
//! RUSTFLAGS="--cfg loom" cargo test --release --test model
//! RUSTFLAGS="--cfg loom" cargo test --release --test model --features broken_tryget
//! ```
//!
//! **What it costs.** Its two models (three threads: a request, a close
//! and reopen, the engine step; and two requests racing a close) explore
//! 19 and 174 executions at one preemption, 1,092 and 3,154 at two (the
//! example's default, 0.5 s for both on a 2-vCPU VM), and 14,356 and
//! 56,996 at three (7 s). Each operation of this crate is a handful of
//! loom operations (a `tryget_live` reads the mode and adds to a shard; a
//! kill takes the switch lock and queues), so a model of two or three
//! threads doing a few operations each stays in this range; a bound of 2
//! or 3 preemptions (`LOOM_MAX_PREEMPTIONS`) is what this crate's own
//! models use.
//!
//! **What loom cannot see.** Code that is not built under loom: the rseq
//! assembly and the kernel's part of it (the abort on preemption, the
//! `membarrier`), the per-CPU arena's memory, and the backend detection;
//! those are checked by the stress tests, the VM runner's kernels and
//! Miri instead
//! ([docs/reliability.md](https://docs.rs/crate/percpu-ref/latest/source/docs/reliability.md)).
//! loom does not treat a deallocation as an access, and its search is
//! bounded by the preemption count: a passing model is evidence, not proof.
//!
//! [loom]: https://docs.rs/loom
//!
//! # Limitations
//!
//! - `kill_sync` and the other `_sync` switches return after the grace
//!   period and `confirm`: a `membarrier` each on the rseq backend (shared
//!   by switches that overlap). `kill` and the other switches without the
//!   suffix return at once, on a pinned ref, and leave the grace period to
//!   the engine, which batches them; either way switches are meant to be
//!   rarer than gets and puts.
//! - In percpu mode an underflow cannot be seen until the next switch to
//!   atomic mode; it is then reported by a panic. So is an overflow made
//!   of more than 2^46 per-CPU calls; one of more than about 2^47 such
//!   calls between two switches would read as an underflow.
//! - Dropping a `PercpuRef` does not run `release` (as `percpu_ref_exit`).
//! - Threads that use a `PercpuRef` must be made by the C library
//!   (`pthread_create`) or by `std::thread`: the rseq fast path relies on
//!   the rseq area glibc registers for each such thread, and a thread made
//!   with a raw `clone` system call could commit a per-CPU add on the
//!   wrong CPU. This cannot be detected cheaply.
//!
// The `css` module exists only with the `css` feature; without it the
// crate docs link to its page on docs.rs (built with every feature), so
// that `cargo doc` has no broken intra-doc link either way.
#![cfg_attr(feature = "css", doc = "[`css`]: crate::css")]
#![cfg_attr(
    not(feature = "css"),
    doc = "[`css`]: https://docs.rs/percpu-ref/latest/percpu_ref/css/"
)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// Lints the library follows beyond rustc's and clippy's defaults (CI runs
// clippy with `-D warnings`; Cargo.toml adds `undocumented_unsafe_blocks`):
// all of clippy's pedantic group. For users that means `#[must_use]` on
// every result that must not be dropped (with the reason where dropping
// leaks or loses something), `# Panics` and `# Errors` sections, no silent
// truncating or sign-losing casts, and identifiers in backticks in docs.
// Exceptions are item-level `allow`s with a `reason`, plus one crate-wide:
// `inline_always`, because the fast path's inlining is measured
// (scripts/callgrind-pair counts its instructions) rather than left to the
// optimizer's heuristics. Tests, benches and examples are not held to
// pedantic (the lint block is the library's, not Cargo.toml's); neither are
// the unit tests, hence the `cfg(test)` allow: the library's own code is
// still checked by the non-test build that `--all-targets` also lints.
#![warn(clippy::pedantic)]
#![allow(clippy::inline_always)]
#![cfg_attr(test, allow(clippy::pedantic))]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod mutant;

mod atomic_mode;
#[cfg(feature = "css")]
#[cfg_attr(docsrs, doc(cfg(feature = "css")))]
pub mod css;
mod flags;
#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
mod fork;
mod grace;
pub mod owned;
pub mod percpu;
mod percpu_ref;
mod sync;

#[cfg(doctest)]
mod readme_doctests;

pub use flags::{Error, InitFlags};
pub use owned::{FreezeTimeout, Frozen, Killed, Owner, Ref, Weak};
pub use percpu::{backend, possible_cpus, Backend};
pub use percpu_ref::{flush, PercpuRef};

/// What a loom model needs beyond the API, in loom builds only (`--cfg
/// percpu_ref_loom` or `--cfg loom`), where the grace-period engine has no
/// thread and is driven by [`step`](crate::loom_support::step). When a
/// deferred kill completes there, and what a model must do about it: the
/// crate docs' *Model-checking code that uses percpu-ref*.
#[cfg(percpu_ref_loom)]
pub mod loom_support {
    /// Takes the engine's queue as one batch, runs its grace period and
    /// completes it (confirms, puts, releases) on the calling thread, as
    /// the engine thread does; false when the queue was empty. Steps run
    /// one at a time: a step on another thread waits for this one.
    ///
    /// A model spawns a loom thread that calls it to explore the engine
    /// completing a kill concurrently with the model's other threads.
    #[allow(
        clippy::must_use_candidate,
        reason = "models call it for its effect and may ignore the result"
    )]
    pub fn step() -> bool {
        crate::grace::loom_step()
    }

    /// How many grace periods have started in this execution.
    #[must_use]
    pub fn grace_periods() -> u64 {
        crate::grace::started()
    }

    /// The owned layer's blocks (an [`Owner`](crate::Owner)'s allocation,
    /// shared with its [`Ref`](crate::Ref)s and [`Weak`](crate::Weak)s)
    /// allocated and not yet freed in this execution. Zero at the end of a
    /// model whose handles were all dropped and whose kills all completed
    /// ([`flush`](crate::flush)): anything else is a leak, which loom does
    /// not report by itself.
    #[must_use]
    pub fn live_blocks() -> usize {
        crate::owned::live_blocks()
    }
}
