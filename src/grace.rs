//! The grace-period engine: one grace period for many switches, as the
//! kernel's RCU does for `percpu_ref_kill`.
//!
//! ```text
//! A switch to atomic mode sets ATOMIC, then must wait until no percpu add
//! that read the old mode is still in flight: a grace period. On the rseq
//! backend that is a membarrier, an interrupt to every CPU running one of
//! our threads. One grace period serves every switch whose ATOMIC store
//! came before it started, so switches share them:
//!
//!   kill(A)  kill(B)  kill(C) ...   (ATOMIC set, queued)
//!          \_______________|_______________/
//!                          v
//!            [ grace period n: membarrier ]   started = n ... completed = n
//!                          v
//!   for each ref of the batch: sum, fold, confirm, put base, put temp
//!
//! Grace periods are numbered. `started` and `completed` only grow, and a
//! grace period runs with the gp mutex held:
//!
//!   run:      s = started + 1; started = s; <backend grace period>; completed = s
//!   cookie:   started + 1, read *after* the switch set ATOMIC
//!   wait(c):  done once completed >= c
//! ```
//!
//! # Invariants
//!
//! 1. **A switch is completed only by a grace period that started after its
//!    `ATOMIC` store.** Its cookie is `started + 1` read by a release RMW
//!    after the store; grace period `c` begins with an acquire RMW that
//!    moves `started` from `c - 1` to `c`, so it reads from (a release
//!    sequence headed by) the cookie's RMW: the store happens before the
//!    grace period, which therefore sees it (on the machine, `membarrier`
//!    orders it as well). `completed >= c` means a grace period numbered
//!    at least `c` has run entirely (as `get_state_synchronize_rcu` /
//!    `poll_state_synchronize_rcu`). The cookie is `started + 1`, never
//!    `started`: a grace period already in flight may have passed a CPU
//!    before the store.
//! 2. **Synchronous callers share grace periods** ([`synchronize`]): a
//!    waiter returns at once if `completed` reached its cookie, else takes
//!    the gp mutex, checks again (someone else's grace period may have
//!    covered it while it waited), gathers for a few microseconds if it
//!    had to wait (so that the threads whose grace period just ended can
//!    join this one with their next switch) and only then runs one. A
//!    switcher that finds no grace period running runs its own at once,
//!    without a cookie (its store precedes it in program order).
//! 3. **Deferred entries** ([`enqueue`]) go on a queue. An entry is what
//!    the kernel's `rcu_head` is: an object's address and the function that
//!    completes it (plus a callback the function is handed, and whether it
//!    needs a grace period); the engine knows nothing else of the object.
//!    It takes the whole queue as one batch, then takes the batch's cookie
//!    (after the take, so after every switch of the batch was queued),
//!    waits for it, and calls each entry's function in queue order (for a
//!    ref, the protocol's `complete_deferred`: sum, fold, `confirm`, put
//!    the base reference of a kill and the temporary one, so release never
//!    precedes confirm). Batches are completed one at a time. A managed
//!    ref's scan steps, queued once per engine round for every marked ref,
//!    are [`Link`]s kept in the ref itself ([`enqueue_link`]): queuing one
//!    allocates nothing, and they are completed after the batch's other
//!    entries, the last queued first (a ref has at most one entry queued,
//!    so no order between refs is promised).
//! 4. **The object outlives its completion, and waiters never read it.**
//!    Whoever would free an object with a queued entry waits first
//!    ([`wait_until`]) until the completion's last access (for a ref, the
//!    release store that clears its pending bit; its `Drop` waits for
//!    it). Waiters are woken through the engine's own mutex and condition
//!    variable, never through memory in the object. If the completion
//!    itself frees the object (a ref's `release` dropping the ref), it
//!    sees that this thread is completing it ([`completing`]), records it
//!    ([`mark_freed`]) and touches nothing of it afterwards ([`freed`]).
//! 5. **`flush` is `rcu_barrier`**: every entry gets a ticket (the number of
//!    entries queued before it, plus one); `finished` counts entries whose
//!    completion has fully ended, and grows by a whole batch at once after
//!    its last ref, so `finished >= ticket` means every earlier confirm and
//!    temporary put has run.
//!
//! The engine thread that takes the queue (`engine.rs`) and the handlers
//! that carry the engine across `fork` (`fork.rs`) have their own modules,
//! each with its story.
//!
//! # Under loom
//!
//! There is no background thread: a model drives the engine with
//! `percpu_ref::loom_support::step()` from a loom thread, and `flush`
//! runs steps itself. The engine's state is a `loom::lazy_static`, fresh
//! for every execution.

use crate::sync::unmodeled;
use crate::sync::{self, AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::time::Duration;

#[cfg(not(percpu_ref_loom))]
mod engine;
#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
mod fork;

#[cfg(miri)]
use engine::join_idle_engine;
#[cfg(not(percpu_ref_loom))]
use engine::{complete_refused, start_engine};
#[cfg(all(unix, not(miri), not(percpu_ref_loom)))]
pub(crate) use fork::{child_after_fork, parent_after_fork, prepare_fork};

/// The default of [`batch_delay`]: the most a woken engine waits for more
/// switches before running the batch's grace period. Bounds a steady
/// stream's membarrier rate to about 1000 per second, and a lone kill's
/// latency to about a millisecond.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(1);
/// The longest [`set_batch_delay`] accepts.
pub const MAX_BATCH_DELAY: Duration = Duration::from_secs(1);

/// [`batch_delay`] in nanoseconds. A process-wide setting read once per
/// batch, not part of the protocol: not modeled.
static BATCH_DELAY_NS: unmodeled::AtomicU64 = unmodeled::AtomicU64::new(1_000_000);
const _: () = assert!(DEFAULT_BATCH_DELAY.as_nanos() == 1_000_000);

/// How long the grace-period engine, once woken, gathers more work before
/// it runs one grace period for all of it ([`DEFAULT_BATCH_DELAY`], 1 ms,
/// until [`set_batch_delay`]).
///
/// # Examples
///
/// ```
/// assert!(percpu_ref::batch_delay() <= percpu_ref::MAX_BATCH_DELAY);
/// ```
#[must_use]
pub fn batch_delay() -> Duration {
    Duration::from_nanos(BATCH_DELAY_NS.load(unmodeled::Ordering::Relaxed))
}

/// Sets [`batch_delay`] for the whole process, from the engine's next
/// batch on: the latency of the deferred operations against the rate of
/// grace periods. A deferred kill (`kill`, an `Owner`'s drop) completes
/// about one delay (plus a grace period) after it is made; a promoted
/// [`Shared`](crate::shared::Shared) is dropped about three rounds of the
/// engine (each a delay and a grace period) after its last handle, since
/// a managed ref's scan takes three (docs/design.md, "Managed refs").
/// Shorter means sooner, and more grace periods (`membarrier` calls, each
/// an interrupt on every CPU running the process) while work keeps
/// coming: with zero, a process with a hot promoted value runs grace
/// periods back to back. Longer means fewer, and memory held longer.
///
/// # Panics
///
/// When `delay` is longer than [`MAX_BATCH_DELAY`] (1 s), naming it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// // Release promoted values sooner, at the price of more grace periods.
/// percpu_ref::set_batch_delay(Duration::from_micros(250));
/// assert_eq!(percpu_ref::batch_delay(), Duration::from_micros(250));
/// percpu_ref::set_batch_delay(percpu_ref::DEFAULT_BATCH_DELAY);
/// ```
pub fn set_batch_delay(delay: Duration) {
    assert!(
        delay <= MAX_BATCH_DELAY,
        "percpu_ref::set_batch_delay: {delay:?} is longer than the most accepted, {MAX_BATCH_DELAY:?}"
    );
    // At most 1 s: fits.
    let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
    BATCH_DELAY_NS.store(ns, unmodeled::Ordering::Relaxed);
}
/// A batch this large runs its grace period without waiting any longer: a
/// burst costs one membarrier per 4096 switches (the design asks for at
/// most one per 1000), and a batch's completion stays a few milliseconds of work.
#[cfg(not(percpu_ref_loom))]
pub(crate) const BATCH_FULL: usize = 4096;

/// A closure that an entry carries for its completion function (for a
/// ref, its `confirm`), called with the entry's object. The engine only
/// moves it; what the pointer is, the entry's creator knows.
pub(crate) struct Callback(Box<dyn FnOnce(*const ()) + Send>);

impl Callback {
    pub(crate) fn new(f: impl FnOnce(*const ()) + Send + 'static) -> Self {
        Callback(Box::new(f))
    }

    /// # Safety
    ///
    /// `obj` is the object of the entry this callback was queued with, as
    /// its completion function got it: the closure may rely on that.
    pub(crate) unsafe fn call(self, obj: *const ()) {
        (self.0)(obj);
    }
}

/// Completes one entry: the object's address and the entry's callback.
///
/// # Safety
///
/// Called once per entry, on the engine, after the entry's grace period.
pub(crate) type Complete = unsafe fn(*const (), Option<Callback>);

/// An object's address, sent to the engine.
struct ObjPtr(*const ());

// SAFETY: an entry's creator promises (`Entry::new`) that its object may be
// completed on another thread and stays alive until then.
unsafe impl Send for ObjPtr {}

/// One queued deferred completion: the engine's `rcu_head`.
pub(crate) struct Entry {
    obj: ObjPtr,
    complete: Complete,
    callback: Option<Callback>,
    /// The completion needs a grace period first (the rseq backend's refs);
    /// otherwise the entry only keeps its place in the queue.
    needs_gp: bool,
}

impl Entry {
    /// # Safety
    ///
    /// `complete(obj, callback)` may run on any thread once the entry's
    /// grace period passed, and `obj` stays valid for it until it returns:
    /// whoever would free the object first waits for the engine (for a
    /// ref, its `Drop` waits for the pending bit that `complete` clears
    /// last; invariant 4).
    pub(crate) unsafe fn new(
        obj: *const (),
        complete: Complete,
        callback: Option<Callback>,
        needs_gp: bool,
    ) -> Self {
        Entry {
            obj: ObjPtr(obj),
            complete,
            callback,
            needs_gp,
        }
    }
}

/// An entry that lives in its object, for objects that are queued often
/// and at most once at a time (a managed ref's scan steps, one per engine
/// round of every marked ref): queuing it allocates nothing, so a put that
/// marks a ref never grows a buffer under the queue's lock, and the queue
/// holds no memory of its own for them. Three words, in the ref's count
/// line (its spare bytes).
///
/// Its fields are written by [`enqueue_link`] under the queue lock, and
/// read by whoever takes the batch (under the same lock) and completes it;
/// the object's creator guarantees it is not queued again before its
/// completion began (for a ref: the pending bit, invariant 4).
pub(crate) struct Link(std::cell::UnsafeCell<MaybeUninit<LinkFields>>);

/// What a queued [`Link`] holds; unwritten before its first queuing (a ref
/// that is never managed pays no store for it).
#[derive(Clone, Copy)]
struct LinkFields {
    /// The link queued before this one (null for the first).
    next: *const Link,
    /// The object's address, with [`LINK_NEEDS_GP`] in its low bit.
    obj: usize,
    complete: Complete,
}

/// Set in a [`Link`]'s `obj`: its completion needs a grace period first.
const LINK_NEEDS_GP: usize = 1;

impl Link {
    /// A link never queued (its fields unwritten).
    pub(crate) const fn new() -> Self {
        Link(std::cell::UnsafeCell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    ///
    /// Under the queue lock, with the link not queued (`enqueue_link`).
    unsafe fn write(&self, fields: LinkFields) {
        // SAFETY: the caller's; nobody reads the link meanwhile.
        unsafe { (*self.0.get()).write(fields) };
    }

    /// # Safety
    ///
    /// The link was queued and taken in a batch by this thread, and its
    /// completion has not begun (`complete_links`).
    unsafe fn read(&self) -> LinkFields {
        // SAFETY: written by `enqueue_link` before it was queued (the
        // queue lock orders that write before the take); nobody writes it
        // again before its completion begins.
        unsafe { (*self.0.get()).assume_init() }
    }
}

// SAFETY: a link is written only under the queue lock (by `enqueue_link`)
// and read by the one thread that took it from the queue under that lock;
// it is not queued again before that read (`enqueue_link`'s contract), so
// no two threads access it at once.
unsafe impl Sync for Link {}
// SAFETY: as for `Sync`; the pointers are addresses, owned by nobody.
unsafe impl Send for Link {}

/// The links queued, the last queued first: a stack, so that queuing one
/// writes only that link and the queue (a list in queue order would write
/// the previous link too: a line of another ref, most likely in another
/// CPU's cache, under the queue lock; that doubled the storm's time in
/// `shared_costs`' hot-value row). The order of a batch's links is no
/// part of the protocol: a ref has at most one queued, and the batch is
/// finished (`flush`) only once all are completed.
struct Links {
    head: *const Link,
    len: usize,
    /// One of them needs a grace period.
    needs_gp: bool,
}

impl Links {
    const EMPTY: Links = Links {
        head: std::ptr::null(),
        len: 0,
        needs_gp: false,
    };
}

// SAFETY: the list only names links, which are `Send` and `Sync`; it is
// moved with the queue or a batch, whose owner alone walks it.
unsafe impl Send for Links {}

struct Queue {
    entries: Vec<Entry>,
    /// The queued [`Link`]s (completed after `entries` in their batch,
    /// the last queued first).
    links: Links,
    /// Entries ever queued: the next entry's ticket is `queued + 1`.
    queued: u64,
    /// The engine thread exists (never under loom).
    #[cfg_attr(
        percpu_ref_loom,
        allow(dead_code, reason = "no engine thread under loom")
    )]
    running: bool,
    /// The engine waits for work: the next enqueue must wake it.
    #[cfg_attr(
        percpu_ref_loom,
        allow(dead_code, reason = "no engine thread under loom")
    )]
    sleeping: bool,
    /// A flush waits: run the next batch without gathering.
    urgent: bool,
    /// Under Miri, the engine thread, joined once it ended.
    #[cfg(miri)]
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Queue {
    /// Nothing is queued.
    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.links.len == 0
    }

    /// Entries and links queued.
    #[cfg_attr(
        percpu_ref_loom,
        allow(dead_code, reason = "only the engine thread asks (none under loom)")
    )]
    fn len(&self) -> usize {
        self.entries.len() + self.links.len
    }
}

struct Done {
    /// Entries whose completion has fully ended (a prefix of the queue).
    finished: u64,
    /// A batch was taken and is not finished yet.
    in_flight: bool,
}

/// A field on cache lines of its own (two: the adjacent-line prefetcher
/// pulls pairs), so that the threads that queue (the queue's lock) and those
/// that wait for batches (the completion count's lock) do not slow each
/// other or the engine's own counters down by sharing a line.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Engine {
    started: AtomicU64,
    completed: AtomicU64,
    /// Cookies taken while `gathering` (its hint that a switch arrived).
    cookies: AtomicU64,
    /// A contended grace period waits for more switches (`gather`).
    gathering: AtomicBool,
    /// Held while a grace period runs: they run one at a time, in order.
    gp: Mutex<()>,
    queue: Padded<Mutex<Queue>>,
    /// Wakes the engine thread.
    #[cfg_attr(
        percpu_ref_loom,
        allow(dead_code, reason = "no engine thread under loom")
    )]
    work: Condvar,
    done: Padded<Mutex<Done>>,
    /// Signalled when a batch finished: [`flush`] and [`wait_until`].
    done_cv: Condvar,
    /// Under loom, one step at a time (the engine thread's role).
    #[cfg(percpu_ref_loom)]
    step: Mutex<()>,
}

macro_rules! new_engine {
    () => {
        Engine {
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            cookies: AtomicU64::new(0),
            gathering: AtomicBool::new(false),
            gp: Mutex::new(()),
            queue: Padded(Mutex::new(Queue {
                entries: Vec::new(),
                links: Links::EMPTY,
                queued: 0,
                running: false,
                sleeping: false,
                urgent: false,
                #[cfg(miri)]
                handle: None,
            })),
            work: Condvar::new(),
            done: Padded(Mutex::new(Done {
                finished: 0,
                in_flight: false,
            })),
            done_cv: Condvar::new(),
            #[cfg(percpu_ref_loom)]
            step: Mutex::new(()),
        }
    };
}

#[cfg(not(percpu_ref_loom))]
fn engine() -> &'static Engine {
    static ENGINE: Engine = new_engine!();
    &ENGINE
}

#[cfg(percpu_ref_loom)]
fn engine() -> &'static Engine {
    loom::lazy_static! {
        static ref ENGINE: Engine = new_engine!();
    }
    &ENGINE
}

/// This thread's engine state (loom's `thread_local!` takes no `const`).
///
/// None of these needs dropping, so none is ever destroyed: a handle
/// dropped inside a thread-local's destructor, after this thread's other
/// thread-locals are gone, still reaches them (`with` panics only on a
/// destroyed one, and a panic there aborts the process). Keep it so: what
/// owns memory lives on a caller's stack ([`complete`]'s list, a batch
/// `start_engine` returns), not here.
macro_rules! engine_thread_locals {
    ($($init:tt)*) => {
        sync::thread_local! {
            /// This thread completes entries (the engine thread, a loom
            /// step, or a thread standing in for a refused engine thread).
            static ON_ENGINE: Cell<bool> = $($init)* { Cell::new(false) };
            /// The object whose entry this thread is completing (as an
            /// address), 0 when none.
            static COMPLETING: Cell<usize> = $($init)* { Cell::new(0) };
            /// That object was freed during its own completion.
            static FREED: Cell<bool> = $($init)* { Cell::new(false) };
            /// Where its completion leaves work for after the engine's last
            /// access to the object ([`after_completion`]): a list on
            /// [`complete`]'s stack, null when none.
            static AFTER: Cell<*mut Vec<After>> =
                $($init)* { Cell::new(std::ptr::null_mut()) };
        }
    };
}
#[cfg(not(percpu_ref_loom))]
engine_thread_locals!(const);
#[cfg(percpu_ref_loom)]
engine_thread_locals!();

// ----- grace periods ---------------------------------------------------------

/// The number of the first grace period that starts after this call: a
/// switch that set `ATOMIC` before calling this is complete once
/// `completed` reaches it (invariant 1).
pub(crate) fn cookie() -> u64 {
    // ordering-audit: Release, not AcqRel: publishes the caller's ATOMIC
    // store to the grace period that starts after it (whose RMW acquires);
    // the caller needs nothing from earlier grace periods (its sum acquires
    // `completed`).
    let e = engine();
    let started = e.started.fetch_add(0, Ordering::Release);
    // After the RMW above: a grace period that sees this count go up may
    // start, this cookie is `started + 1` for it (`gather`). Only while one
    // gathers: a lone switcher pays a load, not a second RMW.
    // ordering-audit: Relaxed: hints for `gather`, ordering nothing.
    if e.gathering.load(Ordering::Relaxed) {
        // ordering-audit: Relaxed: as above.
        e.cookies.fetch_add(1, Ordering::Relaxed);
    }
    // mutant engine_late_join: a grace period already in flight (or done)
    // counts for a switch that set ATOMIC after it started.
    if mutated!("engine_late_join") {
        return started;
    }
    started + 1
}

/// Returns once a grace period numbered at least `cookie` has completed,
/// running one if none did (invariant 2).
///
/// # Errors
///
/// The kernel refused the grace period; nothing was waited for.
pub(crate) fn synchronize(cookie: u64) -> std::io::Result<()> {
    let e = engine();
    // mutant engine_no_sharing: every waiter runs a grace period of its own.
    let shared = !mutated!("engine_no_sharing");
    if shared && e.completed.load(Ordering::Acquire) >= cookie {
        return Ok(());
    }
    // mutant engine_wait_in_flight: a grace period that started (but may not
    // have passed every CPU yet) counts as done.
    #[cfg(percpu_ref_mutant = "engine_wait_in_flight")]
    // ordering-audit: mutant only (not built otherwise).
    if e.started.load(Ordering::Acquire) >= cookie {
        return Ok(());
    }
    let (_gp, contended) = match sync::try_lock(&e.gp) {
        Some(gp) => (gp, false),
        None => (sync::lock(&e.gp), true),
    };
    // ordering-audit: Relaxed: read under the gp mutex, whose lock acquires
    // what the last runner did before its unlock, its `completed` store
    // included (the ordering audit found the acquire redundant here).
    if shared && e.completed.load(Ordering::Relaxed) >= cookie {
        return Ok(());
    }
    #[cfg(not(percpu_ref_loom))]
    if contended {
        gather(e);
    }
    #[cfg(percpu_ref_loom)]
    let _ = contended;
    run_grace_period_locked(e)
}

/// Runs one grace period; the caller holds the gp mutex.
fn run_grace_period_locked(e: &Engine) -> std::io::Result<()> {
    // Acquire: every switch whose cookie RMW came before this one set ATOMIC
    // before this grace period.
    let s = e.started.fetch_add(1, Ordering::Acquire) + 1;
    // On failure `completed` stays behind `started`: the next grace period
    // takes a higher number, which is still after every cookie taken.
    crate::percpu::grace_period()?;
    // Release: a waiter that sees `s` sees what the grace period ordered.
    e.completed.store(s, Ordering::Release);
    Ok(())
}

/// Before a grace period that had to wait for another one: gives the
/// switches that the previous grace period just completed a moment
/// ([`GATHER`]) to come back with their next switch and take a cookie that
/// this grace period covers, instead of each waiting for one of its own.
/// Without it, two threads killing in a loop alternate perfectly (each
/// arrives while the other's grace period runs, and needs the next one),
/// and no grace period is ever shared. Never taken by a lone switcher.
#[cfg(not(percpu_ref_loom))]
fn gather(e: &Engine) {
    // ordering-audit: Relaxed: only hints; a switch that misses the flag
    // just makes this wait the whole time. The cookie's own RMW on
    // `started` is what orders its switch before this grace period.
    e.gathering.store(true, Ordering::Relaxed);
    let seen = e.cookies.load(Ordering::Relaxed);
    let start = std::time::Instant::now();
    // ordering-audit: Relaxed: as above.
    while e.cookies.load(Ordering::Relaxed) == seen && start.elapsed() < GATHER {
        std::hint::spin_loop();
    }
    // ordering-audit: Relaxed: as above.
    e.gathering.store(false, Ordering::Relaxed);
}

/// How long a contended grace period waits for more switches to join it:
/// a few times a switch's own work between two grace periods (the sum,
/// fold, puts and the next switch's first steps, about 1-2 us), and about
/// what the membarrier it may save costs when another CPU runs one of our
/// threads (4-9 us).
#[cfg(not(percpu_ref_loom))]
const GATHER: std::time::Duration = std::time::Duration::from_micros(5);

/// A synchronous switch's grace period: it set `ATOMIC` before calling.
///
/// When nobody runs a grace period, the caller runs its own at once: it
/// starts after the caller's store (program order), so no cookie is
/// needed, and a lone switcher pays three atomic RMWs over the
/// `membarrier` (the gp mutex's lock and unlock, `started`). Otherwise it
/// takes a cookie and waits, maybe sharing another's grace period.
pub(crate) fn synchronize_after_store() -> std::io::Result<()> {
    let e = engine();
    if let Some(_gp) = sync::try_lock(&e.gp) {
        return run_grace_period_locked(e);
    }
    synchronize(cookie())
}

// ----- the queue ---------------------------------------------------------------

/// Queues an entry, to be completed after a grace period that starts
/// after this call (for a ref: after its `ATOMIC` store). Wakes the engine
/// if it sleeps (starts it at first use); no system call otherwise.
pub(crate) fn enqueue(entry: Entry) {
    let mut q = sync::lock(&engine().queue);
    q.entries.push(entry);
    queued_one(q);
}

/// Queues `link` for its object at `obj`, as [`enqueue`] an entry with no
/// callback, and with no allocation.
///
/// # Safety
///
/// As [`Entry::new`]'s for `obj` and `complete`; `obj` is even (aligned);
/// `link` stays at its address and is not queued again until its
/// completion has begun (the engine reads its fields before it calls
/// `complete`, which may queue it again).
pub(crate) unsafe fn enqueue_link(link: &Link, obj: *const (), complete: Complete, needs_gp: bool) {
    assert!(
        obj as usize & LINK_NEEDS_GP == 0,
        "grace::enqueue_link: the object's address {obj:p} is odd"
    );
    let mut q = sync::lock(&engine().queue);
    let l = &mut q.links;
    // SAFETY: under the queue lock, and not queued (the caller's contract).
    unsafe {
        link.write(LinkFields {
            next: l.head,
            obj: obj as usize | if needs_gp { LINK_NEEDS_GP } else { 0 },
            complete,
        });
    }
    l.head = link;
    l.len += 1;
    l.needs_gp |= needs_gp;
    queued_one(q);
}

/// Counts the entry or link just queued and wakes the engine if it sleeps
/// (or starts it), with the queue lock `q` held until then.
fn queued_one(mut q: sync::MutexGuard<'_, Queue>) {
    q.queued += 1;
    #[cfg(not(percpu_ref_loom))]
    {
        let e = engine();
        let refused = if q.running {
            if q.sleeping || q.len() == BATCH_FULL {
                q.sleeping = false;
                e.work.notify_one();
            }
            None
        } else {
            start_engine(&mut q)
        };
        drop(q);
        complete_refused(refused);
    }
}

/// Takes the whole queue as a batch, with its cookie (taken after the
/// take, so after every switch of the batch was queued).
fn take_batch(q: &mut Queue) -> Batch {
    let entries = std::mem::take(&mut q.entries);
    let links = std::mem::replace(&mut q.links, Links::EMPTY);
    let cookie = cookie();
    sync::lock(&engine().done).in_flight = true;
    Batch {
        entries,
        links,
        cookie,
    }
}

struct Batch {
    entries: Vec<Entry>,
    links: Links,
    cookie: u64,
}

impl Batch {
    fn len(&self) -> usize {
        self.entries.len() + self.links.len
    }
}

/// Runs the batch's grace period (if one of its entries needs it), then
/// completes each entry in queue order and then each link (the last queued
/// first), then marks the batch finished.
fn complete_batch(batch: Batch) {
    let n = batch.len() as u64;
    let needs_gp = batch.links.needs_gp || batch.entries.iter().any(|e| e.needs_gp);
    // mutant engine_flush_early: count the batch as finished when it is
    // taken, before its confirms ran.
    let finished_early = mutated!("engine_flush_early");
    if finished_early {
        finish(n);
    }
    // mutant engine_complete_before_gp: complete the batch, then run its
    // grace period.
    let gp_first = !mutated!("engine_complete_before_gp");
    if needs_gp && gp_first {
        run_grace_period(batch.cookie, batch.len());
    }
    for entry in batch.entries {
        complete(entry);
    }
    complete_links(batch.links.head);
    if needs_gp && !gp_first {
        run_grace_period(batch.cookie, 0);
    }
    finish(if finished_early { 0 } else { n });
}

/// Waits for grace period `cookie`; a refusal by the kernel is reported
/// and retried (a deferred switch cannot be undone).
fn run_grace_period(cookie: u64, waiting: usize) {
    let mut reported = false;
    while let Err(err) = synchronize(cookie) {
        if !reported {
            eprintln!(
                "percpu_ref: grace-period engine: the kernel refused the grace period \
                 (membarrier PRIVATE_EXPEDITED_RSEQ: {err}); {waiting} deferred switches wait, \
                 retrying every 10 ms"
            );
            reported = true;
        }
        #[cfg(not(percpu_ref_loom))]
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Completes one entry with its own function.
///
/// Nests: a callback on a thread whose engine thread was refused may queue
/// another entry, which that thread then completes inside this one (see
/// [`complete_refused`]); the outer completion's state is restored after.
fn complete(entry: Entry) {
    let mut after: Vec<After> = Vec::new();
    let obj = entry.obj.0;
    let outer = (
        COMPLETING.with(|c| c.replace(obj as usize)),
        FREED.with(|d| d.replace(false)),
        AFTER.with(|a| a.replace(&raw mut after)),
    );
    // SAFETY: once, after the entry's grace period (`complete_batch`), with
    // the object alive (`Entry::new`).
    unsafe { (entry.complete)(obj, entry.callback) };
    COMPLETING.with(|c| c.set(outer.0));
    FREED.with(|d| d.set(outer.1));
    AFTER.with(|a| a.set(outer.2));
    run_after_completion(after);
}

/// Completes the links of a batch from `head` (the last queued) on, each
/// as an entry.
fn complete_links(head: *const Link) {
    // mutant engine_link_next_after_complete: read a link's next after its
    // completion, which may have queued it again: it then leads into the
    // new queue, so the rest of the batch is lost (its refs stay pending,
    // never scanned again) and links queued since are completed early.
    let late = mutated!("engine_link_next_after_complete");
    let mut at = head;
    while !at.is_null() {
        let this = at;
        // SAFETY: a queued link stays alive until its completion begins
        // (`enqueue_link`'s contract); it is read whole before that, since
        // the completion may queue it again.
        let entry = unsafe {
            let f = (*at).read();
            if !late {
                at = f.next;
            }
            Entry::new(
                (f.obj & !LINK_NEEDS_GP) as *const (),
                f.complete,
                None,
                f.obj & LINK_NEEDS_GP != 0,
            )
        };
        complete(entry);
        if late {
            // SAFETY: none (the mutant's bug); the models' refs outlive it.
            at = unsafe { (*this).read().next };
        }
    }
}

/// Work that a completion hands to the engine for after its last access
/// to the object (see [`after_completion`]).
pub(crate) type After = Box<dyn FnOnce()>;

/// Runs `f` on this thread once the completion it is running has returned
/// (for a ref: after the store that clears its pending bit, the last
/// access), before the next entry of the batch. For code, run inside a
/// completion, that must free the memory holding the object: freeing it
/// there would pull it from under the completion's borrow, and no other
/// thread may know it is free to go.
///
/// # Panics
///
/// When this thread is not completing an entry.
pub(crate) fn after_completion(f: After) {
    let after = AFTER.with(Cell::get);
    assert!(
        !after.is_null(),
        "grace::after_completion outside the completion of a deferred entry"
    );
    // SAFETY: a non-null `AFTER` is the list of the innermost [`complete`]
    // running on this thread, which lives on its stack until the entry's
    // completion returned and `AFTER` was restored; only this
    // thread reaches it, and nothing else borrows it meanwhile (`complete`
    // moves it only after the restore).
    unsafe { (*after).push(f) };
}

/// Runs the work [`after_completion`] queued for the entry just completed;
/// a panic is reported and the rest runs.
fn run_after_completion(work: Vec<After>) {
    for f in work {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            eprintln!(
                "percpu_ref: grace-period engine: work a deferred confirm or release left for \
                 after its completion panicked"
            );
        }
    }
}

/// Counts `n` more entries finished and wakes everyone waiting on the
/// engine ([`flush`], [`wait_until`]).
fn finish(n: u64) {
    let e = engine();
    let mut d = sync::lock(&e.done);
    d.finished += n;
    d.in_flight = false;
    e.done_cv.notify_all();
}

// ----- entries being completed ----------------------------------------------------

/// Whether this thread is completing the entry of the object at `obj`
/// right now (its completion function is running).
pub(crate) fn completing(obj: *const ()) -> bool {
    COMPLETING.with(|c| c.get() == obj as usize)
}

/// Whether this thread is the engine (completing entries: the engine
/// thread, a loom step, or a thread standing in for a refused one).
pub(crate) fn on_engine() -> bool {
    ON_ENGINE.with(Cell::get)
}

/// Records that the object this thread is completing was freed during its
/// own completion (for a ref: dropped by its release).
pub(crate) fn mark_freed() {
    FREED.with(|d| d.set(true));
}

/// Whether the object being completed on this thread was freed
/// ([`mark_freed`]): its completion must touch nothing of it any more.
pub(crate) fn freed() -> bool {
    FREED.with(Cell::get)
}

/// Waits until `pending()` is false, re-checking whenever a batch finishes
/// (a completion's last access to its object comes before the end of its
/// batch is signalled). Hurries the engine first: someone waits, so the
/// queue is taken without the gathering delay (and the engine is started
/// if it is not running, as in a child after `fork`).
pub(crate) fn wait_until(mut pending: impl FnMut() -> bool) {
    wait_done(|_| pending());
}

/// [`wait_until`] with the completion count at hand (under its lock).
fn wait_done(mut pending: impl FnMut(&Done) -> bool) {
    hurry();
    let e = engine();
    let mut d = sync::lock(&e.done);
    while pending(&d) {
        #[cfg(percpu_ref_loom)]
        {
            // No engine thread: drive one step (if another loom thread is
            // running one, `step` waits for it). Nothing queued yet (a
            // managed ref's mark is between its PENDING and its enqueue):
            // let the other threads run.
            drop(d);
            if !loom_step() {
                sync::spin_wait();
            }
            d = sync::lock(&e.done);
        }
        #[cfg(not(percpu_ref_loom))]
        {
            d = sync::wait(&e.done_cv, d);
        }
    }
    #[cfg(miri)]
    {
        drop(d);
        join_idle_engine(e);
    }
}

/// Under loom: the grace periods started so far.
#[cfg(percpu_ref_loom)]
pub(crate) fn started() -> u64 {
    // ordering-audit: kept: a model's check after joining its threads
    // (which orders everything already); not part of the protocol.
    engine().started.load(Ordering::SeqCst)
}

/// Under loom: one engine step on the calling thread (see
/// `crate::loom_support::step`).
#[cfg(percpu_ref_loom)]
pub(crate) fn loom_step() -> bool {
    let e = engine();
    let _step = sync::lock(&e.step);
    let batch = {
        let mut q = sync::lock(&e.queue);
        if q.is_empty() {
            return false;
        }
        take_batch(&mut q)
    };
    complete_standing_in(batch);
    true
}

/// Completes `batch` on this thread, which stands in for the engine thread
/// meanwhile: its callbacks see [`on_engine`] (a loom step, or a thread
/// whose engine thread was refused).
fn complete_standing_in(batch: Batch) {
    let was = ON_ENGINE.with(|o| o.replace(true));
    complete_batch(batch);
    ON_ENGINE.with(|o| o.set(was));
}

// ----- flush ---------------------------------------------------------------------

/// Waits until every entry queued before the call (on any thread) has been
/// completed, and the work its completion left ([`after_completion`]) has
/// run: the kernel's `rcu_barrier`. Cuts the gathering short.
///
/// # Panics
///
/// On the engine (from inside a completion): it would wait for itself.
pub(crate) fn flush() {
    assert!(
        !on_engine(),
        "percpu_ref::flush called from a deferred confirm or release: the grace-period engine \
         would wait for itself"
    );
    let e = engine();
    let ticket = sync::lock(&e.queue).queued;
    wait_done(|d| d.finished < ticket);
}

/// Someone waits for the queue: take it without gathering, and start the
/// engine if it is not running. [`wait_until`] calls it; so does a thread
/// about to block on a queued entry by other means (a wait for what the
/// completion will release).
pub(crate) fn hurry() {
    let e = engine();
    let mut q = sync::lock(&e.queue);
    if q.is_empty() {
        return;
    }
    q.urgent = true;
    #[cfg(not(percpu_ref_loom))]
    {
        let refused = if q.running {
            // Also while it gathers: `urgent` ends the wait.
            q.sleeping = false;
            e.work.notify_one();
            None
        } else {
            start_engine(&mut q)
        };
        drop(q);
        complete_refused(refused);
    }
}
