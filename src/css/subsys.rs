//! Subsystems (controllers): the kernel's `struct cgroup_subsys` callbacks,
//! and [`Recorder`], a subsystem that writes every callback to a log.

use super::subsys_state::Css;
use std::any::Any;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// A cgroup subsystem (controller), as the kernel's `struct cgroup_subsys`.
///
/// Each cgroup has one [`Css`] per subsystem of its hierarchy. The
/// callbacks run in the kernel's order, each exactly once per css:
///
/// 1. [`css_alloc`](Self::css_alloc) — the css exists but nothing can see
///    it yet; an error makes `mkdir` fail.
/// 2. [`css_online`](Self::css_online) — the css is linked to its parent;
///    an error makes `mkdir` fail (then only `css_free` follows).
/// 3. [`css_offline`](Self::css_offline) — after `rmdir` killed the css,
///    once no `css_tryget_online` can succeed and every child css is
///    offline. References may still be held.
/// 4. [`css_released`](Self::css_released) — the last reference was put;
///    the css is unlinked from its parent and the id table.
/// 5. [`css_free`](Self::css_free) — a grace period later: nothing can
///    reach the css any more. Every child was freed before. (A root css
///    goes offline when its hierarchy is dropped, and is released and
///    freed together by the last put on it; see the [module
///    docs](super), *What keeps the root alive*.)
///
/// The callbacks run with the hierarchy's `cgroup_mutex` held (except
/// `css_alloc`/`css_online` of a hierarchy's root css, run at creation,
/// and the root's teardown, which starts when the last [`Hierarchy`]
/// handle is dropped): they must not call `mkdir`, `rmdir`, `attach` or
/// `run_destroy_work` on the same hierarchy.
///
/// # Panics in callbacks
///
/// A callback that panics does not stop the lifecycle: the panic is
/// caught, the step that called it completes as if the callback had
/// returned (a panicking `css_alloc` or `css_online` counts as a refusal
/// and `mkdir` is undone), `cgroup_mutex` is released, and then the panic
/// is resumed in the caller that ran the step: `mkdir`/`rmdir`/`attach`/
/// `spawn` whose unlock ran the work, the put that released the css,
/// [`Hierarchy::run_destroy_work`] or [`Hierarchy::flush`]. Work run with
/// no such caller (after a grace period, or while the thread was already
/// unwinding) keeps its panic for the next `flush` or `run_destroy_work`.
/// Only the first panic of a step is resumed; the panic hook has reported
/// every one.
///
/// [`Hierarchy`]: super::Hierarchy
/// [`Hierarchy::run_destroy_work`]: super::Hierarchy::run_destroy_work
/// [`Hierarchy::flush`]: super::Hierarchy::flush
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{Css, Hierarchy, Subsys};
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// #[derive(Default)]
/// struct Counting { online: AtomicUsize }
/// impl Subsys for Counting {
///     fn name(&self) -> &str { "counting" }
///     fn css_online(&self, _css: &Css) -> Result<(), String> {
///         self.online.fetch_add(1, Ordering::SeqCst);
///         Ok(())
///     }
///     fn css_offline(&self, _css: &Css) {
///         self.online.fetch_sub(1, Ordering::SeqCst);
///     }
/// }
///
/// let ss = Arc::new(Counting::default());
/// let h = Hierarchy::new(vec![ss.clone()]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// assert_eq!(ss.online.load(Ordering::SeqCst), 2); // root and a
/// h.rmdir(&a).unwrap();
/// percpu_ref::flush(); // the kill completes; its confirm offlines `a`
/// assert_eq!(ss.online.load(Ordering::SeqCst), 1);
/// ```
pub trait Subsys: Send + Sync + 'static {
    /// The subsystem's name (`"memory"`, `"io"`, ...).
    fn name(&self) -> &str;
    /// The css was allocated. `Err` refuses the `mkdir`.
    ///
    /// # Errors
    ///
    /// Return `Err(reason)` to refuse the css: `mkdir` is undone and fails
    /// with [`CgroupError::SubsysRefused`](super::CgroupError::SubsysRefused)
    /// (for a root css, [`Hierarchy::new`](super::Hierarchy::new) panics).
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        let _ = css;
        Ok(())
    }
    /// The css is about to go online. `Err` refuses the `mkdir`.
    ///
    /// # Errors
    ///
    /// As [`css_alloc`](Self::css_alloc).
    fn css_online(&self, css: &Css) -> Result<(), String> {
        let _ = css;
        Ok(())
    }
    /// The css went offline (after every child css).
    fn css_offline(&self, css: &Css) {
        let _ = css;
    }
    /// The css's last reference was put.
    fn css_released(&self, css: &Css) {
        let _ = css;
    }
    /// The css is about to be freed (after every child css).
    fn css_free(&self, css: &Css) {
        let _ = css;
    }
}

/// A panic payload.
pub(crate) type Payload = Box<dyn Any + Send + 'static>;

/// Panics caught from subsystem callbacks while a lifecycle step runs, so
/// that the step completes; the first one is resumed once the step's
/// caller has released what it held (see [`Subsys`], *Panics in
/// callbacks*).
#[derive(Default)]
#[must_use = "caught panics must be resumed or kept"]
pub(crate) struct CallbackPanics(Option<Payload>);

impl CallbackPanics {
    /// Runs `f` (a subsystem callback); `None` if it panicked (the panic is
    /// kept).
    pub(crate) fn call<R>(&mut self, f: impl FnOnce() -> R) -> Option<R> {
        // AssertUnwindSafe: the caller goes on as if the callback returned,
        // and reads nothing the callback could have left half-written; the
        // subsystem's own state is the subsystem's business.
        match panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => Some(r),
            Err(p) => {
                self.keep(p);
                None
            }
        }
    }

    /// Keeps `p` unless a panic is kept already (later ones are dropped:
    /// the panic hook reported them).
    pub(crate) fn keep(&mut self, p: Payload) {
        if self.0.is_none() {
            self.0 = Some(p);
        }
    }

    /// Keeps the first panic of `other` too.
    pub(crate) fn merge(&mut self, other: CallbackPanics) {
        if let Some(p) = other.0 {
            self.keep(p);
        }
    }

    /// The kept panic, if any.
    pub(crate) fn take(&mut self) -> Option<Payload> {
        self.0.take()
    }

    /// Resumes the kept panic, unless this thread is already unwinding
    /// (a second panic would abort; the hook has reported this one).
    pub(crate) fn resume(self) {
        if let Some(p) = self.0 {
            if !std::thread::panicking() {
                panic::resume_unwind(p);
            }
        }
    }
}

/// Which callback an [`Event`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// [`Subsys::css_alloc`].
    Alloc,
    /// [`Subsys::css_online`].
    Online,
    /// [`Subsys::css_offline`].
    Offline,
    /// [`Subsys::css_released`].
    Released,
    /// [`Subsys::css_free`].
    Free,
}

impl EventKind {
    /// The kernel callback's name.
    #[must_use]
    pub fn callback(self) -> &'static str {
        match self {
            EventKind::Alloc => "css_alloc",
            EventKind::Online => "css_online",
            EventKind::Offline => "css_offline",
            EventKind::Released => "css_released",
            EventKind::Free => "css_free",
        }
    }
}

/// One recorded callback: which, on which css.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// The callback.
    pub kind: EventKind,
    /// The subsystem's name.
    pub subsys: String,
    /// The css id (unique within its subsystem while the css lives).
    pub css_id: u32,
    /// The cgroup's path (`/` for the root).
    pub path: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<12} {:>8} css#{:<4} {}",
            self.kind.callback(),
            self.subsys,
            self.css_id,
            self.path
        )
    }
}

/// A shared, ordered log of [`Event`]s.
pub type EventLog = Arc<Mutex<Vec<Event>>>;

/// A subsystem that records every callback in an [`EventLog`], so tests
/// and examples can check the lifecycle order.
///
/// # Examples
///
/// ```
/// use percpu_ref::css::{EventKind, Hierarchy, Recorder};
/// let rec = Recorder::new("memory");
/// let h = Hierarchy::new(vec![rec.clone()]);
/// let a = h.mkdir(&h.root(), "a").unwrap();
/// h.rmdir(&a).unwrap();
/// assert!(h.flush()); // wait for the grace period and the free
/// let kinds: Vec<_> = rec.events().iter().filter(|e| e.path == "/a").map(|e| e.kind).collect();
/// use EventKind::*;
/// assert_eq!(kinds, [Alloc, Online, Offline, Released, Free]);
/// ```
pub struct Recorder {
    name: String,
    log: EventLog,
}

impl Recorder {
    /// A recorder with its own log.
    #[must_use]
    pub fn new(name: &str) -> Arc<Recorder> {
        Self::with_log(name, EventLog::default())
    }

    /// A recorder that appends to `log` (share one log between several
    /// subsystems to see their relative order).
    #[must_use]
    pub fn with_log(name: &str, log: EventLog) -> Arc<Recorder> {
        Arc::new(Recorder {
            name: name.to_string(),
            log,
        })
    }

    /// The log this recorder appends to.
    #[must_use]
    pub fn log(&self) -> EventLog {
        self.log.clone()
    }

    /// A copy of the events recorded so far.
    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        lock_log(&self.log).clone()
    }

    fn record(&self, kind: EventKind, css: &Css) {
        lock_log(&self.log).push(Event {
            kind,
            subsys: self.name.clone(),
            css_id: css.id(),
            path: css.cgroup_path().to_string(),
        });
    }
}

fn lock_log(log: &EventLog) -> std::sync::MutexGuard<'_, Vec<Event>> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Subsys for Recorder {
    fn name(&self) -> &str {
        &self.name
    }
    fn css_alloc(&self, css: &Css) -> Result<(), String> {
        self.record(EventKind::Alloc, css);
        Ok(())
    }
    fn css_online(&self, css: &Css) -> Result<(), String> {
        self.record(EventKind::Online, css);
        Ok(())
    }
    fn css_offline(&self, css: &Css) {
        self.record(EventKind::Offline, css);
    }
    fn css_released(&self, css: &Css) {
        self.record(EventKind::Released, css);
    }
    fn css_free(&self, css: &Css) {
        self.record(EventKind::Free, css);
    }
}
