//! The cgroup css lifecycle (kernel/cgroup/cgroup.c) on [`PercpuRef`].
//!
//! In 2013 the kernel converted `cgroup_subsys_state` (css) reference
//! counts to `percpu_ref`, because blkcg and memcg take and drop css
//! references several times per I/O and per page. This module models that
//! lifecycle faithfully, with the kernel's names.
//!
//! # The model
//!
//! A [`Hierarchy`] has a fixed list of [`Subsys`]tems and a tree of
//! [`Cgroup`]s; each cgroup has one [`Css`] per subsystem. A css counts
//! references in a [`PercpuRef`]; the root css is not counted
//! (`CSS_NO_REF`). References are [`CssRef`] (`css_get`/`css_put`),
//! [`CssRefs`] (`css_get_many`/`css_put_many`), `tryget`
//! (`css_tryget`) and `tryget_online` (`css_tryget_online`).
//!
//! # The lifecycle, as the kernel does it
//!
//! 1. **mkdir** (`css_create`, under `cgroup_mutex`): allocate
//!    (`css_alloc`), pin the parent css (`css_get(parent)`), link to the
//!    parent's children, online it (`online_css`: `css_online`, set
//!    `CSS_ONLINE`, publish in `cgroup->subsys[]`, `online_cnt += 1` on the
//!    css and on its parent), publish in the id table.
//! 2. **rmdir** (`cgroup_destroy_locked`): refused while the cgroup has
//!    tasks or children; else mark the cgroup offline and `kill_css` each
//!    css: set `CSS_DYING`, take an extra reference, and
//!    `percpu_ref_kill_and_confirm(css_killed_ref_fn)`.
//! 3. **confirm** (`css_killed_ref_fn`): from now on no
//!    `css_tryget_online` succeeds. `online_cnt -= 1`; if that was the
//!    last, queue `css_killed_work_fn`.
//! 4. **offline** (`css_killed_work_fn`): `offline_css` (`css_offline`,
//!    clear `CSS_ONLINE`, unpublish from `cgroup->subsys[]`), drop the
//!    kill's extra reference, then walk up: the parent's `online_cnt -= 1`,
//!    and if it reaches zero (the parent is dying and this was its last
//!    online child) offline the parent too. A parent is therefore offlined
//!    only after all its children.
//! 5. **release** (`css_release` → `css_release_work_fn`), when the count
//!    reaches zero: set `CSS_RELEASED`, unlink from the parent's children
//!    and the id table, `css_released`, and `queue_rcu_work`.
//! 6. **free** (`css_free_rwork_fn`), a grace period later: `css_free`,
//!    free the memory and the id, and put the parent. A parent is therefore
//!    released, and freed, only after all its children were freed.
//!
//! States: online → dying → offline → released → freed ([`CssState`],
//! the [`Subsys`] callbacks, [`Hierarchy::nr_css`]).
//!
//! # Invariants
//!
//! - Each callback runs exactly once per css, in the order above.
//! - A css is released only after it was offlined: the kill's extra
//!   reference is dropped by the offline work.
//! - `online_cnt` = 1 while the css itself is not killed, plus one per
//!   child css not yet offline; the offline work runs when it reaches 0.
//! - A css is freed only after every child css was freed (the child's pin).
//! - RCU-visible pointers (the id table, `cgroup->subsys[]`) are cleared
//!   before release, and the memory is freed a grace period after release,
//!   so [`Hierarchy::css_from_id`] under an [`RcuGuard`] followed by
//!   [`Css::tryget_online`] never touches freed memory.
//! - All destroy work runs under `cgroup_mutex` (see [`hierarchy`'s
//!   docs](Hierarchy)), so no css is freed while another thread holds it.
//!
//! # What runs where
//!
//! The kernel runs `css_killed_work_fn`, `css_release_work_fn` and
//! `css_free_rwork_fn` on a workqueue that takes `cgroup_mutex`. Here the
//! confirm runs synchronously inside `rmdir` (with the ref's switch lock
//! held, and `cgroup_mutex`), so it only counts and queues, as the kernel's
//! does; the queued work runs when `rmdir` unlocks. A release can happen on
//! any thread's last put, so `css_release` too only queues; that work runs
//! at once if `cgroup_mutex` is free, else its holder runs it before
//! unlocking. The grace period is crossbeam-epoch's (see `rcu.rs`).
//! [`WorkMode::Manual`] holds all work until
//! [`Hierarchy::run_destroy_work`].
//!
//! # Tasks and charges
//!
//! A [`Task`] points at a [`CssSet`] through `arc-swap` (the RCU-protected
//! `task->cgroups`); [`Hierarchy::attach`] swaps it. A css_set holds a
//! reference on each of its csses. [`Pages`] are memcg charges: one
//! reference per page, moved between cgroups with `get_many`/`put_many`.
//!
//! # Example
//!
//! ```
//! use percpu_ref::css::{EventKind, Hierarchy, Pages, Recorder};
//! let rec = Recorder::new("memory");
//! let h = Hierarchy::new(vec![rec.clone()]);
//! let a = h.mkdir(&h.root(), "a").unwrap();
//! let b = h.mkdir(&a, "b").unwrap();
//! let task = h.spawn(&b).unwrap();
//! let mut pages = Pages::new();
//! pages.charge_task(&task, 0, 8);
//! h.attach(&task, &h.root()).unwrap();
//! h.rmdir(&b).unwrap();
//! h.rmdir(&a).unwrap();
//! drop(pages); // the last references on /a/b's css
//! assert!(h.flush());
//! let order: Vec<(EventKind, String)> = rec
//!     .events()
//!     .into_iter()
//!     .filter(|e| e.kind >= EventKind::Offline)
//!     .map(|e| (e.kind, e.path))
//!     .collect();
//! use EventKind::*;
//! let p = |k, s: &str| (k, s.to_string());
//! assert_eq!(order, [
//!     p(Offline, "/a/b"), p(Offline, "/a"),
//!     p(Released, "/a/b"), p(Free, "/a/b"), p(Released, "/a"), p(Free, "/a"),
//! ]);
//! ```

mod hierarchy;
mod idr;
mod rcu;
mod subsys;
mod subsys_state;
mod task;

pub use hierarchy::{BusyReason, Cgroup, CgroupError, Hierarchy, Options, RefcntMode, WorkMode};
pub use rcu::RcuGuard;
pub use subsys::{Event, EventKind, EventLog, Recorder, Subsys};
pub use subsys_state::{Css, CssRef, CssRefs, CssState};
pub use task::{CssSet, Pages, Task};

#[cfg(doc)]
use crate::PercpuRef;
