//! What the client listener reads from the applied state: streams and
//! topics with their sizes and message counts, consumer groups and a
//! member's assignment, routing of a (stream, topic, partition) to its
//! consensus group, and login verification.
//!
//! Plain functions over [`MetadataState`], no I/O. The partition plane
//! holds the sizes and counts, so the caller passes a [`StatsSource`] (a
//! closure over [`GroupId`] works) and the queries aggregate. "Not found"
//! answers are `None` where Iggy 0.11.0 answers an empty body with status
//! 0 (GET_STREAM, GET_TOPIC, GET_CONSUMER_GROUP, SYNC_CONSUMER_GROUP), and
//! a [`Refusal`] with its code where Iggy answers an error.

use common::{GroupId, PartitionId, StreamId, TopicId};

use crate::consumer_group::{ConsumerGroup, ConsumerGroupId, MemberId, SessionId};
use crate::identifier::Identifier;
use crate::refusal::Refusal;
use crate::state::{MetadataState, Stream, Topic};
use crate::topic_config::TopicConfig;
use crate::user::{UserId, verify_password};

/// One partition's numbers, held by the partition plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PartitionStats {
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
    /// Segments on disk.
    pub segments_count: u32,
    /// The last offset (0 when empty), as GET_TOPIC reports it.
    pub current_offset: u64,
}

/// Where the queries get partition numbers from.
pub trait StatsSource {
    /// The numbers of one partition group (zeros if unknown here).
    fn partition_stats(&self, group: GroupId) -> PartitionStats;
}

impl<F: Fn(GroupId) -> PartitionStats> StatsSource for F {
    fn partition_stats(&self, group: GroupId) -> PartitionStats {
        self(group)
    }
}

/// A stream record (GET_STREAMS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// Its id.
    pub id: StreamId,
    /// Its name.
    pub name: String,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// Its topic count.
    pub topics_count: u32,
    /// Bytes over all its partitions.
    pub size_bytes: u64,
    /// Messages over all its partitions.
    pub messages_count: u64,
}

/// A stream with its topic headers (GET_STREAM, CREATE_STREAM's reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDetails {
    /// The stream record.
    pub stream: StreamInfo,
    /// Its topics, by id.
    pub topics: Vec<TopicInfo>,
}

/// A topic header (GET_TOPICS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Its id.
    pub id: TopicId,
    /// Its name.
    pub name: String,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// Its partition count.
    pub partitions_count: u32,
    /// Its settings (expiry, compression, max size, replication factor…).
    pub config: TopicConfig,
    /// Bytes over its partitions.
    pub size_bytes: u64,
    /// Messages over its partitions.
    pub messages_count: u64,
}

/// A partition record of GET_TOPIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Its id.
    pub id: PartitionId,
    /// Its consensus group.
    pub group: GroupId,
    /// Creation time (µs).
    pub created_at_us: u64,
    /// Its numbers.
    pub stats: PartitionStats,
}

/// A topic with its partitions (GET_TOPIC, CREATE_TOPIC's reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDetails {
    /// The topic header.
    pub topic: TopicInfo,
    /// Its partitions, by id.
    pub partitions: Vec<PartitionInfo>,
}

/// A member in GET_CONSUMER_GROUP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its id.
    pub id: MemberId,
    /// Its partitions, ascending.
    pub partitions: Vec<PartitionId>,
}

/// GET_CONSUMER_GROUP's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDetails {
    /// Its id.
    pub id: ConsumerGroupId,
    /// Its name.
    pub name: String,
    /// The topic's partition count.
    pub partitions_count: u32,
    /// Its members, by id.
    pub members: Vec<MemberInfo>,
}

/// SYNC_CONSUMER_GROUP's answer for a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAssignment {
    /// The group's generation.
    pub generation: u64,
    /// The member's partitions (possibly none).
    pub partitions: Vec<PartitionId>,
}

/// Where a partition's requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRoute {
    /// The stream.
    pub stream: StreamId,
    /// The topic.
    pub topic: TopicId,
    /// The partition.
    pub partition: PartitionId,
    /// Its consensus group.
    pub group: GroupId,
    /// Its incarnation.
    pub incarnation: u64,
    /// Its committed purge generation.
    pub purge_generation: u64,
}

fn topic_info(t: &Topic, stats: &impl StatsSource) -> TopicInfo {
    let (size_bytes, messages_count) = t.partitions.values().fold((0u64, 0u64), |acc, p| {
        let s = stats.partition_stats(p.group);
        (
            acc.0.saturating_add(s.size_bytes),
            acc.1.saturating_add(s.messages_count),
        )
    });
    TopicInfo {
        id: t.id,
        name: t.name.clone(),
        created_at_us: t.created_at_us,
        partitions_count: t.partitions.len() as u32,
        config: t.config,
        size_bytes,
        messages_count,
    }
}

fn stream_info(s: &Stream, topics: &[TopicInfo]) -> StreamInfo {
    StreamInfo {
        id: s.id,
        name: s.name.clone(),
        created_at_us: s.created_at_us,
        topics_count: s.topics.len() as u32,
        size_bytes: topics
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.size_bytes)),
        messages_count: topics
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.messages_count)),
    }
}

fn group_details(g: &ConsumerGroup, t: &Topic) -> ConsumerGroupDetails {
    ConsumerGroupDetails {
        id: g.id,
        name: g.name.clone(),
        partitions_count: t.partitions.len() as u32,
        members: g
            .members
            .values()
            .map(|m| MemberInfo {
                id: m.id,
                partitions: m.partitions.clone(),
            })
            .collect(),
    }
}

impl MetadataState {
    fn stream_by(&self, id: &Identifier) -> Option<&Stream> {
        self.resolve_stream(id).ok().map(|s| &self.streams[&s])
    }

    fn topic_by(&self, stream: &Identifier, topic: &Identifier) -> Result<&Topic, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        Ok(&self.streams[&s].topics[&t])
    }

    /// GET_STREAM: the stream with its topic headers; `None` if missing.
    pub fn get_stream(&self, id: &Identifier, stats: &impl StatsSource) -> Option<StreamDetails> {
        let s = self.stream_by(id)?;
        let topics: Vec<TopicInfo> = s.topics.values().map(|t| topic_info(t, stats)).collect();
        Some(StreamDetails {
            stream: stream_info(s, &topics),
            topics,
        })
    }

    /// GET_STREAMS: every stream's record, by id.
    pub fn list_streams(&self, stats: &impl StatsSource) -> Vec<StreamInfo> {
        self.streams
            .values()
            .map(|s| {
                let topics: Vec<TopicInfo> =
                    s.topics.values().map(|t| topic_info(t, stats)).collect();
                stream_info(s, &topics)
            })
            .collect()
    }

    /// GET_TOPIC: the topic with its partitions; `None` if the stream or
    /// the topic is missing (the SDK relies on an empty body for both).
    pub fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        stats: &impl StatsSource,
    ) -> Option<TopicDetails> {
        let t = self.topic_by(stream, topic).ok()?;
        Some(TopicDetails {
            topic: topic_info(t, stats),
            partitions: t
                .partitions
                .values()
                .map(|p| PartitionInfo {
                    id: p.id,
                    group: p.group,
                    created_at_us: p.created_at_us,
                    stats: stats.partition_stats(p.group),
                })
                .collect(),
        })
    }

    /// GET_TOPICS: the stream's topic headers; a missing stream is refused.
    pub fn list_topics(
        &self,
        stream: &Identifier,
        stats: &impl StatsSource,
    ) -> Result<Vec<TopicInfo>, Refusal> {
        let s = self.resolve_stream(stream)?;
        Ok(self.streams[&s]
            .topics
            .values()
            .map(|t| topic_info(t, stats))
            .collect())
    }

    /// GET_CONSUMER_GROUP: `None` if the stream, topic or group is missing.
    pub fn get_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Option<ConsumerGroupDetails> {
        let t = self.topic_by(stream, topic).ok()?;
        let g = t.resolve_consumer_group(group).ok()?;
        Some(group_details(&t.consumer_groups[&g], t))
    }

    /// GET_CONSUMER_GROUPS: the topic's groups; a missing topic is refused.
    pub fn list_consumer_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Vec<ConsumerGroupDetails>, Refusal> {
        let t = self.topic_by(stream, topic)?;
        Ok(t.consumer_groups
            .values()
            .map(|g| group_details(g, t))
            .collect())
    }

    /// SYNC_CONSUMER_GROUP: the session's assignment and the generation;
    /// `None` means "not a member" (Iggy's empty body).
    pub fn member_assignment(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
        session: SessionId,
    ) -> Option<MemberAssignment> {
        let t = self.topic_by(stream, topic).ok()?;
        let g = &t.consumer_groups[&t.resolve_consumer_group(group).ok()?];
        g.member_of(session).map(|m| MemberAssignment {
            generation: g.generation,
            partitions: m.partitions.clone(),
        })
    }

    /// A consumer-group poll's gate: the group id its offsets are kept
    /// under, if `session` is a member that owns `partition`; 5006 if not a
    /// member, 5009 if the partition is another member's.
    pub fn check_group_poll(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
        session: SessionId,
        partition: PartitionId,
    ) -> Result<ConsumerGroupId, Refusal> {
        let t = self.topic_by(stream, topic)?;
        let gid = t.resolve_consumer_group(group)?;
        let g = &t.consumer_groups[&gid];
        let m = g
            .member_of(session)
            .ok_or(Refusal::ConsumerGroupMemberNotFound {
                session,
                group: gid,
            })?;
        if !m.partitions.contains(&partition) {
            return Err(Refusal::ConsumerGroupPartitionNotOwned {
                partition,
                group: gid,
            });
        }
        Ok(gid)
    }

    /// STORE/GET/DELETE_CONSUMER_OFFSET for a consumer group: the id its
    /// offsets are kept under (no membership needed to read or store), with
    /// Iggy's codes for a missing stream, topic or group.
    pub fn consumer_group_id(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<ConsumerGroupId, Refusal> {
        self.topic_by(stream, topic)?.resolve_consumer_group(group)
    }

    /// The consensus group of a partition, by ids.
    pub fn group_id_of(
        &self,
        stream: StreamId,
        topic: TopicId,
        partition: PartitionId,
    ) -> Option<GroupId> {
        let p = self
            .streams
            .get(&stream)?
            .topics
            .get(&topic)?
            .partitions
            .get(&partition)?;
        Some(p.group)
    }

    /// Routes a send, poll or consumer-offset request to its partition
    /// group, with Iggy's codes for a missing stream, topic or partition.
    pub fn route_partition(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition: PartitionId,
    ) -> Result<PartitionRoute, Refusal> {
        let (s, t) = self.resolve_topic(stream, topic)?;
        let p = self.streams[&s].topics[&t]
            .partitions
            .get(&partition)
            .ok_or(Refusal::PartitionNotFound {
                partition,
                topic: t,
                stream: s,
            })?;
        Ok(PartitionRoute {
            stream: s,
            topic: t,
            partition,
            group: p.group,
            incarnation: p.incarnation,
            purge_generation: p.purge_generation,
        })
    }

    /// The committed purge generation of a live partition group (what a
    /// state-transfer install's purge-advance rule compares against).
    pub fn committed_purge_generation(&self, group: GroupId) -> Option<u64> {
        self.streams
            .values()
            .flat_map(|s| s.topics.values())
            .flat_map(|t| t.partitions.values())
            .find(|p| p.group == group)
            .map(|p| p.purge_generation)
    }

    /// LOGIN: the user id if `password` matches the user's hash. An unknown
    /// user and a wrong password answer alike (42), so the reply does not
    /// tell which usernames exist. Runs Argon2: call it off the apply path.
    pub fn verify_login(&self, username: &str, password: &str) -> Result<UserId, Refusal> {
        self.users
            .values()
            .find(|u| u.username == username)
            .filter(|u| verify_password(&u.password_hash, password))
            .map(|u| u.id)
            .ok_or(Refusal::InvalidCredentials)
    }
}
