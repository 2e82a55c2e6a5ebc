//! replog's metadata plane: the state machine replicated as consensus
//! group 0.
//!
//! Where to start:
//! - [`MetadataState`] (`state.rs`) holds streams, topics, partitions,
//!   consumer groups, users and purge generations; [`MetadataState::apply`]
//!   applies one committed [`MetadataOp`] deterministically and returns the
//!   reply's [`Outcome`] and the [`PartitionEffect`]s the shard must carry
//!   out, or a typed [`Refusal`] with its Iggy error code.
//! - [`MetadataOp::encode`] / [`MetadataOp::decode`] (`op_codec.rs`): the
//!   fail-closed body codec of a group-0 prepare.
//! - `query.rs`: what the client listener reads (streams and topics with
//!   their sizes, consumer groups, assignments, routing, login).
//! - `snapshot.rs` and [`MetadataStore`] (`store.rs`): the snapshot codec
//!   and the durable store (metadata WAL + snapshots, boot by replay).
//! - [`MetadataGroup`] (`group.rs`): one replica of group 0, driving the
//!   VSR core over a [`MetadataBus`]; committed ops go through the store,
//!   their effects come out of [`MetadataGroup::take_effects`].
//!
//! A shard hosting group 0 opens a [`MetadataStore`], wraps it in a
//! [`MetadataGroup`] with the group's superblock and its bus, feeds it
//! frames, ticks and requests, carries out the [`PartitionEffect`]s in op
//! order, and at boot reconciles its partition groups with
//! [`reconcile_effects`] from an empty state (or compares against
//! [`MetadataState::partition_groups`]). A replica behind its peers'
//! retention reports [`MetadataGroup::state_transfer_needed`]; the shard
//! pulls the primary's [`MetadataGroup::transfer_offer`] over the chunk
//! protocol and hands it to [`MetadataGroup::install_transfer`]. Byte
//! layouts: docs/formats.md §13.
//!
//! The crate does no I/O outside the store and the group, which go through
//! `storage::fs::Fs`; it knows nothing of shards or sockets.

mod client_table_artifact;
mod consumer_group;
mod effect;
mod group;
mod identifier;
mod op;
mod op_codec;
mod query;
mod refusal;
mod snapshot;
mod state;
mod store;
mod topic_config;
mod user;

pub use client_table_artifact::{
    CLIENT_TABLE_ENTRIES_MAX, CLIENT_TABLE_MAGIC, ClientTableDecodeError,
};
pub use consumer_group::{ConsumerGroup, ConsumerGroupId, Member, MemberId, SessionId};
pub use effect::{PartitionEffect, PartitionGroupConfig, reconcile_effects};
pub use group::{
    CommittedEffect, GroupError, MetadataBus, MetadataGroup, MetadataOffer, MetadataReply,
    TransferError, TransferNeeded,
};
pub use identifier::{Identifier, NAME_LEN_MAX, NameKind};
pub use op::MetadataOp;
pub use op_codec::{OP_CODEC_VERSION, OpDecodeError, OpEncodeError};
pub use query::{
    ConsumerGroupDetails, MemberAssignment, MemberInfo, PartitionInfo, PartitionRoute,
    PartitionStats, StatsSource, StreamDetails, StreamInfo, TopicDetails, TopicInfo,
};
pub use refusal::Refusal;
pub use snapshot::{
    SNAPSHOT_MAGIC, SNAPSHOT_VERSION, SnapshotDecodeError, decode_snapshot, encode_snapshot,
};
pub use state::{
    Applied, ApplyError, CONSUMER_GROUPS_PER_TOPIC_MAX, GROUP_COUNTER_MAX, MEMBERS_PER_GROUP_MAX,
    MetadataState, Outcome, PARTITIONS_PER_TOPIC_MAX, Partition, PartitionGroupInfo, STREAMS_MAX,
    Stream, TOPICS_PER_STREAM_MAX, Topic, USERS_MAX,
};
pub use store::{
    BootReport, DAMAGE_RECOVERY_FILE, DAMAGED_PREFIX, MetadataStore, OpOrigin, SIBLING_SUFFIX,
    SNAPSHOT_EVERY_OPS_DEFAULT, SNAPSHOT_FILE, StoreConfig, StoreError, WAL_FILE,
};
pub use topic_config::{
    CompressionAlgorithm, Durability, MaxTopicSize, MessageExpiry, SEGMENT_SIZE_BYTES_DEFAULT,
    TopicConfig, TopicPatch,
};
pub use user::{
    HashParams, PASSWORD_HASH_LEN_MAX, PasswordError, PasswordHash, ROOT_USER, User, UserId,
    hash_password, verify_password,
};
