//! Benchmarks of the css model, after the 2013 seeds.
//!
//! 1. `css_charge_uncharge/{mode}/{threads}`: a page-fault-style loop on
//!    every thread in one cgroup: each "page" is a `css_get` on charge and
//!    a `css_put` on uncharge. `percpu` is this crate's css; `atomic_refcnt`
//!    is the same css with its `PercpuRef` made `INIT_ATOMIC` (one shared
//!    counter, same code path: a CAS loop, since a get must not revive a
//!    zero count); `atomic_usize` is the pre-2013 kernel css, a bare
//!    `atomic_inc`/`atomic_dec_and_test` (`fetch_add`/`fetch_sub`), the
//!    cheapest possible shared counter. Time is per get/put pair per
//!    thread; throughput counts pairs on all threads.
//! 2. `css_move_charge/{root_to_child|child_to_child}/{pages}`: moving N
//!    charged pages between cgroups (`mem_cgroup_move_charge`: count,
//!    `css_get_many` on the target, move each page, `css_put_many` on the
//!    source). Throughput is per page. The root css is counted per CPU
//!    like any css (unlike the kernel's `CSS_NO_REF` root), so both
//!    directions make one `get_many` and one `put_many` per move.
//!    Seed (2013, 252 MB = 64512 pages): 0.21 s root→child (3.3 µs/page),
//!    0.43 s child→child (6.7 µs/page), linear in size; the kernel's time
//!    was mostly page-table walking and res_counter charging.
//!
//! Run briefly: `cargo bench --features css --bench css -- --warm-up-time 0.3 --measurement-time 1`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use percpu_ref::css::{Hierarchy, Options, Pages, Recorder, RefcntMode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

fn thread_counts() -> Vec<usize> {
    let n = num_cpus::get().max(1);
    let mut v = vec![1];
    if n > 1 {
        v.push(n);
    }
    v
}

/// Runs `op` `iters` times on each of `threads` threads; returns the wall
/// time from the common start to the last finish.
/// Generic (not `&dyn Fn`) so that `op` inlines into the loop: an indirect
/// call per operation would cost more than the percpu get/put it measures.
fn run_threads(threads: usize, iters: u64, op: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    op();
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

fn charge_uncharge(c: &mut Criterion) {
    let mut g = c.benchmark_group("css_charge_uncharge");
    for threads in thread_counts() {
        g.throughput(Throughput::Elements(threads as u64));
        for (name, mode) in [
            ("percpu", RefcntMode::Percpu),
            ("atomic_refcnt", RefcntMode::Atomic),
        ] {
            let h = Hierarchy::with_options(
                vec![Recorder::new("memory")],
                Options {
                    refcnt: mode,
                    ..Options::default()
                },
            );
            let cg = h.mkdir(&h.root(), "bench").unwrap();
            let css = cg.css(0).unwrap();
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| {
                    run_threads(t, iters, || {
                        let page = css.get(); // charge
                        drop(std::hint::black_box(page)); // uncharge
                    })
                })
            });
            drop(css);
            h.rmdir(&cg).unwrap();
            assert!(h.flush());
        }
        let count = AtomicUsize::new(1);
        g.bench_with_input(
            BenchmarkId::new("atomic_usize", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|iters| {
                    run_threads(t, iters, || {
                        count.fetch_add(1, Ordering::Relaxed);
                        if count.fetch_sub(1, Ordering::Release) == 1 {
                            unreachable!("the base reference is held");
                        }
                    })
                })
            },
        );
    }
    g.finish();
}

fn move_charge(c: &mut Criterion) {
    let mut g = c.benchmark_group("css_move_charge");
    g.sample_size(10);
    let h = Hierarchy::new(vec![Recorder::new("memory")]);
    let root = h.root();
    let (a, b) = (h.mkdir(&root, "a").unwrap(), h.mkdir(&root, "b").unwrap());
    let (cr, ca, cb) = (root.css(0).unwrap(), a.css(0).unwrap(), b.css(0).unwrap());
    for shift in [10u32, 14, 16, 18, 20] {
        let n = 1usize << shift;
        g.throughput(Throughput::Elements(n as u64));
        for (name, from, to) in [("root_to_child", &cr, &ca), ("child_to_child", &ca, &cb)] {
            let mut pages = Pages::new();
            pages.charge(from, n);
            g.bench_with_input(BenchmarkId::new(name, n), &n, |bch, &n| {
                bch.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t = Instant::now();
                        let moved = pages.move_charge(from, to);
                        total += t.elapsed();
                        assert_eq!(moved, n);
                        pages.move_charge(to, from); // back, untimed
                    }
                    total
                })
            });
        }
    }
    g.finish();
    drop((cr, ca, cb));
    h.rmdir(&a).unwrap();
    h.rmdir(&b).unwrap();
    assert!(h.flush());
}

criterion_group!(benches, charge_uncharge, move_charge);
criterion_main!(benches);
