//! `N` get+put pairs on one `PercpuRef` (or on an `AtomicUsize` / `Arc`),
//! for counting instructions per pair with callgrind
//! (`scripts/callgrind-pair`) or timing one thread quickly.
//!
//! Usage: `pair_loop <rseq|sharded|rseq-atomic|atomic|arc|shared|shared-str|rseq-churn|sharded-churn|new-churn|arc-churn|floor-churn|shared-churn> <n>`
//!
//! `rseq-atomic` is a get + put on an `INIT_ATOMIC` ref of the rseq backend:
//! the section finds atomic mode and the pair takes the atomic counter's
//! one `fetch_add` and one `fetch_sub`.
//!
//! The `-churn` variants make a new ref (or `Arc`) per iteration, do one
//! get + put (clone + drop) on it and drop it; `new-churn` makes it with
//! `PercpuRef::new` (the default backend), the others with a chosen one.
//!
//! `shared` is a clone + drop of a promoted `percpu_ref::shared::Shared`
//! (per CPU; its engine's rounds while the loop runs are counted too),
//! `shared-str` the same on a `Shared<str>` (a wide handle), and
//! `shared-churn` a `Shared::new` + clone + drop of both (never promoted:
//! the last drop drops the value), as `arc-churn` for `Arc`.
//!
//! `floor-churn` is `arc-churn` with one test added before each clone and
//! each drop: [`Floor`], the least that counting in `Arc`'s word can cost
//! when the count may move elsewhere (module docs of `Floor`).
//!
//! Valgrind disables rseq (glibc's registration fails, `__rseq_size` = 0),
//! so built with `RUSTFLAGS="--cfg percpu_ref_callgrind"` this program
//! first points the rseq backend at a fake, never-registered rseq area
//! whose `cpu_id` is 0: the fast path then executes exactly the
//! instructions it executes on a registered thread (the same machine code;
//! only the area's address differs), while nothing can abort it. Without
//! that cfg it uses whatever backend the process has.

use percpu_ref::shared::Shared;
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[inline(never)]
fn percpu_pairs(r: &PercpuRef, n: u64) {
    for _ in 0..n {
        r.get();
        r.put();
    }
}

#[inline(never)]
fn atomic_pairs(a: &AtomicUsize, n: u64) {
    for _ in 0..n {
        a.fetch_add(1, Ordering::Relaxed);
        a.fetch_sub(1, Ordering::Release);
    }
}

#[inline(never)]
fn arc_pairs(a: &Arc<u64>, n: u64) {
    for _ in 0..n {
        drop(black_box(Arc::clone(a)));
    }
}

/// `n` times: a ref from `new`, get + put, drop (what a short-lived object
/// costs). Each iteration's ref escapes through `black_box(&r)`, so none
/// of it can be optimised away, and is dropped where it lies, as
/// `arc_churn`'s `Arc` is (moving the 128-byte ref through `black_box(r)`
/// would add sixteen moves that the 8-byte `Arc` does not pay).
#[inline(never)]
fn percpu_churn(n: u64, new: impl Fn() -> PercpuRef) {
    for _ in 0..n {
        let r = new();
        black_box(&r).get();
        black_box(&r).put();
        drop(r);
    }
}

/// A ref on `backend`, for the churn loops.
#[inline(always)]
fn ref_on(backend: Backend) -> PercpuRef {
    PercpuRef::with_backend(|_| {}, InitFlags::empty(), backend)
        .unwrap_or_else(|e| panic!("pair_loop churn: {e}"))
}

#[inline(never)]
fn shared_pairs(s: &Shared<u64>, n: u64) {
    for _ in 0..n {
        drop(black_box(Shared::clone(s)));
    }
}

/// `shared_pairs` on a `Shared<str>`: a wide handle, the same block code.
#[inline(never)]
fn shared_str_pairs(s: &Shared<str>, n: u64) {
    for _ in 0..n {
        drop(black_box(Shared::clone(s)));
    }
}

/// `n` times: `Shared::new`, clone, drop both (as `arc_churn`).
#[inline(never)]
fn shared_churn(n: u64) {
    for _ in 0..n {
        let s = Shared::new(0u64);
        drop(black_box(Shared::clone(black_box(&s))));
        drop(s);
    }
}

/// `n` times: `Arc::new`, clone, drop both.
#[inline(never)]
fn arc_churn(n: u64) {
    for _ in 0..n {
        let a = Arc::new(0u64);
        drop(black_box(Arc::clone(black_box(&a))));
        drop(a);
    }
}

/// The floor of a count that starts in `Arc`'s word and may move to per-CPU
/// counters (as `Shared`'s does when promoted): `Arc` itself, plus one
/// load and branch before each clone and each drop. Once a count has moved,
/// a clone or a drop must not write the shared word (that write is the
/// cost per-CPU counting removes), so each must read something first to
/// know: a clone gets only `&self`, and a drop that wrote first and looked
/// after would write the shared line (a drop could test a tag its handle
/// carries instead: a test and a branch all the same). Not a
/// refcount to use: its test and its count are two steps, which a real
/// protocol must join (`Shared` does it with a compare-and-swap); it only
/// counts what cannot be avoided.
struct Floor(Arc<(AtomicBool, u64)>);

impl Floor {
    fn new(v: u64) -> Self {
        Floor(Arc::new((AtomicBool::new(false), v)))
    }

    /// Whether the count has moved (never, here).
    #[inline(always)]
    fn moved(&self) -> bool {
        self.0 .0.load(Ordering::Relaxed)
    }
}

/// Where a moved count would be counted; never reached.
#[cold]
#[inline(never)]
fn floor_moved() {
    panic!("pair_loop floor-churn: the flag is never set");
}

impl Clone for Floor {
    #[inline(always)]
    fn clone(&self) -> Self {
        if self.moved() {
            floor_moved();
        }
        Floor(Arc::clone(&self.0))
    }
}

impl Drop for Floor {
    #[inline(always)]
    fn drop(&mut self) {
        if self.moved() {
            floor_moved();
        }
    }
}

/// `n` times: `Floor::new`, clone, drop both (as `arc_churn`).
#[inline(never)]
fn floor_churn(n: u64) {
    for _ in 0..n {
        let f = Floor::new(0u64);
        drop(black_box(Floor::clone(black_box(&f))));
        drop(f);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (what, n) = match (args.get(1), args.get(2).map(|n| n.parse::<u64>())) {
        (Some(w), Some(Ok(n))) => (w.as_str(), n),
        _ => {
            eprintln!(
                "usage: pair_loop <rseq|sharded|rseq-atomic|atomic|arc|shared|shared-str|rseq-churn|\
                 sharded-churn|new-churn|arc-churn|floor-churn|shared-churn> <n>"
            );
            std::process::exit(2);
        }
    };
    // scripts/callgrind-pair sets the cfg on x86_64 Linux, where the crate
    // builds its rseq backend (and with it this function).
    #[cfg(percpu_ref_callgrind)]
    if what.starts_with("rseq") || what.starts_with("shared") || what == "new-churn" {
        // SAFETY: called first, and this program uses refs on this thread
        // only and never switches them (`shared`'s engine clears and marks
        // the mode word, but never opens its window, the one switch, while
        // the loop holds the value: the count is at least 2 throughout).
        unsafe { percpu_ref::percpu::force_fake_area_for_instruction_counting() };
    }
    let t0 = Instant::now();
    match what {
        "rseq" | "sharded" => {
            let backend = if what == "rseq" {
                Backend::Rseq
            } else {
                Backend::Sharded
            };
            let r = PercpuRef::with_backend(|_| {}, InitFlags::empty(), backend)
                .unwrap_or_else(|e| panic!("pair_loop {what}: {e}"));
            percpu_pairs(black_box(&r), black_box(n));
        }
        "rseq-atomic" => {
            let r = PercpuRef::with_backend(|_| {}, InitFlags::INIT_ATOMIC, Backend::Rseq)
                .unwrap_or_else(|e| panic!("pair_loop {what}: {e}"));
            percpu_pairs(black_box(&r), black_box(n));
        }
        "atomic" => atomic_pairs(black_box(&AtomicUsize::new(1)), black_box(n)),
        "arc" => arc_pairs(black_box(&Arc::new(0)), black_box(n)),
        "rseq-churn" => percpu_churn(black_box(n), || ref_on(Backend::Rseq)),
        "sharded-churn" => percpu_churn(black_box(n), || ref_on(Backend::Sharded)),
        // As users create refs: the process's default backend, asked for
        // on every creation (rseq, where the fake area makes it available
        // under callgrind).
        "new-churn" => percpu_churn(black_box(n), || PercpuRef::new(|_| {})),
        "arc-churn" => arc_churn(black_box(n)),
        "floor-churn" => floor_churn(black_box(n)),
        "shared" => {
            let s = Shared::new(0u64);
            Shared::promote(&s);
            shared_pairs(black_box(&s), black_box(n));
        }
        "shared-str" => {
            let s: Shared<str> = Shared::from("a name");
            Shared::promote(&s);
            shared_str_pairs(black_box(&s), black_box(n));
        }
        "shared-churn" => shared_churn(black_box(n)),
        other => panic!("pair_loop: unknown variant {other:?}"),
    }
    let dt = t0.elapsed();
    println!(
        "{what}: {n} pairs, {:.2} ns per pair",
        dt.as_secs_f64() * 1e9 / n.max(1) as f64
    );
}
