//! The metadata plane's write-ahead log: prepare frames appended to one
//! file, each made durable before the prepare is acknowledged.
//!
//! Entries are whole prepare frames (`[256-byte header][body]`) back to
//! back with no padding; each carries its identity checksum, its body
//! checksum and its parent's identity, so the file is a verifiable hash
//! chain. An in-memory index remembers where the most recent ops
//! (`slots`, default 1,024) sit.
//!
//! # Boot
//!
//! The file is walked from the start, verifying each entry (header, size,
//! identity, body checksum, consecutive op, parent chain). At the first
//! entry that fails:
//!
//! - if any complete, valid prepare lies after the damage, the damage is
//!   **interior corruption**: boot is refused with the file offset, because
//!   truncating there would silently drop acknowledged prepares;
//! - otherwise it is a **torn tail** (the last, unacknowledged append): the
//!   file is physically truncated there and the truncation synced, as long
//!   as the tail is no longer than one entry can be.
//!
//! One entry per sync makes "the torn tail is at most the last entry" true.
//! [`MetadataWal::append_batch`] (group commit) syncs several entries at
//! once; a crash that lands a later entry of a batch but not an earlier one
//! then reads as interior corruption and refuses boot — a false alarm that
//! fails safe, never a silent loss. The group size is bounded by the caller.

use common::{GroupId, Op, ReplicaId};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use consensus::header::{
    CommandHeader, FrameHeader, HEADER_SIZE, HeaderError, PrepareCommand, decode_frame, peek_size,
};
use storage::fs::{BufResult, Fs, FsFile, OpenOptions};

/// Default number of recent ops the in-memory index covers.
pub const WAL_SLOTS_DEFAULT: usize = 1024;
/// Largest entry (frame) the WAL accepts; a larger `size` is corruption.
pub const WAL_ENTRY_SIZE_MAX: u32 = 64 * 1024 * 1024;

/// What boot recovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WalRecovery {
    /// Valid entries kept.
    pub entries: u64,
    /// The first op in the file, if any.
    pub first_op: Option<Op>,
    /// The last op in the file, if any.
    pub last_op: Option<Op>,
    /// Bytes of torn tail truncated away.
    pub truncated_bytes: u64,
}

/// Why the WAL refused to open or to append.
#[derive(Debug)]
pub enum WalError {
    /// An I/O error on the WAL file.
    Io {
        /// The file.
        path: PathBuf,
        /// The file offset concerned.
        offset: u64,
        /// The error.
        source: io::Error,
    },
    /// Damage followed by a valid entry: refusing to truncate acknowledged
    /// prepares.
    InteriorCorruption {
        /// The file.
        path: PathBuf,
        /// Where the first damaged entry starts.
        offset: u64,
        /// Where the next valid entry starts.
        next_valid: u64,
        /// What was wrong at `offset`.
        reason: EntryDamage,
    },
    /// A damaged tail longer than any single entry.
    TornTailTooLarge {
        /// The file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// Bytes from there to the end of the file.
        len: u64,
    },
    /// The frame offered to `append` is not a valid prepare.
    InvalidPrepare(HeaderError),
    /// The frame offered to `append` is not a Prepare command.
    NotAPrepare,
    /// The prepare's op does not follow the WAL head.
    NotNextOp {
        /// The op expected.
        expected: Op,
        /// The op offered.
        op: Op,
    },
    /// The prepare does not chain to the head's identity.
    ParentMismatch {
        /// The op offered.
        op: Op,
    },
    /// An earlier write or sync failed; the file's tail is unknown until
    /// the WAL is reopened (which repairs it).
    Poisoned {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io {
                path,
                offset,
                source,
            } => write!(f, "WAL I/O at {}:{offset}: {source}", path.display()),
            Self::InteriorCorruption {
                path,
                offset,
                next_valid,
                reason,
            } => write!(
                f,
                "WAL {} is corrupt at offset {offset} ({reason}) with a valid entry at {next_valid}; refusing to truncate acknowledged prepares",
                path.display()
            ),
            Self::TornTailTooLarge { path, offset, len } => write!(
                f,
                "WAL {} has {len} damaged bytes from offset {offset}, more than one entry can be",
                path.display()
            ),
            Self::InvalidPrepare(e) => write!(f, "not a valid prepare: {e}"),
            Self::NotAPrepare => f.write_str("the WAL holds only Prepare frames"),
            Self::NotNextOp { expected, op } => {
                write!(
                    f,
                    "op {op} does not follow the WAL head (expected {expected})"
                )
            }
            Self::ParentMismatch { op } => write!(f, "op {op} does not chain to the WAL head"),
            Self::Poisoned { path } => write!(
                f,
                "WAL {} failed an earlier write; reopen it to repair the tail",
                path.display()
            ),
        }
    }
}

impl std::error::Error for WalError {}

/// What made an entry unusable during the boot walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryDamage {
    /// The file ends inside the entry.
    Incomplete,
    /// The frame does not decode.
    Frame(HeaderError),
    /// A frame other than a Prepare.
    NotAPrepare,
    /// The op does not follow the previous entry's.
    OpGap {
        /// The op expected.
        expected: Op,
        /// The op found.
        op: Op,
    },
    /// The parent is not the previous entry's identity.
    ChainBreak {
        /// The op found.
        op: Op,
    },
}

impl fmt::Display for EntryDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Incomplete => f.write_str("entry runs past the end of the file"),
            Self::Frame(e) => write!(f, "{e}"),
            Self::NotAPrepare => f.write_str("not a Prepare frame"),
            Self::OpGap { expected, op } => write!(f, "op {op} where {expected} was expected"),
            Self::ChainBreak { op } => write!(f, "op {op} does not chain to its predecessor"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    op: u64,
    checksum: u128,
    position: u64,
    size: u32,
}

/// A validated prepare: its header fields the WAL checks.
fn parse_prepare(frame: &[u8]) -> Result<(u64, u128, u128), EntryDamage> {
    let decoded = decode_frame(frame, WAL_ENTRY_SIZE_MAX).map_err(EntryDamage::Frame)?;
    match decoded.header.command {
        CommandHeader::Prepare(PrepareCommand { op, parent, .. }) => {
            Ok((op.0, decoded.header.checksum, parent))
        }
        _ => Err(EntryDamage::NotAPrepare),
    }
}

/// The entry at the start of `bytes`, checked against its predecessor.
fn entry_at(bytes: &[u8], prev: Option<(u64, u128)>) -> Result<(Slot, u128), EntryDamage> {
    let Some(head) = bytes.first_chunk::<HEADER_SIZE>() else {
        return Err(EntryDamage::Incomplete);
    };
    // A whole header holds the size field; were it missing, 0 would be
    // refused just below as smaller than a header.
    let size = peek_size(head).unwrap_or(0);
    if (size as usize) < HEADER_SIZE || size > WAL_ENTRY_SIZE_MAX {
        return Err(EntryDamage::Frame(HeaderError::SizeBelowHeader { size }));
    }
    let Some(frame) = bytes.get(..size as usize) else {
        return Err(EntryDamage::Incomplete);
    };
    let (op, checksum, parent) = parse_prepare(frame)?;
    if let Some((prev_op, prev_checksum)) = prev {
        if op != prev_op + 1 {
            return Err(EntryDamage::OpGap {
                expected: Op(prev_op + 1),
                op: Op(op),
            });
        }
        if parent != prev_checksum {
            return Err(EntryDamage::ChainBreak { op: Op(op) });
        }
    }
    Ok((
        Slot {
            op,
            checksum,
            position: 0,
            size,
        },
        parent,
    ))
}

/// The metadata WAL over one file.
pub struct MetadataWal<F: Fs> {
    path: PathBuf,
    file: F::File,
    end: u64,
    slots: usize,
    index: VecDeque<Slot>,
    head: Option<(u64, u128)>,
    poisoned: bool,
}

impl<F: Fs> fmt::Debug for MetadataWal<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataWal")
            .field("path", &self.path)
            .field("end", &self.end)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl<F: Fs> MetadataWal<F> {
    /// Opens (creating if absent) the WAL at `path`, walks it, truncates a
    /// torn tail, and refuses interior corruption.
    pub async fn open(fs: &F, path: &Path, slots: usize) -> Result<(Self, WalRecovery), WalError> {
        let (file, bytes) = open_and_read(fs, path).await?;
        let io_err = |offset: u64| wal_io(path, offset);
        let slots = slots.max(1);
        let mut index = VecDeque::with_capacity(slots);
        let mut recovery = WalRecovery::default();
        let mut head = None;
        let mut pos = 0usize;
        while pos < bytes.len() {
            match entry_at(&bytes[pos..], head) {
                Ok((mut slot, _)) => {
                    slot.position = pos as u64;
                    head = Some((slot.op, slot.checksum));
                    recovery.first_op.get_or_insert(Op(slot.op));
                    recovery.last_op = Some(Op(slot.op));
                    recovery.entries += 1;
                    if index.len() == slots {
                        index.pop_front();
                    }
                    index.push_back(slot);
                    pos += slot.size as usize;
                }
                Err(reason) => {
                    if let Some(next_valid) = find_valid_entry_after(&bytes, pos) {
                        return Err(WalError::InteriorCorruption {
                            path: path.to_path_buf(),
                            offset: pos as u64,
                            next_valid: next_valid as u64,
                            reason,
                        });
                    }
                    let tail = (bytes.len() - pos) as u64;
                    if tail > u64::from(WAL_ENTRY_SIZE_MAX) {
                        return Err(WalError::TornTailTooLarge {
                            path: path.to_path_buf(),
                            offset: pos as u64,
                            len: tail,
                        });
                    }
                    tracing::warn!(
                        path = %path.display(),
                        offset = pos,
                        bytes = tail,
                        reason = %reason,
                        "truncating the torn tail of the metadata WAL"
                    );
                    file.set_len(pos as u64).await.map_err(io_err(pos as u64))?;
                    file.sync_data().await.map_err(io_err(pos as u64))?;
                    recovery.truncated_bytes = tail;
                    break;
                }
            }
        }
        Ok((
            Self {
                path: path.to_path_buf(),
                file,
                end: pos as u64,
                slots,
                index,
                head,
                poisoned: false,
            },
            recovery,
        ))
    }

    /// The last op in the WAL and its identity.
    pub const fn head(&self) -> Option<(u64, u128)> {
        self.head
    }

    /// Bytes in the file.
    pub const fn len_bytes(&self) -> u64 {
        self.end
    }

    fn check_next(&self, frame: &[u8], prev: Option<(u64, u128)>) -> Result<Slot, WalError> {
        let decoded = decode_frame(frame, WAL_ENTRY_SIZE_MAX).map_err(WalError::InvalidPrepare)?;
        let CommandHeader::Prepare(p) = decoded.header.command else {
            return Err(WalError::NotAPrepare);
        };
        if let Some((op, checksum)) = prev {
            if p.op.0 != op + 1 {
                return Err(WalError::NotNextOp {
                    expected: Op(op + 1),
                    op: p.op,
                });
            }
            if p.parent != checksum {
                return Err(WalError::ParentMismatch { op: p.op });
            }
        }
        Ok(Slot {
            op: p.op.0,
            checksum: decoded.header.checksum,
            position: 0,
            size: decoded.header.size,
        })
    }

    /// Appends one prepare frame and syncs it: durable when this returns.
    pub async fn append(&mut self, frame: Vec<u8>) -> Result<(), WalError> {
        self.append_batch(vec![frame]).await
    }

    /// Appends several prepares with one write and one sync (group commit):
    /// all are durable when this returns. They must continue the chain in
    /// order. Nothing is written if any is invalid.
    pub async fn append_batch(&mut self, frames: Vec<Vec<u8>>) -> Result<(), WalError> {
        if self.poisoned {
            return Err(WalError::Poisoned {
                path: self.path.clone(),
            });
        }
        let mut head = self.head;
        let mut slots = Vec::with_capacity(frames.len());
        let mut position = self.end;
        for frame in &frames {
            let mut slot = self.check_next(frame, head)?;
            slot.position = position;
            position += u64::from(slot.size);
            head = Some((slot.op, slot.checksum));
            slots.push(slot);
        }
        if slots.is_empty() {
            return Ok(());
        }
        let buf: Vec<u8> = if frames.len() == 1 {
            frames.into_iter().next().unwrap_or_default()
        } else {
            frames.concat()
        };
        let start = self.end;
        let BufResult(res, _) = self.file.write_all_at(buf, start).await;
        let res = match res {
            Ok(()) => self.file.sync_data().await,
            Err(e) => Err(e),
        };
        if let Err(source) = res {
            // The tail is unknown now: refuse further appends until a
            // reopen walks and repairs it.
            self.poisoned = true;
            return Err(WalError::Io {
                path: self.path.clone(),
                offset: start,
                source,
            });
        }
        self.end = position;
        self.head = head;
        for slot in slots {
            if self.index.len() == self.slots {
                self.index.pop_front();
            }
            self.index.push_back(slot);
        }
        Ok(())
    }

    /// Reads the frame of `op` if the index still covers it.
    pub async fn read(&self, op: u64) -> Result<Option<Vec<u8>>, WalError> {
        let Some(first) = self.index.front() else {
            return Ok(None);
        };
        let Some(slot) = op
            .checked_sub(first.op)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.index.get(i))
        else {
            return Ok(None);
        };
        let bytes = self
            .file
            .read_exact_at(slot.size as usize, slot.position)
            .await
            .map_err(|source| WalError::Io {
                path: self.path.clone(),
                offset: slot.position,
                source,
            })?;
        Ok(Some(bytes))
    }

    /// The ops the in-memory index covers.
    pub fn indexed_ops(&self) -> Option<(u64, u64)> {
        Some((self.index.front()?.op, self.index.back()?.op))
    }
}

/// The first position after `damaged` where a complete, valid prepare
/// starts (chain not checked: any real entry proves interior damage).
fn find_valid_entry_after(bytes: &[u8], damaged: usize) -> Option<usize> {
    let command = consensus::header::Command::Prepare as u8;
    (damaged + 1..bytes.len().saturating_sub(HEADER_SIZE - 1))
        .filter(|&q| bytes[q + 60] == command)
        .find(|&q| entry_at(&bytes[q..], None).is_ok())
}

/// The error of an I/O step on the WAL at `path`, at file `offset`.
fn wal_io(path: &Path, offset: u64) -> impl FnOnce(io::Error) -> WalError {
    let path = path.to_path_buf();
    move |source| WalError::Io {
        path,
        offset,
        source,
    }
}

/// Opens the WAL at `path` (a new one's name made durable first) and
/// reads it whole.
async fn open_and_read<F: Fs>(fs: &F, path: &Path) -> Result<(F::File, Vec<u8>), WalError> {
    let io_err = |offset: u64| wal_io(path, offset);
    let existed = fs.exists(path).await.map_err(io_err(0))?;
    let file = fs
        .open(path, OpenOptions::create_read_write())
        .await
        .map_err(io_err(0))?;
    if !existed {
        // Make the new name durable before anything is acknowledged
        // from it.
        if let Some(parent) = path.parent() {
            fs.sync_dir(parent).await.map_err(io_err(0))?;
        }
    }
    let len = file.len().await.map_err(io_err(0))?;
    let len_usize = usize::try_from(len).map_err(|_| {
        io_err(0)(io::Error::new(
            io::ErrorKind::InvalidData,
            "WAL larger than memory",
        ))
    })?;
    let bytes = file.read_exact_at(len_usize, 0).await.map_err(io_err(0))?;
    Ok((file, bytes))
}

/// Builds a sealed prepare frame chained to `parent`: for tests, tools and
/// benchmarks.
pub fn build_prepare(op: Op, parent: u128, group: GroupId, body: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster: 1,
        size: 0,
        view: 0,
        replica: ReplicaId(0),
        command: CommandHeader::Prepare(PrepareCommand {
            client: 1,
            parent,
            request_checksum: 0,
            op,
            commit: op - 1,
            timestamp: op.0,
            request: op.0,
            operation: 128,
            group,
            user_id: 0,
        }),
    };
    consensus::header::encode_frame(&header, body)
}
