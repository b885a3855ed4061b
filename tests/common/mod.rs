//! Helpers shared by the protocol test files.
#![allow(dead_code)] // each test file uses a subset

use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// Every backend this process can run.
pub fn backends() -> Vec<Backend> {
    [Backend::Sharded, Backend::Rseq]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// A ref on `backend` whose release calls are counted; with
/// `release_panics`, each release panics with "release panics" after
/// counting.
pub fn counted_with(
    flags: InitFlags,
    backend: Backend,
    release_panics: bool,
) -> (PercpuRef, Arc<AtomicUsize>) {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let releases = releases.clone();
        PercpuRef::with_backend(
            move |_| {
                releases.fetch_add(1, SeqCst);
                if release_panics {
                    panic!("release panics");
                }
            },
            flags,
            backend,
        )
        .unwrap()
    };
    (r, releases)
}

/// A ref on `backend` whose release calls are counted.
pub fn counted(flags: InitFlags, backend: Backend) -> (PercpuRef, Arc<AtomicUsize>) {
    counted_with(flags, backend, false)
}

/// What `f` panicked with (empty for a non-string payload), or `None`.
pub fn try_panic_message(f: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(f)).err().map(|err| {
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// What `f` panicked with; fails the test if it did not panic.
pub fn panic_message(f: impl FnOnce()) -> String {
    try_panic_message(f).expect("expected a panic")
}

/// Waits for child `pid` at most `timeout`; its wait status, or `None` if
/// it was still running (it is then killed and reaped). For the fork tests.
#[cfg(all(unix, not(miri)))]
pub fn wait_or_kill(pid: libc::pid_t, timeout: std::time::Duration) -> Option<libc::c_int> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if r == pid {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            describe_hung_child(pid);
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Prints where each thread of a hung child `pid` waits (its state, kernel
/// wait channel and system call, from `/proc`), so that a hang in a guest
/// or a CI log can be told from a slow child without a rerun.
#[cfg(all(unix, not(miri)))]
fn describe_hung_child(pid: libc::pid_t) {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("({e})"))
    };
    let tasks = std::path::PathBuf::from(format!("/proc/{pid}/task"));
    let Ok(dir) = std::fs::read_dir(&tasks) else {
        eprintln!("hung child {pid}: {} unreadable", tasks.display());
        return;
    };
    for task in dir.flatten() {
        let t = task.path();
        let stat = read(&t.join("stat"));
        // The state is the field after the parenthesised name.
        let state = stat.rsplit(") ").next().and_then(|s| s.split(' ').next());
        eprintln!(
            "hung child {pid} thread {}: {} state={} wchan={} syscall={}",
            task.file_name().to_string_lossy(),
            read(&t.join("comm")),
            state.unwrap_or("?"),
            read(&t.join("wchan")),
            read(&t.join("syscall")),
        );
    }
}

/// `n` scaled by the factor in `PERCPU_REF_TEST_SCALE` (default 1), at
/// least 1. `scripts/vm-test` sets it for tests whose every round starts
/// threads: in an emulated guest a thread start costs milliseconds, so the
/// full round count would not fit CI; the workload of each round, where
/// the races are, keeps its size.
pub fn scaled(n: usize) -> usize {
    let factor = std::env::var("PERCPU_REF_TEST_SCALE")
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|f| *f > 0.0 && f.is_finite())
                .unwrap_or_else(|| panic!("PERCPU_REF_TEST_SCALE={s:?}: not a positive number"))
        })
        .unwrap_or(1.0);
    ((n as f64 * factor).round() as usize).max(1)
}

/// Prints the process's rseq aborts and grace periods so far, in the form
/// `scripts/vm-test` sums into its matrix (`vm-counts: key=value ...`; the
/// counters only grow, so it keeps the largest of a binary's lines).
pub fn report_counts() {
    eprintln!(
        "vm-counts: backend={} rseq_aborts={} grace_periods={}",
        percpu_ref::backend(),
        percpu_ref::percpu::rseq_aborts(),
        percpu_ref::percpu::grace_periods()
    );
}

/// Installs, on the calling thread only, a seccomp filter that fails each
/// of the system calls `nrs` with `errno` (as a sandbox applied after
/// start-up would); every other call is allowed. Threads this thread
/// creates afterwards inherit it.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(miri)
))]
pub fn fail_syscalls_on_this_thread(nrs: &[libc::c_long], errno: libc::c_int) {
    use libc::{sock_filter, sock_fprog};
    // The audit architecture the filter admits (`AUDIT_ARCH_X86_64`,
    // `AUDIT_ARCH_AARCH64`): a call of another ABI is failed, not allowed.
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    let stmt = |code: u16, k: u32| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let n = u8::try_from(nrs.len()).expect("at most 255 system calls");
    // arch check, load nr, one jump per call, allow, fail.
    let mut prog = vec![
        stmt(ld, 4), // seccomp_data.arch
        jeq(AUDIT_ARCH, 0, n + 1),
        stmt(ld, 0), // seccomp_data.nr
    ];
    for (i, &nr) in nrs.iter().enumerate() {
        // To the fail below the allow: past the remaining jumps and it.
        let to_fail = n - 1 - i as u8 + 1;
        prog.push(jeq(u32::try_from(nr).unwrap(), to_fail, 0));
    }
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(
        ret,
        libc::SECCOMP_RET_ERRNO | u32::try_from(errno).unwrap(),
    ));
    let fprog = sock_fprog {
        len: u16::try_from(prog.len()).unwrap(),
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls with integer arguments and a pointer to a
    // valid filter program that outlives the call; the filter applies to
    // this thread only (no TSYNC flag).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}
