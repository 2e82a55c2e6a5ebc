//! Flushing the committed journal prefix to the active segment.
//!
//! Every entry of the partition's [`journal::PrepareJournal`] is an applied
//! (so committed) op; the flush appends the batches among them, in op
//! order, to the `SegmentedLog` (which rotates at `segment_size_bytes` on
//! committed bytes alone, so every replica seals at the same offsets) and
//! then evicts the flushed entries once, at the end.
//!
//! When: after each drive step once `messages_required_to_save` messages or
//! `size_required_to_save_bytes` bytes wait; with `enforce_fsync` after every
//! step that applied a batch, synced, before the replies go out; without it,
//! written but not synced, after every step whose replies are about to go
//! out while batches wait; and on demand
//! ([`Partition::flush_committed_messages`], e.g. at shutdown, so a graceful
//! restart does not boot with consumer offsets past the data).
//!
//! **A reply never leaves before its batch is in the file.** Whatever the
//! thresholds, a step that holds replies writes the waiting batches to the
//! active segment first (one write per step, coalescing every batch of the
//! step). The page cache outlives the process, so a killed replica — the
//! single replica included — boots with every batch it acknowledged; only
//! a power loss or a kernel crash can take unsynced bytes, and only without
//! `enforce_fsync`. A backup answers no client and keeps the thresholds:
//! its acknowledged prepares are covered by the quorum, not by its file.
//! The thresholds still decide how often a replica that only applies
//! writes, and the applied-point rules below decide when it syncs.
//!
//! **A full disk** (ENOSPC, EDQUOT on a batch, an index entry, a seal or
//! the client table) does not fence: the batches not written stay in the
//! journal, their replies stay held, new writes are refused
//! ([`PartitionError::NoSpace`]) and the flush is retried on the ticks
//! with a backoff (`health.rs`); the storage crate cut back what landed of
//! a batch, so a retry appends it whole, once. The retry writes the
//! batches before the client table ([`Partition::retry_flush_for_space`]).
//! The applied point is recorded only after a sync, as always, so a
//! crash while the disk is full boots from what was synced. Anything but a
//! full disk still fences.
//!
//! **The applied point.** A flush writes the whole journal, so afterwards
//! every op up to the last journaled one (`journaled_point`: its op, its
//! identity, the next offset after it) has its effects in segments
//! (consumer-offset ops are durable when applied, each record naming its
//! op so that boot can roll back those above the recorded point; a purge
//! records itself).
//! Once those segments are synced, the superblock may record that op as
//! the applied point (`checkpoint_op`, `checkpoint_checksum`) together with
//! the offset frontier after it, in one write
//! ([`journal::Superblock::record_applied`]). A restarted replica of a
//! group resumes applying after that op and repairs the rest from its
//! peers (see `partition.rs`, "Restart with peers").
//!
//! Order of durable steps: batches written, log synced (the storage crate
//! then writes the index entries that point into the synced bytes), the
//! client table as of the point written and synced (`client_sessions.rs`),
//! and only then the superblock record. The frontier therefore never claims an
//! offset whose bytes a crash could still lose, and boot can refuse a
//! frontier above the recovered log as missing data; a crash between the
//! sync and the record leaves synced batches above the recorded point,
//! which a restart finds on disk instead of writing them again.
//!
//! When the point is recorded: at on-demand flushes; when a segment seals
//! (the active segment is synced too, one more sync per segment); and, in
//! a multi-replica group, once the last journaled op is `retention_ops / 4`
//! ops past the recorded one, or past it at all `record_interval_us` after
//! the last record (either alone makes a flush due, and the flush then
//! syncs; the time bound's record is made on the group's tick, at most a
//! tick after it falls due, so that a shard's groups make theirs side by
//! side). The time bound is what a whole-group restart of a `replicated`
//! group can lose. The last rule bounds how far back a restarted replica must
//! repair, so that its peers, which retain `retention_ops` applied
//! prepares, can still serve it. And with `enforce_fsync` in a
//! multi-replica group, at every step whose replies are about to go out
//! (one superblock write per step, shared by every reply of the step):
//! a persisted reply promises the op survives a restart of the whole
//! group, and a restarted replica keeps nothing past its recorded point
//! (boot cuts later batches; the census of a whole-group restart starts
//! from the longest recorded point, docs/consensus.md §4).

use common::{Offset, Op};
use journal::SuperblockStore;
use storage::fs::Fs;

use crate::bus::MessageBus;
use crate::error::PartitionError;
use crate::partition::Partition;

/// What a flush wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushOutcome {
    /// Batches appended to segments.
    pub batches: u64,
    /// Messages in them.
    pub messages: u64,
    /// Whether the log was synced.
    pub synced: bool,
}

/// A journaled batch on its way to the active segment.
struct FlushedBatch {
    bytes: bytes::Bytes,
    messages: u32,
    base_offset: u64,
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Flushes every committed batch to the active segment and syncs it,
    /// whatever the thresholds.
    ///
    /// # Errors
    /// [`PartitionError::NoSpace`] when the disk is full: the batches stay
    /// in the journal and the partition retries on its ticks. Any other
    /// failure fences the partition.
    pub async fn flush_committed_messages(&mut self) -> Result<FlushOutcome, PartitionError> {
        self.check_fenced()?;
        match self.flush(true, true).await {
            Ok(outcome) => {
                self.space_regained();
                Ok(outcome)
            }
            Err(e) if e.is_no_space() => Err(self.ran_out_of_space(&e)),
            Err(e) => {
                self.fence(&e);
                Err(e)
            }
        }
    }

    /// A write found the disk full (`error`): the partition holds its
    /// journaled batches and the replies that wait for them, refuses new
    /// writes, and retries the flush on its ticks with a backoff
    /// (`health.rs`). Logged once when it starts, not per retry. Returns
    /// the error a refused write is answered with.
    pub(crate) fn ran_out_of_space(&mut self, error: &PartitionError) -> PartitionError {
        let wanted_bytes = self.journal.info().size_bytes;
        if self.health.no_space_failed(wanted_bytes) {
            tracing::warn!(
                dir = %self.dir.display(),
                wanted_bytes,
                group = %self.config.vsr.group,
                %error,
                "disk full: partition out of space; writes refused and retried, reads served"
            );
        }
        PartitionError::NoSpace {
            dir: self.dir.clone(),
            wanted_bytes,
        }
    }

    /// The flush that waited for space landed: writes are taken again.
    pub(crate) fn space_regained(&mut self) {
        if let Some(retry) = self.health.space_regained() {
            tracing::info!(
                dir = %self.dir.display(),
                wanted_bytes = retry.wanted_bytes,
                group = %self.config.vsr.group,
                "disk space regained: partition writes resumed"
            );
        }
    }

    /// While the disk is full, the error a write is refused with.
    pub(crate) fn check_space(&self) -> Result<(), PartitionError> {
        match self.health.retries().no_space() {
            Some(retry) => Err(PartitionError::NoSpace {
                dir: self.dir.clone(),
                wanted_bytes: retry.wanted_bytes,
            }),
            None => Ok(()),
        }
    }

    /// The retry of a flush that found the disk full: the journal's
    /// batches first, then what the step's rules ask for (the client
    /// table of a single replica's held replies, a sync, a record).
    /// Batches before the table, unlike a first attempt: the table of an
    /// earlier attempt may already name them, and a newer table must not
    /// overwrite the older slot while the log does not reach either (boot
    /// keeps the newest table the log reaches, `client_sessions.rs`);
    /// batches past the table a reboot finds are cut, and their replies
    /// were held.
    pub(crate) async fn retry_flush_for_space(&mut self) -> Result<(), PartitionError> {
        if self.journal.info().messages_count > 0 {
            self.flush(false, false).await?;
        }
        self.flush_if_due().await
    }

    /// Closes the log's file handles when it has nothing unsynced (they
    /// are reopened on next use); returns whether it holds none now. A
    /// host of many idle partitions calls it so that its descriptor limit
    /// does not bound how many it can hold.
    pub fn release_handles(&mut self) -> bool {
        if let Some(log) = self.replica_log.as_mut() {
            log.release_handle();
        }
        self.log.release_handles()
    }

    /// Whether the log (or the replica log) holds any open file handle.
    pub fn holds_handles(&self) -> bool {
        self.log.holds_handles() || self.replica_log.as_ref().is_some_and(|l| l.holds_handle())
    }

    /// The threshold check run after every drive step. In a multi-replica
    /// group a lagging applied point is due too, even when no message waits
    /// (a run of consumer-offset ops, or many one-message batches below
    /// the message threshold, would otherwise leave it behind).
    pub(crate) async fn flush_if_due(&mut self) -> Result<(), PartitionError> {
        let info = *self.journal.info();
        let lagging = self.record_due_here();
        // A single replica applies nothing again after a restart, so the
        // client table its replies rely on is written before they go out,
        // and before their batches (client_sessions.rs: boot keeps the
        // newest table the log reaches and cuts batches past it).
        if self.config.vsr.replica_count == 1
            && self.clients_dirty
            && !self.pending_replies.is_empty()
        {
            let point = self.journaled_point;
            self.write_client_table(
                point.op,
                point.checksum,
                point.next_offset,
                self.config.enforce_fsync,
            )
            .await?;
        }
        // A persisted primary records what it applied before anyone can
        // see it: before the step's replies, and before a poll can read
        // a batch it applied with no reply here (one it re-committed
        // after a view change).
        let record_before_exposure = self.config.enforce_fsync
            && self.config.vsr.replica_count > 1
            && (!self.pending_replies.is_empty()
                || (info.messages_count > 0 && self.replica.is_primary()));
        if info.messages_count == 0 && !lagging && !record_before_exposure {
            return Ok(());
        }
        if record_before_exposure {
            // What the replies acknowledge must be in the recorded applied
            // point, not only synced: after a whole-group restart the
            // census starts from the longest recorded point, and batches
            // past it are cut (see the module documentation).
            self.flush(true, true).await?;
        } else if self.config.enforce_fsync && info.messages_count > 0 {
            self.flush(true, false).await?;
        } else if lagging
            || info.messages_count >= self.config.messages_required_to_save
            || info.size_bytes >= self.config.size_required_to_save_bytes
            || (info.messages_count > 0 && !self.pending_replies.is_empty())
        {
            self.flush(false, false).await?;
        }
        Ok(())
    }

    /// Records `op` (identity `checksum`, offset frontier `next_offset`)
    /// as the applied point: the client table as of it first, synced, then
    /// the superblock record, which boot matches the table against.
    pub(crate) async fn record_applied_point(
        &mut self,
        op: u64,
        checksum: u128,
        next_offset: u64,
    ) -> Result<(), PartitionError> {
        self.write_client_table(op, checksum, next_offset, true)
            .await?;
        self.durable
            .record_applied(Op(op), checksum, Offset(next_offset))
            .await
            .map_err(PartitionError::Superblock)?;
        self.offsets.settle(op);
        Ok(())
    }

    /// Notes that an applied client op changed the client table, so that
    /// a single replica writes it before the step's replies.
    pub(crate) fn client_table_changed(&mut self) {
        self.clients_dirty = true;
    }

    /// Writes the client table (the state after `commit_min`) into its next
    /// slot (`client_sessions.rs`), labelled as the state after `op` with
    /// the log ending at `next_offset`: the callers pass `commit_min` and
    /// its end, except a purge's first step (purge.rs).
    pub(crate) async fn write_client_table(
        &mut self,
        op: u64,
        checksum: u128,
        next_offset: u64,
        sync: bool,
    ) -> Result<(), PartitionError> {
        let table = crate::client_sessions::RecordedTable {
            op: Op(op),
            checksum,
            next_offset: Offset(next_offset),
            sessions: self.replica.client_table().sessions(),
        };
        self.client_slots
            .write(&self.fs, &self.dir, &table, sync)
            .await
            .map_err(|source| PartitionError::ClientTableIo {
                dir: self.dir.clone(),
                source,
            })?;
        self.clients_dirty = false;
        Ok(())
    }

    /// Whether a lagging applied point is recorded on this call: the
    /// op-count bound at once, the time bound only on the group's tick (at
    /// most a tick after it falls due: that tick visits the group). A shard
    /// runs many groups' ticks at once and their syncs share the
    /// filesystem's commits; made on the step that applied the op, as
    /// frames arrive, one group's syncs would follow another's.
    fn record_due_here(&self) -> bool {
        self.applied_point_lags_by_ops() || (self.ticking && self.applied_point_overdue())
    }

    /// Whether, in a multi-replica group, the last journaled op is
    /// `retention_ops / 4` (at least 1) ops past the recorded applied
    /// point.
    fn applied_point_lags_by_ops(&self) -> bool {
        let lag_max = (self.config.vsr.retention_ops / 4).max(1);
        self.records_applied_point() && self.ops_past_recorded_point() >= lag_max
    }

    /// Whether, in a multi-replica group, the last journaled op is past the
    /// recorded applied point and `record_interval_us` has passed since the
    /// last record.
    fn applied_point_overdue(&self) -> bool {
        let interval = self.config.record_interval_us;
        self.records_applied_point()
            && interval > 0
            && self.ops_past_recorded_point() > 0
            && self.now_us.saturating_sub(self.recorded_at_us) >= interval
    }

    fn ops_past_recorded_point(&self) -> u64 {
        self.journaled_point
            .op
            .saturating_sub(self.durable.state().checkpoint_op.0)
    }

    /// Whether this group keeps its applied point recorded on these rules
    /// at all: a multi-replica group with no missing-history record due.
    fn records_applied_point(&self) -> bool {
        self.health.retries().missing_history_record().is_none()
            && self.config.vsr.replica_count > 1
    }

    /// When the time-based record of a lagging applied point falls due
    /// (µs on the driver's clock), if one is waiting: the tick that reaches
    /// it must run (see [`Partition::ticks_until_due`]).
    pub(crate) fn record_due_at_us(&self) -> Option<u64> {
        let interval = self.config.record_interval_us;
        let behind = self.journaled_point.op > self.durable.state().checkpoint_op.0;
        (interval > 0
            && behind
            && self.config.vsr.replica_count > 1
            && self.health.retries().missing_history_record().is_none())
        .then(|| self.recorded_at_us.saturating_add(interval))
    }

    /// Writes the journal's batches to segments, optionally syncing, and
    /// evicts what was written. The applied point and its frontier are
    /// recorded after a sync when `record_frontier` is set, a segment was
    /// sealed, or the recorded point lags (see the module documentation).
    pub(crate) async fn flush(
        &mut self,
        sync: bool,
        record_frontier: bool,
    ) -> Result<FlushOutcome, PartitionError> {
        let segments_before = self.log.segments().count();
        let mut outcome = FlushOutcome::default();
        let in_segments = self.write_journaled(&mut outcome).await?;
        if self.config.vsr.replica_count > 1 {
            for (op, base_offset, len) in in_segments {
                self.retained
                    .flushed(&mut self.replica, op.0, base_offset, len);
            }
        }
        let sealed = self.log.segments().count() != segments_before;
        let point = self.journaled_point;
        // While a converge's transfer-needed record is not durable the
        // install marker is the only evidence that history is missing,
        // and boot honours it only while the superblock's applied point
        // still matches it: recording a later point would make a reboot
        // read "the old state stands" and come back complete.
        // The client table recorded with the point must be the state after
        // it: not so while an op is being applied (a full journal flushes
        // from inside `apply`), when the next flush records instead.
        let record = ((sync && record_frontier) || sealed || self.record_due_here())
            && self.health.retries().missing_history_record().is_none()
            && point.op == self.replica.commit_min().0;
        if sync || record {
            self.log.sync().await.map_err(PartitionError::Storage)?;
            outcome.synced = true;
        }
        if record {
            // After the sync, never before: see the module comment.
            self.record_applied_point(point.op, point.checksum, point.next_offset)
                .await?;
            self.recorded_at_us = self.now_us;
        }
        Ok(outcome)
    }

    /// Appends the journal's batches to the log, counting them in
    /// `outcome`, and evicts what was written. Returns each written body's
    /// op, base offset and length: the bodies now in segments, which the
    /// core may let go of.
    async fn write_journaled(
        &mut self,
        outcome: &mut FlushOutcome,
    ) -> Result<Vec<(Op, u64, u64)>, PartitionError> {
        let (in_segments, failed) = self.write_journaled_batches(outcome).await;
        match failed {
            None => Ok(in_segments),
            Some(e) => {
                // What was written before the failure is in segments: the
                // core may let go of those bodies as of any flush.
                if self.config.vsr.replica_count > 1 {
                    for (op, base_offset, len) in in_segments {
                        self.retained
                            .flushed(&mut self.replica, op.0, base_offset, len);
                    }
                }
                Err(e)
            }
        }
    }

    /// [`Self::write_journaled`]'s writes: the bodies written, and the
    /// failure that stopped them, if one did.
    async fn write_journaled_batches(
        &mut self,
        outcome: &mut FlushOutcome,
    ) -> (Vec<(Op, u64, u64)>, Option<PartitionError>) {
        let entries: Vec<(Op, Option<FlushedBatch>)> = self
            .journal
            .live()
            .map(|e| {
                (
                    e.op,
                    (e.stats.messages > 0).then(|| FlushedBatch {
                        bytes: e.frame.clone(),
                        messages: e.stats.messages,
                        base_offset: e.stats.base_offset.0,
                    }),
                )
            })
            .collect();
        let mut written_to = None;
        // The bodies now in segments, which the core may let go of.
        let mut in_segments = Vec::new();
        for (op, batch) in entries {
            if let Some(FlushedBatch {
                bytes,
                messages,
                base_offset,
            }) = batch
            {
                let len = bytes.len() as u64;
                let (res, _) = self.log.append(bytes).await;
                if let Err(e) = res {
                    // What was written stays written: evict it so a retry
                    // does not append it twice. The failed batch is not in
                    // the log (the storage cut what landed of it, or is
                    // poisoned), so it stays journaled.
                    if let Some(up_to) = written_to {
                        self.journal.evict_flushed(up_to);
                    }
                    return (in_segments, Some(PartitionError::Storage(e)));
                }
                in_segments.push((op, base_offset, len));
                outcome.batches += 1;
                outcome.messages += u64::from(messages);
            }
            written_to = Some(op);
        }
        // Written batches are readable from the segment now; evicting before
        // the sync means a failed sync cannot lead to a second append.
        if let Some(up_to) = written_to {
            self.journal.evict_flushed(up_to);
        }
        (in_segments, None)
    }
}
