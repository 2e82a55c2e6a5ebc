//! [`NodeBackend`]: the real [`Backend`] behind every client connection of
//! a replica. Each operation becomes metadata ops and queries (group 0 on
//! shard 0) and partition calls (on the shard that owns the partition's
//! group), through [`ShardHandles`].
//!
//! The backend is outside the deterministic core, so this is where the
//! wall clock is read (`created_at_us` of new streams and topics) and where
//! passwords are hashed and verified (Argon2 is slow by design: it runs on
//! the connection's thread, never on the apply path or shard 0's thread).
//!
//! Every error reaches the client through the one mapping at the bottom of
//! this file (`refused`, `meta_failed`, `call_failed`), which turns the
//! metadata plane's [`Refusal`]s and the shard's errors into
//! [`BackendError`]s; `crate::status` turns those into Iggy codes.

use super::password_pool::{Busy, PasswordPool};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use common::admin::ReplicaStatus;
use common::{ConsumerKind, GroupId, METADATA_GROUP, Offset, PartitionId};
use metadata::{
    HashParams, MetadataOp, MetadataState, Outcome, PartitionRoute, PartitionStats, Refusal,
    SessionId, TopicConfig,
};
use shard::{Answer, Call, CallError, MetaError, ProducerKey};

use super::admin::{self, Identity};
use super::forward::codec::{Reply, Request};
use super::forward::{ForwardError, Forwarder};
use super::handle::ShardHandles;
use crate::protocol::poll::select_messages;
use crate::protocol::records::{
    Compression, ConsumerGroupDetails, ConsumerGroupId, ConsumerGroupInfo, ConsumerGroupList,
    ConsumerGroupMember, ConsumerOffsetInfo, GroupAssignment, JoinedGroup, MemberId, PartitionInfo,
    PolledMessages, SendConfirmation, StreamDetails, StreamInfo, StreamList, TopicDetails,
    TopicInfo, TopicList, UserId,
};
use crate::protocol::{
    Consumer, ConsumerOffsetKey, CreateConsumerGroup, CreateStream, CreateTopic,
    DeleteConsumerOffset, FlushUnsavedBuffer, GroupRef, Identifier, Name, Options, Partitioning,
    PartitionsChange, PollMessages, PollingStrategy, SendMessages, StoreConsumerOffset, TopicRef,
    UpdateStream, UpdateTopic,
};
use crate::session::{Backend, BackendError, BackendResult, Caller, LoginGrant};
use std::rc::Rc;

/// Round-robin cursors kept before the map is reset (a client naming many
/// topics cannot grow it without bound).
const BALANCED_CURSORS_MAX: usize = 1024;

/// The backend of one replica's client connections.
///
/// Clones share the login-session counter; each keeps its own balanced
/// round-robin cursors (one clone per connection: a producer's balanced
/// sends rotate over the partitions in its own order).
#[derive(Debug, Clone)]
pub struct NodeBackend {
    handles: ShardHandles,
    node_tag: u32,
    sessions: Arc<AtomicU64>,
    balanced: HashMap<TopicRef, u32>,
    forwarder: Option<Rc<Forwarder>>,
    topic_defaults: TopicConfig,
    identity: Arc<Identity>,
    passwords: Option<PasswordPool>,
}

/// How long a replica that forwarded a metadata op waits to have applied
/// what the primary had, before it answers anyway.
const READ_YOUR_WRITES_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a purge's answer waits for a partition whose primary cannot
/// take the purge call now (a cluster only: longer than a primary timeout
/// and the view change after it), and how often it asks again.
const PURGE_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const PURGE_SETTLE_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

impl NodeBackend {
    /// A backend over `handles`. `node_tag` must differ between replicas
    /// and between boots of one replica (e.g. replica id and boot count
    /// packed): a connection's consumer-group session is `node_tag` and
    /// its connection id, so no two live connections of the cluster share
    /// one, and a restarted node cannot inherit a dead connection's
    /// membership.
    pub fn new(handles: ShardHandles, node_tag: u32) -> Self {
        Self {
            handles,
            node_tag,
            sessions: Arc::new(AtomicU64::new(1)),
            balanced: HashMap::new(),
            forwarder: None,
            topic_defaults: TopicConfig::default(),
            identity: Arc::new(Identity::default()),
            passwords: None,
        }
    }

    /// Checks login passwords on `pool`'s threads; without one (tests),
    /// on the calling thread.
    pub fn with_password_pool(mut self, pool: PasswordPool) -> Self {
        self.passwords = Some(pool);
        self
    }

    /// This replica's id and the roster's client addresses, reported by
    /// `REPLOG_STATUS` (replica 0 alone when not set).
    #[must_use]
    pub fn with_identity(mut self, identity: Arc<Identity>) -> Self {
        self.identity = identity;
        self
    }

    /// The settings a new topic gets where its create request names none
    /// (the replica's `storage` configuration).
    #[must_use]
    pub fn with_topic_defaults(mut self, defaults: TopicConfig) -> Self {
        self.topic_defaults = defaults;
        self
    }

    /// Forwards calls whose group's primary is another replica through
    /// `forwarder` (a cluster of more than one replica).
    #[must_use]
    pub fn with_forwarder(mut self, forwarder: Option<Rc<Forwarder>>) -> Self {
        self.forwarder = forwarder;
        self
    }

    /// Joins (`join`) or leaves the group for the caller's connection: the
    /// group is resolved to numeric ids first, so a concurrent rename
    /// cannot retarget the op.
    async fn membership(
        &mut self,
        caller: Caller,
        group: &GroupRef,
        join: bool,
    ) -> BackendResult<JoinedGroup> {
        let joined = self.resolve_group(group).await?;
        let (stream, topic, group) = numeric_group(joined);
        let session = self.session_of(caller);
        let op = if join {
            MetadataOp::JoinConsumerGroup {
                stream,
                topic,
                group,
                session,
            }
        } else {
            MetadataOp::LeaveConsumerGroup {
                stream,
                topic,
                group,
                session,
            }
        };
        self.submit(caller, op).await?;
        Ok(joined)
    }

    /// The metadata plane's session of a connection (group membership).
    fn session_of(&self, caller: Caller) -> SessionId {
        SessionId((u64::from(self.node_tag) << 32) | u64::from(caller.member.0))
    }

    /// Runs a query that may refuse, on the applied metadata state.
    async fn query<T, Q>(&self, query: Q) -> BackendResult<T>
    where
        T: Send + 'static,
        Q: FnOnce(&MetadataState) -> BackendResult<T> + Send + 'static,
    {
        self.handles.meta_query(query).await.map_err(meta_failed)?
    }

    /// Replicates an op and waits for its outcome: here when this replica
    /// is group 0's primary, else at the primary over the forward lane
    /// (and then until this replica has applied as much, so the client's
    /// next read here sees its write).
    async fn submit(&self, caller: Caller, op: MetadataOp) -> BackendResult<Outcome> {
        let user = caller.user.0;
        let Some(forwarder) = &self.forwarder else {
            return self
                .handles
                .meta_submit(op, user)
                .await
                .map_err(meta_failed);
        };
        let primary = match forwarder.hint(METADATA_GROUP) {
            Some(primary) => primary,
            None => match self.handles.meta_submit(op.clone(), user).await {
                Err(MetaError::NotPrimary { primary, .. }) if primary != forwarder.me() => {
                    forwarder.set_hint(METADATA_GROUP, Some(primary));
                    primary
                }
                other => return other.map_err(meta_failed),
            },
        };
        let request = Request::Meta { user, op };
        match forwarder.request(primary, &request).await {
            Ok(Reply::Meta { result, applied }) => {
                if result == Err(BackendError::NoPrimary) {
                    forwarder.set_hint(METADATA_GROUP, None);
                }
                self.await_applied(applied).await;
                result
            }
            Ok(Reply::Partition(_)) => Err(unexpected("a metadata op")),
            Err(e) => {
                forwarder.set_hint(METADATA_GROUP, None);
                Err(forward_failed(&e))
            }
        }
    }

    /// Waits (bounded) until group 0 here has applied `op`.
    async fn await_applied(&self, op: u64) {
        let deadline = std::time::Instant::now() + READ_YOUR_WRITES_WAIT;
        while std::time::Instant::now() < deadline {
            match self.handles.meta_query(|s| s.applied().0).await {
                Ok(applied) if applied >= op => return,
                Ok(_) => compio::time::sleep(std::time::Duration::from_millis(2)).await,
                Err(_) => return,
            }
        }
        tracing::debug!(op, "answered before applying the primary's metadata");
    }

    /// Runs a partition call on its group's primary.
    async fn call(&self, route: &PartitionRoute, call: Call) -> BackendResult<Answer> {
        self.call_group(route.group, call).await
    }

    /// Runs a call on `group`'s primary: here, or forwarded to the
    /// replica this one last learnt is primary (the call is kept for the
    /// forward only in a cluster, and only until a primary is known).
    async fn call_group(&self, group: GroupId, call: Call) -> BackendResult<Answer> {
        let Some(forwarder) = &self.forwarder else {
            return self.handles.call(group, call).await.map_err(call_failed);
        };
        let primary = match forwarder.hint(group) {
            Some(primary) => primary,
            None => match self.handles.call(group, call.clone()).await {
                Err(CallError::NotPrimary { primary, .. }) if primary != forwarder.me() => {
                    forwarder.set_hint(group, Some(primary));
                    primary
                }
                other => return other.map_err(call_failed),
            },
        };
        let replicated = call.is_replicated();
        match forwarder
            .request(primary, &Request::Partition { group, call })
            .await
        {
            Ok(Reply::Partition(result)) => {
                if matches!(result, Err(BackendError::NoPrimary)) {
                    forwarder.set_hint(group, None);
                }
                result
            }
            Ok(Reply::Meta { .. }) => Err(unexpected("a partition call")),
            Err(e) => {
                forwarder.set_hint(group, None);
                match e {
                    ForwardError::Lost | ForwardError::Timeout if replicated => {
                        Err(BackendError::NotCommitted)
                    }
                    other => Err(forward_failed(&other)),
                }
            }
        }
    }

    /// The numbers of each group, asked of every group at once; a group
    /// that answers an error counts as zeros (a read of sizes must not
    /// fail because one partition is between primaries).
    async fn stats_of(&self, groups: Vec<GroupId>) -> BTreeMap<GroupId, PartitionStats> {
        let calls = groups.iter().map(|g| self.call_group(*g, Call::Stats));
        let answers = futures::future::join_all(calls).await;
        groups
            .into_iter()
            .zip(answers)
            .filter_map(|(g, answer)| match answer {
                Ok(Answer::Stats(s)) => Some((g, stats_record(&s))),
                _ => None,
            })
            .collect()
    }

    /// One partition's numbers (zeros if it cannot answer).
    async fn partition_stats(&self, route: &PartitionRoute) -> PartitionStats {
        self.stats_of(vec![route.group])
            .await
            .remove(&route.group)
            .unwrap_or_default()
    }

    /// Waits until every partition `scope` names has the purge generation
    /// the metadata committed for it in its group's committed history.
    ///
    /// Group 0 commits a purge before the partitions carry it out, each
    /// as its own op. Answering at the commit would let this client's
    /// next poll still read what it purged, and its next produce land
    /// before the purge op and be erased by it. So each group's primary is
    /// asked for the purge itself at that generation: it answers once the
    /// op committed and applied (when the copy the metadata effect
    /// proposed came first, this one commits as nothing), durably for a
    /// `persisted` topic, and every later call on the group is ordered
    /// after it. A group that cannot answer in time fails the request with
    /// `NotCommitted`; the purge is committed all the same and the group's
    /// primary applies it once it has one (refusing data calls until
    /// then).
    async fn settle_purges(&self, scope: PurgeScope) -> BackendResult<()> {
        let targets = self.query(move |s| Ok(purge_targets(s, &scope))).await?;
        let settles = targets
            .into_iter()
            .map(|(group, generation)| self.settle_purge(group, generation));
        futures::future::join_all(settles)
            .await
            .into_iter()
            .collect()
    }

    /// One group's part of [`Self::settle_purges`]. In a cluster a
    /// transient failure (a primary that just moved, a view change) is
    /// retried for a while before it reaches the client: the purge is
    /// committed already, and a client told to retry would purge again.
    /// The call is safe to repeat, since a generation already applied
    /// commits as nothing.
    async fn settle_purge(&self, group: GroupId, generation: u64) -> BackendResult<()> {
        let deadline = std::time::Instant::now() + PURGE_SETTLE_WAIT;
        loop {
            match self.call_group(group, Call::Purge { generation }).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.class() == crate::session::ErrorClass::Transient
                        && self.forwarder.is_some()
                        && std::time::Instant::now() < deadline =>
                {
                    compio::time::sleep(PURGE_SETTLE_RETRY).await;
                }
                Err(e) => {
                    tracing::debug!(
                        group = group.0,
                        generation,
                        error = %e,
                        "a committed purge is not yet applied by its partition"
                    );
                    // Admitted and committed, so never "not accepted"
                    // (58, which tells the client nothing happened).
                    return Err(match e.class() {
                        crate::session::ErrorClass::Transient => BackendError::NotCommitted,
                        _ => e,
                    });
                }
            }
        }
    }

    /// The next balanced partition index for a topic.
    fn next_balanced(&mut self, topic: &TopicRef) -> u32 {
        if self.balanced.len() >= BALANCED_CURSORS_MAX && !self.balanced.contains_key(topic) {
            self.balanced.clear();
        }
        let cursor = self.balanced.entry(topic.clone()).or_insert(0);
        let at = *cursor;
        *cursor = cursor.wrapping_add(1);
        at
    }
}

/// Makes the root user's stored password the configured one: the node
/// calls this at boot when the configured password changed since it last
/// applied one (`root-password.applied`, main.rs). Creates the user if
/// missing; otherwise replaces its hash when the password does not match
/// it. Transient errors are returned for the caller to retry.
pub async fn apply_root_password(
    handles: &ShardHandles,
    username: &str,
    password: &str,
) -> BackendResult<RootPassword> {
    let name = username.to_owned();
    let stored = handles
        .meta_query(move |s| {
            s.users()
                .values()
                .find(|u| u.username == name)
                .map(|u| u.password_hash.clone())
        })
        .await
        .map_err(meta_failed)?;
    let Some(stored) = stored else {
        ensure_root_user(handles, username, password).await?;
        return Ok(RootPassword::Created);
    };
    if metadata::verify_password(&stored, password) {
        return Ok(RootPassword::Unchanged);
    }
    let password_hash = metadata::hash_password(password, &fresh_salt()?, HashParams::default())
        .map_err(|e| BackendError::LocalFault(format!("hashing the root password: {e}")))?;
    let op = MetadataOp::ChangePassword {
        user: metadata::Identifier::Name(username.to_owned()),
        password_hash,
    };
    handles
        .meta_submit(op, metadata::ROOT_USER.0)
        .await
        .map_err(meta_failed)?;
    Ok(RootPassword::Changed)
}

/// What [`apply_root_password`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootPassword {
    /// The root user did not exist and was created with it.
    Created,
    /// The stored hash matched it already.
    Unchanged,
    /// The stored hash was replaced.
    Changed,
}

/// Creates the root user if no user has its name: the node calls this at
/// boot on the metadata primary. Idempotent: a user of that name already
/// there (found, or refused as existing by a concurrent create) is fine.
/// Transient errors (no metadata primary yet) are returned for the caller
/// to retry.
pub async fn ensure_root_user(
    handles: &ShardHandles,
    username: &str,
    password: &str,
) -> BackendResult<()> {
    let name = username.to_owned();
    let exists = handles
        .meta_query(move |s| s.users().values().any(|u| u.username == name))
        .await
        .map_err(meta_failed)?;
    if exists {
        return Ok(());
    }
    let password_hash = metadata::hash_password(password, &fresh_salt()?, HashParams::default())
        .map_err(|e| BackendError::LocalFault(format!("hashing the root password: {e}")))?;
    let op = MetadataOp::CreateUser {
        username: username.to_owned(),
        password_hash,
        created_at_us: now_us(),
    };
    match handles.meta_submit(op, metadata::ROOT_USER.0).await {
        Ok(_) | Err(MetaError::Refused(Refusal::UserAlreadyExists(_))) => Ok(()),
        Err(e) => Err(meta_failed(e)),
    }
}

impl Backend for NodeBackend {
    async fn login(&mut self, username: &Name, password: &str) -> BackendResult<LoginGrant> {
        let name = username.as_str().to_owned();
        // The hash is fetched and verified here, not in a query: Argon2
        // would otherwise stall shard 0 (and the metadata plane) per login.
        let (user, no_users) = self
            .handles
            .meta_query(move |s| {
                let user = s
                    .users()
                    .values()
                    .find(|u| u.username == name)
                    .map(|u| (u.id, u.password_hash.clone()));
                (user, s.users().is_empty())
            })
            .await
            .map_err(meta_failed)?;
        if no_users {
            // A new cluster whose root user group 0 has not created yet,
            // or a restarted replica whose metadata has not caught up:
            // refused as a login the client should try elsewhere or again
            // (the SDK moves on at once; a transient status would keep it
            // waiting on this replica), not counted against the address.
            return Err(BackendError::NotReady);
        }
        // Unknown user and wrong password answer alike, after the same
        // work (the pool checks an unknown name against a dummy hash).
        let (id, hash) = user.unzip();
        let matched = match &self.passwords {
            Some(pool) => pool
                .verify(hash, password)
                .await
                .map_err(|Busy| BackendError::Busy)?,
            None => hash.is_some_and(|h| metadata::verify_password(&h, password)),
        };
        let user = match id {
            Some(id) if matched => id,
            _ => return Err(BackendError::InvalidCredentials),
        };
        let session = NonZeroU64::new(self.sessions.fetch_add(1, Ordering::Relaxed))
            .ok_or_else(|| BackendError::LocalFault("login session numbers exhausted".into()))?;
        Ok(LoginGrant {
            user: UserId(user.0),
            session,
        })
    }

    async fn logout(&mut self, caller: Caller) -> BackendResult<()> {
        let session = self.session_of(caller);
        self.submit(caller, MetadataOp::EndSession { session })
            .await
            .map(drop)
    }

    async fn get_stream(
        &mut self,
        _caller: Caller,
        stream: &Identifier,
    ) -> BackendResult<Option<StreamDetails>> {
        let id = meta_id(stream);
        let scope = id.clone();
        let groups = self.query(move |s| Ok(groups_of_stream(s, &scope))).await?;
        let stats = self.stats_of(groups).await;
        let details = self
            .query(move |s| Ok(s.get_stream(&id, &stats_source(&stats))))
            .await?;
        details.map(|d| stream_details(&d)).transpose()
    }

    async fn get_streams(&mut self, _caller: Caller) -> BackendResult<StreamList> {
        let groups = self
            .query(|s| Ok(s.partition_groups().iter().map(|g| g.group).collect()))
            .await?;
        let stats = self.stats_of(groups).await;
        let streams = self
            .query(move |s| Ok(s.list_streams(&stats_source(&stats))))
            .await?;
        Ok(StreamList(
            streams
                .iter()
                .map(stream_info)
                .collect::<BackendResult<_>>()?,
        ))
    }

    async fn create_stream(
        &mut self,
        caller: Caller,
        request: &CreateStream,
    ) -> BackendResult<StreamDetails> {
        let op = MetadataOp::CreateStream {
            name: request.name.as_str().to_owned(),
            created_at_us: now_us(),
        };
        let Outcome::StreamCreated(id) = self.submit(caller, op).await? else {
            return Err(unexpected("create_stream"));
        };
        let stream = metadata::Identifier::Numeric(id.0);
        // A new stream holds nothing: no stats to ask for.
        let details = self
            .query(move |s| Ok(s.get_stream(&stream, &zero_stats)))
            .await?;
        let details = details.ok_or(BackendError::StreamNotFound(Identifier::Numeric(id.0)))?;
        stream_details(&details)
    }

    async fn delete_stream(&mut self, caller: Caller, stream: &Identifier) -> BackendResult<()> {
        let op = MetadataOp::DeleteStream {
            stream: meta_id(stream),
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn get_topic(
        &mut self,
        _caller: Caller,
        topic: &TopicRef,
    ) -> BackendResult<Option<TopicDetails>> {
        let (stream, topic) = (meta_id(&topic.stream), meta_id(&topic.topic));
        let scope = (stream.clone(), topic.clone());
        let groups = self
            .query(move |s| Ok(groups_of_topic(s, &scope.0, &scope.1)))
            .await?;
        let stats = self.stats_of(groups).await;
        let details = self
            .query(move |s| Ok(s.get_topic(&stream, &topic, &stats_source(&stats))))
            .await?;
        details.map(|d| topic_details(&d)).transpose()
    }

    async fn get_topics(
        &mut self,
        _caller: Caller,
        stream: &Identifier,
    ) -> BackendResult<TopicList> {
        let id = meta_id(stream);
        let scope = id.clone();
        let groups = self.query(move |s| Ok(groups_of_stream(s, &scope))).await?;
        let stats = self.stats_of(groups).await;
        let topics = self
            .query(move |s| s.list_topics(&id, &stats_source(&stats)).map_err(refused))
            .await?;
        Ok(TopicList(
            topics
                .iter()
                .map(topic_info)
                .collect::<BackendResult<_>>()?,
        ))
    }

    async fn create_topic(
        &mut self,
        caller: Caller,
        request: &CreateTopic,
    ) -> BackendResult<TopicDetails> {
        let op = MetadataOp::CreateTopic {
            stream: meta_id(&request.stream),
            name: request.name.as_str().to_owned(),
            partitions_count: request.partitions_count,
            config: topic_config(&request.options, &self.topic_defaults)?,
            created_at_us: now_us(),
        };
        let Outcome::TopicCreated(s, t) = self.submit(caller, op).await? else {
            return Err(unexpected("create_topic"));
        };
        let (stream, topic) = (
            metadata::Identifier::Numeric(s.0),
            metadata::Identifier::Numeric(t.0),
        );
        let details = self
            .query(move |state| Ok(state.get_topic(&stream, &topic, &zero_stats)))
            .await?;
        let details = details.ok_or(BackendError::TopicNotFound(Identifier::Numeric(t.0)))?;
        topic_details(&details)
    }

    async fn delete_topic(&mut self, caller: Caller, topic: &TopicRef) -> BackendResult<()> {
        let op = MetadataOp::DeleteTopic {
            stream: meta_id(&topic.stream),
            topic: meta_id(&topic.topic),
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn update_stream(&mut self, caller: Caller, request: &UpdateStream) -> BackendResult<()> {
        // Iggy 0.11 defines no updatable stream option: any key is refused
        // by name rather than ignored.
        if let Some(e) = request.options.entries.first() {
            return Err(BackendError::UnsupportedOptionKey(e.key.clone()));
        }
        let op = MetadataOp::UpdateStream {
            stream: meta_id(&request.stream),
            name: request.name.as_str().to_owned(),
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn purge_stream(&mut self, caller: Caller, stream: &Identifier) -> BackendResult<()> {
        let stream = meta_id(stream);
        let op = MetadataOp::PurgeStream {
            stream: stream.clone(),
        };
        self.submit(caller, op).await?;
        self.settle_purges(PurgeScope::Stream(stream)).await
    }

    async fn update_topic(&mut self, caller: Caller, request: &UpdateTopic) -> BackendResult<()> {
        // Iggy 0.11's UPDATE_TOPIC patches: a setting it does not name
        // keeps its value, and only the updatable ones may be named.
        let op = MetadataOp::PatchTopic {
            stream: meta_id(&request.topic.stream),
            topic: meta_id(&request.topic.topic),
            name: request.name.as_str().to_owned(),
            patch: topic_patch(&request.options)?,
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn purge_topic(&mut self, caller: Caller, topic: &TopicRef) -> BackendResult<()> {
        let (stream, topic) = (meta_id(&topic.stream), meta_id(&topic.topic));
        let op = MetadataOp::PurgeTopic {
            stream: stream.clone(),
            topic: topic.clone(),
        };
        self.submit(caller, op).await?;
        self.settle_purges(PurgeScope::Topic(stream, topic)).await
    }

    async fn create_partitions(
        &mut self,
        caller: Caller,
        request: &PartitionsChange,
    ) -> BackendResult<()> {
        let op = MetadataOp::CreatePartitions {
            stream: meta_id(&request.topic.stream),
            topic: meta_id(&request.topic.topic),
            count: request.count,
            created_at_us: now_us(),
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn delete_partitions(
        &mut self,
        caller: Caller,
        request: &PartitionsChange,
    ) -> BackendResult<()> {
        let op = MetadataOp::DeletePartitions {
            stream: meta_id(&request.topic.stream),
            topic: meta_id(&request.topic.topic),
            count: request.count,
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn flush_unsaved_buffer(
        &mut self,
        _caller: Caller,
        request: &FlushUnsavedBuffer,
    ) -> BackendResult<()> {
        let (stream, topic) = (
            meta_id(&request.topic.stream),
            meta_id(&request.topic.topic),
        );
        let partition = request.partition;
        let route = self
            .query(move |s| {
                s.route_partition(&stream, &topic, partition)
                    .map_err(refused)
            })
            .await?;
        // The partition flushes its committed prefix to the active
        // segment; whether that is fsynced is the topic's durability.
        match self.call(&route, Call::Flush).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected("flush")),
        }
    }

    async fn send_messages(
        &mut self,
        _caller: Caller,
        request: &SendMessages,
    ) -> BackendResult<SendConfirmation> {
        let choice = match &request.partitioning {
            Partitioning::PartitionId(p) => PartitionChoice::Id(*p),
            Partitioning::Balanced => {
                PartitionChoice::Nth(u64::from(self.next_balanced(&request.topic)))
            }
            Partitioning::MessagesKey(key) => PartitionChoice::Nth(xxhash_rust::xxh3::xxh3_64(key)),
        };
        let (stream, topic) = (
            meta_id(&request.topic.stream),
            meta_id(&request.topic.topic),
        );
        let route = self
            .query(move |s| route_send(s, &stream, &topic, choice))
            .await?;
        let started = std::time::Instant::now();
        let mut key = ProducerKey {
            key: request.producer_key,
            replay: request.replay,
            vouched: 0,
        };
        let mut answer = self
            .call(
                &route,
                Call::Produce {
                    batch: request.batch.to_vec(),
                    key,
                },
            )
            .await;
        // A primary that restarted since cannot place a replay by itself:
        // it says since when its journal holds every op, and if this
        // connection first received the send after that moment (its
        // original, if ordered at all, was ordered later), this replica
        // vouches for it and it is ordered as new. Sound without clock
        // agreement: `held` was measured before this answer arrived.
        if let Err(BackendError::ReplayUnplaced {
            since: Some((boot, held_us)),
        }) = answer
        {
            let age = std::time::Duration::from_millis(u64::from(request.replay_age_ms))
                .saturating_add(started.elapsed());
            if std::time::Duration::from_micros(held_us) >= age {
                key.vouched = boot;
                answer = self
                    .call(
                        &route,
                        Call::Produce {
                            batch: request.batch.to_vec(),
                            key,
                        },
                    )
                    .await;
            }
        }
        if let Err(error) = &answer {
            tracing::debug!(replay = request.replay, %error, "send not answered");
        }
        let answer = match answer {
            // A replay's original may have committed: "not accepted" (58)
            // would let the SDK send it again under a new session, where
            // it is a new send. Only a same-session replay (57) can be
            // recognised.
            Err(BackendError::NoPrimary) if request.replay && request.producer_key != 0 => {
                return Err(BackendError::NotCommitted);
            }
            other => other?,
        };
        let base = match answer {
            Answer::Committed {
                base_offset: Some(base),
                ..
            } => base,
            // Committed, but the prepare was gone before the answer was
            // made (a transfer in between): no offset is confirmed rather
            // than one that may name another batch.
            Answer::Committed {
                base_offset: None, ..
            } => return Err(BackendError::AlreadyApplied),
            _ => return Err(unexpected("produce")),
        };
        Ok(SendConfirmation {
            stream_id: route.stream,
            topic_id: route.topic,
            partition_id: route.partition,
            base_offset: base,
        })
    }

    async fn poll_messages(
        &mut self,
        caller: Caller,
        request: &PollMessages,
    ) -> BackendResult<PolledMessages> {
        if request.count == 0 {
            return Err(BackendError::InvalidMessagesCount(0));
        }
        let key = OffsetKey::new(&request.consumer, &request.topic, request.partition);
        let session = self.session_of(caller);
        let target = self
            .query(move |s| offset_target(s, &key, session, Ownership::Required))
            .await?;
        let poll = partitions::PollRequest {
            consumer: target.consumer,
            strategy: poll_strategy(request.strategy),
            count: request.count,
            auto_commit: request.auto_commit,
        };
        let polled = match self.call(&target.route, Call::Poll(poll)).await? {
            Answer::Polled(p) => p,
            _ => return Err(unexpected("poll")),
        };
        let head = self.partition_stats(&target.route).await;
        polled_messages(target.route.partition, &head, &polled)
    }

    async fn get_consumer_offset(
        &mut self,
        caller: Caller,
        key: &ConsumerOffsetKey,
    ) -> BackendResult<Option<ConsumerOffsetInfo>> {
        let key = OffsetKey::new(&key.consumer, &key.topic, key.partition);
        let session = self.session_of(caller);
        let target = self
            .query(move |s| offset_target(s, &key, session, Ownership::NotChecked))
            .await?;
        let (kind, id) = target.consumer;
        let stored = match self
            .call(&target.route, Call::GetOffset { kind, id })
            .await?
        {
            Answer::Offset(o) => o,
            _ => return Err(unexpected("get_offset")),
        };
        let Some(stored) = stored else {
            return Ok(None);
        };
        let head = self.partition_stats(&target.route).await;
        Ok(Some(ConsumerOffsetInfo {
            partition_id: target.route.partition,
            current_offset: Offset(head.current_offset),
            stored_offset: stored,
        }))
    }

    async fn store_consumer_offset(
        &mut self,
        caller: Caller,
        request: &StoreConsumerOffset,
    ) -> BackendResult<()> {
        let k = &request.key;
        let key = OffsetKey::new(&k.consumer, &k.topic, k.partition);
        let session = self.session_of(caller);
        let target = self
            .query(move |s| offset_target(s, &key, session, Ownership::NotChecked))
            .await?;
        let (kind, id) = target.consumer;
        let call = Call::StoreOffset {
            kind,
            id,
            offset: request.offset,
        };
        committed(self.call(&target.route, call).await?, "store_offset")
    }

    async fn delete_consumer_offset(
        &mut self,
        caller: Caller,
        request: &DeleteConsumerOffset,
    ) -> BackendResult<()> {
        let k = &request.key;
        let key = OffsetKey::new(&k.consumer, &k.topic, k.partition);
        let session = self.session_of(caller);
        let target = self
            .query(move |s| offset_target(s, &key, session, Ownership::NotChecked))
            .await?;
        let (kind, id) = target.consumer;
        let call = Call::DeleteOffset { kind, id };
        committed(self.call(&target.route, call).await?, "delete_offset")
    }

    async fn get_consumer_group(
        &mut self,
        _caller: Caller,
        group: &GroupRef,
    ) -> BackendResult<Option<ConsumerGroupDetails>> {
        let (s, t, g) = group_ids(group);
        let details = self
            .query(move |state| Ok(state.get_consumer_group(&s, &t, &g)))
            .await?;
        details.map(|d| group_details(&d)).transpose()
    }

    async fn get_consumer_groups(
        &mut self,
        _caller: Caller,
        topic: &TopicRef,
    ) -> BackendResult<ConsumerGroupList> {
        let (s, t) = (meta_id(&topic.stream), meta_id(&topic.topic));
        let groups = self
            .query(move |state| state.list_consumer_groups(&s, &t).map_err(refused))
            .await?;
        Ok(ConsumerGroupList(
            groups
                .iter()
                .map(|g| group_details(g).map(|d| d.group))
                .collect::<BackendResult<_>>()?,
        ))
    }

    async fn create_consumer_group(
        &mut self,
        caller: Caller,
        request: &CreateConsumerGroup,
    ) -> BackendResult<ConsumerGroupDetails> {
        let op = MetadataOp::CreateConsumerGroup {
            stream: meta_id(&request.topic.stream),
            topic: meta_id(&request.topic.topic),
            name: request.name.as_str().to_owned(),
        };
        let Outcome::ConsumerGroupCreated(s, t, g) = self.submit(caller, op).await? else {
            return Err(unexpected("create_consumer_group"));
        };
        let ids = (
            metadata::Identifier::Numeric(s.0),
            metadata::Identifier::Numeric(t.0),
            metadata::Identifier::Numeric(g.0),
        );
        let details = self
            .query(move |state| Ok(state.get_consumer_group(&ids.0, &ids.1, &ids.2)))
            .await?;
        let details = details.ok_or(BackendError::ConsumerGroupNotFound(Identifier::Numeric(
            g.0,
        )))?;
        group_details(&details)
    }

    async fn delete_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> BackendResult<()> {
        let (stream, topic, group) = group_ids(group);
        let op = MetadataOp::DeleteConsumerGroup {
            stream,
            topic,
            group,
        };
        self.submit(caller, op).await.map(drop)
    }

    async fn join_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> BackendResult<JoinedGroup> {
        self.membership(caller, group, true).await
    }

    async fn leave_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> BackendResult<JoinedGroup> {
        self.membership(caller, group, false).await
    }

    async fn sync_consumer_group(
        &mut self,
        caller: Caller,
        group: &GroupRef,
    ) -> BackendResult<Option<GroupAssignment>> {
        let (s, t, g) = group_ids(group);
        let session = self.session_of(caller);
        let assignment = self
            .query(move |state| {
                state.consumer_group_id(&s, &t, &g).map_err(refused)?;
                Ok(state.member_assignment(&s, &t, &g, session))
            })
            .await?;
        Ok(assignment.map(|a| GroupAssignment {
            generation: a.generation,
            partitions: a.partitions,
        }))
    }

    async fn replica_status(&mut self, _caller: Caller) -> BackendResult<ReplicaStatus> {
        Ok(admin::replica_status(&self.handles, &self.identity).await)
    }
}

impl NodeBackend {
    /// The numeric ids of a group (joined and left by id, so a concurrent
    /// rename cannot make the op name another group).
    async fn resolve_group(&self, group: &GroupRef) -> BackendResult<JoinedGroup> {
        let (s, t, g) = group_ids(group);
        self.query(move |state| {
            let (stream, topic) = state.resolve_topic(&s, &t).map_err(refused)?;
            let group = state.consumer_group_id(&s, &t, &g).map_err(refused)?;
            Ok(JoinedGroup {
                stream,
                topic,
                group: ConsumerGroupId(group.0),
            })
        })
        .await
    }
}

// ---------------------------------------------------------------------
// Routing: which partition group a request goes to (run inside queries).
// ---------------------------------------------------------------------

/// How a send picks its partition.
#[derive(Debug, Clone, Copy)]
enum PartitionChoice {
    /// This partition id.
    Id(PartitionId),
    /// The n-th partition modulo the count (balanced cursor, key hash).
    Nth(u64),
}

fn route_send(
    state: &MetadataState,
    stream: &metadata::Identifier,
    topic: &metadata::Identifier,
    choice: PartitionChoice,
) -> BackendResult<PartitionRoute> {
    let partition = match choice {
        PartitionChoice::Id(p) => p,
        PartitionChoice::Nth(n) => {
            let (s, t) = state.resolve_topic(stream, topic).map_err(refused)?;
            let ids: Vec<PartitionId> = state
                .streams()
                .get(&s)
                .and_then(|st| st.topics.get(&t))
                .map(|tp| tp.partitions.keys().copied().collect())
                .unwrap_or_default();
            let count = u64::try_from(ids.len()).unwrap_or(u64::MAX);
            if count == 0 {
                return Err(BackendError::NoPartitions);
            }
            let at = usize::try_from(n % count).unwrap_or(0);
            *ids.get(at).ok_or(BackendError::NoPartitions)?
        }
    };
    state
        .route_partition(stream, topic, partition)
        .map_err(refused)
}

/// Whether a consumer-group request must come from a member owning the
/// partition (polls) or not (offset reads and writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    Required,
    NotChecked,
}

/// Whose offsets, where: the request's part the routing needs, owned so
/// it can travel into a query.
#[derive(Debug, Clone)]
struct OffsetKey {
    kind: ConsumerKind,
    consumer: metadata::Identifier,
    stream: metadata::Identifier,
    topic: metadata::Identifier,
    partition: Option<PartitionId>,
}

impl OffsetKey {
    fn new(consumer: &Consumer, topic: &TopicRef, partition: Option<PartitionId>) -> Self {
        Self {
            kind: consumer.kind,
            consumer: meta_id(&consumer.id),
            stream: meta_id(&topic.stream),
            topic: meta_id(&topic.topic),
            partition,
        }
    }
}

/// A routed offset or poll request: the partition and the consumer key the
/// partition keeps offsets under.
#[derive(Debug, Clone, Copy)]
struct OffsetTarget {
    route: PartitionRoute,
    consumer: (ConsumerKind, u32),
}

fn offset_target(
    state: &MetadataState,
    key: &OffsetKey,
    session: SessionId,
    ownership: Ownership,
) -> BackendResult<OffsetTarget> {
    let (partition, id) = match key.kind {
        ConsumerKind::Consumer => (
            key.partition.unwrap_or(PartitionId(0)),
            consumer_number(&key.consumer),
        ),
        ConsumerKind::ConsumerGroup => {
            let group = state
                .consumer_group_id(&key.stream, &key.topic, &key.consumer)
                .map_err(refused)?;
            let partition = match key.partition {
                Some(p) => p,
                // No partition named: the member's first one.
                None => state
                    .member_assignment(&key.stream, &key.topic, &key.consumer, session)
                    .and_then(|a| a.partitions.first().copied())
                    .ok_or(BackendError::NotGroupMember)?,
            };
            if ownership == Ownership::Required {
                state
                    .check_group_poll(&key.stream, &key.topic, &key.consumer, session, partition)
                    .map_err(refused)?;
            }
            (partition, group.0)
        }
    };
    let route = state
        .route_partition(&key.stream, &key.topic, partition)
        .map_err(refused)?;
    Ok(OffsetTarget {
        route,
        consumer: (key.kind, id),
    })
}

/// A stand-alone consumer's number: its numeric id, or a hash of its name
/// (a named and a numeric consumer may collide; Iggy hashes names too).
fn consumer_number(id: &metadata::Identifier) -> u32 {
    match id {
        metadata::Identifier::Numeric(n) => *n,
        // The low 32 bits of the hash: truncation is the point.
        metadata::Identifier::Name(name) => xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as u32,
    }
}

fn groups_of_stream(state: &MetadataState, stream: &metadata::Identifier) -> Vec<GroupId> {
    let Ok(s) = state.resolve_stream(stream) else {
        return Vec::new();
    };
    state
        .partition_groups()
        .iter()
        .filter(|g| g.stream == s)
        .map(|g| g.group)
        .collect()
}

fn groups_of_topic(
    state: &MetadataState,
    stream: &metadata::Identifier,
    topic: &metadata::Identifier,
) -> Vec<GroupId> {
    let Ok((s, t)) = state.resolve_topic(stream, topic) else {
        return Vec::new();
    };
    state
        .partition_groups()
        .iter()
        .filter(|g| g.stream == s && g.topic == t)
        .map(|g| g.group)
        .collect()
}

// ---------------------------------------------------------------------
// Conversions between the protocol's records and the planes' types.
// ---------------------------------------------------------------------

fn meta_id(id: &Identifier) -> metadata::Identifier {
    match id {
        Identifier::Numeric(n) => metadata::Identifier::Numeric(*n),
        Identifier::Name(name) => metadata::Identifier::Name(name.as_str().to_owned()),
    }
}

fn group_ids(
    group: &GroupRef,
) -> (
    metadata::Identifier,
    metadata::Identifier,
    metadata::Identifier,
) {
    (
        meta_id(&group.topic.stream),
        meta_id(&group.topic.topic),
        meta_id(&group.group),
    )
}

fn numeric_group(
    g: JoinedGroup,
) -> (
    metadata::Identifier,
    metadata::Identifier,
    metadata::Identifier,
) {
    (
        metadata::Identifier::Numeric(g.stream.0),
        metadata::Identifier::Numeric(g.topic.0),
        metadata::Identifier::Numeric(g.group.0),
    )
}

fn stats_record(s: &partitions::PartitionStats) -> PartitionStats {
    PartitionStats {
        size_bytes: s.size_bytes,
        messages_count: s.messages_count,
        segments_count: u32::try_from(s.segments_count).unwrap_or(u32::MAX),
        current_offset: s.current_offset.map_or(0, |o| o.0),
    }
}

fn stats_source(
    stats: &BTreeMap<GroupId, PartitionStats>,
) -> impl Fn(GroupId) -> PartitionStats + '_ {
    move |g| stats.get(&g).copied().unwrap_or_default()
}

fn zero_stats(_: GroupId) -> PartitionStats {
    PartitionStats::default()
}

/// A stored name as a protocol name. The metadata plane enforces the same
/// 1..=255-byte rule, so a failure is a corrupt state, not the client's.
fn name_of(name: &str) -> BackendResult<Name> {
    Name::new(name).ok_or_else(|| BackendError::LocalFault(format!("stored name {name:?}")))
}

fn stream_info(s: &metadata::StreamInfo) -> BackendResult<StreamInfo> {
    Ok(StreamInfo {
        id: s.id,
        created_at_micros: s.created_at_us,
        topics_count: s.topics_count,
        size_bytes: s.size_bytes,
        messages_count: s.messages_count,
        name: name_of(&s.name)?,
    })
}

fn stream_details(d: &metadata::StreamDetails) -> BackendResult<StreamDetails> {
    Ok(StreamDetails {
        stream: stream_info(&d.stream)?,
        topics: d
            .topics
            .iter()
            .map(topic_info)
            .collect::<BackendResult<_>>()?,
    })
}

fn topic_info(t: &metadata::TopicInfo) -> BackendResult<TopicInfo> {
    Ok(TopicInfo {
        id: t.id,
        created_at_micros: t.created_at_us,
        partitions_count: t.partitions_count,
        message_expiry_micros: t.config.message_expiry.to_wire(),
        compression: match t.config.compression {
            metadata::CompressionAlgorithm::None => Compression::None,
            metadata::CompressionAlgorithm::Gzip => Compression::Gzip,
        },
        max_topic_size_bytes: t.config.max_topic_size.to_wire(),
        size_bytes: t.size_bytes,
        messages_count: t.messages_count,
        name: name_of(&t.name)?,
    })
}

fn topic_details(d: &metadata::TopicDetails) -> BackendResult<TopicDetails> {
    Ok(TopicDetails {
        topic: topic_info(&d.topic)?,
        partitions: d
            .partitions
            .iter()
            .map(|p| PartitionInfo {
                id: p.id,
                created_at_micros: p.created_at_us,
                segments_count: p.stats.segments_count,
                current_offset: Offset(p.stats.current_offset),
                size_bytes: p.stats.size_bytes,
                messages_count: p.stats.messages_count,
            })
            .collect(),
    })
}

fn group_details(g: &metadata::ConsumerGroupDetails) -> BackendResult<ConsumerGroupDetails> {
    Ok(ConsumerGroupDetails {
        group: ConsumerGroupInfo {
            id: ConsumerGroupId(g.id.0),
            partitions_count: g.partitions_count,
            members_count: u32::try_from(g.members.len()).unwrap_or(u32::MAX),
            name: name_of(&g.name)?,
        },
        members: g
            .members
            .iter()
            .map(|m| ConsumerGroupMember {
                id: MemberId(m.id.0),
                partitions: m.partitions.clone(),
            })
            .collect(),
    })
}

fn poll_strategy(s: PollingStrategy) -> partitions::PollingStrategy {
    use partitions::PollingStrategy as P;
    match s {
        PollingStrategy::Offset(o) => P::Offset(o.0),
        PollingStrategy::Timestamp(t) => P::Timestamp(t),
        PollingStrategy::First => P::First,
        PollingStrategy::Last => P::Last,
        PollingStrategy::Next => P::Next,
    }
}

/// The poll reply: the partition's whole batches cut down to the range it
/// returned (the first may start before it, the last end after it).
fn polled_messages(
    partition: PartitionId,
    head: &PartitionStats,
    polled: &partitions::Polled,
) -> BackendResult<PolledMessages> {
    let current = Offset(head.current_offset.max(polled.last_offset.0));
    if polled.is_empty() {
        return Ok(PolledMessages::empty(partition, current));
    }
    let mut left = u32::try_from(polled.count).unwrap_or(u32::MAX);
    let mut next = polled.first_offset;
    let mut out: Vec<Bytes> = Vec::new();
    for batch in &polled.batches {
        if left == 0 {
            break;
        }
        let cut = select_messages(batch, next, left).map_err(stored_batch)?;
        if let Some(cut) = cut {
            let h = storage::BatchHeader::decode(&cut, u64::MAX).map_err(stored_batch)?;
            left = left.saturating_sub(h.message_count);
            next = Offset(h.next_offset());
            out.push(cut);
        }
    }
    PolledMessages::new(partition, current, out).map_err(stored_batch)
}

/// A topic's settings from CREATE_TOPIC's options. Keys replog does not
/// use (consumer-offset durability, flush thresholds…) are accepted and
/// ignored, as the SDK sends some on every create; a known key whose
/// value does not parse is refused whole.
fn topic_config(options: &Options, defaults: &TopicConfig) -> BackendResult<TopicConfig> {
    let mut config = *defaults;
    for e in &options.entries {
        let bad = || BackendError::InvalidOption(format!("{} has an unusable value", e.key));
        match e.key.as_str() {
            "compression_algorithm" => {
                config.compression = match option_text(e).as_deref() {
                    Some("none") => metadata::CompressionAlgorithm::None,
                    Some("gzip") => metadata::CompressionAlgorithm::Gzip,
                    _ => return Err(bad()),
                }
            }
            "durability" => {
                config.durability = match option_text(e).as_deref() {
                    Some("replicated") => metadata::Durability::Replicated,
                    Some("persisted") => metadata::Durability::Persisted,
                    _ => return Err(bad()),
                }
            }
            "message_expiry" => {
                config.message_expiry =
                    metadata::MessageExpiry::from_wire(option_u64(e).ok_or_else(bad)?);
            }
            "max_topic_size" => {
                config.max_topic_size =
                    metadata::MaxTopicSize::from_wire(option_u64(e).ok_or_else(bad)?);
            }
            "segment_size" => match option_u64(e).ok_or_else(bad)? {
                0 => {}
                bytes => config.segment_size_bytes = bytes,
            },
            _ => {}
        }
    }
    Ok(config)
}

/// The settings an UPDATE_TOPIC names: `compression_algorithm`,
/// `message_expiry` and `max_topic_size` (Iggy 0.11's updatable keys);
/// any other key is refused by name rather than ignored.
fn topic_patch(options: &Options) -> BackendResult<metadata::TopicPatch> {
    let mut patch = metadata::TopicPatch::default();
    for e in &options.entries {
        let bad = || BackendError::InvalidOption(format!("{} has an unusable value", e.key));
        match e.key.as_str() {
            "compression_algorithm" => {
                patch.compression = Some(match option_text(e).as_deref() {
                    Some("none") => metadata::CompressionAlgorithm::None,
                    Some("gzip") => metadata::CompressionAlgorithm::Gzip,
                    _ => return Err(bad()),
                });
            }
            "message_expiry" => {
                patch.message_expiry = Some(metadata::MessageExpiry::from_wire(
                    option_u64(e).ok_or_else(bad)?,
                ));
            }
            "max_topic_size" => {
                patch.max_topic_size = Some(metadata::MaxTopicSize::from_wire(
                    option_u64(e).ok_or_else(bad)?,
                ));
            }
            key => return Err(BackendError::UnsupportedOptionKey(key.to_owned())),
        }
    }
    Ok(patch)
}

/// Option value kinds (the user-header kinds).
const KIND_STRING: u8 = 2;
const KIND_UINT8: u8 = 9;
const KIND_UINT64: u8 = 12;

fn option_text(e: &crate::protocol::OptionEntry) -> Option<String> {
    (e.value_kind == KIND_STRING)
        .then(|| std::str::from_utf8(&e.value).ok())
        .flatten()
        .map(|s| s.trim().to_ascii_lowercase())
}

/// An unsigned option: a little-endian u8..u64 of its width, or decimal
/// digits in a string.
fn option_u64(e: &crate::protocol::OptionEntry) -> Option<u64> {
    if (KIND_UINT8..=KIND_UINT64).contains(&e.value_kind) {
        let width = 1usize << (e.value_kind - KIND_UINT8);
        if e.value.len() != width {
            return None;
        }
        let mut le = [0u8; 8];
        le.get_mut(..width)?.copy_from_slice(&e.value);
        return Some(u64::from_le_bytes(le));
    }
    option_text(e)?.parse().ok()
}

fn committed(answer: Answer, what: &'static str) -> BackendResult<()> {
    match answer {
        Answer::Committed { .. } => Ok(()),
        _ => Err(unexpected(what)),
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A fresh 16-byte salt from the OS.
fn fresh_salt() -> BackendResult<[u8; 16]> {
    use std::io::Read;
    let mut salt = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut salt))
        .map_err(|e| BackendError::LocalFault(format!("reading a salt from /dev/urandom: {e}")))?;
    Ok(salt)
}

// ---------------------------------------------------------------------
// The one mapping of the planes' errors to the client's.
// ---------------------------------------------------------------------

/// A name carried by a refusal, as an identifier. Refused names came
/// from a protocol [`Name`], so the fallback (which only changes the code
/// from the name variant to the id variant) is never taken.
fn named(name: &str) -> Identifier {
    Name::new(name).map_or(Identifier::Numeric(u32::MAX), Identifier::Name)
}

fn existing(name: &str, make: fn(Name) -> BackendError) -> BackendError {
    match Name::new(name) {
        Some(n) => make(n),
        None => BackendError::LocalFault(format!("refused name {name:?}")),
    }
}

/// A committed refusal of the metadata state machine.
fn refused(r: Refusal) -> BackendError {
    use BackendError as B;
    match r {
        Refusal::InvalidCredentials => B::InvalidCredentials,
        Refusal::StreamIdNotFound(s) => B::StreamNotFound(Identifier::Numeric(s.0)),
        Refusal::StreamNameNotFound(n) => B::StreamNotFound(named(&n)),
        Refusal::StreamNameAlreadyExists(n) => existing(&n, B::StreamNameAlreadyExists),
        Refusal::TopicIdNotFound { topic, .. } => B::TopicNotFound(Identifier::Numeric(topic.0)),
        Refusal::TopicNameNotFound { topic, .. } => B::TopicNotFound(named(&topic)),
        Refusal::TopicNameAlreadyExists { topic, .. } => {
            existing(&topic, B::TopicNameAlreadyExists)
        }
        Refusal::InvalidPartitionsCount { count, .. } => B::InvalidPartitionsCount(count),
        Refusal::PartitionNotFound { partition, .. } => B::PartitionNotFound(partition),
        Refusal::ConsumerGroupIdNotFound { group, .. } => {
            B::ConsumerGroupNotFound(Identifier::Numeric(group.0))
        }
        Refusal::ConsumerGroupNameNotFound { group, .. } => B::ConsumerGroupNotFound(named(&group)),
        Refusal::ConsumerGroupNameAlreadyExists { group, .. } => {
            existing(&group, B::ConsumerGroupNameAlreadyExists)
        }
        Refusal::ConsumerGroupMemberNotFound { .. } => B::NotGroupMember,
        Refusal::ConsumerGroupPartitionNotOwned { partition, .. } => {
            B::PartitionNotOwned(partition)
        }
        // The codec already enforces 1..=255-byte names; a topic setting
        // out of range is the client's option value.
        r @ (Refusal::InvalidName { .. } | Refusal::InvalidTopicConfig) => {
            B::InvalidOption(r.to_string())
        }
        // Ceilings and id spaces (Iggy answers its generic error, 1), and
        // user management, which no client command reaches yet.
        r @ (Refusal::IdsExhausted { .. }
        | Refusal::LimitReached { .. }
        | Refusal::UserAlreadyExists(_)
        | Refusal::UserNotFound(_)
        | Refusal::CannotDeleteRootUser
        | Refusal::InvalidPasswordHash) => B::LocalFault(r.to_string()),
    }
}

/// A metadata op or query that was not carried out.
pub(crate) fn meta_failed(e: MetaError) -> BackendError {
    match e {
        MetaError::Refused(r) => refused(r),
        // No primary here or a view change: Iggy's 58, which the SDK
        // retries (possibly elsewhere).
        MetaError::NotPrimary { .. } | MetaError::Unavailable { .. } => BackendError::NoPrimary,
        // May or may not commit: 57, retried on this connection.
        MetaError::Indeterminate { .. } => BackendError::NotCommitted,
        MetaError::Local { reason } => BackendError::LocalFault(reason),
        MetaError::NotHosted => {
            BackendError::LocalFault("shard 0 does not host the metadata group".into())
        }
    }
}

/// The partitions a purge covers: a topic's, or every topic's of a stream.
enum PurgeScope {
    Topic(metadata::Identifier, metadata::Identifier),
    Stream(metadata::Identifier),
}

/// Each partition group `scope` names, with the purge generation the
/// applied metadata holds for it. A stream or topic gone since the purge
/// committed names none: nothing is left to purge.
fn purge_targets(state: &MetadataState, scope: &PurgeScope) -> Vec<(GroupId, u64)> {
    // The stream, and the topic unless the whole stream was purged.
    let resolved = match scope {
        PurgeScope::Topic(stream, topic) => state
            .resolve_topic(stream, topic)
            .map(|(s, t)| (s, Some(t))),
        PurgeScope::Stream(stream) => state.resolve_stream(stream).map(|s| (s, None)),
    };
    let Ok((stream, topic)) = resolved else {
        return Vec::new();
    };
    state
        .partition_groups()
        .into_iter()
        .filter(|i| {
            i.purge_generation > 0 && i.stream == stream && topic.is_none_or(|t| i.topic == t)
        })
        .map(|i| (i.group, i.purge_generation))
        .collect()
}

/// A forwarded request without an answer: nothing was sent, or the
/// outcome is unknown. Both are worth a retry (58); a replicated call
/// whose outcome is unknown is mapped by the caller (57).
fn forward_failed(e: &ForwardError) -> BackendError {
    match e {
        ForwardError::NotConnected | ForwardError::Lost | ForwardError::Timeout => {
            BackendError::NoPrimary
        }
        ForwardError::Codec(c) => BackendError::LocalFault(format!("forwarding: {c}")),
    }
}

/// A partition call that was not carried out.
pub(crate) fn call_failed(e: CallError) -> BackendError {
    match e {
        CallError::NotPrimary { .. } | CallError::Unavailable { .. } | CallError::Overloaded => {
            BackendError::NoPrimary
        }
        // The committed metadata names the group (the call was routed by
        // it), so this replica has not created it yet (the create effect
        // is on its way to the owning shard) or is behind: retry, as for
        // a missing primary. A group truly gone fails the next routing
        // with its not-found code.
        CallError::UnknownGroup { .. } => BackendError::NoPrimary,
        CallError::Indeterminate { .. } => BackendError::NotCommitted,
        CallError::AlreadyApplied { .. } => BackendError::AlreadyApplied,
        CallError::ReplayUnplaced { since } => BackendError::ReplayUnplaced { since },
        // The status table has no closer client-fault code for a request
        // the partition refuses (an offset past the end); the sentence
        // names the cause.
        CallError::Rejected { reason } => BackendError::InvalidOption(reason),
        CallError::Fenced { reason } | CallError::Local { reason } => {
            BackendError::LocalFault(reason)
        }
        // A full disk is this node's fault, not the client's, and not
        // transient at once. Iggy's closest code is 4006
        // (CannotSaveMessagesToSegment), which needs its own BackendError
        // variant (session::backend, not this file); until then the
        // sentence names the partition directory and the full disk, and
        // the partition's `disk full` warning is logged once.
        CallError::NoSpace { reason } => BackendError::NoSpace(reason),
    }
}

/// A batch the partition returned that does not decode: this replica's
/// fault (its storage or journal), never the client's.
fn stored_batch(e: storage::BatchError) -> BackendError {
    BackendError::LocalFault(format!("a stored batch does not decode: {e}"))
}

/// An answer of the wrong kind for its call: a shard bug, answered rather
/// than trusted.
fn unexpected(what: &'static str) -> BackendError {
    BackendError::LocalFault(format!("unexpected answer to {what}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::protocol::OptionEntry;

    fn entry(key: &str, value_kind: u8, value: &[u8]) -> OptionEntry {
        OptionEntry {
            key: key.to_owned(),
            value_kind,
            value: value.to_vec(),
        }
    }

    #[test]
    fn given_known_and_unknown_options_when_read_should_set_the_known_and_ignore_the_rest() {
        let options = Options {
            entries: vec![
                entry("compression_algorithm", KIND_STRING, b"gzip"),
                entry("durability", KIND_STRING, b"persisted"),
                entry("message_expiry", KIND_UINT64, &5_000u64.to_le_bytes()),
                entry("max_topic_size", KIND_STRING, b"4096"),
                entry("segment_size", KIND_UINT64, &0u64.to_le_bytes()),
                entry("consumer_offset_durability", KIND_STRING, b"replicated"),
            ],
        };
        let c = topic_config(&options, &TopicConfig::default()).unwrap();
        assert_eq!(c.compression, metadata::CompressionAlgorithm::Gzip);
        assert_eq!(c.durability, metadata::Durability::Persisted);
        assert_eq!(
            c.message_expiry,
            metadata::MessageExpiry::After { micros: 5_000 }
        );
        assert_eq!(
            c.max_topic_size,
            metadata::MaxTopicSize::Bytes { bytes: 4096 }
        );
        assert_eq!(
            c.segment_size_bytes,
            TopicConfig::default().segment_size_bytes
        );
    }

    #[test]
    fn given_an_unusable_known_option_when_read_should_refuse_the_create() {
        for bad in [
            entry("durability", KIND_STRING, b"quorum"),
            entry("compression_algorithm", KIND_UINT8, &[1]),
            entry("message_expiry", KIND_STRING, b"7 days"),
            entry("max_topic_size", KIND_UINT64, &[1, 2, 3]),
        ] {
            let options = Options {
                entries: vec![bad.clone()],
            };
            assert!(
                matches!(
                    topic_config(&options, &TopicConfig::default()),
                    Err(BackendError::InvalidOption(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn given_the_planes_errors_when_mapped_should_keep_their_class_and_code() {
        use crate::session::ErrorClass;
        use crate::status::ErrorCode;
        let code = |e: &BackendError| ErrorCode::from(e).code();
        assert_eq!(
            code(&refused(Refusal::StreamNameNotFound("s".into()))),
            1010
        );
        assert_eq!(
            code(&refused(Refusal::StreamIdNotFound(common::StreamId(3)))),
            1009
        );
        assert_eq!(
            code(&refused(Refusal::ConsumerGroupNameAlreadyExists {
                group: "g".into(),
                topic: common::TopicId(0),
            })),
            5004
        );
        for transient in [
            CallError::Overloaded,
            CallError::Unavailable { reason: "x" },
            CallError::UnknownGroup { group: GroupId(9) },
        ] {
            let e = call_failed(transient);
            assert_eq!(e.class(), ErrorClass::Transient);
            assert_eq!(code(&e), 58);
        }
        assert_eq!(
            call_failed(CallError::Indeterminate { reason: "x" }).class(),
            ErrorClass::Transient
        );
        assert_eq!(
            call_failed(CallError::Local {
                reason: "disk".into()
            })
            .class(),
            ErrorClass::Local
        );
        assert_eq!(
            code(&meta_failed(MetaError::Unavailable { reason: "x" })),
            58
        );
        assert_eq!(
            code(&meta_failed(MetaError::Refused(
                Refusal::InvalidCredentials
            ))),
            42
        );
    }
}
