//! replog storage: everything between a partition and its bytes on disk.
//!
//! - [`fs`]: the filesystem abstraction ([`fs::Fs`], [`fs::FsFile`]) with
//!   the real compio implementation and the deterministic simulator.
//! - `batch`: the message batch codec (wire = replication = disk):
//!   [`BatchView`], [`BatchBuilder`], [`stamp`].
//! - `index`: the sparse 24-byte-entry segment index ([`IndexEntry`]).
//! - `segment`: segment file names, the log writer, batch walks and reads.
//! - `log`: [`SegmentedLog`], sealed segments plus one active; start here.
//! - `recovery`: the boot walk of a partition directory
//!   ([`recover_partition`]).
//!
//! The byte layouts are documented in `docs/formats.md` §12.

mod batch;
mod error;
pub mod fs;
mod index;
mod log;
mod recovery;
mod segment;

pub use batch::{
    BATCH_HEADER_SIZE, BATCH_LENGTH_MAX_DEFAULT, BatchBuilder, BatchError, BatchHeader,
    BatchStream, BatchView, Integrity, MessageView, Messages, stamp,
};
pub use error::{RecoveryError, StorageError};
pub use fs::{Fs, FsFile, OpenOptions, RealFs, SimFs};
pub use index::{
    INDEX_STRIDE_BYTES_DEFAULT, IndexEntry, IndexPolicy, decode_entries, encode_entries,
};
pub use log::{Appended, LogConfig, SEGMENT_SIZE_BYTES_DEFAULT, SegmentedLog};
pub use recovery::{
    RecoveredSegment, RecoveryConfig, RecoveryReport, TruncatedTail, recover_partition,
    recover_segment,
};
pub use segment::{
    ReadBatches, STAGING_SUFFIX, SegmentFileName, SegmentMeta, WalkStop, index_file_name,
    log_file_name, parse_file_name,
};
