//! What a partition refuses or fails with: [`BootError`] when it cannot
//! boot (nothing was served), [`PartitionError`] for an input it refuses
//! or an op it cannot carry out.

use std::fmt;
use std::io;
use std::path::PathBuf;

use common::{ConsumerKind, Offset, Op};
use consensus::vsr::FrameError;
use journal::{JournalError, ReplicaLogError, SuperblockError};
use storage::{RecoveryError, StorageError};

use crate::ops::OpDecodeError;

/// Why a partition could not boot. Nothing was served.
#[derive(Debug)]
pub enum BootError {
    /// The superblock could not be read or initialised.
    Superblock(SuperblockError),
    /// Segment recovery refused the directory (a hole, an I/O error…).
    Recovery(RecoveryError),
    /// `purge.gen` exists but cannot be read; booting with generation 0
    /// could re-apply a purge over newer data.
    PurgeGenerationUnreadable {
        /// The partition directory.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A client-table slot exists but could not be read (an I/O error;
    /// a slot that does not verify is skipped instead).
    ClientTableUnreadable {
        /// The slot file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The replica log (`replica.log`) could not be opened or read.
    ReplicaLog(ReplicaLogError),
    /// The consumer-offset directories could not be loaded.
    OffsetsUnreadable {
        /// The partition directory.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The superblock's frontier is above what the segments hold: data
    /// that was synced before the frontier advanced is gone.
    FrontierAheadOfLog {
        /// The durable frontier.
        frontier: Offset,
        /// The offset after the last recovered batch.
        log_next_offset: Offset,
    },
    /// A replica of a multi-replica group restarted with an offset frontier
    /// but no recorded applied point (a superblock written before the
    /// applied point was recorded): it can rejoin only through a state
    /// transfer.
    RestartNeedsStateTransfer {
        /// The superblock's commit bound.
        commit: Op,
        /// The offset after the last recovered batch.
        log_next_offset: Offset,
    },
    /// Cutting the batches past the recorded applied point failed.
    TruncateToAppliedPoint {
        /// The partition directory.
        dir: PathBuf,
        /// The applied point's offset frontier.
        frontier: Offset,
        /// The underlying error.
        source: StorageError,
    },
    /// The superblock names an op (its commit bound or applied point) past
    /// any op a real log reaches ([`consensus::vsr::OP_MAX`]): the core
    /// would compute the op after it.
    SuperblockOpOutOfRange {
        /// The offending op.
        op: Op,
        /// The largest op accepted.
        max: Op,
    },
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Superblock(e) => write!(f, "partition superblock unusable: {e}"),
            Self::Recovery(e) => write!(f, "partition segments could not be recovered: {e}"),
            Self::PurgeGenerationUnreadable { dir, source } => write!(
                f,
                "purge generation in {} is unreadable: {source}",
                dir.display()
            ),
            Self::OffsetsUnreadable { dir, source } => write!(
                f,
                "consumer offsets in {} could not be loaded: {source}",
                dir.display()
            ),
            Self::ClientTableUnreadable { path, source } => write!(
                f,
                "client-table slot {} could not be read: {source}",
                path.display()
            ),
            Self::ReplicaLog(e) => write!(f, "{e}"),
            Self::TruncateToAppliedPoint {
                dir,
                frontier,
                source,
            } => write!(
                f,
                "could not cut {} at offset {frontier}, the recorded applied point: {source}",
                dir.display()
            ),
            Self::FrontierAheadOfLog {
                frontier,
                log_next_offset,
            } => write!(
                f,
                "the durable offset frontier {frontier} is above the recovered log end {log_next_offset}: synced data is missing"
            ),
            Self::RestartNeedsStateTransfer {
                commit,
                log_next_offset,
            } => write!(
                f,
                "a replica with history (commit {commit}, log end {log_next_offset}) must rejoin its group by state transfer"
            ),
            Self::SuperblockOpOutOfRange { op, max } => {
                write!(f, "the superblock names op {op}, past the largest op {max}")
            }
        }
    }
}

impl std::error::Error for BootError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Superblock(e) => Some(e),
            Self::Recovery(e) => Some(e),
            Self::PurgeGenerationUnreadable { source, .. }
            | Self::OffsetsUnreadable { source, .. }
            | Self::ClientTableUnreadable { source, .. } => Some(source),
            Self::TruncateToAppliedPoint { source, .. } => Some(source),
            Self::ReplicaLog(e) => Some(e),
            Self::FrontierAheadOfLog { .. }
            | Self::RestartNeedsStateTransfer { .. }
            | Self::SuperblockOpOutOfRange { .. } => None,
        }
    }
}

/// Why a partition refused an input or could not carry out an op.
#[derive(Debug)]
pub enum PartitionError {
    /// An earlier local failure fenced the partition; it serves nothing
    /// until rebooted.
    Fenced {
        /// What fenced it.
        reason: String,
    },
    /// A state-transfer install is in flight (it runs in steps between the
    /// shard's ticks, `install/`): the partition takes no
    /// input until it ends. Transient.
    InstallInProgress {
        /// The partition directory.
        dir: PathBuf,
    },
    /// A client's batch or a peer's prepare body is not a valid op.
    InvalidOp(OpDecodeError),
    /// A prepare whose batch does not start at the offset this replica
    /// expects after the op before it: refused (a gap repair refills),
    /// never re-stamped.
    PrepareOffsetMismatch {
        /// The prepare's op.
        op: Op,
        /// The base offset the replica expected.
        expected: Offset,
        /// The base offset the batch carries.
        actual: Offset,
    },
    /// A prepare whose batch names another partition.
    PrepareWrongPartition {
        /// The prepare's op.
        op: Op,
        /// The partition id in the batch.
        partition_id: u64,
    },
    /// The VSR core refused a frame.
    Frame(FrameError),
    /// A store names an offset the partition has not committed yet.
    StoreOffsetBeyondEnd {
        /// The offset asked for.
        offset: Offset,
        /// The next offset the partition will commit.
        next_offset: Offset,
    },
    /// A purge naming generation 0, which is the partition before any
    /// purge and never one a purge brings in.
    PurgeGenerationZero,
    /// A committed batch does not continue the applied offsets (an
    /// internal invariant; the partition is fenced).
    ApplyOffsetMismatch {
        /// The op.
        op: Op,
        /// The offset expected.
        expected: Offset,
        /// The offset the batch carries.
        actual: Offset,
    },
    /// A committed batch re-applied after a restart straddles the end of
    /// the log recovered at boot: part of it is on disk and part is not.
    /// Flushes write whole batches, so this means the segments do not hold
    /// what this group committed; the partition is fenced.
    ReplayStraddlesRecoveredEnd {
        /// The op.
        op: Op,
        /// The batch's first offset.
        base_offset: Offset,
        /// The batch's last offset.
        last_offset: Offset,
        /// The last offset recovered at boot.
        recovered_end: Offset,
    },
    /// The segment log failed.
    Storage(StorageError),
    /// The superblock write failed.
    Superblock(SuperblockError),
    /// The in-memory journal refused an entry.
    Journal(JournalError),
    /// A consumer-offset file could not be written or removed.
    OffsetIo {
        /// Consumer or group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
        /// The underlying error.
        source: io::Error,
    },
    /// A purge step failed on disk.
    PurgeIo {
        /// Which step.
        step: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// The client table could not be recorded (`client_sessions.rs`).
    ClientTableIo {
        /// The partition directory.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The replica log could not be written or synced: the step's frames,
    /// which vouch for it, were not sent (the partition is fenced).
    ReplicaLog(ReplicaLogError),
    /// The partition's disk is full (ENOSPC or EDQUOT on a segment or
    /// client-table write): its committed batches wait in memory for a
    /// retry, so it refuses new writes (produces, offset stores) until
    /// space is freed. Reads are served meanwhile, and the writes resume
    /// by themselves, with no restart (`health.rs`).
    NoSpace {
        /// The partition directory.
        dir: PathBuf,
        /// Bytes of committed batches waiting to be written.
        wanted_bytes: u64,
    },
}

impl PartitionError {
    /// Whether this is the disk being full (ENOSPC, EDQUOT) rather than
    /// another failure: a write that failed with it may be retried once
    /// space is freed, and the partition need not be fenced.
    pub fn is_no_space(&self) -> bool {
        match self {
            Self::NoSpace { .. } => true,
            Self::Storage(e) => e.is_no_space(),
            Self::ClientTableIo { source, .. } => storage::fs::is_no_space(source),
            _ => false,
        }
    }
}

impl fmt::Display for PartitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fenced { reason } => write!(f, "partition is fenced: {reason}"),
            Self::InstallInProgress { dir } => write!(
                f,
                "partition {} is installing a state transfer; try again shortly",
                dir.display()
            ),
            Self::InvalidOp(e) => write!(f, "operation refused: {e}"),
            Self::PrepareOffsetMismatch {
                op,
                expected,
                actual,
            } => write!(
                f,
                "prepare {op} starts at offset {actual} but this replica's next offset is {expected}"
            ),
            Self::PrepareWrongPartition { op, partition_id } => {
                write!(
                    f,
                    "prepare {op} carries a batch of partition {partition_id}"
                )
            }
            Self::Frame(e) => write!(f, "frame refused: {e}"),
            Self::StoreOffsetBeyondEnd {
                offset,
                next_offset,
            } => write!(
                f,
                "cannot store offset {offset}: the partition has committed only up to {next_offset}"
            ),
            Self::PurgeGenerationZero => {
                f.write_str("purge generation 0 names no purge (generations start at 1)")
            }
            Self::ApplyOffsetMismatch {
                op,
                expected,
                actual,
            } => write!(
                f,
                "committed op {op} starts at offset {actual}, not at the applied end {expected}"
            ),
            Self::ReplayStraddlesRecoveredEnd {
                op,
                base_offset,
                last_offset,
                recovered_end,
            } => write!(
                f,
                "re-applied op {op} holds offsets {base_offset}..={last_offset} but the log recovered at boot ends at {recovered_end}"
            ),
            Self::Storage(e) => write!(f, "segment log failed: {e}"),
            Self::Superblock(e) => write!(f, "superblock write failed: {e}"),
            Self::Journal(e) => write!(f, "journal refused an entry: {e}"),
            Self::OffsetIo { kind, id, source } => {
                write!(
                    f,
                    "offset of {kind:?} {id} could not be persisted: {source}"
                )
            }
            Self::PurgeIo { step, source } => write!(f, "purge failed at {step}: {source}"),
            Self::ClientTableIo { dir, source } => write!(
                f,
                "client table could not be recorded in {}: {source}",
                dir.display()
            ),
            Self::ReplicaLog(e) => write!(f, "{e}"),
            Self::NoSpace { dir, wanted_bytes } => write!(
                f,
                "the disk of partition {} is full: {wanted_bytes} bytes of committed messages wait to be written, and new messages are refused until space is freed (reads are served)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for PartitionError {}
