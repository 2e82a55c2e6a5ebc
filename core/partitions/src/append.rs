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
    /// ops and the log above them; an older send is not found (the
    /// replay is then ordered as new).
    pub fn keyed_append(&self, key: u128) -> Option<KeyedAppend> {
        let (op, locator) = self.replica.find_request_checksum(key)?;
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
