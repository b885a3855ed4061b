//! How a hierarchy is set up: the [`Options`] of
//! [`Hierarchy::with_options`](super::Hierarchy::with_options).
//!
//! A leaf of the css model (it names no other file of it): the shared
//! state in `graph.rs` keeps the options, and the lifecycle
//! (`create.rs`, `destroy.rs`) reads them.

/// How a hierarchy's csses count references.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RefcntMode {
    /// Per-CPU until killed: the kernel since 2013.
    #[default]
    Percpu,
    /// One shared atomic counter from the start (`PercpuRef` with
    /// `INIT_ATOMIC`): the pre-2013 css's `atomic_t`, with the same
    /// lifecycle code. For comparisons.
    Atomic,
}

/// When queued destroy work (offline, release, free) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WorkMode {
    /// As soon as `cgroup_mutex` is free (see the module docs).
    #[default]
    Inline,
    /// Only in [`Hierarchy::run_destroy_work`] and [`Hierarchy::flush`].
    ///
    /// [`Hierarchy::run_destroy_work`]: super::Hierarchy::run_destroy_work
    /// [`Hierarchy::flush`]: super::Hierarchy::flush
    Manual,
}

/// Options for [`Hierarchy::with_options`](super::Hierarchy::with_options).
#[derive(Clone, Debug)]
pub struct Options {
    /// Per-CPU or atomic css refcounts.
    pub refcnt: RefcntMode,
    /// When destroy work runs.
    pub work: WorkMode,
    /// Size of each subsystem's id table (ids `1..max_css_ids`); at most
    /// 2^32, as ids are `u32`.
    pub max_css_ids: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            refcnt: RefcntMode::Percpu,
            work: WorkMode::Inline,
            max_css_ids: 1 << 16,
        }
    }
}
