//! Small concurrent runs of the protocol, sized so that Miri can execute
//! them (`cargo +nightly miri test --test small_races`): Miri checks every
//! access for data races and undefined behaviour, and explores thread
//! interleavings with its own scheduler.

use percpu_ref::{InitFlags, PercpuRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;

const THREADS: usize = 4;
const OPS: usize = if cfg!(miri) { 200 } else { 20_000 };

#[test]
fn switches_gets_puts_and_kill() {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        Arc::new(PercpuRef::with_flags(
            move |_| {
                releases.fetch_add(1, SeqCst);
            },
            InitFlags::ALLOW_REINIT,
        ))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let switcher = {
        let (r, stop) = (r.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(SeqCst) {
                r.switch_to_atomic_sync();
                r.switch_to_percpu().unwrap();
                thread::yield_now();
            }
        })
    };
    r.get_many(THREADS);
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let r = r.clone();
            thread::spawn(move || {
                for _ in 0..OPS {
                    assert!(r.tryget_live());
                    r.get_many(2);
                    r.put_many(3);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, SeqCst);
    switcher.join().unwrap();
    r.kill_sync().unwrap();
    assert_eq!(r.atomic_count(), Some(THREADS as u64));
    assert_eq!(releases.load(SeqCst), 0);
    r.put_many(THREADS);
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn tryget_live_against_kill_and_resurrect() {
    let r = Arc::new(PercpuRef::with_flags(|_| {}, InitFlags::ALLOW_REINIT));
    let confirmed = Arc::new(AtomicBool::new(false));
    r.get_many(THREADS); // one per worker, taken before the kill can happen
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (r, confirmed) = (r.clone(), confirmed.clone());
            thread::spawn(move || {
                for _ in 0..OPS {
                    let seen = confirmed.load(SeqCst);
                    if r.tryget_live() {
                        assert!(!seen, "tryget_live succeeded after confirm");
                        r.put();
                    }
                }
                r.put();
            })
        })
        .collect();
    let flag = confirmed.clone();
    r.kill_and_confirm_sync(move |_| flag.store(true, SeqCst))
        .unwrap();
    for w in workers {
        w.join().unwrap();
    }
    assert!(r.is_zero());
    r.reinit().unwrap();
    assert!(r.tryget_live());
}
