//! The kernel's css destruction, from `kill_css` to `css_free_rwork_fn`,
//! with the destroy queue, `cgroup_mutex` and the panic bookkeeping it
//! runs under.
//!
//! A css's walk from `rmdir` to its free reads in this one file, in the
//! order of the sections below: `kill_css`, its confirm
//! (`css_killed_ref_fn`), the destroy work (`Work::run`): the offline
//! (`css_killed_work_fn`), the put that releases it (`css_put`,
//! `css_release`, handed on to the queue), the release work and, a grace
//! period later, the free; then the root css's teardown. These call each
//! other in a loop (the queue runs the work, the work puts references, a
//! put hands its release back to the queue, and releasing `cgroup_mutex`
//! runs the queue), so they are one layer: it stands on the data graph
//! (`graph.rs`), and creation (`create.rs`), the references (`refs.rs`)
//! and the [`Hierarchy`](super::Hierarchy) API stand on it.
//!
//! # `cgroup_mutex` and the destroy queue
//!
//! Tree changes (`mkdir`, `rmdir`, `attach`) and all destroy work run under
//! one lock, `cgroup_mutex`. The kernel runs destroy work on a workqueue
//! (`cgroup_destroy_wq`) whose worker takes `cgroup_mutex`; here the work is
//! run by a thread that already has it, and never inside a `PercpuRef`
//! callback (a release is queued only once the put that made it has
//! returned; see the [module docs](super), *What runs where*):
//!
//! - work queued by the thread holding `cgroup_mutex` (an `rmdir`'s kill
//!   confirm, a release caused by a put made under the mutex) runs when
//!   that thread unlocks, still under the mutex;
//! - work queued by another thread (a release after a task's last put
//!   returned, a free after a grace period) takes the mutex if it is free
//!   and runs; if it is held, the holder runs it before it lets go (it
//!   looks at the queue again after unlocking, so nothing is stranded).
//!
//! With [`WorkMode::Manual`] queued work waits for
//! [`Hierarchy::run_destroy_work`], which makes interleavings the kernel
//! allows (an offline still pending while the parent is removed) easy to
//! set up in tests.
//!
//! # Panics
//!
//! A subsystem callback that panics is caught where it is called, so the
//! work item (or `mkdir`) completes and nothing queued is lost. Who holds
//! `cgroup_mutex` is recorded next to the lock and cleared with it, also
//! when unwinding, so the thread can take it again. The panic is then
//! resumed in the caller that ran the work, after the mutex is released;
//! one with no such caller is kept for the next `flush` or
//! `run_destroy_work`.
//!
//! # Releases leave the `PercpuRef` call first
//!
//! The refcount's release callback runs inside a [`PercpuRef`] method
//! whose `&self` points into the css (and the callback's own closure lives
//! in the css's `PercpuRef`). Destroy work run from there could free the
//! css under those borrows: directly (a subsystem's `css_released` puts
//! another css, whose grace period lets this css's free run), or on
//! another thread (destroy work that saw the release queued runs the free
//! while the releasing thread is still returning from the callback). So
//! `css_release`, like the kernel's, does no work: it only records the
//! css in a per-thread stack (a thread-local head, linked through the
//! csses themselves, so that nothing there needs dropping and a put from
//! a thread-local's destructor still finds it). Every put goes through [`css_put`], which,
//! once the `PercpuRef` call has returned, hands the recorded release to
//! the hierarchy's destroy queue (`settle_releases`). Until then no other
//! thread knows the css was released, and nothing can free it.
//!
//! [`Hierarchy::run_destroy_work`]: super::Hierarchy::run_destroy_work

use super::graph::{Css, CssPtr, Inner, Work, CSS_DYING, CSS_OFFLINED, CSS_ONLINE, CSS_RELEASED};
use super::options::WorkMode;
use super::panics::{CallbackPanics, Payload};
// Under loom the grace-period work waits in `Inner::rcu_list` instead.
#[cfg(not(percpu_ref_loom))]
use super::rcu;
use crate::percpu_ref::{Confirm, PercpuRef};
use crate::sync::{self, MutexGuard, Ordering};
use std::cell::Cell;
use std::sync::Arc;

// ----- cgroup_mutex ----------------------------------------------------------

/// `cgroup_mutex` as this thread holds it: the lock and the owner mark.
/// Dropping it, also while unwinding, clears the mark and unlocks, so a
/// panic never leaves the mutex recorded as held by this thread.
struct Held<'a> {
    inner: &'a Inner,
    guard: Option<MutexGuard<'a, ()>>,
}

impl Held<'_> {
    fn unlock(&mut self) {
        if let Some(g) = self.guard.take() {
            self.inner
                .mutex_owner
                .store(0, crate::sync::unmodeled::Ordering::Relaxed);
            drop(g);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.unlock();
    }
}

/// `cgroup_mutex`, held; unlocking runs queued destroy work first, then
/// resumes the first panic of a subsystem callback run under it.
pub(crate) struct CgroupMutexGuard<'a> {
    inner: &'a Arc<Inner>,
    held: Held<'a>,
    drain: bool,
    /// Panics of subsystem callbacks run under the mutex (by the operation
    /// itself, or by the destroy work run at unlock).
    pub(crate) panics: CallbackPanics,
}

impl CgroupMutexGuard<'_> {
    /// Runs queued destroy work (in [`WorkMode::Inline`]), unlocks, and
    /// runs what other threads queued meanwhile (they found the mutex held
    /// and left it to us: look again now that they can see it unlocked).
    /// Returns the callback panics caught; a no-op once unlocked.
    fn unlock(&mut self) -> CallbackPanics {
        while self.held.guard.is_some() {
            if self.drain {
                self.inner.drain_locked(&mut self.panics);
            }
            self.held.unlock();
            if !self.drain || self.inner.queue_is_empty() {
                break;
            }
            if let Some(g) = sync::try_lock(&self.inner.cgroup_mutex) {
                self.inner.set_owner();
                self.held.guard = Some(g);
            } // else the new holder runs it
        }
        std::mem::take(&mut self.panics)
    }

    /// Unlocks (running destroy work first) and resumes a callback panic.
    /// Ops call this before they return: a panic from a destructor after
    /// the return value is made would leak that value.
    fn finish(mut self) {
        let panics = self.unlock();
        self.inner.resume_or_keep(panics);
    }
}

impl Drop for CgroupMutexGuard<'_> {
    fn drop(&mut self) {
        let panics = self.unlock();
        self.inner.resume_or_keep(panics);
    }
}

impl Inner {
    fn holds_cgroup_mutex(&self) -> bool {
        self.mutex_owner
            .load(crate::sync::unmodeled::Ordering::Relaxed)
            == sync::thread_token()
    }

    fn set_owner(&self) {
        self.mutex_owner.store(
            sync::thread_token(),
            crate::sync::unmodeled::Ordering::Relaxed,
        );
    }

    /// Runs `f` under `cgroup_mutex`, then unlocks (running destroy work)
    /// and resumes a subsystem callback's panic, with `f`'s result still a
    /// local that unwinding drops.
    ///
    /// # Panics
    ///
    /// As [`cgroup_lock`](Self::cgroup_lock).
    pub(crate) fn locked<R>(
        self: &Arc<Self>,
        op: &str,
        f: impl FnOnce(&mut CgroupMutexGuard<'_>) -> R,
    ) -> R {
        let mut g = self.cgroup_lock(op);
        let r = f(&mut g);
        g.finish();
        r
    }

    /// Takes `cgroup_mutex`.
    ///
    /// # Panics
    ///
    /// If this thread already holds it (a subsystem callback calling back
    /// into the hierarchy).
    fn cgroup_lock<'a>(self: &'a Arc<Self>, op: &str) -> CgroupMutexGuard<'a> {
        assert!(
            !self.holds_cgroup_mutex(),
            "css hierarchy: {op} called with cgroup_mutex held by this thread \
             (from a subsystem callback?); it would deadlock"
        );
        let g = sync::lock(&self.cgroup_mutex);
        self.set_owner();
        self.guard_for(g, self.opts.work == WorkMode::Inline)
    }

    fn guard_for<'a>(
        self: &'a Arc<Self>,
        g: MutexGuard<'a, ()>,
        drain: bool,
    ) -> CgroupMutexGuard<'a> {
        CgroupMutexGuard {
            inner: self,
            held: Held {
                inner: self,
                guard: Some(g),
            },
            drain,
            panics: CallbackPanics::default(),
        }
    }
}

// ----- the destroy queue -----------------------------------------------------

impl Inner {
    fn queue_is_empty(&self) -> bool {
        sync::lock(&self.destroy_wq).is_empty()
    }

    /// Queues destroy work (see the module docs for who runs it). If this
    /// thread runs it (the mutex was free), callback panics go to `panics`.
    ///
    /// Never called inside a `PercpuRef` callback except by the kill's
    /// confirm, which holds `cgroup_mutex` and so only queues.
    fn queue_work(self: &Arc<Self>, w: Work, panics: &mut CallbackPanics) {
        sync::lock(&self.destroy_wq).push_back(w);
        if self.opts.work == WorkMode::Manual || self.holds_cgroup_mutex() {
            return;
        }
        if let Some(g) = sync::try_lock(&self.cgroup_mutex) {
            self.set_owner();
            let mut g = self.guard_for(g, true);
            panics.merge(g.unlock());
        }
    }

    /// Resumes the first panic in `panics`, or keeps it for the next
    /// `flush` if this thread is already unwinding.
    fn resume_or_keep(&self, mut panics: CallbackPanics) {
        if std::thread::panicking() {
            if let Some(p) = panics.take() {
                self.keep_orphan(p);
            }
        } else {
            panics.resume();
        }
    }

    fn keep_orphan(&self, p: Payload) {
        let mut slot = sync::lock(&self.orphan_panic);
        if slot.is_none() {
            *slot = Some(p);
        }
    }

    pub(crate) fn take_orphan(&self) -> Option<Payload> {
        sync::lock(&self.orphan_panic).take()
    }

    /// `queue_rcu_work`: queue `w` after a grace period.
    pub(crate) fn queue_rcu_work(self: &Arc<Self>, w: Work) {
        // ordering-audit: Relaxed: made under cgroup_mutex, which `Inner::flush` holds when it
        // reads the count.
        self.rcu_pending.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(percpu_ref_loom))]
        {
            let inner = self.clone();
            rcu::call_rcu(move || {
                let mut panics = CallbackPanics::default();
                inner.queue_work(w, &mut panics);
                // ordering-audit: Relaxed: `queue_work` handed the work over under destroy_wq's
                // mutex first; see `Inner::flush`'s load.
                inner.rcu_pending.fetch_sub(1, Ordering::Relaxed);
                // Run inside whatever pinned this thread: no caller to
                // resume it in.
                if let Some(p) = panics.take() {
                    inner.keep_orphan(p);
                }
            });
        }
        #[cfg(percpu_ref_loom)]
        sync::lock(&self.rcu_list).push(w);
    }

    /// Runs queued work; `cgroup_mutex` is held by this thread. Each item
    /// completes even if a subsystem callback in it panics (kept in
    /// `panics`), so no work is lost.
    pub(crate) fn drain_locked(self: &Arc<Self>, panics: &mut CallbackPanics) -> usize {
        let mut ran = 0;
        loop {
            let w = sync::lock(&self.destroy_wq).pop_front();
            match w {
                Some(w) => {
                    w.run(self, panics);
                    ran += 1;
                }
                None => return ran,
            }
        }
    }

    fn css_freed(&self) {
        // ordering-audit: Relaxed: a statistic; no memory is handed over through it.
        self.nr_css.fetch_sub(1, Ordering::Relaxed);
    }

    /// `rcu_barrier` plus `flush_workqueue`, for `Hierarchy::flush`: waits
    /// until every kill queued so far has completed, no destroy work is
    /// queued and no css waits for a grace period; false if that did not
    /// happen within about ten seconds.
    pub(crate) fn flush(self: &Arc<Self>, caught: &mut CallbackPanics) -> bool {
        // Every kill queued so far completes (its confirm queued the offline
        // work, a release it caused was handed on) before the queue is
        // looked at.
        crate::percpu_ref::flush();
        for attempt in 0..20_000u32 {
            let mut g = self.cgroup_lock("flush");
            self.drain_locked(&mut g.panics);
            // Checked under the mutex, so no work is running elsewhere; grace
            // period work counts as pending until it was queued.
            // ordering-audit: Relaxed: a 0 read here comes from a decrement made after its work was
            // pushed under destroy_wq's mutex, so `queue_is_empty` (which takes that mutex next)
            // sees the work: had our lock come first, this load would read a write that happens
            // after it. Increments are made under cgroup_mutex, which we hold.
            let done = self.rcu_pending.load(Ordering::Relaxed) == 0 && self.queue_is_empty();
            caught.merge(g.unlock());
            drop(g);
            if done {
                return true;
            }
            #[cfg(percpu_ref_loom)]
            {
                let due: Vec<Work> = std::mem::take(&mut *sync::lock(&self.rcu_list));
                for w in due {
                    sync::lock(&self.destroy_wq).push_back(w);
                    // ordering-audit: Relaxed: the work was handed over through destroy_wq's mutex
                    // before this decrement; see `Inner::flush`'s load.
                    self.rcu_pending.fetch_sub(1, Ordering::Relaxed);
                }
            }
            #[cfg(not(percpu_ref_loom))]
            {
                rcu::advance();
                if attempt > 100 {
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
            }
            let _ = attempt;
        }
        false
    }
}

impl Work {
    /// Runs the work; the caller holds `cgroup_mutex`. Panics of subsystem
    /// callbacks are caught into `panics` and the work completes.
    fn run(self, inner: &Arc<Inner>, panics: &mut CallbackPanics) {
        match self {
            Work::Offline(p) => css_killed_work_fn(p, panics),
            Work::Release(p) => css_release_work_fn(inner, p, panics),
            Work::Free(p) => css_free_work_fn(inner, p, panics),
        }
    }
}

// ----- rmdir: kill, confirm, offline -----------------------------------------

/// `kill_css`: called by `rmdir` under `cgroup_mutex`. Asynchronous, as the
/// kernel's: the css is dying at once (no `css_tryget_online` succeeds once
/// this returns), and the confirm, `css_killed_ref_fn`, runs on the
/// grace-period engine after the switch to atomic mode completes (at once,
/// on this thread, when the refcount is already atomic).
///
/// The extra reference keeps the css from being released before
/// `css_killed_work_fn` has offlined it; it is dropped there.
pub(crate) fn kill_css(p: CssPtr) {
    // SAFETY: called under cgroup_mutex on an online css, which holds its
    // base reference until this kill.
    let css = unsafe { p.get() };
    css.set_flags(CSS_DYING);
    // mutant css_no_kill_ref: kill without the extra reference.
    if !mutated!("css_no_kill_ref") {
        css.get_raw(1);
    }
    // A release by a kill completed in the call (an atomic refcount,
    // without the extra reference) is handed on once the call has returned.
    let _settle = SettleReleases;
    // SAFETY: a css never moves, and is freed (`Css::dealloc`, which drops
    // the `PercpuRef`; its `Drop` waits for the engine) only once released,
    // which the engine's temporary reference prevents while the kill is
    // queued.
    let killed = unsafe {
        PercpuRef::kill_raw(
            std::ptr::addr_of!((*p.as_ptr()).refcnt),
            Some(Confirm::new(move |_| css_killed_ref_fn(p))),
            "kill_css",
        )
    };
    if let Err(e) = killed {
        panic!("kill_css: css {} of {}: {e}", css.id(), css.cgroup_path());
    }
}

/// `css_killed_ref_fn`: the kill's confirm. No `css_tryget_online` can
/// succeed any more; drop this css's own count in `online_cnt` and, if no
/// child is still online, queue the offline work.
///
/// It runs on the grace-period engine, inside the `PercpuRef` call that
/// completes the kill, without `cgroup_mutex` (as the kernel's runs from
/// an RCU callback): it must not take the mutex (a thread holding it may
/// wait for the engine: `flush`, a free that waits for a pending ref), nor
/// run destroy work under the engine's borrow of the css. So it only
/// counts, and hands the queueing to the engine for after the call
/// (`PercpuRef::after_engine_completion`), when the css is still pinned by the kill's
/// extra reference. With an atomic refcount the kill completes in `rmdir`,
/// which holds `cgroup_mutex`: then it queues, and `rmdir` runs the work
/// when it unlocks.
fn css_killed_ref_fn(p: CssPtr) {
    // SAFETY: the kill holds the base and the extra reference.
    let css = unsafe { p.get() };
    // ordering-audit: Relaxed: this decrement (on the engine) races with the
    // children's offline work (under cgroup_mutex), but it orders nothing:
    // whoever reaches zero queues an offline that runs under cgroup_mutex,
    // after every child's offline section in the mutex's order (a section
    // that came after it would happen before the queueing, hence before the
    // decrement that reached zero, against the RMWs' order).
    let last = css.online_cnt.fetch_sub(1, Ordering::Relaxed) == 1;
    // mutant css_no_online_cnt: offline at once, whatever the children.
    if last || mutated!("css_no_online_cnt") {
        let hier = hier_of(css).clone();
        let queue = move || {
            let mut panics = CallbackPanics::default();
            hier.queue_work(Work::Offline(p), &mut panics);
            if let Some(payload) = panics.take() {
                hier.keep_orphan(payload);
            }
        };
        if css.refcnt.completing_on_engine() {
            css.refcnt.after_engine_completion(Box::new(queue));
        } else {
            // This thread holds cgroup_mutex (only `rmdir` and `mkdir`'s
            // undo kill), so this only queues: nothing runs inside the
            // confirm.
            queue();
        }
    }
}

/// `css_killed_work_fn`: offline the css, drop the kill's extra reference,
/// and walk up: a dying parent whose last online child this was goes
/// offline now too.
fn css_killed_work_fn(mut p: CssPtr, panics: &mut CallbackPanics) {
    loop {
        // SAFETY: under cgroup_mutex (frees wait for it); `p` is pinned by
        // the kill's extra reference, or by its child that we came from.
        let css = unsafe { p.get() };
        offline_css(css, panics);
        let parent = css.parent;
        // SAFETY: the kill's extra reference; a release it causes is only
        // queued (we hold cgroup_mutex), so `p` stays valid meanwhile.
        unsafe { css_put(p, 1) };
        if mutated!("css_no_online_cnt") {
            return;
        }
        let Some(pp) = parent else { return };
        // SAFETY: the child we just offlined pins its parent until it is
        // freed, and frees run under cgroup_mutex, which we hold.
        let parent_css = unsafe { pp.get() };
        // ordering-audit: Relaxed: races with the parent's confirm on the
        // engine, ordering nothing (see `css_killed_ref_fn`).
        if parent_css.online_cnt.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        p = pp;
    }
}

/// `offline_css`: the subsystem's `css_offline`, then unpublish from the
/// cgroup's `subsys[]`.
fn offline_css(css: &Css, panics: &mut CallbackPanics) {
    if !css.is_online() {
        return;
    }
    panics.call(|| css.subsys.css_offline(css));
    css.clear_flags(CSS_ONLINE);
    css.set_flags(CSS_OFFLINED);
    // ordering-audit: Relaxed: a null publishes nothing; readers that loaded the old pointer are
    // covered by RCU (the free waits a grace period).
    let _ = css.cgroup.subsys[css.ssid()].compare_exchange(
        css.ptr().as_ptr(),
        std::ptr::null_mut(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

// ----- puts, and handing releases on from a clean stack ----------------------

// The last css released by this thread's `PercpuRef` calls and not yet
// handed on (see the module docs): the head of a stack linked through
// `Css::released_next`. One that needs no dropping, so it is never
// destroyed: a put from a thread-local's destructor, after this thread's
// other thread-locals are gone, still records its release here.
#[cfg(not(percpu_ref_loom))]
sync::thread_local! {
    static RELEASED: Cell<Option<CssPtr>> = const { Cell::new(None) };
}
// loom's macro takes no `const` block.
#[cfg(percpu_ref_loom)]
sync::thread_local! {
    static RELEASED: Cell<Option<CssPtr>> = Cell::new(None);
}

/// `css_put_many`: puts `n` references, then hands on a release it caused.
///
/// # Safety
///
/// The caller holds `n` references on `p` and gives them up. It must not
/// hold a `&Css` of `p` across this call that is not kept alive by
/// something else (an RCU read section, another reference): the release
/// this put causes may free the css before it returns.
pub(crate) unsafe fn css_put(p: CssPtr, n: usize) {
    let _settle = SettleReleases;
    // SAFETY: the caller's references keep the css alive until the put
    // gives them up; the raw put holds no borrow of the css past that point
    // (another thread's release may free it right after).
    unsafe { PercpuRef::put_many_raw(std::ptr::addr_of!((*p.as_ptr()).refcnt), n) };
}

/// Hands on, when dropped, the releases that the `PercpuRef` calls made
/// meanwhile on this thread recorded, even if one of them panicked.
/// Panics of subsystem callbacks run meanwhile are resumed after.
struct SettleReleases;

impl Drop for SettleReleases {
    #[inline]
    fn drop(&mut self) {
        if RELEASED.with(|c| c.get().is_some()) {
            let mut panics = CallbackPanics::default();
            settle_releases(&mut panics);
            panics.resume();
        }
    }
}

/// Hands on every release recorded by this thread's `PercpuRef` calls
/// that have returned; callback panics are kept in `panics`.
#[cold]
fn settle_releases(panics: &mut CallbackPanics) {
    while let Some(p) = RELEASED.with(Cell::take) {
        // Popped before it is handed on: from then on another thread may
        // free it.
        // SAFETY: recorded by this thread and not handed on yet: alive, and
        // its link is this thread's (see `ReleaseLink`).
        let next = unsafe { p.get() }.released_next.0.take();
        RELEASED.with(|c| c.set(next));
        hand_on_release(p, panics);
    }
}

/// Hands the release of `p` to whoever runs it: the hierarchy's destroy
/// queue, or, for a root css, this thread.
fn hand_on_release(p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: the count reached zero in a `PercpuRef` call of this thread
    // that has returned, and no one else knows yet, so nothing frees the
    // css before the release is queued below.
    let hier = unsafe { p.get() }.hier.clone();
    match hier {
        // Our own handle on the hierarchy: once the work is queued, another
        // thread may free the css (and drop the css's handle) at any time.
        Some(inner) => inner.queue_work(Work::Release(p), panics),
        None => root_release(p, panics),
    }
}

/// `css_release`: the refcount's release callback. It runs inside the
/// `PercpuRef` call that put the last reference, on whichever thread made
/// it, with that call's borrows of the css live, so it only records the
/// release; the `css_put` (or `kill_css`) around the call hands it on.
pub(crate) fn css_release(p: CssPtr) {
    // SAFETY: the last put's `PercpuRef` call borrows the css: it is alive.
    let refcnt = unsafe { &(*p.as_ptr()).refcnt };
    if refcnt.completing_on_engine() {
        // The engine's put of a deferred kill was the last: no wrapper of
        // ours is around that call, so the engine hands the release on once
        // it is done with the css.
        // SAFETY: as above.
        let hier = unsafe { p.get() }.hier.clone();
        refcnt.after_engine_completion(Box::new(move || {
            let mut panics = CallbackPanics::default();
            settle_releases(&mut panics);
            if let Some(payload) = panics.take() {
                match hier {
                    Some(h) => h.keep_orphan(payload),
                    // A root css's callbacks: the engine reports it.
                    None => std::panic::resume_unwind(payload),
                }
            }
        }));
    }
    // The stack is empty unless a hand-on was skipped (none of our
    // wrappers skips one, even when a callback panics): then the earlier
    // release waits below this one, and the next settle hands both on.
    let earlier = RELEASED.with(|c| c.replace(Some(p)));
    // SAFETY: as above; the link is this thread's from now on (see
    // `ReleaseLink`).
    unsafe { p.get() }.released_next.0.set(earlier);
}

// ----- release and free ------------------------------------------------------

/// `css_release_work_fn`: mark released, unlink from the parent's children
/// and the id table, tell the subsystem, and free after a grace period.
fn css_release_work_fn(inner: &Arc<Inner>, p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: under cgroup_mutex; released but not yet queued for freeing.
    let css = unsafe { p.get() };
    css.set_flags(CSS_RELEASED);
    if let Some(parent) = css.parent() {
        sync::lock(&parent.children).retain(|&id| id != css.id());
    }
    inner.idrs[css.ssid()].unpublish(css.id());
    panics.call(|| css.subsys.css_released(css));
    inner.queue_rcu_work(Work::Free(p));
}

/// `css_free_rwork_fn`: a grace period after release nothing can reach the
/// css: tell the subsystem, free it, free its id, and put the parent.
fn css_free_work_fn(inner: &Arc<Inner>, p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: a grace period passed since the css was unpublished; only this
    // work can reach it.
    let css = unsafe { p.get() };
    let (id, ssid, parent) = (css.id(), css.ssid(), css.parent);
    panics.call(|| css.subsys.css_free(css));
    let live_children = sync::lock(&css.children).len();
    assert!(
        live_children == 0,
        "css_free: css {id} of {} still has {live_children} linked children",
        css.cgroup_path()
    );
    // SAFETY: as above; nothing touches `css` after this.
    unsafe { Css::dealloc(p) };
    inner.idrs[ssid].remove(id);
    inner.css_freed();
    if let Some(pp) = parent {
        // SAFETY: the css's pin on its parent, given up here.
        unsafe { css_put(pp, 1) };
    }
}

fn hier_of(css: &Css) -> &Arc<Inner> {
    match &css.hier {
        Some(h) => h,
        None => panic!(
            "css {} of {}: the root css is never killed or released",
            css.id(),
            css.cgroup_path()
        ),
    }
}

// ----- the root css ----------------------------------------------------------

/// Takes a root css down when its hierarchy goes (`Inner::drop`): unpublish
/// it from the root cgroup (later [`Cgroup::css`] calls find nothing),
/// offline it, and drop the hierarchy's base reference. It is released
/// and freed when the last reference on it is put: now, or when the last
/// task, page or [`CssRef`] on it goes.
///
/// No grace period is needed before the free: once the hierarchy is gone
/// the id table is gone too (and [`Hierarchy::css_from_id`]'s result is
/// bound to a hierarchy handle), and the root cgroup's slot, the only
/// other way to the css without a reference, is cleared under the lock
/// that [`Cgroup::css`] holds from its load to its `tryget_online`.
///
/// [`Hierarchy::css_from_id`]: super::Hierarchy::css_from_id
fn kill_root_css(p: CssPtr, panics: &mut CallbackPanics) {
    // SAFETY: the hierarchy holds the root's base reference until the kill
    // below; this `&Css` is not used after it.
    let css = unsafe { p.get() };
    css.cgroup.clear_root_slot(css.ssid());
    css.set_flags(CSS_DYING);
    offline_css(css, panics);
    // Hands on a release by the kill even if the kill panics; on success
    // the release is handed on below, with its panics kept.
    let settle = SettleReleases;
    if let Err(e) = css.refcnt.kill_sync() {
        panic!("root css {} of {}: {e}", css.id(), css.cgroup_path());
    }
    std::mem::forget(settle);
    settle_releases(panics);
}

/// The release of a root css, on the thread that put its last reference
/// (its hierarchy is gone, so there is no destroy queue and no
/// `cgroup_mutex`): `css_released`, then at once `css_free` and the
/// memory (see [`kill_root_css`] for why no grace period is needed).
fn root_release(p: CssPtr, panics: &mut CallbackPanics) {
    {
        // SAFETY: released, and only this thread knows: nothing else can
        // reach it (see `kill_root_css`).
        let css = unsafe { p.get() };
        css.set_flags(CSS_RELEASED);
        panics.call(|| css.subsys.css_released(css));
        panics.call(|| css.subsys.css_free(css));
    }
    // SAFETY: as above; nothing touches it after this.
    unsafe { Css::dealloc(p) };
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every non-root css holds the hierarchy, so only the roots are left
        // (and no `Hierarchy` handle, so no lookup by id). Take each down:
        // offline it and drop the hierarchy's base reference. It is
        // released when the last task, page or `CssRef` on it goes (maybe
        // now), and freed a grace period later.
        // ordering-audit: Relaxed: a status flag; the last handle is gone, so nobody reads it
        // concurrently.
        self.root.online.store(false, Ordering::Relaxed);
        let mut panics = CallbackPanics::default();
        for &p in &self.root_css {
            kill_root_css(p, &mut panics);
        }
        panics.resume();
    }
}
