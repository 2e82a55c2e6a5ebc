//! Three partition replicas in one thread over the in-memory bus with the
//! VSR harness's network faults (drop, duplicate, delay/reorder): 10,000
//! messages produced by retrying clients; every replica's polls return the
//! same messages; after a flush, the three partition directories hold
//! byte-identical segment files.
#![allow(clippy::unwrap_used)]

use common::{ConsumerKind, GroupId, Offset, ReplicaId};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::simnet::NetworkFaults;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome, TimeoutConfig};
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, Partition, PartitionConfig,
    PartitionError, PollRequest, PollingStrategy,
};
use storage::BatchBuilder;
use storage::fs::{FileKind, Fs, SimFs};

type Replica = Partition<InMemoryBus, MemSuperblock, SimFs>;

const REPLICAS: u8 = 3;
const GROUP: u64 = 5;
const CLIENTS: u64 = 8;
const MESSAGES_PER_BATCH: u32 = 10;
const MESSAGES_TOTAL: u64 = 10_000;
const RETRY_TICKS: u64 = 30;
const TICK_US: u64 = 10_000;

/// Seeds per scenario (`PARTITION_CLUSTER_SEEDS`, default 3).
fn seeds() -> u64 {
    std::env::var("PARTITION_CLUSTER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

fn pdir() -> PathBuf {
    PathBuf::from("/data/p")
}

fn replica_config(replica: u8) -> PartitionConfig {
    let mut vsr = Config::new(ReplicaId(replica), REPLICAS, GroupId(GROUP));
    vsr.timeouts = TimeoutConfig::scaled_down(5);
    vsr.retention_ops = 8192;
    vsr.seed = 77;
    let mut c = PartitionConfig::new(vsr);
    c.partition_id = 1;
    c.log.segment_size_bytes = 64 * 1024;
    c
}

struct Client {
    id: u128,
    session: Option<u64>,
    /// The request in flight: number, op, ticks since sent, target.
    in_flight: Option<(u64, ClientOp)>,
    sent_at: u64,
    target: u8,
    next_request: u64,
    batches_left: u64,
    acked_ids: Vec<u128>,
}

fn client_batch(client: u128, n: u64) -> (Vec<u8>, Vec<u128>) {
    let mut b = BatchBuilder::new(n);
    let mut ids = Vec::new();
    for i in 0..MESSAGES_PER_BATCH {
        let id = client << 64 | u128::from(n) << 16 | u128::from(i);
        ids.push(id);
        b.push(id, i, format!("c{client}-b{n}-m{i}").as_bytes(), b"h");
    }
    (b.build(), ids)
}

struct Cluster {
    net: InMemoryNetwork,
    fss: Vec<SimFs>,
    replicas: Vec<Replica>,
    now: u64,
    refused_prepares: u64,
}

impl Cluster {
    fn new(seed: u64, faults: NetworkFaults) -> Self {
        let net = InMemoryNetwork::new(seed, REPLICAS, faults);
        let mut fss = Vec::new();
        let mut replicas = Vec::new();
        for r in 0..REPLICAS {
            let fs = SimFs::new(seed + u64::from(r));
            let p = block_on(Partition::open(
                replica_config(r),
                fs.clone(),
                &pdir(),
                net.endpoint(ReplicaId(r)),
                MemSuperblock::new(),
            ))
            .unwrap();
            fss.push(fs);
            replicas.push(p);
        }
        Self {
            net,
            fss,
            replicas,
            now: 0,
            refused_prepares: 0,
        }
    }

    fn step(&mut self) {
        self.now += 1;
        for (to, frame) in self.net.tick() {
            match block_on(self.replicas[usize::from(to)].on_frame(frame)) {
                Ok(()) | Err(PartitionError::Frame(_)) => {}
                Err(PartitionError::PrepareOffsetMismatch { .. }) => self.refused_prepares += 1,
                Err(e) => panic!("replica {to}: {e}"),
            }
        }
        for r in &mut self.replicas {
            block_on(r.on_tick(self.now * TICK_US)).unwrap();
        }
    }

    fn submit(&mut self, to: u8, request: ClientRequest) -> RequestOutcome {
        block_on(self.replicas[usize::from(to)].submit(request, self.now * TICK_US)).unwrap()
    }
}

fn run(seed: u64, isolate_primary_at: Option<u64>) {
    let faults = NetworkFaults {
        drop_per_mille: 30,
        duplicate_per_mille: 20,
        delay_ticks_max: 3,
    };
    let mut cluster = Cluster::new(seed, faults);
    let batches_total = MESSAGES_TOTAL / u64::from(MESSAGES_PER_BATCH);
    let mut clients: Vec<Client> = (1..=CLIENTS)
        .map(|id| Client {
            id: u128::from(id),
            session: None,
            in_flight: None,
            sent_at: 0,
            target: 0,
            next_request: 1,
            batches_left: batches_total / CLIENTS,
            acked_ids: Vec::new(),
        })
        .collect();
    let mut pending_ids: Vec<Vec<u128>> = vec![Vec::new(); clients.len()];
    let mut ticks = 0;
    while clients
        .iter()
        .any(|c| c.batches_left > 0 || c.in_flight.is_some())
    {
        ticks += 1;
        assert!(ticks < 200_000, "no progress: {} ticks", ticks);
        // Cut the view-0 primary off for a while: a view change, clients
        // retrying elsewhere, possibly requests ordered twice.
        if let Some(at) = isolate_primary_at {
            if ticks == at {
                let primary = cluster.replicas[0].replica().primary_index(0).0;
                cluster.net.isolate(Some(ReplicaId(primary)));
            } else if ticks == at + 600 {
                cluster.net.isolate(None);
            }
        }
        // Clients send or retry.
        for (ci, c) in clients.iter_mut().enumerate() {
            if c.in_flight.is_none() {
                if c.session.is_none() {
                    c.in_flight = Some((0, ClientOp::Register));
                } else if c.batches_left > 0 {
                    let (bytes, ids) = client_batch(c.id, c.next_request);
                    pending_ids[ci] = ids;
                    c.in_flight = Some((c.next_request, ClientOp::Append(bytes)));
                } else {
                    continue;
                }
                c.sent_at = 0;
            }
            if c.sent_at == 0 || cluster.now - c.sent_at >= RETRY_TICKS {
                if c.sent_at != 0 {
                    c.target = (c.target + 1) % REPLICAS;
                }
                c.sent_at = cluster.now.max(1);
                let (request, op) = c.in_flight.clone().unwrap();
                let outcome = cluster.submit(
                    c.target,
                    ClientRequest {
                        client: c.id,
                        session: c.session.unwrap_or(0),
                        request,
                        user_id: 1,
                        op,
                    },
                );
                if outcome == RequestOutcome::Unavailable {
                    // Try the next replica on the next tick.
                    c.sent_at = cluster.now.saturating_sub(RETRY_TICKS).max(1);
                }
            }
        }
        cluster.step();
        // Replies.
        for r in 0..REPLICAS {
            for reply in cluster.net.take_replies(ReplicaId(r)) {
                let Some(ci) = clients.iter().position(|c| c.id == reply.client) else {
                    continue;
                };
                let c = &mut clients[ci];
                let Some((request, _)) = c.in_flight.as_ref() else {
                    continue;
                };
                if reply.request != *request {
                    continue;
                }
                match reply.status {
                    ReplyStatus::Ok | ReplyStatus::AlreadyApplied => {
                        if *request == 0 {
                            c.session = Some(reply.session);
                        } else {
                            c.acked_ids.append(&mut pending_ids[ci]);
                            c.batches_left -= 1;
                            c.next_request += 1;
                        }
                        c.target = r;
                        c.in_flight = None;
                    }
                    ReplyStatus::NoSession | ReplyStatus::Fenced => {
                        c.session = None;
                        c.in_flight = None;
                    }
                }
            }
        }
    }
    // Heal and converge.
    cluster.net.set_faults(NetworkFaults::default());
    cluster.net.isolate(None);
    let target = cluster
        .replicas
        .iter()
        .map(|r| r.replica().commit_max().0)
        .max()
        .unwrap();
    for _ in 0..20_000 {
        if cluster
            .replicas
            .iter()
            .all(|r| r.replica().commit_min().0 >= target)
        {
            break;
        }
        cluster.step();
    }
    let frontiers: Vec<u64> = cluster
        .replicas
        .iter()
        .map(|r| r.offset_frontier().0)
        .collect();
    assert!(
        frontiers.iter().all(|f| *f == frontiers[0]),
        "{frontiers:?}"
    );
    assert!(frontiers[0] >= MESSAGES_TOTAL, "{frontiers:?}");
    for r in &cluster.replicas {
        assert!(r.fenced().is_none());
    }
    // Identical polls on every replica, in pages, and every acknowledged
    // message present.
    let mut per_replica = Vec::new();
    for r in &cluster.replicas {
        let mut all = Vec::new();
        let mut at = 0;
        while at < frontiers[0] {
            let p = block_on(r.poll(&PollRequest {
                consumer: (ConsumerKind::Consumer, 1),
                strategy: PollingStrategy::Offset(at),
                count: 777,
                auto_commit: false,
            }))
            .unwrap();
            assert!(!p.is_empty());
            for m in p.messages() {
                all.push((m.offset, m.id, m.payload.to_vec()));
            }
            at = p.last_offset.0 + 1;
        }
        per_replica.push(all);
    }
    assert_eq!(per_replica[0], per_replica[1]);
    assert_eq!(per_replica[0], per_replica[2]);
    let offsets: Vec<u64> = per_replica[0].iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, (0..frontiers[0]).collect::<Vec<_>>());
    let stored: BTreeSet<u128> = per_replica[0].iter().map(|(_, id, _)| *id).collect();
    for c in &clients {
        for id in &c.acked_ids {
            assert!(stored.contains(id), "acknowledged message {id:#x} missing");
        }
    }
    // Flush, then the segment files are byte-identical.
    for r in &mut cluster.replicas {
        block_on(r.flush_committed_messages()).unwrap();
    }
    let listing = |fs: &SimFs| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = block_on(fs.read_dir(&pdir()))
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .filter_map(|e| {
                let name = e.name_str()?.to_owned();
                (name.ends_with(".log") || name.ends_with(".index")).then_some(name)
            })
            .map(|name| {
                let bytes = fs.contents(&Path::new("/data/p").join(&name)).unwrap();
                (name, bytes)
            })
            .collect();
        files.sort();
        files
    };
    let a = listing(&cluster.fss[0]);
    assert!(
        a.len() >= 8,
        "expected several segments, got {}",
        a.len() / 2
    );
    assert_eq!(a, listing(&cluster.fss[1]));
    assert_eq!(a, listing(&cluster.fss[2]));
    let (sent, dropped) = cluster.net.counts();
    assert!(dropped > 0 && sent > dropped);
    let views: Vec<u32> = cluster
        .replicas
        .iter()
        .map(|r| r.replica().view())
        .collect();
    if isolate_primary_at.is_some() {
        assert!(views.iter().all(|v| *v > 0), "no view change: {views:?}");
    }
    eprintln!(
        "seed {seed}: {ticks} ticks, views {views:?}, {} messages, {} segments, {sent} frames ({dropped} dropped), {} prepares refused",
        frontiers[0],
        a.len() / 2,
        cluster.refused_prepares
    );
}

#[test]
fn given_three_replicas_with_network_faults_when_10k_messages_produced_should_agree_byte_for_byte()
{
    for seed in 1..=seeds() {
        run(seed, None);
    }
}

#[test]
fn given_primary_cut_off_mid_run_when_10k_messages_produced_should_change_view_and_agree() {
    for seed in 1..=seeds() {
        run(1000 + seed, Some(200));
    }
}

#[test]
fn given_prepare_with_wrong_base_offset_when_received_by_backup_should_refuse_without_journaling() {
    use consensus::vsr::{Frame, Message, Prepare, body_checksum};
    let mut cluster = Cluster::new(99, NetworkFaults::default());
    let primary = cluster.replicas[0].replica().primary_index(0).0;
    let backup = (primary + 1) % REPLICAS;
    // Register and produce one batch through the primary.
    cluster.submit(
        primary,
        ClientRequest {
            client: 1,
            session: 0,
            request: 0,
            user_id: 1,
            op: ClientOp::Register,
        },
    );
    for _ in 0..5 {
        cluster.step();
    }
    let session = cluster
        .net
        .take_replies(ReplicaId(primary))
        .last()
        .map(|r| r.session)
        .unwrap();
    let (bytes, _) = client_batch(1, 1);
    cluster.submit(
        primary,
        ClientRequest {
            client: 1,
            session,
            request: 1,
            user_id: 1,
            op: ClientOp::Append(bytes),
        },
    );
    // Long enough for a commit heartbeat to reach the backup.
    for _ in 0..40 {
        cluster.step();
    }
    let head = cluster.replicas[usize::from(backup)].replica().op();
    let last = cluster.replicas[usize::from(backup)]
        .replica()
        .journal_entry(head)
        .cloned()
        .unwrap();
    // A forged next prepare from the primary, correctly chained and
    // checksummed, whose batch starts at the wrong offset.
    let forge = |base_offset: u64| {
        let mut b = BatchBuilder::new(1);
        b.push(9, 0, b"forged", b"");
        let body = bytes::Bytes::from(b.build_stamped(1, base_offset, 5).unwrap());
        let mut header = last.header;
        header.op = head + 1;
        header.parent = last.header.checksum;
        header.request = 2;
        header.checksum_body = body_checksum(&body);
        header.checksum = header.compute_checksum();
        Frame {
            group: GroupId(GROUP),
            replica: ReplicaId(primary),
            view: 0,
            message: Message::Prepare(Prepare { header, body }),
        }
    };
    let expected = cluster.replicas[usize::from(backup)].offset_frontier().0;
    assert_eq!(expected, u64::from(MESSAGES_PER_BATCH));
    let res = block_on(cluster.replicas[usize::from(backup)].on_frame(forge(expected + 1)));
    assert!(
        matches!(res, Err(PartitionError::PrepareOffsetMismatch { expected: e, actual: a, .. }) if e == Offset(expected) && a == Offset(expected + 1)),
        "{res:?}"
    );
    assert!(
        cluster.replicas[usize::from(backup)]
            .replica()
            .journal_entry(head + 1)
            .is_none()
    );
    // The same prepare at the right offset is journaled.
    block_on(cluster.replicas[usize::from(backup)].on_frame(forge(expected))).unwrap();
    assert!(
        cluster.replicas[usize::from(backup)]
            .replica()
            .journal_entry(head + 1)
            .is_some()
    );
}

/// Registers `client` through `primary` and returns its session.
fn register(cluster: &mut Cluster, primary: u8, client: u128) -> u64 {
    cluster.submit(
        primary,
        ClientRequest {
            client,
            session: 0,
            request: 0,
            user_id: 1,
            op: ClientOp::Register,
        },
    );
    for _ in 0..5 {
        cluster.step();
    }
    cluster
        .net
        .take_replies(ReplicaId(primary))
        .iter()
        .rev()
        .find(|r| r.client == client)
        .map(|r| r.session)
        .unwrap()
}

#[test]
fn given_purge_pipelined_with_appends_when_committed_should_restart_offsets_on_every_replica() {
    let mut cluster = Cluster::new(7, NetworkFaults::default());
    let primary = cluster.replicas[0].replica().primary_index(0).0;
    let s1 = register(&mut cluster, primary, 1);
    let s2 = register(&mut cluster, primary, 2);
    for n in 1..=3 {
        let (bytes, _) = client_batch(1, n);
        cluster.submit(
            primary,
            ClientRequest {
                client: 1,
                session: s1,
                request: n,
                user_id: 1,
                op: ClientOp::Append(bytes),
            },
        );
        cluster.step();
    }
    cluster.submit(
        primary,
        ClientRequest {
            client: 2,
            session: s2,
            request: 1,
            user_id: 1,
            op: ClientOp::StoreOffset {
                kind: ConsumerKind::ConsumerGroup,
                id: 5,
                offset: Offset(12),
            },
        },
    );
    for _ in 0..40 {
        cluster.step();
    }
    for r in &cluster.replicas {
        assert_eq!(r.offset_frontier().0, 30);
        assert_eq!(
            r.stored_offset(ConsumerKind::ConsumerGroup, 5),
            Some(Offset(12))
        );
    }
    // The purge and an append ordered right behind it, before either
    // commits: the append is stamped at offset 0 by the primary's fold.
    cluster.submit(
        primary,
        ClientRequest {
            client: 2,
            session: s2,
            request: 2,
            user_id: 1,
            op: ClientOp::Purge { generation: 1 },
        },
    );
    let (bytes, _) = client_batch(1, 4);
    let out = cluster.submit(
        primary,
        ClientRequest {
            client: 1,
            session: s1,
            request: 4,
            user_id: 1,
            op: ClientOp::Append(bytes),
        },
    );
    assert!(matches!(out, RequestOutcome::Prepared { .. }));
    for _ in 0..40 {
        cluster.step();
    }
    let mut polls = Vec::new();
    for r in &cluster.replicas {
        assert!(r.fenced().is_none());
        assert_eq!(r.purge_generation(), 1);
        assert_eq!(r.offset_frontier().0, u64::from(MESSAGES_PER_BATCH));
        assert_eq!(r.stored_offset(ConsumerKind::ConsumerGroup, 5), None);
        let p = block_on(r.poll(&PollRequest {
            consumer: (ConsumerKind::Consumer, 1),
            strategy: PollingStrategy::First,
            count: 100,
            auto_commit: false,
        }))
        .unwrap();
        polls.push(
            p.messages()
                .map(|m| (m.offset, m.payload.to_vec()))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(polls[0].len(), MESSAGES_PER_BATCH as usize);
    assert_eq!(polls[0][0], (0, b"c1-b4-m0".to_vec()));
    assert_eq!(polls[0], polls[1]);
    assert_eq!(polls[0], polls[2]);
}

#[test]
fn given_auto_commit_poll_on_primary_when_ticked_should_replicate_the_offset() {
    let mut cluster = Cluster::new(21, NetworkFaults::default());
    let primary = cluster.replicas[0].replica().primary_index(0).0;
    let s1 = register(&mut cluster, primary, 1);
    for n in 1..=4 {
        let (bytes, _) = client_batch(1, n);
        cluster.submit(
            primary,
            ClientRequest {
                client: 1,
                session: s1,
                request: n,
                user_id: 1,
                op: ClientOp::Append(bytes),
            },
        );
        cluster.step();
    }
    for _ in 0..20 {
        cluster.step();
    }
    let consumer = (ConsumerKind::ConsumerGroup, 3);
    let polled = block_on(cluster.replicas[usize::from(primary)].poll(&PollRequest {
        consumer,
        strategy: PollingStrategy::Next,
        count: 15,
        auto_commit: true,
    }))
    .unwrap();
    assert_eq!(polled.last_offset, Offset(14));
    for _ in 0..40 {
        cluster.step();
    }
    for r in &cluster.replicas {
        assert_eq!(
            r.consumer_offsets().durable().get(consumer.0, consumer.1),
            Some(Offset(14))
        );
        assert_eq!(r.stored_offset(consumer.0, consumer.1), Some(Offset(14)));
    }
    // The next poll continues after it, and an older auto-commit does not
    // move it back.
    let next = block_on(cluster.replicas[usize::from(primary)].poll(&PollRequest {
        consumer,
        strategy: PollingStrategy::Offset(2),
        count: 1,
        auto_commit: true,
    }))
    .unwrap();
    assert_eq!(next.first_offset, Offset(2));
    for _ in 0..40 {
        cluster.step();
    }
    for r in &cluster.replicas {
        assert_eq!(
            r.consumer_offsets().durable().get(consumer.0, consumer.1),
            Some(Offset(14))
        );
    }
}
