//! What a `Ref` clone/drop costs next to a raw `PercpuRef` get/put.
//!
//! Prints ns per pair for both on one thread (percpu mode), and keeps the
//! four operations in `#[inline(never)]` functions with unmangled names so
//! their code can be compared:
//!
//! ```text
//! cargo build --release -p percpu-ref-tools --bin owned_cost
//! objdump -d --no-show-raw-insn target/release/owned_cost \
//!     | awk '/<owned_cost_(ref_clone|raw_get|ref_drop|raw_put)>:/,/^$/'
//! ```
//!
//! Run: `cargo run --release -p percpu-ref-tools --bin owned_cost [iterations]`

use percpu_ref::owned::{Owner, Ref};
use percpu_ref::PercpuRef;
use std::hint::black_box;
use std::mem::ManuallyDrop;
use std::time::Instant;

/// `Ref::clone`, forgotten so that only the get is measured.
#[no_mangle]
#[inline(never)]
pub fn owned_cost_ref_clone(r: &Ref<u64>) -> ManuallyDrop<Ref<u64>> {
    ManuallyDrop::new(r.clone())
}

/// `Ref`'s drop.
#[no_mangle]
#[inline(never)]
pub fn owned_cost_ref_drop(r: ManuallyDrop<Ref<u64>>) {
    drop(ManuallyDrop::into_inner(r))
}

/// A raw percpu get.
#[no_mangle]
#[inline(never)]
pub fn owned_cost_raw_get(p: &PercpuRef) {
    p.get()
}

/// A raw percpu put.
#[no_mangle]
#[inline(never)]
pub fn owned_cost_raw_put(p: &PercpuRef) {
    p.put()
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000_000);
    let owner = Owner::new(7u64);
    let r = owner.get();
    let raw = PercpuRef::new(|_| {});
    println!(
        "backend: {}, {iters} pairs each, one thread",
        percpu_ref::backend()
    );
    for round in 0..3 {
        let t = Instant::now();
        for _ in 0..iters {
            owned_cost_ref_drop(owned_cost_ref_clone(black_box(&r)));
        }
        let owned = t.elapsed().as_nanos() as f64 / iters as f64;
        let t = Instant::now();
        for _ in 0..iters {
            owned_cost_raw_get(black_box(&raw));
            owned_cost_raw_put(black_box(&raw));
        }
        let rawt = t.elapsed().as_nanos() as f64 / iters as f64;
        println!(
            "round {round}: Ref clone+drop {owned:6.2} ns/pair   PercpuRef get+put {rawt:6.2} ns/pair   ratio {:.2}",
            owned / rawt
        );
    }
    drop(r);
    raw.kill_sync().unwrap();
}
