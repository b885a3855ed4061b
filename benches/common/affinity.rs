//! Which CPUs this process may run on, and pinning a thread to one: shared
//! by the benchmarks, a test and the measurement programs of tools/
//! (included with `#[path]`).
//! Off Linux there is no affinity API: every CPU is allowed and threads
//! float.

#![allow(dead_code)] // each includer uses a different part

/// The CPUs this process may run on, in increasing order.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's capacity.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// The CPUs this process may run on (no affinity API: 0..n).
#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Vec<usize> {
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// Pins the calling thread to `cpu`.
#[cfg(target_os = "linux")]
pub fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's `cpu` comes from `allowed_cpus`, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 = this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "sched_setaffinity(cpu {cpu}): {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Pinning is not supported here; threads float.
#[cfg(not(target_os = "linux"))]
pub fn pin_to(_cpu: usize) -> Result<(), String> {
    Ok(())
}

/// The CPU the calling thread runs on now (it may have moved by the time
/// the caller looks).
#[cfg(target_os = "linux")]
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// No portable way to ask here.
#[cfg(not(target_os = "linux"))]
pub fn current_cpu() -> Option<usize> {
    None
}

/// Runs `work` on `threads` threads at once and returns the slowest
/// thread's time, each measured from a common start. With more than one
/// thread, thread `t` is pinned to `cpus[t % cpus.len()]` (a failure, such
/// as a CPU no longer allowed, leaves it floating: slower, never wrong).
pub fn run_pinned(threads: usize, cpus: &[usize], work: impl Fn() + Sync) -> std::time::Duration {
    let start = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (start, work) = (&start, &work);
                s.spawn(move || {
                    if threads > 1 && !cpus.is_empty() {
                        let _ = pin_to(cpus[t % cpus.len()]);
                    }
                    start.wait();
                    let t0 = std::time::Instant::now();
                    work();
                    t0.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}
