//! Reply and eviction frames (client_protocol.md §2.3–§2.5, §11).
//!
//! A reply is a 256-byte Reply header (through `consensus::header`) and a
//! body. Its rules, each one a way to break the SDK if missed:
//! - `operation` echoes the request's, because the SDK decides from it
//!   whether the body starts with a result section, and refuses an
//!   operation byte it does not know;
//! - a result-framed operation's body starts with `u32 count`: 0 then the
//!   payload, or 1 then one `(u32 index 0, u32 code)` entry for a
//!   rejection; a Register reply is result-framed when non-empty;
//! - every other reply carries its payload bare;
//! - an error in `status` comes with an empty body.
//!
//! An eviction (command 13) is header-only and session-terminal; the
//! consensus codec does not handle it, so its few fields are laid out here,
//! each offset named once.

use super::codes::{OPERATION_NON_REPLICATED, OPERATION_REGISTER, operation_known, result_framed};
use crate::status::ErrorCode;
use common::{Op, ReplicaId};
use consensus::header::{
    CommandHeader, FrameHeader, HEADER_SIZE, ReplyHeader, RequestHeader, encode_frame,
};

/// How a reply reports its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Success, with this payload (possibly empty).
    Ok(&'a [u8]),
    /// A refusal of the operation itself (not found, exists, not owned…):
    /// in the result section for result-framed operations, in `status`
    /// otherwise.
    Rejected(ErrorCode),
    /// A dispatch-time denial (not logged in, malformed, unknown or
    /// unimplemented command): always in `status`, empty body.
    Denied(ErrorCode),
}

/// The operation byte a reply to `request` carries: the request's, unless
/// the SDK would not decode it (a client inventing operations gets a
/// non-replicated reply, which the SDK reads without a result section).
pub fn reply_operation(request: &RequestHeader) -> u8 {
    if operation_known(request.operation) {
        request.operation
    } else {
        OPERATION_NON_REPLICATED
    }
}

/// Encodes the reply to `request`.
pub fn encode_reply(request: &RequestHeader, outcome: Outcome<'_>) -> Vec<u8> {
    let operation = reply_operation(request);
    let framed = result_framed(operation);
    let mut body = Vec::new();
    let status = match outcome {
        Outcome::Ok(payload) => {
            if framed || (operation == OPERATION_REGISTER && !payload.is_empty()) {
                body.extend_from_slice(&0u32.to_le_bytes());
            }
            body.extend_from_slice(payload);
            0
        }
        Outcome::Rejected(code) if framed => {
            body.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&code.code().to_le_bytes());
            0
        }
        Outcome::Rejected(code) | Outcome::Denied(code) => code.code(),
    };
    // A frame's size is a u32: a body past it (which the poll budget
    // keeps far away) is answered as a server error, never a panic.
    let status = if body.len() > u32::MAX as usize - consensus::header::HEADER_SIZE {
        tracing::error!(
            bytes = body.len(),
            "a reply too large for a frame; answered as an error"
        );
        body.clear();
        ErrorCode::Error.code()
    } else {
        status
    };
    let header = FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster: 0,
        size: 0,
        view: 0,
        replica: ReplicaId(0),
        command: CommandHeader::Reply(ReplyHeader {
            request_checksum: request.request_checksum,
            context: 0,
            client: request.client,
            op: Op(0),
            commit: Op(0),
            timestamp: 0,
            request: request.request,
            operation,
            status,
        }),
    };
    encode_frame(&header, &body)
}

/// Why a session is evicted (the byte at offset 255 of an eviction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionReason {
    /// 1.
    NoSession = 1,
    /// 2.
    ClientReleaseTooLow = 2,
    /// 3.
    ClientReleaseTooHigh = 3,
    /// 4.
    InvalidRequestOperation = 4,
    /// 5.
    InvalidRequestBody = 5,
    /// 6.
    InvalidRequestBodySize = 6,
    /// 7.
    SessionTooLow = 7,
    /// 8.
    SessionReleaseMismatch = 8,
    /// 9: wrong username or password (the SDK reports InvalidCredentials).
    InvalidCredentials = 9,
    /// 10.
    InvalidToken = 10,
    /// 11.
    UserInactive = 11,
    /// 12.
    SessionError = 12,
    /// 13.
    StaleClient = 13,
    /// 14: the client's protocol version is outside the server's window
    /// (the SDK reports IncompatibleProtocolVersion).
    IncompatibleProtocol = 14,
    /// 15: the login body does not decode (the SDK reports InvalidFormat).
    MalformedLogin = 15,
}

const EVICTION_COMMAND: u8 = 13;
const EVICTION_SIZE_OFFSET: usize = 48;
const EVICTION_COMMAND_OFFSET: usize = 60;
const EVICTION_CLIENT_OFFSET: usize = 128;
const EVICTION_VERSION_OFFSET: usize = 144;
const EVICTION_VERSION_MIN_OFFSET: usize = 148;
const EVICTION_REASON_OFFSET: usize = 255;

/// The server's protocol-version window, sent with reason 14.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionWindow {
    /// The server's packed version.
    pub version: u32,
    /// The oldest packed client version it accepts.
    pub version_min: u32,
}

/// Encodes an eviction frame for `client`. The version window is written
/// for reason 14 only (the SDK reads it for no other reason).
pub fn encode_eviction(
    client: u128,
    reason: EvictionReason,
    window: VersionWindow,
) -> [u8; HEADER_SIZE] {
    let mut b = [0u8; HEADER_SIZE];
    b[EVICTION_SIZE_OFFSET..EVICTION_SIZE_OFFSET + 4]
        .copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    b[EVICTION_COMMAND_OFFSET] = EVICTION_COMMAND;
    b[EVICTION_CLIENT_OFFSET..EVICTION_CLIENT_OFFSET + 16].copy_from_slice(&client.to_le_bytes());
    if reason == EvictionReason::IncompatibleProtocol {
        b[EVICTION_VERSION_OFFSET..EVICTION_VERSION_OFFSET + 4]
            .copy_from_slice(&window.version.to_le_bytes());
        b[EVICTION_VERSION_MIN_OFFSET..EVICTION_VERSION_MIN_OFFSET + 4]
            .copy_from_slice(&window.version_min.to_le_bytes());
    }
    // Unsealed (checksum 0), as the reference sends it: the SDK reads only
    // the command, the reason and the window.
    b[EVICTION_REASON_OFFSET] = reason as u8;
    b
}
