//! The css itself, its reference operations, and the kernel's lifecycle
//! functions (`css_create` through `css_free_rwork_fn`).
//!
//! A [`Css`] is one heap allocation whose lifetime the refcount decides:
//! it is reachable through the id table and its cgroup's `subsys[]` slot
//! (RCU pointers, cleared before release) and through references
//! ([`CssRef`], [`CssRefs`], `css_set`s, charges, child csses). It is freed
//! by `css_free_work_fn`, which only runs a grace period after the last
//! reference was put and the RCU pointers were cleared.
//!
//! # Releases leave the `PercpuRef` call first
//!
//! The refcount's release callback runs inside a [`PercpuRef`] method
//! whose `&self` points into the css (and the callback's own closure lives
//! in the css's `PercpuRef`). Destroy work run from there could free the
//! css under those borrows: directly (a subsystem's `css_released` puts
//! another css, whose grace period lets this css's free run), or on
//! another thread (destroy work that saw the release queued runs the free
//! while the releasing thread is still returning from the callback). So
//! `css_release`, like the kernel's, does no work: it only records the
//! css in a per-thread stack (a thread-local head, linked through the
//! csses themselves, so that nothing there needs dropping and a put from
//! a thread-local's destructor still finds it). Every put goes through [`css_put`], which,
//! once the `PercpuRef` call has returned, hands the recorded release to
//! the hierarchy's destroy queue (`settle_releases`). Until then no other
//! thread knows the css was released, and nothing can free it.

use super::hierarchy::{Cgroup, CgroupNode, Inner};
use super::subsys::{CallbackPanics, Subsys};
use crate::percpu_ref::Confirm;
use crate::sync::{self, AtomicUsize, Mutex, Ordering};
use crate::{InitFlags, PercpuRef};
use std::cell::Cell;
use std::fmt;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

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
/// Obtained as a [`CssRef`] (from [`Cgroup::css`], a task's `css_set`, or a
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
    refcnt: PercpuRef,
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
    /// released after the hierarchy is gone (see `root_release`).
    pub(crate) hier: Option<Arc<Inner>>,
    /// Ids of linked child csses (`css->children`), under `cgroup_mutex`.
    pub(crate) children: Mutex<Vec<u32>>,
    /// The next css on the releasing thread's stack of releases not yet
    /// handed on (see `RELEASED`).
    released_next: ReleaseLink,
    /// Loom only: stands for the css's plain fields, which loom does not
    /// track. Written once initialised, read by every lock-free lookup, so
    /// that loom sees a lookup that finds the css before it happens-after
    /// the initialisation (see `loom_tests/css.rs`, `mkdir_vs_css_from_id`).
    #[cfg(percpu_ref_loom)]
    initialised: crate::sync::UnsafeCell<()>,
}

/// A link of a thread's stack of released csses ([`Css::released_next`]).
struct ReleaseLink(Cell<Option<CssPtr>>);

// SAFETY: only one thread ever touches a css's link: the one whose
// `PercpuRef` call released it, from `css_release` (which pushes it) until
// `settle_releases` pops it and hands it on. Until then no other thread
// knows the css was released (see the module docs); once handed on, its
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
        // The release callback only records the release (see the module
        // docs): it must not run destroy work inside the `PercpuRef` call.
        let refcnt = PercpuRef::with_flags(move |_| css_release(me), flags);
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

    fn ptr(&self) -> CssPtr {
        CssPtr(NonNull::from(self))
    }

    // ----- the kernel's css refcount operations -----------------------------

    pub(crate) fn get_raw(&self, n: usize) {
        self.refcnt.get_many(n);
    }

    /// `css_get`: takes a reference. The caller must already hold one (or
    /// know the css is online).
    ///
    /// # Panics
    ///
    /// If the css was released (its count is zero): use
    /// [`tryget`](Self::tryget) on a css found by id.
    #[must_use = "dropping the reference at once puts it again; test the css's state with its \
                  queries instead"]
    pub fn get(&self) -> CssRef {
        self.get_raw(1);
        CssRef { css: self.ptr() }
    }

    /// `css_get_many`: takes `n` references at once.
    ///
    /// The [`CssRefs`] also holds one reference of its own for as long as
    /// it exists (taken in the same `get_many`), so it keeps the css alive
    /// even when it holds zero of the `n` (`get_many(0)`, or after
    /// [`put_many`](CssRefs::put_many) of all of them).
    ///
    /// # Panics
    ///
    /// As [`get`](Self::get) (also for `n == 0`), or if `n` is above
    /// 2^62 - 2.
    #[must_use = "dropping the references at once puts them again; test the css's state with its \
                  queries instead"]
    pub fn get_many(&self, n: usize) -> CssRefs {
        let Some(with_own) = n.checked_add(1) else {
            panic!("css_get_many({n}): too many references");
        };
        self.get_raw(with_own);
        CssRefs { css: self.ptr(), n }
    }

    /// `css_tryget`: takes a reference unless the count is zero (the css
    /// was released). Succeeds on dying and offline csses.
    #[must_use = "a `Some` is a reference taken; dropping it at once puts it again; test the css's \
                  state with its queries instead"]
    pub fn tryget(&self) -> Option<CssRef> {
        // No `SettleReleases` around it, unlike a put: a failed tryget runs
        // `release` only when its give-back is the last landing on zero,
        // which takes a revival in between (src/atomic_mode.rs, invariant
        // 3), and a css is never revived.
        self.refcnt.tryget().then(|| CssRef { css: self.ptr() })
    }

    /// `css_tryget_online`: takes a reference unless the css was killed.
    /// Once `rmdir` has killed it (its confirm ran), this fails on every
    /// thread. A root css is killed when its hierarchy is dropped.
    #[must_use = "a `Some` is a reference taken; dropping it at once puts it again; test the css's \
                  state with its queries instead"]
    pub fn tryget_online(&self) -> Option<CssRef> {
        self.refcnt
            .tryget_live()
            .then(|| CssRef { css: self.ptr() })
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

    fn clear_flags(&self, f: usize) {
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

/// One reference on a css: `css_get` when made or cloned, `css_put` when
/// dropped.
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Hierarchy, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("io")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let r = a.css(0).unwrap();
/// let r2 = r.clone(); // css_get
/// assert_eq!(r2.cgroup_path(), "/a");
/// r2.put(); // css_put (the same as drop)
/// ```
pub struct CssRef {
    css: CssPtr,
}

impl CssRef {
    /// `css_put`: drops the reference (the same as `drop`).
    pub fn put(self) {
        drop(self);
    }
}

impl Deref for CssRef {
    type Target = Css;
    fn deref(&self) -> &Css {
        // SAFETY: this reference keeps the count above zero, so the css is
        // not released, let alone freed.
        unsafe { self.css.get() }
    }
}

impl Clone for CssRef {
    fn clone(&self) -> CssRef {
        self.get()
    }
}

impl Drop for CssRef {
    fn drop(&mut self) {
        // SAFETY: this handle's reference, given up here.
        unsafe { css_put(self.css, 1) };
    }
}

impl fmt::Debug for CssRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// `n` references on one css, from [`Css::get_many`]; dropping puts what is
/// left with one `css_put_many`.
///
/// Besides the `n` it counts, a `CssRefs` holds one reference of its own
/// until it is dropped, so that it can be dereferenced whatever its count
/// (even zero) without the css being released under it.
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Hierarchy, Recorder};
/// let h = Hierarchy::new(vec![Recorder::new("io")]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// let mut refs = a.css(0).unwrap().get_many(10);
/// refs.put_many(4);
/// assert_eq!(refs.count(), 6);
/// ```
pub struct CssRefs {
    css: CssPtr,
    /// References counted by the handle; it holds `n + 1`.
    n: usize,
}

impl CssRefs {
    /// How many references are held.
    #[must_use]
    pub fn count(&self) -> usize {
        self.n
    }

    /// `css_put_many`: drops `k` of the references.
    ///
    /// # Panics
    ///
    /// If `k` is more than [`count`](Self::count).
    pub fn put_many(&mut self, k: usize) {
        assert!(
            k <= self.n,
            "css_put_many({k}): only {} references are held",
            self.n
        );
        self.n -= k;
        // SAFETY: `k` of the references held, given up here; the handle's
        // own reference stays, so this is never the last put.
        unsafe { css_put(self.css, k) };
    }
}

impl Deref for CssRefs {
    type Target = Css;
    fn deref(&self) -> &Css {
        // SAFETY: the handle's own reference keeps the css from being
        // released until the handle is dropped.
        unsafe { self.css.get() }
    }
}

impl Drop for CssRefs {
    fn drop(&mut self) {
        // SAFETY: the `n` references counted plus the handle's own.
        unsafe { css_put(self.css, self.n + 1) };
    }
}

impl fmt::Debug for CssRefs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CssRefs")
            .field("count", &self.n)
            .field("css", &self.css)
            .finish()
    }
}

// ----- lifecycle: the kernel's functions, in the order they run -------------

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

impl Work {
    /// Runs the work; the caller holds `cgroup_mutex`. Panics of subsystem
    /// callbacks are caught into `panics` and the work completes.
    pub(crate) fn run(self, inner: &Arc<Inner>, panics: &mut CallbackPanics) {
        match self {
            Work::Offline(p) => css_killed_work_fn(p, panics),
            Work::Release(p) => css_release_work_fn(inner, p, panics),
            Work::Free(p) => css_free_work_fn(inner, p, panics),
        }
    }
}

// ----- puts, and handing releases on from a clean stack ---------------------

// The last css released by this thread's `PercpuRef` calls and not yet
// handed on (see the module docs): the head of a stack linked through
// `Css::released_next`. One that needs no dropping, so it is never
// destroyed: a put from a thread-local's destructor, after this thread's
// other thread-locals are gone, still records its release here.
#[cfg(not(percpu_ref_loom))]
sync::thread_local! {
    static RELEASED: Cell<Option<CssPtr>> = const { Cell::new(None) };
}
// loom's macro takes no `const` block.
#[cfg(percpu_ref_loom)]
sync::thread_local! {
    static RELEASED: Cell<Option<CssPtr>> = Cell::new(None);
}

/// `css_put_many`: puts `n` references, then hands on a release it caused.
///
/// # Safety
///
/// The caller holds `n` references on `p` and gives them up. It must not
/// hold a `&Css` of `p` across this call that is not kept alive by
/// something else (an RCU read section, another reference): the release
/// this put causes may free the css before it returns.
pub(crate) unsafe fn css_put(p: CssPtr, n: usize) {
    let _settle = SettleReleases;
    // SAFETY: the caller's references keep the css alive until the put
    // gives them up; the raw put holds no borrow of the css past that point
    // (another thread's release may free it right after).
    unsafe { PercpuRef::put_many_raw(std::ptr::addr_of!((*p.as_ptr()).refcnt), n) };
}

/// Hands on, when dropped, the releases that the `PercpuRef` calls made
/// meanwhile on this thread recorded, even if one of them panicked.
/// Panics of subsystem callbacks run meanwhile are resumed after.
pub(crate) struct SettleReleases;

impl Drop for SettleReleases {
    #[inline]
    fn drop(&mut self) {
        if RELEASED.with(|c| c.get().is_some()) {
            let mut panics = CallbackPanics::default();
            settle_releases(&mut panics);
            panics.resume();
        }
    }
}

/// Hands on every release recorded by this thread's `PercpuRef` calls
/// that have returned; callback panics are kept in `panics`.
#[cold]
pub(crate) fn settle_releases(panics: &mut CallbackPanics) {
    while let Some(p) = RELEASED.with(Cell::take) {
        // Popped before it is handed on: from then on another thread may
        // free it.
        // SAFETY: recorded by this thread and not handed on yet: alive, and
        // its link is this thread's (see `ReleaseLink`).
        let next = unsafe { p.get() }.released_next.0.take();
        RELEASED.with(|c| c.set(next));
        hand_on_release(p, panics);
    }
}

/// Hands the release of `p` to whoever runs it: the hierarchy's destroy
/// queue, or, for a root css, this thread.
fn hand_on_release(p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: the count reached zero in a `PercpuRef` call of this thread
    // that has returned, and no one else knows yet, so nothing frees the
    // css before the release is queued below.
    let hier = unsafe { p.get() }.hier.clone();
    match hier {
        // Our own handle on the hierarchy: once the work is queued, another
        // thread may free the css (and drop the css's handle) at any time.
        Some(inner) => inner.queue_work(Work::Release(p), panics),
        None => root_release(p, panics),
    }
}

/// `css_release`: the refcount's release callback. It runs inside the
/// `PercpuRef` call that put the last reference, on whichever thread made
/// it, with that call's borrows of the css live, so it only records the
/// release; the `css_put` (or `kill_css`) around the call hands it on.
fn css_release(p: CssPtr) {
    // SAFETY: the last put's `PercpuRef` call borrows the css: it is alive.
    let refcnt = unsafe { &(*p.as_ptr()).refcnt };
    if refcnt.completing_on_engine() {
        // The engine's put of a deferred kill was the last: no wrapper of
        // ours is around that call, so the engine hands the release on once
        // it is done with the css.
        // SAFETY: as above.
        let hier = unsafe { p.get() }.hier.clone();
        refcnt.after_engine_completion(Box::new(move || {
            let mut panics = CallbackPanics::default();
            settle_releases(&mut panics);
            if let Some(payload) = panics.take() {
                match hier {
                    Some(h) => h.keep_orphan(payload),
                    // A root css's callbacks: the engine reports it.
                    None => std::panic::resume_unwind(payload),
                }
            }
        }));
    }
    // The stack is empty unless a hand-on was skipped (none of our
    // wrappers skips one, even when a callback panics): then the earlier
    // release waits below this one, and the next settle hands both on.
    let earlier = RELEASED.with(|c| c.replace(Some(p)));
    // SAFETY: as above; the link is this thread's from now on (see
    // `ReleaseLink`).
    unsafe { p.get() }.released_next.0.set(earlier);
}

// ----- the root css ---------------------------------------------------------

/// Takes a root css down when its hierarchy goes (`Inner::drop`): unpublish
/// it from the root cgroup (later [`Cgroup::css`] calls find nothing),
/// offline it, and drop the hierarchy's base reference. It is released
/// and freed when the last reference on it is put: now, or when the last
/// task, page or [`CssRef`] on it goes.
///
/// No grace period is needed before the free: once the hierarchy is gone
/// the id table is gone too (and [`Hierarchy::css_from_id`]'s result is
/// bound to a hierarchy handle), and the root cgroup's slot, the only
/// other way to the css without a reference, is cleared under the lock
/// that [`Cgroup::css`] holds from its load to its `tryget_online`.
///
/// [`Hierarchy::css_from_id`]: super::Hierarchy::css_from_id
pub(crate) fn kill_root_css(p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: the hierarchy holds the root's base reference until the kill
    // below; this `&Css` is not used after it.
    let css = unsafe { p.get() };
    css.cgroup.clear_root_slot(css.ssid);
    css.set_flags(CSS_DYING);
    offline_css(css, panics);
    // Hands on a release by the kill even if the kill panics; on success
    // the release is handed on below, with its panics kept.
    let settle = SettleReleases;
    if let Err(e) = css.refcnt.kill_sync() {
        panic!("root css {} of {}: {e}", css.id, css.cgroup_path());
    }
    std::mem::forget(settle);
    settle_releases(panics);
}

/// The release of a root css, on the thread that put its last reference
/// (its hierarchy is gone, so there is no destroy queue and no
/// `cgroup_mutex`): `css_released`, then at once `css_free` and the
/// memory (see [`kill_root_css`] for why no grace period is needed).
fn root_release(p: CssPtr, panics: &mut CallbackPanics) {
    {
        // SAFETY: released, and only this thread knows: nothing else can
        // reach it (see `kill_root_css`).
        let css = unsafe { p.get() };
        css.set_flags(CSS_RELEASED);
        panics.call(|| css.subsys.css_released(css));
        panics.call(|| css.subsys.css_free(css));
    }
    // SAFETY: as above; nothing touches it after this.
    unsafe { Css::dealloc(p) };
}

// ----- the lifecycle of a non-root css ----------------------------------------

/// `online_css`: the subsystem's `css_online`, then mark online, publish in
/// the cgroup's `subsys[]`, and count in `online_cnt` (own and parent's).
/// A panicking `css_online` counts as a refusal (the panic is kept).
pub(crate) fn online_css(css: &Css, panics: &mut CallbackPanics) -> Result<(), String> {
    panics
        .call(|| css.subsys.css_online(css))
        .unwrap_or_else(|| Err(String::from("css_online panicked")))?;
    css.set_flags(CSS_ONLINE);
    // ordering-audit: kept (rcu_assign_pointer): publishes the css's fields to `Cgroup::css`
    // readers. No model races them: a cgroup's handle escapes mkdir only after this store.
    css.cgroup.subsys[css.ssid].store(css.ptr().as_ptr(), Ordering::Release);
    // ordering-audit: Relaxed: changed only under cgroup_mutex, which orders it; it publishes
    // nothing.
    css.online_cnt.fetch_add(1, Ordering::Relaxed);
    if let Some(parent) = css.parent() {
        // ordering-audit: Relaxed: changed only under cgroup_mutex, which orders it; it publishes
        // nothing.
        parent.online_cnt.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// `kill_css`: called by `rmdir` under `cgroup_mutex`. Asynchronous, as the
/// kernel's: the css is dying at once (no `css_tryget_online` succeeds once
/// this returns), and the confirm, `css_killed_ref_fn`, runs on the
/// grace-period engine after the switch to atomic mode completes (at once,
/// on this thread, when the refcount is already atomic).
///
/// The extra reference keeps the css from being released before
/// `css_killed_work_fn` has offlined it; it is dropped there.
pub(crate) fn kill_css(p: CssPtr) {
    // SAFETY: called under cgroup_mutex on an online css, which holds its
    // base reference until this kill.
    let css = unsafe { p.get() };
    css.set_flags(CSS_DYING);
    // mutant css_no_kill_ref: kill without the extra reference.
    if !mutated!("css_no_kill_ref") {
        css.get_raw(1);
    }
    // A release by a kill completed in the call (an atomic refcount,
    // without the extra reference) is handed on once the call has returned.
    let _settle = SettleReleases;
    // SAFETY: a css never moves, and is freed (`Css::dealloc`, which drops
    // the `PercpuRef`; its `Drop` waits for the engine) only once released,
    // which the engine's temporary reference prevents while the kill is
    // queued.
    let killed = unsafe {
        PercpuRef::kill_raw(
            std::ptr::addr_of!((*p.as_ptr()).refcnt),
            Some(Confirm::new(move |_| css_killed_ref_fn(p))),
            "kill_css",
        )
    };
    if let Err(e) = killed {
        panic!("kill_css: css {} of {}: {e}", css.id, css.cgroup_path());
    }
}

/// `css_killed_ref_fn`: the kill's confirm. No `css_tryget_online` can
/// succeed any more; drop this css's own count in `online_cnt` and, if no
/// child is still online, queue the offline work.
///
/// It runs on the grace-period engine, inside the `PercpuRef` call that
/// completes the kill, without `cgroup_mutex` (as the kernel's runs from
/// an RCU callback): it must not take the mutex (a thread holding it may
/// wait for the engine: `flush`, a free that waits for a pending ref), nor
/// run destroy work under the engine's borrow of the css. So it only
/// counts, and hands the queueing to the engine for after the call
/// (`PercpuRef::after_engine_completion`), when the css is still pinned by the kill's
/// extra reference. With an atomic refcount the kill completes in `rmdir`,
/// which holds `cgroup_mutex`: then it queues, and `rmdir` runs the work
/// when it unlocks.
fn css_killed_ref_fn(p: CssPtr) {
    // SAFETY: the kill holds the base and the extra reference.
    let css = unsafe { p.get() };
    // ordering-audit: Relaxed: this decrement (on the engine) races with the
    // children's offline work (under cgroup_mutex), but it orders nothing:
    // whoever reaches zero queues an offline that runs under cgroup_mutex,
    // after every child's offline section in the mutex's order (a section
    // that came after it would happen before the queueing, hence before the
    // decrement that reached zero, against the RMWs' order).
    let last = css.online_cnt.fetch_sub(1, Ordering::Relaxed) == 1;
    // mutant css_no_online_cnt: offline at once, whatever the children.
    if last || mutated!("css_no_online_cnt") {
        let hier = hier_of(css).clone();
        let queue = move || {
            let mut panics = CallbackPanics::default();
            hier.queue_work(Work::Offline(p), &mut panics);
            if let Some(payload) = panics.take() {
                hier.keep_orphan(payload);
            }
        };
        if css.refcnt.completing_on_engine() {
            css.refcnt.after_engine_completion(Box::new(queue));
        } else {
            // This thread holds cgroup_mutex (only `rmdir` and `mkdir`'s
            // undo kill), so this only queues: nothing runs inside the
            // confirm.
            queue();
        }
    }
}

/// `css_killed_work_fn`: offline the css, drop the kill's extra reference,
/// and walk up: a dying parent whose last online child this was goes
/// offline now too.
fn css_killed_work_fn(mut p: CssPtr, panics: &mut CallbackPanics) {
    loop {
        // SAFETY: under cgroup_mutex (frees wait for it); `p` is pinned by
        // the kill's extra reference, or by its child that we came from.
        let css = unsafe { p.get() };
        offline_css(css, panics);
        let parent = css.parent;
        // SAFETY: the kill's extra reference; a release it causes is only
        // queued (we hold cgroup_mutex), so `p` stays valid meanwhile.
        unsafe { css_put(p, 1) };
        if mutated!("css_no_online_cnt") {
            return;
        }
        let Some(pp) = parent else { return };
        // SAFETY: the child we just offlined pins its parent until it is
        // freed, and frees run under cgroup_mutex, which we hold.
        let parent_css = unsafe { pp.get() };
        // ordering-audit: Relaxed: races with the parent's confirm on the
        // engine, ordering nothing (see `css_killed_ref_fn`).
        if parent_css.online_cnt.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        p = pp;
    }
}

/// `offline_css`: the subsystem's `css_offline`, then unpublish from the
/// cgroup's `subsys[]`.
fn offline_css(css: &Css, panics: &mut CallbackPanics) {
    if !css.is_online() {
        return;
    }
    panics.call(|| css.subsys.css_offline(css));
    css.clear_flags(CSS_ONLINE);
    css.set_flags(CSS_OFFLINED);
    // ordering-audit: Relaxed: a null publishes nothing; readers that loaded the old pointer are
    // covered by RCU (the free waits a grace period).
    let _ = css.cgroup.subsys[css.ssid].compare_exchange(
        css.ptr().as_ptr(),
        std::ptr::null_mut(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// `css_release_work_fn`: mark released, unlink from the parent's children
/// and the id table, tell the subsystem, and free after a grace period.
fn css_release_work_fn(inner: &Arc<Inner>, p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: under cgroup_mutex; released but not yet queued for freeing.
    let css = unsafe { p.get() };
    css.set_flags(CSS_RELEASED);
    if let Some(parent) = css.parent() {
        sync::lock(&parent.children).retain(|&id| id != css.id);
    }
    inner.idrs[css.ssid].unpublish(css.id);
    panics.call(|| css.subsys.css_released(css));
    inner.queue_rcu_work(Work::Free(p));
}

/// `css_free_rwork_fn`: a grace period after release nothing can reach the
/// css: tell the subsystem, free it, free its id, and put the parent.
fn css_free_work_fn(inner: &Arc<Inner>, p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: a grace period passed since the css was unpublished; only this
    // work can reach it.
    let css = unsafe { p.get() };
    let (id, ssid, parent) = (css.id, css.ssid, css.parent);
    panics.call(|| css.subsys.css_free(css));
    let live_children = sync::lock(&css.children).len();
    assert!(
        live_children == 0,
        "css_free: css {id} of {} still has {live_children} linked children",
        css.cgroup_path()
    );
    // SAFETY: as above; nothing touches `css` after this.
    unsafe { Css::dealloc(p) };
    inner.idrs[ssid].remove(id);
    inner.css_freed();
    if let Some(pp) = parent {
        // SAFETY: the css's pin on its parent, given up here.
        unsafe { css_put(pp, 1) };
    }
}

fn hier_of(css: &Css) -> &Arc<Inner> {
    match &css.hier {
        Some(h) => h,
        None => panic!(
            "css {} of {}: the root css is never killed or released",
            css.id,
            css.cgroup_path()
        ),
    }
}
