//! The replica core's vocabulary with its driver: the configuration and
//! durable state a replica starts from, what it asks the driver to do
//! ([`Action`], [`Effect`]), and what its inputs can answer ([`FrameError`],
//! [`Handled`] and [`Ignored`], [`RequestOutcome`]). The replica itself is
//! in `replica.rs`.

use std::fmt;

use common::{GroupId, Op, ReplicaId};

use super::journal::Retained;
use super::message::{Frame, Prepare, PrepareHeader, Reply};
use super::timeout::TimeoutConfig;

/// Replicas in one group at most (one bit each in a `u32` ack set).
pub const REPLICAS_MAX: u8 = 32;

/// The largest op or commit number accepted from a peer. Far beyond any
/// real log, and it leaves headroom so `op + 1` arithmetic on peer values
/// can never overflow.
pub const OP_MAX: u64 = 1 << 62;

/// The largest view accepted from a peer (so `view + 1` cannot overflow).
pub const VIEW_MAX: u32 = u32::MAX - 1;

/// Static configuration of one replica of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// This replica's index, `0..replica_count`.
    pub replica: ReplicaId,
    /// Replicas in the group (1..=32).
    pub replica_count: u8,
    /// The consensus group.
    pub group: GroupId,
    /// Timeouts in ticks.
    pub timeouts: TimeoutConfig,
    /// Applied prepares kept to serve repair; older ones are evicted (the
    /// partition plane's state lives in segments) and a peer that needs
    /// them is told `RangeEvicted`.
    pub retention_ops: u64,
    /// Client sessions kept.
    pub clients_max: usize,
    /// Seed of the jitter PRNG (mixed with replica and group).
    pub seed: u64,
    /// How prepares travel from the primary to the backups.
    pub topology: Topology,
}

/// How the primary's prepares reach the backups. Acknowledgements always go
/// straight to the primary, and retransmissions go straight to the replicas
/// that have not acknowledged, whatever the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// The primary sends every prepare to every backup (the default; see
    /// docs/consensus.md for why).
    #[default]
    Star,
    /// The primary sends to the next replica in the ring, which forwards to
    /// its successor, stopping before the primary (the reference's chain).
    Chain,
}

impl Config {
    /// Defaults for replica `replica` of `replica_count` in `group`.
    pub fn new(replica: ReplicaId, replica_count: u8, group: GroupId) -> Self {
        Self {
            replica,
            replica_count,
            group,
            timeouts: TimeoutConfig::default(),
            retention_ops: 1024,
            clients_max: crate::client_table::CLIENTS_TABLE_MAX,
            seed: 0,
            topology: Topology::Star,
        }
    }
}

/// The superblock part of VSR state: what survives a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DurableState {
    /// The highest view this replica entered.
    pub view: u32,
    /// The latest view in which it installed a log.
    pub log_view: u32,
    /// Its `commit_max` when written (a lower bound only).
    pub commit: Op,
}

/// What the driver's durable applied state says after a restart: the
/// highest applied op and its identity (the hash chain continues from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppliedState {
    /// The highest op applied.
    pub commit_min: Op,
    /// Its identity (0 when nothing was applied).
    pub checksum: u128,
}

/// A replica's journal as a durable log held it when last synced: what
/// [`Replica::logged_journal`] returned, written before any frame of that
/// step left, so it holds every op the replica vouched for since it last
/// became quorum-visible (docs/consensus.md §4, "Resume from a durable
/// journal").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggedJournal {
    /// The view then (may be newer than the superblock's: the log is
    /// synced before the superblock records a view).
    pub view: u32,
    /// The log view then.
    pub log_view: u32,
    /// The commit point it knew then. A primary counts its own
    /// acknowledgement for ops above holes in its journal, so its vote
    /// must not deny ops it committed, and the superblock's commit is
    /// only a lower bound written now and then.
    pub commit: Op,
    /// The head of the log view's log before a state-transfer install cut
    /// the journal above the installed op (0 when none was cut): a vote
    /// after the restart reports the log up to it, as it would have.
    pub cut_head: Op,
    /// Whether the replica was quorum-visible. A log written while it was
    /// not (after a restart without its journal, before the barrier) does
    /// not hold what an earlier life acknowledged, and vouches for nothing.
    pub visible: bool,
    /// Every op above the applied point, in op order: its header, and the
    /// prepare when the body was held.
    pub ops: Vec<(PrepareHeader, Option<Prepare>)>,
}

/// The replica's protocol status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Serving a view.
    Normal,
    /// Electing the next primary.
    ViewChange,
    /// Restarted without its journal and not yet told the current view.
    Recovering,
}

/// Something the driver must carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write `(view, log_view, commit)` to the superblock, then call
    /// [`Replica::on_persisted`] with the values written.
    PersistState {
        /// View to persist.
        view: u32,
        /// Log view to persist.
        log_view: u32,
        /// Commit point to persist (a lower bound).
        commit: Op,
    },
    /// The core appended this prepare to its journal (the driver may mirror
    /// it; the core does not wait for an acknowledgement because the
    /// partition journal is memory-only).
    Journal {
        /// The prepare appended.
        prepare: Prepare,
    },
    /// The core dropped its journal from this op upward (log divergence).
    TruncateJournal {
        /// First op dropped.
        from_op: Op,
    },
    /// Apply this committed op to the state machine (in op order).
    Apply {
        /// The committed prepare.
        prepare: Prepare,
        /// True when the client table says this request already committed
        /// at an earlier op: the state machine must skip it.
        duplicate: bool,
    },
    /// A peer asked for a slice of retained ops some of whose bodies were
    /// spilled ([`Replica::spill_applied`]). Read each spilled body back
    /// at its locator and call [`Replica::serve_read_back`] with the slice
    /// in order (held prepares as given, `None` for a body that cannot be
    /// read); the core answers the peer from there.
    ReadBack {
        /// The peer that asked.
        to: ReplicaId,
        /// Its repair session's nonce.
        nonce: u128,
        /// The first op of the slice.
        from_op: Op,
        /// The slice, in op order without holes.
        slice: Vec<Retained>,
    },
    /// Repair concluded `FloorRefused`: the ops needed lie below what every
    /// peer retains. Transfer state from `peer`, then install it with
    /// `set_commit_floor`, `set_sequence`, `clear_pipeline`,
    /// `advance_commit_max` and `finish_state_transfer`.
    StartStateTransfer {
        /// The replica to transfer from (the primary when it is not us).
        peer: ReplicaId,
        /// The highest op below every peer's retained range.
        floor: Op,
        /// The op repair was trying to reach.
        to_op: Op,
    },
}

/// One output of the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a frame to replica `to`.
    Send {
        /// Destination replica.
        to: ReplicaId,
        /// The frame.
        frame: Frame,
    },
    /// Send a reply to its client.
    Reply(Reply),
    /// Carry out an effect.
    Effect(Effect),
}

/// Bad input from a peer: the frame is dropped and nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The frame names another group.
    WrongGroup {
        /// The group in the frame.
        group: GroupId,
    },
    /// The sender index is out of range or is this replica.
    BadSender {
        /// The claimed sender.
        replica: ReplicaId,
    },
    /// A prepare's identity or body checksum does not verify.
    BadChecksum {
        /// The op of the prepare.
        op: Op,
    },
    /// A DoViewChange or StartView is malformed.
    MalformedViewMessage {
        /// Why, in a few words.
        reason: &'static str,
    },
    /// An op, commit or view number beyond what any log can reach.
    OutOfRange {
        /// The offending value.
        value: u64,
    },
    /// A RequestPrepares range is empty or starts at op 0.
    BadRange {
        /// First op asked for.
        from_op: Op,
        /// Last op asked for.
        to_op: Op,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongGroup { group } => {
                write!(f, "frame for group {} reached another group", group.0)
            }
            Self::BadSender { replica } => write!(f, "frame claims an invalid sender {replica}"),
            Self::BadChecksum { op } => write!(f, "prepare for op {op} fails its checksum"),
            Self::MalformedViewMessage { reason } => {
                write!(f, "view-change message rejected: {reason}")
            }
            Self::OutOfRange { value } => {
                write!(
                    f,
                    "frame carries op, commit or view {value}, beyond any log"
                )
            }
            Self::BadRange { from_op, to_op } => {
                write!(f, "repair range {from_op}..={to_op} is invalid")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Why a well-formed frame from a peer changed nothing here. Each handler
/// names its case; the replica counts them per reason
/// ([`Replica::frames_ignored`]) and [`Replica::on_frame`] returns it, so a
/// replica that never journals, votes or answers says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ignored {
    /// It belongs to a newer view than this replica's (which most
    /// handlers then ask for).
    NewerView,
    /// It belongs to an older view.
    StaleView,
    /// This replica is not `Normal` (a view change or a restart).
    NotNormal,
    /// Its sender is not the replica whose word counts here (the view's
    /// primary, or in a chain this replica's predecessor).
    NotFromAuthority,
    /// This replica is the view's primary: it makes the view's prepares
    /// and heartbeats itself.
    OwnView,
    /// Only the view's primary takes it, and this replica is not that.
    NotPrimary,
    /// A state transfer is installing here.
    Transferring,
    /// This replica restarted and is quorum-invisible: it votes in no view
    /// change until a primary's answer to its own probe brings it back
    /// (docs/consensus.md §4).
    Invisible,
    /// A StartView that answers another boot's probe, or names a view
    /// below the one `f + 1` peers reported after a disk replacement.
    NotOurProbe,
    /// A StartView or StartViewChange of the view this replica is already
    /// `Normal` in as a backup.
    AlreadyInView,
    /// A StartView whose log ends below what this replica applied.
    BehindApplied,
    /// A repair answer for a session this replica is not running (another
    /// nonce or peer: a late answer).
    NoSuchRepair,
    /// A repaired prepare this replica already applied or journals.
    AlreadyHeld,
    /// A repaired prepare that does not fit the bounded repair buffer.
    RepairBufferFull,
    /// Set by the partition driver, not the core: a vote for a view this
    /// replica would lead, withheld while it holds its history as missing.
    HistoryMissing,
}

impl Ignored {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 15] = [
        Self::NewerView,
        Self::StaleView,
        Self::NotNormal,
        Self::NotFromAuthority,
        Self::OwnView,
        Self::NotPrimary,
        Self::Transferring,
        Self::Invisible,
        Self::NotOurProbe,
        Self::AlreadyInView,
        Self::BehindApplied,
        Self::NoSuchRepair,
        Self::AlreadyHeld,
        Self::RepairBufferFull,
        Self::HistoryMissing,
    ];

    pub(super) const fn index(self) -> usize {
        self as usize
    }

    /// A stable snake_case name, for log fields and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NewerView => "newer_view",
            Self::StaleView => "stale_view",
            Self::NotNormal => "not_normal",
            Self::NotFromAuthority => "not_from_authority",
            Self::OwnView => "own_view",
            Self::NotPrimary => "not_primary",
            Self::Transferring => "transferring",
            Self::Invisible => "invisible",
            Self::NotOurProbe => "not_our_probe",
            Self::AlreadyInView => "already_in_view",
            Self::BehindApplied => "behind_applied",
            Self::NoSuchRepair => "no_such_repair",
            Self::AlreadyHeld => "already_held",
            Self::RepairBufferFull => "repair_buffer_full",
            Self::HistoryMissing => "history_missing",
        }
    }
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a well-formed frame from a peer did here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// It was taken: it changed this replica's state or was answered.
    Taken,
    /// It changed nothing, for this reason.
    Ignored(Ignored),
}

impl Handled {
    /// The reason, when the frame changed nothing.
    pub const fn ignored(self) -> Option<Ignored> {
        match self {
            Self::Taken => None,
            Self::Ignored(reason) => Some(reason),
        }
    }
}

/// What happened to a client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Ordered as this op; the reply follows when it commits.
    Prepared {
        /// The op assigned.
        op: Op,
    },
    /// Already committed: answered from the client table.
    Answered,
    /// Already in flight; the reply follows when it commits.
    InFlight,
    /// Not accepted here: not the primary, not caught up, or the pipeline
    /// is full. The client should retry (elsewhere).
    Unavailable,
    /// Client id 0 is reserved.
    ReservedClient,
}
