//! Client calls into a shard: what a caller (the server's client listener,
//! the simulator's workload, a test) asks of one group, and the typed
//! answers and errors.
//!
//! A call names its group and carries a [`ReplyTx`]; the shard answers it
//! exactly once, after the op committed for writes, at once for reads and
//! refusals. Every error says whether retrying can help
//! ([`CallError::transient`]) so the server can map it to Iggy's status
//! codes in one place.

use std::fmt;

use common::{ConsumerKind, GroupId, Offset, Op, ReplicaId};
use futures::channel::oneshot;
use partitions::{PartitionStats, PollRequest, Polled};

/// The reply handle of one call.
pub type ReplyTx = oneshot::Sender<Result<Answer, CallError>>;

/// What a caller asks of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Append a batch as the client encoded it (the primary stamps offsets
    /// and timestamps).
    Produce {
        /// The batch bytes (storage::batch layout).
        batch: Vec<u8>,
        /// Who sent it and whether this is a replay of that send.
        key: ProducerKey,
    },
    /// Read committed messages.
    Poll(PollRequest),
    /// Store a consumer offset (replicated).
    StoreOffset {
        /// Consumer or consumer group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
        /// The last consumed offset.
        offset: Offset,
    },
    /// Read a stored consumer offset.
    GetOffset {
        /// Consumer or consumer group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
    },
    /// Delete a stored consumer offset (replicated).
    DeleteOffset {
        /// Consumer or consumer group.
        kind: ConsumerKind,
        /// Its id.
        id: u32,
    },
    /// Purge the partition up to a generation (replicated): a generation
    /// the partition already applied commits as nothing, so the answer
    /// always means the purge is in the group's committed history (and,
    /// for `persisted`, recorded as applied on the primary).
    Purge {
        /// The generation group 0 committed (1 or more).
        generation: u64,
    },
    /// Flush the committed prefix to the active segment.
    Flush,
    /// The partition's counters.
    Stats,
}

/// The identity of a producer's send, carried with its produce call to the
/// group's primary, which orders the batch with it (the prepare's
/// `request_checksum`).
///
/// A client whose answer was lost or unknown (Iggy's 57) sends the same
/// request again; the primary looks such a replay up in its journal before
/// ordering it, so a send the client made once is stored once: a replay of
/// a committed send is answered with the original offsets, one still
/// being committed waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerKey {
    /// A digest of the sender's session, request number and batch header
    /// (0: none, never looked up).
    pub key: u128,
    /// Whether the sender has sent this very request before.
    pub replay: bool,
    /// For a replay, the primary's partition boot that the replica the
    /// client talks to found started before it first received the send
    /// (from a [`CallError::ReplayUnplaced`] answer): that boot's journal
    /// holds the original if it committed. 0: none.
    pub vouched: u64,
}

impl ProducerKey {
    /// No identity: the call is ordered as new.
    pub const NONE: Self = Self {
        key: 0,
        replay: false,
        vouched: 0,
    };
}

impl Call {
    /// A produce without a producer identity.
    pub fn produce(batch: Vec<u8>) -> Self {
        Self::Produce {
            batch,
            key: ProducerKey::NONE,
        }
    }

    /// Whether the call becomes a replicated op (and so needs the shard's
    /// session with the group).
    pub fn is_replicated(&self) -> bool {
        matches!(
            self,
            Self::Produce { .. }
                | Self::StoreOffset { .. }
                | Self::DeleteOffset { .. }
                | Self::Purge { .. }
        )
    }

    /// Whether the call writes new data to the partition (messages or a
    /// consumer offset): what a partition whose disk is full refuses. A
    /// purge is not refused (it is owed once committed, and frees space).
    pub fn writes_data(&self) -> bool {
        matches!(
            self,
            Self::Produce { .. } | Self::StoreOffset { .. } | Self::DeleteOffset { .. }
        )
    }

    /// A short name for logs and counters.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Produce { .. } => "produce",
            Self::Poll(_) => "poll",
            Self::StoreOffset { .. } => "store_offset",
            Self::GetOffset { .. } => "get_offset",
            Self::DeleteOffset { .. } => "delete_offset",
            Self::Purge { .. } => "purge",
            Self::Flush => "flush",
            Self::Stats => "stats",
        }
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The replicated op committed (and, with `enforce_fsync`, synced).
    Committed {
        /// The op it committed as.
        op: Op,
        /// For a produce, the first offset of the batch as the primary
        /// stamped it (`None` for other ops, or when the prepare was no
        /// longer held to read it from).
        base_offset: Option<Offset>,
    },
    /// Messages read.
    Polled(Polled),
    /// A stored offset, `None` when the consumer has none.
    Offset(Option<Offset>),
    /// A flush or other local step finished.
    Done,
    /// Counters.
    Stats(PartitionStats),
}

/// Why a call was not carried out. Nothing changed unless the variant says
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No such group on this replica.
    UnknownGroup {
        /// The group asked for.
        group: GroupId,
    },
    /// Another replica is the group's primary; the server forwards there.
    NotPrimary {
        /// The group's view.
        view: u32,
        /// The primary of that view.
        primary: ReplicaId,
    },
    /// The group cannot take the call now: a view change, a state
    /// transfer, a full pipeline, a session being opened. Retry.
    Unavailable {
        /// Why, for logs.
        reason: &'static str,
    },
    /// The call was accepted but its outcome is unknown (the primary lost
    /// its view before the op committed, or the shard is stopping): it may
    /// or may not commit. Retrying may duplicate a produce.
    Indeterminate {
        /// Why.
        reason: &'static str,
    },
    /// A replayed send the primary cannot place: it is in no journal the
    /// primary holds, and that journal may not reach back to the original
    /// (the primary restarted since it could have been ordered). `since`:
    /// the primary's partition boot and for how long (µs) its journal has
    /// held every op, when it has; if the send was first received after
    /// that moment, the caller may vouch for it
    /// ([`ProducerKey::vouched`]). Retry.
    ReplayUnplaced {
        /// The boot's identity and how long it has held every op.
        since: Option<(u64, u64)>,
    },
    /// The op committed already and its answer is no longer known (its
    /// reply is not cached, or a replayed send's batch is no longer held
    /// to read its offsets from). Retrying would apply it again.
    AlreadyApplied {
        /// Why.
        reason: &'static str,
    },
    /// The partition is fenced (its data could not be made serviceable).
    Fenced {
        /// The fence reason.
        reason: String,
    },
    /// The request itself is wrong (a batch that does not decode, an offset
    /// past the end, a purge generation of 0…): the client's mistake.
    Rejected {
        /// The partition's error, as a sentence.
        reason: String,
    },
    /// The partition's disk is full: it takes no new messages or offsets
    /// until space is freed, and serves reads meanwhile. Retrying helps
    /// only after space was freed (not at once, so not [`Self::transient`]).
    NoSpace {
        /// The partition's error, naming its directory.
        reason: String,
    },
    /// A local fault (disk) while serving the call.
    Local {
        /// The error, as a sentence.
        reason: String,
    },
    /// The shard's inbox is full or the shard stopped; retry.
    Overloaded,
}

impl CallError {
    /// Whether the same call may succeed if retried (here or at the named
    /// primary).
    pub fn transient(&self) -> bool {
        matches!(
            self,
            Self::NotPrimary { .. } | Self::Unavailable { .. } | Self::Overloaded
        )
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownGroup { group } => write!(f, "group {} is not on this replica", group.0),
            Self::NotPrimary { view, primary } => {
                write!(f, "replica {} is the primary (view {view})", primary.0)
            }
            Self::Unavailable { reason } => write!(f, "group unavailable: {reason}"),
            Self::Indeterminate { reason } => write!(f, "outcome unknown: {reason}"),
            Self::AlreadyApplied { reason } => write!(f, "applied already: {reason}"),
            Self::ReplayUnplaced { .. } => {
                f.write_str("the primary cannot tell whether the original send committed")
            }
            Self::Fenced { reason } => write!(f, "partition fenced: {reason}"),
            Self::Rejected { reason } => write!(f, "request rejected: {reason}"),
            Self::NoSpace { reason } => write!(f, "out of disk space: {reason}"),
            Self::Local { reason } => write!(f, "local fault: {reason}"),
            Self::Overloaded => write!(f, "shard overloaded"),
        }
    }
}

impl std::error::Error for CallError {}

/// A call with its group and reply handle, as it travels to a shard.
#[derive(Debug)]
pub struct Envelope {
    /// The group.
    pub group: GroupId,
    /// What to do.
    pub call: Call,
    /// Where the answer goes.
    pub reply: ReplyTx,
}
