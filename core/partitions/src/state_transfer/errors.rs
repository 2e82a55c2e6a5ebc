//! The state-transfer error taxonomy. Each refusal and failure says
//! whether retrying can help ([`PartitionTransferUnavailable::transient`],
//! [`SegmentLoadError::transient`]): a requester charges its re-arm backoff
//! only for faults, never for "not right now".

use common::{ConsumerKind, Offset, Op};
use std::fmt;
use std::io;
use std::path::PathBuf;

use super::walk::SegmentWalkError;
use super::wire::ConsumerOffsetsWireError;
use crate::error::PartitionError;

/// Why a partition cannot serve a state-transfer offer right now.
#[derive(Debug)]
pub enum PartitionTransferUnavailable {
    /// Not the caught-up primary of this group (the requester asks again or
    /// elsewhere).
    NotCaughtUpPrimary,
    /// The partition has no directory on disk to serve from.
    NoPartitionDir,
    /// The partition is itself repairing.
    RepairInProgress,
    /// More offsets of one kind than the artifact may carry.
    ConsumerOffsetsTooLarge {
        /// Consumers or consumer groups.
        kind: ConsumerKind,
        /// How many there are.
        count: usize,
        /// The ceiling.
        max: usize,
    },
    /// A durable offset record is missing from the live map: the snapshot
    /// would not describe what is on disk.
    ConsumerOffsetStateInconsistent {
        /// Consumers or consumer groups.
        kind: ConsumerKind,
        /// The consumer id.
        consumer_id: u32,
    },
    /// The primary by index of a group that has committed nothing: an
    /// empty group is trivially caught up, so this alone tells a real
    /// primary from a view-0 phantom whose data vanished.
    NothingCommitted,
    /// More retained segments than a manifest may list.
    ManifestTooLarge {
        /// Entries needed.
        entries: usize,
        /// The ceiling.
        max: usize,
    },
    /// The segment chain changed (purge, retention, a replaced file) while
    /// the offer's checksums were computed.
    SegmentSetChanged,
    /// This round's share of the checksum pass ran out; the memo keeps the
    /// progress and the next request resumes it.
    OfferBuildInProgress {
        /// Bytes of the live chain hashed so far.
        hashed: u64,
        /// Bytes still to hash.
        remaining: u64,
    },
    /// Flushing the committed prefix before building failed.
    FlushFailed(PartitionError),
    /// A segment the live chain still lists at its planned length is gone
    /// from disk or shorter than that: this node lost data it claims to
    /// hold. Not transient, so requesters charge the failure, back off and
    /// ask another peer instead of re-asking this one forever.
    SegmentMissing {
        /// The segment's base offset.
        start_offset: Offset,
        /// The read error (not found, or a short read).
        source: io::Error,
    },
    /// A segment could not be read on this node.
    SegmentUnreadable {
        /// The segment's base offset.
        start_offset: Offset,
        /// The error.
        source: io::Error,
    },
}

impl PartitionTransferUnavailable {
    /// Whether the refusal means "not right now" (retry without charging a
    /// failure) rather than "this node cannot serve".
    pub const fn transient(&self) -> bool {
        match self {
            Self::NotCaughtUpPrimary
            | Self::RepairInProgress
            | Self::NothingCommitted
            | Self::SegmentSetChanged
            | Self::OfferBuildInProgress { .. } => true,
            Self::NoPartitionDir
            | Self::ConsumerOffsetsTooLarge { .. }
            | Self::ConsumerOffsetStateInconsistent { .. }
            | Self::ManifestTooLarge { .. }
            | Self::FlushFailed(_)
            | Self::SegmentMissing { .. }
            | Self::SegmentUnreadable { .. } => false,
        }
    }
}

impl fmt::Display for PartitionTransferUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotCaughtUpPrimary => f.write_str("not the caught-up primary of this group"),
            Self::NoPartitionDir => f.write_str("partition has no directory on disk"),
            Self::RepairInProgress => f.write_str("partition is itself repairing"),
            Self::ConsumerOffsetsTooLarge { kind, count, max } => write!(
                f,
                "partition holds {count} {kind:?} offsets, past the transfer ceiling of {max}"
            ),
            Self::ConsumerOffsetStateInconsistent { kind, consumer_id } => write!(
                f,
                "durable {kind:?} offset {consumer_id} is missing from the live map"
            ),
            Self::NothingCommitted => f.write_str(
                "primary by index with nothing committed; refusing to serve an empty offer",
            ),
            Self::ManifestTooLarge { entries, max } => write!(
                f,
                "offer needs {entries} manifest entries, past the ceiling of {max}"
            ),
            Self::SegmentSetChanged => {
                f.write_str("segment chain changed while the offer was being built")
            }
            Self::OfferBuildInProgress { hashed, remaining } => write!(
                f,
                "offer checksum pass has hashed {hashed} bytes with {remaining} to go; it resumes on the next request"
            ),
            Self::FlushFailed(source) => {
                write!(f, "flushing the committed prefix failed: {source}")
            }
            Self::SegmentMissing {
                start_offset,
                source,
            } => write!(
                f,
                "segment {start_offset:020}.log is missing or shorter than this node's log records: {source}"
            ),
            Self::SegmentUnreadable {
                start_offset,
                source,
            } => write!(f, "segment {start_offset:020}.log is unreadable: {source}"),
        }
    }
}

impl std::error::Error for PartitionTransferUnavailable {}

/// Refuses an offsets table larger than the transfer ceiling.
pub const fn validate_consumer_offset_transfer_count(
    kind: ConsumerKind,
    count: usize,
    max: usize,
) -> Result<(), PartitionTransferUnavailable> {
    if count <= max {
        Ok(())
    } else {
        Err(PartitionTransferUnavailable::ConsumerOffsetsTooLarge { kind, count, max })
    }
}

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

/// Why a received segment artifact could not be validated or staged.
#[derive(Debug)]
pub enum SpillError {
    /// The partition has no directory on disk.
    NoPartitionDir,
    /// The received bytes do not hash to the manifest entry.
    ManifestChecksum {
        /// The segment's base offset.
        frontier: Offset,
    },
    /// The payload failed its validation walk.
    Walk(SegmentWalkError),
    /// Writing or syncing a staging file failed.
    StagingIo {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for SpillError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPartitionDir => f.write_str("partition has no directory on disk"),
            Self::ManifestChecksum { frontier } => write!(
                f,
                "segment artifact at base offset {frontier} fails its manifest checksum"
            ),
            Self::Walk(source) => write!(f, "{source}"),
            Self::StagingIo { path, source } => {
                write!(f, "staging failed at {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for SpillError {}

impl From<SegmentWalkError> for SpillError {
    fn from(source: SegmentWalkError) -> Self {
        Self::Walk(source)
    }
}

/// Why a served segment could not be loaded for a requester.
#[derive(Debug)]
pub enum SegmentLoadError {
    /// The file is gone or shorter than the entry: out of step with an
    /// offer built earlier (retention raced it). Retryable.
    Stale(io::Error),
    /// The bytes no longer hash to the manifest entry: the offer is stale.
    ChecksumMismatch,
    /// A fault of this node's disk (EIO, EACCES): peers should stop asking.
    LocalFault(io::Error),
}

impl SegmentLoadError {
    /// Classifies an I/O error by cause: EIO and permission errors are
    /// local faults, everything else (missing file, short read) is stale.
    /// The raw errno is checked because std maps EIO to no specific kind.
    pub fn classify(source: io::Error) -> Self {
        const EIO: i32 = 5;
        if source.raw_os_error() == Some(EIO) || source.kind() == io::ErrorKind::PermissionDenied {
            Self::LocalFault(source)
        } else {
            Self::Stale(source)
        }
    }

    /// Whether the requester should retry without charging a failure.
    pub const fn transient(&self) -> bool {
        matches!(self, Self::Stale(_) | Self::ChecksumMismatch)
    }
}

impl fmt::Display for SegmentLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stale(source) => {
                write!(f, "served segment no longer matches the offer: {source}")
            }
            Self::ChecksumMismatch => {
                f.write_str("served segment bytes no longer hash to the manifest entry")
            }
            Self::LocalFault(source) => {
                write!(f, "served segment is unreadable on this node: {source}")
            }
        }
    }
}

impl std::error::Error for SegmentLoadError {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn given_offset_count_above_transfer_ceiling_when_validated_should_reject() {
        assert!(validate_consumer_offset_transfer_count(ConsumerKind::Consumer, 4, 4).is_ok());
        assert!(matches!(
            validate_consumer_offset_transfer_count(ConsumerKind::ConsumerGroup, 5, 4),
            Err(PartitionTransferUnavailable::ConsumerOffsetsTooLarge {
                kind: ConsumerKind::ConsumerGroup,
                count: 5,
                max: 4
            })
        ));
        let error = validate_consumer_offset_transfer_count(ConsumerKind::Consumer, 5, 4)
            .expect_err("above the ceiling");
        assert!(
            !error.transient(),
            "a table that cannot fit will not heal by retrying"
        );
    }

    #[test]
    fn given_each_refusal_when_classified_should_match_retry_policy() {
        use PartitionTransferUnavailable as U;
        for transient in [
            U::NotCaughtUpPrimary,
            U::RepairInProgress,
            U::NothingCommitted,
            U::SegmentSetChanged,
            U::OfferBuildInProgress {
                hashed: 1,
                remaining: 2,
            },
        ] {
            assert!(transient.transient(), "{transient}");
        }
        for fault in [
            U::NoPartitionDir,
            U::ManifestTooLarge {
                entries: 70_000,
                max: 65_536,
            },
            U::ConsumerOffsetStateInconsistent {
                kind: ConsumerKind::Consumer,
                consumer_id: 3,
            },
            U::SegmentUnreadable {
                start_offset: Offset(7),
                source: io::Error::from_raw_os_error(5),
            },
        ] {
            assert!(!fault.transient(), "{fault}");
        }
    }

    #[test]
    fn given_io_errors_when_classified_should_separate_local_faults_from_stale() {
        let eio = SegmentLoadError::classify(io::Error::from_raw_os_error(5));
        assert!(matches!(eio, SegmentLoadError::LocalFault(_)) && !eio.transient());
        let eacces = SegmentLoadError::classify(io::Error::from_raw_os_error(13));
        assert!(matches!(eacces, SegmentLoadError::LocalFault(_)) && !eacces.transient());
        let gone = SegmentLoadError::classify(io::Error::from(io::ErrorKind::NotFound));
        assert!(matches!(gone, SegmentLoadError::Stale(_)) && gone.transient());
        let short = SegmentLoadError::classify(io::Error::from(io::ErrorKind::UnexpectedEof));
        assert!(short.transient());
        assert!(SegmentLoadError::ChecksumMismatch.transient());
    }
}
