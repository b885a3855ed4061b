//! The API on top of the css model: [`Hierarchy`] and its operations
//! (`mkdir`, `rmdir`, `css_from_id`, `run_destroy_work`, `flush`).
//!
//! Each operation checks its arguments, takes `cgroup_mutex` and calls the
//! kernel's lifecycle functions (`create.rs`, `destroy.rs`); releasing the
//! mutex runs the destroy work queued meanwhile. The types they act on are
//! in `graph.rs`. Tasks, which the hierarchy's `spawn` and `attach` make and
//! move, are a layer above this one (`task.rs`).

use super::create::{create_root_css, css_create};
use super::destroy::kill_css;
use super::error::{BusyReason, CgroupError};
use super::graph::{Cgroup, CgroupNode, Css, CssPtr, Inner, Subsys};
use super::options::Options;
use super::panics::CallbackPanics;
use super::rcu::{self, RcuGuard};
use crate::sync::unmodeled::AtomicU64;
use crate::sync::{self, Ordering};
use std::fmt;
use std::sync::Arc;

static NEXT_HIERARCHY: AtomicU64 = AtomicU64::new(1);

/// A cgroup hierarchy with a fixed set of subsystems.
///
/// Cloning gives another handle to the same hierarchy. The hierarchy lives
/// until every handle is dropped *and* every non-root css was freed;
/// cgroups never removed keep it (and themselves) alive, as a mounted
/// hierarchy with children stays. Its root csses are then taken offline
/// and live on while references hold them (tasks in the root cgroup,
/// pages charged to it, [`CssRef`](super::CssRef)s); see the [module docs](super),
/// *What keeps the root alive*.
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{BusyReason, CgroupError, Hierarchy, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("memory"), Recorder::new("io")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let b = h.mkdir(&a, "b").unwrap();
/// let task = h.spawn(&b).unwrap();
/// assert!(matches!(h.rmdir(&a), Err(CgroupError::Busy { reason: BusyReason::HasChildren(_), .. })));
/// assert!(matches!(h.rmdir(&b), Err(CgroupError::Busy { reason: BusyReason::HasTasks(1), .. })));
/// h.attach(&task, &h.root()).unwrap();
/// h.rmdir(&b).unwrap();
/// h.rmdir(&a).unwrap();
/// assert!(h.flush());
/// assert_eq!(h.nr_css(), 0);
/// ```
#[derive(Clone)]
pub struct Hierarchy {
    pub(crate) inner: Arc<Inner>,
}

impl Hierarchy {
    /// A hierarchy with default [`Options`].
    ///
    /// # Panics
    ///
    /// If `subsys` is empty or a subsystem refuses its root css.
    #[must_use]
    pub fn new(subsys: Vec<Arc<dyn Subsys>>) -> Hierarchy {
        Self::with_options(subsys, Options::default())
    }

    /// A hierarchy with the given options.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new), and if `opts.max_css_ids` is above 2^32.
    pub fn with_options(subsys: Vec<Arc<dyn Subsys>>, opts: Options) -> Hierarchy {
        assert!(!subsys.is_empty(), "Hierarchy::new: no subsystems");
        assert!(
            opts.max_css_ids
                .checked_sub(1)
                .is_none_or(|max| u32::try_from(max).is_ok()),
            "Hierarchy::with_options: max_css_ids = {} is above 2^32 (css ids are u32)",
            opts.max_css_ids
        );
        let hid = NEXT_HIERARCHY.fetch_add(1, crate::sync::unmodeled::Ordering::Relaxed);
        let root = Arc::new(CgroupNode::new(
            hid,
            String::new(),
            "/".to_string(),
            None,
            subsys.len(),
        ));
        // Built before the root csses, so that if one is refused (or its
        // callback panics) dropping `inner` takes down those made so far.
        let mut inner = Inner::new(hid, subsys, opts, root);
        for ssid in 0..inner.subsys.len() {
            create_root_css(&mut inner, ssid);
        }
        Hierarchy {
            inner: Arc::new(inner),
        }
    }

    /// The root cgroup.
    #[must_use]
    pub fn root(&self) -> Cgroup {
        Cgroup::from_node(self.inner.root.clone())
    }

    /// The number of subsystems; their ids are `0..nr_subsys()`.
    #[must_use]
    pub fn nr_subsys(&self) -> usize {
        self.inner.subsys.len()
    }

    /// Subsystem `ssid`'s name.
    ///
    /// # Panics
    ///
    /// If `ssid` is not below [`nr_subsys`](Self::nr_subsys).
    #[must_use]
    pub fn subsys_name(&self, ssid: usize) -> &str {
        self.inner.subsys[ssid].name()
    }

    /// `mkdir`: makes cgroup `name` under `parent`, with one online css per
    /// subsystem, each pinning its parent css.
    ///
    /// # Errors
    ///
    /// [`CgroupError::Removed`] if `parent` was removed,
    /// [`CgroupError::Exists`], [`CgroupError::InvalidName`],
    /// [`CgroupError::IdsExhausted`], [`CgroupError::SubsysRefused`],
    /// [`CgroupError::WrongHierarchy`].
    ///
    /// # Panics
    ///
    /// If called from a subsystem callback of this hierarchy (this thread
    /// holds `cgroup_mutex`: it would deadlock), and with the first panic
    /// of a subsystem callback that the step ran, once the step is complete
    /// (see [`Subsys`], *Panics in callbacks*).
    pub fn mkdir(&self, parent: &Cgroup, name: &str) -> Result<Cgroup, CgroupError> {
        if name.is_empty() || name.contains('/') {
            return Err(CgroupError::InvalidName {
                name: name.to_string(),
            });
        }
        let inner = &self.inner;
        self.check("mkdir", parent)?;
        inner.locked("mkdir", |g| {
            if !parent.is_online() {
                return Err(CgroupError::Removed {
                    op: "mkdir",
                    path: parent.path().to_string(),
                });
            }
            let path = if parent.node.parent.is_none() {
                format!("/{name}")
            } else {
                format!("{}/{name}", parent.path())
            };
            if sync::lock(&parent.node.children).contains_key(name) {
                return Err(CgroupError::Exists { path });
            }
            let node = Arc::new(CgroupNode::new(
                inner.hid,
                name.to_string(),
                path,
                Some(parent.node.clone()),
                inner.subsys.len(),
            ));
            for ssid in 0..inner.subsys.len() {
                if let Err(e) = css_create(inner, &node, ssid, &mut g.panics) {
                    // Undo as the kernel does: destroy what was made.
                    // ordering-audit: Relaxed: a status flag; readers learn nothing else from it
                    // (`is_online`).
                    node.online.store(false, Ordering::Relaxed);
                    for made in 0..ssid {
                        // ordering-audit: Relaxed: the slot is written under cgroup_mutex, which we
                        // hold.
                        let p = node.subsys[made].load(Ordering::Relaxed);
                        kill_css(CssPtr::from_raw(p).expect("a made css is online"));
                    }
                    return Err(e);
                }
            }
            sync::lock(&parent.node.children).insert(name.to_string(), node.clone());
            Ok(Cgroup::from_node(node))
        })
    }

    /// `rmdir` (`cgroup_destroy_locked`): removes an empty cgroup and kills
    /// its csses, asynchronously as the kernel does: they are dying when
    /// this returns, and go offline once their kills completed on the
    /// grace-period engine and their children are offline; they are
    /// released when the last reference is put, and freed a grace period
    /// later. [`flush`](Self::flush) waits for all of it.
    ///
    /// # Errors
    ///
    /// [`CgroupError::Busy`] while tasks are attached or children exist;
    /// [`CgroupError::Removed`], [`CgroupError::Root`],
    /// [`CgroupError::WrongHierarchy`].
    ///
    /// # Panics
    ///
    /// If called from a subsystem callback of this hierarchy (this thread
    /// holds `cgroup_mutex`: it would deadlock), and with the first panic
    /// of a subsystem callback that the step ran, once the step is complete
    /// (see [`Subsys`], *Panics in callbacks*).
    pub fn rmdir(&self, cg: &Cgroup) -> Result<(), CgroupError> {
        let inner = &self.inner;
        self.check("rmdir", cg)?;
        let parent = cg
            .node
            .parent
            .as_ref()
            .ok_or(CgroupError::Root { op: "rmdir" })?;
        inner.locked("rmdir", |_| {
            let path = || cg.path().to_string();
            if !cg.is_online() {
                return Err(CgroupError::Removed {
                    op: "rmdir",
                    path: path(),
                });
            }
            let tasks = cg.nr_tasks();
            if tasks > 0 {
                return Err(CgroupError::Busy {
                    path: path(),
                    reason: BusyReason::HasTasks(tasks),
                });
            }
            let children: Vec<String> = sync::lock(&cg.node.children).keys().cloned().collect();
            if !children.is_empty() {
                return Err(CgroupError::Busy {
                    path: path(),
                    reason: BusyReason::HasChildren(children),
                });
            }
            // ordering-audit: Relaxed: a status flag; readers learn nothing else from it
            // (`is_online`).
            cg.node.online.store(false, Ordering::Relaxed);
            sync::lock(&parent.children).remove(cg.name());
            for slot in &cg.node.subsys {
                // ordering-audit: Relaxed: the slot is written under cgroup_mutex, which we hold.
                let p = CssPtr::from_raw(slot.load(Ordering::Relaxed))
                    .expect("rmdir: an online cgroup has an online css per subsystem");
                kill_css(p);
            }
            Ok(())
        })
    }

    /// Enters an RCU read section, for [`css_from_id`](Self::css_from_id).
    pub fn rcu_read_lock(&self) -> RcuGuard {
        rcu::read_lock()
    }

    /// `css_from_id`: the css with `id` in subsystem `ssid`, valid while
    /// `guard` is held, and no longer than this hierarchy handle is
    /// borrowed. It may be dying or offline; take a reference with
    /// [`Css::tryget_online`] (or [`Css::tryget`]) to keep it.
    ///
    /// # Examples
    ///
    /// ```
    /// use percpu_ref::css::{Hierarchy, Recorder};
    /// let h = Hierarchy::new(vec![Recorder::new("memory")]);
    /// let a = h.mkdir(&h.root(), "a").unwrap();
    /// let id = a.css(0).unwrap().id();
    /// let guard = h.rcu_read_lock();
    /// let css = h.css_from_id(0, id, &guard).unwrap().tryget_online().unwrap();
    /// drop(guard);
    /// assert_eq!(css.cgroup_path(), "/a");
    /// ```
    ///
    /// What it returns cannot outlive the hierarchy handle (nor the guard):
    ///
    /// ```compile_fail
    /// use percpu_ref::css::{Hierarchy, Recorder};
    /// let guard;
    /// let root_css;
    /// {
    ///     let h = Hierarchy::new(vec![Recorder::new("memory")]);
    ///     guard = h.rcu_read_lock();
    ///     root_css = h.css_from_id(0, 1, &guard).unwrap();
    /// } // `h` is dropped here
    /// assert!(root_css.is_root());
    /// ```
    #[must_use]
    pub fn css_from_id<'a>(&'a self, ssid: usize, id: u32, guard: &'a RcuGuard) -> Option<&'a Css> {
        let _ = guard;
        let p = CssPtr::from_raw(self.inner.idrs.get(ssid)?.find(id))?;
        // SAFETY: the slot is cleared at release (a root css's when the
        // hierarchy goes, which `&'a self` rules out) and the css freed a
        // grace period after; `guard` is a read section that began before
        // the load and outlives the returned reference.
        let css = unsafe { p.get() };
        css.check_published();
        Some(css)
    }

    /// Runs queued destroy work now (the only way it runs with
    /// [`WorkMode::Manual`](super::WorkMode::Manual)); returns how many items ran.
    ///
    /// # Panics
    ///
    /// After the work ran, with the first panic of a subsystem callback in
    /// it, or one kept from destroy work that ran with no caller (see
    /// [`Subsys`], *Panics in callbacks*).
    #[allow(
        clippy::must_use_candidate,
        reason = "called for the work it runs; the count is a diagnostic"
    )]
    pub fn run_destroy_work(&self) -> usize {
        let inner = &self.inner;
        inner.locked("run_destroy_work", |g| {
            if let Some(p) = inner.take_orphan() {
                g.panics.keep(p);
            }
            inner.drain_locked(&mut g.panics)
        })
    }

    /// Waits until every kill queued by `rmdir` has completed (its confirm
    /// ran on the grace-period engine: [`crate::flush`]), no destroy work
    /// is queued and no css waits for a grace period (`rcu_barrier` plus
    /// `flush_workqueue`). Returns false if that
    /// did not happen within about ten seconds (a thread stayed inside an
    /// RCU read section).
    ///
    /// # Panics
    ///
    /// As [`run_destroy_work`](Self::run_destroy_work), once the wait is
    /// over.
    #[must_use = "`false` means destroy work or a grace period is still pending (a thread stayed \
                  in an RCU read section): csses are not all freed yet"]
    pub fn flush(&self) -> bool {
        let mut caught = CallbackPanics::default();
        let done = self.inner.flush(&mut caught);
        if let Some(p) = self.inner.take_orphan() {
            caught.keep(p);
        }
        caught.resume();
        done
    }

    /// Non-root csses allocated and not yet freed.
    #[must_use]
    pub fn nr_css(&self) -> usize {
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        self.inner.nr_css.load(Ordering::Relaxed)
    }

    /// Css ids in use in subsystem `ssid` (the root's included).
    ///
    /// # Panics
    ///
    /// If `ssid` is not below [`nr_subsys`](Self::nr_subsys).
    #[must_use]
    pub fn nr_css_ids(&self, ssid: usize) -> usize {
        self.inner.idrs[ssid].in_use()
    }

    /// Refuses a cgroup of another hierarchy.
    pub(crate) fn check(&self, op: &'static str, cg: &Cgroup) -> Result<(), CgroupError> {
        if cg.node.hid != self.inner.hid {
            return Err(CgroupError::WrongHierarchy {
                op,
                path: cg.path().to_string(),
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Hierarchy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hierarchy")
            .field(
                "subsys",
                &self
                    .inner
                    .subsys
                    .iter()
                    .map(|s| s.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("nr_css", &self.nr_css())
            .finish()
    }
}
