//! Purge: a replicated op that empties the partition and restarts its
//! offsets at 0 under a new purge generation.
//!
//! The durable steps, in order, each with the crash it defends against:
//!
//! 1. **Superblock frontier reset to 0, applied point to the op before the
//!    purge** (`checkpoint_op = P − 1`, its identity being the purge's
//!    `parent`). First, because every later step destroys evidence of the
//!    old offset space: were segments unlinked while the superblock still
//!    claimed the old frontier, boot would see a frontier above an empty
//!    log (refused as missing data) instead of a purge in progress. If this
//!    write fails nothing has changed. The applied point `P − 1` with
//!    frontier 0 is not literally true (the old space had data), but every
//!    effect of ops up to `P − 1` is about to be erased by `P`, and a
//!    restarted replica of a group re-applies `P` first: `purge.gen` still
//!    older → the purge runs again and completes; already `P`'s generation
//!    → the partition is purged and its next offset is indeed 0. Ops
//!    between the previous applied point and `P − 1` are never re-applied,
//!    which is right since `P` erases them.
//! 2. **Unlink every segment, oldest first, log before index, syncing the
//!    directory between segments.** A crash mid-way leaves a contiguous
//!    suffix of the old chain (an orphan index is swept at boot), whose end
//!    is still the old counter. Without the sync per segment, unlinks
//!    survive a crash independently and a crash test found the hole that
//!    leaves.
//! 3. **Plant an empty segment at 0 and sync the directory** (the storage
//!    crate's open does both when it finds no segment), only after the last
//!    unlink was synced: a crash test found that otherwise the new empty
//!    segment at 0 can survive beside an old tail whose unlink was lost. A
//!    crash before the plant boots an empty directory, which opens at the
//!    superblock's frontier: 0.
//! 4. **Clear the consumer offsets** (unlink every file, sync each
//!    directory). A crash before this boots offsets clamped to the
//!    recovered end, so none points past the data.
//! 5. **`purge.gen` last.** It is the record that the purge finished: a
//!    crash anywhere earlier leaves the old generation, so a retried
//!    `Purge{generation}` applies again and completes the job.
//! 6. **Applied point to `P`** (frontier 0), so that a restart does not
//!    need `P` from its peers.
//!
//! In memory, the journal (every live entry precedes the purge op) is
//! cleared, the counters are zeroed and the applied offset restarts at 0.

use common::{Offset, Op};
use std::io;

use consensus::vsr::PrepareHeader;
use journal::SuperblockStore;
use storage::SegmentedLog;
use storage::fs::{FileKind, Fs};
use storage::{SegmentFileName, parse_file_name};

use crate::bus::MessageBus;
use crate::error::PartitionError;
use crate::offset_storage::{PurgeGeneration, persist_purge_generation};
use crate::partition::{AppliedPoint, Partition};

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Applies a committed purge establishing `generation` at op `h.op.0`.
    pub(crate) async fn apply_purge(
        &mut self,
        h: &PrepareHeader,
        generation: u64,
    ) -> Result<(), PartitionError> {
        let op = h.op.0;
        tracing::info!(dir = %self.dir.display(), op, generation, "purging partition");
        // The core may have committed later ops in the same step (their
        // requests are in its client table already). A table recorded
        // with this op's points would then cover requests a restart from
        // them applies again: they would be taken for duplicates and
        // skipped (a consumer-offset store rolled back at boot was lost
        // that way: replog-sim --purges --deletes 20002303). So the
        // table is recorded only when this op is the core's last applied;
        // otherwise the points are recorded without one, and a restart
        // from them starts deduplication empty (docs/consensus.md §9).
        let table_current = self.replica.commit_min().0 == op;
        // 1. Frontier reset first (see the module comment), with the client
        // table under the same point so that a crash mid-purge restores it.
        // It already holds this op's request: the op is applied again, as
        // a duplicate, which the purge ignores (it is gated by generation).
        if table_current {
            self.write_client_table(op.saturating_sub(1), h.parent, 0, true)
                .await?;
        }
        self.durable
            .reset_applied(Op(op.saturating_sub(1)), h.parent, Offset::ZERO)
            .await
            .map_err(PartitionError::Superblock)?;
        // 2. Unlink the chain oldest first.
        self.unlink_segment_chain().await?;
        // 3. Plant the empty segment at 0 (syncs the directory).
        let (log, _) = SegmentedLog::open(self.fs.clone(), &self.dir, self.config.log, 0)
            .await
            .map_err(|e| PartitionError::PurgeIo {
                step: "plant empty segment",
                source: io::Error::other(e.to_string()),
            })?;
        self.replace_log(log);
        self.journal.clear_all(Op(op + 1));
        self.applied_log_purged();
        // 4. Consumer offsets.
        self.offsets
            .clear_all(&self.fs)
            .await
            .map_err(purge_io("clear consumer offsets"))?;
        // 5. The generation, last.
        persist_purge_generation(
            &self.fs,
            &self.dir,
            PurgeGeneration {
                generation,
                created_revision: self.config.created_revision,
            },
        )
        .await
        .map_err(purge_io("record purge generation"))?;
        self.purge_recorded(
            generation,
            AppliedPoint {
                op,
                checksum: h.checksum,
                next_offset: 0,
            },
        );
        // 6. The applied point moves past the purge.
        if table_current {
            self.record_applied_point(op, h.checksum, 0).await?;
        } else {
            self.durable
                .record_applied(Op(op), h.checksum, Offset::ZERO)
                .await
                .map_err(PartitionError::Superblock)?;
            self.offsets.settle(op);
        }
        Ok(())
    }

    /// Unlinks every segment file, oldest first, with a directory sync
    /// between segments and after the last.
    async fn unlink_segment_chain(&self) -> Result<(), PartitionError> {
        let entries = self
            .fs
            .read_dir(&self.dir)
            .await
            .map_err(purge_io("list segments"))?;
        let mut files: Vec<(u64, u8, std::ffi::OsString)> = entries
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .filter_map(|e| {
                let order = match parse_file_name(e.name_str()?) {
                    SegmentFileName::Log(start) => (start, 0),
                    SegmentFileName::Index(start) => (start, 1),
                    SegmentFileName::Staging => (u64::MAX, 2),
                    SegmentFileName::Other => return None,
                };
                Some((order.0, order.1, e.name))
            })
            .collect();
        files.sort();
        let mut previous = None;
        for (start, _, name) in files {
            if previous.is_some_and(|p| p != start) {
                // One directory sync per segment: unsynced unlinks survive
                // a crash independently, so without it a crash could keep
                // a later segment's unlink and lose an earlier one's,
                // leaving a hole in the chain.
                self.fs
                    .sync_dir(&self.dir)
                    .await
                    .map_err(purge_io("sync directory"))?;
            }
            previous = Some(start);
            match self.fs.remove_file(&self.dir.join(&name)).await {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(purge_io("unlink segment")(e)),
            }
        }
        // The last segment's unlinks durable before the plant: otherwise a
        // crash could keep the new empty segment at 0 beside a surviving
        // old tail (an empty segment that is not the tail, refused at boot).
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(purge_io("sync directory"))?;
        Ok(())
    }
}

/// Names the purge step an I/O error stopped.
fn purge_io(step: &'static str) -> impl Fn(io::Error) -> PartitionError {
    move |source| PartitionError::PurgeIo { step, source }
}
