//! The check of an offer's descriptor (ST-R1): its header against what
//! this replica knows, and its manifest whole (kinds, sizes, order, one
//! offsets artifact last) before anything is created.

use std::fmt;

use consensus::header::StateTransferTargetHeader;
use consensus::{ArtifactKind, ManifestError, decode_manifest};

use super::{
    AcceptedDescriptor, LocalFacts, OFFSETS_ARTIFACT_LEN_MAX, ReceiverConfig,
    TRANSFER_TOTAL_LEN_MAX,
};
use crate::state_transfer::driver::{OfferHeaderRefusal, check_offer_header};

/// Why a descriptor was refused at accept. None leaves anything behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorRefusal {
    /// The manifest did not decode.
    Manifest(ManifestError),
    /// An artifact kind this plane cannot install.
    UnknownKind {
        /// Manifest index.
        index: usize,
        /// The kind.
        kind: u8,
    },
    /// A segment artifact past the cap.
    SegmentTooLarge {
        /// Manifest index.
        index: usize,
        /// Declared length.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// The offsets artifact past its cap.
    OffsetsTooLarge {
        /// Declared length.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// The offer's bytes in total past the cap (or past `u64`).
    TotalTooLarge {
        /// The cap.
        max: u64,
    },
    /// The offsets artifact is missing, repeated, or not last.
    OffsetsArtifactMisplaced {
        /// How many the manifest lists.
        count: usize,
    },
    /// A segment entry does not start above the previous one (two would
    /// share a staging file name).
    SegmentsNotAscending {
        /// Manifest index.
        index: usize,
        /// The previous base offset.
        previous: u64,
        /// This entry's base offset.
        frontier: u64,
    },
    /// A zero-length segment (empty segments are never offered).
    EmptySegment {
        /// Manifest index.
        index: usize,
    },
    /// The offer's header is out of range or from a peer behind this
    /// replica (the check group 0's receiver shares).
    Header(OfferHeaderRefusal),
}

impl fmt::Display for DescriptorRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Manifest(e) => write!(f, "offer manifest does not decode: {e}"),
            Self::UnknownKind { index, kind } => {
                write!(
                    f,
                    "offer artifact {index} has kind {kind}, which a partition cannot install"
                )
            }
            Self::SegmentTooLarge { index, len, max } => {
                write!(
                    f,
                    "offer segment {index} declares {len} bytes, past the cap of {max}"
                )
            }
            Self::OffsetsTooLarge { len, max } => write!(
                f,
                "offer offsets artifact declares {len} bytes, past the cap of {max}"
            ),
            Self::TotalTooLarge { max } => {
                write!(
                    f,
                    "offer declares more bytes in total than the cap of {max}"
                )
            }
            Self::OffsetsArtifactMisplaced { count } => write!(
                f,
                "offer lists {count} consumer-offsets artifacts; exactly one, last, is required"
            ),
            Self::SegmentsNotAscending {
                index,
                previous,
                frontier,
            } => write!(
                f,
                "offer segment {index} starts at {frontier}, not above the previous one at {previous}"
            ),
            Self::EmptySegment { index } => write!(f, "offer segment {index} is empty"),
            Self::Header(r) => write!(f, "{r}"),
        }
    }
}

impl std::error::Error for DescriptorRefusal {}

/// Checks an offer's descriptor whole before anything is created (ST-R1).
pub(super) fn accept_descriptor(
    view: u32,
    header: &StateTransferTargetHeader,
    body: &[u8],
    local: &LocalFacts,
    config: &ReceiverConfig,
) -> Result<AcceptedDescriptor, DescriptorRefusal> {
    check_offer_header(view, header, local).map_err(DescriptorRefusal::Header)?;
    let manifest = decode_manifest(body).map_err(DescriptorRefusal::Manifest)?;
    let mut total: u64 = 0;
    let mut offsets_count = 0;
    let mut previous: Option<u64> = None;
    for (index, entry) in manifest.iter().enumerate() {
        match entry.kind {
            ArtifactKind::SegmentLog { base_offset } => {
                if entry.len > config.segment_artifact_len_max_bytes {
                    return Err(DescriptorRefusal::SegmentTooLarge {
                        index,
                        len: entry.len,
                        max: config.segment_artifact_len_max_bytes,
                    });
                }
                if entry.len == 0 {
                    return Err(DescriptorRefusal::EmptySegment { index });
                }
                if let Some(previous) = previous.filter(|&p| base_offset.0 <= p) {
                    return Err(DescriptorRefusal::SegmentsNotAscending {
                        index,
                        previous,
                        frontier: base_offset.0,
                    });
                }
                previous = Some(base_offset.0);
            }
            ArtifactKind::ConsumerOffsets { .. } => {
                if entry.len > OFFSETS_ARTIFACT_LEN_MAX {
                    return Err(DescriptorRefusal::OffsetsTooLarge {
                        len: entry.len,
                        max: OFFSETS_ARTIFACT_LEN_MAX,
                    });
                }
                offsets_count += 1;
            }
            kind => {
                return Err(DescriptorRefusal::UnknownKind {
                    index,
                    kind: kind.code(),
                });
            }
        }
        total = total
            .checked_add(entry.len)
            .filter(|&t| t <= TRANSFER_TOTAL_LEN_MAX)
            .ok_or(DescriptorRefusal::TotalTooLarge {
                max: TRANSFER_TOTAL_LEN_MAX,
            })?;
    }
    let last_is_offsets = manifest
        .last()
        .is_some_and(|e| matches!(e.kind, ArtifactKind::ConsumerOffsets { .. }));
    if offsets_count != 1 || !last_is_offsets {
        return Err(DescriptorRefusal::OffsetsArtifactMisplaced {
            count: offsets_count,
        });
    }
    Ok(AcceptedDescriptor {
        commit_op: header.commit_op,
        view,
        commit_max: header.commit_max,
        manifest,
    })
}
