//! [`Recorder`], a subsystem that writes every callback to a log, and the
//! [`Event`]s it records.
//!
//! Built on the data graph only (`graph.rs`: the [`Subsys`] trait and
//! [`Css`]'s queries), as a subsystem of a user's would be.

use super::graph::{Css, Subsys};
use std::fmt;
use std::sync::{Arc, Mutex};

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
