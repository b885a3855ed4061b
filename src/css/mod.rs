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
//! references in a [`PercpuRef`], the root css included (unlike the
//! kernel's `CSS_NO_REF` root; see *What keeps the root alive*).
//! References are [`CssRef`] (`css_get`/`css_put`), [`CssRefs`]
//! (`css_get_many`/`css_put_many`), `tryget` (`css_tryget`) and
//! `tryget_online` (`css_tryget_online`). Every handle that can be
//! dereferenced holds a reference, whatever it counts: a [`CssRefs`]
//! holding zero of its references still holds one of its own.
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
//!    `percpu_ref_kill_and_confirm(css_killed_ref_fn)`. The kill is
//!    asynchronous, as in the kernel
//!    ([`PercpuRef::kill_and_confirm`]): `rmdir` returns with the
//!    css dying (no `css_tryget_online` succeeds), and the process's
//!    grace-period engine completes the switch later (within about a
//!    millisecond); [`Hierarchy::flush`] waits for it.
//! 3. **confirm** (`css_killed_ref_fn`, on the engine thread once the kill
//!    completed): `online_cnt -= 1`; if that was the last, queue
//!    `css_killed_work_fn`.
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
//! - All destroy work of non-root csses runs under `cgroup_mutex` (see
//!   [`hierarchy`'s docs](Hierarchy)), so no css is freed while another
//!   thread holds it.
//! - No css is freed while a `PercpuRef` call that released it is still
//!   running (see *What runs where*).
//!
//! # What runs where
//!
//! The kernel never frees in release context: `css_release` only queues
//! `css_release_work_fn`, which runs on a workqueue that takes
//! `cgroup_mutex`, and the free (`css_free_rwork_fn`) runs from there a
//! grace period later. Here:
//!
//! - **confirm** (`css_killed_ref_fn`) runs on the grace-period engine's
//!   thread, inside the engine's `PercpuRef` call that completes the kill
//!   (as the kernel's runs from an RCU callback), without `cgroup_mutex`:
//!   it only counts (`online_cnt`, an atomic that the children's offline
//!   work also decrements under the mutex: whoever reaches zero queues the
//!   offline) and asks the engine to queue the offline work once it is
//!   done with the css. It never takes `cgroup_mutex` (a thread holding it
//!   may wait for the engine). The engine then runs the queue if the mutex
//!   is free, like any thread that queues work. With
//!   [`RefcntMode::Atomic`] no grace period is needed: the kill completes
//!   inside `rmdir`, which holds the mutex, and the confirm only queues.
//! - **release** by the engine's put (the kill's own, when nothing else
//!   held the css) is handed on by the engine in the same way, once its
//!   call has returned.
//! - **release** (`css_release`) runs inside the `PercpuRef` call that put
//!   the last reference, on whichever thread made it, while that call
//!   still borrows the css (its `&self`, and the release closure stored in
//!   it). So it does no work at all: it records the css in a per-thread
//!   slot. Every put goes through one wrapper (a [`CssRef`]'s drop,
//!   [`CssRefs`], [`Pages`], the offline work's and the free's puts,
//!   `kill_css`), which hands the release on to the hierarchy's destroy
//!   queue once the `PercpuRef` call has returned. Until then no other
//!   thread knows the css was released, so nothing can free it under the
//!   call: not destroy work run on this thread (nested, through a
//!   subsystem's `css_released` putting another css), nor on another.
//! - **queued work** (offline, release, free) runs under `cgroup_mutex`,
//!   from a clean stack: when the thread holding the mutex unlocks (at the
//!   end of `mkdir`, `rmdir`, `attach`, `spawn`, `run_destroy_work`,
//!   `flush`), or at once on the thread that queued it if the mutex is
//!   free. A thread that finds it held leaves the work to the holder, who
//!   looks at the queue again after unlocking.
//! - **free** is queued a grace period after the release work unpublished
//!   the css (crossbeam-epoch's; see `rcu.rs`); the grace-period callback
//!   queues it and runs the queue if the mutex is free.
//!
//! [`WorkMode::Manual`] holds all work until [`Hierarchy::run_destroy_work`]
//! (or [`Hierarchy::flush`]); the offline work of a `rmdir` is only queued
//! once its kill completed ([`crate::flush`] waits for that).
//!
//! # What keeps the root alive
//!
//! The kernel's root csses are not reference counted (`CSS_NO_REF`): they
//! live as long as the kernel. Here a hierarchy can be dropped while
//! handles on its root remain, so a root css is counted per CPU like any
//! css (a get or put on it costs the same):
//!
//! - the hierarchy holds each root css's base reference; every non-root
//!   css pins its parent and holds the hierarchy, so the hierarchy lives
//!   until its last handle is dropped and every non-root css was freed;
//! - a [`CssRef`] or [`CssRefs`] on the root, a [`Task`] in the root
//!   cgroup (its `css_set`) and [`Pages`] charged to the root each hold
//!   references;
//! - when the hierarchy goes, each root css is taken down: its slot in
//!   the root cgroup is cleared, `css_offline` runs, and the base
//!   reference is dropped. The last put, then or later, releases the root
//!   css and frees it at once, on that thread (`css_released`,
//!   `css_free`). No grace period is needed: the id table went with the
//!   hierarchy (what [`Hierarchy::css_from_id`] returns borrows the
//!   hierarchy handle, so it cannot outlive it), and [`Cgroup::css`] on the
//!   root reads the slot under a lock that the teardown takes to clear it.
//!   A root [`Cgroup`] handle keeps the cgroup, not its csses: its `css()`
//!   finds nothing once the hierarchy is gone.
//!
//! # Panics
//!
//! A panicking subsystem callback does not leave the hierarchy
//! half-changed: the lifecycle step completes, `cgroup_mutex` is released
//! (also when unwinding), and the panic then propagates to the caller that
//! ran the step (see [`Subsys`], *Panics in callbacks*). [`Pages::charge`]
//! reserves room for the pages before it takes their references.
//!
//! # Puts that race with a free
//!
//! A put that is *not* the last one can still be running when another
//! thread puts the last reference and the css is freed (a non-root css a
//! grace period later, which does not wait for that thread). The kernel
//! closes this window by running every put inside an RCU read section;
//! here that would cost an epoch pin per put, on the fast path this crate
//! exists for. Instead every css put goes through a `PercpuRef` put that
//! holds no borrow of the ref across its decrement (as
//! `Arc::decrement_strong_count`), so the free never happens under a live
//! borrow.
//!
//! # Tasks and charges
//!
//! A [`Task`] points at a [`CssSet`] through `arc-swap` (the RCU-protected
//! `task->cgroups`); [`Hierarchy::attach`] swaps it. A `css_set` holds a
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
//! percpu_ref::flush(); // the kills completed: both csses are offline
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

// The files in layers, bottom to top; a file names (`use super::...`)
// only files of the layers below its own, and says in its module docs
// what it holds (docs/css.md, *The code*; docs/contributing.md gives the
// `grep` that shows there is no circle):
//
//   rcu, idr, panics, options, error -> graph -> destroy -> create
//   -> refs, recorder -> hierarchy -> task
mod create;
mod destroy;
mod error;
mod graph;
mod hierarchy;
mod idr;
mod options;
mod panics;
mod rcu;
mod recorder;
mod refs;
mod task;

pub use error::{BusyReason, CgroupError};
pub use graph::{Cgroup, Css, CssState, Subsys};
pub use hierarchy::Hierarchy;
pub use options::{Options, RefcntMode, WorkMode};
pub use rcu::RcuGuard;
pub use recorder::{Event, EventKind, EventLog, Recorder};
pub use refs::{CssRef, CssRefs};
pub use task::{CssSet, CssSetGuard, Pages, Task};

#[cfg(doc)]
use crate::percpu_ref::PercpuRef;
