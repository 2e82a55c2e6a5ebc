//! Request bodies (client_protocol.md §6–§10), decoded into
//! [`ClientCommand`]. Each payload's fields are read once, in wire order,
//! by its `decode`; every body must be consumed exactly (options blocks and
//! batches run to the end of the body by definition).

use super::codes::CommandCode;
use super::error::{NameField, PayloadError};
use super::frame::RequestFrame;
use super::primitives::{
    AckLevel, Consumer, Identifier, Name, Options, Partitioning, PollingStrategy, Reader,
    decode_optional_partition,
};
use bytes::Bytes;
use common::PartitionId;
use storage::{BATCH_LENGTH_MAX_DEFAULT, BatchView, Integrity};

/// A topic, named by its stream and itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicRef {
    /// The stream.
    pub stream: Identifier,
    /// The topic.
    pub topic: Identifier,
}

impl TopicRef {
    fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        Ok(Self {
            stream: Identifier::decode(r, "stream id")?,
            topic: Identifier::decode(r, "topic id")?,
        })
    }
}

/// A consumer group, named by its topic and itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupRef {
    /// The topic.
    pub topic: TopicRef,
    /// The group.
    pub group: Identifier,
}

impl GroupRef {
    fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        Ok(Self {
            topic: TopicRef::decode(r)?,
            group: Identifier::decode(r, "group id")?,
        })
    }
}

/// LOGIN_REGISTER (40): the client's version and credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct LoginRegister {
    /// Packed `major << 20 | minor << 10 | patch`.
    pub protocol_version: u32,
    /// E.g. "rust-sdk".
    pub sdk_name: Name,
    /// E.g. "0.11.0".
    pub sdk_version: Name,
    /// The user.
    pub username: Name,
    /// The password (u8 length prefix, so at most 255 bytes).
    pub password: String,
    /// Opaque client context (empty from the Rust SDK).
    pub client_context: Vec<u8>,
}

impl std::fmt::Debug for LoginRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("LoginRegister")
            .field("protocol_version", &self.protocol_version)
            .field("sdk_name", &self.sdk_name)
            .field("sdk_version", &self.sdk_version)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl LoginRegister {
    fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        let protocol_version = r.u32("protocol version")?;
        let sdk_name = Name::decode(r, NameField::Login, "sdk name")?;
        let sdk_version = Name::decode(r, NameField::Login, "sdk version")?;
        let username = Name::decode(r, NameField::Login, "username")?;
        let password_len = usize::from(r.u8("password")?);
        let password = r.text(password_len, "password")?.to_owned();
        // The length is checked against the bytes present before anything
        // is copied, so a huge declared length costs nothing.
        let context_len = r.u32("client context")?;
        let client_context = r.bytes(context_len as usize, "client context")?.to_vec();
        Ok(Self {
            protocol_version,
            sdk_name,
            sdk_version,
            username,
            password,
            client_context,
        })
    }
}

/// CREATE_STREAM (202).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateStream {
    /// The new stream's name.
    pub name: Name,
    /// Options (empty from the SDK).
    pub options: Options,
}

/// UPDATE_STREAM (204).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateStream {
    /// The stream.
    pub stream: Identifier,
    /// Its new name.
    pub name: Name,
    /// Options.
    pub options: Options,
}

/// CREATE_TOPIC (302).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopic {
    /// The stream to create it in.
    pub stream: Identifier,
    /// How many partitions (ids 0..count).
    pub partitions_count: u32,
    /// The new topic's name.
    pub name: Name,
    /// Options (durability, compression, expiry, sizes…).
    pub options: Options,
}

/// UPDATE_TOPIC (304).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateTopic {
    /// The topic.
    pub topic: TopicRef,
    /// Its new name.
    pub name: Name,
    /// Options.
    pub options: Options,
}

/// CREATE_PARTITIONS (402) and DELETE_PARTITIONS (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionsChange {
    /// The topic.
    pub topic: TopicRef,
    /// How many partitions to add or remove.
    pub count: u32,
}

/// SEND_MESSAGES (101): a validated batch for one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendMessages {
    /// The topic.
    pub topic: TopicRef,
    /// Where the batch goes.
    pub partitioning: Partitioning,
    /// How many messages the batch holds (already checked against it).
    pub messages_count: u32,
    /// The batch exactly as sent: 256-byte header and frames, every
    /// checksum verified. A slice of the request frame (no copy).
    pub batch: Bytes,
    /// The send's identity: a digest of the connection's Iggy client id,
    /// the request number and the batch header (0 until the session sets
    /// it; see [`SendMessages::producer_key`]).
    pub producer_key: u128,
    /// Whether the connection sent this very request before (the SDK
    /// replays a request answered 57 under the same number).
    pub replay: bool,
    /// For a replay, how long ago (ms) the connection first sent it.
    pub replay_age_ms: u32,
}

impl SendMessages {
    fn decode(r: &mut Reader<'_>, body: &Bytes) -> Result<Self, PayloadError> {
        let metadata_length = r.u32("metadata length")?;
        let before = r.remaining().len();
        let topic = TopicRef::decode(r)?;
        let partitioning = Partitioning::decode(r)?;
        let messages_count = r.u32("messages count")?;
        let actual = before - r.remaining().len();
        if metadata_length as usize != actual {
            return Err(PayloadError::MetadataLengthMismatch {
                declared: metadata_length,
                actual,
            });
        }
        let start = body.len() - r.remaining().len();
        let batch = body.slice(start..);
        r.rest();
        let view = BatchView::decode_exact(&batch, Integrity::Verify, BATCH_LENGTH_MAX_DEFAULT)
            .map_err(PayloadError::Batch)?;
        if view.header().message_count != messages_count {
            return Err(PayloadError::MessagesCountMismatch {
                declared: messages_count,
                batch: view.header().message_count,
            });
        }
        Ok(Self {
            topic,
            partitioning,
            messages_count,
            batch,
            producer_key: 0,
            replay: false,
            replay_age_ms: 0,
        })
    }

    /// The identity of this send from Iggy client `client` as request
    /// `request`: xxh3-128 of both and of the batch header as sent (which
    /// holds the batch checksum over every message), never 0. A client
    /// that reuses a request number for another batch therefore gets
    /// another key. 0 for a client or request of 0 (no identity).
    pub fn producer_key(&self, client: u128, request: u64) -> u128 {
        if client == 0 || request == 0 {
            return 0;
        }
        let mut input = [0u8; 16 + 8 + 52];
        input[..16].copy_from_slice(&client.to_le_bytes());
        input[16..24].copy_from_slice(&request.to_le_bytes());
        let header = &self.batch[..52.min(self.batch.len())];
        input[24..24 + header.len()].copy_from_slice(header);
        xxhash_rust::xxh3::xxh3_128(&input).max(1)
    }
}

/// POLL_MESSAGES (100).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollMessages {
    /// Who polls.
    pub consumer: Consumer,
    /// From which topic.
    pub topic: TopicRef,
    /// From which partition (the 0.11 SDK always names one).
    pub partition: Option<PartitionId>,
    /// Where to start.
    pub strategy: PollingStrategy,
    /// At most this many messages.
    pub count: u32,
    /// Store the last returned offset as the consumer's.
    pub auto_commit: bool,
}

/// GET_CONSUMER_OFFSET (120): whose offset, where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumerOffsetKey {
    /// The consumer or group.
    pub consumer: Consumer,
    /// The topic.
    pub topic: TopicRef,
    /// The partition (the SDK always sets it).
    pub partition: Option<PartitionId>,
}

impl ConsumerOffsetKey {
    fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        Ok(Self {
            consumer: Consumer::decode(r)?,
            topic: TopicRef::decode(r)?,
            partition: decode_optional_partition(r)?,
        })
    }
}

/// STORE_CONSUMER_OFFSET (121).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConsumerOffset {
    /// Whose offset, where.
    pub key: ConsumerOffsetKey,
    /// The offset to store.
    pub offset: common::Offset,
    /// How durable before acknowledging.
    pub ack: AckLevel,
}

/// DELETE_CONSUMER_OFFSET (122).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteConsumerOffset {
    /// Whose offset, where.
    pub key: ConsumerOffsetKey,
    /// How durable before acknowledging.
    pub ack: AckLevel,
}

/// CREATE_CONSUMER_GROUP (602).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateConsumerGroup {
    /// The topic.
    pub topic: TopicRef,
    /// The new group's name.
    pub name: Name,
}

/// FLUSH_UNSAVED_BUFFER (102).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushUnsavedBuffer {
    /// The topic.
    pub topic: TopicRef,
    /// The partition.
    pub partition: PartitionId,
    /// Whether to fsync as well.
    pub fsync: bool,
}

/// A decoded client request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCommand {
    /// PING (1).
    Ping,
    /// GET_CLUSTER_METADATA (12).
    GetClusterMetadata,
    /// GET_ME (20).
    GetMe,
    /// REPLOG_STATUS (9000, replog's admin command; empty body).
    ReplogStatus,
    /// LOGIN_REGISTER (40, operation Register).
    LoginRegister(LoginRegister),
    /// LOGOUT_USER (39, operation Logout).
    Logout,
    /// POLL_MESSAGES (100).
    PollMessages(PollMessages),
    /// SEND_MESSAGES (101, operation 160).
    SendMessages(SendMessages),
    /// FLUSH_UNSAVED_BUFFER (102).
    FlushUnsavedBuffer(FlushUnsavedBuffer),
    /// GET_CONSUMER_OFFSET (120).
    GetConsumerOffset(ConsumerOffsetKey),
    /// STORE_CONSUMER_OFFSET (121, operation 161).
    StoreConsumerOffset(StoreConsumerOffset),
    /// DELETE_CONSUMER_OFFSET (122, operation 162).
    DeleteConsumerOffset(DeleteConsumerOffset),
    /// GET_STREAM (200).
    GetStream(Identifier),
    /// GET_STREAMS (201).
    GetStreams,
    /// CREATE_STREAM (202, operation 128).
    CreateStream(CreateStream),
    /// DELETE_STREAM (203, operation 130).
    DeleteStream(Identifier),
    /// UPDATE_STREAM (204, operation 129).
    UpdateStream(UpdateStream),
    /// PURGE_STREAM (205, operation 131).
    PurgeStream(Identifier),
    /// GET_TOPIC (300).
    GetTopic(TopicRef),
    /// GET_TOPICS (301).
    GetTopics(Identifier),
    /// CREATE_TOPIC (302, operation 132).
    CreateTopic(CreateTopic),
    /// DELETE_TOPIC (303, operation 134).
    DeleteTopic(TopicRef),
    /// UPDATE_TOPIC (304, operation 133).
    UpdateTopic(UpdateTopic),
    /// PURGE_TOPIC (305, operation 135).
    PurgeTopic(TopicRef),
    /// CREATE_PARTITIONS (402, operation 136).
    CreatePartitions(PartitionsChange),
    /// DELETE_PARTITIONS (403, operation 137).
    DeletePartitions(PartitionsChange),
    /// GET_CONSUMER_GROUP (600).
    GetConsumerGroup(GroupRef),
    /// GET_CONSUMER_GROUPS (601).
    GetConsumerGroups(TopicRef),
    /// CREATE_CONSUMER_GROUP (602, operation 139).
    CreateConsumerGroup(CreateConsumerGroup),
    /// DELETE_CONSUMER_GROUP (603, operation 140).
    DeleteConsumerGroup(GroupRef),
    /// JOIN_CONSUMER_GROUP (604, operation 148).
    JoinConsumerGroup(GroupRef),
    /// LEAVE_CONSUMER_GROUP (605, operation 149).
    LeaveConsumerGroup(GroupRef),
    /// SYNC_CONSUMER_GROUP (606).
    SyncConsumerGroup(GroupRef),
    /// A command of the protocol replog does not implement (its body is
    /// not decoded); answered with FeatureUnavailable.
    Unimplemented(CommandCode),
}

impl RequestFrame {
    /// The command this request names (from the operation byte, or the
    /// code at offset 196 for operation 2).
    pub fn command_code(&self) -> Result<CommandCode, PayloadError> {
        let (operation, code) = (self.header.operation, self.header.legacy_command);
        CommandCode::from_request(operation, code)
            .ok_or(PayloadError::UnknownCommand { operation, code })
    }

    /// Decodes the body of the command the header names. A non-zero
    /// `request_checksum` must be xxh3-64 of the body: the SDK stamps it on
    /// metadata and session operations, and TCP's own checksum is too weak
    /// to trust a create or delete that arrived bent.
    pub fn decode_command(&self) -> Result<ClientCommand, PayloadError> {
        let code = self.command_code()?;
        let body = self.body();
        let stored = self.header.request_checksum;
        if stored != 0 {
            let computed = u128::from(xxhash_rust::xxh3::xxh3_64(&body));
            if stored != computed {
                return Err(PayloadError::RequestChecksumMismatch { stored, computed });
            }
        }
        decode_body(code, &body)
    }
}

/// Decodes `body` as the payload of `code`. Bodies must be consumed
/// exactly; the variable-length tails (options, batches) run to the end.
pub fn decode_body(code: CommandCode, body: &Bytes) -> Result<ClientCommand, PayloadError> {
    use ClientCommand as C;
    use CommandCode as K;
    if !code.implemented() {
        return Ok(C::Unimplemented(code));
    }
    let r = &mut Reader::new(body);
    let command = match code {
        K::Ping => C::Ping,
        K::GetClusterMetadata => C::GetClusterMetadata,
        K::GetMe => C::GetMe,
        K::ReplogStatus => C::ReplogStatus,
        K::LoginRegister => C::LoginRegister(LoginRegister::decode(r)?),
        K::LogoutUser => C::Logout,
        K::PollMessages => C::PollMessages(PollMessages {
            consumer: Consumer::decode(r)?,
            topic: TopicRef::decode(r)?,
            partition: decode_optional_partition(r)?,
            strategy: PollingStrategy::decode(r)?,
            count: r.u32("count")?,
            auto_commit: r.flag("auto commit")?,
        }),
        K::SendMessages => C::SendMessages(SendMessages::decode(r, body)?),
        K::FlushUnsavedBuffer => C::FlushUnsavedBuffer(FlushUnsavedBuffer {
            topic: TopicRef::decode(r)?,
            partition: PartitionId(r.u32("partition id")?),
            fsync: r.flag("fsync")?,
        }),
        K::GetConsumerOffset => C::GetConsumerOffset(ConsumerOffsetKey::decode(r)?),
        K::StoreConsumerOffset => C::StoreConsumerOffset(StoreConsumerOffset {
            key: ConsumerOffsetKey::decode(r)?,
            offset: common::Offset(r.u64("offset")?),
            ack: AckLevel::decode(r)?,
        }),
        K::DeleteConsumerOffset => C::DeleteConsumerOffset(DeleteConsumerOffset {
            key: ConsumerOffsetKey::decode(r)?,
            ack: AckLevel::decode(r)?,
        }),
        K::GetStream => C::GetStream(Identifier::decode(r, "stream id")?),
        K::GetStreams => C::GetStreams,
        K::CreateStream => C::CreateStream(CreateStream {
            name: Name::decode(r, NameField::Stream, "stream name")?,
            options: Options::decode(r.rest())?,
        }),
        K::DeleteStream => C::DeleteStream(Identifier::decode(r, "stream id")?),
        K::UpdateStream => C::UpdateStream(UpdateStream {
            stream: Identifier::decode(r, "stream id")?,
            name: Name::decode(r, NameField::Stream, "stream name")?,
            options: Options::decode(r.rest())?,
        }),
        K::PurgeStream => C::PurgeStream(Identifier::decode(r, "stream id")?),
        K::GetTopic => C::GetTopic(TopicRef::decode(r)?),
        K::GetTopics => C::GetTopics(Identifier::decode(r, "stream id")?),
        K::CreateTopic => C::CreateTopic(CreateTopic {
            stream: Identifier::decode(r, "stream id")?,
            partitions_count: r.u32("partitions count")?,
            name: Name::decode(r, NameField::Topic, "topic name")?,
            options: Options::decode(r.rest())?,
        }),
        K::DeleteTopic => C::DeleteTopic(TopicRef::decode(r)?),
        K::UpdateTopic => C::UpdateTopic(UpdateTopic {
            topic: TopicRef::decode(r)?,
            name: Name::decode(r, NameField::Topic, "topic name")?,
            options: Options::decode(r.rest())?,
        }),
        K::PurgeTopic => C::PurgeTopic(TopicRef::decode(r)?),
        K::CreatePartitions | K::DeletePartitions => {
            let change = PartitionsChange {
                topic: TopicRef::decode(r)?,
                count: r.u32("partitions count")?,
            };
            if code == K::CreatePartitions {
                C::CreatePartitions(change)
            } else {
                C::DeletePartitions(change)
            }
        }
        K::GetConsumerGroup => C::GetConsumerGroup(GroupRef::decode(r)?),
        K::GetConsumerGroups => C::GetConsumerGroups(TopicRef::decode(r)?),
        K::CreateConsumerGroup => C::CreateConsumerGroup(CreateConsumerGroup {
            topic: TopicRef::decode(r)?,
            name: Name::decode(r, NameField::ConsumerGroup, "group name")?,
        }),
        K::DeleteConsumerGroup => C::DeleteConsumerGroup(GroupRef::decode(r)?),
        K::JoinConsumerGroup => C::JoinConsumerGroup(GroupRef::decode(r)?),
        K::LeaveConsumerGroup => C::LeaveConsumerGroup(GroupRef::decode(r)?),
        K::SyncConsumerGroup => C::SyncConsumerGroup(GroupRef::decode(r)?),
        unimplemented => C::Unimplemented(unimplemented),
    };
    r.finish()?;
    Ok(command)
}
