//! The clients: a topic set created through the metadata plane, then
//! produces, polls, offset stores, deletes and reads through the shard's call
//! path, one request in flight per client.
//!
//! A client retries the same request only after an answer that promises
//! nothing changed (`NotPrimary`, `Unavailable`, `Overloaded`, an unknown
//! group on a replica that has not created it yet). A produce answered
//! `Indeterminate` is replayed as the Iggy SDK replays a request answered
//! 57: the same batch under the same producer key, flagged as a replay,
//! which the primary must recognise (the oracle catches a batch stored
//! twice as one value at two offsets). After anything else — a local
//! fault, a replica that crashed with the call, no answer in time, a
//! replay that ran out of attempts — the outcome is unknown: the oracle is
//! told so and the client moves on with a fresh request, never resending
//! the batch.

use std::collections::{BTreeMap, BTreeSet};

use common::{ConsumerKind, GroupId, Offset, Prng};
use futures::channel::oneshot;
use metadata::{
    Durability, Identifier, MaxTopicSize, MessageExpiry, MetadataOp, MetadataState, Outcome,
    Refusal, SessionId, TopicConfig,
};
use partitions::{PollRequest, PollingStrategy};
use shard::{Answer, Call, CallError, MetaError, ProducerKey};
use storage::BatchBuilder;
use storage::{BatchView, Integrity};

use crate::cluster::{Cluster, ClusterError};
use crate::oracle::{Consumer, Fate, Oracle, Property, StoreOutcome, Violation, payload};
use crate::trace::{Event, Trace};

/// Ticks a client waits for an answer before giving up on it.
const ANSWER_TIMEOUT_TICKS: u64 = 400;
/// Attempts of one request before the client gives it up.
const ATTEMPTS_MAX: u32 = 60;
/// The stream every topic lives in.
const STREAM: &str = "sim";
/// Segment size of the simulated topics: small, so segments seal often.
const SEGMENT_SIZE_BYTES: u64 = 4096;
/// Topics the workload creates at most.
const TOPICS_MAX: u32 = 4;
/// With purges on, one new request in this many starts a topic purge.
const PURGE_ONE_IN: u64 = 120;
/// With deletes on, one new request in this many deletes a topic.
const DELETE_ONE_IN: u64 = 300;
/// With stream purges on, one new request in this many purges the stream.
const STREAM_PURGE_ONE_IN: u64 = 250;
/// With stream deletes on, one new request in this many deletes the
/// stream with every topic in it (the workload then creates it again).
const STREAM_DELETE_ONE_IN: u64 = 400;
/// Topics created in all, deleted ones included.
const TOPICS_CREATED_MAX: u32 = 12;
/// With consumer groups on, one new request in this many is a membership
/// op (create a topic's group, join it, leave it, or end the session).
const MEMBERSHIP_ONE_IN: u64 = 30;
/// With retention on, how old a message of an expiring topic may grow
/// (3 s of virtual time, 300 ticks): a default run seals and expires
/// segments many times over.
pub(crate) const MESSAGE_EXPIRY_US: u64 = 3_000_000;
/// With size retention on, the size ceiling of a sized topic: 12 KiB for
/// each of its two partitions, three segments' worth, so a default run
/// removes sealed segments by size many times over.
pub(crate) const TOPIC_SIZE_MAX_BYTES: u64 = 2 * 12_288;
/// The most a segment can hold past its rotation size: one batch of the
/// workload (at most 5 messages of at most about 330 payload bytes each,
/// with their headers).
pub(crate) const BATCH_BYTES_MAX: u64 = 2_048;
/// Segment size of the simulated topics (exported for the final checks).
pub(crate) const TOPIC_SEGMENT_SIZE_BYTES: u64 = SEGMENT_SIZE_BYTES;

/// What a client holds a topic's groups (or the stream's) quiet for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopicAction {
    Purge,
    Delete,
    /// A purge of the whole stream: every live topic's groups.
    PurgeStream,
    /// A delete of the whole stream: every live topic goes.
    DeleteStream,
}

/// The opt-in parts of the workload (each draws from its own PRNG, so a
/// run without one keeps its schedule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mix {
    /// Topic purges.
    pub purges: bool,
    /// Topic deletes.
    pub deletes: bool,
    /// Topics that expire their messages.
    pub retention: bool,
    /// Consumer groups created, joined and left.
    pub consumer_groups: bool,
    /// Whole-stream purges.
    pub stream_purges: bool,
    /// Whole-stream deletes.
    pub stream_deletes: bool,
    /// Topics with a size ceiling.
    pub size_retention: bool,
}

/// What a workload step ran into.
#[derive(Debug)]
pub(crate) enum StepError {
    /// A property failed.
    Violation(Violation),
    /// The cluster could not serve a call.
    Cluster(ClusterError),
}

impl From<Violation> for StepError {
    fn from(v: Violation) -> Self {
        Self::Violation(v)
    }
}

impl From<ClusterError> for StepError {
    fn from(e: ClusterError) -> Self {
        Self::Cluster(e)
    }
}

#[derive(Debug, Clone)]
enum Request {
    Meta(MetadataOp),
    Produce {
        group: GroupId,
        tag: u64,
        batch: Vec<u8>,
        /// Whether this sends the batch again after an `Indeterminate`.
        replay: bool,
        /// The tick of its first send (a replay's age).
        sent_tick: u64,
        /// The primary boot this client vouches its replay for (0: none).
        vouched: u64,
    },
    Poll {
        group: GroupId,
        request: PollRequest,
    },
    /// Store `Some(offset)`, or delete the stored offset (`None`).
    Store {
        group: GroupId,
        consumer: Consumer,
        offset: Option<u64>,
    },
    Get {
        group: GroupId,
        consumer: Consumer,
    },
    /// The partition's part of a committed purge: the server's backend
    /// asks each group's primary for the generation group 0 committed and
    /// answers the client once every group has (`NodeBackend::settle_purges`).
    Purge {
        group: GroupId,
        generation: u64,
    },
}

impl Request {
    /// The partition group a call goes to (`None` for a metadata op).
    fn group(&self) -> Option<GroupId> {
        match self {
            Self::Meta(_) => None,
            Self::Produce { group, .. }
            | Self::Poll { group, .. }
            | Self::Store { group, .. }
            | Self::Get { group, .. }
            | Self::Purge { group, .. } => Some(*group),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Meta(op) => format!("meta {}", meta_name(op)),
            Self::Produce { group, tag, .. } => format!("produce batch {tag} to {}", group.0),
            Self::Poll { group, request } => {
                format!("poll {} {:?} x{}", group.0, request.strategy, request.count)
            }
            Self::Store {
                group,
                consumer,
                offset: Some(offset),
            } => format!("store offset {offset} for {consumer} in {}", group.0),
            Self::Store {
                group,
                consumer,
                offset: None,
            } => format!("delete the offset of {consumer} in {}", group.0),
            Self::Get { group, consumer } => format!("get the offset of {consumer} in {}", group.0),
            Self::Purge { group, generation } => {
                format!("purge {} to generation {generation}", group.0)
            }
        }
    }
}

fn meta_name(op: &MetadataOp) -> String {
    match op {
        MetadataOp::CreateStream { name, .. } => format!("create-stream {name}"),
        MetadataOp::CreateTopic { name, .. } => format!("create-topic {name}"),
        MetadataOp::PurgeTopic { topic, .. } => format!("purge-topic {topic:?}"),
        MetadataOp::PurgeStream { stream } => format!("purge-stream {stream:?}"),
        MetadataOp::DeleteTopic { topic, .. } => format!("delete-topic {topic:?}"),
        MetadataOp::DeleteStream { stream } => format!("delete-stream {stream:?}"),
        MetadataOp::CreateConsumerGroup { topic, name, .. } => {
            format!("create-consumer-group {name} in {topic:?}")
        }
        MetadataOp::JoinConsumerGroup {
            topic,
            group,
            session,
            ..
        } => format!("join {group:?} in {topic:?} as session {}", session.0),
        MetadataOp::LeaveConsumerGroup {
            topic,
            group,
            session,
            ..
        } => format!("leave {group:?} in {topic:?} as session {}", session.0),
        MetadataOp::EndSession { session } => format!("end session {}", session.0),
        _ => "other".into(),
    }
}

enum Waiting {
    Call(oneshot::Receiver<Result<Answer, CallError>>),
    Meta(oneshot::Receiver<Result<Outcome, MetaError>>),
}

struct InFlight {
    request: Request,
    waiting: Waiting,
    sent_tick: u64,
}

enum ClientState {
    /// Ready for a new request at `wake_tick`.
    Idle,
    /// A request to (re)send at `wake_tick`, `attempts` sent so far.
    Retry { request: Request, attempts: u32 },
    /// Waiting for an answer.
    Waiting { flight: InFlight, attempts: u32 },
}

struct Client {
    id: u8,
    state: ClientState,
    wake_tick: u64,
    /// The replica it sends to next.
    target: u8,
}

/// Counters of the workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WorkloadStats {
    pub calls: u64,
    pub retries: u64,
    pub polls: u64,
    pub stores_acknowledged: u64,
    pub deletes_acknowledged: u64,
    pub offset_reads: u64,
    pub metadata_ops: u64,
    pub topics: u32,
    /// Partition purges seen applied.
    pub purges: u64,
    /// Topics deleted.
    pub topic_deletes: u32,
    /// Streams deleted (with every topic in them).
    pub stream_deletes: u32,
    /// Consumer-group creates, joins, leaves and session ends committed.
    pub membership_ops: u64,
}

/// The clients and what they know of the cluster.
pub(crate) struct Workload {
    prng: Prng,
    clients: Vec<Client>,
    next_tag: u64,
    groups: Vec<GroupId>,
    /// The stream exists.
    stream_created: bool,
    /// A metadata op is in flight (one at a time).
    meta_busy: bool,
    replica_count: u8,
    /// Only `persisted` topics (the blackout profile).
    persisted_only: bool,
    /// Topic purges are in the workload (`--purges`).
    purges: bool,
    /// Draws for purges alone, so a run without them keeps its schedule.
    purge_prng: Prng,
    /// Topic deletes are in the workload (`--deletes`).
    deletes: bool,
    /// Draws for deletes alone.
    delete_prng: Prng,
    /// Some topics expire their messages (`--retention`).
    retention: bool,
    /// Some topics have a size ceiling (`--size-retention`).
    size_retention: bool,
    /// Consumer groups are created, joined and left (`--consumer-groups`).
    consumer_groups: bool,
    /// Draws for membership ops alone.
    member_prng: Prng,
    /// Whole-stream purges (`--stream-purges`).
    stream_purges: bool,
    /// Draws for stream purges alone.
    stream_prng: Prng,
    /// Whole-stream deletes (`--stream-deletes`).
    stream_deletes: bool,
    /// Draws for stream deletes alone.
    stream_delete_prng: Prng,
    /// Topics (by number) whose consumer group `cg{n}` exists.
    groups_created: BTreeSet<usize>,
    /// The topic whose group each client's session is a member of, as the
    /// committed ops say.
    joined: BTreeMap<u8, usize>,
    /// Each topic's groups, by topic number (`t{n}`).
    topic_groups: Vec<Vec<GroupId>>,
    /// Topics whose create was answered while no replica's metadata
    /// showed them (a single replica that crashed right after answering):
    /// their groups are looked up again until some replica names them.
    unresolved_topics: BTreeSet<usize>,
    /// Groups a purge or delete holds: no client sends to them until the
    /// group's purge call is answered (`Some(generation)` once group 0
    /// committed it) or the delete answered.
    held: BTreeMap<GroupId, Option<u64>>,
    /// Held groups whose purge call a client has in flight or to retry.
    settling: BTreeSet<GroupId>,
    /// A purge or delete of topic `n` that client `i` waits to send until
    /// no request to its groups is in flight: `(i, n, action)`.
    topic_action_waiting: Option<(usize, usize, TopicAction)>,
    /// The last purge generation the workload waited for, per group.
    purge_targets: BTreeMap<GroupId, u64>,
    /// Groups of deleted topics (a replica that has not applied the
    /// delete yet still names them).
    deleted_groups: BTreeSet<GroupId>,
    pub(crate) stats: WorkloadStats,
}

/// The topic number of a name `t{n}`.
fn topic_number(name: &str) -> Option<usize> {
    name.strip_prefix('t')?.parse().ok()
}

/// The client whose session this is.
fn client_of(session: SessionId) -> Option<u8> {
    u8::try_from(session.0.checked_sub(1)?).ok()
}

/// The session a client joins consumer groups as.
fn session_of(client: u8) -> SessionId {
    SessionId(u64::from(client) + 1)
}

fn consumer_of(client: u8) -> u32 {
    u32::from(client) + 1
}

/// The consumer group a client stores offsets for (its own: ids apart
/// from the lone consumers', though the two kinds never share a map).
fn consumer_group_of(client: u8) -> u32 {
    u32::from(client) + 101
}

/// The key `client` writes and reads offsets under: its own consumer
/// group with `group_kind`, else its own lone consumer. Every client
/// writes only its own keys (one writer per key, as the oracle's
/// expectations assume).
fn offset_key(client: u8, group_kind: bool) -> Consumer {
    Consumer {
        kind: if group_kind {
            ConsumerKind::ConsumerGroup
        } else {
            ConsumerKind::Consumer
        },
        id: if group_kind {
            consumer_group_of(client)
        } else {
            consumer_of(client)
        },
    }
}

impl Workload {
    pub(crate) fn new(
        seed: u64,
        clients: u8,
        replica_count: u8,
        persisted_only: bool,
        mix: Mix,
    ) -> Self {
        let Mix {
            purges,
            deletes,
            retention,
            consumer_groups,
            stream_purges,
            stream_deletes,
            size_retention,
        } = mix;
        let mut prng = Prng::new(seed ^ 0xC11E_0007);
        let clients = (0..clients)
            .map(|id| Client {
                id,
                state: ClientState::Idle,
                wake_tick: 0,
                target: u8::try_from(prng.below_inclusive(u64::from(replica_count) - 1))
                    .unwrap_or(0),
            })
            .collect();
        Self {
            prng,
            clients,
            next_tag: 1,
            groups: Vec::new(),
            stream_created: false,
            meta_busy: false,
            replica_count,
            persisted_only,
            purges,
            purge_prng: Prng::new(seed ^ 0x9E12_6E00),
            deletes,
            delete_prng: Prng::new(seed ^ 0xDE1E_7E00),
            retention,
            size_retention,
            consumer_groups,
            member_prng: Prng::new(seed ^ 0xC6_0000_0001),
            stream_purges,
            stream_prng: Prng::new(seed ^ 0x5E_0000_0002),
            stream_deletes,
            stream_delete_prng: Prng::new(seed ^ 0x5D_0000_0003),
            groups_created: BTreeSet::new(),
            joined: BTreeMap::new(),
            topic_groups: Vec::new(),
            unresolved_topics: BTreeSet::new(),
            held: BTreeMap::new(),
            settling: BTreeSet::new(),
            topic_action_waiting: None,
            purge_targets: BTreeMap::new(),
            deleted_groups: BTreeSet::new(),
            stats: WorkloadStats::default(),
        }
    }

    /// Whether no client has a request to one of `groups` in flight or
    /// waiting to be sent again.
    fn quiet(&self, groups: &[GroupId]) -> bool {
        self.clients.iter().all(|c| {
            let request = match &c.state {
                ClientState::Idle => return true,
                ClientState::Retry { request, .. } => request,
                ClientState::Waiting { flight, .. } => &flight.request,
            };
            request.group().is_none_or(|g| !groups.contains(&g))
        })
    }

    /// Client `i`'s purge: started now and then (its groups then take no
    /// new requests), sent once they are quiet. `Some` is the request to
    /// send; `None` with `true` means the client waits this turn.
    fn topic_action_turn(&mut self, i: usize) -> (Option<Request>, bool) {
        if let Some((client, n, action)) = self.topic_action_waiting {
            if client != i {
                return (None, false);
            }
            return self.send_topic_action_once_quiet(n, action);
        }
        let idle = self.held.is_empty() && !self.meta_busy && !self.topic_groups.is_empty();
        if let Some(action) = self.draw_stream_action(idle) {
            for &g in self.topic_groups.iter().flatten() {
                self.held.insert(g, None);
            }
            if self.held.is_empty() {
                return (None, false);
            }
            self.topic_action_waiting = Some((i, 0, action));
            return (None, true);
        }
        let action = if self.purges
            && idle
            && self.purge_prng.below_inclusive(PURGE_ONE_IN - 1) == 0
        {
            TopicAction::Purge
        } else if self.deletes && idle && self.delete_prng.below_inclusive(DELETE_ONE_IN - 1) == 0 {
            TopicAction::Delete
        } else {
            return (None, false);
        };
        let prng = match action {
            TopicAction::Purge | TopicAction::PurgeStream | TopicAction::DeleteStream => {
                &mut self.purge_prng
            }
            TopicAction::Delete => &mut self.delete_prng,
        };
        let n = prng.below_inclusive(self.topic_groups.len() as u64 - 1) as usize;
        let live = self.topic_groups.iter().filter(|g| !g.is_empty()).count();
        // A delete leaves at least one topic to write to.
        if self.topic_groups[n].is_empty() || (action == TopicAction::Delete && live < 2) {
            return (None, false);
        }
        for &g in &self.topic_groups[n] {
            self.held.insert(g, None);
        }
        self.topic_action_waiting = Some((i, n, action));
        (None, true)
    }

    /// The waiting client's `action` on topic `n` (or the stream): its
    /// metadata op once no other is in flight and the held groups are
    /// quiet, else a turn spent waiting.
    fn send_topic_action_once_quiet(
        &mut self,
        n: usize,
        action: TopicAction,
    ) -> (Option<Request>, bool) {
        let held: Vec<GroupId> = self.held.keys().copied().collect();
        if self.meta_busy || !self.quiet(&held) {
            return (None, true);
        }
        self.topic_action_waiting = None;
        self.meta_busy = true;
        let (stream, topic) = (
            Identifier::Name(STREAM.into()),
            Identifier::Name(format!("t{n}")),
        );
        let op = match action {
            TopicAction::Purge => MetadataOp::PurgeTopic { stream, topic },
            TopicAction::Delete => MetadataOp::DeleteTopic { stream, topic },
            TopicAction::PurgeStream => MetadataOp::PurgeStream { stream },
            TopicAction::DeleteStream => MetadataOp::DeleteStream { stream },
        };
        (Some(Request::Meta(op)), true)
    }

    /// Whether a whole-stream purge or delete starts now: drawn only when
    /// that kind is in the workload and nothing is held or in flight
    /// (`idle`), a purge's draw first.
    fn draw_stream_action(&mut self, idle: bool) -> Option<TopicAction> {
        if self.stream_purges
            && idle
            && self.stream_prng.below_inclusive(STREAM_PURGE_ONE_IN - 1) == 0
        {
            Some(TopicAction::PurgeStream)
        } else if self.stream_deletes
            && idle
            && self
                .stream_delete_prng
                .below_inclusive(STREAM_DELETE_ONE_IN - 1)
                == 0
        {
            Some(TopicAction::DeleteStream)
        } else {
            None
        }
    }

    /// A purge call for a held group whose purge group 0 committed and no
    /// client settles yet, as the backend makes one after the metadata op.
    fn settle_request(&mut self) -> Option<Request> {
        let (&group, &generation) = self
            .held
            .iter()
            .find(|(g, target)| target.is_some() && !self.settling.contains(g))?;
        let generation = generation?;
        self.settling.insert(group);
        Some(Request::Purge { group, generation })
    }

    /// A group's purge call answered: the oracle learns the purge (no
    /// request to the group is in flight while it is held; the trace has
    /// the answer).
    fn purge_settled(&mut self, group: GroupId, oracle: &mut Oracle) {
        self.settling.remove(&group);
        self.held.remove(&group);
        oracle.purged(group);
        self.stats.purges += 1;
    }

    /// The groups of topic `name`, as the first replica whose metadata
    /// has applied its create names them.
    fn named_topic_groups(&self, cluster: &Cluster, name: &str) -> Option<Vec<GroupId>> {
        (0..cluster.replica_count).find_map(|r| cluster.metadata_topic_groups(r, STREAM, name))
    }

    /// Learns the groups of the topics no replica showed when their
    /// create was answered, once one does: they join the groups clients
    /// write to, and the topic's purges and deletes then hold them.
    fn resolve_topics(&mut self, cluster: &Cluster) {
        if self.unresolved_topics.is_empty() {
            return;
        }
        for n in self.unresolved_topics.clone() {
            let Some(groups) = self.named_topic_groups(cluster, &format!("t{n}")) else {
                continue;
            };
            self.unresolved_topics.remove(&n);
            for g in &groups {
                if !self.groups.contains(g) && !self.deleted_groups.contains(g) {
                    self.groups.push(*g);
                }
            }
            self.topic_groups[n] = groups;
        }
    }

    /// The partition groups the workload knows of.
    pub(crate) fn groups(&self) -> &[GroupId] {
        &self.groups
    }

    /// Whether every client is idle (nothing in flight or to retry) and
    /// no committed purge waits for its partitions' answers.
    pub(crate) fn idle(&self) -> bool {
        self.held.values().all(Option::is_none)
            && self
                .clients
                .iter()
                .all(|c| matches!(c.state, ClientState::Idle))
    }

    fn random_replica(&mut self) -> u8 {
        u8::try_from(self.prng.below_inclusive(u64::from(self.replica_count) - 1)).unwrap_or(0)
    }

    /// One step of every client: take answers, then send what is due.
    /// With `issue_new` false only requests already begun are finished.
    pub(crate) fn step(
        &mut self,
        cluster: &mut Cluster,
        oracle: &mut Oracle,
        trace: &mut Trace,
        issue_new: bool,
    ) -> Result<(), StepError> {
        let tick = cluster.tick();
        self.resolve_topics(cluster);
        for i in 0..self.clients.len() {
            self.take_answer(i, tick, cluster, oracle, trace)?;
            if self.clients[i].wake_tick > tick {
                continue;
            }
            let state = std::mem::replace(&mut self.clients[i].state, ClientState::Idle);
            let (request, attempts) = match state {
                ClientState::Waiting { flight, attempts } => {
                    self.clients[i].state = ClientState::Waiting { flight, attempts };
                    continue;
                }
                ClientState::Retry { request, attempts } => (request, attempts),
                ClientState::Idle => {
                    // A purge's calls are part of a request already begun.
                    if let Some(r) = self.settle_request() {
                        (r, 0)
                    } else if !issue_new {
                        continue;
                    } else {
                        match self.next_request(i, tick, oracle) {
                            Some(r) => (r, 0),
                            None => continue,
                        }
                    }
                }
            };
            self.send(i, request, attempts, tick, cluster, trace)?;
        }
        Ok(())
    }

    /// Sends client `i`'s `request` (its `attempts + 1`th attempt) to the
    /// replica it targets.
    fn send(
        &mut self,
        i: usize,
        request: Request,
        attempts: u32,
        tick: u64,
        cluster: &mut Cluster,
        trace: &mut Trace,
    ) -> Result<(), ClusterError> {
        let client = &self.clients[i];
        let target = client.target;
        trace.record(Event::Call {
            tick,
            client: client.id,
            replica: target,
            what: request.describe(),
        });
        self.stats.calls += 1;
        if attempts > 0 {
            self.stats.retries += 1;
        }
        let Some(waiting) = issue(cluster, target, &request)? else {
            // The replica is down: the connection was refused and nothing
            // was sent. Try another replica a little later.
            trace.record(Event::Answer {
                tick,
                client: self.clients[i].id,
                what: format!("{}: connection refused", request.describe()),
            });
            let wait = 5 + self.prng.below_inclusive(20);
            let target = self.random_replica();
            let c = &mut self.clients[i];
            c.target = target;
            c.wake_tick = tick + wait;
            c.state = ClientState::Retry {
                request,
                attempts: attempts + 1,
            };
            return Ok(());
        };
        self.clients[i].state = ClientState::Waiting {
            flight: InFlight {
                request,
                waiting,
                sent_tick: tick,
            },
            attempts: attempts + 1,
        };
        Ok(())
    }

    /// Picks the next request of client `i`.
    fn next_request(&mut self, i: usize, tick: u64, oracle: &mut Oracle) -> Option<Request> {
        if !self.stream_created {
            return self.create_stream_request(i);
        }
        // No live topic: the first, or the first after a stream delete.
        if self.stats.topics == self.stats.topic_deletes {
            return self.create_topic_request();
        }
        if self.groups.is_empty() {
            return None;
        }
        match self.topic_action_turn(i) {
            (Some(request), _) => return Some(request),
            (None, true) => return None,
            (None, false) => {}
        }
        if self.consumer_groups
            && !self.meta_busy
            && self.topic_action_waiting.is_none()
            && self.member_prng.below_inclusive(MEMBERSHIP_ONE_IN - 1) == 0
            && let Some(request) = self.membership_request(i)
        {
            return Some(request);
        }
        let roll = self.prng.below_inclusive(99);
        let group = self.groups[self.prng.below_inclusive(self.groups.len() as u64 - 1) as usize];
        if self.held.contains_key(&group) {
            return None;
        }
        let client = self.clients[i].id;
        // Which kind of offset key a request writes or reads follows from
        // draws the workload always made, so every seed's schedule is the
        // one it had before groups were written.
        match roll {
            0..=1
                if self.stats.topics - self.stats.topic_deletes < TOPICS_MAX
                    && self.stats.topics < TOPICS_CREATED_MAX =>
            {
                self.create_topic_request()
            }
            0..=54 => Some(self.produce_request(group, tick, oracle)),
            55..=79 => Some(self.poll_request(group, client, tick, oracle)),
            // One offset write in twelve deletes the stored offset, so
            // stores, deletes and their retries interleave.
            80..=90 => {
                let highest = oracle.highest_offset(group)?;
                Some(Request::Store {
                    group,
                    consumer: offset_key(client, roll >= 86),
                    offset: Some(self.prng.below_inclusive(highest)),
                })
            }
            91 => Some(Request::Store {
                group,
                consumer: offset_key(client, group.0 % 2 == 1),
                offset: None,
            }),
            _ => Some(Request::Get {
                group,
                consumer: offset_key(client, roll >= 96),
            }),
        }
    }

    /// The stream's create, sent by client 0 alone while no other
    /// metadata op is in flight.
    fn create_stream_request(&mut self, i: usize) -> Option<Request> {
        if i != 0 || self.meta_busy {
            return None;
        }
        self.meta_busy = true;
        Some(Request::Meta(MetadataOp::CreateStream {
            name: STREAM.into(),
            created_at_us: 1,
        }))
    }

    /// A produce of a fresh batch of one to five messages to `group`,
    /// which the oracle learns of before it is sent.
    fn produce_request(&mut self, group: GroupId, tick: u64, oracle: &mut Oracle) -> Request {
        let tag = self.next_tag;
        self.next_tag += 1;
        let messages = 1 + self.prng.below_inclusive(4) as u32;
        let mut builder = BatchBuilder::new(tag);
        for index in 0..messages {
            let filler = self.prng.below_inclusive(300) as usize;
            builder.push(
                (u128::from(tag) << 32) | u128::from(index),
                index,
                &payload(tag, index, filler),
                b"",
            );
        }
        oracle.produced(tag, group, messages, tick);
        Request::Produce {
            group,
            tag,
            batch: builder.build(),
            replay: false,
            sent_tick: tick,
            vouched: 0,
        }
    }

    /// A poll of `group` as `client`'s lone consumer, from a strategy
    /// drawn at random (an offset up to the highest the oracle knows, the
    /// first, the last, a moment of the run so far or the next).
    fn poll_request(&mut self, group: GroupId, client: u8, tick: u64, oracle: &Oracle) -> Request {
        let highest = oracle.highest_offset(group).unwrap_or(0);
        let strategy = match self.prng.below_inclusive(4) {
            0 => PollingStrategy::Offset(self.prng.below_inclusive(highest + 1)),
            1 => PollingStrategy::First,
            2 => PollingStrategy::Last,
            // Any moment of the run so far: primaries stamp
            // batches with their clock, the run's virtual time.
            3 => {
                PollingStrategy::Timestamp(self.prng.below_inclusive(tick.saturating_mul(TICK_US)))
            }
            _ => PollingStrategy::Next,
        };
        Request::Poll {
            group,
            request: PollRequest {
                consumer: (ConsumerKind::Consumer, consumer_of(client)),
                strategy,
                count: 1 + self.prng.below_inclusive(40) as u32,
                auto_commit: false,
            },
        }
    }

    /// Client `i`'s next membership op: a member leaves its group or ends
    /// its session; a client in no group creates a live topic's group, or
    /// joins it once it exists.
    fn membership_request(&mut self, i: usize) -> Option<Request> {
        let client = self.clients[i].id;
        let session = session_of(client);
        let stream = Identifier::Name(STREAM.into());
        let op = match self.joined.get(&client) {
            Some(&n) => {
                if self.member_prng.below_inclusive(1) == 0 {
                    MetadataOp::LeaveConsumerGroup {
                        stream,
                        topic: Identifier::Name(format!("t{n}")),
                        group: Identifier::Name(format!("cg{n}")),
                        session,
                    }
                } else {
                    MetadataOp::EndSession { session }
                }
            }
            None => {
                let live: Vec<usize> = (0..self.topic_groups.len())
                    .filter(|&n| !self.topic_groups[n].is_empty())
                    .collect();
                if live.is_empty() {
                    return None;
                }
                let n = live[self.member_prng.below_inclusive(live.len() as u64 - 1) as usize];
                let topic = Identifier::Name(format!("t{n}"));
                if self.groups_created.contains(&n) {
                    MetadataOp::JoinConsumerGroup {
                        stream,
                        topic,
                        group: Identifier::Name(format!("cg{n}")),
                        session,
                    }
                } else {
                    MetadataOp::CreateConsumerGroup {
                        stream,
                        topic,
                        name: format!("cg{n}"),
                    }
                }
            }
        };
        self.meta_busy = true;
        Some(Request::Meta(op))
    }

    /// Membership as the committed ops left it, against `state` (a
    /// converged replica's metadata): each client's session is a member of
    /// exactly the group it last joined and did not leave since, and of no
    /// other group the workload created.
    pub(crate) fn check_membership(&self, state: &MetadataState) -> Result<(), Violation> {
        let stream = Identifier::Name(STREAM.into());
        for client in self.clients.iter().map(|c| c.id) {
            for &n in &self.groups_created {
                if self.topic_groups.get(n).is_none_or(Vec::is_empty) {
                    continue;
                }
                let member = state
                    .member_assignment(
                        &stream,
                        &Identifier::Name(format!("t{n}")),
                        &Identifier::Name(format!("cg{n}")),
                        session_of(client),
                    )
                    .is_some();
                let expected = self.joined.get(&client) == Some(&n);
                if member != expected {
                    return Err(Violation::new(
                        Property::MembershipWrong,
                        format!(
                            "session {} is {}a member of cg{n} in t{n}; the committed ops say it {}",
                            session_of(client).0,
                            if member { "" } else { "not " },
                            if expected {
                                "joined it"
                            } else {
                                "is not in it"
                            }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn create_topic_request(&mut self) -> Option<Request> {
        if self.meta_busy {
            return None;
        }
        self.meta_busy = true;
        let n = self.stats.topics;
        let config = TopicConfig {
            segment_size_bytes: SEGMENT_SIZE_BYTES,
            durability: if n.is_multiple_of(2) && !self.persisted_only {
                Durability::Replicated
            } else {
                Durability::Persisted
            },
            // Two topics in four expire, one of each durability when both
            // are in play.
            message_expiry: if self.retention && matches!(n % 4, 1 | 2) {
                MessageExpiry::After {
                    micros: MESSAGE_EXPIRY_US,
                }
            } else {
                MessageExpiry::ServerDefault
            },
            // The other two in four (one of each durability) keep their
            // partitions within a share of a size ceiling.
            max_topic_size: if self.size_retention && matches!(n % 4, 0 | 3) {
                MaxTopicSize::Bytes {
                    bytes: TOPIC_SIZE_MAX_BYTES,
                }
            } else {
                MaxTopicSize::ServerDefault
            },
            ..TopicConfig::default()
        };
        Some(Request::Meta(MetadataOp::CreateTopic {
            stream: Identifier::Name(STREAM.into()),
            name: format!("t{n}"),
            partitions_count: 2,
            config,
            created_at_us: 2 + u64::from(n),
        }))
    }

    /// Takes client `i`'s answer if one arrived (or gives up on it).
    fn take_answer(
        &mut self,
        i: usize,
        tick: u64,
        cluster: &Cluster,
        oracle: &mut Oracle,
        trace: &mut Trace,
    ) -> Result<(), StepError> {
        let ClientState::Waiting { flight, .. } = &mut self.clients[i].state else {
            return Ok(());
        };
        let timed_out = tick.saturating_sub(flight.sent_tick) > ANSWER_TIMEOUT_TICKS;
        let answer = match &mut flight.waiting {
            Waiting::Call(rx) => match rx.try_recv() {
                Ok(Some(a)) => Got::Call(a),
                Ok(None) if timed_out => Got::TimedOut,
                Ok(None) => return Ok(()),
                Err(oneshot::Canceled) => Got::Cancelled,
            },
            Waiting::Meta(rx) => match rx.try_recv() {
                Ok(Some(a)) => Got::Meta(a),
                Ok(None) if timed_out => Got::TimedOut,
                Ok(None) => return Ok(()),
                Err(oneshot::Canceled) => Got::Cancelled,
            },
        };
        let state = std::mem::replace(&mut self.clients[i].state, ClientState::Idle);
        let ClientState::Waiting { flight, attempts } = state else {
            return Ok(());
        };
        let client = self.clients[i].id;
        // The client is connected to one replica, its origin, which
        // forwards a call to the group's primary. When the primary dies
        // with a produce, the origin answers 57 and the SDK replays the
        // send; when the origin itself dies, the client only sees its
        // connection drop.
        let origin = client % self.replica_count;
        let answer = match answer {
            Got::Cancelled
                if matches!(flight.request, Request::Produce { .. })
                    && self.clients[i].target != origin =>
            {
                Got::Call(Err(CallError::Indeterminate {
                    reason: "the forwarded send's primary died",
                }))
            }
            other => other,
        };
        trace.record(Event::Answer {
            tick,
            client,
            what: format!("{}: {}", flight.request.describe(), answer.describe()),
        });
        let next = self.judge(flight.request, attempts, answer, cluster, oracle)?;
        let wait = 5 + self.prng.below_inclusive(20);
        let fallback = self.random_replica();
        let c = &mut self.clients[i];
        match next {
            Next::Done => c.wake_tick = tick + 1,
            Next::Retry {
                request,
                attempts,
                at: Some(primary),
            } => {
                c.target = primary;
                c.wake_tick = tick + 1;
                c.state = ClientState::Retry { request, attempts };
            }
            Next::Retry {
                request,
                attempts,
                at: None,
            } => {
                c.target = fallback;
                c.wake_tick = tick + wait;
                c.state = ClientState::Retry { request, attempts };
            }
        }
        Ok(())
    }

    /// What an answer means for the oracle and for the client's next move:
    /// each kind of request has its own judge.
    fn judge(
        &mut self,
        request: Request,
        attempts: u32,
        answer: Got,
        cluster: &Cluster,
        oracle: &mut Oracle,
    ) -> Result<Next, Violation> {
        match request {
            Request::Meta(op) => self.judge_meta(op, attempts, answer, cluster),
            Request::Produce {
                group,
                tag,
                batch,
                replay,
                sent_tick,
                ..
            } => judge_produce(
                group,
                tag,
                (batch, replay, sent_tick, cluster.tick()),
                attempts,
                answer,
                oracle,
            ),
            Request::Poll { group, request } => {
                self.judge_poll(group, request, attempts, answer, oracle)
            }
            Request::Store {
                group,
                consumer,
                offset,
            } => self.judge_store(group, consumer, offset, attempts, answer, oracle),
            Request::Get { group, consumer } => {
                self.judge_get(group, consumer, attempts, answer, oracle)
            }
            Request::Purge { group, generation } => {
                self.judge_purge(group, generation, attempts, answer, oracle)
            }
        }
    }

    /// A purge call's answer: the purge is done once it committed; after
    /// anything else the call is made again (the backend's client would
    /// send its purge again), by this client or, once it gives up, by the
    /// next idle one.
    fn judge_purge(
        &mut self,
        group: GroupId,
        generation: u64,
        attempts: u32,
        answer: Got,
        oracle: &mut Oracle,
    ) -> Result<Next, Violation> {
        match answer.into_call() {
            Some(Ok(Answer::Committed { .. })) => {
                self.purge_settled(group, oracle);
                Ok(Next::Done)
            }
            Some(Ok(other)) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!("purge of group {} answered {other:?}", group.0),
            )),
            Some(Err(CallError::Rejected { reason })) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!(
                    "purge of group {} to generation {generation} rejected: {reason}",
                    group.0
                ),
            )),
            Some(Err(e)) if nothing_changed(&e) && !exhausted(attempts) => Ok(retry(
                Request::Purge { group, generation },
                attempts,
                retry_target(&e),
            )),
            _ => {
                self.settling.remove(&group);
                Ok(Next::Done)
            }
        }
    }

    /// A metadata op's answer: done once it committed (or a retry finds
    /// its first attempt landed), a violation if refused, sent again after
    /// anything else.
    fn judge_meta(
        &mut self,
        op: MetadataOp,
        attempts: u32,
        answer: Got,
        cluster: &Cluster,
    ) -> Result<Next, Violation> {
        let result = match answer {
            Got::Meta(r) => r,
            Got::Cancelled | Got::TimedOut => {
                return Ok(retry(Request::Meta(op), attempts, None));
            }
            Got::Call(_) => unreachable_answer(),
        };
        self.stats.metadata_ops += 1;
        match result {
            Ok(_) => {
                self.meta_done(&op, cluster);
                Ok(Next::Done)
            }
            // A retry of an op whose first attempt landed.
            Err(MetaError::Refused(
                Refusal::StreamNameAlreadyExists(_)
                | Refusal::TopicNameAlreadyExists { .. }
                | Refusal::TopicNameNotFound { .. }
                | Refusal::StreamNameNotFound(_)
                | Refusal::ConsumerGroupNameAlreadyExists { .. }
                | Refusal::ConsumerGroupMemberNotFound { .. },
            )) if attempts > 1 => {
                self.meta_done(&op, cluster);
                Ok(Next::Done)
            }
            Err(MetaError::Refused(refusal)) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!("metadata op {} refused: {refusal}", meta_name(&op)),
            )),
            Err(MetaError::NotPrimary { primary, .. }) => {
                Ok(retry(Request::Meta(op), attempts, Some(primary.0)))
            }
            // Metadata ops are named, so a retry of one that landed
            // is refused as existing (handled above): retrying is
            // safe after every other answer.
            Err(
                MetaError::Unavailable { .. }
                | MetaError::Indeterminate { .. }
                | MetaError::Local { .. }
                | MetaError::NotHosted,
            ) => Ok(retry(Request::Meta(op), attempts, None)),
        }
    }

    /// A poll's answer: the polled messages must be dense, match what the
    /// oracle knows and carry ordered timestamps; a "nothing changed"
    /// answer sends the poll again.
    fn judge_poll(
        &mut self,
        group: GroupId,
        request: PollRequest,
        attempts: u32,
        answer: Got,
        oracle: &mut Oracle,
    ) -> Result<Next, Violation> {
        let Some(result) = answer.into_call() else {
            return Ok(Next::Done);
        };
        match result {
            Ok(Answer::Polled(polled)) => {
                self.stats.polls += 1;
                let messages: Vec<(u64, Vec<u8>)> = polled
                    .messages()
                    .map(|m| (m.offset, m.payload.to_vec()))
                    .collect();
                if messages.len() as u64 != polled.count {
                    return Err(Violation::new(
                        Property::OffsetsNotDense,
                        format!(
                            "group {}: a poll claimed {} messages and held {}",
                            group.0,
                            polled.count,
                            messages.len()
                        ),
                    ));
                }
                oracle.polled(group, &messages)?;
                check_timestamps(group, request.strategy, &polled)?;
                Ok(Next::Done)
            }
            Ok(other) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!("poll answered {other:?}"),
            )),
            Err(e) if nothing_changed(&e) && !exhausted(attempts) => Ok(retry(
                Request::Poll { group, request },
                attempts,
                retry_target(&e),
            )),
            Err(CallError::Rejected { reason }) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!("poll of group {} rejected: {reason}", group.0),
            )),
            Err(_) => Ok(Next::Done),
        }
    }

    /// An offset store's (or delete's) answer: the oracle learns how it
    /// settled; a "nothing changed" answer sends it again until the
    /// attempts run out.
    fn judge_store(
        &mut self,
        group: GroupId,
        consumer: Consumer,
        offset: Option<u64>,
        attempts: u32,
        answer: Got,
        oracle: &mut Oracle,
    ) -> Result<Next, Violation> {
        let outcome = match answer {
            Got::Call(Ok(Answer::Committed { .. })) => StoreOutcome::Acknowledged,
            Got::Call(Ok(other)) => {
                return Err(Violation::new(
                    Property::UnexpectedRefusal,
                    format!("offset store answered {other:?}"),
                ));
            }
            Got::Call(Err(e)) if nothing_changed(&e) && !exhausted(attempts) => {
                let request = Request::Store {
                    group,
                    consumer,
                    offset,
                };
                return Ok(retry(request, attempts, retry_target(&e)));
            }
            Got::Call(Err(e)) if nothing_changed(&e) => StoreOutcome::NeverApplied,
            Got::Call(Err(CallError::Rejected { reason })) => {
                let what = match offset {
                    Some(offset) => format!("store of committed offset {offset}"),
                    None => "delete of the stored offset".to_string(),
                };
                return Err(Violation::new(
                    Property::UnexpectedRefusal,
                    format!("{what} in group {} rejected: {reason}", group.0),
                ));
            }
            Got::Call(Err(_)) | Got::Cancelled => StoreOutcome::Unknown,
            Got::TimedOut => StoreOutcome::MayLandLater,
            Got::Meta(_) => unreachable_answer(),
        };
        if outcome == StoreOutcome::Acknowledged {
            match offset {
                Some(_) => self.stats.stores_acknowledged += 1,
                None => self.stats.deletes_acknowledged += 1,
            }
        }
        oracle.store_settled(group, consumer, offset, outcome);
        Ok(Next::Done)
    }

    /// An offset read's answer: the offset read must be one the oracle
    /// allows; a "nothing changed" answer reads again.
    fn judge_get(
        &mut self,
        group: GroupId,
        consumer: Consumer,
        attempts: u32,
        answer: Got,
        oracle: &mut Oracle,
    ) -> Result<Next, Violation> {
        let Some(result) = answer.into_call() else {
            return Ok(Next::Done);
        };
        match result {
            Ok(Answer::Offset(got)) => {
                self.stats.offset_reads += 1;
                oracle.offset_read(group, consumer, got.map(|o| o.0))?;
                Ok(Next::Done)
            }
            Ok(other) => Err(Violation::new(
                Property::UnexpectedRefusal,
                format!("offset read answered {other:?}"),
            )),
            Err(e) if nothing_changed(&e) && !exhausted(attempts) => Ok(retry(
                Request::Get { group, consumer },
                attempts,
                retry_target(&e),
            )),
            Err(_) => Ok(Next::Done),
        }
    }

    /// A metadata op committed: learn what it created or removed.
    fn meta_done(&mut self, op: &MetadataOp, cluster: &Cluster) {
        self.meta_busy = false;
        match op {
            MetadataOp::CreateStream { .. } => self.stream_created = true,
            MetadataOp::CreateTopic { name, .. } => self.topic_created(name, cluster),
            MetadataOp::CreateConsumerGroup {
                topic: Identifier::Name(name),
                ..
            } => {
                self.stats.membership_ops += 1;
                if let Some(n) = topic_number(name) {
                    self.groups_created.insert(n);
                }
            }
            MetadataOp::JoinConsumerGroup {
                topic: Identifier::Name(name),
                session,
                ..
            } => {
                self.stats.membership_ops += 1;
                if let (Some(n), Some(client)) = (topic_number(name), client_of(*session)) {
                    self.joined.insert(client, n);
                }
            }
            MetadataOp::LeaveConsumerGroup { session, .. } | MetadataOp::EndSession { session } => {
                self.stats.membership_ops += 1;
                if let Some(client) = client_of(*session) {
                    self.joined.remove(&client);
                }
            }
            MetadataOp::DeleteTopic {
                topic: Identifier::Name(name),
                ..
            } => self.topic_deleted(name),
            MetadataOp::DeleteStream { .. } => self.stream_deleted(),
            MetadataOp::PurgeTopic { .. } | MetadataOp::PurgeStream { .. } => {
                self.purge_committed(op, cluster);
            }
            _ => {}
        }
    }

    /// Topic `name`'s create committed: the groups clients write to grow
    /// to every group a replica's metadata names, and the topic's own
    /// groups are learnt now or looked up again later.
    fn topic_created(&mut self, name: &str, cluster: &Cluster) {
        self.stats.topics += 1;
        // The answering primary applied the op: its metadata names
        // every group so far. Any replica that has applied it does.
        for r in 0..cluster.replica_count {
            if let Some(mut groups) = cluster.metadata_groups(r) {
                groups.retain(|g| !self.deleted_groups.contains(g));
                if groups.len() > self.groups.len() {
                    self.groups = groups;
                }
            }
        }
        // This topic's groups, as a replica that applied its create
        // names them; looked up again later if none shows them
        // now (the groups new since the last create may include
        // an earlier topic's that were not visible then).
        let n = self.topic_groups.len();
        match self.named_topic_groups(cluster, name) {
            Some(groups) => self.topic_groups.push(groups),
            None => {
                self.topic_groups.push(Vec::new());
                self.unresolved_topics.insert(n);
            }
        }
    }

    /// Topic `name`'s delete committed: its groups, its consumer group and
    /// every membership in it are gone (a name the workload never created
    /// changes nothing).
    fn topic_deleted(&mut self, name: &str) {
        let Some(n) = name
            .strip_prefix('t')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n < self.topic_groups.len())
        else {
            return;
        };
        // Nothing was in flight to its groups, and nothing will be:
        // the oracle's final checks cover the groups the metadata
        // names, so they drop out there too.
        let gone = std::mem::take(&mut self.topic_groups[n]);
        self.unresolved_topics.remove(&n);
        // Its consumer group and every membership in it went too.
        self.groups_created.remove(&n);
        self.joined.retain(|_, joined| *joined != n);
        self.groups.retain(|g| !gone.contains(g));
        self.deleted_groups.extend(gone.iter().copied());
        for g in &gone {
            self.held.remove(g);
        }
        self.stats.topic_deletes += 1;
    }

    /// The stream's delete committed: every topic, its consumer group and
    /// every membership in it went with the stream; the next request
    /// creates both again (under new group ids).
    fn stream_deleted(&mut self) {
        for gone in &mut self.topic_groups {
            self.deleted_groups.extend(std::mem::take(gone));
        }
        self.groups.clear();
        self.unresolved_topics.clear();
        self.stats.topic_deletes = self.stats.topics;
        self.groups_created.clear();
        self.joined.clear();
        self.held.clear();
        self.stream_created = false;
        self.stats.stream_deletes += 1;
    }

    /// A topic or stream purge committed: each purged group stays held
    /// until it is seen applying the generation this settles on.
    fn purge_committed(&mut self, op: &MetadataOp, cluster: &Cluster) {
        let purged: Vec<GroupId> = match op {
            MetadataOp::PurgeTopic {
                topic: Identifier::Name(name),
                ..
            } => topic_number(name)
                .and_then(|n| self.topic_groups.get(n).cloned())
                .unwrap_or_default(),
            // Every topic's groups: the held ones, all live.
            MetadataOp::PurgeStream { .. } => self.topic_groups.iter().flatten().copied().collect(),
            _ => Vec::new(),
        };
        for g in purged {
            // The generation group 0 committed (the answering
            // primary holds it; a later one may too), and at least
            // one more than the last purge of the group.
            let committed = (0..cluster.replica_count)
                .filter_map(|r| cluster.metadata_purge_generation(r, g))
                .max()
                .unwrap_or(0);
            let last = self.purge_targets.get(&g).copied().unwrap_or(0);
            let target = committed.max(last + 1);
            self.purge_targets.insert(g, target);
            self.held.insert(g, Some(target));
        }
    }
}

/// A produce's answer: the oracle learns the batch acknowledged (at its
/// offset), never applied or of unknown fate; only a "nothing changed"
/// answer sends the same batch again.
fn judge_produce(
    group: GroupId,
    tag: u64,
    (batch, replay, sent_tick, now_tick): (Vec<u8>, bool, u64, u64),
    attempts: u32,
    answer: Got,
    oracle: &mut Oracle,
) -> Result<Next, Violation> {
    let Some(result) = answer.into_call() else {
        oracle.settle(tag, Fate::Unknown);
        return Ok(Next::Done);
    };
    match result {
        Ok(Answer::Committed { base_offset, .. }) => {
            oracle.acknowledged(tag, base_offset.map(|o| o.0))?;
            Ok(Next::Done)
        }
        Ok(other) => Err(Violation::new(
            Property::UnexpectedRefusal,
            format!("produce of batch {tag} answered {other:?}"),
        )),
        Err(e) if nothing_changed(&e) => {
            if exhausted(attempts) {
                // A refusal of a replay says nothing of the first send.
                let fate = if replay {
                    Fate::Unknown
                } else {
                    Fate::NeverApplied
                };
                oracle.settle(tag, fate);
                return Ok(Next::Done);
            }
            let at = retry_target(&e);
            // Once replayed, every later send of it is a replay too.
            let request = Request::Produce {
                group,
                tag,
                batch,
                replay,
                sent_tick,
                vouched: 0,
            };
            Ok(retry(request, attempts, at))
        }
        // The SDK's same-session replay of a request answered 57.
        Err(CallError::Indeterminate { .. }) if !exhausted(attempts) => {
            let request = Request::Produce {
                group,
                tag,
                batch,
                replay: true,
                sent_tick,
                vouched: 0,
            };
            Ok(retry(request, attempts, None))
        }
        // A primary that cannot place the replay by itself; vouched for
        // when the send was first made after its journal began, as the
        // server's backend does (ticks of 10 ms).
        Err(CallError::ReplayUnplaced { since }) if !exhausted(attempts) => {
            let age_us = now_tick.saturating_sub(sent_tick).saturating_mul(10_000);
            let vouched = since
                .filter(|(_, held_us)| *held_us >= age_us)
                .map_or(0, |(boot, _)| boot);
            let request = Request::Produce {
                group,
                tag,
                batch,
                replay: true,
                sent_tick,
                vouched,
            };
            Ok(retry(request, attempts, None))
        }
        Err(CallError::Rejected { reason }) => Err(Violation::new(
            Property::UnexpectedRefusal,
            format!(
                "produce of batch {tag} to group {} rejected: {reason}",
                group.0
            ),
        )),
        Err(_) => {
            oracle.settle(tag, Fate::Unknown);
            Ok(Next::Done)
        }
    }
}

/// The producer key a batch is sent with: one per tag, never 0 (the
/// server's is a digest of the Iggy session and request number; any
/// identity unique per send does).
fn producer_key(tag: u64) -> u128 {
    (1 << 127) | u128::from(tag)
}

/// Whether a request has run out of attempts: one that got only "nothing
/// changed" answers this often ends here.
fn exhausted(attempts: u32) -> bool {
    attempts >= ATTEMPTS_MAX
}

/// The client's next move when it sends `request` again.
fn retry(request: Request, attempts: u32, at: Option<u8>) -> Next {
    Next::Retry {
        request,
        attempts,
        at,
    }
}

/// The replica a retry goes to: the primary a `NotPrimary` answer names,
/// or `None` for one picked at random a little later.
fn retry_target(e: &CallError) -> Option<u8> {
    match e {
        CallError::NotPrimary { primary, .. } => Some(primary.0),
        _ => None,
    }
}

/// Hands `request` to replica `target`: what to wait on for its answer,
/// or `None` when the replica is down and refused the connection.
fn issue(
    cluster: &mut Cluster,
    target: u8,
    request: &Request,
) -> Result<Option<Waiting>, ClusterError> {
    let waiting = match request {
        Request::Meta(op) => cluster.meta(target, op.clone())?.map(Waiting::Meta),
        Request::Produce {
            group,
            tag,
            batch,
            replay,
            vouched,
            ..
        } => {
            let call = Call::Produce {
                batch: batch.clone(),
                key: ProducerKey {
                    key: producer_key(*tag),
                    replay: *replay,
                    vouched: *vouched,
                },
            };
            cluster.call(target, *group, call)?.map(Waiting::Call)
        }
        Request::Poll { group, request } => cluster
            .call(target, *group, Call::Poll(*request))?
            .map(Waiting::Call),
        Request::Store {
            group,
            consumer,
            offset,
        } => {
            let call = match offset {
                Some(offset) => Call::StoreOffset {
                    kind: consumer.kind,
                    id: consumer.id,
                    offset: Offset(*offset),
                },
                None => Call::DeleteOffset {
                    kind: consumer.kind,
                    id: consumer.id,
                },
            };
            cluster.call(target, *group, call)?.map(Waiting::Call)
        }
        Request::Get { group, consumer } => cluster
            .call(
                target,
                *group,
                Call::GetOffset {
                    kind: consumer.kind,
                    id: consumer.id,
                },
            )?
            .map(Waiting::Call),
        Request::Purge { group, generation } => cluster
            .call(
                target,
                *group,
                Call::Purge {
                    generation: *generation,
                },
            )?
            .map(Waiting::Call),
    };
    Ok(waiting)
}

/// Answers after which the same request may be sent again: the shard
/// promises nothing changed.
fn nothing_changed(e: &CallError) -> bool {
    e.transient() || matches!(e, CallError::UnknownGroup { .. })
}

fn unreachable_answer() -> ! {
    // A call's receiver only ever yields call answers and a metadata op's
    // only metadata answers: `take_answer` builds `Got` from the matching
    // receiver.
    unreachable!("answer kind does not match the request kind")
}

/// What a client got.
enum Got {
    Call(Result<Answer, CallError>),
    Meta(Result<Outcome, MetaError>),
    /// The reply handle was dropped (the replica crashed with the call).
    Cancelled,
    /// No answer in time.
    TimedOut,
}

impl Got {
    /// A call's answer; `None` when the call was cancelled or timed out.
    fn into_call(self) -> Option<Result<Answer, CallError>> {
        match self {
            Self::Call(r) => Some(r),
            Self::Cancelled | Self::TimedOut => None,
            Self::Meta(_) => unreachable_answer(),
        }
    }
}

impl Got {
    fn describe(&self) -> String {
        match self {
            Self::Call(Ok(Answer::Committed { op, base_offset })) => match base_offset {
                Some(base) => format!("committed op {} at offset {}", op.0, base.0),
                None => format!("committed op {}", op.0),
            },
            Self::Call(Ok(Answer::Polled(p))) => {
                format!("polled {} from {}", p.count, p.first_offset)
            }
            Self::Call(Ok(Answer::Offset(o))) => format!("offset {o:?}"),
            Self::Call(Ok(other)) => format!("{other:?}"),
            Self::Call(Err(e)) => format!("error: {e}"),
            Self::Meta(Ok(o)) => format!("{o:?}"),
            Self::Meta(Err(e)) => format!("error: {e}"),
            Self::Cancelled => "cancelled (replica went down)".into(),
            Self::TimedOut => "no answer in time".into(),
        }
    }
}

/// A client's next move after an answer.
enum Next {
    Done,
    Retry {
        request: Request,
        attempts: u32,
        at: Option<u8>,
    },
}

/// Microseconds per tick of the run's clock.
const TICK_US: u64 = 10_000;

/// A poll's batches carry non-decreasing timestamps (primaries stamp them
/// so), and a poll by timestamp starts at a batch's first message, stamped
/// at or after the time asked.
fn check_timestamps(
    group: GroupId,
    strategy: PollingStrategy,
    polled: &partitions::Polled,
) -> Result<(), Violation> {
    let wrong = |detail: String| {
        Err(Violation::new(
            Property::TimestampWrong,
            format!("group {}: {detail}", group.0),
        ))
    };
    let mut headers = Vec::with_capacity(polled.batches.len());
    for bytes in &polled.batches {
        match BatchView::decode_exact(bytes, Integrity::LayoutOnly, u64::MAX) {
            Ok(view) => headers.push(*view.header()),
            Err(e) => return wrong(format!("a polled batch did not decode: {e}")),
        }
    }
    for pair in headers.windows(2) {
        if pair[1].base_timestamp < pair[0].base_timestamp {
            return wrong(format!(
                "batch at {} stamped {} after batch at {} stamped {}",
                pair[1].base_offset,
                pair[1].base_timestamp,
                pair[0].base_offset,
                pair[0].base_timestamp
            ));
        }
    }
    let PollingStrategy::Timestamp(asked) = strategy else {
        return Ok(());
    };
    if polled.is_empty() {
        return Ok(());
    }
    match headers.first() {
        Some(h) if h.base_offset == polled.first_offset.0 && h.base_timestamp >= asked => Ok(()),
        Some(h) => wrong(format!(
            "a poll from timestamp {asked} started at offset {} in the batch at {} stamped {}",
            polled.first_offset, h.base_offset, h.base_timestamp
        )),
        None => wrong(format!(
            "a poll from timestamp {asked} claimed {} messages and held no batch",
            polled.count
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A stamped batch of `count` messages at `base_offset`.
    fn batch(base_offset: u64, count: u32, stamped: u64) -> Bytes {
        let mut b = BatchBuilder::new(1);
        for i in 0..count {
            b.push(u128::from(i) + 1, i, b"m", b"");
        }
        let mut bytes = b.build();
        storage::stamp(&mut bytes, 0, base_offset, stamped, u64::MAX).unwrap();
        Bytes::from(bytes)
    }

    fn polled(batches: Vec<Bytes>, first_offset: u64, last_offset: u64) -> partitions::Polled {
        partitions::Polled {
            batches,
            first_offset: Offset(first_offset),
            last_offset: Offset(last_offset),
            count: last_offset - first_offset + 1,
        }
    }

    #[test]
    fn given_a_poll_from_a_batch_stamped_at_or_after_the_time_when_checked_should_pass() {
        let p = polled(vec![batch(4, 2, 500), batch(6, 1, 700)], 4, 6);
        check_timestamps(GroupId(1), PollingStrategy::Timestamp(500), &p).unwrap();
        check_timestamps(GroupId(1), PollingStrategy::First, &p).unwrap();
    }

    #[test]
    fn given_a_poll_from_an_earlier_batch_or_mid_batch_when_checked_should_fail() {
        let early = polled(vec![batch(4, 2, 400), batch(6, 1, 700)], 4, 6);
        let mid = polled(vec![batch(4, 2, 500)], 5, 5);
        for p in [early, mid] {
            let v = check_timestamps(GroupId(1), PollingStrategy::Timestamp(450), &p).unwrap_err();
            assert_eq!(v.property, Property::TimestampWrong);
        }
    }

    #[test]
    fn given_batches_stamped_backwards_when_checked_should_fail_for_any_strategy() {
        let p = polled(vec![batch(4, 1, 700), batch(5, 1, 600)], 4, 5);
        let v = check_timestamps(GroupId(1), PollingStrategy::Offset(4), &p).unwrap_err();
        assert_eq!(v.property, Property::TimestampWrong);
    }
}
