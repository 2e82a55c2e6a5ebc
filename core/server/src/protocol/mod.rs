//! The Apache Iggy 0.11.0 TCP client protocol, sans-IO
//! (`shared/reference/client_protocol.md`).
//!
//! Where to start:
//! - [`FrameReader`] cuts a byte stream into [`RequestFrame`]s (or a
//!   [`FrameError`], after which the connection is closed);
//! - [`RequestFrame::command_code`] and [`RequestFrame::decode_command`]
//!   turn one into a [`ClientCommand`] (or a [`PayloadError`], answered
//!   with an error code);
//! - the [`records`] are what replies carry, [`encode_reply`] and
//!   [`encode_eviction`] frame them.
//!
//! The 256-byte header itself is `consensus::header`'s; nothing here reads
//! or writes a header field of a request or reply.

pub mod codes;
mod error;
mod frame;
pub mod poll;
mod primitives;
pub mod records;
mod reply;
mod request;

#[cfg(test)]
pub(crate) mod tests;

pub use codes::CommandCode;
pub use error::{FrameError, NameField, PayloadError};
pub use frame::{FrameReader, RequestFrame};
pub use primitives::{
    AckLevel, Consumer, Identifier, NAME_LEN_MAX, Name, OptionEntry, Options, Partitioning,
    PollingStrategy,
};
pub use reply::{EvictionReason, Outcome, VersionWindow, encode_eviction, encode_reply};
pub use request::{
    ClientCommand, ConsumerOffsetKey, CreateConsumerGroup, CreateStream, CreateTopic,
    DeleteConsumerOffset, FlushUnsavedBuffer, GroupRef, LoginRegister, PartitionsChange,
    PollMessages, SendMessages, StoreConsumerOffset, TopicRef, UpdateStream, UpdateTopic,
    decode_body,
};

/// Packs a semantic version the way the protocol does:
/// `major << 20 | minor << 10 | patch`, 10 bits each.
pub const fn pack_version(major: u32, minor: u32, patch: u32) -> u32 {
    (major << 20) | (minor << 10) | patch
}

/// The protocol version replog speaks: 0.11.0 (11264).
pub const PROTOCOL_VERSION: u32 = pack_version(0, 11, 0);
/// The oldest client version accepted: this one with the patch cleared.
pub const PROTOCOL_VERSION_MIN: u32 = PROTOCOL_VERSION & !0x3ff;

/// Whether a client of packed version `client` may log in: at least the
/// minimum, and major.minor no newer than ours (the SDK's own rule).
pub const fn protocol_compatible(client: u32) -> bool {
    client >= PROTOCOL_VERSION_MIN && (client >> 10) <= (PROTOCOL_VERSION >> 10)
}

/// The window sent with an IncompatibleProtocol eviction.
pub const VERSION_WINDOW: VersionWindow = VersionWindow {
    version: PROTOCOL_VERSION,
    version_min: PROTOCOL_VERSION_MIN,
};
