//! Segment files and the byte-level walks over them.
//!
//! A segment is `{start_offset:020}.log` (batch records back to back: no
//! file header, no padding) plus its sparse `{start_offset:020}.index`.
//! This module names the files, appends to a log ([`LogWriter`]), and walks
//! stored batches: [`walk_batches`] (recovery: validate every batch, stop at
//! the first that fails), [`find_batch`] (readers: headers only, from an
//! index hint to the batch wanted) and [`read_batches_at`] (readers: whole,
//! verified batches from a position).

use std::io;
use std::path::Path;

use crate::batch::{BATCH_HEADER_SIZE, BatchError, BatchHeader, BatchView, Integrity};
use crate::error::StorageError;
use crate::fs::{BufResult, FsFile, IoBuf};

/// Extension of segment log files.
pub const LOG_EXTENSION: &str = "log";
/// Extension of segment index files.
pub const INDEX_EXTENSION: &str = "index";
/// Suffix of state-transfer scratch files, swept at boot.
pub const STAGING_SUFFIX: &str = ".staging";

/// Bytes read per window when walking headers or batches.
const WALK_WINDOW_BYTES: usize = 1024 * 1024;
/// Bytes read per window when locating a batch from an index hint (about
/// one index stride, so one read usually suffices).
const FIND_WINDOW_BYTES: usize = 64 * 1024 + BATCH_HEADER_SIZE;

/// `{start_offset:020}.log`.
pub fn log_file_name(start_offset: u64) -> String {
    format!("{start_offset:020}.{LOG_EXTENSION}")
}

/// `{start_offset:020}.index`.
pub fn index_file_name(start_offset: u64) -> String {
    format!("{start_offset:020}.{INDEX_EXTENSION}")
}

/// What a file name in a partition directory is, as far as segments go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFileName {
    /// A segment log starting at this offset.
    Log(u64),
    /// A segment index starting at this offset.
    Index(u64),
    /// A `.staging` scratch file (invisible to recovery, swept).
    Staging,
    /// Anything else (superblock, purge generation, offsets directory…).
    Other,
}

/// Classifies a file name. Segment stems must be exactly 20 decimal digits.
pub fn parse_file_name(name: &str) -> SegmentFileName {
    if name.ends_with(STAGING_SUFFIX) {
        return SegmentFileName::Staging;
    }
    let Some((stem, ext)) = name.split_once('.') else {
        return SegmentFileName::Other;
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return SegmentFileName::Other;
    }
    let Ok(start) = stem.parse::<u64>() else {
        return SegmentFileName::Other;
    };
    match ext {
        LOG_EXTENSION => SegmentFileName::Log(start),
        INDEX_EXTENSION => SegmentFileName::Index(start),
        _ => SegmentFileName::Other,
    }
}

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentMeta {
    /// Offset in the file name: the first offset the segment may hold.
    pub start_offset: u64,
    /// One past the last offset held (`start_offset` when empty).
    pub next_offset: u64,
    /// Bytes of whole batches in the log file.
    pub size_bytes: u64,
    /// Base timestamp of the first batch (0 when empty).
    pub start_timestamp: u64,
    /// Base timestamp of the last batch (0 when empty).
    pub end_timestamp: u64,
}

impl SegmentMeta {
    /// An empty segment at `start_offset`.
    pub fn empty(start_offset: u64) -> Self {
        Self {
            start_offset,
            next_offset: start_offset,
            size_bytes: 0,
            start_timestamp: 0,
            end_timestamp: 0,
        }
    }

    /// True when the segment holds no batch.
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// Last offset held, `None` when empty.
    pub fn end_offset(&self) -> Option<u64> {
        (!self.is_empty()).then(|| self.next_offset - 1)
    }

    /// Accounts for a batch appended at the end.
    pub fn record(&mut self, header: &BatchHeader) {
        if self.is_empty() {
            self.start_timestamp = header.base_timestamp;
        }
        self.size_bytes += header.batch_length;
        self.next_offset = header.next_offset();
        self.end_timestamp = header.base_timestamp;
    }
}

/// Appends batch records to a segment's `.log` at a cursor, with optional
/// fdatasync after each append. After a failed sync the writer refuses
/// further appends: the kernel may have dropped the dirty pages, so what
/// the file holds is unknown until recovery walks it.
#[derive(Debug)]
pub struct LogWriter<F: FsFile> {
    file: F,
    cursor: u64,
    fsync: bool,
    sync_failed: bool,
}

impl<F: FsFile> LogWriter<F> {
    /// A writer appending at `cursor` (the recovered, physically truncated
    /// length). With `fsync`, every append is followed by `sync_data`.
    pub fn new(file: F, cursor: u64, fsync: bool) -> Self {
        Self {
            file,
            cursor,
            fsync,
            sync_failed: false,
        }
    }

    /// True once a sync of this file failed (the writer is then unusable).
    pub fn sync_failed(&self) -> bool {
        self.sync_failed
    }

    /// Reserves `len` bytes of disk for the file without changing its
    /// length (best effort; see [`FsFile::preallocate`]).
    pub async fn preallocate(&self, len: u64) -> io::Result<()> {
        self.file.preallocate(len).await
    }

    /// Writes `buf` at the cursor (and fdatasyncs it when configured) and
    /// advances the cursor; returns the position the bytes start at. On
    /// error the cursor is unchanged: a failed write may have partly landed
    /// (see [`LogWriter::rewind_to`]); a failed sync poisons the writer.
    pub async fn append<B: IoBuf>(&mut self, buf: B) -> BufResult<u64, B> {
        if self.sync_failed {
            return BufResult(Err(sync_failed_error()), buf);
        }
        let len = buf.buf_len() as u64;
        let position = self.cursor;
        let BufResult(res, buf) = self.file.write_all_at(buf, position).await;
        if let Err(e) = res {
            return BufResult(Err(e), buf);
        }
        if self.fsync
            && let Err(e) = self.file.sync_data().await
        {
            self.sync_failed = true;
            return BufResult(Err(e), buf);
        }
        self.cursor += len;
        BufResult(Ok(position), buf)
    }

    /// Physically cuts the file at `position` and moves the cursor there
    /// (undoing a failed or rolled-back append).
    pub async fn rewind_to(&mut self, position: u64) -> io::Result<()> {
        self.file.set_len(position).await?;
        self.cursor = position;
        Ok(())
    }

    /// fdatasync of the log. A failure poisons the writer.
    pub async fn sync(&mut self) -> io::Result<()> {
        if self.sync_failed {
            return Err(sync_failed_error());
        }
        let res = self.file.sync_data().await;
        self.sync_failed = res.is_err();
        res
    }

    /// The append position.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The file (for reads of the active segment).
    pub fn file(&self) -> &F {
        &self.file
    }
}

fn sync_failed_error() -> io::Error {
    io::Error::other("an earlier sync of this segment failed; reopen to recover")
}

/// Why a walk stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkStop {
    /// The walk reached the end exactly on a batch boundary.
    End,
    /// A batch runs past the end of the file (a torn append).
    Incomplete {
        /// Bytes the batch declares.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A batch failed validation.
    Invalid(BatchError),
    /// A valid batch does not continue the offsets.
    OffsetGap {
        /// The offset expected.
        expected: u64,
        /// The batch's base offset.
        found: u64,
    },
}

/// Result of [`walk_batches`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// Position after the last valid batch.
    pub end_position: u64,
    /// Why the walk stopped.
    pub stop: WalkStop,
}

/// Walks batches from `position` to `file_len`, validating each with
/// `integrity` and requiring base offsets to continue from
/// `expected_offset`. Calls `on_batch(position, header)` for every valid
/// batch; stops at the first that is incomplete, invalid or discontinuous.
/// Memory is bounded by one window plus one batch (≤ `batch_length_max`).
pub async fn walk_batches<F: FsFile>(
    file: &F,
    mut position: u64,
    file_len: u64,
    mut expected_offset: u64,
    integrity: Integrity,
    batch_length_max: u64,
    mut on_batch: impl FnMut(u64, &BatchHeader),
) -> io::Result<Walk> {
    let mut window: Vec<u8> = Vec::new();
    let mut window_pos = position;
    loop {
        if position == file_len {
            return Ok(Walk {
                end_position: position,
                stop: WalkStop::End,
            });
        }
        let available = file_len - position;
        // Ensure the header is in the window.
        let rel = usize::try_from(position - window_pos).unwrap_or(usize::MAX);
        if rel.saturating_add(BATCH_HEADER_SIZE) > window.len() {
            let want = available.min(WALK_WINDOW_BYTES as u64) as usize;
            window = file.read_exact_into(window, want, position).await?;
            window_pos = position;
        }
        let rel = (position - window_pos) as usize;
        let header = match BatchHeader::decode(&window[rel..], batch_length_max) {
            Ok(h) => h,
            Err(BatchError::Truncated { needed, available }) => {
                return Ok(Walk {
                    end_position: position,
                    stop: WalkStop::Incomplete { needed, available },
                });
            }
            Err(e) => {
                return Ok(Walk {
                    end_position: position,
                    stop: WalkStop::Invalid(e),
                });
            }
        };
        if header.batch_length > available {
            return Ok(Walk {
                end_position: position,
                stop: WalkStop::Incomplete {
                    needed: header.batch_length,
                    available,
                },
            });
        }
        let len = header.batch_length as usize;
        if rel + len > window.len() {
            // Refill so the whole batch is in the window (bounded: the
            // header decoder capped batch_length).
            let want = available.min((WALK_WINDOW_BYTES.max(len)) as u64) as usize;
            window = file.read_exact_into(window, want, position).await?;
            window_pos = position;
        }
        let rel = (position - window_pos) as usize;
        if let Err(e) = BatchView::decode_prefix(&window[rel..], integrity, batch_length_max) {
            return Ok(Walk {
                end_position: position,
                stop: WalkStop::Invalid(e),
            });
        }
        if header.base_offset != expected_offset {
            return Ok(Walk {
                end_position: position,
                stop: WalkStop::OffsetGap {
                    expected: expected_offset,
                    found: header.base_offset,
                },
            });
        }
        on_batch(position, &header);
        expected_offset = header.next_offset();
        position += header.batch_length;
    }
}

/// Walks batch headers (layout checks only) from `position` until `wanted`
/// accepts one; returns its position and header, or `None` when the walk
/// reaches `limit`. A header that fails to decode is corruption.
pub async fn find_batch<F: FsFile>(
    file: &F,
    path: &Path,
    mut position: u64,
    limit: u64,
    batch_length_max: u64,
    wanted: impl Fn(&BatchHeader) -> bool,
) -> Result<Option<(u64, BatchHeader)>, StorageError> {
    let mut window: Vec<u8> = Vec::new();
    let mut window_pos = position;
    while position < limit {
        let rel = usize::try_from(position - window_pos).unwrap_or(usize::MAX);
        if rel.saturating_add(BATCH_HEADER_SIZE) > window.len() {
            let want = (limit - position).min(FIND_WINDOW_BYTES as u64) as usize;
            window = file
                .read_exact_into(window, want, position)
                .await
                .map_err(|e| StorageError::io("read", path, e))?;
            window_pos = position;
        }
        let rel = (position - window_pos) as usize;
        let header = BatchHeader::decode(&window[rel..], batch_length_max).map_err(|source| {
            StorageError::Corrupt {
                path: path.to_path_buf(),
                position,
                source,
            }
        })?;
        if wanted(&header) {
            return Ok(Some((position, header)));
        }
        position += header.batch_length;
    }
    Ok(None)
}

/// Whole batches read from one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatches {
    /// The batches' bytes, back to back (already validated).
    pub bytes: Vec<u8>,
    /// Start offset of the segment they came from.
    pub segment_start: u64,
    /// Position of the first batch in the segment's log.
    pub position: u64,
    /// Position right after the last batch (where a sequential reader
    /// continues).
    pub next_position: u64,
}

impl ReadBatches {
    /// The buffer, for reuse by the next read.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// True when nothing was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The batches, in order. They were validated when read, so the layout
    /// check here cannot fail; iteration stops early if it somehow did.
    pub fn batches(&self) -> impl Iterator<Item = BatchView<'_>> {
        let mut rest: &[u8] = &self.bytes;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let view = BatchView::decode_prefix(rest, Integrity::LayoutOnly, u64::MAX).ok()?;
            rest = &rest[view.bytes().len()..];
            Some(view)
        })
    }
}

/// How much to read and how hard to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// About how many bytes to return (at least one whole batch is
    /// returned when one exists, even if larger).
    pub max_bytes: u64,
    /// Validation applied to every batch read.
    pub integrity: Integrity,
    /// Ceiling on a stored batch's length.
    pub batch_length_max: u64,
}

/// Reads whole batches from `position` (a batch boundary) up to `limit`
/// (the segment's size), as bounded by `limits`, into `buf` (cleared and
/// reused, so a sequential reader allocates once). Each batch is
/// validated; a failure is [`StorageError::Corrupt`] naming the file and
/// position.
pub async fn read_batches_at<F: FsFile>(
    file: &F,
    path: &Path,
    segment_start: u64,
    (position, limit): (u64, u64),
    limits: ReadLimits,
    buf: Vec<u8>,
) -> Result<ReadBatches, StorageError> {
    let ReadLimits {
        max_bytes,
        integrity,
        batch_length_max,
    } = limits;
    let mut out = ReadBatches {
        bytes: Vec::new(),
        segment_start,
        position,
        next_position: position,
    };
    if position >= limit {
        return Ok(out);
    }
    let want = (limit - position).min(max_bytes.max(BATCH_HEADER_SIZE as u64));
    let io_err = |e| StorageError::io("read", path, e);
    let mut buf = file
        .read_exact_into(buf, want as usize, position)
        .await
        .map_err(io_err)?;
    let corrupt = |at: u64, source| StorageError::Corrupt {
        path: path.to_path_buf(),
        position: at,
        source,
    };
    let mut consumed: usize = 0;
    loop {
        let at = position + consumed as u64;
        let rest = buf.len() - consumed;
        if rest < BATCH_HEADER_SIZE {
            if consumed == 0 {
                // Less than a header before the segment's end: the recorded
                // size does not end on a batch boundary.
                return Err(corrupt(
                    at,
                    BatchError::Truncated {
                        needed: BATCH_HEADER_SIZE as u64,
                        available: rest as u64,
                    },
                ));
            }
            break;
        }
        let header =
            BatchHeader::decode(&buf[consumed..], batch_length_max).map_err(|e| corrupt(at, e))?;
        let len = header.batch_length as usize;
        if len > rest {
            if consumed > 0 {
                break;
            }
            // The first batch is larger than `max_bytes`: read the rest of
            // it (bounded by the header check and the segment's size).
            let missing = len - rest;
            if at + len as u64 > limit {
                return Err(corrupt(
                    at,
                    BatchError::Truncated {
                        needed: len as u64,
                        available: limit - at,
                    },
                ));
            }
            buf.reserve_exact(missing);
            let end = buf.len() as u64;
            let BufResult(res, back) = read_more(file, buf, missing, position + end).await;
            buf = back;
            res.map_err(io_err)?;
        }
        BatchView::decode_prefix(&buf[consumed..], integrity, batch_length_max)
            .map_err(|e| corrupt(at, e))?;
        consumed += len;
    }
    buf.truncate(consumed);
    out.next_position = position + consumed as u64;
    out.bytes = buf;
    Ok(out)
}

/// Appends exactly `len` bytes read at `pos` to `buf`.
async fn read_more<F: FsFile>(
    file: &F,
    mut buf: Vec<u8>,
    len: usize,
    pos: u64,
) -> BufResult<(), Vec<u8>> {
    let start_len = buf.len();
    let target = start_len + len;
    while buf.len() < target {
        let have = buf.len();
        let BufResult(res, back) = file
            .read_at(buf, pos + (have - start_len) as u64, target - have)
            .await;
        buf = back;
        match res {
            Ok(0) => {
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "segment shorter than its size",
                );
                return BufResult(Err(e), buf);
            }
            Ok(_) => {}
            Err(e) => return BufResult(Err(e), buf),
        }
    }
    BufResult(Ok(()), buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_segment_names_when_parsed_should_classify() {
        assert_eq!(log_file_name(42), "00000000000000000042.log");
        assert_eq!(
            parse_file_name("00000000000000000042.log"),
            SegmentFileName::Log(42)
        );
        assert_eq!(
            parse_file_name(&index_file_name(u64::MAX)),
            SegmentFileName::Index(u64::MAX)
        );
        assert_eq!(
            parse_file_name("00000000000000000042.log.staging"),
            SegmentFileName::Staging
        );
        assert_eq!(parse_file_name("42.log"), SegmentFileName::Other);
        assert_eq!(
            parse_file_name("99999999999999999999.log"),
            SegmentFileName::Other
        );
        assert_eq!(parse_file_name("superblock.a"), SegmentFileName::Other);
        assert_eq!(
            parse_file_name("0000000000000000004x.log"),
            SegmentFileName::Other
        );
    }
}
