//! The state manifest: the ordered list of artifacts a state-transfer offer
//! consists of, carried as the body of the offer frame.
//!
//! Layout "ISM1", little-endian:
//!
//! | field | width |
//! |---|---|
//! | magic `ISM1` | 4 |
//! | count | u32 |
//! | entry_len (25 in this version) | u8 |
//! | count × { kind u8, frontier u64, len u64, checksum u64 } | entry_len each |
//! | xxh3-64 trailer over everything before it | u64 |
//!
//! `entry_len` lets a later version append per-entry fields: a decoder reads
//! the 25 bytes it knows and skips the rest of each entry.

use crate::hashing::{push_trailer, split_verified_trailer, state_artifact_checksum};
use common::le_cursor::{LeCursor, Truncated};
use common::{Offset, Op};
use std::fmt;

/// The artifact kinds' codes, pinned on the wire: never reorder or reuse a
/// value. [`ArtifactKind`] is the typed form.
pub mod artifact_kind {
    /// The metadata plane's snapshot payload; frontier = its applied op.
    pub const METADATA_SNAPSHOT: u8 = 0;
    /// An encoded client table; frontier = the offer's commit op.
    pub const CLIENT_TABLE: u8 = 1;
    /// One retained segment's `.log` bytes; frontier = its base offset.
    pub const SEGMENT_LOG: u8 = 2;
    /// The consumer-offset table ("ICO2"); frontier = the offer's commit op.
    pub const CONSUMER_OFFSETS: u8 = 3;
}

/// Magic that opens an encoded manifest.
pub const STATE_MANIFEST_MAGIC: [u8; 4] = *b"ISM1";
/// Encoded length of one entry in this version.
pub const STATE_MANIFEST_ENTRY_LEN: u8 = 25;
/// The most entries a manifest may carry. A corruption guard on a count a
/// peer sent, not a sizing target.
pub const STATE_MANIFEST_ENTRIES_MAX: usize = 1 << 16;
const PREFIX_LEN: usize = 4 + 4 + 1;

/// What an artifact is, with the watermark its kind gives the entry's
/// `frontier` field on the wire: a commit op for the tables and the
/// metadata snapshot, a message offset for a segment. Typed, so a segment's
/// base offset can never be compared with an offer's op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactKind {
    /// The metadata plane's snapshot payload, as of `commit_op`.
    MetadataSnapshot {
        /// The op the snapshot was taken at.
        commit_op: Op,
    },
    /// An encoded client table, as of the offer's commit op.
    ClientTable {
        /// The offer's commit op.
        commit_op: Op,
    },
    /// One retained segment's `.log` bytes.
    SegmentLog {
        /// The segment's first offset.
        base_offset: Offset,
    },
    /// The consumer-offset table ("ICO2"), as of the offer's commit op.
    ConsumerOffsets {
        /// The offer's commit op.
        commit_op: Op,
    },
    /// A code this version does not know (a decoder keeps it; the plane
    /// that reads the manifest decides). Never one of [`artifact_kind`]'s.
    Unknown {
        /// The kind code.
        code: u8,
        /// The watermark, uninterpreted.
        frontier: u64,
    },
}

impl ArtifactKind {
    /// The typed kind of a wire entry.
    pub const fn from_wire(code: u8, frontier: u64) -> Self {
        match code {
            artifact_kind::METADATA_SNAPSHOT => Self::MetadataSnapshot {
                commit_op: Op(frontier),
            },
            artifact_kind::CLIENT_TABLE => Self::ClientTable {
                commit_op: Op(frontier),
            },
            artifact_kind::SEGMENT_LOG => Self::SegmentLog {
                base_offset: Offset(frontier),
            },
            artifact_kind::CONSUMER_OFFSETS => Self::ConsumerOffsets {
                commit_op: Op(frontier),
            },
            code => Self::Unknown { code, frontier },
        }
    }

    /// The kind's wire code ([`artifact_kind`]).
    pub const fn code(self) -> u8 {
        match self {
            Self::MetadataSnapshot { .. } => artifact_kind::METADATA_SNAPSHOT,
            Self::ClientTable { .. } => artifact_kind::CLIENT_TABLE,
            Self::SegmentLog { .. } => artifact_kind::SEGMENT_LOG,
            Self::ConsumerOffsets { .. } => artifact_kind::CONSUMER_OFFSETS,
            Self::Unknown { code, .. } => code,
        }
    }

    /// The watermark as the wire carries it.
    pub const fn wire_frontier(self) -> u64 {
        match self {
            Self::MetadataSnapshot { commit_op }
            | Self::ClientTable { commit_op }
            | Self::ConsumerOffsets { commit_op } => commit_op.0,
            Self::SegmentLog { base_offset } => base_offset.0,
            Self::Unknown { frontier, .. } => frontier,
        }
    }

    /// The commit op of a kind whose watermark is one.
    pub const fn commit_op(self) -> Option<Op> {
        match self {
            Self::MetadataSnapshot { commit_op }
            | Self::ClientTable { commit_op }
            | Self::ConsumerOffsets { commit_op } => Some(commit_op),
            Self::SegmentLog { .. } | Self::Unknown { .. } => None,
        }
    }

    /// A segment's base offset.
    pub const fn base_offset(self) -> Option<Offset> {
        match self {
            Self::SegmentLog { base_offset } => Some(base_offset),
            _ => None,
        }
    }
}

/// One piece of transferable state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateArtifact {
    /// What it is and its watermark; unknown kinds decode, the plane
    /// decides.
    pub kind: ArtifactKind,
    /// Length of the artifact in bytes.
    pub len: u64,
    /// xxh3-64 of the whole artifact.
    pub checksum: u64,
}

impl StateArtifact {
    /// The entry describing `bytes`: its length and checksum filled in.
    pub fn for_bytes(kind: ArtifactKind, bytes: &[u8]) -> Self {
        Self {
            kind,
            len: bytes.len() as u64,
            checksum: state_artifact_checksum(bytes),
        }
    }
}

/// True iff `bytes` has exactly the entry's declared length and checksum.
///
/// This proves only that the bytes arrived as offered; the receiving plane
/// still validates their format before installing them.
pub fn verify_state_artifact(entry: &StateArtifact, bytes: &[u8]) -> bool {
    u64::try_from(bytes.len()).is_ok_and(|len| len == entry.len)
        && state_artifact_checksum(bytes) == entry.checksum
}

/// Why a manifest failed to decode. Nothing is trusted from a manifest
/// that returns one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestError {
    /// The input ends before a field, or before its declared entries.
    Truncated,
    /// The trailer does not match the content.
    ChecksumMismatch {
        /// Checksum stored in the trailer.
        expected: u64,
        /// Checksum of the content.
        actual: u64,
    },
    /// The first four bytes are not `ISM1`.
    BadMagic {
        /// The bytes found instead.
        found: [u8; 4],
    },
    /// More entries than [`STATE_MANIFEST_ENTRIES_MAX`].
    TooManyEntries {
        /// The count the manifest declared.
        count: u32,
    },
    /// An entry length shorter than this version's 25 bytes.
    EntryTooShort {
        /// The entry length the manifest declared.
        entry_len: u8,
    },
    /// Bytes left after the declared entries.
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

impl From<Truncated> for ManifestError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("state manifest is truncated"),
            Self::ChecksumMismatch { expected, actual } => write!(
                f,
                "state manifest trailer {expected:#018x} does not match its content ({actual:#018x})"
            ),
            Self::BadMagic { found } => {
                write!(f, "state manifest magic is {found:?}, expected \"ISM1\"")
            }
            Self::TooManyEntries { count } => write!(
                f,
                "state manifest declares {count} entries, more than the {STATE_MANIFEST_ENTRIES_MAX} allowed"
            ),
            Self::EntryTooShort { entry_len } => write!(
                f,
                "state manifest entries are {entry_len} bytes, shorter than the {STATE_MANIFEST_ENTRY_LEN} this version reads"
            ),
            Self::TrailingBytes { extra } => write!(
                f,
                "state manifest has {extra} bytes after its declared entries"
            ),
        }
    }
}

impl std::error::Error for ManifestError {}

/// Encodes `entries` in the "ISM1" layout.
///
/// # Panics
/// If there are more than [`STATE_MANIFEST_ENTRIES_MAX`] entries: the offer
/// builder checks the count first and refuses with its own error, so
/// reaching this is a programming error.
pub fn encode_manifest(entries: &[StateArtifact]) -> Vec<u8> {
    assert!(
        entries.len() <= STATE_MANIFEST_ENTRIES_MAX,
        "manifest of {} entries exceeds the ceiling {STATE_MANIFEST_ENTRIES_MAX}",
        entries.len()
    );
    let mut out = Vec::with_capacity(encoded_manifest_len(entries.len()));
    out.extend_from_slice(&STATE_MANIFEST_MAGIC);
    // Lossless: bounded by the assertion above.
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.push(STATE_MANIFEST_ENTRY_LEN);
    for entry in entries {
        out.push(entry.kind.code());
        out.extend_from_slice(&entry.kind.wire_frontier().to_le_bytes());
        out.extend_from_slice(&entry.len.to_le_bytes());
        out.extend_from_slice(&entry.checksum.to_le_bytes());
    }
    push_trailer(&mut out);
    debug_assert_eq!(out.len(), encoded_manifest_len(entries.len()));
    out
}

/// The encoded length of a manifest of `count` entries in this version.
pub const fn encoded_manifest_len(count: usize) -> usize {
    PREFIX_LEN + count * STATE_MANIFEST_ENTRY_LEN as usize + 8
}

/// Decodes an "ISM1" manifest, failing closed.
///
/// The trailer is verified first, then the magic; the declared count is
/// checked against the ceiling and against the bytes present before the
/// entry vector is allocated.
pub fn decode_manifest(bytes: &[u8]) -> Result<Vec<StateArtifact>, ManifestError> {
    let content = split_verified_trailer(bytes).map_err(|mismatch| match mismatch {
        None => ManifestError::Truncated,
        Some((expected, actual)) => ManifestError::ChecksumMismatch { expected, actual },
    })?;
    let mut cursor = LeCursor::new(content);
    let mut found = [0u8; 4];
    found.copy_from_slice(cursor.take(4)?);
    if found != STATE_MANIFEST_MAGIC {
        return Err(ManifestError::BadMagic { found });
    }
    let count = cursor.u32()?;
    if count as usize > STATE_MANIFEST_ENTRIES_MAX {
        return Err(ManifestError::TooManyEntries { count });
    }
    let entry_len = cursor.u8()?;
    if entry_len < STATE_MANIFEST_ENTRY_LEN {
        return Err(ManifestError::EntryTooShort { entry_len });
    }
    let body_len = count as usize * entry_len as usize;
    let present = cursor.remaining().len();
    if body_len > present {
        return Err(ManifestError::Truncated);
    }
    if body_len < present {
        return Err(ManifestError::TrailingBytes {
            extra: present - body_len,
        });
    }
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut entry = LeCursor::new(cursor.take(entry_len as usize)?);
        let (code, frontier) = (entry.u8()?, entry.u64()?);
        entries.push(StateArtifact {
            kind: ArtifactKind::from_wire(code, frontier),
            len: entry.u64()?,
            checksum: entry.u64()?,
        });
        // Any bytes past the 25 known ones belong to a newer version and
        // are skipped on purpose.
    }
    debug_assert!(cursor.remaining().is_empty());
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn given_artifact_when_verified_should_check_length_and_checksum() {
        let bytes = b"segment bytes".to_vec();
        let entry = StateArtifact::for_bytes(segment(7), &bytes);
        assert!(verify_state_artifact(&entry, &bytes));
        assert!(!verify_state_artifact(&entry, &bytes[..bytes.len() - 1]));
        let mut flipped = bytes.clone();
        flipped[0] ^= 1;
        assert!(!verify_state_artifact(&entry, &flipped));
        let longer = StateArtifact {
            len: entry.len + 1,
            ..entry
        };
        assert!(!verify_state_artifact(&longer, &bytes));
    }

    #[test]
    fn given_each_code_when_typed_should_say_what_its_frontier_is_and_round_trip() {
        let f = 0x0102_0304_0506_0708;
        let cases = [
            (
                artifact_kind::METADATA_SNAPSHOT,
                ArtifactKind::MetadataSnapshot { commit_op: Op(f) },
            ),
            (
                artifact_kind::CLIENT_TABLE,
                ArtifactKind::ClientTable { commit_op: Op(f) },
            ),
            (artifact_kind::SEGMENT_LOG, segment(f)),
            (
                artifact_kind::CONSUMER_OFFSETS,
                ArtifactKind::ConsumerOffsets { commit_op: Op(f) },
            ),
            (
                4,
                ArtifactKind::Unknown {
                    code: 4,
                    frontier: f,
                },
            ),
            (
                255,
                ArtifactKind::Unknown {
                    code: 255,
                    frontier: f,
                },
            ),
        ];
        for (code, kind) in cases {
            assert_eq!(ArtifactKind::from_wire(code, f), kind);
            assert_eq!((kind.code(), kind.wire_frontier()), (code, f));
            assert_eq!(
                kind.base_offset().is_some(),
                code == artifact_kind::SEGMENT_LOG
            );
            assert_eq!(
                kind.commit_op().is_some(),
                code < 4 && code != artifact_kind::SEGMENT_LOG
            );
        }
    }

    fn segment(base: u64) -> ArtifactKind {
        ArtifactKind::SegmentLog {
            base_offset: Offset(base),
        }
    }

    fn sample() -> Vec<StateArtifact> {
        vec![
            StateArtifact::for_bytes(segment(0), b"first segment"),
            StateArtifact::for_bytes(segment(1000), b"second"),
            StateArtifact::for_bytes(ArtifactKind::ConsumerOffsets { commit_op: Op(42) }, b""),
            StateArtifact {
                kind: ArtifactKind::Unknown {
                    code: 200,
                    frontier: u64::MAX,
                },
                len: u64::MAX,
                checksum: 1,
            },
        ]
    }

    /// Re-seals `content` with a fresh trailer, so a test can reach the
    /// checks that run after the trailer.
    fn sealed(mut content: Vec<u8>) -> Vec<u8> {
        push_trailer(&mut content);
        content
    }

    #[test]
    fn given_entries_when_encoded_should_round_trip() {
        let entries = sample();
        let bytes = encode_manifest(&entries);
        assert_eq!(bytes.len(), 9 + 25 * entries.len() + 8);
        assert_eq!(decode_manifest(&bytes), Ok(entries));
    }

    #[test]
    fn given_empty_manifest_when_encoded_should_round_trip() {
        let bytes = encode_manifest(&[]);
        assert_eq!(bytes.len(), 17);
        assert_eq!(decode_manifest(&bytes), Ok(Vec::new()));
    }

    #[test]
    fn given_known_entry_when_encoded_should_match_documented_bytes() {
        let entry = StateArtifact {
            kind: segment(0x0102_0304_0506_0708),
            len: 0x10,
            checksum: 0xAABB,
        };
        let bytes = encode_manifest(&[entry]);
        let mut expected = b"ISM1".to_vec();
        expected.extend_from_slice(&[1, 0, 0, 0, 25, 2]);
        expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        expected.extend_from_slice(&[0x10, 0, 0, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[0xBB, 0xAA, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[..bytes.len() - 8], &expected[..]);
        assert_eq!(
            &bytes[bytes.len() - 8..],
            &state_artifact_checksum(&expected).to_le_bytes()
        );
    }

    #[test]
    fn given_every_strict_prefix_when_decoded_should_reject() {
        let bytes = encode_manifest(&sample());
        for len in 0..bytes.len() {
            assert!(decode_manifest(&bytes[..len]).is_err(), "prefix {len}");
        }
    }

    #[test]
    fn given_any_flipped_bit_when_decoded_should_reject() {
        let bytes = encode_manifest(&sample());
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_manifest(&flipped).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn given_short_input_when_decoded_should_report_truncated() {
        assert_eq!(decode_manifest(&[0; 7]), Err(ManifestError::Truncated));
        assert_eq!(
            decode_manifest(&sealed(b"ISM1".to_vec())),
            Err(ManifestError::Truncated)
        );
    }

    #[test]
    fn given_corrupt_trailer_when_decoded_should_report_checksum_mismatch() {
        let mut bytes = encode_manifest(&sample());
        let last = bytes.len() - 1;
        bytes[last] ^= 0x80;
        assert!(matches!(
            decode_manifest(&bytes),
            Err(ManifestError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn given_foreign_magic_when_decoded_should_report_bad_magic() {
        let mut content = encode_manifest(&[]);
        content.truncate(content.len() - 8);
        content[..4].copy_from_slice(b"ISM2");
        assert_eq!(
            decode_manifest(&sealed(content)),
            Err(ManifestError::BadMagic { found: *b"ISM2" })
        );
    }

    #[test]
    fn given_count_past_ceiling_when_decoded_should_reject_before_allocating() {
        // u32::MAX entries of 25 bytes would ask for ~100 GiB.
        for count in [STATE_MANIFEST_ENTRIES_MAX as u32 + 1, u32::MAX] {
            let mut content = b"ISM1".to_vec();
            content.extend_from_slice(&count.to_le_bytes());
            content.push(STATE_MANIFEST_ENTRY_LEN);
            assert_eq!(
                decode_manifest(&sealed(content)),
                Err(ManifestError::TooManyEntries { count })
            );
        }
    }

    #[test]
    fn given_count_past_bytes_present_when_decoded_should_report_truncated() {
        let mut content = b"ISM1".to_vec();
        content.extend_from_slice(&(STATE_MANIFEST_ENTRIES_MAX as u32).to_le_bytes());
        content.push(STATE_MANIFEST_ENTRY_LEN);
        content.extend_from_slice(&[0; 25]);
        assert_eq!(
            decode_manifest(&sealed(content)),
            Err(ManifestError::Truncated)
        );
    }

    #[test]
    fn given_entry_len_below_25_when_decoded_should_reject() {
        let mut content = b"ISM1".to_vec();
        content.extend_from_slice(&0u32.to_le_bytes());
        content.push(24);
        assert_eq!(
            decode_manifest(&sealed(content)),
            Err(ManifestError::EntryTooShort { entry_len: 24 })
        );
    }

    #[test]
    fn given_longer_entries_from_newer_version_when_decoded_should_skip_tail() {
        let entries = sample();
        let mut content = b"ISM1".to_vec();
        content.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        content.push(STATE_MANIFEST_ENTRY_LEN + 3);
        for e in &entries {
            content.push(e.kind.code());
            content.extend_from_slice(&e.kind.wire_frontier().to_le_bytes());
            content.extend_from_slice(&e.len.to_le_bytes());
            content.extend_from_slice(&e.checksum.to_le_bytes());
            content.extend_from_slice(&[0xEE; 3]);
        }
        assert_eq!(decode_manifest(&sealed(content)), Ok(entries));
    }

    #[test]
    fn given_trailing_bytes_when_decoded_should_reject() {
        let mut content = encode_manifest(&sample());
        content.truncate(content.len() - 8);
        content.push(0);
        assert_eq!(
            decode_manifest(&sealed(content)),
            Err(ManifestError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn given_maximum_entries_when_encoded_should_round_trip() {
        let entries: Vec<_> = (0..STATE_MANIFEST_ENTRIES_MAX as u64)
            .map(|i| StateArtifact {
                kind: segment(i * 10),
                len: i,
                checksum: i ^ 0x5555,
            })
            .collect();
        assert_eq!(decode_manifest(&encode_manifest(&entries)), Ok(entries));
    }

    #[test]
    #[should_panic(expected = "exceeds the ceiling")]
    fn given_too_many_entries_when_encoded_should_panic() {
        let entries = vec![
            StateArtifact {
                kind: segment(0),
                len: 0,
                checksum: 0
            };
            STATE_MANIFEST_ENTRIES_MAX + 1
        ];
        let _ = encode_manifest(&entries);
    }

    fn artifact() -> impl Strategy<Value = StateArtifact> {
        (any::<u8>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(code, frontier, len, checksum)| StateArtifact {
                kind: ArtifactKind::from_wire(code, frontier),
                len,
                checksum,
            },
        )
    }

    proptest! {
        #[test]
        fn given_random_entries_when_encoded_should_round_trip(
            entries in proptest::collection::vec(artifact(), 0..64)
        ) {
            prop_assert_eq!(decode_manifest(&encode_manifest(&entries)), Ok(entries));
        }

        #[test]
        fn given_random_bytes_when_decoded_should_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let _ = decode_manifest(&bytes);
            let _ = decode_manifest(&sealed(bytes));
        }
    }
}
