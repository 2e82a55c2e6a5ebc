//! Appends: the primary validates and stamps a client's batch; a backup
//! checks a prepare's batch against its own log before journaling it.
//!
//! Offsets are minted by the primary (SPEC §4): the stamped batch is the
//! prepare body, so every replica persists the same bytes by construction.
//! The base offset is the primary's next offset counting its uncommitted
//! prepares, obtained by folding the applied state forward over the
//! journaled ops (`Partition::offset_state_before`); a purge in that
//! window restarts it at 0. The base timestamp is the driver's clock, never
//! below the last stamped one, so timestamps are non-decreasing along the
//! log and timestamp polls can search it.
//!
//! The per-message offset deltas are *validated*, not rewritten: each
//! message's checksum covers its delta, so rewriting would mean re-hashing
//! every message body, and the client encodes them as the message index
//! already (the batch decoder refuses anything else).
//!
//! A backup folds the same way and refuses a prepare whose batch does not
//! start at the offset it expects after the op before it. The prepare is
//! then not journaled: to the core it is a gap that repair refetches, and
//! nothing is ever re-stamped. When the op before it is itself missing the
//! check waits: the apply path checks every batch against the applied end
//! once more, and fences the partition if that ever fails.

use bytes::Bytes;
use common::{Offset, Op};
use consensus::vsr::Prepare;
use journal::SuperblockStore;
use storage::fs::Fs;
use storage::{BatchView, Integrity, stamp};

use crate::bus::MessageBus;
use crate::error::PartitionError;
use crate::ops::{OpDecodeError, PartitionOp};
use crate::partition::Partition;

/// How far back a replayed send's original can lie: the SDK replays a
/// request answered 57 for at most 30 s after it first sent it, so a
/// journal that holds every op committed in the last 35 s holds the
/// original of any replay, if it committed.
pub const REPLAY_WINDOW_US: u64 = 35_000_000;
/// How often the applied point is sampled for [`ReplaySamples`].
const REPLAY_SAMPLE_US: u64 = 1_000_000;

/// Samples of `(driver time, applied op)`, taken at ticks while the
/// partition lives, to tell whether its journal reaches back across the
/// replay window: the oldest kept sample is the newest one at least
/// [`REPLAY_WINDOW_US`] old, so every op committed since then is above its
/// op. Memory only: a restarted replica, which holds no journal from
/// before its boot, has no such sample until the window has passed —
/// unless it had applied nothing before it (a new group, a new replica),
/// when its journal holds the group's whole history.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplaySamples {
    samples: std::collections::VecDeque<(u64, u64)>,
    /// The first sample `(driver time, applied op)`: what this process
    /// found when it started sampling.
    first: Option<(u64, u64)>,
}

impl ReplaySamples {
    /// Records the applied op `applied` at driver time `now_us`.
    pub(crate) fn sample(&mut self, now_us: u64, applied: u64) {
        self.first.get_or_insert((now_us, applied));
        let due = self
            .samples
            .back()
            .is_none_or(|(at, _)| now_us >= at.saturating_add(REPLAY_SAMPLE_US));
        if due {
            self.samples.push_back((now_us, applied));
        }
        while self
            .samples
            .get(1)
            .is_some_and(|(at, _)| at.saturating_add(REPLAY_WINDOW_US) <= now_us)
        {
            self.samples.pop_front();
        }
    }

    /// An op that every op committed in the last [`REPLAY_WINDOW_US`]
    /// before `now_us` lies above, if this replica knows one: what it had
    /// applied that long ago, or 0 when it applied nothing before this
    /// process.
    pub(crate) fn applied_a_window_ago(&self, now_us: u64) -> Option<u64> {
        let sampled = self
            .samples
            .front()
            .filter(|(at, _)| at.saturating_add(REPLAY_WINDOW_US) <= now_us)
            .map(|(_, op)| *op);
        sampled.or(self.first.filter(|(_, op)| *op == 0).map(|_| 0))
    }

    /// The applied op of the first sample and how long ago (µs) it was
    /// taken: every op committed since is above it.
    pub(crate) fn first(&self, now_us: u64) -> Option<(u64, u64)> {
        self.first.map(|(at, op)| (op, now_us.saturating_sub(at)))
    }
}

/// What a primary's journal knows of a producer's send it is asked again
/// (a replay of a request whose answer was lost or unknown), found by the
/// producer key the send was ordered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedAppend {
    /// Ordered at `op` and not committed yet: the replay must wait.
    Pending(Op),
    /// Committed at `op`; its batch starts at `base_offset` when the
    /// journal still holds its header's body or locator.
    Committed {
        /// The op.
        op: Op,
        /// The batch's first offset, if known.
        base_offset: Option<Offset>,
    },
    /// Not in the journal, which does not reach back across the replay
    /// window (a replica restarted or installed a transfer since, or took
    /// more than `retention_ops` appends): the original may have committed
    /// before what it holds, so ordering the replay could store it twice.
    /// When the journal holds every op since this process started
    /// sampling, `since` says so: a replay first received after that
    /// moment ([`Partition::keyed_append`]'s `vouched`) is ordered as new.
    Unknown {
        /// This partition boot's identity and how long (µs) it has held
        /// every op, if it does.
        since: Option<(u64, u64)>,
    },
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Validates a client's batch whole (layout and every checksum; bytes
    /// from a client are never trusted) and stamps it for the next op: base
    /// offset, base timestamp, partition id, batch checksum. `None` when
    /// the next offset is unknown (not a caught-up primary).
    pub(crate) fn stamp_client_batch(
        &self,
        mut batch: Vec<u8>,
    ) -> Result<Option<Bytes>, PartitionError> {
        let max = self.config.log.batch_length_max;
        BatchView::decode_exact(&batch, Integrity::Verify, max)
            .map_err(|e| PartitionError::InvalidOp(OpDecodeError::InvalidBatch(e)))?;
        let Some(state) = self.offset_state_before(self.replica.op().0 + 1) else {
            return Ok(None);
        };
        let timestamp = self.now_us.max(state.last_timestamp);
        stamp(
            &mut batch,
            u64::from(self.config.partition_id),
            state.next_offset,
            timestamp,
            max,
        )
        .map_err(|e| PartitionError::InvalidOp(OpDecodeError::InvalidBatch(e)))?;
        Ok(Some(Bytes::from(batch)))
    }

    /// What this replica's journal knows of the append ordered with
    /// producer key `key` (nonzero), if anything: a producer's replay is
    /// looked up here before it is ordered again, so a send the client
    /// made once is stored once. The journal holds the retained applied
    /// ops and the log above them. `None`: the journal reaches back
    /// across the whole replay window and never saw the send, so it never
    /// committed and never will (a primary's log holds every op that
    /// still may), and the replay is ordered as new.
    /// `vouched` is this partition boot's identity when the replica the
    /// client talks to found the send first received after the moment
    /// [`KeyedAppend::Unknown`] named (0: not vouched).
    pub fn keyed_append(&self, key: u128, vouched: u64) -> Option<KeyedAppend> {
        let Some((op, locator)) = self.replica.find_request_checksum(key) else {
            let retained_from = self.replica.retained_from().0;
            let holds_above = |applied: u64| retained_from <= applied.saturating_add(1);
            let covered = self
                .replay_samples
                .applied_a_window_ago(self.now_us)
                .is_some_and(holds_above);
            let since = self
                .replay_samples
                .first(self.now_us)
                .filter(|(applied, _)| holds_above(*applied))
                .map(|(_, held_us)| (self.boot_identity(), held_us));
            let vouched_here = vouched != 0 && since.is_some_and(|(boot, _)| boot == vouched);
            return (!covered && !vouched_here).then_some(KeyedAppend::Unknown { since });
        };
        if op > self.replica.commit_min() {
            return Some(KeyedAppend::Pending(op));
        }
        let base_offset = match locator {
            // A spilled body's locator is its batch's base offset.
            Some(offset) => Some(Offset(offset)),
            None => self
                .replica
                .journal_entry(op)
                .and_then(|p| {
                    BatchView::decode_exact(&p.body, Integrity::LayoutOnly, u64::MAX).ok()
                })
                .map(|view| Offset(view.header().base_offset)),
        };
        Some(KeyedAppend::Committed { op, base_offset })
    }

    /// Starts the replay window at driver time `now_us`, right after boot:
    /// from here on the journal holds every op above the applied one (the
    /// logged ops above it now, later ones as they arrive or are
    /// repaired). The first tick would do too, but an idle group is not
    /// ticked.
    pub fn start_replay_window(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        self.replay_samples
            .sample(self.now_us, self.replica.commit_min().0);
    }

    /// This partition boot's identity (its core's seed, drawn per boot),
    /// never 0.
    fn boot_identity(&self) -> u64 {
        self.config.vsr.seed.max(1)
    }

    /// Checks a verified prepare from a peer before the core may journal
    /// it: a valid op body, and for a batch this partition's id and the
    /// base offset this replica expects.
    pub(crate) fn check_prepare(&self, prepare: &Prepare) -> Result<(), PartitionError> {
        let h = &prepare.header;
        if h.op.0 <= self.replica.commit_min().0 {
            // Already applied: the core ignores it.
            return Ok(());
        }
        let op = PartitionOp::decode(
            h.operation,
            &prepare.body,
            Integrity::Verify,
            self.config.log.batch_length_max,
        )
        .map_err(PartitionError::InvalidOp)?;
        let PartitionOp::Append(batch) = op else {
            return Ok(());
        };
        let header = storage::BatchHeader::decode(&batch, self.config.log.batch_length_max)
            .map_err(|e| PartitionError::InvalidOp(OpDecodeError::InvalidBatch(e)))?;
        if header.partition_id != u64::from(self.config.partition_id) {
            return Err(PartitionError::PrepareWrongPartition {
                op: h.op,
                partition_id: header.partition_id,
            });
        }
        if let Some(state) = self.offset_state_before(h.op.0)
            && state.next_offset != header.base_offset
        {
            return Err(PartitionError::PrepareOffsetMismatch {
                op: h.op,
                expected: Offset(state.next_offset),
                actual: Offset(header.base_offset),
            });
        }
        Ok(())
    }
}
