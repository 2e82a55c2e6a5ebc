//! Why a frame header failed to decode.

use super::Command;
use std::fmt;

/// A frame that failed to decode. Each cause is its own variant; nothing of
/// a frame that returns one is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The buffer is shorter than the 256-byte header.
    TooShort {
        /// Bytes present.
        len: usize,
    },
    /// `size` is below the header's own 256 bytes.
    SizeBelowHeader {
        /// The declared size.
        size: u32,
    },
    /// `size` is above the configured maximum.
    SizeAboveMax {
        /// The declared size.
        size: u32,
        /// The configured maximum.
        max: u32,
    },
    /// The buffer ends before `size` bytes.
    Truncated {
        /// The declared size.
        size: u32,
        /// Bytes present.
        len: usize,
    },
    /// The buffer runs past `size` bytes.
    TrailingBytes {
        /// The declared size.
        size: u32,
        /// Bytes present.
        len: usize,
    },
    /// The command byte names no command.
    UnknownCommand {
        /// The byte found.
        command: u8,
    },
    /// A command this codec does not decode (handshakes, pings, forwards).
    UnsupportedCommand {
        /// The command.
        command: Command,
    },
    /// The seal or the prepare identity does not match the header.
    SealMismatch {
        /// The checksum stored in the header.
        stored: u128,
        /// The checksum computed over it.
        computed: u128,
    },
    /// `checksum_body` does not match the body.
    BodyChecksumMismatch {
        /// The checksum stored in the header.
        stored: u128,
        /// The checksum computed over the body.
        computed: u128,
    },
    /// A reserved or padding byte is not zero.
    NonzeroReserved {
        /// Offset of the first nonzero byte within the header.
        offset: usize,
    },
    /// `release` is not zero (no other release exists yet).
    UnsupportedRelease {
        /// The release found.
        release: u32,
    },
    /// A header-only command carries a body.
    UnexpectedBody {
        /// The command.
        command: Command,
        /// Body length.
        len: usize,
    },
    /// A body that should be prepare headers is not a whole number of them.
    BodyNotHeaders {
        /// Body length.
        len: usize,
    },
    /// More prepare headers than a frame may carry.
    TooManyHeaders {
        /// How many the body holds.
        count: usize,
    },
    /// A field breaks its command's rules.
    Invalid {
        /// The command.
        command: Command,
        /// The rule broken.
        reason: &'static str,
    },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => write!(f, "frame of {len} bytes is shorter than its header"),
            Self::SizeBelowHeader { size } => {
                write!(f, "frame size {size} is below the 256-byte header")
            }
            Self::SizeAboveMax { size, max } => {
                write!(f, "frame size {size} exceeds the maximum {max}")
            }
            Self::Truncated { size, len } => {
                write!(f, "frame declares {size} bytes but only {len} arrived")
            }
            Self::TrailingBytes { size, len } => {
                write!(f, "frame declares {size} bytes but {len} arrived")
            }
            Self::UnknownCommand { command } => write!(f, "unknown command byte {command}"),
            Self::UnsupportedCommand { command } => {
                write!(
                    f,
                    "command {command:?} is not decoded by the consensus codec"
                )
            }
            Self::SealMismatch { stored, computed } => write!(
                f,
                "header checksum {stored:#x} does not match the header ({computed:#x})"
            ),
            Self::BodyChecksumMismatch { stored, computed } => write!(
                f,
                "body checksum {stored:#x} does not match the body ({computed:#x})"
            ),
            Self::NonzeroReserved { offset } => {
                write!(f, "reserved header byte {offset} is not zero")
            }
            Self::UnsupportedRelease { release } => write!(f, "unsupported release {release}"),
            Self::UnexpectedBody { command, len } => {
                write!(f, "{command:?} is header-only but carries {len} body bytes")
            }
            Self::BodyNotHeaders { len } => write!(
                f,
                "body of {len} bytes is not a whole number of 256-byte headers"
            ),
            Self::TooManyHeaders { count } => write!(
                f,
                "body holds {count} headers, more than the {} allowed",
                super::HEADERS_PER_FRAME_MAX
            ),
            Self::Invalid { command, reason } => write!(f, "invalid {command:?} header: {reason}"),
        }
    }
}

impl std::error::Error for HeaderError {}
