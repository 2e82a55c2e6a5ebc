//! [`NodeBackend`] over real shards: a one-replica cluster (two shards,
//! shard 0 hosting the metadata group) on the in-process test
//! environment, each shard's pump a task on one `LocalPool`, the virtual
//! clock advanced by the test one tick at a time while a request is in
//! flight. Requests go through [`Session`] as SDK-encoded frames, so the
//! whole path — codec, session, backend, metadata plane, partition
//! groups — is exercised, and replies are read with the SDK's rules.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use common::ReplicaId;
use common::simnet::NetworkFaults;
use consensus::header::HEADER_SIZE;
use consensus::vsr::TimeoutConfig;
use futures::channel::oneshot;
use futures::executor::{LocalPool, block_on};
use futures::task::LocalSpawnExt;
use iggy_binary_protocol::consensus::{Command as WireCommand, Operation};
use iggy_binary_protocol::requests::consumer_groups::*;
use iggy_binary_protocol::requests::consumer_offsets::*;
use iggy_binary_protocol::requests::messages::*;
use iggy_binary_protocol::requests::streams::*;
use iggy_binary_protocol::requests::topics::*;
use iggy_binary_protocol::requests::users::*;
use iggy_binary_protocol::{
    AckLevel as WireAck, ClientVersionInfo, IGGY_PROTOCOL_VERSION, WireConsumer, WireEncode,
    WireIdentifier, WireName, WireOptions, WirePartitioning, WirePollingStrategy,
};
use server::node::backend::{NodeBackend, ensure_root_user};
use server::node::handle::ShardHandles;
use server::protocol::Name;
use server::protocol::records::{ClusterMetadata, ClusterNode, MemberId, NodeRole, NodeStatus};
use server::session::{ErrorClass, Output, Session, SessionConfig};
use shard::testing::{TestClock, TestEnv, TestNet};
use shard::{Shard, ShardConfig, ShardIndex, shard_dir};
use storage::fs::{Fs, SimFs};
use storage::{BatchHeader, BatchView, Integrity};

const TICK: Duration = Duration::from_millis(10);
const CLUSTER: u128 = 0xB4;
const SHARDS: u16 = 2;
/// Ticks a request may take before the test fails (a commit on one
/// replica takes a few).
const TICKS_PER_REQUEST_MAX: u32 = 3000;
const CLIENT: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

/// One replica: its shards' pumps on a local pool, its handles.
struct Node {
    pool: LocalPool,
    clock: Rc<TestClock>,
    envs: Vec<Rc<TestEnv>>,
    handles: ShardHandles,
    _stops: Vec<oneshot::Sender<()>>,
}

impl Node {
    fn boot() -> Self {
        let clock = TestClock::new();
        let net = TestNet::new(11, NetworkFaults::default());
        let fs = SimFs::new(11);
        let data = PathBuf::from("/data");
        block_on(async {
            fs.create_dir_all(&data).await.unwrap();
            fs.sync_dir(Path::new("/")).await.unwrap();
        });
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..SHARDS).map(|_| shard::inbox(1024)).unzip();
        let pool = LocalPool::new();
        let mut envs = Vec::new();
        let mut stops = Vec::new();
        for (s, inbox) in (0..SHARDS).zip(receivers) {
            let env = TestEnv::new(
                ReplicaId(0),
                ShardIndex(s),
                Rc::clone(&clock),
                net.clone(),
                fs.clone(),
            );
            let mut config = ShardConfig::new(
                CLUSTER,
                ReplicaId(0),
                1,
                ShardIndex(s),
                SHARDS,
                shard_dir(&data, ShardIndex(s)),
            );
            config.timeouts = TimeoutConfig::scaled_down(5);
            config.tick = TICK;
            config.seed = 100 + u64::from(s);
            let mut shard = block_on(Shard::open(config, Rc::clone(&env))).unwrap();
            shard.set_siblings(senders.clone());
            let (stop, stopped) = oneshot::channel();
            pool.spawner()
                .spawn_local(async move {
                    let _ = shard::pump::run(shard, inbox, stopped).await;
                })
                .unwrap();
            envs.push(env);
            stops.push(stop);
        }
        let mut node = Self {
            pool,
            clock,
            envs,
            handles: ShardHandles::new(senders),
            _stops: stops,
        };
        // Let the groups settle into a view before the first request.
        node.idle(100);
        let handles = node.handles.clone();
        for _ in 0..20 {
            match node.run(ensure_root_user(&handles, "iggy", "iggy")) {
                Ok(()) => return node,
                Err(e) if e.class() == ErrorClass::Transient => node.idle(20),
                Err(e) => panic!("root user: {e}"),
            }
        }
        panic!("the metadata plane never took the root user");
    }

    fn step(&mut self) {
        self.pool.run_until_stalled();
        let spawner = self.pool.spawner();
        for env in &self.envs {
            for task in env.take_spawned() {
                spawner.spawn_local(task).unwrap();
            }
        }
        self.pool.run_until_stalled();
    }

    fn idle(&mut self, ticks: u32) {
        for _ in 0..ticks {
            self.step();
            self.clock.advance(TICK);
        }
    }

    /// Polls `future` to completion, serving the shards and advancing the
    /// clock a tick whenever it waits.
    fn run<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = pin!(future);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..TICKS_PER_REQUEST_MAX {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            self.step();
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            self.clock.advance(TICK);
        }
        panic!("no answer within {TICKS_PER_REQUEST_MAX} ticks");
    }
}

fn session_config() -> Arc<SessionConfig> {
    Arc::new(SessionConfig {
        frame_size_max_bytes: 1 << 20,
        limits: server::session::ClientLimits::default(),
        cluster: ClusterMetadata {
            name: "c".to_owned(),
            node: ClusterNode {
                name: "r0".to_owned(),
                ip: "127.0.0.1".to_owned(),
                tcp_port: 8090,
                quic_port: 0,
                http_port: 0,
                websocket_port: 0,
                role: NodeRole::Leader,
                status: NodeStatus::Healthy,
            },
        },
        server_version: Name::new("replog").unwrap(),
    })
}

/// One client connection: a session over its own clone of the backend.
struct Client {
    session: Session,
    backend: NodeBackend,
    session_number: u64,
    request: u64,
}

impl Client {
    fn connect(node: &Node, member: u32) -> Self {
        Self {
            session: Session::new(session_config(), MemberId(member), "127.0.0.1:1"),
            backend: NodeBackend::new(node.handles.clone(), 1),
            session_number: 0,
            request: 0,
        }
    }

    /// Sends one SDK-framed request and reads the reply with the SDK's
    /// rules: the body, or the error code.
    fn call(&mut self, node: &mut Node, code: u32, payload: &[u8]) -> Result<Vec<u8>, u32> {
        self.request += 1;
        let frame = sdk_frame(code, payload, self.session_number, self.request);
        self.session.receive(&frame);
        let out = node.run(self.session.next_output(&mut self.backend));
        match out {
            Some(Output::Reply(bytes)) => sdk_reply(&bytes),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    /// Logs in; the raw reply frame (an eviction on failure).
    fn login_frame(&mut self, node: &mut Node, password: &str) -> Vec<u8> {
        let body = LoginRegisterRequest {
            version_info: ClientVersionInfo {
                protocol_version: IGGY_PROTOCOL_VERSION,
                sdk_name: WireName::new("rust-sdk").unwrap(),
                sdk_version: WireName::new("0.11.0").unwrap(),
            },
            username: WireName::new("iggy").unwrap(),
            password: secrecy::SecretString::from(password.to_owned()),
            client_context: None,
        }
        .to_bytes()
        .to_vec();
        self.request += 1;
        self.session.receive(&sdk_frame(40, &body, 0, 0));
        match node.run(self.session.next_output(&mut self.backend)) {
            Some(Output::Reply(bytes)) => bytes,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn login(&mut self, node: &mut Node) {
        let frame = self.login_frame(node, "iggy");
        let body = sdk_reply(&frame).expect("login accepted");
        self.session_number = u64::from_le_bytes(body[4..12].try_into().unwrap());
        assert_ne!(self.session_number, 0);
    }
}

/// A request frame exactly as the SDK builds it (the rules of
/// `iggy::vsr::encode_request_header`, as in the codec tests).
fn sdk_frame(code: u32, payload: &[u8], session: u64, request: u64) -> Vec<u8> {
    let operation = match code {
        40 | 45 => Operation::Register,
        39 => Operation::Logout,
        _ => Operation::from_command_code(code).unwrap_or(Operation::NonReplicated),
    };
    let (request, session) = match operation {
        Operation::Register => (0, 0),
        _ => (request, session),
    };
    let request_checksum = if operation.is_partition() || operation == Operation::NonReplicated {
        0
    } else {
        u128::from(xxhash_rust::xxh3::xxh3_64(payload))
    };
    let mut reserved = [0u8; 60];
    if operation == Operation::NonReplicated {
        reserved[..4].copy_from_slice(&code.to_le_bytes());
    }
    let header = iggy_binary_protocol::RequestHeader {
        command: WireCommand::Request,
        operation,
        size: (HEADER_SIZE + payload.len()) as u32,
        client: CLIENT,
        request,
        session,
        request_checksum,
        timestamp: 0,
        reserved,
        ..Default::default()
    };
    let mut out = bytemuck::bytes_of(&header).to_vec();
    out.extend_from_slice(payload);
    out
}

/// A reply as the SDK reads it: the body after any result section, or
/// the error code (from the status or the result section).
fn sdk_reply(frame: &[u8]) -> Result<Vec<u8>, u32> {
    use iggy_binary_protocol::ReplyHeader as R;
    let header: &[u8; HEADER_SIZE] = frame[..HEADER_SIZE].try_into().unwrap();
    assert_eq!(header[60], WireCommand::Reply as u8, "not a reply");
    let at = std::mem::offset_of!(R, status);
    let status = u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    if status != 0 {
        return Err(status);
    }
    let at = std::mem::offset_of!(R, operation);
    let operation: Operation = *bytemuck::checked::try_from_bytes(&header[at..=at]).unwrap();
    let body = &frame[HEADER_SIZE..];
    let framed =
        operation.is_result_framed() || (operation == Operation::Register && !body.is_empty());
    if !framed {
        return Ok(body.to_vec());
    }
    match iggy_binary_protocol::result_code(body) {
        Some(0) => Ok(body[iggy_binary_protocol::result_section_len(body).unwrap()..].to_vec()),
        Some(code) => Err(code),
        None => panic!("malformed result section"),
    }
}

fn wstr(s: &str) -> WireIdentifier {
    WireIdentifier::named(s).unwrap()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn create_stream(node: &mut Node, c: &mut Client, name: &str) -> Vec<u8> {
    let body = CreateStreamRequest {
        name: WireName::new(name).unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    c.call(node, 202, &body).expect("stream created")
}

fn create_topic(node: &mut Node, c: &mut Client, stream: &str, name: &str, partitions: u32) {
    let body = CreateTopicRequest {
        stream_id: wstr(stream),
        partitions_count: partitions,
        name: WireName::new(name).unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    let details = c.call(node, 302, &body).expect("topic created");
    // Topic header: id, created_at, partitions_count.
    assert_eq!(u32_at(&details, 12), partitions);
}

/// Sends `payloads` as one batch; the confirmation's (partition, base).
fn send(
    node: &mut Node,
    c: &mut Client,
    partitioning: WirePartitioning,
    payloads: &[&str],
) -> Result<(u32, u64), u32> {
    let messages: Vec<RawMessage<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| RawMessage {
            id: 1000 + i as u128,
            origin_timestamp: 1_000 + i as u64,
            headers: None,
            payload: p.as_bytes(),
        })
        .collect();
    let mut buf = BytesMut::new();
    SendMessagesEncoder::encode(&mut buf, &wstr("s"), &wstr("t"), &partitioning, &messages)
        .unwrap();
    let reply = c.call(node, 101, &buf)?;
    assert_eq!(u32_at(&reply, 0), 1, "one confirmation");
    Ok((u32_at(&reply, 12), u64_at(&reply, 16)))
}

/// A poll reply: partition, head, and the (offset, payload) of every
/// message, each batch verified whole (checksums included).
struct Polled {
    partition: u32,
    head: u64,
    messages: Vec<(u64, String)>,
}

fn poll(
    node: &mut Node,
    c: &mut Client,
    consumer: WireConsumer,
    partition: u32,
    strategy: WirePollingStrategy,
    count: u32,
    auto_commit: bool,
) -> Result<Polled, u32> {
    let body = PollMessagesRequest {
        consumer,
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partition_id: Some(partition),
        strategy,
        count,
        auto_commit,
    }
    .to_bytes();
    let reply = c.call(node, 100, &body)?;
    let declared = u32_at(&reply, 12);
    let mut messages = Vec::new();
    let mut at = 16;
    while at < reply.len() {
        let h = BatchHeader::decode(&reply[at..], u64::MAX).unwrap();
        let end = at + h.batch_length as usize;
        let view = BatchView::decode_exact(&reply[at..end], Integrity::Verify, u64::MAX).unwrap();
        for m in view.messages() {
            messages.push((m.offset, String::from_utf8(m.payload.to_vec()).unwrap()));
        }
        at = end;
    }
    assert_eq!(declared as usize, messages.len(), "declared count");
    Ok(Polled {
        partition: u32_at(&reply, 0),
        head: u64_at(&reply, 4),
        messages,
    })
}

fn consumer(id: &str) -> WireConsumer {
    WireConsumer::consumer(wstr(id))
}

fn group(id: &str) -> WireConsumer {
    WireConsumer::consumer_group(wstr(id))
}

fn stored_offset(
    node: &mut Node,
    c: &mut Client,
    who: WireConsumer,
    partition: u32,
) -> Option<u64> {
    let body = GetConsumerOffsetRequest {
        consumer: who,
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partition_id: Some(partition),
    }
    .to_bytes();
    let reply = c.call(node, 120, &body).expect("offset read");
    if reply.is_empty() {
        return None;
    }
    assert_eq!(u32_at(&reply, 0), partition);
    Some(u64_at(&reply, 12))
}

fn group_request(name: &str) -> (WireIdentifier, WireIdentifier, WireIdentifier) {
    (wstr("s"), wstr("t"), wstr(name))
}

fn sync(node: &mut Node, c: &mut Client, name: &str) -> Option<Vec<u32>> {
    let (stream_id, topic_id, group_id) = group_request(name);
    let body = SyncConsumerGroupRequest {
        stream_id,
        topic_id,
        group_id,
    }
    .to_bytes();
    let reply = c.call(node, 606, &body).expect("sync");
    if reply.is_empty() {
        return None;
    }
    let count = u32_at(&reply, 8) as usize;
    Some((0..count).map(|i| u32_at(&reply, 12 + 4 * i)).collect())
}

fn setup() -> (Node, Client) {
    let mut node = Node::boot();
    let mut c = Client::connect(&node, 1);
    c.login(&mut node);
    create_stream(&mut node, &mut c, "s");
    create_topic(&mut node, &mut c, "s", "t", 3);
    (node, c)
}

#[test]
fn given_a_topic_when_sent_with_each_partitioning_should_land_and_poll_back_in_order() {
    let (mut node, mut c) = setup();

    // By partition id: offsets start at 0 and follow on.
    assert_eq!(
        send(
            &mut node,
            &mut c,
            WirePartitioning::PartitionId(1),
            &["a", "b"]
        ),
        Ok((1, 0))
    );
    assert_eq!(
        send(&mut node, &mut c, WirePartitioning::PartitionId(1), &["c"]),
        Ok((1, 2))
    );
    // Balanced: round robin over the three partitions.
    let mut balanced: Vec<u32> = (0..3)
        .map(|i| {
            send(
                &mut node,
                &mut c,
                WirePartitioning::Balanced,
                &[&format!("r{i}")],
            )
            .unwrap()
            .0
        })
        .collect();
    balanced.sort_unstable();
    assert_eq!(balanced, vec![0, 1, 2]);
    // By key: the same key always lands on the same partition.
    let key = WirePartitioning::messages_key(b"user-7".to_vec()).unwrap();
    let (p1, _) = send(&mut node, &mut c, key.clone(), &["k1"]).unwrap();
    let (p2, _) = send(&mut node, &mut c, key, &["k2"]).unwrap();
    assert_eq!(p1, p2);
    // A partition that does not exist.
    assert_eq!(
        send(&mut node, &mut c, WirePartitioning::PartitionId(3), &["x"]),
        Err(3007)
    );

    // Poll partition 1 by offset: a cut inside the first batch.
    let got = poll(
        &mut node,
        &mut c,
        consumer("reader"),
        1,
        WirePollingStrategy::offset(1),
        2,
        false,
    )
    .unwrap();
    assert_eq!(got.partition, 1);
    assert_eq!(got.messages, vec![(1, "b".to_owned()), (2, "c".to_owned())]);
    assert!(got.head >= 2);

    // Next with auto-commit walks the partition once, then stops.
    let mut seen = Vec::new();
    for _ in 0..10 {
        let got = poll(
            &mut node,
            &mut c,
            consumer("reader"),
            1,
            WirePollingStrategy::next(),
            1,
            true,
        )
        .unwrap();
        if got.messages.is_empty() {
            break;
        }
        seen.extend(got.messages.into_iter().map(|(o, _)| o));
    }
    assert_eq!(&seen[..3], &[0, 1, 2]);
    let head = seen.last().copied().unwrap();
    // The auto-committed offset is the consumer's stored offset (its
    // replicated store is submitted on the partition's next tick).
    node.idle(20);
    assert_eq!(
        stored_offset(&mut node, &mut c, consumer("reader"), 1),
        Some(head)
    );

    // Store / get / delete an offset explicitly.
    let store = StoreConsumerOffsetRequest {
        consumer: consumer("other"),
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partition_id: Some(1),
        offset: 1,
        ack: WireAck::Quorum,
    }
    .to_bytes();
    c.call(&mut node, 121, &store).expect("stored");
    assert_eq!(
        stored_offset(&mut node, &mut c, consumer("other"), 1),
        Some(1)
    );
    let next = poll(
        &mut node,
        &mut c,
        consumer("other"),
        1,
        WirePollingStrategy::next(),
        10,
        false,
    )
    .unwrap();
    assert_eq!(next.messages.first().map(|m| m.0), Some(2));
    let delete = DeleteConsumerOffsetRequest {
        consumer: consumer("other"),
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partition_id: Some(1),
        ack: WireAck::Quorum,
    }
    .to_bytes();
    c.call(&mut node, 122, &delete).expect("deleted");
    assert_eq!(stored_offset(&mut node, &mut c, consumer("other"), 1), None);

    // The topic's numbers add up the partitions' (GET_TOPIC).
    let get = GetTopicRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
    }
    .to_bytes();
    let details = c.call(&mut node, 300, &get).unwrap();
    // Topic header: id 4, created 8, partitions 4, expiry 8, compression
    // 1, max size 8, size 8, then messages_count.
    let messages_count = u64_at(&details, 4 + 8 + 4 + 8 + 1 + 8 + 8);
    assert_eq!(messages_count, 8);
}

#[test]
fn given_two_members_when_polling_through_a_group_should_split_partitions_and_gate_polls() {
    let (mut node, mut a) = setup();
    for p in 0..3 {
        send(
            &mut node,
            &mut a,
            WirePartitioning::PartitionId(p),
            &[&format!("p{p}")],
        )
        .unwrap();
    }
    let (stream_id, topic_id, _) = group_request("g");
    let create = CreateConsumerGroupRequest {
        stream_id,
        topic_id,
        name: WireName::new("g").unwrap(),
    }
    .to_bytes();
    let details = a.call(&mut node, 602, &create).expect("group created");
    assert_eq!(u32_at(&details, 4), 3, "partitions count");
    assert_eq!(a.call(&mut node, 602, &create), Err(5004));

    // Not a member yet: sync is empty, a poll is 5006.
    assert_eq!(sync(&mut node, &mut a, "g"), None);
    assert_eq!(
        poll(
            &mut node,
            &mut a,
            group("g"),
            0,
            WirePollingStrategy::next(),
            10,
            true
        )
        .err(),
        Some(5006)
    );

    let mut b = Client::connect(&node, 2);
    b.login(&mut node);
    for client in [&mut a, &mut b] {
        let (stream_id, topic_id, group_id) = group_request("g");
        let join = JoinConsumerGroupRequest {
            stream_id,
            topic_id,
            group_id,
        }
        .to_bytes();
        client.call(&mut node, 604, &join).expect("joined");
    }
    let mine_a = sync(&mut node, &mut a, "g").unwrap();
    let mine_b = sync(&mut node, &mut b, "g").unwrap();
    let mut all: Vec<u32> = mine_a.iter().chain(&mine_b).copied().collect();
    all.sort_unstable();
    assert_eq!(all, vec![0, 1, 2], "every partition owned once");
    assert!(!mine_a.is_empty() && !mine_b.is_empty());

    // Each member polls its own partitions; another's is 5009.
    let got = poll(
        &mut node,
        &mut a,
        group("g"),
        mine_a[0],
        WirePollingStrategy::next(),
        10,
        true,
    )
    .unwrap();
    assert_eq!(got.messages, vec![(0, format!("p{}", mine_a[0]))]);
    assert_eq!(
        poll(
            &mut node,
            &mut a,
            group("g"),
            mine_b[0],
            WirePollingStrategy::next(),
            10,
            true
        )
        .err(),
        Some(5009)
    );
    // The group's offset is kept under the group, readable by anyone.
    node.idle(20);
    assert_eq!(
        stored_offset(&mut node, &mut b, group("g"), mine_a[0]),
        Some(0)
    );

    // B leaves: A owns everything.
    let (stream_id, topic_id, group_id) = group_request("g");
    let leave = LeaveConsumerGroupRequest {
        stream_id,
        topic_id,
        group_id,
    }
    .to_bytes();
    b.call(&mut node, 605, &leave).expect("left");
    assert_eq!(sync(&mut node, &mut b, "g"), None);
    assert_eq!(sync(&mut node, &mut a, "g"), Some(vec![0, 1, 2]));
    assert_eq!(b.call(&mut node, 605, &leave), Err(5006));

    // A member whose connection goes away leaves through EndSession: B
    // rejoins, takes partitions, then disconnects.
    let (stream_id, topic_id, group_id) = group_request("g");
    let join = JoinConsumerGroupRequest {
        stream_id,
        topic_id,
        group_id,
    }
    .to_bytes();
    b.call(&mut node, 604, &join).expect("rejoined");
    assert_eq!(
        sync(&mut node, &mut b, "g").map(|p| p.is_empty()),
        Some(false)
    );
    node.run(b.session.disconnect(&mut b.backend));
    assert_eq!(sync(&mut node, &mut a, "g"), Some(vec![0, 1, 2]));

    // GET_CONSUMER_GROUPS lists it; DELETE removes it.
    let list = GetConsumerGroupsRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
    }
    .to_bytes();
    let groups = a.call(&mut node, 601, &list).unwrap();
    assert_eq!(u32_at(&groups, 8), 1, "one member");
    let (stream_id, topic_id, group_id) = group_request("g");
    let delete = DeleteConsumerGroupRequest {
        stream_id,
        topic_id,
        group_id,
    }
    .to_bytes();
    a.call(&mut node, 603, &delete).expect("deleted");
    assert_eq!(a.call(&mut node, 601, &list), Ok(Vec::new()));
    assert_eq!(a.call(&mut node, 603, &delete), Err(5003));
}

#[test]
fn given_a_wrong_password_or_missing_objects_when_asked_should_answer_their_codes() {
    let mut node = Node::boot();
    let mut c = Client::connect(&node, 1);
    // A wrong password is an eviction (reason 9, InvalidCredentials).
    let frame = c.login_frame(&mut node, "wrong");
    assert_eq!(frame.len(), HEADER_SIZE);
    assert_eq!(frame[60], WireCommand::Eviction as u8, "an eviction");
    assert_eq!(frame[255], 9, "reason: invalid credentials");
    c.login(&mut node);

    // A missing stream: GET is empty, GET_TOPICS and DELETE name it.
    let get = GetStreamRequest {
        stream_id: wstr("nope"),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 200, &get), Ok(Vec::new()));
    let topics = GetTopicsRequest {
        stream_id: wstr("nope"),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 301, &topics), Err(1010));
    let delete = DeleteStreamRequest {
        stream_id: WireIdentifier::numeric(77),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 203, &delete), Err(1009));
    let topic = CreateTopicRequest {
        stream_id: wstr("nope"),
        partitions_count: 1,
        name: WireName::new("t").unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 302, &topic), Err(1010));

    // A duplicate stream name; then streams list and delete.
    let details = create_stream(&mut node, &mut c, "s");
    let id = u32_at(&details, 0);
    let again = CreateStreamRequest {
        name: WireName::new("s").unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 202, &again), Err(1012));
    let listed = c
        .call(&mut node, 201, &GetStreamsRequest.to_bytes())
        .unwrap();
    assert_eq!(u32_at(&listed, 0), id);
    let delete = DeleteStreamRequest {
        stream_id: WireIdentifier::numeric(id),
    }
    .to_bytes();
    c.call(&mut node, 203, &delete).expect("deleted");
    let get = GetStreamRequest {
        stream_id: WireIdentifier::numeric(id),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 200, &get), Ok(Vec::new()));
}

#[test]
fn given_a_topic_when_partitions_change_purged_flushed_and_renamed_should_report_it() {
    let (mut node, mut c) = setup();
    send(
        &mut node,
        &mut c,
        WirePartitioning::PartitionId(0),
        &["a", "b"],
    )
    .unwrap();
    let flush = iggy_binary_protocol::requests::messages::FlushUnsavedBufferRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partition_id: 0,
        fsync: true,
    }
    .to_bytes();
    c.call(&mut node, 102, &flush).expect("flushed");
    let flushed = poll(
        &mut node,
        &mut c,
        consumer("r"),
        0,
        WirePollingStrategy::first(),
        10,
        false,
    )
    .unwrap();
    assert_eq!(
        flushed.messages.len(),
        2,
        "a flushed partition still serves"
    );

    let topic_partitions = |node: &mut Node, c: &mut Client| {
        let get = GetTopicRequest {
            stream_id: wstr("s"),
            topic_id: wstr("t"),
        }
        .to_bytes();
        u32_at(&c.call(node, 300, &get).unwrap(), 12)
    };
    use iggy_binary_protocol::requests::partitions::{
        CreatePartitionsRequest, DeletePartitionsRequest,
    };
    let add = CreatePartitionsRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partitions_count: 2,
    }
    .to_bytes();
    c.call(&mut node, 402, &add).expect("added");
    assert_eq!(topic_partitions(&mut node, &mut c), 5);
    // The new partitions serve at once (their groups were created by the
    // committed op's effects).
    assert_eq!(
        send(&mut node, &mut c, WirePartitioning::PartitionId(4), &["n"]),
        Ok((4, 0))
    );
    let remove = DeletePartitionsRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
        partitions_count: 1,
    }
    .to_bytes();
    c.call(&mut node, 403, &remove).expect("removed");
    assert_eq!(topic_partitions(&mut node, &mut c), 4);
    assert_eq!(
        send(&mut node, &mut c, WirePartitioning::PartitionId(4), &["x"]),
        Err(3007)
    );

    // Purge: once it is answered, the partitions have applied it. The
    // next poll, with no time between, reads nothing, and the next produce
    // lands after the purge, so it is not erased by it.
    let purge = PurgeTopicRequest {
        stream_id: wstr("s"),
        topic_id: wstr("t"),
    }
    .to_bytes();
    c.call(&mut node, 305, &purge).expect("purged");
    let poll_first = |node: &mut Node, c: &mut Client| {
        poll(
            node,
            c,
            consumer("r"),
            0,
            WirePollingStrategy::first(),
            10,
            false,
        )
        .unwrap()
    };
    let after = poll_first(&mut node, &mut c);
    assert!(after.messages.is_empty(), "{:?}", after.messages);
    assert_eq!(
        send(&mut node, &mut c, WirePartitioning::PartitionId(0), &["p"]),
        Ok((0, 0)),
        "the purge starts the offsets again"
    );
    node.idle(50);
    let kept = poll_first(&mut node, &mut c);
    assert_eq!(
        kept.messages.len(),
        1,
        "a produce after the purge's answer is kept"
    );

    // A stream purge waits for its partitions the same way.
    let purge_stream = PurgeStreamRequest {
        stream_id: wstr("s"),
    }
    .to_bytes();
    c.call(&mut node, 205, &purge_stream)
        .expect("stream purged");
    let after = poll_first(&mut node, &mut c);
    assert!(after.messages.is_empty(), "{:?}", after.messages);

    // Rename the stream: the old name is gone, the new one answers.
    let rename = UpdateStreamRequest {
        stream_id: wstr("s"),
        name: WireName::new("s2").unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    c.call(&mut node, 204, &rename).expect("renamed");
    let old = GetStreamRequest {
        stream_id: wstr("s"),
    }
    .to_bytes();
    assert_eq!(c.call(&mut node, 200, &old), Ok(Vec::new()));
    let new = GetStreamRequest {
        stream_id: wstr("s2"),
    }
    .to_bytes();
    assert!(!c.call(&mut node, 200, &new).unwrap().is_empty());
}
