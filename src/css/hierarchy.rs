//! The cgroup hierarchy: cgroups, `mkdir`/`rmdir`, `cgroup_mutex` and the
//! destroy work queue.
//!
//! # `cgroup_mutex` and the destroy queue
//!
//! Tree changes (`mkdir`, `rmdir`, `attach`) and all destroy work run under
//! one lock, `cgroup_mutex`. The kernel runs destroy work on a workqueue
//! (`cgroup_destroy_wq`) whose worker takes `cgroup_mutex`; here the work is
//! run by a thread that already has it, and never inside a `PercpuRef`
//! callback (a release is queued only once the put that made it has
//! returned; see the [module docs](super), *What runs where*):
//!
//! - work queued by the thread holding `cgroup_mutex` (an `rmdir`'s kill
//!   confirm, a release caused by a put made under the mutex) runs when
//!   that thread unlocks, still under the mutex;
//! - work queued by another thread (a release after a task's last put
//!   returned, a free after a grace period) takes the mutex if it is free
//!   and runs; if it is held, the holder runs it before it lets go (it
//!   looks at the queue again after unlocking, so nothing is stranded).
//!
//! With [`WorkMode::Manual`] queued work waits for
//! [`Hierarchy::run_destroy_work`], which makes interleavings the kernel
//! allows (an offline still pending while the parent is removed) easy to
//! set up in tests.
//!
//! # Panics
//!
//! A subsystem callback that panics is caught where it is called, so the
//! work item (or `mkdir`) completes and nothing queued is lost. Who holds
//! `cgroup_mutex` is recorded next to the lock and cleared with it, also
//! when unwinding, so the thread can take it again. The panic is then
//! resumed in the caller that ran the work, after the mutex is released;
//! one with no such caller is kept for the next `flush` or
//! `run_destroy_work`.

use super::idr::Idr;
use super::rcu::{self, RcuGuard};
use super::subsys::{CallbackPanics, Payload, Subsys};
use super::subsys_state::{
    kill_css, kill_root_css, online_css, Css, CssInit, CssPtr, CssRef, Work,
};
use crate::sync::{self, AtomicBool, AtomicPtr, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

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
    Manual,
}

/// Options for [`Hierarchy::with_options`].
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

/// Why [`Hierarchy::rmdir`] found a cgroup busy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BusyReason {
    /// Tasks are attached to it.
    HasTasks(usize),
    /// It has children that were not removed (their names).
    HasChildren(Vec<String>),
}

/// A refused cgroup operation. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupError {
    /// `rmdir` of a cgroup that still has tasks or online children (the
    /// kernel's `EBUSY`).
    Busy {
        /// The cgroup.
        path: String,
        /// What keeps it.
        reason: BusyReason,
    },
    /// The cgroup was already removed (or, for `mkdir`, the parent was).
    Removed {
        /// The operation.
        op: &'static str,
        /// The removed cgroup.
        path: String,
    },
    /// `mkdir` of a name that exists (`EEXIST`).
    Exists {
        /// The existing cgroup.
        path: String,
    },
    /// `mkdir` with an empty name or one containing `/`.
    InvalidName {
        /// The name.
        name: String,
    },
    /// `rmdir` of the root cgroup.
    Root {
        /// The operation.
        op: &'static str,
    },
    /// A cgroup or task of another hierarchy was passed.
    WrongHierarchy {
        /// The operation.
        op: &'static str,
        /// The cgroup's path.
        path: String,
    },
    /// A subsystem's id table is full.
    IdsExhausted {
        /// The subsystem.
        subsys: String,
    },
    /// A subsystem callback refused the new css.
    SubsysRefused {
        /// The subsystem.
        subsys: String,
        /// The callback (`css_alloc` or `css_online`).
        callback: &'static str,
        /// The cgroup being made.
        path: String,
        /// The subsystem's reason.
        reason: String,
    },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupError::Busy {
                path,
                reason: BusyReason::HasTasks(n),
            } => write!(f, "rmdir {path}: busy: {n} task(s) attached"),
            CgroupError::Busy {
                path,
                reason: BusyReason::HasChildren(names),
            } => write!(
                f,
                "rmdir {path}: busy: child cgroup(s) {} not removed",
                names.join(", ")
            ),
            CgroupError::Removed { op, path } => {
                write!(f, "{op}: cgroup {path} was removed")
            }
            CgroupError::Exists { path } => write!(f, "mkdir {path}: already exists"),
            CgroupError::InvalidName { name } => {
                write!(f, "mkdir: invalid cgroup name {name:?}")
            }
            CgroupError::Root { op } => write!(f, "{op}: the root cgroup cannot be removed"),
            CgroupError::WrongHierarchy { op, path } => {
                write!(f, "{op}: {path} belongs to another hierarchy")
            }
            CgroupError::IdsExhausted { subsys } => {
                write!(f, "mkdir: subsystem {subsys} has no free css id")
            }
            CgroupError::SubsysRefused {
                subsys,
                callback,
                path,
                reason,
            } => write!(f, "mkdir {path}: {subsys}'s {callback} refused: {reason}"),
        }
    }
}

impl std::error::Error for CgroupError {}

static NEXT_HIERARCHY: AtomicU64 = AtomicU64::new(1);

/// One cgroup's node. Fields that change are written under `cgroup_mutex`.
pub(crate) struct CgroupNode {
    hid: u64,
    name: String,
    path: String,
    parent: Option<Arc<CgroupNode>>,
    /// `cgroup->subsys[]`: the online css per subsystem, null once offline.
    pub(crate) subsys: Box<[AtomicPtr<Css>]>,
    /// `cgroup->self` is online: cleared synchronously by `rmdir`.
    online: AtomicBool,
    pub(crate) nr_tasks: AtomicUsize,
    /// Online children, by name.
    children: Mutex<BTreeMap<String, Arc<CgroupNode>>>,
    /// Root cgroup only: held while [`Cgroup::css`] reads a `subsys[]`
    /// slot and takes its reference, and while the hierarchy's teardown
    /// clears the slot (see `kill_root_css`). A root css is freed without
    /// a grace period, so its slot is not an RCU pointer.
    root_slots: Mutex<()>,
}

impl CgroupNode {
    /// An online cgroup with no csses yet, no tasks and no children.
    fn new(
        hid: u64,
        name: String,
        path: String,
        parent: Option<Arc<CgroupNode>>,
        nr_subsys: usize,
    ) -> CgroupNode {
        CgroupNode {
            hid,
            name,
            path,
            parent,
            subsys: (0..nr_subsys)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            online: AtomicBool::new(true),
            nr_tasks: AtomicUsize::new(0),
            children: Mutex::new(BTreeMap::new()),
            root_slots: Mutex::new(()),
        }
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Clears the root cgroup's slot for `ssid`: from now on
    /// [`Cgroup::css`] finds nothing there, and no call that found the css
    /// is still between its load and its `tryget_online`.
    pub(crate) fn clear_root_slot(&self, ssid: usize) {
        debug_assert!(self.parent.is_none());
        let _g = sync::lock(&self.root_slots);
        // ordering-audit: Relaxed: written and read under root_slots, and a null publishes nothing.
        self.subsys[ssid].store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

/// A handle to a cgroup. Cloning is cheap; a handle keeps the node's
/// memory, not the cgroup, alive (it can be removed meanwhile).
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Hierarchy, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("cpu")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let b = h.mkdir(&a, "b").unwrap();
/// assert_eq!(b.path(), "/a/b");
/// assert_eq!(b.parent().unwrap().path(), "/a");
/// assert!(b.is_online());
/// ```
#[derive(Clone)]
pub struct Cgroup {
    node: Arc<CgroupNode>,
}

impl Cgroup {
    pub(crate) fn from_node(node: Arc<CgroupNode>) -> Cgroup {
        Cgroup { node }
    }

    /// The cgroup's name (`""` for the root).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.node.name
    }

    /// The cgroup's path (`/` for the root).
    #[must_use]
    pub fn path(&self) -> &str {
        &self.node.path
    }

    /// The parent cgroup.
    #[must_use]
    pub fn parent(&self) -> Option<Cgroup> {
        self.node.parent.clone().map(Cgroup::from_node)
    }

    /// False once `rmdir` removed it.
    #[must_use]
    pub fn is_online(&self) -> bool {
        // ordering-audit: Relaxed: a snapshot of a flag changed under cgroup_mutex; it publishes
        // nothing.
        self.node.online.load(Ordering::Relaxed)
    }

    /// Tasks attached to this cgroup.
    #[must_use]
    pub fn nr_tasks(&self) -> usize {
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        self.node.nr_tasks.load(Ordering::Relaxed)
    }

    /// The cgroup's online css for subsystem `ssid`, with a reference
    /// (`cgroup_css` under RCU, then `css_tryget_online`). `None` once the
    /// cgroup was removed (for the root cgroup: once its hierarchy was
    /// dropped), or if `ssid` is out of range.
    #[must_use = "a `Some` is a reference taken; dropping it at once puts it again"]
    pub fn css(&self, ssid: usize) -> Option<CssRef> {
        let slot = self.node.subsys.get(ssid)?;
        if self.node.parent.is_none() {
            let _g = sync::lock(&self.node.root_slots);
            // ordering-audit: Relaxed: the root's slot is set before any handle exists and cleared
            // under root_slots, which we hold.
            let p = slot.load(Ordering::Relaxed);
            // SAFETY: a root css's slot is cleared under this lock before
            // the hierarchy drops its base reference (`kill_root_css`), so
            // a css found here holds that reference until we unlock.
            let css = unsafe { CssPtr::from_raw(p)?.get() };
            return css.tryget_online();
        }
        let _rcu = rcu::read_lock();
        // ordering-audit: kept (rcu_dereference): pairs with the Release store in `online_css`.
        let p = slot.load(Ordering::Acquire);
        // SAFETY: the slot is cleared at offline, before release, and a css
        // is freed only a grace period after release; we are inside a read
        // section that began before we loaded the pointer.
        let css = unsafe { CssPtr::from_raw(p)?.get() };
        css.check_published();
        css.tryget_online()
    }

    pub(crate) fn nr_tasks_counter(&self) -> &AtomicUsize {
        &self.node.nr_tasks
    }

    fn same(&self, other: &Cgroup) -> bool {
        Arc::ptr_eq(&self.node, &other.node)
    }
}

impl PartialEq for Cgroup {
    fn eq(&self, other: &Cgroup) -> bool {
        self.same(other)
    }
}

impl Eq for Cgroup {}

impl fmt::Debug for Cgroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cgroup")
            .field("path", &self.path())
            .field("online", &self.is_online())
            .field("nr_tasks", &self.nr_tasks())
            .finish()
    }
}

/// The shared state of a hierarchy.
pub(crate) struct Inner {
    pub(crate) hid: u64,
    pub(crate) subsys: Vec<Arc<dyn Subsys>>,
    pub(crate) idrs: Vec<Idr>,
    opts: Options,
    root: Arc<CgroupNode>,
    root_css: Vec<CssPtr>,
    cgroup_mutex: Mutex<()>,
    /// The thread holding `cgroup_mutex` (`sync::thread_token`), 0 if none.
    /// Only ever equal to a thread's own token if that thread stored it.
    mutex_owner: std::sync::atomic::AtomicUsize,
    destroy_wq: Mutex<VecDeque<Work>>,
    /// Grace-period work not yet run (queued to crossbeam-epoch, or held
    /// for `flush` under loom).
    rcu_pending: AtomicUsize,
    #[cfg(percpu_ref_loom)]
    rcu_list: Mutex<Vec<Work>>,
    /// Non-root csses allocated and not yet freed.
    nr_css: AtomicUsize,
    /// A subsystem callback's panic from destroy work that had no caller to
    /// resume it in (run after a grace period, or while its thread was
    /// unwinding); resumed by the next `flush` or `run_destroy_work`.
    orphan_panic: Mutex<Option<Payload>>,
}

/// `cgroup_mutex` as this thread holds it: the lock and the owner mark.
/// Dropping it, also while unwinding, clears the mark and unlocks, so a
/// panic never leaves the mutex recorded as held by this thread.
struct Held<'a> {
    inner: &'a Inner,
    guard: Option<MutexGuard<'a, ()>>,
}

impl Held<'_> {
    fn unlock(&mut self) {
        if let Some(g) = self.guard.take() {
            self.inner
                .mutex_owner
                .store(0, std::sync::atomic::Ordering::Relaxed);
            drop(g);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.unlock();
    }
}

/// `cgroup_mutex`, held; unlocking runs queued destroy work first, then
/// resumes the first panic of a subsystem callback run under it.
pub(crate) struct CgroupMutexGuard<'a> {
    inner: &'a Arc<Inner>,
    held: Held<'a>,
    drain: bool,
    /// Panics of subsystem callbacks run under the mutex (by the operation
    /// itself, or by the destroy work run at unlock).
    pub(crate) panics: CallbackPanics,
}

impl CgroupMutexGuard<'_> {
    /// Runs queued destroy work (in [`WorkMode::Inline`]), unlocks, and
    /// runs what other threads queued meanwhile (they found the mutex held
    /// and left it to us: look again now that they can see it unlocked).
    /// Returns the callback panics caught; a no-op once unlocked.
    fn unlock(&mut self) -> CallbackPanics {
        while self.held.guard.is_some() {
            if self.drain {
                self.inner.drain_locked(&mut self.panics);
            }
            self.held.unlock();
            if !self.drain || self.inner.queue_is_empty() {
                break;
            }
            if let Some(g) = sync::try_lock(&self.inner.cgroup_mutex) {
                self.inner.set_owner();
                self.held.guard = Some(g);
            } // else the new holder runs it
        }
        std::mem::take(&mut self.panics)
    }

    /// Unlocks (running destroy work first) and resumes a callback panic.
    /// Ops call this before they return: a panic from a destructor after
    /// the return value is made would leak that value.
    fn finish(mut self) {
        let panics = self.unlock();
        self.inner.resume_or_keep(panics);
    }
}

impl Drop for CgroupMutexGuard<'_> {
    fn drop(&mut self) {
        let panics = self.unlock();
        self.inner.resume_or_keep(panics);
    }
}

impl Inner {
    fn holds_cgroup_mutex(&self) -> bool {
        self.mutex_owner.load(std::sync::atomic::Ordering::Relaxed) == sync::thread_token()
    }

    fn set_owner(&self) {
        self.mutex_owner
            .store(sync::thread_token(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` under `cgroup_mutex`, then unlocks (running destroy work)
    /// and resumes a subsystem callback's panic, with `f`'s result still a
    /// local that unwinding drops.
    ///
    /// # Panics
    ///
    /// As [`cgroup_lock`](Self::cgroup_lock).
    fn locked<R>(self: &Arc<Self>, op: &str, f: impl FnOnce(&mut CgroupMutexGuard<'_>) -> R) -> R {
        let mut g = self.cgroup_lock(op);
        let r = f(&mut g);
        g.finish();
        r
    }

    /// Takes `cgroup_mutex`.
    ///
    /// # Panics
    ///
    /// If this thread already holds it (a subsystem callback calling back
    /// into the hierarchy).
    pub(crate) fn cgroup_lock<'a>(self: &'a Arc<Self>, op: &str) -> CgroupMutexGuard<'a> {
        assert!(
            !self.holds_cgroup_mutex(),
            "css hierarchy: {op} called with cgroup_mutex held by this thread \
             (from a subsystem callback?); it would deadlock"
        );
        let g = sync::lock(&self.cgroup_mutex);
        self.set_owner();
        self.guard_for(g, self.opts.work == WorkMode::Inline)
    }

    fn guard_for<'a>(
        self: &'a Arc<Self>,
        g: MutexGuard<'a, ()>,
        drain: bool,
    ) -> CgroupMutexGuard<'a> {
        CgroupMutexGuard {
            inner: self,
            held: Held {
                inner: self,
                guard: Some(g),
            },
            drain,
            panics: CallbackPanics::default(),
        }
    }

    fn queue_is_empty(&self) -> bool {
        sync::lock(&self.destroy_wq).is_empty()
    }

    /// Queues destroy work (see the module docs for who runs it). If this
    /// thread runs it (the mutex was free), callback panics go to `panics`.
    ///
    /// Never called inside a `PercpuRef` callback except by the kill's
    /// confirm, which holds `cgroup_mutex` and so only queues.
    pub(crate) fn queue_work(self: &Arc<Self>, w: Work, panics: &mut CallbackPanics) {
        sync::lock(&self.destroy_wq).push_back(w);
        if self.opts.work == WorkMode::Manual || self.holds_cgroup_mutex() {
            return;
        }
        if let Some(g) = sync::try_lock(&self.cgroup_mutex) {
            self.set_owner();
            let mut g = self.guard_for(g, true);
            panics.merge(g.unlock());
        }
    }

    /// Resumes the first panic in `panics`, or keeps it for the next
    /// `flush` if this thread is already unwinding.
    fn resume_or_keep(&self, mut panics: CallbackPanics) {
        if std::thread::panicking() {
            if let Some(p) = panics.take() {
                self.keep_orphan(p);
            }
        } else {
            panics.resume();
        }
    }

    pub(crate) fn keep_orphan(&self, p: Payload) {
        let mut slot = sync::lock(&self.orphan_panic);
        if slot.is_none() {
            *slot = Some(p);
        }
    }

    fn take_orphan(&self) -> Option<Payload> {
        sync::lock(&self.orphan_panic).take()
    }

    /// `queue_rcu_work`: queue `w` after a grace period.
    pub(crate) fn queue_rcu_work(self: &Arc<Self>, w: Work) {
        // ordering-audit: Relaxed: made under cgroup_mutex, which `flush_inner` holds when it reads
        // the count.
        self.rcu_pending.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(percpu_ref_loom))]
        {
            let inner = self.clone();
            rcu::call_rcu(move || {
                let mut panics = CallbackPanics::default();
                inner.queue_work(w, &mut panics);
                // ordering-audit: Relaxed: `queue_work` handed the work over under destroy_wq's
                // mutex first; see `flush_inner`'s load.
                inner.rcu_pending.fetch_sub(1, Ordering::Relaxed);
                // Run inside whatever pinned this thread: no caller to
                // resume it in.
                if let Some(p) = panics.take() {
                    inner.keep_orphan(p);
                }
            });
        }
        #[cfg(percpu_ref_loom)]
        sync::lock(&self.rcu_list).push(w);
    }

    /// Runs queued work; `cgroup_mutex` is held by this thread. Each item
    /// completes even if a subsystem callback in it panics (kept in
    /// `panics`), so no work is lost.
    fn drain_locked(self: &Arc<Self>, panics: &mut CallbackPanics) -> usize {
        let mut ran = 0;
        loop {
            let w = sync::lock(&self.destroy_wq).pop_front();
            match w {
                Some(w) => {
                    w.run(self, panics);
                    ran += 1;
                }
                None => return ran,
            }
        }
    }

    pub(crate) fn css_freed(&self) {
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        self.nr_css.fetch_sub(1, Ordering::Relaxed);
    }

    fn check(&self, op: &'static str, cg: &Cgroup) -> Result<(), CgroupError> {
        if cg.node.hid != self.hid {
            return Err(CgroupError::WrongHierarchy {
                op,
                path: cg.path().to_string(),
            });
        }
        Ok(())
    }

    /// `css_create`, under `cgroup_mutex`. A panicking `css_alloc` or
    /// `css_online` is undone as a refusal; its panic is kept in `panics`.
    fn css_create(
        self: &Arc<Self>,
        node: &Arc<CgroupNode>,
        ssid: usize,
        panics: &mut CallbackPanics,
    ) -> Result<CssPtr, CgroupError> {
        let subsys = &self.subsys[ssid];
        let parent_node = node.parent.as_ref().expect("css_create: not for the root");
        // ordering-audit: Relaxed: the parent's slot is written under cgroup_mutex, which we hold.
        let parent = CssPtr::from_raw(parent_node.subsys[ssid].load(Ordering::Relaxed))
            .expect("css_create: an online parent cgroup has an online css");
        let id = self.idrs[ssid]
            .alloc(2)
            .ok_or_else(|| CgroupError::IdsExhausted {
                subsys: subsys.name().to_string(),
            })?;
        let p = Css::alloc(CssInit {
            id,
            ssid,
            parent: Some(parent),
            cgroup: node.clone(),
            subsys: subsys.clone(),
            hier: Some(self.clone()),
            atomic_refcnt: self.opts.refcnt == RefcntMode::Atomic,
        });
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        self.nr_css.fetch_add(1, Ordering::Relaxed);
        // SAFETY: we own the new css; nobody else can reach it yet.
        let css = unsafe { p.get() };
        let refused = |callback, reason| CgroupError::SubsysRefused {
            subsys: subsys.name().to_string(),
            callback,
            path: node.path.clone(),
            reason,
        };
        let alloc = panics
            .call(|| subsys.css_alloc(css))
            .unwrap_or_else(|| Err(String::from("css_alloc panicked")));
        if let Err(reason) = alloc {
            self.idrs[ssid].remove(id);
            // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
            self.nr_css.fetch_sub(1, Ordering::Relaxed);
            // SAFETY: never published nor linked.
            unsafe { Css::dealloc(p) };
            return Err(refused("css_alloc", reason));
        }
        // init_and_link_css: the child pins its parent.
        // SAFETY: the parent is online and we hold cgroup_mutex.
        let parent_css = unsafe { parent.get() };
        parent_css.get_raw(1);
        sync::lock(&parent_css.children).push(id);
        if let Err(reason) = online_css(css, panics) {
            sync::lock(&parent_css.children).retain(|&c| c != id);
            // The kernel's error path: free after a grace period, which also
            // drops the parent pin.
            self.queue_rcu_work(Work::Free(p));
            return Err(refused("css_online", reason));
        }
        self.idrs[ssid].publish(id, p.as_ptr());
        Ok(p)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every non-root css holds the hierarchy, so only the roots are left
        // (and no `Hierarchy` handle, so no lookup by id). Take each down:
        // offline it and drop the hierarchy's base reference. It is
        // released when the last task, page or `CssRef` on it goes (maybe
        // now), and freed a grace period later.
        // ordering-audit: Relaxed: a status flag; the last handle is gone, so nobody reads it
        // concurrently.
        self.root.online.store(false, Ordering::Relaxed);
        let mut panics = CallbackPanics::default();
        for &p in &self.root_css {
            kill_root_css(p, &mut panics);
        }
        panics.resume();
    }
}

/// A cgroup hierarchy with a fixed set of subsystems.
///
/// Cloning gives another handle to the same hierarchy. The hierarchy lives
/// until every handle is dropped *and* every non-root css was freed;
/// cgroups never removed keep it (and themselves) alive, as a mounted
/// hierarchy with children stays. Its root csses are then taken offline
/// and live on while references hold them (tasks in the root cgroup,
/// pages charged to it, [`CssRef`]s); see the [module docs](super),
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
    inner: Arc<Inner>,
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
        let hid = NEXT_HIERARCHY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = Arc::new(CgroupNode::new(
            hid,
            String::new(),
            "/".to_string(),
            None,
            subsys.len(),
        ));
        let idrs: Vec<Idr> = subsys.iter().map(|_| Idr::new(opts.max_css_ids)).collect();
        // Built before the root csses, so that if one is refused (or its
        // callback panics) dropping `inner` takes down those made so far.
        let mut inner = Inner {
            hid,
            subsys,
            idrs,
            opts,
            root: root.clone(),
            root_css: Vec::new(),
            cgroup_mutex: Mutex::new(()),
            mutex_owner: std::sync::atomic::AtomicUsize::new(0),
            destroy_wq: Mutex::new(VecDeque::new()),
            rcu_pending: AtomicUsize::new(0),
            #[cfg(percpu_ref_loom)]
            rcu_list: Mutex::new(Vec::new()),
            nr_css: AtomicUsize::new(0),
            orphan_panic: Mutex::new(None),
        };
        for ssid in 0..inner.subsys.len() {
            let ss = inner.subsys[ssid].clone();
            let id = inner.idrs[ssid]
                .alloc(1)
                .expect("a fresh id table has id 1");
            let p = Css::alloc(CssInit {
                id,
                ssid,
                parent: None,
                cgroup: root.clone(),
                subsys: ss.clone(),
                hier: None,
                atomic_refcnt: inner.opts.refcnt == RefcntMode::Atomic,
            });
            // SAFETY: we own it.
            let css = unsafe { p.get() };
            let mut panics = CallbackPanics::default();
            let made = panics
                .call(|| ss.css_alloc(css))
                .unwrap_or_else(|| Err(String::from("css_alloc panicked")))
                .and_then(|()| online_css(css, &mut panics));
            if let Err(e) = made {
                // SAFETY: never published (online_css publishes last).
                unsafe { Css::dealloc(p) };
                panics.resume();
                panic!(
                    "Hierarchy::new: subsystem {} refused its root css: {e}",
                    ss.name()
                );
            }
            inner.idrs[ssid].publish(id, p.as_ptr());
            inner.root_css.push(p);
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
        inner.check("mkdir", parent)?;
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
                if let Err(e) = inner.css_create(&node, ssid, &mut g.panics) {
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
        inner.check("rmdir", cg)?;
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
    /// (see [`Subsys`], *Panics in callbacks*).
    pub fn spawn(&self, cg: &Cgroup) -> Result<super::Task, CgroupError> {
        let inner = &self.inner;
        inner.check("spawn", cg)?;
        inner.locked("spawn", |_| {
            let set = Self::css_set_locked("spawn", cg)?;
            // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
            cg.node.nr_tasks.fetch_add(1, Ordering::Relaxed);
            Ok(super::Task::new(inner.hid, set))
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
    /// (see [`Subsys`], *Panics in callbacks*).
    pub fn attach(&self, task: &super::Task, cg: &Cgroup) -> Result<(), CgroupError> {
        let inner = &self.inner;
        inner.check("attach", cg)?;
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

    fn css_set_locked(op: &'static str, cg: &Cgroup) -> Result<Arc<super::CssSet>, CgroupError> {
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
        Ok(Arc::new(super::CssSet::new(cg.clone(), csses)))
    }

    /// Runs queued destroy work now (the only way it runs with
    /// [`WorkMode::Manual`]); returns how many items ran.
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
        let done = self.flush_inner(&mut caught);
        if let Some(p) = self.inner.take_orphan() {
            caught.keep(p);
        }
        caught.resume();
        done
    }

    fn flush_inner(&self, caught: &mut CallbackPanics) -> bool {
        // Every kill queued so far completes (its confirm queued the offline
        // work, a release it caused was handed on) before the queue is
        // looked at.
        crate::flush();
        for attempt in 0..20_000u32 {
            let mut g = self.inner.cgroup_lock("flush");
            self.inner.drain_locked(&mut g.panics);
            // Checked under the mutex, so no work is running elsewhere; grace
            // period work counts as pending until it was queued.
            // ordering-audit: Relaxed: a 0 read here comes from a decrement made after its work was
            // pushed under destroy_wq's mutex, so `queue_is_empty` (which takes that mutex next)
            // sees the work: had our lock come first, this load would read a write that happens
            // after it. Increments are made under cgroup_mutex, which we hold.
            let done =
                self.inner.rcu_pending.load(Ordering::Relaxed) == 0 && self.inner.queue_is_empty();
            caught.merge(g.unlock());
            drop(g);
            if done {
                return true;
            }
            #[cfg(percpu_ref_loom)]
            {
                let due: Vec<Work> = std::mem::take(&mut *sync::lock(&self.inner.rcu_list));
                for w in due {
                    sync::lock(&self.inner.destroy_wq).push_back(w);
                    // ordering-audit: Relaxed: the work was handed over through destroy_wq's mutex
                    // before this decrement; see `flush_inner`'s load.
                    self.inner.rcu_pending.fetch_sub(1, Ordering::Relaxed);
                }
            }
            #[cfg(not(percpu_ref_loom))]
            {
                rcu::advance();
                if attempt > 100 {
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
            }
            let _ = attempt;
        }
        false
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
