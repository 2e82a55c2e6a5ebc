//! The command-specific area (bytes 128..256) of each header this codec
//! handles: each header's layout, declared once, and the field rules each
//! command's decode enforces after the layout's reserved-byte check.

use super::layout::{Bytes, HasLayout, TAIL, header_layout};
use super::{
    Command, HEADER_SIZE, HeaderError, VIEW_OFFSET, check_headers_body, decode_prepare_entry, zero,
};
use common::le_cursor::u32_at;
use common::{GroupId, Op};

fn invalid(command: Command, reason: &'static str) -> HeaderError {
    HeaderError::Invalid { command, reason }
}

/// A client request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestHeader {
    /// Client id; never 0.
    pub client: u128,
    /// Checksum of the request body, when the client stamps one.
    pub request_checksum: u128,
    /// Client timestamp (the SDK sends 0).
    pub timestamp: u64,
    /// Request number: 0 for register, then counting from 1.
    pub request: u64,
    /// Operation code; never 0.
    pub operation: u8,
    /// Session number: 0 before login.
    pub session: u64,
    /// User id (not trusted by the server).
    pub user_id: u32,
    /// The classic command code, used only by the non-replicated
    /// operation (2); zero otherwise.
    pub legacy_command: u32,
}

/// Operation code of a client's registration (login).
pub const OPERATION_REGISTER: u8 = 1;
/// Operation code of a non-replicated (read) request.
pub const OPERATION_NON_REPLICATED: u8 = 2;

header_layout!(RequestHeader over TAIL => {
    client: u128 @ 128,
    request_checksum: u128 @ 144,
    timestamp: u64 @ 160,
    request: u64 @ 168,
    operation: u8 @ 176,
    session: u64 @ 184,
    user_id: u32 @ 192,
    legacy_command: u32 @ 196,
});

impl RequestHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        let c = Command::Request;
        let h = Self::decode_fields(b, c)?;
        if h.client == 0 {
            return Err(invalid(c, "client id 0 is reserved"));
        }
        match h.operation {
            0 => return Err(invalid(c, "operation 0 is reserved")),
            OPERATION_REGISTER if h.session != 0 || h.request != 0 => {
                return Err(invalid(c, "a register carries session 0 and request 0"));
            }
            OPERATION_REGISTER | OPERATION_NON_REPLICATED => {}
            _ if h.session == 0 || h.request == 0 => {
                return Err(invalid(
                    c,
                    "a replicated request needs a session and request > 0",
                ));
            }
            _ => {}
        }
        if h.operation != OPERATION_NON_REPLICATED && h.legacy_command != 0 {
            return Err(HeaderError::NonzeroReserved { offset: 196 });
        }
        Ok(h)
    }
}

/// The answer to a client request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplyHeader {
    /// Echo of the request's checksum.
    pub request_checksum: u128,
    /// Opaque context.
    pub context: u128,
    /// Echo of the client id.
    pub client: u128,
    /// The op that executed the request.
    pub op: Op,
    /// The commit number when the reply was built.
    pub commit: Op,
    /// The prepare's timestamp.
    pub timestamp: u64,
    /// Echo of the request number.
    pub request: u64,
    /// Echo of the operation.
    pub operation: u8,
    /// 0 for success, otherwise an error code (with an empty body).
    pub status: u32,
}

header_layout!(ReplyHeader over TAIL => {
    request_checksum: u128 @ 128,
    context: u128 @ 144,
    client: u128 @ 160,
    op: Op @ 176,
    commit: Op @ 184,
    timestamp: u64 @ 192,
    request: u64 @ 200,
    operation: u8 @ 208,
    status: u32 @ 216,
});

/// A prepare's command-specific fields (also the layout of RepairPrepare
/// and of the headers in a view-change suffix). The whole header as the
/// replica core sees it, identity and view included, is
/// `vsr::PrepareHeader`; `vsr::wire` converts between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrepareCommand {
    /// The client whose request this is.
    pub client: u128,
    /// The identity of the previous op's prepare (the hash chain).
    pub parent: u128,
    /// Checksum of the client's request.
    pub request_checksum: u128,
    /// The op number; at least 1.
    pub op: Op,
    /// The primary's commit number when it built the prepare; below `op`.
    pub commit: Op,
    /// The primary's timestamp, microseconds, strictly increasing.
    pub timestamp: u64,
    /// The client's request number.
    pub request: u64,
    /// The operation; 0 only in a blank suffix slot.
    pub operation: u8,
    /// The consensus group.
    pub group: GroupId,
    /// The requesting user.
    pub user_id: u32,
}

header_layout!(PrepareCommand over TAIL => {
    client: u128 @ 128,
    parent: u128 @ 144,
    request_checksum: u128 @ 160,
    op: Op @ 176,
    commit: Op @ 184,
    timestamp: u64 @ 192,
    request: u64 @ 200,
    operation: u8 @ 208,
    group: GroupId @ 216,
    user_id: u32 @ 224,
});

impl PrepareCommand {
    fn read(b: &Bytes, command: Command) -> Result<Self, HeaderError> {
        let h = Self::decode_fields(b, command)?;
        if h.op == Op::ZERO {
            return Err(invalid(command, "op 0 is never prepared"));
        }
        if h.operation != 0 && h.commit >= h.op {
            return Err(invalid(command, "a prepare's commit must be below its op"));
        }
        Ok(h)
    }
}

/// A backup's acknowledgement of a journaled prepare. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrepareOkHeader {
    /// The acknowledged prepare's parent.
    pub parent: u128,
    /// The acknowledged prepare's identity.
    pub prepare_checksum: u128,
    /// The acknowledged op.
    pub op: Op,
    /// The prepare's commit field.
    pub commit: Op,
    /// The prepare's timestamp.
    pub timestamp: u64,
    /// The prepare's request number.
    pub request: u64,
    /// The prepare's operation.
    pub operation: u8,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(PrepareOkHeader over TAIL => {
    parent: u128 @ 128,
    prepare_checksum: u128 @ 144,
    op: Op @ 160,
    commit: Op @ 168,
    timestamp: u64 @ 176,
    request: u64 @ 184,
    operation: u8 @ 192,
    group: GroupId @ 200,
});

impl PrepareOkHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        let h = Self::decode_fields(b, Command::PrepareOk)?;
        if h.op == Op::ZERO {
            return Err(invalid(Command::PrepareOk, "op 0 is never prepared"));
        }
        Ok(h)
    }
}

/// The primary's commit heartbeat. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitHeader {
    /// Identity of the committed prepare.
    pub commit_checksum: u128,
    /// Strictly increasing per primary; only a newer one resets a backup's
    /// heartbeat timer.
    pub timestamp_monotonic: u64,
    /// The primary's commit number.
    pub commit: Op,
    /// The primary's latest checkpoint op.
    pub checkpoint_op: Op,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(CommitHeader over TAIL => {
    commit_checksum: u128 @ 128,
    timestamp_monotonic: u64 @ 144,
    commit: Op @ 152,
    checkpoint_op: Op @ 160,
    group: GroupId @ 168,
});

/// A vote to leave the current view. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartViewChangeHeader {
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(StartViewChangeHeader over TAIL => {
    group: GroupId @ 128,
});

/// A replica's log suffix for the new view's primary. The body holds up to
/// 128 prepare headers, highest op first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoViewChangeHeader {
    /// The sender's head op.
    pub op: Op,
    /// The sender's commit number; at most `op`.
    pub commit: Op,
    /// The consensus group.
    pub group: GroupId,
    /// The last view in which the sender's log changed; at most `view`.
    pub log_view: u32,
    /// Bit `i`: the sender proves it never prepared suffix slot `i`.
    pub nack_bitset: u128,
    /// Bit `i`: the sender holds the body of suffix slot `i`.
    pub present_bitset: u128,
}

header_layout!(DoViewChangeHeader over TAIL => {
    op: Op @ 128,
    commit: Op @ 136,
    group: GroupId @ 144,
    log_view: u32 @ 152,
    nack_bitset: u128 @ 224,
    present_bitset: u128 @ 240,
});

/// The new primary's announcement of a view. The body optionally holds the
/// log suffix, as in DoViewChange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartViewHeader {
    /// The primary's head op.
    pub op: Op,
    /// The primary's commit number; at most `op`.
    pub commit: Op,
    /// The consensus group.
    pub group: GroupId,
    /// Echo of a prober's incarnation (0 when unsolicited).
    pub incarnation: u128,
}

header_layout!(StartViewHeader over TAIL => {
    op: Op @ 128,
    commit: Op @ 136,
    group: GroupId @ 144,
    incarnation: u128 @ 240,
});

/// A recovering replica's probe for the current view. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStartViewHeader {
    /// The consensus group.
    pub group: GroupId,
    /// The prober's per-boot nonce.
    pub incarnation: u128,
    /// Whether the probe carries a census report (the three fields below;
    /// all zero otherwise).
    pub census: bool,
    /// The prober's durable applied op.
    pub census_op: Op,
    /// That op's identity.
    pub census_checksum: u128,
    /// The prober's durable log view.
    pub census_log_view: u32,
}

header_layout!(RequestStartViewHeader over TAIL => {
    group: GroupId @ 128,
    census_op: Op @ 136,
    census_checksum: u128 @ 144,
    census_log_view: u32 @ 160,
    census: bool @ 164,
    incarnation: u128 @ 240,
});

/// The census fields' bytes, which a probe without a census leaves zero
/// (a unit test holds this to the layout above).
const CENSUS_BYTES: std::ops::Range<usize> = 136..164;

// The census fields mean something only under the census flag, so this
// header wraps its declared layout: without a census they are written as
// zeros whatever the struct holds, and a decode refuses them nonzero; and
// its flag byte is refused with a reason of its own.
impl RequestStartViewHeader {
    fn read(b: &Bytes, command: Command) -> Result<Self, HeaderError> {
        Self::check_reserved(b)?;
        if Self::LAYOUT.has_bad_flag(b) {
            return Err(invalid(command, "census flag is neither 0 nor 1"));
        }
        let h = Self::read_fields(b);
        if !h.census {
            zero(b, CENSUS_BYTES)?;
        }
        Ok(h)
    }

    fn write(&self, b: &mut Bytes) {
        let sent = if self.census {
            *self
        } else {
            Self {
                group: self.group,
                incarnation: self.incarnation,
                ..Self::default()
            }
        };
        sent.write_fields(b);
    }
}

/// A request for prepares `from_op..=to_op`. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestPreparesHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// First op wanted; at least 1.
    pub from_op: Op,
    /// Last op wanted; at least `from_op`.
    pub to_op: Op,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(RequestPreparesHeader over TAIL => {
    nonce: u128 @ 128,
    from_op: Op @ 144,
    to_op: Op @ 152,
    group: GroupId @ 160,
});

/// RepairDone (the last op served) and RangeEvicted (the oldest op the
/// peer still retains) share this layout. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RepairRangeHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// The op the command reports.
    pub op: Op,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(RepairRangeHeader over TAIL => {
    nonce: u128 @ 128,
    op: Op @ 144,
    group: GroupId @ 152,
});

/// Ping (the primary asks its backups to vouch for its view before it
/// serves a read) and Pong (a backup's answer) share this layout.
/// Header-only; the prefix view is the sender's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingHeader {
    /// The consensus group.
    pub group: GroupId,
    /// The primary's read-check round; a Pong echoes its Ping's.
    pub round: u64,
}

header_layout!(PingHeader over TAIL => {
    group: GroupId @ 128,
    round: u64 @ 136,
});

/// A request for prepare headers `from_op..=to_op`, at most 128 of them.
/// Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestHeadersHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// First op wanted; at least 1.
    pub from_op: Op,
    /// Last op wanted; within 128 ops of `from_op`.
    pub to_op: Op,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(RequestHeadersHeader over TAIL => {
    nonce: u128 @ 128,
    from_op: Op @ 144,
    to_op: Op @ 152,
    group: GroupId @ 160,
});

/// A run of prepare headers; the body holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeadersHeader {
    /// Echo of the request's nonce.
    pub nonce: u128,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(HeadersHeader over TAIL => {
    nonce: u128 @ 128,
    group: GroupId @ 144,
});

/// A request for a state-transfer offer. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStateTransferHeader {
    /// The receiver's session nonce.
    pub nonce: u128,
    /// The consensus group.
    pub group: GroupId,
}

header_layout!(RequestStateTransferHeader over TAIL => {
    nonce: u128 @ 128,
    group: GroupId @ 144,
});

/// A state-transfer offer, or a refusal. When available, the body is the
/// encoded state manifest; a refusal is header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateTransferTargetHeader {
    /// Echo of the request's nonce.
    pub nonce: u128,
    /// The server's commit_min when it built the offer.
    pub commit_op: Op,
    /// The consensus group.
    pub group: GroupId,
    /// Whether an offer follows.
    pub available: bool,
    /// For a refusal: whether asking again soon may succeed.
    pub unavailable_transient: bool,
    /// The server's commit_max.
    pub commit_max: Op,
}

header_layout!(StateTransferTargetHeader over TAIL => {
    nonce: u128 @ 128,
    commit_op: Op @ 144,
    group: GroupId @ 152,
    available: bool @ 160,
    unavailable_transient: bool @ 161,
    commit_max: Op @ 168,
});

/// A request for `len` bytes of artifact `artifact` at `offset`.
/// Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStateChunkHeader {
    /// The session nonce.
    pub nonce: u128,
    /// Byte offset within the artifact.
    pub offset: u64,
    /// The consensus group.
    pub group: GroupId,
    /// Bytes wanted; never 0.
    pub len: u32,
    /// The artifact's manifest index.
    pub artifact: u32,
}

header_layout!(RequestStateChunkHeader over TAIL => {
    nonce: u128 @ 128,
    offset: u64 @ 144,
    group: GroupId @ 152,
    len: u32 @ 160,
    artifact: u32 @ 164,
});

/// One chunk of an artifact; the body is the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateChunkHeader {
    /// The session nonce.
    pub nonce: u128,
    /// Byte offset of the payload within the artifact.
    pub offset: u64,
    /// The consensus group.
    pub group: GroupId,
    /// The artifact's manifest index.
    pub artifact: u32,
}

header_layout!(StateChunkHeader over TAIL => {
    nonce: u128 @ 128,
    offset: u64 @ 144,
    group: GroupId @ 152,
    artifact: u32 @ 160,
});

/// The command-specific fields of a header, by command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandHeader {
    /// Command 5.
    Request(RequestHeader),
    /// Command 8.
    Reply(ReplyHeader),
    /// Command 6.
    Prepare(PrepareCommand),
    /// Command 19: a prepare served by repair.
    RepairPrepare(PrepareCommand),
    /// Command 7.
    PrepareOk(PrepareOkHeader),
    /// Command 9.
    Commit(CommitHeader),
    /// Command 10.
    StartViewChange(StartViewChangeHeader),
    /// Command 11.
    DoViewChange(DoViewChangeHeader),
    /// Command 12.
    StartView(StartViewHeader),
    /// Command 17.
    RequestStartView(RequestStartViewHeader),
    /// Command 18.
    RequestPrepares(RequestPreparesHeader),
    /// Command 20.
    RepairDone(RepairRangeHeader),
    /// Command 21.
    RangeEvicted(RepairRangeHeader),
    /// Command 1.
    Ping(PingHeader),
    /// Command 2.
    Pong(PingHeader),
    /// Command 30.
    RequestHeaders(RequestHeadersHeader),
    /// Command 31.
    Headers(HeadersHeader),
    /// Command 22.
    RequestStateTransfer(RequestStateTransferHeader),
    /// Command 23.
    StateTransferTarget(StateTransferTargetHeader),
    /// Command 24.
    RequestStateChunk(RequestStateChunkHeader),
    /// Command 25.
    StateChunk(StateChunkHeader),
}

impl CommandHeader {
    /// The command byte this variant encodes as.
    pub const fn command(&self) -> Command {
        match self {
            Self::Request(_) => Command::Request,
            Self::Reply(_) => Command::Reply,
            Self::Prepare(_) => Command::Prepare,
            Self::RepairPrepare(_) => Command::RepairPrepare,
            Self::PrepareOk(_) => Command::PrepareOk,
            Self::Commit(_) => Command::Commit,
            Self::StartViewChange(_) => Command::StartViewChange,
            Self::DoViewChange(_) => Command::DoViewChange,
            Self::StartView(_) => Command::StartView,
            Self::RequestStartView(_) => Command::RequestStartView,
            Self::RequestPrepares(_) => Command::RequestPrepares,
            Self::RepairDone(_) => Command::RepairDone,
            Self::RangeEvicted(_) => Command::RangeEvicted,
            Self::Ping(_) => Command::Ping,
            Self::Pong(_) => Command::Pong,
            Self::RequestHeaders(_) => Command::RequestHeaders,
            Self::Headers(_) => Command::Headers,
            Self::RequestStateTransfer(_) => Command::RequestStateTransfer,
            Self::StateTransferTarget(_) => Command::StateTransferTarget,
            Self::RequestStateChunk(_) => Command::RequestStateChunk,
            Self::StateChunk(_) => Command::StateChunk,
        }
    }

    /// Whether this codec decodes `command`.
    pub const fn supports(command: Command) -> bool {
        !matches!(
            command,
            Command::Reserved
                | Command::PingClient
                | Command::PongClient
                | Command::Eviction
                | Command::ReplicaHello
                | Command::ReplicaChallenge
                | Command::ReplicaFinish
                | Command::ForwardRegister
                | Command::ForwardRegisterResult
                | Command::ForwardLogout
                | Command::ForwardLogoutResult
        )
    }

    /// Whether the command never carries a body.
    pub const fn header_only(&self) -> bool {
        matches!(
            self,
            Self::PrepareOk(_)
                | Self::Commit(_)
                | Self::StartViewChange(_)
                | Self::RequestStartView(_)
                | Self::RequestPrepares(_)
                | Self::RepairDone(_)
                | Self::RangeEvicted(_)
                | Self::Ping(_)
                | Self::Pong(_)
                | Self::RequestHeaders(_)
                | Self::RequestStateTransfer(_)
                | Self::RequestStateChunk(_)
        ) || matches!(self, Self::StateTransferTarget(t) if !t.available)
    }

    /// Decodes the command-specific area of a `command` frame: the
    /// command's fields, then what they must satisfy together
    /// ([`TailChecks`]).
    pub(super) fn read_tail(command: Command, b: &Bytes) -> Result<Self, HeaderError> {
        let tail = match command {
            Command::Request => Self::Request(RequestHeader::read(b)?),
            Command::Reply => Self::Reply(ReplyHeader::decode_fields(b, command)?),
            Command::Prepare => Self::Prepare(PrepareCommand::read(b, command)?),
            Command::RepairPrepare => Self::RepairPrepare(PrepareCommand::read(b, command)?),
            Command::PrepareOk => Self::PrepareOk(PrepareOkHeader::read(b)?),
            Command::Commit => Self::Commit(CommitHeader::decode_fields(b, command)?),
            Command::StartViewChange => {
                Self::StartViewChange(StartViewChangeHeader::decode_fields(b, command)?)
            }
            Command::DoViewChange => {
                Self::DoViewChange(DoViewChangeHeader::decode_fields(b, command)?)
            }
            Command::StartView => Self::StartView(StartViewHeader::decode_fields(b, command)?),
            Command::RequestStartView => {
                Self::RequestStartView(RequestStartViewHeader::read(b, command)?)
            }
            Command::RequestPrepares => {
                Self::RequestPrepares(RequestPreparesHeader::decode_fields(b, command)?)
            }
            Command::RepairDone => Self::RepairDone(RepairRangeHeader::decode_fields(b, command)?),
            Command::RangeEvicted => {
                Self::RangeEvicted(RepairRangeHeader::decode_fields(b, command)?)
            }
            Command::Ping => Self::Ping(PingHeader::decode_fields(b, command)?),
            Command::Pong => Self::Pong(PingHeader::decode_fields(b, command)?),
            Command::RequestHeaders => {
                Self::RequestHeaders(RequestHeadersHeader::decode_fields(b, command)?)
            }
            Command::Headers => Self::Headers(HeadersHeader::decode_fields(b, command)?),
            Command::RequestStateTransfer => {
                Self::RequestStateTransfer(RequestStateTransferHeader::decode_fields(b, command)?)
            }
            Command::StateTransferTarget => {
                Self::StateTransferTarget(StateTransferTargetHeader::decode_fields(b, command)?)
            }
            Command::RequestStateChunk => {
                Self::RequestStateChunk(RequestStateChunkHeader::decode_fields(b, command)?)
            }
            Command::StateChunk => Self::StateChunk(StateChunkHeader::decode_fields(b, command)?),
            other => return Err(HeaderError::UnsupportedCommand { command: other }),
        };
        tail.check_fields(u32_at(b, VIEW_OFFSET))
            .map_err(|reason| invalid(command, reason))?;
        Ok(tail)
    }

    /// What a decoded command's fields must satisfy together, each field
    /// being in range on its own: a range that is not one, a commit ahead of
    /// its head, an offer that is also a refusal. `view` is the frame's.
    fn check_fields(&self, view: u32) -> Result<(), &'static str> {
        match self {
            Self::DoViewChange(h) if h.log_view > view => Err("log_view is ahead of view"),
            Self::DoViewChange(DoViewChangeHeader { commit, op, .. })
            | Self::StartView(StartViewHeader { commit, op, .. })
                if commit > op =>
            {
                Err("commit is ahead of op")
            }
            Self::RequestPrepares(RequestPreparesHeader { from_op, to_op, .. })
            | Self::RequestHeaders(RequestHeadersHeader { from_op, to_op, .. })
                if *from_op == Op::ZERO || from_op > to_op =>
            {
                Err("the range must satisfy 1 <= from <= to")
            }
            Self::RequestHeaders(h)
                if h.to_op.ops_since(h.from_op) >= super::HEADERS_PER_FRAME_MAX as u64 =>
            {
                Err("the range spans more than 128 ops")
            }
            Self::Ping(h) | Self::Pong(h) if h.round == 0 => Err("read-check rounds start at 1"),
            Self::StateTransferTarget(h) if h.available && h.unavailable_transient => {
                Err("an offer cannot also be a refusal")
            }
            Self::StateTransferTarget(h) if h.available && h.commit_op > h.commit_max => {
                Err("commit_op is ahead of commit_max")
            }
            Self::RequestStateChunk(h) if h.len == 0 => {
                Err("a chunk request asks for at least one byte")
            }
            _ => Ok(()),
        }
    }

    pub(super) fn write_tail(&self, b: &mut Bytes) {
        match self {
            Self::Request(h) => h.write_fields(b),
            Self::Reply(h) => h.write_fields(b),
            Self::Prepare(h) | Self::RepairPrepare(h) => h.write_fields(b),
            Self::PrepareOk(h) => h.write_fields(b),
            Self::Commit(h) => h.write_fields(b),
            Self::StartViewChange(h) => h.write_fields(b),
            Self::DoViewChange(h) => h.write_fields(b),
            Self::StartView(h) => h.write_fields(b),
            Self::RequestStartView(h) => h.write(b),
            Self::RequestPrepares(h) => h.write_fields(b),
            Self::RepairDone(h) | Self::RangeEvicted(h) => h.write_fields(b),
            Self::Ping(h) | Self::Pong(h) => h.write_fields(b),
            Self::RequestHeaders(h) => h.write_fields(b),
            Self::Headers(h) => h.write_fields(b),
            Self::RequestStateTransfer(h) => h.write_fields(b),
            Self::StateTransferTarget(h) => h.write_fields(b),
            Self::RequestStateChunk(h) => h.write_fields(b),
            Self::StateChunk(h) => h.write_fields(b),
        }
    }

    /// Checks the body against the command: empty for header-only commands,
    /// valid prepare headers for suffix-carrying ones, a non-empty manifest
    /// slot for an offer.
    pub(super) fn check_body(&self, body: &[u8]) -> Result<(), HeaderError> {
        if self.header_only() {
            if !body.is_empty() {
                return Err(HeaderError::UnexpectedBody {
                    command: self.command(),
                    len: body.len(),
                });
            }
            return Ok(());
        }
        match self {
            Self::DoViewChange(h) => {
                check_prepare_headers(body)?;
                let count = body.len() / HEADER_SIZE;
                let beyond = if count >= 128 { 0 } else { !0u128 << count };
                if (h.nack_bitset | h.present_bitset) & beyond != 0 {
                    return Err(invalid(
                        Command::DoViewChange,
                        "a bitset names a slot past the suffix",
                    ));
                }
                Ok(())
            }
            Self::StartView(_) | Self::Headers(_) => check_prepare_headers(body),
            Self::StateTransferTarget(h) if h.available && body.is_empty() => Err(invalid(
                Command::StateTransferTarget,
                "an offer must carry its manifest",
            )),
            _ => Ok(()),
        }
    }
}

fn check_prepare_headers(body: &[u8]) -> Result<(), HeaderError> {
    check_headers_body(body)?;
    for chunk in body.chunks_exact(HEADER_SIZE) {
        let mut b = [0u8; HEADER_SIZE];
        b.copy_from_slice(chunk);
        decode_prepare_entry(&b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_census_fields_when_the_flag_is_cleared_should_drop_exactly_the_census_bytes() {
        let with = RequestStartViewHeader {
            group: GroupId(u64::MAX),
            incarnation: u128::MAX,
            census: true,
            census_op: Op(u64::MAX),
            census_checksum: u128::MAX,
            census_log_view: u32::MAX,
        };
        let without = RequestStartViewHeader {
            census: false,
            ..with
        };
        let (mut a, mut b) = ([0u8; HEADER_SIZE], [0u8; HEADER_SIZE]);
        with.write(&mut a);
        without.write(&mut b);
        let differ: Vec<usize> = (0..HEADER_SIZE).filter(|&i| a[i] != b[i]).collect();
        let flag = 164;
        let expected: Vec<usize> = CENSUS_BYTES.chain(flag..flag + 1).collect();
        assert_eq!(differ, expected);
    }
}
