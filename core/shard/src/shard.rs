//! The shard: every group of one core, and the three inputs that drive
//! them — frames from peer replicas, ticks, and client calls.
//!
//! Groups live in a `BTreeMap` keyed by group id, so every walk over them
//! is in the same order on every replica and every run. A group is a
//! [`Partition`] with its [`TransferDriver`]; the shard owns both through
//! `&mut` and never holds a borrow across an await that another input
//! could need (inputs are handled one at a time by the pump).
//!
//! Frames arrive as bytes from a connection whose peer is known. The shard
//! checks them once, here: the state-transfer commands go to the group's
//! driver (which runs the header codec and its own checks), every other
//! command through [`consensus::vsr::wire::decode`] with the cluster, the
//! size ceiling and the connection's peer. A refused frame is counted by
//! its reason ([`FrameRefusal`]) and changes nothing.
//!
//! Replicated client calls (produce, offset store and delete, purge) need
//! a VSR client session with the group. The shard is that client: one
//! client id per shard and boot, a session registered with each group the
//! first time a call needs it, request numbers in order. Calls wait in the
//! group's queue while the session is being opened and are answered from
//! the replies the partition delivers when their ops commit.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{GroupId, METADATA_GROUP, Offset, Op, ReplicaId};
use consensus::vsr::wire::{self, Expect, WireError};
use consensus::vsr::{
    Config as VsrConfig, Frame, OPERATION_REGISTER, Reply, ReplyStatus, RequestOutcome,
    TimeoutConfig,
};
use journal::{FileSuperblock, SuperblockTable, TableKey, TableSuperblock};
use partitions::state_transfer::{
    BuildClock, DriverOutput, Outgoing, TransferDriver, TransferDriverConfig, TransferEvent,
    TransferSlots,
};
use partitions::{
    ClientOp, ClientRequest, MessageBus, Partition, PartitionConfig, PartitionError,
    RetentionPolicy,
};
use storage::fs::Fs;

use crate::call::{Answer, Call, CallError, Envelope, ReplyTx};
use crate::catalog::{self, GroupSpec};
use crate::env::{Env, Sent};
use crate::metadata_host::{MetaCall, MetaError, MetadataHost};
use crate::metadata_transfer::MetadataTransferConfig;
use crate::placement::{ShardIndex, shard_of};
use crate::pump::{Inbox, Input};
use crate::rejoin::{self, Rejoin};
use crate::session::{Session, SessionStep};
use crate::snapshot::{
    DurationBuckets, GroupSnapshot, IgnoredTotals, PartitionSnapshot, PartitionTotals,
    ShardSnapshot, SnapshotDetail, TransferProgress, TransferTotals, consensus_of,
};

/// Default tick period.
pub const TICK_DEFAULT: Duration = Duration::from_millis(10);
/// How many ticks between two retention passes of a group.
const RETENTION_EVERY_TICKS: u64 = 100;
/// Calls a group queues while its session is being opened.
const QUEUED_CALLS_MAX: usize = 4096;
/// How long a primary waits for a purge it proposed to apply before it
/// proposes it again.
const PURGE_RETRY_TICKS: u64 = 100;
/// Ticks a read waits for its primary's read check before it is answered
/// `Unavailable` (the primary may be cut off from its backups).
const READ_CHECK_TICKS_MAX: u64 = 100;
/// Reads a group holds while their read check is out.
const PENDING_READS_MAX: usize = 4096;
/// Group 0's directory under shard 0's.
pub const METADATA_DIR: &str = "metadata";

/// Static configuration of one shard.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// The cluster id every frame carries.
    pub cluster: u128,
    /// This replica.
    pub replica: ReplicaId,
    /// Replicas in the cluster.
    pub replica_count: u8,
    /// This shard's index.
    pub shard: ShardIndex,
    /// Shards per replica (the same on every replica).
    pub shard_count: u16,
    /// The shard's directory (its groups live below it).
    pub dir: PathBuf,
    /// Ceiling on an inbound frame, header included.
    pub frame_size_max: u32,
    /// The groups' VSR timeouts, in ticks.
    pub timeouts: TimeoutConfig,
    /// Applied prepares a partition group keeps in memory for its peers'
    /// repair.
    pub retention_ops: u64,
    /// The same for group 0 (kept apart so that tests can push group 0
    /// past its peers' retention without changing the partitions').
    pub metadata_retention_ops: u64,
    /// Seeds the groups' PRNGs and the shard's client id (per boot).
    pub seed: u64,
    /// The tick period.
    pub tick: Duration,
    /// Whether this shard hosts the metadata group (shard 0 does).
    pub host_metadata: bool,
    /// Bytes of sealed segments the shard reads back and verifies per tick
    /// (`partitions::scrub`), spread over its groups in turn; 0 turns
    /// scrubbing off. At the default 64 KiB and 10 ms ticks that is at most
    /// 6.4 MB/s of reads per shard.
    pub scrub_bytes_per_tick: u64,
    /// Every partition group's `PartitionConfig::record_interval_us`.
    pub record_interval_us: u64,
    /// This boot starts an empty data directory as a replica whose disk
    /// was replaced: shard 0 records the rejoin marker ([`crate::rejoin`])
    /// before it opens group 0. Later boots find the marker; this flag
    /// only matters on the first.
    pub rejoin: bool,
    /// File operations a partition's state-transfer install carries out
    /// per tick (`TransferDriverConfig::install_file_ops_per_step`).
    pub install_file_ops_per_step: usize,
    /// Bytes of flushed batches the shard's partition groups keep in
    /// memory, together, for their peers' repair; past it a group lets go
    /// of its oldest and serves them from its segments
    /// (`partitions::retained`).
    pub retained_bytes_max: u64,
    /// Every partition group's `PartitionConfig::read_back_bytes_per_slice`.
    pub read_back_bytes_per_slice: u64,
}

impl ShardConfig {
    /// A configuration with the defaults around the identity fields.
    pub fn new(
        cluster: u128,
        replica: ReplicaId,
        replica_count: u8,
        shard: ShardIndex,
        shard_count: u16,
        dir: PathBuf,
    ) -> Self {
        Self {
            cluster,
            replica,
            replica_count,
            shard,
            shard_count,
            dir,
            frame_size_max: consensus::header::FRAME_SIZE_MAX_DEFAULT,
            timeouts: TimeoutConfig::default(),
            retention_ops: VsrConfig::new(ReplicaId(0), 1, GroupId(0)).retention_ops,
            metadata_retention_ops: VsrConfig::new(ReplicaId(0), 1, GroupId(0)).retention_ops,
            seed: 0,
            tick: TICK_DEFAULT,
            host_metadata: shard == ShardIndex(0),
            scrub_bytes_per_tick: SCRUB_BYTES_PER_TICK_DEFAULT,
            record_interval_us: partitions::RECORD_INTERVAL_US_DEFAULT,
            rejoin: false,
            install_file_ops_per_step: partitions::state_transfer::INSTALL_FILE_OPS_PER_STEP,
            retained_bytes_max: partitions::RETAINED_BYTES_MAX_DEFAULT,
            read_back_bytes_per_slice: partitions::READ_BACK_BYTES_PER_SLICE_DEFAULT,
        }
    }
}

/// Default [`ShardConfig::scrub_bytes_per_tick`].
pub const SCRUB_BYTES_PER_TICK_DEFAULT: u64 = 64 * 1024;
/// Groups a tick's scrub visits at most (so thousands of groups without
/// sealed segments cost a bounded few lookups per tick).
const SCRUB_GROUPS_PER_TICK: usize = 8;
/// Ticks in which the handle pass sees every group once (about 5 s at the
/// default 10 ms tick).
const HANDLE_PASS_TICKS: u64 = 512;
/// Due groups whose own ticks run at once (see [`Shard::on_tick`]): enough
/// to share the filesystem's commits among many groups' syncs, few enough
/// that the files they open stay well inside the descriptor budget.
const TICK_GROUPS_AT_ONCE: usize = 64;
/// Idle groups with unsynced writes a tick's handle pass flushes at most
/// (each is an fsync and an applied-point record).
const HANDLE_SYNCS_PER_TICK: u32 = 2;

/// Why an inbound frame was refused (counted per variant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameRefusal {
    /// The bytes are not a frame this replica accepts.
    Wire(WireError),
    /// A frame for a group that does not live on this shard.
    UnknownGroup {
        /// The group named.
        group: GroupId,
    },
    /// A frame for a group another shard index owns.
    WrongShard {
        /// The group named.
        group: GroupId,
        /// The shard that owns it.
        owner: ShardIndex,
    },
    /// The state-transfer driver refused it.
    Transfer(String),
    /// The partition refused it (a prepare that does not fit its log…).
    Partition(String),
    /// A frame from a replica id outside the cluster.
    UnknownPeer {
        /// The peer.
        peer: ReplicaId,
    },
}

impl FrameRefusal {
    /// The counter a refusal bumps.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Wire(WireError::Header(_)) => "header",
            Self::Wire(WireError::WrongCluster { .. }) => "wrong_cluster",
            Self::Wire(WireError::WrongSender { .. }) => "wrong_sender",
            Self::Wire(WireError::NotVsr { .. }) => "not_vsr",
            Self::Wire(_) => "suffix",
            Self::UnknownGroup { .. } => "unknown_group",
            Self::WrongShard { .. } => "wrong_shard",
            Self::Transfer(_) => "transfer",
            Self::Partition(_) => "partition",
            Self::UnknownPeer { .. } => "unknown_peer",
        }
    }
}

impl std::fmt::Display for FrameRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Wire(e) => write!(f, "{e}"),
            Self::UnknownGroup { group } => write!(f, "no group {} on this shard", group.0),
            Self::WrongShard { group, owner } => {
                write!(f, "group {} belongs to shard {}", group.0, owner.0)
            }
            Self::Transfer(e) => write!(f, "state-transfer frame refused: {e}"),
            Self::Partition(e) => write!(f, "partition refused the frame: {e}"),
            Self::UnknownPeer { peer } => write!(f, "replica {} is not in the cluster", peer.0),
        }
    }
}

impl std::error::Error for FrameRefusal {}

/// Why a group could not be created, opened or deleted.
#[derive(Debug)]
pub enum GroupError {
    /// The group is already on this shard.
    AlreadyExists(GroupId),
    /// The group is not on this shard.
    Unknown(GroupId),
    /// The group belongs to another shard index.
    WrongShard {
        /// The group.
        group: GroupId,
        /// Its owner.
        owner: ShardIndex,
    },
    /// A directory step failed.
    Io {
        /// The group.
        group: GroupId,
        /// What was being done.
        step: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The partition refused to boot.
    Boot {
        /// The group.
        group: GroupId,
        /// The partition's error.
        reason: String,
    },
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyExists(g) => write!(f, "group {} already exists", g.0),
            Self::Unknown(g) => write!(f, "group {} is not on this shard", g.0),
            Self::WrongShard { group, owner } => {
                write!(f, "group {} belongs to shard {}", group.0, owner.0)
            }
            Self::Io {
                group,
                step,
                source,
            } => write!(f, "group {}: {step} failed: {source}", group.0),
            Self::Boot { group, reason } => write!(f, "group {} did not boot: {reason}", group.0),
        }
    }
}

impl std::error::Error for GroupError {}

/// Counters of a shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Frames accepted.
    pub frames_in: u64,
    /// Frames refused, by [`FrameRefusal::reason`].
    pub frames_refused: BTreeMap<&'static str, u64>,
    /// Frames handed to the environment.
    pub frames_out: u64,
    /// Frames the environment dropped.
    pub frames_dropped: u64,
    /// Ticks run.
    pub ticks: u64,
    /// Groups visited by ticks (a group is visited only on ticks when it
    /// has something due).
    pub group_visits: u64,
    /// Calls answered, successful or not.
    pub calls: u64,
    /// Groups fenced since boot.
    pub fenced: u64,
    /// Groups the metadata names that could not be created or opened
    /// since boot (at boot, at runtime, or by a reconcile); each is also
    /// logged. Such a group is absent here until a restart opens it.
    pub groups_not_opened: u64,
    /// Transfers installed since boot.
    pub installs: u64,
    /// How long the installed transfers took, armed to installed.
    pub transfer_durations: DurationBuckets,
    /// Bytes of flushed batches the partition groups keep in memory for
    /// repair, now and at most after any flush, and the ceiling
    /// ([`ShardConfig::retained_bytes_max`]).
    pub retained_bytes: u64,
    /// See [`ShardStats::retained_bytes`].
    pub retained_bytes_peak: u64,
    /// See [`ShardStats::retained_bytes`].
    pub retained_bytes_max: u64,
    /// Batches let go of to stay within the ceiling (read back from the
    /// segments if a peer's repair needs them).
    pub retained_spilled: u64,
    /// What the shard's superblock table wrote since boot: batches (two
    /// syncs each), the records and frees they carried, the largest.
    pub superblock: journal::TableStats,
}

/// The partition type a shard hosts.
pub type ShardPartition<E> =
    Partition<ShardBus<E>, TableSuperblock<<E as Env>::Fs>, <E as Env>::Fs>;

/// Replies the shard's partitions delivered, awaiting matching to calls.
type ReplyQueue = Rc<RefCell<Vec<(GroupId, Reply)>>>;

/// The [`MessageBus`] a shard gives each of its partitions: frames leave
/// as bytes through the environment, replies go to the shard's queue.
pub struct ShardBus<E: Env> {
    env: Rc<E>,
    cluster: u128,
    group: GroupId,
    replies: ReplyQueue,
    sent: Rc<RefCell<(u64, u64)>>,
}

impl<E: Env> ShardBus<E> {
    fn send(&self, to: ReplicaId, frame: Bytes) {
        let outcome = self.env.send_to_peer(to, frame);
        let mut sent = self.sent.borrow_mut();
        sent.0 += 1;
        if outcome == Sent::Dropped {
            sent.1 += 1;
        }
    }
}

impl<E: Env> MessageBus for ShardBus<E> {
    fn send_to_replica(&self, to: ReplicaId, frame: Frame) {
        self.send(to, wire::encode(self.cluster, &frame));
    }

    fn send_to_client(&self, reply: Reply) {
        self.replies.borrow_mut().push((self.group, reply));
    }

    fn send_wire_to_replica(&self, to: ReplicaId, frame: Bytes) {
        self.send(to, frame);
    }
}

/// A replicated call waiting for its commit.
#[derive(Debug)]
struct InFlight {
    reply: ReplyTx,
}

/// A call that reads the group's state, waiting until its primary has
/// confirmed that it still leads its view (`consensus::vsr::read_check`):
/// a poll, a consumer-offset read, or an offset store naming an offset
/// past this replica's end, which a newer view may already have
/// committed.
#[derive(Debug)]
struct PendingRead {
    /// The read-check round that must be confirmed.
    round: u64,
    call: Call,
    reply: ReplyTx,
    /// The tick it arrived at.
    since_tick: u64,
}

/// One group on the shard.
/// What [`Shard::triage`] made of a frame.
enum Triage {
    /// A partition group's VSR frame: served beside other groups' frames.
    Partition(GroupId, consensus::vsr::Frame),
    /// Group 0's VSR frame.
    Metadata(consensus::vsr::Frame),
    /// A state-transfer frame, decoded by its driver.
    Transfer,
}

struct Group<E: Env> {
    spec: GroupSpec,
    partition: ShardPartition<E>,
    driver: TransferDriver<E::Fs>,
    session: Session,
    next_request: u64,
    /// Calls waiting for the session.
    queued: VecDeque<(Call, ReplyTx)>,
    /// Replicated calls sent, by request number.
    in_flight: BTreeMap<u64, InFlight>,
    /// Reads waiting for their read check, oldest first.
    reads: VecDeque<PendingRead>,
    fenced_reported: bool,
    /// The view and whether this replica was its primary, as last logged.
    seen_view: (u32, bool),
    /// Census views this replica started, as last logged.
    seen_census: u64,
    /// When the running transfer was first armed (the environment's clock),
    /// for its duration once installed.
    transfer_armed_at: Option<Duration>,
    /// The shard tick through which the partition's ticks are counted
    /// (ticked, or skipped while nothing was due).
    counted_to: u64,
    /// The shard tick the group is scheduled to be visited at.
    due_at: u64,
    /// The partition's op when the handle pass last found its files busy
    /// with unsynced writes.
    handles_seen_op: Option<u64>,
    /// The group's head when the handle pass last saw it holding bodies
    /// for repair (an idle one lets them go on the next pass).
    retained_seen_op: Option<u64>,
    /// The purge generation this replica last proposed as the group's
    /// primary, and the shard tick it did.
    purge_proposed: Option<(u64, u64)>,
}

impl<E: Env> Group<E> {
    /// A purge group 0 committed is proposed to the partition group by
    /// whichever replica is its primary when the effect is applied; a
    /// primary that was down, changing views or not yet caught up then
    /// leaves it unproposed, and no client is told. So the group's
    /// primary proposes any committed generation its partition has not
    /// applied, again every `PURGE_RETRY_TICKS` until it has (a second
    /// copy applies as nothing: a purge needs a newer generation).
    fn propose_missing_purge(&mut self, id: GroupId, tick: u64) {
        let Some(committed) = self.driver.committed_purge_generation() else {
            return;
        };
        let due = committed > self.partition.purge_generation()
            && self.partition.replica().is_caught_up_primary()
            && self.partition.fenced().is_none()
            && self.purge_proposed.is_none_or(|(generation, at)| {
                generation < committed || tick.saturating_sub(at) >= PURGE_RETRY_TICKS
            });
        if !due {
            return;
        }
        tracing::info!(
            group = id.0,
            generation = committed,
            applied = self.partition.purge_generation(),
            "proposing a committed purge the group has not applied"
        );
        self.purge_proposed = Some((committed, tick));
        // Nobody waits for the answer: the metadata op already answered.
        let (reply, _) = futures::channel::oneshot::channel();
        self.queued.push_back((
            Call::Purge {
                generation: committed,
            },
            reply,
        ));
    }

    /// What a tick does to this group alone: the ticks since its last
    /// visit counted, its partition's tick and, when `retention` is given,
    /// its retention pass. Touches nothing of the shard, so the due groups'
    /// own ticks can run at once.
    async fn own_tick(
        &mut self,
        id: GroupId,
        tick: u64,
        now_us: u64,
        retention: Option<&RetentionPolicy>,
    ) {
        // The ticks since its last visit did nothing: count them.
        self.partition
            .skip_ticks(tick.saturating_sub(self.counted_to).saturating_sub(1));
        self.counted_to = tick;
        if let Err(error) = self.partition.on_tick(now_us).await
            && !matches!(error, PartitionError::Fenced { .. })
        {
            tracing::warn!(group = id.0, %error, "tick failed");
        }
        if let Some(base) = retention
            && self.spec.retains()
            && self.partition.fenced().is_none()
            && !self.partition.installing()
        {
            let policy = RetentionPolicy {
                max_age_us: (self.spec.message_expiry_us > 0)
                    .then_some(self.spec.message_expiry_us),
                max_total_bytes: (self.spec.retained_bytes_max > 0)
                    .then_some(self.spec.retained_bytes_max),
                ..*base
            };
            if let Err(error) = self.partition.retention_pass(now_us, &policy).await {
                tracing::warn!(group = id.0, %error, "retention pass failed");
            }
        }
    }

    /// Logs a change of the group's view, or of whether this replica is
    /// its primary: what an operator watches after a replica fails.
    fn note_view(&mut self, id: GroupId) {
        let replica = self.partition.replica();
        let now = (replica.view(), replica.is_primary());
        if now == self.seen_view {
            return;
        }
        let primary = replica.primary_index(now.0);
        let census = replica.census_views_started();
        if census > self.seen_census {
            self.seen_census = census;
            // docs/consensus.md §4, "Whole-group restart".
            tracing::info!(
                group = id.0,
                view = now.0,
                op = replica.commit_min().0,
                "every replica of the group restarted: started a view from the longest applied state"
            );
        } else if now.0 != self.seen_view.0 {
            tracing::info!(
                group = id.0,
                view = now.0,
                primary = primary.0,
                "group view changed"
            );
        } else {
            // The view's start (this replica finishing it as primary):
            // every group of a new cluster does this once.
            tracing::debug!(
                group = id.0,
                view = now.0,
                primary = primary.0,
                primary_here = now.1,
                "group view started"
            );
        }
        self.seen_view = now;
    }
}

/// A build clock over the environment's monotonic time.
struct EnvClock<'a, E: Env>(&'a E);

impl<E: Env> BuildClock for EnvClock<'_, E> {
    fn now(&self) -> Duration {
        self.0.now()
    }
}

/// The groups of one core and what drives them.
pub struct Shard<E: Env> {
    config: ShardConfig,
    env: Rc<E>,
    groups: BTreeMap<GroupId, Group<E>>,
    slots: TransferSlots,
    /// The byte ceiling the partition groups' retained bodies share.
    retained: partitions::RetainedBudget,
    replies: ReplyQueue,
    sent: Rc<RefCell<(u64, u64)>>,
    client: u128,
    /// Groups with replicated calls waiting for their commit.
    in_flight_groups: BTreeSet<GroupId>,
    /// Groups with reads waiting for their read check.
    reading_groups: BTreeSet<GroupId>,
    /// Every group by the tick it is next due at: a tick visits only the
    /// groups whose entry has come (docs/architecture.md, "What a tick
    /// costs").
    schedule: BTreeSet<(u64, GroupId)>,
    /// Groups an input reached since the last rescheduling (a group may
    /// appear more than once).
    touched: Vec<GroupId>,
    /// The last tick whose due groups have all been visited: an input
    /// catches a group up to it before handing it anything.
    settled_tick: u64,
    /// Group 0, on the shard that hosts it.
    metadata: Option<MetadataHost<E>>,
    /// The rejoin marker, on the shard that hosts group 0, while this
    /// replica rejoins after a disk replacement (or has rejoined: it then
    /// names the last op whose groups it may have seen before).
    rejoin: Option<Rejoin>,
    /// Every shard's inbox of this replica, by index (set by the node once
    /// all shards exist): where effects for other shards' groups go.
    siblings: Vec<Inbox>,
    tick: u64,
    stats: ShardStats,
    /// The transfer counters of deleted groups (the shard's sums stay
    /// monotonic).
    transfer_retired: TransferTotals,
    /// Ignored frames of the groups deleted since boot.
    ignored_retired: IgnoredTotals,
    retention: RetentionPolicy,
    /// The group the next tick's scrub starts after.
    scrub_after: GroupId,
    /// The last group the handle pass saw.
    handles_after: GroupId,
    /// Every partition group's superblock record, in batches
    /// (journal::superblock_table).
    superblocks: Rc<SuperblockTable<E::Fs>>,
    /// The groups whose directories existed when the table opened: only
    /// they may have had a record in a slot the table lost.
    booted: BTreeSet<GroupId>,
}

impl<E: Env> std::fmt::Debug for Shard<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("replica", &self.config.replica)
            .field("shard", &self.config.shard)
            .field("groups", &self.groups.len())
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

impl<E: Env> Shard<E> {
    /// Boots the shard from its directory: finishes interrupted deletes,
    /// removes creates that never recorded their spec, and opens every
    /// group that has one. A group that fails to boot is logged and left
    /// on disk; the shard serves the others.
    ///
    /// # Errors
    /// Only when the shard directory itself cannot be listed.
    pub async fn open(config: ShardConfig, env: Rc<E>) -> std::io::Result<Self> {
        let fs = env.fs().clone();
        let listing = catalog::list(&fs, &config.dir).await?;
        let superblocks = SuperblockTable::open(fs.clone(), &config.dir)
            .await
            .map(Rc::new)
            .map_err(std::io::Error::other)?;
        // Unique per replica, shard and boot: a restarted shard must not
        // reuse request numbers a table still holds for its last boot.
        let client = (u128::from(config.seed) << 64)
            | (u128::from(config.replica.0) << 16)
            | u128::from(config.shard.0)
            | (1 << 127);
        let mut shard = Self {
            replies: Rc::new(RefCell::new(Vec::new())),
            sent: Rc::new(RefCell::new((0, 0))),
            slots: TransferSlots::default(),
            retained: partitions::RetainedBudget::new(config.retained_bytes_max),
            groups: BTreeMap::new(),
            client,
            in_flight_groups: BTreeSet::new(),
            reading_groups: BTreeSet::new(),
            schedule: BTreeSet::new(),
            touched: Vec::new(),
            settled_tick: 0,
            metadata: None,
            rejoin: None,
            siblings: Vec::new(),
            tick: 0,
            stats: ShardStats::default(),
            transfer_retired: TransferTotals::default(),
            ignored_retired: IgnoredTotals::default(),
            retention: RetentionPolicy::default(),
            scrub_after: GroupId(0),
            handles_after: GroupId(0),
            superblocks,
            booted: listing.groups.iter().copied().collect(),
            config,
            env,
        };
        if shard.config.host_metadata {
            let mut vsr = VsrConfig::new(
                shard.config.replica,
                shard.config.replica_count,
                METADATA_GROUP,
            );
            vsr.timeouts = shard.config.timeouts;
            vsr.retention_ops = shard.config.metadata_retention_ops;
            vsr.seed = shard.config.seed ^ 0x0E7A;
            if shard.config.rejoin && rejoin::read(&fs, &shard.config.dir).await?.is_none() {
                // Before group 0 exists on disk: a crash after this finds
                // the marker, a crash before it finds an empty directory.
                rejoin::write(&fs, &shard.config.dir, &Rejoin { through_op: None }).await?;
                tracing::warn!(dir = %shard.config.dir.display(), "rejoining after a disk replacement: every group stays out of every quorum until it caught up");
            }
            shard.rejoin = rejoin::read(&fs, &shard.config.dir).await?;
            let dir = shard.config.dir.join(METADATA_DIR);
            let rejoining = shard.rejoin.is_some();
            let mut transfer = MetadataTransferConfig::new(shard.config.cluster);
            transfer.frame_size_max = shard.config.frame_size_max;
            match MetadataHost::open(Rc::clone(&shard.env), &dir, vsr, transfer, rejoining).await {
                Ok(host) => shard.metadata = Some(host),
                Err(reason) => {
                    return Err(std::io::Error::other(reason));
                }
            }
        }
        for name in listing.foreign.iter().filter(|n| {
            n.as_str() != METADATA_DIR
                && !n.starts_with(rejoin::REJOIN_FILE)
                && !n.starts_with(journal::CLEAN_STOPS_FILE)
                && !journal::TABLE_NAMES.contains(&n.as_str())
        }) {
            tracing::warn!(dir = %shard.config.dir.display(), name, "unknown entry in shard directory left alone");
        }
        // Taken (read and removed durably) before any group opens, so no
        // group sends anything while a record that vouches for it stands.
        let mut clean_stops = journal::take_clean_stops(&fs, &shard.config.dir).await;
        for group in listing.deleted {
            if let Err(error) = catalog::finish_delete(&fs, &shard.config.dir, group).await {
                tracing::error!(group = group.0, %error, "could not finish an interrupted delete");
            }
        }
        // Records of groups whose directory is gone: a delete the process
        // did not live to free (the directory goes first, then the record).
        let booted = shard.booted.clone();
        match shard
            .superblocks
            .free_unless(|key| booted.contains(&key.group))
            .await
        {
            Ok(0) => {}
            Ok(freed) => tracing::info!(freed, "freed the superblock records of deleted groups"),
            Err(error) => tracing::warn!(%error, "superblock records of deleted groups not freed"),
        }
        for group in listing.groups {
            let dir = catalog::group_dir(&shard.config.dir, group);
            match catalog::read_spec(&fs, &dir).await {
                Ok(Some(spec)) if spec.group == group => {
                    let stop = clean_stops.remove(&group.0);
                    if let Err(error) = shard.open_group(spec, stop).await {
                        shard.stats.groups_not_opened += 1;
                        tracing::error!(group = group.0, %error, "group left closed");
                    }
                }
                Ok(Some(spec)) => tracing::error!(
                    group = group.0,
                    spec_group = spec.group.0,
                    "group directory holds another group's spec; left alone"
                ),
                Ok(None) => {
                    tracing::info!(
                        group = group.0,
                        "removing a group whose create never finished"
                    );
                    if let Err(error) =
                        catalog::remove_unfinished(&fs, &shard.config.dir, group).await
                    {
                        tracing::error!(group = group.0, %error, "could not remove it");
                    }
                }
                Err(error) => {
                    tracing::error!(group = group.0, %error, "group spec unreadable; left closed")
                }
            }
        }
        tracing::info!(
            replica = shard.config.replica.0,
            shard = shard.config.shard.0,
            groups = shard.groups.len(),
            dir = %shard.config.dir.display(),
            "shard open"
        );
        Ok(shard)
    }

    /// The configuration.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// The environment.
    pub fn env(&self) -> Rc<E> {
        Rc::clone(&self.env)
    }

    /// Flushes every group's committed messages (on stop).
    pub async fn flush_all(&mut self) {
        for (id, g) in &mut self.groups {
            // An install in flight holds nothing to flush; a restart
            // converges it (the marker) and pulls again.
            if g.partition.fenced().is_some() || g.partition.installing() {
                continue;
            }
            if let Err(error) = g.partition.flush_committed_messages().await {
                tracing::warn!(group = id.0, %error, "flush on stop failed");
            }
        }
    }

    /// The last step of a clean stop, after [`Shard::flush_all`] and with
    /// no input served after it: every group (group 0 included) that has
    /// acknowledged nothing past its durable state records so, and comes
    /// back from the next boot as a full member of its view rather than a
    /// quorum-invisible one (`journal::clean_stop`). Returns how many
    /// groups recorded and how many could not (they restart under the
    /// rule of docs/consensus.md §4, as after a crash).
    pub async fn record_clean_stops(&mut self) -> (usize, usize) {
        let (mut clean, mut not) = (0, 0);
        if let Some(host) = self.metadata.as_mut() {
            match host.group.record_clean_stop().await {
                Ok(true) => clean += 1,
                Ok(false) => not += 1,
                Err(error) => {
                    not += 1;
                    tracing::warn!(%error, "metadata clean-stop record failed");
                }
            }
        }
        // One file for every partition group of the shard: one durable
        // write at stop, one read and one removal at boot.
        let stops: BTreeMap<u64, journal::CleanStop> = self
            .groups
            .iter()
            .filter_map(|(id, g)| Some((id.0, g.partition.clean_stop()?)))
            .collect();
        let fs = self.env.fs().clone();
        match journal::record_clean_stops(&fs, &self.config.dir, &stops).await {
            Ok(()) => {
                clean += stops.len();
                not += self.groups.len() - stops.len();
            }
            Err(error) => {
                not += self.groups.len();
                tracing::warn!(dir = %self.config.dir.display(), %error, "clean-stop records failed");
            }
        }
        (clean, not)
    }

    /// The groups that hold a record in the shard's superblock table.
    pub fn superblock_records(&self) -> BTreeSet<GroupId> {
        self.superblocks
            .keys()
            .into_iter()
            .map(|k| k.group)
            .collect()
    }

    /// The counters.
    pub fn stats(&self) -> ShardStats {
        let mut stats = self.stats.clone();
        stats.superblock = self.superblocks.stats();
        let sent = *self.sent.borrow();
        stats.frames_out = sent.0;
        stats.frames_dropped = sent.1;
        stats.retained_bytes = self.retained.used();
        stats.retained_bytes_peak = self.retained.peak();
        stats.retained_bytes_max = self.retained.limit();
        stats.retained_spilled = self.retained.spilled();
        stats
    }

    /// The shard's state for an observer (the metrics endpoint): its
    /// counters, sums over its partitions and, with
    /// [`SnapshotDetail::Groups`], every group's position. A pure read.
    pub fn snapshot(&self, detail: SnapshotDetail) -> ShardSnapshot {
        let mut totals = PartitionTotals::default();
        let mut transfer = self.transfer_retired;
        let mut ignored = self.ignored_retired;
        let mut groups = Vec::new();
        if let Some(host) = self.metadata.as_ref() {
            ignored.add(host.replica());
            groups.push(GroupSnapshot {
                group: METADATA_GROUP,
                consensus: consensus_of(host.replica()),
                partition: None,
                transfer: None,
            });
        }
        for (id, g) in &self.groups {
            let stats = g.partition.stats();
            let fenced = g.partition.fenced().is_some();
            totals.messages += stats.messages_count;
            totals.size_bytes += stats.size_bytes;
            totals.segments += stats.segments_count;
            totals.fenced += u64::from(fenced);
            totals.read_back_bodies += g.partition.read_backs().1;
            add_transfer_totals(&mut transfer, &g.driver);
            ignored.add(g.partition.replica());
            let progress = transfer_progress(&g.driver);
            totals.transferring += u64::from(progress.is_some());
            if detail == SnapshotDetail::Groups {
                groups.push(GroupSnapshot {
                    group: *id,
                    consensus: consensus_of(g.partition.replica()),
                    partition: Some(PartitionSnapshot {
                        partition_id: g.spec.partition_id,
                        stats,
                        fenced,
                    }),
                    transfer: progress,
                });
            }
        }
        ShardSnapshot {
            shard: self.config.shard,
            stats: self.stats(),
            partition_groups: self.groups.len() as u64,
            totals,
            transfer,
            ignored,
            groups,
        }
    }

    /// The groups on this shard, ascending.
    pub fn groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.groups.keys().copied()
    }

    /// A group's partition, for inspection.
    pub fn partition(&self, group: GroupId) -> Option<&ShardPartition<E>> {
        self.groups.get(&group).map(|g| &g.partition)
    }

    /// A group's transfer driver, for inspection.
    pub fn driver(&self, group: GroupId) -> Option<&TransferDriver<E::Fs>> {
        self.groups.get(&group).map(|g| &g.driver)
    }

    /// The shard-wide transfer budget.
    pub fn slots(&self) -> &TransferSlots {
        &self.slots
    }

    /// Creates a group durably and opens it.
    ///
    /// # Errors
    /// [`GroupError`]; a create cut short leaves nothing a boot would keep.
    pub async fn create_group(&mut self, spec: GroupSpec) -> Result<(), GroupError> {
        let owner = shard_of(spec.group, self.config.shard_count);
        if owner != self.config.shard {
            return Err(GroupError::WrongShard {
                group: spec.group,
                owner,
            });
        }
        if self.groups.contains_key(&spec.group) {
            return Err(GroupError::AlreadyExists(spec.group));
        }
        let fs = self.env.fs().clone();
        let created = catalog::create(&fs, &self.config.dir, &spec)
            .await
            .map_err(|source| GroupError::Io {
                group: spec.group,
                step: "create",
                source,
            });
        let result = match created {
            Ok(_) => self.open_group(spec, None).await,
            Err(error) => Err(error),
        };
        if result.is_err() {
            self.stats.groups_not_opened += 1;
        }
        result
    }

    /// Deletes a group: it stops serving at once, and its directory is
    /// gone for good once this returns (a crash after the commit point
    /// finishes the removal at boot, never brings the group back).
    ///
    /// # Errors
    /// [`GroupError`].
    pub async fn delete_group(&mut self, group: GroupId) -> Result<(), GroupError> {
        let Some(mut removed) = self.groups.remove(&group) else {
            return Err(GroupError::Unknown(group));
        };
        self.schedule.remove(&(removed.due_at, group));
        removed.driver.release(&mut self.slots);
        add_transfer_totals(&mut self.transfer_retired, &removed.driver);
        self.ignored_retired.add(removed.partition.replica());
        for (_, reply) in removed.queued.drain(..) {
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
        }
        for (_, flight) in std::mem::take(&mut removed.in_flight) {
            let _ = flight.reply.send(Err(CallError::Indeterminate {
                reason: "the group was deleted",
            }));
        }
        let key = TableKey {
            group,
            incarnation: removed.spec.incarnation,
        };
        drop(removed);
        self.booted.remove(&group);
        let fs = self.env.fs().clone();
        catalog::delete(&fs, &self.config.dir, group)
            .await
            .map_err(|source| GroupError::Io {
                group,
                step: "delete",
                source,
            })?;
        // After the directory: a crash between the two leaves a record
        // with no group, which boot frees; the other order could leave a
        // group with no record, which would boot as new.
        if let Err(error) = self.superblocks.free(key).await {
            tracing::warn!(group = group.0, %error, "superblock record not freed; the next boot frees it");
        }
        Ok(())
    }

    /// A group directory from before the shard's table, holding its own
    /// two-copy superblock: its record moves into the table (durably)
    /// before the old files go, so a crash between finds it in one or the
    /// other — the table's once it is there.
    async fn adopt_legacy_superblock(&self, key: TableKey, dir: &Path) -> Result<(), GroupError> {
        let group = key.group;
        let fs = self.env.fs().clone();
        let io = |step: &'static str| {
            move |source: std::io::Error| GroupError::Io {
                group,
                step,
                source,
            }
        };
        let names = journal::SLOT_NAMES.map(|n| dir.join(n));
        let mut present = false;
        for path in &names {
            present |= fs.exists(path).await.map_err(io("superblock adoption"))?;
        }
        if !present {
            return Ok(());
        }
        let boot = |e: journal::SuperblockError| GroupError::Boot {
            group,
            reason: e.to_string(),
        };
        // Once the table holds the record (an adoption cut short after
        // its write), only the files are left to remove.
        if self.superblocks.state(key).is_none() {
            let mut legacy = FileSuperblock::new(fs.clone(), dir);
            if let Some(state) = journal::SuperblockStore::read_latest(&mut legacy)
                .await
                .map_err(boot)?
            {
                self.superblocks.write(key, &state).await.map_err(boot)?;
            }
        }
        for path in &names {
            match fs.remove_file(path).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("superblock adoption")(e)),
            }
        }
        fs.sync_dir(dir).await.map_err(io("superblock adoption"))?;
        tracing::info!(group = group.0, dir = %dir.display(), "moved the group's superblock into the shard's table");
        Ok(())
    }

    async fn open_group(
        &mut self,
        spec: GroupSpec,
        clean_stop: Option<journal::CleanStop>,
    ) -> Result<(), GroupError> {
        let group = spec.group;
        let dir = catalog::group_dir(&self.config.dir, group);
        let fs = self.env.fs().clone();
        let mut vsr = VsrConfig::new(self.config.replica, self.config.replica_count, group);
        vsr.timeouts = self.config.timeouts;
        vsr.retention_ops = self.config.retention_ops;
        vsr.seed = self.config.seed ^ group.0.rotate_left(17);
        let mut config = PartitionConfig::new(vsr);
        config.partition_id = spec.partition_id;
        config.created_revision = spec.incarnation;
        config.cluster = self.config.cluster;
        config.log.segment_size_bytes = spec.segment_size_bytes;
        config.messages_required_to_save = spec.messages_required_to_save;
        config.enforce_fsync = spec.enforce_fsync;
        config.rejoin = spec.rejoin;
        config.record_interval_us = self.config.record_interval_us;
        config.read_back_bytes_per_slice = self.config.read_back_bytes_per_slice;
        let bus = ShardBus {
            env: Rc::clone(&self.env),
            cluster: self.config.cluster,
            group,
            replies: Rc::clone(&self.replies),
            sent: Rc::clone(&self.sent),
        };
        let key = TableKey {
            group,
            incarnation: spec.incarnation,
        };
        self.adopt_legacy_superblock(key, &dir).await?;
        let store = TableSuperblock::new(
            Rc::clone(&self.superblocks),
            key,
            self.booted.contains(&group),
        );
        let mut partition =
            Partition::open_after_stop(config, fs.clone(), &dir, bus, store, clean_stop)
                .await
                .map_err(|e| GroupError::Boot {
                    group,
                    reason: e.to_string(),
                })?;
        partition.share_retained_budget(self.retained.clone());
        let mut driver_config = TransferDriverConfig::new(self.config.cluster, group);
        driver_config.frame_size_max = self.config.frame_size_max;
        driver_config.install_file_ops_per_step = self.config.install_file_ops_per_step;
        let driver = TransferDriver::new(fs, &dir, driver_config, vsr.seed ^ 0x5EED);
        let seen_view = (partition.replica().view(), partition.replica().is_primary());
        self.groups.insert(
            group,
            Group {
                spec,
                partition,
                driver,
                session: Session::Closed,
                next_request: 1,
                queued: VecDeque::new(),
                in_flight: BTreeMap::new(),
                reads: VecDeque::new(),
                fenced_reported: false,
                seen_view,
                seen_census: 0,
                transfer_armed_at: None,
                counted_to: self.settled_tick,
                due_at: self.tick + 1,
                handles_seen_op: None,
                retained_seen_op: None,
                purge_proposed: None,
            },
        );
        self.schedule.insert((self.tick + 1, group));
        Ok(())
    }

    /// One frame from replica `from`, as the connection delivered it.
    ///
    /// # Errors
    /// [`FrameRefusal`], counted; nothing changed.
    pub async fn on_frame(&mut self, from: ReplicaId, bytes: Bytes) -> Result<(), FrameRefusal> {
        let mut outcomes = self.on_frames(vec![(from, bytes)]).await;
        outcomes.pop().unwrap_or(Ok(()))
    }

    /// Serves frames that arrived together: each partition group's VSR
    /// frames in their order, the groups side by side (up to
    /// `TICK_GROUPS_AT_ONCE` at once); the rest (transfer frames, group 0,
    /// refusals) one at a time first. A failover's view-change frames for
    /// hundreds of groups then persist their views together, which the
    /// superblock table writes in one batch instead of one per group. On
    /// a simulated disk every call completes when made, so this serves
    /// the frames in exactly the order of `on_frame` one by one, bar the
    /// serial ones moving ahead (the network reorders anyway).
    ///
    /// Returns each frame's outcome, in the order given.
    pub async fn on_frames(
        &mut self,
        frames: Vec<(ReplicaId, Bytes)>,
    ) -> Vec<Result<(), FrameRefusal>> {
        let mut outcomes: Vec<Option<Result<(), FrameRefusal>>> = vec![None; frames.len()];
        let peers: Vec<ReplicaId> = frames.iter().map(|(from, _)| *from).collect();
        let mut by_group: BTreeMap<GroupId, Vec<(usize, consensus::vsr::Frame)>> = BTreeMap::new();
        for (i, (from, bytes)) in frames.into_iter().enumerate() {
            outcomes[i] = match self.triage(from, &bytes) {
                Ok(Triage::Partition(group, frame)) => {
                    by_group.entry(group).or_default().push((i, frame));
                    continue;
                }
                Ok(Triage::Metadata(frame)) => Some(self.serve_metadata_frame(frame).await),
                Ok(Triage::Transfer) => Some(self.serve_transfer_frame(from, bytes).await),
                Err(refusal) => Some(Err(refusal)),
            };
        }
        let mut taken = Vec::with_capacity(by_group.len());
        for (id, frames) in by_group {
            if touch(&mut self.groups, &mut self.touched, self.settled_tick, id).is_none() {
                continue;
            }
            if let Some(g) = self.groups.remove(&id) {
                taken.push((id, g, frames));
            }
        }
        for chunk in taken.chunks_mut(TICK_GROUPS_AT_ONCE) {
            let served = chunk.iter_mut().map(|(id, g, frames)| async move {
                let mut out = Vec::with_capacity(frames.len());
                for (i, frame) in frames.drain(..) {
                    let result = g
                        .partition
                        .on_frame(frame)
                        .await
                        .map_err(|e| FrameRefusal::Partition(e.to_string()));
                    out.push((i, result));
                }
                g.note_view(*id);
                out
            });
            for (i, result) in futures::future::join_all(served)
                .await
                .into_iter()
                .flatten()
            {
                outcomes[i] = Some(result);
            }
        }
        for (id, g, _) in taken {
            self.groups.insert(id, g);
        }
        let outcomes: Vec<Result<(), FrameRefusal>> = outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or(Err(FrameRefusal::Partition(
                    "the group left while the frame waited".to_owned(),
                )))
            })
            .collect();
        for (peer, result) in peers.iter().zip(&outcomes) {
            match result {
                Ok(()) => self.stats.frames_in += 1,
                Err(refusal) => {
                    *self
                        .stats
                        .frames_refused
                        .entry(refusal.reason())
                        .or_default() += 1;
                    tracing::debug!(peer = peer.0, shard = self.config.shard.0, %refusal, "frame refused");
                }
            }
        }
        self.settle().await;
        outcomes
    }

    /// Where a frame goes: checked and decoded once, at the boundary.
    fn triage(&self, from: ReplicaId, bytes: &Bytes) -> Result<Triage, FrameRefusal> {
        if from.0 >= self.config.replica_count || from == self.config.replica {
            return Err(FrameRefusal::UnknownPeer { peer: from });
        }
        if TransferDriver::<E::Fs>::is_transfer_frame(bytes) {
            return Ok(Triage::Transfer);
        }
        let expect = Expect {
            cluster: self.config.cluster,
            size_max: self.config.frame_size_max,
            peer: Some(from),
        };
        let frame = wire::decode(bytes, &expect).map_err(FrameRefusal::Wire)?;
        if frame.group == METADATA_GROUP {
            return Ok(Triage::Metadata(frame));
        }
        self.check_owner(frame.group.0)?;
        let group = frame.group;
        if !self.groups.contains_key(&group) {
            return Err(FrameRefusal::UnknownGroup { group });
        }
        Ok(Triage::Partition(group, frame))
    }

    /// A state-transfer frame (of group 0 or a partition group).
    async fn serve_transfer_frame(
        &mut self,
        from: ReplicaId,
        bytes: Bytes,
    ) -> Result<(), FrameRefusal> {
        let group = wire::peek_group(&bytes).unwrap_or(GroupId(u64::MAX));
        if group == METADATA_GROUP {
            let Some(host) = self.metadata.as_mut() else {
                return Err(FrameRefusal::UnknownGroup { group });
            };
            let out = host
                .transfer
                .on_frame(&mut host.group, from.0, bytes)
                .await
                .map_err(|e| FrameRefusal::Transfer(e.to_string()))?;
            self.send_frames(out);
            // An install queues the effects that bring the partition
            // plane from the old state to the new.
            self.after_metadata_input().await;
            return Ok(());
        }
        self.check_owner(group.0)?;
        let Some(g) = touch(
            &mut self.groups,
            &mut self.touched,
            self.settled_tick,
            group,
        ) else {
            return Err(FrameRefusal::UnknownGroup { group });
        };
        let clock = EnvClock(&*self.env);
        let out = g
            .driver
            .on_frame(&mut g.partition, &mut self.slots, from.0, bytes, &clock)
            .await
            .map_err(|e| FrameRefusal::Transfer(e.to_string()))?;
        self.carry_out(group, out);
        Ok(())
    }

    /// A VSR frame of group 0, decoded and checked.
    async fn serve_metadata_frame(
        &mut self,
        frame: consensus::vsr::Frame,
    ) -> Result<(), FrameRefusal> {
        let Some(host) = self.metadata.as_mut() else {
            return Err(FrameRefusal::UnknownGroup {
                group: METADATA_GROUP,
            });
        };
        host.group
            .on_frame(frame)
            .await
            .map_err(|e| FrameRefusal::Partition(e.to_string()))?;
        self.after_metadata_input().await;
        Ok(())
    }

    fn check_owner(&self, group: u64) -> Result<(), FrameRefusal> {
        let owner = shard_of(GroupId(group), self.config.shard_count);
        if owner != self.config.shard {
            return Err(FrameRefusal::WrongShard {
                group: GroupId(group),
                owner,
            });
        }
        if !self.groups.contains_key(&GroupId(group)) {
            return Err(FrameRefusal::UnknownGroup {
                group: GroupId(group),
            });
        }
        Ok(())
    }

    /// One tick: every group's consensus timeouts, its transfer driver,
    /// its flush thresholds and (every hundred ticks) its retention; then
    /// the sessions and queued calls.
    pub async fn on_tick(&mut self) {
        self.tick += 1;
        self.stats.ticks += 1;
        let now_us = u64::try_from(self.env.now().as_micros()).unwrap_or(u64::MAX);
        let retention_due = self.tick.is_multiple_of(RETENTION_EVERY_TICKS);
        if let Some(host) = self.metadata.as_mut() {
            if let Err(error) = host.group.on_tick().await {
                tracing::warn!(%error, "metadata tick failed");
            }
            let out = host.transfer.on_tick(&mut host.group);
            self.send_frames(out);
            self.after_metadata_input().await;
        }
        // Effects of group 0 may have reached groups: any that became due
        // now is visited below.
        self.reschedule_touched();
        // The due groups leave the map for the pass, so that their own
        // ticks can run side by side (below); what needs the whole shard
        // (sending, reporting, sessions) is collected and done after it.
        let mut outputs = Vec::new();
        let mut waiting = Vec::new();
        let tick = self.tick;
        let tick_us = u64::try_from(self.config.tick.as_micros()).unwrap_or(u64::MAX);
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.schedule.first() {
            if at > tick {
                break;
            }
            self.schedule.pop_first();
            if let Some(g) = self.groups.remove(&id) {
                due.push((id, g));
            }
        }
        // Each group's own tick (timeouts, flush thresholds, the applied
        // point's time-based record, retention) touches only that group's
        // files, so up to `TICK_GROUPS_AT_ONCE` of them run at once: a record
        // is three syncs in a row (log, client table, superblock), and a
        // shard with hundreds of groups due at once (a burst of produces
        // across partitions, a failover's view changes) otherwise waits
        // for every group's syncs one after another, long enough to miss its
        // own heartbeats. The syncs of different files run side by side and
        // the filesystem commits them together. Durable order within a group
        // is unchanged; on a simulated disk every call completes when made,
        // so the groups run in the same order as one at a time.
        let retention = self.retention;
        for chunk in due.chunks_mut(TICK_GROUPS_AT_ONCE) {
            let ticks = chunk
                .iter_mut()
                .map(|(id, g)| g.own_tick(*id, tick, now_us, retention_due.then_some(&retention)));
            futures::future::join_all(ticks).await;
        }
        let clock = EnvClock(&*self.env);
        for (id, mut g) in due {
            self.stats.group_visits += 1;
            g.note_view(id);
            // An idle driver's tick would do nothing.
            if !g.driver.is_idle(&g.partition) {
                let out = g
                    .driver
                    .on_tick(&mut g.partition, &mut self.slots, &clock)
                    .await;
                outputs.push((id, out));
            }
            if g.partition.fenced().is_some() && !g.fenced_reported {
                outputs.push((id, DriverOutput::default()));
            }
            g.propose_missing_purge(id, tick);
            if !g.queued.is_empty() {
                waiting.push(id);
            }
            // Rescheduled while its state is still in cache; what runs
            // after the pass reschedules the groups it reaches again.
            g.due_at = next_visit(&g, tick_us, tick);
            self.schedule.insert((g.due_at, id));
            self.groups.insert(id, g);
        }
        self.settled_tick = tick;
        self.touched.extend(outputs.iter().map(|(id, _)| *id));
        for (id, out) in outputs {
            self.carry_out(id, out);
        }
        for id in waiting {
            self.pump_session(id).await;
        }
        self.scrub().await;
        self.release_handles().await;
        self.settle().await;
    }

    /// Up to `count` groups in id order after `after`, wrapping round to the
    /// first: the next share of a pass over every group.
    fn groups_in_turn(&self, after: GroupId, count: usize) -> Vec<GroupId> {
        self.groups
            .range(GroupId(after.0.saturating_add(1))..)
            .chain(self.groups.range(..=after))
            .map(|(id, _)| *id)
            .take(count)
            .collect()
    }

    /// This tick's share of letting file handles go: groups in turn after
    /// the last one seen, so that each is seen about once per
    /// [`HANDLE_PASS_TICKS`]. A group whose log has nothing unsynced closes
    /// its files (reopened on next use). One with writes still unsynced
    /// and no new op since the pass last saw it (a single replica's, which
    /// nothing else syncs before its segment seals) is flushed first, a
    /// few per tick. So the descriptor limit bounds the partitions in use,
    /// not those hosted (docs/architecture.md, the "Descriptors" paragraph).
    /// A group with no new op since the pass last saw it also lets go of
    /// the bodies it kept for repair (`Partition::release_retained`).
    async fn release_handles(&mut self) {
        let count = self.groups.len() as u64;
        if count == 0 || !self.tick.is_multiple_of((HANDLE_PASS_TICKS / count).max(1)) {
            return;
        }
        let per_tick = usize::try_from(count.div_ceil(HANDLE_PASS_TICKS)).unwrap_or(usize::MAX);
        let order = self.groups_in_turn(self.handles_after, per_tick);
        let mut syncs = 0;
        for id in order {
            self.handles_after = id;
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            // A group with no new op for a whole pass gives its bodies kept
            // for repair back to the shard's budget.
            let head = g.partition.replica().op().0;
            if g.partition.retained_bytes() > 0 && g.retained_seen_op == Some(head) {
                g.partition.release_retained();
            }
            g.retained_seen_op = Some(head);
            if !g.partition.holds_handles() || g.partition.release_handles() {
                continue;
            }
            // Idle: no op since the pass last saw it, a pass ago.
            let op = g.partition.replica().op().0;
            let idle = g.handles_seen_op == Some(op);
            g.handles_seen_op = Some(op);
            if !idle
                || syncs >= HANDLE_SYNCS_PER_TICK
                || g.partition.fenced().is_some()
                || g.partition.installing()
            {
                continue;
            }
            syncs += 1;
            // A failed flush fences the group: it must be visited to
            // report that.
            let Some(g) = touch(&mut self.groups, &mut self.touched, self.settled_tick, id) else {
                continue;
            };
            match g.partition.flush_committed_messages().await {
                Ok(_) => {
                    g.partition.release_handles();
                }
                Err(error) => tracing::warn!(group = id.0, %error, "flush of an idle group failed"),
            }
        }
    }

    /// Puts every group an input reached back into the schedule at the
    /// tick it is next due ([`next_visit`]).
    fn reschedule_touched(&mut self) {
        if self.touched.is_empty() {
            return;
        }
        let tick_us = u64::try_from(self.config.tick.as_micros()).unwrap_or(u64::MAX);
        let mut touched = std::mem::take(&mut self.touched);
        for id in touched.drain(..) {
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            let at = next_visit(g, tick_us, self.settled_tick);
            if at != g.due_at {
                self.schedule.remove(&(g.due_at, id));
                g.due_at = at;
            }
            self.schedule.insert((at, id));
        }
        // The buffer is kept for the next input.
        self.touched = touched;
    }

    /// This tick's share of scrubbing: groups in turn after the last one
    /// scrubbed, until the byte budget is spent or a few groups were
    /// visited. Damage found is repaired by the group itself
    /// (`Partition::note_damage`).
    async fn scrub(&mut self) {
        let mut budget = self.config.scrub_bytes_per_tick;
        if budget == 0 || self.groups.is_empty() {
            return;
        }
        let order = self.groups_in_turn(self.scrub_after, SCRUB_GROUPS_PER_TICK);
        for id in order {
            self.scrub_after = id;
            let Some(g) = touch(&mut self.groups, &mut self.touched, self.settled_tick, id) else {
                continue;
            };
            let read = g.partition.scrub_step(budget).await;
            budget = budget.saturating_sub(read);
            if budget == 0 {
                break;
            }
        }
    }

    /// Hands a driver's frames to the environment, counted.
    fn send_frames(&self, frames: Vec<Outgoing>) {
        for outgoing in frames {
            let sent = self
                .env
                .send_to_peer(ReplicaId(outgoing.to), outgoing.frame);
            let mut counts = self.sent.borrow_mut();
            counts.0 += 1;
            if sent == Sent::Dropped {
                counts.1 += 1;
            }
        }
    }

    /// Sends a driver's frames and reports its events.
    fn carry_out(&mut self, group: GroupId, out: DriverOutput) {
        self.send_frames(out.send);
        let now = self.env.now();
        for event in out.events {
            let armed_at = self
                .groups
                .get_mut(&group)
                .map(|g| &mut g.transfer_armed_at);
            match (&event, armed_at) {
                (TransferEvent::Armed { .. }, Some(at)) => {
                    at.get_or_insert(now);
                }
                (TransferEvent::Installed(_), Some(at)) => {
                    if let Some(since) = at.take() {
                        self.stats
                            .transfer_durations
                            .observe(now.saturating_sub(since));
                    }
                }
                (TransferEvent::Disarmed | TransferEvent::Fenced { .. }, Some(at)) => *at = None,
                _ => {}
            }
            match event {
                TransferEvent::Installed(outcome) => {
                    self.stats.installs += 1;
                    tracing::info!(group = group.0, ?outcome, "state transfer installed");
                }
                TransferEvent::Fenced { reason, quarantine } => {
                    self.stats.fenced += 1;
                    tracing::error!(group = group.0, reason, ?quarantine, "partition fenced");
                }
                TransferEvent::Armed { peer } => {
                    tracing::info!(group = group.0, peer = peer.0, "state transfer armed");
                }
                TransferEvent::AttemptFailed(error) => {
                    tracing::warn!(group = group.0, %error, "state transfer attempt failed");
                }
                TransferEvent::InstallFailed(error) => {
                    tracing::warn!(group = group.0, %error, "state transfer install failed");
                }
                TransferEvent::Disarmed => {
                    tracing::debug!(group = group.0, "state transfer no longer needed");
                }
                TransferEvent::ServeRefused { requester, reason } => {
                    tracing::debug!(
                        group = group.0,
                        requester = requester.0,
                        ?reason,
                        "offer request refused"
                    );
                }
            }
        }
        if let Some(g) = self.groups.get_mut(&group)
            && let Some(reason) = g.partition.fenced()
            && !g.fenced_reported
        {
            g.fenced_reported = true;
            let reason = reason.to_owned();
            for (_, reply) in g.queued.drain(..) {
                let _ = reply.send(Err(CallError::Fenced {
                    reason: reason.clone(),
                }));
            }
        }
    }

    /// A client call. The answer goes to `envelope.reply`, now or when the
    /// op commits.
    pub async fn on_call(&mut self, envelope: Envelope) {
        self.take_call(envelope).await;
        self.reschedule_touched();
    }

    async fn take_call(&mut self, envelope: Envelope) {
        let Envelope { group, call, reply } = envelope;
        let owner = shard_of(group, self.config.shard_count);
        if owner != self.config.shard {
            // The server forwards in-process before calling; a misrouted
            // call is the caller's bug, answered rather than trusted.
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
            return;
        }
        let Some(g) = touch(
            &mut self.groups,
            &mut self.touched,
            self.settled_tick,
            group,
        ) else {
            self.stats.calls += 1;
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
            return;
        };
        if let Some(reason) = g.partition.fenced() {
            self.stats.calls += 1;
            let _ = reply.send(Err(CallError::Fenced {
                reason: reason.to_owned(),
            }));
            return;
        }
        if let Err(refusal) = primary_check(&g.partition) {
            self.stats.calls += 1;
            let _ = reply.send(Err(refusal));
            return;
        }
        let reads_state = match &call {
            Call::Poll(_) | Call::GetOffset { .. } => true,
            Call::StoreOffset { offset, .. } => *offset >= g.partition.offset_frontier(),
            _ => false,
        };
        if reads_state {
            let round = match g.partition.read_fence().await {
                Ok(round) => round,
                Err(error) => {
                    self.stats.calls += 1;
                    let _ = reply.send(Err(partition_error(error)));
                    return;
                }
            };
            if !g.partition.replica().read_confirmed(round) {
                if g.reads.len() >= PENDING_READS_MAX {
                    let _ = reply.send(Err(CallError::Unavailable {
                        reason: "too many reads waiting for the group's read check",
                    }));
                    return;
                }
                g.reads.push_back(PendingRead {
                    round,
                    call,
                    reply,
                    since_tick: self.tick,
                });
                self.reading_groups.insert(group);
                return;
            }
        }
        if call.is_replicated() {
            if g.queued.len() >= QUEUED_CALLS_MAX {
                let _ = reply.send(Err(CallError::Unavailable {
                    reason: "too many calls waiting for the group",
                }));
                return;
            }
            g.queued.push_back((call, reply));
            self.pump_session(group).await;
            self.settle().await;
            return;
        }
        self.stats.calls += 1;
        let answer = answer_locally(&mut g.partition, call).await;
        let _ = reply.send(answer);
        // A poll with auto-commit may have started an internal op.
        self.settle().await;
    }

    /// Answers the reads whose read check came back, and refuses those
    /// whose group lost its primary or waited too long.
    async fn serve_reads(&mut self) {
        if self.reading_groups.is_empty() {
            return;
        }
        let reading: Vec<GroupId> = self.reading_groups.iter().copied().collect();
        for id in reading {
            let Some(g) = touch(&mut self.groups, &mut self.touched, self.settled_tick, id) else {
                self.reading_groups.remove(&id);
                continue;
            };
            let mut stores_queued = false;
            while let Some(front) = g.reads.front() {
                let refusal = match g.partition.fenced() {
                    Some(reason) => Some(CallError::Fenced {
                        reason: reason.to_owned(),
                    }),
                    None => primary_check(&g.partition).err(),
                };
                let confirmed =
                    refusal.is_none() && g.partition.replica().read_confirmed(front.round);
                let expired = self.tick.saturating_sub(front.since_tick) > READ_CHECK_TICKS_MAX;
                if !confirmed && refusal.is_none() && !expired {
                    // Rounds only grow, so the reads behind wait too.
                    break;
                }
                let Some(read) = g.reads.pop_front() else {
                    break;
                };
                if let Some(refusal) = refusal {
                    self.stats.calls += 1;
                    let _ = read.reply.send(Err(refusal));
                    continue;
                }
                if !confirmed {
                    self.stats.calls += 1;
                    let _ = read.reply.send(Err(CallError::Unavailable {
                        reason: "the primary could not confirm that it still leads its view",
                    }));
                    continue;
                }
                if read.call.is_replicated() {
                    // An offset store checked against the confirmed state:
                    // the session path refuses it if it is still past the
                    // end.
                    g.queued.push_back((read.call, read.reply));
                    stores_queued = true;
                    continue;
                }
                self.stats.calls += 1;
                let answer = answer_locally(&mut g.partition, read.call).await;
                let _ = read.reply.send(answer);
            }
            if g.reads.is_empty() {
                self.reading_groups.remove(&id);
            }
            if stores_queued {
                self.pump_session(id).await;
            }
        }
    }

    /// Opens the group's session when calls wait for it, and submits the
    /// waiting calls once it is open.
    async fn pump_session(&mut self, group: GroupId) {
        let now_us = u64::try_from(self.env.now().as_micros()).unwrap_or(u64::MAX);
        let tick = self.tick;
        let client = self.client;
        let Some(g) = touch(
            &mut self.groups,
            &mut self.touched,
            self.settled_tick,
            group,
        ) else {
            return;
        };
        if g.queued.is_empty() || g.partition.fenced().is_some() {
            return;
        }
        if let Err(refusal) = primary_check(&g.partition) {
            for (_, reply) in g.queued.drain(..) {
                let _ = reply.send(Err(refusal.clone()));
            }
            return;
        }
        let session = match g.session.step(tick) {
            SessionStep::Submit(session) => session,
            SessionStep::Wait => return,
            SessionStep::Register => {
                let request = ClientRequest {
                    client,
                    session: 0,
                    request: 0,
                    user_id: 0,
                    op: ClientOp::Register,
                };
                match g.partition.submit(request, now_us).await {
                    Ok(RequestOutcome::Prepared { .. } | RequestOutcome::InFlight) => {
                        g.session = Session::Registering { since_tick: tick };
                    }
                    Ok(RequestOutcome::Answered) => {}
                    Ok(_) => {}
                    Err(error) => tracing::warn!(group = group.0, %error, "register failed"),
                }
                return;
            }
        };
        while let Some((call, reply)) = g.queued.pop_front() {
            let op = match call {
                Call::Produce { batch } => ClientOp::Append(batch),
                Call::StoreOffset { kind, id, offset } => {
                    ClientOp::StoreOffset { kind, id, offset }
                }
                Call::DeleteOffset { kind, id } => ClientOp::DeleteOffset { kind, id },
                Call::Purge { generation } => ClientOp::Purge { generation },
                other => {
                    let _ = reply.send(Err(CallError::Rejected {
                        reason: format!("{} is not replicated", other.name()),
                    }));
                    continue;
                }
            };
            let request_number = g.next_request;
            let request = ClientRequest {
                client,
                session,
                request: request_number,
                user_id: 0,
                op,
            };
            match g.partition.submit(request, now_us).await {
                Ok(RequestOutcome::Prepared { .. } | RequestOutcome::InFlight) => {
                    g.next_request += 1;
                    g.in_flight.insert(request_number, InFlight { reply });
                    self.in_flight_groups.insert(group);
                }
                Ok(RequestOutcome::Answered) => {
                    g.next_request += 1;
                    g.in_flight.insert(request_number, InFlight { reply });
                    self.in_flight_groups.insert(group);
                }
                Ok(RequestOutcome::Unavailable) => {
                    let _ = reply.send(Err(CallError::Unavailable {
                        reason: "the group is not taking requests (view change, transfer or full pipeline)",
                    }));
                }
                Ok(RequestOutcome::ReservedClient) => {
                    let _ = reply.send(Err(CallError::Rejected {
                        reason: "reserved client id".into(),
                    }));
                }
                Err(error) => {
                    let _ = reply.send(Err(partition_error(error)));
                }
            }
        }
    }

    /// Matches the replies the partitions delivered to waiting calls, and
    /// submits the calls of sessions that just opened (whose submission
    /// may deliver replies in turn; bounded, as each round opens a session
    /// at most once per group).
    async fn settle(&mut self) {
        self.serve_reads().await;
        for _ in 0..4 {
            let opened = self.settle_replies();
            if opened.is_empty() {
                break;
            }
            for group in opened {
                self.pump_session(group).await;
            }
        }
        self.reschedule_touched();
    }

    /// Matches delivered replies to waiting calls; returns the groups whose
    /// session opened.
    fn settle_replies(&mut self) -> Vec<GroupId> {
        let replies = std::mem::take(&mut *self.replies.borrow_mut());
        let mut opened = Vec::new();
        for (group, reply) in replies {
            if reply.client != self.client {
                continue;
            }
            let Some(g) = self.groups.get_mut(&group) else {
                continue;
            };
            if reply.operation == OPERATION_REGISTER {
                if g.session.on_register_reply(&reply) {
                    opened.push(group);
                }
                continue;
            }
            let Some(flight) = g.in_flight.remove(&reply.request) else {
                continue;
            };
            self.stats.calls += 1;
            let answer = match reply.status {
                ReplyStatus::Ok => Ok(Answer::Committed {
                    op: reply.op,
                    // Set when the partition applied the batch, and kept
                    // with the cached reply, so a retry answered from the
                    // client table reports the original offsets.
                    base_offset: (reply.operation == consensus::vsr::OPERATION_APPEND)
                        .then_some(Offset(reply.result)),
                }),
                ReplyStatus::AlreadyApplied => Err(CallError::Indeterminate {
                    reason: "already applied; its reply is no longer cached",
                }),
                ReplyStatus::NoSession | ReplyStatus::Fenced => {
                    g.session = Session::Closed;
                    Err(CallError::Unavailable {
                        reason: "the group lost this shard's session",
                    })
                }
            };
            let _ = flight.reply.send(answer);
        }
        // Calls whose primary moved away will not be answered by this
        // replica's core: tell their callers the outcome is unknown.
        let flying: Vec<GroupId> = self.in_flight_groups.iter().copied().collect();
        for id in flying {
            let Some(g) = self.groups.get_mut(&id) else {
                self.in_flight_groups.remove(&id);
                continue;
            };
            if g.in_flight.is_empty() {
                self.in_flight_groups.remove(&id);
                continue;
            }
            if !g.partition.replica().is_primary() {
                for (_, flight) in std::mem::take(&mut g.in_flight) {
                    let _ = flight.reply.send(Err(CallError::Indeterminate {
                        reason: "the primary lost its view before the op committed",
                    }));
                }
                g.session = Session::Closed;
            }
        }
        opened
    }
}

impl<E: Env> Shard<E> {
    /// Wires the inboxes of every shard of this replica (by index), where
    /// the metadata plane's effects for other shards' groups go.
    pub fn set_siblings(&mut self, siblings: Vec<Inbox>) {
        self.siblings = siblings;
    }

    /// Group 0, when this shard hosts it.
    pub fn metadata(&self) -> Option<&MetadataHost<E>> {
        self.metadata.as_ref()
    }

    /// A call to the metadata plane.
    pub async fn on_meta(&mut self, call: MetaCall) {
        let Some(host) = self.metadata.as_mut() else {
            if let MetaCall::Submit { reply, .. } = call {
                let _ = reply.send(Err(MetaError::NotHosted));
            }
            return;
        };
        match call {
            MetaCall::Query(query) => query(host.state()),
            MetaCall::Submit { op, user_id, reply } => {
                host.enqueue(op, user_id, reply);
                self.after_metadata_input().await;
            }
        }
    }

    /// After any input to group 0: submit queued ops once the session is
    /// open, answer committed ones, and carry out committed effects.
    async fn after_metadata_input(&mut self) {
        let client = self.client;
        let tick = self.tick;
        for _ in 0..4 {
            let Some(host) = self.metadata.as_mut() else {
                return;
            };
            host.pump(client, tick).await;
            let opened = host.settle(client);
            if host.damage_recovery_caught_up() {
                tracing::info!(
                    applied = host.state().applied().0,
                    "group 0 caught up after its damaged store: reconciling partition groups"
                );
                host.stop_deferring_reconciliation();
                self.reconcile_partitions().await;
                if let Some(host) = self.metadata.as_mut() {
                    host.end_damage_recovery().await;
                }
            }
            self.note_rejoined().await;
            let Some(host) = self.metadata.as_mut() else {
                return;
            };
            let effects = host.group.take_effects();
            for committed in effects {
                self.carry_out_effect(committed.effect).await;
            }
            if !opened {
                break;
            }
        }
    }

    /// While rejoining: once group 0 counts again, records its head as
    /// the last op whose groups the earlier life may have seen.
    async fn note_rejoined(&mut self) {
        let (Some(Rejoin { through_op: None }), Some(host)) = (self.rejoin, self.metadata.as_ref())
        else {
            return;
        };
        if !host.replica().is_quorum_visible() {
            return;
        }
        let marker = Rejoin {
            through_op: Some(host.replica().op()),
        };
        let fs = self.env.fs().clone();
        match rejoin::write(&fs, &self.config.dir, &marker).await {
            Ok(()) => {
                tracing::info!(through_op = ?marker.through_op, "rejoin: group 0 caught up; groups of later ops start as new members");
                self.rejoin = Some(marker);
            }
            // Still unknown: every group created meanwhile rejoins, which
            // is safe; the write is tried again after the next input.
            Err(error) => tracing::warn!(%error, "rejoin marker not updated"),
        }
    }

    async fn carry_out_effect(&mut self, effect: metadata::PartitionEffect) {
        use metadata::PartitionEffect;
        match effect {
            PartitionEffect::CreatePartitionGroup {
                group,
                partition,
                incarnation,
                config,
                ..
            } => {
                let mut spec = spec_of(group, partition.0, incarnation, &config);
                spec.rejoin = self.rejoin.is_some_and(|r| r.covers(Op(incarnation)));
                let (done, _) = futures::channel::oneshot::channel();
                self.route(group, Input::CreateGroup { spec, done }).await;
            }
            PartitionEffect::DeletePartitionGroup { group } => {
                let (done, _) = futures::channel::oneshot::channel();
                self.route(group, Input::DeleteGroup { group, done }).await;
            }
            PartitionEffect::ReconfigurePartitionGroup { group, config } => {
                // What an existing partition can take on: its retention.
                // Segment size and durability are not in an Iggy update
                // and stay what the group was created with.
                let (message_expiry_us, retained_bytes_max) = retention_of(&config);
                self.route(
                    group,
                    Input::Reconfigure {
                        group,
                        message_expiry_us,
                        retained_bytes_max,
                    },
                )
                .await;
            }
            PartitionEffect::PurgePartition { group, generation } => {
                // Every replica's copy of the group learns the committed
                // generation (its transfer install refuses older offers).
                self.route(group, Input::PurgeCommitted { group, generation })
                    .await;
                // Every replica sees the effect; the partition's primary
                // proposes the purge, the others' calls answer NotPrimary.
                let (reply, _) = futures::channel::oneshot::channel();
                let call = Input::Call(Envelope {
                    group,
                    call: Call::Purge { generation },
                    reply,
                });
                self.route(group, call).await;
            }
        }
    }

    /// Serves `input` here when this shard owns `group`, else hands it to
    /// the owning shard's inbox (waiting for room: an effect is never
    /// dropped).
    async fn route(&mut self, group: GroupId, input: Input) {
        let owner = shard_of(group, self.config.shard_count);
        if owner == self.config.shard {
            // Served as the owner's pump serves it (which logs a failed
            // create or delete: nobody waits on a routed one's answer).
            match input {
                Input::CreateGroup { .. }
                | Input::DeleteGroup { .. }
                | Input::Call(_)
                | Input::PurgeCommitted { .. }
                | Input::Reconfigure { .. } => Box::pin(self.on_input(input)).await,
                other => tracing::error!(?other, "not routable"),
            }
            return;
        }
        let Some(inbox) = self.siblings.get_mut(usize::from(owner.0)) else {
            tracing::error!(
                group = group.0,
                shard = owner.0,
                "no inbox for the owning shard"
            );
            return;
        };
        use futures::SinkExt;
        if inbox.send(input).await.is_err() {
            tracing::error!(group = group.0, shard = owner.0, "owning shard stopped");
        }
    }

    /// Boot reconciliation: asks every shard of this replica to hold
    /// exactly the partition groups the committed metadata names.
    pub async fn reconcile_partitions(&mut self) {
        let Some(host) = self.metadata.as_ref() else {
            return;
        };
        if host.recovering_from_damage() {
            // Done when group 0 has caught up (after_metadata_input).
            tracing::warn!(
                "partition groups not reconciled until group 0 has repaired its damaged store from the peers"
            );
            return;
        }
        let live: Vec<GroupSpec> = host
            .state()
            .partition_groups()
            .iter()
            .map(|i| spec_of(i.group, i.partition.0, i.incarnation, &i.config))
            .collect();
        let purges: Vec<(GroupId, u64)> = host
            .state()
            .partition_groups()
            .iter()
            .filter(|i| i.purge_generation > 0)
            .map(|i| (i.group, i.purge_generation))
            .collect();
        let count = self.config.shard_count;
        for index in 0..count {
            if ShardIndex(index) == self.config.shard {
                self.reconcile(&live).await;
            } else if let Some(inbox) = self.siblings.get_mut(usize::from(index)) {
                use futures::SinkExt;
                let _ = inbox.send(Input::Reconcile { live: live.clone() }).await;
            }
        }
        for (group, generation) in purges {
            self.route(group, Input::PurgeCommitted { group, generation })
                .await;
        }
    }

    /// Hands a committed purge generation to the group's transfer driver.
    pub fn learn_purge_generation(&mut self, group: GroupId, generation: u64) {
        if let Some(g) = touch(
            &mut self.groups,
            &mut self.touched,
            self.settled_tick,
            group,
        ) {
            g.driver.learn_committed_purge_generation(generation);
        }
        self.reschedule_touched();
    }

    /// Creates the named groups this shard owns and lacks, deletes the
    /// ones it holds that are not named.
    pub async fn reconcile(&mut self, live: &[GroupSpec]) {
        let mine: BTreeMap<GroupId, GroupSpec> = live
            .iter()
            .filter(|s| shard_of(s.group, self.config.shard_count) == self.config.shard)
            .map(|s| (s.group, *s))
            .collect();
        let held: Vec<GroupId> = self.groups.keys().copied().collect();
        for group in held {
            if !mine.contains_key(&group) {
                tracing::info!(
                    group = group.0,
                    "deleting a group the metadata no longer names"
                );
                if let Err(error) = self.delete_group(group).await {
                    tracing::error!(group = group.0, %error, "reconcile delete failed");
                }
            }
        }
        for (group, spec) in mine {
            if !self.groups.contains_key(&group) {
                if let Err(error) = self.create_group(spec).await {
                    tracing::error!(group = group.0, %error, "reconcile create failed");
                }
            } else {
                // A topic update this replica applied (or learned by a
                // snapshot transfer) but whose effect did not reach the
                // spec before a crash.
                self.reconfigure_group(group, spec.message_expiry_us, spec.retained_bytes_max)
                    .await;
            }
        }
    }

    /// Gives a held group its topic's current retention settings and
    /// records them in its spec. A failed rewrite is logged and the
    /// settings still apply in memory: boot's reconciliation gives them
    /// again from the committed metadata.
    pub async fn reconfigure_group(
        &mut self,
        group: GroupId,
        message_expiry_us: u64,
        retained_bytes_max: u64,
    ) {
        let fs = self.env.fs().clone();
        let root = self.config.dir.clone();
        let Some(g) = touch(
            &mut self.groups,
            &mut self.touched,
            self.settled_tick,
            group,
        ) else {
            return;
        };
        if g.spec.message_expiry_us == message_expiry_us
            && g.spec.retained_bytes_max == retained_bytes_max
        {
            return;
        }
        let spec = GroupSpec {
            message_expiry_us,
            retained_bytes_max,
            ..g.spec
        };
        g.spec = spec;
        match catalog::rewrite_spec(&fs, &root, &spec).await {
            Ok(()) => tracing::info!(
                group = group.0,
                message_expiry_us,
                retained_bytes_max,
                "partition group retention reconfigured"
            ),
            Err(error) => tracing::warn!(
                group = group.0,
                %error,
                "retention reconfigured in memory; the spec rewrite failed (boot reconciliation applies it again)"
            ),
        }
        self.reschedule_touched();
    }
}

fn add_transfer_totals<F: Fs>(totals: &mut TransferTotals, driver: &TransferDriver<F>) {
    let stats = driver.stats();
    totals.received_bytes += driver.receiver().stats().chunk_bytes;
    totals.chunks_served += stats.chunks_served;
    totals.offers_served += stats.offers_served;
    totals.install_failures += stats.install_failures;
}

/// A receiving session's progress: what its artifacts hold so far against
/// what the accepted manifest declares.
fn transfer_progress<F: Fs>(driver: &TransferDriver<F>) -> Option<TransferProgress> {
    use consensus::ChunkProgress;
    let session = driver.receiver().session()?;
    let (received_bytes, expected_bytes) = session.accepted().map_or((0, 0), |accepted| {
        accepted.artifacts.iter().fold((0u64, 0u64), |(r, e), a| {
            (
                r.saturating_add(a.received_len()),
                e.saturating_add(a.declared_len()),
            )
        })
    });
    Some(TransferProgress {
        peer: session.peer,
        received_bytes,
        expected_bytes,
    })
}

/// The spec of a partition group the metadata plane names.
pub fn spec_of(
    group: GroupId,
    partition_id: u32,
    incarnation: u64,
    config: &metadata::PartitionGroupConfig,
) -> GroupSpec {
    let mut spec = GroupSpec::new(group, partition_id);
    spec.incarnation = incarnation;
    // Every committed batch is written to its segment before its reply
    // goes out (SPEC §6.1: a killed process never loses an acknowledged
    // write); whether it is also synced is the durability mode's call.
    spec.messages_required_to_save = 1;
    if config.segment_size_bytes > 0 {
        spec.segment_size_bytes = config.segment_size_bytes;
    }
    spec.enforce_fsync = config.durability == metadata::Durability::Persisted;
    (spec.message_expiry_us, spec.retained_bytes_max) = retention_of(config);
    spec
}

/// The retention settings of a group with `config`: the message expiry
/// (µs, 0 = never) and the sealed segments' size ceiling (0 = none).
fn retention_of(config: &metadata::PartitionGroupConfig) -> (u64, u64) {
    let expiry = match config.message_expiry {
        metadata::MessageExpiry::After { micros } => micros,
        metadata::MessageExpiry::ServerDefault | metadata::MessageExpiry::Never => 0,
    };
    (expiry, config.retained_bytes_max)
}

/// The group `id`, caught up on the ticks it was not visited for (through
/// `settled`, the last tick whose due groups were all visited), so it is
/// exactly where ticking it every tick would have left it, and marked for
/// rescheduling. Every input to a group goes through here.
fn touch<'a, E: Env>(
    groups: &'a mut BTreeMap<GroupId, Group<E>>,
    touched: &mut Vec<GroupId>,
    settled: u64,
    id: GroupId,
) -> Option<&'a mut Group<E>> {
    let g = groups.get_mut(&id)?;
    if g.counted_to < settled {
        g.partition.skip_ticks(settled - g.counted_to);
        g.counted_to = settled;
    }
    touched.push(id);
    Some(g)
}

/// The shard tick a group is next due at, after `settled` (the last tick
/// whose due groups were all visited): the next one while it has work
/// every tick needs (a running transfer, calls waiting for its session, a
/// fence not yet reported), its retention tick when its topic has a
/// retention setting, its purge retry while it owes a committed purge,
/// otherwise when the partition says
/// (`Partition::ticks_until_due`).
fn next_visit<E: Env>(g: &Group<E>, tick_us: u64, settled: u64) -> u64 {
    let every_tick = !g.queued.is_empty()
        || (g.partition.fenced().is_some() && !g.fenced_reported)
        || !g.driver.is_idle(&g.partition);
    let due_in = if every_tick {
        1
    } else {
        g.partition.ticks_until_due(tick_us)
    };
    let mut at = g.counted_to.saturating_add(due_in);
    // A committed purge the partition has not applied: its primary
    // proposes it on a visit (`propose_missing_purge`), and a group with
    // no timers of its own (a single replica's) would never be visited.
    if g.driver
        .committed_purge_generation()
        .is_some_and(|committed| committed > g.partition.purge_generation())
    {
        let retry = g.purge_proposed.map_or(g.counted_to + 1, |(_, proposed)| {
            proposed + PURGE_RETRY_TICKS
        });
        at = at.min(retry);
    }
    if g.spec.retains() {
        let next_pass = (g.counted_to / RETENTION_EVERY_TICKS + 1) * RETENTION_EVERY_TICKS;
        at = at.min(next_pass);
    }
    at.max(settled + 1)
}

/// A call this replica answers from its own state: a read (after its read
/// check), a flush or the counters.
async fn answer_locally<E: Env>(
    partition: &mut ShardPartition<E>,
    call: Call,
) -> Result<Answer, CallError> {
    match call {
        Call::Poll(request) => partition
            .poll(&request)
            .await
            .map(Answer::Polled)
            .map_err(|e| match e {
                partitions::PollError::HistoryMissing { .. } => CallError::Unavailable {
                    reason: "history missing until a state transfer",
                },
                other => CallError::Local {
                    reason: other.to_string(),
                },
            }),
        Call::GetOffset { kind, id } => Ok(Answer::Offset(partition.stored_offset(kind, id))),
        Call::Flush => partition
            .flush_committed_messages()
            .await
            .map(|_| Answer::Done)
            .map_err(partition_error),
        Call::Stats => Ok(Answer::Stats(partition.stats())),
        // Replicated calls go through the group's session.
        replicated => Err(CallError::Rejected {
            reason: format!("{} is replicated", replicated.name()),
        }),
    }
}

fn primary_check<B: MessageBus, S: journal::SuperblockStore, F: Fs>(
    partition: &Partition<B, S, F>,
) -> Result<(), CallError> {
    let replica = partition.replica();
    if partition.state_transfer_needed().is_some() || partition.missing_history().is_some() {
        return Err(CallError::Unavailable {
            reason: "state transfer in progress",
        });
    }
    if !replica.is_primary() {
        let view = replica.view();
        return Err(CallError::NotPrimary {
            view,
            primary: replica.primary_index(view),
        });
    }
    if !replica.is_caught_up_primary() {
        return Err(CallError::Unavailable {
            reason: "view change in progress",
        });
    }
    Ok(())
}

fn partition_error(error: PartitionError) -> CallError {
    match error {
        PartitionError::Fenced { .. } => CallError::Fenced {
            reason: error.to_string(),
        },
        PartitionError::InstallInProgress { .. } => CallError::Unavailable {
            reason: "the partition is installing a state transfer",
        },
        PartitionError::InvalidOp(_)
        | PartitionError::StoreOffsetBeyondEnd { .. }
        | PartitionError::PurgeGenerationNotNewer { .. } => CallError::Rejected {
            reason: error.to_string(),
        },
        other => CallError::Local {
            reason: other.to_string(),
        },
    }
}

/// The directory of shard `shard` under a replica's data directory.
pub fn shard_dir(data_dir: &Path, shard: ShardIndex) -> PathBuf {
    data_dir.join(format!("shard-{}", shard.0))
}
