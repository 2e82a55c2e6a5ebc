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
//! step that applied a batch, synced, before the replies go out; and on
//! demand ([`Partition::flush_committed_messages`], e.g. at shutdown, so a
//! graceful restart does not boot with consumer offsets past the data).
//!
//! Order of durable steps in a synced flush: batches written, log synced
//! (the storage crate then writes the index entries that point into the
//! synced bytes), and only then the superblock's offset frontier advanced
//! to the log's end. The frontier therefore never claims an offset whose
//! bytes a crash could still lose, and boot can refuse a frontier above
//! the recovered log as missing data. The frontier is a lower bound, so it
//! is recorded only at on-demand flushes and when a segment seals (the
//! rotation syncs it), not on every `enforce_fsync` flush.

use journal::SuperblockStore;
use storage::fs::Fs;

use crate::bus::MessageBus;
use crate::partition::{Partition, PartitionError};

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

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Flushes every committed batch to the active segment and syncs it,
    /// whatever the thresholds.
    pub async fn flush_committed_messages(&mut self) -> Result<FlushOutcome, PartitionError> {
        self.check_fenced()?;
        match self.flush(true, true).await {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                self.fence(&e);
                Err(e)
            }
        }
    }

    /// The threshold check run after every drive step.
    pub(crate) async fn flush_if_due(&mut self) -> Result<(), PartitionError> {
        let info = *self.journal.info();
        if info.messages_count == 0 {
            return Ok(());
        }
        if self.config.enforce_fsync {
            self.flush(true, false).await?;
        } else if info.messages_count >= self.config.messages_required_to_save
            || info.size_bytes >= self.config.size_required_to_save_bytes
        {
            self.flush(false, false).await?;
        }
        Ok(())
    }

    /// Writes the journal's batches to segments, optionally syncing, and
    /// evicts what was written. The superblock frontier advances after a
    /// sync when `record_frontier` is set or a segment was sealed: it is a
    /// lower bound, so recording it on every `enforce_fsync` flush would
    /// only add a superblock write (two syncs and a rename) per produce.
    pub(crate) async fn flush(
        &mut self,
        sync: bool,
        record_frontier: bool,
    ) -> Result<FlushOutcome, PartitionError> {
        let segments_before = self.log.segments().count();
        let entries: Vec<(u64, Option<(bytes::Bytes, u32)>)> = self
            .journal
            .live()
            .map(|e| {
                (
                    e.op,
                    (e.stats.messages > 0).then(|| (e.frame.clone(), e.stats.messages)),
                )
            })
            .collect();
        let mut outcome = FlushOutcome::default();
        let mut written_to = None;
        for (op, batch) in entries {
            if let Some((bytes, messages)) = batch {
                let (res, _) = self.log.append(bytes).await;
                if let Err(e) = res {
                    // What was written stays written: evict it so a retry
                    // does not append it twice.
                    if let Some(up_to) = written_to {
                        self.journal.evict_flushed(up_to);
                    }
                    return Err(PartitionError::Storage(e));
                }
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
        if sync {
            self.log.sync().await.map_err(PartitionError::Storage)?;
            outcome.synced = true;
        }
        let sealed = self.log.segments().count() != segments_before;
        // Rotation syncs the sealed segment itself, so a seal is a durable
        // point even without `sync`.
        if (sync && record_frontier) || sealed {
            // After the sync, never before: see the module comment.
            let durable_end = if sync {
                self.log.next_offset()
            } else {
                self.log.segments().last().map_or(0, |s| s.start_offset)
            };
            self.durable
                .advance_offset_frontier(durable_end)
                .await
                .map_err(PartitionError::Superblock)?;
        }
        Ok(outcome)
    }
}
