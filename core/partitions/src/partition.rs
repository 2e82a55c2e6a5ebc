//! The [`Partition`]: one partition group's state machine and the driver of
//! its VSR replica.
//!
//! The VSR [`Replica`] is the group's consensus; the partition feeds it
//! frames, ticks and client requests and carries out its actions:
//!
//! - `PersistState` → [`Superblock::persist_view`], then
//!   [`Replica::on_persisted`] with exactly the values written (a failed
//!   write is retried on the next tick; until then the core keeps holding
//!   its sends);
//! - `Apply` → the committed op is applied ([`crate::ops::PartitionOp`]):
//!   a batch enters the in-memory [`PrepareJournal`] (readable at once,
//!   flushed to segments by thresholds), a consumer-offset op is made
//!   durable, a purge truncates the partition;
//! - `Send` / `Reply` → the [`MessageBus`].
//!
//! Every mutating call takes `&mut self`, and a future holding it runs to
//! completion before the next input: that exclusive borrow *is* the
//! partition's write lock, so flush, purge, retention and apply never
//! interleave (the reference needed an async mutex for the same effect).
//!
//! **Boot** ([`Partition::open`]): the superblock first (view, log_view,
//! commit bound, applied point with its offset frontier), then the purge
//! generation, then the segments (`storage::SegmentedLog::open`, which
//! sweeps staging files, cuts a torn tail and rebuilds indexes), then the
//! consumer offsets clamped to the recovered end. A superblock frontier
//! above the recovered end is refused, because the frontier only advances
//! after the data below it was synced (see `flush.rs`), so such a record
//! means synced data vanished. A single replica then resumes at once: its
//! offset counter is what the segments prove, its op numbers continue past
//! the commit bound.
//!
//! **Restart with peers.** The prepare journal is memory-only, so a replica
//! of a multi-replica group restarts from the *applied point* its flushes
//! record in the superblock (`checkpoint_op`, `checkpoint_checksum`, and
//! the offset frontier after that op; `flush.rs`): the VSR core restarts
//! with `commit_min = checkpoint_op` and the hash chain continuing from its
//! identity, quorum-invisible until repair brought its journal to the head
//! the primary reports (docs/consensus.md §4). The partition's next offset
//! for the base-offset checks and the apply path is the frontier at that
//! op, not the end of the segments: a flush may have synced batches of
//! later ops before the process died short of the superblock write. The
//! log end recovered at boot (`recovered_durable_offset`) tells those
//! apart: a committed batch re-applied whose offsets lie at or below it is
//! already on disk, so it advances the applied offset (its base offset
//! checked against it like every batch) but is neither written nor counted
//! again; a batch that straddles it fences the partition
//! ([`PartitionError::ReplayStraddlesRecoveredEnd`]; flushes write whole
//! batches, so it cannot happen). Consumer-offset ops re-applied in order
//! store what they stored before; a purge re-applied runs again only if
//! `purge.gen` shows it unfinished (see `purge.rs`). When the peers no
//! longer retain the ops after the applied point, repair concludes
//! `FloorRefused` and the core asks for a state transfer: the partition
//! records the need ([`Partition::state_transfer_needed`]) and its transfer
//! driver (`state_transfer`, run by the shard) pulls the state from a
//! peer; until the install lands the replica stays lagging and invisible.
//! A record with a frontier but no
//! applied point (written before it existed) is refused with
//! [`crate::BootError::RestartNeedsStateTransfer`].
//!
//! The client table is not durable: a restarted replica rebuilds only the
//! sessions of the ops it re-applies. A request ordered twice whose first
//! copy is at or below the applied point is therefore not recognised as a
//! duplicate there (docs/consensus.md §9).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::{ConsumerKind, Offset, Op, ReplicaId};
use consensus::ClientTableError;
use consensus::DedupWatermark;
use consensus::vsr::{
    Action, Config as VsrConfig, Effect, Frame, Handled, Ignored, Message, OPERATION_REGISTER,
    Prepare, PrepareHeader, Replica, Reply, ReplyStatus, Request, RequestOutcome,
};
use journal::{
    EntryStats, JournalEntry, JournalError, JournalLimits, PrepareJournal, Superblock,
    SuperblockStore,
};
use storage::StorageError;
use storage::fs::Fs;
use storage::{BatchHeader, Integrity};
use storage::{LogConfig, SegmentedLog};

use crate::bus::MessageBus;
use crate::error::PartitionError;
use crate::health::Health;
use crate::missing_history::MissingHistory;
use crate::offsets::ConsumerOffsets;
use crate::ops::{OpDecodeError, PartitionOp};

/// Default `messages_required_to_save`: flush once this many messages wait.
pub const MESSAGES_REQUIRED_TO_SAVE_DEFAULT: u64 = 1024;
/// Default size threshold: flush once this many bytes wait (1 MiB).
pub const SIZE_REQUIRED_TO_SAVE_BYTES_DEFAULT: u64 = 1024 * 1024;
/// The client id the partition itself uses to replicate poll auto-commits.
pub const INTERNAL_CLIENT: u128 = u128::MAX;
/// How long the internal client waits for its Register before re-sending.
const REGISTER_RETRY_US: u64 = 1_000_000;

/// Static configuration of one partition replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionConfig {
    /// The partition id stamped into every batch header.
    pub partition_id: u32,
    /// The partition incarnation (`purge.gen` records belong to one).
    pub created_revision: u64,
    /// The cluster id recorded in the superblock.
    pub cluster: u128,
    /// Flush once this many committed messages wait in the journal.
    pub messages_required_to_save: u64,
    /// Flush once this many bytes wait in the journal.
    pub size_required_to_save_bytes: u64,
    /// Sync every flush, flush every commit, and hold the client's reply
    /// until the sync returned.
    pub enforce_fsync: bool,
    /// Segment size, index density, batch ceiling, read integrity.
    pub log: LogConfig,
    /// Bounds of the in-memory journal of unflushed batches.
    pub journal: JournalLimits,
    /// The group's VSR configuration (replica index, count, group id…).
    pub vsr: VsrConfig,
    /// A directory with no superblock yet belongs to a replica that may
    /// have acknowledged ops of this group in an earlier life (its disk
    /// was replaced): it starts under the restart rule from nothing —
    /// quorum-invisible until it caught up with a primary of its peers
    /// (docs/consensus.md §4) — instead of as a new member. Ignored for a
    /// single replica, which has nobody to catch up from.
    pub rejoin: bool,
    /// In a multi-replica group, the longest the recorded applied point
    /// may trail the applied ops, in driver time (µs; 0 = no time bound):
    /// what a whole-group restart of a `replicated` group can lose, since
    /// the census starts from the longest recorded point and a restarted
    /// replica keeps no batch past its own (docs/consensus.md §4). The
    /// price is a sync and a superblock write per interval per busy group.
    pub record_interval_us: u64,
    /// Bytes of spilled batches one answer to a peer's repair reads back
    /// from the segments at most (`retained.rs`); the highest ops of the
    /// slice are served first and the peer asks again for the rest.
    pub read_back_bytes_per_slice: u64,
    /// Bytes of batches one poll returns at most (whole batches: the first
    /// is always returned, whatever its size, so a poll makes progress);
    /// the client polls again for the rest.
    pub poll_reply_bytes_max: u64,
    /// The tag of this machine boot (`journal::boot_tag_of`; 0 unknown).
    /// A member of a multi-replica group without `enforce_fsync` keeps
    /// its replica log in the page cache, unsynced, when it is known: the
    /// log then survives a process kill (not a power loss), and the
    /// replica resumes from it instead of restarting without its journal
    /// (docs/consensus.md §4, "Kept replica logs").
    pub boot_tag: u32,
}

/// Default `record_interval_us`: a tenth of a second.
pub const RECORD_INTERVAL_US_DEFAULT: u64 = 100_000;

impl PartitionConfig {
    /// Defaults around a VSR configuration. A single replica serves no
    /// repair, so its core is set to retain no applied prepares (it counts
    /// ops, not bytes: 1,024 retained batches of 1 MiB would hold 1 GiB).
    pub fn new(mut vsr: VsrConfig) -> Self {
        if vsr.replica_count == 1 {
            vsr.retention_ops = 0;
        }
        Self {
            partition_id: 0,
            created_revision: 0,
            cluster: 0,
            messages_required_to_save: MESSAGES_REQUIRED_TO_SAVE_DEFAULT,
            size_required_to_save_bytes: SIZE_REQUIRED_TO_SAVE_BYTES_DEFAULT,
            enforce_fsync: false,
            log: LogConfig::default(),
            journal: JournalLimits::default(),
            vsr,
            rejoin: false,
            record_interval_us: RECORD_INTERVAL_US_DEFAULT,
            read_back_bytes_per_slice: crate::retained::READ_BACK_BYTES_PER_SLICE_DEFAULT,
            poll_reply_bytes_max: crate::poll::POLL_REPLY_BYTES_MAX_DEFAULT,
            boot_tag: 0,
        }
    }
}

/// A client request, before it becomes a prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRequest {
    /// The client id (0 is reserved).
    pub client: u128,
    /// The client's session (the op of its Register; 0 for a Register).
    pub session: u64,
    /// The request number (0 for a Register).
    pub request: u64,
    /// The user the session belongs to.
    pub user_id: u32,
    /// What to do.
    pub op: ClientOp,
}

/// What a client asks of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// Open a session.
    Register,
    /// Append a batch, as the client encoded it (offsets and timestamps
    /// are stamped by the primary).
    Append(Vec<u8>),
    /// Store a consumer offset explicitly (may rewind).
    StoreOffset {
        /// Consumer or group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
        /// The last consumed offset.
        offset: Offset,
    },
    /// Delete a consumer offset.
    DeleteOffset {
        /// Consumer or group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
    },
    /// Purge the partition up to `generation`: a newer generation than the
    /// applied one purges; one already applied commits as nothing, so its
    /// answer confirms the purge is in the group's committed history.
    Purge {
        /// The generation (1 or more).
        generation: u64,
    },
}

/// Counters of a partition (committed state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PartitionStats {
    /// Messages held (committed, not yet removed by retention or purge).
    pub messages_count: u64,
    /// Bytes of the batches held.
    pub size_bytes: u64,
    /// Segments on disk (sealed and active).
    pub segments_count: u64,
    /// The last committed offset, `None` when nothing is committed.
    pub current_offset: Option<Offset>,
}

/// The offset state after a run of ops: what the next batch must start at
/// and the purge generation in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetState {
    pub next_offset: u64,
    pub purge_generation: u64,
    pub last_timestamp: u64,
}

/// The last op entered into the partition journal (or, before any, the
/// applied point booted from) and the next offset after it: what a flush
/// that writes the whole journal records as the durable applied point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AppliedPoint {
    pub op: u64,
    pub checksum: u128,
    pub next_offset: u64,
}

/// A state transfer the VSR core asked for (`Effect::StartStateTransfer`,
/// after repair concluded `FloorRefused`), for the transfer driver
/// (`state_transfer`) to carry out; the replica stays lagging and serves
/// nothing new until the install lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTransferNeeded {
    /// The replica to transfer from.
    pub peer: ReplicaId,
    /// The highest op below every peer's retained range.
    pub floor: Op,
    /// The op repair was trying to reach.
    pub to_op: Op,
}

/// The replicated-but-internal client through which poll auto-commits
/// become StoreOffset ops.
#[derive(Debug, Default)]
pub(crate) struct AutoCommits {
    pub session: Option<u64>,
    /// When the pending Register was sent (µs); a lost one is re-sent.
    pub registering_since_us: Option<u64>,
    pub next_request: u64,
    pub pending: BTreeMap<(ConsumerKind, u32), u64>,
}

impl AutoCommits {
    /// Queues an auto-commit of `offset` for `(kind, id)` (a poll's),
    /// keeping the highest one queued.
    pub(crate) fn queue(&mut self, kind: ConsumerKind, id: u32, offset: u64) {
        let slot = self.pending.entry((kind, id)).or_insert(offset);
        *slot = (*slot).max(offset);
    }

    /// Drops the queued auto-commits: they name offsets of a log that a
    /// purge or an install replaced.
    pub(crate) fn forget_pending(&mut self) {
        self.pending.clear();
    }
}

/// One partition replica. Generic over the bus `B`, the superblock store
/// `S` and the filesystem `F`.
///
/// The fields are `pub(crate)` so that the files implementing the
/// partition can read them; each is written in one module only, the one
/// its comment names (this one when none is named). Another file that
/// changes that state calls the owner's named method (a purge
/// [`Self::applied_log_purged`], retention [`Self::count_removed_segment`],
/// an install [`Self::applied_installed`]...), so the writers of a field
/// are found next to it. The sub-objects (`replica`, `log`, `journal`,
/// `offsets`, `durable`, `retained`, `client_slots`) guard their own state
/// behind their methods.
pub struct Partition<B: MessageBus, S: SuperblockStore, F: Fs> {
    pub(crate) config: PartitionConfig,
    pub(crate) fs: F,
    pub(crate) dir: PathBuf,
    pub(crate) bus: B,
    pub(crate) durable: Superblock<S>,
    pub(crate) replica: Replica,
    pub(crate) log: SegmentedLog<F>,
    pub(crate) journal: PrepareJournal,
    pub(crate) offsets: ConsumerOffsets,
    /// The offset after the last applied batch: the commit ceiling of polls
    /// and the frontier a transfer would ship.
    pub(crate) applied_next_offset: u64,
    pub(crate) applied_last_timestamp: u64,
    pub(crate) applied_purge_generation: u64,
    pub(crate) messages_count: u64,
    pub(crate) size_bytes: u64,
    /// The last offset recovered at boot: re-applied batches at or below
    /// it are already on disk (cleared by a purge).
    pub(crate) recovered_durable_offset: Option<u64>,
    /// The frontier of the last state-transfer install (offers report it;
    /// a purge clears it).
    pub(crate) installed_frontier: Option<u64>,
    /// The last journaled op and the offset after it (see `flush.rs`).
    pub(crate) journaled_point: AppliedPoint,
    /// The last state transfer the core asked for.
    pub(crate) state_transfer_needed: Option<StateTransferNeeded>,
    /// Set while the durable transfer-needed record stands (after a
    /// converge): nothing below its frontier is held here.
    pub(crate) missing_history: Option<MissingHistory>,
    /// A read found a committed batch whose bytes fail their checksums (a
    /// poll sets it; the next tick turns it into a repair, see
    /// [`Self::repair_damage`]).
    pub(crate) damage_found: Cell<bool>,
    /// Where the next scrub step starts (`scrub.rs`, which resets it with
    /// every new log).
    pub(crate) scrub_cursor: crate::scrub::ScrubCursor,
    /// The index entries the scrub derived in the segment it is walking
    /// (`scrub.rs`).
    pub(crate) scrub_index: crate::scrub::DerivedIndex,
    /// Sealed-segment indexes the scrub found different from their log and
    /// rewrote (`scrub.rs`).
    pub(crate) scrub_index_rewrites: u64,
    pub(crate) now_us: u64,
    /// The applied op sampled over the replay window (`append.rs`).
    pub(crate) replay_samples: crate::append::ReplaySamples,
    /// Driver time of the last applied-point record (or of the boot;
    /// `flush.rs`).
    pub(crate) recorded_at_us: u64,
    /// Set while [`Partition::on_tick`] drives the core: the time-based
    /// record of a lagging applied point is made only then (flush.rs).
    pub(crate) ticking: bool,
    /// Flushed Append bodies the core still holds for repair, counted
    /// against the shard's byte budget (`retained.rs`).
    pub(crate) retained: crate::retained::RetainedBodies,
    /// Repair slices served with bodies read back from segments, and the
    /// bodies read (`retained.rs`).
    pub(crate) read_back_slices: u64,
    pub(crate) read_back_bodies: u64,
    /// Which client-table slot the next record takes (`client_sessions.rs`).
    pub(crate) client_slots: crate::client_sessions::ClientTableSlots,
    /// Whether an applied client op changed the table since it was last
    /// written (a single replica writes it before the step's replies;
    /// `flush.rs`).
    pub(crate) clients_dirty: bool,
    /// The results of the appends the current drive step applied, by op,
    /// for the replies the core built before they were applied.
    pub(crate) reply_results: Vec<(u64, u64)>,
    pub(crate) pending_replies: Vec<Reply>,
    pub(crate) auto_commits: RefCell<AutoCommits>,
    /// Whether the partition takes input, and the durable writes owed a
    /// retry (`health.rs`).
    pub(crate) health: Health,
    /// The state-transfer install in flight, carried out a bounded number
    /// of file operations per call (`install/`, its owner). While it
    /// is set the partition refuses every input: its log is being swapped
    /// on disk under the one in memory.
    pub(crate) install: Option<Box<crate::install::InstallJob<F>>>,
    /// A `persisted` group member's durable log of its VSR journal,
    /// written and synced at the end of each step before the step's frames
    /// leave (docs/consensus.md §4, "Resume from a durable journal").
    pub(crate) replica_log: Option<journal::ReplicaLog<F>>,
    /// The frames of the current step, held until the replica log holds
    /// what they vouch for.
    pub(crate) held_frames: Vec<(ReplicaId, Frame)>,
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> fmt::Debug for Partition<B, S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partition")
            .field("dir", &self.dir)
            .field("replica", &self.config.vsr.replica)
            .field("commit_min", &self.replica.commit_min().0)
            .field("applied_next_offset", &self.applied_next_offset)
            .field("fenced", &self.health.fenced())
            .finish_non_exhaustive()
    }
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    // ----- accessors --------------------------------------------------------

    /// The durable transfer-needed record, while it stands: a converge left
    /// this replica applied at `commit_op` holding nothing below
    /// `frontier`. Until an install clears it the replica reports
    /// [`Self::state_transfer_needed`], serves no offer, refuses polls
    /// below the frontier ([`crate::poll::PollError::HistoryMissing`]) and,
    /// in a group, stays out of every quorum: it sends no PrepareOk,
    /// StartViewChange, DoViewChange, and, should it be primary, no
    /// Prepare, Commit or StartView; it takes no DoViewChange (so it cannot
    /// assemble a view as its primary) and no client request.
    pub fn missing_history(&self) -> Option<MissingHistory> {
        self.missing_history
    }

    /// Marks the history below `record.frontier` missing in memory and
    /// asks for a transfer (the durable record is the caller's).
    pub(crate) fn mark_history_missing(&mut self, record: MissingHistory) {
        self.missing_history = Some(record);
        self.health.missing_history_cleared();
        if self.state_transfer_needed.is_none() && self.config.vsr.replica_count > 1 {
            let me = self.config.vsr.replica;
            let primary = self.replica.primary_index(self.replica.view());
            let peer = if primary == me {
                ReplicaId((me.0 + 1) % self.config.vsr.replica_count)
            } else {
                primary
            };
            self.state_transfer_needed = Some(StateTransferNeeded {
                peer,
                floor: record.commit_op,
                to_op: self.replica.commit_max().max(record.commit_op),
            });
        }
        tracing::warn!(dir = %self.dir.display(), frontier = record.frontier.0, op = record.commit_op.0, "history below the frontier is missing: lagging until a state transfer installs");
    }

    /// The transfer-needed record is gone (a completed install removed
    /// it): the history is whole again.
    pub(crate) fn history_restored(&mut self) {
        self.missing_history = None;
        self.health.missing_history_cleared();
    }

    /// An install completed: no transfer is needed any more, and no
    /// transfer-needed record is owed.
    pub(crate) fn transfer_completed(&mut self) {
        self.health.missing_history_recorded();
        self.state_transfer_needed = None;
    }

    /// Replaces the segment set (purge, install, converge). The scrub's
    /// cursor starts over with it: a batch boundary of the old files, read
    /// in the new ones, would be reported as damage. Every replacement goes
    /// through here so that no site can forget the reset.
    pub(crate) fn replace_log(&mut self, log: SegmentedLog<F>) {
        self.log = log;
        self.restart_scrub();
    }

    /// Notes a read that found committed bytes failing their checksums
    /// (bit rot, a torn sector, a foreign write): nothing of it was
    /// served, and the next tick starts the repair.
    pub(crate) fn note_damage(&self, error: &StorageError) {
        if let StorageError::Corrupt {
            path,
            position,
            source,
        } = error
            && !self.damage_found.replace(true)
        {
            tracing::error!(path = %path.display(), position, %source, group = %self.config.vsr.group, "damaged batch in a segment: never served; repairing from a peer");
        }
    }

    /// A member of a group whose committed data is damaged treats its
    /// whole history as missing: it records so durably
    /// (`state_transfer::missing`), serves no poll below its frontier and
    /// no offer, stays out of every quorum (so it neither becomes primary
    /// with the damage nor counts as holding what it lost), and asks for a
    /// state transfer, whose install replaces its segments with a peer's.
    /// A single replica has no peer: its polls keep answering the typed
    /// storage error for the damaged range.
    async fn repair_damage(&mut self) {
        self.damage_found.set(false);
        if self.config.vsr.replica_count == 1 || self.missing_history.is_some() {
            return;
        }
        let record = MissingHistory {
            commit_op: self.replica.commit_min(),
            frontier: Offset(self.applied_next_offset),
        };
        self.mark_history_missing(record);
        self.retry_missing_history_record(record).await;
    }

    /// Whether this replica must stay out of quorums (a group member with
    /// missing history).
    fn quorum_withheld(&self) -> bool {
        self.missing_history.is_some() && self.config.vsr.replica_count > 1
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The group's replica core.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The configuration.
    pub fn config(&self) -> &PartitionConfig {
        &self.config
    }

    /// The next offset the partition will mint once every applied op is
    /// counted (the offset frontier a transfer ships).
    pub fn offset_frontier(&self) -> Offset {
        Offset(self.applied_next_offset)
    }

    /// The frontier the superblock durably holds.
    pub fn durable_offset_frontier(&self) -> Offset {
        self.durable.state().offset_frontier
    }

    /// The last offset recovered from segments at boot.
    pub fn recovered_durable_offset(&self) -> Option<Offset> {
        self.recovered_durable_offset.map(Offset)
    }

    /// Counts this group's flushed Append bodies against `budget` (shared
    /// by a shard's groups) instead of its own unbounded one, letting go
    /// of bodies at once if that takes the budget past its ceiling.
    pub fn share_retained_budget(&mut self, budget: crate::retained::RetainedBudget) {
        self.retained.share(budget, &mut self.replica);
    }

    /// Lets go of every flushed Append body this group's core holds for
    /// repair (a peer's repair reads them back from the segments). A host
    /// calls it for a group that stayed idle, so that the shared budget
    /// serves the groups that write.
    pub fn release_retained(&mut self) {
        self.retained.release_all(&mut self.replica);
    }

    /// Bytes of flushed Append bodies this group's core holds for repair.
    pub fn retained_bytes(&self) -> u64 {
        self.retained.bytes()
    }

    /// Repair slices this group served by reading bodies back from its
    /// segments, and the bodies it read (`retained.rs`).
    pub fn read_backs(&self) -> (u64, u64) {
        (self.read_back_slices, self.read_back_bodies)
    }

    /// The state transfer the core asked for, while it still waits for one
    /// (repair concluded `FloorRefused`: the ops this replica lacks are
    /// below every peer's retained range). `None` once the core resumed
    /// repairing, unless the transfer-needed record stands
    /// ([`Self::missing_history`]): then until an install clears it.
    pub fn state_transfer_needed(&self) -> Option<StateTransferNeeded> {
        self.state_transfer_needed
            .filter(|_| self.replica.is_transferring() || self.quorum_withheld())
    }

    /// Where the offset space starts after a state-transfer install.
    pub fn installed_frontier(&self) -> Option<Offset> {
        self.installed_frontier.map(Offset)
    }

    /// The purge generation applied (and recorded in `purge.gen`).
    pub fn purge_generation(&self) -> u64 {
        self.applied_purge_generation
    }

    /// The superblock store (e.g. to carry a `MemSuperblock` across a
    /// simulated reboot).
    pub fn superblock(&self) -> &S {
        self.durable.store()
    }

    /// The filesystem handle.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Changes the flush thresholds (messages, bytes) at run time.
    pub fn set_flush_thresholds(&mut self, messages: u64, size_bytes: u64) {
        self.config.messages_required_to_save = messages;
        self.config.size_required_to_save_bytes = size_bytes;
    }

    /// Changes `record_interval_us` at run time (0: no time bound).
    pub fn set_record_interval(&mut self, interval_us: u64) {
        self.config.record_interval_us = interval_us;
    }

    /// The segment log.
    pub fn log(&self) -> &SegmentedLog<F> {
        &self.log
    }

    /// The consumer offsets (live maps and durable records).
    pub fn consumer_offsets(&self) -> &ConsumerOffsets {
        &self.offsets
    }

    /// The live stored offset of `(kind, id)`.
    pub fn stored_offset(&self, kind: ConsumerKind, id: u32) -> Option<Offset> {
        self.offsets.get(kind, id)
    }

    /// The consumer offsets committed stores left, identical on every
    /// replica that applied the same ops.
    pub fn durable_offsets(&self) -> &crate::offsets::DurableOffsets {
        self.offsets.durable()
    }

    /// Called last when the replica stops cleanly (after the final flush,
    /// with nothing sent after it): when this replica of a group of
    /// several is `Normal` in a view whose log it installed and has
    /// acknowledged nothing past its durable applied point, records that,
    /// so the next boot resumes it as a full member of the view instead of
    /// a quorum-invisible one (`journal::clean_stop`). Returns whether it
    /// recorded; when it does not, the next boot restarts under the rule
    /// of docs/consensus.md §4.
    ///
    /// # Errors
    /// The record's write failed (nothing usable is left behind).
    pub async fn record_clean_stop(&mut self) -> Result<bool, PartitionError> {
        let Some(stop) = self.clean_stop() else {
            return Ok(false);
        };
        journal::record_clean_stop(&self.fs, &self.dir, &stop)
            .await
            .map_err(|source| {
                PartitionError::Storage(StorageError::Io {
                    op: "write",
                    path: self.dir.join(journal::CLEAN_STOP_FILE),
                    source,
                })
            })?;
        Ok(true)
    }

    /// The clean-stop record this replica may write now (see
    /// [`Self::record_clean_stop`]), for a caller that writes the records
    /// of many groups at once; `None` when it must restart under the rule.
    pub fn clean_stop(&self) -> Option<journal::CleanStop> {
        let r = &self.replica;
        let sb = *self.durable.state();
        let clean = self.config.vsr.replica_count > 1
            && self.health.fenced().is_none()
            && self.install.is_none()
            && self.missing_history().is_none()
            && self.state_transfer_needed().is_none()
            && r.status() == consensus::vsr::Status::Normal
            && r.log_view() == r.view()
            && r.op() == r.commit_min()
            && sb.view == r.view()
            && sb.log_view == r.log_view()
            && sb.checkpoint_op == r.commit_min()
            && sb.checkpoint_checksum == r.commit_min_checksum()
            && sb.commit_max <= r.commit_min()
            && self.journal.info().messages_count == 0;
        clean.then_some(journal::CleanStop {
            view: sb.view,
            log_view: sb.log_view,
            op: sb.checkpoint_op,
            checksum: sb.checkpoint_checksum,
        })
    }

    /// Why the partition is fenced, if it is.
    pub fn fenced(&self) -> Option<&str> {
        self.health.fenced()
    }

    /// Whether the partition's disk is full: its writes are refused,
    /// reads are served, and a tick retries the flush with a backoff until
    /// it lands (then writes resume).
    pub fn out_of_space(&self) -> bool {
        self.health.retries().no_space().is_some()
    }

    /// While the disk is full, the error a write is refused with
    /// ([`PartitionError::NoSpace`], naming the directory).
    pub fn space_refusal(&self) -> Option<PartitionError> {
        self.check_space().err()
    }

    /// Checks what must hold between any two inputs: the VSR core's own
    /// invariants, and, unless the partition is fenced or its history is
    /// missing, that the recorded applied point and
    /// its offset frontier are not past what was applied, that no op past
    /// the applied one was applied into the log, and that no committed
    /// consumer offset names an offset past both the applied end and the
    /// log's end. The simulator checks every partition after every step,
    /// and a debug build after every input that reached the core.
    pub fn invariants(&self) -> Result<(), consensus::vsr::InvariantViolation> {
        self.replica.invariants()?;
        // A partition whose history is missing (an install under way, or
        // one that failed part-way) records the transfer's point before
        // its core applies it; a fenced one refuses everything.
        if self.health.fenced().is_some()
            || self.install.is_some()
            || self.missing_history.is_some()
            || self.health.retries().missing_history_record().is_some()
        {
            return Ok(());
        }
        let broken = |property: &'static str, detail: String| {
            Err(consensus::vsr::InvariantViolation::new(property, detail))
        };
        let sb = self.durable.state();
        let applied = self.replica.commit_min().0;
        if sb.checkpoint_op.0 > applied {
            return broken(
                "recorded-past-applied",
                format!(
                    "recorded applied point {} > commit_min {applied}",
                    sb.checkpoint_op
                ),
            );
        }
        if sb.offset_frontier.0 > self.applied_next_offset {
            return broken(
                "frontier-past-applied",
                format!(
                    "recorded frontier {} > applied end {}",
                    sb.offset_frontier, self.applied_next_offset
                ),
            );
        }
        // A single replica numbers ops on from what its disk shows and
        // applies nothing again; a replica of a group applies in order.
        if self.config.vsr.replica_count > 1 && self.journaled_point.op > applied {
            return broken(
                "journaled-past-applied",
                format!(
                    "journaled op {} > commit_min {applied}",
                    self.journaled_point.op
                ),
            );
        }
        // A restart inside a purge (its applied point recorded, its
        // segments not all gone) holds offsets clamped to the log that is
        // left until the purge is applied again; beyond both is a bug.
        let end = self.applied_next_offset.max(self.log.next_offset());
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            let past = self.offsets.durable().with_entries(kind, |m| {
                m.iter()
                    .find(|(_, d)| d.committed_offset >= Offset(end))
                    .map(|(id, d)| (*id, d.committed_offset))
            });
            if let Some((id, offset)) = past {
                return broken(
                    "offset-past-applied-end",
                    format!(
                        "{kind:?} {id} stores {offset}, the applied end is {}, the log's {}",
                        self.applied_next_offset,
                        self.log.next_offset()
                    ),
                );
            }
        }
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> PartitionStats {
        PartitionStats {
            messages_count: self.messages_count,
            size_bytes: self.size_bytes,
            segments_count: self.log.segments().count() as u64,
            current_offset: self.applied_next_offset.checked_sub(1).map(Offset),
        }
    }

    /// Committed messages waiting in the journal for a flush.
    pub fn unflushed_messages(&self) -> u64 {
        self.journal.info().messages_count
    }

    /// This group's dedup slice: one watermark per client, sorted by id.
    pub fn dedup_export(&self) -> Vec<DedupWatermark> {
        let mut slice = self.replica.client_table().export();
        slice.sort_unstable_by_key(|w| w.client);
        slice
    }

    /// Replaces this group's client table with a slice (state-transfer
    /// install). Validated whole; on error nothing changes.
    pub fn dedup_install(&mut self, slice: &[DedupWatermark]) -> Result<(), ClientTableError> {
        self.replica.client_table_mut().install(slice)
    }

    // ----- inputs -----------------------------------------------------------

    /// Refuses input to a fenced partition, and to one whose install is
    /// in flight.
    pub(crate) fn check_fenced(&self) -> Result<(), PartitionError> {
        match self.health.fenced() {
            Some(reason) => Err(PartitionError::Fenced {
                reason: reason.to_owned(),
            }),
            None if self.install.is_some() => Err(PartitionError::InstallInProgress {
                dir: self.dir.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Whether a state-transfer install is in flight (see
    /// [`Self::begin_install`]): every input is refused until it ends.
    pub fn installing(&self) -> bool {
        self.install.is_some()
    }

    pub(crate) fn fence(&mut self, error: &PartitionError) {
        tracing::error!(dir = %self.dir.display(), %error, "partition fenced");
        self.health.fence(|| error.to_string());
    }

    /// A frame from a peer. A prepare is checked before the core sees it:
    /// its body must be a valid op and its batch must start where this
    /// replica's log (applied plus journaled) ends. A refused prepare is
    /// not journaled, so it is a gap that repair refetches; bad input
    /// changes nothing.
    pub async fn on_frame(&mut self, frame: Frame) -> Result<(), PartitionError> {
        self.check_fenced()?;
        // Only a header that verifies is worth checking (the core checks
        // the body checksum itself; a bad body also fails the batch check).
        if let Message::Prepare(p) | Message::RepairPrepare(p) = &frame.message
            && p.header.verify()
            && let Err(e) = self.check_prepare(p)
        {
            tracing::warn!(op = p.header.op.0, error = %e, "prepare refused before journaling");
            return Err(e);
        }
        if self.quorum_withheld() && matches!(frame.message, Message::DoViewChange(_)) {
            // A vote for a view this replica would lead: it must not lead
            // while history it claims is missing.
            self.replica.count_ignored(Ignored::HistoryMissing);
            return Ok(());
        }
        let (from, view, message) = (frame.replica.0, frame.view, frame.message.name());
        let res = self.replica.on_frame(frame);
        if let Ok(Handled::Ignored(reason)) = res {
            tracing::trace!(
                group = %self.replica.group(),
                from,
                view,
                message,
                %reason,
                "frame ignored"
            );
        }
        self.drive().await?;
        res.map(|_| ()).map_err(PartitionError::Frame)
    }

    /// Fences a read that arrived now: the read may be served from this
    /// replica's state once [`Replica::read_confirmed`] holds for the
    /// returned round (at once for groups of one or two replicas). Sends
    /// the round's Ping when none is outstanding.
    pub async fn read_fence(&mut self) -> Result<u64, PartitionError> {
        self.check_fenced()?;
        let round = self.replica.read_fence();
        self.drive().await?;
        Ok(round)
    }

    /// How many ticks from now the next one that does anything is (see
    /// `Replica::ticks_until_due`): a retry, a repair to start or an
    /// auto-commit to send makes every tick due; a lagging applied point
    /// the tick at which its record interval has passed (`tick_us`, the
    /// driver's tick period); the core's timers the rest. `u64::MAX` for a
    /// fenced partition or one with nothing armed. A driver ticks the
    /// partition on that tick and counts the ones before it with
    /// [`Self::skip_ticks`].
    pub fn ticks_until_due(&self, tick_us: u64) -> u64 {
        if self.health.fenced().is_some() {
            return u64::MAX;
        }
        let no_space = self.health.retries().no_space();
        // Replies held by a full disk wait for its retry, not every tick,
        // and so do auto-commits (refused while it is full).
        let busy = self.install.is_some()
            || self.health.retries().any()
            || self.damage_found.get()
            || (no_space.is_none()
                && (!self.pending_replies.is_empty()
                    || !self.auto_commits.borrow().pending.is_empty()));
        if busy {
            return 1;
        }
        let mut due = self.replica.ticks_until_due();
        if let Some(retry) = no_space {
            due = due.min(retry.wait_ticks().max(1));
        }
        if let Some(at_us) = self.record_due_at_us() {
            let wait = at_us.saturating_sub(self.now_us);
            due = due.min(wait.div_ceil(tick_us.max(1)).max(1));
        }
        due
    }

    /// Counts `n` ticks in which nothing is due (`n` below
    /// [`Self::ticks_until_due`]), as `n` calls of [`Self::on_tick`] would
    /// (the clock it was last given stands until the next tick).
    pub fn skip_ticks(&mut self, n: u64) {
        // A fenced partition's ticks do nothing at all (its core stands).
        if self.health.fenced().is_none() {
            self.replica.skip_ticks(n);
            self.health.count_ticks(n);
        }
    }

    /// One tick of the driver's clock; `now_us` is its time in µs (the
    /// timestamp the primary stamps batches with, and retention's "now").
    pub async fn on_tick(&mut self, now_us: u64) -> Result<(), PartitionError> {
        if self.install.is_some() && self.health.fenced().is_none() {
            // The core stands while its log is swapped (its driver carries
            // the install on); its timers resume after.
            self.now_us = self.now_us.max(now_us);
            return Ok(());
        }
        self.check_fenced()?;
        self.now_us = self.now_us.max(now_us);
        self.replay_samples
            .sample(self.now_us, self.replica.commit_min().0);
        // A flush waiting for disk space comes a tick closer; it runs in
        // the drive below once due.
        self.health.count_ticks(1);
        // Each retry reads the state the one before it left.
        if self.health.retries().view() {
            self.retry_persist().await;
        }
        if self.health.retries().missing_history_clear() {
            self.clear_missing_history().await;
        }
        if let Some(record) = self.health.retries().missing_history_record() {
            self.retry_missing_history_record(record).await;
        }
        if self.damage_found.get() {
            self.repair_damage().await;
        }
        self.retained.trim(self.replica.retained_from().0);
        self.replica.on_tick();
        self.ticking = true;
        let driven = self.drive().await;
        self.ticking = false;
        driven?;
        self.pump_auto_commits().await
    }

    /// A client request. Appends are validated whole and stamped here (on
    /// the primary) before the core orders them; see `append.rs`.
    pub async fn submit(
        &mut self,
        request: ClientRequest,
        now_us: u64,
    ) -> Result<RequestOutcome, PartitionError> {
        self.submit_keyed(request, 0, now_us).await
    }

    /// [`Partition::submit`] with the producer key an append is ordered
    /// with (0 for none): the prepare carries it as its
    /// `request_checksum`, and [`Partition::keyed_append`] finds it.
    pub async fn submit_keyed(
        &mut self,
        request: ClientRequest,
        key: u128,
        now_us: u64,
    ) -> Result<RequestOutcome, PartitionError> {
        self.check_fenced()?;
        self.now_us = self.now_us.max(now_us);
        if self.quorum_withheld() {
            return Ok(RequestOutcome::Unavailable);
        }
        if matches!(
            request.op,
            ClientOp::Append(_) | ClientOp::StoreOffset { .. } | ClientOp::DeleteOffset { .. }
        ) {
            // A full disk takes no new data: its committed batches wait in
            // memory, and an offset would be written at apply.
            self.check_space()?;
        }
        let op = match request.op {
            ClientOp::Register => PartitionOp::Register,
            ClientOp::Append(batch) => {
                if !self.replica.is_caught_up_primary() {
                    return Ok(RequestOutcome::Unavailable);
                }
                match self.stamp_client_batch(batch)? {
                    Some(stamped) => PartitionOp::Append(stamped),
                    None => return Ok(RequestOutcome::Unavailable),
                }
            }
            ClientOp::StoreOffset { kind, id, offset } => {
                if offset >= Offset(self.applied_next_offset) {
                    return Err(PartitionError::StoreOffsetBeyondEnd {
                        offset,
                        next_offset: Offset(self.applied_next_offset),
                    });
                }
                PartitionOp::StoreOffset {
                    kind,
                    id,
                    offset: offset.0,
                    auto_commit: false,
                }
            }
            ClientOp::DeleteOffset { kind, id } => PartitionOp::DeleteOffset { kind, id },
            ClientOp::Purge { generation } => {
                if generation == 0 {
                    return Err(PartitionError::PurgeGenerationZero);
                }
                PartitionOp::Purge { generation }
            }
        };
        let key = if matches!(op, PartitionOp::Append(_)) {
            key
        } else {
            0
        };
        let outcome = self.submit_op(
            request.client,
            request.session,
            request.request,
            request.user_id,
            key,
            &op,
        );
        self.drive().await?;
        Ok(outcome)
    }

    pub(crate) fn submit_op(
        &mut self,
        client: u128,
        session: u64,
        request: u64,
        user_id: u32,
        key: u128,
        op: &PartitionOp,
    ) -> RequestOutcome {
        self.replica.on_client_request(Request {
            client,
            session,
            request,
            operation: op.operation(),
            user_id,
            request_checksum: key,
            body: op.encode_body(),
        })
    }

    async fn retry_persist(&mut self) {
        match self.durable.persist_replica_view(&mut self.replica).await {
            Ok(()) => self.health.view_persisted(),
            Err(error) => {
                tracing::warn!(%error, view = self.replica.view(), "superblock write failed again");
            }
        }
    }

    /// Carries out the core's actions until it has none, then flushes by
    /// threshold and delivers the replies (after the sync, with
    /// `enforce_fsync`).
    pub(crate) async fn drive(&mut self) -> Result<(), PartitionError> {
        let mut failure = None;
        'outer: loop {
            let actions = self.replica.take_actions();
            if actions.is_empty() {
                break;
            }
            for action in actions {
                match action {
                    Action::Send { to, frame } => {
                        let vote_or_authority = matches!(
                            frame.message,
                            Message::PrepareOk { .. }
                                | Message::StartViewChange
                                | Message::DoViewChange(_)
                                | Message::Prepare(_)
                                | Message::Commit { .. }
                                | Message::StartView(_)
                        );
                        if vote_or_authority && self.quorum_withheld() {
                            continue;
                        }
                        if self.replica_log.is_some() {
                            self.held_frames.push((to, frame));
                        } else {
                            self.bus.send_to_replica(to, frame);
                        }
                    }
                    Action::Reply(mut reply) => {
                        if reply.client == INTERNAL_CLIENT {
                            self.on_internal_reply(&reply);
                        } else {
                            // Built by the core before the op was applied
                            // here (the core applies a whole commit run at
                            // once, so the table may already cache a later
                            // request): the result comes from this apply.
                            if let Some(&(_, result)) =
                                self.reply_results.iter().find(|(op, _)| *op == reply.op.0)
                            {
                                reply.result = result;
                            }
                            self.pending_replies.push(reply);
                        }
                    }
                    Action::Effect(effect) => {
                        if let Err(e) = self.carry_out(effect).await {
                            failure = Some(e);
                            break 'outer;
                        }
                    }
                }
            }
        }
        self.reply_results.clear();
        if failure.is_none()
            && let Err(e) = self.write_replica_log().await
        {
            failure = Some(e);
        }
        if failure.is_none() {
            for (to, frame) in std::mem::take(&mut self.held_frames) {
                self.bus.send_to_replica(to, frame);
            }
        } else {
            // They vouch for a journal the log may not hold.
            self.held_frames.clear();
        }
        if failure.is_none() {
            let waiting = self.health.retries().no_space();
            let flushed = match waiting {
                // The disk was full and the retry is not due: nothing is
                // written, and the replies stay held (below).
                Some(retry) if !retry.due() => Ok(()),
                Some(_) => self.retry_flush_for_space().await,
                None => self.flush_if_due().await,
            };
            match flushed {
                Ok(()) => {
                    if waiting.is_some_and(|retry| retry.due()) {
                        self.space_regained();
                    }
                }
                Err(e) if e.is_no_space() => {
                    self.ran_out_of_space(&e);
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            // A committed op that cannot be applied, or a flush the reply
            // waits for: the partition cannot go on consistently.
            self.fence(&e);
            self.pending_replies.clear();
            return Err(e);
        }
        // A full disk holds the replies: "a reply never leaves before its
        // batch is in the file" (flush.rs). They go out with the retry
        // that writes their batches; a crash before it loses only ops
        // nobody was told of.
        if self.health.retries().no_space().is_none() {
            for reply in self.pending_replies.drain(..) {
                self.bus.send_to_client(reply);
            }
        }
        if cfg!(debug_assertions)
            && let Err(violation) = self.invariants()
        {
            // A bug here or in the core, never bad input: a debug build
            // stops at the step that broke it.
            panic!("partition invariant broken after an input: {violation}");
        }
        Ok(())
    }

    async fn carry_out(&mut self, effect: Effect) -> Result<(), PartitionError> {
        match effect {
            Effect::PersistState {
                view,
                log_view,
                commit,
            } => {
                // A suffix the core replaced is in the log before the
                // superblock records the view it belongs to.
                self.write_replica_log().await?;
                self.persist_state(view, log_view, commit).await;
            }
            Effect::Apply { prepare, duplicate } => self.apply(prepare, duplicate).await?,
            Effect::Journal { .. } | Effect::TruncateJournal { .. } => {}
            Effect::ReadBack {
                to,
                nonce,
                from_op,
                slice,
            } => self.read_back(to.0, nonce, from_op.0, slice).await,
            Effect::StartStateTransfer { peer, floor, to_op } => {
                self.state_transfer_needed = Some(StateTransferNeeded { peer, floor, to_op });
                tracing::warn!(
                    peer = peer.0,
                    floor = floor.0,
                    to_op = to_op.0,
                    "repair concluded FloorRefused: a state transfer is needed"
                );
            }
        }
        Ok(())
    }

    /// Writes what changed in the core's journal to the replica log and
    /// syncs it, when this group keeps one.
    async fn write_replica_log(&mut self) -> Result<(), PartitionError> {
        let Some(log) = self.replica_log.as_mut() else {
            return Ok(());
        };
        let logged = self.replica.logged_journal();
        let applied = self.replica.commit_min().0;
        let recorded = self.durable.state().checkpoint_op.0;
        log.record(&self.fs, &logged, applied, recorded)
            .await
            .map(|_| ())
            .map_err(PartitionError::ReplicaLog)
    }

    async fn persist_state(&mut self, view: u32, log_view: u32, commit: Op) {
        match self.durable.persist_view(view, log_view, commit).await {
            Ok(()) => self.replica.on_persisted(view, log_view),
            Err(error) => {
                // Sends stay held by the core; retried on the next tick.
                tracing::warn!(%error, view, log_view, "superblock write failed; sends held");
                self.health.view_unpersisted();
            }
        }
    }

    /// Applies one committed op, in op order.
    async fn apply(&mut self, prepare: Prepare, duplicate: bool) -> Result<(), PartitionError> {
        let h = prepare.header;
        let op = PartitionOp::decode(
            h.operation,
            &prepare.body,
            Integrity::LayoutOnly,
            self.config.log.batch_length_max,
        )
        .map_err(PartitionError::InvalidOp)?;
        if h.client != INTERNAL_CLIENT {
            self.client_table_changed();
        }
        let (stats, frame) = match op {
            PartitionOp::Append(batch) => self.apply_append(&h, batch, duplicate)?,
            PartitionOp::StoreOffset {
                kind,
                id,
                offset,
                auto_commit,
            } => {
                if !duplicate {
                    self.apply_store(kind, id, offset, auto_commit, h.op.0)
                        .await?;
                }
                (EntryStats::default(), Bytes::new())
            }
            PartitionOp::DeleteOffset { kind, id } => {
                if !duplicate {
                    let by = self.offset_applied_by(h.op.0);
                    self.offsets
                        .apply_delete(&self.fs, kind, id, by)
                        .await
                        .map_err(|source| PartitionError::OffsetIo { kind, id, source })?;
                }
                (EntryStats::default(), Bytes::new())
            }
            PartitionOp::Purge { generation } => {
                // Gated by generation alone (never by `duplicate`), which
                // is what the primary's offset fold assumes.
                if generation > self.applied_purge_generation {
                    return self.apply_purge(&h, generation).await;
                }
                (EntryStats::default(), Bytes::new())
            }
            PartitionOp::Register => (EntryStats::default(), Bytes::new()),
        };
        self.journal_applied(&h, frame, stats).await
    }

    /// Applies an append: checks that it starts where the applied log
    /// ends, records the reply's result, and returns the journal entry's
    /// stats and frame (none for a batch already in the segments recovered
    /// at boot).
    fn apply_append(
        &mut self,
        h: &PrepareHeader,
        batch: Bytes,
        duplicate: bool,
    ) -> Result<(EntryStats, Bytes), PartitionError> {
        // A duplicate (a request ordered twice across a view change) still
        // occupies its offsets: the primary minted every later offset after
        // it, so skipping it would leave a hole. That batch is stored twice
        // (at-least-once).
        if duplicate {
            tracing::warn!(
                op = h.op.0,
                client = h.client,
                request = h.request,
                "storing a batch ordered twice"
            );
        }
        let header = BatchHeader::decode(&batch, self.config.log.batch_length_max)
            .map_err(|e| PartitionError::InvalidOp(OpDecodeError::InvalidBatch(e)))?;
        if header.base_offset != self.applied_next_offset {
            return Err(PartitionError::ApplyOffsetMismatch {
                op: h.op,
                expected: Offset(self.applied_next_offset),
                actual: Offset(header.base_offset),
            });
        }
        if !duplicate {
            // The reply's result, cached and recorded with it, so a retry
            // answered from the table gets the same offsets.
            self.reply_results.push((h.op.0, header.base_offset));
            self.replica.client_table_mut().set_result(
                h.client,
                h.request,
                h.op,
                header.base_offset,
            );
        }
        self.applied_next_offset = header.next_offset();
        self.applied_last_timestamp = self.applied_last_timestamp.max(header.base_timestamp);
        match self.recovered_durable_offset {
            // Re-applied after a restart and already in the recovered
            // segments (its base offset was checked above): counted at
            // boot, never written again.
            Some(end) if header.base_offset <= end => {
                if header.last_offset() > end {
                    return Err(PartitionError::ReplayStraddlesRecoveredEnd {
                        op: h.op,
                        base_offset: Offset(header.base_offset),
                        last_offset: Offset(header.last_offset()),
                        recovered_end: Offset(end),
                    });
                }
                if self.config.vsr.replica_count > 1 {
                    self.retained.flushed(
                        &mut self.replica,
                        h.op.0,
                        header.base_offset,
                        batch.len() as u64,
                    );
                }
                Ok((EntryStats::default(), Bytes::new()))
            }
            _ => {
                self.messages_count += u64::from(header.message_count);
                self.size_bytes += batch.len() as u64;
                let stats = EntryStats {
                    messages: header.message_count,
                    base_offset: Offset(header.base_offset),
                    timestamp: header.base_timestamp,
                };
                Ok((stats, batch))
            }
        }
    }

    /// Journals an applied op (flushing first when the journal is full)
    /// and moves the journaled point to it.
    async fn journal_applied(
        &mut self,
        h: &PrepareHeader,
        frame: Bytes,
        stats: EntryStats,
    ) -> Result<(), PartitionError> {
        let entry = JournalEntry {
            op: h.op,
            checksum: h.checksum,
            parent: h.parent,
            frame,
            stats,
        };
        match self.journal.append(entry.clone()) {
            Ok(()) => {}
            Err(JournalError::Full { .. }) => {
                self.flush(false, false).await?;
                self.journal
                    .append(entry)
                    .map_err(PartitionError::Journal)?;
            }
            Err(e) => return Err(PartitionError::Journal(e)),
        }
        self.journaled_point = AppliedPoint {
            op: h.op.0,
            checksum: h.checksum,
            next_offset: self.applied_next_offset,
        };
        Ok(())
    }

    /// The op an offset record is written for, and the applied point a
    /// restart of this replica resumes from (none for a single replica,
    /// which applies nothing again).
    fn offset_applied_by(&self, op: u64) -> crate::offsets::AppliedBy {
        crate::offsets::AppliedBy {
            op: Op(op),
            recorded_point: (self.config.vsr.replica_count > 1)
                .then(|| self.durable.state().checkpoint_op),
        }
    }

    async fn apply_store(
        &mut self,
        kind: ConsumerKind,
        id: u32,
        offset: u64,
        auto_commit: bool,
        op: u64,
    ) -> Result<(), PartitionError> {
        // Clamped deterministically: the applied end is the same on every
        // replica at this op, so every replica stores the same value.
        let Some(last) = self.applied_next_offset.checked_sub(1) else {
            return Ok(());
        };
        let offset = offset.min(last);
        let by = self.offset_applied_by(op);
        self.offsets
            .apply_store(&self.fs, kind, id, offset, auto_commit, by)
            .await
            .map_err(|source| PartitionError::OffsetIo { kind, id, source })?;
        Ok(())
    }

    // ----- the applied state, as other files change it --------------------

    /// A purge planted its empty segment (`purge.rs`, step 3): nothing
    /// applied is held any more and offsets restart at 0; neither the end
    /// recovered at boot nor an install's frontier describes the new log,
    /// and queued auto-commits name offsets of the old one.
    pub(crate) fn applied_log_purged(&mut self) {
        self.applied_next_offset = 0;
        self.applied_last_timestamp = 0;
        self.messages_count = 0;
        self.size_bytes = 0;
        self.recovered_durable_offset = None;
        self.installed_frontier = None;
        self.auto_commits.borrow_mut().forget_pending();
    }

    /// A purge's generation is durable (`purge.rs`, step 5): it is the
    /// generation in effect, and the purge op at `point` the last
    /// journaled one.
    pub(crate) fn purge_recorded(&mut self, generation: u64, point: AppliedPoint) {
        self.applied_purge_generation = generation;
        self.journaled_point = point;
    }

    /// Retention removed a sealed segment holding `messages` messages in
    /// `size_bytes` bytes.
    pub(crate) fn count_removed_segment(&mut self, messages: u64, size_bytes: u64) {
        self.messages_count -= messages.min(self.messages_count);
        self.size_bytes -= size_bytes.min(self.size_bytes);
    }

    /// The log was replaced whole (an install's chain, a converge's empty
    /// segment): the counters are the new chain's.
    pub(crate) fn count_replaced_log(
        &mut self,
        messages: u64,
        size_bytes: u64,
        last_timestamp: u64,
    ) {
        self.messages_count = messages;
        self.size_bytes = size_bytes;
        self.applied_last_timestamp = last_timestamp;
    }

    /// An install recorded the offered purge generation durably
    /// (`install/`).
    pub(crate) fn purge_generation_installed(&mut self, generation: u64) {
        self.applied_purge_generation = generation;
    }

    /// An install or a converge left the partition applied at `point`,
    /// its next offset the offer's frontier, with the segments up to
    /// `installed_end` on disk (none after a converge); queued
    /// auto-commits name offsets of the replaced log.
    pub(crate) fn applied_installed(&mut self, point: AppliedPoint, installed_end: Option<u64>) {
        self.applied_next_offset = point.next_offset;
        self.journaled_point = point;
        self.recovered_durable_offset = installed_end;
        self.installed_frontier = (point.next_offset > 0).then_some(point.next_offset);
        self.auto_commits.borrow_mut().forget_pending();
    }

    // ----- the offset fold --------------------------------------------------

    /// The offset state after applying every op below `op`: the applied
    /// state folded forward over the journaled prepares `commit_min+1 ..
    /// op-1`. `None` when `op` is already applied or a prepare in between
    /// is missing (a hole: nothing to check against yet).
    pub(crate) fn offset_state_before(&self, op: u64) -> Option<OffsetState> {
        let applied = self.replica.commit_min().0;
        if op <= applied {
            return None;
        }
        let mut state = OffsetState {
            next_offset: self.applied_next_offset,
            purge_generation: self.applied_purge_generation,
            last_timestamp: self.applied_last_timestamp,
        };
        for k in applied + 1..op {
            let p = self.replica.journal_entry(Op(k))?;
            state = self.fold(state, p)?;
        }
        Some(state)
    }

    fn fold(&self, mut state: OffsetState, p: &Prepare) -> Option<OffsetState> {
        match p.header.operation {
            consensus::vsr::OPERATION_APPEND => {
                let h = BatchHeader::decode(&p.body, self.config.log.batch_length_max).ok()?;
                state.next_offset = h.next_offset();
                state.last_timestamp = state.last_timestamp.max(h.base_timestamp);
            }
            crate::ops::OPERATION_PURGE => {
                if let Ok(PartitionOp::Purge { generation }) =
                    PartitionOp::decode(p.header.operation, &p.body, Integrity::LayoutOnly, 0)
                    && generation > state.purge_generation
                {
                    state.next_offset = 0;
                    state.purge_generation = generation;
                }
            }
            _ => {}
        }
        Some(state)
    }

    // ----- auto-commit ------------------------------------------------------

    fn on_internal_reply(&mut self, reply: &Reply) {
        let mut ac = self.auto_commits.borrow_mut();
        if reply.operation == OPERATION_REGISTER {
            ac.registering_since_us = None;
            if reply.status == ReplyStatus::Ok {
                ac.session = Some(reply.session);
                ac.next_request = 1;
            }
        } else if matches!(reply.status, ReplyStatus::NoSession | ReplyStatus::Fenced) {
            ac.session = None;
        }
    }

    /// On a caught-up primary, turns queued auto-commits into replicated
    /// stores through the internal client (registering it first).
    pub(crate) async fn pump_auto_commits(&mut self) -> Result<(), PartitionError> {
        // On a full disk they stay queued: a stored offset is written when
        // applied.
        if !self.replica.is_caught_up_primary() || self.health.retries().no_space().is_some() {
            return Ok(());
        }
        let (session, registering_since, empty) = {
            let ac = self.auto_commits.borrow();
            (ac.session, ac.registering_since_us, ac.pending.is_empty())
        };
        if empty {
            return Ok(());
        }
        // A Register lost to a view change is sent again after a while.
        let register_due = registering_since
            .is_none_or(|since| self.now_us.saturating_sub(since) >= REGISTER_RETRY_US);
        match session {
            None if register_due => {
                self.auto_commits.borrow_mut().registering_since_us = Some(self.now_us);
                let outcome = self.submit_op(INTERNAL_CLIENT, 0, 0, 0, 0, &PartitionOp::Register);
                if outcome == RequestOutcome::Unavailable {
                    self.auto_commits.borrow_mut().registering_since_us = None;
                }
            }
            None => {}
            Some(session) => {
                let next = {
                    let ac = self.auto_commits.borrow();
                    ac.pending
                        .iter()
                        .next()
                        .map(|(&(kind, id), &offset)| (kind, id, offset, ac.next_request))
                };
                if let Some((kind, id, offset, request)) = next {
                    let op = PartitionOp::StoreOffset {
                        kind,
                        id,
                        offset,
                        auto_commit: true,
                    };
                    let outcome = self.submit_op(INTERNAL_CLIENT, session, request, 0, 0, &op);
                    let mut ac = self.auto_commits.borrow_mut();
                    match outcome {
                        RequestOutcome::Prepared { .. } => {
                            ac.next_request += 1;
                            if ac.pending.get(&(kind, id)) == Some(&offset) {
                                ac.pending.remove(&(kind, id));
                            }
                        }
                        RequestOutcome::Answered => {
                            ac.next_request += 1;
                        }
                        _ => {}
                    }
                }
            }
        }
        self.drive().await
    }
}
