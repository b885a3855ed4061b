//! What the cost programs (`managed_costs`, `shared_costs`) share:
//! percentiles, and the process's CPU time.
#![allow(dead_code)] // each program uses a subset

use std::time::Duration;

/// The median of `v` (sorted in place); 0 when empty.
pub fn median(v: &mut [f64]) -> f64 {
    percentile(v, 50.0)
}

/// The `p`th percentile of `v` (nearest rank, sorted in place); 0 when
/// empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// The process's CPU time so far (user + system).
#[cfg(unix)]
pub fn cpu_time() -> Option<Duration> {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Some(tv(u.ru_utime) + tv(u.ru_stime))
}

/// Not read off Unix (no `getrusage`): the programs say so.
#[cfg(not(unix))]
pub fn cpu_time() -> Option<Duration> {
    None
}
