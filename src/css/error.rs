//! Why a cgroup operation was refused: [`CgroupError`].
//!
//! A leaf of the css model (it names no other file of it), so that the
//! kernel's `css_create` (`create.rs`) and the API's `mkdir` and `rmdir` report with
//! the same type.

use std::fmt;

/// Why [`Hierarchy::rmdir`](super::Hierarchy::rmdir) found a cgroup busy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BusyReason {
    /// Tasks are attached to it.
    HasTasks(usize),
    /// It has children that were not removed (their names).
    HasChildren(Vec<String>),
}

/// A refused cgroup operation. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupError {
    /// `rmdir` of a cgroup that still has tasks or online children (the
    /// kernel's `EBUSY`).
    Busy {
        /// The cgroup.
        path: String,
        /// What keeps it.
        reason: BusyReason,
    },
    /// The cgroup was already removed (or, for `mkdir`, the parent was).
    Removed {
        /// The operation.
        op: &'static str,
        /// The removed cgroup.
        path: String,
    },
    /// `mkdir` of a name that exists (`EEXIST`).
    Exists {
        /// The existing cgroup.
        path: String,
    },
    /// `mkdir` with an empty name or one containing `/`.
    InvalidName {
        /// The name.
        name: String,
    },
    /// `rmdir` of the root cgroup.
    Root {
        /// The operation.
        op: &'static str,
    },
    /// A cgroup or task of another hierarchy was passed.
    WrongHierarchy {
        /// The operation.
        op: &'static str,
        /// The cgroup's path.
        path: String,
    },
    /// A subsystem's id table is full.
    IdsExhausted {
        /// The subsystem.
        subsys: String,
    },
    /// A subsystem callback refused the new css.
    SubsysRefused {
        /// The subsystem.
        subsys: String,
        /// The callback (`css_alloc` or `css_online`).
        callback: &'static str,
        /// The cgroup being made.
        path: String,
        /// The subsystem's reason.
        reason: String,
    },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupError::Busy {
                path,
                reason: BusyReason::HasTasks(n),
            } => write!(f, "rmdir {path}: busy: {n} task(s) attached"),
            CgroupError::Busy {
                path,
                reason: BusyReason::HasChildren(names),
            } => write!(
                f,
                "rmdir {path}: busy: child cgroup(s) {} not removed",
                names.join(", ")
            ),
            CgroupError::Removed { op, path } => {
                write!(f, "{op}: cgroup {path} was removed")
            }
            CgroupError::Exists { path } => write!(f, "mkdir {path}: already exists"),
            CgroupError::InvalidName { name } => {
                write!(f, "mkdir: invalid cgroup name {name:?}")
            }
            CgroupError::Root { op } => write!(f, "{op}: the root cgroup cannot be removed"),
            CgroupError::WrongHierarchy { op, path } => {
                write!(f, "{op}: {path} belongs to another hierarchy")
            }
            CgroupError::IdsExhausted { subsys } => {
                write!(f, "mkdir: subsystem {subsys} has no free css id")
            }
            CgroupError::SubsysRefused {
                subsys,
                callback,
                path,
                reason,
            } => write!(f, "mkdir {path}: {subsys}'s {callback} refused: {reason}"),
        }
    }
}

impl std::error::Error for CgroupError {}
