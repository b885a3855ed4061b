//! A refused grace period undoes the switch: a thread
//! whose `membarrier` a seccomp filter blocks gets
//! `Error::GracePeriodFailed` from `kill_and_confirm_sync` and a panic from
//! `switch_to_atomic_sync`, with the ref exactly as it was; a promoted
//! `Shared`'s `get_mut` and `try_unwrap` there give the conservative
//! answer, and the value stays managed per CPU.
//!
//! A binary of its own, with one test function: a grace period serves the
//! whole process, so a synchronous switch on the blocked thread that finds
//! another thread's grace period running waits for that one (or the next)
//! instead of issuing its own, and completes. In `tests/soundness.rs`, whose
//! other tests kill rseq refs in parallel, that happened on a CI machine.
//! Here the only other thread counts per CPU and never switches, so the
//! blocked thread's switch must run its own grace period.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(miri)
))]

mod common;
use common::{counted, fail_syscalls_on_this_thread, panic_message};
use percpu_ref::shared::Shared;
use percpu_ref::{Backend, Error, InitFlags};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

#[test]
fn a_refused_grace_period_undoes_the_switch() {
    if !Backend::Rseq.is_available() {
        eprintln!("skipped: the rseq backend is not available");
        return;
    }
    let (r, rel) = counted(InitFlags::ALLOW_REINIT, Backend::Rseq);
    let r = Arc::new(r);
    r.get_many(5);
    // Another thread keeps counting per CPU throughout.
    let stop = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while stop.load(SeqCst) == 0 {
                r.get();
                r.put();
                n += 1;
            }
            n
        })
    };
    let confirmed = Arc::new(AtomicUsize::new(0));
    {
        let (r, confirmed) = (r.clone(), confirmed.clone());
        std::thread::spawn(move || {
            // As a sandbox applied after start-up would.
            fail_syscalls_on_this_thread(&[libc::SYS_membarrier], libc::EPERM);
            let e = r
                .kill_and_confirm_sync(|_| {
                    confirmed.fetch_add(1, SeqCst);
                })
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::GracePeriodFailed {
                        op: "kill_and_confirm_sync",
                        errno: libc::EPERM
                    }
                ),
                "{e:?}"
            );
            assert!(e.to_string().contains("undone"), "{e}");
            assert!(r.is_percpu() && !r.is_dying(), "the kill was undone");
            let msg = panic_message(|| r.switch_to_atomic_sync());
            assert!(msg.contains("switch_to_atomic_sync") && msg.contains("membarrier"));
            assert!(r.is_percpu(), "the switch was undone");
            assert!(r.tryget_live());
            r.put();
        })
        .join()
        .unwrap();
    }
    assert_eq!(confirmed.load(SeqCst), 0, "confirm never ran");
    // On a loaded machine the worker may not have run yet: let it count.
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(1, SeqCst);
    assert!(worker.join().unwrap() > 0);
    // A thread without the filter can kill it, and the count is exact.
    r.switch_to_atomic_sync();
    assert_eq!(r.atomic_count(), Some(6), "nothing lost, nothing twice");
    r.switch_to_percpu().unwrap();
    r.kill_sync().unwrap();
    r.put_many(5);
    assert_eq!(rel.load(SeqCst), 1);

    // A promoted `Shared`'s exact checks on a blocked thread: conservative
    // (`None`, `Err`), and the value still managed per CPU: once its
    // handles are gone the engine drops it. Nothing is queued on the
    // engine meanwhile (no clone was dropped), so no grace period of its
    // own can serve the blocked thread's switch.
    #[derive(Debug)]
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let s = Shared::new(Dropped(drops.clone()));
    if Shared::promote(&s) {
        let s = std::thread::spawn(move || {
            fail_syscalls_on_this_thread(&[libc::SYS_membarrier], libc::EPERM);
            let mut s = s;
            assert!(
                Shared::get_mut(&mut s).is_none(),
                "refused: not known unique"
            );
            let s = Shared::try_unwrap(s).expect_err("refused: not known to be the last");
            assert!(Shared::is_percpu(&s), "per CPU again");
            s
        })
        .join()
        .unwrap();
        drop(s.clone());
        drop(s);
        percpu_ref::flush();
        assert_eq!(drops.load(SeqCst), 1, "the engine manages it again");
    }
}
