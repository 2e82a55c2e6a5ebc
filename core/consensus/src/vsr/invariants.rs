//! What must hold of a replica between any two inputs, whatever the
//! network, the disk or the peers did. The simulator checks every replica
//! after every step; a failure names the property and the values, so a
//! seed that breaks one points at the state, not only at a symptom much
//! later.
//!
//! These are properties of one replica's own state. What must hold across
//! replicas (no two values at one committed op, acknowledged ops kept) is
//! the simulator's oracle.

use std::fmt;

use super::io::Status;
use super::journal::Journal;
use super::replica::Replica;

/// A broken invariant: which one, and the values that break it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvariantViolation {
    /// The property's name (stable, for grouping failures).
    pub property: &'static str,
    /// The values involved.
    pub detail: String,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.property, self.detail)
    }
}

impl std::error::Error for InvariantViolation {}

impl InvariantViolation {
    /// `property` broken, with the values in `detail`.
    pub fn new(property: &'static str, detail: String) -> Self {
        Self { property, detail }
    }
}

fn broken(property: &'static str, detail: String) -> Result<(), InvariantViolation> {
    Err(InvariantViolation::new(property, detail))
}

impl Replica {
    /// Checks the replica's invariants (module documentation).
    pub fn invariants(&self) -> Result<(), InvariantViolation> {
        let (view, log_view) = (self.view, self.log_view);
        if log_view > view {
            return broken(
                "log-view-ahead",
                format!("log_view {log_view} > view {view}"),
            );
        }
        if self.durable_view > view || self.durable_log_view > log_view {
            return broken(
                "durable-ahead",
                format!(
                    "durable (view {}, log_view {}) ahead of (view {view}, log_view {log_view})",
                    self.durable_view, self.durable_log_view
                ),
            );
        }
        if self.status == Status::Normal && log_view != view {
            return broken(
                "normal-outside-its-log-view",
                format!("Normal in view {view} with log_view {log_view}"),
            );
        }
        if self.commit_min > self.commit_max {
            return broken(
                "applied-past-committed",
                format!(
                    "commit_min {} > commit_max {}",
                    self.commit_min, self.commit_max
                ),
            );
        }
        if let Some(h) = self.journal.header(self.commit_min)
            && self.commit_min > 0
            && h.checksum != self.commit_min_checksum
        {
            return broken(
                "applied-identity",
                format!(
                    "op {} applied as {:#x}, the journal holds {:#x}",
                    self.commit_min, self.commit_min_checksum, h.checksum
                ),
            );
        }
        self.journal.invariants(self.commit_min).map_err(|mut v| {
            v.detail = format!(
                "{} ({:?}, view {view}, log_view {log_view}, commit {}/{})",
                v.detail, self.status, self.commit_min, self.commit_max
            );
            v
        })
    }
}

impl Journal {
    /// Every entry and header filed under its own op, a held body agreeing with the header known at its
    /// op, and the unapplied entries chained where they are adjacent.
    pub(super) fn invariants(&self, commit_min: u64) -> Result<(), InvariantViolation> {
        for (op, header) in self.headers_iter() {
            if header.op.0 != op {
                return broken(
                    "journal-misfiled",
                    format!("header of op {} filed at {op}", header.op.0),
                );
            }
        }
        let mut below: Option<(u64, u128)> = None;
        for (op, prepare) in self.entries_iter() {
            let h = &prepare.header;
            if h.op.0 != op {
                return broken(
                    "journal-misfiled",
                    format!("prepare of op {} filed at {op}", h.op.0),
                );
            }
            if let Some(known) = self.headers_get(op)
                && known.checksum != h.checksum
            {
                return broken(
                    "journal-body-disagrees",
                    format!(
                        "op {op}: body {:#x}, header {:#x}",
                        h.checksum, known.checksum
                    ),
                );
            }
            if op > commit_min
                && let Some((prev, checksum)) = below
                && prev + 1 == op
                && prev > commit_min
                && h.parent != checksum
            {
                return broken(
                    "journal-chain",
                    format!(
                        "op {op}'s parent {:#x} is not op {prev}'s checksum {checksum:#x}",
                        h.parent
                    ),
                );
            }
            below = Some((op, h.checksum));
        }
        Ok(())
    }
}
