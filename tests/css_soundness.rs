//! Soundness of the css model (issue 10, items 1, 2, 3, 10 and 11): every
//! handle keeps what it points at alive; no css is freed while its own
//! release is on the stack; a panicking subsystem callback or a failed
//! charge leaves the hierarchy usable and leaks nothing.
//!
//! Several of these are only *detected* by Miri (a read of freed memory
//! or a deallocation under a live borrow can look fine in a plain run);
//! the assertions check what a plain run can see (which callbacks ran,
//! what was freed). Run them, and the other css tests (Miri-sized under
//! `cfg(miri)`), under Miri with tree borrows:
//!
//! ```text
//! MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-disable-isolation -Zmiri-ignore-leaks" \
//!   cargo +nightly miri test --test css_soundness --test css_lifecycle --test css_stress
//! ```
//!
//! `-Zmiri-ignore-leaks`: crossbeam-epoch keeps its global garbage (queue
//! nodes, records of exited threads) behind pointers stored as integers,
//! which Miri's leak check cannot follow, so it reports them at exit. The
//! tests check the css model's own frees instead (`nr_css`, the `Free`
//! events, root csses included).

#![allow(dead_code, unused_imports)]

mod css_common;
use css_common::check_lifecycle;

use percpu_ref::css::{
    Css, CssRef, CssState, Event, EventKind, EventLog, Hierarchy, Options, Pages, Recorder, Subsys,
    WorkMode,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

fn events(log: &EventLog) -> Vec<Event> {
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn count(log: &EventLog, kind: EventKind, path: &str) -> usize {
    events(log)
        .iter()
        .filter(|e| e.kind == kind && e.path == path)
        .count()
}

/// Lets grace-period work queued earlier run, for a css whose hierarchy
/// has no handle left to flush: a scratch hierarchy's flush waits for a
/// free queued after it (crossbeam-epoch collects in order).
fn wait_grace_period() {
    let h = Hierarchy::with_options(
        vec![Recorder::new("scratch")],
        Options {
            max_css_ids: 8,
            ..Options::default()
        },
    );
    let a = h.mkdir(&h.root(), "a").unwrap();
    h.rmdir(&a).unwrap();
    assert!(h.flush());
}

/// The root css of `log`'s hierarchy was released and freed, once each
/// (at once on its last put: it needs no grace period).
fn assert_root_freed(log: &EventLog) {
    assert_eq!(count(log, EventKind::Released, "/"), 1, "{:?}", events(log));
    assert_eq!(count(log, EventKind::Free, "/"), 1, "{:?}", events(log));
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        String::from("(not a string)")
    }
}

// ----- item 1: a CssRefs holding zero references ----------------------------

/// `get_many(0)` and `put_many(count())` leave a `CssRefs` that can still be
/// dereferenced, so it must still keep its css alive.
#[test]
fn css_refs_with_zero_count_keeps_the_css_alive() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let b = h.mkdir(&h.root(), "b").unwrap();
    let (ca, cb) = (a.css(0).unwrap(), b.css(0).unwrap());
    let zero = ca.get_many(0);
    let mut drained = cb.get_many(3);
    drained.put_many(drained.count());
    assert_eq!((zero.count(), drained.count()), (0, 0));
    drop((ca, cb));
    h.rmdir(&a).unwrap();
    h.rmdir(&b).unwrap();
    assert!(h.flush());
    let log = rec.log();
    assert_eq!(
        count(&log, EventKind::Free, "/a"),
        0,
        "freed under a CssRefs"
    );
    assert_eq!(
        count(&log, EventKind::Free, "/b"),
        0,
        "freed under a CssRefs"
    );
    assert_eq!(h.nr_css(), 2);
    // Both still readable.
    assert_eq!(
        (zero.cgroup_path(), zero.state()),
        ("/a", CssState::Offline)
    );
    assert_eq!(
        (drained.cgroup_path(), drained.state()),
        ("/b", CssState::Offline)
    );
    let id = zero.id();
    drop(zero);
    drop(drained);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&rec.events()), 2);
    let guard = h.rcu_read_lock();
    assert!(h.css_from_id(0, id, &guard).is_none());
}

// ----- item 11: a charge that cannot be stored -------------------------------

/// `Pages::charge` of more pages than can be stored panics before taking
/// any reference, so the css of a removed cgroup is still freed.
#[test]
fn failed_charge_takes_no_reference() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let css = a.css(0).unwrap();
    let mut pages = Pages::new();
    pages.charge(&css, 2);
    let err = catch_unwind(AssertUnwindSafe(|| pages.charge(&css, 1 << 61)));
    assert!(err.is_err(), "2^61 pages cannot be stored");
    assert_eq!(pages.len(), 2);
    h.rmdir(&a).unwrap();
    assert_eq!(css.refcnt_atomic_count(), Some(3), "ours and two pages'");
    drop(css);
    drop(pages);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0, "the failed charge leaked references");
    assert_eq!(check_lifecycle(&rec.events()), 1);
}
