//! What a session needs from the rest of the server: the [`Backend`]
//! trait, one method per operation, each returning a typed result or a
//! [`BackendError`] (which `crate::status` turns into the client's code).
//!
//! The methods return futures so a backend can forward to a shard, wait
//! for a commit, or relay from another replica's primary; nothing requires
//! `Send`, since a connection lives on one shard's thread. The extras no
//! SDK flow needs (update, purge, partitions, flush) default to
//! [`BackendError::Unsupported`].

use crate::protocol::records::{
    ConsumerGroupDetails, ConsumerGroupList, ConsumerOffsetInfo, GroupAssignment, JoinedGroup,
    MemberId, PolledMessages, SendConfirmation, StreamDetails, StreamList, TopicDetails, TopicList,
    UserId,
};
use crate::protocol::{
    ConsumerOffsetKey, CreateConsumerGroup, CreateStream, CreateTopic, DeleteConsumerOffset,
    FlushUnsavedBuffer, GroupRef, Identifier, Name, PartitionsChange, PollMessages, SendMessages,
    StoreConsumerOffset, TopicRef, UpdateStream, UpdateTopic,
};
use common::PartitionId;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;

/// Who is asking: the logged-in user and the connection (which is also
/// its consumer-group member id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The logged-in user.
    pub user: UserId,
    /// The connection, as a group member.
    pub member: MemberId,
}

/// A granted login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginGrant {
    /// The user.
    pub user: UserId,
    /// The session number to bind to the connection (never 0).
    pub session: NonZeroU64,
}

/// Where an error's fault lies, so a caller knows whether retrying helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is wrong; the same request will fail again.
    Client,
    /// The cluster cannot serve it right now (no primary, not committed
    /// yet); the SDK retries these on its own.
    Transient,
    /// This node failed (disk, invariant); other replicas may serve it.
    Local,
}

/// Why the backend refused an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// Wrong username or password.
    InvalidCredentials,
    /// The user may not do this.
    Unauthorized,
    /// No such stream.
    StreamNotFound(Identifier),
    /// No such topic in the stream.
    TopicNotFound(Identifier),
    /// No such consumer group in the topic.
    ConsumerGroupNotFound(Identifier),
    /// No such partition in the topic.
    PartitionNotFound(PartitionId),
    /// The topic has no partitions to send to.
    NoPartitions,
    /// A stream with this name exists.
    StreamNameAlreadyExists(Name),
    /// A topic with this name exists in the stream.
    TopicNameAlreadyExists(Name),
    /// A consumer group with this name exists in the topic.
    ConsumerGroupNameAlreadyExists(Name),
    /// The partition count is out of range.
    InvalidPartitionsCount(u32),
    /// The message count is out of range (a poll of 0 messages).
    InvalidMessagesCount(u32),
    /// The caller is not a member of the group it polls or syncs through.
    NotGroupMember,
    /// The partition is not assigned to the calling member.
    PartitionNotOwned(PartitionId),
    /// An option's key or value is not accepted.
    InvalidOption(String),
    /// An option key this request cannot carry (an update naming a setting
    /// fixed at creation).
    UnsupportedOptionKey(String),
    /// Accepted but not committed yet; retrying on this connection is safe.
    NotCommitted,
    /// The group has no primary right now.
    NoPrimary,
    /// A replayed send its primary cannot place (see
    /// `shard::CallError::ReplayUnplaced`): the primary's partition boot
    /// and how long its journal has held every op, if it has.
    ReplayUnplaced {
        /// Boot identity and µs held.
        since: Option<(u64, u64)>,
    },
    /// The request committed already and its answer is gone (a replay of
    /// a send whose offsets are no longer known): retrying would store it
    /// again.
    AlreadyApplied,
    /// A login before this replica knows any user (its metadata group has
    /// not caught up since it started): refused like bad credentials, so
    /// the client moves on, but not counted against its address.
    NotReady,
    /// The server is at a limit for this kind of request (password
    /// checks queued to the ceiling); retrying later may succeed.
    Busy,
    /// The partition's disk is full: nothing new is stored until space is
    /// freed (reads still serve what is stored).
    NoSpace(String),
    /// The operation is not implemented.
    Unsupported,
    /// This node failed serving it.
    LocalFault(String),
}

impl BackendError {
    /// Where the fault lies.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::NotCommitted
            | Self::NoPrimary
            | Self::Busy
            | Self::NotReady
            | Self::ReplayUnplaced { .. } => ErrorClass::Transient,
            Self::LocalFault(_) => ErrorClass::Local,
            _ => ErrorClass::Client,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy => f.write_str("the server is busy with this kind of request; retry later"),
            Self::NoSpace(reason) => write!(f, "the partition's disk is full: {reason}"),
            Self::NotReady => f.write_str("this replica knows no users yet; try another or retry"),
            Self::InvalidCredentials => f.write_str("wrong username or password"),
            Self::Unauthorized => f.write_str("the user may not do this"),
            Self::StreamNotFound(id) => write!(f, "stream {id} does not exist"),
            Self::TopicNotFound(id) => write!(f, "topic {id} does not exist"),
            Self::ConsumerGroupNotFound(id) => write!(f, "consumer group {id} does not exist"),
            Self::PartitionNotFound(p) => write!(f, "partition {} does not exist", p.0),
            Self::NoPartitions => f.write_str("the topic has no partitions"),
            Self::StreamNameAlreadyExists(n) => write!(f, "stream {n:?} already exists"),
            Self::TopicNameAlreadyExists(n) => write!(f, "topic {n:?} already exists"),
            Self::ConsumerGroupNameAlreadyExists(n) => {
                write!(f, "consumer group {n:?} already exists")
            }
            Self::InvalidPartitionsCount(n) => write!(f, "{n} is not a valid partition count"),
            Self::InvalidMessagesCount(n) => write!(f, "{n} is not a valid message count"),
            Self::NotGroupMember => f.write_str("the caller is not a member of the group"),
            Self::PartitionNotOwned(p) => {
                write!(f, "partition {} is not assigned to the caller", p.0)
            }
            Self::InvalidOption(why) => write!(f, "invalid option: {why}"),
            Self::UnsupportedOptionKey(key) => {
                write!(f, "option {key:?} cannot be set by this request")
            }
            Self::NotCommitted => f.write_str("not committed yet"),
            Self::NoPrimary => f.write_str("the group has no primary right now"),
            Self::ReplayUnplaced { .. } => {
                f.write_str("the primary cannot tell yet whether the original send committed")
            }
            Self::AlreadyApplied => {
                f.write_str("the request was applied already; its answer is no longer known")
            }
            Self::Unsupported => f.write_str("not implemented"),
            Self::LocalFault(why) => write!(f, "local fault: {why}"),
        }
    }
}

impl std::error::Error for BackendError {}

/// A backend result.
pub type BackendResult<T> = Result<T, BackendError>;

/// The operations behind the client protocol. "Not found" on a read is
/// `Ok(None)` (the SDK wants an empty body, not an error); creations return
/// the created object's details (the SDK decodes them).
pub trait Backend {
    /// Checks credentials and opens a session.
    fn login(
        &mut self,
        username: &Name,
        password: &str,
    ) -> impl Future<Output = BackendResult<LoginGrant>>;

    /// Ends a session (logout, or the connection closed).
    fn logout(&mut self, caller: Caller) -> impl Future<Output = BackendResult<()>>;

    /// GET_STREAM.
    fn get_stream(
        &mut self,
        caller: Caller,
        stream: &Identifier,
    ) -> impl Future<Output = BackendResult<Option<StreamDetails>>>;

    /// GET_STREAMS.
    fn get_streams(&mut self, caller: Caller) -> impl Future<Output = BackendResult<StreamList>>;

    /// CREATE_STREAM.
    fn create_stream(
        &mut self,
        caller: Caller,
        request: &CreateStream,
    ) -> impl Future<Output = BackendResult<StreamDetails>>;

    /// DELETE_STREAM.
    fn delete_stream(
        &mut self,
        caller: Caller,
        stream: &Identifier,
    ) -> impl Future<Output = BackendResult<()>>;

    /// UPDATE_STREAM.
    fn update_stream(
        &mut self,
        _caller: Caller,
        _request: &UpdateStream,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// PURGE_STREAM.
    fn purge_stream(
        &mut self,
        _caller: Caller,
        _stream: &Identifier,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// GET_TOPIC. A missing stream is `Ok(None)` as well: the SDK's
    /// consumer init asks for the topic even when the stream was missing.
    fn get_topic(
        &mut self,
        caller: Caller,
        topic: &TopicRef,
    ) -> impl Future<Output = BackendResult<Option<TopicDetails>>>;

    /// GET_TOPICS.
    fn get_topics(
        &mut self,
        caller: Caller,
        stream: &Identifier,
    ) -> impl Future<Output = BackendResult<TopicList>>;

    /// CREATE_TOPIC.
    fn create_topic(
        &mut self,
        caller: Caller,
        request: &CreateTopic,
    ) -> impl Future<Output = BackendResult<TopicDetails>>;

    /// DELETE_TOPIC.
    fn delete_topic(
        &mut self,
        caller: Caller,
        topic: &TopicRef,
    ) -> impl Future<Output = BackendResult<()>>;

    /// UPDATE_TOPIC.
    fn update_topic(
        &mut self,
        _caller: Caller,
        _request: &UpdateTopic,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// PURGE_TOPIC.
    fn purge_topic(
        &mut self,
        _caller: Caller,
        _topic: &TopicRef,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// CREATE_PARTITIONS.
    fn create_partitions(
        &mut self,
        _caller: Caller,
        _request: &PartitionsChange,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// DELETE_PARTITIONS.
    fn delete_partitions(
        &mut self,
        _caller: Caller,
        _request: &PartitionsChange,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// SEND_MESSAGES: appends the (already verified) batch.
    fn send_messages(
        &mut self,
        caller: Caller,
        request: &SendMessages,
    ) -> impl Future<Output = BackendResult<SendConfirmation>>;

    /// POLL_MESSAGES: at most `count` committed messages; with
    /// `auto_commit`, stores the last returned offset.
    fn poll_messages(
        &mut self,
        caller: Caller,
        request: &PollMessages,
    ) -> impl Future<Output = BackendResult<PolledMessages>>;

    /// FLUSH_UNSAVED_BUFFER.
    fn flush_unsaved_buffer(
        &mut self,
        _caller: Caller,
        _request: &FlushUnsavedBuffer,
    ) -> impl Future<Output = BackendResult<()>> {
        std::future::ready(Err(BackendError::Unsupported))
    }

    /// GET_CONSUMER_OFFSET (`None`: nothing stored).
    fn get_consumer_offset(
        &mut self,
        caller: Caller,
        key: &ConsumerOffsetKey,
    ) -> impl Future<Output = BackendResult<Option<ConsumerOffsetInfo>>>;

    /// STORE_CONSUMER_OFFSET.
    fn store_consumer_offset(
        &mut self,
        caller: Caller,
        request: &StoreConsumerOffset,
    ) -> impl Future<Output = BackendResult<()>>;

    /// DELETE_CONSUMER_OFFSET.
    fn delete_consumer_offset(
        &mut self,
        caller: Caller,
        request: &DeleteConsumerOffset,
    ) -> impl Future<Output = BackendResult<()>>;

    /// GET_CONSUMER_GROUP.
    fn get_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> impl Future<Output = BackendResult<Option<ConsumerGroupDetails>>>;

    /// GET_CONSUMER_GROUPS.
    fn get_consumer_groups(
        &mut self,
        caller: Caller,
        topic: &TopicRef,
    ) -> impl Future<Output = BackendResult<ConsumerGroupList>>;

    /// CREATE_CONSUMER_GROUP.
    fn create_consumer_group(
        &mut self,
        caller: Caller,
        request: &CreateConsumerGroup,
    ) -> impl Future<Output = BackendResult<ConsumerGroupDetails>>;

    /// DELETE_CONSUMER_GROUP.
    fn delete_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> impl Future<Output = BackendResult<()>>;

    /// JOIN_CONSUMER_GROUP: makes `caller.member` a member; returns the
    /// group's numeric ids (kept by the session for GET_ME and for leaving
    /// on disconnect).
    fn join_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> impl Future<Output = BackendResult<JoinedGroup>>;

    /// LEAVE_CONSUMER_GROUP.
    fn leave_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> impl Future<Output = BackendResult<JoinedGroup>>;

    /// SYNC_CONSUMER_GROUP (`None`: the caller is not a member).
    fn sync_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> impl Future<Output = BackendResult<Option<GroupAssignment>>>;

    /// REPLOG_STATUS (replog's admin command, docs/formats.md §17): this
    /// replica, its roster and every consensus group it hosts.
    fn replica_status(
        &mut self,
        caller: Caller,
    ) -> impl Future<Output = BackendResult<common::admin::ReplicaStatus>>;
}
