//! A topic's settings, as the Iggy 0.11.0 client sends and reads them:
//! message expiry, maximum size, segment size, compression, replication
//! factor and durability.
//!
//! Expiry and maximum size are enums over the u64 the wire carries, with a
//! bijection both ways (`0` = server default, `u64::MAX` = never or
//! unlimited), so the op and snapshot codecs stay canonical with no extra
//! rule. Expiry and size drive the partitions' retention by age and by size.

use std::fmt;

/// Default segment size: 1 GiB, Iggy's default.
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = common::GIB;

/// When messages expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum MessageExpiry {
    /// The server's configured default (wire `0`).
    #[default]
    ServerDefault,
    /// Never (wire `u64::MAX`).
    Never,
    /// After this many microseconds (wire `1..u64::MAX`).
    After {
        /// Age in microseconds at which a message may be removed.
        micros: u64,
    },
}

impl MessageExpiry {
    /// The wire value.
    pub const fn to_wire(self) -> u64 {
        match self {
            Self::ServerDefault => 0,
            Self::Never => u64::MAX,
            Self::After { micros } => micros,
        }
    }

    /// From the wire value (every u64 means something).
    pub const fn from_wire(value: u64) -> Self {
        match value {
            0 => Self::ServerDefault,
            u64::MAX => Self::Never,
            micros => Self::After { micros },
        }
    }
}

/// How large a topic may grow before its oldest segments are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum MaxTopicSize {
    /// The server's configured default (wire `0`).
    #[default]
    ServerDefault,
    /// No limit (wire `u64::MAX`).
    Unlimited,
    /// At most this many bytes (wire `1..u64::MAX`).
    Bytes {
        /// The ceiling in bytes.
        bytes: u64,
    },
}

impl MaxTopicSize {
    /// The wire value.
    pub const fn to_wire(self) -> u64 {
        match self {
            Self::ServerDefault => 0,
            Self::Unlimited => u64::MAX,
            Self::Bytes { bytes } => bytes,
        }
    }

    /// From the wire value (every u64 means something).
    pub const fn from_wire(value: u64) -> Self {
        match value {
            0 => Self::ServerDefault,
            u64::MAX => Self::Unlimited,
            bytes => Self::Bytes { bytes },
        }
    }
}

/// The compression algorithm as Iggy reports it in topic headers (u8:
/// 1 = none, 2 = gzip; 0 is rejected by the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum CompressionAlgorithm {
    /// No compression (1).
    #[default]
    None,
    /// Gzip (2).
    Gzip,
}

impl CompressionAlgorithm {
    /// The wire byte.
    pub const fn to_wire(self) -> u8 {
        match self {
            Self::None => 1,
            Self::Gzip => 2,
        }
    }

    /// From the wire byte; anything but 1 or 2 is `None`.
    pub const fn from_wire(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::None),
            2 => Some(Self::Gzip),
            _ => None,
        }
    }
}

/// When a replica of the topic's partitions acknowledges a prepare
/// (SPEC §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Durability {
    /// Once it holds the prepare in memory (commit at a quorum of
    /// journals).
    #[default]
    Replicated,
    /// Once the prepare is durable on its disk.
    Persisted,
}

impl Durability {
    /// The codec byte.
    pub const fn to_wire(self) -> u8 {
        match self {
            Self::Replicated => 1,
            Self::Persisted => 2,
        }
    }

    /// From the codec byte.
    pub const fn from_wire(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::Replicated),
            2 => Some(Self::Persisted),
            _ => None,
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Replicated => "replicated",
            Self::Persisted => "persisted",
        })
    }
}

/// What an Iggy 0.11 topic update changes: the updatable settings it
/// names. A setting it leaves out keeps its current value (an update
/// patches the topic's options, it does not replace them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TopicPatch {
    /// The compression algorithm reported to clients.
    pub compression: Option<CompressionAlgorithm>,
    /// When messages expire.
    pub message_expiry: Option<MessageExpiry>,
    /// The topic's size ceiling.
    pub max_topic_size: Option<MaxTopicSize>,
}

impl TopicPatch {
    /// `config` with the named settings replaced.
    pub fn apply_to(&self, config: &TopicConfig) -> TopicConfig {
        TopicConfig {
            compression: self.compression.unwrap_or(config.compression),
            message_expiry: self.message_expiry.unwrap_or(config.message_expiry),
            max_topic_size: self.max_topic_size.unwrap_or(config.max_topic_size),
            ..*config
        }
    }
}

/// A topic's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopicConfig {
    /// When messages expire (retention by age).
    pub message_expiry: MessageExpiry,
    /// The topic's size ceiling (retention by size).
    pub max_topic_size: MaxTopicSize,
    /// Segment size at which a partition rotates its active segment.
    pub segment_size_bytes: u64,
    /// The compression algorithm reported to clients.
    pub compression: CompressionAlgorithm,
    /// The replication factor as Iggy reports it (at least 1). replog
    /// replicates every partition on every replica of the cluster; this is
    /// the client's number, kept and reported.
    pub replication_factor: u8,
    /// When a partition replica acknowledges.
    pub durability: Durability,
}

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            message_expiry: MessageExpiry::ServerDefault,
            max_topic_size: MaxTopicSize::ServerDefault,
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            compression: CompressionAlgorithm::None,
            replication_factor: 1,
            durability: Durability::Replicated,
        }
    }
}
