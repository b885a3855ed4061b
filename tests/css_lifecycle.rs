//! Lifecycle order of the css model: every callback exactly once, in the
//! kernel's order; children offline and freed before their parents; the
//! errors of busy and removed cgroups.

mod css_common;
use css_common::check_lifecycle;

use percpu_ref::css::{
    BusyReason, Cgroup, CgroupError, Css, CssState, Event, EventKind, EventLog, Hierarchy, Options,
    Pages, Recorder, RefcntMode, Subsys, WorkMode,
};
use std::sync::{Arc, Mutex};

fn two_recorders() -> (EventLog, Vec<Arc<dyn Subsys>>) {
    let log = EventLog::default();
    let ss: Vec<Arc<dyn Subsys>> = vec![
        Recorder::with_log("memory", log.clone()),
        Recorder::with_log("io", log.clone()),
    ];
    (log, ss)
}

fn events(log: &EventLog) -> Vec<Event> {
    log.lock().unwrap().clone()
}

fn sample_tree(refcnt: RefcntMode) {
    let (log, ss) = two_recorders();
    let h = Hierarchy::with_options(
        ss,
        Options {
            refcnt,
            ..Options::default()
        },
    );
    let root = h.root();
    let a = h.mkdir(&root, "a").unwrap();
    let b = h.mkdir(&a, "b").unwrap();
    let c = h.mkdir(&a, "c").unwrap();
    let d = h.mkdir(&root, "d").unwrap();
    assert_eq!(h.nr_css(), 8);

    let tb = h.spawn(&b).unwrap();
    let tc = h.spawn(&c).unwrap();
    let mut pages = Pages::new();
    pages.charge_task(&tb, 0, 100);
    pages.charge_task(&tc, 0, 50);
    pages.charge_task(&tc, 1, 10);

    // Busy and removed cgroups are refused with errors naming them.
    let e = h.rmdir(&b).unwrap_err();
    assert_eq!(
        e,
        CgroupError::Busy {
            path: "/a/b".into(),
            reason: BusyReason::HasTasks(1)
        }
    );
    assert_eq!(e.to_string(), "rmdir /a/b: busy: 1 task(s) attached");
    let e = h.rmdir(&a).unwrap_err();
    assert_eq!(
        e,
        CgroupError::Busy {
            path: "/a".into(),
            reason: BusyReason::HasChildren(vec!["b".into(), "c".into()])
        }
    );
    assert!(e.to_string().contains("b, c"));
    assert_eq!(h.rmdir(&root), Err(CgroupError::Root { op: "rmdir" }));
    assert_eq!(
        h.mkdir(&a, "b").unwrap_err(),
        CgroupError::Exists {
            path: "/a/b".into()
        }
    );
    assert!(matches!(
        h.mkdir(&a, "x/y"),
        Err(CgroupError::InvalidName { .. })
    ));

    // Move the tasks out, and b's charges with its task (the recharge).
    h.attach(&tb, &d).unwrap();
    let (from, to) = (b.css(0).unwrap(), d.css(0).unwrap());
    assert_eq!(pages.move_charge(&from, &to), 100);
    drop((from, to));
    h.attach(&tc, &root).unwrap();

    h.rmdir(&b).unwrap();
    assert_eq!(
        h.rmdir(&b),
        Err(CgroupError::Removed {
            op: "rmdir",
            path: "/a/b".into()
        })
    );
    assert_eq!(
        h.mkdir(&b, "z").unwrap_err(),
        CgroupError::Removed {
            op: "mkdir",
            path: "/a/b".into()
        }
    );
    assert!(b.css(0).is_none(), "no tryget_online after rmdir");
    h.rmdir(&c).unwrap();
    h.rmdir(&a).unwrap();
    assert!(h.flush());
    // b had no references left: released and freed. c's css 0 and 1 are
    // pinned by charges; a is pinned by c (and offline).
    let ev = events(&log);
    let has = |k: EventKind, p: &str| ev.iter().any(|e| e.kind == k && e.path == p);
    assert!(has(EventKind::Free, "/a/b"));
    assert!(has(EventKind::Offline, "/a/c") && !has(EventKind::Released, "/a/c"));
    assert!(has(EventKind::Offline, "/a") && !has(EventKind::Released, "/a"));

    // d is busy (tb); move it back and remove d too.
    h.attach(&tb, &root).unwrap();
    h.rmdir(&d).unwrap();
    drop(pages); // the last references on c (and d)
    drop((tb, tc));
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(h.nr_css_ids(0), 1);
    assert_eq!(h.nr_css_ids(1), 1);
    assert_eq!(check_lifecycle(&events(&log)), 8);
}

#[test]
fn sample_tree_percpu() {
    sample_tree(RefcntMode::Percpu);
}

#[test]
fn sample_tree_atomic_refcnt() {
    sample_tree(RefcntMode::Atomic);
}

#[test]
fn parent_offline_waits_for_children_online_cnt() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::with_options(
        vec![rec.clone()],
        Options {
            work: WorkMode::Manual,
            ..Options::default()
        },
    );
    let a = h.mkdir(&h.root(), "a").unwrap();
    let b = h.mkdir(&a, "b").unwrap();
    let c = h.mkdir(&a, "c").unwrap();
    let ca = a.css(0).unwrap();
    let cb = b.css(0).unwrap();
    h.rmdir(&b).unwrap();
    h.rmdir(&c).unwrap();
    // The cgroups are offline at once, so a can be removed while its
    // children's csses still wait for their offline work.
    h.rmdir(&a).unwrap();
    assert_eq!(ca.state(), CssState::Dying);
    assert_eq!(cb.state(), CssState::Dying);
    assert!(ca.tryget_online().is_none() && cb.tryget_online().is_none());
    assert!(!rec.events().iter().any(|e| e.kind == EventKind::Offline));
    // The kills complete on the grace-period engine; their confirms queue
    // b's and c's offline work (a's own confirm finds a child online).
    percpu_ref::flush();
    assert!(!rec.events().iter().any(|e| e.kind == EventKind::Offline));
    // b's and c's offline work each walk up; the second one offlines a.
    assert_eq!(h.run_destroy_work(), 2 + 1); // 2 offline + c's release
    assert_eq!(ca.state(), CssState::Offline);
    assert_eq!(cb.state(), CssState::Offline);
    let offline: Vec<String> = rec
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::Offline)
        .map(|e| e.path)
        .collect();
    assert_eq!(offline, ["/a/b", "/a/c", "/a"]);
    drop(cb);
    drop(ca);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&rec.events()), 3);
}

/// A subsystem that records the state each callback sees.
#[derive(Default)]
struct StateSpy {
    seen: Mutex<Vec<(&'static str, CssState)>>,
}

impl Subsys for StateSpy {
    fn name(&self) -> &str {
        "spy"
    }
    fn css_online(&self, css: &Css) -> Result<(), String> {
        self.seen.lock().unwrap().push(("online", css.state()));
        Ok(())
    }
    fn css_offline(&self, css: &Css) {
        self.seen.lock().unwrap().push(("offline", css.state()));
    }
    fn css_released(&self, css: &Css) {
        self.seen.lock().unwrap().push(("released", css.state()));
    }
    fn css_free(&self, css: &Css) {
        self.seen.lock().unwrap().push(("free", css.state()));
    }
}

#[test]
fn states_seen_by_callbacks_and_queries() {
    let spy = Arc::new(StateSpy::default());
    let h = Hierarchy::new(vec![spy.clone()]);
    let a = h.mkdir(&h.root(), "a").unwrap();
    let css = a.css(0).unwrap();
    assert_eq!(css.state(), CssState::Online);
    assert!(css.refcnt_is_percpu());
    let id = css.id();
    h.rmdir(&a).unwrap();
    assert!(css.is_dying() && css.tryget_online().is_none());
    percpu_ref::flush(); // the kill completes, its confirm offlines the css
    assert_eq!(css.state(), CssState::Offline);
    assert!(css.is_dying() && !css.is_online());
    // Killed: atomic now, and the count is exactly what is held (ours).
    assert_eq!(css.refcnt_atomic_count(), Some(1));
    {
        let guard = h.rcu_read_lock();
        let found = h
            .css_from_id(0, id, &guard)
            .expect("published until release");
        assert!(found.tryget_online().is_none());
        assert!(found.tryget().is_some());
    }
    drop(css);
    assert!(h.flush());
    let guard = h.rcu_read_lock();
    assert!(h.css_from_id(0, id, &guard).is_none());
    let root = h.root().css(0).unwrap();
    assert!(root.is_root() && root.refcnt_is_percpu());
    drop(root);
    let seen = spy.seen.lock().unwrap().clone();
    let a_seen: Vec<_> = seen[1..].to_vec(); // [0] is the root's online
    assert_eq!(
        a_seen,
        [
            ("online", CssState::New),
            ("offline", CssState::Dying), // flips to Offline right after
            ("released", CssState::Released),
            ("free", CssState::Released),
        ]
    );
}

/// Refuses to bring any non-root css online.
struct Picky {
    inner: Arc<Recorder>,
    refuse_online: bool,
}

impl Subsys for Picky {
    fn name(&self) -> &str {
        "picky"
    }
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        self.inner.css_alloc(css)
    }
    fn css_online(&self, css: &Css) -> Result<(), String> {
        if self.refuse_online && css.cgroup_path() != "/" {
            return Err("no room".into());
        }
        self.inner.css_online(css)
    }
    fn css_offline(&self, css: &Css) {
        self.inner.css_offline(css)
    }
    fn css_released(&self, css: &Css) {
        self.inner.css_released(css)
    }
    fn css_free(&self, css: &Css) {
        self.inner.css_free(css)
    }
}

#[test]
fn mkdir_refused_by_a_subsystem_undoes_everything() {
    let log = EventLog::default();
    let picky = Arc::new(Picky {
        inner: Recorder::with_log("picky", log.clone()),
        refuse_online: true,
    });
    let h = Hierarchy::new(vec![Recorder::with_log("memory", log.clone()), picky]);
    let e = h.mkdir(&h.root(), "a").unwrap_err();
    assert_eq!(
        e.to_string(),
        "mkdir /a: picky's css_online refused: no room"
    );
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    let of = |ss: &str| -> Vec<EventKind> {
        events(&log)
            .into_iter()
            .filter(|e| e.path == "/a" && e.subsys == ss)
            .map(|e| e.kind)
            .collect()
    };
    use EventKind::*;
    // The made css is destroyed as by rmdir; the refused one was never
    // online, so it is only freed (after a grace period).
    assert_eq!(of("memory"), [Alloc, Online, Offline, Released, Free]);
    assert_eq!(of("picky"), [Alloc, Free]);
    // Nothing of /a is left: the name can be used again.
    let root: Cgroup = h.root();
    assert!(h.mkdir(&root, "a").is_err(), "picky still refuses");
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
}

#[test]
fn charges_pin_removed_cgroups_and_move_with_get_many() {
    let rec = Recorder::new("memory");
    let h = Hierarchy::new(vec![rec.clone()]);
    let root = h.root();
    let a = h.mkdir(&root, "a").unwrap();
    let b = h.mkdir(&root, "b").unwrap();
    let (cr, ca, cb) = (root.css(0).unwrap(), a.css(0).unwrap(), b.css(0).unwrap());
    let mut pages = Pages::new();
    pages.charge(&cr, 10);
    assert_eq!(pages.move_charge(&cr, &ca), 10); // root -> child
    assert_eq!(pages.move_charge(&ca, &cb), 10); // child -> child
    assert_eq!(pages.charged_to(&cb), 10);
    assert_eq!(pages.charged_to(&ca), 0);
    drop((cr, ca, cb));
    h.rmdir(&a).unwrap();
    h.rmdir(&b).unwrap();
    assert!(h.flush());
    assert_eq!(h.nr_css(), 1, "b's css is pinned by 10 pages");
    assert_eq!(pages.uncharge(4), 4);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 1);
    assert_eq!(pages.uncharge(100), 6);
    assert!(h.flush());
    assert_eq!(h.nr_css(), 0);
    assert_eq!(check_lifecycle(&rec.events()), 2);
}

#[test]
#[should_panic(expected = "cgroup_mutex held by this thread")]
fn subsystem_calling_back_into_the_hierarchy_panics() {
    struct Reentrant(Mutex<Option<Hierarchy>>);
    impl Subsys for Reentrant {
        fn name(&self) -> &str {
            "reentrant"
        }
        fn css_offline(&self, _css: &Css) {
            let h = self.0.lock().unwrap().clone().unwrap();
            let _ = h.mkdir(&h.root(), "nested");
        }
    }
    let ss = Arc::new(Reentrant(Mutex::new(None)));
    let h = Hierarchy::new(vec![ss.clone()]);
    *ss.0.lock().unwrap() = Some(h.clone());
    let a = h.mkdir(&h.root(), "a").unwrap();
    h.rmdir(&a).unwrap();
    // The offline runs once the kill completes, on the grace-period engine,
    // which keeps the panic for `flush`.
    let _ = h.flush();
}

#[test]
fn wrong_hierarchy_is_refused() {
    let h1 = Hierarchy::new(vec![Recorder::new("memory")]);
    let h2 = Hierarchy::new(vec![Recorder::new("memory")]);
    let a = h1.mkdir(&h1.root(), "a").unwrap();
    assert!(matches!(
        h2.rmdir(&a),
        Err(CgroupError::WrongHierarchy { op: "rmdir", .. })
    ));
    let t = h1.spawn(&a).unwrap();
    assert!(matches!(
        h2.attach(&t, &h2.root()),
        Err(CgroupError::WrongHierarchy { .. })
    ));
    drop(t);
    h1.rmdir(&a).unwrap();
    assert!(h1.flush());
}
