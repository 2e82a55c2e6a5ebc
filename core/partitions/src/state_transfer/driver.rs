//! The per-partition state-transfer driver: what a shard calls for one
//! partition, on every tick and for every state-transfer frame that
//! arrives, on both sides of a transfer.
//!
//! The pieces below it are sans-network: [`TransferReceiver`] turns frames
//! and ticks into requests, [`OfferServer`] turns requests into answers.
//! The driver is the glue a shard would otherwise repeat per group:
//!
//! - **Frames.** The four state-transfer commands ride the consensus frame
//!   header (`RequestStateTransfer`, `StateTransferTarget`,
//!   `RequestStateChunk`, `StateChunk`). The driver decodes an inbound
//!   frame with the header codec (seal, body checksum, command rules), then
//!   checks what the codec cannot know: the cluster, the group, and that
//!   the header's sender is the connection's peer. A frame that fails any
//!   check is a typed [`TransferFrameError`] and changes nothing. Outbound
//!   frames are encoded here and returned to the caller to send.
//! - **Arming.** A partition whose repair concluded `FloorRefused` (or that
//!   booted with the transfer-needed record of §8.6) reports
//!   [`Partition::state_transfer_needed`]; the next tick arms a session
//!   against the peer repair named, if the shard's receive budget has room.
//!   The receiver's own re-arm (backoff, peer rotation) takes over after a
//!   failure; the driver only withholds the slot while the budget is full.
//! - **Serving.** A descriptor request is answered with the offer (the
//!   manifest as the body) or a refusal that carries the server's view,
//!   `commit_max` and the transient flag. An offer still being hashed is
//!   refused as transient, and the driver keeps hashing it one budgeted
//!   round per tick (ST-B1, ST-B3), so the requester's next attempt finds
//!   it built or nearly so. A chunk request for a session the server does
//!   not hold (expired, or this replica restarted) is answered with a
//!   transient refusal, which restarts the requester's session.
//! - **Install.** A completed pull is installed at once. The offer names
//!   its op but not the op's identity (the reference's frame has no field
//!   for it), so the install records the identity as unknown and the
//!   consensus core learns it from the log or the primary's heartbeat
//!   (`consensus::vsr::UNKNOWN_CHECKSUM`). A completed install resets the
//!   backoff and the serving side's memos (the chain they describe is
//!   gone); a failed one that converged charges the backoff and re-arms;
//!   `ConvergeFailed` quarantines the partition's segment files (the
//!   fence) and the driver stops: the partition takes nothing until the
//!   shard rebuilds it.
//! - **Admission.** A shard-wide [`TransferSlots`] caps sessions: at most
//!   four partitions pulling at once (the reference's receive cap) and at
//!   most two offers handed out (the reference derives its serving cap from
//!   a cache budget of two segments per shard; one artifact is loaded per
//!   session). A request past the serving cap is refused as transient.

use common::{GroupId, Op, ReplicaId};
use std::fmt;
use std::path::{Path, PathBuf};
use std::task::Poll;

use bytes::Bytes;
use consensus::header::{
    CommandHeader, FRAME_SIZE_MAX_DEFAULT, FrameHeader, HEADER_SIZE, HeaderError,
    RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader, decode_frame, encode_frame,
};
use consensus::vsr::{Replica, UNKNOWN_CHECKSUM};
use journal::SuperblockStore;
use storage::fs::Fs;

use super::errors::PartitionTransferUnavailable;
use super::offer::BuildClock;
use super::receive::{
    LocalFacts, ReceiveError, ReceiveStep, ReceiverConfig, TransferReceiver, TransferRequest,
};
use super::serve::{ChunkAnswer, ChunkRequest, OfferServer, OfferServerConfig};
use crate::bus::MessageBus;
use crate::install::{
    INSTALL_FILE_OPS_PER_STEP, InstallInput, PartitionInstallError, PartitionInstallOutcome,
};
use crate::partition::{Partition, StateTransferNeeded};

/// Partitions of one shard pulling a transfer at once (the reference's
/// cap).
pub const RECEIVING_TRANSFERS_MAX_DEFAULT: usize = 4;
/// Offers one shard hands out at once (the reference's serving budget of
/// two loaded segments; one artifact is loaded per session).
pub const SERVING_TRANSFERS_MAX_DEFAULT: usize = 2;
/// Read blocks (4 MiB each) one call of a driven server may load for a
/// chunk request: a request further into its artifact (a receiver resuming
/// mid-artifact) is served over the following ticks instead of inside one
/// frame (ST-B1).
pub const DRIVER_LOAD_BLOCKS_PER_CALL: usize = 4;
/// Chunk requests a driven pull keeps in flight: three overlap the
/// source's reads with the staging writes, and a receiver then holds at
/// most two chunks ahead of its cursor plus the one being written, inside
/// ST-B2's four-chunk bound whatever order the answers come in.
pub const DRIVER_CHUNKS_IN_FLIGHT_DEFAULT: u32 = 3;

/// A shard's admission budget for state transfers, shared by the drivers
/// of all its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferSlots {
    receiving: usize,
    serving: usize,
    receiving_max: usize,
    serving_max: usize,
}

impl Default for TransferSlots {
    fn default() -> Self {
        Self::new(
            RECEIVING_TRANSFERS_MAX_DEFAULT,
            SERVING_TRANSFERS_MAX_DEFAULT,
        )
    }
}

impl TransferSlots {
    /// A budget of `receiving_max` pulls and `serving_max` offers.
    pub fn new(receiving_max: usize, serving_max: usize) -> Self {
        Self {
            receiving: 0,
            serving: 0,
            receiving_max,
            serving_max,
        }
    }

    /// Partitions pulling now.
    pub fn receiving(&self) -> usize {
        self.receiving
    }

    /// Offers handed out now.
    pub fn serving(&self) -> usize {
        self.serving
    }

    fn take_receiving(&mut self) -> bool {
        if self.receiving >= self.receiving_max {
            return false;
        }
        self.receiving += 1;
        true
    }

    fn serving_full(&self) -> bool {
        self.serving >= self.serving_max
    }
}

/// What an inbound state-transfer frame must match beyond its codec: the
/// plane-agnostic half of the checks, shared by the partition driver and
/// the metadata group's (shard crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferFrameExpect {
    /// The cluster id every frame carries.
    pub cluster: u128,
    /// The group the receiving driver serves.
    pub group: GroupId,
    /// Ceiling on the frame's size, header included.
    pub frame_size_max: u32,
    /// This replica's index.
    pub local: ReplicaId,
    /// Replicas in the group.
    pub replica_count: u8,
}

/// A state-transfer frame that passed [`check_transfer_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedTransferFrame {
    /// One of the four state-transfer commands.
    pub command: CommandHeader,
    /// The sender's view.
    pub view: u32,
}

/// Decodes `frame` from peer `from` with the header codec (seal, body
/// checksum, command rules) and checks what the codec cannot know: the
/// cluster, that the header's sender is the connection's peer and in the
/// group, the command, and the group. Pure: a refusal changes nothing.
///
/// # Errors
/// The first check that fails, as a [`TransferFrameError`].
pub fn check_transfer_frame(
    frame: &[u8],
    expect: &TransferFrameExpect,
    from: ReplicaId,
) -> Result<CheckedTransferFrame, TransferFrameError> {
    let decoded = decode_frame(frame, expect.frame_size_max)?;
    let h = decoded.header;
    if h.cluster != expect.cluster {
        return Err(TransferFrameError::WrongCluster { cluster: h.cluster });
    }
    if h.replica != from || from == expect.local || from >= ReplicaId(expect.replica_count) {
        return Err(TransferFrameError::Sender {
            claimed: h.replica,
            peer: from,
        });
    }
    let group = match h.command {
        CommandHeader::RequestStateTransfer(c) => c.group,
        CommandHeader::StateTransferTarget(c) => c.group,
        CommandHeader::RequestStateChunk(c) => c.group,
        CommandHeader::StateChunk(c) => c.group,
        other => {
            return Err(TransferFrameError::NotTransferCommand {
                command: other.command() as u8,
            });
        }
    };
    if group != expect.group {
        return Err(TransferFrameError::WrongGroup { group });
    }
    Ok(CheckedTransferFrame {
        command: h.command,
        view: h.view,
    })
}

/// Why an offer's `StateTransferTarget` header was refused against this
/// replica's own view and `commit_max`, before its manifest is read: the
/// descriptor checks both planes' receivers share (a partition's and group
/// 0's), each wrapping this in its own descriptor refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferHeaderRefusal {
    /// The offer's `commit_max` (so its op) is past any op a real log
    /// reaches ([`consensus::vsr::OP_MAX`]): arithmetic on it (the op after
    /// the install, the journal's floor) would overflow.
    OpOutOfRange {
        /// The offer's `commit_max`.
        commit_max: Op,
        /// The largest op accepted.
        max: Op,
    },
    /// The offer claims an op past its own `commit_max`.
    CommitOpPastCommitMax {
        /// The offer's op.
        commit_op: Op,
        /// The offer's `commit_max`.
        commit_max: Op,
    },
    /// The peer is in an older view than this replica.
    ViewBehind {
        /// The peer's view.
        offer_view: u32,
        /// This replica's view.
        local_view: u32,
    },
    /// The peer knows less committed than this replica.
    CommitMaxBehind {
        /// The peer's `commit_max`.
        offer_commit_max: u64,
        /// This replica's `commit_max`.
        local_commit_max: u64,
    },
}

impl fmt::Display for OfferHeaderRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OpOutOfRange { commit_max, max } => write!(
                f,
                "offer commit_max {commit_max} is past the largest op {max}"
            ),
            Self::CommitOpPastCommitMax {
                commit_op,
                commit_max,
            } => write!(
                f,
                "offer at op {commit_op} is past its own commit_max {commit_max}"
            ),
            Self::ViewBehind {
                offer_view,
                local_view,
            } => write!(
                f,
                "offer from view {offer_view} is behind this replica's view {local_view}"
            ),
            Self::CommitMaxBehind {
                offer_commit_max,
                local_commit_max,
            } => write!(
                f,
                "offer peer's commit_max {offer_commit_max} is behind this replica's {local_commit_max}"
            ),
        }
    }
}

impl std::error::Error for OfferHeaderRefusal {}

/// Checks an offer's header, sent in `view`, against this replica
/// (`local`'s view and `commit_max`): its op in range and not past its own
/// `commit_max`, and the peer not behind this replica. Pure; the first
/// check that fails is returned, in the order above.
///
/// # Errors
/// The first check that fails, as an [`OfferHeaderRefusal`].
pub fn check_offer_header(
    view: u32,
    header: &StateTransferTargetHeader,
    local: &LocalFacts,
) -> Result<(), OfferHeaderRefusal> {
    if header.commit_max.0 > consensus::vsr::OP_MAX {
        return Err(OfferHeaderRefusal::OpOutOfRange {
            commit_max: header.commit_max,
            max: Op(consensus::vsr::OP_MAX),
        });
    }
    if header.commit_op > header.commit_max {
        return Err(OfferHeaderRefusal::CommitOpPastCommitMax {
            commit_op: header.commit_op,
            commit_max: header.commit_max,
        });
    }
    if view < local.view {
        return Err(OfferHeaderRefusal::ViewBehind {
            offer_view: view,
            local_view: local.view,
        });
    }
    if header.commit_max < local.commit_max {
        return Err(OfferHeaderRefusal::CommitMaxBehind {
            offer_commit_max: header.commit_max.0,
            local_commit_max: local.commit_max.0,
        });
    }
    Ok(())
}

/// Encodes a state-transfer frame from replica `replica` in `view` (sealed,
/// body checksummed by the header codec).
pub fn encode_transfer_frame(
    cluster: u128,
    view: u32,
    replica: ReplicaId,
    command: CommandHeader,
    body: &[u8],
) -> Bytes {
    let header = FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster,
        size: 0,
        view,
        replica,
        command,
    };
    Bytes::from(encode_frame(&header, body))
}

impl Outgoing {
    /// A state-transfer frame for replica `to`, from `from` in its current
    /// view, encoded by [`encode_transfer_frame`]: the one way both planes'
    /// drivers address a frame, so the sender and view always come from
    /// the replica that sends it.
    pub fn transfer_frame(
        cluster: u128,
        from: &Replica,
        to: ReplicaId,
        command: CommandHeader,
        body: &[u8],
    ) -> Self {
        Self {
            to: to.0,
            frame: encode_transfer_frame(cluster, from.view(), from.replica(), command, body),
        }
    }
}

/// Configuration of a [`TransferDriver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferDriverConfig {
    /// The cluster id every frame carries.
    pub cluster: u128,
    /// The partition's consensus group.
    pub group: GroupId,
    /// Ceiling on an inbound frame's size.
    pub frame_size_max: u32,
    /// The receiving side.
    pub receiver: ReceiverConfig,
    /// The serving side.
    pub server: OfferServerConfig,
    /// The purge generation the metadata plane committed for this
    /// partition, when known: the shard has the group's primary propose
    /// it until the partition applied it.
    pub committed_purge_generation: Option<u64>,
    /// File operations an install carries out per tick
    /// ([`INSTALL_FILE_OPS_PER_STEP`] by default; the simulator varies it
    /// so that installs span many ticks).
    pub install_file_ops_per_step: usize,
}

impl TransferDriverConfig {
    /// Defaults for `group` of `cluster`.
    pub fn new(cluster: u128, group: GroupId) -> Self {
        Self {
            cluster,
            group,
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            receiver: ReceiverConfig {
                chunks_in_flight: DRIVER_CHUNKS_IN_FLIGHT_DEFAULT,
                ..ReceiverConfig::default()
            },
            server: OfferServerConfig::default(),
            committed_purge_generation: None,
            install_file_ops_per_step: INSTALL_FILE_OPS_PER_STEP,
        }
    }
}

/// Why an inbound frame was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferFrameError {
    /// The header codec refused the frame.
    Header(HeaderError),
    /// The frame belongs to another cluster.
    WrongCluster {
        /// The frame's cluster.
        cluster: u128,
    },
    /// The frame belongs to another group.
    WrongGroup {
        /// The frame's group.
        group: GroupId,
    },
    /// The header names a sender other than the connection's peer, or one
    /// outside the group.
    Sender {
        /// The header's replica field.
        claimed: ReplicaId,
        /// The peer the frame came from.
        peer: ReplicaId,
    },
    /// Not one of the four state-transfer commands.
    NotTransferCommand {
        /// The command byte.
        command: u8,
    },
}

impl fmt::Display for TransferFrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(e) => write!(f, "state-transfer frame refused: {e}"),
            Self::WrongCluster { cluster } => {
                write!(f, "state-transfer frame from cluster {cluster:#x}")
            }
            Self::WrongGroup { group } => {
                write!(f, "state-transfer frame for group {:#x}", group.0)
            }
            Self::Sender { claimed, peer } => write!(
                f,
                "state-transfer frame from peer {peer} claims to be from replica {claimed}"
            ),
            Self::NotTransferCommand { command } => {
                write!(f, "command {command} is not a state-transfer command")
            }
        }
    }
}

impl std::error::Error for TransferFrameError {}

impl From<HeaderError> for TransferFrameError {
    fn from(e: HeaderError) -> Self {
        Self::Header(e)
    }
}

/// An encoded frame to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination replica.
    pub to: u8,
    /// Header and body.
    pub frame: Bytes,
}

/// Something an operator (or a test) wants to know about.
#[derive(Debug)]
pub enum TransferEvent {
    /// A session was armed against `peer`.
    Armed {
        /// The serving peer.
        peer: ReplicaId,
    },
    /// An attempt failed; the receiver scheduled a re-arm.
    AttemptFailed(ReceiveError),
    /// A pull completed and installed.
    Installed(PartitionInstallOutcome),
    /// A pull completed but its install failed; the partition converged
    /// and a re-arm is scheduled.
    InstallFailed(PartitionInstallError),
    /// The install's converge failed: the segment files were quarantined
    /// (`quarantine` is where, unless moving them failed too) and the
    /// partition is fenced.
    Fenced {
        /// Why.
        reason: String,
        /// The quarantine directory.
        quarantine: Option<PathBuf>,
    },
    /// The partition stopped needing a transfer; the session was dropped.
    Disarmed,
    /// An offer request was refused (the reason stays here: the frame only
    /// carries the transient flag).
    ServeRefused {
        /// The requester.
        requester: ReplicaId,
        /// Why, or `None` when the shard's serving budget was full.
        reason: Option<PartitionTransferUnavailable>,
    },
}

/// What one call produced.
#[derive(Debug, Default)]
pub struct DriverOutput {
    /// Frames to send.
    pub send: Vec<Outgoing>,
    /// What happened.
    pub events: Vec<TransferEvent>,
}

/// Counters for operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Frames accepted.
    pub frames_in: u64,
    /// Frames refused as [`TransferFrameError`].
    pub frames_refused: u64,
    /// Frames produced.
    pub frames_out: u64,
    /// Offers handed out (first answer per session).
    pub offers_served: u64,
    /// Chunks served.
    pub chunks_served: u64,
    /// Chunk requests answered on a later tick because their chunk lay
    /// further into its artifact than one call loads.
    pub chunks_deferred: u64,
    /// Offer requests refused.
    pub serve_refusals: u64,
    /// Build rounds run on ticks.
    pub tick_build_rounds: u64,
    /// Installs that completed.
    pub installs: u64,
    /// Installs that failed.
    pub install_failures: u64,
    /// Calls that carried an install on, each bounded to
    /// [`TransferDriverConfig::install_file_ops_per_step`] file operations
    /// (one when the pull completes, then one per tick until the install
    /// ends).
    pub install_steps: u64,
}

/// One partition's state-transfer driver.
pub struct TransferDriver<F: Fs> {
    config: TransferDriverConfig,
    receiver: TransferReceiver<F>,
    server: OfferServer,
    /// An offer request was answered "in progress": keep hashing on ticks.
    build_pending: bool,
    /// The floor the live session (or scheduled re-arm) is for.
    armed_floor: Option<Op>,
    /// This driver holds one of the shard's receive slots.
    receive_slot: bool,
    /// Serving sessions this driver counted into the shard's budget.
    serving_counted: usize,
    /// The peer whose pull is being installed, while the partition's
    /// install is in flight (carried on a step per tick; it keeps the
    /// receive slot).
    installing_from: Option<ReplicaId>,
    stats: DriverStats,
}

impl<F: Fs> fmt::Debug for TransferDriver<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferDriver")
            .field("group", &self.config.group)
            .field("session", &self.receiver.session().is_some())
            .field("pending_rearm", &self.receiver.pending_rearm())
            .field("serving", &self.server.session_count())
            .field("build_pending", &self.build_pending)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<F: Fs> TransferDriver<F> {
    /// A driver for the partition in `dir` on `fs`; `seed` draws its
    /// session nonces.
    pub fn new(fs: F, dir: &Path, config: TransferDriverConfig, seed: u64) -> Self {
        Self {
            receiver: TransferReceiver::new(fs, dir, config.receiver, seed),
            server: OfferServer::new(config.server)
                .with_load_blocks_per_call(DRIVER_LOAD_BLOCKS_PER_CALL),
            config,
            build_pending: false,
            armed_floor: None,
            receive_slot: false,
            serving_counted: 0,
            installing_from: None,
            stats: DriverStats::default(),
        }
    }

    /// The receiving side.
    pub fn receiver(&self) -> &TransferReceiver<F> {
        &self.receiver
    }

    /// The serving side.
    pub fn server(&self) -> &OfferServer {
        &self.server
    }

    /// The serving side, mutably (a shard's tests and tools; the driver
    /// itself builds and serves through its frames and ticks).
    pub fn server_mut(&mut self) -> &mut OfferServer {
        &mut self.server
    }

    /// The counters.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Whether `frame` carries one of the four state-transfer commands (by
    /// its command byte; nothing is verified): for routing.
    pub fn is_transfer_frame(frame: &[u8]) -> bool {
        matches!(frame.get(60), Some(22..=25))
    }

    /// The purge generation the metadata plane committed for this
    /// partition, as this driver knows it.
    pub fn committed_purge_generation(&self) -> Option<u64> {
        self.config.committed_purge_generation
    }

    /// Learns a purge generation the metadata plane committed (the
    /// highest one learnt is kept: an effect replayed after a later one
    /// changes nothing).
    pub fn learn_committed_purge_generation(&mut self, generation: u64) {
        let known = self.config.committed_purge_generation.unwrap_or(0);
        self.config.committed_purge_generation = Some(known.max(generation));
    }

    /// Whether a tick would do nothing: no session on either side, no
    /// re-arm counting down, no offer build to continue, no slot held, and
    /// the partition needs no transfer. A shard skips an idle driver's
    /// tick, which is what keeps thousands of quiet groups cheap.
    pub fn is_idle<B: MessageBus, S: SuperblockStore>(
        &self,
        partition: &Partition<B, S, F>,
    ) -> bool {
        !self.build_pending
            && self.installing_from.is_none()
            && self.armed_floor.is_none()
            && !self.receive_slot
            && self.serving_counted == 0
            && self.server.session_count() == 0
            && self.receiver.session().is_none()
            && self.receiver.pending_rearm().is_none()
            && partition.state_transfer_needed().is_none()
    }

    /// Gives back every slot this driver holds (its partition is being
    /// dropped by the shard).
    pub fn release(&mut self, slots: &mut TransferSlots) {
        self.installing_from = None;
        self.receiver.disarm();
        self.server.reset();
        self.sync_slots(slots);
    }

    /// One tick: ages the served offers, continues a pending offer build by
    /// one round, arms a session when the partition needs one and the
    /// shard has room, and ticks the receiver (idle re-requests, re-arm
    /// countdown, preparation of an accepted offer).
    pub async fn on_tick<B, S, C>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        slots: &mut TransferSlots,
        clock: &C,
    ) -> DriverOutput
    where
        B: MessageBus,
        S: SuperblockStore,
        C: BuildClock,
    {
        let mut out = DriverOutput::default();
        if partition.fenced().is_some() {
            self.stop(slots);
            return out;
        }
        if let Some(peer) = self.installing_from {
            // An install in flight is all this partition does until it
            // ends: one bounded step per tick.
            self.advance_install(partition, peer, &mut out).await;
            self.sync_slots(slots);
            return out;
        }
        self.serve_tick(partition, clock, &mut out).await;
        self.receive_tick(partition, slots, &mut out).await;
        if self.receiver.session().is_some() {
            partition.hold_state_transfer();
        }
        self.sync_slots(slots);
        out
    }

    /// The serving side's tick: offers age, loads advance, and a pending
    /// offer build runs one more round.
    async fn serve_tick<B, S, C>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        clock: &C,
        out: &mut DriverOutput,
    ) where
        B: MessageBus,
        S: SuperblockStore,
        C: BuildClock,
    {
        self.server.on_tick();
        for (requester, nonce, answer) in self.server.advance_loads(partition.fs()).await {
            self.push_chunk_answer(partition, requester, nonce, answer, out);
        }
        if self.build_pending {
            self.stats.tick_build_rounds += 1;
            match partition
                .build_state_transfer_offer(self.server.builder_mut(), clock)
                .await
            {
                Err(PartitionTransferUnavailable::OfferBuildInProgress { .. }) => {}
                Ok(_) | Err(_) => self.build_pending = false,
            }
        }
    }

    /// The receiving side's tick: arms, re-arms or ticks the receiver while
    /// the partition needs a transfer, and disarms it once it does not.
    async fn receive_tick<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        slots: &mut TransferSlots,
        out: &mut DriverOutput,
    ) {
        let facts = LocalFacts::of(partition);
        // The core stops reporting the need while it retries repair between
        // FloorRefused conclusions; a session survives that, and is only
        // dropped once the applied point passed the floor it was armed for
        // (repair found the ops after all).
        let need = partition.state_transfer_needed().or_else(|| {
            let floor = self.armed_floor?;
            (partition.replica().commit_min() < floor).then_some(StateTransferNeeded {
                peer: facts.primary,
                floor,
                to_op: facts.commit_max,
            })
        });
        match need {
            None => {
                self.armed_floor = None;
                if self.receiver.session().is_some() || self.receiver.pending_rearm().is_some() {
                    self.receiver.disarm();
                    out.events.push(TransferEvent::Disarmed);
                }
            }
            Some(need) => {
                self.armed_floor = Some(need.floor);
                let idle = self.receiver.session().is_none();
                match self.receiver.pending_rearm() {
                    None if idle => {
                        if self.take_receive_slot(slots) {
                            let request = self.receiver.arm(need.peer);
                            out.events.push(TransferEvent::Armed { peer: need.peer });
                            self.push_request(partition, request, out);
                        }
                    }
                    // A re-arm about to fire needs a slot first; without
                    // one its countdown waits at its last tick.
                    Some(rearm) if idle && rearm.after_ticks <= 1 => {
                        if self.take_receive_slot(slots) {
                            let step = self.receiver.on_tick(&facts).await;
                            if let ReceiveStep::Send(TransferRequest::Descriptor { peer, .. }) =
                                &step
                            {
                                out.events.push(TransferEvent::Armed { peer: *peer });
                            }
                            self.on_step(partition, step, out).await;
                        }
                    }
                    _ => {
                        let step = self.receiver.on_tick(&facts).await;
                        self.on_step(partition, step, out).await;
                    }
                }
            }
        }
    }

    /// One inbound frame from replica `from`.
    ///
    /// # Errors
    /// [`TransferFrameError`] when the frame is refused; nothing changed.
    pub async fn on_frame<B, S, C>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        slots: &mut TransferSlots,
        from: u8,
        frame: Bytes,
        clock: &C,
    ) -> Result<DriverOutput, TransferFrameError>
    where
        B: MessageBus,
        S: SuperblockStore,
        C: BuildClock,
    {
        let (header, view) = match self.check_frame(partition, from, &frame) {
            Ok(checked) => checked,
            Err(e) => {
                self.stats.frames_refused += 1;
                tracing::warn!(peer = from, group = %self.config.group, error = %e, "state-transfer frame refused");
                return Err(e);
            }
        };
        self.stats.frames_in += 1;
        let mut out = DriverOutput::default();
        if partition.fenced().is_some() {
            self.stop(slots);
            return Ok(out);
        }
        if self.installing_from.is_some() {
            // Its log is being swapped: nothing to serve from, and its own
            // pull is over. A requester times out and asks again.
            return Ok(out);
        }
        match header {
            CommandHeader::RequestStateTransfer(h) => {
                self.serve_offer(partition, slots, from, h.nonce, clock, &mut out)
                    .await;
            }
            CommandHeader::RequestStateChunk(h) => {
                self.serve_chunk(partition, from, &h, &mut out).await;
            }
            CommandHeader::StateTransferTarget(h) => {
                let body = &frame[HEADER_SIZE..];
                let facts = LocalFacts::of(partition);
                let step = self.receiver.on_target(from, view, &h, body, &facts).await;
                self.on_step(partition, step, &mut out).await;
            }
            CommandHeader::StateChunk(h) => {
                let payload = frame.slice(HEADER_SIZE..);
                let facts = LocalFacts::of(partition);
                let step = self
                    .receiver
                    .on_chunk(from, h.nonce, h.artifact, h.offset, payload, &facts)
                    .await;
                self.on_step(partition, step, &mut out).await;
            }
            other => {
                // `check_frame` let only the four commands through.
                return Err(TransferFrameError::NotTransferCommand {
                    command: other.command() as u8,
                });
            }
        }
        self.sync_slots(slots);
        Ok(out)
    }

    /// Decodes `frame` and checks what the codec cannot: cluster, group,
    /// sender, command.
    fn check_frame<B: MessageBus, S: SuperblockStore>(
        &self,
        partition: &Partition<B, S, F>,
        from: u8,
        frame: &[u8],
    ) -> Result<(CommandHeader, u32), TransferFrameError> {
        let checked = check_transfer_frame(
            frame,
            &TransferFrameExpect {
                cluster: self.config.cluster,
                group: self.config.group,
                frame_size_max: self.config.frame_size_max,
                local: partition.replica().replica(),
                replica_count: partition.config().vsr.replica_count,
            },
            ReplicaId(from),
        )?;
        Ok((checked.command, checked.view))
    }

    /// Answers a descriptor request: the offer, or a refusal.
    async fn serve_offer<B, S, C>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        slots: &TransferSlots,
        requester: u8,
        nonce: u128,
        clock: &C,
        out: &mut DriverOutput,
    ) where
        B: MessageBus,
        S: SuperblockStore,
        C: BuildClock,
    {
        let known = self
            .server
            .session_offer(ReplicaId(requester), nonce)
            .is_some();
        if !known && !self.server.serves(ReplicaId(requester)) && slots.serving_full() {
            self.stats.serve_refusals += 1;
            tracing::info!(
                requester,
                serving = slots.serving(),
                "state-transfer offer refused: the shard's serving budget is full"
            );
            out.events.push(TransferEvent::ServeRefused {
                requester: ReplicaId(requester),
                reason: None,
            });
            self.push_refusal(partition, ReplicaId(requester), nonce, true, out);
            return;
        }
        match self
            .server
            .on_request_state_transfer(partition, ReplicaId(requester), nonce, clock)
            .await
        {
            Ok(offer) => {
                self.build_pending = false;
                if !known {
                    self.stats.offers_served += 1;
                }
                let commit_max = partition.replica().commit_max();
                let target = StateTransferTargetHeader {
                    nonce,
                    commit_op: offer.commit_op(),
                    group: self.config.group,
                    available: true,
                    unavailable_transient: false,
                    commit_max: commit_max.max(offer.commit_op()),
                };
                let body = offer.encoded_manifest().clone();
                self.push(
                    partition,
                    ReplicaId(requester),
                    CommandHeader::StateTransferTarget(target),
                    &body,
                    out,
                );
            }
            Err(reason) => {
                self.stats.serve_refusals += 1;
                self.build_pending = matches!(
                    reason,
                    PartitionTransferUnavailable::OfferBuildInProgress { .. }
                );
                let transient = reason.transient();
                tracing::debug!(requester, %reason, transient, "state-transfer offer refused");
                self.push_refusal(partition, ReplicaId(requester), nonce, transient, out);
                out.events.push(TransferEvent::ServeRefused {
                    requester: ReplicaId(requester),
                    reason: Some(reason),
                });
            }
        }
    }

    /// Answers a chunk request: the chunk, nothing, or a refusal.
    async fn serve_chunk<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &Partition<B, S, F>,
        requester: u8,
        h: &RequestStateChunkHeader,
        out: &mut DriverOutput,
    ) {
        let request = ChunkRequest {
            requester: ReplicaId(requester),
            nonce: h.nonce,
            artifact: h.artifact,
            offset: h.offset,
            len: h.len,
        };
        let answer = self
            .server
            .on_request_state_chunk(partition.fs(), request)
            .await;
        self.push_chunk_answer(partition, ReplicaId(requester), h.nonce, answer, out);
    }

    /// Sends what a chunk request earned: the chunk, nothing, or a refusal.
    fn push_chunk_answer<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &Partition<B, S, F>,
        requester: ReplicaId,
        nonce: u128,
        answer: ChunkAnswer,
        out: &mut DriverOutput,
    ) {
        match answer {
            ChunkAnswer::Chunk(chunk) => {
                self.stats.chunks_served += 1;
                let header = StateChunkHeader {
                    nonce,
                    offset: chunk.offset,
                    group: self.config.group,
                    artifact: chunk.artifact,
                };
                self.push(
                    partition,
                    requester,
                    CommandHeader::StateChunk(header),
                    &chunk.payload,
                    out,
                );
            }
            ChunkAnswer::Loading => self.stats.chunks_deferred += 1,
            ChunkAnswer::Ignore => {}
            ChunkAnswer::Refuse(refusal) => {
                tracing::info!(requester = requester.0, %refusal, "state-transfer chunk refused");
                self.push_refusal(partition, requester, nonce, refusal.transient(), out);
            }
        }
    }

    /// Acts on what the receiver said.
    async fn on_step<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        step: ReceiveStep,
        out: &mut DriverOutput,
    ) {
        match step {
            ReceiveStep::Send(request) => {
                self.push_request(partition, request, out);
                // A window tops itself up after every request it sent.
                for more in self.receiver.fill_window() {
                    self.push_request(partition, more, out);
                }
            }
            ReceiveStep::Complete(done) => {
                let peer = done.peer;
                let input = InstallInput::from_received(&done, UNKNOWN_CHECKSUM);
                drop(done);
                match partition.begin_install(input).await {
                    Ok(()) => {
                        self.installing_from = Some(peer);
                        // A short chain installs in this call.
                        self.advance_install(partition, peer, out).await;
                    }
                    Err(e) => self.on_install_end(partition, peer, Err(e), out).await,
                }
            }
            ReceiveStep::Failed(e) => out.events.push(TransferEvent::AttemptFailed(e)),
            ReceiveStep::Wait => {
                // A chunk that landed may have freed window room without a
                // request of its own (it was held, or the cursor's request
                // is already out).
                for more in self.receiver.fill_window() {
                    self.push_request(partition, more, out);
                }
            }
            ReceiveStep::Ignored(_) => {}
        }
    }

    /// Carries the partition's install one step on; reports its end.
    async fn advance_install<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        peer: ReplicaId,
        out: &mut DriverOutput,
    ) {
        self.stats.install_steps += 1;
        let budget = self.config.install_file_ops_per_step;
        if let Poll::Ready(result) = partition.advance_install(budget).await {
            self.installing_from = None;
            self.on_install_end(partition, peer, result, out).await;
        }
    }

    /// What an ended install (or one refused at its start) leaves to do.
    async fn on_install_end<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &mut Partition<B, S, F>,
        peer: ReplicaId,
        result: Result<PartitionInstallOutcome, PartitionInstallError>,
        out: &mut DriverOutput,
    ) {
        match result {
            Ok(outcome) => {
                self.stats.installs += 1;
                self.armed_floor = None;
                self.receiver.record_install_completed();
                // The chain the memos and offers describe is gone.
                self.server.reset();
                self.build_pending = false;
                out.events.push(TransferEvent::Installed(outcome));
            }
            Err(PartitionInstallError::ConvergeFailed { source, frontier }) => {
                self.stats.install_failures += 1;
                let reason = format!(
                    "state-transfer install converge failed at frontier {frontier}: {source}"
                );
                let quarantine = match partition.fence_segment_files(&reason).await {
                    Ok(path) => Some(path),
                    Err(e) => {
                        tracing::error!(dir = %partition.dir().display(), error = %e, "quarantining the fenced partition's segment files failed");
                        None
                    }
                };
                self.receiver.disarm();
                self.server.reset();
                out.events
                    .push(TransferEvent::Fenced { reason, quarantine });
            }
            Err(e) => {
                self.stats.install_failures += 1;
                // Success or not (install.rs): a converge replaced the
                // chain the memos and the cached offer describe; a
                // check-phase refusal changed nothing, and the next build
                // only re-hashes.
                self.server.reset();
                self.build_pending = false;
                let facts = LocalFacts::of(partition);
                self.receiver.record_install_failed(peer, &facts);
                out.events.push(TransferEvent::InstallFailed(e));
            }
        }
    }

    fn push_request<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &Partition<B, S, F>,
        request: TransferRequest,
        out: &mut DriverOutput,
    ) {
        let group = self.config.group;
        let (to, command) = match request {
            TransferRequest::Descriptor { peer, nonce } => (
                peer,
                CommandHeader::RequestStateTransfer(RequestStateTransferHeader { nonce, group }),
            ),
            TransferRequest::Chunk {
                peer,
                nonce,
                artifact,
                offset,
                len,
            } => (
                peer,
                CommandHeader::RequestStateChunk(RequestStateChunkHeader {
                    nonce,
                    offset,
                    group,
                    len,
                    artifact,
                }),
            ),
        };
        self.push(partition, to, command, &[], out);
    }

    fn push_refusal<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &Partition<B, S, F>,
        to: ReplicaId,
        nonce: u128,
        transient: bool,
        out: &mut DriverOutput,
    ) {
        let target = StateTransferTargetHeader {
            nonce,
            commit_op: Op(0),
            group: self.config.group,
            available: false,
            unavailable_transient: transient,
            commit_max: Op(partition.replica().commit_max().0),
        };
        self.push(
            partition,
            to,
            CommandHeader::StateTransferTarget(target),
            &[],
            out,
        );
    }

    fn push<B: MessageBus, S: SuperblockStore>(
        &mut self,
        partition: &Partition<B, S, F>,
        to: ReplicaId,
        command: CommandHeader,
        body: &[u8],
        out: &mut DriverOutput,
    ) {
        self.stats.frames_out += 1;
        out.send.push(Outgoing::transfer_frame(
            self.config.cluster,
            partition.replica(),
            to,
            command,
            body,
        ));
    }

    fn take_receive_slot(&mut self, slots: &mut TransferSlots) -> bool {
        if self.receive_slot {
            return true;
        }
        self.receive_slot = slots.take_receiving();
        self.receive_slot
    }

    /// Brings the shard's counts in line with this driver's sessions.
    fn sync_slots(&mut self, slots: &mut TransferSlots) {
        if self.receive_slot && self.receiver.session().is_none() && self.installing_from.is_none()
        {
            self.receive_slot = false;
            slots.receiving = slots.receiving.saturating_sub(1);
        }
        let serving = self.server.session_count();
        slots.serving = slots
            .serving
            .saturating_sub(self.serving_counted)
            .saturating_add(serving);
        self.serving_counted = serving;
    }

    fn stop(&mut self, slots: &mut TransferSlots) {
        self.build_pending = false;
        self.installing_from = None;
        self.receiver.disarm();
        self.server.reset();
        self.sync_slots(slots);
    }
}
