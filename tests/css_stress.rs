//! Concurrency stress of the css model: threads charging and uncharging
//! pages, looking csses up by id and trying online references, migrating
//! tasks with their charges, while others make and remove whole subtrees.
//! More threads than cores, so preemption lands everywhere. At the end
//! every css went through each callback exactly once, in order, children
//! before parents, and every css was freed.
//!
//! Under Miri (`cfg(miri)`) the same test runs with a few rounds and
//! operations per thread, to check the interleavings it does see for
//! undefined behaviour (see `tests/css_soundness.rs` for the command).

mod css_common;

use css_common::check_lifecycle;
use percpu_ref::css::{
    Cgroup, CgroupError, CssState, EventLog, Hierarchy, Options, Pages, Recorder,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod common;

/// A small xorshift generator (no dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Shared {
    h: Hierarchy,
    live: Mutex<Vec<Cgroup>>,
    stop: AtomicBool,
    ops: AtomicU64,
    lookups_ok: AtomicU64,
}

/// Removes `cgs` (a subtree listed parents first) bottom-up, retrying while
/// a migrating task sits in one. Returns how many were removed.
///
/// The retries back off to sleeping and are bounded by time, not by count:
/// a rmdir that fails takes and drops `cgroup_mutex`, and retried in a
/// tight loop it can keep taking it back before the migrator that would
/// leave the cgroup (asleep on that mutex) gets it. CI once saw 10,000
/// yielding retries pass in under 0.15 s that way on 2 busy cores.
fn rmdir_subtree(s: &Shared, cgs: &[Cgroup]) -> usize {
    let mut removed = 0;
    for cg in cgs.iter().rev() {
        let deadline = Instant::now() + Duration::from_secs(30);
        for attempt in 0u64.. {
            match s.h.rmdir(cg) {
                Ok(()) => {
                    removed += 1;
                    break;
                }
                Err(CgroupError::Busy { .. }) if Instant::now() < deadline => {
                    if attempt < 100 {
                        thread::yield_now();
                    } else {
                        thread::sleep(Duration::from_micros(100));
                    }
                }
                Err(e) => panic!("rmdir {} (after {attempt} retries): {e}", cg.path()),
            }
        }
    }
    removed
}

#[test]
fn css_stress() {
    let scale: u64 = if cfg!(debug_assertions) { 1 } else { 10 };
    let miri = cfg!(miri);
    let log = EventLog::default();
    // Under Miri a small id table: each access to the table's slice is
    // checked over its whole length (65536 slots by default).
    let max_css_ids = if miri {
        512
    } else {
        Options::default().max_css_ids
    };
    let h = Hierarchy::with_options(
        vec![
            Recorder::with_log("memory", log.clone()),
            Recorder::with_log("io", log.clone()),
        ],
        Options {
            max_css_ids,
            ..Options::default()
        },
    );
    let s = Arc::new(Shared {
        h: h.clone(),
        live: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        lookups_ok: AtomicU64::new(0),
    });
    let (destroyers, chargers, migrators, lookers) = if miri { (1, 2, 1, 1) } else { (2, 3, 2, 2) };
    let start = Arc::new(Barrier::new(destroyers + chargers + migrators + lookers));
    let mut handles = Vec::new();

    // Destroyers: make a subtree, publish it, then remove all of it.
    let rounds = if miri { 3 } else { 30 * scale };
    for t in 0..destroyers {
        let (s, start) = (s.clone(), start.clone());
        handles.push(thread::spawn(move || {
            start.wait();
            let root = s.h.root();
            let mut made = 0;
            for r in 0..rounds {
                let top = s.h.mkdir(&root, &format!("t{t}r{r}")).unwrap();
                let x = s.h.mkdir(&top, "x").unwrap();
                let y = s.h.mkdir(&top, "y").unwrap();
                let z = s.h.mkdir(&y, "z").unwrap();
                let tree = vec![top, x, y, z];
                s.live.lock().unwrap().extend(tree.iter().cloned());
                thread::yield_now();
                s.live.lock().unwrap().retain(|c| !tree.contains(c));
                made += rmdir_subtree(&s, &tree);
            }
            made
        }));
    }

    // Chargers: the page-fault path on a task that migrators do not move.
    let charges = if miri { 40 } else { 100_000 * scale };
    let hop_every = if miri { 10 } else { 1000 };
    let lookups: u64 = if miri { 8 } else { 64 };
    for t in 0..chargers {
        let (s, start) = (s.clone(), start.clone());
        handles.push(thread::spawn(move || {
            let task = s.h.spawn(&s.h.root()).unwrap();
            let mut pages = Pages::new();
            let mut rng = Rng(0x9e37_79b9 + t as u64);
            start.wait();
            for i in 0..charges {
                pages.charge_task(&task, (i & 1) as usize, 1);
                pages.uncharge(1);
                if i % hop_every == 0 {
                    // Hop into a live cgroup now and then, leaving a few pages
                    // charged there (they pin its css after rmdir).
                    let target = s.live.lock().unwrap().first().cloned();
                    if let Some(cg) = target {
                        if s.h.attach(&task, &cg).is_ok() {
                            pages.charge_task(&task, rng.below(2), 3);
                            s.h.attach(&task, &s.h.root()).unwrap();
                        }
                    }
                    if pages.len() > 30 {
                        pages.uncharge(15);
                    }
                }
            }
            s.ops.fetch_add(2 * charges, Ordering::Relaxed);
            0
        }));
    }

    // Migrators: move a task into live cgroups and back with its charges.
    for t in 0..migrators {
        let (s, start) = (s.clone(), start.clone());
        handles.push(thread::spawn(move || {
            let task = s.h.spawn(&s.h.root()).unwrap();
            let mut pages = Pages::new();
            let mut rng = Rng(0x1234_5678 + t as u64);
            start.wait();
            while !s.stop.load(Ordering::Relaxed) {
                let target = {
                    let live = s.live.lock().unwrap();
                    (!live.is_empty()).then(|| live[rng.below(live.len())].clone())
                };
                let Some(cg) = target else {
                    thread::yield_now();
                    continue;
                };
                if s.h.attach(&task, &cg).is_err() {
                    continue; // removed meanwhile
                }
                pages.charge_task(&task, 0, 64);
                let from = task.get_css(0);
                s.h.attach(&task, &s.h.root()).unwrap();
                let to = task.get_css(0);
                // The recharge at task move: get_many on the new css,
                // put_many on the old (which may be offline by now).
                assert_eq!(pages.move_charge(&from, &to), 64);
                drop(from);
                pages.uncharge(64);
                s.ops.fetch_add(1, Ordering::Relaxed);
            }
            0
        }));
    }

    // Lookers: css_from_id under RCU, then tryget_online / tryget.
    for t in 0..lookers {
        let (s, start) = (s.clone(), start.clone());
        handles.push(thread::spawn(move || {
            let mut rng = Rng(0xdead_beef + t as u64);
            start.wait();
            while !s.stop.load(Ordering::Relaxed) {
                let guard = s.h.rcu_read_lock();
                for _ in 0..lookups {
                    let ssid = rng.below(2);
                    let id = 1 + rng.below(256) as u32;
                    let Some(css) = s.h.css_from_id(ssid, id, &guard) else {
                        continue;
                    };
                    // Reading a css found under RCU is fine whatever its state.
                    let _ = (css.cgroup_path().len(), css.state());
                    if let Some(r) = css.tryget_online() {
                        assert_ne!(r.state(), CssState::Released);
                        s.lookups_ok.fetch_add(1, Ordering::Relaxed);
                    } else if let Some(r) = css.tryget() {
                        assert_ne!(r.state(), CssState::Released);
                        assert!(r.is_dying() || r.is_root());
                    }
                }
                drop(guard);
                s.ops.fetch_add(lookups, Ordering::Relaxed);
            }
            0
        }));
    }

    let mut made = 0;
    let mut iter = handles.into_iter();
    for hd in iter.by_ref().take(destroyers + chargers) {
        made += hd.join().unwrap();
    }
    s.stop.store(true, Ordering::Relaxed);
    for hd in iter {
        hd.join().unwrap();
    }
    assert_eq!(made as u64, destroyers as u64 * rounds * 4);
    assert!(h.flush(), "destroy work or grace periods did not finish");
    assert_eq!(h.nr_css(), 0, "every css was freed");
    assert_eq!(h.nr_css_ids(0), 1);
    let events = log.lock().unwrap().clone();
    let checked = check_lifecycle(&events);
    assert_eq!(checked as u64, 2 * destroyers as u64 * rounds * 4);
    eprintln!(
        "css_stress: {} ops, {} online lookups, {} csses through the whole lifecycle",
        s.ops.load(Ordering::Relaxed),
        s.lookups_ok.load(Ordering::Relaxed),
        checked
    );
    common::report_counts();
}
