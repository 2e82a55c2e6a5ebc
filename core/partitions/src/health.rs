//! Whether a partition still takes input, and which of its durable writes
//! failed and are owed a retry.
//!
//! Four writes may fail without stopping the partition: the superblock's
//! view (`PersistState`), the transfer-needed record's write (after a
//! converge or on damage) or removal (after a completed install), and a
//! flush of committed batches that found the disk full (ENOSPC, EDQUOT).
//! The first three are retried on every tick until they land, the flush
//! with a backoff ([`NoSpaceRetry`]); until then the partition holds back
//! what the write would vouch for (`partition.rs`, `flush.rs`,
//! `install/`): a full disk holds the replies of the batches not written
//! and refuses new writes, and keeps serving reads. A failure it cannot go
//! on from fences it: every later input is refused until a reboot.
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
    /// A flush found the disk full: the journal's batches wait for a retry.
    no_space: Option<NoSpaceRetry>,
}

/// The shortest wait between two retries of a flush on a full disk.
const NO_SPACE_BACKOFF_TICKS_MIN: u64 = 1;
/// The longest (about 1.3 s at the default 10 ms tick): a freed disk is
/// written again within that, and a full one costs a failed write per
/// wait, not per tick.
pub(crate) const NO_SPACE_BACKOFF_TICKS_MAX: u64 = 128;

/// A flush of committed batches that failed for want of disk space
/// (`flush.rs`). The batches stay in the journal (readable, replies held);
/// the flush is tried again once `wait_ticks` ticks passed, and each
/// failure doubles the wait, up to [`NO_SPACE_BACKOFF_TICKS_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoSpaceRetry {
    /// Bytes of committed batches waiting to be written at the last
    /// failure.
    pub(crate) wanted_bytes: u64,
    /// Ticks until the next retry (0: due).
    wait_ticks: u64,
    /// The wait set after the next failure.
    backoff_ticks: u64,
}

impl NoSpaceRetry {
    /// Whether the retry runs on this step.
    pub(crate) fn due(&self) -> bool {
        self.wait_ticks == 0
    }

    /// Ticks until the retry is due.
    pub(crate) fn wait_ticks(&self) -> u64 {
        self.wait_ticks
    }
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
    /// Whether any write waits for a retry on every tick (then every
    /// tick is due; a flush on a full disk waits its backoff instead).
    pub(crate) fn any(&self) -> bool {
        self.view || self.missing_history.is_some()
    }

    /// The flush waiting for disk space, if one is.
    pub(crate) fn no_space(&self) -> Option<NoSpaceRetry> {
        self.no_space
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

    /// A flush found the disk full with `wanted_bytes` of batches to
    /// write; returns whether the partition just ran out of space (false
    /// for a retry that failed again, which waits twice as long).
    pub(crate) fn no_space_failed(&mut self, wanted_bytes: u64) -> bool {
        let Self::Serving(retries) = self else {
            return false;
        };
        match retries.no_space.as_mut() {
            Some(retry) => {
                retry.wanted_bytes = wanted_bytes;
                retry.wait_ticks = retry.backoff_ticks;
                retry.backoff_ticks = (retry.backoff_ticks * 2).min(NO_SPACE_BACKOFF_TICKS_MAX);
                false
            }
            None => {
                retries.no_space = Some(NoSpaceRetry {
                    wanted_bytes,
                    wait_ticks: NO_SPACE_BACKOFF_TICKS_MIN,
                    backoff_ticks: NO_SPACE_BACKOFF_TICKS_MIN * 2,
                });
                true
            }
        }
    }

    /// The flush waiting for space landed; returns the retry it ends.
    pub(crate) fn space_regained(&mut self) -> Option<NoSpaceRetry> {
        match self {
            Self::Serving(retries) => retries.no_space.take(),
            Self::Fenced { .. } => None,
        }
    }

    /// `ticks` ticks passed: a flush waiting for space comes closer to its
    /// retry.
    pub(crate) fn count_ticks(&mut self, ticks: u64) {
        if let Self::Serving(retries) = self
            && let Some(retry) = retries.no_space.as_mut()
        {
            retry.wait_ticks = retry.wait_ticks.saturating_sub(ticks);
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
    #[allow(clippy::unwrap_used)]
    fn given_a_full_disk_when_retries_fail_should_back_off_up_to_the_ceiling_and_end_on_success() {
        let mut health = Health::default();
        assert!(health.no_space_failed(100));
        assert!(!health.retries().any(), "a full disk waits its backoff");
        let mut waits = Vec::new();
        for _ in 0..10 {
            let retry = health.retries().no_space().unwrap();
            waits.push(retry.wait_ticks());
            health.count_ticks(retry.wait_ticks());
            assert!(health.retries().no_space().unwrap().due());
            assert!(!health.no_space_failed(200));
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
        assert_eq!(health.space_regained().unwrap().wanted_bytes, 200);
        assert_eq!(health.retries(), PendingRetries::default());
        assert!(health.space_regained().is_none());
    }

    #[test]
    fn given_a_full_disk_when_fenced_should_retry_nothing() {
        let mut health = Health::default();
        health.no_space_failed(1);
        health.fence(|| "disk gone".to_owned());
        assert!(health.retries().no_space().is_none());
        assert!(!health.no_space_failed(1));
        assert!(health.space_regained().is_none());
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
