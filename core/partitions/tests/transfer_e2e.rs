//! The end-to-end state transfer, in a three-replica group over the
//! in-memory bus with network faults on: the primary holds many segments
//! (about 64 KiB batches, small segments), retention has removed the oldest
//! ones, and a backup that was down restarts behind the repair floor. Repair
//! concludes FloorRefused, the backup pulls the primary's offer
//! (`OfferServer` ↔ `TransferReceiver`, driven directly) while the group
//! keeps producing, installs it, repairs the tail through the journal, and
//! ends with segment files byte-identical to the primary's and the same
//! consumer offsets, dedup slice and frontier. A second test installs an
//! empty offer (every segment retained away at the origin).
//!
//! Both the 20 MiB run (512 KiB segments) and the 200 MiB one (4 MiB
//! segments) run by default (SimFs; about 0.3 s and 3 s in the dev
//! profile).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::ConsumerKind;
use consensus::header::StateTransferTargetHeader;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome, TimeoutConfig};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::state_transfer::{
    BuildBudget, BuildClock, ChunkAnswer, ChunkRequest, InstallInput, LocalFacts, OfferServer,
    OfferServerConfig, ReceiveStep, ReceiverConfig, TransferReceiver, TransferRequest,
};
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, NetworkFaults, Partition,
    PartitionConfig, PartitionError, PollRequest, PollingStrategy, RetentionPolicy,
};
use storage::batch::BatchBuilder;
use storage::fs::{FileKind, Fs, SimFs};

type Replica = Partition<InMemoryBus, FileSuperblock<SimFs>, SimFs>;

const REPLICAS: u8 = 3;
const GROUP: u64 = 9;
const MESSAGES_PER_BATCH: u32 = 16;
/// Payload bytes per message: a batch is about 64 KiB.
const PAYLOAD: usize = 4000;
const RETRY_TICKS: u64 = 30;
const TICK_US: u64 = 10_000;
const CLIENT: u128 = 42;

fn pdir() -> PathBuf {
    PathBuf::from("/data/p")
}

thread_local! {
    static SEGMENT_SIZE: std::cell::Cell<u64> = const { std::cell::Cell::new(4 << 20) };
}

fn replica_config(replica: u8, count: u8, retention_ops: u64) -> PartitionConfig {
    let mut vsr = Config::new(replica, count, GROUP);
    vsr.timeouts = TimeoutConfig::scaled_down(5);
    vsr.retention_ops = retention_ops;
    vsr.seed = 13;
    let mut c = PartitionConfig::new(vsr);
    c.partition_id = 2;
    c.log.segment_size_bytes = SEGMENT_SIZE.with(std::cell::Cell::get);
    // A flush every 16 batches (1 MiB).
    c.messages_required_to_save = 16 * u64::from(MESSAGES_PER_BATCH);
    c
}

fn fresh_fs(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(Path::new("/data")).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
        fs.sync_dir(Path::new("/data")).await.unwrap();
    });
    fs
}

fn open(fs: &SimFs, net: &InMemoryNetwork, r: u8, count: u8, retention_ops: u64) -> Replica {
    block_on(Partition::open(
        replica_config(r, count, retention_ops),
        fs.clone(),
        &pdir(),
        net.endpoint(r),
        FileSuperblock::new(fs.clone(), &pdir()),
    ))
    .unwrap()
}

/// The ids of batch `n`'s messages.
fn batch(n: u64) -> (Vec<u8>, Vec<u128>) {
    let mut b = BatchBuilder::new(n);
    let mut ids = Vec::new();
    for i in 0..MESSAGES_PER_BATCH {
        let id = CLIENT << 64 | u128::from(n) << 16 | u128::from(i);
        ids.push(id);
        let mut payload = format!("b{n}-m{i}-").into_bytes();
        payload.resize(PAYLOAD, (n as u8) ^ (i as u8));
        b.push(id, i, &payload, b"h");
    }
    (b.build(), ids)
}

struct Cluster {
    /// Replicas in the group.
    n: u8,
    net: InMemoryNetwork,
    fss: Vec<SimFs>,
    replicas: Vec<Option<Replica>>,
    retention_ops: u64,
    /// A replica whose power is cut: its errors are expected.
    powerless: Option<u8>,
    now: u64,
    // The one producing client.
    session: Option<u64>,
    in_flight: Option<(u64, ClientOp, Vec<u128>)>,
    sent_at: u64,
    target: u8,
    next_request: u64,
    acked: Vec<u128>,
}

impl Cluster {
    fn new(seed: u64, retention_ops: u64) -> Self {
        Self::with_replicas(REPLICAS, seed, retention_ops)
    }

    fn with_replicas(n: u8, seed: u64, retention_ops: u64) -> Self {
        // Network faults on, as in tests/cluster.rs.
        let faults = NetworkFaults {
            drop_per_mille: 30,
            duplicate_per_mille: 20,
            delay_ticks_max: 3,
        };
        let net = InMemoryNetwork::new(seed, n, faults);
        let fss: Vec<SimFs> = (0..n).map(|r| fresh_fs(seed * 31 + u64::from(r))).collect();
        let replicas = (0..n)
            .map(|r| Some(open(&fss[usize::from(r)], &net, r, n, retention_ops)))
            .collect();
        Self {
            n,
            net,
            fss,
            replicas,
            retention_ops,
            powerless: None,
            now: 0,
            session: None,
            in_flight: None,
            sent_at: 0,
            target: 0,
            next_request: 1,
            acked: Vec::new(),
        }
    }

    fn replica(&self, r: u8) -> &Replica {
        self.replicas[usize::from(r)].as_ref().unwrap()
    }

    fn up(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().flatten()
    }

    /// The primary of the highest view any live replica is in.
    fn primary(&self) -> u8 {
        let r = self.up().max_by_key(|r| r.replica().view()).unwrap();
        r.replica().primary_index(r.replica().view())
    }

    fn step(&mut self) {
        self.now += 1;
        for (to, frame) in self.net.tick() {
            let Some(r) = self.replicas[usize::from(to)].as_mut() else {
                continue;
            };
            match block_on(r.on_frame(frame)) {
                Ok(())
                | Err(PartitionError::Frame(_))
                | Err(PartitionError::PrepareOffsetMismatch { .. }) => {}
                Err(_) if self.powerless == Some(to) => {}
                Err(e) => panic!("replica {to}: {e}"),
            }
        }
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            match block_on(r.on_tick(self.now * TICK_US)) {
                Ok(()) => {}
                Err(_) if self.powerless.is_some_and(|p| usize::from(p) == i) => {}
                Err(e) => panic!("replica {i}: {e}"),
            }
        }
    }

    /// The client sends or retries one request, the cluster steps, replies
    /// are taken. `produce` false: only finish what is in flight.
    fn client_step(&mut self, produce: bool) {
        self.client_step_with(produce, |n| {
            let (bytes, ids) = batch(n);
            (ClientOp::Append(bytes), ids)
        });
    }

    /// One client step whose next request (number `n`) is `next(n)`.
    fn client_step_with(&mut self, produce: bool, next: impl Fn(u64) -> (ClientOp, Vec<u128>)) {
        if self.in_flight.is_none() {
            if self.session.is_none() {
                self.in_flight = Some((0, ClientOp::Register, Vec::new()));
            } else if produce {
                let (op, ids) = next(self.next_request);
                self.in_flight = Some((self.next_request, op, ids));
            }
            self.sent_at = 0;
        }
        if let Some((request, op, _)) = self.in_flight.clone()
            && (self.sent_at == 0 || self.now - self.sent_at >= RETRY_TICKS)
        {
            if self.sent_at != 0 {
                self.target = (self.target + 1) % self.n;
            }
            self.sent_at = self.now.max(1);
            let outcome = match self.replicas[usize::from(self.target)].as_mut() {
                Some(r) => block_on(r.submit(
                    ClientRequest {
                        client: CLIENT,
                        session: self.session.unwrap_or(0),
                        request,
                        user_id: 1,
                        op,
                    },
                    self.now * TICK_US,
                ))
                .unwrap(),
                None => RequestOutcome::Unavailable,
            };
            if outcome == RequestOutcome::Unavailable {
                self.sent_at = self.now.saturating_sub(RETRY_TICKS).max(1);
            }
        }
        self.step();
        for r in 0..self.n {
            for reply in self.net.take_replies(r) {
                let Some((request, _, ids)) = self.in_flight.as_ref() else {
                    continue;
                };
                if reply.client != CLIENT || reply.request != *request {
                    continue;
                }
                match reply.status {
                    ReplyStatus::Ok | ReplyStatus::AlreadyApplied => {
                        if *request == 0 {
                            self.session = Some(reply.session);
                        } else {
                            self.acked.extend(ids.iter().copied());
                            self.next_request += 1;
                        }
                        self.target = r;
                        self.in_flight = None;
                    }
                    ReplyStatus::NoSession | ReplyStatus::Fenced => {
                        self.session = None;
                        self.in_flight = None;
                    }
                }
            }
        }
    }

    /// Produces until `batches` more batches are acknowledged.
    fn produce(&mut self, batches: u64) {
        let goal = self.next_request + batches;
        let mut ticks = 0;
        while self.next_request < goal {
            ticks += 1;
            assert!(ticks < 1_000_000, "no progress producing");
            self.client_step(true);
        }
    }

    /// Runs `count` more explicit consumer-offset stores (no messages).
    fn store_offsets(&mut self, count: u64) {
        let goal = self.next_request + count;
        let mut ticks = 0;
        while self.next_request < goal {
            ticks += 1;
            assert!(ticks < 50_000, "no progress storing offsets");
            self.client_step_with(true, |n| {
                let op = ClientOp::StoreOffset {
                    kind: ConsumerKind::Consumer,
                    id: 7,
                    offset: n % 50,
                };
                (op, Vec::new())
            });
        }
    }

    /// Power loss on replica `r`: its process is gone and its disk keeps
    /// what the seeded crash keeps of the unsynced state.
    fn crash(&mut self, r: u8) {
        self.powerless = None;
        self.replicas[usize::from(r)] = None;
        self.fss[usize::from(r)].crash();
    }

    fn restart(&mut self, r: u8) {
        let p = open(
            &self.fss[usize::from(r)],
            &self.net,
            r,
            self.n,
            self.retention_ops,
        );
        self.replicas[usize::from(r)] = Some(p);
    }

    /// Steps until every live replica applied what any committed.
    fn converge(&mut self) {
        while self.in_flight.is_some() {
            self.client_step(false);
        }
        for _ in 0..20_000 {
            let target = self.up().map(|r| r.replica().commit_max()).max().unwrap();
            if self
                .up()
                .all(|r| r.replica().commit_min() >= target && r.replica().is_quorum_visible())
            {
                return;
            }
            self.step();
        }
        panic!(
            "no convergence: {:?}",
            self.up()
                .map(|r| (r.replica().commit_min(), r.replica().commit_max()))
                .collect::<Vec<_>>()
        );
    }
}

fn segment_files(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = block_on(fs.read_dir(&pdir()))
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == FileKind::File)
        .filter_map(|e| {
            let name = e.name_str()?.to_owned();
            (name.ends_with(".log") || name.ends_with(".index")).then_some(name)
        })
        .map(|name| {
            let bytes = fs.contents(&pdir().join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

struct NoClock;

impl BuildClock for NoClock {
    fn now(&self) -> Duration {
        Duration::ZERO
    }

    fn observe_hashed(&self, _bytes: u64) {}
}

/// Flush and retention on every live replica: the sealed segments kept within
/// `max_bytes` (the same policy removes the same segments everywhere).
fn retain(c: &mut Cluster, max_bytes: u64) {
    let policy = RetentionPolicy {
        max_total_bytes: Some(max_bytes),
        respect_group_offsets: false,
        segments_per_pass_max: usize::MAX,
        ..RetentionPolicy::default()
    };
    let now = c.now * TICK_US;
    for r in c.replicas.iter_mut().flatten() {
        // Retention sees only flushed (sealed) segments: flush first so
        // every replica sees the same ones.
        block_on(r.flush_committed_messages()).unwrap();
        block_on(r.retention_pass(now, &policy)).unwrap();
    }
}

/// Steps the group (producing when `produce`) until replica `victim` asks
/// for a transfer.
fn until_transfer_needed(c: &mut Cluster, victim: u8, produce: bool) {
    for _ in 0..5_000 {
        c.client_step(produce);
        if c.replica(victim).state_transfer_needed().is_some() {
            return;
        }
    }
    panic!("no state transfer asked for");
}

/// Pulls the primary's offer into `to` with `to` cut off from the group,
/// which keeps producing a batch every `produce_every` chunks; returns the
/// install input (with the identity of the offer's op, read off the
/// primary when the offer was built) and how many chunks flowed.
fn pull_while_producing(c: &mut Cluster, to: u8, produce_every: u64) -> (InstallInput, u64) {
    let from = c.primary();
    assert_ne!(from, to);
    c.net.isolate(Some(to));
    let facts = {
        let r = c.replica(to).replica();
        LocalFacts {
            replica: to,
            replica_count: c.n,
            view: r.view(),
            primary: r.primary_index(r.view()),
            commit_max: r.commit_max(),
            purge_generation: c.replica(to).purge_generation(),
        }
    };
    let mut server = OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 64 * 1024,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });
    let to_fs = c.fss[usize::from(to)].clone();
    let from_fs = c.fss[usize::from(from)].clone();
    let mut rx = TransferReceiver::new(to_fs, &pdir(), ReceiverConfig::default(), 5);
    let mut request = rx.arm(from);
    let mut identity = None;
    let mut chunks = 0u64;
    let done = loop {
        let step = match request {
            TransferRequest::Descriptor { nonce, .. } => {
                let peer = c.replicas[usize::from(from)].as_mut().unwrap();
                let offer =
                    block_on(server.on_request_state_transfer(peer, to, nonce, &NoClock)).unwrap();
                // The offer is taken at the primary's applied op, now.
                assert_eq!(offer.commit_op(), peer.replica().commit_min());
                identity = Some((offer.commit_op(), peer.replica().commit_min_checksum()));
                let header = StateTransferTargetHeader {
                    nonce,
                    commit_op: offer.commit_op(),
                    group: 0,
                    available: true,
                    unavailable_transient: false,
                    commit_max: peer.replica().commit_max(),
                };
                let body = offer.encoded_manifest().to_vec();
                let view = peer.replica().view();
                block_on(rx.on_target(from, view, &header, &body, &facts))
            }
            TransferRequest::Chunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } => {
                chunks += 1;
                if chunks.is_multiple_of(produce_every) {
                    // The primary keeps committing (and flushing into the
                    // segment being served) while chunks flow.
                    c.client_step(true);
                }
                let answer = block_on(server.on_request_state_chunk(
                    &from_fs,
                    ChunkRequest {
                        requester: to,
                        nonce,
                        artifact,
                        offset,
                        len,
                    },
                ));
                let ChunkAnswer::Chunk(chunk) = answer else {
                    panic!("peer did not serve: {answer:?}");
                };
                block_on(rx.on_chunk(
                    from,
                    nonce,
                    chunk.artifact,
                    chunk.offset,
                    chunk.payload,
                    &facts,
                ))
            }
        };
        match step {
            ReceiveStep::Send(next) => request = next,
            ReceiveStep::Complete(done) => break done,
            ReceiveStep::Wait => {
                c.step();
                match block_on(rx.on_tick(&facts)) {
                    ReceiveStep::Send(next) => request = next,
                    ReceiveStep::Complete(done) => break done,
                    ReceiveStep::Wait => {}
                    other => panic!("transfer failed: {other:?}"),
                }
            }
            other => panic!("transfer did not complete: {other:?}"),
        }
    };
    server.reset();
    let (op, checksum) = identity.unwrap();
    assert_eq!(done.descriptor.commit_op, op);
    (InstallInput::from_received(&done, checksum, None), chunks)
}

/// Equal frontier, consumer offsets, dedup slice, polls from the first
/// offset held, and (after a flush) byte-identical segment files.
fn assert_same_as_primary(c: &mut Cluster, victim: u8) {
    for r in c.replicas.iter_mut().flatten() {
        block_on(r.flush_committed_messages()).unwrap();
    }
    let primary = c.primary();
    let (p, v) = (c.replica(primary), c.replica(victim));
    assert!(v.fenced().is_none());
    assert!(v.missing_history().is_none());
    assert_eq!(v.offset_frontier(), p.offset_frontier());
    assert_eq!(v.first_offset(), p.first_offset());
    assert_eq!(v.dedup_export(), p.dedup_export());
    for id in 0..10 {
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            assert_eq!(
                v.stored_offset(kind, id),
                p.stored_offset(kind, id),
                "{kind:?} {id}"
            );
        }
    }
    assert!(v.stored_offset(ConsumerKind::Consumer, 7).is_some());
    let poll = |r: &Replica, at: u64| {
        let polled = block_on(r.poll(&PollRequest {
            consumer: (ConsumerKind::Consumer, 1),
            strategy: PollingStrategy::Offset(at),
            count: 64,
            auto_commit: false,
        }))
        .unwrap();
        polled
            .messages()
            .map(|m| (m.offset, m.id))
            .collect::<Vec<_>>()
    };
    let first = p.first_offset();
    for at in [
        first,
        (first + p.offset_frontier()) / 2,
        p.offset_frontier() - 1,
    ] {
        assert_eq!(poll(v, at), poll(p, at), "poll at {at}");
    }
    let listings: Vec<_> = c.fss.iter().map(segment_files).collect();
    let (pl, vl) = (
        &listings[usize::from(primary)],
        &listings[usize::from(victim)],
    );
    assert_eq!(
        pl.iter().map(|f| &f.0).collect::<Vec<_>>(),
        vl.iter().map(|f| &f.0).collect::<Vec<_>>(),
        "segment names differ"
    );
    for (a, b) in pl.iter().zip(vl) {
        assert!(a.1 == b.1, "{} differs", a.0);
    }
    for l in &listings {
        assert!(l == pl, "a replica's segment files differ");
    }
}

/// The scenario, with `total_bytes` produced while the victim is down and a
/// client step every `produce_every` chunks of the pull (the ops produced
/// during the pull must stay within the peers' retained 128 ops, so the
/// tail after the install comes by journal repair).
fn run(seed: u64, total_bytes: u64, segment_size: u64, produce_every: u64) {
    let started = Instant::now();
    SEGMENT_SIZE.with(|s| s.set(segment_size));
    let batch_bytes = u64::from(MESSAGES_PER_BATCH) * PAYLOAD as u64;
    let batches = total_bytes / batch_bytes;
    let mut c = Cluster::new(seed, 128);
    c.produce(20);
    c.store_offsets(2);
    let victim = (c.primary() + 1) % REPLICAS;
    c.crash(victim);
    c.produce(batches);
    c.store_offsets(3);
    let before = c.replica(c.primary()).log().segments().count();
    let expected = total_bytes / segment_size * 9 / 10;
    assert!(before as u64 >= expected, "only {before} segments");
    // Retention keeps a quarter of the data on the live replicas.
    retain(&mut c, total_bytes / 4);
    let segments = c.replica(c.primary()).log().segments().count();
    let first = c.replica(c.primary()).first_offset();
    assert!(first > 0, "retention removed nothing");
    eprintln!(
        "produced {} MiB in {:?}: {before} segments, {segments} kept, first offset {first}",
        total_bytes >> 20,
        started.elapsed()
    );
    c.restart(victim);
    until_transfer_needed(&mut c, victim, true);
    let need = c.replica(victim).state_transfer_needed().unwrap();
    let t = Instant::now();
    let acked_before_pull = c.acked.len();
    let (input, chunks) = pull_while_producing(&mut c, victim, produce_every);
    let r = c.replicas[usize::from(victim)].as_mut().unwrap();
    let outcome = block_on(r.install_partition_state(input)).unwrap();
    assert!(outcome.applied_commit_op >= need.floor);
    eprintln!(
        "pulled and installed {chunks} chunks in {:?}; installed op {}",
        t.elapsed(),
        outcome.applied_commit_op
    );
    c.net.isolate(None);
    assert!(
        c.acked.len() > acked_before_pull,
        "nothing was produced while chunks flowed"
    );
    // The tail produced during the transfer comes by journal repair.
    assert!(c.replica(c.primary()).replica().commit_min() > outcome.applied_commit_op);
    c.produce(10);
    c.store_offsets(2);
    c.converge();
    retain(&mut c, total_bytes / 4);
    assert_same_as_primary(&mut c, victim);
    eprintln!("total {:?}", started.elapsed());
}

#[test]
fn given_backup_behind_the_floor_when_transferred_while_producing_should_match_the_primary_20mib() {
    run(21, 20 << 20, 512 * 1024, 1);
}

/// 200 MiB over 4 MiB segments (50+): about 3 s in the dev profile, so it
/// runs by default.
#[test]
fn given_backup_behind_the_floor_when_transferred_while_producing_should_match_the_primary_200mib()
{
    run(22, 200 << 20, 4 << 20, 4);
}

/// Every segment retained away at the origin: the offer carries no segment,
/// the backup installs one empty segment at the frontier and continues at
/// the right offset.
#[test]
fn given_everything_retained_away_at_the_origin_when_transferred_should_install_an_empty_segment_at_the_frontier()
 {
    // Every batch fills a segment, so a flush leaves an empty active one.
    SEGMENT_SIZE.with(|s| s.set(32 * 1024));
    let mut c = Cluster::new(31, 128);
    c.produce(20);
    let victim = (c.primary() + 1) % REPLICAS;
    c.crash(victim);
    c.produce(300);
    c.store_offsets(3);
    c.restart(victim);
    until_transfer_needed(&mut c, victim, false);
    retain(&mut c, 0);
    let primary = c.primary();
    let p = c.replica(primary);
    let segs: Vec<_> = p.log().segments().copied().collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert!(segs[0].is_empty());
    let (input, chunks) = pull_while_producing(&mut c, victim, 1_000);
    assert_eq!(chunks, 1, "only the offsets artifact flows");
    let r = c.replicas[usize::from(victim)].as_mut().unwrap();
    block_on(r.install_partition_state(input)).unwrap();
    let frontier = r.offset_frontier();
    let segs: Vec<_> = r.log().segments().copied().collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert!(segs[0].is_empty());
    assert_eq!(segs[0].start_offset, frontier);
    assert_eq!(r.installed_frontier(), Some(frontier));
    assert!(r.stored_offset(ConsumerKind::Consumer, 7).is_some());
    c.net.isolate(None);
    c.produce(5);
    c.converge();
    // The backup minted nothing itself; the next batch it applied starts
    // at the installed frontier, as on the primary.
    let polled = block_on(c.replica(victim).poll(&PollRequest {
        consumer: (ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::Offset(frontier),
        count: 1,
        auto_commit: false,
    }))
    .unwrap();
    assert_eq!(polled.first_offset, frontier);
    assert_eq!(polled.count, 1);
    assert_same_as_primary(&mut c, victim);
}
