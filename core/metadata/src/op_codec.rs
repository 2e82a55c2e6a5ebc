//! The byte codec of [`MetadataOp`]: the body of every prepare on group 0
//! and of every metadata WAL entry (layout in docs/formats.md, "Metadata
//! op").
//!
//! `[version u8 = 1][tag u8][fields]`, little-endian, no padding. A name is
//! `u8 len (1..=255)` + UTF-8; an identifier is `u8 kind` (1 numeric:
//! `u32`; 2 name: a name); a password hash is `u16 len (1..=512)` + a PHC
//! string; a topic config is 27 bytes. The decoder fails closed: each
//! rejection is its own [`OpDecodeError`] variant, lengths are checked
//! against the bytes present before anything is allocated, and every byte
//! must be consumed. The encoding is canonical: every accepted byte string
//! is the encoding of exactly one op, so `encode(decode(b)) == b`.

use std::fmt;

use common::le_cursor::LeCursor;

use crate::consumer_group::SessionId;
use crate::identifier::{Identifier, NAME_LEN_MAX};
use crate::op::MetadataOp;
use crate::state::PARTITIONS_PER_TOPIC_MAX;
use crate::topic_config::{
    CompressionAlgorithm, Durability, MaxTopicSize, MessageExpiry, TopicConfig, TopicPatch,
};
use crate::user::{PASSWORD_HASH_LEN_MAX, PasswordHash};

/// The op codec's version byte.
pub const OP_CODEC_VERSION: u8 = 1;

const TAG_CREATE_STREAM: u8 = 1;
const TAG_UPDATE_STREAM: u8 = 2;
const TAG_DELETE_STREAM: u8 = 3;
const TAG_PURGE_STREAM: u8 = 4;
const TAG_CREATE_TOPIC: u8 = 5;
const TAG_UPDATE_TOPIC: u8 = 6;
const TAG_DELETE_TOPIC: u8 = 7;
const TAG_PURGE_TOPIC: u8 = 8;
const TAG_CREATE_PARTITIONS: u8 = 9;
const TAG_DELETE_PARTITIONS: u8 = 10;
const TAG_CREATE_CONSUMER_GROUP: u8 = 11;
const TAG_DELETE_CONSUMER_GROUP: u8 = 12;
const TAG_JOIN_CONSUMER_GROUP: u8 = 13;
const TAG_LEAVE_CONSUMER_GROUP: u8 = 14;
const TAG_END_SESSION: u8 = 15;
const TAG_CREATE_USER: u8 = 16;
const TAG_DELETE_USER: u8 = 17;
const TAG_CHANGE_PASSWORD: u8 = 18;
const TAG_PATCH_TOPIC: u8 = 19;

/// Which settings a topic patch carries (each present one follows in bit
/// order).
const PATCH_COMPRESSION: u8 = 1;
const PATCH_MESSAGE_EXPIRY: u8 = 1 << 1;
const PATCH_MAX_TOPIC_SIZE: u8 = 1 << 2;
const PATCH_ALL: u8 = PATCH_COMPRESSION | PATCH_MESSAGE_EXPIRY | PATCH_MAX_TOPIC_SIZE;

const IDENT_NUMERIC: u8 = 1;
const IDENT_NAME: u8 = 2;

/// Why bytes are not a metadata op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpDecodeError {
    /// The bytes end inside `field`.
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes are left after the op.
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// A version byte this build does not know.
    UnknownVersion(u8),
    /// A tag byte no op has.
    UnknownTag(u8),
    /// A name of length 0 (names are 1..=255 bytes).
    EmptyName {
        /// The field.
        field: &'static str,
    },
    /// A name or hash that is not UTF-8.
    BadUtf8 {
        /// The field.
        field: &'static str,
    },
    /// An identifier kind other than 1 (numeric) or 2 (name).
    UnknownIdentifierKind(u8),
    /// A compression byte other than 1 (none) or 2 (gzip).
    UnknownCompression(u8),
    /// A durability byte other than 1 (replicated) or 2 (persisted).
    UnknownDurability(u8),
    /// A replication factor of 0.
    ZeroReplicationFactor,
    /// A segment size of 0.
    ZeroSegmentSize,
    /// A partition count above [`PARTITIONS_PER_TOPIC_MAX`].
    PartitionCountAboveCeiling {
        /// The count found.
        count: u32,
    },
    /// A password hash length of 0 or above [`PASSWORD_HASH_LEN_MAX`].
    HashLengthOutOfRange {
        /// The length found.
        len: u16,
    },
    /// A password hash that is not an Argon2 PHC string.
    HashNotPhc,
    /// A topic patch naming a setting no patch has.
    UnknownPatchBits(u8),
}

impl fmt::Display for OpDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { field } => write!(f, "metadata op truncated in {field}"),
            Self::TrailingBytes { len } => write!(f, "{len} bytes follow the metadata op"),
            Self::UnknownVersion(v) => write!(f, "unknown metadata op codec version {v}"),
            Self::UnknownTag(t) => write!(f, "unknown metadata op tag {t}"),
            Self::EmptyName { field } => write!(f, "{field} is empty (names are 1..=255 bytes)"),
            Self::BadUtf8 { field } => write!(f, "{field} is not UTF-8"),
            Self::UnknownIdentifierKind(k) => write!(f, "unknown identifier kind {k}"),
            Self::UnknownCompression(c) => write!(f, "unknown compression algorithm {c}"),
            Self::UnknownDurability(d) => write!(f, "unknown durability {d}"),
            Self::ZeroReplicationFactor => f.write_str("replication factor 0"),
            Self::ZeroSegmentSize => f.write_str("segment size 0"),
            Self::PartitionCountAboveCeiling { count } => write!(
                f,
                "partition count {count} above the ceiling {PARTITIONS_PER_TOPIC_MAX}"
            ),
            Self::HashLengthOutOfRange { len } => write!(
                f,
                "password hash length {len} outside 1..={PASSWORD_HASH_LEN_MAX}"
            ),
            Self::HashNotPhc => f.write_str("password hash is not an Argon2 PHC string"),
            Self::UnknownPatchBits(b) => write!(f, "topic patch names unknown settings {b:#04x}"),
        }
    }
}

impl std::error::Error for OpDecodeError {}

/// Why an op cannot be encoded (it could never be decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpEncodeError {
    /// A name outside 1..=255 bytes.
    NameLength {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A partition count above [`PARTITIONS_PER_TOPIC_MAX`].
    PartitionCountAboveCeiling {
        /// The count.
        count: u32,
    },
    /// A replication factor of 0.
    ZeroReplicationFactor,
    /// A segment size of 0.
    ZeroSegmentSize,
}

impl fmt::Display for OpEncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NameLength { field, len } => {
                write!(f, "{field} is {len} bytes; names are 1..=255")
            }
            Self::PartitionCountAboveCeiling { count } => write!(
                f,
                "partition count {count} above the ceiling {PARTITIONS_PER_TOPIC_MAX}"
            ),
            Self::ZeroReplicationFactor => f.write_str("replication factor 0"),
            Self::ZeroSegmentSize => f.write_str("segment size 0"),
        }
    }
}

impl std::error::Error for OpEncodeError {}

pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn name(&mut self, field: &'static str, name: &str) -> Result<(), OpEncodeError> {
        if name.is_empty() || name.len() > NAME_LEN_MAX {
            return Err(OpEncodeError::NameLength {
                field,
                len: name.len(),
            });
        }
        self.u8(name.len() as u8);
        self.0.extend_from_slice(name.as_bytes());
        Ok(())
    }
    pub(crate) fn ident(
        &mut self,
        field: &'static str,
        id: &Identifier,
    ) -> Result<(), OpEncodeError> {
        match id {
            Identifier::Numeric(n) => {
                self.u8(IDENT_NUMERIC);
                self.u32(*n);
            }
            Identifier::Name(name) => {
                self.u8(IDENT_NAME);
                self.name(field, name)?;
            }
        }
        Ok(())
    }
    pub(crate) fn count(&mut self, count: u32) -> Result<(), OpEncodeError> {
        if count > PARTITIONS_PER_TOPIC_MAX {
            return Err(OpEncodeError::PartitionCountAboveCeiling { count });
        }
        self.u32(count);
        Ok(())
    }
    pub(crate) fn config(&mut self, c: &TopicConfig) -> Result<(), OpEncodeError> {
        if c.replication_factor == 0 {
            return Err(OpEncodeError::ZeroReplicationFactor);
        }
        if c.segment_size_bytes == 0 {
            return Err(OpEncodeError::ZeroSegmentSize);
        }
        self.u64(c.message_expiry.to_wire());
        self.u64(c.max_topic_size.to_wire());
        self.u64(c.segment_size_bytes);
        self.u8(c.compression.to_wire());
        self.u8(c.replication_factor);
        self.u8(c.durability.to_wire());
        Ok(())
    }
    pub(crate) fn patch(&mut self, p: &TopicPatch) {
        let mask = if p.compression.is_some() {
            PATCH_COMPRESSION
        } else {
            0
        } | if p.message_expiry.is_some() {
            PATCH_MESSAGE_EXPIRY
        } else {
            0
        } | if p.max_topic_size.is_some() {
            PATCH_MAX_TOPIC_SIZE
        } else {
            0
        };
        self.u8(mask);
        if let Some(c) = p.compression {
            self.u8(c.to_wire());
        }
        if let Some(e) = p.message_expiry {
            self.u64(e.to_wire());
        }
        if let Some(m) = p.max_topic_size {
            self.u64(m.to_wire());
        }
    }
    pub(crate) fn hash(&mut self, h: &PasswordHash) {
        // A `PasswordHash` is 1..=512 bytes by construction.
        let bytes = h.as_str().as_bytes();
        self.0
            .extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }
}

pub(crate) struct Reader<'a>(pub(crate) LeCursor<'a>);

impl<'a> Reader<'a> {
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, OpDecodeError> {
        self.0.u8().map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, OpDecodeError> {
        self.0.u16().map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, OpDecodeError> {
        self.0.u32().map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, OpDecodeError> {
        self.0.u64().map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn u128(&mut self, field: &'static str) -> Result<u128, OpDecodeError> {
        self.0
            .u128()
            .map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn take(
        &mut self,
        field: &'static str,
        n: usize,
    ) -> Result<&'a [u8], OpDecodeError> {
        self.0
            .take(n)
            .map_err(|_| OpDecodeError::Truncated { field })
    }
    pub(crate) fn name(&mut self, field: &'static str) -> Result<String, OpDecodeError> {
        let len = self.u8(field)?;
        if len == 0 {
            return Err(OpDecodeError::EmptyName { field });
        }
        let bytes = self.take(field, usize::from(len))?;
        let s = std::str::from_utf8(bytes).map_err(|_| OpDecodeError::BadUtf8 { field })?;
        Ok(s.to_owned())
    }
    pub(crate) fn ident(&mut self, field: &'static str) -> Result<Identifier, OpDecodeError> {
        match self.u8(field)? {
            IDENT_NUMERIC => Ok(Identifier::Numeric(self.u32(field)?)),
            IDENT_NAME => Ok(Identifier::Name(self.name(field)?)),
            k => Err(OpDecodeError::UnknownIdentifierKind(k)),
        }
    }
    pub(crate) fn count(&mut self, field: &'static str) -> Result<u32, OpDecodeError> {
        let count = self.u32(field)?;
        if count > PARTITIONS_PER_TOPIC_MAX {
            return Err(OpDecodeError::PartitionCountAboveCeiling { count });
        }
        Ok(count)
    }
    pub(crate) fn config(&mut self) -> Result<TopicConfig, OpDecodeError> {
        let message_expiry = MessageExpiry::from_wire(self.u64("message_expiry")?);
        let max_topic_size = MaxTopicSize::from_wire(self.u64("max_topic_size")?);
        let segment_size_bytes = self.u64("segment_size")?;
        let compression = self.u8("compression")?;
        let replication_factor = self.u8("replication_factor")?;
        let durability = self.u8("durability")?;
        if segment_size_bytes == 0 {
            return Err(OpDecodeError::ZeroSegmentSize);
        }
        let compression = CompressionAlgorithm::from_wire(compression)
            .ok_or(OpDecodeError::UnknownCompression(compression))?;
        if replication_factor == 0 {
            return Err(OpDecodeError::ZeroReplicationFactor);
        }
        let durability = Durability::from_wire(durability)
            .ok_or(OpDecodeError::UnknownDurability(durability))?;
        Ok(TopicConfig {
            message_expiry,
            max_topic_size,
            segment_size_bytes,
            compression,
            replication_factor,
            durability,
        })
    }
    pub(crate) fn patch(&mut self) -> Result<TopicPatch, OpDecodeError> {
        let mask = self.u8("patch settings")?;
        if mask & !PATCH_ALL != 0 {
            return Err(OpDecodeError::UnknownPatchBits(mask));
        }
        let compression = if mask & PATCH_COMPRESSION != 0 {
            let c = self.u8("compression")?;
            Some(CompressionAlgorithm::from_wire(c).ok_or(OpDecodeError::UnknownCompression(c))?)
        } else {
            None
        };
        let message_expiry = if mask & PATCH_MESSAGE_EXPIRY != 0 {
            Some(MessageExpiry::from_wire(self.u64("message_expiry")?))
        } else {
            None
        };
        let max_topic_size = if mask & PATCH_MAX_TOPIC_SIZE != 0 {
            Some(MaxTopicSize::from_wire(self.u64("max_topic_size")?))
        } else {
            None
        };
        Ok(TopicPatch {
            compression,
            message_expiry,
            max_topic_size,
        })
    }
    pub(crate) fn hash(&mut self) -> Result<PasswordHash, OpDecodeError> {
        let len = self.u16("password_hash")?;
        if len == 0 || usize::from(len) > PASSWORD_HASH_LEN_MAX {
            return Err(OpDecodeError::HashLengthOutOfRange { len });
        }
        let bytes = self.take("password_hash", usize::from(len))?;
        let s = std::str::from_utf8(bytes).map_err(|_| OpDecodeError::BadUtf8 {
            field: "password_hash",
        })?;
        PasswordHash::from_phc(s.to_owned()).map_err(|_| OpDecodeError::HashNotPhc)
    }
    pub(crate) fn session(&mut self) -> Result<SessionId, OpDecodeError> {
        Ok(SessionId(self.u64("session")?))
    }
}

impl MetadataOp {
    /// The op's bytes, or why it has none (an op the decoder would refuse
    /// is never encoded, so nothing undecodable is ever proposed).
    pub fn encode(&self) -> Result<Vec<u8>, OpEncodeError> {
        let mut w = Writer(Vec::with_capacity(64));
        w.u8(OP_CODEC_VERSION);
        match self {
            Self::CreateStream {
                name,
                created_at_us,
            } => {
                w.u8(TAG_CREATE_STREAM);
                w.name("stream name", name)?;
                w.u64(*created_at_us);
            }
            Self::UpdateStream { stream, name } => {
                w.u8(TAG_UPDATE_STREAM);
                w.ident("stream", stream)?;
                w.name("stream name", name)?;
            }
            Self::DeleteStream { stream } => {
                w.u8(TAG_DELETE_STREAM);
                w.ident("stream", stream)?;
            }
            Self::PurgeStream { stream } => {
                w.u8(TAG_PURGE_STREAM);
                w.ident("stream", stream)?;
            }
            Self::CreateTopic {
                stream,
                name,
                partitions_count,
                config,
                created_at_us,
            } => {
                w.u8(TAG_CREATE_TOPIC);
                w.ident("stream", stream)?;
                w.name("topic name", name)?;
                w.count(*partitions_count)?;
                w.config(config)?;
                w.u64(*created_at_us);
            }
            Self::UpdateTopic {
                stream,
                topic,
                name,
                config,
            } => {
                w.u8(TAG_UPDATE_TOPIC);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.name("topic name", name)?;
                w.config(config)?;
            }
            Self::PatchTopic {
                stream,
                topic,
                name,
                patch,
            } => {
                w.u8(TAG_PATCH_TOPIC);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.name("topic name", name)?;
                w.patch(patch);
            }
            Self::DeleteTopic { stream, topic } => {
                w.u8(TAG_DELETE_TOPIC);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
            }
            Self::PurgeTopic { stream, topic } => {
                w.u8(TAG_PURGE_TOPIC);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
            }
            Self::CreatePartitions {
                stream,
                topic,
                count,
                created_at_us,
            } => {
                w.u8(TAG_CREATE_PARTITIONS);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.count(*count)?;
                w.u64(*created_at_us);
            }
            Self::DeletePartitions {
                stream,
                topic,
                count,
            } => {
                w.u8(TAG_DELETE_PARTITIONS);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.count(*count)?;
            }
            Self::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                w.u8(TAG_CREATE_CONSUMER_GROUP);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.name("consumer group name", name)?;
            }
            Self::DeleteConsumerGroup {
                stream,
                topic,
                group,
            } => {
                w.u8(TAG_DELETE_CONSUMER_GROUP);
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.ident("consumer group", group)?;
            }
            Self::JoinConsumerGroup {
                stream,
                topic,
                group,
                session,
            }
            | Self::LeaveConsumerGroup {
                stream,
                topic,
                group,
                session,
            } => {
                w.u8(if matches!(self, Self::JoinConsumerGroup { .. }) {
                    TAG_JOIN_CONSUMER_GROUP
                } else {
                    TAG_LEAVE_CONSUMER_GROUP
                });
                w.ident("stream", stream)?;
                w.ident("topic", topic)?;
                w.ident("consumer group", group)?;
                w.u64(session.0);
            }
            Self::EndSession { session } => {
                w.u8(TAG_END_SESSION);
                w.u64(session.0);
            }
            Self::CreateUser {
                username,
                password_hash,
                created_at_us,
            } => {
                w.u8(TAG_CREATE_USER);
                w.name("username", username)?;
                w.hash(password_hash);
                w.u64(*created_at_us);
            }
            Self::DeleteUser { user } => {
                w.u8(TAG_DELETE_USER);
                w.ident("user", user)?;
            }
            Self::ChangePassword {
                user,
                password_hash,
            } => {
                w.u8(TAG_CHANGE_PASSWORD);
                w.ident("user", user)?;
                w.hash(password_hash);
            }
        }
        Ok(w.0)
    }

    /// Decodes exactly one op from `bytes` (all of them).
    pub fn decode(bytes: &[u8]) -> Result<Self, OpDecodeError> {
        let mut r = Reader(LeCursor::new(bytes));
        let version = r.u8("version")?;
        if version != OP_CODEC_VERSION {
            return Err(OpDecodeError::UnknownVersion(version));
        }
        let op = match r.u8("tag")? {
            TAG_CREATE_STREAM => Self::CreateStream {
                name: r.name("stream name")?,
                created_at_us: r.u64("created_at")?,
            },
            TAG_UPDATE_STREAM => Self::UpdateStream {
                stream: r.ident("stream")?,
                name: r.name("stream name")?,
            },
            TAG_DELETE_STREAM => Self::DeleteStream {
                stream: r.ident("stream")?,
            },
            TAG_PURGE_STREAM => Self::PurgeStream {
                stream: r.ident("stream")?,
            },
            TAG_CREATE_TOPIC => Self::CreateTopic {
                stream: r.ident("stream")?,
                name: r.name("topic name")?,
                partitions_count: r.count("partitions_count")?,
                config: r.config()?,
                created_at_us: r.u64("created_at")?,
            },
            TAG_UPDATE_TOPIC => Self::UpdateTopic {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                name: r.name("topic name")?,
                config: r.config()?,
            },
            TAG_PATCH_TOPIC => Self::PatchTopic {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                name: r.name("topic name")?,
                patch: r.patch()?,
            },
            TAG_DELETE_TOPIC => Self::DeleteTopic {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
            },
            TAG_PURGE_TOPIC => Self::PurgeTopic {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
            },
            TAG_CREATE_PARTITIONS => Self::CreatePartitions {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                count: r.count("count")?,
                created_at_us: r.u64("created_at")?,
            },
            TAG_DELETE_PARTITIONS => Self::DeletePartitions {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                count: r.count("count")?,
            },
            TAG_CREATE_CONSUMER_GROUP => Self::CreateConsumerGroup {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                name: r.name("consumer group name")?,
            },
            TAG_DELETE_CONSUMER_GROUP => Self::DeleteConsumerGroup {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                group: r.ident("consumer group")?,
            },
            TAG_JOIN_CONSUMER_GROUP => Self::JoinConsumerGroup {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                group: r.ident("consumer group")?,
                session: r.session()?,
            },
            TAG_LEAVE_CONSUMER_GROUP => Self::LeaveConsumerGroup {
                stream: r.ident("stream")?,
                topic: r.ident("topic")?,
                group: r.ident("consumer group")?,
                session: r.session()?,
            },
            TAG_END_SESSION => Self::EndSession {
                session: r.session()?,
            },
            TAG_CREATE_USER => Self::CreateUser {
                username: r.name("username")?,
                password_hash: r.hash()?,
                created_at_us: r.u64("created_at")?,
            },
            TAG_DELETE_USER => Self::DeleteUser {
                user: r.ident("user")?,
            },
            TAG_CHANGE_PASSWORD => Self::ChangePassword {
                user: r.ident("user")?,
                password_hash: r.hash()?,
            },
            tag => return Err(OpDecodeError::UnknownTag(tag)),
        };
        let left = r.0.remaining().len();
        if left != 0 {
            return Err(OpDecodeError::TrailingBytes { len: left });
        }
        Ok(op)
    }
}
