//! [`MetadataState`]: the metadata plane's state machine — streams, topics,
//! partitions, consumer groups, users and purge generations — and its
//! deterministic `apply`.
//!
//! Determinism: only ordered maps, no clock, no randomness, no hashing of
//! passwords; every replica applying the same ops in the same order holds
//! equal states (`PartialEq` compares them whole). Refusal: each handler
//! validates everything it needs with shared borrows first and mutates only
//! after, so a refused op leaves the state exactly as it was.
//!
//! Ids: streams from 0, topics from 0 within their stream, consumer groups
//! from 0 within their topic, users from 0 (the root user), each from a
//! counter kept in the state and never handed out twice (a deleted id is
//! not reused, so a stale request by id cannot hit a newer object).
//! Partitions are `0..partitions_count` within their topic, as Iggy has
//! them. Every partition gets a [`GroupId`] from the state's group counter
//! (from 1, never reused after a delete, so a dead partition's group can
//! never be confused with a new one) and an incarnation: the op that
//! created it.

use std::collections::BTreeMap;

use common::{GroupId, Op, PartitionId, StreamId, TopicId};

use crate::consumer_group::{ConsumerGroup, ConsumerGroupId, SessionId};
use crate::effect::{PartitionEffect, PartitionGroupConfig};
use crate::identifier::{Identifier, NameKind, check_name};
use crate::op::MetadataOp;
use crate::refusal::Refusal;
use crate::topic_config::TopicConfig;
use crate::user::{PasswordHash, ROOT_USER, User, UserId};

/// Partitions per topic at most (Iggy's `MAX_PARTITIONS_COUNT`).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1000;
/// Streams at most.
pub const STREAMS_MAX: u32 = 100_000;
/// Topics per stream at most.
pub const TOPICS_PER_STREAM_MAX: u32 = 10_000;
/// Consumer groups per topic at most.
pub const CONSUMER_GROUPS_PER_TOPIC_MAX: u32 = 10_000;
/// Members per consumer group at most.
pub const MEMBERS_PER_GROUP_MAX: u32 = 10_000;
/// Users at most.
pub const USERS_MAX: u32 = 10_000;
/// The partition group counter stays below this (52 bits: far from the
/// metadata group's top bit).
pub const GROUP_COUNTER_MAX: u64 = 1 << 52;

/// A partition of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Its id in the topic.
    pub id: PartitionId,
    /// Its consensus group (never reused).
    pub group: GroupId,
    /// The op that created it.
    pub incarnation: u64,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// The committed purge generation (0 until the first purge).
    pub purge_generation: u64,
}

/// A topic of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// Its id in the stream.
    pub id: TopicId,
    /// Its name, unique in the stream.
    pub name: String,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// Its settings.
    pub config: TopicConfig,
    /// Its partitions, ids `0..len`.
    pub partitions: BTreeMap<PartitionId, Partition>,
    /// The next consumer group id.
    pub next_consumer_group_id: u32,
    /// Its consumer groups.
    pub consumer_groups: BTreeMap<ConsumerGroupId, ConsumerGroup>,
}

impl Topic {
    fn partition_ids(&self) -> Vec<PartitionId> {
        self.partitions.keys().copied().collect()
    }

    /// The settings each of its partition groups runs with.
    pub fn group_config(&self) -> PartitionGroupConfig {
        PartitionGroupConfig::of(&self.config, self.partitions.len())
    }

    /// Reconfigures every partition group when their settings changed
    /// from `before` (the topic's settings, or its partition count,
    /// which divides the size ceiling).
    fn reconfigure_if_changed(&self, before: PartitionGroupConfig) -> Vec<PartitionEffect> {
        let config = self.group_config();
        if config == before {
            return Vec::new();
        }
        self.partitions
            .values()
            .map(|p| PartitionEffect::ReconfigurePartitionGroup {
                group: p.group,
                config,
            })
            .collect()
    }

    /// The consumer group an identifier names.
    pub fn resolve_consumer_group(&self, id: &Identifier) -> Result<ConsumerGroupId, Refusal> {
        match id {
            Identifier::Numeric(n) => {
                let g = ConsumerGroupId(*n);
                if self.consumer_groups.contains_key(&g) {
                    Ok(g)
                } else {
                    Err(Refusal::ConsumerGroupIdNotFound {
                        group: g,
                        topic: self.id,
                    })
                }
            }
            Identifier::Name(name) => self
                .consumer_groups
                .values()
                .find(|g| &g.name == name)
                .map(|g| g.id)
                .ok_or_else(|| Refusal::ConsumerGroupNameNotFound {
                    group: name.clone(),
                    topic: self.id,
                }),
        }
    }
}

/// A stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Its id.
    pub id: StreamId,
    /// Its name, unique among streams.
    pub name: String,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// The next topic id.
    pub next_topic_id: u32,
    /// Its topics.
    pub topics: BTreeMap<TopicId, Topic>,
}

impl Stream {
    /// The topic an identifier names.
    pub fn resolve_topic(&self, id: &Identifier) -> Result<TopicId, Refusal> {
        match id {
            Identifier::Numeric(n) => {
                let t = TopicId(*n);
                if self.topics.contains_key(&t) {
                    Ok(t)
                } else {
                    Err(Refusal::TopicIdNotFound {
                        topic: t,
                        stream: self.id,
                    })
                }
            }
            Identifier::Name(name) => self
                .topics
                .values()
                .find(|t| &t.name == name)
                .map(|t| t.id)
                .ok_or_else(|| Refusal::TopicNameNotFound {
                    topic: name.clone(),
                    stream: self.id,
                }),
        }
    }

    fn topic_name_taken(&self, name: &str, except: Option<TopicId>) -> bool {
        self.topics
            .values()
            .any(|t| t.name == name && Some(t.id) != except)
    }
}

/// What an accepted op did, for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A stream was created.
    StreamCreated(StreamId),
    /// A topic was created.
    TopicCreated(StreamId, TopicId),
    /// A consumer group was created.
    ConsumerGroupCreated(StreamId, TopicId, ConsumerGroupId),
    /// A user was created.
    UserCreated(UserId),
    /// Anything else that was accepted.
    Done,
}

/// An accepted op: its outcome and the partition plane's effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// What it did.
    pub outcome: Outcome,
    /// What the partition plane must do, in order.
    pub effects: Vec<PartitionEffect>,
}

impl Applied {
    fn done(effects: Vec<PartitionEffect>) -> Self {
        Self {
            outcome: Outcome::Done,
            effects,
        }
    }
}

/// Why `apply` did not apply an op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyError {
    /// The op was committed and refused: every replica refuses it, nothing
    /// changed, the client gets [`Refusal::iggy_code`].
    Refused(Refusal),
    /// The op is at or below the last applied op: applying it again would
    /// repeat its effects. Nothing changed.
    AlreadyApplied {
        /// The op offered.
        op: Op,
        /// The last op applied.
        applied: Op,
    },
    /// The op skips ahead of `applied + 1`: an op is missing. Nothing
    /// changed.
    Gap {
        /// The op offered.
        op: Op,
        /// The op expected.
        expected: Op,
    },
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(r) => write!(f, "refused: {r}"),
            Self::AlreadyApplied { op, applied } => {
                write!(f, "op {} is at or below the applied op {}", op.0, applied.0)
            }
            Self::Gap { op, expected } => {
                write!(
                    f,
                    "op {} skips ahead of the expected op {}",
                    op.0, expected.0
                )
            }
        }
    }
}

impl std::error::Error for ApplyError {}

impl From<Refusal> for ApplyError {
    fn from(r: Refusal) -> Self {
        Self::Refused(r)
    }
}

/// A live partition group, for the shard's reconciliation at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionGroupInfo {
    /// The group.
    pub group: GroupId,
    /// Its stream.
    pub stream: StreamId,
    /// Its topic.
    pub topic: TopicId,
    /// Its partition id.
    pub partition: PartitionId,
    /// The op that created it.
    pub incarnation: u64,
    /// Its committed purge generation.
    pub purge_generation: u64,
    /// Its settings.
    pub config: PartitionGroupConfig,
}

/// The metadata plane's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataState {
    pub(crate) applied: Op,
    /// The VSR identity of the applied op's prepare (0 outside
    /// replication): a restarted replica's hash chain continues from it.
    pub(crate) applied_identity: u128,
    pub(crate) next_stream_id: u32,
    pub(crate) next_group: u64,
    pub(crate) next_user_id: u32,
    pub(crate) streams: BTreeMap<StreamId, Stream>,
    pub(crate) users: BTreeMap<UserId, User>,
}

impl MetadataState {
    /// An empty state: nothing applied, no users (the root user comes from
    /// configuration through a committed [`MetadataOp::CreateUser`], so that
    /// every replica stores the same hash).
    pub fn new() -> Self {
        Self {
            next_group: 1,
            ..Self::default()
        }
    }

    /// The last op applied (accepted or refused).
    pub const fn applied(&self) -> Op {
        self.applied
    }

    /// The VSR identity of the applied op's prepare (0 when not recorded).
    pub const fn applied_identity(&self) -> u128 {
        self.applied_identity
    }

    /// Records the applied op's prepare identity (the store does, after
    /// applying a committed prepare).
    pub(crate) fn set_applied_identity(&mut self, identity: u128) {
        self.applied_identity = identity;
    }

    /// The streams by id.
    pub const fn streams(&self) -> &BTreeMap<StreamId, Stream> {
        &self.streams
    }

    /// The users by id.
    pub const fn users(&self) -> &BTreeMap<UserId, User> {
        &self.users
    }

    /// Whether two states are equal in everything but the applied op: what
    /// a refused op must leave unchanged (id counters included).
    pub fn eq_ignoring_applied(&self, other: &Self) -> bool {
        self.next_stream_id == other.next_stream_id
            && self.next_group == other.next_group
            && self.next_user_id == other.next_user_id
            && self.streams == other.streams
            && self.users == other.users
    }

    /// The next partition group id the counter will hand out.
    pub const fn next_group(&self) -> u64 {
        self.next_group
    }

    /// The stream an identifier names.
    pub fn resolve_stream(&self, id: &Identifier) -> Result<StreamId, Refusal> {
        match id {
            Identifier::Numeric(n) => {
                if self.streams.contains_key(&StreamId(*n)) {
                    Ok(StreamId(*n))
                } else {
                    Err(Refusal::StreamIdNotFound(StreamId(*n)))
                }
            }
            Identifier::Name(name) => self
                .streams
                .values()
                .find(|s| &s.name == name)
                .map(|s| s.id)
                .ok_or_else(|| Refusal::StreamNameNotFound(name.clone())),
        }
    }

    /// The stream and topic two identifiers name.
    pub fn resolve_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<(StreamId, TopicId), Refusal> {
        let s = self.resolve_stream(stream)?;
        let t = self.streams[&s].resolve_topic(topic)?;
        Ok((s, t))
    }

    /// The user an identifier names.
    pub fn resolve_user(&self, id: &Identifier) -> Result<UserId, Refusal> {
        match id {
            Identifier::Numeric(n) if self.users.contains_key(&UserId(*n)) => Ok(UserId(*n)),
            Identifier::Name(name) => self
                .users
                .values()
                .find(|u| &u.username == name)
                .map(|u| u.id)
                .ok_or_else(|| Refusal::UserNotFound(id.clone())),
            Identifier::Numeric(_) => Err(Refusal::UserNotFound(id.clone())),
        }
    }

    /// Every partition group that should exist, in (stream, topic,
    /// partition) order.
    pub fn partition_groups(&self) -> Vec<PartitionGroupInfo> {
        let mut out = Vec::new();
        for s in self.streams.values() {
            for t in s.topics.values() {
                for p in t.partitions.values() {
                    out.push(PartitionGroupInfo {
                        group: p.group,
                        stream: s.id,
                        topic: t.id,
                        partition: p.id,
                        incarnation: p.incarnation,
                        purge_generation: p.purge_generation,
                        config: t.group_config(),
                    });
                }
            }
        }
        out
    }

    fn topic_mut(&mut self, s: StreamId, t: TopicId) -> &mut Topic {
        self.streams
            .get_mut(&s)
            .and_then(|st| st.topics.get_mut(&t))
            .expect("resolved topic exists")
    }

    /// Applies committed op `op`. It must be the op after [`Self::applied`].
    /// A refused op advances `applied` and changes nothing else.
    pub fn apply(&mut self, op: Op, body: &MetadataOp) -> Result<Applied, ApplyError> {
        if op <= self.applied {
            return Err(ApplyError::AlreadyApplied {
                op,
                applied: self.applied,
            });
        }
        let expected = Op(self.applied.0 + 1);
        if op != expected {
            return Err(ApplyError::Gap { op, expected });
        }
        let result = self.apply_body(op, body);
        self.applied = op;
        if cfg!(debug_assertions) {
            self.invariants();
        }
        result.map_err(ApplyError::Refused)
    }

    /// Occupies committed op `op` without changing anything else: a
    /// client Register, or a request the client table recognised as
    /// already committed. Same ordering rules as [`Self::apply`].
    pub fn skip(&mut self, op: Op) -> Result<(), ApplyError> {
        if op <= self.applied {
            return Err(ApplyError::AlreadyApplied {
                op,
                applied: self.applied,
            });
        }
        let expected = Op(self.applied.0 + 1);
        if op != expected {
            return Err(ApplyError::Gap { op, expected });
        }
        self.applied = op;
        Ok(())
    }

    /// Applies one op's body: the step for its kind, below in the order of
    /// the match (streams, topics, partitions, consumer groups, users).
    fn apply_body(&mut self, op: Op, body: &MetadataOp) -> Result<Applied, Refusal> {
        match body {
            MetadataOp::CreateStream {
                name,
                created_at_us,
            } => self.create_stream(name, *created_at_us),
            MetadataOp::UpdateStream { stream, name } => self.update_stream(stream, name),
            MetadataOp::DeleteStream { stream } => self.delete_stream(stream),
            MetadataOp::PurgeStream { stream } => self.purge_stream(stream),
            MetadataOp::CreateTopic {
                stream,
                name,
                partitions_count,
                config,
                created_at_us,
            } => self.create_topic(op, stream, name, *partitions_count, config, *created_at_us),
            MetadataOp::UpdateTopic {
                stream,
                topic,
                name,
                config,
            } => self.update_topic(stream, topic, name, |_| *config),
            MetadataOp::PatchTopic {
                stream,
                topic,
                name,
                patch,
            } => self.update_topic(stream, topic, name, |current| patch.apply_to(current)),
            MetadataOp::DeleteTopic { stream, topic } => self.delete_topic(stream, topic),
            MetadataOp::PurgeTopic { stream, topic } => self.purge_one_topic(stream, topic),
            MetadataOp::CreatePartitions {
                stream,
                topic,
                count,
                created_at_us,
            } => self.create_partitions(op, stream, topic, *count, *created_at_us),
            MetadataOp::DeletePartitions {
                stream,
                topic,
                count,
            } => self.delete_partitions(stream, topic, *count),
            MetadataOp::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => self.create_consumer_group(stream, topic, name),
            MetadataOp::DeleteConsumerGroup {
                stream,
                topic,
                group,
            } => self.delete_consumer_group(stream, topic, group),
            MetadataOp::JoinConsumerGroup {
                stream,
                topic,
                group,
                session,
            } => self.join_consumer_group(stream, topic, group, *session),
            MetadataOp::LeaveConsumerGroup {
                stream,
                topic,
                group,
                session,
            } => self.leave_consumer_group(stream, topic, group, *session),
            MetadataOp::EndSession { session } => Ok(self.end_session(*session)),
            MetadataOp::CreateUser {
                username,
                password_hash,
                created_at_us,
            } => self.create_user(username, password_hash, *created_at_us),
            MetadataOp::DeleteUser { user } => self.delete_user(user),
            MetadataOp::ChangePassword {
                user,
                password_hash,
            } => self.change_password(user, password_hash),
        }
    }

    fn create_stream(&mut self, name: &str, created_at_us: u64) -> Result<Applied, Refusal> {
        check_name(NameKind::Stream, name)?;
        if self.streams.values().any(|s| s.name == name) {
            return Err(Refusal::StreamNameAlreadyExists(name.to_owned()));
        }
        if self.streams.len() as u32 >= STREAMS_MAX {
            return Err(Refusal::LimitReached {
                what: "streams",
                max: STREAMS_MAX,
            });
        }
        let id = StreamId(self.next_stream_id);
        self.next_stream_id = self
            .next_stream_id
            .checked_add(1)
            .ok_or(Refusal::IdsExhausted { what: "stream" })?;
        self.streams.insert(
            id,
            Stream {
                id,
                name: name.to_owned(),
                created_at_us,
                next_topic_id: 0,
                topics: BTreeMap::new(),
            },
        );
        Ok(Applied {
            outcome: Outcome::StreamCreated(id),
            effects: Vec::new(),
        })
    }

    fn update_stream(&mut self, stream: &Identifier, name: &str) -> Result<Applied, Refusal> {
        check_name(NameKind::Stream, name)?;
        let s = self.resolve_stream(stream)?;
        if self.streams.values().any(|x| x.name == name && x.id != s) {
            return Err(Refusal::StreamNameAlreadyExists(name.to_owned()));
        }
        if let Some(st) = self.streams.get_mut(&s) {
            name.clone_into(&mut st.name);
        }
        Ok(Applied::done(Vec::new()))
    }

    /// Removes the stream; every partition group of its topics is deleted.
    fn delete_stream(&mut self, stream: &Identifier) -> Result<Applied, Refusal> {
        let s = self.resolve_stream(stream)?;
        let removed = self.streams.remove(&s).expect("resolved");
        let effects = removed
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .map(|p| PartitionEffect::DeletePartitionGroup { group: p.group })
            .collect();
        Ok(Applied::done(effects))
    }

    /// Purges every partition of every topic of the stream.
    fn purge_stream(&mut self, stream: &Identifier) -> Result<Applied, Refusal> {
        let s = self.resolve_stream(stream)?;
        let st = self.streams.get_mut(&s).expect("resolved");
        let effects = st.topics.values_mut().flat_map(purge_topic).collect();
        Ok(Applied::done(effects))
    }

    fn create_topic(
        &mut self,
        op: Op,
        stream: &Identifier,
        name: &str,
        partitions_count: u32,
        config: &TopicConfig,
        created_at_us: u64,
    ) -> Result<Applied, Refusal> {
        check_name(NameKind::Topic, name)?;
        check_config(config)?;
        let s = self.resolve_stream(stream)?;
        let st = &self.streams[&s];
        if st.topic_name_taken(name, None) {
            return Err(Refusal::TopicNameAlreadyExists {
                topic: name.to_owned(),
                stream: s,
            });
        }
        if partitions_count > PARTITIONS_PER_TOPIC_MAX {
            return Err(Refusal::InvalidPartitionsCount {
                count: partitions_count,
                max: PARTITIONS_PER_TOPIC_MAX,
            });
        }
        if st.topics.len() as u32 >= TOPICS_PER_STREAM_MAX {
            return Err(Refusal::LimitReached {
                what: "topics per stream",
                max: TOPICS_PER_STREAM_MAX,
            });
        }
        let next_topic_id = st
            .next_topic_id
            .checked_add(1)
            .ok_or(Refusal::IdsExhausted { what: "topic" })?;
        self.check_groups_available(u64::from(partitions_count))?;
        // Validated: mutate.
        let st = self.streams.get_mut(&s).expect("resolved");
        let t = TopicId(st.next_topic_id);
        st.next_topic_id = next_topic_id;
        st.topics.insert(
            t,
            Topic {
                id: t,
                name: name.to_owned(),
                created_at_us,
                config: *config,
                partitions: BTreeMap::new(),
                next_consumer_group_id: 0,
                consumer_groups: BTreeMap::new(),
            },
        );
        let effects = self.add_partitions(op, s, t, partitions_count, created_at_us);
        Ok(Applied {
            outcome: Outcome::TopicCreated(s, t),
            effects,
        })
    }

    fn check_groups_available(&self, count: u64) -> Result<(), Refusal> {
        if self.next_group + count > GROUP_COUNTER_MAX {
            return Err(Refusal::IdsExhausted {
                what: "partition group",
            });
        }
        Ok(())
    }

    /// Renames a topic and gives it the settings `config` makes of its
    /// current ones; every partition group is reconfigured if what it
    /// runs with changed.
    fn update_topic(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
        config: impl FnOnce(&TopicConfig) -> TopicConfig,
    ) -> Result<Applied, Refusal> {
        check_name(NameKind::Topic, name)?;
        let (s, t) = self.resolve_topic(stream, topic)?;
        let config = config(&self.streams[&s].topics[&t].config);
        check_config(&config)?;
        if self.streams[&s].topic_name_taken(name, Some(t)) {
            return Err(Refusal::TopicNameAlreadyExists {
                topic: name.to_owned(),
                stream: s,
            });
        }
        let tp = self.topic_mut(s, t);
        let before = tp.group_config();
        name.clone_into(&mut tp.name);
        tp.config = config;
        Ok(Applied::done(tp.reconfigure_if_changed(before)))
    }

    /// Removes the topic; each of its partition groups is deleted.
    fn delete_topic(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Applied, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let st = self.streams.get_mut(&s).expect("resolved");
        let removed = st.topics.remove(&t).expect("resolved");
        let effects = removed
            .partitions
            .values()
            .map(|p| PartitionEffect::DeletePartitionGroup { group: p.group })
            .collect();
        Ok(Applied::done(effects))
    }

    /// Purges every partition of the topic (see [`purge_topic`]).
    fn purge_one_topic(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Applied, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        Ok(Applied::done(purge_topic(self.topic_mut(s, t))))
    }

    /// Appends `count` partitions (validated by the caller) and rebalances
    /// the topic's consumer groups.
    fn add_partitions(
        &mut self,
        op: Op,
        s: StreamId,
        t: TopicId,
        count: u32,
        created_at_us: u64,
    ) -> Vec<PartitionEffect> {
        let mut next_group = self.next_group;
        let tp = self.topic_mut(s, t);
        let before = tp.group_config();
        let existing: Vec<GroupId> = tp.partitions.values().map(|p| p.group).collect();
        let first = tp.partitions.len() as u32;
        let mut created = Vec::with_capacity(count as usize);
        for id in first..first + count {
            let group = GroupId(next_group);
            next_group += 1;
            let p = Partition {
                id: PartitionId(id),
                group,
                incarnation: op.0,
                created_at_us,
                purge_generation: 0,
            };
            tp.partitions.insert(p.id, p);
            created.push((group, p.id));
        }
        // The size ceiling is now shared by more partitions: the existing
        // ones get their smaller share, the new ones start with it.
        let cfg = tp.group_config();
        let mut effects = Vec::with_capacity(existing.len() + created.len());
        if cfg != before {
            effects.extend(
                existing
                    .into_iter()
                    .map(|group| PartitionEffect::ReconfigurePartitionGroup { group, config: cfg }),
            );
        }
        effects.extend(created.into_iter().map(|(group, partition)| {
            PartitionEffect::CreatePartitionGroup {
                group,
                stream: s,
                topic: t,
                partition,
                incarnation: op.0,
                config: cfg,
            }
        }));
        let ids = tp.partition_ids();
        for g in tp.consumer_groups.values_mut() {
            g.rebalance(&ids);
        }
        self.next_group = next_group;
        effects
    }

    /// Adds `count` partitions, within the per-topic ceiling and the
    /// groups still available.
    fn create_partitions(
        &mut self,
        op: Op,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
        created_at_us: u64,
    ) -> Result<Applied, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let have = self.streams[&s].topics[&t].partitions.len() as u32;
        let room = PARTITIONS_PER_TOPIC_MAX - have;
        if count == 0 || count > room {
            return Err(Refusal::InvalidPartitionsCount { count, max: room });
        }
        self.check_groups_available(u64::from(count))?;
        let effects = self.add_partitions(op, s, t, count, created_at_us);
        Ok(Applied::done(effects))
    }

    /// Removes the last `count` partitions; the rest are reconfigured if
    /// their share of the topic's settings changed, and the consumer groups
    /// rebalanced over them.
    fn delete_partitions(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
    ) -> Result<Applied, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let tp = self.topic_mut(s, t);
        let have = tp.partitions.len() as u32;
        if count == 0 || count > have {
            return Err(Refusal::InvalidPartitionsCount { count, max: have });
        }
        let before = tp.group_config();
        let mut effects = Vec::new();
        for _ in 0..count {
            if let Some((_, p)) = tp.partitions.pop_last() {
                effects.push(PartitionEffect::DeletePartitionGroup { group: p.group });
            }
        }
        // The ceiling is now shared by fewer partitions.
        effects.extend(tp.reconfigure_if_changed(before));
        let ids = tp.partition_ids();
        for g in tp.consumer_groups.values_mut() {
            g.rebalance(&ids);
        }
        Ok(Applied::done(effects))
    }

    fn create_consumer_group(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
    ) -> Result<Applied, Refusal> {
        check_name(NameKind::ConsumerGroup, name)?;
        let (s, t) = self.resolve_topic(stream, topic)?;
        let tp = self.topic_mut(s, t);
        if tp.consumer_groups.values().any(|g| g.name == name) {
            return Err(Refusal::ConsumerGroupNameAlreadyExists {
                group: name.to_owned(),
                topic: t,
            });
        }
        if tp.consumer_groups.len() as u32 >= CONSUMER_GROUPS_PER_TOPIC_MAX {
            return Err(Refusal::LimitReached {
                what: "consumer groups per topic",
                max: CONSUMER_GROUPS_PER_TOPIC_MAX,
            });
        }
        let id = ConsumerGroupId(tp.next_consumer_group_id);
        tp.next_consumer_group_id =
            tp.next_consumer_group_id
                .checked_add(1)
                .ok_or(Refusal::IdsExhausted {
                    what: "consumer group",
                })?;
        tp.consumer_groups
            .insert(id, ConsumerGroup::new(id, name.to_owned()));
        Ok(Applied {
            outcome: Outcome::ConsumerGroupCreated(s, t, id),
            effects: Vec::new(),
        })
    }

    fn delete_consumer_group(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<Applied, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let tp = self.topic_mut(s, t);
        let g = tp.resolve_consumer_group(group)?;
        tp.consumer_groups.remove(&g);
        Ok(Applied::done(Vec::new()))
    }

    /// A topic's consumer group, resolved, with the id it resolved to and
    /// the topic's partition ids (what a join or leave rebalances over).
    fn consumer_group_mut(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<(ConsumerGroupId, Vec<PartitionId>, &mut ConsumerGroup), Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let tp = self.topic_mut(s, t);
        let g = tp.resolve_consumer_group(group)?;
        let ids = tp.partition_ids();
        let cg = tp.consumer_groups.get_mut(&g).expect("resolved");
        Ok((g, ids, cg))
    }

    /// Adds `session` to the group (a member already in it stays, and does
    /// not count against the ceiling) and rebalances the partitions.
    fn join_consumer_group(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
        session: SessionId,
    ) -> Result<Applied, Refusal> {
        let (_, ids, cg) = self.consumer_group_mut(stream, topic, group)?;
        if cg.member_of(session).is_none() && cg.members.len() as u32 >= MEMBERS_PER_GROUP_MAX {
            return Err(Refusal::LimitReached {
                what: "members per consumer group",
                max: MEMBERS_PER_GROUP_MAX,
            });
        }
        if !cg.join(session, &ids) {
            return Err(Refusal::IdsExhausted { what: "member" });
        }
        Ok(Applied::done(Vec::new()))
    }

    fn leave_consumer_group(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
        session: SessionId,
    ) -> Result<Applied, Refusal> {
        let (g, ids, cg) = self.consumer_group_mut(stream, topic, group)?;
        if !cg.leave(session, &ids) {
            return Err(Refusal::ConsumerGroupMemberNotFound { session, group: g });
        }
        Ok(Applied::done(Vec::new()))
    }

    /// An ended session leaves every consumer group it was in; it is
    /// never refused, since a session may end that joined nothing.
    fn end_session(&mut self, session: SessionId) -> Applied {
        for st in self.streams.values_mut() {
            for tp in st.topics.values_mut() {
                let ids = tp.partition_ids();
                for cg in tp.consumer_groups.values_mut() {
                    cg.leave(session, &ids);
                }
            }
        }
        Applied::done(Vec::new())
    }

    fn create_user(
        &mut self,
        username: &str,
        password_hash: &PasswordHash,
        created_at_us: u64,
    ) -> Result<Applied, Refusal> {
        check_name(NameKind::User, username)?;
        check_hash(password_hash)?;
        if self.users.values().any(|u| u.username == username) {
            return Err(Refusal::UserAlreadyExists(username.to_owned()));
        }
        if self.users.len() as u32 >= USERS_MAX {
            return Err(Refusal::LimitReached {
                what: "users",
                max: USERS_MAX,
            });
        }
        let id = UserId(self.next_user_id);
        self.next_user_id = self
            .next_user_id
            .checked_add(1)
            .ok_or(Refusal::IdsExhausted { what: "user" })?;
        self.users.insert(
            id,
            User {
                id,
                username: username.to_owned(),
                password_hash: password_hash.clone(),
                created_at_us,
            },
        );
        Ok(Applied {
            outcome: Outcome::UserCreated(id),
            effects: Vec::new(),
        })
    }

    /// Removes a user; the root user cannot be removed.
    fn delete_user(&mut self, user: &Identifier) -> Result<Applied, Refusal> {
        let u = self.resolve_user(user)?;
        if u == ROOT_USER {
            return Err(Refusal::CannotDeleteRootUser);
        }
        self.users.remove(&u);
        Ok(Applied::done(Vec::new()))
    }

    fn change_password(
        &mut self,
        user: &Identifier,
        password_hash: &PasswordHash,
    ) -> Result<Applied, Refusal> {
        let u = self.resolve_user(user)?;
        check_hash(password_hash)?;
        if let Some(x) = self.users.get_mut(&u) {
            x.password_hash = password_hash.clone();
        }
        Ok(Applied::done(Vec::new()))
    }

    /// Asserts the state's invariants (called after every apply in debug
    /// builds, and by the snapshot decoder's tests).
    ///
    /// # Panics
    /// If an invariant does not hold: a bug in this crate.
    pub fn invariants(&self) {
        if let Err(e) = self.check_invariants() {
            panic!("metadata state invariant violated: {e}");
        }
    }

    /// The invariants as a check (the snapshot decoder refuses a state
    /// that fails it).
    pub(crate) fn check_invariants(&self) -> Result<(), &'static str> {
        let mut groups = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        if self.next_group == 0 || self.next_group > GROUP_COUNTER_MAX {
            return Err("partition group counter out of range");
        }
        for (id, s) in &self.streams {
            if *id != s.id || s.id.0 >= self.next_stream_id {
                return Err("stream id mismatch or beyond the counter");
            }
            if s.name.is_empty() || s.name.len() > 255 || !names.insert(s.name.as_str()) {
                return Err("stream name invalid or duplicated");
            }
            let mut topic_names = std::collections::BTreeSet::new();
            for (tid, t) in &s.topics {
                if *tid != t.id || t.id.0 >= s.next_topic_id {
                    return Err("topic id mismatch or beyond the counter");
                }
                if t.name.is_empty() || t.name.len() > 255 || !topic_names.insert(t.name.as_str()) {
                    return Err("topic name invalid or duplicated");
                }
                if t.partitions.len() as u32 > PARTITIONS_PER_TOPIC_MAX {
                    return Err("too many partitions");
                }
                for (i, (pid, p)) in t.partitions.iter().enumerate() {
                    if pid.0 as usize != i || p.id != *pid {
                        return Err("partition ids are not 0..count");
                    }
                    if p.group.0 == 0 || p.group.0 >= self.next_group || !groups.insert(p.group) {
                        return Err("partition group zero, beyond the counter or duplicated");
                    }
                    if p.incarnation > self.applied.0 {
                        return Err("partition incarnation beyond the applied op");
                    }
                }
                let mut group_names = std::collections::BTreeSet::new();
                for (gid, g) in &t.consumer_groups {
                    if *gid != g.id || g.id.0 >= t.next_consumer_group_id {
                        return Err("consumer group id mismatch or beyond the counter");
                    }
                    if g.name.is_empty() || g.name.len() > 255 || !group_names.insert(&g.name) {
                        return Err("consumer group name invalid or duplicated");
                    }
                    check_assignment(g, t)?;
                }
            }
        }
        let mut user_names = std::collections::BTreeSet::new();
        for (id, u) in &self.users {
            if *id != u.id || u.id.0 >= self.next_user_id {
                return Err("user id mismatch or beyond the counter");
            }
            if u.username.is_empty() || u.username.len() > 255 || !user_names.insert(&u.username) {
                return Err("username invalid or duplicated");
            }
        }
        Ok(())
    }
}

/// Every partition owned by exactly one member, counts within one, each
/// member's list ascending; sessions unique.
fn check_assignment(g: &ConsumerGroup, t: &Topic) -> Result<(), &'static str> {
    let mut owned = std::collections::BTreeSet::new();
    let mut sessions = std::collections::BTreeSet::new();
    let (mut lo, mut hi) = (usize::MAX, 0);
    for (mid, m) in &g.members {
        if *mid != m.id || m.id.0 >= g.next_member_id {
            return Err("member id mismatch or beyond the counter");
        }
        if !sessions.insert(m.session) {
            return Err("a session is a member twice");
        }
        if !m.partitions.windows(2).all(|w| w[0] < w[1]) {
            return Err("member partitions not strictly ascending");
        }
        for p in &m.partitions {
            if !t.partitions.contains_key(p) || !owned.insert(*p) {
                return Err("assigned partition missing or owned twice");
            }
        }
        lo = lo.min(m.partitions.len());
        hi = hi.max(m.partitions.len());
    }
    if !g.members.is_empty() && (owned.len() != t.partitions.len() || hi - lo > 1) {
        return Err("assignment incomplete or unbalanced");
    }
    Ok(())
}

fn purge_topic(t: &mut Topic) -> Vec<PartitionEffect> {
    t.partitions
        .values_mut()
        .map(|p| {
            p.purge_generation += 1;
            PartitionEffect::PurgePartition {
                group: p.group,
                generation: p.purge_generation,
            }
        })
        .collect()
}

fn check_config(c: &TopicConfig) -> Result<(), Refusal> {
    // The codec refuses these too; an op built in-process is checked here.
    if c.replication_factor == 0 || c.segment_size_bytes == 0 {
        return Err(Refusal::InvalidTopicConfig);
    }
    Ok(())
}

fn check_hash(h: &PasswordHash) -> Result<(), Refusal> {
    // `PasswordHash` can only be built from a PHC string that parsed; this
    // re-check keeps a future constructor from slipping one past apply.
    PasswordHash::from_phc(h.as_str().to_owned())
        .map(|_| ())
        .map_err(|_| Refusal::InvalidPasswordHash)
}
