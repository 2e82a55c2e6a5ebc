//! [`MetadataGroup`]: one replica of consensus group 0, driving the VSR
//! [`Replica`] the way `partitions::Partition` drives a partition group.
//!
//! Inputs: frames from peers ([`MetadataGroup::on_frame`]), ticks
//! ([`MetadataGroup::on_tick`]) and client requests
//! ([`MetadataGroup::register`], [`MetadataGroup::submit`]). The core's
//! actions are carried out at once:
//!
//! - `PersistState` → the superblock (`journal::Superblock`), then
//!   [`Replica::on_persisted`] with the values written; a failed write is
//!   retried on the next tick while the core keeps holding its sends;
//! - `Apply` → [`MetadataStore::commit`]: the op is appended to the
//!   metadata WAL and synced, then applied; its effects are queued for the
//!   shard ([`MetadataGroup::take_effects`]) and its outcome rides on the
//!   client's reply. A Register, or a request the client table recognises
//!   as already committed at an earlier op (`duplicate`), occupies its op
//!   number with an empty WAL entry and changes nothing, so a request
//!   retried across a view change takes effect once;
//! - `Send` / `Reply` → the [`MetadataBus`].
//!
//! Durability: the core emits a committed op's `Apply` before its `Reply`,
//! and the apply awaits the WAL sync, so the client is answered only after
//! the primary made the op durable; a backup makes it durable when it
//! applies it (ops a backup only journaled live in its memory, as the
//! `replicated` mode of SPEC §6.1 has it for this plane).
//!
//! Effects come only from `Apply`, which the core emits once per committed
//! op per replica, in op order; the store refuses an op at or below the
//! applied one. That is the whole exactly-once argument.
//!
//! A restart resumes from the store's applied op and its prepare identity
//! (recorded in every WAL entry and in the snapshot). The client table is
//! not durable: a restarted replica rebuilds only the sessions of the ops
//! it re-applies from peers (as on the partition plane).
//!
//! A replica behind every peer's retention is told so by the core
//! (`Effect::StartStateTransfer`, reported by
//! [`MetadataGroup::state_transfer_needed`]); the shard pulls a caught-up
//! primary's [`MetadataGroup::transfer_offer`] over the chunk protocol and
//! installs it with [`MetadataGroup::install_transfer`] (snapshot and client
//! table, so dedup survives the transfer). The chunk session over the bus
//! is the shard's (`shard::metadata_transfer`).

use std::collections::VecDeque;
use std::fmt;

use bytes::Bytes;
use common::{Op, ReplicaId};
use consensus::vsr::{
    Action, AppliedState, Config as VsrConfig, DurableState, Effect, Frame, FrameError, Handled,
    LoggedJournal, OPERATION_APPEND, OPERATION_REGISTER, Prepare, Replica, Reply, Request,
    RequestOutcome,
};
use journal::{
    REPLICA_LOG_FILE, Replayed, ReplicaLog, ReplicaLogError, Superblock, SuperblockError,
    SuperblockStore, VsrState,
};
use storage::fs::Fs;

use consensus::verify_state_artifact;
use consensus::{ArtifactKind, StateArtifact};

use crate::client_table_artifact::{
    ClientTableDecodeError, decode_client_table, encode_client_table,
};
use crate::effect::{PartitionEffect, reconcile_effects};
use crate::op::MetadataOp;
use crate::op_codec::OpEncodeError;
use crate::refusal::Refusal;
use crate::snapshot::{SnapshotDecodeError, decode_snapshot, encode_snapshot};
use crate::state::{MetadataState, Outcome};
use crate::store::{MetadataStore, OpOrigin, StoreError};

/// How many applied outcomes are kept for replies not yet sent.
const OUTCOMES_KEPT: usize = 64;

/// Where a metadata replica's outputs go.
pub trait MetadataBus {
    /// Sends `frame` to replica `to` of group 0.
    fn send_to_replica(&self, to: u8, frame: Frame);
    /// Delivers a reply to its client.
    fn send_to_client(&self, reply: MetadataReply);
}

/// A reply and, when the request was applied here, what the op did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataReply {
    /// The core's reply.
    pub reply: Reply,
    /// `Some(Ok)` for an accepted op, `Some(Err)` for a refused one, `None`
    /// for a Register or a reply from the client table.
    pub outcome: Option<Result<Outcome, Refusal>>,
}

/// An effect with the op that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedEffect {
    /// The committed op.
    pub op: Op,
    /// What the partition plane must do.
    pub effect: PartitionEffect,
}

/// Why the group could not go on or refused an input.
#[derive(Debug)]
pub enum GroupError {
    /// The superblock could not be opened.
    Superblock(SuperblockError),
    /// The store refused to commit an op the core committed: the replica
    /// stops (fenced) rather than diverge.
    Store(StoreError),
    /// The op cannot be encoded.
    Encode(OpEncodeError),
    /// A frame from a peer was dropped.
    Frame(FrameError),
    /// The store holds ops but not the identity of the last one (it was
    /// written outside replication): the hash chain cannot continue.
    AppliedIdentityUnknown {
        /// The store's applied op.
        applied: Op,
    },
    /// An earlier store failure fenced this replica.
    Fenced,
    /// The replica log could not be opened, written or synced (the step's
    /// frames, which vouch for it, were not sent).
    ReplicaLog(ReplicaLogError),
    /// A state-transfer offer was refused.
    Transfer(TransferError),
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Superblock(e) => write!(f, "metadata superblock: {e}"),
            Self::Store(e) => write!(f, "metadata store: {e}"),
            Self::Encode(e) => write!(f, "metadata op: {e}"),
            Self::Frame(e) => write!(f, "metadata frame dropped: {e}"),
            Self::AppliedIdentityUnknown { applied } => write!(
                f,
                "the metadata store holds ops up to {} without the last one's prepare identity",
                applied.0
            ),
            Self::Fenced => f.write_str("the metadata replica is fenced after a store failure"),
            Self::Transfer(e) => write!(f, "metadata state transfer: {e}"),
            Self::ReplicaLog(e) => write!(f, "metadata {e}"),
        }
    }
}

impl std::error::Error for GroupError {}

/// A state transfer the core asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferNeeded {
    /// The peer to transfer from.
    pub peer: ReplicaId,
    /// The highest op below every peer's retained range.
    pub floor: Op,
    /// The op repair was trying to reach.
    pub to_op: Op,
}

/// What a caught-up primary serves to a replica behind its peers'
/// retention: the manifest (a `METADATA_SNAPSHOT` artifact whose frontier
/// is the applied op, then a `CLIENT_TABLE` artifact at the same op) and
/// the artifacts' bytes in manifest order. The chunk protocol of
/// `consensus::chunk` carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataOffer {
    /// The op the snapshot is at.
    pub commit_op: Op,
    /// The manifest.
    pub manifest: Vec<StateArtifact>,
    /// The artifacts: the snapshot (docs/formats.md §13.3), then the
    /// client table (§13.5).
    pub artifacts: Vec<Vec<u8>>,
}

/// Why an offer could not be served or installed. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// Only a caught-up primary serves, or a caught-up backup its view's
    /// primary (another backup may be behind).
    NotCaughtUpPrimary,
    /// Nothing is committed yet (a view-0 phantom could wipe a peer).
    NothingCommitted,
    /// The manifest is not a metadata snapshot then a client table at the
    /// same op, or the artifacts do not match it in number.
    UnexpectedManifest,
    /// The client-table artifact does not decode or install.
    ClientTable(ClientTableDecodeError),
    /// The client table does not fit this replica's.
    ClientTableRefused,
    /// The bytes do not match the manifest's length and checksum.
    ArtifactMismatch,
    /// The snapshot does not decode.
    Snapshot(SnapshotDecodeError),
    /// The snapshot's op is not the manifest's frontier.
    FrontierMismatch {
        /// The manifest's frontier.
        frontier: Op,
        /// The snapshot's applied op.
        applied: Op,
    },
    /// The offer is not ahead of what this replica applied.
    StaleTransfer {
        /// The offer's op.
        offer: Op,
        /// This replica's applied op.
        applied: Op,
    },
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotCaughtUpPrimary => f.write_str("only a caught-up primary serves metadata"),
            Self::NothingCommitted => f.write_str("nothing is committed to transfer"),
            Self::UnexpectedManifest => {
                f.write_str("the manifest is not a metadata snapshot and a client table at one op")
            }
            Self::ClientTable(e) => write!(f, "the transferred client table is unusable: {e}"),
            Self::ClientTableRefused => {
                f.write_str("the transferred client table does not fit this replica's")
            }
            Self::ArtifactMismatch => f.write_str("the snapshot bytes do not match the manifest"),
            Self::Snapshot(e) => write!(f, "the transferred snapshot is unusable: {e}"),
            Self::FrontierMismatch { frontier, applied } => write!(
                f,
                "the manifest names op {frontier} but the snapshot is at op {applied}"
            ),
            Self::StaleTransfer { offer, applied } => write!(
                f,
                "the offer at op {offer} is not ahead of the applied op {applied}"
            ),
        }
    }
}

impl std::error::Error for TransferError {}

/// One replica of the metadata plane.
pub struct MetadataGroup<F: Fs, S: SuperblockStore, B: MetadataBus> {
    replica: Replica,
    store: MetadataStore<F>,
    durable: Superblock<S>,
    bus: B,
    effects: Vec<CommittedEffect>,
    outcomes: VecDeque<(u64, Result<Outcome, Refusal>)>,
    persist_failed: bool,
    fenced: bool,
    transfer_needed: Option<TransferNeeded>,
    /// With peers, the durable log of the core's journal, written and
    /// synced after each step before its frames leave (docs/consensus.md
    /// §4, "Resume from a durable journal").
    replica_log: Option<ReplicaLog<F>>,
    /// The current step's frames, held until the log holds what they
    /// vouch for.
    held_frames: Vec<(u8, Frame)>,
}

impl<F: Fs, S: SuperblockStore, B: MetadataBus> fmt::Debug for MetadataGroup<F, S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataGroup")
            .field("replica", &self.replica.replica())
            .field("view", &self.replica.view())
            .field("applied", &self.store.applied())
            .finish_non_exhaustive()
    }
}

impl<F: Fs, S: SuperblockStore, B: MetadataBus> MetadataGroup<F, S, B> {
    /// A replica of group 0 over its store and superblock. A new group (an
    /// empty store and superblock) starts in view 0; otherwise the replica
    /// restarts from the superblock's views and the store's applied op,
    /// its hash chain continuing from that op's identity. With peers it
    /// comes back quorum-invisible and repairs the ops after its applied
    /// one from them (docs/consensus.md, "Restart rule").
    pub async fn open(
        config: VsrConfig,
        cluster: u128,
        store: MetadataStore<F>,
        superblock: S,
        bus: B,
    ) -> Result<Self, GroupError> {
        Self::open_rejoining(config, cluster, store, superblock, bus, false).await
    }

    /// As [`Self::open`]; with `rejoin`, an empty store and superblock
    /// belong to a replica whose disk was replaced (it may have
    /// acknowledged ops in an earlier life), so it starts under the restart
    /// rule from nothing — quorum-invisible until caught up — instead of
    /// as a new group. Ignored for a single replica.
    pub async fn open_rejoining(
        config: VsrConfig,
        cluster: u128,
        store: MetadataStore<F>,
        superblock: S,
        bus: B,
        rejoin: bool,
    ) -> Result<Self, GroupError> {
        let initial = VsrState {
            cluster,
            replica_id: config.replica,
            replica_count: config.replica_count,
            ..VsrState::default()
        };
        // New only if no superblock record was ever written: the first
        // open writes one (durably) before the replica can act, so a
        // record of view 0 with nothing committed means a replica that
        // may have prepared or acknowledged ops in view 0 and lost them
        // with its memory-only journal. Restarting it as new would let it
        // lead view 0 again from an empty log and reuse op numbers its
        // peers hold (and may have committed) with other contents
        // (replog-sim seed 359, mixed profile).
        let (never_written, durable) = open_superblock(superblock, initial).await?;
        let sb = *durable.state();
        let applied = store.applied();
        let rejoining = rejoin && config.replica_count > 1 && never_written && applied == Op(0);
        if rejoining {
            tracing::warn!(
                replica = config.replica.0,
                "metadata group rejoining with an empty directory: out of every quorum until caught up"
            );
        }
        let fresh = never_written && applied == Op(0) && !rejoining;
        let (replica_log, logged) = open_replica_log(&config, &store).await?;
        let replica = if fresh {
            Replica::new(config)
        } else {
            restart_replica(config, &store, &sb, rejoin, logged.as_ref()).await?
        };
        Ok(Self {
            replica,
            store,
            durable,
            bus,
            effects: Vec::new(),
            outcomes: VecDeque::new(),
            persist_failed: false,
            fenced: false,
            transfer_needed: None,
            replica_log,
            held_frames: Vec::new(),
        })
    }

    /// The VSR core.
    pub const fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The applied metadata state.
    pub const fn state(&self) -> &MetadataState {
        self.store.state()
    }

    /// The durable store.
    pub const fn store(&self) -> &MetadataStore<F> {
        &self.store
    }

    /// Called last when the replica stops cleanly: records that group 0
    /// here is `Normal` in a view whose log it installed with nothing
    /// acknowledged past its applied op, so the next boot resumes it as a
    /// full member (`journal::clean_stop`). Returns whether it recorded.
    ///
    /// # Errors
    /// The record's write failed (nothing usable is left behind).
    pub async fn record_clean_stop(&mut self) -> Result<bool, GroupError> {
        let r = &self.replica;
        let sb = *self.durable.state();
        let applied = self.store.applied().0;
        let clean = r.replica_count() > 1
            && !self.fenced
            && !self.persist_failed
            && self.transfer_needed.is_none()
            && r.status() == consensus::vsr::Status::Normal
            && r.log_view() == r.view()
            && r.op() == r.commit_min()
            && r.commit_min().0 == applied
            && sb.view == r.view()
            && sb.log_view == r.log_view()
            && sb.commit_max.0 <= applied;
        if !clean {
            return Ok(false);
        }
        let stop = journal::CleanStop {
            view: sb.view,
            log_view: sb.log_view,
            op: Op(applied),
            checksum: self.store.state().applied_identity(),
        };
        journal::record_clean_stop(self.store.fs(), self.store.dir(), &stop)
            .await
            .map_err(|source| {
                GroupError::Store(crate::store::StoreError::Io {
                    step: "write the clean-stop record",
                    path: self.store.dir().join(journal::CLEAN_STOP_FILE),
                    source,
                })
            })?;
        Ok(true)
    }

    /// The store, for snapshots between inputs.
    pub fn store_mut(&mut self) -> &mut MetadataStore<F> {
        &mut self.store
    }

    /// The effects applied since the last call, in op order.
    pub fn take_effects(&mut self) -> Vec<CommittedEffect> {
        std::mem::take(&mut self.effects)
    }

    /// Keeps the core waiting while the shard pulls an offer (no commit
    /// walk, no acknowledgements), so the offer is not overtaken.
    pub fn hold_state_transfer(&mut self) {
        self.replica.hold_state_transfer();
    }

    /// A state transfer the core asked for and still needs, if any. The
    /// core gives a `FloorRefused` conclusion up after a while and retries
    /// repair; once that brought it past the floor the need is gone, and a
    /// stale one would keep the primary refusing every op as "transfer in
    /// progress" for good (replog-sim seed 3000036, mixed).
    pub fn state_transfer_needed(&self) -> Option<TransferNeeded> {
        self.transfer_needed
            .filter(|t| self.replica.is_transferring() || self.replica.commit_min() < t.floor)
    }

    /// Serves the applied state as a state-transfer offer (only a caught-up
    /// primary; [`Self::transfer_offer_to`] when the requester is known).
    pub fn transfer_offer(&self) -> Result<MetadataOffer, TransferError> {
        self.offer_gated(self.replica.serves_applied_state())
    }

    /// Serves the applied state as a state-transfer offer to `requester`,
    /// by the partition plane's rule (ST-S1, docs/state-transfer.md §2): a
    /// primary with everything it knows committed applied serves anyone; a
    /// backup serves its view's primary when it is `Normal`; a member of a
    /// view change serves anyone — each quorum-visible, not transferring
    /// itself, with everything it knows committed applied. A primary
    /// missing ops no peer retains can only be served by a backup (mixed
    /// seed 950 on group 0), and while no view forms there is no primary
    /// at all (mixed 23004582: group 0's replica needing a transfer asked
    /// a primary that could not serve, for ever).
    pub fn transfer_offer_to(&self, requester: ReplicaId) -> Result<MetadataOffer, TransferError> {
        let r = &self.replica;
        self.offer_gated(r.serves_applied_state() || r.serves_transfer_as_non_primary(requester))
    }

    fn offer_gated(&self, may_serve: bool) -> Result<MetadataOffer, TransferError> {
        if !may_serve || self.fenced || self.state_transfer_needed().is_some() {
            return Err(TransferError::NotCaughtUpPrimary);
        }
        let applied = self.store.applied();
        if applied == Op(0) {
            return Err(TransferError::NothingCommitted);
        }
        let snapshot = encode_snapshot(self.store.state());
        let clients = encode_client_table(&self.replica.client_table().export());
        let manifest = vec![
            StateArtifact::for_bytes(
                ArtifactKind::MetadataSnapshot { commit_op: applied },
                &snapshot,
            ),
            StateArtifact::for_bytes(ArtifactKind::ClientTable { commit_op: applied }, &clients),
        ];
        Ok(MetadataOffer {
            commit_op: applied,
            manifest,
            artifacts: vec![snapshot, clients],
        })
    }

    /// Installs a transferred snapshot: checked whole first (manifest,
    /// artifact checksum, decode, frontier, ahead of the applied op), then
    /// made durable by the store, then the core's floor is lifted to it.
    /// Returns the effects that bring the partition plane from the old
    /// state to the new (the ops in between were never applied here one
    /// by one); they are also queued for [`Self::take_effects`].
    pub async fn install_transfer(
        &mut self,
        manifest: &[StateArtifact],
        artifacts: &[Vec<u8>],
    ) -> Result<Vec<PartitionEffect>, GroupError> {
        self.check_fenced()?;
        let refuse = |e| Err(GroupError::Transfer(e));
        let ([snap, table], [snapshot, clients]) = (manifest, artifacts) else {
            return refuse(TransferError::UnexpectedManifest);
        };
        let (
            ArtifactKind::MetadataSnapshot {
                commit_op: snapshot_op,
            },
            ArtifactKind::ClientTable {
                commit_op: table_op,
            },
        ) = (snap.kind, table.kind)
        else {
            return refuse(TransferError::UnexpectedManifest);
        };
        if table_op != snapshot_op {
            return refuse(TransferError::UnexpectedManifest);
        }
        if !verify_state_artifact(snap, snapshot) || !verify_state_artifact(table, clients) {
            return refuse(TransferError::ArtifactMismatch);
        }
        let state = decode_snapshot(snapshot)
            .map_err(|e| GroupError::Transfer(TransferError::Snapshot(e)))?;
        let watermarks = decode_client_table(clients)
            .map_err(|e| GroupError::Transfer(TransferError::ClientTable(e)))?;
        if state.applied() != snapshot_op {
            return refuse(TransferError::FrontierMismatch {
                frontier: snapshot_op,
                applied: state.applied(),
            });
        }
        let applied = self.store.applied();
        if state.applied() <= applied || state.applied() < self.replica.commit_min() {
            return Err(GroupError::Transfer(TransferError::StaleTransfer {
                offer: state.applied(),
                applied,
            }));
        }
        // Checked on a copy first, so a refusal changes nothing.
        let mut table = self.replica.client_table().clone();
        if table.install(&watermarks).is_err() {
            return refuse(TransferError::ClientTableRefused);
        }
        let effects = reconcile_effects(self.store.state(), &state);
        let (op, identity) = (state.applied(), state.applied_identity());
        // The replica log's ops chain from the applied op the install
        // replaces: withdrawn first, so a crash never resumes them on the
        // installed state (the next step's record vouches again).
        if let Some(log) = self.replica_log.as_mut() {
            log.withdraw(self.store.fs())
                .await
                .map_err(GroupError::ReplicaLog)?;
        }
        // Durable first: a crash after this boots the installed state.
        self.store.install(state).await.map_err(|e| {
            self.fenced = true;
            GroupError::Store(e)
        })?;
        *self.replica.client_table_mut() = table;
        self.replica.set_commit_floor(op, identity);
        self.replica.set_sequence(op);
        self.replica.clear_pipeline();
        self.replica.advance_commit_max(op);
        self.replica.finish_state_transfer();
        self.transfer_needed = None;
        self.outcomes.clear();
        self.effects
            .extend(effects.iter().map(|effect| CommittedEffect {
                op,
                effect: effect.clone(),
            }));
        tracing::info!(op = op.0, "metadata state transfer installed");
        self.drive().await?;
        Ok(effects)
    }

    /// Whether a store failure stopped this replica.
    pub const fn is_fenced(&self) -> bool {
        self.fenced
    }

    fn check_fenced(&self) -> Result<(), GroupError> {
        if self.fenced {
            Err(GroupError::Fenced)
        } else {
            Ok(())
        }
    }

    /// A frame from a peer.
    pub async fn on_frame(&mut self, frame: Frame) -> Result<(), GroupError> {
        self.check_fenced()?;
        let (from, view, message) = (frame.replica.0, frame.view, frame.message.name());
        let res = self.replica.on_frame(frame);
        if let Ok(Handled::Ignored(reason)) = res {
            tracing::trace!(group = 0, from, view, message, %reason, "frame ignored");
        }
        self.drive().await?;
        res.map(|_| ()).map_err(GroupError::Frame)
    }

    /// One tick of the driver's clock.
    pub async fn on_tick(&mut self) -> Result<(), GroupError> {
        self.check_fenced()?;
        if self.persist_failed {
            self.persist().await;
        }
        self.replica.on_tick();
        self.drive().await?;
        if self.store.snapshot_due() && !self.replica.is_transferring() {
            // Between inputs, so no apply interleaves. A failure before the
            // snapshot's rename changes nothing (retried next tick); after
            // it the store refuses commits and the next apply fences.
            if let Err(error) = self.store.snapshot().await {
                tracing::warn!(%error, "metadata snapshot failed");
            }
        }
        Ok(())
    }

    /// Asserts the driver's invariants (after every input in debug builds):
    /// the core's own, the store applied exactly what the core applied,
    /// and the state's own invariants hold.
    ///
    /// # Panics
    /// If an invariant does not hold: a bug in this crate or the core.
    pub fn invariants(&self) {
        if self.fenced {
            return;
        }
        if let Err(violation) = self.replica.invariants() {
            panic!("group 0's replica broke an invariant: {violation}");
        }
        assert_eq!(
            self.store.applied().0,
            self.replica.commit_min().0,
            "the store and the core disagree on the applied op"
        );
        self.store.state().invariants();
    }

    /// Registers a client session (its reply carries the session).
    pub async fn register(
        &mut self,
        client: u128,
        user_id: u32,
    ) -> Result<RequestOutcome, GroupError> {
        self.check_fenced()?;
        let outcome = self.replica.on_client_request(Request {
            client,
            session: 0,
            request: 0,
            operation: OPERATION_REGISTER,
            user_id,
            request_checksum: 0,
            body: Bytes::new(),
        });
        self.drive().await?;
        Ok(outcome)
    }

    /// Orders a metadata op for a registered client. The caller (the
    /// listener on the primary) has already stamped creation times and
    /// hashed passwords into `op`.
    pub async fn submit(
        &mut self,
        client: u128,
        session: u64,
        request: u64,
        user_id: u32,
        op: &MetadataOp,
    ) -> Result<RequestOutcome, GroupError> {
        self.check_fenced()?;
        let body = op.encode().map_err(GroupError::Encode)?;
        let outcome = self.replica.on_client_request(Request {
            client,
            session,
            request,
            operation: OPERATION_APPEND,
            user_id,
            request_checksum: 0,
            body: Bytes::from(body),
        });
        self.drive().await?;
        Ok(outcome)
    }

    async fn persist(&mut self) {
        match self.durable.persist_replica_view(&mut self.replica).await {
            Ok(()) => self.persist_failed = false,
            Err(error) => {
                // Sends stay held by the core; retried on the next tick.
                let (view, log_view) = (self.replica.view(), self.replica.log_view());
                tracing::warn!(%error, view, log_view, "metadata superblock write failed");
                self.persist_failed = true;
            }
        }
    }

    /// Writes what changed in the core's journal to the replica log and
    /// syncs it, when this replica keeps one. A failure fences the
    /// replica: its frames would vouch for what the log may not hold.
    async fn write_replica_log(&mut self) -> Result<(), GroupError> {
        let Some(log) = self.replica_log.as_mut() else {
            return Ok(());
        };
        let logged = self.replica.logged_journal();
        let applied = self.store.applied().0;
        if let Err(e) = log.record(self.store.fs(), &logged, applied, applied).await {
            tracing::error!(error = %e, "metadata replica log could not be written; fencing");
            self.fenced = true;
            self.held_frames.clear();
            return Err(GroupError::ReplicaLog(e));
        }
        Ok(())
    }

    async fn drive(&mut self) -> Result<(), GroupError> {
        loop {
            let actions = self.replica.take_actions();
            if actions.is_empty() {
                self.write_replica_log().await?;
                for (to, frame) in std::mem::take(&mut self.held_frames) {
                    self.bus.send_to_replica(to, frame);
                }
                if cfg!(debug_assertions) {
                    self.invariants();
                }
                return Ok(());
            }
            for action in actions {
                match action {
                    Action::Send { to, frame } if self.replica_log.is_some() => {
                        self.held_frames.push((to.0, frame));
                    }
                    Action::Send { to, frame } => self.bus.send_to_replica(to.0, frame),
                    Action::Reply(reply) => {
                        let outcome = self
                            .outcomes
                            .iter()
                            .find(|(op, _)| *op == reply.op.0)
                            .map(|(_, o)| o.clone());
                        self.bus.send_to_client(MetadataReply { reply, outcome });
                    }
                    Action::Effect(Effect::PersistState { .. }) => {
                        // A suffix the core replaced is in the log before
                        // the superblock records the view it belongs to.
                        self.write_replica_log().await?;
                        self.persist().await;
                    }
                    Action::Effect(Effect::Apply { prepare, duplicate }) => {
                        if let Err(e) = self.apply(prepare, duplicate).await {
                            tracing::error!(error = %e, "metadata op could not be committed; fencing");
                            self.fenced = true;
                            return Err(e);
                        }
                    }
                    Action::Effect(Effect::Journal { .. } | Effect::TruncateJournal { .. }) => {}
                    Action::Effect(Effect::ReadBack {
                        to,
                        nonce,
                        from_op,
                        slice,
                    }) => {
                        // This group never lets go of a body (it has no
                        // segments to read one back from): a slot that is
                        // not held is answered as missing.
                        let read = slice
                            .into_iter()
                            .map(|slot| match slot {
                                consensus::vsr::Retained::Held(p) => Some(p),
                                consensus::vsr::Retained::Spilled(_) => None,
                            })
                            .collect();
                        self.replica.serve_read_back(to.0, nonce, from_op.0, read);
                    }
                    Action::Effect(Effect::StartStateTransfer { peer, floor, to_op }) => {
                        tracing::warn!(
                            peer = peer.0,
                            floor = floor.0,
                            to_op = to_op.0,
                            "metadata replica needs a state transfer"
                        );
                        self.transfer_needed = Some(TransferNeeded { peer, floor, to_op });
                    }
                }
            }
        }
    }

    async fn apply(&mut self, prepare: Prepare, duplicate: bool) -> Result<(), GroupError> {
        let h = prepare.header;
        let op = h.op;
        let origin = OpOrigin {
            client: h.client,
            request: h.request,
            timestamp_us: h.timestamp,
            user_id: h.user_id,
            identity: h.checksum,
        };
        let body = if h.operation == OPERATION_REGISTER || duplicate {
            None
        } else {
            match MetadataOp::decode(&prepare.body) {
                Ok(body) => Some(body),
                Err(error) => {
                    // The primary encodes every op it orders, so this is a
                    // bug or a hostile primary; every replica decodes the
                    // same bytes and skips alike.
                    tracing::error!(op = h.op.0, %error, "committed metadata op does not decode; skipped");
                    None
                }
            }
        };
        let Some(body) = body else {
            return self
                .store
                .commit_skip(op, origin)
                .await
                .map_err(GroupError::Store);
        };
        let result = self
            .store
            .commit(op, &body, origin)
            .await
            .map_err(GroupError::Store)?;
        let outcome = match result {
            Ok(applied) => {
                self.effects.extend(
                    applied
                        .effects
                        .into_iter()
                        .map(|effect| CommittedEffect { op, effect }),
                );
                Ok(applied.outcome)
            }
            Err(refusal) => Err(refusal),
        };
        if self.outcomes.len() == OUTCOMES_KEPT {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back((h.op.0, outcome));
        Ok(())
    }
}

/// Reads the superblock, noting whether a record was ever written, and
/// opens it with `initial` for a replica that has none.
async fn open_superblock<S: SuperblockStore>(
    superblock: S,
    initial: VsrState,
) -> Result<(bool, Superblock<S>), GroupError> {
    let mut superblock = superblock;
    let never_written = superblock
        .read_latest()
        .await
        .map_err(GroupError::Superblock)?
        .is_none();
    let durable = Superblock::open(superblock, initial)
        .await
        .map_err(GroupError::Superblock)?;
    Ok((never_written, durable))
}

/// With peers, the replica log in the store's directory and the journal
/// it vouches for above the store's applied op, if any.
async fn open_replica_log<F: Fs>(
    config: &VsrConfig,
    store: &MetadataStore<F>,
) -> Result<(Option<ReplicaLog<F>>, Option<LoggedJournal>), GroupError> {
    if config.replica_count == 1 {
        return Ok((None, None));
    }
    let path = store.dir().join(REPLICA_LOG_FILE);
    let (log, replayed) = ReplicaLog::open(
        store.fs(),
        &path,
        store.applied().0,
        journal::LogMode::SYNCED,
    )
    .await
    .map_err(GroupError::ReplicaLog)?;
    let logged = match replayed {
        Replayed::Journal(logged) => Some(logged),
        Replayed::Empty | Replayed::Stale { .. } => None,
        Replayed::Damaged { offset, reason } => {
            tracing::warn!(path = %path.display(), offset, %reason, "metadata replica log damaged: restarting without the journal");
            None
        }
    };
    Ok((Some(log), logged))
}

/// The core for a replica that is not new: resumed after a clean stop,
/// rejoining after a replaced disk, resumed from its replica log, or
/// restarted under the rule.
async fn restart_replica<F: Fs>(
    config: VsrConfig,
    store: &MetadataStore<F>,
    sb: &VsrState,
    rejoin: bool,
    logged: Option<&LoggedJournal>,
) -> Result<Replica, GroupError> {
    let applied = store.applied();
    let identity = store.state().applied_identity();
    if applied != Op(0) && identity == 0 {
        return Err(GroupError::AppliedIdentityUnknown { applied });
    }
    let durable_state = DurableState {
        view: sb.view,
        log_view: sb.log_view,
        commit: sb.commit_max.max(applied),
    };
    let applied_state = AppliedState {
        commit_min: applied,
        checksum: identity,
    };
    // A clean stop with nothing acknowledged past the applied op
    // resumes as a full member (journal::clean_stop); anything
    // else restarts under the rule.
    let clean = journal::take_clean_stop(store.fs(), store.dir())
        .await
        .is_some_and(|stop| {
            stop.view == sb.view
                && stop.log_view == sb.log_view
                && stop.op == applied
                && stop.checksum == identity
                && sb.commit_max <= applied
        });
    Ok(if clean {
        tracing::info!(
            view = sb.view,
            op = applied.0,
            "metadata group resuming after a clean stop"
        );
        Replica::resume(config, durable_state, applied_state)
    } else if rejoin && config.replica_count > 1 && sb.view == 0 && sb.log_view == 0 {
        // A replaced disk's group 0 that adopted no view yet (this
        // boot or an earlier one): the peers bound its view.
        Replica::restart_rejoining(config, durable_state, applied_state)
    } else if let Some(logged) = logged {
        let replica = Replica::resume_with_log(config, durable_state, applied_state, logged);
        tracing::info!(
            applied_op = applied.0,
            logged_ops = logged.ops.len(),
            view = replica.view(),
            visible = replica.is_quorum_visible(),
            "metadata group resumed from its replica log"
        );
        replica
    } else {
        Replica::restart(config, durable_state, applied_state)
    })
}
