//! How many CPU ids this process can ever observe.
//!
//! Per-CPU storage is indexed by CPU id, so it must be sized by the
//! *possible* CPUs of the machine, not by how many this process may run on:
//! under `taskset -c 3` a process sees one CPU, whose id is 3. The number
//! of possible CPUs is read once from `/sys/devices/system/cpu/possible`
//! (falling back to `sysconf(_SC_NPROCESSORS_CONF)`, then to the
//! available parallelism) and never changes afterwards.
//!
//! # What the count is trusted for
//!
//! Speed, never memory safety. Normally every CPU id the kernel reports is
//! below the count and gets its own per-CPU counter. But a container can
//! hide or trim `/sys/devices/system/cpu/possible`, `/proc/stat` and
//! `/proc/cpuinfo`; `sysconf` then falls back to the affinity count, and a
//! process allowed on CPU 1 alone believes there is one CPU. Per-CPU
//! storage sized by this number must therefore never be indexed by an
//! unchecked CPU id: the rseq fast path compares `cpu_id` with the arena's
//! CPU count and takes the atomic path at or above it (`percpu/rseq.rs`),
//! the sharded backend masks its thread index.
//!
//! The hidden environment variable `PERCPU_REF_TEST_POSSIBLE_CPUS`, read at
//! detection, lowers the count to at most its value: it simulates such a
//! container in the tests (`tests/rseq_stress.rs`). It can only cost speed.

/// The number of possible CPU ids (highest possible id + 1).
///
/// Every CPU id the kernel can report to this process is below this number,
/// whatever affinity the process has, unless the system under-reports it
/// (a container can): the crate relies on it for speed only, never for
/// memory safety.
///
/// # Examples
///
/// ```
/// let n = percpu_ref::possible_cpus();
/// assert!(n >= 1);
/// // Never smaller than what this process may run on.
/// assert!(n >= std::thread::available_parallelism().map_or(1, |p| p.get()));
/// ```
#[must_use]
pub fn possible_cpus() -> usize {
    #[cfg(percpu_ref_loom)]
    {
        2
    }
    #[cfg(not(percpu_ref_loom))]
    {
        use crate::sync::unmodeled::{AtomicUsize, Ordering::Relaxed};
        // 0 until detected. Not a `OnceLock`: a fork while another thread
        // runs its initialiser would leave the child waiting for it forever.
        // Racing threads each detect (the same number); the first stored
        // wins, so every caller gets one value.
        static N: AtomicUsize = AtomicUsize::new(0);
        match N.load(Relaxed) {
            0 => {
                let n = detect();
                match N.compare_exchange(0, n, Relaxed, Relaxed) {
                    Ok(_) => n,
                    Err(first) => first,
                }
            }
            n => n,
        }
    }
}

#[cfg(not(percpu_ref_loom))]
fn detect() -> usize {
    let from_sysfs = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list_max(&s))
        .map(|max| max + 1);
    let parallel = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let detected = from_sysfs
        .or_else(sysconf_configured)
        .unwrap_or(parallel)
        .max(parallel);
    // Tests only: simulate a system that under-reports the count.
    let cap = std::env::var("PERCPU_REF_TEST_POSSIBLE_CPUS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    detected.min(cap).max(1)
}

#[cfg(all(unix, not(percpu_ref_loom)))]
fn sysconf_configured() -> Option<usize> {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

#[cfg(all(not(unix), not(percpu_ref_loom)))]
fn sysconf_configured() -> Option<usize> {
    None
}

/// The highest id in a kernel CPU list such as `0-3,8,10-11\n`.
#[cfg_attr(percpu_ref_loom, allow(dead_code))]
pub(crate) fn parse_cpu_list_max(list: &str) -> Option<usize> {
    let mut max = None;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let hi = match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (usize, usize) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                if lo > hi {
                    return None;
                }
                hi
            }
            None => part.trim().parse().ok()?,
        };
        max = Some(max.map_or(hi, |m: usize| m.max(hi)));
    }
    max
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list_max;

    #[test]
    fn parses_kernel_cpu_lists() {
        assert_eq!(parse_cpu_list_max("0-1\n"), Some(1));
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("0-3,8,10-11"), Some(11));
        assert_eq!(parse_cpu_list_max("5,2"), Some(5));
        assert_eq!(parse_cpu_list_max(""), None);
        assert_eq!(parse_cpu_list_max("x"), None);
        assert_eq!(parse_cpu_list_max("3-1"), None);
    }
}
