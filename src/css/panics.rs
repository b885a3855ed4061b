//! Where the panics of subsystem callbacks wait while a lifecycle step
//! completes.
//!
//! A leaf of the css model (it names no other file of it): every layer
//! runs callbacks or resumes their panics.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

/// A panic payload.
pub(crate) type Payload = Box<dyn Any + Send + 'static>;

/// Panics caught from subsystem callbacks while a lifecycle step runs, so
/// that the step completes; the first one is resumed once the step's
/// caller has released what it held (see [`Subsys`](super::Subsys), *Panics in
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
