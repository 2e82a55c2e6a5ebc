//! Boot recovery of one partition directory.
//!
//! 1. **One directory scan.** `.log` stems give the segments, in offset
//!    order. `.staging` files (state-transfer scratch) and `.index` files
//!    without a `.log` (left by an interrupted install) are swept.
//! 2. **Per segment, read-only:** find the last index entry that still
//!    points at a valid batch with the entry's offset (or start at byte 0),
//!    then walk forward validating header, every checksum and offset
//!    continuity. The first batch that fails ends the segment: the torn
//!    tail. The index is re-derived from the trusted entry with the writer's
//!    own stride rule. Cost is proportional to the tail, not the data.
//! 3. **Contiguity, still read-only:** an empty segment before the last, or
//!    a hole or overlap between consecutive segments, is a typed error. The
//!    directory is left untouched so the fenced partition can be inspected.
//! 4. **Repair:** physically truncate each torn tail (`set_len` + fsync, so
//!    later appends land right after the valid prefix, not after garbage),
//!    rewrite each index that differs from the derived one, sweep, and sync
//!    the directory once.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::batch::{BATCH_HEADER_SIZE, BatchHeader, BatchView, Integrity};
use crate::error::RecoveryError;
use crate::fs::{BufResult, DirEntry, FileKind, Fs, FsFile, OpenOptions};
use crate::index::{INDEX_ENTRY_SIZE, IndexEntry, IndexPolicy, decode_entries, encode_entries};
use crate::segment::{
    SegmentFileName, SegmentMeta, Walk, WalkStop, index_file_name, log_file_name, parse_file_name,
    walk_batches,
};

/// What recovery needs to know about the log's formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// Ceiling on a stored batch's length; a longer one is corruption.
    pub batch_length_max: u64,
    /// The index stride used to rebuild entries.
    pub index: IndexPolicy,
}

/// A segment as recovery found (and repaired) it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredSegment {
    /// Offsets, size and timestamps.
    pub meta: SegmentMeta,
    /// The index entries now on disk.
    pub index: Vec<IndexEntry>,
}

/// A torn tail that recovery cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedTail {
    /// The segment log.
    pub path: PathBuf,
    /// The offset the segment now ends before (its next offset).
    pub next_offset: u64,
    /// File length found.
    pub from_bytes: u64,
    /// File length left.
    pub to_bytes: u64,
    /// Why the walk stopped there.
    pub reason: WalkStop,
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The segments, in offset order (the last one is the active segment).
    pub segments: Vec<RecoveredSegment>,
    /// Files swept (`.staging`, orphaned `.index`).
    pub swept: Vec<PathBuf>,
    /// Torn tails physically truncated.
    pub truncated: Vec<TruncatedTail>,
    /// Index files rewritten (missing, short, torn or ahead of the log).
    pub rebuilt_indexes: Vec<PathBuf>,
}

impl RecoveryReport {
    /// The next offset the log proves: the last segment's next offset (an
    /// empty last segment marks a frontier at its start). `None` when the
    /// directory holds no segment.
    pub fn next_offset(&self) -> Option<u64> {
        self.segments.last().map(|s| s.meta.next_offset)
    }
}

/// Per-segment plan computed read-only in phase 2.
struct Plan {
    log_path: PathBuf,
    index_path: PathBuf,
    meta: SegmentMeta,
    file_len: u64,
    stop: WalkStop,
    index: Vec<IndexEntry>,
    index_ok: bool,
    /// The stored index is a strict prefix of the rebuilt one: entries
    /// for batches appended after the last sync, which an unclean stop
    /// loses by design (the index is written only after its log bytes are
    /// durable). Anything else wrong with it is damage.
    index_behind: bool,
}

/// A partition directory's files by kind: segment logs and indexes (start
/// offsets, ascending), staging files left by an interrupted write, and
/// indexes without a log.
struct DirFiles {
    logs: Vec<u64>,
    indexes: Vec<u64>,
    staging: Vec<PathBuf>,
    orphans: Vec<PathBuf>,
}

impl DirFiles {
    fn sort(dir: &Path, entries: &[DirEntry]) -> Self {
        let mut logs = Vec::new();
        let mut indexes = Vec::new();
        let mut staging = Vec::new();
        for entry in entries {
            if entry.kind != FileKind::File {
                continue;
            }
            let Some(name) = entry.name_str() else {
                continue;
            };
            match parse_file_name(name) {
                SegmentFileName::Log(start) => logs.push(start),
                SegmentFileName::Index(start) => indexes.push(start),
                SegmentFileName::Staging => staging.push(dir.join(name)),
                SegmentFileName::Other => {}
            }
        }
        logs.sort_unstable();
        indexes.sort_unstable();
        let orphans = indexes
            .iter()
            .filter(|s| logs.binary_search(s).is_err())
            .map(|s| dir.join(index_file_name(*s)))
            .collect();
        Self {
            logs,
            indexes,
            staging,
            orphans,
        }
    }
}

/// Recovers the partition directory `dir`. A missing directory is an empty
/// partition (no segments). See the module comment for the rules.
pub async fn recover_partition<F: Fs>(
    fs: &F,
    dir: &Path,
    config: RecoveryConfig,
) -> Result<RecoveryReport, RecoveryError> {
    let mut report = RecoveryReport::default();
    let entries = match fs.read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(RecoveryError::io("read_dir", dir, e)),
    };
    let DirFiles {
        logs,
        indexes,
        staging,
        orphans,
    } = DirFiles::sort(dir, &entries);

    let mut plans = Vec::with_capacity(logs.len());
    for (i, &start) in logs.iter().enumerate() {
        plans.push(
            plan_segment(
                fs,
                dir,
                start,
                indexes.binary_search(&start).is_ok(),
                i + 1 == logs.len(),
                config,
            )
            .await?,
        );
    }

    let metas: Vec<SegmentMeta> = plans.iter().map(|p| p.meta).collect();
    check_chain(&metas)?;

    let mut dir_changed = false;
    for path in staging.into_iter().chain(orphans) {
        match fs.remove_file(&path).await {
            Ok(()) => {
                warn!(path = %path.display(), "swept stray file");
                report.swept.push(path);
                dir_changed = true;
            }
            // A failed sweep is not fatal: the file stays invisible.
            Err(e) => warn!(path = %path.display(), error = %e, "could not sweep stray file"),
        }
    }

    for plan in plans {
        let (segment, index_written) = repair_planned(fs, plan, &mut report).await?;
        report.segments.push(segment);
        dir_changed |= index_written;
    }
    if dir_changed {
        fs.sync_dir(dir)
            .await
            .map_err(|e| RecoveryError::io("sync_dir", dir, e))?;
    }
    Ok(report)
}

/// Recovers the one segment of `dir` that starts at `start`, exactly as
/// [`recover_partition`] recovers each segment it finds (steps 2 and 4 of
/// the module comment: read and check, then truncate a torn tail and
/// rewrite an index that differs from the derived one). For a caller that
/// recovers a chain a few segments at a time, so that no single call reads
/// a whole partition (the state-transfer install). `last` says whether the
/// segment is the chain's active one (its index was never synced).
/// Contiguity with its neighbours is the caller's to check
/// ([`check_chain`]); no stray file is swept.
///
/// Returns the segment and whether an index file was written, whose name
/// the caller must make durable with a directory sync.
///
/// # Errors
/// What [`recover_partition`] returns for a segment: I/O on its files, or
/// [`RecoveryError::SegmentStartMismatch`] for a misplaced log.
pub async fn recover_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    start: u64,
    last: bool,
    config: RecoveryConfig,
) -> Result<(RecoveredSegment, bool), RecoveryError> {
    let index_path = dir.join(index_file_name(start));
    let has_index = fs
        .exists(&index_path)
        .await
        .map_err(|e| RecoveryError::io("stat", &index_path, e))?;
    let plan = plan_segment(fs, dir, start, has_index, last, config).await?;
    repair_planned(fs, plan, &mut RecoveryReport::default()).await
}

/// Carries out one segment's plan: truncates its torn tail and rewrites its
/// index when it differs from the derived one, noting both in `report`.
/// Returns the segment and whether an index file was written (its name
/// must be made durable by a directory sync).
async fn repair_planned<F: Fs>(
    fs: &F,
    plan: Plan,
    report: &mut RecoveryReport,
) -> Result<(RecoveredSegment, bool), RecoveryError> {
    let mut index_written = false;
    if plan.file_len > plan.meta.size_bytes {
        let file = open_rw(fs, &plan.log_path).await?;
        file.set_len(plan.meta.size_bytes)
            .await
            .map_err(|e| RecoveryError::io("truncate", &plan.log_path, e))?;
        file.sync_data()
            .await
            .map_err(|e| RecoveryError::io("sync", &plan.log_path, e))?;
        warn!(
            path = %plan.log_path.display(),
            offset = plan.meta.next_offset,
            bytes = plan.file_len - plan.meta.size_bytes,
            reason = ?plan.stop,
            "truncated torn segment tail"
        );
        report.truncated.push(TruncatedTail {
            path: plan.log_path.clone(),
            next_offset: plan.meta.next_offset,
            from_bytes: plan.file_len,
            to_bytes: plan.meta.size_bytes,
            reason: plan.stop.clone(),
        });
    }
    if !plan.index_ok {
        let file = fs
            .open(&plan.index_path, OpenOptions::create_read_write())
            .await
            .map_err(|e| RecoveryError::io("open", &plan.index_path, e))?;
        let bytes = encode_entries(&plan.index);
        let len = bytes.len() as u64;
        let BufResult(res, _) = file.write_all_at(bytes, 0).await;
        res.map_err(|e| RecoveryError::io("write", &plan.index_path, e))?;
        file.set_len(len)
            .await
            .map_err(|e| RecoveryError::io("truncate", &plan.index_path, e))?;
        file.sync_data()
            .await
            .map_err(|e| RecoveryError::io("sync", &plan.index_path, e))?;
        if plan.index_behind {
            info!(path = %plan.index_path.display(), entries = plan.index.len(), "extended a segment index an unclean stop left behind");
        } else {
            warn!(path = %plan.index_path.display(), entries = plan.index.len(), "rebuilt segment index");
        }
        report.rebuilt_indexes.push(plan.index_path.clone());
        // The index may have been created: its name must be durable.
        index_written = true;
    }
    let segment = RecoveredSegment {
        meta: plan.meta,
        index: plan.index,
    };
    Ok((segment, index_written))
}

async fn open_rw<F: Fs>(fs: &F, path: &Path) -> Result<F::File, RecoveryError> {
    fs.open(path, OpenOptions::read_write())
        .await
        .map_err(|e| RecoveryError::io("open", path, e))
}

/// Checks that `metas` (in offset order) form one chain: no empty segment
/// before the last, no hole and no overlap between neighbours.
///
/// # Errors
/// [`RecoveryError::EmptyNonTailSegment`], [`RecoveryError::Hole`] or
/// [`RecoveryError::Overlap`] for the first pair that breaks it.
pub fn check_chain(metas: &[SegmentMeta]) -> Result<(), RecoveryError> {
    for pair in metas.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        let Some(previous_end) = prev.end_offset() else {
            return Err(RecoveryError::EmptyNonTailSegment {
                start: prev.start_offset,
            });
        };
        if next.start_offset > prev.next_offset {
            return Err(RecoveryError::Hole {
                previous_end,
                next_start: next.start_offset,
            });
        }
        if next.start_offset < prev.next_offset {
            return Err(RecoveryError::Overlap {
                previous_end,
                next_start: next.start_offset,
            });
        }
    }
    Ok(())
}

/// The header of the batch `entry` names, when one with the entry's offset
/// and timestamp starts at its position and fits in the file.
async fn entry_names_batch<F: FsFile>(
    file: &F,
    entry: &IndexEntry,
    file_len: u64,
    batch_length_max: u64,
) -> std::io::Result<Option<BatchHeader>> {
    if entry.position.saturating_add(BATCH_HEADER_SIZE as u64) > file_len {
        return Ok(None);
    }
    let header_bytes = file
        .read_exact_at(BATCH_HEADER_SIZE, entry.position)
        .await?;
    let Ok(header) = BatchHeader::decode(&header_bytes, batch_length_max) else {
        return Ok(None);
    };
    let fits = entry
        .position
        .checked_add(header.batch_length)
        .is_some_and(|end| end <= file_len);
    let named = header.base_offset == entry.offset && header.base_timestamp == entry.timestamp;
    Ok((named && fits).then_some(header))
}

/// Whether the batch `entry` names is whole and verifies: read at its
/// position and checked fully, carrying the entry's offset and timestamp.
async fn entry_points_at_valid_batch<F: FsFile>(
    file: &F,
    entry: &IndexEntry,
    file_len: u64,
    batch_length_max: u64,
) -> std::io::Result<bool> {
    let Some(header) = entry_names_batch(file, entry, file_len, batch_length_max).await? else {
        return Ok(false);
    };
    let bytes = file
        .read_exact_at(header.batch_length as usize, entry.position)
        .await?;
    Ok(BatchView::decode_exact(&bytes, Integrity::Verify, batch_length_max).is_ok())
}

/// The stored index of the segment at `start`, bounded by what the log
/// could possibly hold (each entry names a distinct batch of at least 256
/// bytes), with the file's length; empty without an index file.
async fn read_stored_index<F: Fs>(
    fs: &F,
    index_path: &Path,
    has_index: bool,
    file_len: u64,
) -> Result<(Vec<IndexEntry>, u64), RecoveryError> {
    if !has_index {
        return Ok((Vec::new(), 0));
    }
    let index = fs
        .open(index_path, OpenOptions::read_only())
        .await
        .map_err(|e| RecoveryError::io("open", index_path, e))?;
    let stored_len = index
        .len()
        .await
        .map_err(|e| RecoveryError::io("stat", index_path, e))?;
    let cap = (file_len / BATCH_HEADER_SIZE as u64 + 1) * INDEX_ENTRY_SIZE as u64;
    let read_len = stored_len.min(cap) as usize;
    let bytes = index
        .read_exact_at(read_len, 0)
        .await
        .map_err(|e| RecoveryError::io("read", index_path, e))?;
    Ok((decode_entries(&bytes), stored_len))
}

/// How many of `stored` form the longest well-formed prefix: the first at
/// byte 0 with the segment's start offset, strictly increasing after that,
/// every one inside the file.
fn well_formed_prefix(stored: &[IndexEntry], start: u64, file_len: u64) -> usize {
    let mut sane = 0;
    for (i, e) in stored.iter().enumerate() {
        let ok = if i == 0 {
            e.position == 0 && e.offset == start
        } else {
            let p = &stored[i - 1];
            e.position > p.position && e.offset > p.offset
        };
        if !ok || e.position >= file_len {
            break;
        }
        sane = i + 1;
    }
    sane
}

/// Whether the first batch carries entry 0's offset and timestamp: a lost
/// (zero-filled) first entry under a surviving later one would otherwise
/// pass as "offset 0 at position 0" in a segment starting at 0. Later
/// zeroed or torn entries fail the increasing-position check.
async fn first_entry_names_first_batch<F: FsFile>(
    log: &F,
    log_path: &Path,
    first: &IndexEntry,
    batch_length_max: u64,
) -> Result<bool, RecoveryError> {
    match log.read_exact_at(BATCH_HEADER_SIZE, 0).await {
        Ok(bytes) => Ok(BatchHeader::decode(&bytes, batch_length_max)
            .is_ok_and(|h| h.base_offset == first.offset && h.base_timestamp == first.timestamp)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(RecoveryError::io("read", log_path, e)),
    }
}

/// The last segment's index was never synced (only a seal syncs one), and
/// a crash keeps its unsynced entry writes in any combination, a torn one
/// included: an entry can be wrong under a later one that survived whole,
/// which the increasing check may not see (a position torn from 660 to 148
/// still increases). Each entry must name its batch, or the entries from
/// it on are not trusted: how many of the first `sane` do. Sealed
/// segments' indexes were synced before the next segment existed.
async fn entries_naming_their_batches<F: FsFile>(
    log: &F,
    log_path: &Path,
    stored: &[IndexEntry],
    sane: usize,
    file_len: u64,
    batch_length_max: u64,
) -> Result<usize, RecoveryError> {
    for (k, entry) in stored.iter().enumerate().take(sane).skip(1) {
        let named = entry_names_batch(log, entry, file_len, batch_length_max)
            .await
            .map_err(|e| RecoveryError::io("read", log_path, e))?;
        if named.is_none() {
            return Ok(k);
        }
    }
    Ok(sane)
}

/// How many of the first `sane` entries to keep: up to the last one that
/// still points at a valid batch, where the walk starts. Entries after it
/// are ahead of the log (index written, log write lost) or damaged.
async fn trusted_prefix<F: FsFile>(
    log: &F,
    log_path: &Path,
    stored: &[IndexEntry],
    sane: usize,
    file_len: u64,
    batch_length_max: u64,
) -> Result<usize, RecoveryError> {
    for k in (0..sane).rev() {
        let ok = entry_points_at_valid_batch(log, &stored[k], file_len, batch_length_max)
            .await
            .map_err(|e| RecoveryError::io("read", log_path, e))?;
        if ok {
            return Ok(k + 1);
        }
    }
    Ok(0)
}

/// Plans the recovery of the segment at `start`: which of its stored index
/// entries to trust, then a verifying walk of its batches from the last
/// trusted one to the first that fails, deriving the index entries and
/// the segment's metadata on the way.
async fn plan_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    start: u64,
    has_index: bool,
    last: bool,
    config: RecoveryConfig,
) -> Result<Plan, RecoveryError> {
    let log_path = dir.join(log_file_name(start));
    let index_path = dir.join(index_file_name(start));
    let log = fs
        .open(&log_path, OpenOptions::read_only())
        .await
        .map_err(|e| RecoveryError::io("open", &log_path, e))?;
    let file_len = log
        .len()
        .await
        .map_err(|e| RecoveryError::io("stat", &log_path, e))?;
    let (stored, stored_len) = read_stored_index(fs, &index_path, has_index, file_len).await?;
    let trusted =
        trusted_index_entries(&log, &log_path, &stored, start, file_len, last, config).await?;
    let (meta, index, stop) = walk_from_trusted(
        &log,
        &log_path,
        start,
        stored[..trusted].to_vec(),
        file_len,
        config,
    )
    .await?;
    let (index_ok, index_behind) = stored_index_state(has_index, &stored, stored_len, &index);
    Ok(Plan {
        log_path,
        index_path,
        meta,
        file_len,
        stop,
        index,
        index_ok,
        index_behind,
    })
}

/// How many stored index entries the walk may trust: a well-formed
/// prefix whose first entry names the first batch, in the last segment
/// only the entries that name their batches, cut back to the last entry
/// that still points at a valid batch.
async fn trusted_index_entries<F: FsFile>(
    log: &F,
    log_path: &Path,
    stored: &[IndexEntry],
    start: u64,
    file_len: u64,
    last: bool,
    config: RecoveryConfig,
) -> Result<usize, RecoveryError> {
    let batch_length_max = config.batch_length_max;
    let mut sane = well_formed_prefix(stored, start, file_len);
    if sane > 0
        && !first_entry_names_first_batch(log, log_path, &stored[0], batch_length_max).await?
    {
        sane = 0;
    }
    if last {
        sane =
            entries_naming_their_batches(log, log_path, stored, sane, file_len, batch_length_max)
                .await?;
    }
    trusted_prefix(log, log_path, stored, sane, file_len, batch_length_max).await
}

/// The verifying walk from the last trusted index entry (or byte 0) to the
/// first batch that fails: the segment's metadata, the index extended by
/// the policy, and where and why the walk stopped. A first batch that is
/// whole and verified but carries the wrong offset is a misplaced file,
/// refused rather than truncated away.
async fn walk_from_trusted<F: FsFile>(
    log: &F,
    log_path: &Path,
    start: u64,
    mut index: Vec<IndexEntry>,
    file_len: u64,
    config: RecoveryConfig,
) -> Result<(SegmentMeta, Vec<IndexEntry>, WalkStop), RecoveryError> {
    let (walk_from, expected) = match index.last() {
        Some(e) => (e.position, e.offset),
        None => (0, start),
    };
    let mut meta = SegmentMeta::empty(start);
    if let Some(first) = index.first() {
        meta.start_timestamp = first.timestamp;
    }
    let mut last_header: Option<BatchHeader> = None;
    let policy = config.index;
    let Walk { end_position, stop } = walk_batches(
        log,
        walk_from,
        file_len,
        expected,
        Integrity::Verify,
        config.batch_length_max,
        |position, header| {
            if position == 0 {
                meta.start_timestamp = header.base_timestamp;
            }
            if policy.should_index(index.last(), position) {
                index.push(IndexEntry {
                    offset: header.base_offset,
                    timestamp: header.base_timestamp,
                    position,
                });
            }
            last_header = Some(*header);
        },
    )
    .await
    .map_err(|e| RecoveryError::io("read", log_path, e))?;

    if end_position == 0
        && let WalkStop::OffsetGap { expected, found } = stop
    {
        // Not a torn append: truncating would throw away a whole file.
        return Err(RecoveryError::SegmentStartMismatch {
            path: log_path.to_path_buf(),
            expected,
            found,
        });
    }

    meta.size_bytes = end_position;
    match last_header {
        Some(h) => {
            meta.next_offset = h.next_offset();
            meta.end_timestamp = h.base_timestamp;
        }
        None => {
            // Only possible when the walk started at byte 0 and found no
            // valid batch: the segment is empty.
            debug_assert_eq!(end_position, 0);
            meta = SegmentMeta::empty(start);
        }
    }
    Ok((meta, index, stop))
}

/// Whether the stored index file already equals the derived index (`ok`),
/// or, failing that, is a clean prefix of it that appending completes
/// (`behind`).
fn stored_index_state(
    has_index: bool,
    stored: &[IndexEntry],
    stored_len: u64,
    index: &[IndexEntry],
) -> (bool, bool) {
    let index_ok =
        has_index && stored_len == (index.len() * INDEX_ENTRY_SIZE) as u64 && stored == index;
    let index_behind = !index_ok
        && stored_len == (stored.len() * INDEX_ENTRY_SIZE) as u64
        && stored.len() < index.len()
        && index.starts_with(stored);
    (index_ok, index_behind)
}
