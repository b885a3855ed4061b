//! The loom model of the session table's two promises (`src/lib.rs`).
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --test model
//! RUSTFLAGS="--cfg loom" cargo test --release --test model --features broken_tryget  # fails
//! RUSTFLAGS="--cfg loom" cargo test --release --test model --features broken_close   # fails
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` bounds the search (loom's default: none; this
//! model's: 2, enough for both broken variants, see README.md).
#![cfg(loom)]

use loom::thread;
use session_table::{close, Table};
use std::sync::Arc;

/// Runs `f` under loom, at most `LOOM_MAX_PREEMPTIONS` (default 2)
/// preemptions per execution, and prints how many executions that was
/// (`--nocapture`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, Relaxed);
        f();
    });
    eprintln!("{} executions", runs.load(Relaxed));
}

/// A request for session 1 races its connection closing and reconnecting,
/// and the grace-period engine completing the close.
///
/// 1. Once `close` returns, id 1 can be opened again.
/// 2. The closed session's count includes the request if it served it.
#[test]
fn request_races_close_and_reopen() {
    model(|| {
        let table = Arc::new(Table::new());
        let first = table.open(1).unwrap();
        let request = {
            let table = table.clone();
            thread::spawn(move || table.lookup(1).map(|s| (s.serial, s.serve())))
        };
        // The engine thread's role: completes the kill at any point.
        let engine = thread::spawn(|| {
            percpu_ref::loom_support::step();
        });
        let closed = close(first);
        let second = table
            .open(1)
            .expect("a closed session still holds its id: reopen refused");
        let served_by_first = closed.served();
        let request = request.join().unwrap();
        engine.join().unwrap();

        match request {
            Some((1, _)) => assert_eq!(served_by_first, 1, "a served request is missing"),
            Some((2, n)) => {
                assert_eq!(served_by_first, 0);
                assert_eq!((n, second.served()), (1, 1));
            }
            Some((serial, _)) => panic!("a session numbered {serial}"),
            None => assert_eq!(served_by_first, 0),
        }
        // The table's dead entries are `Weak`s: they keep the allocations.
        drop((second, table));
        percpu_ref::flush();
        assert_eq!(
            percpu_ref::loom_support::live_blocks(),
            0,
            "a session leaked"
        );
    });
}

/// Two requests and a close, no reopen: every request that found the
/// session is counted by `served`, and no lookup finds it after `close`.
#[test]
fn two_requests_race_close() {
    model(|| {
        let table = Arc::new(Table::new());
        let owner = table.open(7).unwrap();
        let requests: Vec<_> = (0..2)
            .map(|_| {
                let table = table.clone();
                thread::spawn(move || table.lookup(7).map(|s| s.serve()).is_some())
            })
            .collect();
        let closed = close(owner);
        assert!(table.lookup(7).is_none(), "found after close returned");
        let served = closed.served();
        let found = requests
            .into_iter()
            .map(|r| u64::from(r.join().unwrap()))
            .sum::<u64>();
        assert_eq!(served, found, "served {served}, found by {found} requests");
        drop(table);
        percpu_ref::flush();
        assert_eq!(
            percpu_ref::loom_support::live_blocks(),
            0,
            "a session leaked"
        );
    });
}
