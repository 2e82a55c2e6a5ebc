//! What an install reports: its outcome, and each way it can fail with
//! whether the partition was converged before the error returned.

use common::{ConsumerKind, Offset, Op};
use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::state_transfer::wire::ConsumerOffsetsWireError;

/// What a completed install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInstallOutcome {
    /// The consensus op the install applied (an op, never an offset).
    pub applied_commit_op: Op,
}

/// Why an install failed. The check phase mutates nothing; from the
/// mutate phase on, the partition is converged to an empty, honestly
/// lagging state before the error returns, unless the error is
/// [`Self::ConvergeFailed`].
#[derive(Debug)]
pub enum PartitionInstallError {
    /// The partition has no directory on disk.
    NoPartitionDir,
    /// An offsets directory is not configured.
    NoOffsetDir {
        /// Consumers or consumer groups.
        kind: ConsumerKind,
    },
    /// The offer's op is below this replica's commit point: installing
    /// would rewind it.
    StaleTransfer {
        /// The offer's op.
        commit_op: Op,
        /// This replica's applied op.
        commit_min: Op,
    },
    /// The offer's op is past any op a real log reaches
    /// ([`consensus::vsr::OP_MAX`]); the op after it would overflow.
    OpOutOfRange {
        /// The offer's op.
        commit_op: Op,
        /// The largest op accepted.
        max: Op,
    },
    /// The incoming frontier could not be made durable before the swap.
    FrontierNotDurable {
        /// The frontier.
        frontier: Offset,
    },
    /// The offer's offset frontier is below this replica's own: installing
    /// would rewind the offset space and fork future batch bytes.
    OfferRewindsDurableData {
        /// The offer's next offset.
        offer_next_offset: Offset,
        /// This replica's next offset.
        local_next_offset: Offset,
    },
    /// Staging or finalising a consumer-offset file failed.
    OffsetPersistence {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The offsets artifact did not decode.
    Offsets(ConsumerOffsetsWireError),
    /// Two staged segments share a base offset.
    DuplicateSegment {
        /// The base offset.
        start_offset: Offset,
    },
    /// The staged segments leave a hole.
    SegmentSetHole {
        /// End of the earlier segment.
        previous_end: Offset,
        /// Start of the next one.
        next_start: Offset,
    },
    /// A filesystem step of the swap failed; disk holds what is left of the
    /// old chain and part of the new one, which the converge removes.
    SwapIo {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Reopening an installed segment failed; disk holds the new chain.
    SegmentOpen {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The partition is fenced: it takes no install until rebooted.
    Fenced {
        /// What fenced it.
        reason: String,
    },
    /// The offer carries an older purge generation than the one this
    /// replica applied: it was built before a purge this replica already
    /// carried out.
    PurgeGenerationBehind {
        /// The offer's generation.
        offered: u64,
        /// The local generation it is below.
        local: u64,
    },
    /// The offered purge generation could not be recorded in `purge.gen`;
    /// the install converges and pulls again rather than leave the
    /// installed state under an older generation.
    PurgeGenerationNotDurable {
        /// The offered generation.
        generation: u64,
        /// The `purge.gen` file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The offer's dedup slice does not fit this replica's client table.
    Dedup(consensus::ClientTableError),
    /// An install is already in flight on this partition; it ends first.
    AlreadyInstalling,
    /// No install is in flight to carry on.
    NotInstalling,
    /// Converging after a failure failed too: the shard must fence this
    /// partition (its segment files move to `<dir>.fenced.<n>`; the
    /// superblock stays).
    ConvergeFailed {
        /// The error.
        source: io::Error,
        /// The offer's offset frontier, which the fence records.
        frontier: Offset,
    },
}

impl fmt::Display for PartitionInstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPartitionDir => f.write_str("partition has no directory on disk"),
            Self::NoOffsetDir { kind } => {
                write!(f, "partition has no {kind:?} offsets directory")
            }
            Self::OpOutOfRange { commit_op, max } => {
                write!(f, "transfer at op {commit_op} is past the largest op {max}")
            }
            Self::StaleTransfer {
                commit_op,
                commit_min,
            } => write!(
                f,
                "transfer at op {commit_op} is below the local commit point {commit_min}"
            ),
            Self::FrontierNotDurable { frontier } => write!(
                f,
                "could not record the incoming offset frontier {frontier} before the swap"
            ),
            Self::OfferRewindsDurableData {
                offer_next_offset,
                local_next_offset,
            } => write!(
                f,
                "offer frontier {offer_next_offset} is below this replica's next offset {local_next_offset}; installing it would rewind the offset space"
            ),
            Self::OffsetPersistence { path, source } => write!(
                f,
                "consumer offset persistence failed at {}: {source}",
                path.display()
            ),
            Self::Offsets(source) => write!(f, "consumer-offsets artifact rejected: {source}"),
            Self::DuplicateSegment { start_offset } => {
                write!(f, "two staged segments start at offset {start_offset}")
            }
            Self::SegmentSetHole {
                previous_end,
                next_start,
            } => write!(
                f,
                "staged segments leave a hole: one ends at {previous_end}, the next starts at {next_start}"
            ),
            Self::SwapIo { path, source } => {
                write!(f, "swap failed at {}: {source}", path.display())
            }
            Self::SegmentOpen { path, source } => write!(
                f,
                "reopening installed segment {} failed: {source}",
                path.display()
            ),
            Self::Fenced { reason } => write!(f, "partition is fenced: {reason}"),
            Self::PurgeGenerationBehind { offered, local } => write!(
                f,
                "offer purge generation {offered} is below the local generation {local}"
            ),
            Self::PurgeGenerationNotDurable {
                generation,
                path,
                source,
            } => write!(
                f,
                "recording purge generation {generation} in {} failed: {source}",
                path.display()
            ),
            Self::Dedup(source) => write!(f, "offered dedup slice refused: {source}"),
            Self::AlreadyInstalling => {
                f.write_str("an install is already in flight on this partition")
            }
            Self::NotInstalling => f.write_str("no install is in flight on this partition"),
            Self::ConvergeFailed { source, frontier } => write!(
                f,
                "converging after a failed install failed at frontier {frontier}; the partition must be fenced: {source}"
            ),
        }
    }
}

impl std::error::Error for PartitionInstallError {}

impl From<ConsumerOffsetsWireError> for PartitionInstallError {
    fn from(source: ConsumerOffsetsWireError) -> Self {
        Self::Offsets(source)
    }
}
