//! criterion version of the copy-size matrix (the `copy_size_table`
//! program of tools/): threads pinned one per CPU loop on get, memcpy of
//! `size` bytes, put, on one shared object; "atomic" is an `AtomicUsize`,
//! "percpu" a `PercpuRef` on the process default backend (and on the
//! sharded backend too when the default is another one), and "floor" the
//! same loop with no counting, so that each counter's cost is its time
//! above the floor.
//!
//! Each criterion iteration is one loop on *every* thread, timed with
//! `iter_custom` as the slowest thread's busy time, and the throughput is
//! reported per loop, so `elem/s` is the table's "loops per second".
//!
//! ```text
//! cargo bench --bench copy_size -- --warm-up-time 0.3 --measurement-time 1
//! ```

#[path = "common/copy_size.rs"]
mod harness;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use harness::Kind;
use percpu_ref::Backend;
use std::time::Duration;

const SIZES: [usize; 6] = [0, 32, 64, 128, 256, 512];

/// 1, 2, 4, ... up to the CPUs this process may run on, and that count.
fn thread_counts() -> Vec<usize> {
    let cpus = harness::allowed_cpus().len();
    let mut t: Vec<usize> = std::iter::successors(Some(1usize), |&n| n.checked_mul(2))
        .take_while(|&n| n < cpus)
        .collect();
    t.push(cpus.max(1));
    t
}

fn kinds() -> Vec<Kind> {
    let mut k = vec![Kind::Atomic, Kind::Percpu(percpu_ref::backend())];
    if percpu_ref::backend() != Backend::Sharded {
        k.push(Kind::Percpu(Backend::Sharded));
    }
    k.push(Kind::None);
    k
}

fn copy_size(c: &mut Criterion) {
    for threads in thread_counts() {
        let mut g = c.benchmark_group(format!("copy_size/threads={threads}"));
        g.throughput(Throughput::Elements(threads as u64));
        for size in SIZES {
            for kind in kinds() {
                g.bench_with_input(BenchmarkId::new(kind.name(), size), &size, |b, &size| {
                    b.iter_custom(|iters| harness::time_iters(kind, threads, size, iters))
                });
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    // 6 sizes x 3+ kinds x every thread count: keep each point short by
    // default; the command line (--measurement-time ...) overrides this.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = copy_size
}
criterion_main!(benches);
