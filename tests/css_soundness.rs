//! Soundness of the css model: every
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

// ----- item 2: the root css outlives every handle on it ----------------------

/// A `CssRef` on the root css, the hierarchy dropped first.
#[test]
fn root_css_ref_outlives_the_hierarchy() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let r = h.root().css(0).unwrap();
    let log = rec.log();
    drop(h);
    assert_eq!(
        count(&log, EventKind::Released, "/"),
        0,
        "released while referenced"
    );
    assert_eq!(
        count(&log, EventKind::Free, "/"),
        0,
        "freed while referenced"
    );
    assert!(r.is_root());
    assert_eq!(r.cgroup_path(), "/");
    assert_eq!(r.state(), CssState::Offline, "the hierarchy is gone");
    assert!(r.tryget_online().is_none());
    let r2 = r.tryget().expect("still referenced");
    drop(r);
    assert_eq!(count(&log, EventKind::Released, "/"), 0);
    drop(r2);
    assert_eq!(count(&log, EventKind::Released, "/"), 1);
    assert_root_freed(&log);
    let kinds: Vec<EventKind> = events(&log).iter().map(|e| e.kind).collect();
    use EventKind::*;
    assert_eq!(kinds, [Alloc, Online, Offline, Released, Free]);
}

/// A root `Cgroup` handle: its css slots are cleared when the hierarchy
/// goes, so `css()` finds nothing instead of a freed css.
#[test]
fn root_cgroup_handle_outlives_the_hierarchy() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let root = h.root();
    let log = rec.log();
    drop(h);
    assert_eq!(count(&log, EventKind::Released, "/"), 1);
    assert!(root.css(0).is_none(), "the root css was taken down");
    assert!(!root.is_online());
    assert_eq!(root.path(), "/");
    assert_root_freed(&log);
    assert!(root.css(0).is_none());
}

/// `Cgroup::css` on the root on other threads while the last hierarchy
/// handle is dropped: each call finds the root css and keeps it, or finds
/// nothing; never a freed css.
#[test]
fn root_cgroup_css_races_with_the_hierarchy_drop() {
    let rounds = if cfg!(miri) { 3 } else { 200 };
    for _ in 0..rounds {
        let rec = Recorder::new("memory");
        let h = Hierarchy::new(vec![rec.clone()]);
        let root = h.root();
        let log = rec.log();
        let got = std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let root = root.clone();
                    s.spawn(move || {
                        let mut kept = Vec::new();
                        for _ in 0..4 {
                            if let Some(r) = root.css(0) {
                                assert_eq!(r.cgroup_path(), "/");
                                kept.push(r);
                            }
                            std::thread::yield_now();
                        }
                        kept
                    })
                })
                .collect();
            drop(h);
            readers
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert!(root.css(0).is_none());
        let freed = count(&log, EventKind::Free, "/");
        assert_eq!(freed, usize::from(got.is_empty()));
        drop(got);
        assert_root_freed(&log);
    }
}

/// A task in the root cgroup: its css_set holds the root css.
#[test]
fn task_in_root_outlives_the_hierarchy() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let task = h.spawn(&h.root()).unwrap();
    let log = rec.log();
    drop(h);
    assert_eq!(
        count(&log, EventKind::Released, "/"),
        0,
        "released under a task"
    );
    assert_eq!(count(&log, EventKind::Free, "/"), 0, "freed under a task");
    assert_eq!(task.css_set().css(0).cgroup_path(), "/");
    let r = task.get_css(0);
    assert!(r.is_root());
    drop(r);
    assert_eq!(task.cgroup().nr_tasks(), 1);
    drop(task);
    assert_eq!(count(&log, EventKind::Released, "/"), 1);
    assert_root_freed(&log);
}

/// Pages charged to the root css.
#[test]
fn pages_charged_to_root_outlive_the_hierarchy() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let mut pages = Pages::new();
    {
        let (cr, ca) = (h.root().css(0).unwrap(), a.css(0).unwrap());
        pages.charge(&cr, 5);
        pages.charge(&ca, 2);
    }
    h.rmdir(&a).unwrap();
    let log = rec.log();
    drop(h); // /a is pinned by its pages, the hierarchy by /a
    assert_eq!(count(&log, EventKind::Offline, "/"), 0);
    assert_eq!(pages.uncharge(2), 2); // /a's last references
    wait_grace_period();
    for _ in 0..100 {
        if count(&log, EventKind::Free, "/a") == 1 {
            break;
        }
        wait_grace_period();
    }
    assert_eq!(count(&log, EventKind::Free, "/a"), 1);
    // /a's free dropped the last hierarchy reference: the root went offline
    // but five pages still hold it.
    assert_eq!(count(&log, EventKind::Offline, "/"), 1);
    assert_eq!(
        count(&log, EventKind::Released, "/"),
        0,
        "released under pages"
    );
    assert_eq!(pages.len(), 5);
    drop(pages);
    assert_eq!(count(&log, EventKind::Released, "/"), 1);
    assert_root_freed(&log);
}

/// `css_from_id` finds the root css too; what it returns is bound to the
/// hierarchy handle and the guard (a `compile_fail` doctest on
/// `Hierarchy::css_from_id` checks it cannot outlive them). Here: a
/// reference taken from it keeps the root css alive.
#[test]
fn root_found_by_id_then_referenced_outlives_the_hierarchy() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let r = {
        let guard = h.rcu_read_lock();
        let root_id = h.root().css(0).unwrap().id();
        h.css_from_id(0, root_id, &guard).unwrap().tryget().unwrap()
    };
    let log = rec.log();
    drop(h);
    assert_eq!(count(&log, EventKind::Released, "/"), 0);
    assert!(r.is_root());
    drop(r);
    assert_root_freed(&log);
}

// ----- item 3: no css is freed inside its own release -----------------------

/// A subsystem that holds a reference on one css and drops it in another
/// css's `css_released`.
struct DropOnRelease {
    rec: Arc<Recorder>,
    trigger: &'static str,
    held: Mutex<Option<CssRef>>,
}

impl Subsys for DropOnRelease {
    fn name(&self) -> &str {
        "drop-on-release"
    }
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        self.rec.css_alloc(css)
    }
    fn css_online(&self, css: &Css) -> Result<(), String> {
        self.rec.css_online(css)
    }
    fn css_offline(&self, css: &Css) {
        self.rec.css_offline(css)
    }
    fn css_released(&self, css: &Css) {
        self.rec.css_released(css);
        if css.cgroup_path() == self.trigger {
            drop(self.held.lock().unwrap().take());
        }
    }
    fn css_free(&self, css: &Css) {
        self.rec.css_free(css)
    }
}

/// The last put on css A runs A's release; A's `css_released` drops the
/// last reference on css B; B's release and grace period let A's free run.
/// It must not run while A's `PercpuRef::put` (and its release closure)
/// is still on the stack: Miri with tree borrows reported "deallocation ...
/// protected" here.
#[test]
fn css_is_not_freed_inside_its_own_release() {
    let rec = Recorder::new("memory");
    let ss = Arc::new(DropOnRelease {
        rec: rec.clone(),
        trigger: "/a",
        held: Mutex::new(None),
    });
    let h = Hierarchy::new(vec![ss.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let b = h.mkdir(&h.root(), "b").unwrap();
    let ra = a.css(0).unwrap();
    *ss.held.lock().unwrap() = Some(b.css(0).unwrap());
    h.rmdir(&b).unwrap();
    h.rmdir(&a).unwrap();
    assert_eq!(h.nr_css(), 2);
    drop(ra); // A's last reference, from a thread not holding cgroup_mutex
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&rec.events()), 2);
}

/// The same window without nesting: the last references are dropped on
/// other threads while this one holds `cgroup_mutex` and runs destroy
/// work; a release must not be visible to the destroy work before the
/// put that made it has returned.
#[test]
fn last_puts_on_other_threads_race_with_destroy_work() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let n = if cfg!(miri) { 3 } else { 16 };
    let rounds = if cfg!(miri) { 2 } else { 50 };
    for round in 0..rounds {
        let cgs: Vec<_> = (0..n)
            .map(|i| h.mkdir(&h.root(), &format!("r{round}c{i}")).unwrap())
            .collect();
        let refs: Vec<CssRef> = cgs.iter().map(|c| c.css(0).unwrap()).collect();
        for cg in &cgs {
            h.rmdir(cg).unwrap();
        }
        std::thread::scope(|s| {
            for r in refs {
                s.spawn(move || drop(r));
            }
            for i in 0..n {
                h.run_destroy_work();
                let x = h.mkdir(&h.root(), &format!("r{round}x{i}")).unwrap();
                h.rmdir(&x).unwrap();
            }
        });
        assert!(h.flush());
    }
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&rec.events()), 2 * n * rounds);
}

// ----- item 10: a panicking subsystem callback ------------------------------

/// Records every callback; panics once in `callback` on `/a`.
struct PanicOnce {
    rec: Arc<Recorder>,
    callback: EventKind,
    armed: AtomicBool,
}

impl PanicOnce {
    fn new(callback: EventKind) -> (Arc<PanicOnce>, EventLog) {
        let rec = Recorder::new("panicky");
        let log = rec.log();
        let ss = Arc::new(PanicOnce {
            rec,
            callback,
            armed: AtomicBool::new(true),
        });
        (ss, log)
    }

    fn maybe_panic(&self, kind: EventKind, css: &Css) {
        if kind == self.callback
            && css.cgroup_path() == "/a"
            && self.armed.swap(false, Ordering::SeqCst)
        {
            panic!("{} of /a failed", kind.callback());
        }
    }
}

impl Subsys for PanicOnce {
    fn name(&self) -> &str {
        "panicky"
    }
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        self.rec.css_alloc(css)?;
        self.maybe_panic(EventKind::Alloc, css);
        Ok(())
    }
    fn css_online(&self, css: &Css) -> Result<(), String> {
        self.rec.css_online(css)?;
        self.maybe_panic(EventKind::Online, css);
        Ok(())
    }
    fn css_offline(&self, css: &Css) {
        self.rec.css_offline(css);
        self.maybe_panic(EventKind::Offline, css);
    }
    fn css_released(&self, css: &Css) {
        self.rec.css_released(css);
        self.maybe_panic(EventKind::Released, css);
    }
    fn css_free(&self, css: &Css) {
        self.rec.css_free(css);
        self.maybe_panic(EventKind::Free, css);
    }
}

/// `css_offline` panics in the offline work that `rmdir`'s kill queued
/// (from its confirm, on the grace-period engine): the panic comes out of
/// `rmdir` or of the next `flush`, the offline
/// work still finishes (the css is released and freed), and the thread can
/// use the hierarchy again.
#[test]
fn panic_in_css_offline_after_rmdir() {
    let (ss, log) = PanicOnce::new(EventKind::Offline);
    let h = Hierarchy::new(vec![ss.clone(), Recorder::with_log("memory", log.clone())]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    // The offline runs on the engine (no caller: `flush` resumes the
    // panic), or, if `rmdir` still held cgroup_mutex when the engine
    // queued it, in `rmdir`'s unlock (which resumes it).
    let err = catch_unwind(AssertUnwindSafe(|| {
        h.rmdir(&a).unwrap();
        let _ = h.flush();
    }))
    .expect_err("the panic propagates");
    assert_eq!(panic_message(&*err), "css_offline of /a failed");
    // The hierarchy is usable on this thread.
    let b = h
        .mkdir(&h.root(), "b")
        .expect("mkdir after a panicking callback");
    h.rmdir(&b).unwrap();
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0, "the offline work was not lost");
    assert_eq!(check_lifecycle(&events(&log)), 4);
}

/// `css_released` panics in the put that released the css: the panic
/// reaches that put's caller, and the css is still freed.
#[test]
fn panic_in_css_released_during_the_last_put() {
    let (ss, log) = PanicOnce::new(EventKind::Released);
    let h = Hierarchy::new(vec![ss.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let r = a.css(0).unwrap();
    h.rmdir(&a).unwrap();
    percpu_ref::flush(); // offline: only `r` holds the css
    let err = catch_unwind(AssertUnwindSafe(|| drop(r))).expect_err("the panic propagates");
    assert_eq!(panic_message(&*err), "css_released of /a failed");
    let b = h.mkdir(&h.root(), "b").unwrap();
    h.rmdir(&b).unwrap();
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&events(&log)), 2);
}

/// `css_free` runs after a grace period, from whichever call ran the free
/// work; its panic comes out of `flush` (at most once), and the css is
/// freed all the same.
#[test]
fn panic_in_css_free_surfaces_from_flush() {
    let (ss, log) = PanicOnce::new(EventKind::Free);
    let h = Hierarchy::new(vec![ss.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    h.rmdir(&a).unwrap();
    let mut panics = Vec::new();
    for _ in 0..5 {
        match catch_unwind(AssertUnwindSafe(|| h.flush())) {
            Ok(done) => {
                assert!(done);
                break;
            }
            Err(p) => panics.push(panic_message(&*p)),
        }
    }
    assert_eq!(panics, ["css_free of /a failed"]);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(h.nr_css_ids(0), 1);
    let b = h.mkdir(&h.root(), "b").unwrap();
    h.rmdir(&b).unwrap();
    assert!(h.flush());
    assert_eq!(check_lifecycle(&events(&log)), 2);
}

/// `css_alloc` or `css_online` panicking in `mkdir`: undone as a refusal
/// (nothing of the new cgroup is left), and the panic reaches the caller.
#[test]
fn panic_in_css_alloc_or_online_during_mkdir() {
    for callback in [EventKind::Alloc, EventKind::Online] {
        let (ss, log) = PanicOnce::new(callback);
        let h = Hierarchy::new(vec![Recorder::with_log("memory", log.clone()), ss.clone()]);
        let err = catch_unwind(AssertUnwindSafe(|| h.mkdir(&h.root(), "a")))
            .expect_err("the panic propagates");
        assert_eq!(
            panic_message(&*err),
            format!("{} of /a failed", callback.callback())
        );
        assert!(h.flush());
        assert_eq!(h.nr_css(), 0, "{callback:?}: nothing of /a is left");
        assert_eq!(h.nr_css_ids(0), 1);
        assert_eq!(h.nr_css_ids(1), 1);
        // The name is free again, and the thread can take cgroup_mutex.
        let a = h.mkdir(&h.root(), "a").unwrap();
        h.rmdir(&a).unwrap();
        assert!(h.flush());
        assert_eq!(h.nr_css(), 0);
    }
}

/// The same in `WorkMode::Manual`, where the offline runs in
/// `run_destroy_work`: the panic comes out of it, and the rest of the
/// queue still runs.
#[test]
fn panic_in_css_offline_during_run_destroy_work() {
    let (ss, log) = PanicOnce::new(EventKind::Offline);
    let h = Hierarchy::with_options(
        vec![ss.clone()],
        Options {
            work: WorkMode::Manual,
            ..Options::default()
        },
    );
    let a = h.mkdir(&h.root(), "a").unwrap();
    let b = h.mkdir(&h.root(), "b").unwrap();
    h.rmdir(&a).unwrap();
    h.rmdir(&b).unwrap();
    percpu_ref::flush(); // the kills' confirms queue the offline work
    let err = catch_unwind(AssertUnwindSafe(|| h.run_destroy_work())).expect_err("propagates");
    assert_eq!(panic_message(&*err), "css_offline of /a failed");
    assert_eq!(count(&log, EventKind::Offline, "/b"), 1, "the queue ran on");
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&events(&log)), 2);
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
    percpu_ref::flush(); // the kill and the offline put their references
    assert_eq!(css.refcnt_atomic_count(), Some(3), "ours and two pages'");
    drop(css);
    drop(pages);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0, "the failed charge leaked references");
    assert_eq!(check_lifecycle(&rec.events()), 1);
}

// ----- css ids are u32 -------------------------------------------------------

/// A table of more ids than `u32` holds is refused up front with a message
/// naming the option, not truncated (ids would wrap and alias).
#[cfg(target_pointer_width = "64")]
#[test]
fn max_css_ids_above_u32_panics_clearly() {
    let p = catch_unwind(|| {
        Hierarchy::with_options(
            vec![Recorder::new("io")],
            Options {
                max_css_ids: (1 << 32) + 1,
                ..Options::default()
            },
        )
    })
    .expect_err("a table of 2^32 + 1 ids must be refused");
    let msg = panic_message(&*p);
    assert!(
        msg.contains("max_css_ids") && msg.contains("4294967297"),
        "{msg}"
    );
}
