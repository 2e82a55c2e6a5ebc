//! Serving an offer (ST-S5): the offer cache per requester and nonce, the
//! chunk answers, and the idle expiry.
//!
//! The protocol is pull-based (reference §4.2): a lagging replica asks for
//! an offer with a fresh nonce, then pulls chunks `(artifact, offset, len)`
//! one at a time. There is no completion frame; the server forgets an offer
//! once it has been idle long enough.
//!
//! - **First wins per nonce.** The first offer built for `(requester,
//!   nonce)` is the one every retry with that nonce gets, never a rebuilt
//!   one: a rebuilt offer at a later op would describe other bytes under
//!   the receiver's cursor. A new nonce from the same requester starts a
//!   new session and replaces the old one (a requester runs one session
//!   per group).
//! - **One artifact in memory per session, loaded as it is pulled.** A
//!   segment artifact is read from its file (which may be longer: the
//!   active segment kept growing; the artifact is the prefix) only as far
//!   as the requested chunk needs, [`OFFER_READ_CHUNK_BYTES`] at a time,
//!   with a running checksum; the read that completes it checks the whole
//!   artifact against the manifest before its last bytes are served. So a
//!   chunk request costs at most one read, however large the segment
//!   (ST-B1: the pump answering it stays short), a file replaced or rotted
//!   since the build is caught before the receiver holds the whole
//!   artifact, and served bytes are exactly the bytes checked. Moving to
//!   the next artifact drops the previous one.
//! - **Answers.** A chunk request for an artifact index past the manifest,
//!   or at an offset at or past the artifact's end, is dropped: an empty
//!   chunk would count as progress on the receiver and start an empty-frame
//!   ping-pong. An unknown session is refused as transient (the requester
//!   starts over); a segment that cannot be loaded is refused as its
//!   [`SegmentLoadError`] classifies it, and the session is dropped.
//! - **Expiry** in ticks: `repair_retry_ticks × 10` idle ticks, or `× 3`
//!   once the last byte of the last artifact was served (long enough for
//!   one re-request of a lost final chunk).

use common::ReplicaId;
use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;

use bytes::Bytes;
use consensus::StateArtifactHasher;
use journal::SuperblockStore;
use storage::fs::{BufResult, Fs, FsFile, OpenOptions};

use super::errors::{PartitionTransferUnavailable, SegmentLoadError};
use super::offer::{
    BuildBudget, BuildClock, OFFER_READ_CHUNK_BYTES, OfferBuilder, OfferedArtifact, OfferedSegment,
    PartitionOffer,
};
use crate::bus::MessageBus;
use crate::partition::Partition;

/// Default ceiling on one chunk's payload (the reference's 256 KiB).
pub const STATE_CHUNK_LEN_MAX_DEFAULT: u32 = 256 * 1024;

/// Default repair retry interval in ticks, the unit of offer expiry.
pub const REPAIR_RETRY_TICKS_DEFAULT: u64 = 100;

/// Idle ticks an offer survives, in units of the repair retry interval,
/// while it is not fully served.
pub const OFFER_IDLE_RETRIES_MAX: u64 = 10;

/// Idle ticks an offer survives once fully served, in the same unit.
pub const OFFER_SERVED_IDLE_RETRIES_MAX: u64 = 3;

/// Configuration of an [`OfferServer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfferServerConfig {
    /// Ceiling on one chunk's payload; both ends compute the same clamp.
    pub chunk_len_max_bytes: u32,
    /// The repair retry interval in ticks (the expiry unit).
    pub repair_retry_ticks: u64,
    /// The per-round build budget.
    pub budget: BuildBudget,
}

impl Default for OfferServerConfig {
    fn default() -> Self {
        Self {
            chunk_len_max_bytes: STATE_CHUNK_LEN_MAX_DEFAULT,
            repair_retry_ticks: REPAIR_RETRY_TICKS_DEFAULT,
            budget: BuildBudget::default(),
        }
    }
}

/// A chunk request, as the `RequestStateChunk` header carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRequest {
    /// The requesting replica.
    pub requester: ReplicaId,
    /// The requester's session nonce.
    pub nonce: u128,
    /// The artifact's manifest index.
    pub artifact: u32,
    /// Byte offset within the artifact.
    pub offset: u64,
    /// Bytes wanted.
    pub len: u32,
}

/// A chunk to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedChunk {
    /// The artifact's manifest index.
    pub artifact: u32,
    /// Byte offset of the payload within the artifact.
    pub offset: u64,
    /// The bytes; never empty.
    pub payload: Bytes,
}

/// Why a chunk request is refused (answered with an unavailable target).
#[derive(Debug)]
pub enum ChunkRefusal {
    /// No live session for this requester and nonce (expired, replaced, or
    /// this replica restarted): the requester starts a new session.
    UnknownSession,
    /// A segment artifact could not be loaded as offered.
    SegmentLoad {
        /// The segment's base offset.
        start_offset: u64,
        /// Why.
        error: SegmentLoadError,
    },
}

impl ChunkRefusal {
    /// Whether the requester should retry without charging a failure: a
    /// local disk fault here is not transient, so peers stop asking.
    pub fn transient(&self) -> bool {
        match self {
            Self::UnknownSession => true,
            Self::SegmentLoad { error, .. } => error.transient(),
        }
    }
}

impl fmt::Display for ChunkRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownSession => f.write_str("no offer is held for this requester and nonce"),
            Self::SegmentLoad {
                start_offset,
                error,
            } => write!(f, "segment {start_offset:020} cannot be served: {error}"),
        }
    }
}

impl std::error::Error for ChunkRefusal {}

/// The answer to a chunk request.
#[derive(Debug)]
pub enum ChunkAnswer {
    /// Send this chunk.
    Chunk(ServedChunk),
    /// Send nothing (index or offset out of range, or a zero length).
    Ignore,
    /// Send an unavailable target.
    Refuse(ChunkRefusal),
    /// Nothing to send yet: the chunk lies further into its artifact than
    /// one call loads (a receiver resuming mid-artifact in a new session).
    /// The request is kept, and [`OfferServer::advance_loads`] answers it
    /// on a later call (see [`OfferServer::with_load_blocks_per_call`]).
    Loading,
}

/// Requests kept per session while their chunk loads.
const PENDING_REQUESTS_MAX: usize = 16;

/// The artifact a session holds in memory: the prefix read so far, as
/// whole [`OFFER_READ_CHUNK_BYTES`] blocks (block `i` covers
/// `[i × OFFER_READ_CHUNK_BYTES, …)`), and the checksum over it.
///
/// Blocks, not one growing buffer: a chunk inside a block is served as a
/// slice of it (no copy), and no block is ever reallocated or moved. One
/// buffer grown to the artifact's length cost a copy per served chunk and,
/// past the allocator's mmap threshold, fresh zeroed pages faulted in on
/// every growth (measured, docs/state-transfer.md §9.2).
#[derive(Debug)]
struct LoadedArtifact {
    index: usize,
    blocks: Vec<Bytes>,
    len: usize,
    hasher: StateArtifactHasher,
}

impl LoadedArtifact {
    fn new(index: usize) -> Self {
        Self {
            index,
            blocks: Vec::new(),
            len: 0,
            hasher: StateArtifactHasher::new(),
        }
    }

    /// Bytes `[from, to)` of the loaded prefix: a slice of one block, or a
    /// copy when the range straddles blocks. `None` past the prefix.
    fn slice(&self, from: usize, to: usize) -> Option<Bytes> {
        if from >= to || to > self.len {
            return None;
        }
        let first = from / OFFER_READ_CHUNK_BYTES;
        let last = (to - 1) / OFFER_READ_CHUNK_BYTES;
        let base = first * OFFER_READ_CHUNK_BYTES;
        if first == last {
            return Some(self.blocks.get(first)?.slice(from - base..to - base));
        }
        let mut out = Vec::with_capacity(to - from);
        for (i, block) in self.blocks.get(first..=last)?.iter().enumerate() {
            let start = (first + i) * OFFER_READ_CHUNK_BYTES;
            let lo = from.max(start) - start;
            let hi = to.min(start + block.len()) - start;
            out.extend_from_slice(block.get(lo..hi)?);
        }
        Some(Bytes::from(out))
    }
}

/// One requester's view of an offer.
#[derive(Debug)]
struct OfferSession {
    offer: Rc<PartitionOffer>,
    idle_ticks: u64,
    fully_served: bool,
    loaded: Option<LoadedArtifact>,
    /// Requests answered [`ChunkAnswer::Loading`], oldest first.
    pending: std::collections::VecDeque<ChunkRequest>,
}

/// The serving side of one partition's state transfer, owned by its
/// driver: the [`OfferBuilder`] and the sessions of the offers handed out.
#[derive(Debug)]
pub struct OfferServer {
    config: OfferServerConfig,
    builder: OfferBuilder,
    sessions: BTreeMap<(ReplicaId, u128), OfferSession>,
    /// Read blocks one chunk request may load ([`usize::MAX`]: unbounded).
    load_blocks_per_call: usize,
}

impl OfferServer {
    /// A server with no sessions.
    pub fn new(config: OfferServerConfig) -> Self {
        Self {
            config,
            builder: OfferBuilder::new(config.budget),
            sessions: BTreeMap::new(),
            load_blocks_per_call: usize::MAX,
        }
    }

    /// Bounds the reading one chunk request (or one
    /// [`Self::advance_loads`] call per session) may do to `blocks` reads
    /// of [`OFFER_READ_CHUNK_BYTES`] (at least one). A request further in
    /// is answered [`ChunkAnswer::Loading`] and served once
    /// `advance_loads`, called on later ticks, has loaded up to it (ST-B1:
    /// a receiver resuming at 900 MiB must not have its server read and
    /// hash 900 MiB inside one frame). Unbounded by default.
    #[must_use]
    pub fn with_load_blocks_per_call(mut self, blocks: usize) -> Self {
        self.load_blocks_per_call = blocks.max(1);
        self
    }

    /// Continues loading for the requests answered
    /// [`ChunkAnswer::Loading`], one bounded call per session, and returns
    /// the answers that are ready, as `(requester, nonce, answer)`: the
    /// chunks now loaded, or the refusal a failed load earned. Requests
    /// further in stay pending.
    pub async fn advance_loads<F: Fs>(&mut self, fs: &F) -> Vec<(ReplicaId, u128, ChunkAnswer)> {
        let keys: Vec<(ReplicaId, u128)> = self
            .sessions
            .iter()
            .filter(|(_, session)| !session.pending.is_empty())
            .map(|(key, _)| *key)
            .collect();
        let mut ready = Vec::new();
        for key in keys {
            let Some(session) = self.sessions.get_mut(&key) else {
                continue;
            };
            let requests = std::mem::take(&mut session.pending);
            let mut loaded_once = false;
            for (i, request) in requests.iter().enumerate() {
                let needs_load = self.needs_load(key, request);
                if needs_load && loaded_once {
                    // One bounded load per session per call; the rest wait.
                    if let Some(session) = self.sessions.get_mut(&key) {
                        session.pending.extend(requests.iter().skip(i).copied());
                    }
                    break;
                }
                loaded_once |= needs_load;
                match self.on_request_state_chunk(fs, *request).await {
                    ChunkAnswer::Loading => {
                        // Re-queued by the call; the rest wait behind it.
                        if let Some(session) = self.sessions.get_mut(&key) {
                            session.pending.extend(requests.iter().skip(i + 1).copied());
                        }
                        break;
                    }
                    ChunkAnswer::Ignore => {}
                    answer => ready.push((key.0, key.1, answer)),
                }
            }
        }
        ready
    }

    /// Whether serving `request` would read from the file.
    fn needs_load(&self, key: (ReplicaId, u128), request: &ChunkRequest) -> bool {
        let Some(session) = self.sessions.get(&key) else {
            return false;
        };
        let Ok(index) = usize::try_from(request.artifact) else {
            return false;
        };
        let end = request
            .offset
            .saturating_add(u64::from(request.len))
            .min(session.offer.artifact(index).map_or(0, |a| a.entry().len));
        match &session.loaded {
            Some(loaded) if loaded.index == index => (loaded.len as u64) < end,
            _ => matches!(
                session.offer.artifact(index),
                Some(OfferedArtifact::Segment(_))
            ),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OfferServerConfig {
        &self.config
    }

    /// The builder (memos, cached offer).
    pub fn builder(&self) -> &OfferBuilder {
        &self.builder
    }

    /// The builder, e.g. to change its budget.
    pub fn builder_mut(&mut self) -> &mut OfferBuilder {
        &mut self.builder
    }

    /// Live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Whether an offer is held for `requester` (under any nonce): a new
    /// request from it replaces that session rather than adding one.
    pub fn serves(&self, requester: ReplicaId) -> bool {
        self.sessions.keys().any(|&(who, _)| who == requester)
    }

    /// The offer held for `(requester, nonce)`, if any.
    pub fn session_offer(&self, requester: ReplicaId, nonce: u128) -> Option<&Rc<PartitionOffer>> {
        self.sessions.get(&(requester, nonce)).map(|s| &s.offer)
    }

    /// Forgets every session, memo and cached offer (after this partition
    /// installed or converged: nothing offered before describes it now).
    pub fn reset(&mut self) {
        self.sessions.clear();
        self.builder.reset();
    }

    /// Answers `RequestStateTransfer { nonce }` from `requester`: the offer
    /// already held for that nonce, or a newly built one (one budgeted
    /// round per call).
    ///
    /// # Errors
    /// The build's refusal; `OfferBuildInProgress` means asking again with
    /// the same nonce resumes the build.
    pub async fn on_request_state_transfer<B, S, F, C>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        requester: ReplicaId,
        nonce: u128,
        clock: &C,
    ) -> Result<Rc<PartitionOffer>, PartitionTransferUnavailable>
    where
        B: MessageBus,
        S: SuperblockStore,
        F: Fs,
        C: BuildClock,
    {
        if let Some(session) = self.sessions.get_mut(&(requester, nonce)) {
            session.idle_ticks = 0;
            return Ok(Rc::clone(&session.offer));
        }
        self.builder.set_requester(Some(requester));
        let offer = partition
            .build_state_transfer_offer(&mut self.builder, clock)
            .await?;
        self.sessions.retain(|&(who, _), _| who != requester);
        self.sessions.insert(
            (requester, nonce),
            OfferSession {
                offer: Rc::clone(&offer),
                idle_ticks: 0,
                fully_served: false,
                loaded: None,
                pending: std::collections::VecDeque::new(),
            },
        );
        tracing::info!(
            requester = requester.0,
            commit_op = offer.commit_op().0,
            artifacts = offer.artifact_count(),
            "state-transfer offer handed out"
        );
        Ok(offer)
    }

    /// Answers one `RequestStateChunk`: `[offset, min(offset + min(len,
    /// chunk_len_max), artifact_len))` of the artifact (see the module
    /// documentation for what is dropped and what is refused).
    pub async fn on_request_state_chunk<F: Fs>(
        &mut self,
        fs: &F,
        request: ChunkRequest,
    ) -> ChunkAnswer {
        let key = (request.requester, request.nonce);
        let Some(session) = self.sessions.get_mut(&key) else {
            return ChunkAnswer::Refuse(ChunkRefusal::UnknownSession);
        };
        session.idle_ticks = 0;
        let Ok(index) = usize::try_from(request.artifact) else {
            return ChunkAnswer::Ignore;
        };
        let offer = Rc::clone(&session.offer);
        let Some(artifact) = offer.artifact(index) else {
            return ChunkAnswer::Ignore;
        };
        let artifact_len = artifact.entry().len;
        if request.offset >= artifact_len || request.len == 0 {
            return ChunkAnswer::Ignore;
        }
        let len = request.len.min(self.config.chunk_len_max_bytes.max(1));
        let end = request
            .offset
            .saturating_add(u64::from(len))
            .min(artifact_len);
        // Both ends are within the artifact, and an artifact is at most a
        // segment, which this node holds in memory when it serves it.
        let (Ok(from), Ok(to)) = (usize::try_from(request.offset), usize::try_from(end)) else {
            return ChunkAnswer::Ignore;
        };
        let payload = match artifact {
            OfferedArtifact::Offsets { bytes, .. } => bytes.slice(from..to),
            OfferedArtifact::Segment(segment) => {
                if session.loaded.as_ref().is_none_or(|l| l.index != index) {
                    // Drop the previous artifact first: one per session, ever.
                    session.loaded = None;
                    session.loaded = Some(LoadedArtifact::new(index));
                }
                let Some(loaded) = session.loaded.as_mut() else {
                    return ChunkAnswer::Ignore;
                };
                match load_segment_through(fs, segment, loaded, to, self.load_blocks_per_call).await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        if session.pending.len() >= PENDING_REQUESTS_MAX {
                            session.pending.pop_front();
                        }
                        if !session.pending.contains(&request) {
                            session.pending.push_back(request);
                        }
                        return ChunkAnswer::Loading;
                    }
                    Err(error) => return self.refuse_load(key, segment, error),
                }
                let Some(chunk) = loaded.slice(from, to) else {
                    return ChunkAnswer::Ignore;
                };
                chunk
            }
        };
        if index + 1 == offer.artifact_count() && end == artifact_len {
            session.fully_served = true;
        }
        ChunkAnswer::Chunk(ServedChunk {
            artifact: request.artifact,
            offset: request.offset,
            payload,
        })
    }

    /// Bytes of the artifact `(requester, nonce)` holds in memory, as
    /// `(manifest index, bytes)`.
    pub fn loaded_artifact(&self, requester: ReplicaId, nonce: u128) -> Option<(usize, usize)> {
        self.sessions
            .get(&(requester, nonce))
            .and_then(|s| s.loaded.as_ref())
            .map(|l| (l.index, l.len))
    }

    /// A segment failed to load: the session goes (its offer no longer
    /// describes the disk), so does the cached offer if it is the same, and
    /// so does the segment's memo unless the disk itself failed.
    fn refuse_load(
        &mut self,
        key: (ReplicaId, u128),
        segment: &OfferedSegment,
        error: SegmentLoadError,
    ) -> ChunkAnswer {
        tracing::warn!(
            requester = key.0.0,
            start_offset = segment.identity.start_offset.0,
            %error,
            transient = error.transient(),
            "served segment could not be loaded"
        );
        if let Some(session) = self.sessions.remove(&key)
            && self
                .builder
                .cached()
                .is_some_and(|cached| Rc::ptr_eq(cached, &session.offer))
        {
            self.builder.clear_cached();
        }
        if !matches!(error, SegmentLoadError::LocalFault(_)) {
            self.builder.forget(&segment.identity);
        }
        ChunkAnswer::Refuse(ChunkRefusal::SegmentLoad {
            start_offset: segment.identity.start_offset.0,
            error,
        })
    }

    /// One tick: ages every session and drops those idle past their
    /// expiry. Once no session is left the cached offer goes too (the
    /// memos stay: they are what makes the next build cheap).
    pub fn on_tick(&mut self) {
        let retry = self.config.repair_retry_ticks.max(1);
        self.sessions.retain(|&(requester, _), session| {
            session.idle_ticks += 1;
            let retries = if session.fully_served {
                OFFER_SERVED_IDLE_RETRIES_MAX
            } else {
                OFFER_IDLE_RETRIES_MAX
            };
            let keep = session.idle_ticks < retry.saturating_mul(retries);
            if !keep {
                tracing::debug!(
                    requester = requester.0,
                    fully_served = session.fully_served,
                    "state-transfer offer expired"
                );
            }
            keep
        });
        if self.sessions.is_empty() {
            self.builder.clear_cached();
        }
    }
}

/// Extends `loaded` (a prefix of `segment`'s artifact) to cover at least
/// `need` bytes, reading [`OFFER_READ_CHUNK_BYTES`] at a time (so usually
/// one read per call) and at most `blocks_max` reads, and checks the whole
/// artifact against the manifest checksum once the prefix reaches its end.
/// `Ok(false)`: `blocks_max` reads did not reach `need`; call again.
///
/// # Errors
/// [`SegmentLoadError`], classified by cause: a file gone or short is
/// stale, EIO/EACCES is a local fault, a mismatch means the bytes changed.
async fn load_segment_through<F: Fs>(
    fs: &F,
    segment: &OfferedSegment,
    loaded: &mut LoadedArtifact,
    need: usize,
    blocks_max: usize,
) -> Result<bool, SegmentLoadError> {
    if loaded.len >= need {
        return Ok(true);
    }
    let len = usize::try_from(segment.entry.len).map_err(|_| {
        SegmentLoadError::Stale(std::io::Error::other(
            "artifact larger than this node's address space",
        ))
    })?;
    // Whole reads: the next boundary past `need`, capped at the artifact.
    let target = need
        .div_ceil(OFFER_READ_CHUNK_BYTES)
        .saturating_mul(OFFER_READ_CHUNK_BYTES)
        .min(len);
    let file = fs
        .open(&segment.path, OpenOptions::read_only())
        .await
        .map_err(SegmentLoadError::classify)?;
    let mut blocks = 0usize;
    while loaded.len < target {
        if blocks == blocks_max {
            return Ok(false);
        }
        blocks += 1;
        // `loaded.len` is a block boundary: every block but the artifact's
        // last is whole.
        let at = loaded.len;
        let want = (target - at).min(OFFER_READ_CHUNK_BYTES);
        let mut block = Vec::with_capacity(want);
        while block.len() < want {
            let filled = block.len();
            let BufResult(read, back) = file
                .read_at(block, (at + filled) as u64, want - filled)
                .await;
            block = back;
            match read {
                Ok(0) => {
                    return Err(SegmentLoadError::Stale(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "{} ends at {} bytes, before the offered {len}",
                            segment.path.display(),
                            at + filled
                        ),
                    )));
                }
                Ok(_) => {}
                Err(error) => return Err(SegmentLoadError::classify(error)),
            }
        }
        loaded.hasher.update(&block);
        loaded.len += block.len();
        loaded.blocks.push(Bytes::from(block));
        fs.yield_now().await;
    }
    if loaded.len == len && loaded.hasher.finish() != segment.entry.checksum {
        return Err(SegmentLoadError::ChecksumMismatch);
    }
    Ok(true)
}

/// Reads the whole artifact of `segment` and checks it against the
/// manifest checksum (the serve path's loading, in one call).
///
/// # Errors
/// As the serve path classifies them (see [`SegmentLoadError`]).
pub async fn load_verified_segment_artifact<F: Fs>(
    fs: &F,
    segment: &OfferedSegment,
) -> Result<Vec<u8>, SegmentLoadError> {
    let mut loaded = LoadedArtifact::new(0);
    let len = usize::try_from(segment.entry.len).map_err(|_| {
        SegmentLoadError::Stale(std::io::Error::other(
            "artifact larger than this node's address space",
        ))
    })?;
    // Unbounded: the whole artifact in this call.
    load_segment_through(fs, segment, &mut loaded, len, usize::MAX).await?;
    let mut bytes = Vec::with_capacity(loaded.len);
    for block in &loaded.blocks {
        bytes.extend_from_slice(block);
    }
    Ok(bytes)
}
