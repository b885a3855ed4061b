//! The machine's CPU topology as the crate sees it: the possible-CPU count
//! and the arena bound against the kernel's own lists, and exact counts on
//! every CPU this process may run on, including CPUs that come online
//! after the arena was sized.
//!
//! On a development machine these check what sysfs says. `scripts/vm-test`
//! also runs them in guests whose possible CPUs differ from the online
//! ones (QEMU's `-smp N,maxcpus=M`, the kernel's `maxcpus=`), and sets
//! `PERCPU_REF_VM_EXPECT_POSSIBLE` / `PERCPU_REF_VM_EXPECT_ONLINE` to what
//! the guest was booted with; as root there, the last test brings offline
//! CPUs online and counts on them.
#![cfg(target_os = "linux")]

use percpu_ref::percpu::arena_stats;
use percpu_ref::{backend, possible_cpus, Backend, InitFlags, PercpuRef};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

#[path = "../benches/common/affinity.rs"]
mod affinity;
mod common;

use affinity::{allowed_cpus, pin_to};

/// The CPU ids of a sysfs CPU list such as `0-3,8,10-11`.
fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut ids = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap(), b.parse().unwrap()),
            None => {
                let v: usize = part.parse().unwrap();
                (v, v)
            }
        };
        ids.extend(lo..=hi);
    }
    ids
}

fn sysfs_list(name: &str) -> Option<Vec<usize>> {
    std::fs::read_to_string(format!("/sys/devices/system/cpu/{name}"))
        .ok()
        .map(|s| parse_cpu_list(&s))
}

fn expected(var: &str) -> Option<usize> {
    std::env::var(var).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{var}={v:?}: not a number"))
    })
}

fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    assert!(c >= 0, "sched_getcpu failed");
    c as usize
}

#[test]
fn possible_cpus_and_the_arena_bound_follow_sysfs() {
    let Some(possible) = sysfs_list("possible") else {
        eprintln!("skipped: no /sys/devices/system/cpu/possible");
        return;
    };
    let highest = *possible.iter().max().unwrap();
    assert_eq!(
        possible_cpus(),
        highest + 1,
        "possible_cpus() against sysfs possible {possible:?}"
    );
    if let Some(n) = expected("PERCPU_REF_VM_EXPECT_POSSIBLE") {
        assert_eq!(
            possible_cpus(),
            n,
            "the guest was booted with {n} possible CPUs"
        );
    }
    if let Some(n) = expected("PERCPU_REF_VM_EXPECT_ONLINE") {
        let online = sysfs_list("online").unwrap();
        assert_eq!(online.len(), n, "the guest was booted with {n} online CPUs");
        assert!(possible_cpus() > n, "possible must exceed online here");
    }
    let r = PercpuRef::new(|_| {});
    assert_eq!(
        r.percpu_bytes(),
        8 * possible_cpus(),
        "8 B per possible CPU"
    );
    assert_eq!(arena_stats().bytes_per_slot, 8 * possible_cpus());
    // What the kernel says of its rseq ABI (0 before Linux 6.3, which
    // added both): the matrix's notes compare kernels by it.
    // SAFETY: getauxval has no preconditions; 0 means "no such entry".
    let (feature_size, align) = unsafe { (libc::getauxval(27), libc::getauxval(28)) };
    eprintln!(
        "vm-counts: backend={} possible_cpus={} arena_bytes_per_slot={} online_cpus={} \
         rseq_feature_size={feature_size} rseq_align={align}",
        backend(),
        possible_cpus(),
        arena_stats().bytes_per_slot,
        sysfs_list("online").map_or(0, |l| l.len())
    );
}

/// Eight threads pinned to each CPU in turn, gets and puts on one ref, and
/// a kill at the end: the count is exact and release runs once, whichever
/// CPUs' counters the gets and puts landed on.
fn count_on(cpus: &[usize]) -> usize {
    let released = Arc::new(AtomicUsize::new(0));
    let r = {
        let released = released.clone();
        Arc::new(PercpuRef::with_flags(
            move |_| {
                released.fetch_add(1, SeqCst);
            },
            InitFlags::empty(),
        ))
    };
    let mut pinned = 0;
    for &cpu in cpus {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    if pin_to(cpu).is_err() {
                        return false;
                    }
                    assert_eq!(current_cpu(), cpu);
                    // Unbalanced on purpose: each CPU's counter ends away
                    // from 0, some above and some below.
                    for _ in 0..(1000 + t) {
                        r.get();
                    }
                    for _ in 0..1000 {
                        r.put();
                    }
                    true
                })
            })
            .collect();
        let ok = handles.into_iter().all(|h| h.join().unwrap());
        pinned += usize::from(ok);
    }
    let per_cpu: u64 = (0..8).sum();
    r.kill_sync().unwrap();
    assert_eq!(
        r.atomic_count(),
        Some(per_cpu * pinned as u64),
        "the sum over CPUs {cpus:?} is exact"
    );
    for _ in 0..per_cpu * pinned as u64 {
        r.put();
    }
    assert_eq!(released.load(SeqCst), 1, "release runs once");
    pinned
}

#[test]
fn exact_on_every_allowed_cpu() {
    let cpus = allowed_cpus();
    assert_eq!(count_on(&cpus), cpus.len(), "every allowed CPU took a pin");
    assert!(cpus.iter().all(|&c| c < possible_cpus()));
}

/// A CPU brought online after the arena was sized (hotplug) has a region
/// (it is a possible CPU) and counts exactly. Needs root and offline CPUs:
/// a guest booted with `maxcpus=` below its CPUs.
#[test]
fn cpus_brought_online_later_count_exactly() {
    if expected("PERCPU_REF_VM_EXPECT_ONLINE").is_none() {
        eprintln!("skipped: not a guest booted with maxcpus= (PERCPU_REF_VM_EXPECT_ONLINE)");
        return;
    }
    // Size the arena first, from the CPUs online now.
    let before = PercpuRef::new(|_| {});
    let online = sysfs_list("online").unwrap();
    let offline: Vec<usize> = (0..possible_cpus())
        .filter(|c| !online.contains(c))
        .collect();
    assert!(!offline.is_empty(), "maxcpus= left no CPU offline");
    for &c in &offline {
        std::fs::write(format!("/sys/devices/system/cpu/cpu{c}/online"), "1")
            .unwrap_or_else(|e| panic!("cannot bring CPU {c} online: {e}"));
    }
    let now = sysfs_list("online").unwrap();
    assert!(offline.iter().all(|c| now.contains(c)));
    // This thread's affinity was set before the CPUs existed: widen it.
    // SAFETY: a zeroed cpu_set_t with bits below its size set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in &now {
            libc::CPU_SET(c, &mut set);
        }
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
            0
        );
    }
    assert_eq!(count_on(&offline), offline.len());
    drop(before);
    let expect_rseq = std::env::var("GLIBC_TUNABLES").map_or(true, |v| !v.contains("rseq=0"));
    if expect_rseq && Backend::Rseq.is_available() {
        assert_eq!(backend(), Backend::Rseq);
    }
    eprintln!("brought CPUs {offline:?} online and counted exactly on each");
    common::report_counts();
}

#[test]
fn cpu_lists_parse() {
    assert_eq!(parse_cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(parse_cpu_list("0"), [0]);
}
