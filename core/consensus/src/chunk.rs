//! The receiver's side of the chunk protocol: which piece of which artifact
//! to ask for next, and which arriving chunks to accept.
//!
//! A state transfer pulls in manifest order, the reference lockstep with one
//! chunk in flight (the partition receiver may keep a small window out and
//! hold the few chunks that arrive ahead of the cursor until it reaches
//! them; these functions only ever see the chunk at the cursor).
//! A chunk is addressed by `(artifact index, byte offset)`, and the only
//! acceptable chunk is the one that continues the first incomplete artifact
//! exactly where it stopped. Everything else — a duplicate, a reordered or
//! stale frame, a chunk for another artifact, one running past the declared
//! length, an empty payload — is refused without side effects, so the caller
//! resets its liveness counters only when real bytes landed. (Counting an
//! empty chunk as progress once caused an endless empty-frame ping-pong.)
//!
//! Accepting only the first incomplete artifact also caps memory: at most one
//! artifact is being received at a time, and [`ArtifactProgress`] reserves no
//! more than [`ARTIFACT_RESERVE_MAX_BYTES`] up front however large a peer
//! declares it.
//!
//! Streaming to disk: a receiver that writes chunks to a staging file instead
//! of buffering them calls [`check_chunk`] first (pure), writes the payload
//! at the returned offset, and only then records the bytes with
//! [`ChunkProgress::extend_from_chunk`]. Its progress type counts received
//! bytes without keeping them.

use crate::state_manifest::StateArtifact;
use std::fmt;

/// Upper bound on what [`ArtifactProgress`] reserves when an artifact's
/// first chunk arrives. Beyond it the buffer grows as bytes really arrive,
/// so a declared length can never make us allocate memory up front.
pub const ARTIFACT_RESERVE_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Progress of one artifact of a transfer, as the chunk cursor sees it.
pub trait ChunkProgress {
    /// The artifact's length as the manifest declared it.
    fn declared_len(&self) -> u64;
    /// Bytes received so far; also the offset of the next chunk to request.
    fn received_len(&self) -> u64;
    /// Records a chunk the cursor accepted. Called only after
    /// [`check_chunk`] passed, so `payload` continues exactly at
    /// [`Self::received_len`] and does not run past the declared length.
    fn extend_from_chunk(&mut self, payload: &[u8]);
    /// Called once per artifact, when its first chunk is accepted.
    fn reserve_declared(&mut self) {}
    /// Whether every declared byte arrived. A zero-length artifact is
    /// complete from the start and is never requested.
    fn complete(&self) -> bool {
        self.received_len() >= self.declared_len()
    }
}

/// An artifact being received into memory: the manifest entry plus the
/// bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactProgress {
    /// The manifest entry this progress belongs to.
    pub entry: StateArtifact,
    /// The bytes received so far, in order.
    pub buf: Vec<u8>,
}

impl ArtifactProgress {
    /// Nothing received yet.
    pub const fn new(entry: StateArtifact) -> Self {
        Self {
            entry,
            buf: Vec::new(),
        }
    }
}

impl ChunkProgress for ArtifactProgress {
    fn declared_len(&self) -> u64 {
        self.entry.len
    }

    fn received_len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn extend_from_chunk(&mut self, payload: &[u8]) {
        self.buf.extend_from_slice(payload);
    }

    fn reserve_declared(&mut self) {
        let want = self.entry.len.min(ARTIFACT_RESERVE_MAX_BYTES);
        // Lossless: bounded by the cap above.
        self.buf.reserve(want as usize);
    }
}

/// The next chunk a receiver should ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingChunk {
    /// Index of the artifact in the manifest.
    pub artifact: u32,
    /// Byte offset within the artifact.
    pub offset: u64,
    /// How many bytes to ask for; never zero.
    pub len: u32,
}

/// The first incomplete artifact in manifest order and where it stopped, or
/// `None` once everything is complete (including an empty manifest).
///
/// `chunk_len_max` of zero is treated as one: a zero-length request would
/// never make progress.
pub fn next_pending_chunk<P: ChunkProgress>(
    artifacts: &[P],
    chunk_len_max: u32,
) -> Option<PendingChunk> {
    let index = first_incomplete(artifacts)?;
    let progress = &artifacts[index];
    let remaining = progress.declared_len() - progress.received_len();
    let len = remaining.min(u64::from(chunk_len_max.max(1)));
    Some(PendingChunk {
        // Lossless: manifests hold at most 2^16 entries.
        artifact: index as u32,
        offset: progress.received_len(),
        // Lossless: bounded by chunk_len_max.
        len: len as u32,
    })
}

fn first_incomplete<P: ChunkProgress>(artifacts: &[P]) -> Option<usize> {
    artifacts.iter().position(|p| !p.complete())
}

/// Why a chunk was not accepted. None of these change any state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkRejection {
    /// The chunk carries no bytes.
    EmptyPayload,
    /// The artifact index is not in the manifest.
    UnknownArtifact {
        /// The index the chunk named.
        artifact: u32,
        /// How many artifacts the manifest has.
        count: usize,
    },
    /// Every artifact is already complete.
    AllComplete,
    /// The chunk is for an artifact other than the one being received.
    NotCurrentArtifact {
        /// The index the chunk named.
        artifact: u32,
        /// The index of the first incomplete artifact.
        current: u32,
    },
    /// The chunk does not continue where the artifact stopped (a duplicate
    /// or a reordered frame).
    WrongOffset {
        /// Where the artifact stopped.
        expected: u64,
        /// Where the chunk starts.
        offset: u64,
    },
    /// The chunk would run past the artifact's declared length.
    Overrun {
        /// The declared length.
        declared: u64,
        /// Where the chunk would end.
        end: u64,
    },
}

impl fmt::Display for ChunkRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyPayload => f.write_str("chunk carries no bytes"),
            Self::UnknownArtifact { artifact, count } => write!(
                f,
                "chunk names artifact {artifact} but the manifest has {count}"
            ),
            Self::AllComplete => f.write_str("chunk arrived after every artifact completed"),
            Self::NotCurrentArtifact { artifact, current } => write!(
                f,
                "chunk is for artifact {artifact} while artifact {current} is being received"
            ),
            Self::WrongOffset { expected, offset } => {
                write!(f, "chunk starts at byte {offset}, expected byte {expected}")
            }
            Self::Overrun { declared, end } => write!(
                f,
                "chunk ends at byte {end}, past the declared length {declared}"
            ),
        }
    }
}

impl std::error::Error for ChunkRejection {}

/// A chunk that [`check_chunk`] accepted: where its bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptedChunk {
    /// Index of the artifact in the manifest.
    pub artifact: usize,
    /// Byte offset of the payload within the artifact.
    pub offset: u64,
    /// Whether these bytes are the artifact's first.
    pub first: bool,
    /// Whether these bytes complete the artifact.
    pub completes: bool,
}

/// Decides, without changing anything, whether a chunk continues the
/// artifact being received.
pub fn check_chunk<P: ChunkProgress>(
    artifacts: &[P],
    artifact: u32,
    offset: u64,
    payload: &[u8],
) -> Result<AcceptedChunk, ChunkRejection> {
    if payload.is_empty() {
        return Err(ChunkRejection::EmptyPayload);
    }
    let index = artifact as usize;
    if index >= artifacts.len() {
        return Err(ChunkRejection::UnknownArtifact {
            artifact,
            count: artifacts.len(),
        });
    }
    let current = first_incomplete(artifacts).ok_or(ChunkRejection::AllComplete)?;
    if index != current {
        return Err(ChunkRejection::NotCurrentArtifact {
            artifact,
            // Lossless: current < artifacts.len() and index fits u32.
            current: current as u32,
        });
    }
    let progress = &artifacts[index];
    let expected = progress.received_len();
    if offset != expected {
        return Err(ChunkRejection::WrongOffset { expected, offset });
    }
    let declared = progress.declared_len();
    let end = offset.saturating_add(payload.len() as u64);
    if end > declared {
        return Err(ChunkRejection::Overrun { declared, end });
    }
    Ok(AcceptedChunk {
        artifact: index,
        offset,
        first: offset == 0,
        completes: end == declared,
    })
}

/// Checks a chunk and, if it continues the artifact being received, records
/// it (reserving on the artifact's first chunk). Returns what was accepted;
/// a rejection changes nothing.
pub fn append_chunk<P: ChunkProgress>(
    artifacts: &mut [P],
    artifact: u32,
    offset: u64,
    payload: &[u8],
) -> Result<AcceptedChunk, ChunkRejection> {
    let accepted = check_chunk(artifacts, artifact, offset, payload)?;
    let progress = &mut artifacts[accepted.artifact];
    if accepted.first {
        progress.reserve_declared();
    }
    progress.extend_from_chunk(payload);
    debug_assert_eq!(
        progress.received_len(),
        accepted.offset + payload.len() as u64,
        "a ChunkProgress must count exactly the bytes it was given"
    );
    Ok(accepted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_manifest::ArtifactKind;
    use common::Offset;

    fn slots(lens: &[usize]) -> (Vec<Vec<u8>>, Vec<ArtifactProgress>) {
        let bodies: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|b| (b * 7 + i) as u8).collect())
            .collect();
        let progress = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| {
                ArtifactProgress::new(StateArtifact::for_bytes(
                    ArtifactKind::SegmentLog {
                        base_offset: Offset(i as u64),
                    },
                    b,
                ))
            })
            .collect();
        (bodies, progress)
    }

    /// Drives a transfer to completion the way a receiver does, serving
    /// every request from `bodies`.
    fn pull_all(bodies: &[Vec<u8>], progress: &mut [ArtifactProgress], chunk: u32) -> usize {
        let mut requests = 0;
        while let Some(req) = next_pending_chunk(progress, chunk) {
            requests += 1;
            let body = &bodies[req.artifact as usize];
            let start = req.offset as usize;
            let end = start + req.len as usize;
            append_chunk(progress, req.artifact, req.offset, &body[start..end])
                .expect("in-order chunk is accepted");
        }
        requests
    }

    #[test]
    fn given_in_order_chunks_when_pulled_should_complete_every_artifact() {
        let (bodies, mut progress) = slots(&[10, 0, 7, 3]);
        let requests = pull_all(&bodies, &mut progress, 4);
        // 10 → 3 chunks, 0 → none, 7 → 2, 3 → 1.
        assert_eq!(requests, 6);
        for (p, b) in progress.iter().zip(&bodies) {
            assert_eq!(&p.buf, b);
            assert!(crate::verify_state_artifact(&p.entry, &p.buf));
        }
        assert_eq!(next_pending_chunk(&progress, 4), None);
    }

    #[test]
    fn given_empty_manifest_when_asked_should_have_nothing_pending() {
        let progress: Vec<ArtifactProgress> = Vec::new();
        assert_eq!(next_pending_chunk(&progress, 1024), None);
        let mut progress = progress;
        assert_eq!(
            append_chunk(&mut progress, 0, 0, b"x"),
            Err(ChunkRejection::UnknownArtifact {
                artifact: 0,
                count: 0
            })
        );
    }

    #[test]
    fn given_zero_length_artifact_when_asked_should_skip_it() {
        let (_, progress) = slots(&[0, 5]);
        assert!(progress[0].complete());
        assert_eq!(
            next_pending_chunk(&progress, 100),
            Some(PendingChunk {
                artifact: 1,
                offset: 0,
                len: 5
            })
        );
        let (_, progress) = slots(&[0, 0]);
        assert_eq!(next_pending_chunk(&progress, 100), None);
    }

    #[test]
    fn given_zero_chunk_len_max_when_asked_should_request_one_byte() {
        let (_, progress) = slots(&[5]);
        assert_eq!(next_pending_chunk(&progress, 0).map(|r| r.len), Some(1));
    }

    #[test]
    fn given_out_of_order_chunk_when_appended_should_reject_without_change() {
        let (bodies, mut progress) = slots(&[10]);
        assert_eq!(
            append_chunk(&mut progress, 0, 4, &bodies[0][4..8]),
            Err(ChunkRejection::WrongOffset {
                expected: 0,
                offset: 4
            })
        );
        assert_eq!(progress[0].received_len(), 0);
    }

    #[test]
    fn given_duplicate_chunk_when_appended_should_reject_without_change() {
        let (bodies, mut progress) = slots(&[10]);
        append_chunk(&mut progress, 0, 0, &bodies[0][..4]).expect("first chunk");
        assert_eq!(
            append_chunk(&mut progress, 0, 0, &bodies[0][..4]),
            Err(ChunkRejection::WrongOffset {
                expected: 4,
                offset: 0
            })
        );
        assert_eq!(progress[0].buf, bodies[0][..4]);
    }

    #[test]
    fn given_overrun_chunk_when_appended_should_reject_without_change() {
        let (_, mut progress) = slots(&[3]);
        assert_eq!(
            append_chunk(&mut progress, 0, 0, &[1, 2, 3, 4]),
            Err(ChunkRejection::Overrun {
                declared: 3,
                end: 4
            })
        );
        assert!(progress[0].buf.is_empty());
        // The very end of the offset space does not wrap around.
        let mut huge = vec![ArtifactProgress::new(StateArtifact {
            kind: ArtifactKind::SegmentLog {
                base_offset: Offset(0),
            },
            len: u64::MAX,
            checksum: 0,
        })];
        assert_eq!(
            append_chunk(&mut huge, 0, u64::MAX, &[1]),
            Err(ChunkRejection::WrongOffset {
                expected: 0,
                offset: u64::MAX
            })
        );
    }

    #[test]
    fn given_empty_payload_when_appended_should_reject() {
        let (_, mut progress) = slots(&[3]);
        assert_eq!(
            append_chunk(&mut progress, 0, 0, &[]),
            Err(ChunkRejection::EmptyPayload)
        );
    }

    #[test]
    fn given_wrong_artifact_index_when_appended_should_reject() {
        let (bodies, mut progress) = slots(&[3, 3]);
        assert_eq!(
            append_chunk(&mut progress, 1, 0, &bodies[1]),
            Err(ChunkRejection::NotCurrentArtifact {
                artifact: 1,
                current: 0
            })
        );
        assert_eq!(
            append_chunk(&mut progress, 2, 0, &bodies[1]),
            Err(ChunkRejection::UnknownArtifact {
                artifact: 2,
                count: 2
            })
        );
        assert_eq!(
            append_chunk(&mut progress, u32::MAX, 0, &bodies[1]),
            Err(ChunkRejection::UnknownArtifact {
                artifact: u32::MAX,
                count: 2
            })
        );
        assert!(progress.iter().all(|p| p.buf.is_empty()));
    }

    #[test]
    fn given_completed_transfer_when_chunk_arrives_should_reject() {
        let (bodies, mut progress) = slots(&[2]);
        pull_all(&bodies, &mut progress, 8);
        assert_eq!(
            append_chunk(&mut progress, 0, 2, &[9]),
            Err(ChunkRejection::AllComplete)
        );
    }

    #[test]
    fn given_huge_declared_length_when_first_chunk_lands_should_cap_reservation() {
        let mut progress = vec![ArtifactProgress::new(StateArtifact {
            kind: ArtifactKind::SegmentLog {
                base_offset: Offset(0),
            },
            len: 1 << 40,
            checksum: 0,
        })];
        let accepted = append_chunk(&mut progress, 0, 0, &[1, 2, 3]).expect("first chunk");
        assert!(accepted.first && !accepted.completes);
        assert!(progress[0].buf.capacity() as u64 <= ARTIFACT_RESERVE_MAX_BYTES + 64);
    }

    /// A receiver that streams to "disk" keeps only a byte count.
    struct Streamed {
        declared: u64,
        written: Vec<u8>,
        received: u64,
    }

    impl ChunkProgress for Streamed {
        fn declared_len(&self) -> u64 {
            self.declared
        }
        fn received_len(&self) -> u64 {
            self.received
        }
        fn extend_from_chunk(&mut self, payload: &[u8]) {
            self.received += payload.len() as u64;
        }
    }

    #[test]
    fn given_streaming_receiver_when_checked_then_written_should_track_count_only() {
        let body: Vec<u8> = (0..100u8).collect();
        let mut slots = vec![Streamed {
            declared: 100,
            written: Vec::new(),
            received: 0,
        }];
        while let Some(req) = next_pending_chunk(&slots, 30) {
            let payload = &body[req.offset as usize..(req.offset + u64::from(req.len)) as usize];
            let accepted = check_chunk(&slots, req.artifact, req.offset, payload).expect("ok");
            // The "disk write" happens between the check and the record.
            slots[accepted.artifact].written.extend_from_slice(payload);
            slots[accepted.artifact].extend_from_chunk(payload);
        }
        assert_eq!(slots[0].written, body);
    }
}
