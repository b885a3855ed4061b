//! The table without loom, on real threads: what an ordinary test sees.
#![cfg(not(loom))]

use session_table::{close, InUse, Table};
use std::sync::Arc;

#[test]
fn open_lookup_close_reopen() {
    let table = Table::new();
    let owner = table.open(1).unwrap();
    assert_eq!(table.open(1).err(), Some(InUse(1)));
    let r = table.lookup(1).unwrap();
    assert_eq!(r.serve(), 1);
    drop(r);
    let closed = close(owner);
    assert!(table.lookup(1).is_none());
    let again = table.open(1).unwrap();
    assert_eq!(again.serial, 2);
    assert_eq!(closed.served(), 1);
}

/// Requests on many threads while sessions close and reopen: every
/// request served by a session is in that session's final count.
#[test]
fn counts_add_up_under_churn() {
    let table = Arc::new(Table::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(s) = table.lookup(1) {
                        s.serve();
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for _ in 0..200 {
        let owner = table.open(1).unwrap();
        std::thread::yield_now();
        total += close(owner).served();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let found: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(total, found);
}
