//! Validation of a received segment artifact: every batch header and
//! checksum, the declared base offset, offset continuity and overflow, and
//! a rebuilt sparse index.
//!
//! [`SegmentWalker`] is incremental: it takes the artifact's bytes in any
//! split, as chunks arrive, holding back only a batch that straddles a chunk
//! boundary (bounded by the batch length ceiling, checked from the header
//! before anything is buffered). A receiver can therefore validate and
//! stream each chunk to its staging file as it lands instead of buffering
//! the whole artifact, and the CPU work comes in slices no larger than a
//! chunk, between which the shard runs its other groups' ticks.

use std::fmt;

use storage::batch::{
    BATCH_HEADER_SIZE, BATCH_LENGTH_MAX_DEFAULT, BatchError, BatchHeader, BatchView, Integrity,
};
use storage::index::{INDEX_STRIDE_BYTES_DEFAULT, IndexEntry, encode_entries};

/// What a complete walk derived about a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWalkStats {
    /// Offset of the segment's last message.
    pub end_offset: u64,
    /// Base timestamp of the first batch.
    pub start_timestamp: u64,
    /// Base timestamp of the last batch.
    pub end_timestamp: u64,
    /// Largest base timestamp.
    pub max_timestamp: u64,
}

/// Why a segment artifact's bytes are not a valid segment. The manifest
/// checksum proved transit only; these are about the bytes themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentWalkError {
    /// A batch failed its header or checksum validation.
    Batch {
        /// Byte position of the batch in the artifact.
        position: u64,
        /// What was wrong.
        source: BatchError,
    },
    /// The first batch does not start at the manifest's base offset.
    BaseOffsetMismatch {
        /// The manifest's base offset.
        expected: u64,
        /// The first batch's base offset.
        actual: u64,
    },
    /// A batch does not continue the previous one.
    NonContiguous {
        /// The offset expected.
        expected: u64,
        /// The batch's base offset.
        actual: u64,
    },
    /// A batch's offsets run past `u64::MAX`.
    OffsetOverflow {
        /// Byte position of the batch.
        position: u64,
    },
    /// The payload holds no batches (empty segments are never offered).
    Empty,
    /// The payload ends inside a batch.
    PartialBatch {
        /// Byte position of the incomplete batch.
        position: u64,
        /// Bytes of it present.
        present: u64,
    },
}

impl fmt::Display for SegmentWalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Batch { position, source } => {
                write!(f, "segment batch at byte {position} rejected: {source}")
            }
            Self::BaseOffsetMismatch { expected, actual } => write!(
                f,
                "segment's first batch starts at offset {actual}, the manifest says {expected}"
            ),
            Self::NonContiguous { expected, actual } => write!(
                f,
                "segment batch starts at offset {actual}, expected {expected}"
            ),
            Self::OffsetOverflow { position } => {
                write!(
                    f,
                    "segment batch at byte {position} overflows the offset space"
                )
            }
            Self::Empty => f.write_str("segment payload holds no batches"),
            Self::PartialBatch { position, present } => write!(
                f,
                "segment payload ends inside the batch at byte {position} ({present} bytes of it present)"
            ),
        }
    }
}

impl std::error::Error for SegmentWalkError {}

/// An incremental walk over one segment artifact.
#[derive(Debug)]
pub struct SegmentWalker {
    base_offset: u64,
    batch_length_max: u64,
    index_stride_bytes: u64,
    /// Bytes of the artifact consumed as whole batches.
    position: u64,
    /// A batch straddling the last chunk boundary.
    carry: Vec<u8>,
    next_offset: u64,
    stats: Option<SegmentWalkStats>,
    index: Vec<IndexEntry>,
}

impl SegmentWalker {
    /// A walk of a segment declared to start at `base_offset`, with the
    /// default batch ceiling and the 64 KiB index stride.
    pub fn new(base_offset: u64) -> Self {
        Self::with_limits(
            base_offset,
            BATCH_LENGTH_MAX_DEFAULT,
            INDEX_STRIDE_BYTES_DEFAULT,
        )
    }

    /// A walk with explicit limits.
    pub fn with_limits(base_offset: u64, batch_length_max: u64, index_stride_bytes: u64) -> Self {
        Self {
            base_offset,
            batch_length_max,
            index_stride_bytes,
            position: 0,
            carry: Vec::new(),
            next_offset: base_offset,
            stats: None,
            index: Vec::new(),
        }
    }

    /// Bytes validated as whole batches so far.
    pub const fn walked_bytes(&self) -> u64 {
        self.position
    }

    /// Bytes held back because a batch straddles a chunk boundary.
    pub fn carried_bytes(&self) -> usize {
        self.carry.len()
    }

    /// Takes the next bytes of the artifact, in order.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), SegmentWalkError> {
        loop {
            if !self.carry.is_empty() {
                if self.carry.len() < BATCH_HEADER_SIZE {
                    let take = (BATCH_HEADER_SIZE - self.carry.len()).min(chunk.len());
                    self.carry.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    if self.carry.len() < BATCH_HEADER_SIZE {
                        return Ok(());
                    }
                }
                let len = self.batch_length(&self.carry)?;
                let take = (len - self.carry.len()).min(chunk.len());
                self.carry.extend_from_slice(&chunk[..take]);
                chunk = &chunk[take..];
                if self.carry.len() < len {
                    return Ok(());
                }
                let batch = std::mem::take(&mut self.carry);
                self.batch(&batch)?;
                continue;
            }
            if chunk.is_empty() {
                return Ok(());
            }
            if chunk.len() < BATCH_HEADER_SIZE {
                self.carry.extend_from_slice(chunk);
                return Ok(());
            }
            let len = self.batch_length(chunk)?;
            if chunk.len() < len {
                // Bounded: `len` passed the batch ceiling above.
                self.carry.reserve_exact(len);
                self.carry.extend_from_slice(chunk);
                return Ok(());
            }
            self.batch(&chunk[..len])?;
            chunk = &chunk[len..];
        }
    }

    /// The declared length of the batch whose header starts `bytes`,
    /// checked against the ceiling before anything is buffered.
    fn batch_length(&self, bytes: &[u8]) -> Result<usize, SegmentWalkError> {
        let header = BatchHeader::decode(bytes, self.batch_length_max).map_err(|source| {
            SegmentWalkError::Batch {
                position: self.position,
                source,
            }
        })?;
        // Lossless: bounded by `batch_length_max`, far below usize::MAX.
        Ok(header.batch_length as usize)
    }

    fn batch(&mut self, bytes: &[u8]) -> Result<(), SegmentWalkError> {
        let position = self.position;
        let view = BatchView::decode_prefix(bytes, Integrity::Verify, self.batch_length_max)
            .map_err(|source| SegmentWalkError::Batch { position, source })?;
        let header = *view.header();
        if self.stats.is_none() && header.base_offset != self.base_offset {
            return Err(SegmentWalkError::BaseOffsetMismatch {
                expected: self.base_offset,
                actual: header.base_offset,
            });
        }
        if header.base_offset != self.next_offset {
            return Err(SegmentWalkError::NonContiguous {
                expected: self.next_offset,
                actual: header.base_offset,
            });
        }
        // Peer-controlled operands: checked, never saturated. (The decoder
        // also refuses a zero count and overflow; this keeps the walk's own
        // arithmetic honest whatever the decoder allows.)
        let last = header
            .base_offset
            .checked_add(u64::from(header.message_count).saturating_sub(1))
            .ok_or(SegmentWalkError::OffsetOverflow { position })?;
        let next = last
            .checked_add(1)
            .ok_or(SegmentWalkError::OffsetOverflow { position })?;
        // The broker-stamped timestamp, identical on every replica (the
        // producer's origin timestamp is not).
        let timestamp = header.base_timestamp;
        let stride_reached = self
            .index
            .last()
            .is_none_or(|e| position - e.position >= self.index_stride_bytes);
        if stride_reached {
            self.index.push(IndexEntry {
                offset: header.base_offset,
                timestamp,
                position,
            });
        }
        self.stats = Some(match self.stats {
            None => SegmentWalkStats {
                end_offset: last,
                start_timestamp: timestamp,
                end_timestamp: timestamp,
                max_timestamp: timestamp,
            },
            Some(s) => SegmentWalkStats {
                end_offset: last,
                start_timestamp: s.start_timestamp,
                end_timestamp: timestamp,
                max_timestamp: s.max_timestamp.max(timestamp),
            },
        });
        self.next_offset = next;
        self.position += bytes.len() as u64;
        Ok(())
    }

    /// Ends the walk: the stats and the rebuilt sparse index.
    pub fn finish(self) -> Result<(SegmentWalkStats, Vec<IndexEntry>), SegmentWalkError> {
        if !self.carry.is_empty() {
            return Err(SegmentWalkError::PartialBatch {
                position: self.position,
                present: self.carry.len() as u64,
            });
        }
        let stats = self.stats.ok_or(SegmentWalkError::Empty)?;
        Ok((stats, self.index))
    }
}

/// Walks a whole segment payload at once: its stats and the encoded sparse
/// index (24-byte entries, the first batch always indexed, then about one
/// per 64 KiB).
pub fn walk_segment_payload(
    base_offset: u64,
    bytes: &[u8],
) -> Result<(SegmentWalkStats, Vec<u8>), SegmentWalkError> {
    let mut walker = SegmentWalker::new(base_offset);
    walker.feed(bytes)?;
    let (stats, index) = walker.finish()?;
    Ok((stats, encode_entries(&index)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use storage::BatchBuilder;
    use storage::index::decode_entries;

    /// A stamped batch of `count` messages of `size` bytes at `base`.
    fn batch(base: u64, count: u32, size: usize, timestamp: u64) -> Vec<u8> {
        let mut b = BatchBuilder::new(timestamp);
        for i in 0..count {
            b.push(
                u128::from(i) + 1,
                0,
                &vec![(base as u8) ^ (i as u8); size],
                b"",
            );
        }
        let mut bytes = b.build();
        storage::batch::stamp(&mut bytes, 1, base, timestamp, u64::MAX).unwrap();
        bytes
    }

    fn segment(base: u64, batches: u32, size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut next = base;
        for i in 0..batches {
            out.extend(batch(next, 3, size, 1_000 + u64::from(i)));
            next += 3;
        }
        out
    }

    #[test]
    fn given_valid_segment_when_walked_should_report_bounds_and_timestamps() {
        let bytes = segment(100, 5, 50);
        let (stats, index) = walk_segment_payload(100, &bytes).unwrap();
        assert_eq!(
            stats,
            SegmentWalkStats {
                end_offset: 114,
                start_timestamp: 1_000,
                end_timestamp: 1_004,
                max_timestamp: 1_004,
            }
        );
        let index = decode_entries(&index);
        assert_eq!(index.len(), 1, "small segment: only the first batch");
        assert_eq!(
            index[0],
            IndexEntry {
                offset: 100,
                timestamp: 1_000,
                position: 0
            }
        );
    }

    #[test]
    fn given_first_batch_at_other_offset_when_walked_should_report_base_mismatch() {
        let bytes = segment(100, 2, 10);
        assert_eq!(
            walk_segment_payload(99, &bytes),
            Err(SegmentWalkError::BaseOffsetMismatch {
                expected: 99,
                actual: 100
            })
        );
    }

    #[test]
    fn given_gap_between_batches_when_walked_should_report_non_contiguous() {
        let mut bytes = batch(0, 3, 10, 1);
        bytes.extend(batch(4, 3, 10, 2));
        assert_eq!(
            walk_segment_payload(0, &bytes),
            Err(SegmentWalkError::NonContiguous {
                expected: 3,
                actual: 4
            })
        );
        // A duplicate base offset is the same defect.
        let mut bytes = batch(0, 3, 10, 1);
        bytes.extend(batch(0, 3, 10, 2));
        assert!(matches!(
            walk_segment_payload(0, &bytes),
            Err(SegmentWalkError::NonContiguous {
                expected: 3,
                actual: 0
            })
        ));
    }

    #[test]
    fn given_offsets_past_u64_max_when_walked_should_reject() {
        // The last message of a batch at u64::MAX - 1 with 3 messages would
        // be u64::MAX + 1: the batch decoder refuses it.
        let mut b = BatchBuilder::new(1);
        for i in 0..3u32 {
            b.push(u128::from(i) + 1, 0, b"x", b"");
        }
        let mut bytes = b.build();
        assert!(storage::batch::stamp(&mut bytes, 1, u64::MAX - 1, 1, u64::MAX).is_err());
        // Forged in place past the stamper, the walk refuses it too.
        bytes[8..16].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        assert!(matches!(
            walk_segment_payload(u64::MAX - 1, &bytes),
            Err(SegmentWalkError::Batch { position: 0, .. })
        ));
        // A single message at u64::MAX fits, but nothing can follow it.
        let last = batch(u64::MAX, 1, 1, 1);
        assert_eq!(
            walk_segment_payload(u64::MAX, &last),
            Err(SegmentWalkError::OffsetOverflow { position: 0 })
        );
    }

    #[test]
    fn given_empty_payload_when_walked_should_reject() {
        assert_eq!(walk_segment_payload(0, &[]), Err(SegmentWalkError::Empty));
    }

    #[test]
    fn given_corrupted_batch_checksum_when_walked_should_name_position() {
        let mut bytes = segment(0, 3, 20);
        let second = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
        bytes[second + 40] ^= 0xFF; // the second batch's checksum field
        assert!(matches!(
            walk_segment_payload(0, &bytes),
            Err(SegmentWalkError::Batch { position, source: BatchError::BatchChecksum { .. } })
                if position == second as u64
        ));
        // A flipped payload byte fails the message checksum.
        let mut bytes = segment(0, 3, 20);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(matches!(
            walk_segment_payload(0, &bytes),
            Err(SegmentWalkError::Batch {
                source: BatchError::MessageChecksum { .. },
                ..
            })
        ));
    }

    #[test]
    fn given_payload_ending_inside_a_batch_when_walked_should_reject() {
        let bytes = segment(0, 2, 20);
        for cut in [1, 255, 256, bytes.len() - 1] {
            assert!(walk_segment_payload(0, &bytes[..cut]).is_err(), "cut {cut}");
        }
        let one = batch(0, 3, 20, 1).len();
        assert_eq!(
            walk_segment_payload(0, &bytes[..one + 10]),
            Err(SegmentWalkError::PartialBatch {
                position: one as u64,
                present: 10
            })
        );
    }

    #[test]
    fn given_large_segment_when_walked_should_index_first_batch_then_every_stride() {
        // ~1.2 KiB batches: a 64 KiB stride indexes about every 54th batch.
        let bytes = segment(0, 400, 400);
        let batch_len = batch(0, 3, 400, 0).len() as u64;
        let (_, index) = walk_segment_payload(0, &bytes).unwrap();
        let index = decode_entries(&index);
        assert_eq!(index[0].position, 0);
        assert_eq!(index[0].offset, 0);
        for pair in index.windows(2) {
            let gap = pair[1].position - pair[0].position;
            assert!(gap >= 64 * 1024 && gap < 64 * 1024 + batch_len, "gap {gap}");
            assert_eq!(pair[1].offset, pair[1].position / batch_len * 3);
        }
        // No stretch of the segment longer than a stride goes unindexed.
        let last = index.last().unwrap();
        assert!(bytes.len() as u64 - last.position < 64 * 1024 + batch_len);
        assert!(index.len() > 5);
    }

    #[test]
    fn given_oversized_declared_length_when_fed_should_reject_before_buffering() {
        let mut bytes = batch(0, 1, 10, 1);
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut walker = SegmentWalker::new(0);
        assert!(matches!(
            walker.feed(&bytes[..300]),
            Err(SegmentWalkError::Batch {
                source: BatchError::LengthAboveMax { .. },
                ..
            })
        ));
        assert_eq!(walker.carried_bytes(), 0);
    }

    proptest! {
        #[test]
        fn given_any_chunking_when_fed_should_match_whole_walk(
            cuts in proptest::collection::vec(1usize..700, 1..40)
        ) {
            let bytes = segment(10, 12, 90);
            let whole = walk_segment_payload(10, &bytes).unwrap();
            let mut walker = SegmentWalker::with_limits(10, BATCH_LENGTH_MAX_DEFAULT, 512);
            let mut whole_small_stride = SegmentWalker::with_limits(10, BATCH_LENGTH_MAX_DEFAULT, 512);
            whole_small_stride.feed(&bytes).unwrap();
            let mut at = 0;
            for cut in cuts.iter().cycle() {
                if at >= bytes.len() { break; }
                let end = (at + cut).min(bytes.len());
                walker.feed(&bytes[at..end]).unwrap();
                // Memory held back never exceeds one batch.
                prop_assert!(walker.carried_bytes() <= batch(0, 3, 90, 0).len());
                at = end;
            }
            let (stats, index) = walker.finish().unwrap();
            prop_assert_eq!(stats, whole.0);
            prop_assert_eq!(index, whole_small_stride.finish().unwrap().1);
        }
    }
}
