//! The receiver's staging files (ST-R2, ST-B2, ST-R3): a `SEGMENT_LOG`
//! artifact streamed chunk by chunk into `{base:020}.log.staging`, its
//! rebuilt index written to `{base:020}.index.staging`, the resume of an
//! interrupted spill from its last synced byte, and the adoption of staged
//! files an earlier session left behind.
//!
//! Nothing here holds an artifact in memory. A [`SegmentSpill`] keeps a
//! running checksum and an incremental [`SegmentWalker`], whose only buffer
//! is the part of a batch header straddling a chunk boundary (at most 256
//! bytes; a straddling batch is checked piece by piece, never carried);
//! each chunk is written at its offset as it lands. The names carry the
//! `.staging` suffix, which boot recovery never loads and always sweeps, so
//! a crash anywhere in here leaves the partition exactly as it was.
//!
//! Durable steps, in order, and the crash each defends against:
//! 1. every [`SpillConfig::sync_interval_bytes`] the log staging file is
//!    data-synced and the synced length recorded: a resume trusts only
//!    bytes a sync covered (unsynced bytes may be lost or kept, a torn
//!    write may have landed half), so it never builds on bytes that were
//!    not durable;
//! 2. at the end, the log is synced before the index is written, the index
//!    is synced, then the directory once: the slot reports `Staged` only
//!    after both names and both contents are durable, so an install that
//!    renames them never renames a name a crash could undo.

use common::Offset;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use consensus::{StateArtifact, StateArtifactHasher};
use storage::encode_entries;
use storage::fs::{BufResult, FileKind, Fs, FsFile, OpenOptions};
use storage::{STAGING_SUFFIX, index_file_name, log_file_name};

use super::errors::SpillError;
use super::walk::{SegmentWalkStats, SegmentWalker};
use crate::install::StagedSegment;

/// Default interval between data syncs of a log staging file (8 MiB): the
/// most a resume re-pulls, and one sync per 32 chunks of 256 KiB.
pub const STAGING_SYNC_INTERVAL_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;

/// Default slice in which a staged prefix is re-read and re-hashed (1 MiB),
/// with a yield to the shard between slices.
pub const REHASH_SLICE_BYTES_DEFAULT: usize = 1024 * 1024;

/// How a spill syncs and re-reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillConfig {
    /// Bytes written between two data syncs of the log staging file.
    pub sync_interval_bytes: u64,
    /// Bytes read per slice when a staged prefix is re-hashed.
    pub rehash_slice_bytes: usize,
}

impl Default for SpillConfig {
    fn default() -> Self {
        Self {
            sync_interval_bytes: STAGING_SYNC_INTERVAL_BYTES_DEFAULT,
            rehash_slice_bytes: REHASH_SLICE_BYTES_DEFAULT,
        }
    }
}

/// The staging names of the segment starting at `start_offset`:
/// `({base:020}.log.staging, {base:020}.index.staging)`.
pub fn staging_paths(dir: &Path, start_offset: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{}{STAGING_SUFFIX}", log_file_name(start_offset))),
        dir.join(format!("{}{STAGING_SUFFIX}", index_file_name(start_offset))),
    )
}

/// What the receiver learned about one validated, staged segment: what the
/// install needs to rename it in and rebuild the in-memory segment without
/// re-reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedSegmentMeta {
    /// Base offset (the manifest entry's frontier).
    pub start_offset: Offset,
    /// Offset of the last message.
    pub end_offset: Offset,
    /// Length of the log, equal to the manifest entry's length.
    pub size_bytes: u64,
    /// Length of the rebuilt index.
    pub index_size_bytes: u64,
    /// Base timestamp of the first batch.
    pub start_timestamp: u64,
    /// Base timestamp of the last batch.
    pub end_timestamp: u64,
    /// Largest base timestamp.
    pub max_timestamp: u64,
    /// `{base:020}.log.staging`.
    pub log_staging: PathBuf,
    /// `{base:020}.index.staging`.
    pub index_staging: PathBuf,
}

/// The install reads a staged segment by the description the spill
/// checked as it wrote it.
impl From<&StagedSegmentMeta> for StagedSegment {
    fn from(meta: &StagedSegmentMeta) -> Self {
        Self {
            start_offset: meta.start_offset,
            end_offset: meta.end_offset,
            size_bytes: meta.size_bytes,
            start_timestamp: meta.start_timestamp,
            end_timestamp: meta.end_timestamp,
            max_timestamp: meta.max_timestamp,
        }
    }
}

impl StagedSegmentMeta {
    fn from_walk(
        entry: &StateArtifact,
        stats: SegmentWalkStats,
        index_size_bytes: u64,
        (log_staging, index_staging): (PathBuf, PathBuf),
    ) -> Self {
        Self {
            start_offset: Offset(base_offset(entry)),
            end_offset: stats.end_offset,
            size_bytes: entry.len,
            index_size_bytes,
            start_timestamp: stats.start_timestamp,
            end_timestamp: stats.end_timestamp,
            max_timestamp: stats.max_timestamp,
            log_staging,
            index_staging,
        }
    }
}

/// Where an interrupted spill can continue: its manifest entry (the whole
/// entry, so a different artifact at the same base offset never matches)
/// and how many of its bytes a sync made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePoint {
    /// The manifest entry being spilled.
    pub entry: StateArtifact,
    /// Bytes of the log staging file covered by a data sync.
    pub synced_len_bytes: u64,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SpillError + '_ {
    move |source| SpillError::StagingIo {
        path: path.to_path_buf(),
        source,
    }
}

/// One `SEGMENT_LOG` artifact being streamed to its staging file.
#[derive(Debug)]
pub struct SegmentSpill<H: FsFile> {
    entry: StateArtifact,
    log_path: PathBuf,
    index_path: PathBuf,
    file: H,
    hasher: StateArtifactHasher,
    walker: SegmentWalker,
    received_len_bytes: u64,
    synced_len_bytes: u64,
    config: SpillConfig,
}

impl<H: FsFile> SegmentSpill<H> {
    /// Starts the spill of `entry` from its first byte, truncating whatever
    /// an earlier attempt left in its staging file.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] when the file cannot be created.
    pub async fn create<F: Fs<File = H>>(
        fs: &F,
        dir: &Path,
        entry: StateArtifact,
        config: SpillConfig,
    ) -> Result<Self, SpillError> {
        let (log_path, index_path) = staging_paths(dir, base_offset(&entry));
        let file = fs
            .open(&log_path, OpenOptions::create_read_write().truncate(true))
            .await
            .map_err(io_error(&log_path))?;
        Ok(Self {
            entry,
            log_path,
            index_path,
            file,
            hasher: StateArtifactHasher::new(),
            walker: SegmentWalker::new(base_offset(&entry)),
            received_len_bytes: 0,
            synced_len_bytes: 0,
            config,
        })
    }

    /// Continues an interrupted spill: re-reads the synced prefix in slices
    /// (yielding between them) to rebuild the checksum and the walk, drops
    /// any unsynced tail, and carries on from there. The prefix is walked
    /// again, so bytes that rotted on disk since are refused here, not
    /// installed. [`PrefixRehash`] does the same in budgeted steps.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] when the file is gone or shorter than the
    /// synced length; [`SpillError::Walk`] when its bytes no longer walk.
    pub async fn resume<F: Fs<File = H>>(
        fs: &F,
        dir: &Path,
        point: ResumePoint,
        config: SpillConfig,
    ) -> Result<Self, SpillError> {
        let mut rehash =
            PrefixRehash::open(fs, dir, point.entry, point.synced_len_bytes, true).await?;
        while !rehash
            .advance(fs, u64::MAX, config.rehash_slice_bytes)
            .await?
        {}
        Self::from_rehash(rehash, config).await
    }

    /// Continues a spill from a completed [`PrefixRehash`] of its synced
    /// prefix (opened writable), cutting any unsynced tail.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] when the tail cannot be cut.
    pub async fn from_rehash(
        rehash: PrefixRehash<H>,
        config: SpillConfig,
    ) -> Result<Self, SpillError> {
        debug_assert!(rehash.done());
        let synced = rehash.hasher.hashed_len_bytes();
        rehash
            .file
            .set_len(synced)
            .await
            .map_err(io_error(&rehash.log_path))?;
        Ok(Self {
            entry: rehash.entry,
            log_path: rehash.log_path,
            index_path: rehash.index_path,
            file: rehash.file,
            hasher: rehash.hasher,
            walker: rehash.walker,
            received_len_bytes: synced,
            synced_len_bytes: synced,
            config,
        })
    }

    /// The manifest entry being spilled.
    pub fn entry(&self) -> &StateArtifact {
        &self.entry
    }

    /// The log staging file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Bytes received (hashed, walked and written) so far.
    pub fn received_len_bytes(&self) -> u64 {
        self.received_len_bytes
    }

    /// Bytes covered by the last data sync.
    pub fn synced_len_bytes(&self) -> u64 {
        self.synced_len_bytes
    }

    /// Bytes the walk holds back (at most a batch header, 256 bytes).
    pub fn carried_bytes(&self) -> usize {
        self.walker.carried_bytes()
    }

    /// Where a later session may continue this spill.
    pub fn resume_point(&self) -> ResumePoint {
        ResumePoint {
            entry: self.entry,
            synced_len_bytes: self.synced_len_bytes,
        }
    }

    /// Takes the next chunk, which the chunk cursor already placed at
    /// [`Self::received_len_bytes`] and within the declared length: walks
    /// it, hashes it, writes it at its offset, and syncs once another
    /// interval of bytes is written.
    ///
    /// # Errors
    /// [`SpillError::Walk`] for bytes that are not a valid segment (nothing
    /// is written); [`SpillError::StagingIo`] for a failed write or sync.
    /// Either way the spill is to be dropped; [`Self::resume_point`] still
    /// names only synced, walked bytes.
    pub async fn append(&mut self, payload: Bytes) -> Result<(), SpillError> {
        debug_assert!(self.received_len_bytes + payload.len() as u64 <= self.entry.len);
        // The walk first: a hostile chunk never reaches the disk.
        self.walker.feed(&payload)?;
        self.hasher.update(&payload);
        let len = payload.len() as u64;
        let BufResult(written, _) = self
            .file
            .write_all_at(payload, self.received_len_bytes)
            .await;
        written.map_err(io_error(&self.log_path))?;
        self.received_len_bytes += len;
        if self.received_len_bytes - self.synced_len_bytes >= self.config.sync_interval_bytes {
            self.file
                .sync_data()
                .await
                .map_err(io_error(&self.log_path))?;
            self.synced_len_bytes = self.received_len_bytes;
        }
        Ok(())
    }

    /// Ends a complete spill: the checksum against the manifest, the end of
    /// the walk, the log synced, the index written and synced, the directory
    /// synced (module documentation: why in this order).
    ///
    /// # Errors
    /// [`SpillError::ManifestChecksum`], [`SpillError::Walk`], or
    /// [`SpillError::StagingIo`].
    pub async fn finish<F: Fs<File = H>>(
        self,
        fs: &F,
        dir: &Path,
    ) -> Result<StagedSegmentMeta, SpillError> {
        debug_assert_eq!(self.received_len_bytes, self.entry.len);
        if self.hasher.finish() != self.entry.checksum {
            return Err(SpillError::ManifestChecksum {
                frontier: Offset(base_offset(&self.entry)),
            });
        }
        let (stats, index) = self.walker.finish()?;
        self.file
            .sync_data()
            .await
            .map_err(io_error(&self.log_path))?;
        let index_bytes = encode_entries(&index);
        let index_size_bytes = index_bytes.len() as u64;
        write_synced(fs, &self.index_path, index_bytes).await?;
        fs.sync_dir(dir).await.map_err(io_error(dir))?;
        Ok(StagedSegmentMeta::from_walk(
            &self.entry,
            stats,
            index_size_bytes,
            (self.log_path, self.index_path),
        ))
    }
}

async fn write_synced<F: Fs>(fs: &F, path: &Path, bytes: Vec<u8>) -> Result<(), SpillError> {
    let file = fs
        .open(path, OpenOptions::create_read_write().truncate(true))
        .await
        .map_err(io_error(path))?;
    let BufResult(written, _) = file.write_all_at(bytes, 0).await;
    written.map_err(io_error(path))?;
    file.sync_data().await.map_err(io_error(path))
}

/// An incremental re-read of a staged log's first `target_len_bytes`,
/// rebuilding its checksum and walk: the work behind a resume and an
/// adoption, done in steps of bounded bytes so a driver can spread a
/// multi-GiB re-read over many ticks (ST-B1).
#[derive(Debug)]
pub struct PrefixRehash<H: FsFile> {
    entry: StateArtifact,
    log_path: PathBuf,
    index_path: PathBuf,
    file: H,
    hasher: StateArtifactHasher,
    walker: SegmentWalker,
    target_len_bytes: u64,
    buf: Vec<u8>,
}

impl<H: FsFile> PrefixRehash<H> {
    /// Opens `entry`'s staged log for a re-read of its first
    /// `target_len_bytes` (capped at the entry's length); `writable` when a
    /// spill will continue it.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] when the file cannot be opened.
    pub async fn open<F: Fs<File = H>>(
        fs: &F,
        dir: &Path,
        entry: StateArtifact,
        target_len_bytes: u64,
        writable: bool,
    ) -> Result<Self, SpillError> {
        let (log_path, index_path) = staging_paths(dir, base_offset(&entry));
        let opts = if writable {
            OpenOptions::read_write()
        } else {
            OpenOptions::read_only()
        };
        let file = fs
            .open(&log_path, opts)
            .await
            .map_err(io_error(&log_path))?;
        Ok(Self {
            entry,
            log_path,
            index_path,
            file,
            hasher: StateArtifactHasher::new(),
            walker: SegmentWalker::new(base_offset(&entry)),
            target_len_bytes: target_len_bytes.min(entry.len),
            buf: Vec::new(),
        })
    }

    /// The manifest entry.
    pub fn entry(&self) -> &StateArtifact {
        &self.entry
    }

    /// Bytes re-read so far.
    pub fn rehashed_len_bytes(&self) -> u64 {
        self.hasher.hashed_len_bytes()
    }

    /// Whether the whole target prefix was re-read.
    pub fn done(&self) -> bool {
        self.hasher.hashed_len_bytes() >= self.target_len_bytes
    }

    /// Re-reads up to `budget_bytes` more (at least one byte), in slices
    /// of at most `slice_bytes` with a yield after each, reusing one
    /// buffer. Returns whether the prefix is complete.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] for a failed or short read,
    /// [`SpillError::Walk`] for bytes that no longer walk.
    pub async fn advance<F: Fs<File = H>>(
        &mut self,
        fs: &F,
        budget_bytes: u64,
        slice_bytes: usize,
    ) -> Result<bool, SpillError> {
        let budget_bytes = budget_bytes.max(1);
        let slice_bytes = slice_bytes.max(1) as u64;
        let mut spent = 0u64;
        while !self.done() && spent < budget_bytes {
            let at = self.hasher.hashed_len_bytes();
            // Lossless: bounded by slice_bytes, a usize.
            let want = (self.target_len_bytes - at)
                .min(slice_bytes)
                .min(budget_bytes - spent) as usize;
            let buf = std::mem::take(&mut self.buf);
            self.buf = self
                .file
                .read_exact_into(buf, want, at)
                .await
                .map_err(io_error(&self.log_path))?;
            self.walker.feed(&self.buf)?;
            self.hasher.update(&self.buf);
            spent += want as u64;
            fs.yield_now().await;
        }
        if self.done() {
            self.buf = Vec::new();
        }
        Ok(self.done())
    }

    /// Ends a complete re-read of a whole staged log as an adoption: the
    /// checksum against the entry and the end of the walk; on a match the
    /// index is rewritten and synced (an earlier crash may have lost it;
    /// the caller syncs the directory once for every adoption). `Ok(None)`
    /// when the bytes do not match.
    ///
    /// # Errors
    /// [`SpillError::StagingIo`] when writing the index fails.
    pub async fn adopt<F: Fs<File = H>>(
        self,
        fs: &F,
    ) -> Result<Option<StagedSegmentMeta>, SpillError> {
        debug_assert!(self.done());
        if self.target_len_bytes != self.entry.len || self.hasher.finish() != self.entry.checksum {
            return Ok(None);
        }
        let Ok((stats, index)) = self.walker.finish() else {
            return Ok(None);
        };
        let index_bytes = encode_entries(&index);
        let index_size_bytes = index_bytes.len() as u64;
        write_synced(fs, &self.index_path, index_bytes).await?;
        Ok(Some(StagedSegmentMeta::from_walk(
            &self.entry,
            stats,
            index_size_bytes,
            (self.log_path, self.index_path),
        )))
    }
}

/// Whether `entry`'s staged log exists with exactly its length: the cheap
/// test before an adoption reads anything (the common miss, a grown active
/// segment, costs no read).
pub async fn staged_len_matches<F: Fs>(fs: &F, dir: &Path, entry: &StateArtifact) -> bool {
    let (log_path, _) = staging_paths(dir, base_offset(entry));
    matches!(
        fs.metadata(&log_path).await,
        Ok(m) if m.kind == FileKind::File && m.len == entry.len
    )
}

/// Adopts a staged log left by an earlier session if it matches `entry`
/// byte for byte, in one go ([`PrefixRehash`] in steps is the budgeted
/// form). `Ok(None)`: no file, or no match.
///
/// # Errors
/// [`SpillError::StagingIo`] when writing the index fails.
pub async fn adopt_staged_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    entry: &StateArtifact,
    rehash_slice_bytes: usize,
) -> Result<Option<StagedSegmentMeta>, SpillError> {
    if !staged_len_matches(fs, dir, entry).await {
        return Ok(None);
    }
    let Ok(mut rehash) = PrefixRehash::open(fs, dir, *entry, entry.len, false).await else {
        return Ok(None);
    };
    loop {
        match rehash.advance(fs, u64::MAX, rehash_slice_bytes).await {
            Ok(true) => return rehash.adopt(fs).await,
            Ok(false) => {}
            Err(_) => return Ok(None),
        }
    }
}

/// Unlinks every `.staging` file in `dir` whose path is not in `keep`,
/// returning how many went. Best effort: a file that survives is swept at
/// the next boot. Only names ending in `.staging` are ever touched, so a
/// live `.log` or `.index` cannot be removed through here. `keep` is a
/// set: both it and the directory hold up to two files per manifest entry
/// (65,536), and a list lookup per file made the sweep quadratic.
pub async fn sweep_staging_except<F: Fs>(
    fs: &F,
    dir: &Path,
    keep: &std::collections::HashSet<PathBuf>,
) -> usize {
    let Ok(entries) = fs.read_dir(dir).await else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries {
        let Some(name) = entry.name_str() else {
            continue;
        };
        if entry.kind != FileKind::File || !name.ends_with(STAGING_SUFFIX) {
            continue;
        }
        let path = dir.join(name);
        if keep.contains(&path) {
            continue;
        }
        match fs.remove_file(&path).await {
            Ok(()) => swept += 1,
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "staging sweep left a file for boot");
            }
        }
    }
    swept
}

/// The first offset of a segment entry's bytes. Staged files exist only
/// for entries the descriptor check found to be segments (receive.rs), so
/// a debug build stops on anything else.
fn base_offset(entry: &StateArtifact) -> u64 {
    debug_assert!(
        entry.kind.base_offset().is_some(),
        "staging a non-segment artifact {:?}",
        entry.kind
    );
    entry.kind.wire_frontier()
}

/// A digest over every `SEGMENT_LOG` entry of a manifest (frontier, length,
/// checksum), keying the reuse-scan memo: equal digests mean two offers
/// expect byte-identical staged files. The offsets artifact is left out; it
/// is never staged and is re-encoded per build.
pub fn segment_manifest_digest(manifest: &[StateArtifact]) -> u64 {
    let mut hasher = StateArtifactHasher::new();
    for (entry, base) in manifest
        .iter()
        .filter_map(|e| Some((e, e.kind.base_offset()?)))
    {
        hasher.update(&base.0.to_le_bytes());
        hasher.update(&entry.len.to_le_bytes());
        hasher.update(&entry.checksum.to_le_bytes());
    }
    hasher.finish()
}
