//! A table of live sessions, as a server keeps one, built on
//! [`percpu_ref::owned`]: an example dependent, model-checked with loom.
//!
//! Each connection owns its session (an [`Owner`]). Request handlers reach
//! any connection's session by id through the [`Weak`]s in a [`Table`]
//! ([`Table::lookup`] gives a counted [`Ref`]). Closing a connection
//! ([`close`]) kills its session, and the protocol promises:
//!
//! 1. **Closing frees the id at once.** From the moment `close` returns,
//!    no lookup finds the session, and the id can be opened again (a
//!    reconnect) although requests may still be inside the old session.
//!    The table keeps the dead entry until the id is reopened: the kill is
//!    the removal (`tryget_live` fails from the kill on), so closing takes
//!    no table lock.
//! 2. **Nothing a session served is lost.** [`Closed::served`] returns the
//!    number of requests the session served, counting every request that
//!    was inside it when it closed: it waits for the last one to leave.
//!
//! `tests/model.rs` checks both in every interleaving of a request, a
//! close followed by a reopen, and the grace-period engine, under loom:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --test model
//! ```
//!
//! and the features `broken_tryget` and `broken_close` break one promise
//! each, for the model to catch (see `README.md`).

use percpu_ref::owned::{Killed, Owner, Ref, Weak};
use std::collections::HashMap;

/// This crate's own `std`/`loom` switch: under `--cfg loom` the table's
/// lock and the counters are loom's, so the model sees them.
mod sync {
    #[cfg(loom)]
    pub(crate) use loom::sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    };
    #[cfg(not(loom))]
    pub(crate) use std::sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    };
}
use sync::{AtomicU64, Mutex, Ordering};

/// One connection's shared state.
#[derive(Debug)]
pub struct Session {
    /// The id it is registered under.
    pub id: u64,
    /// Which opening of `id` this is (1 for the first).
    pub serial: u64,
    served: AtomicU64,
}

impl Session {
    /// Serves one request; the number served so far, this one included.
    pub fn serve(&self) -> u64 {
        // Relaxed: the count is read by `Closed::served` after the last
        // reference is gone (the release orders every increment before),
        // or for a report.
        self.served.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

/// `open` refused: a live session holds the id.
#[derive(Debug, PartialEq, Eq)]
pub struct InUse(pub u64);

/// Sessions by id.
#[derive(Default)]
pub struct Table {
    /// The latest session opened under each id; dead entries stay until
    /// the id is reopened.
    map: Mutex<HashMap<u64, (u64, Weak<Session>)>>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens a session under `id`, owned by the caller.
    ///
    /// # Errors
    ///
    /// [`InUse`] while a live session holds `id`.
    pub fn open(&self, id: u64) -> Result<Owner<Session>, InUse> {
        let mut map = self.map.lock().unwrap();
        let serial = match map.get(&id) {
            Some((serial, w)) => {
                if take(w).is_some() {
                    return Err(InUse(id));
                }
                serial + 1
            }
            None => 1,
        };
        let owner = Owner::new(Session {
            id,
            serial,
            served: AtomicU64::new(0),
        });
        map.insert(id, (serial, owner.downgrade()));
        Ok(owner)
    }

    /// A counted reference to the live session `id`; `None` once it is
    /// closing. The table's lock is not held while the caller serves.
    pub fn lookup(&self, id: u64) -> Option<Ref<Session>> {
        let w = self.map.lock().unwrap().get(&id)?.1.clone();
        take(&w)
    }
}

/// A session that may be taken for a request: alive (not killed).
#[cfg(not(feature = "broken_tryget"))]
fn take(w: &Weak<Session>) -> Option<Ref<Session>> {
    w.tryget_live()
}

/// Broken: `tryget` succeeds after the kill while any reference is left
/// (the base reference until the kill completes, a request inside), so a
/// closed session still holds its id and still takes requests.
#[cfg(feature = "broken_tryget")]
fn take(w: &Weak<Session>) -> Option<Ref<Session>> {
    w.tryget()
}

/// A closed session: lookups fail; the requests inside finish.
#[must_use = "`served` is the session's final count"]
pub struct Closed {
    #[cfg(not(feature = "broken_close"))]
    killed: Killed<Session>,
    #[cfg(feature = "broken_close")]
    early: u64,
}

/// Closes a connection's session: from the return on, no lookup finds it
/// and its id can be opened again.
pub fn close(owner: Owner<Session>) -> Closed {
    #[cfg(not(feature = "broken_close"))]
    {
        Closed {
            killed: owner.kill(),
        }
    }
    // Broken: reads the count through a reference of its own and gives up
    // the `Killed` (the last `Ref` drops the session), so a request still
    // inside is served after the count was taken.
    #[cfg(feature = "broken_close")]
    {
        let own = owner.get();
        drop::<Killed<Session>>(owner.kill());
        Closed {
            early: own.served(),
        }
    }
}

impl Closed {
    /// The number of requests the session served, once the last one has
    /// left it.
    pub fn served(self) -> u64 {
        #[cfg(not(feature = "broken_close"))]
        {
            self.killed.wait().served()
        }
        #[cfg(feature = "broken_close")]
        {
            self.early
        }
    }
}
