//! The transfer-needed record: a backup whose install a power cut
//! interrupted reboots converged to an empty partition at the offer's
//! frontier, and the durable record keeps it honestly lagging until a
//! completed install clears it: it reports `state_transfer_needed()`,
//! serves no offer, answers polls below its frontier "not available"
//! rather than "empty", and acknowledges nothing, so a group whose other
//! backup is cut off cannot commit through it. (The cluster harness is the
//! one of `tests/install_cluster.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ConsumerKind;
use consensus::header::StateTransferTargetHeader;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome, TimeoutConfig};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::state_transfer::{
    BuildBudget, BuildClock, ChunkAnswer, ChunkRequest, InstallInput, LocalFacts, OfferServer,
    OfferServerConfig, PartitionTransferUnavailable, ReceiveStep, ReceiverConfig,
    TRANSFER_NEEDED_FILE, TransferReceiver, TransferRequest,
};
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, NetworkFaults, Partition,
    PartitionConfig, PartitionError, PollError, PollRequest, PollingStrategy, StateTransferNeeded,
};
use storage::batch::BatchBuilder;
use storage::fs::{FileKind, Fs, SimFs};

type Replica = Partition<InMemoryBus, FileSuperblock<SimFs>, SimFs>;

const REPLICAS: u8 = 3;
const GROUP: u64 = 9;
const MESSAGES_PER_BATCH: u32 = 10;
const RETRY_TICKS: u64 = 30;
const TICK_US: u64 = 10_000;
const CLIENT: u128 = 42;

fn pdir() -> PathBuf {
    PathBuf::from("/data/p")
}

fn replica_config(replica: u8, count: u8, retention_ops: u64) -> PartitionConfig {
    let mut vsr = Config::new(replica, count, GROUP);
    vsr.timeouts = TimeoutConfig::scaled_down(5);
    vsr.retention_ops = retention_ops;
    vsr.seed = 13;
    let mut c = PartitionConfig::new(vsr);
    c.partition_id = 2;
    c.log.segment_size_bytes = 8 * 1024;
    // A flush every three batches, unsynced unless it seals a segment or
    // the recorded applied point lags by `retention_ops / 4`.
    c.messages_required_to_save = 30;
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
        b.push(id, i, format!("b{n}-m{i}").as_bytes(), b"h");
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
        let net = InMemoryNetwork::new(seed, n, NetworkFaults::default());
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
            assert!(ticks < 50_000, "no progress producing");
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

    /// Same polls everywhere, every acknowledged message present, and after
    /// a flush byte-identical segment files.
    fn assert_identical(&mut self) {
        let frontiers: Vec<u64> = self.up().map(|r| r.offset_frontier()).collect();
        assert!(
            frontiers.iter().all(|f| *f == frontiers[0]),
            "{frontiers:?}"
        );
        let mut per_replica = Vec::new();
        for r in self.up() {
            assert!(r.fenced().is_none());
            let mut all = Vec::new();
            let mut at = 0;
            while at < frontiers[0] {
                let p = block_on(r.poll(&PollRequest {
                    consumer: (ConsumerKind::Consumer, 1),
                    strategy: PollingStrategy::Offset(at),
                    count: 500,
                    auto_commit: false,
                }))
                .unwrap();
                assert!(!p.is_empty(), "no messages at {at}");
                for m in p.messages() {
                    all.push((m.offset, m.id, m.payload.to_vec()));
                }
                at = p.last_offset + 1;
            }
            per_replica.push(all);
        }
        for other in &per_replica[1..] {
            assert_eq!(&per_replica[0], other);
        }
        let offsets: Vec<u64> = per_replica[0].iter().map(|m| m.0).collect();
        assert_eq!(offsets, (0..frontiers[0]).collect::<Vec<_>>());
        let stored: BTreeSet<u128> = per_replica[0].iter().map(|m| m.1).collect();
        for id in &self.acked {
            assert!(stored.contains(id), "acknowledged message {id:#x} missing");
        }
        for r in self.replicas.iter_mut().flatten() {
            block_on(r.flush_committed_messages()).unwrap();
        }
        let listings: Vec<_> = self.fss.iter().map(segment_files).collect();
        assert!(listings[0].len() >= 6, "only {} files", listings[0].len());
        for other in &listings[1..] {
            assert_eq!(&listings[0], other, "segment files differ");
        }
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

/// Pulls replica `from`'s offer into replica `to` and installs it.
fn transfer(c: &mut Cluster, from: u8, to: u8) -> u64 {
    let input = pull(c, from, to);
    let receiver = c.replicas[usize::from(to)].as_mut().unwrap();
    block_on(receiver.install_partition_state(input))
        .unwrap()
        .applied_commit_op
}

/// Pulls replica `from`'s offer into replica `to`'s staging files.
fn pull(c: &mut Cluster, from: u8, to: u8) -> InstallInput {
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
        chunk_len_max_bytes: 4096,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });
    let to_fs = c.fss[usize::from(to)].clone();
    let from_fs = c.fss[usize::from(from)].clone();
    let mut rx = TransferReceiver::new(to_fs, &pdir(), ReceiverConfig::default(), 5);
    let mut request = rx.arm(from);
    let done = loop {
        let step = match request {
            TransferRequest::Descriptor { nonce, .. } => {
                let peer = c.replicas[usize::from(from)].as_mut().unwrap();
                let offer =
                    block_on(server.on_request_state_transfer(peer, to, nonce, &NoClock)).unwrap();
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
            other => panic!("transfer did not complete: {other:?}"),
        }
    };
    // Nothing stepped since the offer was built: the server's applied op is
    // the offer's, and its identity is the one the hash chain continues from.
    let peer = c.replica(from).replica();
    assert_eq!(peer.commit_min(), done.descriptor.commit_op);
    server.reset();
    InstallInput::from_received(&done, peer.commit_min_checksum(), None)
}

/// A cluster whose backup restarted behind every peer's retention and asks
/// for a state transfer.
fn lagging_backup(seed: u64) -> (Cluster, u8, StateTransferNeeded) {
    let mut c = Cluster::new(seed, 16);
    c.produce(20);
    let victim = (c.primary() + 1) % REPLICAS;
    c.crash(victim);
    c.produce(60);
    c.store_offsets(3);
    c.restart(victim);
    for _ in 0..200 {
        c.client_step(true);
        if let Some(need) = c.replica(victim).state_transfer_needed() {
            return (c, victim, need);
        }
    }
    panic!("no state transfer asked for");
}

/// Power cuts at every filesystem call of the backup's install until one
/// reboots converged (the install got past its frontier record). Returns
/// the cluster with the rebooted victim and the cut that did it.
fn rebooted_converged(seed: u64) -> (Cluster, u8, u64) {
    for n in 1..300 {
        let (mut c, victim, need) = lagging_backup(seed);
        let input = pull(&mut c, need.peer, victim);
        let fs = c.fss[usize::from(victim)].clone();
        fs.cut_power_after(n);
        let receiver = c.replicas[usize::from(victim)].as_mut().unwrap();
        let result = block_on(receiver.install_partition_state(input));
        c.crash(victim);
        c.restart(victim);
        let r = c.replica(victim);
        // Converged: the only segment is the empty one at the frontier.
        let converged = r.log().segments().count() == 1
            && r.log().next_offset() == r.offset_frontier()
            && r.first_offset() == r.offset_frontier()
            && r.offset_frontier() > 0;
        if converged {
            return (c, victim, n);
        }
        assert!(result.is_err() || n > 1, "cut {n}");
    }
    panic!("no power cut left the backup converged");
}

fn record_path() -> PathBuf {
    pdir().join(TRANSFER_NEEDED_FILE)
}

#[test]
fn given_power_cut_mid_install_when_rebooted_should_stay_lagging_until_an_install_clears_the_record()
 {
    let (mut c, victim, cut) = rebooted_converged(9);
    let fs = c.fss[usize::from(victim)].clone();
    let r = c.replica(victim);
    let frontier = r.offset_frontier();
    eprintln!(
        "cut {cut}: converged at frontier {frontier}, op {}",
        r.replica().commit_min()
    );

    // The record is durable and honoured after the reboot.
    assert!(block_on(fs.exists(&record_path())).unwrap(), "no record");
    let missing = r.missing_history().expect("record not honoured at boot");
    assert_eq!(missing.frontier, frontier);
    assert!(
        r.state_transfer_needed().is_some(),
        "converged replica does not ask for a transfer"
    );
    // Polls below the frontier are "not available", not "empty".
    for strategy in [
        PollingStrategy::Offset(0),
        PollingStrategy::Offset(frontier - 1),
        PollingStrategy::First,
        PollingStrategy::Next,
    ] {
        let polled = block_on(r.poll(&PollRequest {
            consumer: (ConsumerKind::Consumer, 1),
            strategy,
            count: 10,
            auto_commit: false,
        }));
        assert!(
            matches!(polled, Err(PollError::HistoryMissing { frontier: f }) if f == frontier),
            "{strategy:?}: {polled:?}"
        );
    }
    // It survives another reboot (the record, not memory, says so).
    c.crash(victim);
    c.restart(victim);
    assert_eq!(
        c.replica(victim).missing_history().map(|m| m.frontier),
        Some(frontier)
    );

    // It acknowledges nothing: with the other backup cut off, the primary
    // cannot commit through it (without the record it would, over a hole).
    for _ in 0..200 {
        c.step();
    }
    let primary = c.primary();
    assert_ne!(primary, victim);
    let other = (0..REPLICAS)
        .find(|r| *r != primary && *r != victim)
        .unwrap();
    let acked_before = c.next_request;
    c.net.isolate(Some(other));
    for _ in 0..400 {
        c.client_step(true);
    }
    assert_eq!(
        c.next_request, acked_before,
        "committed through a replica with missing history"
    );
    c.net.isolate(None);
    c.produce(2);

    // A pull and an install clear it; the replica agrees byte for byte.
    for _ in 0..2_000 {
        if c.replica(c.primary()).replica().is_caught_up_primary() {
            break;
        }
        c.step();
    }
    let peer = c.primary();
    transfer(&mut c, peer, victim);
    let r = c.replica(victim);
    assert!(r.missing_history().is_none());
    assert!(r.state_transfer_needed().is_none());
    assert!(
        !block_on(fs.exists(&record_path())).unwrap(),
        "record left behind"
    );
    c.produce(5);
    c.converge();
    c.assert_identical();
    // Cleared for good: a reboot does not bring it back.
    c.crash(victim);
    c.restart(victim);
    assert!(c.replica(victim).missing_history().is_none());
    c.produce(3);
    c.converge();
    c.assert_identical();
}

/// The serve gate refuses a replica with missing history even when it is
/// the group's caught-up primary (a single replica, which is primary by
/// itself once booted).
#[test]
fn given_single_replica_converged_at_boot_when_asked_for_an_offer_should_refuse() {
    let (mut c, victim, _) = rebooted_converged(11);
    drop(c.replicas[usize::from(victim)].take());
    // Reopen the victim's disk as a one-replica group: primary at once.
    let fs = c.fss[usize::from(victim)].clone();
    let net = InMemoryNetwork::new(3, 1, NetworkFaults::default());
    let mut solo = block_on(Partition::open(
        replica_config(0, 1, 16),
        fs,
        &pdir(),
        net.endpoint(0),
        FileSuperblock::new(c.fss[usize::from(victim)].clone(), &pdir()),
    ))
    .unwrap();
    assert!(solo.replica().is_caught_up_primary());
    assert!(solo.missing_history().is_some());
    let mut server = OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 4096,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });
    let refused = block_on(server.on_request_state_transfer(&mut solo, 1, 77, &NoClock));
    assert!(
        matches!(refused, Err(PartitionTransferUnavailable::RepairInProgress)),
        "{refused:?}"
    );
}

/// It does not vote: with the primary crashed, the other backup and the
/// replica with missing history are a majority by count, but no view forms
/// through it (without the record the two would start a view whose log the
/// lagging replica could lead over its hole). The group stalls instead:
/// the lagging replica counts as failed, as an invisible one does.
#[test]
fn given_missing_history_when_the_primary_crashes_should_not_form_a_view_through_it() {
    let (mut c, victim, _) = rebooted_converged(9);
    assert!(c.replica(victim).missing_history().is_some());
    for _ in 0..200 {
        c.step();
    }
    let primary = c.primary();
    assert_ne!(primary, victim);
    let view = c.replica(victim).replica().view();
    c.crash(primary);
    for _ in 0..3_000 {
        c.step();
    }
    for r in c.up() {
        assert!(
            !(r.replica().is_primary() && r.replica().view() > view),
            "replica {} leads view {} formed through a replica with missing history",
            r.replica().replica(),
            r.replica().view()
        );
    }
}
