//! The chunk window of a fetching session: up to `chunks_in_flight`
//! requests out, and the chunks that arrive ahead of the cursor held until
//! the bytes before them land.

use std::collections::BTreeMap;

use bytes::Bytes;
use consensus::{ChunkProgress, ChunkRejection, next_pending_chunk};
use storage::fs::Fs;

use super::{TransferReceiver, TransferRequest};

/// The chunk requests a fetching session has out, and the chunks that
/// arrived ahead of the cursor.
#[derive(Debug, Default)]
pub(super) struct ChunkWindow {
    /// Where the next request starts, `(artifact, offset)`: the end of the
    /// furthest request sent (never behind the cursor when used).
    pub(super) frontier: Option<(u32, u64)>,
    /// Requests sent and not answered yet (approximate after a loss: the
    /// stall re-request resets it).
    pub(super) in_flight: u32,
    /// Chunks that arrived past the cursor but before the frontier, by
    /// `(artifact, offset)`; at most `chunks_in_flight - 1` of them.
    pub(super) early: BTreeMap<(u32, u64), Bytes>,
    /// Bytes held in `early`.
    pub(super) early_bytes: u64,
}

impl ChunkWindow {
    /// The held chunk at the cursor `at`, if any; held chunks behind it
    /// (which can never land) are dropped.
    pub(super) fn take_early(&mut self, at: (u32, u64)) -> Option<Bytes> {
        let kept = self.early.split_off(&at);
        for payload in std::mem::replace(&mut self.early, kept).into_values() {
            self.early_bytes -= payload.len() as u64;
        }
        let payload = self.early.remove(&at)?;
        self.early_bytes -= payload.len() as u64;
        Some(payload)
    }

    /// A chunk of `len` bytes landed at `at`: one fewer in flight when it
    /// `arrived` (answered a request rather than being held), and when it
    /// is shorter than `asked` without completing its artifact (the peer
    /// clamps lower), the window restarts right after it, so no byte goes
    /// unrequested.
    pub(super) fn note_landed(
        &mut self,
        arrived: bool,
        (artifact, offset): (u32, u64),
        len: u64,
        asked: u64,
        completes: bool,
    ) {
        if arrived {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        if len < asked && !completes {
            self.frontier = Some((artifact, offset + len));
            self.in_flight = 0;
        }
    }
}

/// The next request of a window: from `frontier` (or `cursor` when the
/// frontier is behind it or unset), the first artifact not yet complete,
/// at most `chunk_len_max` bytes.
pub(super) fn request_at<P: ChunkProgress>(
    artifacts: &[P],
    cursor: consensus::PendingChunk,
    frontier: Option<(u32, u64)>,
    chunk_len_max: u32,
) -> Option<consensus::PendingChunk> {
    let (mut artifact, mut offset) = frontier
        .filter(|&f| f > (cursor.artifact, cursor.offset))
        .unwrap_or((cursor.artifact, cursor.offset));
    loop {
        let progress = artifacts.get(artifact as usize)?;
        let declared = progress.declared_len();
        let offset_here = offset.max(progress.received_len());
        if !progress.complete() && offset_here < declared {
            let len = (declared - offset_here).min(u64::from(chunk_len_max.max(1)));
            return Some(consensus::PendingChunk {
                artifact,
                offset: offset_here,
                // Lossless: bounded by chunk_len_max.
                len: len as u32,
            });
        }
        artifact = artifact.checked_add(1)?;
        offset = 0;
    }
}

impl<F: Fs> TransferReceiver<F> {
    /// Whether a chunk the cursor refused arrived ahead of it within the
    /// window (requested, not yet due), so it is held until the bytes
    /// before it land: bounded by `chunks_in_flight - 1` chunks of at most
    /// `chunk_len_max_bytes`.
    pub(super) fn hold_early(
        &self,
        rejection: ChunkRejection,
        artifact: u32,
        offset: u64,
        payload: &[u8],
    ) -> bool {
        let ahead = match rejection {
            ChunkRejection::WrongOffset { expected, offset } => offset > expected,
            ChunkRejection::NotCurrentArtifact { artifact, current } => artifact > current,
            _ => false,
        };
        let window = self.config.chunks_in_flight.max(1);
        ahead
            && window > 1
            && payload.len() <= self.config.chunk_len_max_bytes.max(1) as usize
            && self.window.frontier.is_some_and(|f| (artifact, offset) < f)
            && self.window.early.len() < (window - 1) as usize
            && !self.window.early.contains_key(&(artifact, offset))
    }

    /// The requests that fill the window up to
    /// [`ReceiverConfig::chunks_in_flight`] (none with the default of 1:
    /// every step already returns the one request due). A driver pulling
    /// with a window sends these after every step of a fetching session.
    pub fn fill_window(&mut self) -> Vec<TransferRequest> {
        let mut requests = Vec::new();
        while let Some(request) = self.next_window_request() {
            requests.push(request);
        }
        requests
    }

    /// The next request if the window has room: at the frontier, counted
    /// as in flight.
    pub(super) fn next_window_request(&mut self) -> Option<TransferRequest> {
        let session = self.session.as_ref()?;
        let accepted = session.accepted()?;
        if self.window.in_flight >= self.config.chunks_in_flight.max(1) {
            return None;
        }
        let chunk_len_max = self.config.chunk_len_max_bytes;
        let cursor = next_pending_chunk(&accepted.artifacts, chunk_len_max)?;
        let next = request_at(
            &accepted.artifacts,
            cursor,
            self.window.frontier,
            chunk_len_max,
        )?;
        self.window.frontier = Some((next.artifact, next.offset + u64::from(next.len)));
        self.window.in_flight += 1;
        self.stats.chunk_requests += 1;
        Some(TransferRequest::Chunk {
            peer: session.peer,
            nonce: session.nonce,
            artifact: next.artifact,
            offset: next.offset,
            len: next.len,
        })
    }
}
