//! Loom models of the grace-period engine (`src/grace.rs`): deferred
//! switches, batches, shared grace periods and `flush`.
//!
//! There is no engine thread under loom: a model drives it with
//! `percpu_ref::loom_support::step()` from one of its threads (one step =
//! take the queue as a batch, run its grace period, complete each ref),
//! and `flush` and `Drop` run steps themselves when they must wait. The
//! engine's state is fresh for every execution.
//!
//! Models that need a grace period run on the loom model of the rseq
//! backend (`Backend::Rseq` under `--cfg loom`: a section is a critical
//! section on a process-wide per-CPU lock, the grace period takes every
//! CPU's lock in turn); the others also run on the sharded backend (no
//! grace period, the same observable order of confirm and release).
//!
//! Run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --test loom_engine
//! ```
//!
//! `scripts/loom-mutants` runs every model against the engine's mutants
//! (`engine_*`, grep `mutant engine_`) and the others.

#![cfg(percpu_ref_loom)]

mod common;
use common::{check, models};

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use loom::thread;
use percpu_ref::loom_support::step;
use percpu_ref::shared::Shared;
use percpu_ref::{Backend, InitFlags, PercpuRef};
use std::pin::Pin;
use std::sync::Arc;

/// What a ref's callbacks and the model's threads observe.
#[derive(Default)]
struct Probe {
    confirmed: AtomicBool,
    /// References the model's threads hold (decremented before each put).
    held: AtomicUsize,
    releases: AtomicUsize,
}

impl Probe {
    fn new(held: usize) -> Arc<Probe> {
        let p = Probe::default();
        p.held.store(held, SeqCst);
        Arc::new(p)
    }

    fn confirmed(&self) -> bool {
        self.confirmed.load(SeqCst)
    }

    fn releases(&self) -> usize {
        self.releases.load(SeqCst)
    }

    /// A confirm callback that records itself.
    fn confirm(self: &Arc<Self>) -> impl FnOnce(&PercpuRef) + Send + 'static {
        let p = self.clone();
        move |_| assert!(!p.confirmed.swap(true, SeqCst), "confirm ran twice")
    }

    /// One put, accounted: the reference stops being held first.
    fn put(&self, r: &PercpuRef) {
        self.held.fetch_sub(1, SeqCst);
        r.put();
    }
}

type PinnedRef = Pin<Arc<PercpuRef>>;

/// A pinned ref whose release asserts that it is the only one, that confirm
/// ran first, and that no reference is still held.
fn strict_ref(p: &Arc<Probe>, backend: Backend) -> PinnedRef {
    let p = p.clone();
    Arc::pin(
        PercpuRef::with_backend(
            move |_| {
                assert!(p.confirmed.load(SeqCst), "release ran before confirm");
                assert_eq!(
                    p.held.load(SeqCst),
                    0,
                    "release ran while a reference is held"
                );
                assert_eq!(p.releases.fetch_add(1, SeqCst), 0, "release ran twice");
            },
            InitFlags::empty(),
            backend,
        )
        .unwrap(),
    )
}

/// One get (percpu mode) by the model's main thread, handed to a thread
/// that puts it.
fn get_for(r: &PinnedRef, p: &Arc<Probe>) {
    r.get();
    p.held.fetch_add(1, SeqCst);
}

fn spawn_put(r: &PinnedRef, p: &Arc<Probe>) -> thread::JoinHandle<()> {
    let (r, p) = (r.clone(), p.clone());
    thread::spawn(move || p.put(&r))
}

// ----- the models ---------------------------------------------------------

/// Two refs killed with `kill_and_confirm` are completed by one
/// engine step (one batch, one grace period), while a thread puts a
/// reference on each (a section in flight on the rseq model): both
/// confirmed after the step, both released exactly once, after confirm and
/// after the last put.
fn two_refs_one_batch(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    get_for(&a, &pa);
    get_for(&b, &pb);
    let (ra, rb) = (a.clone(), b.clone());
    let (qa, qb) = (pa.clone(), pb.clone());
    let putter = thread::spawn(move || {
        qa.put(&ra);
        qb.put(&rb);
    });
    a.as_ref().kill_and_confirm(pa.confirm()).unwrap();
    b.as_ref().kill_and_confirm(pb.confirm()).unwrap();
    assert!(step(), "the step found nothing queued");
    assert!(
        pa.confirmed() && pb.confirmed(),
        "one step completes the batch"
    );
    assert!(!step(), "both refs were in the first batch");
    putter.join().unwrap();
    assert_eq!((pa.releases(), pb.releases()), (1, 1));
}

/// A kill queued while another thread's grace period is in flight is not
/// completed by that grace period: a section that read percpu mode after
/// the grace period passed its CPU, but before the kill set `ATOMIC`, must
/// be waited for (rseq model: loom reports the sum racing with the
/// section's add, or the count comes out wrong).
fn kill_queued_during_grace_period(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    get_for(&b, &pb);
    let other = {
        let (a, pa) = (a.clone(), pa.clone());
        // A synchronous kill: runs a grace period on this thread.
        thread::spawn(move || a.kill_and_confirm_sync(pa.confirm()).unwrap())
    };
    let putter = spawn_put(&b, &pb);
    b.as_ref().kill_and_confirm(pb.confirm()).unwrap();
    step();
    other.join().unwrap();
    putter.join().unwrap();
    percpu_ref::flush();
    assert_eq!((pa.releases(), pb.releases()), (1, 1));
}

/// Every ref of a batch runs its confirm before its release, whether the
/// release comes from the engine's puts or from a thread's last put racing
/// with the batch.
fn confirm_before_release_in_a_batch(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    get_for(&a, &pa);
    get_for(&b, &pb);
    a.as_ref().kill_and_confirm(pa.confirm()).unwrap();
    b.as_ref().kill_and_confirm(pb.confirm()).unwrap();
    let (ta, tb) = (spawn_put(&a, &pa), spawn_put(&b, &pb));
    step();
    ta.join().unwrap();
    tb.join().unwrap();
    assert_eq!((pa.releases(), pb.releases()), (1, 1));
}

/// Once `kill` returned, no `tryget_live` that starts afterwards
/// (on any thread) succeeds, whether or not the engine completed the kill.
fn tryget_live_fails_after_kill(backend: Backend) {
    let p = Probe::new(0);
    let r = strict_ref(&p, backend);
    let killed = Arc::new(AtomicBool::new(false));
    let checker = {
        let (r, p, killed) = (r.clone(), p.clone(), killed.clone());
        thread::spawn(move || {
            let after_kill = killed.load(SeqCst);
            if r.tryget_live() {
                assert!(!after_kill, "tryget_live succeeded after kill returned");
                p.held.fetch_add(1, SeqCst);
                p.put(&r);
            }
        })
    };
    let engine = thread::spawn(|| {
        step();
    });
    r.as_ref().kill_and_confirm(p.confirm()).unwrap();
    killed.store(true, SeqCst);
    checker.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert_eq!(p.releases(), 1);
}

/// `flush` returns only once every deferred switch queued before it has
/// run its confirm (and put its references), even while another thread
/// runs the engine step that completes it.
fn flush_after_every_earlier_confirm(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    let engine = thread::spawn(|| {
        step();
    });
    let killer = {
        let (b, pb) = (b.clone(), pb.clone());
        thread::spawn(move || b.as_ref().kill_and_confirm(pb.confirm()).unwrap())
    };
    a.as_ref().kill_and_confirm(pa.confirm()).unwrap();
    percpu_ref::flush();
    assert!(pa.confirmed(), "flush returned before an earlier confirm");
    assert_eq!(pa.releases(), 1, "flush returned before the release");
    killer.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert!(pb.confirmed());
}

/// Two synchronous kills at once share grace periods; each returns only
/// after a grace period that started after its switch: a section on its
/// ref that read percpu mode is counted exactly (rseq model: loom reports
/// a sum racing with the add otherwise).
fn sync_waiter_after_its_grace_period(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    get_for(&b, &pb);
    let other = {
        let (a, pa) = (a.clone(), pa.clone());
        thread::spawn(move || a.kill_and_confirm_sync(pa.confirm()).unwrap())
    };
    let putter = spawn_put(&b, &pb);
    b.kill_and_confirm_sync(pb.confirm()).unwrap();
    other.join().unwrap();
    putter.join().unwrap();
    assert_eq!((pa.releases(), pb.releases()), (1, 1));
}

/// Dropping a ref right after its deferred kill waits until the engine is
/// done with it (the step may run on another thread, or from the drop).
fn drop_waits_for_the_engine(backend: Backend) {
    let p = Probe::new(0);
    let r = strict_ref(&p, backend);
    let engine = thread::spawn(|| {
        step();
    });
    r.as_ref().kill_and_confirm(p.confirm()).unwrap();
    drop(r);
    assert!(p.confirmed(), "the ref was dropped before its confirm ran");
    assert_eq!(p.releases(), 1);
    engine.join().unwrap();
}

/// A deferred switch, then `switch_to_percpu` (which waits for the engine)
/// while another thread runs the step: the engine's sum reads the per-CPU
/// counters before the reset writes them (rseq model: loom reports the two
/// racing if the pending bit's release/acquire pair is missing).
fn deferred_switch_then_percpu(backend: Backend) {
    let p = Probe::new(0);
    let r = Arc::pin(PercpuRef::with_backend(|_| {}, InitFlags::ALLOW_REINIT, backend).unwrap());
    r.get();
    let engine = thread::spawn(|| {
        step();
    });
    r.as_ref().switch_to_atomic_and_confirm(p.confirm());
    r.switch_to_percpu().unwrap();
    assert!(p.confirmed(), "the switch back waited for the deferred one");
    assert!(r.is_percpu());
    r.put();
    engine.join().unwrap();
    r.kill_sync().unwrap();
    assert!(r.is_zero());
}

/// Whether some execution of `two_sync_kills` needed
/// only one grace period for two kills.
static SHARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Two synchronous kills at once need one or two grace periods, and in
/// some interleaving one (the second waiter finds that a grace period
/// that started after its switch has completed while it waited).
fn two_sync_kills(backend: Backend) {
    let (pa, pb) = (Probe::new(0), Probe::new(0));
    let (a, b) = (strict_ref(&pa, backend), strict_ref(&pb, backend));
    let other = {
        let (a, pa) = (a.clone(), pa.clone());
        thread::spawn(move || a.kill_and_confirm_sync(pa.confirm()).unwrap())
    };
    b.kill_and_confirm_sync(pb.confirm()).unwrap();
    other.join().unwrap();
    let n = percpu_ref::loom_support::grace_periods();
    assert!((1..=2).contains(&n), "{n} grace periods for two kills");
    if n == 1 {
        SHARED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn sync_kills_share_a_grace_period() {
    check(2, || two_sync_kills(Backend::Rseq));
    assert!(
        SHARED.load(std::sync::atomic::Ordering::Relaxed),
        "no interleaving shared a grace period between two synchronous kills"
    );
}

// ----- managed refs (`src/percpu_ref/managed.rs`) ---------------------------

/// A managed ref whose release asserts that it is the only one and that
/// no reference is still held (no confirm: nothing kills it).
fn managed_ref(p: &Arc<Probe>, backend: Backend) -> PinnedRef {
    let q = p.clone();
    let r = Arc::pin(
        PercpuRef::with_backend(
            move |_| {
                assert_eq!(
                    q.held.load(SeqCst),
                    0,
                    "release ran while a reference is held"
                );
                assert_eq!(q.releases.fetch_add(1, SeqCst), 0, "release ran twice");
            },
            InitFlags::empty(),
            backend,
        )
        .unwrap(),
    );
    r.as_ref().switch_to_managed().unwrap();
    r
}

/// An engine thread: three steps (a mark's clear, its scan and its
/// window, or whatever is queued by then).
fn spawn_engine() -> thread::JoinHandle<()> {
    thread::spawn(|| {
        step();
        step();
        step();
    })
}

/// The last two puts of a managed ref, one on another thread, while the
/// engine scans it: it is released exactly once, after both (invariants 1
/// to 3: neither put goes unseen, the window's count is exact).
fn managed_last_puts_vs_scan(backend: Backend) {
    let p = Probe::new(1);
    let r = managed_ref(&p, backend);
    get_for(&r, &p);
    let putter = spawn_put(&r, &p);
    let engine = spawn_engine();
    p.put(&r);
    putter.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert_eq!(
        p.releases(),
        1,
        "a managed ref whose count is down to the stand-in was not released"
    );
    assert!(!r.tryget(), "a tryget succeeded on a released ref");
}

/// The last puts of two managed refs, one on another thread, before the
/// engine's first step: both marks are queued in one batch, and each step's
/// completion queues the next step of its ref while the batch's later
/// links are still to be completed (the links live in the refs). Both are
/// released exactly once.
fn managed_two_refs_one_batch(backend: Backend) {
    let (pa, pb) = (Probe::new(1), Probe::new(1));
    let (a, b) = (managed_ref(&pa, backend), managed_ref(&pb, backend));
    let (ra, qa) = (a.clone(), pa.clone());
    let putter = thread::spawn(move || qa.put(&ra));
    pb.put(&b);
    putter.join().unwrap();
    percpu_ref::flush();
    assert_eq!(
        (pa.releases(), pb.releases()),
        (1, 1),
        "a managed ref queued in the same batch as another was not released"
    );
}

/// A tryget (a `Weak::upgrade`) racing the last put and the scan: either
/// it revives the ref (and its put is then the last) or it fails because
/// the ref was released; never a release under it.
fn managed_tryget_vs_last_put(backend: Backend) {
    let p = Probe::new(1);
    let r = managed_ref(&p, backend);
    let tryer = {
        let (r, p) = (r.clone(), p.clone());
        thread::spawn(move || {
            if r.tryget() {
                p.held.fetch_add(1, SeqCst);
                assert_eq!(
                    p.releases(),
                    0,
                    "released while a tryget's reference is held"
                );
                p.put(&r);
            }
        })
    };
    let engine = spawn_engine();
    p.put(&r);
    tryer.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert_eq!(p.releases(), 1);
    assert!(!r.tryget(), "a tryget succeeded on a released ref");
}

/// What a release wrote, read by the thread whose `Drop` of the ref
/// returned: the engine's last store (PENDING cleared) must order it
/// (loom reports the write and the read as a race otherwise).
struct Written(loom::cell::UnsafeCell<u32>);

// SAFETY: written once by the release, read after the `Drop` that waited
// for it: the model checks that the two are ordered.
unsafe impl Sync for Written {}

/// The last put of a managed ref, then its `Drop`, while the engine scans
/// it: the `Drop` waits for the engine, and the release (if the engine got
/// that far before the `Drop` asked it to stop) happens before it returns.
fn managed_release_before_drop_returns(backend: Backend) {
    let written = Arc::new(Written(loom::cell::UnsafeCell::new(0)));
    let r = {
        let w = written.clone();
        let r = Box::pin(
            PercpuRef::with_backend(
                // SAFETY: the only write; the read below is after the `Drop`.
                move |_| w.0.with_mut(|v| unsafe { *v = 1 }),
                InitFlags::empty(),
                backend,
            )
            .unwrap(),
        );
        r.as_ref().switch_to_managed().unwrap();
        r
    };
    let engine = spawn_engine();
    r.put();
    drop(r);
    // SAFETY: the release, if it ran, ran before the `Drop` returned.
    let v = written.0.with(|v| unsafe { *v });
    assert!(v <= 1);
    engine.join().unwrap();
}

/// A tryget racing the scan (a `Weak::upgrade`) whose holder writes and
/// then puts in the window: the election that releases after that put
/// acquires it, so the release sees the write (loom reports the two as a
/// race otherwise: no section lock or probe orders them).
fn managed_release_sees_the_last_holders_writes(backend: Backend) {
    let written = Arc::new(Written(loom::cell::UnsafeCell::new(0)));
    let releases = Arc::new(AtomicUsize::new(0));
    let r = {
        let (w, n) = (written.clone(), releases.clone());
        let r = Arc::pin(
            PercpuRef::with_backend(
                move |_| {
                    // SAFETY: the read is ordered after the holder's write
                    // by the release election (what the model checks).
                    let _ = w.0.with(|v| unsafe { *v });
                    n.fetch_add(1, SeqCst);
                },
                InitFlags::empty(),
                backend,
            )
            .unwrap(),
        );
        r.as_ref().switch_to_managed().unwrap();
        r
    };
    let holder = {
        let (r, w) = (r.clone(), written.clone());
        thread::spawn(move || {
            if r.tryget() {
                // SAFETY: the holder's write, before its put.
                w.0.with_mut(|v| unsafe { *v = 1 });
                r.put();
            }
        })
    };
    let engine = spawn_engine();
    r.put();
    holder.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    let released = releases.load(SeqCst);
    if released != 1 {
        // A ref left pending for ever (a lost scan): its drop would wait
        // for it, so the model fails here instead of hanging.
        std::mem::forget(r);
        panic!("{released} releases of a managed ref whose count is down to the stand-in");
    }
    assert!(!r.tryget(), "a tryget succeeded on a released ref");
}

/// A kill of a managed ref while its last other reference is put and the
/// engine scans it: the kill takes over, and the ref is released once,
/// after the last put.
fn managed_kill_vs_scan(backend: Backend) {
    let p = Probe::new(1);
    let r = managed_ref(&p, backend);
    get_for(&r, &p);
    let putter = spawn_put(&r, &p);
    let engine = spawn_engine();
    p.held.fetch_sub(1, SeqCst); // the kill puts the base reference
    r.kill_sync().unwrap();
    putter.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert_eq!(p.releases(), 1);
    assert!(!r.is_managed());
}

// ----- `shared::Shared` (`src/shared/`) ---------------------------------------

/// A `Shared`'s value: holders read `cell`, its `Drop` writes it, so loom
/// reports a drop not ordered after a holder's read; `drops` counts.
struct Canary {
    cell: loom::cell::UnsafeCell<u32>,
    drops: Arc<AtomicUsize>,
}

// SAFETY: the cell is read by holders and written only by `Drop`, which
// the model checks is ordered after every read.
unsafe impl Sync for Canary {}

impl Canary {
    fn new(drops: &Arc<AtomicUsize>) -> Canary {
        Canary {
            cell: loom::cell::UnsafeCell::new(1),
            drops: drops.clone(),
        }
    }

    /// A holder's use of the value.
    fn read(&self) {
        // SAFETY: a handle is held: the drop must come after this read.
        assert_eq!(self.cell.with(|v| unsafe { *v }), 1, "a dropped value read");
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        // SAFETY: the value's last access, which the model checks.
        self.cell.with_mut(|v| unsafe { *v = 0 });
        self.drops.fetch_add(1, SeqCst);
    }
}

/// After a `Shared` model: dropped once, and every block freed.
fn shared_done(drops: &AtomicUsize) {
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 1, "a value dropped other than once");
    assert_eq!(percpu_ref::loom_support::live_blocks(), 0, "a block leaked");
}

/// A thread that promotes the value through `a`, reads it and drops `a`.
fn spawn_promoter(a: Shared<Canary>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        Shared::promote(&a);
        a.read();
        drop(a);
    })
}

/// A thread that upgrades `w`, reads the value if that succeeded, and
/// drops the `Weak`.
fn spawn_upgrader(w: percpu_ref::shared::Weak<Canary>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        if let Some(u) = w.upgrade() {
            u.read();
        }
        drop(w);
    })
}

/// A value promoted by one handle's thread while the other handle, the
/// last but one, is dropped and the engine runs: dropped once, after both
/// handles, whichever of promotion and drops comes first (invariant 5 of
/// `shared::block`: the promoting handle keeps the count above zero).
fn shared_promotion_vs_last_drop(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    let t = spawn_promoter(v.clone());
    let engine = spawn_engine();
    v.read();
    drop(v);
    t.join().unwrap();
    engine.join().unwrap();
    shared_done(&drops);
}

/// Two threads promote one value (two clones that crossed the threshold
/// at once, or `Shared::promote` on a promoted value) while the engine
/// scans it after a drop: the second promoter must not leave the ref
/// handed back and unqueued (it asks the engine to stop for its lock), or
/// the value is never dropped.
fn shared_second_promotion_vs_scan(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    let t = spawn_promoter(v.clone());
    let engine = spawn_engine();
    Shared::promote(&v);
    drop(v);
    t.join().unwrap();
    engine.join().unwrap();
    shared_done(&drops);
}

/// A clone and a `Weak::upgrade` in the block's word racing the hand-over
/// of the word's count to the ref (the promoting thread's swap)
/// and the engine: each lands in the word before the swap (and is handed
/// over) or on the ref after it, never both or neither (invariant 3 of
/// `shared::block`); the value is dropped once, after every handle.
fn shared_clone_and_upgrade_vs_handoff(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    let w = Shared::downgrade(&v);
    let t = spawn_promoter(v.clone());
    let engine = spawn_engine();
    let c = v.clone();
    drop(v);
    let u = w.upgrade().expect("a handle is held");
    drop(w);
    c.read();
    drop(c);
    u.read();
    drop(u);
    t.join().unwrap();
    engine.join().unwrap();
    shared_done(&drops);
}

/// A clone from a `Shared` and its drop on another thread, racing the last
/// other handle's drop while the engine scans the promoted value.
fn shared_clone_vs_scan(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let b = v.clone();
    let t = thread::spawn(move || {
        let c = b.clone();
        drop(b);
        c.read();
        drop(c);
    });
    let engine = spawn_engine();
    drop(v);
    t.join().unwrap();
    engine.join().unwrap();
    shared_done(&drops);
}

/// `shared_clone_vs_scan` on a `Shared<[Canary]>`: the promoted ref's
/// `release` and the unit it owes carry the block's wide pointer
/// (`ErasedPtr`), so the engine drops both elements, once, after every
/// read, and the block is freed with its length's layout.
fn shared_slice_clone_vs_scan(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_slice_on(
        vec![Canary::new(&drops), Canary::new(&drops)],
        backend,
    );
    Shared::promote(&v);
    let b = v.clone();
    let t = thread::spawn(move || {
        let c = b.clone();
        drop(b);
        c.iter().for_each(Canary::read);
        drop(c);
    });
    let engine = spawn_engine();
    v[1].read();
    drop(v);
    t.join().unwrap();
    engine.join().unwrap();
    percpu_ref::flush();
    assert_eq!(drops.load(SeqCst), 2, "an element dropped other than once");
    assert_eq!(percpu_ref::loom_support::live_blocks(), 0, "a block leaked");
}

/// A `Weak::upgrade` racing the last drop of a promoted value while the
/// engine scans it: the upgrade either fails or holds a live value (it may
/// revive it), the value is dropped once, and the `Weak`, dropped last or
/// before the engine's free, leaves no block behind.
fn shared_upgrade_vs_last_drop(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let w = Shared::downgrade(&v);
    let t = spawn_upgrader(w);
    let engine = spawn_engine();
    drop(v);
    t.join().unwrap();
    engine.join().unwrap();
    shared_done(&drops);
}

/// `Shared::get_mut` against another handle's downgrade, that handle's
/// drop and an upgrade through the `Weak`: no `&mut T` coexists with the
/// upgraded handle's read (loom sees the write and the read unordered
/// otherwise). The first `get_mut` races the downgrade (the allocation
/// count stays locked across the check, std's `Arc::is_unique`:
/// `shared_downgrade_ignores_lock`); the second comes after the other
/// handle is gone and its `Weak` may still upgrade
/// (`shared_get_mut_ignores_weak`). Once everything is joined, `get_mut`
/// is `Some`: the check is exact.
fn shared_get_mut_vs_upgrade(backend: Backend) {
    get_mut_vs_upgrade(backend, false);
}

/// [`shared_get_mut_vs_upgrade`] on a promoted value: its check switches
/// the ref to atomic mode (a grace period) and locks the allocation count
/// in that window, then hands the ref back to the engine
/// (`shared_exact_ignores_weak`: the count read without the lock).
fn shared_exact_get_mut_vs_upgrade(backend: Backend) {
    get_mut_vs_upgrade(backend, true);
}

fn get_mut_vs_upgrade(backend: Backend, promote: bool) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    if promote {
        Shared::promote(&v);
    }
    let b = v.clone();
    let dropped = Arc::new(AtomicBool::new(false));
    let t = thread::spawn({
        let dropped = dropped.clone();
        move || {
            let w = Shared::downgrade(&b);
            drop(b);
            dropped.store(true, SeqCst);
            if let Some(u) = w.upgrade() {
                u.read();
            }
            drop(w);
        }
    });
    write_if_unique(&mut v);
    while !dropped.load(SeqCst) {
        thread::yield_now();
    }
    write_if_unique(&mut v);
    // Joined first: an upgrade after a write needs `v`, which keeps the
    // count above zero until then.
    t.join().unwrap();
    assert!(
        Shared::get_mut(&mut v).is_some(),
        "the only handle, not unique"
    );
    drop(v);
    shared_done(&drops);
}

/// `Shared::get_mut`, and a write through it if `Some`: loom reports the
/// write unordered with any other holder's read.
fn write_if_unique(v: &mut Shared<Canary>) {
    if let Some(m) = Shared::get_mut(v) {
        // SAFETY: `get_mut` found no other handle and no `Weak`; the model
        // checks that every other handle's read happens before this write.
        m.cell.with_mut(|x| unsafe { *x = 1 });
    }
}

/// `Shared::try_unwrap`, and a write to the value if it was moved out:
/// loom reports the write unordered with any other holder's read.
fn unwrap_and_write(v: Shared<Canary>) {
    match Shared::try_unwrap(v) {
        Ok(value) => {
            // SAFETY: `try_unwrap` moved the value out: no handle can read it.
            value.cell.with_mut(|x| unsafe { *x = 1 });
            drop(value);
        }
        Err(v) => drop(v),
    }
}

/// A thread that reads the value through `c` and drops it, then upgrades
/// `w` (if any) and reads again; returns once the drop is seen through a
/// relaxed flag (which orders nothing: only the count can).
fn spawn_read_and_drop(
    c: Shared<Canary>,
    w: Option<percpu_ref::shared::Weak<Canary>>,
) -> thread::JoinHandle<()> {
    let dropped = Arc::new(AtomicBool::new(false));
    let t = thread::spawn({
        let dropped = dropped.clone();
        move || {
            c.read();
            drop(c);
            dropped.store(true, Relaxed);
            if let Some(u) = w.as_ref().and_then(percpu_ref::shared::Weak::upgrade) {
                u.read();
            }
            drop(w);
        }
    });
    while !dropped.load(Relaxed) {
        thread::yield_now();
    }
    t
}

/// `Shared::get_mut` after another handle read `T` and was dropped, seen
/// through a relaxed flag (no `Weak`, so the allocation count orders
/// nothing): the check's acquire of the word orders that read before the
/// caller's write (the check's load weakened to relaxed is caught here).
fn shared_get_mut_after_other_drop(backend: Backend) {
    get_mut_after_other_drop(backend, false);
}

/// [`shared_get_mut_after_other_drop`] on a promoted value: the other
/// handle's per-CPU put is summed after the grace period, which orders its
/// read before the write; `Some` once the handle is gone.
fn shared_exact_get_mut_after_other_drop(backend: Backend) {
    get_mut_after_other_drop(backend, true);
}

fn get_mut_after_other_drop(backend: Backend, promote: bool) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    if promote {
        Shared::promote(&v);
    }
    let t = spawn_read_and_drop(v.clone(), None);
    // `None` where the check reads the count from before the drop (the
    // relaxed flag orders nothing).
    write_if_unique(&mut v);
    t.join().unwrap();
    drop(v);
    shared_done(&drops);
}

/// `Shared::try_unwrap` after another handle read `T`, was dropped (seen
/// through a relaxed flag) and had downgraded first: its `Weak` upgrades
/// and reads `T` in the meantime. `T` is moved out only with the count at
/// one, in one compare-and-swap that fails against the upgrade
/// (`shared_take_last_by_store`), and the compare-and-swap acquires the
/// dropped handle's read (`shared_take_last_relaxed`): loom sees either
/// read unordered with the write to the moved-out value otherwise.
fn shared_try_unwrap_vs_drop_and_upgrade(backend: Backend) {
    try_unwrap_vs_drop_and_upgrade(backend, false);
}

/// [`shared_try_unwrap_vs_drop_and_upgrade`] on a promoted value: the
/// value is moved out only by the exact window's election from one
/// (`shared_exact_take_by_check`: a check and a store, which an upgrade
/// in between defeats), with no release run (it would drop the value
/// moved out), and the ref and block are freed by the last unit.
fn shared_exact_try_unwrap_vs_drop_and_upgrade(backend: Backend) {
    try_unwrap_vs_drop_and_upgrade(backend, true);
}

fn try_unwrap_vs_drop_and_upgrade(backend: Backend, promote: bool) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    if promote {
        Shared::promote(&v);
    }
    let w = Shared::downgrade(&v);
    let t = spawn_read_and_drop(v.clone(), Some(w));
    unwrap_and_write(v);
    t.join().unwrap();
    shared_done(&drops);
}

/// `Shared::try_unwrap` of a promoted value's only handle while a `Weak`
/// upgrades on another thread and reads the value: the upgrade fails, or
/// `try_unwrap` does (the window's election is one compare-and-swap from
/// exactly one: `shared_exact_take_by_check`, a check and a store, leaves
/// the upgraded handle a value moved out).
fn shared_exact_try_unwrap_vs_upgrade(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let w = Shared::downgrade(&v);
    let t = spawn_upgrader(w);
    unwrap_and_write(v);
    t.join().unwrap();
    shared_done(&drops);
}

/// `Shared::get_mut` of a promoted value while the other handle reads the
/// value and is dropped on another thread, unsynchronised: a drop before
/// the switch is summed after its grace period, one in the window is an
/// atomic put, and either way its read comes before the caller's write.
/// (The check's acquire, for a put between the switch's last
/// read-modify-write and the check, is kept by the ordering audit: the
/// rseq model's sections order that put anyway.)
fn shared_exact_get_mut_vs_drop(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let c = v.clone();
    let t = thread::spawn(move || {
        c.read();
        drop(c);
    });
    write_if_unique(&mut v);
    t.join().unwrap();
    drop(v);
    shared_done(&drops);
}

/// `Shared::new_cyclic` while a `Weak` that its function sent to another
/// thread upgrades there: the upgrade fails while the count is zero, or
/// holds the value and sees all of it. The value's making is a write that
/// loom tracks; the count's release store, acquired by the upgrade's load,
/// orders it before the other thread's read (`shared_cyclic_publish_relaxed`).
fn shared_new_cyclic_vs_upgrade(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut upgrader = None;
    let v = percpu_ref::loom_support::shared_cyclic_on(
        |me: &percpu_ref::shared::Weak<Canary>| {
            let w = me.clone();
            upgrader = Some(thread::spawn(move || {
                if let Some(u) = w.upgrade() {
                    u.read();
                }
                drop(w);
            }));
            let value = Canary::new(&drops);
            // SAFETY: the value is not shared yet: no handle can read it.
            value.cell.with_mut(|x| unsafe { *x = 1 });
            value
        },
        backend,
    );
    v.read();
    drop(v);
    upgrader.unwrap().join().unwrap();
    shared_done(&drops);
}

/// `Shared::into_inner` of both handles of a promoted value, on two
/// threads, while each waits for the engine: exactly one gets the value
/// (the release leaves it to a registered taker instead of dropping it,
/// `shared_release_ignores_takers`; a taker waits for the engine before it
/// leaves, `shared_into_inner_no_flush`), and it is dropped once, by the
/// one that got it. In atomic mode (sharded), `Arc`'s read-modify-write.
fn shared_into_inner_vs_into_inner(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let b = v.clone();
    let t = thread::spawn(move || {
        b.read();
        Shared::into_inner(b)
    });
    let mine = Shared::into_inner(v);
    let theirs = t.join().unwrap();
    assert!(
        mine.is_some() != theirs.is_some(),
        "into_inner gave the value to {} of the two last handles",
        usize::from(mine.is_some()) + usize::from(theirs.is_some())
    );
    assert_eq!(drops.load(SeqCst), 0, "a value both taken and dropped");
    drop(mine.or(theirs));
    shared_done(&drops);
}

/// `Shared::into_inner` racing the other handle's plain drop and an
/// upgrade through a `Weak`: the value is taken or dropped, once, and a
/// taker's use of it comes after the other handles' reads (the release's
/// release and the taker's acquire; loom reports the write below
/// unordered with a read otherwise).
fn shared_into_inner_vs_drop_and_upgrade(backend: Backend) {
    let drops = Arc::new(AtomicUsize::new(0));
    let v = percpu_ref::loom_support::shared_on(Canary::new(&drops), backend);
    Shared::promote(&v);
    let w = Shared::downgrade(&v);
    let c = v.clone();
    let t = thread::spawn(move || {
        c.read();
        drop(c);
        if let Some(u) = w.upgrade() {
            u.read();
        }
        drop(w);
    });
    if let Some(value) = Shared::into_inner(v) {
        // SAFETY: `into_inner` moved the value out: no handle can read it.
        value.cell.with_mut(|x| unsafe { *x = 1 });
        drop(value);
    }
    t.join().unwrap();
    shared_done(&drops);
}

/// An owned `Weak::tryget` racing the last `Ref`'s drop once the kill
/// completed (atomic mode), the `Weak` dropped right after: a tryget must
/// not revive a count that the put just took to zero, or the put's
/// election, its last access, may come after the reviver's own last put
/// released the object and its `Weak` freed the block (a use after free,
/// found with the rcuref-style tryget of issue 35: `tryget_revives_zero`;
/// loom sees it as its objects read from freed memory). In this suite
/// because the engine completes the kill.
fn owned_tryget_vs_last_put_after_kill(_: Backend) {
    let owner = percpu_ref::owned::Owner::new(5u64);
    let r = owner.get();
    let w = owner.downgrade();
    drop(owner); // a deferred kill (no drop glue)
    percpu_ref::flush(); // the base reference is put: atomic mode, count 1
    let t = thread::spawn(move || drop(r));
    if let Some(x) = w.tryget() {
        assert_eq!(*x, 5);
    }
    drop(w);
    t.join().unwrap();
    assert_eq!(percpu_ref::loom_support::live_blocks(), 0, "a block leaked");
}

// ----- the tests ------------------------------------------------------------

models! {
    two_refs_one_batch: preemptions 2, backends [sharded, rseq_model];
    kill_queued_during_grace_period: preemptions 2, backends [rseq_model];
    confirm_before_release_in_a_batch: preemptions 2, backends [sharded, rseq_model];
    tryget_live_fails_after_kill: preemptions 2, backends [sharded, rseq_model];
    flush_after_every_earlier_confirm: preemptions 2, backends [sharded, rseq_model];
    sync_waiter_after_its_grace_period: preemptions 2, backends [rseq_model];
    drop_waits_for_the_engine: preemptions 2, backends [sharded, rseq_model];
    deferred_switch_then_percpu: preemptions 2, backends [sharded, rseq_model];
    managed_last_puts_vs_scan: preemptions 2, backends [sharded, rseq_model];
    managed_tryget_vs_last_put: preemptions 2, backends [sharded, rseq_model];
    managed_two_refs_one_batch: preemptions 2, backends [rseq_model];
    managed_kill_vs_scan: preemptions 2, backends [sharded, rseq_model];
    managed_release_before_drop_returns: preemptions 2, backends [sharded, rseq_model];
    managed_release_sees_the_last_holders_writes: preemptions 2, backends [sharded, rseq_model];
    shared_promotion_vs_last_drop: preemptions 2, backends [sharded, rseq_model];
    shared_clone_vs_scan: preemptions 2, backends [sharded, rseq_model];
    shared_slice_clone_vs_scan: preemptions 2, backends [rseq_model];
    shared_upgrade_vs_last_drop: preemptions 2, backends [sharded, rseq_model];
    shared_second_promotion_vs_scan: preemptions 2, backends [rseq_model];
    shared_clone_and_upgrade_vs_handoff: preemptions 2, backends [sharded, rseq_model];
    owned_tryget_vs_last_put_after_kill: preemptions 2, backends [sharded];
    shared_get_mut_vs_upgrade: preemptions 2, backends [sharded];
    shared_get_mut_after_other_drop: preemptions 2, backends [sharded];
    shared_try_unwrap_vs_drop_and_upgrade: preemptions 2, backends [sharded];
    shared_new_cyclic_vs_upgrade: preemptions 2, backends [sharded];
    shared_into_inner_vs_into_inner: preemptions 2, backends [sharded, rseq_model];
    shared_into_inner_vs_drop_and_upgrade: preemptions 2, backends [sharded, rseq_model];
    shared_exact_get_mut_vs_upgrade: preemptions 2, backends [rseq_model];
    shared_exact_get_mut_after_other_drop: preemptions 2, backends [rseq_model];
    shared_exact_try_unwrap_vs_drop_and_upgrade: preemptions 2, backends [rseq_model];
    shared_exact_try_unwrap_vs_upgrade: preemptions 2, backends [rseq_model];
    shared_exact_get_mut_vs_drop: preemptions 2, backends [rseq_model];
}
