//! The operations of the metadata plane: what a committed prepare on group
//! 0 carries in its body (codec in `op_codec.rs`).
//!
//! Every value an op needs to be applied identically on every replica is
//! in the op: names and identifiers as the client sent them (resolved at
//! apply time), creation times stamped by the primary, password hashes
//! computed by the primary. Nothing in `apply` reads a clock or draws a
//! random number.

use crate::consumer_group::SessionId;
use crate::identifier::Identifier;
use crate::topic_config::{TopicConfig, TopicPatch};
use crate::user::PasswordHash;

/// One metadata operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataOp {
    /// CREATE_STREAM (202).
    CreateStream {
        /// The name, unique among streams.
        name: String,
        /// Creation time (µs since the epoch), stamped by the primary.
        created_at_us: u64,
    },
    /// UPDATE_STREAM (204): rename.
    UpdateStream {
        /// The stream.
        stream: Identifier,
        /// The new name.
        name: String,
    },
    /// DELETE_STREAM (203): the stream, its topics and their partitions.
    DeleteStream {
        /// The stream.
        stream: Identifier,
    },
    /// PURGE_STREAM (205): purge every partition of every topic.
    PurgeStream {
        /// The stream.
        stream: Identifier,
    },
    /// CREATE_TOPIC (302).
    CreateTopic {
        /// The stream.
        stream: Identifier,
        /// The name, unique in the stream.
        name: String,
        /// Partitions to create (ids `0..count`).
        partitions_count: u32,
        /// The topic's settings.
        config: TopicConfig,
        /// Creation time (µs), stamped by the primary.
        created_at_us: u64,
    },
    /// UPDATE_TOPIC (304): rename and replace the settings.
    UpdateTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The new name.
        name: String,
        /// The new settings.
        config: TopicConfig,
    },
    /// UPDATE_TOPIC (304) as Iggy 0.11 sends it: rename, and change only
    /// the settings the request names.
    PatchTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The new name.
        name: String,
        /// The settings to change.
        patch: TopicPatch,
    },
    /// DELETE_TOPIC (303).
    DeleteTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// PURGE_TOPIC (305): purge every partition of the topic.
    PurgeTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// CREATE_PARTITIONS (402): append `count` partitions.
    CreatePartitions {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// How many to add.
        count: u32,
        /// Creation time (µs), stamped by the primary.
        created_at_us: u64,
    },
    /// DELETE_PARTITIONS (403): remove the last `count` partitions.
    DeletePartitions {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// How many to remove.
        count: u32,
    },
    /// CREATE_CONSUMER_GROUP (602).
    CreateConsumerGroup {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The name, unique in the topic.
        name: String,
    },
    /// DELETE_CONSUMER_GROUP (603).
    DeleteConsumerGroup {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The group.
        group: Identifier,
    },
    /// JOIN_CONSUMER_GROUP (604).
    JoinConsumerGroup {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The group.
        group: Identifier,
        /// The joining session.
        session: SessionId,
    },
    /// LEAVE_CONSUMER_GROUP (605).
    LeaveConsumerGroup {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The group.
        group: Identifier,
        /// The leaving session.
        session: SessionId,
    },
    /// A client session ended (logout, disconnect, heartbeat timeout): it
    /// leaves every consumer group, which are rebalanced.
    EndSession {
        /// The session.
        session: SessionId,
    },
    /// CREATE_USER (31), also the root user's bootstrap from configuration.
    CreateUser {
        /// The username, unique.
        username: String,
        /// The Argon2 hash computed by the primary.
        password_hash: PasswordHash,
        /// Creation time (µs), stamped by the primary.
        created_at_us: u64,
    },
    /// DELETE_USER (32).
    DeleteUser {
        /// The user.
        user: Identifier,
    },
    /// CHANGE_PASSWORD (34): the new hash, computed by the primary after it
    /// verified the current password.
    ChangePassword {
        /// The user.
        user: Identifier,
        /// The new hash.
        password_hash: PasswordHash,
    },
}

impl MetadataOp {
    /// A short name for logs and traces.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::CreateStream { .. } => "create_stream",
            Self::UpdateStream { .. } => "update_stream",
            Self::DeleteStream { .. } => "delete_stream",
            Self::PurgeStream { .. } => "purge_stream",
            Self::CreateTopic { .. } => "create_topic",
            Self::UpdateTopic { .. } => "update_topic",
            Self::PatchTopic { .. } => "patch_topic",
            Self::DeleteTopic { .. } => "delete_topic",
            Self::PurgeTopic { .. } => "purge_topic",
            Self::CreatePartitions { .. } => "create_partitions",
            Self::DeletePartitions { .. } => "delete_partitions",
            Self::CreateConsumerGroup { .. } => "create_consumer_group",
            Self::DeleteConsumerGroup { .. } => "delete_consumer_group",
            Self::JoinConsumerGroup { .. } => "join_consumer_group",
            Self::LeaveConsumerGroup { .. } => "leave_consumer_group",
            Self::EndSession { .. } => "end_session",
            Self::CreateUser { .. } => "create_user",
            Self::DeleteUser { .. } => "delete_user",
            Self::ChangePassword { .. } => "change_password",
        }
    }
}
