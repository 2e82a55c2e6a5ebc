//! Why a request could not be taken: the frame itself ([`FrameError`], the
//! connection cannot go on) or its body ([`PayloadError`], the request is
//! answered with an error code and the connection goes on).

use consensus::header::HeaderError;
use std::fmt;
use storage::BatchError;

/// A frame the reader or the header codec refused. Nothing after it on the
/// connection can be trusted to start on a frame boundary, so the driver
/// closes the connection (client_protocol.md has no resynchronisation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The declared size does not cover the 256-byte header itself.
    SizeBelowHeader {
        /// The declared size.
        size: u32,
    },
    /// The declared size is above the configured ceiling; refused before
    /// any of it is buffered.
    SizeAboveMax {
        /// The declared size.
        size: u32,
        /// The ceiling.
        max: u32,
    },
    /// The header is not a client request (garbage, or a server-bound
    /// command on the client port).
    NotARequest {
        /// The command byte found at offset 60.
        command: u8,
    },
    /// The header names a request but breaks the header codec's rules
    /// (reserved bytes, release, client id, session rules, checksums).
    Header(HeaderError),
    /// The stream ended inside a frame.
    Truncated {
        /// Bytes of the unfinished frame that arrived.
        received: usize,
        /// The declared size, if its four bytes arrived.
        size: Option<u32>,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SizeBelowHeader { size } => {
                write!(f, "frame size {size} is below the 256-byte header")
            }
            Self::SizeAboveMax { size, max } => {
                write!(f, "frame size {size} exceeds the ceiling of {max} bytes")
            }
            Self::NotARequest { command } => {
                write!(f, "command byte {command} is not a client request (5)")
            }
            Self::Header(e) => write!(f, "request header refused: {e}"),
            Self::Truncated { received, size } => match size {
                Some(size) => write!(f, "stream ended after {received} of {size} frame bytes"),
                None => write!(f, "stream ended after {received} bytes of a frame header"),
            },
        }
    }
}

impl std::error::Error for FrameError {}

/// Which kind of name a [`PayloadError::InvalidName`] concerns; it decides
/// the error code (each kind has its own in Iggy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameField {
    /// A stream name.
    Stream,
    /// A topic name.
    Topic,
    /// A consumer group name.
    ConsumerGroup,
    /// A login string (username, SDK name or version).
    Login,
}

/// A request body that does not decode. The header was fine, so the
/// request is answered (with the code of `crate::status`) and the
/// connection goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadError {
    /// The operation (or, for operation 2, the legacy code) names no
    /// command of the 0.11.0 protocol.
    UnknownCommand {
        /// The operation byte.
        operation: u8,
        /// The legacy code at header offset 196 (0 unless operation is 2).
        code: u32,
    },
    /// The body ended before the field.
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes follow the last field of a fixed-shape body.
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// Text that is not UTF-8.
    InvalidUtf8 {
        /// The field being read.
        field: &'static str,
    },
    /// A kind byte (identifier, consumer, partitioning, strategy, ack)
    /// outside its range.
    UnknownKind {
        /// The field being read.
        field: &'static str,
        /// The byte found.
        kind: u8,
    },
    /// A boolean or presence flag that is neither 0 nor 1.
    InvalidFlag {
        /// The field being read.
        field: &'static str,
        /// The byte found.
        value: u8,
    },
    /// An identifier of the wrong length (numeric must be 4 bytes, a name
    /// 1..=255).
    InvalidIdentifier {
        /// The field being read.
        field: &'static str,
        /// The identifier kind byte.
        kind: u8,
        /// The declared length.
        len: u8,
    },
    /// A name of length 0 (names are 1..=255 bytes).
    InvalidName {
        /// Which name.
        field: NameField,
        /// The declared length.
        len: usize,
    },
    /// An options block breaking the TLV rules.
    InvalidOptions {
        /// The rule broken.
        reason: &'static str,
    },
    /// SEND_MESSAGES: `metadata_length` does not match the fields.
    MetadataLengthMismatch {
        /// The declared length.
        declared: u32,
        /// The length of the fields that follow it.
        actual: usize,
    },
    /// SEND_MESSAGES: the metadata count and the batch header disagree.
    MessagesCountMismatch {
        /// The metadata's count.
        declared: u32,
        /// The batch header's count.
        batch: u32,
    },
    /// SEND_MESSAGES: the batch failed the batch codec.
    Batch(BatchError),
    /// The header's `request_checksum` (which the SDK stamps on metadata
    /// and session operations) does not match the body.
    RequestChecksumMismatch {
        /// The stamp in the header.
        stored: u128,
        /// xxh3-64 of the body.
        computed: u128,
    },
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownCommand { operation, code } => {
                write!(f, "unknown command (operation {operation}, code {code})")
            }
            Self::Truncated { field } => write!(f, "body ends before {field}"),
            Self::TrailingBytes { len } => write!(f, "{len} bytes follow the last field"),
            Self::InvalidUtf8 { field } => write!(f, "{field} is not UTF-8"),
            Self::UnknownKind { field, kind } => write!(f, "{field} has unknown kind {kind}"),
            Self::InvalidFlag { field, value } => {
                write!(f, "{field} flag is {value}, expected 0 or 1")
            }
            Self::InvalidIdentifier { field, kind, len } => {
                write!(
                    f,
                    "{field}: identifier of kind {kind} cannot be {len} bytes"
                )
            }
            Self::InvalidName { field, len } => {
                write!(f, "{field:?} name of {len} bytes (1..=255 allowed)")
            }
            Self::InvalidOptions { reason } => write!(f, "options block: {reason}"),
            Self::MetadataLengthMismatch { declared, actual } => write!(
                f,
                "metadata_length says {declared} bytes but the fields take {actual}"
            ),
            Self::MessagesCountMismatch { declared, batch } => write!(
                f,
                "metadata counts {declared} messages but the batch holds {batch}"
            ),
            Self::Batch(e) => write!(f, "message batch refused: {e}"),
            Self::RequestChecksumMismatch { stored, computed } => write!(
                f,
                "request checksum {stored:#x} does not match the body ({computed:#x})"
            ),
        }
    }
}

impl std::error::Error for PayloadError {}
