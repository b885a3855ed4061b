//! Handles dropped inside a thread-local's destructor.
//!
//! A user keeps a handle in a `thread_local!` of their own; it is dropped
//! when the thread exits, possibly after the crate's own thread-locals on
//! that thread are gone (the standard library destroys them in the reverse
//! order of their first use). A crate thread-local reached with `with`
//! then panics, and a panic in a thread-local destructor aborts the
//! process ("thread local panicked on drop"). So each case runs in a
//! subprocess of this binary: the parent checks that it exited cleanly
//! and that its own checks, made after joining the thread, passed.
//!
//! Every case runs on both backends (`PERCPU_REF_BACKEND`), on a thread
//! that used the crate before it stored the handle (the crate's
//! thread-locals are destroyed first) and on one that did not (the handle
//! was made on another thread; the crate's thread-locals are first reached
//! from the destructor). After the join, each child checks that every
//! release, value drop, css free and arena slot happened exactly once.

mod common;

#[cfg(feature = "css")]
use percpu_ref::css::{EventKind, Hierarchy, Pages, Recorder};
use percpu_ref::percpu::arena_stats;
use percpu_ref::{Backend, Owner, PercpuRef};
use std::cell::RefCell;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// Set in the subprocesses: the case to run.
const CASE: &str = "PERCPU_REF_TLS_CASE";
/// Set in the subprocesses whose thread uses the crate before it stores
/// the handle.
const USED_BEFORE: &str = "PERCPU_REF_TLS_USED_BEFORE";

/// Runs a closure when dropped: what a case does at thread exit.
struct AtExit(Option<Box<dyn FnOnce() + Send>>);

impl Drop for AtExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

thread_local! {
    /// The user's thread-local whose destructor drops the handles.
    static KEEP: RefCell<Vec<AtExit>> = const { RefCell::new(Vec::new()) };
}

/// Counts the drops of an owned value.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Reaches every thread-local the crate has on this thread: a deferred
/// kill (the grace-period engine's), arena slots (the thread's slot
/// cache), a css lifecycle (the css model's release stack, and
/// crossbeam-epoch's handle under an RCU read section). Without
/// `deferred`, only what does not start the engine thread: sync kills.
fn use_the_crate(deferred: bool) {
    let refs: Vec<_> = (0..4).map(|_| PercpuRef::new(|_| {})).collect();
    for r in &refs {
        r.kill_sync().unwrap();
    }
    drop(refs);
    drop(Owner::new(vec![1u8])); // drop glue: a sync kill
    if !deferred {
        return;
    }
    let o = Owner::new(0u64);
    let r = o.get();
    drop(o); // no drop glue: a deferred kill
    drop(r);
    #[cfg(feature = "css")]
    scratch_css_lifecycle();
    percpu_ref::flush();
}

/// A css made, removed and released on this thread.
#[cfg(feature = "css")]
fn scratch_css_lifecycle() {
    let h = Hierarchy::new(vec![Recorder::new("scratch")]);
    let cg = h.mkdir(&h.root(), "scratch").unwrap();
    let css = cg.css(0).unwrap();
    h.rmdir(&cg).unwrap();
    percpu_ref::flush(); // the kill completed: the put below releases here
    drop(css);
    drop(h.rcu_read_lock());
    assert!(h.flush());
}

/// Runs `make` to build what the thread keeps: on the thread itself after
/// using the crate (`used_before`), or on this thread, before the spawn.
/// The thread registers its thread-local first, so that with `used_before`
/// the crate's thread-locals are destroyed before it.
fn on_exiting_thread(used_before: bool, make: impl FnOnce() -> AtExit + Send + 'static) {
    on_exiting_thread_using(used_before.then_some(|| use_the_crate(true)), make);
}

/// [`on_exiting_thread`], with the thread's use of the crate before it
/// stores the handle: `used`, or none.
fn on_exiting_thread_using(used: Option<fn()>, make: impl FnOnce() -> AtExit + Send + 'static) {
    let handle = if let Some(used) = used {
        std::thread::spawn(move || {
            KEEP.with(|k| k.borrow_mut().push(AtExit(None)));
            used();
            let at_exit = make();
            KEEP.with(|k| k.borrow_mut().push(at_exit));
        })
    } else {
        let at_exit = make();
        std::thread::spawn(move || KEEP.with(|k| k.borrow_mut().push(at_exit)))
    };
    handle.join().expect("the exiting thread panicked");
}

/// The arena's live slots now; after the case every slot must be back.
fn live_slots() -> usize {
    arena_stats().live_slots
}

/// A `PercpuRef` killed (deferred) and dropped in the destructor, after a
/// get and a put on the fast path there.
fn case_percpu_ref(used_before: bool) {
    let live = live_slots();
    let releases = Arc::new(AtomicUsize::new(0));
    let rel = releases.clone();
    on_exiting_thread(used_before, move || {
        let r = Box::pin(PercpuRef::new(move |_| {
            rel.fetch_add(1, SeqCst);
        }));
        AtExit(Some(Box::new(move || {
            r.get();
            r.put();
            r.as_ref().kill().unwrap();
            drop(r); // waits for the kill: the engine completes it
        })))
    });
    percpu_ref::flush();
    assert_eq!(releases.load(SeqCst), 1, "PercpuRef releases");
    assert_eq!(live_slots(), live, "arena slots back");
}

/// An `Owner` dropped in the destructor, one dropped with a deferred kill
/// there, and one frozen there and then dropped.
fn case_owner(used_before: bool) {
    let live = live_slots();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    on_exiting_thread(used_before, move || {
        let dropped = Owner::new(Counted(d.clone()));
        let deferred = Owner::new(Counted(d.clone()));
        let mut frozen = Owner::new(Counted(d));
        let no_drop_glue = Owner::new(2u64);
        AtExit(Some(Box::new(move || {
            drop(no_drop_glue); // a deferred kill
            drop(dropped);
            deferred.drop_deferred();
            let f = frozen.freeze();
            drop(f);
            drop(frozen);
        })))
    });
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 3, "values dropped");
    assert_eq!(live_slots(), live, "arena slots back");
}

/// The last `Ref` of a dropped `Owner`, put in the destructor.
fn case_ref(used_before: bool) {
    let live = live_slots();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    on_exiting_thread(used_before, move || {
        let o = Owner::new(Counted(d));
        let r = o.get();
        let r2 = r.clone();
        drop(o);
        AtExit(Some(Box::new(move || {
            drop(r2);
            drop(r); // the last reference: releases (now or on the engine)
        })))
    });
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1, "value dropped");
    assert_eq!(live_slots(), live, "arena slots back");
}

/// A `Weak` upgraded in the destructor (the owner is alive there), and the
/// last `Weak` of a dead owner dropped there (it frees the block).
fn case_weak(used_before: bool) {
    let live = live_slots();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let d2 = drops.clone();
    on_exiting_thread(used_before, move || {
        let alive = Owner::new(Counted(d));
        let w_alive = alive.downgrade();
        let dead = Owner::new(Counted(d2));
        let w_dead = dead.downgrade();
        drop(dead);
        AtExit(Some(Box::new(move || {
            let r = w_alive.tryget_live().expect("the owner is alive");
            drop(r);
            drop(alive);
            assert!(w_alive.tryget_live().is_none(), "killed by the drop");
            drop(w_alive);
            drop(w_dead);
        })))
    });
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 2, "values dropped");
    assert_eq!(live_slots(), live, "arena slots back");
}

/// A `Killed` waited for in the destructor, and another dropped there
/// while a reference still holds its value.
fn case_killed(used_before: bool) {
    let live = live_slots();
    let drops = Arc::new(AtomicUsize::new(0));
    let (d, d2) = (drops.clone(), drops.clone());
    let held = Arc::new(std::sync::Mutex::new(None));
    let h = held.clone();
    on_exiting_thread(used_before, move || {
        let waited = Owner::new(Counted(d)).kill();
        let o = Owner::new(Counted(d2));
        *h.lock().unwrap() = Some(o.get());
        let dropped = o.kill();
        AtExit(Some(Box::new(move || {
            let value = waited.wait();
            drop(value);
            drop(dropped);
        })))
    });
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1, "the waited value dropped");
    drop(held.lock().unwrap().take()); // the last reference
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 2, "values dropped");
    assert_eq!(live_slots(), live, "arena slots back");
}

/// The kinds of css callback in `events`, counted.
#[cfg(feature = "css")]
fn count(events: &[percpu_ref::css::Event], kind: EventKind) -> usize {
    events.iter().filter(|e| e.kind == kind).count()
}

/// Checks that every css but the root was released and freed exactly once.
#[cfg(feature = "css")]
fn check_css_freed(h: &Hierarchy, rec: &Recorder) {
    assert!(h.flush(), "the hierarchy settles");
    let events = rec.events();
    let allocs = count(&events, EventKind::Alloc);
    assert_eq!(
        count(&events, EventKind::Released),
        allocs - 1,
        "{events:?}"
    );
    assert_eq!(count(&events, EventKind::Free), allocs - 1, "{events:?}");
    assert_eq!(h.nr_css(), 0, "every non-root css freed");
}

/// Runs a css case: `make` gets a hierarchy with one subsystem and builds
/// what the exiting thread keeps; afterwards every css but the root must
/// have been released and freed exactly once.
#[cfg(feature = "css")]
fn css_case(used_before: bool, make: impl FnOnce(Arc<Hierarchy>) -> AtExit + Send + 'static) {
    let rec = Recorder::new("memory");
    let h = Arc::new(Hierarchy::new(vec![rec.clone()]));
    let h2 = h.clone();
    on_exiting_thread(used_before, move || make(h2));
    check_css_freed(&h, &rec);
}

/// The last `CssRef` of a removed cgroup, dropped in the destructor.
#[cfg(feature = "css")]
fn case_css_ref(used_before: bool) {
    css_case(used_before, |h| {
        let cg = h.mkdir(&h.root(), "a").unwrap();
        let css = cg.css(0).unwrap();
        h.rmdir(&cg).unwrap();
        percpu_ref::flush(); // the kill completed: the drop below releases
        AtExit(Some(Box::new(move || {
            assert!(css.tryget_online().is_none(), "removed");
            drop(css);
            drop(h);
        })))
    });
}

/// A `Task` dropped in the destructor, which then removes its cgroup and
/// puts the last reference on the cgroup's css.
#[cfg(feature = "css")]
fn case_task(used_before: bool) {
    css_case(used_before, |h| {
        let cg = h.mkdir(&h.root(), "a").unwrap();
        let task = h.spawn(&cg).unwrap();
        AtExit(Some(Box::new(move || {
            let css = task.get_css(0);
            drop(task);
            assert_eq!(cg.nr_tasks(), 0, "the task exited");
            h.rmdir(&cg).unwrap();
            percpu_ref::flush();
            drop(css); // the last reference
            drop(cg);
        })))
    });
}

/// `Pages` charged to a removed cgroup's css, dropped (uncharged) in the
/// destructor: the last reference.
#[cfg(feature = "css")]
fn case_pages(used_before: bool) {
    css_case(used_before, |h| {
        let cg = h.mkdir(&h.root(), "a").unwrap();
        let css = cg.css(0).unwrap();
        let mut pages = Pages::new();
        pages.charge(&css, 8);
        h.rmdir(&cg).unwrap();
        drop(css);
        percpu_ref::flush(); // the kill completed: the uncharge releases
        AtExit(Some(Box::new(move || drop(pages))))
    });
}

/// The grace-period engine's thread refused: the destructor installs a
/// seccomp filter that fails `clone` and `clone3` (so `pthread_create`)
/// with EAGAIN on its thread, before any deferred switch in the process
/// started the engine. The deferred kills made there (a `PercpuRef`'s, an
/// `Owner`'s, a css's) complete on that thread, inside the call that
/// queued them: the engine's per-completion state must be reachable there
/// too, after the thread's other thread-locals are gone.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn case_engine_refused(used_before: bool) {
    let releases = Arc::new(AtomicUsize::new(0));
    let drops = Arc::new(AtomicUsize::new(0));
    let (rel, released, d) = (releases.clone(), releases.clone(), drops.clone());
    #[cfg(feature = "css")]
    let rec = Recorder::new("memory");
    #[cfg(feature = "css")]
    let h = Arc::new(Hierarchy::new(vec![rec.clone()]));
    #[cfg(feature = "css")]
    let h2 = h.clone();
    let live = live_slots(); // the root css's included
    let make = move || {
        let r = Box::pin(PercpuRef::new(move |_| {
            rel.fetch_add(1, SeqCst);
        }));
        let o = Owner::new(Counted(d.clone()));
        #[cfg(feature = "css")]
        let (cg, css) = {
            let cg = h2.mkdir(&h2.root(), "a").unwrap();
            let css = cg.css(0).unwrap();
            (cg, css)
        };
        AtExit(Some(Box::new(move || {
            common::fail_syscalls_on_this_thread(
                &[libc::SYS_clone, libc::SYS_clone3],
                libc::EAGAIN,
            );
            let confirmed = Arc::new(AtomicUsize::new(0));
            let c = confirmed.clone();
            r.as_ref()
                .kill_and_confirm(move |_| {
                    c.fetch_add(1, SeqCst);
                })
                .unwrap();
            assert_eq!(confirmed.load(SeqCst), 1, "confirmed inside the call");
            assert_eq!(released.load(SeqCst), 1, "released inside the call");
            drop(r);
            // This thread stands in for the engine meanwhile: a flush from
            // a callback is refused (it would wait for the very batch this
            // thread is completing), as on the engine thread.
            let refused = Arc::new(std::sync::Mutex::new(None));
            let seen = refused.clone();
            let r2 = Box::pin(PercpuRef::new(|_| {}));
            r2.as_ref()
                .kill_and_confirm(move |_| {
                    *seen.lock().unwrap() = common::try_panic_message(percpu_ref::flush);
                })
                .unwrap();
            let msg = refused.lock().unwrap().take().expect("flush refused");
            assert!(
                msg.contains("percpu_ref::flush called from a deferred confirm"),
                "{msg}"
            );
            drop(r2);
            o.drop_deferred();
            assert_eq!(d.load(SeqCst), 1, "the value dropped inside the call");
            #[cfg(feature = "css")]
            {
                h2.rmdir(&cg).unwrap(); // kill_css: completed inside the call
                drop(css); // the last reference
                drop(cg);
                assert!(h2.flush());
                assert_eq!(h2.nr_css(), 0, "freed");
            }
        })))
    };
    on_exiting_thread_using(used_before.then_some(|| use_the_crate(false)), make);
    assert_eq!(releases.load(SeqCst), 1, "PercpuRef releases");
    assert_eq!(drops.load(SeqCst), 1, "values dropped");
    #[cfg(feature = "css")]
    check_css_freed(&h, &rec);
    percpu_ref::flush();
    assert_eq!(live_slots(), live, "arena slots back");
}

/// Forks once in the child of a fork: its deferred kill completes (the
/// engine is started again there), and it exits 0.
#[cfg(all(unix, not(miri)))]
fn fork_and_check() {
    // SAFETY: the child runs this crate's code (whose locks its fork
    // handlers took around the fork) and std allocation, then `_exit`s
    // without unwinding.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let drops = Arc::new(AtomicUsize::new(0));
            Owner::new(Counted(drops.clone())).drop_deferred();
            percpu_ref::flush();
            drops.load(SeqCst) == 1
        });
        // SAFETY: ends the child without the parent's atexit handlers.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    let st = common::wait_or_kill(pid, std::time::Duration::from_secs(60));
    assert!(
        st.is_some_and(|st| libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0),
        "the forked child failed or hung: {st:?}"
    );
}

/// `fork` from the destructor, on a thread that (with `used_before`)
/// forked before: the engine's fork handlers keep their locks across it.
#[cfg(all(unix, not(miri)))]
fn case_fork(used_before: bool) {
    on_exiting_thread_using(
        used_before.then_some(|| {
            use_the_crate(true);
            fork_and_check();
        }),
        || AtExit(Some(Box::new(fork_and_check))),
    );
    let drops = Arc::new(AtomicUsize::new(0));
    Owner::new(Counted(drops.clone())).drop_deferred();
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1, "the parent's engine runs on");
}

/// Child only: runs the case named by `CASE`.
#[test]
fn child_runs_case() {
    let Ok(case) = std::env::var(CASE) else {
        return; // only meaningful in the subprocesses of the tests below
    };
    let used_before = std::env::var_os(USED_BEFORE).is_some();
    let run: fn(bool) = match case.as_str() {
        "percpu_ref" => case_percpu_ref,
        "owner" => case_owner,
        "ref" => case_ref,
        "weak" => case_weak,
        "killed" => case_killed,
        #[cfg(feature = "css")]
        "css_ref" => case_css_ref,
        #[cfg(feature = "css")]
        "task" => case_task,
        #[cfg(feature = "css")]
        "pages" => case_pages,
        #[cfg(all(
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64")
        ))]
        "engine_refused" => case_engine_refused,
        #[cfg(all(unix, not(miri)))]
        "fork" => case_fork,
        other => panic!("unknown case {other:?}"),
    };
    run(used_before);
    println!("tls case passed: {case} used_before={used_before}");
}

/// How long a child may take (a case takes well under a second natively).
const CHILD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `cmd` to completion and collects its output, unless it takes
/// longer than `timeout` (a hang): then it is killed and `None` returned.
fn output_within(mut cmd: Command, timeout: std::time::Duration) -> Option<std::process::Output> {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(timeout) {
        Ok(out) => Some(out),
        Err(_) => {
            #[cfg(unix)]
            // SAFETY: signals our own child, which has not been reaped (its
            // waiter is still blocked in `wait`).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            let _ = pid;
            None
        }
    }
}

/// Runs `case` in a subprocess on each backend, on a thread that used the
/// crate before and one that did not; each child's stderr must contain
/// `stderr_has`, if given.
fn run_case(case: &str, stderr_has: Option<&str>) {
    for backend in common::backends() {
        for used_before in [true, false] {
            let name = match backend {
                Backend::Rseq => "rseq",
                _ => "sharded",
            };
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "child_runs_case",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CASE, case)
            .env("PERCPU_REF_BACKEND", name);
            if used_before {
                cmd.env(USED_BEFORE, "1");
            } else {
                cmd.env_remove(USED_BEFORE);
            }
            let out = output_within(cmd, CHILD_TIMEOUT).unwrap_or_else(|| {
                panic!("{case} on {name}, used_before={used_before}: hung for {CHILD_TIMEOUT:?}")
            });
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert!(
                out.status.success() && stdout.contains("tls case passed"),
                "{case} on {name}, used_before={used_before}: {}\n{stdout}{stderr}",
                out.status
            );
            if let Some(want) = stderr_has {
                assert!(
                    stderr.contains(want),
                    "{case} on {name}, used_before={used_before}: no {want:?} on stderr:\n{stderr}"
                );
            }
        }
    }
}

/// One test per case, each running it in subprocesses ([`run_case`]);
/// in those subprocesses the tests do nothing.
macro_rules! case_tests {
    ($($(#[$cfg:meta])* $test:ident => $case:literal $(, stderr $want:literal)?;)*) => {$(
        $(#[$cfg])*
        #[test]
        fn $test() {
            if std::env::var_os(CASE).is_none() {
                run_case($case, None $(.or(Some($want)))?);
            }
        }
    )*};
}

case_tests! {
    percpu_ref_dropped_in_a_tls_destructor => "percpu_ref";
    owner_dropped_in_a_tls_destructor => "owner";
    ref_dropped_in_a_tls_destructor => "ref";
    weak_dropped_in_a_tls_destructor => "weak";
    killed_dropped_in_a_tls_destructor => "killed";
    #[cfg(feature = "css")]
    css_ref_dropped_in_a_tls_destructor => "css_ref";
    #[cfg(feature = "css")]
    task_dropped_in_a_tls_destructor => "task";
    #[cfg(feature = "css")]
    pages_dropped_in_a_tls_destructor => "pages";
    #[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
    deferred_kills_complete_in_a_tls_destructor_whose_thread_cannot_start_the_engine =>
        "engine_refused", stderr "cannot start the grace-period engine thread";
    #[cfg(all(unix, not(miri)))]
    fork_in_a_tls_destructor => "fork";
}
