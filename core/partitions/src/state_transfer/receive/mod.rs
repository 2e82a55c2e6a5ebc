//! The receiving half of partition state transfer (ST-R1..R4, ST-B2): one
//! [`TransferReceiver`] per partition runs the pull session against a
//! peer, streams segment artifacts to staging files, adopts staged files an
//! earlier session left, and backs off across failed attempts.
//!
//! It is sans-network: the driver hands it the frames that arrived
//! (`StateTransferTarget`, `StateChunk`) and its ticks, and sends the
//! [`TransferRequest`]s it returns. Its only I/O is on `.staging` files of
//! the partition directory, which boot recovery sweeps, so nothing here can
//! change the partition's live state; the install (ST-I1..I5) consumes a
//! [`ReceivedTransfer`].
//!
//! By file: `descriptor` (the offer's check before anything is created),
//! `prepare` (re-reading and reusing staged files), `window` (the chunk
//! window), `backoff` (re-arm delays and the next peer); here the session.
//!
//! The session (reference §4.2–§4.3): a nonce from a seeded PRNG, one
//! chunk in flight (or a window of [`ReceiverConfig::chunks_in_flight`],
//! topped up by [`TransferReceiver::fill_window`], chunks arriving ahead of
//! the cursor held until the bytes before them land), chunks landed only
//! through the chunk cursor ([`check_chunk`]), idle ticks reset only by a descriptor accepted or
//! bytes landed, a re-request every `repair_retry_ticks` idle ticks that
//! burns one stall attempt, and a failure once the stall budget is spent.
//! An accepted offer is first *prepared*: staged files an earlier
//! attempt left are re-read (adopted when they match an entry, continued
//! when they are the synced prefix of an interrupted spill) at most
//! [`ReceiverConfig::prepare_budget_bytes`] per call, the rest on the next
//! ticks, so a multi-GiB re-read never holds the shard's loop (ST-B1).
//!
//! Every failure ends the session and schedules a [`PendingRearm`]: a
//! charged failure doubles the delay (up to 1024× the base) and rotates the
//! peer; a transient refusal waits the flat base and charges nothing.

use common::{Op, Prng, ReplicaId};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use consensus::header::StateTransferTargetHeader;
use consensus::{AcceptedChunk, ChunkProgress, ChunkRejection, check_chunk};
use consensus::{ArtifactProgress, StateArtifact, append_chunk, next_pending_chunk};
use journal::SuperblockStore;
use storage::fs::Fs;

use super::errors::SpillError;
use super::serve::{REPAIR_RETRY_TICKS_DEFAULT, STATE_CHUNK_LEN_MAX_DEFAULT};
use super::spill::{
    PrefixRehash, ResumePoint, SegmentSpill, SpillConfig, StagedSegmentMeta,
    segment_manifest_digest, sweep_staging_except,
};
use super::wire::{ConsumerOffsetsWire, ConsumerOffsetsWireError};
use crate::bus::MessageBus;
use crate::install::{InstallInput, StagedSegment};
use crate::partition::Partition;

mod backoff;
mod descriptor;
mod prepare;
mod window;

pub use backoff::{TransferBackoff, peer_after_refusal, rotate_peer};
pub use descriptor::DescriptorRefusal;
use descriptor::accept_descriptor;
use prepare::{Candidate, ReuseScanMemo};
use window::ChunkWindow;

/// Default cap on one `SEGMENT_LOG` artifact: 1 GiB + 64 MiB.
pub const SEGMENT_ARTIFACT_LEN_MAX_DEFAULT: u64 = (1 << 30) + (64 << 20);
/// Cap on the consumer-offsets artifact: 32 MiB.
pub const OFFSETS_ARTIFACT_LEN_MAX: u64 = 32 << 20;
/// Cap on an offer's total bytes: 1 TiB.
pub const TRANSFER_TOTAL_LEN_MAX: u64 = 1 << 40;
/// Stall rounds against one peer before the attempt fails.
pub const STALL_ATTEMPTS_MAX_DEFAULT: u32 = 5;
/// The exponent cap of the re-arm backoff: at most 1024× the base.
pub const BACKOFF_EXPONENT_MAX: u32 = 10;

/// Configuration of a [`TransferReceiver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Ceiling on one chunk request; both ends compute the same clamp.
    pub chunk_len_max_bytes: u32,
    /// Idle ticks before a re-request; also the re-arm base delay.
    pub repair_retry_ticks: u64,
    /// Stall rounds before an attempt fails.
    pub stall_attempts_max: u32,
    /// Cap on one segment artifact.
    pub segment_artifact_len_max_bytes: u64,
    /// How staging files are synced and re-read.
    pub spill: SpillConfig,
    /// Bytes of staged files re-read per call while preparing an accepted
    /// offer (reuse, resume): the rest waits for the next tick (ST-B1).
    pub prepare_budget_bytes: u64,
    /// Chunk requests a session keeps in flight (at least 1; the default,
    /// 1, is the lockstep pull). With more, the serving peer reads ahead
    /// while this replica writes and syncs; the driver tops the window up
    /// with [`TransferReceiver::fill_window`] after every step, and a chunk
    /// arriving ahead of the cursor is held (at most `chunks_in_flight - 1`
    /// of them) until the bytes before it land.
    pub chunks_in_flight: u32,
}

/// Default preparation budget per call: 64 MiB (tens of milliseconds of
/// reading and hashing).
pub const PREPARE_BUDGET_BYTES_DEFAULT: u64 = 64 << 20;

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            chunk_len_max_bytes: STATE_CHUNK_LEN_MAX_DEFAULT,
            repair_retry_ticks: REPAIR_RETRY_TICKS_DEFAULT,
            stall_attempts_max: STALL_ATTEMPTS_MAX_DEFAULT,
            segment_artifact_len_max_bytes: SEGMENT_ARTIFACT_LEN_MAX_DEFAULT,
            spill: SpillConfig::default(),
            prepare_budget_bytes: PREPARE_BUDGET_BYTES_DEFAULT,
            chunks_in_flight: 1,
        }
    }
}

/// What the receiver needs to know about its own replica when it judges an
/// offer or picks a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalFacts {
    /// This replica's index.
    pub replica: ReplicaId,
    /// Replicas in the group.
    pub replica_count: u8,
    /// The view this replica is established in ([`Replica::established_view`]):
    /// an offer from an older view is stale.
    ///
    /// [`Replica::established_view`]: consensus::vsr::Replica::established_view
    pub view: u32,
    /// The view's primary.
    pub primary: ReplicaId,
    /// Highest op known committed in the group.
    pub commit_max: Op,
    /// The purge generation this replica applied.
    pub purge_generation: u64,
}

impl LocalFacts {
    /// The facts of a partition replica.
    pub fn of<B: MessageBus, S: SuperblockStore, F: Fs>(partition: &Partition<B, S, F>) -> Self {
        let replica = partition.replica();
        Self {
            replica: replica.replica(),
            replica_count: partition.config().vsr.replica_count,
            view: replica.established_view(),
            primary: replica.primary_index(replica.view()),
            commit_max: replica.commit_max(),
            purge_generation: partition.purge_generation(),
        }
    }
}

/// A frame the receiver asks the driver to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferRequest {
    /// `RequestStateTransfer { nonce }` to `peer`.
    Descriptor {
        /// The serving peer.
        peer: ReplicaId,
        /// The session nonce.
        nonce: u128,
    },
    /// `RequestStateChunk { nonce, artifact, offset, len }` to `peer`.
    Chunk {
        /// The serving peer.
        peer: ReplicaId,
        /// The session nonce.
        nonce: u128,
        /// The artifact's manifest index.
        artifact: u32,
        /// Byte offset within the artifact.
        offset: u64,
        /// Bytes wanted.
        len: u32,
    },
}

/// An offer's descriptor as accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedDescriptor {
    /// The op the offer describes (the server's `commit_min`).
    pub commit_op: Op,
    /// The server's view.
    pub view: u32,
    /// The server's `commit_max`.
    pub commit_max: Op,
    /// The manifest: segments ascending, the offsets artifact last.
    pub manifest: Vec<StateArtifact>,
}

/// An artifact still arriving.
#[derive(Debug)]
pub enum PendingArtifact<H: storage::fs::FsFile> {
    /// A segment; its spill starts with the first chunk (or at accept, when
    /// an interrupted spill of the same entry resumes).
    Segment {
        /// The manifest entry.
        entry: StateArtifact,
        /// The staging file being written, once started (boxed: the
        /// hasher state is large and only one slot holds one).
        spill: Option<Box<SegmentSpill<H>>>,
    },
    /// The consumer-offsets artifact (at most 32 MiB), buffered.
    Offsets(ArtifactProgress),
}

/// One artifact slot of a session, in manifest order.
#[derive(Debug)]
pub enum TransferArtifact<H: storage::fs::FsFile> {
    /// Still arriving.
    Pending(PendingArtifact<H>),
    /// Validated and durable in its staging files.
    Staged(StagedSegmentMeta),
}

impl<H: storage::fs::FsFile> ChunkProgress for TransferArtifact<H> {
    fn declared_len(&self) -> u64 {
        match self {
            Self::Pending(PendingArtifact::Segment { entry, .. }) => entry.len,
            Self::Pending(PendingArtifact::Offsets(progress)) => progress.entry.len,
            Self::Staged(meta) => meta.size_bytes,
        }
    }

    fn received_len(&self) -> u64 {
        match self {
            Self::Pending(PendingArtifact::Segment { spill, .. }) => {
                spill.as_ref().map_or(0, |s| s.received_len_bytes())
            }
            Self::Pending(PendingArtifact::Offsets(progress)) => progress.received_len(),
            Self::Staged(meta) => meta.size_bytes,
        }
    }

    fn extend_from_chunk(&mut self, payload: &[u8]) {
        match self {
            Self::Pending(PendingArtifact::Offsets(progress)) => {
                progress.extend_from_chunk(payload);
            }
            // A segment's bytes are recorded by its spill, after the write
            // (it needs I/O, which this trait cannot do); a staged slot is
            // complete and the cursor never addresses it.
            Self::Pending(PendingArtifact::Segment { .. }) | Self::Staged(_) => {
                debug_assert!(false, "segment chunks go through the spill");
            }
        }
    }

    fn reserve_declared(&mut self) {
        if let Self::Pending(PendingArtifact::Offsets(progress)) = self {
            progress.reserve_declared();
        }
    }
}

/// An accepted offer and its artifact slots.
#[derive(Debug)]
pub struct AcceptedTransfer<H: storage::fs::FsFile> {
    /// The descriptor.
    pub descriptor: AcceptedDescriptor,
    /// One slot per manifest entry.
    pub artifacts: Vec<TransferArtifact<H>>,
}

/// An accepted offer whose staged files are being re-read (ST-R3 reuse,
/// ST-B2 resume) in budgeted steps before the first chunk is requested.
#[derive(Debug)]
pub struct Preparation<H: storage::fs::FsFile> {
    descriptor: AcceptedDescriptor,
    digest: u64,
    memo_hit: bool,
    next_index: usize,
    current: Option<(usize, Candidate, PrefixRehash<H>)>,
    /// Adopted slots by manifest index: looked up once per entry, so a map
    /// (a manifest has up to 65,536 entries; a list made it quadratic).
    adopted: BTreeMap<usize, StagedSegmentMeta>,
    newly_adopted: usize,
    /// Staging files the sweep keeps; a set for the same reason.
    keep: HashSet<PathBuf>,
    resumed: Option<(usize, SegmentSpill<H>)>,
}

impl<H: storage::fs::FsFile> Preparation<H> {
    /// The accepted descriptor.
    pub fn descriptor(&self) -> &AcceptedDescriptor {
        &self.descriptor
    }
}

/// Where a session is.
#[derive(Debug)]
pub enum SessionStage<H: storage::fs::FsFile> {
    /// The descriptor request is out.
    AwaitingDescriptor,
    /// A descriptor was accepted; staged files are being re-read.
    Preparing(Box<Preparation<H>>),
    /// Chunks are being pulled.
    Fetching(AcceptedTransfer<H>),
}

/// One pull session against one peer.
#[derive(Debug)]
pub struct TransferSession<H: storage::fs::FsFile> {
    /// The nonce every frame of the session carries.
    pub nonce: u128,
    /// The serving peer; also where re-requests go.
    pub peer: ReplicaId,
    /// Where the session is.
    pub stage: SessionStage<H>,
    /// Ticks since the last progress.
    pub idle_ticks: u64,
    /// Stall rounds burned since the last progress.
    pub stall_attempts: u32,
}

impl<H: storage::fs::FsFile> TransferSession<H> {
    /// The accepted offer and its slots, once fetching.
    pub fn accepted(&self) -> Option<&AcceptedTransfer<H>> {
        match &self.stage {
            SessionStage::Fetching(accepted) => Some(accepted),
            SessionStage::AwaitingDescriptor | SessionStage::Preparing(_) => None,
        }
    }

    /// Whether a descriptor was accepted (preparing or fetching).
    pub fn descriptor_accepted(&self) -> bool {
        !matches!(self.stage, SessionStage::AwaitingDescriptor)
    }
}

/// A scheduled re-arm: a fresh session against `peer` once `after_ticks`
/// ticks passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRearm {
    /// The peer to ask.
    pub peer: ReplicaId,
    /// Ticks left.
    pub after_ticks: u64,
}

/// Why a transfer attempt failed. [`Self::transient`] says whether it is
/// charged to the backoff.
#[derive(Debug)]
pub enum ReceiveError {
    /// The descriptor was refused.
    Descriptor(DescriptorRefusal),
    /// The peer answered that it cannot serve.
    PeerUnavailable {
        /// Whether the peer said asking again soon may succeed.
        transient: bool,
    },
    /// A segment artifact failed its checksum or walk, or staging failed.
    Spill(SpillError),
    /// The offsets artifact does not hash to its manifest entry.
    OffsetsChecksum,
    /// The offsets artifact did not decode.
    Offsets(ConsumerOffsetsWireError),
    /// The offer was built before a purge this replica already applied.
    OfferBeforePurge {
        /// The offer's purge generation.
        offered: u64,
        /// This replica's.
        local: u64,
    },
    /// The stall budget ran out.
    Stalled {
        /// Stall rounds burned.
        attempts: u32,
    },
}

impl ReceiveError {
    /// Whether the failure is "not right now": re-armed on the flat base
    /// delay and not charged to the backoff.
    pub const fn transient(&self) -> bool {
        matches!(self, Self::PeerUnavailable { transient: true })
    }

    /// Whether the failure says the peer's bytes cannot be trusted: the
    /// session's staging files are swept and nothing is resumed from them.
    ///
    /// An offsets artifact from a newer encoder (an unknown version, bytes
    /// past the last section) is not hostile: it matched its manifest
    /// checksum, and so did every segment before it, so the staged
    /// segments are kept for the next attempt; the failure is charged once
    /// like any other. Sweeping them made every attempt against such a peer
    /// pull the whole partition again.
    pub const fn hostile(&self) -> bool {
        match self {
            Self::Offsets(
                ConsumerOffsetsWireError::UnsupportedVersion { .. }
                | ConsumerOffsetsWireError::TrailingBytes { .. },
            ) => false,
            Self::Spill(SpillError::ManifestChecksum { .. } | SpillError::Walk(_))
            | Self::Offsets(_)
            | Self::OffsetsChecksum
            | Self::OfferBeforePurge { .. } => true,
            _ => false,
        }
    }
}

impl fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Descriptor(r) => write!(f, "descriptor refused: {r}"),
            Self::PeerUnavailable { transient: true } => f.write_str("peer cannot serve right now"),
            Self::PeerUnavailable { transient: false } => f.write_str("peer cannot serve"),
            Self::Spill(e) => write!(f, "segment artifact refused: {e}"),
            Self::OffsetsChecksum => {
                f.write_str("consumer-offsets artifact fails its manifest checksum")
            }
            Self::Offsets(e) => write!(f, "consumer-offsets artifact refused: {e}"),
            Self::OfferBeforePurge { offered, local } => write!(
                f,
                "offer built at purge generation {offered}, before this replica's {local}"
            ),
            Self::Stalled { attempts } => {
                write!(f, "transfer stalled for {attempts} retry rounds")
            }
        }
    }
}

impl std::error::Error for ReceiveError {}

/// Why a frame changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// No session is live.
    NoSession,
    /// The nonce or the sender is not the session's.
    NotThisSession,
    /// A descriptor arrived after one was accepted.
    DuplicateDescriptor,
    /// A chunk arrived before a descriptor was accepted.
    NotAccepted,
    /// The chunk cursor refused the chunk.
    Chunk(ChunkRejection),
}

/// Everything a completed pull hands to the install.
#[derive(Debug)]
pub struct ReceivedTransfer {
    /// The peer that served it.
    pub peer: ReplicaId,
    /// The accepted descriptor.
    pub descriptor: AcceptedDescriptor,
    /// The staged segments, ascending.
    pub staged: Vec<StagedSegmentMeta>,
    /// The decoded consumer-offsets artifact.
    pub offsets: ConsumerOffsetsWire,
    /// The same artifact as received (verified against its manifest entry),
    /// for an install that decodes it itself.
    pub offsets_bytes: Vec<u8>,
}

impl InstallInput {
    /// The install input of a completed pull. The receive side does not
    /// know the identity of op `commit_op`; the caller passes it (from the
    /// offer or the prepare header it repaired).
    pub fn from_received(received: &ReceivedTransfer, commit_checksum: u128) -> Self {
        Self {
            commit_op: received.descriptor.commit_op,
            commit_checksum,
            staged: received.staged.iter().map(StagedSegment::from).collect(),
            offsets_artifact: received.offsets_bytes.clone(),
        }
    }
}

/// What a frame or a tick did.
#[derive(Debug)]
pub enum ReceiveStep {
    /// Nothing to send.
    Ignored(IgnoreReason),
    /// Nothing to send now: waiting for a frame, a scheduled re-arm, or the
    /// next tick to continue preparing an accepted offer.
    Wait,
    /// Send this.
    Send(TransferRequest),
    /// Every artifact is in: install it.
    Complete(Box<ReceivedTransfer>),
    /// The attempt failed; a re-arm is scheduled.
    Failed(ReceiveError),
}

/// Counters a test or an operator reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Chunk requests sent (re-requests included).
    pub chunk_requests: u64,
    /// Chunk bytes accepted.
    pub chunk_bytes: u64,
    /// Most bytes held at once: the chunk being written, the walk's carry,
    /// the offsets buffer.
    pub peak_held_bytes: u64,
    /// Reuse scans that read the directory (memo misses).
    pub reuse_scans: u64,
    /// Staged segments adopted at accept.
    pub adopted_segments: u64,
    /// Spills resumed from a synced prefix.
    pub resumed_spills: u64,
    /// Bytes a resume did not have to pull again.
    pub resumed_bytes: u64,
    /// Staged bytes re-read by reuse and resume.
    pub rehashed_bytes: u64,
    /// Most staged bytes re-read in one call.
    pub rehashed_bytes_max_per_call: u64,
}

/// What landing one chunk did.
enum Landed {
    /// The bytes are in (and the artifact finished if they completed it).
    Accepted,
    /// The chunk changed nothing, or the attempt failed: this is the step.
    Stop(ReceiveStep),
}

/// The receiving side of one partition's state transfer.
#[derive(Debug)]
pub struct TransferReceiver<F: Fs> {
    fs: F,
    dir: PathBuf,
    config: ReceiverConfig,
    prng: Prng,
    session: Option<TransferSession<F::File>>,
    rearm: Option<PendingRearm>,
    backoff: TransferBackoff,
    resume: Option<ResumePoint>,
    reuse_memo: Option<ReuseScanMemo>,
    stats: ReceiverStats,
    window: ChunkWindow,
}

impl<F: Fs> TransferReceiver<F> {
    /// A receiver for the partition in `dir`, its nonces drawn from `seed`.
    pub fn new(fs: F, dir: &Path, config: ReceiverConfig, seed: u64) -> Self {
        Self {
            fs,
            dir: dir.to_path_buf(),
            config,
            prng: Prng::new(seed),
            session: None,
            rearm: None,
            backoff: TransferBackoff::default(),
            resume: None,
            reuse_memo: None,
            stats: ReceiverStats::default(),
            window: ChunkWindow::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// The live session, if any.
    pub fn session(&self) -> Option<&TransferSession<F::File>> {
        self.session.as_ref()
    }

    /// The scheduled re-arm, if any.
    pub fn pending_rearm(&self) -> Option<PendingRearm> {
        self.rearm
    }

    /// The backoff counters.
    pub fn backoff(&self) -> TransferBackoff {
        self.backoff
    }

    /// Where an interrupted spill would resume.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        self.resume
    }

    /// The counters.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }

    /// Resets the peak-memory counter (e.g. between measured phases).
    pub fn reset_peak(&mut self) {
        self.stats.peak_held_bytes = 0;
    }

    /// Called by the install once it completed: the only thing that resets
    /// the backoff.
    pub fn record_install_completed(&mut self) {
        self.backoff = TransferBackoff::default();
        self.rearm = None;
    }

    /// Drops the live session and any scheduled re-arm (the partition no
    /// longer needs a transfer). Staged files stay for a later reuse.
    pub fn disarm(&mut self) {
        self.end_session();
        self.rearm = None;
    }

    /// Called when the install of a completed pull from `peer` failed:
    /// charges the backoff and schedules a re-arm against the next peer
    /// (the partition still needs a transfer).
    pub fn record_install_failed(&mut self, peer: ReplicaId, local: &LocalFacts) {
        self.end_session();
        self.backoff.failures = self.backoff.failures.saturating_add(1);
        let rearm = PendingRearm {
            peer: rotate_peer(local, peer),
            after_ticks: self
                .backoff
                .delay_ticks(self.config.repair_retry_ticks.max(1)),
        };
        tracing::warn!(
            peer = peer.0,
            next_peer = rearm.peer.0,
            after_ticks = rearm.after_ticks,
            failures = self.backoff.failures,
            "state-transfer install failed; re-arm scheduled"
        );
        self.rearm = Some(rearm);
    }

    /// Starts a session against `peer` with a fresh nonce (dropping any
    /// live one) and returns the descriptor request.
    pub fn arm(&mut self, peer: ReplicaId) -> TransferRequest {
        self.end_session();
        self.rearm = None;
        let nonce = u128::from(self.prng.next_u64()) << 64 | u128::from(self.prng.next_u64());
        self.session = Some(TransferSession {
            nonce,
            peer,
            stage: SessionStage::AwaitingDescriptor,
            idle_ticks: 0,
            stall_attempts: 0,
        });
        tracing::info!(peer = peer.0, nonce, "state-transfer session armed");
        TransferRequest::Descriptor { peer, nonce }
    }

    /// Drops the live session, keeping where its spill could resume. (A
    /// session dropped while preparing keeps the resume point it had.)
    fn end_session(&mut self) {
        self.window = ChunkWindow::default();
        let Some(session) = self.session.take() else {
            return;
        };
        let SessionStage::Fetching(accepted) = session.stage else {
            return;
        };
        for slot in accepted.artifacts {
            if let TransferArtifact::Pending(PendingArtifact::Segment {
                spill: Some(spill), ..
            }) = slot
            {
                let point = spill.resume_point();
                if point.synced_len_bytes > 0 {
                    self.resume = Some(point);
                }
            }
        }
    }

    /// Ends the attempt with `error` and schedules the re-arm.
    async fn fail(&mut self, error: ReceiveError, local: &LocalFacts) -> ReceiveStep {
        let peer = self.session.as_ref().map_or(local.primary.0, |s| s.peer.0);
        self.end_session();
        self.fail_after_session(error, ReplicaId(peer), local).await
    }

    /// Like [`Self::fail`], once the session is already gone.
    async fn fail_after_session(
        &mut self,
        error: ReceiveError,
        peer: ReplicaId,
        local: &LocalFacts,
    ) -> ReceiveStep {
        if error.hostile() {
            // Nothing the peer sent this attempt may be mistaken for valid
            // later: drop the resume point and the memo, sweep every file.
            self.resume = None;
            self.reuse_memo = None;
            sweep_staging_except(&self.fs, &self.dir, &HashSet::new()).await;
        }
        self.schedule_rearm(&error, peer, local);
        ReceiveStep::Failed(error)
    }

    fn schedule_rearm(&mut self, error: &ReceiveError, peer: ReplicaId, local: &LocalFacts) {
        let base = self.config.repair_retry_ticks.max(1);
        let rearm = if error.transient() {
            self.backoff.refusals = self.backoff.refusals.saturating_add(1);
            if self.backoff.refusals.is_multiple_of(10) {
                tracing::error!(
                    peer = peer.0,
                    refusals = self.backoff.refusals,
                    "state transfer keeps being refused"
                );
            }
            // Not charged.
            let next = peer_after_refusal(local, peer);
            PendingRearm {
                peer: next,
                after_ticks: base,
            }
        } else {
            self.backoff.failures = self.backoff.failures.saturating_add(1);
            PendingRearm {
                peer: rotate_peer(local, peer),
                after_ticks: self.backoff.delay_ticks(base),
            }
        };
        tracing::warn!(
            peer = peer.0,
            next_peer = rearm.peer.0,
            after_ticks = rearm.after_ticks,
            failures = self.backoff.failures,
            %error,
            "state-transfer attempt failed"
        );
        self.rearm = Some(rearm);
    }

    /// One tick: counts a scheduled re-arm down (arming when it fires and
    /// no session is live); continues preparing an accepted offer by one
    /// budget of re-reading; or counts the session's idle ticks and
    /// re-requests after `repair_retry_ticks` of them, failing the attempt
    /// once the stall budget is spent.
    pub async fn on_tick(&mut self, local: &LocalFacts) -> ReceiveStep {
        let Some(session) = self.session.as_mut() else {
            let Some(rearm) = self.rearm.as_mut() else {
                return ReceiveStep::Wait;
            };
            rearm.after_ticks = rearm.after_ticks.saturating_sub(1);
            if rearm.after_ticks > 0 {
                return ReceiveStep::Wait;
            }
            let peer = rearm.peer;
            return ReceiveStep::Send(self.arm(peer));
        };
        if matches!(session.stage, SessionStage::Preparing(_)) {
            // Local work, not a silent peer: no idle ticks counted.
            return self.prepare(local).await;
        }
        session.idle_ticks += 1;
        if session.idle_ticks < self.config.repair_retry_ticks.max(1) {
            return ReceiveStep::Wait;
        }
        session.idle_ticks = 0;
        session.stall_attempts += 1;
        if session.stall_attempts > self.config.stall_attempts_max {
            let attempts = session.stall_attempts;
            let peer = session.peer;
            self.end_session();
            let error = ReceiveError::Stalled { attempts };
            self.schedule_rearm(&error, peer, local);
            return ReceiveStep::Failed(error);
        }
        let (peer, nonce) = (session.peer, session.nonce);
        tracing::debug!(
            peer = peer.0,
            attempt = session.stall_attempts,
            "state transfer idle; re-requesting"
        );
        let request = match &session.stage {
            SessionStage::AwaitingDescriptor => TransferRequest::Descriptor { peer, nonce },
            SessionStage::Fetching(accepted) => {
                let Some(next) =
                    next_pending_chunk(&accepted.artifacts, self.config.chunk_len_max_bytes)
                else {
                    return ReceiveStep::Wait;
                };
                // Whatever was in flight is presumed lost: the window
                // restarts at the cursor (`fill_window` re-sends the rest;
                // chunks held ahead of the cursor stay).
                self.window.frontier = Some((next.artifact, next.offset + u64::from(next.len)));
                self.window.in_flight = 1;
                self.stats.chunk_requests += 1;
                TransferRequest::Chunk {
                    peer,
                    nonce,
                    artifact: next.artifact,
                    offset: next.offset,
                    len: next.len,
                }
            }
            SessionStage::Preparing(_) => return ReceiveStep::Wait,
        };
        ReceiveStep::Send(request)
    }

    /// Handles a `StateTransferTarget` from `from` in view `view`, with the
    /// encoded manifest as `body`.
    pub async fn on_target(
        &mut self,
        from: u8,
        view: u32,
        header: &StateTransferTargetHeader,
        body: &[u8],
        local: &LocalFacts,
    ) -> ReceiveStep {
        let Some(session) = self.session.as_ref() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        if session.nonce != header.nonce || session.peer != ReplicaId(from) {
            return ReceiveStep::Ignored(IgnoreReason::NotThisSession);
        }
        if !header.available {
            // Also after accept: a server that lost the session (expired,
            // or restarted) answers a chunk request this way, and the
            // session must restart rather than stall out.
            let error = ReceiveError::PeerUnavailable {
                transient: header.unavailable_transient,
            };
            return self.fail(error, local).await;
        }
        if session.descriptor_accepted() {
            return ReceiveStep::Ignored(IgnoreReason::DuplicateDescriptor);
        }
        let descriptor = match accept_descriptor(view, header, body, local, &self.config) {
            Ok(d) => d,
            Err(refusal) => return self.fail(ReceiveError::Descriptor(refusal), local).await,
        };
        tracing::info!(
            peer = from,
            commit_op = descriptor.commit_op.0,
            artifacts = descriptor.manifest.len(),
            "state-transfer descriptor accepted"
        );
        let preparation = self.begin_preparation(descriptor).await;
        let Some(session) = self.session.as_mut() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        session.idle_ticks = 0;
        session.stall_attempts = 0;
        session.stage = SessionStage::Preparing(Box::new(preparation));
        self.prepare(local).await
    }

    /// Handles a `StateChunk` from `from`.
    pub async fn on_chunk(
        &mut self,
        from: u8,
        nonce: u128,
        artifact: u32,
        offset: u64,
        payload: Bytes,
        local: &LocalFacts,
    ) -> ReceiveStep {
        let Some(session) = self.session.as_mut() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        if session.nonce != nonce || session.peer != ReplicaId(from) {
            return ReceiveStep::Ignored(IgnoreReason::NotThisSession);
        }
        let SessionStage::Fetching(accepted) = &mut session.stage else {
            return ReceiveStep::Ignored(IgnoreReason::NotAccepted);
        };
        if let Err(rejection) = check_chunk(&accepted.artifacts, artifact, offset, &payload) {
            if self.hold_early(rejection, artifact, offset, &payload) {
                self.window.early_bytes += payload.len() as u64;
                self.window.early.insert((artifact, offset), payload);
                self.window.in_flight = self.window.in_flight.saturating_sub(1);
                return self.progress(local).await;
            }
            if matches!(rejection, ChunkRejection::Overrun { .. }) {
                tracing::warn!(peer = from, %rejection, "chunk runs past its artifact");
            }
            return ReceiveStep::Ignored(IgnoreReason::Chunk(rejection));
        }
        let mut chunk = Some((artifact, offset, payload));
        let mut first = true;
        while let Some((artifact, offset, payload)) = chunk.take() {
            match self
                .land_chunk(from, artifact, offset, payload, first, local)
                .await
            {
                Landed::Accepted => {}
                // A held chunk that no longer fits is dropped; the cursor
                // re-requests its bytes.
                Landed::Stop(ReceiveStep::Ignored(_)) if !first => break,
                Landed::Stop(step) => return step,
            }
            first = false;
            let cursor = self
                .session
                .as_ref()
                .and_then(|s| s.accepted())
                .and_then(|a| next_pending_chunk(&a.artifacts, self.config.chunk_len_max_bytes));
            chunk = cursor.and_then(|c| {
                let at = (c.artifact, c.offset);
                self.window
                    .take_early(at)
                    .map(|payload| (at.0, at.1, payload))
            });
        }
        self.progress(local).await
    }

    /// Lands one chunk the session's cursor accepts: through the spill (or
    /// into the offsets buffer), finishing the artifact if it completes it.
    /// `arrived` when it just arrived (it answers a request in flight),
    /// not when it was held ahead of the cursor (counted when held).
    async fn land_chunk(
        &mut self,
        from: u8,
        artifact: u32,
        offset: u64,
        payload: Bytes,
        arrived: bool,
        local: &LocalFacts,
    ) -> Landed {
        let Some(session) = self.session.as_mut() else {
            return Landed::Stop(ReceiveStep::Ignored(IgnoreReason::NoSession));
        };
        let SessionStage::Fetching(accepted) = &mut session.stage else {
            return Landed::Stop(ReceiveStep::Ignored(IgnoreReason::NotAccepted));
        };
        let landed = match check_chunk(&accepted.artifacts, artifact, offset, &payload) {
            Ok(landed) => landed,
            Err(rejection) => {
                if matches!(rejection, ChunkRejection::Overrun { .. }) {
                    tracing::warn!(peer = from, %rejection, "chunk runs past its artifact");
                }
                return Landed::Stop(ReceiveStep::Ignored(IgnoreReason::Chunk(rejection)));
            }
        };
        let payload_len = payload.len() as u64;
        let mut staged = None;
        let Some(written) = write_chunk(
            &self.fs,
            &self.dir,
            self.config.spill,
            &mut accepted.artifacts,
            &landed,
            (artifact, offset),
            payload,
        )
        .await
        else {
            return Landed::Stop(ReceiveStep::Ignored(IgnoreReason::Chunk(
                ChunkRejection::AllComplete,
            )));
        };
        let carried = match written {
            Ok(carried) => carried,
            Err(error) => return Landed::Stop(self.fail(error, local).await),
        };
        let held = payload_len + self.window.early_bytes + carried;
        let asked = u64::from(self.config.chunk_len_max_bytes.max(1));
        self.window.note_landed(
            arrived,
            (artifact, offset),
            payload_len,
            asked,
            landed.completes,
        );
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(held);
        self.stats.chunk_bytes += payload_len;
        if landed.completes {
            match finish_segment(
                &self.fs,
                &self.dir,
                &mut accepted.artifacts,
                landed.artifact,
            )
            .await
            {
                Finished::Staged(meta) => staged = Some(meta),
                Finished::NothingToFinish => {}
                Finished::Failed(error) => return Landed::Stop(self.fail(error, local).await),
                Finished::Gone => {
                    return Landed::Stop(ReceiveStep::Ignored(IgnoreReason::NotAccepted));
                }
            }
        }
        // Bytes landed: the only chunk event that counts as liveness.
        session.idle_ticks = 0;
        session.stall_attempts = 0;
        if let Some(meta) = staged {
            tracing::debug!(
                start_offset = meta.start_offset.0,
                size_bytes = meta.size_bytes,
                "segment staged"
            );
            let digest = segment_manifest_digest(&accepted.descriptor.manifest);
            ReuseScanMemo::remember(&mut self.reuse_memo, digest, landed.artifact, meta);
        }
        Landed::Accepted
    }

    /// The progress funnel: the next chunk to request, or the completed
    /// transfer once every artifact is in.
    async fn progress(&mut self, local: &LocalFacts) -> ReceiveStep {
        let Some(session) = self.session.as_ref() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        let Some(accepted) = session.accepted() else {
            return ReceiveStep::Ignored(IgnoreReason::NotAccepted);
        };
        if next_pending_chunk(&accepted.artifacts, self.config.chunk_len_max_bytes).is_some() {
            // With a window of one this is the chunk at the cursor, as the
            // lockstep pull always asked; with more, the next one past the
            // requests already out, or nothing while the window is full.
            return match self.next_window_request() {
                Some(request) => ReceiveStep::Send(request),
                None => ReceiveStep::Wait,
            };
        }
        let Some(session) = self.session.take() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        let peer = session.peer;
        let SessionStage::Fetching(accepted) = session.stage else {
            return ReceiveStep::Ignored(IgnoreReason::NotAccepted);
        };
        let mut staged = Vec::new();
        let mut offsets_bytes = None;
        for slot in accepted.artifacts {
            match slot {
                TransferArtifact::Staged(meta) => staged.push(meta),
                TransferArtifact::Pending(PendingArtifact::Offsets(p)) => offsets_bytes = Some(p),
                TransferArtifact::Pending(PendingArtifact::Segment { .. }) => {
                    debug_assert!(false, "a complete segment is staged");
                }
            }
        }
        let Some(offsets_progress) = offsets_bytes else {
            // Unreachable: acceptance requires the offsets artifact last.
            let error =
                ReceiveError::Descriptor(DescriptorRefusal::OffsetsArtifactMisplaced { count: 0 });
            return self.fail_after_session(error, peer, local).await;
        };
        // Every artifact is checked against its manifest entry, the small one
        // too: the install gets exactly the bytes the offer promised.
        let outcome =
            if !consensus::verify_state_artifact(&offsets_progress.entry, &offsets_progress.buf) {
                Err(ReceiveError::OffsetsChecksum)
            } else {
                match ConsumerOffsetsWire::decode(&offsets_progress.buf) {
                    Ok(offsets) if offsets.purge_generation < local.purge_generation => {
                        Err(ReceiveError::OfferBeforePurge {
                            offered: offsets.purge_generation,
                            local: local.purge_generation,
                        })
                    }
                    Ok(offsets) => Ok(offsets),
                    Err(error) => Err(ReceiveError::Offsets(error)),
                }
            };
        match outcome {
            Ok(offsets) => {
                self.resume = None;
                tracing::info!(
                    peer = peer.0,
                    commit_op = accepted.descriptor.commit_op.0,
                    segments = staged.len(),
                    "state transfer received"
                );
                ReceiveStep::Complete(Box::new(ReceivedTransfer {
                    peer,
                    descriptor: accepted.descriptor,
                    staged,
                    offsets,
                    offsets_bytes: offsets_progress.buf,
                }))
            }
            Err(error) => self.fail_after_session(error, peer, local).await,
        }
    }
}

/// What finishing a completed artifact came to.
enum Finished {
    /// A segment's spill became its staged file, now in the slot.
    Staged(StagedSegmentMeta),
    /// The offsets artifact: its buffer is all there is.
    NothingToFinish,
    /// The slot is gone or its spill already taken.
    Gone,
    /// Finishing the spill failed.
    Failed(ReceiveError),
}

/// Finishes the artifact a chunk just completed: a segment's spill
/// becomes its staged file, which replaces the pending slot.
async fn finish_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    artifacts: &mut [TransferArtifact<F::File>],
    index: usize,
) -> Finished {
    let Some(slot) = artifacts.get_mut(index) else {
        return Finished::Gone;
    };
    let TransferArtifact::Pending(PendingArtifact::Segment { spill, .. }) = slot else {
        return Finished::NothingToFinish;
    };
    let Some(done) = spill.take() else {
        return Finished::Gone;
    };
    match done.finish(fs, dir).await {
        Ok(meta) => {
            *slot = TransferArtifact::Staged(meta.clone());
            Finished::Staged(meta)
        }
        Err(error) => Finished::Failed(ReceiveError::Spill(error)),
    }
}

/// Writes one checked chunk where its artifact collects: a segment's
/// bytes through its spill, the offsets artifact into its buffer. Returns
/// the bytes held beyond the payload (the spill's carried walk, or the
/// whole offsets buffer), or `None` when the artifact is already staged.
async fn write_chunk<F: Fs>(
    fs: &F,
    dir: &Path,
    config: SpillConfig,
    artifacts: &mut [TransferArtifact<F::File>],
    landed: &AcceptedChunk,
    (artifact, offset): (u32, u64),
    payload: Bytes,
) -> Option<Result<u64, ReceiveError>> {
    let index = landed.artifact;
    match artifacts.get_mut(index) {
        Some(TransferArtifact::Pending(PendingArtifact::Segment { entry, spill })) => {
            let entry = *entry;
            Some(
                spill_chunk(fs, dir, config, entry, spill, payload)
                    .await
                    .map_err(ReceiveError::Spill),
            )
        }
        Some(TransferArtifact::Pending(PendingArtifact::Offsets(_))) => {
            let appended = append_chunk(artifacts, artifact, offset, &payload);
            debug_assert!(appended.is_ok(), "checked by the caller");
            match artifacts.get(index) {
                Some(TransferArtifact::Pending(PendingArtifact::Offsets(p))) => {
                    Some(Ok(p.buf.len() as u64))
                }
                _ => Some(Ok(0)),
            }
        }
        Some(TransferArtifact::Staged(_)) | None => None,
    }
}

/// Writes one accepted chunk of a segment through its spill (started on
/// the first chunk); returns the bytes the walk now carries.
async fn spill_chunk<F: Fs>(
    fs: &F,
    dir: &Path,
    config: SpillConfig,
    entry: StateArtifact,
    spill: &mut Option<Box<SegmentSpill<F::File>>>,
    payload: Bytes,
) -> Result<u64, SpillError> {
    if spill.is_none() {
        *spill = Some(Box::new(
            SegmentSpill::create(fs, dir, entry, config).await?,
        ));
    }
    let Some(active) = spill.as_mut() else {
        return Err(SpillError::NoPartitionDir);
    };
    active.append(payload).await?;
    Ok(active.carried_bytes() as u64)
}
