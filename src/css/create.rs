//! The kernel's `css_create` side of the lifecycle: `css_create` (for
//! `mkdir`), the root csses' creation (for `Hierarchy::new`), and
//! `online_css`.
//!
//! Creation only calls down: into the data graph (`graph.rs`) to allocate
//! and link, and into `destroy.rs` for what it hands on (a css's release
//! is `css_release`; a css refused by `css_online` is freed a grace period
//! later, as the kernel's error path does). Neither calls creation back,
//! so it is a layer of its own between them and the
//! [`Hierarchy`](super::Hierarchy) API.

use super::destroy::css_release;
use super::error::CgroupError;
use super::graph::{CgroupNode, Css, CssInit, CssPtr, Inner, Work, CSS_ONLINE};
use super::options::RefcntMode;
use super::panics::CallbackPanics;
use crate::sync::{self, Ordering};
use std::sync::Arc;

/// `css_create`, under `cgroup_mutex`. A panicking `css_alloc` or
/// `css_online` is undone as a refusal; its panic is kept in `panics`.
pub(crate) fn css_create(
    inner: &Arc<Inner>,
    node: &Arc<CgroupNode>,
    ssid: usize,
    panics: &mut CallbackPanics,
) -> Result<CssPtr, CgroupError> {
    let subsys = &inner.subsys[ssid];
    let parent_node = node.parent.as_ref().expect("css_create: not for the root");
    // ordering-audit: Relaxed: the parent's slot is written under cgroup_mutex, which we hold.
    let parent = CssPtr::from_raw(parent_node.subsys[ssid].load(Ordering::Relaxed))
        .expect("css_create: an online parent cgroup has an online css");
    let id = inner.idrs[ssid]
        .alloc(2)
        .ok_or_else(|| CgroupError::IdsExhausted {
            subsys: subsys.name().to_string(),
        })?;
    let p = new_css(inner, id, ssid, Some(parent), node, Some(Arc::clone(inner)));
    // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
    inner.nr_css.fetch_add(1, Ordering::Relaxed);
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
        inner.idrs[ssid].remove(id);
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        inner.nr_css.fetch_sub(1, Ordering::Relaxed);
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
        inner.queue_rcu_work(Work::Free(p));
        return Err(refused("css_online", reason));
    }
    inner.idrs[ssid].publish(id, p.as_ptr());
    Ok(p)
}

/// Makes the root cgroup's css of subsystem `ssid`, at hierarchy
/// creation (no `cgroup_mutex`: nothing else can reach the hierarchy).
///
/// # Panics
///
/// If the subsystem refuses it, once the css is undone.
pub(crate) fn create_root_css(inner: &mut Inner, ssid: usize) {
    let ss = inner.subsys[ssid].clone();
    let id = inner.idrs[ssid]
        .alloc(1)
        .expect("a fresh id table has id 1");
    let root = inner.root.clone();
    let p = new_css(inner, id, ssid, None, &root, None);
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

/// Allocates a css of subsystem `ssid` in `cgroup`, counting in the
/// hierarchy's [`RefcntMode`], with `css_release` as its release.
fn new_css(
    inner: &Inner,
    id: u32,
    ssid: usize,
    parent: Option<CssPtr>,
    cgroup: &Arc<CgroupNode>,
    hier: Option<Arc<Inner>>,
) -> CssPtr {
    Css::alloc(CssInit {
        id,
        ssid,
        parent,
        cgroup: cgroup.clone(),
        subsys: inner.subsys[ssid].clone(),
        hier,
        atomic_refcnt: inner.opts.refcnt == RefcntMode::Atomic,
        // The release callback only records the release (see `destroy.rs`):
        // it must not run destroy work inside the `PercpuRef` call.
        release: css_release,
    })
}

/// `online_css`: the subsystem's `css_online`, then mark online, publish in
/// the cgroup's `subsys[]`, and count in `online_cnt` (own and parent's).
/// A panicking `css_online` counts as a refusal (the panic is kept).
fn online_css(css: &Css, panics: &mut CallbackPanics) -> Result<(), String> {
    panics
        .call(|| css.subsys.css_online(css))
        .unwrap_or_else(|| Err(String::from("css_online panicked")))?;
    css.set_flags(CSS_ONLINE);
    // ordering-audit: kept (rcu_assign_pointer): publishes the css's fields to `Cgroup::css`
    // readers. No model races them: a cgroup's handle escapes mkdir only after this store.
    css.cgroup.subsys[css.ssid()].store(css.ptr().as_ptr(), Ordering::Release);
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
