//! A hot shared object on the owning layer: many threads look it up and
//! use it through counted references, then the owner shuts it down, waits
//! for the last user to leave and gets the object back.
//!
//! Each request enters through `Weak::tryget_live`, as a lookup in a table
//! would: once the owner kills, no new request gets in, while requests
//! already inside finish with the references they hold. One slow request,
//! still running at the kill, shows that `wait` blocks until it is done.
//!
//! `cargo run --release --example hot_object`

use percpu_ref::backend;
use percpu_ref::owned::{Owner, Ref};
use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The shared object: read by every request, never written while shared
/// (a shared counter in it would bring back the contended cache line the
/// per-CPU count avoids).
struct Device {
    name: String,
    table: Vec<u64>,
}

/// One request: it is handed a reference and passes one further down,
/// which is a clone (a per-CPU get) and a drop (a put).
fn serve(dev: &Ref<Device>, key: usize) -> u64 {
    let held = Ref::clone(dev);
    held.table[key % held.table.len()]
}

fn main() {
    let threads = num_cpus::get().max(2) * 2;
    let owner = Owner::new(Device {
        name: String::from("dev0"),
        table: (0..64).collect(),
    });
    // What a lookup table would hold: the allocation, not the value.
    let lookup = owner.downgrade();

    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let lookup = lookup.clone();
            std::thread::spawn(move || {
                let mut requests = 0usize;
                let mut sum = 0u64;
                while let Some(dev) = lookup.tryget_live() {
                    sum = sum.wrapping_add(serve(&dev, t + requests));
                    requests += 1;
                }
                black_box(sum);
                requests
            })
        })
        .collect();

    // A slow request: it holds its reference across the kill, and finishes
    // 100 ms after it is told to (a channel, so that the output does not
    // depend on how the threads are scheduled).
    let (finish, finish_rx) = mpsc::channel::<()>();
    let slow = {
        let dev = owner.get();
        std::thread::spawn(move || {
            finish_rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            drop(dev);
        })
    };

    std::thread::sleep(Duration::from_millis(300));
    let ran = start.elapsed();
    let t = Instant::now();
    // Synchronous: the switch to atomic mode (a grace period) is complete
    // when it returns, and from then on tryget_live fails.
    let killed = owner.kill();
    let kill_time = t.elapsed();
    let requests: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    // Every other request has left; the slow one still holds the object.
    assert!(!killed.is_released());
    let t = Instant::now();
    finish.send(()).unwrap();
    let dev = killed.wait();
    let drain_time = t.elapsed();
    slow.join().unwrap();
    assert!(lookup.tryget().is_none()); // released: not even tryget gets in

    println!(
        "backend {}: {} threads served {} requests on {} in {:.0?} ({:.1} M/s), \
         each a tryget_live and a clone: two get+put pairs",
        backend(),
        threads,
        requests,
        dev.name,
        ran,
        requests as f64 / ran.as_secs_f64() / 1e6
    );
    println!("kill: {kill_time:?} (the switch to atomic mode, grace period included)");
    println!(
        "wait: {drain_time:.0?} until the slow request (told to finish, 100 ms of work) \
         dropped the last reference; then {} came back to the owner with its {}-entry table",
        dev.name,
        dev.table.len()
    );
}
