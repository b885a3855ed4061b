//! Each `PercpuRef` operation alone, on one thread, in percpu mode and in
//! atomic mode (`INIT_ATOMIC`), on every available backend; with a plain
//! `AtomicUsize` and `Arc` clone/drop as reference columns.
//!
//! Operations that leave a count behind (get, tryget, tryget_live) are
//! balanced with one untimed `put_many` after the timed loop; `put` is
//! prepared with one untimed `get_many`. `kill` gets a fresh ref per
//! iteration (`iter_batched`, the drop is not timed). Switches are timed
//! one direction at a time, the way back untimed.
//!
//! ```text
//! cargo bench --bench ops -- --warm-up-time 0.3 --measurement-time 1
//! ```

#[path = "common/copy_size.rs"]
mod harness;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use harness::{AtomicCounter, Counter};
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The backends this process can run.
fn backends() -> Vec<Backend> {
    [Backend::Rseq, Backend::Sharded]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// (column name, backend, flags) for both modes on every backend.
fn columns() -> Vec<(String, Backend, InitFlags)> {
    let mut out = Vec::new();
    for b in backends() {
        out.push((format!("percpu/{b}"), b, InitFlags::ALLOW_REINIT));
        out.push((format!("atomic-mode/{b}"), b, InitFlags::INIT_ATOMIC));
    }
    out
}

fn new_ref(b: Backend, flags: InitFlags) -> PercpuRef {
    PercpuRef::with_backend(|_| {}, flags, b).expect("backend listed as available")
}

/// Times `iters` calls of `op` on a fresh ref; `before` and `after` run
/// untimed (to prepare and to balance the count).
fn timed(
    b: Backend,
    flags: InitFlags,
    iters: u64,
    before: impl Fn(&PercpuRef, usize),
    op: impl Fn(&PercpuRef),
    after: impl Fn(&PercpuRef, usize),
) -> Duration {
    let r = new_ref(b, flags);
    let n = usize::try_from(iters).expect("iteration count fits usize");
    before(&r, n);
    let t = Instant::now();
    for _ in 0..iters {
        op(black_box(&r));
    }
    let d = t.elapsed();
    after(&r, n);
    d
}

fn none(_: &PercpuRef, _: usize) {}

fn get_put_ops(c: &mut Criterion) {
    // get
    let mut g = c.benchmark_group("get");
    for (name, b, f) in columns() {
        g.bench_function(BenchmarkId::from_parameter(&name), |bn| {
            bn.iter_custom(|it| timed(b, f, it, none, |r| r.get(), |r, n| r.put_many(n)))
        });
    }
    g.bench_function(BenchmarkId::from_parameter("atomic_usize"), |bn| {
        let a = AtomicCounter::new();
        bn.iter_custom(|it| {
            let t = Instant::now();
            for _ in 0..it {
                black_box(&a).get();
            }
            let d = t.elapsed();
            (0..it).for_each(|_| a.put());
            d
        })
    });
    g.bench_function(BenchmarkId::from_parameter("arc_clone"), |bn| {
        let a = Arc::new(0u64);
        bn.iter_custom(|it| {
            let t = Instant::now();
            for _ in 0..it {
                std::mem::forget(black_box(&a).clone());
            }
            let d = t.elapsed();
            for _ in 0..it {
                // SAFETY: the pointer comes from `a`, which is alive, and each
                // decrement matches one forgotten clone above.
                unsafe { Arc::decrement_strong_count(Arc::as_ptr(&a)) };
            }
            d
        })
    });
    g.finish();

    // put
    let mut g = c.benchmark_group("put");
    for (name, b, f) in columns() {
        g.bench_function(BenchmarkId::from_parameter(&name), |bn| {
            bn.iter_custom(|it| timed(b, f, it, |r, n| r.get_many(n), |r| r.put(), none))
        });
    }
    g.bench_function(BenchmarkId::from_parameter("atomic_usize"), |bn| {
        let a = AtomicCounter::new();
        bn.iter_custom(|it| {
            (0..it).for_each(|_| a.get());
            let t = Instant::now();
            for _ in 0..it {
                black_box(&a).put();
            }
            t.elapsed()
        })
    });
    g.bench_function(BenchmarkId::from_parameter("arc_drop"), |bn| {
        let a = Arc::new(0u64);
        bn.iter_custom(|it| {
            (0..it).for_each(|_| std::mem::forget(a.clone()));
            let p = Arc::as_ptr(&a);
            let t = Instant::now();
            for _ in 0..it {
                // SAFETY: `p` points into `a`, which is alive; each decrement
                // matches one forgotten clone above.
                unsafe { Arc::decrement_strong_count(black_box(p)) };
            }
            t.elapsed()
        })
    });
    g.finish();

    // get + put pairs, the unit of the copy-size loop
    let mut g = c.benchmark_group("get_put");
    for (name, b, f) in columns() {
        g.bench_function(BenchmarkId::from_parameter(&name), |bn| {
            let r = new_ref(b, f);
            bn.iter(|| {
                let r = black_box(&r);
                r.get();
                r.put();
            })
        });
    }
    g.bench_function(BenchmarkId::from_parameter("atomic_usize"), |bn| {
        let a = AtomicCounter::new();
        bn.iter(|| {
            let a = black_box(&a);
            a.get();
            a.put();
        })
    });
    g.bench_function(BenchmarkId::from_parameter("arc_clone_drop"), |bn| {
        let a = Arc::new(0u64);
        bn.iter(|| drop(black_box(&a).clone()))
    });
    g.finish();

    // tryget, tryget_live
    for (op, f_op) in [
        ("tryget", PercpuRef::tryget as fn(&PercpuRef) -> bool),
        ("tryget_live", PercpuRef::tryget_live),
    ] {
        let mut g = c.benchmark_group(op);
        for (name, b, f) in columns() {
            g.bench_function(BenchmarkId::from_parameter(&name), |bn| {
                bn.iter_custom(|it| {
                    timed(
                        b,
                        f,
                        it,
                        none,
                        |r| assert!(black_box(f_op(r))),
                        |r, n| r.put_many(n),
                    )
                })
            });
        }
        g.finish();
    }
}

fn lifecycle_ops(c: &mut Criterion) {
    // kill: a fresh ref each time; it releases (count 1 -> 0) inside kill.
    let mut g = c.benchmark_group("kill");
    for (name, b, f) in columns() {
        g.bench_function(BenchmarkId::from_parameter(&name), |bn| {
            bn.iter_batched(
                || new_ref(b, f),
                |r| {
                    r.kill_sync().expect("fresh ref is alive");
                    r
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    // switch_to_atomic_sync: a real switch (from percpu, switched back untimed)
    // and a redundant one (already atomic).
    let mut g = c.benchmark_group("switch_to_atomic_sync");
    for b in backends() {
        g.bench_function(
            BenchmarkId::from_parameter(format!("from-percpu/{b}")),
            |bn| {
                let r = new_ref(b, InitFlags::ALLOW_REINIT);
                bn.iter_custom(|it| {
                    let mut d = Duration::ZERO;
                    for _ in 0..it {
                        let t = Instant::now();
                        black_box(&r).switch_to_atomic_sync();
                        d += t.elapsed();
                        r.switch_to_percpu().expect("ALLOW_REINIT");
                    }
                    d
                })
            },
        );
        g.bench_function(
            BenchmarkId::from_parameter(format!("already-atomic/{b}")),
            |bn| {
                let r = new_ref(b, InitFlags::INIT_ATOMIC);
                bn.iter(|| black_box(&r).switch_to_atomic_sync())
            },
        );
    }
    g.finish();

    // switch_to_percpu: the other direction.
    let mut g = c.benchmark_group("switch_to_percpu");
    for b in backends() {
        g.bench_function(
            BenchmarkId::from_parameter(format!("from-atomic/{b}")),
            |bn| {
                let r = new_ref(b, InitFlags::INIT_ATOMIC);
                bn.iter_custom(|it| {
                    let mut d = Duration::ZERO;
                    for _ in 0..it {
                        let t = Instant::now();
                        black_box(&r).switch_to_percpu().expect("ALLOW_REINIT");
                        d += t.elapsed();
                        r.switch_to_atomic_sync();
                    }
                    d
                })
            },
        );
        g.bench_function(
            BenchmarkId::from_parameter(format!("already-percpu/{b}")),
            |bn| {
                let r = new_ref(b, InitFlags::ALLOW_REINIT);
                bn.iter(|| black_box(&r).switch_to_percpu().expect("ALLOW_REINIT"))
            },
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = get_put_ops, lifecycle_ops
}
criterion_main!(benches);
