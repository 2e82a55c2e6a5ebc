//! The 256-byte consensus frame header: every replica-to-replica frame, and
//! the client request and reply, start with one.
//!
//! The layout is the reference's (a 128-byte common prefix, then a
//! command-specific 128-byte area), written here explicitly little-endian
//! field by field rather than by casting a struct in host order. Each
//! header declares its fields and their offsets once (`layout`); its read,
//! its write and its reserved bytes come from that declaration.
//!
//! Integrity, by command:
//! - **sealed control frames** (everything but Request, Reply and the two
//!   prepare commands): `checksum` is xxh3-64 over header bytes `16..256`,
//!   zero-extended to u128, and is verified before any other field is
//!   believed. `checksum_body` is xxh3-64 of the body, or 0 for an empty body.
//! - **Prepare / RepairPrepare**: `checksum` is the prepare's *identity*,
//!   xxh3-64 over the whole header with `checksum` and `view` zeroed, so a
//!   retransmission may restamp the view and keep its identity; `parent`
//!   chains each prepare to the previous op's identity. The body is bound
//!   through `checksum_body`, which the identity covers. The view field is
//!   the one header field no checksum covers, on purpose.
//! - **Request / Reply**: unsealed, because the client SDK sends zeros there;
//!   a non-zero `checksum` or `checksum_body` is verified all the same.
//!
//! Decoding fails closed, each cause its own [`HeaderError`] variant: a
//! buffer shorter than the header or than `size`, bytes past `size`, `size`
//! below 256 or above the configured maximum, an unknown or unsupported
//! command, a seal, identity or body checksum mismatch, a nonzero reserved
//! byte, a nonzero release, and field rules per command.

mod commands;
mod error;
mod layout;

pub use commands::{
    CommandHeader, CommitHeader, DoViewChangeHeader, HeadersHeader, OPERATION_NON_REPLICATED,
    OPERATION_REGISTER, PingHeader, PrepareCommand, PrepareOkHeader, RepairRangeHeader,
    ReplyHeader, RequestHeader, RequestHeadersHeader, RequestPreparesHeader,
    RequestStartViewHeader, RequestStateChunkHeader, RequestStateTransferHeader,
    StartViewChangeHeader, StartViewHeader, StateChunkHeader, StateTransferTargetHeader,
};
pub use error::HeaderError;

use common::ReplicaId;
use common::le_cursor::{u32_at, u128_at};
use layout::{Bytes, HasLayout, header_layout};
use xxhash_rust::xxh3::xxh3_64;

/// Every header is exactly this long.
pub const HEADER_SIZE: usize = 256;
/// Default ceiling on a frame's `size` (header included).
pub const FRAME_SIZE_MAX_DEFAULT: u32 = 64 * 1024 * 1024;
/// The most prepare headers a DoViewChange, StartView or Headers body holds.
pub const HEADERS_PER_FRAME_MAX: usize = 128;

const CHECKSUM_OFFSET: usize = 0;
const SIZE_OFFSET: usize = 48;
const VIEW_OFFSET: usize = 52;
const COMMAND_OFFSET: usize = 60;

/// The `size` field of a frame whose first bytes are `prefix`, once its
/// four bytes (48..52) have arrived: what a stream reader needs to check a
/// frame against its ceiling before buffering the rest.
pub fn peek_size(prefix: &[u8]) -> Option<u32> {
    let b = prefix.get(SIZE_OFFSET..SIZE_OFFSET + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The command byte (offset 60) of a frame whose first bytes are
/// `prefix`, once it has arrived.
pub fn peek_command(prefix: &[u8]) -> Option<u8> {
    prefix.get(COMMAND_OFFSET).copied()
}

/// The common prefix (bytes 0..128) as stored: a [`FrameHeader`] less its
/// command-specific fields, with the release the codec requires to be 0.
#[derive(Debug, Clone, Copy)]
struct Prefix {
    checksum: u128,
    checksum_body: u128,
    cluster: u128,
    size: u32,
    view: u32,
    release: u32,
    command: u8,
    replica: ReplicaId,
}

header_layout!(Prefix over 0..128 => {
    checksum: u128 @ CHECKSUM_OFFSET,
    checksum_body: u128 @ 16,
    cluster: u128 @ 32,
    size: u32 @ SIZE_OFFSET,
    view: u32 @ VIEW_OFFSET,
    release: u32 @ 56,
    command: u8 @ COMMAND_OFFSET,
    replica: ReplicaId @ 61,
});

/// The command byte. Codes 0–29 are the reference's; 30 and 31 add the
/// header-only repair exchange this codec also needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    /// Never sent.
    Reserved = 0,
    /// The primary asks its backups to vouch for its view (a read check).
    Ping = 1,
    /// A backup vouches that it is in the primary's view.
    Pong = 2,
    /// Client liveness probe (not handled by this codec).
    PingClient = 3,
    /// Client liveness answer (not handled by this codec).
    PongClient = 4,
    /// A client request.
    Request = 5,
    /// A primary's proposal of one op.
    Prepare = 6,
    /// A backup's acknowledgement of a journaled prepare.
    PrepareOk = 7,
    /// The answer to a client request.
    Reply = 8,
    /// The primary's commit heartbeat.
    Commit = 9,
    /// A vote to leave the current view.
    StartViewChange = 10,
    /// A replica's log suffix sent to the new view's primary.
    DoViewChange = 11,
    /// The new primary's announcement of the view and its log.
    StartView = 12,
    /// Session eviction, server to client (not handled by this codec).
    Eviction = 13,
    /// Replica handshake (not handled by this codec).
    ReplicaHello = 14,
    /// Replica handshake (not handled by this codec).
    ReplicaChallenge = 15,
    /// Replica handshake (not handled by this codec).
    ReplicaFinish = 16,
    /// A probe for the current view by a recovering replica.
    RequestStartView = 17,
    /// A request for a range of prepares.
    RequestPrepares = 18,
    /// One repaired prepare.
    RepairPrepare = 19,
    /// The end of a repair slice.
    RepairDone = 20,
    /// The serving peer no longer retains the requested ops.
    RangeEvicted = 21,
    /// A request for a state-transfer offer.
    RequestStateTransfer = 22,
    /// A state-transfer offer (or a refusal).
    StateTransferTarget = 23,
    /// A request for one chunk of an offered artifact.
    RequestStateChunk = 24,
    /// One chunk of an offered artifact.
    StateChunk = 25,
    /// Forwarded client registration (not handled by this codec).
    ForwardRegister = 26,
    /// Forwarded registration result (not handled by this codec).
    ForwardRegisterResult = 27,
    /// Forwarded logout (not handled by this codec).
    ForwardLogout = 28,
    /// Forwarded logout result (not handled by this codec).
    ForwardLogoutResult = 29,
    /// A request for a range of prepare headers (without bodies).
    RequestHeaders = 30,
    /// A run of prepare headers.
    Headers = 31,
}

impl Command {
    /// The command for a byte, if the byte names one.
    pub const fn from_u8(byte: u8) -> Option<Self> {
        use Command::*;
        Some(match byte {
            0 => Reserved,
            1 => Ping,
            2 => Pong,
            3 => PingClient,
            4 => PongClient,
            5 => Request,
            6 => Prepare,
            7 => PrepareOk,
            8 => Reply,
            9 => Commit,
            10 => StartViewChange,
            11 => DoViewChange,
            12 => StartView,
            13 => Eviction,
            14 => ReplicaHello,
            15 => ReplicaChallenge,
            16 => ReplicaFinish,
            17 => RequestStartView,
            18 => RequestPrepares,
            19 => RepairPrepare,
            20 => RepairDone,
            21 => RangeEvicted,
            22 => RequestStateTransfer,
            23 => StateTransferTarget,
            24 => RequestStateChunk,
            25 => StateChunk,
            26 => ForwardRegister,
            27 => ForwardRegisterResult,
            28 => ForwardLogout,
            29 => ForwardLogoutResult,
            30 => RequestHeaders,
            31 => Headers,
            _ => return None,
        })
    }

    /// How this command's header is protected.
    pub const fn integrity(self) -> Integrity {
        match self {
            Self::Request | Self::Reply => Integrity::Unsealed,
            Self::Prepare | Self::RepairPrepare => Integrity::Identity,
            _ => Integrity::Sealed,
        }
    }
}

/// How a command's header is protected (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// `checksum` seals header bytes 16..256.
    Sealed,
    /// `checksum` is the prepare identity (view excluded).
    Identity,
    /// Client-facing: checksums are zero unless the sender set them.
    Unsealed,
}

/// A decoded (or to-be-encoded) frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The seal or identity, as found on decode; recomputed on encode.
    pub checksum: u128,
    /// xxh3-64 of the body, as found on decode; recomputed on encode.
    pub checksum_body: u128,
    /// Cluster id.
    pub cluster: u128,
    /// Total frame length, header included; recomputed on encode.
    pub size: u32,
    /// The sender's view (for PrepareOk, the acker's view).
    pub view: u32,
    /// The sender's replica index.
    pub replica: ReplicaId,
    /// The command and its specific fields.
    pub command: CommandHeader,
}

/// A frame decoded from bytes: the header and the body slice it describes
/// (the typed, owned frame a replica takes is `vsr::Frame`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedFrame<'a> {
    /// The header.
    pub header: FrameHeader,
    /// The bytes after the header (`size - 256` of them).
    pub body: &'a [u8],
}

/// xxh3-64 of `bytes`, widened to the u128 checksum fields (the high half is
/// always zero).
pub fn checksum128(bytes: &[u8]) -> u128 {
    u128::from(xxh3_64(bytes))
}

/// The body checksum convention: xxh3 of a non-empty body, 0 for none.
pub fn body_checksum(body: &[u8]) -> u128 {
    if body.is_empty() {
        0
    } else {
        checksum128(body)
    }
}

/// The seal of a control frame: xxh3 over header bytes 16..256.
pub fn frame_seal(header: &[u8; HEADER_SIZE]) -> u128 {
    checksum128(&header[16..])
}

/// The identity of a prepare: xxh3 over the header with `checksum` (0..16)
/// and `view` (52..56) zeroed.
pub fn prepare_identity(header: &[u8; HEADER_SIZE]) -> u128 {
    let mut copy = *header;
    copy[..16].fill(0);
    copy[VIEW_OFFSET..VIEW_OFFSET + 4].fill(0);
    checksum128(&copy)
}

impl FrameHeader {
    /// The header's bytes exactly as its fields say, checksums included as
    /// given (nothing recomputed).
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        let prefix = Prefix {
            checksum: self.checksum,
            checksum_body: self.checksum_body,
            cluster: self.cluster,
            size: self.size,
            view: self.view,
            release: 0,
            command: self.command.command() as u8,
            replica: self.replica,
        };
        prefix.write_fields(&mut b);
        self.command.write_tail(&mut b);
        b
    }

    /// Parses header bytes: command, reserved bytes and field rules. Does
    /// not check `size` against a buffer or any checksum; [`decode_frame`]
    /// does both.
    pub fn from_bytes(b: &[u8; HEADER_SIZE]) -> Result<Self, HeaderError> {
        // The command first, then the release, then the reserved bytes
        // (docs/formats.md §4.5): a frame of another release may well use
        // bytes this one reserves, and should be refused for its release.
        let command = read_command(b)?;
        let prefix = Prefix::read_fields(b);
        if prefix.release != 0 {
            return Err(HeaderError::UnsupportedRelease {
                release: prefix.release,
            });
        }
        Prefix::check_reserved(b)?;
        Ok(Self {
            checksum: prefix.checksum,
            checksum_body: prefix.checksum_body,
            cluster: prefix.cluster,
            size: prefix.size,
            view: prefix.view,
            replica: prefix.replica,
            command: CommandHeader::read_tail(command, b)?,
        })
    }

    /// The checksum this header should carry given its other fields: the
    /// seal, the prepare identity, or 0 for client-facing frames.
    pub fn expected_checksum(&self) -> u128 {
        let bytes = self.to_bytes();
        match self.command.command().integrity() {
            Integrity::Sealed => frame_seal(&bytes),
            Integrity::Identity => prepare_identity(&bytes),
            Integrity::Unsealed => 0,
        }
    }
}

/// Encodes a frame: sets `size`, `checksum_body` and the seal or identity
/// from `body`, and returns header followed by body.
///
/// # Panics
/// If the body would make `size` overflow u32; callers bound bodies far
/// below that.
pub fn encode_frame(header: &FrameHeader, body: &[u8]) -> Vec<u8> {
    let size = u32::try_from(HEADER_SIZE + body.len()).expect("frame size fits in u32");
    let mut h = *header;
    h.size = size;
    h.checksum = 0;
    h.checksum_body = match h.command.command().integrity() {
        Integrity::Unsealed => 0,
        Integrity::Sealed | Integrity::Identity => body_checksum(body),
    };
    h.checksum = h.expected_checksum();
    let mut out = Vec::with_capacity(HEADER_SIZE + body.len());
    out.extend_from_slice(&h.to_bytes());
    out.extend_from_slice(body);
    out
}

/// Decodes and verifies one whole frame. `frame` must be exactly `size`
/// bytes long; `size_max` is the configured ceiling on a frame.
pub fn decode_frame(frame: &[u8], size_max: u32) -> Result<DecodedFrame<'_>, HeaderError> {
    let Some(head) = frame.first_chunk::<HEADER_SIZE>() else {
        return Err(HeaderError::TooShort { len: frame.len() });
    };
    let size = u32_at(head, SIZE_OFFSET);
    if (size as usize) < HEADER_SIZE {
        return Err(HeaderError::SizeBelowHeader { size });
    }
    if size > size_max {
        return Err(HeaderError::SizeAboveMax {
            size,
            max: size_max,
        });
    }
    if frame.len() < size as usize {
        return Err(HeaderError::Truncated {
            size,
            len: frame.len(),
        });
    }
    if frame.len() > size as usize {
        return Err(HeaderError::TrailingBytes {
            size,
            len: frame.len(),
        });
    }
    let command = read_command(head)?;
    let stored = u128_at(head, CHECKSUM_OFFSET);
    // The seal is checked before any other field is believed.
    match command.integrity() {
        Integrity::Sealed => check_checksum(stored, frame_seal(head), seal_mismatch)?,
        Integrity::Identity => check_checksum(stored, prepare_identity(head), seal_mismatch)?,
        Integrity::Unsealed if stored != 0 => {
            check_checksum(stored, frame_seal(head), seal_mismatch)?
        }
        Integrity::Unsealed => {}
    }
    let header = FrameHeader::from_bytes(head)?;
    let body = &frame[HEADER_SIZE..];
    let stored_body = header.checksum_body;
    let expected_body = match command.integrity() {
        Integrity::Unsealed if stored_body == 0 => 0,
        _ => body_checksum(body),
    };
    check_checksum(stored_body, expected_body, body_mismatch)?;
    header.command.check_body(body)?;
    Ok(DecodedFrame { header, body })
}

/// Rewrites the view of an encoded prepare in place (a retransmission in a
/// later view). The identity does not cover the view, so it stays valid.
pub fn restamp_prepare_view(frame: &mut [u8], view: u32) -> Result<(), HeaderError> {
    let Some(head) = frame.first_chunk::<HEADER_SIZE>() else {
        return Err(HeaderError::TooShort { len: frame.len() });
    };
    let command = read_command(head)?;
    if command.integrity() != Integrity::Identity {
        return Err(HeaderError::Invalid {
            command,
            reason: "only prepares can be restamped",
        });
    }
    frame[VIEW_OFFSET..VIEW_OFFSET + 4].copy_from_slice(&view.to_le_bytes());
    Ok(())
}

/// Encodes prepare headers back to back, as the body of a DoViewChange,
/// StartView or Headers frame. Each header is written as given: its
/// identity was sealed when the prepare was built.
pub fn encode_prepare_headers(headers: &[FrameHeader]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len() * HEADER_SIZE);
    for h in headers {
        out.extend_from_slice(&h.to_bytes());
    }
    out
}

/// Decodes a body of prepare headers: a whole number of 256-byte headers,
/// at most [`HEADERS_PER_FRAME_MAX`], each a Prepare header whose identity
/// matches (or 0, a blank slot standing for a missing entry, which must then
/// carry the reserved operation 0).
pub fn decode_prepare_headers(body: &[u8]) -> Result<Vec<FrameHeader>, HeaderError> {
    check_headers_body(body)?;
    let mut out = Vec::with_capacity(body.len() / HEADER_SIZE);
    for chunk in body.chunks_exact(HEADER_SIZE) {
        let mut b = [0u8; HEADER_SIZE];
        b.copy_from_slice(chunk);
        out.push(decode_prepare_entry(&b)?);
    }
    Ok(out)
}

fn check_headers_body(body: &[u8]) -> Result<(), HeaderError> {
    if !body.len().is_multiple_of(HEADER_SIZE) {
        return Err(HeaderError::BodyNotHeaders { len: body.len() });
    }
    let count = body.len() / HEADER_SIZE;
    if count > HEADERS_PER_FRAME_MAX {
        return Err(HeaderError::TooManyHeaders { count });
    }
    Ok(())
}

fn decode_prepare_entry(b: &[u8; HEADER_SIZE]) -> Result<FrameHeader, HeaderError> {
    let header = FrameHeader::from_bytes(b)?;
    let CommandHeader::Prepare(prepare) = header.command else {
        return Err(HeaderError::Invalid {
            command: header.command.command(),
            reason: "a header body holds only Prepare headers",
        });
    };
    if header.checksum == 0 {
        if prepare.operation != 0 {
            return Err(HeaderError::Invalid {
                command: Command::Prepare,
                reason: "an unsealed header must be a blank slot (operation 0)",
            });
        }
    } else {
        check_checksum(header.checksum, prepare_identity(b), seal_mismatch)?;
    }
    Ok(header)
}

fn read_command(b: &[u8; HEADER_SIZE]) -> Result<Command, HeaderError> {
    let byte = b[COMMAND_OFFSET];
    let command = Command::from_u8(byte).ok_or(HeaderError::UnknownCommand { command: byte })?;
    if !CommandHeader::supports(command) {
        return Err(HeaderError::UnsupportedCommand { command });
    }
    Ok(command)
}

fn seal_mismatch(stored: u128, computed: u128) -> HeaderError {
    HeaderError::SealMismatch { stored, computed }
}

fn body_mismatch(stored: u128, computed: u128) -> HeaderError {
    HeaderError::BodyChecksumMismatch { stored, computed }
}

fn check_checksum(
    stored: u128,
    expected: u128,
    error: fn(u128, u128) -> HeaderError,
) -> Result<(), HeaderError> {
    if stored == expected {
        Ok(())
    } else {
        Err(error(stored, expected))
    }
}

/// Fails on the first nonzero byte of `range`, a run of bytes a field rule
/// requires to be zero (reserved bytes proper come from the layouts).
fn zero(b: &Bytes, range: std::ops::Range<usize>) -> Result<(), HeaderError> {
    let start = range.start;
    match b[range].iter().position(|&x| x != 0) {
        None => Ok(()),
        Some(i) => Err(HeaderError::NonzeroReserved { offset: start + i }),
    }
}

#[cfg(test)]
mod tests;
