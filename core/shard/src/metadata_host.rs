//! Group 0 on shard 0: the metadata plane hosted by a shard.
//!
//! Shard 0 of every replica holds a [`MetadataGroup`] next to its
//! partition groups. Its frames arrive like any other (the wire codec
//! routes group 0 here), it ticks with the shard, and callers reach it
//! through [`MetaCall`]: ops to replicate (the shard is their VSR client,
//! as it is for partition calls) and queries that read the applied state
//! on the shard's own thread. Every committed op's partition-plane effects
//! come out in op order and become group creations, deletions and purges
//! on the shards that own the groups, on every replica alike.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::rc::Rc;

use common::ReplicaId;
use consensus::vsr::{Frame, OPERATION_REGISTER, ReplyStatus, RequestOutcome};
use futures::channel::oneshot;
use journal::FileSuperblock;
use metadata::{
    MetadataBus, MetadataGroup, MetadataOp, MetadataReply, MetadataState, MetadataStore, Outcome,
    Refusal, StoreConfig,
};

use crate::env::{Env, Sent};
use crate::metadata_transfer::{MetadataTransfer, MetadataTransferConfig};
use crate::session::{Session, SessionStep};

/// What a metadata call answers.
pub type MetaReplyTx = oneshot::Sender<Result<Outcome, MetaError>>;

/// A read of the applied metadata state, run on shard 0's thread.
pub type MetaQuery = Box<dyn FnOnce(&MetadataState) + Send>;

/// A call to the metadata plane.
pub enum MetaCall {
    /// Replicate `op` (creation times stamped and passwords hashed by the
    /// caller) and answer its outcome once committed.
    Submit {
        /// The op.
        op: MetadataOp,
        /// The user on whose behalf it runs.
        user_id: u32,
        /// The answer.
        reply: MetaReplyTx,
    },
    /// Read the applied state.
    Query(MetaQuery),
}

impl fmt::Debug for MetaCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Submit { op, .. } => write!(f, "MetaCall::Submit({op:?})"),
            Self::Query(_) => write!(f, "MetaCall::Query"),
        }
    }
}

/// Why a metadata op was not carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    /// The state machine refused it (with its Iggy error code).
    Refused(Refusal),
    /// Another replica is group 0's primary.
    NotPrimary {
        /// The view.
        view: u32,
        /// Its primary.
        primary: ReplicaId,
    },
    /// Group 0 cannot take ops now (view change, transfer); retry.
    Unavailable {
        /// Why.
        reason: &'static str,
    },
    /// Accepted, outcome unknown (the primary lost its view).
    Indeterminate {
        /// Why.
        reason: &'static str,
    },
    /// A local fault (the store, the disk).
    Local {
        /// The error.
        reason: String,
    },
    /// This shard does not host group 0.
    NotHosted,
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(r) => write!(f, "{r}"),
            Self::NotPrimary { view, primary } => write!(
                f,
                "replica {} is the metadata primary (view {view})",
                primary.0
            ),
            Self::Unavailable { reason } => write!(f, "metadata unavailable: {reason}"),
            Self::Indeterminate { reason } => write!(f, "metadata outcome unknown: {reason}"),
            Self::Local { reason } => write!(f, "metadata local fault: {reason}"),
            Self::NotHosted => write!(f, "this shard does not host the metadata group"),
        }
    }
}

impl std::error::Error for MetaError {}

/// The bus group 0 speaks through: frames leave as bytes, replies queue
/// for the host.
pub struct MetaBus<E: Env> {
    env: Rc<E>,
    cluster: u128,
    replies: Rc<RefCell<Vec<MetadataReply>>>,
}

impl<E: Env> MetadataBus for MetaBus<E> {
    fn send_to_replica(&self, to: u8, frame: Frame) {
        let bytes = consensus::vsr::wire::encode(self.cluster, &frame);
        if self.env.send_to_peer(ReplicaId(to), bytes) == Sent::Dropped {
            tracing::trace!(peer = to, "metadata frame dropped by the bus");
        }
    }

    fn send_to_client(&self, reply: MetadataReply) {
        self.replies.borrow_mut().push(reply);
    }
}

/// The hosted group type.
pub type HostedGroup<E> = MetadataGroup<<E as Env>::Fs, FileSuperblock<<E as Env>::Fs>, MetaBus<E>>;

/// Group 0 and the shard's client session with it.
pub struct MetadataHost<E: Env> {
    pub(crate) group: HostedGroup<E>,
    /// Group 0's state transfer over the bus (both sides).
    pub(crate) transfer: MetadataTransfer,
    replies: Rc<RefCell<Vec<MetadataReply>>>,
    session: Session,
    next_request: u64,
    queued: VecDeque<(MetadataOp, u32, MetaReplyTx)>,
    in_flight: BTreeMap<u64, MetaReplyTx>,
    /// Boot found the store damaged at rest and set it aside: group 0
    /// restarted from nothing, and the partition groups on disk are
    /// reconciled with the metadata only once it has caught up.
    recovering_from_damage: bool,
}

const QUEUED_MAX: usize = 1024;

impl<E: Env> MetadataHost<E> {
    /// Opens group 0 in `dir` (its store and superblock), with its
    /// state-transfer driver configured by `transfer` (nonces seeded from
    /// the group's seed). With `rejoin`, an empty directory is a replaced
    /// disk's ([`MetadataGroup::open_rejoining`]).
    ///
    /// # Errors
    /// A sentence naming the failing part.
    pub async fn open(
        env: Rc<E>,
        dir: &std::path::Path,
        vsr: consensus::vsr::Config,
        transfer: MetadataTransferConfig,
        rejoin: bool,
    ) -> Result<Self, String> {
        let cluster = transfer.cluster;
        let fs = env.fs().clone();
        let config = StoreConfig {
            cluster,
            ..StoreConfig::default()
        };
        let failed = |e: metadata::StoreError| format!("metadata store in {}: {e}", dir.display());
        // A recovery a reboot interrupted goes on.
        let mut recovering_from_damage = vsr.replica_count > 1
            && MetadataStore::damage_recovery_pending(&fs, dir)
                .await
                .map_err(failed)?;
        let (store, report) = match MetadataStore::open(&fs, dir, config).await {
            Ok(opened) => opened,
            // With peers, damaged bytes at rest are repaired like a lost
            // journal: group 0 restarts under the restart rule from
            // nothing and takes the state from its peers (repair or a
            // snapshot transfer). A single replica has nobody to take it
            // from, so boot is refused with the damage named.
            Err(error) if error.is_damage_at_rest() && vsr.replica_count > 1 => {
                let aside = MetadataStore::set_aside(&fs, dir).await.map_err(failed)?;
                tracing::error!(dir = %dir.display(), aside = %aside.display(), %error, "metadata store damaged at rest: set aside, repairing from the peers");
                recovering_from_damage = true;
                MetadataStore::open(&fs, dir, config)
                    .await
                    .map_err(failed)?
            }
            Err(error) => return Err(failed(error)),
        };
        tracing::info!(dir = %dir.display(), ?report, "metadata store open");
        let replies = Rc::new(RefCell::new(Vec::new()));
        let bus = MetaBus {
            env,
            cluster,
            replies: Rc::clone(&replies),
        };
        let superblock = FileSuperblock::new(fs, dir);
        let group = MetadataGroup::open_rejoining(vsr, cluster, store, superblock, bus, rejoin)
            .await
            .map_err(|e| format!("metadata group in {}: {e}", dir.display()))?;
        Ok(Self {
            group,
            transfer: MetadataTransfer::new(transfer, vsr.seed ^ 0x5EED),
            replies,
            session: Session::Closed,
            next_request: 1,
            queued: VecDeque::new(),
            in_flight: BTreeMap::new(),
            recovering_from_damage,
        })
    }

    /// Whether group 0 restarted from nothing after its store was found
    /// damaged and has not caught up yet: its state is behind what the
    /// shards hold, so nothing may be deleted for not being named in it.
    pub fn recovering_from_damage(&self) -> bool {
        self.recovering_from_damage
    }

    /// Whether a damage recovery can end: group 0 here has applied
    /// everything its view knows committed (the primary's commit point,
    /// which covers every op it applied before the damage).
    pub(crate) fn damage_recovery_caught_up(&self) -> bool {
        let replica = self.group.replica();
        self.recovering_from_damage
            && replica.status() == consensus::vsr::Status::Normal
            && replica.is_quorum_visible()
            && replica.commit_min() == replica.commit_max()
            && self.group.state().applied() == replica.commit_min()
            && self.group.state_transfer_needed().is_none()
    }

    /// Group 0 has caught up after its damaged store: reconciliation of
    /// the partition groups may run (the marker stays until
    /// [`Self::end_damage_recovery`]).
    pub(crate) fn stop_deferring_reconciliation(&mut self) {
        self.recovering_from_damage = false;
    }

    /// Ends the damage recovery once the partition groups are reconciled:
    /// its marker goes, durably. A failed removal is logged; the next boot
    /// then defers its reconciliation once more, which is safe.
    pub(crate) async fn end_damage_recovery(&mut self) {
        let store = self.group.store();
        if let Err(error) = MetadataStore::end_damage_recovery(store.fs(), store.dir()).await {
            tracing::warn!(%error, "damage recovery marker not removed");
        }
    }

    /// The applied state.
    pub fn state(&self) -> &MetadataState {
        self.group.state()
    }

    /// Whether a store failure fenced group 0 here (it takes nothing until
    /// the replica restarts).
    pub fn is_fenced(&self) -> bool {
        self.group.is_fenced()
    }

    /// Group 0's state-transfer driver, for inspection.
    pub fn transfer(&self) -> &MetadataTransfer {
        &self.transfer
    }

    /// Group 0's VSR replica, for inspection (the simulator's checks).
    pub fn replica(&self) -> &consensus::vsr::Replica {
        self.group.replica()
    }

    /// Queues an op; it is submitted once the shard's session is open.
    pub(crate) fn enqueue(&mut self, op: MetadataOp, user_id: u32, reply: MetaReplyTx) {
        if let Err(e) = self.primary_check() {
            let _ = reply.send(Err(e));
            return;
        }
        if self.queued.len() >= QUEUED_MAX {
            let _ = reply.send(Err(MetaError::Unavailable {
                reason: "too many metadata calls waiting",
            }));
            return;
        }
        self.queued.push_back((op, user_id, reply));
    }

    fn primary_check(&self) -> Result<(), MetaError> {
        let replica = self.group.replica();
        if self.group.is_fenced() {
            return Err(MetaError::Local {
                reason: "the metadata store failed; this replica's group 0 is fenced".into(),
            });
        }
        if !replica.is_primary() {
            let view = replica.view();
            return Err(MetaError::NotPrimary {
                view,
                primary: replica.primary_index(view),
            });
        }
        if !replica.is_caught_up_primary() || self.group.state_transfer_needed().is_some() {
            return Err(MetaError::Unavailable {
                reason: "metadata view change or transfer in progress",
            });
        }
        Ok(())
    }

    /// Opens the session when ops wait, then submits them.
    pub(crate) async fn pump(&mut self, client: u128, tick: u64) {
        if self.queued.is_empty() {
            return;
        }
        if let Err(e) = self.primary_check() {
            for (_, _, reply) in self.queued.drain(..) {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
        let session = match self.session.step(tick) {
            SessionStep::Submit(session) => session,
            SessionStep::Wait => return,
            SessionStep::Register => {
                match self.group.register(client, 0).await {
                    Ok(RequestOutcome::Prepared { .. } | RequestOutcome::InFlight) => {
                        self.session = Session::Registering { since_tick: tick };
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "metadata register failed"),
                }
                return;
            }
        };
        while let Some((op, user_id, reply)) = self.queued.pop_front() {
            let request = self.next_request;
            match self
                .group
                .submit(client, session, request, user_id, &op)
                .await
            {
                Ok(
                    RequestOutcome::Prepared { .. }
                    | RequestOutcome::InFlight
                    | RequestOutcome::Answered,
                ) => {
                    self.next_request += 1;
                    self.in_flight.insert(request, reply);
                }
                Ok(RequestOutcome::Unavailable) => {
                    let _ = reply.send(Err(MetaError::Unavailable {
                        reason: "group 0 is not taking requests now",
                    }));
                }
                Ok(RequestOutcome::ReservedClient) => {
                    let _ = reply.send(Err(MetaError::Local {
                        reason: "reserved client id".into(),
                    }));
                }
                Err(error) => {
                    let _ = reply.send(Err(MetaError::Local {
                        reason: error.to_string(),
                    }));
                }
            }
        }
    }

    /// Matches replies to waiting calls; returns whether the session just
    /// opened (queued ops can go).
    pub(crate) fn settle(&mut self, client: u128) -> bool {
        let replies = std::mem::take(&mut *self.replies.borrow_mut());
        let mut opened = false;
        for MetadataReply { reply, outcome } in replies {
            if reply.client != client {
                continue;
            }
            if reply.operation == OPERATION_REGISTER {
                opened |= self.session.on_register_reply(&reply);
                continue;
            }
            let Some(tx) = self.in_flight.remove(&reply.request) else {
                continue;
            };
            let answer = match (reply.status, outcome) {
                (ReplyStatus::Ok, Some(Ok(outcome))) => Ok(outcome),
                (ReplyStatus::Ok, Some(Err(refusal))) => Err(MetaError::Refused(refusal)),
                (ReplyStatus::Ok | ReplyStatus::AlreadyApplied, None) => {
                    Err(MetaError::Indeterminate {
                        reason: "answered from the client table without its outcome",
                    })
                }
                (ReplyStatus::AlreadyApplied, Some(result)) => result.map_err(MetaError::Refused),
                (ReplyStatus::NoSession | ReplyStatus::Fenced, _) => {
                    self.session = Session::Closed;
                    Err(MetaError::Unavailable {
                        reason: "group 0 lost this shard's session",
                    })
                }
            };
            let _ = tx.send(answer);
        }
        if !self.in_flight.is_empty() && !self.group.replica().is_primary() {
            for (_, tx) in std::mem::take(&mut self.in_flight) {
                let _ = tx.send(Err(MetaError::Indeterminate {
                    reason: "the metadata primary lost its view before the op committed",
                }));
            }
            self.session = Session::Closed;
        }
        opened
    }
}
