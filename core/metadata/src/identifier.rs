//! How operations and queries name a stream, topic, consumer group or user:
//! by numeric id or by name, as Iggy's `Identifier` does, and the name rule
//! (1..=255 bytes of UTF-8) every name obeys.
//!
//! Operations carry the identifier the client sent, not an id the primary
//! resolved: resolution happens in `apply`, against the state every
//! replica has at that op, so a concurrent rename or delete cannot make two
//! replicas resolve the same op differently, and the client receives the
//! exact Iggy error kind (id-not-found vs name-not-found).

use std::fmt;

use crate::refusal::Refusal;

/// The longest name, in bytes.
pub const NAME_LEN_MAX: usize = 255;

/// A reference to a stream, topic, consumer group or user.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identifier {
    /// By numeric id.
    Numeric(u32),
    /// By name.
    Name(String),
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Numeric(id) => write!(f, "#{id}"),
            Self::Name(name) => write!(f, "{name:?}"),
        }
    }
}

impl From<u32> for Identifier {
    fn from(id: u32) -> Self {
        Self::Numeric(id)
    }
}

impl From<&str> for Identifier {
    fn from(name: &str) -> Self {
        Self::Name(name.to_owned())
    }
}

/// What a name names (for the error code a bad one answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NameKind {
    /// A stream name (InvalidStreamName, 1013).
    Stream,
    /// A topic name (InvalidTopicName, 2014).
    Topic,
    /// A consumer group name (InvalidConsumerGroupName, 5005).
    ConsumerGroup,
    /// A username (InvalidUsername, 43).
    User,
}

impl NameKind {
    /// The Iggy code for an invalid name of this kind.
    pub const fn invalid_name_code(self) -> u32 {
        match self {
            Self::Stream => 1013,
            Self::Topic => 2014,
            Self::ConsumerGroup => 5005,
            Self::User => 43,
        }
    }
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stream => "stream",
            Self::Topic => "topic",
            Self::ConsumerGroup => "consumer group",
            Self::User => "user",
        })
    }
}

/// Checks the name rule: 1..=255 bytes (UTF-8 is guaranteed by `str`).
pub fn check_name(kind: NameKind, name: &str) -> Result<(), Refusal> {
    if name.is_empty() || name.len() > NAME_LEN_MAX {
        return Err(Refusal::InvalidName {
            kind,
            len: name.len(),
        });
    }
    Ok(())
}
