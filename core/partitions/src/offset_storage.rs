//! Consumer offsets and the purge generation on disk.
//!
//! Each consumer (`offsets/consumers/{id}`) and consumer group
//! (`offsets/groups/{id}`) has one 40-byte file ([`OffsetRecord`],
//! docs/formats.md §8): the offset, the op whose apply wrote it, the offset
//! it replaced as of the applied point durable at that moment, a flag byte
//! and an xxh3-64 trailer. A file is never rewritten in place: a new record
//! is written to the sibling `{id}.replacing` and data-synced
//! ([`stage_offset_replacement`]), then renamed over the file
//! ([`commit_offset_replacement`]); the directory is synced once per step
//! by the caller, after all of its renames and unlinks. A crash therefore
//! leaves either the old or the new record, never a torn one, and a
//! sibling a crash leaves behind is ignored and swept at boot.
//!
//! **Why a record remembers what it replaced.** A record is durable as
//! soon as its op is applied, but the superblock's applied point, which a
//! restarted replica of a group resumes from, is recorded later. If every
//! replica restarts (or more than f fail), the group may never learn that
//! op again: a census starts from the longest recorded applied point and
//! gives later op numbers to other requests. A record written by an op
//! above the recorded point is therefore rolled back at boot to the value
//! it replaced (`before`), and the op, if the group still holds it, is
//! applied again by repair. Writes and records never overlap (both run
//! under the partition's `&mut self`) and a record names the applied op, so
//! one level of history is enough; see `offsets.rs`.
//!
//! `purge.gen` in the partition directory holds the purge generation and
//! the partition incarnation it belongs to, replaced the same way.

use common::{Offset, Op};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use common::le_cursor::{LeField, tiles};
use storage::fs::{BufResult, FileKind, Fs, FsFile, OpenOptions};
use xxhash_rust::xxh3::xxh3_64;

/// Suffix of the sibling a replacement is staged in.
pub const REPLACEMENT_SUFFIX: &str = ".replacing";
/// File name of the purge generation in the partition directory.
pub const PURGE_GENERATION_FILE: &str = "purge.gen";
/// Length of a consumer-offset record.
pub const OFFSET_RECORD_LEN: usize = 40;
/// Length of a record written by versions before the rollback fields: the
/// offset and its checksum.
pub const OFFSET_RECORD_LEN_V1: usize = 16;
/// Length of a bare, unchecksummed record written by older versions.
pub const OFFSET_RECORD_LEN_LEGACY: usize = 8;

/// Flag bit: the record holds an offset (clear: a delete's tombstone).
const FLAG_PRESENT: u8 = 1;
/// Flag bit: an offset was in effect before the record's op.
const FLAG_BEFORE: u8 = 2;

/// The fields of a consumer-offset record (docs/formats.md §8), each
/// declared once for the encoder and the decoder.
mod record {
    use std::ops::Range;

    use common::le_cursor::{LeField, tiles};

    pub(super) const OFFSET: LeField<u64> = LeField::at(0);
    pub(super) const OP: LeField<u64> = LeField::at(8);
    pub(super) const BEFORE: LeField<u64> = LeField::at(16);
    pub(super) const FLAGS: LeField<u8> = LeField::at(24);
    pub(super) const RESERVED: Range<usize> = FLAGS.end()..SUM.start();
    /// xxh3-64 of every byte before it.
    pub(super) const SUM: LeField<u64> = LeField::at(32);
    const _: () = assert!(tiles(
        super::OFFSET_RECORD_LEN,
        &[
            OFFSET.range(),
            OP.range(),
            BEFORE.range(),
            FLAGS.range(),
            RESERVED,
            SUM.range()
        ]
    ));
}

/// The fields of the older records: the 16-byte one (offset and its
/// checksum) and the bare 8-byte one (its first field only).
mod record_v1 {
    use common::le_cursor::{LeField, tiles};

    pub(super) const OFFSET: LeField<u64> = LeField::at(0);
    /// xxh3-64 of the offset's bytes.
    pub(super) const SUM: LeField<u64> = LeField::at(8);
    const _: () = assert!(tiles(
        super::OFFSET_RECORD_LEN_V1,
        &[OFFSET.range(), SUM.range()]
    ));
    const _: () = assert!(tiles(super::OFFSET_RECORD_LEN_LEGACY, &[OFFSET.range()]));
}

// The fields of `purge.gen` (docs/formats.md §9).
const PURGE_GENERATION: LeField<u64> = LeField::at(0);
const PURGE_CREATED_REVISION: LeField<u64> = LeField::at(8);
/// xxh3-64 of every byte before it.
const PURGE_SUM: LeField<u64> = LeField::at(16);
const PURGE_RECORD_LEN: usize = PURGE_SUM.end();
const _: () = assert!(tiles(
    PURGE_RECORD_LEN,
    &[
        PURGE_GENERATION.range(),
        PURGE_CREATED_REVISION.range(),
        PURGE_SUM.range()
    ]
));

/// A decoded consumer-offset file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetRecord {
    /// The stored offset; `None` for a tombstone (a delete that a restart
    /// may still have to roll back).
    pub offset: Option<Offset>,
    /// The op whose apply wrote the record; 0 when no restart can roll it
    /// back (installed by a transfer, settled at boot, or written by an
    /// older version).
    pub op: Op,
    /// The offset in effect at the applied point that was durable when
    /// `op` was applied: what a replica restarting from that point rolls
    /// the record back to (`None`: no offset then).
    pub before: Option<Offset>,
}

/// Why a consumer-offset file cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetRecordError {
    /// A length that is not one of the record layouts.
    BadLength {
        /// The file's length.
        len: usize,
    },
    /// The checksum does not match the record.
    ChecksumMismatch {
        /// The offset field as stored.
        offset: u64,
        /// The checksum as stored.
        stored: u64,
    },
    /// Flag bits or reserved bytes this version does not write, or a
    /// value in a field its flag marks absent.
    BadFlags {
        /// The flag byte as stored.
        flags: u8,
    },
}

impl fmt::Display for OffsetRecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadLength { len } => write!(f, "offset file of {len} bytes is not a record"),
            Self::ChecksumMismatch { offset, stored } => write!(
                f,
                "offset {offset} does not match its checksum {stored:#018x}"
            ),
            Self::BadFlags { flags } => write!(
                f,
                "offset record flags {flags:#04x} (or its reserved bytes) are not a known layout"
            ),
        }
    }
}

impl std::error::Error for OffsetRecordError {}

impl OffsetRecord {
    /// A record no restart rolls back: `offset`, op 0, nothing before.
    pub fn settled(offset: Offset) -> Self {
        Self {
            offset: Some(offset),
            op: Op(0),
            before: None,
        }
    }

    /// The 40-byte record.
    pub fn encode(&self) -> [u8; OFFSET_RECORD_LEN] {
        let mut out = [0u8; OFFSET_RECORD_LEN];
        let mut flags = 0;
        if let Some(offset) = self.offset {
            record::OFFSET.put(&mut out, offset.0);
            flags |= FLAG_PRESENT;
        }
        record::OP.put(&mut out, self.op.0);
        if let Some(before) = self.before {
            record::BEFORE.put(&mut out, before.0);
            flags |= FLAG_BEFORE;
        }
        record::FLAGS.put(&mut out, flags);
        let sum = xxh3_64(&out[..record::SUM.start()]);
        record::SUM.put(&mut out, sum);
        out
    }

    /// Decodes a record file's bytes: the current layout, the 16-byte one
    /// before it (offset and checksum) and the bare 8-byte one; the older
    /// two read as settled records.
    pub fn decode(bytes: &[u8]) -> Result<Self, OffsetRecordError> {
        if let Ok(bytes) = <&[u8; OFFSET_RECORD_LEN_LEGACY]>::try_from(bytes) {
            return Ok(Self::settled(Offset(record_v1::OFFSET.get(bytes))));
        }
        if let Ok(bytes) = <&[u8; OFFSET_RECORD_LEN_V1]>::try_from(bytes) {
            let offset = record_v1::OFFSET.get(bytes);
            let stored = record_v1::SUM.get(bytes);
            if xxh3_64(&bytes[..record_v1::SUM.start()]) != stored {
                return Err(OffsetRecordError::ChecksumMismatch { offset, stored });
            }
            return Ok(Self::settled(Offset(offset)));
        }
        let Ok(bytes) = <&[u8; OFFSET_RECORD_LEN]>::try_from(bytes) else {
            return Err(OffsetRecordError::BadLength { len: bytes.len() });
        };
        let offset = record::OFFSET.get(bytes);
        let stored = record::SUM.get(bytes);
        if xxh3_64(&bytes[..record::SUM.start()]) != stored {
            return Err(OffsetRecordError::ChecksumMismatch { offset, stored });
        }
        let flags = record::FLAGS.get(bytes);
        let before = record::BEFORE.get(bytes);
        let unknown = flags & !(FLAG_PRESENT | FLAG_BEFORE) != 0;
        let stray =
            (flags & FLAG_PRESENT == 0 && offset != 0) || (flags & FLAG_BEFORE == 0 && before != 0);
        if unknown || stray || bytes[record::RESERVED].iter().any(|b| *b != 0) {
            return Err(OffsetRecordError::BadFlags { flags });
        }
        Ok(Self {
            offset: (flags & FLAG_PRESENT != 0).then_some(Offset(offset)),
            op: Op(record::OP.get(bytes)),
            before: (flags & FLAG_BEFORE != 0).then_some(Offset(before)),
        })
    }
}

fn replacement_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(REPLACEMENT_SUFFIX);
    path.with_file_name(name)
}

/// The consumer id a replacement sibling's file name belongs to, or `None`
/// when the name is not a sibling.
pub fn offset_replacement_id(name: &str) -> Option<u32> {
    name.strip_suffix(REPLACEMENT_SUFFIX)?.parse().ok()
}

/// Whether a file name in an offsets directory is one this code writes:
/// a consumer id (`{id}`, the name boot loads) or its replacement sibling
/// (`{id}.replacing`). Anything else is left alone by every sweep (an
/// operator's note, another tool's file), as boot leaves it.
pub fn is_owned_offset_file(name: &str) -> bool {
    name.parse::<u32>().is_ok() || offset_replacement_id(name).is_some()
}

async fn write_synced<F: Fs>(fs: &F, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
    let file = fs
        .open(path, OpenOptions::create_read_write().truncate(true))
        .await?;
    let BufResult(res, _) = file.write_all_at(bytes, 0).await;
    res?;
    file.sync_data().await
}

/// Writes `record` to the replacement sibling of `path` and data-syncs it.
/// Nothing a reader or boot trusts changes until the commit.
pub async fn stage_offset_replacement<F: Fs>(
    fs: &F,
    path: &Path,
    record: OffsetRecord,
) -> io::Result<()> {
    write_synced(fs, &replacement_path(path), record.encode().to_vec()).await
}

/// Renames the staged sibling over `path`. Durable once the caller syncs
/// the directory.
pub async fn commit_offset_replacement<F: Fs>(fs: &F, path: &Path) -> io::Result<()> {
    fs.rename(&replacement_path(path), path).await
}

/// Removes a staged sibling (best effort: boot sweeps any left behind).
pub async fn discard_offset_replacement<F: Fs>(fs: &F, path: &Path) {
    let sibling = replacement_path(path);
    if let Err(error) = fs.remove_file(&sibling).await
        && error.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %sibling.display(), %error, "could not remove a staged offset replacement");
    }
}

/// Unlinks an offset file. `Ok(true)` when it existed, `Ok(false)` when it
/// did not. Durable once the caller syncs the directory.
pub async fn delete_persisted_offset<F: Fs>(fs: &F, path: &Path) -> io::Result<bool> {
    match fs.remove_file(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What boot found in one offsets directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredOffsets {
    /// Usable records (tombstones included), ascending by id.
    pub offsets: Vec<(u32, OffsetRecord)>,
    /// Files that were torn or corrupt: removed by [`load_offsets_dir`]
    /// (the consumer restarts from its default position), left in place
    /// by [`scan_offsets_dir`] for the caller to decide.
    pub corrupt: Vec<PathBuf>,
    /// Replacement siblings swept.
    pub swept_siblings: Vec<PathBuf>,
}

/// Loads an offsets directory at boot: each `{id}` file decoded; torn or
/// corrupt files and leftover `{id}.replacing` siblings removed (with a
/// warning) and the directory synced if anything was removed. A missing
/// directory holds no offsets. Names that are neither are left alone.
pub async fn load_offsets_dir<F: Fs>(fs: &F, dir: &Path) -> io::Result<StoredOffsets> {
    let stored = scan_offsets_dir(fs, dir).await?;
    remove_offset_files(fs, dir, &stored.corrupt).await?;
    Ok(stored)
}

/// Removes `paths` (files of the offsets directory `dir`) and syncs the
/// directory once if there were any.
pub async fn remove_offset_files<F: Fs>(fs: &F, dir: &Path, paths: &[PathBuf]) -> io::Result<()> {
    for path in paths {
        delete_persisted_offset(fs, path).await?;
    }
    if !paths.is_empty() {
        fs.sync_dir(dir).await?;
    }
    Ok(())
}

/// Like [`load_offsets_dir`], but a torn or corrupt record is only
/// reported, never removed: a replica of a group must first record that
/// its history is missing (the record is gone for good once removed, and
/// a peer still holds it). Leftover siblings are swept as by the load.
pub async fn scan_offsets_dir<F: Fs>(fs: &F, dir: &Path) -> io::Result<StoredOffsets> {
    let entries = match fs.read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(StoredOffsets::default()),
        Err(e) => return Err(e),
    };
    let mut out = StoredOffsets::default();
    for entry in entries {
        if entry.kind != FileKind::File {
            continue;
        }
        let Some(name) = entry.name_str() else {
            continue;
        };
        let path = dir.join(name);
        if offset_replacement_id(name).is_some() {
            out.swept_siblings.push(path);
            continue;
        }
        let Ok(id) = name.parse::<u32>() else {
            tracing::warn!(path = %path.display(), "ignoring a foreign file in an offsets directory");
            continue;
        };
        let file = fs.open(&path, OpenOptions::read_only()).await?;
        let len = file.len().await?;
        // Bounded before reading: anything longer is not a record.
        let decoded = if len > OFFSET_RECORD_LEN as u64 {
            Err(OffsetRecordError::BadLength {
                len: usize::try_from(len).unwrap_or(usize::MAX),
            })
        } else {
            OffsetRecord::decode(&file.read_exact_at(len as usize, 0).await?)
        };
        match decoded {
            Ok(record) => out.offsets.push((id, record)),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "an unusable consumer offset file");
                out.corrupt.push(path);
            }
        }
    }
    remove_offset_files(fs, dir, &out.swept_siblings).await?;
    out.offsets.sort_unstable_by_key(|(id, _)| *id);
    Ok(out)
}

/// The durable purge generation of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeGeneration {
    /// How many purges this partition has applied.
    pub generation: u64,
    /// The partition incarnation the record belongs to.
    pub created_revision: u64,
}

/// Makes `generation` durable in `dir/purge.gen`: sibling written and
/// synced, renamed over the file, directory synced. Returns only once
/// durable.
pub async fn persist_purge_generation<F: Fs>(
    fs: &F,
    dir: &Path,
    record: PurgeGeneration,
) -> io::Result<()> {
    let path = dir.join(PURGE_GENERATION_FILE);
    let mut bytes = vec![0u8; PURGE_RECORD_LEN];
    PURGE_GENERATION.put(&mut bytes, record.generation);
    PURGE_CREATED_REVISION.put(&mut bytes, record.created_revision);
    let sum = xxh3_64(&bytes[..PURGE_SUM.start()]);
    PURGE_SUM.put(&mut bytes, sum);
    let sibling = replacement_path(&path);
    write_synced(fs, &sibling, bytes).await?;
    fs.rename(&sibling, &path).await?;
    fs.sync_dir(dir).await
}

/// Reads `dir/purge.gen` for the incarnation `created_revision`.
///
/// Absent, or a record of another incarnation (a dead partition's directory
/// never deleted): generation 0. A record that is present but unreadable is
/// an error, and so is any I/O error: reading 0 there would re-apply a purge
/// over data written after it.
pub async fn read_purge_generation<F: Fs>(
    fs: &F,
    dir: &Path,
    created_revision: u64,
) -> io::Result<u64> {
    let path = dir.join(PURGE_GENERATION_FILE);
    let file = match fs.open(&path, OpenOptions::read_only()).await {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let len = file.len().await?;
    let wrong_length = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {len} bytes, not a {PURGE_RECORD_LEN}-byte record",
                path.display()
            ),
        )
    };
    if len != PURGE_RECORD_LEN as u64 {
        return Err(wrong_length());
    }
    let bytes = file.read_exact_at(PURGE_RECORD_LEN, 0).await?;
    let Ok(bytes) = <[u8; PURGE_RECORD_LEN]>::try_from(bytes) else {
        return Err(wrong_length());
    };
    if xxh3_64(&bytes[..PURGE_SUM.start()]) != PURGE_SUM.get(&bytes) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} fails its checksum", path.display()),
        ));
    }
    if PURGE_CREATED_REVISION.get(&bytes) != created_revision {
        return Ok(0);
    }
    Ok(PURGE_GENERATION.get(&bytes))
}
