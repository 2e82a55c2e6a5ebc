//! replog storage: everything between a partition and its bytes on disk.
//!
//! - [`fs`]: the filesystem abstraction ([`fs::Fs`], [`fs::FsFile`]) with
//!   the real compio implementation and the deterministic simulator.
//! - [`batch`]: the message batch codec (wire = replication = disk).
//! - [`index`]: the sparse 24-byte-entry segment index.
//! - [`segment`]: segment file names, the log writer, batch walks and reads.
//! - [`log`]: [`SegmentedLog`], sealed segments plus one active.
//! - [`recovery`]: the boot walk of a partition directory.
//!
//! The byte layouts are documented in `docs/formats.md` §12.

pub mod batch;
pub mod error;
pub mod fs;
pub mod index;
pub mod log;
pub mod recovery;
pub mod segment;

pub use batch::{BatchBuilder, BatchError, BatchHeader, BatchView, Integrity, MessageView};
pub use error::{RecoveryError, StorageError};
pub use fs::{Fs, FsFile, OpenOptions, RealFs, SimFs};
pub use log::{Appended, LogConfig, SegmentedLog};
pub use recovery::{RecoveryConfig, RecoveryReport, recover_partition, recover_segment};
pub use segment::{ReadBatches, SegmentMeta};
