//! Loom models of the css lifecycle.
//!
//! crossbeam-epoch does not run under loom, so under `cfg(loom)` the
//! hierarchy holds grace-period work until `Hierarchy::flush`, which the
//! models call after joining their threads (see `src/css/rcu.rs`). The
//! models check what is ours: kill vs `css_tryget_online`, the offline
//! and release ordering, and destroy work run by whichever thread gets
//! `cgroup_mutex`.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --features css --test loom_css`
#![cfg(percpu_ref_loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
mod common;

use percpu_ref::css::{Css, CssState, EventKind, Hierarchy, Recorder, Subsys};

/// The css models run within 2 preemptions (or `LOOM_MAX_PREEMPTIONS`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    common::check(2, f);
}

/// Sets a flag when the css goes offline.
struct OfflineFlag(Arc<AtomicBool>);
impl Subsys for OfflineFlag {
    fn name(&self) -> &str {
        "flag"
    }
    fn css_offline(&self, css: &Css) {
        if !css.is_root() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// Once `css_offline` has run (after the kill's confirm), no
/// `css_tryget_online` succeeds; one that failed finds the css dying; a
/// lookup by id never sees a released css; the css is freed exactly once
/// after the last reference.
#[test]
fn kill_css_vs_tryget_online() {
    model(|| {
        let offline = Arc::new(AtomicBool::new(false));
        let h = Hierarchy::new(vec![std::sync::Arc::new(OfflineFlag(offline.clone()))]);
        let a = h.mkdir(&h.root(), "a").unwrap();
        let id = a.css(0).unwrap().id();
        let h2 = h.clone();
        let t = loom::thread::spawn(move || {
            let guard = h2.rcu_read_lock();
            let was_offline = offline.load(Ordering::SeqCst);
            let css = h2.css_from_id(0, id, &guard);
            let got = css.and_then(|css| css.tryget_online());
            if was_offline {
                assert!(got.is_none(), "tryget_online succeeded after css_offline");
            }
            if let (Some(css), None) = (css, &got) {
                // It failed because the css was killed: this thread read the
                // refcount dead, so css_is_dying says so too (here, not just
                // once something orders this thread after the killer).
                if let Some(r) = css.tryget() {
                    assert!(r.is_dying(), "tryget_online failed, yet not dying");
                    let state = r.state();
                    assert!(
                        matches!(state, CssState::Dying | CssState::Offline),
                        "tryget_online failed, yet {state:?}"
                    );
                }
            }
            if let Some(r) = &got {
                assert_ne!(r.state(), CssState::Released);
            }
            drop(got); // may be the last put: release runs on this thread
        });
        h.rmdir(&a).unwrap();
        t.join().unwrap();
        assert!(h.flush());
        assert_eq!(h.nr_css(), 0);
    });
}

/// A parent with two children, removed while another thread drops the last
/// reference on one child: children go offline and are freed before the
/// parent, every callback once.
#[test]
fn parent_with_two_children_offline_and_free_order() {
    model(|| {
        let rec = Recorder::new("memory");
        let h = Hierarchy::new(vec![rec.clone()]);
        let a = h.mkdir(&h.root(), "a").unwrap();
        let b = h.mkdir(&a, "b").unwrap();
        let c = h.mkdir(&a, "c").unwrap();
        let rb = b.css(0).unwrap();
        let h2 = h.clone();
        let t = loom::thread::spawn(move || {
            h2.rmdir(&b).unwrap();
            h2.rmdir(&c).unwrap();
            h2.rmdir(&a).unwrap();
        });
        drop(rb); // races with the rmdirs: release before or after offline
        t.join().unwrap();
        assert!(h.flush());
        assert_eq!(h.nr_css(), 0);
        let ev = rec.events();
        let at = |k: EventKind, p: &str| {
            let hits: Vec<usize> = ev
                .iter()
                .enumerate()
                .filter(|(_, e)| e.kind == k && e.path == p)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(hits.len(), 1, "{k:?} {p}: {ev:?}");
            hits[0]
        };
        for k in [EventKind::Offline, EventKind::Released, EventKind::Free] {
            for child in ["/a/b", "/a/c"] {
                assert!(at(k, child) < at(k, "/a"), "{k:?}: {child} after /a");
            }
        }
        for p in ["/a", "/a/b", "/a/c"] {
            assert!(at(EventKind::Offline, p) < at(EventKind::Released, p));
            assert!(at(EventKind::Released, p) < at(EventKind::Free, p));
        }
    });
}

/// A lookup by id racing the mkdir that publishes the css: ids are handed
/// out in order, so another thread can find the new css as soon as the id
/// table has it, and must then see it initialised (the css's fields are
/// plain memory; a loom-only cell stands for them). Catches a publication
/// without release, or a lookup without acquire (the ordering audit's
/// weakened `Idr::publish` / `Idr::find`).
#[test]
fn mkdir_vs_css_from_id() {
    model(|| {
        let h = Hierarchy::new(vec![Recorder::new("cpu")]);
        let root_id = h.root().css(0).unwrap().id();
        let h2 = h.clone();
        let t = loom::thread::spawn(move || {
            let guard = h2.rcu_read_lock();
            // The first id after the root's.
            if let Some(css) = h2.css_from_id(0, root_id + 1, &guard) {
                assert_eq!(css.cgroup_path(), "/a");
            }
        });
        let a = h.mkdir(&h.root(), "a").unwrap();
        t.join().unwrap();
        assert_eq!(a.css(0).unwrap().id(), root_id + 1);
    });
}
