//! Whether a partition still takes input, and which of its durable writes
//! failed and are owed a retry.
//!
//! Three writes may fail without stopping the partition: the superblock's
//! view (`PersistState`), and the transfer-needed record's write (after a
//! converge or on damage) or removal (after a completed install). Each is
//! retried on every tick until it lands, and until then the partition
//! holds back what the write would vouch for (`partition.rs`, `flush.rs`,
//! `install/`). A failure it cannot go on from fences it:
//! every later input is refused until a reboot.
//!
//! One [`Health`] value holds all of it, written only through its methods,
//! so that the partition's files name what happened ("the view could not
//! be persisted") instead of flipping flags, and no combination the
//! partition never reaches can be represented:
//!
//! - A fence is terminal and a fenced partition retries nothing (its ticks
//!   are refused before any retry), so [`Health::Fenced`] carries no
//!   retries; the first reason wins.
//! - The view's retry is independent of the record's: a view change can
//!   fail its write whatever the record's state, so it is a flag beside it.
//! - The record's write and its removal exclude each other
//!   ([`MissingHistoryRetry`]): a pending removal is dropped when history
//!   goes missing again (the record is written anew), and a pending write
//!   is dropped by the completed install that makes a removal due.

use crate::missing_history::MissingHistory;

/// A partition's state as far as taking input goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Health {
    /// Takes input; the durable writes listed are retried on each tick.
    Serving(PendingRetries),
    /// Refuses every input until a reboot, for the reason given.
    Fenced {
        /// What fenced it (the first failure, never replaced).
        reason: String,
    },
}

/// The durable writes that failed and are retried on the next tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PendingRetries {
    /// The superblock write of a `PersistState` failed; the core keeps
    /// holding its sends until the view is durable.
    view: bool,
    /// The transfer-needed record's write or removal failed.
    missing_history: Option<MissingHistoryRetry>,
}

/// The transfer-needed record's durable step that failed
/// (`state_transfer::missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MissingHistoryRetry {
    /// A completed install could not remove the record: the partition
    /// stays lagging until the removal lands.
    Clear,
    /// A record that could not be written. The install marker then stays
    /// as the only evidence, and it is evidence only while the
    /// superblock's applied point still matches it, so until the record is
    /// durable no applied point is recorded past the install (`flush.rs`).
    Record(MissingHistory),
}

impl Default for Health {
    fn default() -> Self {
        Self::Serving(PendingRetries::default())
    }
}

impl PendingRetries {
    /// Whether any write waits for a retry (then every tick is due).
    pub(crate) fn any(&self) -> bool {
        self.view || self.missing_history.is_some()
    }

    /// Whether the view waits to be persisted.
    pub(crate) fn view(&self) -> bool {
        self.view
    }

    /// Whether the record's removal waits for a retry.
    pub(crate) fn missing_history_clear(&self) -> bool {
        self.missing_history == Some(MissingHistoryRetry::Clear)
    }

    /// The record waiting to be written, if one is.
    pub(crate) fn missing_history_record(&self) -> Option<MissingHistory> {
        match self.missing_history {
            Some(MissingHistoryRetry::Record(record)) => Some(record),
            _ => None,
        }
    }
}

impl Health {
    /// Why the partition is fenced, if it is.
    pub(crate) fn fenced(&self) -> Option<&str> {
        match self {
            Self::Serving(_) => None,
            Self::Fenced { reason } => Some(reason),
        }
    }

    /// Fences the partition, unless it already is (the first reason
    /// stands: it is the failure the rest followed from).
    pub(crate) fn fence(&mut self, reason: impl FnOnce() -> String) {
        if let Self::Serving(_) = self {
            *self = Self::Fenced { reason: reason() };
        }
    }

    /// The writes waiting for a retry; none once fenced.
    pub(crate) fn retries(&self) -> PendingRetries {
        match self {
            Self::Serving(retries) => *retries,
            Self::Fenced { .. } => PendingRetries::default(),
        }
    }

    /// A `PersistState` write failed.
    pub(crate) fn view_unpersisted(&mut self) {
        if let Self::Serving(retries) = self {
            retries.view = true;
        }
    }

    /// The view is durable.
    pub(crate) fn view_persisted(&mut self) {
        if let Self::Serving(retries) = self {
            retries.view = false;
        }
    }

    /// Writing `record` failed; it is written on the next tick.
    pub(crate) fn missing_history_unrecorded(&mut self, record: MissingHistory) {
        if let Self::Serving(retries) = self {
            // Every write follows history going missing, which dropped a
            // pending removal first.
            debug_assert!(!retries.missing_history_clear());
            retries.missing_history = Some(MissingHistoryRetry::Record(record));
        }
    }

    /// No record waits to be written any more: it landed, or a completed
    /// install made it moot.
    pub(crate) fn missing_history_recorded(&mut self) {
        if let Self::Serving(retries) = self
            && matches!(
                retries.missing_history,
                Some(MissingHistoryRetry::Record(_))
            )
        {
            retries.missing_history = None;
        }
    }

    /// Removing the record failed; it is removed on the next tick.
    pub(crate) fn missing_history_uncleared(&mut self) {
        if let Self::Serving(retries) = self {
            // Every removal follows a completed install, which dropped a
            // pending write first.
            debug_assert!(retries.missing_history_record().is_none());
            retries.missing_history = Some(MissingHistoryRetry::Clear);
        }
    }

    /// No removal waits any more: it landed, or history went missing
    /// again and the record is written anew.
    pub(crate) fn missing_history_cleared(&mut self) {
        if let Self::Serving(retries) = self
            && retries.missing_history_clear()
        {
            retries.missing_history = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use common::{Offset, Op};

    use super::*;

    const RECORD: MissingHistory = MissingHistory {
        commit_op: Op(7),
        frontier: Offset(42),
    };

    #[test]
    fn given_a_fenced_partition_when_fenced_again_should_keep_the_first_reason() {
        let mut health = Health::default();
        health.fence(|| "first".to_owned());
        health.fence(|| "second".to_owned());
        assert_eq!(health.fenced(), Some("first"));
    }

    #[test]
    fn given_pending_retries_when_fenced_should_retry_nothing() {
        let mut health = Health::default();
        health.view_unpersisted();
        health.missing_history_unrecorded(RECORD);
        assert!(health.retries().any());
        health.fence(|| "disk gone".to_owned());
        assert!(!health.retries().any());
        health.view_unpersisted();
        assert!(!health.retries().any());
    }

    #[test]
    fn given_a_pending_record_when_a_removal_settles_should_keep_the_record() {
        let mut health = Health::default();
        health.missing_history_unrecorded(RECORD);
        health.missing_history_cleared();
        assert_eq!(health.retries().missing_history_record(), Some(RECORD));
        health.missing_history_recorded();
        assert!(!health.retries().any());
    }

    #[test]
    fn given_a_pending_removal_when_a_record_settles_should_keep_the_removal() {
        let mut health = Health::default();
        health.missing_history_uncleared();
        health.view_unpersisted();
        health.missing_history_recorded();
        assert!(health.retries().missing_history_clear());
        health.missing_history_cleared();
        health.view_persisted();
        assert_eq!(health.retries(), PendingRetries::default());
    }
}
