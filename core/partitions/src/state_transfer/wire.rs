//! The consumer-offsets artifact: the last artifact of every partition
//! offer, carrying both offset tables, the purge generation, the offset
//! frontier and the group's dedup slice at the offer's commit op.
//!
//! Layout "ICO2", version 2, little-endian:
//!
//! | field | width |
//! |---|---|
//! | magic `ICO2` | 4 |
//! | version = 2 | u8 |
//! | purge_generation | u64 |
//! | next_offset | u64 |
//! | consumer_count | u32 |
//! | group_count | u32 |
//! | dedup_count | u32 |
//! | consumer_count × { id u32, offset u64 } | 12 each |
//! | group_count × { id u32, offset u64 } | 12 each |
//! | dedup_count × { client u128, watermark u64, latest_commit u64, user_id u32, committed_window u128 } | 52 each |
//! | xxh3-64 trailer over everything before it | u64 |
//!
//! "ICO1" (version 1) is the same without `dedup_count` and the dedup
//! section; it still decodes (with an empty slice) so a rolling upgrade
//! works in either order.
//!
//! The encoding is canonical: ids and dedup clients strictly ascend (which
//! also rules out duplicates), client 0 never appears. The decoder checks
//! each count against its ceiling and against the bytes present before it
//! allocates, and refuses unknown versions and trailing bytes — a later
//! version's fields could change the meaning of the ones read here.

use common::{Offset, Op};
use std::fmt;

use common::le_cursor::{LeCursor, Truncated};
use consensus::DedupWatermark;
use consensus::{push_trailer, split_verified_trailer};

/// Magic of the current layout.
pub const CONSUMER_OFFSETS_MAGIC: [u8; 4] = *b"ICO2";
/// Version byte of the current layout.
pub const CONSUMER_OFFSETS_VERSION: u8 = 2;
/// Magic of the previous layout (no dedup section).
pub const CONSUMER_OFFSETS_MAGIC_V1: [u8; 4] = *b"ICO1";
/// Version byte of the previous layout.
pub const CONSUMER_OFFSETS_VERSION_V1: u8 = 1;
/// Ceiling on each section's entry count: a corruption guard on a count a
/// peer sent, not a sizing target.
pub const CONSUMER_OFFSETS_ENTRIES_MAX: u32 = 1 << 20;
/// Wire length of one offset entry.
pub const OFFSET_ENTRY_LEN: usize = 4 + 8;
/// Wire length of one dedup entry.
pub const DEDUP_ENTRY_LEN: usize = 16 + 8 + 8 + 4 + 16;

/// The decoded consumer-offsets artifact.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumerOffsetsWire {
    /// The origin's applied purge generation. A receiver that missed a purge
    /// learns it here instead of re-wiping the installed data afterwards.
    pub purge_generation: u64,
    /// The origin's offset frontier: the offset its next append mints (0 for
    /// a partition that never appended). Segments cannot carry it alone:
    /// retention may have removed every segment while the counter stands at
    /// N.
    pub next_offset: Offset,
    /// `(consumer id, offset)`, strictly ascending by id.
    pub consumers: Vec<(u32, Offset)>,
    /// `(consumer group id, offset)`, strictly ascending by id.
    pub groups: Vec<(u32, Offset)>,
    /// The group's dedup slice, strictly ascending by client, never client
    /// 0.
    pub dedup: Vec<DedupWatermark>,
}

/// Why a consumer-offsets artifact failed to decode. Nothing of it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerOffsetsWireError {
    /// The bytes end before a field or a declared section.
    Truncated,
    /// Neither `ICO2` nor `ICO1`.
    BadMagic,
    /// A version this build does not speak for that magic.
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// Bytes after the last section (a newer encoder).
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// The trailer does not match the content.
    ChecksumMismatch {
        /// The stored trailer.
        expected: u64,
        /// The checksum of the content.
        actual: u64,
    },
    /// A section declares more entries than the ceiling.
    TooManyEntries {
        /// `consumers`, `groups` or `dedup`.
        section: &'static str,
        /// The declared count.
        count: u32,
        /// The ceiling.
        max: u32,
    },
    /// An id does not strictly ascend (a duplicate or out of order).
    NonAscendingId {
        /// `consumers` or `groups`.
        section: &'static str,
        /// The offending id.
        id: u32,
    },
    /// A dedup client does not strictly ascend.
    NonAscendingClient {
        /// The offending client.
        client: u128,
    },
    /// A dedup entry carries the reserved client 0.
    ReservedClient,
}

impl From<Truncated> for ConsumerOffsetsWireError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

impl fmt::Display for ConsumerOffsetsWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("consumer-offsets artifact is truncated"),
            Self::BadMagic => f.write_str("consumer-offsets artifact has a foreign magic"),
            Self::UnsupportedVersion { version } => write!(
                f,
                "consumer-offsets artifact version {version} is not understood (this build speaks {CONSUMER_OFFSETS_VERSION})"
            ),
            Self::TrailingBytes { extra } => write!(
                f,
                "consumer-offsets artifact has {extra} bytes past its last section (a newer encoder?)"
            ),
            Self::ChecksumMismatch { expected, actual } => write!(
                f,
                "consumer-offsets artifact trailer {expected:#018x} does not match its content ({actual:#018x})"
            ),
            Self::TooManyEntries {
                section,
                count,
                max,
            } => write!(
                f,
                "consumer-offsets artifact declares {count} {section} entries, past the {max} ceiling"
            ),
            Self::NonAscendingId { section, id } => write!(
                f,
                "consumer-offsets artifact {section} id {id} does not ascend (duplicate or out of order)"
            ),
            Self::NonAscendingClient { client } => write!(
                f,
                "consumer-offsets artifact dedup client {client} does not ascend (duplicate or out of order)"
            ),
            Self::ReservedClient => {
                f.write_str("consumer-offsets artifact carries the reserved dedup client 0")
            }
        }
    }
}

impl std::error::Error for ConsumerOffsetsWireError {}

impl ConsumerOffsetsWire {
    /// The encoded length of this table.
    pub fn encoded_len(&self) -> usize {
        4 + 1
            + 8
            + 8
            + 3 * 4
            + (self.consumers.len() + self.groups.len()) * OFFSET_ENTRY_LEN
            + self.dedup.len() * DEDUP_ENTRY_LEN
            + 8
    }

    /// Encodes the table as "ICO2".
    ///
    /// # Panics
    /// If a section holds more than `u32::MAX` entries (the offer builder
    /// refuses far earlier, at [`CONSUMER_OFFSETS_ENTRIES_MAX`]).
    pub fn encode(&self) -> Vec<u8> {
        let count = |n: usize| u32::try_from(n).expect("section count fits u32");
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&CONSUMER_OFFSETS_MAGIC);
        out.push(CONSUMER_OFFSETS_VERSION);
        out.extend_from_slice(&self.purge_generation.to_le_bytes());
        out.extend_from_slice(&self.next_offset.0.to_le_bytes());
        out.extend_from_slice(&count(self.consumers.len()).to_le_bytes());
        out.extend_from_slice(&count(self.groups.len()).to_le_bytes());
        out.extend_from_slice(&count(self.dedup.len()).to_le_bytes());
        for (id, offset) in self.consumers.iter().chain(&self.groups) {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&offset.0.to_le_bytes());
        }
        for d in &self.dedup {
            out.extend_from_slice(&d.client.to_le_bytes());
            out.extend_from_slice(&d.watermark.to_le_bytes());
            out.extend_from_slice(&d.latest_commit.0.to_le_bytes());
            out.extend_from_slice(&d.user_id.to_le_bytes());
            out.extend_from_slice(&d.committed_window.to_le_bytes());
        }
        push_trailer(&mut out);
        debug_assert_eq!(out.len(), self.encoded_len());
        out
    }

    /// Decodes "ICO2", or "ICO1" with an empty dedup slice, failing closed.
    ///
    /// The trailer proves transit only; this checks what it cannot: the
    /// peer encoder's counts, ordering and framing. Offset values are not
    /// judged here (that needs the installed end offset; the install clamps
    /// them, as boot recovery does).
    pub fn decode(bytes: &[u8]) -> Result<Self, ConsumerOffsetsWireError> {
        let content = split_verified_trailer(bytes).map_err(|mismatch| match mismatch {
            None => ConsumerOffsetsWireError::Truncated,
            Some((expected, actual)) => {
                ConsumerOffsetsWireError::ChecksumMismatch { expected, actual }
            }
        })?;
        let mut cursor = LeCursor::new(content);
        let magic = cursor.take(4)?;
        let version = cursor.u8()?;
        let carries_dedup = if magic == CONSUMER_OFFSETS_MAGIC {
            if version != CONSUMER_OFFSETS_VERSION {
                return Err(ConsumerOffsetsWireError::UnsupportedVersion { version });
            }
            true
        } else if magic == CONSUMER_OFFSETS_MAGIC_V1 {
            if version != CONSUMER_OFFSETS_VERSION_V1 {
                return Err(ConsumerOffsetsWireError::UnsupportedVersion { version });
            }
            false
        } else {
            return Err(ConsumerOffsetsWireError::BadMagic);
        };
        let purge_generation = cursor.u64()?;
        let next_offset = cursor.u64()?;
        let consumer_count = cursor.u32()?;
        let group_count = cursor.u32()?;
        let dedup_count = if carries_dedup { cursor.u32()? } else { 0 };
        let consumers = decode_section(&mut cursor, "consumers", consumer_count)?;
        let groups = decode_section(&mut cursor, "groups", group_count)?;
        let dedup = decode_dedup(&mut cursor, dedup_count)?;
        let extra = cursor.remaining().len();
        if extra != 0 {
            // Not "truncated": extra bytes point at a newer encoder.
            return Err(ConsumerOffsetsWireError::TrailingBytes { extra });
        }
        Ok(Self {
            purge_generation,
            next_offset: Offset(next_offset),
            consumers,
            groups,
            dedup,
        })
    }
}

/// Checks a declared count against the ceiling, then against the bytes
/// present (a lower bound: later sections may follow), before allocating.
fn check_count(
    cursor: &LeCursor<'_>,
    section: &'static str,
    count: u32,
    stride: usize,
) -> Result<(), ConsumerOffsetsWireError> {
    if count > CONSUMER_OFFSETS_ENTRIES_MAX {
        return Err(ConsumerOffsetsWireError::TooManyEntries {
            section,
            count,
            max: CONSUMER_OFFSETS_ENTRIES_MAX,
        });
    }
    if count as usize * stride > cursor.remaining().len() {
        return Err(ConsumerOffsetsWireError::Truncated);
    }
    Ok(())
}

fn decode_section(
    cursor: &mut LeCursor<'_>,
    section: &'static str,
    count: u32,
) -> Result<Vec<(u32, Offset)>, ConsumerOffsetsWireError> {
    check_count(cursor, section, count, OFFSET_ENTRY_LEN)?;
    let mut entries = Vec::with_capacity(count as usize);
    let mut previous: Option<u32> = None;
    for _ in 0..count {
        let id = cursor.u32()?;
        let offset = Offset(cursor.u64()?);
        if previous.is_some_and(|p| id <= p) {
            return Err(ConsumerOffsetsWireError::NonAscendingId { section, id });
        }
        previous = Some(id);
        entries.push((id, offset));
    }
    Ok(entries)
}

fn decode_dedup(
    cursor: &mut LeCursor<'_>,
    count: u32,
) -> Result<Vec<DedupWatermark>, ConsumerOffsetsWireError> {
    check_count(cursor, "dedup", count, DEDUP_ENTRY_LEN)?;
    let mut entries = Vec::with_capacity(count as usize);
    let mut previous: Option<u128> = None;
    for _ in 0..count {
        let client = cursor.u128()?;
        let watermark = cursor.u64()?;
        let latest_commit = cursor.u64()?;
        let user_id = cursor.u32()?;
        let committed_window = cursor.u128()?;
        if client == 0 {
            return Err(ConsumerOffsetsWireError::ReservedClient);
        }
        if previous.is_some_and(|p| client <= p) {
            return Err(ConsumerOffsetsWireError::NonAscendingClient { client });
        }
        previous = Some(client);
        entries.push(DedupWatermark {
            client,
            user_id,
            watermark,
            latest_commit: Op(latest_commit),
            committed_window,
        });
    }
    Ok(entries)
}

/// The purge generation an encoded artifact carries, or 0 when it does not
/// decode: lets a receiver refuse an offer built before a purge it has
/// already applied.
pub fn offered_purge_generation(bytes: &[u8]) -> u64 {
    ConsumerOffsetsWire::decode(bytes)
        .map(|w| w.purge_generation)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use consensus::state_artifact_checksum;
    use proptest::prelude::*;

    fn dedup_entry(client: u128, watermark: u64, latest_commit: u64) -> DedupWatermark {
        DedupWatermark {
            client,
            user_id: 1,
            watermark,
            latest_commit: Op(latest_commit),
            committed_window: 0b1011,
        }
    }

    fn table() -> ConsumerOffsetsWire {
        ConsumerOffsetsWire {
            purge_generation: 3,
            next_offset: Offset(43),
            consumers: vec![(1, Offset(10)), (7, Offset(42))],
            groups: vec![(2, Offset(5))],
            dedup: vec![
                dedup_entry(11, 4, 90),
                dedup_entry(u128::from(u64::MAX) + 5, 9, 91),
            ],
        }
    }

    /// Replaces the trailer so that only the check under test can fire.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let content = bytes.len() - 8;
        let trailer = state_artifact_checksum(&bytes[..content]);
        bytes[content..].copy_from_slice(&trailer.to_le_bytes());
        bytes
    }

    fn sealed(mut content: Vec<u8>) -> Vec<u8> {
        push_trailer(&mut content);
        content
    }

    /// A v2 prefix with the given counts and nothing after.
    fn prefix(consumers: u32, groups: u32, dedup: u32) -> Vec<u8> {
        let mut b = CONSUMER_OFFSETS_MAGIC.to_vec();
        b.push(CONSUMER_OFFSETS_VERSION);
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&consumers.to_le_bytes());
        b.extend_from_slice(&groups.to_le_bytes());
        b.extend_from_slice(&dedup.to_le_bytes());
        b
    }

    #[test]
    fn given_offset_table_when_encoded_should_round_trip() {
        let encoded = table().encode();
        assert_eq!(encoded.len(), table().encoded_len());
        assert_eq!(ConsumerOffsetsWire::decode(&encoded), Ok(table()));
    }

    #[test]
    fn given_table_when_encoded_should_match_documented_layout() {
        let e = table().encode();
        assert_eq!(&e[..5], b"ICO2\x02");
        assert_eq!(&e[5..13], &3u64.to_le_bytes());
        assert_eq!(&e[13..21], &43u64.to_le_bytes());
        assert_eq!(&e[21..33], &[2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        // consumers (1,10), (7,42), then groups (2,5)
        assert_eq!(&e[33..37], &1u32.to_le_bytes());
        assert_eq!(&e[37..45], &10u64.to_le_bytes());
        assert_eq!(&e[57..61], &2u32.to_le_bytes());
        // first dedup entry: client, watermark, latest_commit, user, window
        let d = 69;
        assert_eq!(&e[d..d + 16], &11u128.to_le_bytes());
        assert_eq!(&e[d + 16..d + 24], &4u64.to_le_bytes());
        assert_eq!(&e[d + 24..d + 32], &90u64.to_le_bytes());
        assert_eq!(&e[d + 32..d + 36], &1u32.to_le_bytes());
        assert_eq!(&e[d + 36..d + 52], &0b1011u128.to_le_bytes());
        assert_eq!(e.len(), d + 2 * 52 + 8);
        let trailer = state_artifact_checksum(&e[..e.len() - 8]);
        assert_eq!(&e[e.len() - 8..], &trailer.to_le_bytes());
    }

    #[test]
    fn given_empty_table_when_encoded_should_round_trip() {
        let empty = ConsumerOffsetsWire::default();
        let encoded = empty.encode();
        assert_eq!(encoded.len(), 41);
        assert_eq!(ConsumerOffsetsWire::decode(&encoded), Ok(empty));
    }

    #[test]
    fn given_flipped_bit_when_decoded_should_reject_checksum() {
        let mut encoded = table().encode();
        encoded[6] ^= 1;
        assert!(matches!(
            ConsumerOffsetsWire::decode(&encoded),
            Err(ConsumerOffsetsWireError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn given_any_flipped_bit_when_decoded_should_reject() {
        let encoded = table().encode();
        for bit in 0..encoded.len() * 8 {
            let mut f = encoded.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            assert!(ConsumerOffsetsWire::decode(&f).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn given_truncated_bytes_when_decoded_should_reject() {
        let encoded = table().encode();
        for len in 0..encoded.len() {
            assert!(
                ConsumerOffsetsWire::decode(&encoded[..len]).is_err(),
                "strict prefix of {len} bytes must fail closed"
            );
        }
        assert_eq!(
            ConsumerOffsetsWire::decode(&[0; 7]),
            Err(ConsumerOffsetsWireError::Truncated)
        );
    }

    #[test]
    fn given_unknown_version_when_decoded_should_reject() {
        let mut wrong = table().encode();
        wrong[4] = CONSUMER_OFFSETS_VERSION + 1;
        assert_eq!(
            ConsumerOffsetsWire::decode(&reseal(wrong)),
            Err(ConsumerOffsetsWireError::UnsupportedVersion {
                version: CONSUMER_OFFSETS_VERSION + 1
            })
        );
    }

    #[test]
    fn given_foreign_magic_when_decoded_should_reject() {
        let mut wrong = table().encode();
        wrong[0] = b'X';
        assert_eq!(
            ConsumerOffsetsWire::decode(&reseal(wrong)),
            Err(ConsumerOffsetsWireError::BadMagic)
        );
    }

    #[test]
    fn given_unordered_dedup_clients_when_decoded_should_reject() {
        let unordered = ConsumerOffsetsWire {
            dedup: vec![dedup_entry(9, 1, 1), dedup_entry(4, 2, 2)],
            ..ConsumerOffsetsWire::default()
        };
        assert_eq!(
            ConsumerOffsetsWire::decode(&unordered.encode()),
            Err(ConsumerOffsetsWireError::NonAscendingClient { client: 4 })
        );
        let duplicate = ConsumerOffsetsWire {
            dedup: vec![dedup_entry(9, 1, 1), dedup_entry(9, 2, 2)],
            ..ConsumerOffsetsWire::default()
        };
        assert_eq!(
            ConsumerOffsetsWire::decode(&duplicate.encode()),
            Err(ConsumerOffsetsWireError::NonAscendingClient { client: 9 })
        );
    }

    #[test]
    fn given_reserved_client_in_dedup_when_decoded_should_reject() {
        let reserved = ConsumerOffsetsWire {
            dedup: vec![dedup_entry(0, 1, 1), dedup_entry(4, 2, 2)],
            ..ConsumerOffsetsWire::default()
        };
        assert_eq!(
            ConsumerOffsetsWire::decode(&reserved.encode()),
            Err(ConsumerOffsetsWireError::ReservedClient)
        );
    }

    #[test]
    fn given_v1_artifact_when_decoded_should_install_empty_dedup() {
        let mut bytes = CONSUMER_OFFSETS_MAGIC_V1.to_vec();
        bytes.push(CONSUMER_OFFSETS_VERSION_V1);
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&43u64.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        for (id, offset) in [(7u32, 42u64), (2, 5)] {
            bytes.extend_from_slice(&id.to_le_bytes());
            bytes.extend_from_slice(&offset.to_le_bytes());
        }
        assert_eq!(
            ConsumerOffsetsWire::decode(&sealed(bytes)),
            Ok(ConsumerOffsetsWire {
                purge_generation: 3,
                next_offset: Offset(43),
                consumers: vec![(7, Offset(42))],
                groups: vec![(2, Offset(5))],
                dedup: Vec::new(),
            })
        );
    }

    #[test]
    fn given_v1_magic_with_wrong_version_when_decoded_should_reject() {
        let mut bytes = CONSUMER_OFFSETS_MAGIC_V1.to_vec();
        bytes.push(CONSUMER_OFFSETS_VERSION);
        bytes.extend_from_slice(&[0; 24]);
        assert_eq!(
            ConsumerOffsetsWire::decode(&sealed(bytes)),
            Err(ConsumerOffsetsWireError::UnsupportedVersion {
                version: CONSUMER_OFFSETS_VERSION
            })
        );
        // And the v2 magic with the v1 version.
        let mut bytes = CONSUMER_OFFSETS_MAGIC.to_vec();
        bytes.push(CONSUMER_OFFSETS_VERSION_V1);
        bytes.extend_from_slice(&[0; 28]);
        assert_eq!(
            ConsumerOffsetsWire::decode(&sealed(bytes)),
            Err(ConsumerOffsetsWireError::UnsupportedVersion {
                version: CONSUMER_OFFSETS_VERSION_V1
            })
        );
    }

    #[test]
    fn given_dedup_count_past_ceiling_when_decoded_should_reject_before_allocating() {
        let bytes = sealed(prefix(0, 0, CONSUMER_OFFSETS_ENTRIES_MAX + 1));
        assert_eq!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::TooManyEntries {
                section: "dedup",
                count: CONSUMER_OFFSETS_ENTRIES_MAX + 1,
                max: CONSUMER_OFFSETS_ENTRIES_MAX,
            })
        );
        // u32::MAX dedup entries would ask for more than 200 GiB.
        let bytes = sealed(prefix(0, 0, u32::MAX));
        assert!(matches!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::TooManyEntries { .. })
        ));
    }

    #[test]
    fn given_dedup_count_exceeding_bytes_when_decoded_should_reject_as_truncated() {
        let bytes = sealed(prefix(0, 0, 1_000));
        assert_eq!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::Truncated)
        );
    }

    #[test]
    fn given_count_past_ceiling_when_decoded_should_reject_before_allocating() {
        let bytes = sealed(prefix(CONSUMER_OFFSETS_ENTRIES_MAX + 1, 0, 0));
        assert_eq!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::TooManyEntries {
                section: "consumers",
                count: CONSUMER_OFFSETS_ENTRIES_MAX + 1,
                max: CONSUMER_OFFSETS_ENTRIES_MAX,
            })
        );
        let bytes = sealed(prefix(0, u32::MAX, 0));
        assert_eq!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::TooManyEntries {
                section: "groups",
                count: u32::MAX,
                max: CONSUMER_OFFSETS_ENTRIES_MAX,
            })
        );
    }

    #[test]
    fn given_count_exceeding_bytes_when_decoded_should_reject_as_truncated() {
        // Under the ceiling, but 12 × 1,000,000 bytes are not present.
        let bytes = sealed(prefix(1_000_000, 0, 0));
        assert_eq!(
            ConsumerOffsetsWire::decode(&bytes),
            Err(ConsumerOffsetsWireError::Truncated)
        );
    }

    #[test]
    fn given_duplicate_or_unordered_ids_when_decoded_should_reject() {
        let duplicate = ConsumerOffsetsWire {
            consumers: vec![(5, Offset(1)), (5, Offset(2))],
            ..ConsumerOffsetsWire::default()
        };
        assert_eq!(
            ConsumerOffsetsWire::decode(&duplicate.encode()),
            Err(ConsumerOffsetsWireError::NonAscendingId {
                section: "consumers",
                id: 5
            })
        );
        let unordered = ConsumerOffsetsWire {
            groups: vec![(9, Offset(1)), (4, Offset(2))],
            ..ConsumerOffsetsWire::default()
        };
        assert_eq!(
            ConsumerOffsetsWire::decode(&unordered.encode()),
            Err(ConsumerOffsetsWireError::NonAscendingId {
                section: "groups",
                id: 4
            })
        );
    }

    #[test]
    fn given_trailing_bytes_when_decoded_should_reject() {
        let mut padded = table().encode();
        padded.truncate(padded.len() - 8);
        padded.push(0);
        assert_eq!(
            ConsumerOffsetsWire::decode(&sealed(padded)),
            Err(ConsumerOffsetsWireError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn given_encoded_artifact_when_peeked_should_report_purge_generation() {
        assert_eq!(offered_purge_generation(&table().encode()), 3);
        assert_eq!(offered_purge_generation(b"garbage"), 0);
    }

    fn any_table() -> impl Strategy<Value = ConsumerOffsetsWire> {
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::btree_map(any::<u32>(), any::<u64>(), 0..20),
            proptest::collection::btree_map(any::<u32>(), any::<u64>(), 0..20),
            proptest::collection::btree_map(
                1..=u128::MAX,
                (any::<u32>(), any::<u64>(), any::<u64>(), any::<u128>()),
                0..10,
            ),
        )
            .prop_map(
                |(purge_generation, next_offset, c, g, d)| ConsumerOffsetsWire {
                    purge_generation,
                    next_offset: Offset(next_offset),
                    consumers: c.into_iter().map(|(id, o)| (id, Offset(o))).collect(),
                    groups: g.into_iter().map(|(id, o)| (id, Offset(o))).collect(),
                    dedup: d
                        .into_iter()
                        .map(
                            |(client, (user_id, watermark, latest_commit, committed_window))| {
                                DedupWatermark {
                                    client,
                                    user_id,
                                    watermark,
                                    latest_commit: Op(latest_commit),
                                    committed_window,
                                }
                            },
                        )
                        .collect(),
                },
            )
    }

    proptest! {
        #[test]
        fn given_random_table_when_encoded_should_round_trip(t in any_table()) {
            prop_assert_eq!(ConsumerOffsetsWire::decode(&t.encode()), Ok(t));
        }

        #[test]
        fn given_random_bytes_when_decoded_should_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            let _ = ConsumerOffsetsWire::decode(&bytes);
            let _ = ConsumerOffsetsWire::decode(&sealed(bytes));
        }

        #[test]
        fn given_random_table_with_any_byte_changed_when_decoded_should_reject(
            t in any_table(), at in any::<prop::sample::Index>(), mask in 1..=u8::MAX
        ) {
            let mut e = t.encode();
            let i = at.index(e.len());
            e[i] ^= mask;
            prop_assert!(ConsumerOffsetsWire::decode(&e).is_err());
        }
    }
}
