//! A single-node, in-memory [`Backend`] for tests only: enough semantics
//! (0-based partitions, per-consumer and per-group offsets, round-robin
//! group assignment, auto-commit) to drive the protocol end to end, the
//! official SDK included. The real backend is the shard and the metadata
//! plane.

use super::backend::{Backend, BackendError, BackendResult, Caller, LoginGrant};
use crate::protocol::poll::select_messages;
use crate::protocol::records::{
    Compression, ConsumerGroupDetails, ConsumerGroupId, ConsumerGroupInfo, ConsumerGroupList,
    ConsumerGroupMember, ConsumerOffsetInfo, GroupAssignment, JoinedGroup, MemberId, PartitionInfo,
    PolledMessages, SendConfirmation, StreamDetails, StreamInfo, StreamList, TopicDetails,
    TopicInfo, TopicList, UserId,
};
use crate::protocol::{
    ConsumerOffsetKey, CreateConsumerGroup, CreateStream, CreateTopic, DeleteConsumerOffset,
    GroupRef, Identifier, Name, Partitioning, PollMessages, PollingStrategy, SendMessages,
    StoreConsumerOffset, TopicRef,
};
use bytes::Bytes;
use common::{ConsumerKind, Offset, PartitionId, StreamId, TopicId};
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;

#[derive(Debug, Default)]
struct Partition {
    batches: Vec<Bytes>,
    next_offset: u64,
    /// (kind, consumer key) → stored offset.
    offsets: BTreeMap<(bool, String), u64>,
}

#[derive(Debug)]
struct Group {
    id: ConsumerGroupId,
    name: Name,
    members: BTreeSet<MemberId>,
    generation: u64,
}

#[derive(Debug)]
struct Topic {
    id: TopicId,
    name: Name,
    partitions: Vec<Partition>,
    groups: Vec<Group>,
    balanced_cursor: u32,
}

#[derive(Debug)]
struct Stream {
    id: StreamId,
    name: Name,
    topics: Vec<Topic>,
}

/// The in-memory backend.
#[derive(Debug)]
pub struct MemoryBackend {
    username: Name,
    password: String,
    streams: Vec<Stream>,
    next_session: u64,
    clock_micros: u64,
}

impl MemoryBackend {
    /// A backend whose root user is `username` / `password`.
    pub fn new(username: &str, password: &str) -> Self {
        Self {
            username: Name::new(username).unwrap_or_else(|| panic!("bad test username")),
            password: password.to_owned(),
            streams: Vec::new(),
            next_session: 1,
            clock_micros: 1_700_000_000_000_000,
        }
    }

    fn stream_index(&self, id: &Identifier) -> Option<usize> {
        self.streams.iter().position(|s| match id {
            Identifier::Numeric(n) => s.id.0 == *n,
            Identifier::Name(name) => &s.name == name,
        })
    }

    fn stream(&mut self, id: &Identifier) -> BackendResult<&mut Stream> {
        let i = self
            .stream_index(id)
            .ok_or_else(|| BackendError::StreamNotFound(id.clone()))?;
        Ok(&mut self.streams[i])
    }

    fn topic(&mut self, r: &TopicRef) -> BackendResult<(StreamId, &mut Topic)> {
        let stream = self.stream(&r.stream)?;
        let sid = stream.id;
        let topic = stream
            .topics
            .iter_mut()
            .find(|t| matches_topic(t, &r.topic))
            .ok_or_else(|| BackendError::TopicNotFound(r.topic.clone()))?;
        Ok((sid, topic))
    }

    fn tick(&mut self) -> u64 {
        self.clock_micros += 1;
        self.clock_micros
    }
}

fn matches_topic(t: &Topic, id: &Identifier) -> bool {
    match id {
        Identifier::Numeric(n) => t.id.0 == *n,
        Identifier::Name(name) => &t.name == name,
    }
}

fn group_index(t: &Topic, id: &Identifier) -> Option<usize> {
    t.groups.iter().position(|g| match id {
        Identifier::Numeric(n) => g.id.0 == *n,
        Identifier::Name(name) => &g.name == name,
    })
}

/// Round robin over the sorted members: partition p goes to member
/// `p mod members`.
fn assignment(t: &Topic, g: &Group, member: MemberId) -> Option<Vec<PartitionId>> {
    let i = g.members.iter().position(|&m| m == member)?;
    let n = g.members.len();
    Some(
        (0..t.partitions.len() as u32)
            .filter(|p| *p as usize % n == i)
            .map(PartitionId)
            .collect(),
    )
}

fn topic_info(t: &Topic) -> TopicInfo {
    TopicInfo {
        id: t.id,
        created_at_micros: 1,
        partitions_count: t.partitions.len() as u32,
        message_expiry_micros: 0,
        compression: Compression::None,
        max_topic_size_bytes: 0,
        size_bytes: t
            .partitions
            .iter()
            .flat_map(|p| &p.batches)
            .map(|b| b.len() as u64)
            .sum(),
        messages_count: t.partitions.iter().map(|p| p.next_offset).sum(),
        name: t.name.clone(),
    }
}

fn head(p: &Partition) -> Offset {
    Offset(p.next_offset.saturating_sub(1))
}

fn topic_details(t: &Topic) -> TopicDetails {
    TopicDetails {
        topic: topic_info(t),
        partitions: t
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| PartitionInfo {
                id: PartitionId(i as u32),
                created_at_micros: 1,
                segments_count: 1,
                current_offset: head(p),
                size_bytes: p.batches.iter().map(|b| b.len() as u64).sum(),
                messages_count: p.next_offset,
            })
            .collect(),
    }
}

fn stream_details(s: &Stream) -> StreamDetails {
    StreamDetails {
        stream: stream_info(s),
        topics: s.topics.iter().map(topic_info).collect(),
    }
}

fn stream_info(s: &Stream) -> StreamInfo {
    StreamInfo {
        id: s.id,
        created_at_micros: 1,
        topics_count: s.topics.len() as u32,
        size_bytes: 0,
        messages_count: 0,
        name: s.name.clone(),
    }
}

fn group_details(t: &Topic, g: &Group) -> ConsumerGroupDetails {
    ConsumerGroupDetails {
        group: group_info(t, g),
        members: g
            .members
            .iter()
            .map(|&m| ConsumerGroupMember {
                id: m,
                partitions: assignment(t, g, m).unwrap_or_default(),
            })
            .collect(),
    }
}

fn group_info(t: &Topic, g: &Group) -> ConsumerGroupInfo {
    ConsumerGroupInfo {
        id: g.id,
        partitions_count: t.partitions.len() as u32,
        members_count: g.members.len() as u32,
        name: g.name.clone(),
    }
}

fn offset_key(kind: ConsumerKind, id: String) -> (bool, String) {
    (kind == ConsumerKind::ConsumerGroup, id)
}

/// Resolves a consumer to its offset-map key, checking group membership
/// and ownership for group consumers.
fn consumer_key(
    t: &Topic,
    caller: Caller,
    key: &ConsumerOffsetKey,
    check_owner: bool,
) -> BackendResult<((bool, String), PartitionId)> {
    match key.consumer.kind {
        ConsumerKind::Consumer => {
            let partition = key.partition.unwrap_or(PartitionId(0));
            Ok((
                offset_key(ConsumerKind::Consumer, key.consumer.id.to_string()),
                partition,
            ))
        }
        ConsumerKind::ConsumerGroup => {
            let gi = group_index(t, &key.consumer.id)
                .ok_or_else(|| BackendError::ConsumerGroupNotFound(key.consumer.id.clone()))?;
            let g = &t.groups[gi];
            let mine = if check_owner {
                assignment(t, g, caller.member).ok_or(BackendError::NotGroupMember)?
            } else {
                Vec::new()
            };
            let partition = match key.partition {
                Some(p) => p,
                None => *mine.first().ok_or(BackendError::NotGroupMember)?,
            };
            if check_owner && !mine.contains(&partition) {
                return Err(BackendError::PartitionNotOwned(partition));
            }
            Ok((
                offset_key(ConsumerKind::ConsumerGroup, g.id.0.to_string()),
                partition,
            ))
        }
    }
}

impl Backend for MemoryBackend {
    async fn login(&mut self, username: &Name, password: &str) -> BackendResult<LoginGrant> {
        if *username != self.username || password != self.password {
            return Err(BackendError::InvalidCredentials);
        }
        let session = NonZeroU64::new(self.next_session).ok_or(BackendError::Unsupported)?;
        self.next_session += 1;
        Ok(LoginGrant {
            user: UserId(0),
            session,
        })
    }

    async fn logout(&mut self, _caller: Caller) -> BackendResult<()> {
        Ok(())
    }

    async fn get_stream(
        &mut self,
        _c: Caller,
        id: &Identifier,
    ) -> BackendResult<Option<StreamDetails>> {
        Ok(self
            .stream_index(id)
            .map(|i| stream_details(&self.streams[i])))
    }

    async fn get_streams(&mut self, _c: Caller) -> BackendResult<StreamList> {
        Ok(StreamList(self.streams.iter().map(stream_info).collect()))
    }

    async fn create_stream(
        &mut self,
        _c: Caller,
        r: &CreateStream,
    ) -> BackendResult<StreamDetails> {
        if self.streams.iter().any(|s| s.name == r.name) {
            return Err(BackendError::StreamNameAlreadyExists(r.name.clone()));
        }
        let id = StreamId(self.streams.iter().map(|s| s.id.0 + 1).max().unwrap_or(0));
        self.streams.push(Stream {
            id,
            name: r.name.clone(),
            topics: Vec::new(),
        });
        Ok(stream_details(
            self.streams.last().ok_or(BackendError::Unsupported)?,
        ))
    }

    async fn delete_stream(&mut self, _c: Caller, id: &Identifier) -> BackendResult<()> {
        let i = self
            .stream_index(id)
            .ok_or_else(|| BackendError::StreamNotFound(id.clone()))?;
        self.streams.remove(i);
        Ok(())
    }

    async fn get_topic(&mut self, _c: Caller, r: &TopicRef) -> BackendResult<Option<TopicDetails>> {
        match self.topic(r) {
            Ok((_, t)) => Ok(Some(topic_details(t))),
            Err(BackendError::StreamNotFound(_) | BackendError::TopicNotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn get_topics(&mut self, _c: Caller, id: &Identifier) -> BackendResult<TopicList> {
        let s = self.stream(id)?;
        Ok(TopicList(s.topics.iter().map(topic_info).collect()))
    }

    async fn create_topic(&mut self, _c: Caller, r: &CreateTopic) -> BackendResult<TopicDetails> {
        if r.partitions_count == 0 || r.partitions_count > 1000 {
            return Err(BackendError::InvalidPartitionsCount(r.partitions_count));
        }
        let s = self.stream(&r.stream)?;
        if s.topics.iter().any(|t| t.name == r.name) {
            return Err(BackendError::TopicNameAlreadyExists(r.name.clone()));
        }
        let id = TopicId(s.topics.iter().map(|t| t.id.0 + 1).max().unwrap_or(0));
        s.topics.push(Topic {
            id,
            name: r.name.clone(),
            partitions: (0..r.partitions_count)
                .map(|_| Partition::default())
                .collect(),
            groups: Vec::new(),
            balanced_cursor: 0,
        });
        Ok(topic_details(
            s.topics.last().ok_or(BackendError::Unsupported)?,
        ))
    }

    async fn delete_topic(&mut self, _c: Caller, r: &TopicRef) -> BackendResult<()> {
        let s = self.stream(&r.stream)?;
        let i = s
            .topics
            .iter()
            .position(|t| matches_topic(t, &r.topic))
            .ok_or_else(|| BackendError::TopicNotFound(r.topic.clone()))?;
        s.topics.remove(i);
        Ok(())
    }

    async fn send_messages(
        &mut self,
        _c: Caller,
        r: &SendMessages,
    ) -> BackendResult<SendConfirmation> {
        let now = self.tick();
        let (sid, t) = self.topic(&r.topic)?;
        let n = t.partitions.len() as u32;
        if n == 0 {
            return Err(BackendError::NoPartitions);
        }
        let p = match &r.partitioning {
            Partitioning::PartitionId(p) => *p,
            Partitioning::Balanced => {
                t.balanced_cursor = t.balanced_cursor.wrapping_add(1);
                PartitionId(t.balanced_cursor % n)
            }
            Partitioning::MessagesKey(key) => {
                PartitionId((xxhash_rust::xxh3::xxh3_64(key) % u64::from(n)) as u32)
            }
        };
        let tid = t.id;
        let partition = t
            .partitions
            .get_mut(p.0 as usize)
            .ok_or(BackendError::PartitionNotFound(p))?;
        let base = partition.next_offset;
        let mut batch = r.batch.to_vec();
        let h = storage::stamp(&mut batch, u64::from(p.0), base, now, u64::MAX)
            .map_err(|e| BackendError::LocalFault(e.to_string()))?;
        partition.next_offset = h.next_offset();
        partition.batches.push(Bytes::from(batch));
        Ok(SendConfirmation {
            stream_id: sid,
            topic_id: tid,
            partition_id: p,
            base_offset: Offset(base),
        })
    }

    async fn poll_messages(
        &mut self,
        caller: Caller,
        r: &PollMessages,
    ) -> BackendResult<PolledMessages> {
        if r.count == 0 {
            return Err(BackendError::InvalidMessagesCount(0));
        }
        let (_, t) = self.topic(&r.topic)?;
        let key = ConsumerOffsetKey {
            consumer: r.consumer.clone(),
            topic: r.topic.clone(),
            partition: r.partition,
        };
        let (okey, pid) = consumer_key(t, caller, &key, true)?;
        let partition = t
            .partitions
            .get_mut(pid.0 as usize)
            .ok_or(BackendError::PartitionNotFound(pid))?;
        let start = match r.strategy {
            PollingStrategy::Offset(o) => o.0,
            PollingStrategy::First => 0,
            PollingStrategy::Last => partition.next_offset.saturating_sub(u64::from(r.count)),
            PollingStrategy::Next => partition.offsets.get(&okey).map_or(0, |o| o + 1),
            PollingStrategy::Timestamp(ts) => partition
                .batches
                .iter()
                .find_map(|b| {
                    let h = storage::BatchHeader::decode(b, u64::MAX).ok()?;
                    (h.base_timestamp >= ts).then_some(h.base_offset)
                })
                .unwrap_or(partition.next_offset),
        };
        let mut left = r.count;
        let mut next = start;
        let mut out = Vec::new();
        for b in &partition.batches {
            if left == 0 {
                break;
            }
            let cut = select_messages(b, Offset(next), left)
                .map_err(|e| BackendError::LocalFault(e.to_string()))?;
            if let Some(cut) = cut {
                let h = storage::BatchHeader::decode(&cut, u64::MAX)
                    .map_err(|e| BackendError::LocalFault(e.to_string()))?;
                left -= h.message_count;
                next = h.next_offset();
                out.push(cut);
            }
        }
        if r.auto_commit && !out.is_empty() {
            partition.offsets.insert(okey, next - 1);
        }
        PolledMessages::new(pid, head(partition), out)
            .map_err(|e| BackendError::LocalFault(e.to_string()))
    }

    async fn get_consumer_offset(
        &mut self,
        caller: Caller,
        key: &ConsumerOffsetKey,
    ) -> BackendResult<Option<ConsumerOffsetInfo>> {
        let (_, t) = self.topic(&key.topic)?;
        let (okey, pid) = consumer_key(t, caller, key, false)?;
        let p = t
            .partitions
            .get(pid.0 as usize)
            .ok_or(BackendError::PartitionNotFound(pid))?;
        Ok(p.offsets.get(&okey).map(|&o| ConsumerOffsetInfo {
            partition_id: pid,
            current_offset: head(p),
            stored_offset: Offset(o),
        }))
    }

    async fn store_consumer_offset(
        &mut self,
        caller: Caller,
        r: &StoreConsumerOffset,
    ) -> BackendResult<()> {
        let (_, t) = self.topic(&r.key.topic)?;
        let (okey, pid) = consumer_key(t, caller, &r.key, false)?;
        let p = t
            .partitions
            .get_mut(pid.0 as usize)
            .ok_or(BackendError::PartitionNotFound(pid))?;
        p.offsets.insert(okey, r.offset.0);
        Ok(())
    }

    async fn delete_consumer_offset(
        &mut self,
        caller: Caller,
        r: &DeleteConsumerOffset,
    ) -> BackendResult<()> {
        let (_, t) = self.topic(&r.key.topic)?;
        let (okey, pid) = consumer_key(t, caller, &r.key, false)?;
        let p = t
            .partitions
            .get_mut(pid.0 as usize)
            .ok_or(BackendError::PartitionNotFound(pid))?;
        p.offsets.remove(&okey);
        Ok(())
    }

    async fn get_consumer_group(
        &mut self,
        _c: Caller,
        r: &GroupRef,
    ) -> BackendResult<Option<ConsumerGroupDetails>> {
        let Ok((_, t)) = self.topic(&r.topic) else {
            return Ok(None);
        };
        Ok(group_index(t, &r.group).map(|i| group_details(t, &t.groups[i])))
    }

    async fn get_consumer_groups(
        &mut self,
        _c: Caller,
        r: &TopicRef,
    ) -> BackendResult<ConsumerGroupList> {
        let (_, t) = self.topic(r)?;
        Ok(ConsumerGroupList(
            t.groups.iter().map(|g| group_info(t, g)).collect(),
        ))
    }

    async fn create_consumer_group(
        &mut self,
        _c: Caller,
        r: &CreateConsumerGroup,
    ) -> BackendResult<ConsumerGroupDetails> {
        let (_, t) = self.topic(&r.topic)?;
        if t.groups.iter().any(|g| g.name == r.name) {
            return Err(BackendError::ConsumerGroupNameAlreadyExists(r.name.clone()));
        }
        let id = ConsumerGroupId(t.groups.iter().map(|g| g.id.0 + 1).max().unwrap_or(0));
        t.groups.push(Group {
            id,
            name: r.name.clone(),
            members: BTreeSet::new(),
            generation: 0,
        });
        let g = t.groups.last().ok_or(BackendError::Unsupported)?;
        Ok(group_details(t, g))
    }

    async fn delete_consumer_group(&mut self, _c: Caller, r: &GroupRef) -> BackendResult<()> {
        let (_, t) = self.topic(&r.topic)?;
        let i = group_index(t, &r.group)
            .ok_or_else(|| BackendError::ConsumerGroupNotFound(r.group.clone()))?;
        t.groups.remove(i);
        Ok(())
    }

    async fn join_consumer_group(
        &mut self,
        caller: Caller,
        r: &GroupRef,
    ) -> BackendResult<JoinedGroup> {
        let (sid, t) = self.topic(&r.topic)?;
        let tid = t.id;
        let i = group_index(t, &r.group)
            .ok_or_else(|| BackendError::ConsumerGroupNotFound(r.group.clone()))?;
        let g = &mut t.groups[i];
        if g.members.insert(caller.member) {
            g.generation += 1;
        }
        Ok(JoinedGroup {
            stream: sid,
            topic: tid,
            group: g.id,
        })
    }

    async fn leave_consumer_group(
        &mut self,
        caller: Caller,
        r: &GroupRef,
    ) -> BackendResult<JoinedGroup> {
        let (sid, t) = self.topic(&r.topic)?;
        let tid = t.id;
        let i = group_index(t, &r.group)
            .ok_or_else(|| BackendError::ConsumerGroupNotFound(r.group.clone()))?;
        let g = &mut t.groups[i];
        if !g.members.remove(&caller.member) {
            return Err(BackendError::NotGroupMember);
        }
        g.generation += 1;
        Ok(JoinedGroup {
            stream: sid,
            topic: tid,
            group: g.id,
        })
    }

    async fn sync_consumer_group(
        &mut self,
        caller: Caller,
        r: &GroupRef,
    ) -> BackendResult<Option<GroupAssignment>> {
        let (_, t) = self.topic(&r.topic)?;
        let i = group_index(t, &r.group)
            .ok_or_else(|| BackendError::ConsumerGroupNotFound(r.group.clone()))?;
        let g = &t.groups[i];
        Ok(
            assignment(t, g, caller.member).map(|partitions| GroupAssignment {
                generation: g.generation,
                partitions,
            }),
        )
    }

    /// The in-memory backend runs no consensus: it reports itself as
    /// replica 0 alone, with no shards and no groups.
    async fn replica_status(
        &mut self,
        _caller: Caller,
    ) -> BackendResult<common::admin::ReplicaStatus> {
        Ok(common::admin::ReplicaStatus {
            replica: 0,
            roster: Vec::new(),
            shards: 0,
            shards_answered: 0,
            groups: Vec::new(),
        })
    }
}
