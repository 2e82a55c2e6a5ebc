//! Validation of a received segment artifact: every batch header and
//! checksum, the declared base offset, offset continuity and overflow, and
//! a rebuilt sparse index.
//!
//! [`SegmentWalker`] is incremental: it takes the artifact's bytes in any
//! split, as chunks arrive. A batch wholly inside a chunk is decoded in
//! place; a batch that straddles a chunk boundary is checked piece by piece
//! by a [`BatchStream`] (header fields kept, running message and batch
//! checksums), which holds back at most an incomplete header: 256 bytes,
//! whatever the batch length (up to the 64 MiB ceiling). Every check and
//! every error is the same as on the whole batch, so a split never changes
//! the outcome or the rebuilt index. A receiver can therefore validate and
//! stream each chunk to its staging file as it lands, holding a chunk and
//! a few hundred bytes (ST-B2), and the CPU work comes in slices no larger
//! than a chunk, between which the shard runs its other groups' ticks.

use common::Offset;
use std::fmt;

use storage::{
    BATCH_HEADER_SIZE, BATCH_LENGTH_MAX_DEFAULT, BatchError, BatchHeader, BatchStream, BatchView,
    Integrity,
};
use storage::{INDEX_STRIDE_BYTES_DEFAULT, IndexEntry, encode_entries};

/// What a complete walk derived about a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWalkStats {
    /// Offset of the segment's last message.
    pub end_offset: Offset,
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
    /// The batch straddling the last chunk boundary, checked so far; its
    /// bytes are not kept (at most a partial header is).
    straddling: Option<BatchStream>,
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
            straddling: None,
            next_offset: base_offset,
            stats: None,
            index: Vec::new(),
        }
    }

    /// Bytes validated as whole batches so far.
    pub const fn walked_bytes(&self) -> u64 {
        self.position
    }

    /// Bytes held back because a header straddles a chunk boundary: at
    /// most [`BATCH_HEADER_SIZE`], whatever the batch length. (The hash
    /// states of a straddling batch are a fixed ~2 KiB besides.)
    pub fn carried_bytes(&self) -> usize {
        self.straddling.as_ref().map_or(0, BatchStream::held_bytes)
    }

    /// Takes the next bytes of the artifact, in order.
    ///
    /// # Errors
    /// The first defect the bytes so far prove, named as on the whole
    /// artifact. A batch's own errors come as soon as its bytes prove them
    /// (they are the errors the whole batch would get); the walk's checks
    /// on a batch (base offset, contiguity, overflow) come once it passed.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), SegmentWalkError> {
        loop {
            if let Some(stream) = self.straddling.as_mut() {
                let position = self.position;
                let taken = stream
                    .push(chunk)
                    .map_err(|source| SegmentWalkError::Batch { position, source })?;
                chunk = &chunk[taken..];
                let Some(header) = stream.complete().copied() else {
                    debug_assert!(chunk.is_empty(), "an incomplete batch takes every byte");
                    return Ok(());
                };
                self.straddling = None;
                self.accept(header)?;
                continue;
            }
            if chunk.is_empty() {
                return Ok(());
            }
            if chunk.len() >= BATCH_HEADER_SIZE {
                let len = self.batch_length(chunk)?;
                if chunk.len() >= len {
                    self.batch(&chunk[..len])?;
                    chunk = &chunk[len..];
                    continue;
                }
            }
            // The batch runs past this chunk: checked as its pieces come.
            self.straddling = Some(BatchStream::new(Integrity::Verify, self.batch_length_max));
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

    /// A batch wholly in one chunk, decoded in place.
    fn batch(&mut self, bytes: &[u8]) -> Result<(), SegmentWalkError> {
        let position = self.position;
        let view = BatchView::decode_prefix(bytes, Integrity::Verify, self.batch_length_max)
            .map_err(|source| SegmentWalkError::Batch { position, source })?;
        self.accept(*view.header())
    }

    /// The walk's checks on a batch that passed its own (whole or streamed),
    /// then the index, the stats and the position past it.
    fn accept(&mut self, header: BatchHeader) -> Result<(), SegmentWalkError> {
        let position = self.position;
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
                end_offset: Offset(last),
                start_timestamp: timestamp,
                end_timestamp: timestamp,
                max_timestamp: timestamp,
            },
            Some(s) => SegmentWalkStats {
                end_offset: Offset(last),
                start_timestamp: s.start_timestamp,
                end_timestamp: timestamp,
                max_timestamp: s.max_timestamp.max(timestamp),
            },
        });
        self.next_offset = next;
        self.position += header.batch_length;
        Ok(())
    }

    /// Ends the walk: the stats and the rebuilt sparse index.
    pub fn finish(self) -> Result<(SegmentWalkStats, Vec<IndexEntry>), SegmentWalkError> {
        if let Some(mut stream) = self.straddling {
            // A stream that already failed names its error again.
            let position = self.position;
            stream
                .push(&[])
                .map_err(|source| SegmentWalkError::Batch { position, source })?;
            return Err(SegmentWalkError::PartialBatch {
                position,
                present: stream.consumed_bytes(),
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
    use storage::decode_entries;

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
        storage::stamp(&mut bytes, 1, base, timestamp, u64::MAX).unwrap();
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
                end_offset: Offset(114),
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
        assert!(storage::stamp(&mut bytes, 1, u64::MAX - 1, 1, u64::MAX).is_err());
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

    type Walked = Result<(SegmentWalkStats, Vec<IndexEntry>), SegmentWalkError>;

    /// Walks `bytes` fed whole (one `feed`), with a 512-byte index stride so
    /// that small segments get several entries.
    fn walk_whole(base: u64, bytes: &[u8]) -> Walked {
        let mut walker = SegmentWalker::with_limits(base, BATCH_LENGTH_MAX_DEFAULT, 512);
        walker.feed(bytes)?;
        walker.finish()
    }

    /// Walks `bytes` fed in pieces ending at `cuts` (ascending), then the
    /// rest; asserts the carry after every piece is at most a batch header.
    fn walk_split(base: u64, bytes: &[u8], cuts: &[usize]) -> Walked {
        let mut walker = SegmentWalker::with_limits(base, BATCH_LENGTH_MAX_DEFAULT, 512);
        let mut at = 0;
        for &end in cuts.iter().chain([&bytes.len()]) {
            let end = end.clamp(at, bytes.len());
            walker.feed(&bytes[at..end])?;
            assert!(
                walker.carried_bytes() <= BATCH_HEADER_SIZE,
                "carried {} after byte {end}",
                walker.carried_bytes()
            );
            at = end;
        }
        walker.finish()
    }

    /// Three batches of different shapes: 3 × 20 B, 40 × 300 B (12 KiB, the
    /// one to straddle), 2 × 0 B; then another 12 KiB one.
    fn mixed_segment(base: u64) -> Vec<u8> {
        let mut out = batch(base, 3, 20, 1_000);
        out.extend(batch(base + 3, 40, 300, 1_001));
        out.extend(batch(base + 43, 2, 0, 1_002));
        out.extend(batch(base + 45, 40, 300, 1_003));
        out
    }

    #[test]
    fn given_segment_split_at_every_byte_when_fed_should_match_whole_walk() {
        let bytes = mixed_segment(7);
        let want = walk_whole(7, &bytes).unwrap();
        // The first batch, then the first one 512 bytes past it: the third
        // (the second starts 460 bytes in).
        let third = (batch(0, 3, 20, 0).len() + batch(0, 40, 300, 0).len()) as u64;
        assert_eq!(
            want.1,
            vec![
                IndexEntry {
                    offset: 7,
                    timestamp: 1_000,
                    position: 0
                },
                IndexEntry {
                    offset: 50,
                    timestamp: 1_002,
                    position: third
                },
            ]
        );
        for cut in 0..=bytes.len() {
            assert_eq!(walk_split(7, &bytes, &[cut]), Ok(want.clone()), "cut {cut}");
        }
        let every_byte: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(walk_split(7, &bytes, &every_byte), Ok(want.clone()));
        // Chunks smaller than a frame header, and than a batch header.
        for step in [5, 47, 255, 1_000] {
            let cuts: Vec<usize> = (step..bytes.len()).step_by(step).collect();
            assert_eq!(
                walk_split(7, &bytes, &cuts),
                Ok(want.clone()),
                "step {step}"
            );
        }
    }

    #[test]
    fn given_corruption_in_a_straddling_batch_when_fed_in_pieces_should_fail_as_whole() {
        let bytes = mixed_segment(0);
        let second = batch(0, 3, 20, 1_000).len();
        let second_len = batch(3, 40, 300, 1_001).len();
        let payload = second + BATCH_HEADER_SIZE + 48 * 20 + 300 * 19 + 100;
        let cases: [(&str, usize, u8); 6] = [
            ("header: base timestamp", second + 16, 0x01),
            ("header: reserved byte", second + 200, 0x01),
            ("header: batch length", second + 32, 0x02),
            ("checksum field", second + 40, 0xFF),
            ("payload", payload, 0x10),
            ("last byte of the batch", second + second_len - 1, 0x80),
        ];
        for (what, at, mask) in cases {
            let mut bad = bytes.clone();
            bad[at] ^= mask;
            let want = walk_whole(0, &bad);
            let Err(SegmentWalkError::Batch { position, source }) = &want else {
                panic!("{what}: {want:?}");
            };
            assert_eq!(*position, second as u64, "{what}");
            match what {
                "checksum field" | "header: base timestamp" => {
                    assert!(
                        matches!(source, BatchError::BatchChecksum { .. }),
                        "{what}: {source:?}"
                    );
                }
                "payload" | "last byte of the batch" => {
                    assert!(
                        matches!(source, BatchError::MessageChecksum { .. }),
                        "{what}: {source:?}"
                    );
                }
                _ => {}
            }
            // The batch decoded whole in place says the same.
            let whole_batch = BatchView::decode_prefix(
                &bad[second..],
                Integrity::Verify,
                BATCH_LENGTH_MAX_DEFAULT,
            )
            .map(|_| ());
            assert_eq!(whole_batch, Err(source.clone()), "{what}");
            for cut in second..=second + second_len {
                assert_eq!(walk_split(0, &bad, &[cut]), want, "{what}: cut {cut}");
            }
            assert_eq!(
                walk_split(0, &bad, &[second + 1, at, at + 1]),
                want,
                "{what}"
            );
        }
        // A straddling batch that passes its own checks but does not continue
        // the previous one: the walk's error, after the batch's.
        let mut bad = batch(0, 3, 20, 1);
        bad.extend(batch(4, 40, 300, 2));
        let want = Err(SegmentWalkError::NonContiguous {
            expected: 3,
            actual: 4,
        });
        assert_eq!(walk_whole(0, &bad), want);
        for cut in second..bad.len() {
            assert_eq!(walk_split(0, &bad, &[cut]), want, "cut {cut}");
        }
    }

    #[test]
    fn given_straddling_header_past_the_ceiling_when_fed_should_refuse_before_buffering() {
        // The default ceiling, declared length u64::MAX, header in two pieces.
        let mut bytes = batch(0, 1, 10, 1);
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut walker = SegmentWalker::new(0);
        walker.feed(&bytes[..100]).unwrap();
        assert_eq!(walker.carried_bytes(), 100);
        assert_eq!(
            walker.feed(&bytes[100..]),
            Err(SegmentWalkError::Batch {
                position: 0,
                source: BatchError::LengthAboveMax {
                    batch_length: u64::MAX,
                    max: BATCH_LENGTH_MAX_DEFAULT
                },
            })
        );
        assert!(walker.carried_bytes() <= BATCH_HEADER_SIZE);
        // A real 12 KiB batch under a 4 KiB ceiling, in 1 KiB chunks: refused
        // at its header, at the position of the batch.
        let mut bytes = batch(0, 3, 20, 1);
        bytes.extend(batch(3, 40, 300, 2));
        let second = batch(0, 3, 20, 1).len();
        let mut walker = SegmentWalker::with_limits(0, 4_096, 512);
        let mut failed = None;
        for piece in bytes.chunks(1_024) {
            if let Err(e) = walker.feed(piece) {
                failed = Some(e);
                break;
            }
            assert!(walker.carried_bytes() <= BATCH_HEADER_SIZE);
        }
        assert!(matches!(
            failed,
            Some(SegmentWalkError::Batch {
                position,
                source: BatchError::LengthAboveMax { max: 4_096, .. },
            }) if position == second as u64
        ));
    }

    #[test]
    fn given_artifact_ending_inside_a_straddling_batch_when_finished_should_report_partial() {
        let bytes = mixed_segment(0);
        let second = batch(0, 3, 20, 1_000).len();
        for end in [second + 10, second + 300, second + 5_000] {
            let mut walker = SegmentWalker::new(0);
            walker.feed(&bytes[..second + 1]).unwrap();
            walker.feed(&bytes[second + 1..end]).unwrap();
            assert_eq!(walker.walked_bytes(), second as u64);
            assert_eq!(
                walker.finish(),
                Err(SegmentWalkError::PartialBatch {
                    position: second as u64,
                    present: (end - second) as u64
                })
            );
        }
    }

    proptest! {
        #[test]
        fn given_large_batches_and_any_chunking_when_fed_should_match_whole_walk(
            sizes in proptest::collection::vec((1u32..30, 0usize..3_000), 1..6),
            cuts in proptest::collection::vec(0usize..200_000, 0..40),
            flip in proptest::option::of((0usize..200_000, 0u8..8)),
        ) {
            let mut bytes = Vec::new();
            let mut next = 50;
            for (i, &(count, size)) in sizes.iter().enumerate() {
                bytes.extend(batch(next, count, size, 10 + i as u64));
                next += u64::from(count);
            }
            if let Some((at, bit)) = flip {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            prop_assert_eq!(walk_split(50, &bytes, &cuts), walk_whole(50, &bytes));
        }

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
                // Memory held back never exceeds a batch header.
                prop_assert!(walker.carried_bytes() <= BATCH_HEADER_SIZE);
                at = end;
            }
            let (stats, index) = walker.finish().unwrap();
            prop_assert_eq!(stats, whole.0);
            prop_assert_eq!(index, whole_small_stride.finish().unwrap().1);
        }
    }
}
