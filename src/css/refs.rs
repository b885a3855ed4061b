//! References on a css: the kernel's `css_get`, `css_get_many`,
//! `css_tryget` and `css_tryget_online`, and the handles that hold what
//! they take ([`CssRef`], [`CssRefs`]), whose drops are `css_put`.
//!
//! Every put goes through `css_put`, which hands on a release it caused
//! once the `PercpuRef` call has returned (see `destroy.rs`); so this
//! layer stands on the destruction, and the
//! [`Hierarchy`](super::Hierarchy) API and tasks stand on it.

use super::destroy::css_put;
use super::graph::{Cgroup, Css, CssPtr};
use super::rcu;
use crate::sync::{self, Ordering};
use std::fmt;
use std::ops::Deref;

// The methods that take references are here, not with the rest of `Css`
// in `graph.rs`: what they return puts on drop, which is the destruction's
// business, a layer above the data graph.
impl Css {
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
}

// As `Css`'s: it returns a reference.
impl Cgroup {
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
