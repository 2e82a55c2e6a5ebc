//! `SegmentedLog`: a partition's sealed segments plus one active segment,
//! appends with rotation at `segment_size_bytes`, reads by offset, by
//! timestamp and by position, and truncation at a byte position.
//!
//! Durability rules, each against a crash:
//! - Index entries reach the `.index` file only after the log bytes they
//!   point at were synced (at [`SegmentedLog::sync`], at rotation, or after
//!   each append with `fsync`); the index file itself is synced only when
//!   its segment is sealed. Unsynced log writes may land out of order
//!   or not at all (writeback reorders pages), so an entry pointing into
//!   unsynced bytes would let recovery trust a range with a hole in it; an
//!   entry written after the sync proves every byte before it. Recovery
//!   therefore walks only what was appended since the last sync.
//! - Rotation syncs the old segment's log and index **before** creating the
//!   next segment, then syncs the directory. A crash therefore never leaves
//!   a later segment on disk after an earlier segment's lost tail (a hole).
//! - A failed write is rolled back by cutting the file at the append
//!   position; if even that fails, or a sync fails (the page cache state is
//!   then unknown), the log is poisoned and refuses appends until reopened.
//! - A full disk (ENOSPC, EDQUOT: [`StorageError::is_no_space`]) poisons
//!   nothing it can undo: a batch that landed partly is cut back as any
//!   failed write; index entries that could not be written stay pending
//!   (what landed of them is cut, and they go out with the next sync); a
//!   seal that could not be made is made by the next append, before it
//!   writes (so the seal still follows the batch that filled the segment).
//!   A batch that is in the log is never reported as failed for its index
//!   or its seal, or a caller's retry would append it twice. So once space
//!   is freed the same calls succeed, with no reopen.
//!
//! All segments keep their sparse index in memory (24 bytes per ~64 KiB of
//! log). Sealed segments hold no file handle, except the one most recently
//! read, whose handle is cached: descriptor use stays flat however many
//! segments a partition has, and a sequential reader keeps one open file
//! description, so the kernel's readahead state survives between reads
//! (reopening per read resets it and costs a third of cold-read speed).
//!
//! The active segment's writers are opened on first use (a log opened at
//! boot holds no descriptor until it is written or read), and
//! [`SegmentedLog::release_handles`] closes every handle of a log with
//! nothing unsynced, so a host of thousands of idle partitions is not
//! bounded by its descriptor limit. Only a synced log lets its writers go:
//! a write-back error on a file nobody holds open may never reach a later
//! descriptor's fsync, so unsynced bytes keep theirs.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tracing::warn;

use crate::batch::{BATCH_LENGTH_MAX_DEFAULT, BatchError, BatchHeader, BatchView, Integrity};
use crate::error::{RecoveryError, StorageError};
use crate::fs::{BufResult, Fs, FsFile, IoBuf, OpenOptions};
use crate::index::{
    IndexEntry, IndexPolicy, IndexWriter, encode_entries, lower_bound_by_offset,
    lower_bound_by_timestamp,
};
use crate::recovery::{
    RecoveredSegment, RecoveryConfig, RecoveryReport, check_chain, recover_partition,
};
use crate::segment::{
    LogWriter, ReadBatches, ReadLimits, SegmentMeta, find_batch, index_file_name, log_file_name,
    read_batches_at,
};

/// Default segment size (1 GiB).
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

/// How a log writes and checks its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Rotation threshold: a segment closes after the batch that reaches
    /// this size (whole batches only, so it may exceed it by one batch).
    pub segment_size_bytes: u64,
    /// Index density.
    pub index: IndexPolicy,
    /// fdatasync the log (and index) after every append.
    pub fsync: bool,
    /// Reserve `segment_size_bytes` of disk when a segment is created.
    pub preallocate: bool,
    /// Ceiling on a batch's length.
    pub batch_length_max: u64,
    /// Validation applied to batches read back.
    pub read_integrity: Integrity,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            index: IndexPolicy::default(),
            fsync: false,
            preallocate: false,
            batch_length_max: BATCH_LENGTH_MAX_DEFAULT,
            read_integrity: Integrity::Verify,
        }
    }
}

impl LogConfig {
    /// The recovery parameters matching this configuration.
    pub fn recovery(&self) -> RecoveryConfig {
        RecoveryConfig {
            batch_length_max: self.batch_length_max,
            index: self.index,
        }
    }
}

/// The active segment's writers, while open.
#[derive(Debug)]
struct Active<F: FsFile> {
    log: LogWriter<F>,
    index: IndexWriter<F>,
}

#[derive(Debug)]
struct Segment {
    meta: SegmentMeta,
    index: Vec<IndexEntry>,
    log_path: PathBuf,
    index_path: PathBuf,
}

/// Where an appended batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Start offset of the segment that holds it.
    pub segment_start: u64,
    /// Byte position in that segment's log.
    pub position: u64,
    /// The batch's base offset.
    pub base_offset: u64,
    /// The offset after it.
    pub next_offset: u64,
}

/// A partition's log: sealed segments and one active segment (the last).
#[derive(Debug)]
pub struct SegmentedLog<F: Fs> {
    fs: F,
    dir: PathBuf,
    config: LogConfig,
    segments: Vec<Segment>,
    /// The active segment's writers; `None` until first needed and after
    /// [`Self::release_handles`].
    active: Option<Active<F::File>>,
    /// How many of the active segment's index entries are in its file; the
    /// rest wait for the next sync of the log.
    index_written: usize,
    /// Bytes were appended to the active segment since its last sync.
    unsynced: bool,
    poisoned: bool,
    /// The last sealed segment read: its start offset and log handle.
    sealed_reader: RefCell<Option<(u64, Rc<F::File>)>>,
}

impl<F: Fs> SegmentedLog<F> {
    /// Recovers the log in `dir` (see [`crate::recovery`]) and opens its
    /// last segment for appends. A directory without segments gets an empty
    /// segment at `initial_offset` (the partition's durable frontier).
    pub async fn open(
        fs: F,
        dir: &Path,
        config: LogConfig,
        initial_offset: u64,
    ) -> Result<(Self, RecoveryReport), RecoveryError> {
        let mut report = recover_partition(&fs, dir, config.recovery()).await?;
        let segments = std::mem::take(&mut report.segments);
        let log = Self::from_recovered(fs, dir, config, segments.clone(), initial_offset).await?;
        report.segments = segments;
        Ok((log, report))
    }

    /// The log over segments already recovered one by one
    /// ([`crate::recovery::recover_segment`]), oldest first; nothing is
    /// read. The chain is checked ([`crate::recovery::check_chain`]). No
    /// segments: the directory gets an empty segment at `initial_offset`,
    /// as [`Self::open`] plants one.
    ///
    /// # Errors
    /// A broken chain, or I/O creating the first segment.
    pub async fn from_recovered(
        fs: F,
        dir: &Path,
        config: LogConfig,
        recovered: Vec<RecoveredSegment>,
        initial_offset: u64,
    ) -> Result<Self, RecoveryError> {
        let metas: Vec<SegmentMeta> = recovered.iter().map(|s| s.meta).collect();
        check_chain(&metas)?;
        let mut segments: Vec<Segment> = recovered
            .into_iter()
            .map(|s| Segment {
                meta: s.meta,
                index: s.index,
                log_path: dir.join(log_file_name(s.meta.start_offset)),
                index_path: dir.join(index_file_name(s.meta.start_offset)),
            })
            .collect();
        let segments_nonempty_tail = segments.last().is_some_and(|s| s.meta.size_bytes > 0);
        let (active, index_written) = match segments.last() {
            // Opened when first written or read.
            Some(last) => (None, last.index.len()),
            None => {
                fs.create_dir_all(dir)
                    .await
                    .map_err(|e| RecoveryError::io("create_dir", dir, e))?;
                // The partition directory's own name must survive a crash
                // too, or synced data would vanish with it.
                if let Some(parent) = dir.parent() {
                    fs.sync_dir(parent)
                        .await
                        .map_err(|e| RecoveryError::io("sync_dir", parent, e))?;
                }
                let (seg, active) = create_segment(&fs, dir, &config, initial_offset)
                    .await
                    .map_err(|e| match e {
                        StorageError::Io { op, path, source } => {
                            RecoveryError::Io { op, path, source }
                        }
                        other => RecoveryError::io(
                            "create_segment",
                            dir,
                            std::io::Error::other(other.to_string()),
                        ),
                    })?;
                segments.push(seg);
                (Some(active), 0)
            }
        };
        let log = Self {
            fs,
            dir: dir.to_path_buf(),
            config,
            segments,
            active,
            index_written,
            // What recovery kept of the active segment may be in the page
            // cache only (a killed process's writes survive it, unsynced):
            // the first sync must reach the file, and until then the log
            // keeps its writers.
            unsynced: segments_nonempty_tail,
            poisoned: false,
            sealed_reader: RefCell::new(None),
        };
        Ok(log)
    }

    /// The segments' metadata, oldest first; the last is active.
    pub fn segments(&self) -> impl Iterator<Item = &SegmentMeta> {
        self.segments.iter().map(|s| &s.meta)
    }

    /// The index entries of the segment starting at `start_offset`.
    pub fn index_entries(&self, start_offset: u64) -> Option<&[IndexEntry]> {
        self.segments
            .iter()
            .find(|s| s.meta.start_offset == start_offset)
            .map(|s| s.index.as_slice())
    }

    /// The stored bytes of the index file of the sealed segment starting at
    /// `start_offset`, at most `limit` of them (a file longer than what it
    /// should hold shows as different without being read whole). For the
    /// scrub, which compares them with the entries its walk derives.
    ///
    /// # Errors
    /// No such sealed segment, or I/O reading its index.
    pub async fn read_sealed_index_file(
        &self,
        start_offset: u64,
        limit: u64,
    ) -> Result<Vec<u8>, StorageError> {
        let seg = self.sealed(start_offset)?;
        let file = self
            .fs
            .open(&seg.index_path, OpenOptions::read_only())
            .await
            .map_err(|e| StorageError::io("open", &seg.index_path, e))?;
        file.read_to_end_bounded(limit)
            .await
            .map_err(|e| StorageError::io("read", &seg.index_path, e))
    }

    /// Replaces the index of the sealed segment starting at `start_offset`
    /// with `entries`, in memory and in its file (written in place, cut to
    /// length, synced). For the scrub, once a verified walk of the whole
    /// segment derived them with this log's [`IndexPolicy`] and found the
    /// stored ones different: the index is derived data, so the log's
    /// batches are the truth. A crash during the write leaves each sector
    /// old or new; recovery checks the entries it trusts against the log.
    ///
    /// # Errors
    /// No such sealed segment, or I/O writing its index (memory is then
    /// left as it was).
    pub async fn rewrite_sealed_index(
        &mut self,
        start_offset: u64,
        entries: Vec<IndexEntry>,
    ) -> Result<(), StorageError> {
        let path = self.sealed(start_offset)?.index_path.clone();
        let file = self
            .fs
            .open(&path, OpenOptions::create_read_write())
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let bytes = encode_entries(&entries);
        let len = bytes.len() as u64;
        let BufResult(res, _) = file.write_all_at(bytes, 0).await;
        res.map_err(|e| StorageError::io("write", &path, e))?;
        file.set_len(len)
            .await
            .map_err(|e| StorageError::io("truncate", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("sync", &path, e))?;
        if let Some(seg) = self
            .segments
            .iter_mut()
            .find(|s| s.meta.start_offset == start_offset)
        {
            seg.index = entries;
        }
        Ok(())
    }

    /// The sealed (not the active) segment starting at `start_offset`.
    fn sealed(&self, start_offset: u64) -> Result<&Segment, StorageError> {
        let sealed = self.segments.split_last().map_or(&[][..], |(_, rest)| rest);
        sealed
            .iter()
            .find(|s| s.meta.start_offset == start_offset)
            .ok_or(StorageError::NoSuchSegment { start_offset })
    }

    /// The offset the next batch must start at.
    pub fn next_offset(&self) -> u64 {
        self.active_segment().meta.next_offset
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    fn active_segment(&self) -> &Segment {
        // Invariant: there is always at least one segment (open creates one).
        &self.segments[self.segments.len() - 1]
    }

    /// Appends one stamped batch. Its header is checked (layout, length
    /// equal to the buffer, base offset equal to [`Self::next_offset`]);
    /// message checksums are not recomputed here — the bytes were verified
    /// on admission and stamped by this node. Rotates after the batch that
    /// fills the active segment.
    /// The buffer is handed back whatever the outcome.
    pub async fn append<B: IoBuf>(&mut self, batch: B) -> (Result<Appended, StorageError>, B) {
        let header = match self.admit(batch.as_init()) {
            Ok(header) => header,
            Err(e) => return (Err(e), batch),
        };
        // A segment recovered at or past the size (or a smaller configured
        // size) rotates before it takes another batch.
        if self.active_segment().meta.size_bytes >= self.config.segment_size_bytes
            && let Err(e) = self.rotate().await
        {
            // A full disk leaves the log as it was (see `rotate`): the
            // append is refused and may be retried.
            if !e.is_no_space() {
                self.poisoned = true;
            }
            return (Err(e), batch);
        }
        let seg_index = self.segments.len() - 1;
        let active = match self.open_active().await {
            Ok(active) => active,
            Err(e) => return (Err(e), batch),
        };
        let position = active.log.cursor();
        let BufResult(res, batch) = active.log.append(batch).await;
        let sync_failed = active.log.sync_failed();
        let cursor = active.log.cursor();
        if let Err(e) = res {
            let path = self.segments[seg_index].log_path.clone();
            if sync_failed {
                // The write went through but its sync failed: nothing since
                // the last good sync can be trusted, so no roll-back either.
                self.poisoned = true;
            } else {
                self.roll_back(position).await;
            }
            return (Err(StorageError::io("append", path, e)), batch);
        }
        let appended = self.note_appended(seg_index, &header, position, cursor);
        // From here on the batch is in the log: an error must not tell the
        // caller otherwise, or a retry would append it twice. On a full
        // disk what is left (its index entry, the seal) is done later: the
        // entry stays pending for the next sync or append.
        if self.config.fsync
            && let Err(e) = self.write_index(false).await
            && !e.is_no_space()
        {
            // The batch is durable; only its index entry is not.
            return (Err(e), batch);
        }
        if self.segments[seg_index].meta.size_bytes >= self.config.segment_size_bytes
            && let Err(e) = self.rotate().await
        {
            if !e.is_no_space() {
                // The batch is appended; only the rotation failed.
                self.poisoned = true;
                return (Err(e), batch);
            }
            // The next append rotates first (a full segment seals before
            // it takes another batch), so the seal falls after the same
            // batch on every replica.
            warn!(dir = %self.dir.display(), error = %e, "segment seal deferred: the disk is full");
        }
        (Ok(appended), batch)
    }

    /// Whether the log takes `bytes` next: not poisoned, a valid batch
    /// header for the whole buffer, and its base offset the next offset.
    fn admit(&self, bytes: &[u8]) -> Result<BatchHeader, StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        let header = check_append(bytes, self.config.batch_length_max)
            .map_err(StorageError::InvalidBatch)?;
        let expected = self.next_offset();
        if header.base_offset != expected {
            return Err(StorageError::OffsetMismatch {
                expected,
                actual: header.base_offset,
            });
        }
        Ok(header)
    }

    /// A batch written at `position` of segment `seg_index` (whose log now
    /// ends at `cursor`): its sparse index entry when one is due, and the
    /// segment's totals.
    fn note_appended(
        &mut self,
        seg_index: usize,
        header: &BatchHeader,
        position: u64,
        cursor: u64,
    ) -> Appended {
        let seg = &mut self.segments[seg_index];
        if self.config.index.should_index(seg.index.last(), position) {
            seg.index.push(IndexEntry {
                offset: header.base_offset,
                timestamp: header.base_timestamp,
                position,
            });
        }
        seg.meta.record(header);
        debug_assert_eq!(seg.meta.size_bytes, cursor);
        self.unsynced = !self.config.fsync;
        Appended {
            segment_start: seg.meta.start_offset,
            position,
            base_offset: header.base_offset,
            next_offset: header.next_offset(),
        }
    }

    /// Cuts the active log back to before a failed append. If that fails
    /// too, the log is poisoned.
    async fn roll_back(&mut self, position: u64) {
        let rewound = match self.active.as_mut() {
            Some(active) => active.log.rewind_to(position).await.is_ok(),
            None => false,
        };
        if !rewound {
            warn!(dir = %self.dir.display(), position, "append roll-back failed; log poisoned");
            self.poisoned = true;
        }
    }

    /// Makes everything appended so far durable (fdatasync of the active
    /// log and index; sealed segments were synced at rotation).
    pub async fn sync(&mut self) -> Result<(), StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        let seg = self.active_segment();
        let log_path = seg.log_path.clone();
        // Handles are let go only when nothing is unsynced (module doc),
        // so closed writers have nothing to sync, unless the log was just
        // opened over bytes a killed process left in the page cache.
        if self.unsynced {
            self.open_active().await?;
        }
        if let Some(active) = self.active.as_mut()
            && let Err(e) = active.log.sync().await
        {
            // After a failed fsync the page cache may have dropped the dirty
            // pages: nothing written since the last good sync can be trusted.
            self.poisoned = true;
            return Err(StorageError::io("sync", log_path, e));
        }
        self.unsynced = false;
        // The entries may go to the index file now; they need no sync of
        // their own (one fsync per sync, not two): a crash that loses them
        // only makes recovery walk further, and rotation syncs the index
        // of the segment it seals.
        self.write_index(false).await
    }

    /// [`Self::sync`], and the index file too (before a seal).
    async fn sync_with_index(&mut self) -> Result<(), StorageError> {
        self.sync().await?;
        self.write_index(true).await
    }

    /// Writes the active segment's pending index entries (once the log
    /// bytes they point at are durable), and with `sync` also syncs the
    /// index. The index needs no sync per append: an entry that a crash
    /// loses only makes the next recovery walk a little further.
    async fn write_index(&mut self, sync: bool) -> Result<(), StorageError> {
        let pending = self.active_segment().index.len() > self.index_written;
        if !pending && !sync {
            return Ok(());
        }
        let seg = &self.segments[self.segments.len() - 1];
        let active = open_active(
            &self.fs,
            &self.config,
            seg,
            self.index_written,
            &mut self.active,
        )
        .await?;
        let pending = &seg.index[self.index_written..];
        if let Err(e) = active.index.append_all(pending).await {
            // On a full disk the entries stay pending: cut what landed of
            // them (the file then ends after the entries written before),
            // and the next sync writes them again. Had the cut failed, or
            // any other error, the file's tail is unknown.
            if !crate::fs::is_no_space(&e)
                || active
                    .index
                    .truncate_entries(self.index_written)
                    .await
                    .is_err()
            {
                self.poisoned = true;
            }
            return Err(StorageError::io("write", seg.index_path.clone(), e));
        }
        if sync && let Err(e) = active.index.sync().await {
            self.poisoned = true;
            return Err(StorageError::io("sync", seg.index_path.clone(), e));
        }
        self.index_written = seg.index.len();
        Ok(())
    }

    /// The active segment's writers, opened if they are not.
    async fn open_active(&mut self) -> Result<&mut Active<F::File>, StorageError> {
        let seg = &self.segments[self.segments.len() - 1];
        open_active(
            &self.fs,
            &self.config,
            seg,
            self.index_written,
            &mut self.active,
        )
        .await
    }

    /// Closes every file handle the log holds (the active segment's writers
    /// and the cached reader) when nothing appended is unsynced; they are
    /// reopened on next use. Returns whether the log now holds none. A
    /// poisoned log keeps its handles: it refuses everything until reopened
    /// anyway.
    pub fn release_handles(&mut self) -> bool {
        if self.unsynced || self.poisoned {
            return !self.holds_handles();
        }
        self.active = None;
        self.sealed_reader.borrow_mut().take();
        true
    }

    /// Whether the log holds any open file handle.
    pub fn holds_handles(&self) -> bool {
        self.active.is_some() || self.sealed_reader.borrow().is_some()
    }

    /// Seals the active segment and starts a new one at the next offset.
    /// A no-op error-free call when the active segment is empty.
    ///
    /// On a full disk ([`StorageError::is_no_space`]) the log is left as
    /// it was and the call may be repeated: the active segment stays
    /// active (synced, or its index entries still pending), and a
    /// successor half created (its log file without its index, or neither
    /// name synced) is created again with truncation by the next call; a
    /// crash in between leaves an empty last segment, which recovery
    /// takes as the active one.
    pub async fn rotate(&mut self) -> Result<(), StorageError> {
        if self.active_segment().meta.is_empty() {
            return Ok(());
        }
        // Sync before the successor exists: see the module comment.
        self.sync_with_index().await?;
        let start = self.next_offset();
        let (seg, active) = create_segment(&self.fs, &self.dir, &self.config, start).await?;
        self.segments.push(seg);
        self.active = Some(active);
        self.index_written = 0;
        self.unsynced = false;
        Ok(())
    }

    /// Reads whole batches starting with the one that holds `offset`, about
    /// `max_bytes` of them, from one segment. Empty when `offset` is at or
    /// past the end, or before the first segment.
    pub async fn read_by_offset(
        &self,
        offset: u64,
        max_bytes: u64,
    ) -> Result<ReadBatches, StorageError> {
        let idx = self
            .segments
            .partition_point(|s| s.meta.start_offset <= offset);
        let Some(seg) = idx.checked_sub(1).map(|i| &self.segments[i]) else {
            return Ok(ReadBatches::default());
        };
        if offset >= seg.meta.next_offset {
            return Ok(ReadBatches::default());
        }
        let hint = lower_bound_by_offset(&seg.index, offset);
        self.read_located(seg, hint, max_bytes, |h| h.last_offset() >= offset)
            .await
    }

    /// Reads whole batches starting with the first whose base timestamp is
    /// at or after `timestamp` (base timestamps are the primary's prepare
    /// timestamps, non-decreasing along the log). Empty when none is.
    pub async fn read_by_timestamp(
        &self,
        timestamp: u64,
        max_bytes: u64,
    ) -> Result<ReadBatches, StorageError> {
        let Some(seg) = self
            .segments
            .iter()
            .find(|s| !s.meta.is_empty() && s.meta.end_timestamp >= timestamp)
        else {
            return Ok(ReadBatches::default());
        };
        let hint = lower_bound_by_timestamp(&seg.index, timestamp);
        self.read_located(seg, hint, max_bytes, |h| h.base_timestamp >= timestamp)
            .await
    }

    /// Reads whole batches at a known batch boundary (a previous read's
    /// `next_position`) of the segment starting at `segment_start`.
    pub async fn read_at(
        &self,
        segment_start: u64,
        position: u64,
        max_bytes: u64,
    ) -> Result<ReadBatches, StorageError> {
        self.read_at_into(segment_start, position, max_bytes, Vec::new())
            .await
    }

    /// Like [`Self::read_at`], reusing `buf` (e.g. a previous read's
    /// [`ReadBatches::into_bytes`]) so a sequential reader allocates once.
    pub async fn read_at_into(
        &self,
        segment_start: u64,
        position: u64,
        max_bytes: u64,
        buf: Vec<u8>,
    ) -> Result<ReadBatches, StorageError> {
        let seg = self.segment(segment_start)?;
        let handle = self.reader(seg).await?;
        read_batches_at(
            handle.file(),
            &seg.log_path,
            segment_start,
            (position, seg.meta.size_bytes),
            self.limits(max_bytes),
            buf,
        )
        .await
    }

    fn limits(&self, max_bytes: u64) -> ReadLimits {
        ReadLimits {
            max_bytes,
            integrity: self.config.read_integrity,
            batch_length_max: self.config.batch_length_max,
        }
    }

    fn segment(&self, start: u64) -> Result<&Segment, StorageError> {
        self.segments
            .iter()
            .find(|s| s.meta.start_offset == start)
            .ok_or(StorageError::NoSuchSegment {
                start_offset: start,
            })
    }

    /// A readable handle on `seg`'s log: the active writer's file, or a
    /// freshly opened one for a sealed segment.
    async fn reader(&self, seg: &Segment) -> Result<ReadHandle<'_, F::File>, StorageError> {
        if std::ptr::eq(seg, self.active_segment())
            && let Some(active) = self.active.as_ref()
        {
            return Ok(ReadHandle::Active(active.log.file()));
        }
        // A sealed segment, or the active one while its writers are closed
        // (a read-only handle sees what they write: one file).
        let start = seg.meta.start_offset;
        if let Some((cached, file)) = self.sealed_reader.borrow().as_ref()
            && *cached == start
        {
            return Ok(ReadHandle::Sealed(Rc::clone(file)));
        }
        let file = self
            .fs
            .open(&seg.log_path, OpenOptions::read_only())
            .await
            .map_err(|e| StorageError::io("open", &seg.log_path, e))?;
        let file = Rc::new(file);
        *self.sealed_reader.borrow_mut() = Some((start, Rc::clone(&file)));
        Ok(ReadHandle::Sealed(file))
    }

    /// Reads from the first batch `wanted` accepts, walking from the index
    /// entry `hint` (or byte 0). The batch at the hint must be the one the
    /// entry names: an index damaged at rest (its file is trusted at boot
    /// up to its last entry that verifies) could otherwise point past the
    /// wanted batch at another whole batch, and the read would silently
    /// skip messages. Such a hint is dropped and the walk starts over from
    /// byte 0 (correct, only slower).
    async fn read_located(
        &self,
        seg: &Segment,
        hint: Option<IndexEntry>,
        max_bytes: u64,
        wanted: impl Fn(&BatchHeader) -> bool,
    ) -> Result<ReadBatches, StorageError> {
        let limits = self.limits(max_bytes);
        let handle = self.reader(seg).await?;
        let unchecked = Cell::new(hint);
        let misled = Cell::new(false);
        let mut found = find_batch(
            handle.file(),
            &seg.log_path,
            hint.map_or(0, |e| e.position),
            seg.meta.size_bytes,
            limits.batch_length_max,
            |h| match unchecked.take() {
                Some(e) if h.base_offset != e.offset || h.base_timestamp != e.timestamp => {
                    misled.set(true);
                    true
                }
                _ => wanted(h),
            },
        )
        .await?;
        if misled.get() {
            warn!(
                path = %seg.index_path.display(),
                position = hint.map_or(0, |e| e.position),
                "an index entry does not name the batch it points at; reading from the segment's start"
            );
            found = find_batch(
                handle.file(),
                &seg.log_path,
                0,
                seg.meta.size_bytes,
                limits.batch_length_max,
                wanted,
            )
            .await?;
        }
        let Some((position, _)) = found else {
            return Ok(ReadBatches::default());
        };
        read_batches_at(
            handle.file(),
            &seg.log_path,
            seg.meta.start_offset,
            (position, seg.meta.size_bytes),
            limits,
            Vec::new(),
        )
        .await
    }

    /// Deletes the oldest segment if it is sealed (retention), returning
    /// what it held; `None` when only the active segment is left. The log is
    /// unlinked before the index (an orphaned index is swept at boot), and
    /// the directory is synced, so a crash leaves either the old chain or
    /// the shorter one: a contiguous suffix either way.
    pub async fn remove_oldest_sealed(&mut self) -> Result<Option<SegmentMeta>, StorageError> {
        if self.segments.len() < 2 {
            return Ok(None);
        }
        let victim = self.segments.remove(0);
        if self
            .sealed_reader
            .borrow()
            .as_ref()
            .is_some_and(|(start, _)| *start == victim.meta.start_offset)
        {
            self.sealed_reader.borrow_mut().take();
        }
        for path in [&victim.log_path, &victim.index_path] {
            match self.fs.remove_file(path).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove", path, e)),
            }
        }
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(|e| StorageError::io("sync_dir", &self.dir, e))?;
        Ok(Some(victim.meta))
    }

    /// Cuts the log so that its next offset is `offset`, which must be a
    /// batch boundary within it (see [`Self::truncate`]). Returns whether
    /// anything was cut: nothing is when `offset` is at or past the end.
    pub async fn truncate_to_offset(&mut self, offset: u64) -> Result<bool, StorageError> {
        if offset >= self.next_offset() {
            return Ok(false);
        }
        let Some(seg) = self
            .segments
            .iter()
            .rev()
            .find(|s| s.meta.start_offset <= offset)
        else {
            return Err(StorageError::NotABatchBoundary {
                path: self.dir.clone(),
                position: offset,
            });
        };
        let segment_start = seg.meta.start_offset;
        let position = if offset == segment_start {
            0
        } else {
            let read = self.read_by_offset(offset, 1).await?;
            let starts_there = read
                .batches()
                .next()
                .is_some_and(|b| b.header().base_offset == offset);
            if !starts_there || read.segment_start != segment_start {
                return Err(StorageError::NotABatchBoundary {
                    path: self.dir.join(log_file_name(segment_start)),
                    position: offset,
                });
            }
            read.position
        };
        self.truncate(segment_start, position).await?;
        Ok(true)
    }

    /// Truncates the log at byte `position` of the segment starting at
    /// `segment_start`: later segments are deleted (newest first), that
    /// segment is cut at `position` (which must be a batch boundary) and
    /// becomes the active one. Everything is synced before returning.
    pub async fn truncate(
        &mut self,
        segment_start: u64,
        position: u64,
    ) -> Result<(), StorageError> {
        let idx = self
            .segments
            .iter()
            .position(|s| s.meta.start_offset == segment_start)
            .ok_or(StorageError::NoSuchSegment {
                start_offset: segment_start,
            })?;
        let meta = self.cut_meta(idx, segment_start, position).await?;
        // Files are about to be cut or deleted: drop the cached handle.
        self.sealed_reader.borrow_mut().take();
        self.delete_segments_after(idx).await?;
        // Entries of the active segment past `index_written` are not in
        // its file yet; a sealed segment's are all there.
        let on_file = if idx + 1 == self.segments.len() {
            self.index_written
        } else {
            self.segments[idx].index.len()
        };
        let seg = &mut self.segments[idx];
        let kept = seg.index.partition_point(|e| e.position < position);
        seg.index.truncate(kept);
        seg.meta = meta;
        let (log_path, index_path) = (seg.log_path.clone(), seg.index_path.clone());
        let map = |p: &Path| {
            let p = p.to_path_buf();
            move |e| StorageError::io("truncate", p, e)
        };
        let log = self
            .fs
            .open(&log_path, OpenOptions::read_write())
            .await
            .map_err(map(&log_path))?;
        let index = self
            .fs
            .open(&index_path, OpenOptions::create_read_write())
            .await
            .map_err(map(&index_path))?;
        let mut log = LogWriter::new(log, position, self.config.fsync);
        let mut index = IndexWriter::new(index, 0);
        let entries = &seg.index;
        let res = async {
            log.rewind_to(position).await.map_err(map(&log_path))?;
            log.sync().await.map_err(map(&log_path))?;
            // The log is durable up to `position`: every kept entry may now
            // be on file.
            let keep_on_file = on_file.min(kept);
            index
                .truncate_entries(keep_on_file)
                .await
                .map_err(map(&index_path))?;
            index
                .append_all(&entries[keep_on_file..kept])
                .await
                .map_err(map(&index_path))?;
            index.sync().await.map_err(map(&index_path))?;
            self.fs.sync_dir(&self.dir).await.map_err(map(&self.dir))
        }
        .await;
        self.active = Some(Active { log, index });
        self.index_written = kept;
        if res.is_err() {
            self.poisoned = true;
        } else {
            self.unsynced = false;
        }
        res
    }

    /// The metadata segment `idx` has once cut at byte `position`, found by
    /// walking its batches from the index hint (read-only: nothing changes
    /// if `position` is not a batch boundary).
    async fn cut_meta(
        &self,
        idx: usize,
        segment_start: u64,
        position: u64,
    ) -> Result<SegmentMeta, StorageError> {
        let seg = &self.segments[idx];
        if position > seg.meta.size_bytes {
            return Err(StorageError::NotABatchBoundary {
                path: seg.log_path.clone(),
                position,
            });
        }
        // Find the batch boundary and the last batch before it, from the
        // index hint (read-only: nothing changes if the position is wrong).
        // Strictly before `position`: the walk must cover the last batch
        // before the cut, whose header gives the new end.
        let hint = seg
            .index
            .iter()
            .rev()
            .find(|e| e.position < position)
            .copied();
        let mut meta = SegmentMeta::empty(segment_start);
        if position > 0 {
            let handle = self.reader(seg).await?;
            let from = hint.map_or(0, |e| e.position);
            let mut last: Option<(u64, BatchHeader)> = None;
            let mut at = from;
            while at < position {
                let found = find_batch(
                    handle.file(),
                    &seg.log_path,
                    at,
                    seg.meta.size_bytes,
                    self.config.batch_length_max,
                    |_| true,
                )
                .await?;
                let Some((p, h)) = found else { break };
                last = Some((p, h));
                at = p + h.batch_length;
            }
            let Some((_, h)) = last.filter(|_| at == position) else {
                return Err(StorageError::NotABatchBoundary {
                    path: seg.log_path.clone(),
                    position,
                });
            };
            meta = SegmentMeta {
                start_offset: segment_start,
                next_offset: h.next_offset(),
                size_bytes: position,
                start_timestamp: seg.meta.start_timestamp,
                end_timestamp: h.base_timestamp,
            };
        }
        Ok(meta)
    }

    /// Deletes every segment after `idx`, newest first, with a directory
    /// sync after each.
    async fn delete_segments_after(&mut self, idx: usize) -> Result<(), StorageError> {
        // Delete later segments newest first, so a crash mid-way leaves a
        // contiguous prefix of the chain.
        while self.segments.len() > idx + 1 {
            let Some(victim) = self.segments.pop() else {
                break;
            };
            for path in [&victim.log_path, &victim.index_path] {
                match self.fs.remove_file(path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        self.poisoned = true;
                        return Err(StorageError::io("remove", path, e));
                    }
                }
            }
            // One directory sync per segment: unlinks that are not yet
            // durable may survive a crash in any combination, and an older
            // segment gone while a newer one stays would be a hole.
            if let Err(e) = self.fs.sync_dir(&self.dir).await {
                self.poisoned = true;
                return Err(StorageError::io("sync_dir", &self.dir, e));
            }
        }
        Ok(())
    }
}

/// A readable log handle: borrowed from the active writer, or owned for
/// the duration of one read of a sealed segment.
enum ReadHandle<'a, T> {
    Active(&'a T),
    Sealed(Rc<T>),
}

impl<T> ReadHandle<'_, T> {
    fn file(&self) -> &T {
        match self {
            Self::Active(f) => f,
            Self::Sealed(f) => f.as_ref(),
        }
    }
}

fn check_append(bytes: &[u8], batch_length_max: u64) -> Result<BatchHeader, BatchError> {
    if cfg!(debug_assertions) {
        // Debug builds verify everything: a stamping bug surfaces here
        // rather than as a corrupt segment found by a reader later.
        return BatchView::decode_exact(bytes, Integrity::Verify, batch_length_max)
            .map(|v| *v.header());
    }
    let header = BatchHeader::decode(bytes, batch_length_max)?;
    if header.batch_length != bytes.len() as u64 {
        return Err(if header.batch_length > bytes.len() as u64 {
            BatchError::Truncated {
                needed: header.batch_length,
                available: bytes.len() as u64,
            }
        } else {
            BatchError::TrailingBytes {
                batch_length: header.batch_length,
                buffer_len: bytes.len() as u64,
            }
        });
    }
    Ok(header)
}

/// `seg`'s writers in `slot`, opened at their cursors (the log's size, the
/// `index_written` entries already in the index file) if they are not open.
async fn open_active<'a, F: Fs>(
    fs: &F,
    config: &LogConfig,
    seg: &Segment,
    index_written: usize,
    slot: &'a mut Option<Active<F::File>>,
) -> Result<&'a mut Active<F::File>, StorageError> {
    let active = match slot.take() {
        Some(active) => active,
        None => {
            let log = fs
                .open(&seg.log_path, OpenOptions::read_write())
                .await
                .map_err(|e| StorageError::io("open", &seg.log_path, e))?;
            let index = fs
                .open(&seg.index_path, OpenOptions::create_read_write())
                .await
                .map_err(|e| StorageError::io("open", &seg.index_path, e))?;
            let cursor = (index_written * crate::index::INDEX_ENTRY_SIZE) as u64;
            Active {
                log: LogWriter::new(log, seg.meta.size_bytes, config.fsync),
                index: IndexWriter::new(index, cursor),
            }
        }
    };
    Ok(slot.insert(active))
}

/// Creates (truncating any stale file at the same name) an empty segment at
/// `start` with its writers, then syncs the directory so the new names are
/// durable.
async fn create_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &LogConfig,
    start: u64,
) -> Result<(Segment, Active<F::File>), StorageError> {
    let log_path = dir.join(log_file_name(start));
    let index_path = dir.join(index_file_name(start));
    let opts = OpenOptions::create_read_write().truncate(true);
    let log = fs
        .open(&log_path, opts)
        .await
        .map_err(|e| StorageError::io("create", &log_path, e))?;
    let index = fs
        .open(&index_path, opts)
        .await
        .map_err(|e| StorageError::io("create", &index_path, e))?;
    let log = LogWriter::new(log, 0, config.fsync);
    if config.preallocate
        && let Err(e) = log.preallocate(config.segment_size_bytes).await
    {
        // Preallocation only saves fragmentation; never fail on it.
        warn!(path = %log_path.display(), error = %e, "segment preallocation failed");
    }
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("sync_dir", dir, e))?;
    let segment = Segment {
        meta: SegmentMeta::empty(start),
        index: Vec::new(),
        log_path,
        index_path,
    };
    Ok((
        segment,
        Active {
            log,
            index: IndexWriter::new(index, 0),
        },
    ))
}
