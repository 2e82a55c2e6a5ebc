//! Why the state machine refused an operation, with the Apache Iggy 0.11.0
//! error code the client listener answers with.
//!
//! A refused operation is still a committed op: every replica refuses it
//! identically and nothing in the state changes. The listener maps a
//! refusal to a reply in one place, [`Refusal::iggy_code`], so the codes a
//! client sees cannot drift between call sites. The codes are those of
//! `iggy_common` 0.11.0 (`../shared/reference/client_protocol.md` §11 lists
//! the ones a minimal server needs; the user-management codes 43..=48 are
//! the same table's, which that section does not reproduce).

use std::fmt;

use common::{PartitionId, StreamId, TopicId};

use crate::consumer_group::{ConsumerGroupId, SessionId};
use crate::identifier::{Identifier, NameKind};

/// An operation the metadata state machine refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No stream has this numeric id (1009).
    StreamIdNotFound(StreamId),
    /// No stream has this name (1010).
    StreamNameNotFound(String),
    /// Another stream already has this name (1012).
    StreamNameAlreadyExists(String),
    /// No topic of the stream has this numeric id (2010).
    TopicIdNotFound {
        /// The topic id asked for.
        topic: TopicId,
        /// The stream it was looked up in.
        stream: StreamId,
    },
    /// No topic of the stream has this name (2011).
    TopicNameNotFound {
        /// The topic name asked for.
        topic: String,
        /// The stream it was looked up in.
        stream: StreamId,
    },
    /// Another topic of the stream already has this name (2013).
    TopicNameAlreadyExists {
        /// The name.
        topic: String,
        /// The stream.
        stream: StreamId,
    },
    /// A partition count outside what the operation allows (2019).
    InvalidPartitionsCount {
        /// The count asked for.
        count: u32,
        /// The largest count allowed here.
        max: u32,
    },
    /// The topic has no such partition (3007).
    PartitionNotFound {
        /// The partition id.
        partition: PartitionId,
        /// The topic.
        topic: TopicId,
        /// The stream.
        stream: StreamId,
    },
    /// A name that is empty or longer than 255 bytes (1013, 2014, 5005 or
    /// 43 by kind).
    InvalidName {
        /// Which kind of name.
        kind: NameKind,
        /// Its length in bytes.
        len: usize,
    },
    /// No consumer group of the topic has this numeric id (5000).
    ConsumerGroupIdNotFound {
        /// The group id.
        group: ConsumerGroupId,
        /// The topic.
        topic: TopicId,
    },
    /// No consumer group of the topic has this name (5003).
    ConsumerGroupNameNotFound {
        /// The group name.
        group: String,
        /// The topic.
        topic: TopicId,
    },
    /// Another consumer group of the topic already has this name (5004).
    ConsumerGroupNameAlreadyExists {
        /// The name.
        group: String,
        /// The topic.
        topic: TopicId,
    },
    /// The session is not a member of the group (5006).
    ConsumerGroupMemberNotFound {
        /// The session.
        session: SessionId,
        /// The group.
        group: ConsumerGroupId,
    },
    /// Another user already has this name (46).
    UserAlreadyExists(String),
    /// No such user (20, Iggy's ResourceNotFound).
    UserNotFound(Identifier),
    /// The root user (id 0) cannot be deleted (48).
    CannotDeleteRootUser,
    /// An id space ran out (1, Iggy's generic Error): a u32 id counter or
    /// the partition group counter reached its ceiling.
    IdsExhausted {
        /// Which ids.
        what: &'static str,
    },
    /// A stored password hash that is not an Argon2 PHC string (44).
    InvalidPasswordHash,
    /// A ceiling on how many objects of a kind may exist (1).
    LimitReached {
        /// Which objects.
        what: &'static str,
        /// The ceiling.
        max: u32,
    },
    /// The partition is assigned to another member of the group (5009).
    ConsumerGroupPartitionNotOwned {
        /// The partition.
        partition: PartitionId,
        /// The group.
        group: ConsumerGroupId,
    },
    /// Unknown user or wrong password (42).
    InvalidCredentials,
    /// A topic setting out of range: replication factor or segment size 0
    /// (4042, Iggy's InvalidOptionValue).
    InvalidTopicConfig,
}

impl Refusal {
    /// The Apache Iggy 0.11.0 error code the client receives.
    pub const fn iggy_code(&self) -> u32 {
        match self {
            Self::StreamIdNotFound(_) => 1009,
            Self::StreamNameNotFound(_) => 1010,
            Self::StreamNameAlreadyExists(_) => 1012,
            Self::TopicIdNotFound { .. } => 2010,
            Self::TopicNameNotFound { .. } => 2011,
            Self::TopicNameAlreadyExists { .. } => 2013,
            Self::InvalidPartitionsCount { .. } => 2019,
            Self::PartitionNotFound { .. } => 3007,
            Self::InvalidName { kind, .. } => kind.invalid_name_code(),
            Self::ConsumerGroupIdNotFound { .. } => 5000,
            Self::ConsumerGroupNameNotFound { .. } => 5003,
            Self::ConsumerGroupNameAlreadyExists { .. } => 5004,
            Self::ConsumerGroupMemberNotFound { .. } => 5006,
            Self::UserAlreadyExists(_) => 46,
            Self::UserNotFound(_) => 20,
            Self::CannotDeleteRootUser => 48,
            Self::IdsExhausted { .. } => 1,
            Self::InvalidPasswordHash => 44,
            Self::LimitReached { .. } => 1,
            Self::InvalidTopicConfig => 4042,
            Self::ConsumerGroupPartitionNotOwned { .. } => 5009,
            Self::InvalidCredentials => 42,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamIdNotFound(id) => write!(f, "stream with id {} was not found", id.0),
            Self::StreamNameNotFound(name) => write!(f, "stream with name {name:?} was not found"),
            Self::StreamNameAlreadyExists(name) => {
                write!(f, "a stream named {name:?} already exists")
            }
            Self::TopicIdNotFound { topic, stream } => write!(
                f,
                "topic with id {} was not found in stream {}",
                topic.0, stream.0
            ),
            Self::TopicNameNotFound { topic, stream } => write!(
                f,
                "topic named {topic:?} was not found in stream {}",
                stream.0
            ),
            Self::TopicNameAlreadyExists { topic, stream } => write!(
                f,
                "a topic named {topic:?} already exists in stream {}",
                stream.0
            ),
            Self::InvalidPartitionsCount { count, max } => {
                write!(f, "partition count {count} is outside 0..={max}")
            }
            Self::PartitionNotFound {
                partition,
                topic,
                stream,
            } => write!(
                f,
                "partition {} was not found in topic {} of stream {}",
                partition.0, topic.0, stream.0
            ),
            Self::InvalidName { kind, len } => {
                write!(f, "a {kind} name must be 1..=255 bytes, not {len}")
            }
            Self::ConsumerGroupIdNotFound { group, topic } => write!(
                f,
                "consumer group {} was not found in topic {}",
                group.0, topic.0
            ),
            Self::ConsumerGroupNameNotFound { group, topic } => write!(
                f,
                "consumer group {group:?} was not found in topic {}",
                topic.0
            ),
            Self::ConsumerGroupNameAlreadyExists { group, topic } => write!(
                f,
                "a consumer group named {group:?} already exists in topic {}",
                topic.0
            ),
            Self::ConsumerGroupMemberNotFound { session, group } => write!(
                f,
                "session {} is not a member of consumer group {}",
                session.0, group.0
            ),
            Self::UserAlreadyExists(name) => write!(f, "a user named {name:?} already exists"),
            Self::UserNotFound(id) => write!(f, "user {id} was not found"),
            Self::CannotDeleteRootUser => f.write_str("the root user cannot be deleted"),
            Self::IdsExhausted { what } => write!(f, "no {what} ids are left"),
            Self::InvalidPasswordHash => {
                f.write_str("the password hash is not an Argon2 PHC string")
            }
            Self::LimitReached { what, max } => write!(f, "at most {max} {what} may exist"),
            Self::ConsumerGroupPartitionNotOwned { partition, group } => write!(
                f,
                "partition {} is assigned to another member of consumer group {}",
                partition.0, group.0
            ),
            Self::InvalidCredentials => f.write_str("invalid username or password"),
            Self::InvalidTopicConfig => {
                f.write_str("replication factor and segment size must be at least 1")
            }
        }
    }
}

impl std::error::Error for Refusal {}
