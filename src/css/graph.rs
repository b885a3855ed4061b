//! The kernel's data graph: the css model's types that point at each
//! other, with their fields and the queries that only read them.
//!
//! A [`Css`] holds its cgroup's node, its parent css, its [`Subsys`] and
//! the hierarchy's shared state ([`Inner`]); a cgroup's node holds its
//! csses (`cgroup->subsys[]`); `Inner` holds the id tables, the root csses
//! and the destroy queue's [`Work`], all of which point at csses; and a
//! subsystem's callbacks take a `&Css`. These types cannot be split across
//! files without each file naming the other, so they are here together,
//! and nothing here changes them beyond their own flags: the lifecycle
//! that does is one layer up (the destruction, from `kill_css` to the
//! free, on the destroy queue under `cgroup_mutex`, in `destroy.rs`; then
//! `css_create` in `create.rs`), and the references (`refs.rs`) and the
//! [`Hierarchy`](super::Hierarchy) API above it.
//!
//! A css is one heap allocation whose lifetime the refcount decides: it is
//! reachable through the id table and its cgroup's `subsys[]` slot (RCU
//! pointers, cleared before release) and through references ([`CssRef`],
//! [`CssRefs`], `css_set`s, charges, child csses). It is freed by
//! `css_free_work_fn`, which only runs a grace period after the last
//! reference was put and the RCU pointers were cleared.
//!
//! [`CssRef`]: super::CssRef
//! [`CssRefs`]: super::CssRefs

use super::idr::Idr;
use super::options::Options;
use super::panics::Payload;
use crate::flags::InitFlags;
use crate::percpu_ref::PercpuRef;
use crate::sync::{self, AtomicBool, AtomicPtr, AtomicUsize, Mutex, Ordering};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

/// A cgroup subsystem (controller), as the kernel's `struct cgroup_subsys`.
///
/// Each cgroup has one [`Css`] per subsystem of its hierarchy. The
/// callbacks run in the kernel's order, each exactly once per css:
///
/// 1. [`css_alloc`](Self::css_alloc) — the css exists but nothing can see
///    it yet; an error makes `mkdir` fail.
/// 2. [`css_online`](Self::css_online) — the css is linked to its parent;
///    an error makes `mkdir` fail (then only `css_free` follows).
/// 3. [`css_offline`](Self::css_offline) — after `rmdir` killed the css,
///    once no `css_tryget_online` can succeed and every child css is
///    offline. References may still be held.
/// 4. [`css_released`](Self::css_released) — the last reference was put;
///    the css is unlinked from its parent and the id table.
/// 5. [`css_free`](Self::css_free) — a grace period later: nothing can
///    reach the css any more. Every child was freed before. (A root css
///    goes offline when its hierarchy is dropped, and is released and
///    freed together by the last put on it; see the [module
///    docs](super), *What keeps the root alive*.)
///
/// The callbacks run with the hierarchy's `cgroup_mutex` held (except
/// `css_alloc`/`css_online` of a hierarchy's root css, run at creation,
/// and the root's teardown, which starts when the last [`Hierarchy`]
/// handle is dropped): they must not call `mkdir`, `rmdir`, `attach` or
/// `run_destroy_work` on the same hierarchy.
///
/// # Panics in callbacks
///
/// A callback that panics does not stop the lifecycle: the panic is
/// caught, the step that called it completes as if the callback had
/// returned (a panicking `css_alloc` or `css_online` counts as a refusal
/// and `mkdir` is undone), `cgroup_mutex` is released, and then the panic
/// is resumed in the caller that ran the step: `mkdir`/`rmdir`/`attach`/
/// `spawn` whose unlock ran the work, the put that released the css,
/// [`Hierarchy::run_destroy_work`] or [`Hierarchy::flush`]. Work run with
/// no such caller (after a grace period, or while the thread was already
/// unwinding) keeps its panic for the next `flush` or `run_destroy_work`.
/// Only the first panic of a step is resumed; the panic hook has reported
/// every one.
///
/// [`Hierarchy`]: super::Hierarchy
/// [`Hierarchy::run_destroy_work`]: super::Hierarchy::run_destroy_work
/// [`Hierarchy::flush`]: super::Hierarchy::flush
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Css, Hierarchy, Subsys};
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// #[derive(Default)]
/// struct Counting { online: AtomicUsize }
/// impl Subsys for Counting {
///     fn name(&self) -> &str { "counting" }
///     fn css_online(&self, _css: &Css) -> Result<(), String> {
///         self.online.fetch_add(1, Ordering::SeqCst);
///         Ok(())
///     }
///     fn css_offline(&self, _css: &Css) {
///         self.online.fetch_sub(1, Ordering::SeqCst);
///     }
/// }
///
/// let ss = Arc::new(Counting::default());
/// let h = Hierarchy::new(vec![ss.clone()]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// assert_eq!(ss.online.load(Ordering::SeqCst), 2); // root and a
/// h.rmdir(&a).unwrap();
/// percpu_ref::flush(); // the kill completes; its confirm offlines `a`
/// assert_eq!(ss.online.load(Ordering::SeqCst), 1);
/// ```
pub trait Subsys: Send + Sync + 'static {
    /// The subsystem's name (`"memory"`, `"io"`, ...).
    fn name(&self) -> &str;
    /// The css was allocated. `Err` refuses the `mkdir`.
    ///
    /// # Errors
    ///
    /// Return `Err(reason)` to refuse the css: `mkdir` is undone and fails
    /// with [`CgroupError::SubsysRefused`](super::CgroupError::SubsysRefused)
    /// (for a root css, [`Hierarchy::new`](super::Hierarchy::new) panics).
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        let _ = css;
        Ok(())
    }
    /// The css is about to go online. `Err` refuses the `mkdir`.
    ///
    /// # Errors
    ///
    /// As [`css_alloc`](Self::css_alloc).
    fn css_online(&self, css: &Css) -> Result<(), String> {
        let _ = css;
        Ok(())
    }
    /// The css went offline (after every child css).
    fn css_offline(&self, css: &Css) {
        let _ = css;
    }
    /// The css's last reference was put.
    fn css_released(&self, css: &Css) {
        let _ = css;
    }
    /// The css is about to be freed (after every child css).
    fn css_free(&self, css: &Css) {
        let _ = css;
    }
}

/// Between `online_css` and `offline_css`.
pub(crate) const CSS_ONLINE: usize = 1 << 1;
/// Set by `css_release_work_fn`.
pub(crate) const CSS_RELEASED: usize = 1 << 2;
/// Set by `kill_css`.
pub(crate) const CSS_DYING: usize = 1 << 3;
/// Set by `offline_css` (the kernel tells "not yet online" from "offline"
/// by context; here the state query needs it).
pub(crate) const CSS_OFFLINED: usize = 1 << 4;

/// Where a css is in its lifecycle (see the [module docs](super)).
/// "Freed" is not a state a live `&Css` can be in: it is seen through
/// [`Subsys::css_free`] and [`Hierarchy::nr_css`](super::Hierarchy::nr_css).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CssState {
    /// Allocated, not yet online (only seen by `css_alloc`/`css_online`).
    New,
    /// Online: `css_tryget_online` succeeds.
    Online,
    /// Killed by `rmdir`; waiting for its children to go offline.
    Dying,
    /// `css_offline` ran; references may still be held.
    Offline,
    /// The last reference was put; it will be freed after a grace period.
    Released,
}

/// A raw pointer to a css whose lifetime someone else guarantees (a held
/// reference, an RCU read section, `cgroup_mutex` plus a pin, or a release
/// not yet handed on).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct CssPtr(NonNull<Css>);

// SAFETY: `Css` is `Sync` (atomics, locks and `Send + Sync` callbacks), and
// a `CssPtr` is only dereferenced while its css is kept alive by the
// refcount protocol, whichever thread does it.
unsafe impl Send for CssPtr {}
// SAFETY: as above; sharing the pointer shares only `&Css`.
unsafe impl Sync for CssPtr {}

impl CssPtr {
    /// The css.
    ///
    /// # Safety
    ///
    /// The css must not be freed for `'a`: the caller holds a reference, an
    /// RCU read section it loaded the pointer under, or `cgroup_mutex`
    /// (frees run only under it) with the css pinned.
    pub(crate) unsafe fn get<'a>(self) -> &'a Css {
        // SAFETY: the caller guarantees the allocation is live for 'a.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn as_ptr(self) -> *mut Css {
        self.0.as_ptr()
    }

    pub(crate) fn from_raw(p: *mut Css) -> Option<CssPtr> {
        NonNull::new(p).map(CssPtr)
    }
}

/// A cgroup subsystem state: one cgroup's state for one subsystem, kept
/// alive by a [`PercpuRef`].
///
/// Every css is counted, the root css included (see the [module
/// docs](super), *What keeps the root alive*).
///
/// Obtained as a [`CssRef`](super::CssRef) (from [`Cgroup::css`], a task's `css_set`, or a
/// `tryget`), or as `&Css` under an RCU read section from
/// [`Hierarchy::css_from_id`](super::Hierarchy::css_from_id).
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{CssState, Hierarchy, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("memory")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let css = a.css(0).unwrap(); // css_tryget_online
/// assert_eq!(css.state(), CssState::Online);
/// let more = css.get_many(3); // css_get_many
/// h.rmdir(&a).unwrap();
/// assert!(css.is_dying() && css.tryget_online().is_none()); // at once
/// percpu_ref::flush(); // the kill completed: its confirm offlined the css
/// assert_eq!(css.state(), CssState::Offline); // references still held
/// assert!(css.tryget_online().is_none());
/// assert!(css.tryget().is_some()); // the count is not zero yet
/// drop(more); // css_put_many
/// drop(css); // the last css_put: released, freed after a grace period
/// assert!(h.flush());
/// assert_eq!(h.nr_css(), 0);
/// ```
pub struct Css {
    pub(crate) refcnt: PercpuRef,
    flags: AtomicUsize,
    /// 1 for itself while online, plus one per online child.
    pub(crate) online_cnt: AtomicUsize,
    id: u32,
    ssid: usize,
    pub(crate) parent: Option<CssPtr>,
    pub(crate) cgroup: Arc<CgroupNode>,
    pub(crate) subsys: Arc<dyn Subsys>,
    /// The hierarchy, for queueing destroy work; `None` for a root css,
    /// which the hierarchy holds (its base reference) and which is only
    /// released after the hierarchy is gone (see `root_release` in
    /// `destroy.rs`).
    pub(crate) hier: Option<Arc<Inner>>,
    /// Ids of linked child csses (`css->children`), under `cgroup_mutex`.
    pub(crate) children: Mutex<Vec<u32>>,
    /// The next css on the releasing thread's stack of releases not yet
    /// handed on (see `RELEASED` in `destroy.rs`).
    pub(crate) released_next: ReleaseLink,
    /// Loom only: stands for the css's plain fields, which loom does not
    /// track. Written once initialised, read by every lock-free lookup, so
    /// that loom sees a lookup that finds the css before it happens-after
    /// the initialisation (see `loom_tests/css.rs`, `mkdir_vs_css_from_id`).
    #[cfg(percpu_ref_loom)]
    initialised: crate::sync::UnsafeCell<()>,
}

/// A link of a thread's stack of released csses ([`Css::released_next`]).
pub(crate) struct ReleaseLink(pub(crate) Cell<Option<CssPtr>>);

// SAFETY: only one thread ever touches a css's link: the one whose
// `PercpuRef` call released it, from `css_release` (which pushes it) until
// `settle_releases` pops it and hands it on. Until then no other thread
// knows the css was released (see `destroy.rs`); once handed on, its
// link is never read again.
unsafe impl Sync for ReleaseLink {}

pub(crate) struct CssInit {
    pub(crate) id: u32,
    pub(crate) ssid: usize,
    pub(crate) parent: Option<CssPtr>,
    pub(crate) cgroup: Arc<CgroupNode>,
    pub(crate) subsys: Arc<dyn Subsys>,
    pub(crate) hier: Option<Arc<Inner>>,
    pub(crate) atomic_refcnt: bool,
    /// The refcount's release callback: `css_release`, which only records
    /// the release (see `destroy.rs`, *Releases leave the `PercpuRef`
    /// call first*).
    pub(crate) release: fn(CssPtr),
}

impl Css {
    /// Allocates a css in its final place, so that its refcount's release
    /// callback can name it.
    pub(crate) fn alloc(init: CssInit) -> CssPtr {
        let raw: *mut Css = Box::into_raw(Box::new(MaybeUninit::<Css>::uninit())).cast();
        let me = CssPtr(NonNull::new(raw).expect("Box::into_raw is never null"));
        let flags = if init.atomic_refcnt {
            InitFlags::INIT_ATOMIC
        } else {
            InitFlags::empty()
        };
        let release = init.release;
        let refcnt = PercpuRef::with_flags(move |_| release(me), flags);
        let css = Css {
            refcnt,
            flags: AtomicUsize::new(0),
            online_cnt: AtomicUsize::new(0),
            id: init.id,
            ssid: init.ssid,
            parent: init.parent,
            cgroup: init.cgroup,
            subsys: init.subsys,
            hier: init.hier,
            children: Mutex::new(Vec::new()),
            released_next: ReleaseLink(Cell::new(None)),
            #[cfg(percpu_ref_loom)]
            initialised: crate::sync::UnsafeCell::new(()),
        };
        // SAFETY: `raw` is a fresh, writable allocation with the layout of
        // `Css` (`MaybeUninit<Css>` has the same layout).
        unsafe { raw.write(css) };
        // SAFETY: just written; nothing else can reach it yet.
        #[cfg(percpu_ref_loom)]
        unsafe { me.get() }.initialised.with_mut(|_| ());
        me
    }

    /// Loom only: what a lock-free lookup that found this css reads first
    /// (see the `initialised` field).
    #[inline]
    #[cfg_attr(
        not(loom),
        allow(
            clippy::unused_self,
            reason = "only the loom build has the field to read"
        )
    )]
    pub(crate) fn check_published(&self) {
        #[cfg(percpu_ref_loom)]
        self.initialised.with(|_| ());
    }

    /// Frees a css allocated by [`alloc`](Self::alloc).
    ///
    /// # Safety
    ///
    /// Nothing can reach `p` any more: it was never published, or it was
    /// released, unpublished and a grace period has passed.
    pub(crate) unsafe fn dealloc(p: CssPtr) {
        // SAFETY: `p` came from `Box::into_raw` of a `MaybeUninit<Css>`
        // that `alloc` initialised; the caller guarantees no other user.
        drop(unsafe { Box::from_raw(p.as_ptr()) });
    }

    pub(crate) fn ptr(&self) -> CssPtr {
        CssPtr(NonNull::from(self))
    }

    /// Takes `n` references, unchecked: the handles that hold them are in
    /// `refs.rs`.
    pub(crate) fn get_raw(&self, n: usize) {
        self.refcnt.get_many(n);
    }

    // ----- queries ----------------------------------------------------------

    /// The css id, unique within its subsystem until the css is freed.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The subsystem's index in its hierarchy.
    #[must_use]
    pub fn ssid(&self) -> usize {
        self.ssid
    }

    /// The subsystem's name.
    #[must_use]
    pub fn subsys_name(&self) -> &str {
        self.subsys.name()
    }

    /// The path of the css's cgroup.
    #[must_use]
    pub fn cgroup_path(&self) -> &str {
        self.cgroup.path()
    }

    /// The css's cgroup.
    #[must_use]
    pub fn cgroup(&self) -> Cgroup {
        Cgroup::from_node(self.cgroup.clone())
    }

    /// The parent css (`None` for the root). A css pins its parent, so the
    /// parent lives at least as long as `self`.
    #[must_use]
    pub fn parent(&self) -> Option<&Css> {
        // SAFETY: a css holds a reference on its parent until it is freed
        // (`css_free_work_fn` puts it), so the parent outlives `&self`.
        self.parent.map(|p| unsafe { p.get() })
    }

    /// Whether this is a hierarchy's root css.
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    /// The lifecycle state.
    #[must_use]
    pub fn state(&self) -> CssState {
        // ordering-audit: Relaxed: a snapshot of a value changed under cgroup_mutex; it publishes
        // nothing (the kernel reads it plainly).
        let f = self.flags.load(Ordering::Relaxed);
        if f & CSS_RELEASED != 0 {
            CssState::Released
        } else if f & CSS_OFFLINED != 0 {
            CssState::Offline
        } else if f & CSS_DYING != 0 || self.is_dying() {
            // The refcount too (read after the flags): a thread that saw it
            // dead (a failed `tryget_online`) never reads an earlier state.
            CssState::Dying
        } else if f & CSS_ONLINE != 0 {
            CssState::Online
        } else {
            CssState::New
        }
    }

    /// Whether the css is online (`css_is_online`-like).
    #[must_use]
    pub fn is_online(&self) -> bool {
        // ordering-audit: Relaxed: a snapshot of a value changed under cgroup_mutex; it publishes
        // nothing (the kernel reads it plainly).
        self.flags.load(Ordering::Relaxed) & CSS_ONLINE != 0
    }

    /// Whether `rmdir` killed the css (`css_is_dying`): as the kernel's,
    /// this asks the refcount (`percpu_ref_is_dying`), not the `CSS_DYING`
    /// flag. A thread whose [`tryget_online`](Self::tryget_online) failed
    /// read the refcount's dead mode, and reads it again here, so it finds
    /// the css dying; the flag, a different word set just before the kill,
    /// may still read as not yet set on that thread.
    #[must_use]
    pub fn is_dying(&self) -> bool {
        // mutant css_is_dying_flag: read the CSS_DYING flag instead.
        mutant!(
            "css_is_dying_flag",
            self.refcnt.is_dying(),
            // ordering-audit: mutant only (never runs in a real build).
            self.flags.load(Ordering::Relaxed) & CSS_DYING != 0
        )
    }

    /// Whether the refcount is still counting per CPU (until the kill).
    #[must_use]
    pub fn refcnt_is_percpu(&self) -> bool {
        self.refcnt.is_percpu()
    }

    /// The reference count once atomic (after the kill, or for
    /// [`RefcntMode::Atomic`](super::RefcntMode::Atomic)); `None` while it
    /// counts per CPU. For diagnostics and tests.
    #[must_use]
    pub fn refcnt_atomic_count(&self) -> Option<u64> {
        self.refcnt.atomic_count()
    }

    pub(crate) fn set_flags(&self, f: usize) {
        // ordering-audit: Relaxed: flags change under cgroup_mutex (or, for a root css, on its last
        // thread); they are status and publish nothing.
        self.flags.fetch_or(f, Ordering::Relaxed);
    }

    pub(crate) fn clear_flags(&self, f: usize) {
        // ordering-audit: Relaxed: flags change under cgroup_mutex (or, for a root css, on its last
        // thread); they are status and publish nothing.
        self.flags.fetch_and(!f, Ordering::Relaxed);
    }
}

impl fmt::Debug for Css {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Css")
            .field("subsys", &self.subsys_name())
            .field("id", &self.id)
            .field("cgroup", &self.cgroup_path())
            .field("state", &self.state())
            .field("online_cnt", &self.online_cnt.load(Ordering::Relaxed))
            .field("refcnt", &self.refcnt)
            .finish_non_exhaustive()
    }
}

/// One cgroup's node. Fields that change are written under `cgroup_mutex`.
pub(crate) struct CgroupNode {
    pub(crate) hid: u64,
    pub(crate) name: String,
    pub(crate) path: String,
    pub(crate) parent: Option<Arc<CgroupNode>>,
    /// `cgroup->subsys[]`: the online css per subsystem, null once offline.
    pub(crate) subsys: Box<[AtomicPtr<Css>]>,
    /// `cgroup->self` is online: cleared synchronously by `rmdir`.
    pub(crate) online: AtomicBool,
    pub(crate) nr_tasks: AtomicUsize,
    /// Online children, by name.
    pub(crate) children: Mutex<BTreeMap<String, Arc<CgroupNode>>>,
    /// Root cgroup only: held while [`Cgroup::css`] reads a `subsys[]`
    /// slot and takes its reference, and while the hierarchy's teardown
    /// clears the slot (see `kill_root_css` in `destroy.rs`). A root css is freed without
    /// a grace period, so its slot is not an RCU pointer.
    pub(crate) root_slots: Mutex<()>,
}

impl CgroupNode {
    /// An online cgroup with no csses yet, no tasks and no children.
    pub(crate) fn new(
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
    pub(crate) node: Arc<CgroupNode>,
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
    pub(crate) idrs: Vec<Idr<Css>>,
    pub(crate) opts: Options,
    pub(crate) root: Arc<CgroupNode>,
    pub(crate) root_css: Vec<CssPtr>,
    pub(crate) cgroup_mutex: Mutex<()>,
    /// The thread holding `cgroup_mutex` (`sync::thread_token`), 0 if none.
    /// Only ever equal to a thread's own token if that thread stored it.
    pub(crate) mutex_owner: crate::sync::unmodeled::AtomicUsize,
    pub(crate) destroy_wq: Mutex<VecDeque<Work>>,
    /// Grace-period work not yet run (queued to crossbeam-epoch, or held
    /// for `flush` under loom).
    pub(crate) rcu_pending: AtomicUsize,
    #[cfg(percpu_ref_loom)]
    pub(crate) rcu_list: Mutex<Vec<Work>>,
    /// Non-root csses allocated and not yet freed.
    pub(crate) nr_css: AtomicUsize,
    /// A subsystem callback's panic from destroy work that had no caller to
    /// resume it in (run after a grace period, or while its thread was
    /// unwinding); resumed by the next `flush` or `run_destroy_work`.
    pub(crate) orphan_panic: Mutex<Option<Payload>>,
}

impl Inner {
    /// The shared state of a new hierarchy, with an empty id table per
    /// subsystem and no root css yet (`create.rs` makes them).
    pub(crate) fn new(
        hid: u64,
        subsys: Vec<Arc<dyn Subsys>>,
        opts: Options,
        root: Arc<CgroupNode>,
    ) -> Inner {
        let idrs = subsys.iter().map(|_| Idr::new(opts.max_css_ids)).collect();
        Inner {
            hid,
            subsys,
            idrs,
            opts,
            root,
            root_css: Vec::new(),
            cgroup_mutex: Mutex::new(()),
            mutex_owner: crate::sync::unmodeled::AtomicUsize::new(0),
            destroy_wq: Mutex::new(VecDeque::new()),
            rcu_pending: AtomicUsize::new(0),
            #[cfg(percpu_ref_loom)]
            rcu_list: Mutex::new(Vec::new()),
            nr_css: AtomicUsize::new(0),
            orphan_panic: Mutex::new(None),
        }
    }
}

/// Destroy work, run under `cgroup_mutex` from the hierarchy's destroy
/// queue (the kernel's `cgroup_destroy_wq`).
pub(crate) enum Work {
    /// `css_killed_work_fn`.
    Offline(CssPtr),
    /// `css_release_work_fn`.
    Release(CssPtr),
    /// `css_free_rwork_fn` (queued after a grace period).
    Free(CssPtr),
}
