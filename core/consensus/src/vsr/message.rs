//! The typed VSR messages the replica core consumes and produces.
//!
//! These are Rust values, not bytes: the frame codec in `consensus::header`
//! converts between them and the 256-byte wire frames. Field names follow
//! the wire layout (`op`, `commit`, `view`, `log_view`, `parent`,
//! `checksum`, `client`, `request`, `timestamp`, `group`, ...), so the
//! mapping is one field to one field.
//!
//! Every frame carries the sender's `view` and `replica` in its common
//! prefix; [`Frame`] models that prefix and [`Message`] the command-specific
//! part. A prepare's identity ([`PrepareHeader::checksum`]) is xxh3-64 over
//! every header field except `view` and the checksum itself, with the body
//! reaching it through `checksum_body`; `parent` is the previous op's
//! identity, so a log is a hash chain that a receiver can verify.

use bytes::Bytes;
use common::{GroupId, Op, ReplicaId};
use xxhash_rust::xxh3::xxh3_64;

/// `operation` of a prepare that registers a client session.
pub const OPERATION_REGISTER: u8 = 1;
/// `operation` of an ordinary replicated request (the first application op).
pub const OPERATION_APPEND: u8 = 3;

/// The header of one prepare: everything but the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrepareHeader {
    /// The prepare's identity: xxh3-64 of the other fields (not `view`).
    pub checksum: u128,
    /// xxh3-64 of the body.
    pub checksum_body: u128,
    /// The identity of the prepare at `op - 1` (0 for op 1).
    pub parent: u128,
    /// The client whose request this is (0 for none).
    pub client: u128,
    /// The client's own checksum of its request (0 = unstamped).
    pub request_checksum: u128,
    /// The view in which the prepare was first built (not in the identity).
    pub view: u32,
    /// The op number.
    pub op: Op,
    /// The primary's `commit_max` when it built the prepare.
    pub commit: Op,
    /// The primary's strictly monotonic timestamp.
    pub timestamp: u64,
    /// The client's request number.
    pub request: u64,
    /// What the request does ([`OPERATION_REGISTER`], [`OPERATION_APPEND`]).
    pub operation: u8,
    /// The consensus group.
    pub group: GroupId,
    /// The user the client's session belongs to.
    pub user_id: u32,
}

impl PrepareHeader {
    /// The identity the header should carry: xxh3-64 over every field but
    /// `checksum` and `view`, zero-extended to 128 bits.
    pub fn compute_checksum(&self) -> u128 {
        let mut bytes = [0u8; 16 * 4 + 8 * 5 + 1 + 4];
        let mut at = 0;
        let mut put = |field: &[u8]| {
            bytes[at..at + field.len()].copy_from_slice(field);
            at += field.len();
        };
        put(&self.checksum_body.to_le_bytes());
        put(&self.parent.to_le_bytes());
        put(&self.client.to_le_bytes());
        put(&self.request_checksum.to_le_bytes());
        put(&self.op.0.to_le_bytes());
        put(&self.commit.0.to_le_bytes());
        put(&self.timestamp.to_le_bytes());
        put(&self.request.to_le_bytes());
        put(&[self.operation]);
        put(&self.group.0.to_le_bytes());
        put(&self.user_id.to_le_bytes());
        u128::from(xxh3_64(&bytes))
    }

    /// Whether `checksum` is the identity of the other fields.
    pub fn verify(&self) -> bool {
        self.checksum == self.compute_checksum()
    }
}

/// A prepare: a header and the request body it orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// The header; `header.checksum` is the prepare's identity.
    pub header: PrepareHeader,
    /// The request body, shared cheaply between fan-out copies.
    pub body: Bytes,
}

impl Prepare {
    /// Whether the identity and the body checksum both verify.
    pub fn verify(&self) -> bool {
        self.header.verify() && self.header.checksum_body == body_checksum(&self.body)
    }
}

/// xxh3-64 of a body, zero-extended.
pub fn body_checksum(body: &[u8]) -> u128 {
    u128::from(xxh3_64(body))
}

/// One entry of a DoViewChange or StartView suffix, slot `i` being op
/// `op - i` of the sender's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuffixSlot {
    /// The sender knows the canonical header of this op.
    Header(PrepareHeader),
    /// The sender does not know the header (a blank): not a nack.
    Blank,
}

/// A DoViewChange: a vote for the new view carrying the sender's log tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoViewChange {
    /// The latest view in which the sender installed a log.
    pub log_view: u32,
    /// The sender's head op.
    pub op: Op,
    /// The sender's `commit_max`, capped at `op`.
    pub commit: Op,
    /// Slots for ops `op, op - 1, ...` down to `commit` (at most 128).
    pub suffix: Vec<SuffixSlot>,
    /// Bit `i`: the sender proves it never prepared op `op - i`.
    pub nack_bitset: u128,
    /// Bit `i`: the sender can serve op `op - i`'s body.
    pub present_bitset: u128,
}

/// A StartView: the new view's log head and its uncommitted headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartView {
    /// The new log's head op.
    pub op: Op,
    /// The primary's `commit_max`.
    pub commit: Op,
    /// Canonical headers, high to low, from `op` down (at most 128).
    pub suffix: Vec<PrepareHeader>,
    /// Echo of the prober's incarnation (0 for an unsolicited broadcast).
    pub incarnation: u128,
}

/// A restarted replica's report in its probes while it waits for a view:
/// what it holds durably (see the census in docs/consensus.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// Its durable log view (at most the frame's view).
    pub log_view: u32,
    /// Its durable applied op.
    pub op: Op,
    /// That op's identity (0 for op 0).
    pub checksum: u128,
}

/// The command-specific part of a replica-to-replica frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The primary replicates a prepare (also a retransmission).
    Prepare(Prepare),
    /// A backup vouches that it journaled every op up to `op`, whose
    /// identity is `prepare_checksum` (cumulative: the hash chain makes a
    /// match at `op` a match at every op below).
    PrepareOk {
        /// The acknowledged op.
        op: Op,
        /// Its identity in the acker's journal.
        prepare_checksum: u128,
    },
    /// The primary's heartbeat: what it has applied.
    Commit {
        /// The primary's `commit_min`.
        commit: Op,
        /// The identity of op `commit`.
        commit_checksum: u128,
        /// Strictly increasing per primary life; stale heartbeats do not
        /// reset the backup's liveness timer.
        timestamp_monotonic: u64,
    },
    /// The sender wants to leave its view for the frame's view.
    StartViewChange,
    /// The sender's vote and log tail for the frame's view.
    DoViewChange(DoViewChange),
    /// The frame's view has started with this log.
    StartView(StartView),
    /// A replica asks the primary for the current view (a probe).
    RequestStartView {
        /// The prober's per-boot nonce, echoed by the answer.
        incarnation: u128,
        /// While the prober has adopted no view since its restart: its
        /// durable applied state, for a whole-group restart (`census.rs`).
        census: Option<Census>,
    },
    /// Ask for the prepares `from_op..=to_op` (at most 128 are served).
    RequestPrepares {
        /// Session nonce, echoed.
        nonce: u128,
        /// First op wanted.
        from_op: Op,
        /// Last op wanted.
        to_op: Op,
    },
    /// A prepare served for repair; verified against known headers.
    RepairPrepare(Prepare),
    /// The end of one repair slice.
    RepairDone {
        /// Session nonce, echoed.
        nonce: u128,
        /// The last op served.
        op: Op,
    },
    /// The server no longer holds ops below `retained_from`.
    RangeEvicted {
        /// Session nonce, echoed.
        nonce: u128,
        /// The oldest op the server still retains.
        retained_from: Op,
    },
    /// The primary asks its backups to vouch that they are still in its
    /// view before it serves a read from its own state (`read_check.rs`).
    Ping {
        /// The read-check round (≥ 1), echoed by the Pong.
        round: u64,
    },
    /// A backup vouches that it was in the frame's view when it answered
    /// the Ping of `round`.
    Pong {
        /// The Ping's round.
        round: u64,
    },
}

impl Message {
    /// The wire command name, for traces.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Prepare(_) => "Prepare",
            Self::PrepareOk { .. } => "PrepareOk",
            Self::Commit { .. } => "Commit",
            Self::StartViewChange => "StartViewChange",
            Self::DoViewChange(_) => "DoViewChange",
            Self::StartView(_) => "StartView",
            Self::RequestStartView { .. } => "RequestStartView",
            Self::RequestPrepares { .. } => "RequestPrepares",
            Self::RepairPrepare(_) => "RepairPrepare",
            Self::RepairDone { .. } => "RepairDone",
            Self::RangeEvicted { .. } => "RangeEvicted",
            Self::Ping { .. } => "Ping",
            Self::Pong { .. } => "Pong",
        }
    }
}

/// A replica-to-replica frame: the common prefix plus the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The consensus group the frame belongs to.
    pub group: GroupId,
    /// The sender's index.
    pub replica: ReplicaId,
    /// The sender's current view.
    pub view: u32,
    /// The command-specific part.
    pub message: Message,
}

/// A client request as the core sees it (after routing to its group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client id; 0 is reserved and refused.
    pub client: u128,
    /// The session (the op of the client's Register); 0 for a Register.
    pub session: u64,
    /// The request number; 0 for a Register, then increasing.
    pub request: u64,
    /// [`OPERATION_REGISTER`] or an application operation.
    pub operation: u8,
    /// The user the session belongs to.
    pub user_id: u32,
    /// The client's own digest of what it asked (0 = none), carried into
    /// the prepare's `request_checksum`. A partition append takes the
    /// producer's key here (the Iggy session and request number it came
    /// with), so a replay of the same send can be recognised in the log.
    pub request_checksum: u128,
    /// The request body.
    pub body: Bytes,
}

/// The outcome carried by a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplyStatus {
    /// The request committed at `op`.
    Ok,
    /// The request was committed long ago; its reply is no longer cached.
    AlreadyApplied,
    /// The client has no session (never registered, or evicted).
    NoSession,
    /// The request names an older session than the table's (a zombie).
    Fenced,
}

/// A reply to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The client.
    pub client: u128,
    /// The request number answered.
    pub request: u64,
    /// The op at which the request committed (0 when not `Ok`).
    pub op: Op,
    /// The replying replica's `commit_max`.
    pub commit: Op,
    /// The prepare's timestamp.
    pub timestamp: u64,
    /// The operation.
    pub operation: u8,
    /// The outcome.
    pub status: ReplyStatus,
    /// The session a Register opened (its op), or for a Register retried
    /// before its session was used, the one already open (an older op);
    /// 0 otherwise.
    pub session: u64,
    /// What the state machine made of the op, set by the host when it
    /// applies it (a partition append: the batch's base offset); 0 until
    /// then and for operations that report nothing. It is cached and
    /// recorded with the reply, so a retry answered from the client table
    /// gets the original result.
    pub result: u64,
}
