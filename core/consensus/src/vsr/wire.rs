//! The one codec between the core's typed [`Frame`]s and the bytes that
//! travel between replicas: the 256-byte consensus header of
//! [`crate::header`] followed by the body (docs/formats.md §4).
//!
//! Every frame a replica sends to another, whatever its plane, leaves as
//! the bytes [`encode`] makes and is believed only after [`decode`]
//! accepted it. `decode` runs the header codec's whole fail-closed decode
//! (size ceiling before anything else, seal or identity, body checksum,
//! field rules, body shape) and then the checks only a caller knows the
//! answer to: the cluster id and, through [`Expect`], the group and the
//! sending replica. A frame that fails is a [`WireError`] and produces no
//! value at all, so nothing downstream can act on part of it.
//!
//! Two identities meet here. On the wire a prepare's `checksum` field is
//! the header codec's identity (xxh3 over the header with checksum and
//! view zeroed), so transport damage anywhere in the header is caught. The
//! core's identity ([`PrepareHeader::compute_checksum`]) is a function of
//! the prepare's fields alone; a decoded prepare gets it recomputed from
//! the fields the wire identity has just verified, so the hash chain the
//! core checks is the primary's. A prepare travels with one view, the
//! frame's: the decoded header's `view` is the sender's view (the core's
//! identity leaves the view out for exactly this reason).

use bytes::Bytes;
use common::{GroupId, Op, ReplicaId};

use super::message::{
    Census, DoViewChange, Frame, Message, Prepare, PrepareHeader, StartView, SuffixSlot,
    body_checksum,
};
use crate::header::{
    self, Command, CommandHeader, CommitHeader, DoViewChangeHeader, FrameHeader, HEADER_SIZE,
    HeaderError, PingHeader, PrepareOkHeader, RepairRangeHeader, RequestPreparesHeader,
    RequestStartViewHeader, StartViewChangeHeader, StartViewHeader,
};

/// What a receiver requires of a frame beyond its own integrity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// The cluster this replica belongs to.
    pub cluster: u128,
    /// The largest frame accepted, header included (checked before the
    /// body is looked at).
    pub size_max: u32,
    /// The replica at the other end of the connection the bytes came
    /// from: a frame that claims another sender is refused.
    pub peer: Option<ReplicaId>,
}

/// Why bytes from a peer are not a VSR frame this replica accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The header codec refused the bytes.
    Header(HeaderError),
    /// The frame belongs to another cluster.
    WrongCluster {
        /// The cluster it names.
        cluster: u128,
        /// This replica's cluster.
        expected: u128,
    },
    /// The frame claims a sender other than the connection's peer.
    WrongSender {
        /// The replica it names.
        claimed: ReplicaId,
        /// The connection's peer.
        peer: ReplicaId,
    },
    /// A command this codec does not turn into a VSR message (a client
    /// frame or a state-transfer command; those have their own paths).
    NotVsr {
        /// The command byte.
        command: Command,
    },
    /// A prepare header inside a suffix names another group than its
    /// frame.
    SuffixGroupMismatch {
        /// The frame's group.
        group: GroupId,
        /// The entry's group.
        entry: GroupId,
    },
    /// A suffix entry's op is not the one its position implies.
    SuffixOpMismatch {
        /// The op the position implies.
        expected: Op,
        /// The op the entry names.
        found: Op,
    },
    /// A suffix would run below op 1.
    SuffixBelowOpOne,
    /// A StartView suffix holds a blank slot.
    BlankInStartView,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header(e) => write!(f, "frame header refused: {e}"),
            Self::WrongCluster { cluster, expected } => write!(
                f,
                "frame from cluster {cluster:#x}, this replica belongs to {expected:#x}"
            ),
            Self::WrongSender { claimed, peer } => write!(
                f,
                "frame claims sender replica {claimed} on the connection from replica {peer}"
            ),
            Self::NotVsr { command } => {
                write!(f, "command {command:?} is not a VSR replica message")
            }
            Self::SuffixGroupMismatch { group, entry } => write!(
                f,
                "suffix entry of group {} inside a frame of group {}",
                entry.0, group.0
            ),
            Self::SuffixOpMismatch { expected, found } => write!(
                f,
                "suffix entry for op {found} where its position implies op {expected}"
            ),
            Self::SuffixBelowOpOne => write!(f, "suffix runs below op 1"),
            Self::BlankInStartView => write!(f, "a StartView suffix holds a blank slot"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<HeaderError> for WireError {
    fn from(e: HeaderError) -> Self {
        Self::Header(e)
    }
}

/// Encodes `frame` of cluster `cluster` as header and body.
pub fn encode(cluster: u128, frame: &Frame) -> Bytes {
    let (command, body) = command_of(frame, cluster);
    let header = FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster,
        size: 0,
        view: frame.view,
        replica: frame.replica,
        command,
    };
    Bytes::from(header::encode_frame(&header, &body))
}

/// Decodes and checks bytes from a peer.
///
/// # Errors
/// [`WireError`] for every reason the bytes are not accepted; nothing is
/// returned of a refused frame.
pub fn decode(bytes: &[u8], expect: &Expect) -> Result<Frame, WireError> {
    let decoded = header::decode_frame(bytes, expect.size_max)?;
    let h = decoded.header;
    if h.cluster != expect.cluster {
        return Err(WireError::WrongCluster {
            cluster: h.cluster,
            expected: expect.cluster,
        });
    }
    if let Some(peer) = expect.peer
        && h.replica != peer
    {
        return Err(WireError::WrongSender {
            claimed: h.replica,
            peer,
        });
    }
    let body = decoded.body;
    let (group, message) = match h.command {
        CommandHeader::Prepare(p) => (p.group, Message::Prepare(prepare_of(&h, &p, body))),
        CommandHeader::RepairPrepare(p) => {
            (p.group, Message::RepairPrepare(prepare_of(&h, &p, body)))
        }
        CommandHeader::PrepareOk(ok) => (
            ok.group,
            Message::PrepareOk {
                op: ok.op,
                prepare_checksum: ok.prepare_checksum,
            },
        ),
        CommandHeader::Commit(c) => (
            c.group,
            Message::Commit {
                commit: c.commit,
                commit_checksum: c.commit_checksum,
                timestamp_monotonic: c.timestamp_monotonic,
            },
        ),
        CommandHeader::StartViewChange(s) => (s.group, Message::StartViewChange),
        CommandHeader::DoViewChange(d) => {
            let suffix = decode_suffix(body, d.group, d.op)?;
            (
                d.group,
                Message::DoViewChange(DoViewChange {
                    log_view: d.log_view,
                    op: d.op,
                    commit: d.commit,
                    suffix,
                    nack_bitset: d.nack_bitset,
                    present_bitset: d.present_bitset,
                }),
            )
        }
        CommandHeader::StartView(s) => {
            let mut suffix = Vec::new();
            for slot in decode_suffix(body, s.group, s.op)? {
                match slot {
                    SuffixSlot::Header(h) => suffix.push(h),
                    SuffixSlot::Blank => return Err(WireError::BlankInStartView),
                }
            }
            (
                s.group,
                Message::StartView(StartView {
                    op: s.op,
                    commit: s.commit,
                    suffix,
                    incarnation: s.incarnation,
                }),
            )
        }
        CommandHeader::RequestStartView(r) => (
            r.group,
            Message::RequestStartView {
                incarnation: r.incarnation,
                census: r.census.then_some(Census {
                    log_view: r.census_log_view,
                    op: r.census_op,
                    checksum: r.census_checksum,
                }),
            },
        ),
        CommandHeader::RequestPrepares(r) => (
            r.group,
            Message::RequestPrepares {
                nonce: r.nonce,
                from_op: r.from_op,
                to_op: r.to_op,
            },
        ),
        CommandHeader::RepairDone(r) => (
            r.group,
            Message::RepairDone {
                nonce: r.nonce,
                op: r.op,
            },
        ),
        CommandHeader::RangeEvicted(r) => (
            r.group,
            Message::RangeEvicted {
                nonce: r.nonce,
                retained_from: r.op,
            },
        ),
        CommandHeader::Ping(p) => (p.group, Message::Ping { round: p.round }),
        CommandHeader::Pong(p) => (p.group, Message::Pong { round: p.round }),
        other => {
            return Err(WireError::NotVsr {
                command: other.command(),
            });
        }
    };
    Ok(Frame {
        group,
        replica: h.replica,
        view: h.view,
        message,
    })
}

/// The group a frame names, read without verifying anything: for routing
/// bytes to the shard that owns the group before the full decode there.
/// `None` when the bytes are too short or the command carries no group.
pub fn peek_group(bytes: &[u8]) -> Option<GroupId> {
    let head = bytes.first_chunk::<HEADER_SIZE>()?;
    let at = match Command::from_u8(head[60])? {
        Command::Prepare | Command::RepairPrepare => 216,
        Command::PrepareOk => 200,
        Command::Commit => 168,
        Command::StartViewChange | Command::RequestStartView | Command::Ping | Command::Pong => 128,
        Command::DoViewChange | Command::StartView => 144,
        Command::RequestPrepares | Command::RequestHeaders => 160,
        Command::RepairDone | Command::RangeEvicted => 152,
        Command::RequestStateTransfer | Command::Headers => 144,
        Command::StateTransferTarget | Command::RequestStateChunk | Command::StateChunk => 152,
        _ => return None,
    };
    let field = bytes.get(at..at + 8)?;
    let mut le = [0u8; 8];
    le.copy_from_slice(field);
    Some(GroupId(u64::from_le_bytes(le)))
}

fn command_of(frame: &Frame, cluster: u128) -> (CommandHeader, Vec<u8>) {
    let group = frame.group;
    match &frame.message {
        Message::Prepare(p) => (
            CommandHeader::Prepare(prepare_tail(&p.header)),
            p.body.to_vec(),
        ),
        Message::RepairPrepare(p) => (
            CommandHeader::RepairPrepare(prepare_tail(&p.header)),
            p.body.to_vec(),
        ),
        Message::PrepareOk {
            op,
            prepare_checksum,
        } => (
            CommandHeader::PrepareOk(PrepareOkHeader {
                prepare_checksum: *prepare_checksum,
                op: *op,
                group,
                ..PrepareOkHeader::default()
            }),
            Vec::new(),
        ),
        Message::Commit {
            commit,
            commit_checksum,
            timestamp_monotonic,
        } => (
            CommandHeader::Commit(CommitHeader {
                commit_checksum: *commit_checksum,
                timestamp_monotonic: *timestamp_monotonic,
                commit: *commit,
                checkpoint_op: Op::ZERO,
                group,
            }),
            Vec::new(),
        ),
        Message::StartViewChange => (
            CommandHeader::StartViewChange(StartViewChangeHeader { group }),
            Vec::new(),
        ),
        Message::DoViewChange(d) => (
            CommandHeader::DoViewChange(DoViewChangeHeader {
                op: d.op,
                commit: d.commit,
                group,
                log_view: d.log_view,
                nack_bitset: d.nack_bitset,
                present_bitset: d.present_bitset,
            }),
            encode_suffix(cluster, frame.replica.0, d.op.0, d.suffix.iter().copied()),
        ),
        Message::StartView(s) => (
            CommandHeader::StartView(StartViewHeader {
                op: s.op,
                commit: s.commit,
                group,
                incarnation: s.incarnation,
            }),
            encode_suffix(
                cluster,
                frame.replica.0,
                s.op.0,
                s.suffix.iter().copied().map(SuffixSlot::Header),
            ),
        ),
        Message::RequestStartView {
            incarnation,
            census,
        } => (
            CommandHeader::RequestStartView(RequestStartViewHeader {
                group,
                incarnation: *incarnation,
                census: census.is_some(),
                census_op: census.map_or(Op::ZERO, |c| c.op),
                census_checksum: census.map_or(0, |c| c.checksum),
                census_log_view: census.map_or(0, |c| c.log_view),
            }),
            Vec::new(),
        ),
        Message::RequestPrepares {
            nonce,
            from_op,
            to_op,
        } => (
            CommandHeader::RequestPrepares(RequestPreparesHeader {
                nonce: *nonce,
                from_op: *from_op,
                to_op: *to_op,
                group,
            }),
            Vec::new(),
        ),
        Message::RepairDone { nonce, op } => (
            CommandHeader::RepairDone(RepairRangeHeader {
                nonce: *nonce,
                op: *op,
                group,
            }),
            Vec::new(),
        ),
        Message::RangeEvicted {
            nonce,
            retained_from,
        } => (
            CommandHeader::RangeEvicted(RepairRangeHeader {
                nonce: *nonce,
                op: *retained_from,
                group,
            }),
            Vec::new(),
        ),
        Message::Ping { round } => (
            CommandHeader::Ping(PingHeader {
                group,
                round: *round,
            }),
            Vec::new(),
        ),
        Message::Pong { round } => (
            CommandHeader::Pong(PingHeader {
                group,
                round: *round,
            }),
            Vec::new(),
        ),
    }
}

fn prepare_tail(h: &PrepareHeader) -> header::PrepareCommand {
    header::PrepareCommand {
        client: h.client,
        parent: h.parent,
        request_checksum: h.request_checksum,
        op: h.op,
        commit: h.commit,
        timestamp: h.timestamp,
        request: h.request,
        operation: h.operation,
        group: h.group,
        user_id: h.user_id,
    }
}

/// The core's header from a wire header whose identity (and body
/// checksum, where a body travels) the header codec verified.
fn core_header(frame: &FrameHeader, tail: &header::PrepareCommand) -> PrepareHeader {
    let mut h = PrepareHeader {
        checksum: 0,
        checksum_body: frame.checksum_body,
        parent: tail.parent,
        client: tail.client,
        request_checksum: tail.request_checksum,
        view: frame.view,
        op: tail.op,
        commit: tail.commit,
        timestamp: tail.timestamp,
        request: tail.request,
        operation: tail.operation,
        group: tail.group,
        user_id: tail.user_id,
    };
    h.checksum = h.compute_checksum();
    h
}

fn prepare_of(frame: &FrameHeader, tail: &header::PrepareCommand, body: &[u8]) -> Prepare {
    let mut header = core_header(frame, tail);
    // The wire leaves `checksum_body` zero for an empty body; the core's
    // identity binds the body through its own checksum of it.
    header.checksum_body = body_checksum(body);
    header.checksum = header.compute_checksum();
    Prepare {
        header,
        body: Bytes::copy_from_slice(body),
    }
}

/// A suffix body: one 256-byte prepare header per slot, highest op first;
/// a blank slot is a header with checksum 0 and operation 0 at the op its
/// position implies.
fn encode_suffix(
    cluster: u128,
    replica: u8,
    head_op: u64,
    slots: impl Iterator<Item = SuffixSlot>,
) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, slot) in slots.enumerate() {
        let op = head_op.saturating_sub(i as u64);
        let (tail, checksum_body, view, blank) = match slot {
            SuffixSlot::Header(h) => (prepare_tail(&h), h.checksum_body, h.view, false),
            SuffixSlot::Blank => (
                header::PrepareCommand {
                    op: Op(op),
                    ..header::PrepareCommand::default()
                },
                0,
                0,
                true,
            ),
        };
        let mut entry = FrameHeader {
            checksum: 0,
            checksum_body,
            cluster,
            size: HEADER_SIZE as u32,
            view,
            replica: ReplicaId(replica),
            command: CommandHeader::Prepare(tail),
        };
        if !blank {
            entry.checksum = entry.expected_checksum();
        }
        out.extend_from_slice(&entry.to_bytes());
    }
    out
}

fn decode_suffix(body: &[u8], group: GroupId, head_op: Op) -> Result<Vec<SuffixSlot>, WireError> {
    let entries = header::decode_prepare_headers(body)?;
    let mut slots = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let CommandHeader::Prepare(tail) = entry.command else {
            // decode_prepare_headers admits Prepare headers only.
            return Err(WireError::NotVsr {
                command: entry.command.command(),
            });
        };
        let expected = head_op
            .0
            .checked_sub(i as u64)
            .filter(|op| *op >= 1)
            .ok_or(WireError::SuffixBelowOpOne)?;
        if tail.op != Op(expected) {
            return Err(WireError::SuffixOpMismatch {
                expected: Op(expected),
                found: tail.op,
            });
        }
        if entry.checksum == 0 {
            slots.push(SuffixSlot::Blank);
            continue;
        }
        if tail.group != group {
            return Err(WireError::SuffixGroupMismatch {
                group,
                entry: tail.group,
            });
        }
        slots.push(SuffixSlot::Header(core_header(entry, &tail)));
    }
    Ok(slots)
}

#[cfg(test)]
mod tests;
