//! A hot shared object with a shutdown gate: many threads take and drop
//! references; the owner kills the ref and waits for the last user.
//!
//! `cargo run --release --example hot_object`

use percpu_ref::{backend, PercpuRef};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

fn main() {
    let threads = num_cpus::get().max(2) * 2;
    let drained = Arc::new((Mutex::new(false), Condvar::new()));
    let r = {
        let drained = drained.clone();
        Arc::new(PercpuRef::new(move |_| {
            *drained.0.lock().unwrap() = true;
            drained.1.notify_all();
        }))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (r, stop, ops) = (r.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                // Users enter through tryget_live: once the owner kills the
                // ref, no new user gets in.
                while !stop.load(Ordering::Relaxed) && r.tryget_live() {
                    r.get();
                    r.put();
                    r.put();
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    r.kill().expect("first kill");
    let kill_time = t.elapsed();
    let (lock, cv) = &*drained;
    let mut done = lock.lock().unwrap();
    while !*done {
        done = cv.wait(done).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    println!(
        "backend {}: {} threads did {} entries; kill took {:?}; released after the last user left",
        backend(),
        threads,
        ops.load(Ordering::Relaxed),
        kill_time
    );
}
