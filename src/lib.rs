// The crate docs are the README, so that the front page on GitHub and on
// docs.rs is one text; its Rust code blocks are this crate's doctests, and
// its links are absolute (docs.rs) so that they work in both places.
#![doc = include_str!("../README.md")]
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
pub mod shared;
mod sync;

pub use flags::{Error, InitFlags};
pub use grace::{batch_delay, set_batch_delay, DEFAULT_BATCH_DELAY, MAX_BATCH_DELAY};
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
    /// and the [`Shared`](crate::shared::Shared) blocks
    /// allocated and not yet freed in this execution. Zero at the end of a
    /// model whose handles were all dropped and whose kills all completed
    /// ([`flush`](crate::flush)): anything else is a leak, which loom does
    /// not report by itself.
    #[must_use]
    pub fn live_blocks() -> usize {
        crate::owned::live_blocks()
    }

    /// A [`Shared`](crate::shared::Shared) on `backend` (under loom the
    /// default backend is the sharded one, on which a value is never
    /// promoted; `Backend::Rseq` is the loom model of the rseq backend).
    pub fn shared_on<T: Send + 'static>(
        value: T,
        backend: crate::Backend,
    ) -> crate::shared::Shared<T> {
        crate::shared::Shared::new_on(value, backend)
    }

    /// A `Shared<[T]>` of `v`'s elements on `backend`, as [`shared_on`].
    #[must_use]
    pub fn shared_slice_on<T: Send + 'static>(
        v: Vec<T>,
        backend: crate::Backend,
    ) -> crate::shared::Shared<[T]> {
        crate::shared::slice_from_vec_on(v, backend)
    }

    /// [`Shared::new_cyclic`](crate::shared::Shared::new_cyclic) on
    /// `backend`, as [`shared_on`].
    pub fn shared_cyclic_on<T: Send + 'static>(
        data_fn: impl FnOnce(&crate::shared::Weak<T>) -> T,
        backend: crate::Backend,
    ) -> crate::shared::Shared<T> {
        crate::shared::Shared::cyclic_on(data_fn, backend)
    }
}
