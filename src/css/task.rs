//! Tasks, `css_set`s and charges.
//!
//! A task points at its [`CssSet`] (one css per subsystem) through an
//! [`ArcSwap`]: the kernel's RCU-protected `task->cgroups`. Readers load it
//! without locks; `attach` swaps in a new set under `cgroup_mutex`, and the
//! old set's references are put when its last reader drops it.
//!
//! [`Pages`] are memcg-style charges: each charged page holds one reference
//! on the css it is charged to, so a removed cgroup's css stays (offline)
//! until its last page is uncharged or moved away.
//!
//! The top layer of the css model: [`Hierarchy::spawn`] and
//! [`Hierarchy::attach`] are here, beside the task they make and move, on
//! the hierarchy's API (`hierarchy.rs`) and the references (`refs.rs`).

use super::destroy::css_put;
use super::error::CgroupError;
use super::graph::{Cgroup, Css, CssPtr};
use super::hierarchy::Hierarchy;
use super::panics::CallbackPanics;
use super::refs::CssRef;
use crate::sync::Ordering;
use arc_swap::ArcSwap;
use std::fmt;
use std::sync::Arc;

/// A task's csses, one per subsystem, each held by a reference.
pub struct CssSet {
    cgroup: Cgroup,
    csses: Vec<CssRef>,
}

impl CssSet {
    fn new(cgroup: Cgroup, csses: Vec<CssRef>) -> CssSet {
        CssSet { cgroup, csses }
    }

    /// The cgroup these csses belong to.
    #[must_use]
    pub fn cgroup(&self) -> &Cgroup {
        &self.cgroup
    }

    /// The css of subsystem `ssid` (`task_css`).
    ///
    /// # Panics
    ///
    /// If `ssid` is not a subsystem of the hierarchy.
    #[must_use]
    pub fn css(&self, ssid: usize) -> &Css {
        match self.csses.get(ssid) {
            Some(c) => c,
            None => panic!(
                "CssSet::css({ssid}): the hierarchy has {} subsystems",
                self.csses.len()
            ),
        }
    }
}

impl fmt::Debug for CssSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CssSet")
            .field("cgroup", &self.cgroup.path())
            .finish_non_exhaustive()
    }
}

/// A task: a pointer to its `css_set`. Made by
/// [`Hierarchy::spawn`](super::Hierarchy::spawn), moved by
/// [`Hierarchy::attach`](super::Hierarchy::attach); dropping it is the
/// task's exit.
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Hierarchy, Pages, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("memory")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let task = h.spawn(&a).unwrap();
/// let mut pages = Pages::new();
/// pages.charge_task(&task, 0, 16); // a page fault charging 16 pages to /a
/// assert_eq!(task.cgroup().path(), "/a");
/// h.attach(&task, &h.root()).unwrap();
/// h.rmdir(&a).unwrap(); // the pages still pin /a's css (offline, not freed)
/// assert_eq!(h.nr_css(), 1);
/// pages.uncharge(16);
/// assert!(h.flush());
/// assert_eq!(h.nr_css(), 0);
/// ```
pub struct Task {
    hid: u64,
    cgroups: ArcSwap<CssSet>,
}

impl Task {
    fn new(hid: u64, set: Arc<CssSet>) -> Task {
        Task {
            hid,
            cgroups: ArcSwap::new(set),
        }
    }

    fn hid(&self) -> u64 {
        self.hid
    }

    fn swap_css_set(&self, set: Arc<CssSet>) -> Arc<CssSet> {
        self.cgroups.swap(set)
    }

    /// The task's current `css_set` (an RCU-style read: it may be replaced
    /// meanwhile, and stays valid while the guard is held).
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::css::{Hierarchy, Recorder};
    /// let h = Hierarchy::new(vec![Recorder::new("memory")]);
    /// let task = h.spawn(&h.root()).unwrap();
    /// let set = task.css_set();
    /// assert_eq!(set.css(0).cgroup_path(), "/");
    /// ```
    #[must_use = "the guard is the read: the set it holds may be replaced as soon as it is dropped"]
    pub fn css_set(&self) -> CssSetGuard {
        CssSetGuard(self.cgroups.load())
    }

    /// The task's cgroup.
    #[must_use]
    pub fn cgroup(&self) -> Cgroup {
        self.cgroups.load().cgroup().clone()
    }

    /// A reference on the task's css for `ssid` (`task_get_css`).
    ///
    /// # Panics
    ///
    /// If `ssid` is not a subsystem of the hierarchy.
    #[must_use = "dropping the reference at once puts it again"]
    pub fn get_css(&self, ssid: usize) -> CssRef {
        self.cgroups.load().css(ssid).get()
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let set = self.cgroups.load();
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        set.cgroup()
            .nr_tasks_counter()
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A read of a task's `css_set`, from [`Task::css_set`]: the set as it was
/// when read, kept alive while the guard is held (`rcu_read_lock` +
/// `task_css_set`). Dereferences to the `Arc<CssSet>`.
///
/// Hold it briefly: it may pin the set's memory past a migration, and some
/// guards hold a slot that other readers could use (the pointer is an
/// arc-swap `ArcSwap`, which this type wraps so that arc-swap stays out of
/// the public API).
#[must_use = "the guard is the read: the set it holds may be replaced as soon as it is dropped"]
pub struct CssSetGuard(arc_swap::Guard<Arc<CssSet>>);

impl std::ops::Deref for CssSetGuard {
    type Target = Arc<CssSet>;

    fn deref(&self) -> &Arc<CssSet> {
        &self.0
    }
}

impl fmt::Debug for CssSetGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self.0, f)
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("cgroup", &self.cgroup().path().to_string())
            .finish()
    }
}

/// Charged pages: each page holds one reference on the css it is charged
/// to (the memcg model: `css_get` per page on charge, `css_put` on
/// uncharge, `get_many`/`put_many` when charges move).
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Hierarchy, Pages, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("memory")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let b = h.mkdir(&h.root(), "b").unwrap();
/// let (ca, cb) = (a.css(0).unwrap(), b.css(0).unwrap());
/// let mut pages = Pages::new();
/// pages.charge(&ca, 100);
/// assert_eq!(pages.move_charge(&ca, &cb), 100);
/// assert_eq!(pages.charged_to(&cb), 100);
/// ```
#[derive(Default)]
pub struct Pages {
    /// Each page's css; every entry holds one reference.
    owners: Vec<CssPtr>,
}

impl Pages {
    /// No pages.
    #[must_use]
    pub fn new() -> Pages {
        Pages::default()
    }

    /// Pages charged.
    #[must_use]
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether no page is charged.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Charges `n` pages to `css` with one `css_get_many(n)`.
    ///
    /// Room for the pages is reserved first, so a charge that cannot be
    /// stored panics before it takes any reference.
    ///
    /// # Panics
    ///
    /// If `css` was released (get on a zero count), or `n` pages do not
    /// fit in memory; nothing is charged then.
    pub fn charge(&mut self, css: &Css, n: usize) {
        if let Err(e) = self.owners.try_reserve(n) {
            panic!("Pages::charge({n}): cannot store the pages: {e}");
        }
        css.get_raw(n);
        let p = CssPtr::from_raw(std::ptr::from_ref(css).cast_mut())
            .expect("a reference is never null");
        // Within the reserved capacity: no allocation, no panic.
        self.owners.extend(std::iter::repeat_n(p, n));
    }

    /// Charges `n` pages to `task`'s css of subsystem `ssid` (the page
    /// fault path: read `task->cgroups`, `css_get` under it).
    pub fn charge_task(&mut self, task: &Task, ssid: usize, n: usize) {
        let set = task.css_set();
        self.charge(set.css(ssid), n);
    }

    /// Uncharges the last `n` pages (fewer if fewer are charged), one
    /// `css_put_many` per run of pages on the same css; returns how many.
    ///
    /// # Panics
    ///
    /// With the first panic of a subsystem callback run by a release these
    /// puts caused, once every page was uncharged.
    pub fn uncharge(&mut self, n: usize) -> usize {
        let n = n.min(self.owners.len());
        let mut left = n;
        let mut panics = CallbackPanics::default();
        while left > 0 {
            let last = *self.owners.last().expect("left <= len");
            let mut run = 0;
            while run < left && self.owners.last() == Some(&last) {
                self.owners.pop();
                run += 1;
            }
            // Caught, so that the remaining pages are uncharged too.
            // SAFETY: the `run` pages' references, given up here (their
            // entries are gone).
            panics.call(|| unsafe { css_put(last, run) });
            left -= run;
        }
        panics.resume();
        n
    }

    /// Pages charged to `css`.
    #[must_use]
    pub fn charged_to(&self, css: &Css) -> usize {
        let p = std::ptr::from_ref(css).cast_mut();
        self.owners.iter().filter(|o| o.as_ptr() == p).count()
    }

    /// Moves every page charged to `from` over to `to`, as memcg's
    /// `mem_cgroup_move_charge`: count the pages and precharge `to` with one
    /// `css_get_many`, move each page, then `css_put_many` on `from`.
    /// Returns how many moved.
    ///
    /// # Panics
    ///
    /// If `to` was released.
    pub fn move_charge(&mut self, from: &Css, to: &Css) -> usize {
        let from_p = std::ptr::from_ref(from).cast_mut();
        let to_p = CssPtr::from_raw(std::ptr::from_ref(to).cast_mut()).expect("never null");
        if from_p == to_p.as_ptr() {
            return 0;
        }
        let count = self.charged_to(from);
        if count == 0 {
            return 0;
        }
        to.get_raw(count);
        for o in &mut self.owners {
            if o.as_ptr() == from_p {
                *o = to_p;
            }
        }
        let from_p = CssPtr::from_raw(from_p).expect("never null");
        // SAFETY: the `count` references of the pages just moved away. The
        // caller's `from` stays valid: if these were the last references,
        // the caller found `from` under an RCU read section (any other way
        // to a `&Css` holds a reference), which holds off the free.
        unsafe { css_put(from_p, count) };
        count
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        self.uncharge(self.owners.len());
    }
}

impl fmt::Debug for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pages").field("len", &self.len()).finish()
    }
}

// `spawn` and `attach` are the hierarchy's, but they make and move tasks:
// here, the hierarchy's API needs no word of tasks, and what a task is
// stays private to this file.
impl Hierarchy {
    /// Makes a task in `cg` (its `css_set` takes a reference on each css).
    ///
    /// # Errors
    ///
    /// [`CgroupError::Removed`] if `cg` was removed;
    /// [`CgroupError::WrongHierarchy`].
    ///
    /// # Panics
    ///
    /// If called from a subsystem callback of this hierarchy (this thread
    /// holds `cgroup_mutex`: it would deadlock), and with the first panic
    /// of a subsystem callback that the step ran, once the step is complete
    /// (see [`Subsys`](super::Subsys), *Panics in callbacks*).
    pub fn spawn(&self, cg: &Cgroup) -> Result<Task, CgroupError> {
        let inner = &self.inner;
        self.check("spawn", cg)?;
        inner.locked("spawn", |_| {
            let set = Self::css_set_locked("spawn", cg)?;
            // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
            cg.node.nr_tasks.fetch_add(1, Ordering::Relaxed);
            Ok(Task::new(inner.hid, set))
        })
    }

    /// `cgroup_attach_task`: moves `task` to `cg`, swapping its `css_set`
    /// (readers holding the old set keep its references until they drop
    /// it).
    ///
    /// # Errors
    ///
    /// [`CgroupError::Removed`] if `cg` was removed;
    /// [`CgroupError::WrongHierarchy`].
    ///
    /// # Panics
    ///
    /// If called from a subsystem callback of this hierarchy (this thread
    /// holds `cgroup_mutex`: it would deadlock), and with the first panic
    /// of a subsystem callback that the step ran, once the step is complete
    /// (see [`Subsys`](super::Subsys), *Panics in callbacks*).
    pub fn attach(&self, task: &Task, cg: &Cgroup) -> Result<(), CgroupError> {
        let inner = &self.inner;
        self.check("attach", cg)?;
        if task.hid() != inner.hid {
            return Err(CgroupError::WrongHierarchy {
                op: "attach",
                path: task.cgroup().path().to_string(),
            });
        }
        let old = inner.locked("attach", |_| {
            let set = Self::css_set_locked("attach", cg)?;
            // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
            cg.node.nr_tasks.fetch_add(1, Ordering::Relaxed);
            let old = task.swap_css_set(set);
            // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
            old.cgroup()
                .nr_tasks_counter()
                .fetch_sub(1, Ordering::Relaxed);
            Ok(old)
        })?;
        drop(old); // puts the old csses, outside the mutex
        Ok(())
    }

    fn css_set_locked(op: &'static str, cg: &Cgroup) -> Result<Arc<CssSet>, CgroupError> {
        if !cg.is_online() {
            return Err(CgroupError::Removed {
                op,
                path: cg.path().to_string(),
            });
        }
        let csses = cg
            .node
            .subsys
            .iter()
            .map(|slot| {
                // ordering-audit: Relaxed: the slot is written under cgroup_mutex, which we hold.
                let p = CssPtr::from_raw(slot.load(Ordering::Relaxed))
                    .expect("an online cgroup has an online css per subsystem");
                // SAFETY: online under cgroup_mutex: the base reference is held.
                unsafe { p.get() }.get()
            })
            .collect();
        Ok(Arc::new(CssSet::new(cg.clone(), csses)))
    }
}
