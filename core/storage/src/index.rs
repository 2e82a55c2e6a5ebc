//! The sparse segment index: `{start_offset:020}.index`, 24-byte
//! little-endian entries `(offset, timestamp, position)`, one for the first
//! batch of the segment and then one whenever at least
//! [`INDEX_STRIDE_BYTES_DEFAULT`] bytes of log were written since the last
//! indexed batch. Entry count is `file_len / 24`; a trailing partial entry
//! (a torn index write) is ignored on read and cut off by recovery.
//!
//! The index is a hint for where to start walking; recovery re-derives the
//! tail from the log. The segmented log writes an entry to the file only
//! after the log bytes it points at are synced, so an entry found on disk
//! proves the log prefix before it (see `log.rs`).

use std::io;

use common::le_cursor::{LeField, tiles};

use crate::fs::{BufResult, FsFile};

/// Size of one index entry.
pub const INDEX_ENTRY_SIZE: usize = 24;
/// Default bytes of log between two index entries.
pub const INDEX_STRIDE_BYTES_DEFAULT: u64 = 64 * 1024;

// An entry's fields, each declared once for the encoder and the decoder.
const OFFSET: LeField<u64> = LeField::at(0);
const TIMESTAMP: LeField<u64> = LeField::at(8);
const POSITION: LeField<u64> = LeField::at(16);
const _: () = assert!(tiles(
    INDEX_ENTRY_SIZE,
    &[OFFSET.range(), TIMESTAMP.range(), POSITION.range()]
));

/// One index entry: where a batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The batch's base offset.
    pub offset: u64,
    /// The batch's base timestamp (µs).
    pub timestamp: u64,
    /// Byte position of the batch header in the `.log` file.
    pub position: u64,
}

impl IndexEntry {
    /// The entry's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_SIZE] {
        let mut out = [0u8; INDEX_ENTRY_SIZE];
        OFFSET.put(&mut out, self.offset);
        TIMESTAMP.put(&mut out, self.timestamp);
        POSITION.put(&mut out, self.position);
        out
    }

    /// Decodes one entry from exactly 24 bytes.
    pub fn decode(bytes: &[u8; INDEX_ENTRY_SIZE]) -> Self {
        Self {
            offset: OFFSET.get(bytes),
            timestamp: TIMESTAMP.get(bytes),
            position: POSITION.get(bytes),
        }
    }
}

/// Decodes every whole entry of an index file's bytes; a trailing partial
/// entry is ignored.
pub fn decode_entries(bytes: &[u8]) -> Vec<IndexEntry> {
    bytes
        .chunks_exact(INDEX_ENTRY_SIZE)
        .map(|c| {
            let mut e = [0u8; INDEX_ENTRY_SIZE];
            e.copy_from_slice(c);
            IndexEntry::decode(&e)
        })
        .collect()
}

/// Encodes entries back to back.
pub fn encode_entries(entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * INDEX_ENTRY_SIZE);
    for e in entries {
        out.extend_from_slice(&e.encode());
    }
    out
}

/// The last entry whose offset is ≤ `offset` (where a walk for `offset`
/// starts), or `None` when `offset` precedes every entry (walk from 0).
pub fn lower_bound_by_offset(entries: &[IndexEntry], offset: u64) -> Option<IndexEntry> {
    let n = entries.partition_point(|e| e.offset <= offset);
    n.checked_sub(1).map(|i| entries[i])
}

/// The last entry whose timestamp is strictly below `timestamp`: every batch
/// before it is older than the target, so a walk for the first batch with
/// `base_timestamp >= timestamp` may start there. `None` means walk from 0.
pub fn lower_bound_by_timestamp(entries: &[IndexEntry], timestamp: u64) -> Option<IndexEntry> {
    let n = entries.partition_point(|e| e.timestamp < timestamp);
    n.checked_sub(1).map(|i| entries[i])
}

/// Decides which batches get an index entry: the first of the segment, then
/// the first at least `stride_bytes` past the last indexed one. Recovery
/// uses the same rule to rebuild an index, so a rebuilt index equals the one
/// the writer would have produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexPolicy {
    /// Minimum log bytes between two entries.
    pub stride_bytes: u64,
}

impl Default for IndexPolicy {
    fn default() -> Self {
        Self {
            stride_bytes: INDEX_STRIDE_BYTES_DEFAULT,
        }
    }
}

impl IndexPolicy {
    /// Whether a batch at `position` is indexed, given the last entry.
    pub fn should_index(&self, last: Option<&IndexEntry>, position: u64) -> bool {
        match last {
            None => true,
            Some(e) => position >= e.position.saturating_add(self.stride_bytes),
        }
    }
}

/// Appends entries to an `.index` file at its own cursor.
#[derive(Debug)]
pub struct IndexWriter<F: FsFile> {
    file: F,
    cursor: u64,
}

impl<F: FsFile> IndexWriter<F> {
    /// A writer appending at `cursor` (the file's length after recovery).
    pub fn new(file: F, cursor: u64) -> Self {
        Self { file, cursor }
    }

    /// Appends several entries with one positional write.
    pub async fn append_all(&mut self, entries: &[IndexEntry]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let bytes = encode_entries(entries);
        let len = bytes.len() as u64;
        let BufResult(res, _) = self.file.write_all_at(bytes, self.cursor).await;
        res?;
        self.cursor += len;
        Ok(())
    }

    /// Cuts the index to its first `entries` entries.
    pub async fn truncate_entries(&mut self, entries: usize) -> io::Result<()> {
        let len = (entries * INDEX_ENTRY_SIZE) as u64;
        self.file.set_len(len).await?;
        self.cursor = len;
        Ok(())
    }

    /// fdatasync of the index file.
    pub async fn sync(&self) -> io::Result<()> {
        self.file.sync_data().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(offset: u64, timestamp: u64, position: u64) -> IndexEntry {
        IndexEntry {
            offset,
            timestamp,
            position,
        }
    }

    #[test]
    fn given_entries_when_encoded_should_decode_and_ignore_partial_tail() {
        let entries = vec![e(0, 10, 0), e(5, 20, 70_000), e(9, 30, 140_000)];
        let mut bytes = encode_entries(&entries);
        assert_eq!(bytes.len(), 72);
        bytes.extend_from_slice(&[1, 2, 3]);
        assert_eq!(decode_entries(&bytes), entries);
    }

    #[test]
    fn given_sorted_entries_when_looked_up_should_return_lower_bounds() {
        let entries = vec![e(10, 100, 0), e(20, 200, 70_000), e(30, 300, 140_000)];
        assert_eq!(lower_bound_by_offset(&entries, 9), None);
        assert_eq!(lower_bound_by_offset(&entries, 10), Some(entries[0]));
        assert_eq!(lower_bound_by_offset(&entries, 29), Some(entries[1]));
        assert_eq!(lower_bound_by_offset(&entries, 99), Some(entries[2]));
        assert_eq!(lower_bound_by_timestamp(&entries, 100), None);
        assert_eq!(lower_bound_by_timestamp(&entries, 201), Some(entries[1]));
    }

    #[test]
    fn given_policy_when_positions_advance_should_index_first_and_every_stride() {
        let p = IndexPolicy { stride_bytes: 100 };
        assert!(p.should_index(None, 0));
        let last = e(0, 0, 0);
        assert!(!p.should_index(Some(&last), 99));
        assert!(p.should_index(Some(&last), 100));
    }
}
