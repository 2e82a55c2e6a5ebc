//! Group 0's state transfer over the replica bus: the small driver that
//! pulls and serves the metadata snapshot with the chunk protocol the
//! partitions use (docs/state-transfer.md §10).
//!
//! A metadata replica behind every peer's retention is told so by its core
//! (`MetadataGroup::state_transfer_needed`). This driver then:
//!
//! - **arms** a session (a seeded 128-bit nonce) and sends
//!   `RequestStateTransfer` to the peer repair named;
//! - **serves** such a request, on the other side, with
//!   `MetadataGroup::transfer_offer_to` (a caught-up primary, or a
//!   caught-up backup when the requester is its view's primary — the
//!   partition plane's ST-S1 rule): the manifest (`METADATA_SNAPSHOT`, then
//!   `CLIENT_TABLE`, both at the offer's op) as the body of
//!   `StateTransferTarget`, first wins per `(requester, nonce)`, and chunks
//!   of the two artifacts as `StateChunk` answers;
//! - **checks** the descriptor whole before it pulls anything (the peer is
//!   not behind this replica, the op is ahead of the applied one and within
//!   range, the manifest decodes and is exactly the two artifacts, each
//!   under its ceiling), then **pulls** with a bounded window of chunk
//!   requests in flight, accepting only the chunk at the cursor
//!   (`consensus::chunk`), re-requesting after idle ticks and giving up
//!   after a stall budget;
//! - **verifies** each artifact against its manifest checksum the moment
//!   its last byte lands, and **installs** with
//!   `MetadataGroup::install_transfer`, which checks everything again,
//!   makes the snapshot durable before anything in memory changes (the
//!   store's snapshot-then-WAL replacement; a crash boots the old state or
//!   the installed one), lifts the core's floor and hands the tail above it
//!   back to ordinary repair.
//!
//! Failures re-arm with the partition receiver's rules
//! (`partitions::state_transfer`): a transient refusal waits the flat base
//! delay and asks the primary (or, from the primary, the next backup); any
//! other failure charges the exponential backoff and rotates the peer.
//!
//! What is reused rather than repeated: the frame checks and encoding
//! (`check_transfer_frame`, `Outgoing::transfer_frame`), the descriptor
//! header's checks against this replica (`check_offer_header`), the chunk
//! cursor (`consensus::chunk`), the manifest codec, the backoff and the
//! peer rotation. What is not: the partition receiver itself streams segment
//! artifacts to staging files, walks batches and adopts staged files;
//! metadata artifacts are two small in-memory buffers installed in one
//! step, so making that receiver generic would have cost more than this
//! file.
//!
//! Sans-network and deterministic: frames and ticks in, frames out; no
//! clock (idle counts are ticks), nonces from a seeded [`Prng`].

use common::{METADATA_GROUP, Op, Prng, ReplicaId};
use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use consensus::header::{
    CommandHeader, HEADER_SIZE, RequestStateChunkHeader, RequestStateTransferHeader,
    StateChunkHeader, StateTransferTargetHeader,
};
use consensus::verify_state_artifact;
use consensus::vsr::Replica;
use consensus::{ArtifactProgress, ChunkProgress, append_chunk, next_pending_chunk};
use consensus::{ManifestError, StateArtifact, artifact_kind, decode_manifest};
use journal::SuperblockStore;
use metadata::{MetadataBus, MetadataGroup, TransferError};
use partitions::state_transfer::STALL_ATTEMPTS_MAX_DEFAULT;
use partitions::state_transfer::{
    DRIVER_CHUNKS_IN_FLIGHT_DEFAULT, LocalFacts, OfferHeaderRefusal, Outgoing, TransferBackoff,
    TransferFrameError, TransferFrameExpect, check_offer_header, check_transfer_frame,
    peer_after_refusal, rotate_peer,
};
use partitions::state_transfer::{REPAIR_RETRY_TICKS_DEFAULT, STATE_CHUNK_LEN_MAX_DEFAULT};
use storage::fs::Fs;

/// Ceiling on a transferred metadata snapshot. The state's own ceilings
/// (streams, topics per stream, users…) keep a real one far below; a
/// descriptor past it is refused before a byte is pulled.
pub const METADATA_SNAPSHOT_LEN_MAX: u64 = 256 << 20;
/// Ceiling on a transferred client table: the largest `RMC1` encoding
/// (docs/formats.md §13.5: magic and count, 52 bytes per entry for at most
/// [`metadata::CLIENT_TABLE_ENTRIES_MAX`] entries, the trailer), 3.4 MB.
pub const CLIENT_TABLE_LEN_MAX: u64 = 4 + 4 + metadata::CLIENT_TABLE_ENTRIES_MAX as u64 * 52 + 8;
/// A progress line is logged each time this many more bytes landed.
pub const PROGRESS_EVERY_BYTES: u64 = 8 << 20;

/// Configuration of a [`MetadataTransfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataTransferConfig {
    /// The cluster id every frame carries.
    pub cluster: u128,
    /// Ceiling on an inbound frame, header included.
    pub frame_size_max: u32,
    /// Ceiling on one chunk, on both ends.
    pub chunk_len_max_bytes: u32,
    /// Chunk requests kept in flight (at least 1).
    pub chunks_in_flight: u32,
    /// Idle ticks before a re-request; also the re-arm base delay.
    pub repair_retry_ticks: u64,
    /// Re-requests without progress before an attempt fails.
    pub stall_attempts_max: u32,
    /// Ceiling on the snapshot artifact.
    pub snapshot_len_max_bytes: u64,
    /// Ceiling on the client-table artifact.
    pub client_table_len_max_bytes: u64,
}

impl MetadataTransferConfig {
    /// The partition driver's defaults for `cluster`.
    pub fn new(cluster: u128) -> Self {
        Self {
            cluster,
            frame_size_max: consensus::header::FRAME_SIZE_MAX_DEFAULT,
            chunk_len_max_bytes: STATE_CHUNK_LEN_MAX_DEFAULT,
            chunks_in_flight: DRIVER_CHUNKS_IN_FLIGHT_DEFAULT,
            repair_retry_ticks: REPAIR_RETRY_TICKS_DEFAULT,
            stall_attempts_max: STALL_ATTEMPTS_MAX_DEFAULT,
            snapshot_len_max_bytes: METADATA_SNAPSHOT_LEN_MAX,
            client_table_len_max_bytes: CLIENT_TABLE_LEN_MAX,
        }
    }
}

/// Why a metadata offer's descriptor was refused before anything was
/// pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataDescriptorRefusal {
    /// The manifest did not decode.
    Manifest(ManifestError),
    /// Not exactly a snapshot and a client table.
    ArtifactCount {
        /// Entries listed.
        count: usize,
    },
    /// An entry of the wrong kind at its place.
    UnexpectedKind {
        /// Manifest index.
        index: usize,
        /// The kind found.
        kind: u8,
    },
    /// An entry whose frontier is not the offer's op.
    FrontierMismatch {
        /// Manifest index.
        index: usize,
        /// The entry's frontier.
        frontier: Op,
        /// The offer's op.
        commit_op: Op,
    },
    /// An artifact that declares no bytes (both formats have a header).
    EmptyArtifact {
        /// Manifest index.
        index: usize,
    },
    /// An artifact past its ceiling.
    ArtifactTooLarge {
        /// Manifest index.
        index: usize,
        /// Declared length.
        len: u64,
        /// The ceiling.
        max: u64,
    },
    /// The offer's header is out of range or from a peer behind this
    /// replica (the partition receiver's check, shared).
    Header(OfferHeaderRefusal),
    /// The offer is not ahead of what this replica applied.
    NotAhead {
        /// The offer's op.
        commit_op: Op,
        /// This replica's applied op.
        applied: Op,
    },
}

impl fmt::Display for MetadataDescriptorRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Manifest(e) => write!(f, "metadata offer manifest does not decode: {e}"),
            Self::ArtifactCount { count } => write!(
                f,
                "metadata offer lists {count} artifacts; a snapshot and a client table are required"
            ),
            Self::UnexpectedKind { index, kind } => {
                write!(f, "metadata offer artifact {index} has kind {kind}")
            }
            Self::FrontierMismatch {
                index,
                frontier,
                commit_op,
            } => write!(
                f,
                "metadata offer artifact {index} is at op {frontier}, the offer at op {commit_op}"
            ),
            Self::EmptyArtifact { index } => {
                write!(f, "metadata offer artifact {index} declares no bytes")
            }
            Self::ArtifactTooLarge { index, len, max } => write!(
                f,
                "metadata offer artifact {index} declares {len} bytes, past the ceiling of {max}"
            ),
            Self::Header(r) => write!(f, "metadata {r}"),
            Self::NotAhead { commit_op, applied } => write!(
                f,
                "metadata offer at op {commit_op} is not ahead of the applied op {applied}"
            ),
        }
    }
}

impl std::error::Error for MetadataDescriptorRefusal {}

/// Why an attempt to pull group 0's state failed. [`Self::transient`] says
/// whether it is charged to the backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataReceiveError {
    /// The descriptor was refused.
    Descriptor(MetadataDescriptorRefusal),
    /// The peer answered that it cannot serve (or no longer holds the
    /// session a chunk was asked of).
    PeerUnavailable {
        /// Whether the peer said asking again soon may succeed.
        transient: bool,
    },
    /// A completed artifact does not hash to its manifest entry.
    ArtifactChecksum {
        /// Manifest index.
        index: usize,
    },
    /// The group refused the install (nothing changed) or the store failed.
    Install(String),
    /// The stall budget ran out.
    Stalled {
        /// Re-requests without progress.
        attempts: u32,
    },
}

impl MetadataReceiveError {
    /// Whether the failure is "not right now": re-armed on the flat base
    /// delay and not charged to the backoff.
    pub const fn transient(&self) -> bool {
        matches!(self, Self::PeerUnavailable { transient: true })
    }
}

impl fmt::Display for MetadataReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Descriptor(r) => write!(f, "descriptor refused: {r}"),
            Self::PeerUnavailable { transient: true } => f.write_str("peer cannot serve right now"),
            Self::PeerUnavailable { transient: false } => f.write_str("peer cannot serve"),
            Self::ArtifactChecksum { index } => {
                write!(f, "metadata artifact {index} fails its manifest checksum")
            }
            Self::Install(e) => write!(f, "install refused: {e}"),
            Self::Stalled { attempts } => {
                write!(f, "metadata transfer stalled for {attempts} retry rounds")
            }
        }
    }
}

impl std::error::Error for MetadataReceiveError {}

/// Counters for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetadataTransferStats {
    /// Frames accepted.
    pub frames_in: u64,
    /// Frames refused as [`TransferFrameError`].
    pub frames_refused: u64,
    /// Frames accepted that belonged to no live session (stale nonce,
    /// another peer, a duplicate descriptor) and changed nothing.
    pub frames_ignored: u64,
    /// Chunks the cursor refused (duplicate, reordered, overrun, empty).
    pub chunks_rejected: u64,
    /// Frames produced.
    pub frames_out: u64,
    /// Sessions armed (re-arms included).
    pub armed: u64,
    /// Attempts that failed.
    pub attempts_failed: u64,
    /// Chunk bytes accepted.
    pub bytes_received: u64,
    /// Offers handed out (first answer per session).
    pub offers_served: u64,
    /// Offer requests refused.
    pub serve_refusals: u64,
    /// Chunks served.
    pub chunks_served: u64,
    /// Installs that completed.
    pub installs: u64,
}

/// The pull of one accepted offer.
#[derive(Debug)]
struct Fetch {
    commit_op: u64,
    manifest: Vec<StateArtifact>,
    artifacts: Vec<ArtifactProgress>,
    /// Where the next request starts: the end of the furthest one sent.
    frontier: (u32, u64),
    /// Requests sent and not answered (approximate after a loss; a stall
    /// re-request resets it).
    in_flight: u32,
    /// Bytes landed when the last progress line was logged.
    logged_bytes: u64,
}

#[derive(Debug)]
enum Stage {
    AwaitingDescriptor,
    Fetching(Fetch),
}

#[derive(Debug)]
struct Session {
    peer: u8,
    nonce: u128,
    stage: Stage,
    idle_ticks: u64,
    stalls: u32,
}

/// The receiving side, as one state.
#[derive(Debug, Default)]
enum Receiving {
    #[default]
    Idle,
    /// A fresh session against `peer` once `after_ticks` passed.
    Rearm {
        peer: u8,
        after_ticks: u64,
    },
    Pulling(Session),
}

/// An offer handed to one requester.
#[derive(Debug)]
struct Served {
    nonce: u128,
    commit_op: u64,
    manifest: Bytes,
    artifacts: Vec<Bytes>,
    idle_ticks: u64,
    served_out: bool,
}

/// Group 0's state-transfer driver (both sides).
#[derive(Debug)]
pub struct MetadataTransfer {
    config: MetadataTransferConfig,
    prng: Prng,
    receiving: Receiving,
    backoff: TransferBackoff,
    /// The floor the live session (or scheduled re-arm) is for.
    armed_floor: Option<Op>,
    /// One offer per requester (a new nonce replaces the old one).
    serving: BTreeMap<u8, Served>,
    /// Why the last attempt failed (operators, tests).
    last_failure: Option<MetadataReceiveError>,
    stats: MetadataTransferStats,
}

fn facts(replica: &Replica) -> LocalFacts {
    LocalFacts {
        replica: replica.replica(),
        replica_count: replica.replica_count(),
        view: replica.established_view(),
        primary: ReplicaId(replica.primary_index(replica.view()).0),
        commit_max: replica.commit_max(),
        purge_generation: 0,
    }
}

impl MetadataTransfer {
    /// A driver whose nonces come from `seed`.
    pub fn new(config: MetadataTransferConfig, seed: u64) -> Self {
        Self {
            config,
            prng: Prng::new(seed),
            receiving: Receiving::Idle,
            backoff: TransferBackoff::default(),
            armed_floor: None,
            serving: BTreeMap::new(),
            last_failure: None,
            stats: MetadataTransferStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> MetadataTransferStats {
        self.stats
    }

    /// The backoff (charged failures since the last install).
    pub fn backoff(&self) -> TransferBackoff {
        self.backoff
    }

    /// Why the last attempt failed, if one did since this replica booted.
    pub fn last_failure(&self) -> Option<&MetadataReceiveError> {
        self.last_failure.as_ref()
    }

    /// Whether a pull session is live.
    pub fn pulling(&self) -> bool {
        matches!(self.receiving, Receiving::Pulling(_))
    }

    /// Offers held for requesters.
    pub fn serving_count(&self) -> usize {
        self.serving.len()
    }

    /// One tick: ages the offers handed out, arms a session when the group
    /// needs one, counts a scheduled re-arm down, and re-requests what a
    /// live session waits for too long.
    pub fn on_tick<F: Fs, S: SuperblockStore, B: MetadataBus>(
        &mut self,
        group: &mut MetadataGroup<F, S, B>,
    ) -> Vec<Outgoing> {
        let mut out = Vec::new();
        self.age_offers();
        if group.is_fenced() {
            self.receiving = Receiving::Idle;
            self.armed_floor = None;
            return out;
        }
        let replica = group.replica();
        // The core stops reporting the need while it retries repair between
        // FloorRefused conclusions; a session survives that, and goes only
        // once the applied op passed the floor it was armed for.
        let need = group
            .state_transfer_needed()
            .map(|t| (t.peer.0, t.floor))
            .or_else(|| {
                let floor = self.armed_floor?;
                (replica.commit_min() < floor).then(|| (facts(replica).primary.0, floor))
            });
        let Some((peer, floor)) = need else {
            self.armed_floor = None;
            if !matches!(self.receiving, Receiving::Idle) {
                tracing::info!(
                    group = METADATA_GROUP.0,
                    applied = replica.commit_min().0,
                    "metadata state transfer no longer needed; session dropped"
                );
                self.receiving = Receiving::Idle;
            }
            return out;
        };
        self.armed_floor = Some(floor);
        match &mut self.receiving {
            Receiving::Idle => self.arm(replica, peer, &mut out),
            Receiving::Rearm { peer, after_ticks } => {
                if *after_ticks <= 1 {
                    let peer = *peer;
                    self.arm(replica, peer, &mut out);
                } else {
                    *after_ticks -= 1;
                }
            }
            Receiving::Pulling(session) => {
                session.idle_ticks += 1;
                if session.idle_ticks >= self.config.repair_retry_ticks.max(1) {
                    session.idle_ticks = 0;
                    session.stalls += 1;
                    if session.stalls > self.config.stall_attempts_max {
                        let (peer, attempts) = (session.peer, session.stalls);
                        self.fail(replica, peer, MetadataReceiveError::Stalled { attempts });
                    } else {
                        self.re_request(replica, &mut out);
                    }
                }
            }
        }
        if self.pulling() {
            group.hold_state_transfer();
        }
        out
    }

    /// One inbound state-transfer frame for group 0 from replica `from`.
    ///
    /// # Errors
    /// [`TransferFrameError`] when the frame is refused; nothing changed.
    pub async fn on_frame<F: Fs, S: SuperblockStore, B: MetadataBus>(
        &mut self,
        group: &mut MetadataGroup<F, S, B>,
        from: u8,
        frame: Bytes,
    ) -> Result<Vec<Outgoing>, TransferFrameError> {
        let replica = group.replica();
        let expect = TransferFrameExpect {
            cluster: self.config.cluster,
            group: METADATA_GROUP,
            frame_size_max: self.config.frame_size_max,
            local: replica.replica(),
            replica_count: replica.replica_count(),
        };
        let checked = match check_transfer_frame(&frame, &expect, ReplicaId(from)) {
            Ok(checked) => checked,
            Err(error) => {
                self.stats.frames_refused += 1;
                tracing::warn!(group = METADATA_GROUP.0, peer = from, %error, "metadata state-transfer frame refused");
                return Err(error);
            }
        };
        self.stats.frames_in += 1;
        let mut out = Vec::new();
        if group.is_fenced() {
            return Ok(out);
        }
        match checked.command {
            CommandHeader::RequestStateTransfer(h) => {
                self.serve_offer(
                    group.replica(),
                    group.transfer_offer_to(ReplicaId(from)),
                    from,
                    h.nonce,
                    &mut out,
                );
            }
            CommandHeader::RequestStateChunk(h) => {
                self.serve_chunk(group.replica(), from, &h, &mut out)
            }
            CommandHeader::StateTransferTarget(h) => {
                let body = &frame[HEADER_SIZE..];
                self.on_target(group.replica(), from, checked.view, &h, body, &mut out);
            }
            CommandHeader::StateChunk(h) => {
                let payload = &frame[HEADER_SIZE..];
                self.on_chunk(group, from, &h, payload, &mut out).await;
            }
            // `check_transfer_frame` lets only the four commands through.
            other => {
                return Err(TransferFrameError::NotTransferCommand {
                    command: other.command() as u8,
                });
            }
        }
        Ok(out)
    }

    fn age_offers(&mut self) {
        let idle_max = self.config.repair_retry_ticks.max(1).saturating_mul(10);
        let served_out_max = self.config.repair_retry_ticks.max(1).saturating_mul(3);
        self.serving.retain(|requester, served| {
            served.idle_ticks += 1;
            let keep = served.idle_ticks <= idle_max
                && !(served.served_out && served.idle_ticks > served_out_max);
            if !keep {
                tracing::debug!(
                    group = METADATA_GROUP.0,
                    peer = *requester,
                    commit_op = served.commit_op,
                    "metadata offer expired"
                );
            }
            keep
        });
    }

    fn next_nonce(&mut self) -> u128 {
        loop {
            let nonce = (u128::from(self.prng.next_u64()) << 64) | u128::from(self.prng.next_u64());
            if nonce != 0 {
                return nonce;
            }
        }
    }

    fn arm(&mut self, replica: &Replica, peer: u8, out: &mut Vec<Outgoing>) {
        let nonce = self.next_nonce();
        self.stats.armed += 1;
        tracing::info!(
            group = METADATA_GROUP.0,
            peer,
            applied = replica.commit_min().0,
            commit_max = replica.commit_max().0,
            "metadata state transfer armed"
        );
        self.receiving = Receiving::Pulling(Session {
            peer,
            nonce,
            stage: Stage::AwaitingDescriptor,
            idle_ticks: 0,
            stalls: 0,
        });
        self.push_descriptor_request(replica, peer, nonce, out);
    }

    /// After idle ticks: the descriptor again, or the window from the
    /// cursor (whatever was in flight is presumed lost).
    fn re_request(&mut self, replica: &Replica, out: &mut Vec<Outgoing>) {
        let Receiving::Pulling(session) = &mut self.receiving else {
            return;
        };
        let (peer, nonce) = (session.peer, session.nonce);
        match &mut session.stage {
            Stage::AwaitingDescriptor => self.push_descriptor_request(replica, peer, nonce, out),
            Stage::Fetching(fetch) => {
                if let Some(cursor) = next_pending_chunk(&fetch.artifacts, 1) {
                    fetch.frontier = (cursor.artifact, cursor.offset);
                }
                fetch.in_flight = 0;
                self.fill_window(replica, out);
            }
        }
    }

    /// Tops the window of chunk requests up to `chunks_in_flight`.
    fn fill_window(&mut self, replica: &Replica, out: &mut Vec<Outgoing>) {
        let chunk_max = u64::from(self.config.chunk_len_max_bytes.max(1));
        let window = self.config.chunks_in_flight.max(1);
        let mut requests = Vec::new();
        let Receiving::Pulling(Session {
            peer,
            nonce,
            stage: Stage::Fetching(fetch),
            ..
        }) = &mut self.receiving
        else {
            return;
        };
        while fetch.in_flight < window {
            let (mut artifact, mut offset) = fetch.frontier;
            // Past the end of an artifact (or a zero-length one): the next.
            while let Some(p) = fetch.artifacts.get(artifact as usize)
                && offset >= p.declared_len()
            {
                artifact += 1;
                offset = 0;
            }
            let Some(p) = fetch.artifacts.get(artifact as usize) else {
                break;
            };
            let len = (p.declared_len() - offset).min(chunk_max);
            fetch.frontier = (artifact, offset + len);
            fetch.in_flight += 1;
            requests.push(RequestStateChunkHeader {
                nonce: *nonce,
                offset,
                group: METADATA_GROUP,
                // Lossless: at most chunk_len_max_bytes.
                len: len as u32,
                artifact,
            });
        }
        let peer = *peer;
        for request in requests {
            self.push(
                replica,
                peer,
                CommandHeader::RequestStateChunk(request),
                &[],
                out,
            );
        }
    }

    fn fail(&mut self, replica: &Replica, peer: u8, error: MetadataReceiveError) {
        self.stats.attempts_failed += 1;
        let local = facts(replica);
        let base = self.config.repair_retry_ticks.max(1);
        let (next, after_ticks) = if error.transient() {
            self.backoff.refusals = self.backoff.refusals.saturating_add(1);
            let next = peer_after_refusal(&local, ReplicaId(peer));
            (next, base)
        } else {
            self.backoff.failures = self.backoff.failures.saturating_add(1);
            (
                rotate_peer(&local, ReplicaId(peer)),
                self.backoff.delay_ticks(base),
            )
        };
        tracing::warn!(
            group = METADATA_GROUP.0,
            peer,
            %error,
            next_peer = next.0,
            retry_in_ticks = after_ticks,
            failures = self.backoff.failures,
            "metadata state transfer attempt failed"
        );
        self.receiving = Receiving::Rearm {
            peer: next.0,
            after_ticks,
        };
        self.last_failure = Some(error);
    }

    fn serve_offer(
        &mut self,
        replica: &Replica,
        offer: Result<metadata::MetadataOffer, TransferError>,
        requester: u8,
        nonce: u128,
        out: &mut Vec<Outgoing>,
    ) {
        // First wins per nonce: a retried request gets the same offer,
        // never a newer one that would describe other bytes.
        if let Some(served) = self
            .serving
            .get_mut(&requester)
            .filter(|s| s.nonce == nonce)
        {
            served.idle_ticks = 0;
            let (commit_op, body) = (served.commit_op, served.manifest.clone());
            self.push_target(replica, requester, nonce, commit_op, &body, out);
            return;
        }
        match offer {
            Ok(offer) => {
                self.stats.offers_served += 1;
                let manifest = Bytes::from(consensus::encode_manifest(&offer.manifest));
                let bytes: u64 = offer.manifest.iter().map(|a| a.len).sum();
                tracing::info!(
                    group = METADATA_GROUP.0,
                    peer = requester,
                    commit_op = offer.commit_op.0,
                    bytes,
                    "metadata state transfer offer served"
                );
                self.serving.insert(
                    requester,
                    Served {
                        nonce,
                        commit_op: offer.commit_op.0,
                        manifest: manifest.clone(),
                        artifacts: offer.artifacts.into_iter().map(Bytes::from).collect(),
                        idle_ticks: 0,
                        served_out: false,
                    },
                );
                self.push_target(replica, requester, nonce, offer.commit_op.0, &manifest, out);
            }
            Err(reason) => {
                self.stats.serve_refusals += 1;
                // Every refusal of the gate is "not now": the replica may
                // become a caught-up primary (or its primary's caught-up
                // backup), or commit its first op.
                tracing::debug!(group = METADATA_GROUP.0, peer = requester, %reason, "metadata offer refused");
                self.push_refusal(replica, requester, nonce, true, out);
            }
        }
    }

    fn serve_chunk(
        &mut self,
        replica: &Replica,
        requester: u8,
        h: &RequestStateChunkHeader,
        out: &mut Vec<Outgoing>,
    ) {
        let chunk_max = u64::from(self.config.chunk_len_max_bytes.max(1));
        let Some(served) = self
            .serving
            .get_mut(&requester)
            .filter(|s| s.nonce == h.nonce)
        else {
            // Expired, replaced, or this replica restarted: the requester
            // starts over.
            tracing::debug!(
                group = METADATA_GROUP.0,
                peer = requester,
                "metadata chunk asked of an unknown session"
            );
            self.push_refusal(replica, requester, h.nonce, true, out);
            return;
        };
        let last = served.artifacts.len().saturating_sub(1);
        let Some(bytes) = served.artifacts.get(h.artifact as usize) else {
            self.stats.frames_ignored += 1;
            return;
        };
        let len = bytes.len() as u64;
        // An empty answer would count as progress nowhere and start a
        // ping-pong: nothing is answered past the end or for no bytes.
        if h.len == 0 || h.offset >= len {
            self.stats.frames_ignored += 1;
            return;
        }
        let end = h
            .offset
            .saturating_add(u64::from(h.len).min(chunk_max))
            .min(len);
        served.idle_ticks = 0;
        if h.artifact as usize == last && end == len {
            served.served_out = true;
        }
        // Lossless: both are at most the artifact's in-memory length.
        let payload = bytes.slice(h.offset as usize..end as usize);
        self.stats.chunks_served += 1;
        let header = StateChunkHeader {
            nonce: h.nonce,
            offset: h.offset,
            group: METADATA_GROUP,
            artifact: h.artifact,
        };
        self.push(
            replica,
            requester,
            CommandHeader::StateChunk(header),
            &payload,
            out,
        );
    }

    fn on_target(
        &mut self,
        replica: &Replica,
        from: u8,
        view: u32,
        h: &StateTransferTargetHeader,
        body: &[u8],
        out: &mut Vec<Outgoing>,
    ) {
        let Receiving::Pulling(session) = &mut self.receiving else {
            self.stats.frames_ignored += 1;
            return;
        };
        if session.peer != from || session.nonce != h.nonce {
            self.stats.frames_ignored += 1;
            return;
        }
        if !h.available {
            // Also mid-pull: the peer no longer holds the session.
            let transient = h.unavailable_transient;
            self.fail(
                replica,
                from,
                MetadataReceiveError::PeerUnavailable { transient },
            );
            return;
        }
        if matches!(session.stage, Stage::Fetching(_)) {
            self.stats.frames_ignored += 1;
            return;
        }
        let manifest = match accept_descriptor(&self.config, replica, view, h, body) {
            Ok(manifest) => manifest,
            Err(refusal) => {
                self.fail(replica, from, MetadataReceiveError::Descriptor(refusal));
                return;
            }
        };
        let total: u64 = manifest.iter().map(|a| a.len).sum();
        tracing::info!(
            group = METADATA_GROUP.0,
            peer = from,
            commit_op = h.commit_op.0,
            bytes = total,
            "metadata state transfer offer accepted"
        );
        session.idle_ticks = 0;
        session.stalls = 0;
        session.stage = Stage::Fetching(Fetch {
            commit_op: h.commit_op.0,
            artifacts: manifest
                .iter()
                .copied()
                .map(ArtifactProgress::new)
                .collect(),
            manifest,
            frontier: (0, 0),
            in_flight: 0,
            logged_bytes: 0,
        });
        self.fill_window(replica, out);
    }

    async fn on_chunk<F: Fs, S: SuperblockStore, B: MetadataBus>(
        &mut self,
        group: &mut MetadataGroup<F, S, B>,
        from: u8,
        h: &StateChunkHeader,
        payload: &[u8],
        out: &mut Vec<Outgoing>,
    ) {
        /// What a landed chunk leads to.
        enum Next {
            Pull,
            Corrupt(usize),
            Install,
        }
        let next = {
            let Receiving::Pulling(Session {
                peer,
                nonce,
                stage: Stage::Fetching(fetch),
                idle_ticks,
                stalls,
            }) = &mut self.receiving
            else {
                self.stats.frames_ignored += 1;
                return;
            };
            if *peer != from || *nonce != h.nonce {
                self.stats.frames_ignored += 1;
                return;
            }
            let accepted = match append_chunk(&mut fetch.artifacts, h.artifact, h.offset, payload) {
                Ok(accepted) => accepted,
                Err(rejection) => {
                    self.stats.chunks_rejected += 1;
                    tracing::debug!(group = METADATA_GROUP.0, peer = from, %rejection, "metadata chunk not accepted");
                    return;
                }
            };
            *idle_ticks = 0;
            *stalls = 0;
            fetch.in_flight = fetch.in_flight.saturating_sub(1);
            self.stats.bytes_received += payload.len() as u64;
            let landed: u64 = fetch.artifacts.iter().map(|p| p.received_len()).sum();
            if landed - fetch.logged_bytes >= PROGRESS_EVERY_BYTES {
                fetch.logged_bytes = landed;
                let total: u64 = fetch.manifest.iter().map(|a| a.len).sum();
                tracing::info!(
                    group = METADATA_GROUP.0,
                    peer = from,
                    bytes = landed,
                    total_bytes = total,
                    "metadata state transfer progress"
                );
            }
            let p = &fetch.artifacts[accepted.artifact];
            if accepted.completes && !verify_state_artifact(&p.entry, &p.buf) {
                Next::Corrupt(accepted.artifact)
            } else if next_pending_chunk(&fetch.artifacts, 1).is_some() {
                Next::Pull
            } else {
                Next::Install
            }
        };
        match next {
            Next::Pull => self.fill_window(group.replica(), out),
            Next::Corrupt(index) => self.fail(
                group.replica(),
                from,
                MetadataReceiveError::ArtifactChecksum { index },
            ),
            Next::Install => self.install(group, from).await,
        }
    }

    /// Every artifact is in and verified: hands them to the group.
    async fn install<F: Fs, S: SuperblockStore, B: MetadataBus>(
        &mut self,
        group: &mut MetadataGroup<F, S, B>,
        from: u8,
    ) {
        let Receiving::Pulling(Session {
            stage: Stage::Fetching(fetch),
            ..
        }) = std::mem::take(&mut self.receiving)
        else {
            return;
        };
        let Fetch {
            commit_op,
            manifest,
            artifacts,
            ..
        } = fetch;
        let total: u64 = manifest.iter().map(|a| a.len).sum();
        let bufs: Vec<Vec<u8>> = artifacts.into_iter().map(|p| p.buf).collect();
        match group.install_transfer(&manifest, &bufs).await {
            Ok(effects) => {
                self.stats.installs += 1;
                self.backoff = TransferBackoff::default();
                self.armed_floor = None;
                tracing::info!(
                    group = METADATA_GROUP.0,
                    peer = from,
                    commit_op,
                    bytes = total,
                    effects = effects.len(),
                    "metadata state transfer installed"
                );
            }
            Err(error) if group.is_fenced() => {
                // The store failed after the check phase: the group is
                // fenced, and a reboot recovers the old or the installed
                // state, never a mix.
                tracing::error!(group = METADATA_GROUP.0, peer = from, %error, "metadata state transfer install failed; group 0 fenced");
            }
            Err(error) => self.fail(
                group.replica(),
                from,
                MetadataReceiveError::Install(error.to_string()),
            ),
        }
    }

    /// Asks `peer` for the descriptor of session `nonce` (on arming, and
    /// again after idle ticks while none has been accepted).
    fn push_descriptor_request(
        &mut self,
        replica: &Replica,
        peer: u8,
        nonce: u128,
        out: &mut Vec<Outgoing>,
    ) {
        let request = RequestStateTransferHeader {
            nonce,
            group: METADATA_GROUP,
        };
        self.push(
            replica,
            peer,
            CommandHeader::RequestStateTransfer(request),
            &[],
            out,
        );
    }

    fn push_target(
        &mut self,
        replica: &Replica,
        to: u8,
        nonce: u128,
        commit_op: u64,
        manifest: &[u8],
        out: &mut Vec<Outgoing>,
    ) {
        let target = StateTransferTargetHeader {
            nonce,
            commit_op: Op(commit_op),
            group: METADATA_GROUP,
            available: true,
            unavailable_transient: false,
            commit_max: Op(replica.commit_max().0.max(commit_op)),
        };
        self.push(
            replica,
            to,
            CommandHeader::StateTransferTarget(target),
            manifest,
            out,
        );
    }

    fn push_refusal(
        &mut self,
        replica: &Replica,
        to: u8,
        nonce: u128,
        transient: bool,
        out: &mut Vec<Outgoing>,
    ) {
        let target = StateTransferTargetHeader {
            nonce,
            commit_op: Op(0),
            group: METADATA_GROUP,
            available: false,
            unavailable_transient: transient,
            commit_max: replica.commit_max(),
        };
        self.push(
            replica,
            to,
            CommandHeader::StateTransferTarget(target),
            &[],
            out,
        );
    }

    fn push(
        &mut self,
        replica: &Replica,
        to: u8,
        command: CommandHeader,
        body: &[u8],
        out: &mut Vec<Outgoing>,
    ) {
        self.stats.frames_out += 1;
        out.push(Outgoing::transfer_frame(
            self.config.cluster,
            replica,
            ReplicaId(to),
            command,
            body,
        ));
    }
}

/// Checks a descriptor whole before anything is pulled: the peer is not
/// behind this replica, the op is in range and ahead of the applied one,
/// and the manifest is exactly a snapshot and a client table at that op,
/// each non-empty and under its ceiling.
fn accept_descriptor(
    config: &MetadataTransferConfig,
    replica: &Replica,
    view: u32,
    h: &StateTransferTargetHeader,
    body: &[u8],
) -> Result<Vec<StateArtifact>, MetadataDescriptorRefusal> {
    type R = MetadataDescriptorRefusal;
    check_offer_header(view, h, &facts(replica)).map_err(R::Header)?;
    if h.commit_op <= replica.commit_min() {
        return Err(R::NotAhead {
            commit_op: h.commit_op,
            applied: replica.commit_min(),
        });
    }
    let manifest = decode_manifest(body).map_err(R::Manifest)?;
    if manifest.len() != 2 {
        return Err(R::ArtifactCount {
            count: manifest.len(),
        });
    }
    let expected = [
        (
            artifact_kind::METADATA_SNAPSHOT,
            config.snapshot_len_max_bytes,
        ),
        (
            artifact_kind::CLIENT_TABLE,
            config.client_table_len_max_bytes,
        ),
    ];
    for (index, (entry, (kind, max))) in manifest.iter().zip(expected).enumerate() {
        if entry.kind.code() != kind {
            return Err(R::UnexpectedKind {
                index,
                kind: entry.kind.code(),
            });
        }
        // Both kinds' frontier is a commit op.
        if entry.kind.commit_op() != Some(h.commit_op) {
            return Err(R::FrontierMismatch {
                index,
                frontier: Op(entry.kind.wire_frontier()),
                commit_op: h.commit_op,
            });
        }
        if entry.len == 0 {
            return Err(R::EmptyArtifact { index });
        }
        if entry.len > max {
            return Err(R::ArtifactTooLarge {
                index,
                len: entry.len,
                max,
            });
        }
    }
    Ok(manifest)
}
