//! The command-specific area (bytes 128..256) of each header this codec
//! handles, with the field rules each command's decode enforces.

use super::{
    Command, HEADER_SIZE, HeaderError, check_headers_body, decode_prepare_entry, put, u32_at,
    u64_at, u128_at, zero,
};

type Bytes = [u8; HEADER_SIZE];

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

impl RequestHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        zero(b, 177..184)?;
        zero(b, 200..256)?;
        let h = Self {
            client: u128_at(b, 128),
            request_checksum: u128_at(b, 144),
            timestamp: u64_at(b, 160),
            request: u64_at(b, 168),
            operation: b[176],
            session: u64_at(b, 184),
            user_id: u32_at(b, 192),
            legacy_command: u32_at(b, 196),
        };
        let c = Command::Request;
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

    fn write(&self, b: &mut Bytes) {
        put(b, 128, &self.client.to_le_bytes());
        put(b, 144, &self.request_checksum.to_le_bytes());
        put(b, 160, &self.timestamp.to_le_bytes());
        put(b, 168, &self.request.to_le_bytes());
        b[176] = self.operation;
        put(b, 184, &self.session.to_le_bytes());
        put(b, 192, &self.user_id.to_le_bytes());
        put(b, 196, &self.legacy_command.to_le_bytes());
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
    pub op: u64,
    /// The commit number when the reply was built.
    pub commit: u64,
    /// The prepare's timestamp.
    pub timestamp: u64,
    /// Echo of the request number.
    pub request: u64,
    /// Echo of the operation.
    pub operation: u8,
    /// 0 for success, otherwise an error code (with an empty body).
    pub status: u32,
}

impl ReplyHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        zero(b, 209..216)?;
        zero(b, 220..256)?;
        Ok(Self {
            request_checksum: u128_at(b, 128),
            context: u128_at(b, 144),
            client: u128_at(b, 160),
            op: u64_at(b, 176),
            commit: u64_at(b, 184),
            timestamp: u64_at(b, 192),
            request: u64_at(b, 200),
            operation: b[208],
            status: u32_at(b, 216),
        })
    }

    fn write(&self, b: &mut Bytes) {
        put(b, 128, &self.request_checksum.to_le_bytes());
        put(b, 144, &self.context.to_le_bytes());
        put(b, 160, &self.client.to_le_bytes());
        put(b, 176, &self.op.to_le_bytes());
        put(b, 184, &self.commit.to_le_bytes());
        put(b, 192, &self.timestamp.to_le_bytes());
        put(b, 200, &self.request.to_le_bytes());
        b[208] = self.operation;
        put(b, 216, &self.status.to_le_bytes());
    }
}

/// A prepare (also the layout of RepairPrepare and of the headers in a
/// view-change suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrepareHeader {
    /// The client whose request this is.
    pub client: u128,
    /// The identity of the previous op's prepare (the hash chain).
    pub parent: u128,
    /// Checksum of the client's request.
    pub request_checksum: u128,
    /// The op number; at least 1.
    pub op: u64,
    /// The primary's commit number when it built the prepare; below `op`.
    pub commit: u64,
    /// The primary's timestamp, microseconds, strictly increasing.
    pub timestamp: u64,
    /// The client's request number.
    pub request: u64,
    /// The operation; 0 only in a blank suffix slot.
    pub operation: u8,
    /// The consensus group.
    pub group: u64,
    /// The requesting user.
    pub user_id: u32,
}

impl PrepareHeader {
    fn read(b: &Bytes, command: Command) -> Result<Self, HeaderError> {
        zero(b, 209..216)?;
        zero(b, 228..256)?;
        let h = Self {
            client: u128_at(b, 128),
            parent: u128_at(b, 144),
            request_checksum: u128_at(b, 160),
            op: u64_at(b, 176),
            commit: u64_at(b, 184),
            timestamp: u64_at(b, 192),
            request: u64_at(b, 200),
            operation: b[208],
            group: u64_at(b, 216),
            user_id: u32_at(b, 224),
        };
        if h.op == 0 {
            return Err(invalid(command, "op 0 is never prepared"));
        }
        if h.operation != 0 && h.commit >= h.op {
            return Err(invalid(command, "a prepare's commit must be below its op"));
        }
        Ok(h)
    }

    fn write(&self, b: &mut Bytes) {
        put(b, 128, &self.client.to_le_bytes());
        put(b, 144, &self.parent.to_le_bytes());
        put(b, 160, &self.request_checksum.to_le_bytes());
        put(b, 176, &self.op.to_le_bytes());
        put(b, 184, &self.commit.to_le_bytes());
        put(b, 192, &self.timestamp.to_le_bytes());
        put(b, 200, &self.request.to_le_bytes());
        b[208] = self.operation;
        put(b, 216, &self.group.to_le_bytes());
        put(b, 224, &self.user_id.to_le_bytes());
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
    pub op: u64,
    /// The prepare's commit field.
    pub commit: u64,
    /// The prepare's timestamp.
    pub timestamp: u64,
    /// The prepare's request number.
    pub request: u64,
    /// The prepare's operation.
    pub operation: u8,
    /// The consensus group.
    pub group: u64,
}

impl PrepareOkHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        zero(b, 193..200)?;
        zero(b, 208..256)?;
        let h = Self {
            parent: u128_at(b, 128),
            prepare_checksum: u128_at(b, 144),
            op: u64_at(b, 160),
            commit: u64_at(b, 168),
            timestamp: u64_at(b, 176),
            request: u64_at(b, 184),
            operation: b[192],
            group: u64_at(b, 200),
        };
        if h.op == 0 {
            return Err(invalid(Command::PrepareOk, "op 0 is never prepared"));
        }
        Ok(h)
    }

    fn write(&self, b: &mut Bytes) {
        put(b, 128, &self.parent.to_le_bytes());
        put(b, 144, &self.prepare_checksum.to_le_bytes());
        put(b, 160, &self.op.to_le_bytes());
        put(b, 168, &self.commit.to_le_bytes());
        put(b, 176, &self.timestamp.to_le_bytes());
        put(b, 184, &self.request.to_le_bytes());
        b[192] = self.operation;
        put(b, 200, &self.group.to_le_bytes());
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
    pub commit: u64,
    /// The primary's latest checkpoint op.
    pub checkpoint_op: u64,
    /// The consensus group.
    pub group: u64,
}

impl CommitHeader {
    fn read(b: &Bytes) -> Result<Self, HeaderError> {
        zero(b, 176..256)?;
        Ok(Self {
            commit_checksum: u128_at(b, 128),
            timestamp_monotonic: u64_at(b, 144),
            commit: u64_at(b, 152),
            checkpoint_op: u64_at(b, 160),
            group: u64_at(b, 168),
        })
    }

    fn write(&self, b: &mut Bytes) {
        put(b, 128, &self.commit_checksum.to_le_bytes());
        put(b, 144, &self.timestamp_monotonic.to_le_bytes());
        put(b, 152, &self.commit.to_le_bytes());
        put(b, 160, &self.checkpoint_op.to_le_bytes());
        put(b, 168, &self.group.to_le_bytes());
    }
}

/// A vote to leave the current view. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartViewChangeHeader {
    /// The consensus group.
    pub group: u64,
}

/// A replica's log suffix for the new view's primary. The body holds up to
/// 128 prepare headers, highest op first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoViewChangeHeader {
    /// The sender's head op.
    pub op: u64,
    /// The sender's commit number; at most `op`.
    pub commit: u64,
    /// The consensus group.
    pub group: u64,
    /// The last view in which the sender's log changed; at most `view`.
    pub log_view: u32,
    /// Bit `i`: the sender proves it never prepared suffix slot `i`.
    pub nack_bitset: u128,
    /// Bit `i`: the sender holds the body of suffix slot `i`.
    pub present_bitset: u128,
}

/// The new primary's announcement of a view. The body optionally holds the
/// log suffix, as in DoViewChange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartViewHeader {
    /// The primary's head op.
    pub op: u64,
    /// The primary's commit number; at most `op`.
    pub commit: u64,
    /// The consensus group.
    pub group: u64,
    /// Echo of a prober's incarnation (0 when unsolicited).
    pub incarnation: u128,
}

/// A recovering replica's probe for the current view. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStartViewHeader {
    /// The consensus group.
    pub group: u64,
    /// The prober's per-boot nonce.
    pub incarnation: u128,
    /// Whether the probe carries a census report (the three fields below;
    /// all zero otherwise).
    pub census: bool,
    /// The prober's durable applied op.
    pub census_op: u64,
    /// That op's identity.
    pub census_checksum: u128,
    /// The prober's durable log view.
    pub census_log_view: u32,
}

/// A request for prepares `from_op..=to_op`. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestPreparesHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// First op wanted; at least 1.
    pub from_op: u64,
    /// Last op wanted; at least `from_op`.
    pub to_op: u64,
    /// The consensus group.
    pub group: u64,
}

/// RepairDone (the last op served) and RangeEvicted (the oldest op the
/// peer still retains) share this layout. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RepairRangeHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// The op the command reports.
    pub op: u64,
    /// The consensus group.
    pub group: u64,
}

/// Ping (the primary asks its backups to vouch for its view before it
/// serves a read) and Pong (a backup's answer) share this layout.
/// Header-only; the prefix view is the sender's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingHeader {
    /// The consensus group.
    pub group: u64,
    /// The primary's read-check round; a Pong echoes its Ping's.
    pub round: u64,
}

/// A request for prepare headers `from_op..=to_op`, at most 128 of them.
/// Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestHeadersHeader {
    /// The repair session's nonce.
    pub nonce: u128,
    /// First op wanted; at least 1.
    pub from_op: u64,
    /// Last op wanted; within 128 ops of `from_op`.
    pub to_op: u64,
    /// The consensus group.
    pub group: u64,
}

/// A run of prepare headers; the body holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeadersHeader {
    /// Echo of the request's nonce.
    pub nonce: u128,
    /// The consensus group.
    pub group: u64,
}

/// A request for a state-transfer offer. Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStateTransferHeader {
    /// The receiver's session nonce.
    pub nonce: u128,
    /// The consensus group.
    pub group: u64,
}

/// A state-transfer offer, or a refusal. When available, the body is the
/// encoded state manifest; a refusal is header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateTransferTargetHeader {
    /// Echo of the request's nonce.
    pub nonce: u128,
    /// The server's commit_min when it built the offer.
    pub commit_op: u64,
    /// The consensus group.
    pub group: u64,
    /// Whether an offer follows.
    pub available: bool,
    /// For a refusal: whether asking again soon may succeed.
    pub unavailable_transient: bool,
    /// The server's commit_max.
    pub commit_max: u64,
}

/// A request for `len` bytes of artifact `artifact` at `offset`.
/// Header-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestStateChunkHeader {
    /// The session nonce.
    pub nonce: u128,
    /// Byte offset within the artifact.
    pub offset: u64,
    /// The consensus group.
    pub group: u64,
    /// Bytes wanted; never 0.
    pub len: u32,
    /// The artifact's manifest index.
    pub artifact: u32,
}

/// One chunk of an artifact; the body is the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateChunkHeader {
    /// The session nonce.
    pub nonce: u128,
    /// Byte offset of the payload within the artifact.
    pub offset: u64,
    /// The consensus group.
    pub group: u64,
    /// The artifact's manifest index.
    pub artifact: u32,
}

/// The command-specific fields of a header, by command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandHeader {
    /// Command 5.
    Request(RequestHeader),
    /// Command 8.
    Reply(ReplyHeader),
    /// Command 6.
    Prepare(PrepareHeader),
    /// Command 19: a prepare served by repair.
    RepairPrepare(PrepareHeader),
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

    pub(super) fn read_tail(command: Command, b: &Bytes) -> Result<Self, HeaderError> {
        Ok(match command {
            Command::Request => Self::Request(RequestHeader::read(b)?),
            Command::Reply => Self::Reply(ReplyHeader::read(b)?),
            Command::Prepare => Self::Prepare(PrepareHeader::read(b, command)?),
            Command::RepairPrepare => Self::RepairPrepare(PrepareHeader::read(b, command)?),
            Command::PrepareOk => Self::PrepareOk(PrepareOkHeader::read(b)?),
            Command::Commit => Self::Commit(CommitHeader::read(b)?),
            Command::StartViewChange => {
                zero(b, 136..256)?;
                Self::StartViewChange(StartViewChangeHeader {
                    group: u64_at(b, 128),
                })
            }
            Command::DoViewChange => {
                zero(b, 156..224)?;
                let h = DoViewChangeHeader {
                    op: u64_at(b, 128),
                    commit: u64_at(b, 136),
                    group: u64_at(b, 144),
                    log_view: u32_at(b, 152),
                    nack_bitset: u128_at(b, 224),
                    present_bitset: u128_at(b, 240),
                };
                if h.log_view > u32_at(b, 52) {
                    return Err(invalid(command, "log_view is ahead of view"));
                }
                if h.commit > h.op {
                    return Err(invalid(command, "commit is ahead of op"));
                }
                Self::DoViewChange(h)
            }
            Command::StartView => {
                zero(b, 152..240)?;
                let h = StartViewHeader {
                    op: u64_at(b, 128),
                    commit: u64_at(b, 136),
                    group: u64_at(b, 144),
                    incarnation: u128_at(b, 240),
                };
                if h.commit > h.op {
                    return Err(invalid(command, "commit is ahead of op"));
                }
                Self::StartView(h)
            }
            Command::RequestStartView => {
                zero(b, 165..240)?;
                let census = match b[164] {
                    0 => {
                        zero(b, 136..164)?;
                        false
                    }
                    1 => true,
                    _ => return Err(invalid(command, "census flag is neither 0 nor 1")),
                };
                Self::RequestStartView(RequestStartViewHeader {
                    group: u64_at(b, 128),
                    incarnation: u128_at(b, 240),
                    census,
                    census_op: u64_at(b, 136),
                    census_checksum: u128_at(b, 144),
                    census_log_view: u32_at(b, 160),
                })
            }
            Command::RequestPrepares => {
                zero(b, 168..256)?;
                let h = RequestPreparesHeader {
                    nonce: u128_at(b, 128),
                    from_op: u64_at(b, 144),
                    to_op: u64_at(b, 152),
                    group: u64_at(b, 160),
                };
                if h.from_op == 0 || h.from_op > h.to_op {
                    return Err(invalid(command, "the range must satisfy 1 <= from <= to"));
                }
                Self::RequestPrepares(h)
            }
            Command::RepairDone | Command::RangeEvicted => {
                zero(b, 160..256)?;
                let h = RepairRangeHeader {
                    nonce: u128_at(b, 128),
                    op: u64_at(b, 144),
                    group: u64_at(b, 152),
                };
                if command == Command::RepairDone {
                    Self::RepairDone(h)
                } else {
                    Self::RangeEvicted(h)
                }
            }
            Command::Ping | Command::Pong => {
                zero(b, 144..256)?;
                let h = PingHeader {
                    group: u64_at(b, 128),
                    round: u64_at(b, 136),
                };
                if h.round == 0 {
                    return Err(invalid(command, "read-check rounds start at 1"));
                }
                if command == Command::Ping {
                    Self::Ping(h)
                } else {
                    Self::Pong(h)
                }
            }
            Command::RequestHeaders => {
                zero(b, 168..256)?;
                let h = RequestHeadersHeader {
                    nonce: u128_at(b, 128),
                    from_op: u64_at(b, 144),
                    to_op: u64_at(b, 152),
                    group: u64_at(b, 160),
                };
                if h.from_op == 0 || h.from_op > h.to_op {
                    return Err(invalid(command, "the range must satisfy 1 <= from <= to"));
                }
                if h.to_op - h.from_op >= super::HEADERS_PER_FRAME_MAX as u64 {
                    return Err(invalid(command, "the range spans more than 128 ops"));
                }
                Self::RequestHeaders(h)
            }
            Command::Headers => {
                zero(b, 152..256)?;
                Self::Headers(HeadersHeader {
                    nonce: u128_at(b, 128),
                    group: u64_at(b, 144),
                })
            }
            Command::RequestStateTransfer => {
                zero(b, 152..256)?;
                Self::RequestStateTransfer(RequestStateTransferHeader {
                    nonce: u128_at(b, 128),
                    group: u64_at(b, 144),
                })
            }
            Command::StateTransferTarget => {
                zero(b, 162..168)?;
                zero(b, 176..256)?;
                let flag = |at: usize| match b[at] {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(invalid(command, "a flag byte must be 0 or 1")),
                };
                let h = StateTransferTargetHeader {
                    nonce: u128_at(b, 128),
                    commit_op: u64_at(b, 144),
                    group: u64_at(b, 152),
                    available: flag(160)?,
                    unavailable_transient: flag(161)?,
                    commit_max: u64_at(b, 168),
                };
                if h.available && h.unavailable_transient {
                    return Err(invalid(command, "an offer cannot also be a refusal"));
                }
                if h.available && h.commit_op > h.commit_max {
                    return Err(invalid(command, "commit_op is ahead of commit_max"));
                }
                Self::StateTransferTarget(h)
            }
            Command::RequestStateChunk => {
                zero(b, 168..256)?;
                let h = RequestStateChunkHeader {
                    nonce: u128_at(b, 128),
                    offset: u64_at(b, 144),
                    group: u64_at(b, 152),
                    len: u32_at(b, 160),
                    artifact: u32_at(b, 164),
                };
                if h.len == 0 {
                    return Err(invalid(
                        command,
                        "a chunk request asks for at least one byte",
                    ));
                }
                Self::RequestStateChunk(h)
            }
            Command::StateChunk => {
                zero(b, 164..256)?;
                Self::StateChunk(StateChunkHeader {
                    nonce: u128_at(b, 128),
                    offset: u64_at(b, 144),
                    group: u64_at(b, 152),
                    artifact: u32_at(b, 160),
                })
            }
            other => return Err(HeaderError::UnsupportedCommand { command: other }),
        })
    }

    pub(super) fn write_tail(&self, b: &mut Bytes) {
        match self {
            Self::Request(h) => h.write(b),
            Self::Reply(h) => h.write(b),
            Self::Prepare(h) | Self::RepairPrepare(h) => h.write(b),
            Self::PrepareOk(h) => h.write(b),
            Self::Commit(h) => h.write(b),
            Self::StartViewChange(h) => put(b, 128, &h.group.to_le_bytes()),
            Self::DoViewChange(h) => {
                put(b, 128, &h.op.to_le_bytes());
                put(b, 136, &h.commit.to_le_bytes());
                put(b, 144, &h.group.to_le_bytes());
                put(b, 152, &h.log_view.to_le_bytes());
                put(b, 224, &h.nack_bitset.to_le_bytes());
                put(b, 240, &h.present_bitset.to_le_bytes());
            }
            Self::StartView(h) => {
                put(b, 128, &h.op.to_le_bytes());
                put(b, 136, &h.commit.to_le_bytes());
                put(b, 144, &h.group.to_le_bytes());
                put(b, 240, &h.incarnation.to_le_bytes());
            }
            Self::RequestStartView(h) => {
                put(b, 128, &h.group.to_le_bytes());
                if h.census {
                    put(b, 136, &h.census_op.to_le_bytes());
                    put(b, 144, &h.census_checksum.to_le_bytes());
                    put(b, 160, &h.census_log_view.to_le_bytes());
                    put(b, 164, &[1]);
                }
                put(b, 240, &h.incarnation.to_le_bytes());
            }
            Self::RequestPrepares(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.from_op.to_le_bytes());
                put(b, 152, &h.to_op.to_le_bytes());
                put(b, 160, &h.group.to_le_bytes());
            }
            Self::RepairDone(h) | Self::RangeEvicted(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.op.to_le_bytes());
                put(b, 152, &h.group.to_le_bytes());
            }
            Self::Ping(h) | Self::Pong(h) => {
                put(b, 128, &h.group.to_le_bytes());
                put(b, 136, &h.round.to_le_bytes());
            }
            Self::RequestHeaders(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.from_op.to_le_bytes());
                put(b, 152, &h.to_op.to_le_bytes());
                put(b, 160, &h.group.to_le_bytes());
            }
            Self::Headers(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.group.to_le_bytes());
            }
            Self::RequestStateTransfer(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.group.to_le_bytes());
            }
            Self::StateTransferTarget(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.commit_op.to_le_bytes());
                put(b, 152, &h.group.to_le_bytes());
                b[160] = u8::from(h.available);
                b[161] = u8::from(h.unavailable_transient);
                put(b, 168, &h.commit_max.to_le_bytes());
            }
            Self::RequestStateChunk(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.offset.to_le_bytes());
                put(b, 152, &h.group.to_le_bytes());
                put(b, 160, &h.len.to_le_bytes());
                put(b, 164, &h.artifact.to_le_bytes());
            }
            Self::StateChunk(h) => {
                put(b, 128, &h.nonce.to_le_bytes());
                put(b, 144, &h.offset.to_le_bytes());
                put(b, 152, &h.group.to_le_bytes());
                put(b, 160, &h.artifact.to_le_bytes());
            }
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
