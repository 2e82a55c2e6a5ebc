//! The state-transfer error taxonomy. Each refusal and failure says
//! whether retrying can help ([`PartitionTransferUnavailable::transient`],
//! [`SegmentLoadError::transient`]): a requester charges its re-arm backoff
//! only for faults, never for "not right now".

use common::{ConsumerKind, Offset};
use std::fmt;
use std::io;
use std::path::PathBuf;

use super::walk::SegmentWalkError;
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
