//! The records replies carry (client_protocol.md §6–§10) and their
//! encoders: streams, topics, partitions, consumer groups, offsets, polled
//! messages, send confirmations, the login result, the cluster metadata and
//! the client details. The backend returns these; the session encodes
//! them. Each record's fields are written once, in wire order, by its
//! [`Payload::encode`].
//!
//! Types carry the SDK's decode rules (client_protocol.md §12.3) so a
//! reply it would refuse cannot be built: a login session is non-zero,
//! names are 1..=255 bytes, compression is 1 or 2, node role and status
//! are enums, counts of nested records are the lengths of their vectors,
//! and polled batches are checked (reserved bytes zero) when collected.

use super::primitives::{Name, Options};
use bytes::Bytes;
use common::{Offset, PartitionId, StreamId, TopicId};
use std::num::NonZeroU64;
use storage::{BATCH_LENGTH_MAX_DEFAULT, BatchError, BatchView, Integrity};

/// A user's numeric id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UserId(pub u32);

/// A consumer group's numeric id within its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ConsumerGroupId(pub u32);

/// A consumer-group member: the connection's client id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemberId(pub u32);

/// A reply payload.
pub trait Payload {
    /// Appends the payload's bytes.
    fn encode(&self, out: &mut Vec<u8>);

    /// The payload's bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// A count of nested records. Vectors built by the server are far below
/// u32::MAX entries; saturating keeps this panic-free regardless.
fn put_count(out: &mut Vec<u8>, len: usize) {
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
}
/// A u32-length-prefixed string (cluster metadata, client address).
fn put_long_text(out: &mut Vec<u8>, text: &str) {
    put_count(out, text.len());
    out.extend_from_slice(text.as_bytes());
}

/// A stream as GET_STREAMS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// Its id.
    pub id: StreamId,
    /// Creation time, µs since the epoch.
    pub created_at_micros: u64,
    /// How many topics it has.
    pub topics_count: u32,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
    /// Its name.
    pub name: Name,
}

impl StreamInfo {
    fn encode_with_count(&self, topics_count: u32, out: &mut Vec<u8>) {
        put_u32(out, self.id.0);
        put_u64(out, self.created_at_micros);
        put_u32(out, topics_count);
        put_u64(out, self.size_bytes);
        put_u64(out, self.messages_count);
        self.name.encode(out);
        Options::default().encode_prefixed(out);
    }
}

impl Payload for StreamInfo {
    fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with_count(self.topics_count, out);
    }
}

/// A stream with its topics (GET_STREAM, CREATE_STREAM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDetails {
    /// The stream (its `topics_count` is ignored: `topics.len()` is sent).
    pub stream: StreamInfo,
    /// Its topics.
    pub topics: Vec<TopicInfo>,
}

impl Payload for StreamDetails {
    fn encode(&self, out: &mut Vec<u8>) {
        let count = u32::try_from(self.topics.len()).unwrap_or(u32::MAX);
        self.stream.encode_with_count(count, out);
        for t in &self.topics {
            t.encode(out);
        }
    }
}

/// GET_STREAMS: stream records back to back (empty body: no streams).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamList(pub Vec<StreamInfo>);

impl Payload for StreamList {
    fn encode(&self, out: &mut Vec<u8>) {
        for s in &self.0 {
            s.encode(out);
        }
    }
}

/// A topic's compression. The SDK refuses 0, so there is no "unset".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// No compression (1).
    #[default]
    None,
    /// Gzip (2).
    Gzip,
}

impl Compression {
    /// The wire byte.
    pub const fn code(self) -> u8 {
        match self {
            Self::None => 1,
            Self::Gzip => 2,
        }
    }
}

/// A topic header (in stream details and GET_TOPICS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Its id within the stream.
    pub id: TopicId,
    /// Creation time, µs since the epoch.
    pub created_at_micros: u64,
    /// How many partitions it has.
    pub partitions_count: u32,
    /// Message expiry in µs; 0 or u64::MAX means never.
    pub message_expiry_micros: u64,
    /// Compression.
    pub compression: Compression,
    /// Size cap; 0 = server default, u64::MAX = unlimited.
    pub max_topic_size_bytes: u64,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
    /// Its name.
    pub name: Name,
}

impl TopicInfo {
    fn encode_with_count(&self, partitions_count: u32, out: &mut Vec<u8>) {
        put_u32(out, self.id.0);
        put_u64(out, self.created_at_micros);
        put_u32(out, partitions_count);
        put_u64(out, self.message_expiry_micros);
        out.push(self.compression.code());
        put_u64(out, self.max_topic_size_bytes);
        put_u64(out, self.size_bytes);
        put_u64(out, self.messages_count);
        self.name.encode(out);
        // Options, then derived options: both empty blocks, still written.
        Options::default().encode_prefixed(out);
        Options::default().encode_prefixed(out);
    }
}

impl Payload for TopicInfo {
    fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with_count(self.partitions_count, out);
    }
}

/// A partition record (40 bytes, in topic details).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Its id (0-based).
    pub id: PartitionId,
    /// Creation time, µs since the epoch.
    pub created_at_micros: u64,
    /// Segments on disk.
    pub segments_count: u32,
    /// The partition head: the last offset, or 0 when empty.
    pub current_offset: Offset,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
}

impl Payload for PartitionInfo {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.id.0);
        put_u64(out, self.created_at_micros);
        put_u32(out, self.segments_count);
        put_u64(out, self.current_offset.0);
        put_u64(out, self.size_bytes);
        put_u64(out, self.messages_count);
    }
}

/// A topic with its partitions (GET_TOPIC, CREATE_TOPIC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDetails {
    /// The topic (its `partitions_count` is ignored: `partitions.len()` is
    /// sent, so the SDK's walk of the records stays in step).
    pub topic: TopicInfo,
    /// Its partitions.
    pub partitions: Vec<PartitionInfo>,
}

impl Payload for TopicDetails {
    fn encode(&self, out: &mut Vec<u8>) {
        let count = u32::try_from(self.partitions.len()).unwrap_or(u32::MAX);
        self.topic.encode_with_count(count, out);
        for p in &self.partitions {
            p.encode(out);
        }
    }
}

/// GET_TOPICS: u32 count, then topic headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicList(pub Vec<TopicInfo>);

impl Payload for TopicList {
    fn encode(&self, out: &mut Vec<u8>) {
        put_count(out, self.0.len());
        for t in &self.0 {
            t.encode(out);
        }
    }
}

/// A consumer group as GET_CONSUMER_GROUPS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupInfo {
    /// Its id within the topic.
    pub id: ConsumerGroupId,
    /// The topic's partition count.
    pub partitions_count: u32,
    /// How many members it has.
    pub members_count: u32,
    /// Its name.
    pub name: Name,
}

impl ConsumerGroupInfo {
    fn encode_with_count(&self, members_count: u32, out: &mut Vec<u8>) {
        put_u32(out, self.id.0);
        put_u32(out, self.partitions_count);
        put_u32(out, members_count);
        self.name.encode(out);
    }
}

impl Payload for ConsumerGroupInfo {
    fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with_count(self.members_count, out);
    }
}

/// One member of a group and the partitions assigned to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupMember {
    /// The member.
    pub id: MemberId,
    /// Its partitions.
    pub partitions: Vec<PartitionId>,
}

/// A group with its members (GET_CONSUMER_GROUP, CREATE_CONSUMER_GROUP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDetails {
    /// The group (its `members_count` is ignored: `members.len()` is sent).
    pub group: ConsumerGroupInfo,
    /// Its members.
    pub members: Vec<ConsumerGroupMember>,
}

impl Payload for ConsumerGroupDetails {
    fn encode(&self, out: &mut Vec<u8>) {
        let count = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
        self.group.encode_with_count(count, out);
        for m in &self.members {
            put_u32(out, m.id.0);
            put_count(out, m.partitions.len());
            for p in &m.partitions {
                put_u32(out, p.0);
            }
        }
    }
}

/// GET_CONSUMER_GROUPS: group records back to back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumerGroupList(pub Vec<ConsumerGroupInfo>);

impl Payload for ConsumerGroupList {
    fn encode(&self, out: &mut Vec<u8>) {
        for g in &self.0 {
            g.encode(out);
        }
    }
}

/// GET_CONSUMER_OFFSET's answer when an offset is stored (20 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerOffsetInfo {
    /// The partition.
    pub partition_id: PartitionId,
    /// The partition head.
    pub current_offset: Offset,
    /// The stored offset.
    pub stored_offset: Offset,
}

impl Payload for ConsumerOffsetInfo {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.partition_id.0);
        put_u64(out, self.current_offset.0);
        put_u64(out, self.stored_offset.0);
    }
}

/// SYNC_CONSUMER_GROUP for a member: its partitions (possibly none; a
/// member with none still gets this record, with count 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAssignment {
    /// Bumped at every rebalance.
    pub generation: u64,
    /// The partitions assigned to the caller.
    pub partitions: Vec<PartitionId>,
}

impl Payload for GroupAssignment {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.generation);
        put_count(out, self.partitions.len());
        for p in &self.partitions {
            put_u32(out, p.0);
        }
    }
}

/// Where a sent batch landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendConfirmation {
    /// The stream.
    pub stream_id: StreamId,
    /// The topic.
    pub topic_id: TopicId,
    /// The partition.
    pub partition_id: PartitionId,
    /// The offset of the batch's first message.
    pub base_offset: Offset,
}

impl Payload for SendConfirmation {
    fn encode(&self, out: &mut Vec<u8>) {
        // One confirmation per request, as the direct producer expects.
        put_u32(out, 1);
        put_u32(out, self.stream_id.0);
        put_u32(out, self.topic_id.0);
        put_u32(out, self.partition_id.0);
        put_u64(out, self.base_offset.0);
    }
}

/// A poll's answer: whole stored batches (or batches cut down with
/// `crate::protocol::poll::select_messages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolledMessages {
    partition_id: PartitionId,
    current_offset: Offset,
    messages_count: u32,
    batches: Vec<Bytes>,
}

impl PolledMessages {
    /// Collects batches for a poll reply, checking each one's layout
    /// (the SDK fails the whole poll on a nonzero reserved byte, §12.3 #7).
    pub fn new(
        partition_id: PartitionId,
        current_offset: Offset,
        batches: Vec<Bytes>,
    ) -> Result<Self, BatchError> {
        let mut messages_count: u32 = 0;
        for b in &batches {
            let view = BatchView::decode_exact(b, Integrity::LayoutOnly, BATCH_LENGTH_MAX_DEFAULT)?;
            messages_count = messages_count.saturating_add(view.header().message_count);
        }
        Ok(Self {
            partition_id,
            current_offset,
            messages_count,
            batches,
        })
    }

    /// An empty answer (nothing at or after the start).
    pub fn empty(partition_id: PartitionId, current_offset: Offset) -> Self {
        Self {
            partition_id,
            current_offset,
            messages_count: 0,
            batches: Vec::new(),
        }
    }

    /// The partition polled.
    pub fn partition_id(&self) -> PartitionId {
        self.partition_id
    }

    /// How many messages the batches hold.
    pub fn messages_count(&self) -> u32 {
        self.messages_count
    }

    /// The batches.
    pub fn batches(&self) -> &[Bytes] {
        &self.batches
    }
}

impl Payload for PolledMessages {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.partition_id.0);
        put_u64(out, self.current_offset.0);
        put_u32(out, self.messages_count);
        for b in &self.batches {
            out.extend_from_slice(b);
        }
    }
}

/// A successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResult {
    /// The user.
    pub user_id: UserId,
    /// The session number (the SDK refuses 0).
    pub session: NonZeroU64,
    /// The server's packed protocol version.
    pub server_protocol_version: u32,
    /// The server's version text (1..=255 bytes).
    pub server_version: Name,
}

impl Payload for LoginResult {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.user_id.0);
        put_u64(out, self.session.get());
        put_u32(out, self.server_protocol_version);
        self.server_version.encode(out);
    }
}

/// A node's role. With one leader node the SDK stays on its plain paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// 0.
    Leader,
    /// 1.
    Follower,
}

/// A node's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    /// 0.
    Healthy,
    /// 1.
    Starting,
    /// 2.
    Stopping,
    /// 3.
    Unreachable,
    /// 4.
    Maintenance,
}

/// One node of GET_CLUSTER_METADATA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's name.
    pub name: String,
    /// Its IP address, as text.
    pub ip: String,
    /// Its client TCP port.
    pub tcp_port: u16,
    /// QUIC port (0: none).
    pub quic_port: u16,
    /// HTTP port (0: none).
    pub http_port: u16,
    /// WebSocket port (0: none).
    pub websocket_port: u16,
    /// Its role.
    pub role: NodeRole,
    /// Its status.
    pub status: NodeStatus,
}

/// GET_CLUSTER_METADATA's answer. replog always reports exactly one node,
/// the connected replica, as leader (SPEC §8): zero nodes break the SDK's
/// offset and poll paths, two or more switch on its cluster routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMetadata {
    /// The cluster's name (may be empty).
    pub name: String,
    /// The one node.
    pub node: ClusterNode,
}

impl Payload for ClusterMetadata {
    fn encode(&self, out: &mut Vec<u8>) {
        put_long_text(out, &self.name);
        put_u32(out, 1);
        let n = &self.node;
        put_long_text(out, &n.name);
        put_long_text(out, &n.ip);
        put_u16(out, n.tcp_port);
        put_u16(out, n.quic_port);
        put_u16(out, n.http_port);
        put_u16(out, n.websocket_port);
        out.push(n.role as u8);
        out.push(n.status as u8);
    }
}

/// REPLOG_STATUS's answer; its layout lives in `common::admin`, shared
/// with `replog-cli`.
impl Payload for common::admin::ReplicaStatus {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&common::admin::ReplicaStatus::encode(self));
    }
}

/// A group a connection has joined, by numeric ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JoinedGroup {
    /// The stream.
    pub stream: StreamId,
    /// The topic.
    pub topic: TopicId,
    /// The group.
    pub group: ConsumerGroupId,
}

/// GET_ME's answer: the calling connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientDetails {
    /// The connection's client id.
    pub client_id: u32,
    /// The logged-in user, if any.
    pub user_id: Option<UserId>,
    /// The peer address, as text.
    pub address: String,
    /// The groups the connection has joined.
    pub consumer_groups: Vec<JoinedGroup>,
}

/// The wire value of "no user" in a client record.
const NO_USER: u32 = u32::MAX;
/// Transport code of TCP in a client record.
const TRANSPORT_TCP: u8 = 1;

impl Payload for ClientDetails {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.client_id);
        put_u32(out, self.user_id.map_or(NO_USER, |u| u.0));
        out.push(TRANSPORT_TCP);
        put_long_text(out, &self.address);
        put_count(out, self.consumer_groups.len());
        for g in &self.consumer_groups {
            put_u32(out, g.stream.0);
            put_u32(out, g.topic.0);
            put_u32(out, g.group.0);
        }
    }
}
