//! Errors of the storage plane: [`StorageError`] for appends and reads of
//! a live log, [`RecoveryError`] for the boot walk of a partition directory.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::batch::BatchError;
use crate::fs::is_local_disk_fault;

/// A failure while appending to or reading from a segmented log.
#[derive(Debug)]
pub enum StorageError {
    /// The filesystem refused a call.
    Io {
        /// What was being done (`"append"`, `"read"`, `"sync"`…).
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error, with its errno.
        source: io::Error,
    },
    /// Stored bytes failed validation (bit rot, a foreign write): the
    /// segment is corrupt at `position`.
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte position of the batch that failed.
        position: u64,
        /// What was wrong with it.
        source: BatchError,
    },
    /// A batch to append does not start at the log's next offset.
    OffsetMismatch {
        /// The log's next offset.
        expected: u64,
        /// The batch's base offset.
        actual: u64,
    },
    /// A batch to append failed validation.
    InvalidBatch(BatchError),
    /// A truncation point is not a batch boundary of the segment.
    NotABatchBoundary {
        /// The segment file.
        path: PathBuf,
        /// The requested position.
        position: u64,
    },
    /// No segment starts at the requested offset.
    NoSuchSegment {
        /// The requested start offset.
        start_offset: u64,
    },
    /// A previous write failed mid-way; the log refuses further appends
    /// until it is reopened (recovery trims whatever landed).
    Poisoned,
}

impl StorageError {
    /// True when the failure is a fault of this node's disk (EIO, ENOSPC,
    /// EACCES) rather than bad input or a missing file.
    pub fn is_local_fault(&self) -> bool {
        match self {
            Self::Io { source, .. } => is_local_disk_fault(source),
            _ => false,
        }
    }

    /// True when the disk (or the user's quota) is full: ENOSPC or
    /// EDQUOT. The log is not poisoned by it where it could undo what
    /// landed (an append is rolled back, pending index entries stay
    /// pending, a rotation is left undone), so the same call may be
    /// retried once space is freed.
    pub fn is_no_space(&self) -> bool {
        match self {
            Self::Io { source, .. } => crate::fs::is_no_space(source),
            _ => false,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { op, path, source } => {
                write!(f, "{op} failed on {}: {source}", path.display())
            }
            Self::Corrupt {
                path,
                position,
                source,
            } => write!(
                f,
                "segment {} is corrupt at byte {position}: {source}",
                path.display()
            ),
            Self::OffsetMismatch { expected, actual } => write!(
                f,
                "batch starts at offset {actual} but the log's next offset is {expected}"
            ),
            Self::InvalidBatch(e) => write!(f, "invalid batch: {e}"),
            Self::NotABatchBoundary { path, position } => write!(
                f,
                "byte {position} of {} is not a batch boundary",
                path.display()
            ),
            Self::NoSuchSegment { start_offset } => {
                write!(f, "no segment starts at offset {start_offset}")
            }
            Self::Poisoned => f.write_str("an earlier write failed; reopen the log to recover"),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Corrupt { source, .. } | Self::InvalidBatch(source) => Some(source),
            _ => None,
        }
    }
}

/// Why a partition directory could not be recovered. Every variant except
/// [`RecoveryError::Io`] means the directory's contents are inconsistent:
/// the partition must be fenced (alone), never silently truncated.
#[derive(Debug)]
pub enum RecoveryError {
    /// The filesystem refused a call.
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error, with its errno.
        source: io::Error,
    },
    /// Offsets are missing between two segments.
    Hole {
        /// Last offset held by the earlier segment.
        previous_end: u64,
        /// First offset of the later segment.
        next_start: u64,
    },
    /// A segment other than the last holds no batch.
    EmptyNonTailSegment {
        /// Its start offset.
        start: u64,
    },
    /// Consecutive segments overlap (the later starts at or before the
    /// earlier's last offset).
    Overlap {
        /// Last offset held by the earlier segment.
        previous_end: u64,
        /// First offset of the later segment.
        next_start: u64,
    },
    /// A segment's first batch is whole and verifies but does not start at
    /// the offset in the file name (a misplaced file, not a torn tail).
    SegmentStartMismatch {
        /// The segment file.
        path: PathBuf,
        /// The offset named by the file.
        expected: u64,
        /// The batch's base offset.
        found: u64,
    },
}

impl RecoveryError {
    /// True when the failure is a fault of this node's disk.
    pub fn is_local_fault(&self) -> bool {
        match self {
            Self::Io { source, .. } => is_local_disk_fault(source),
            _ => false,
        }
    }

    /// True when the directory is inconsistent and the partition must be
    /// fenced (as opposed to an I/O error that might pass on retry).
    pub fn fences_partition(&self) -> bool {
        !matches!(self, Self::Io { .. })
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { op, path, source } => {
                write!(f, "{op} failed on {}: {source}", path.display())
            }
            Self::Hole {
                previous_end,
                next_start,
            } => write!(
                f,
                "offsets missing between segments: one ends at {previous_end}, the next starts at {next_start}"
            ),
            Self::EmptyNonTailSegment { start } => {
                write!(f, "segment {start} is empty but is not the last segment")
            }
            Self::Overlap {
                previous_end,
                next_start,
            } => write!(
                f,
                "segments overlap: one ends at {previous_end}, the next starts at {next_start}"
            ),
            Self::SegmentStartMismatch {
                path,
                expected,
                found,
            } => write!(
                f,
                "{} is named for offset {expected} but its first batch starts at {found}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for RecoveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
