//! A replica of a three-replica group restarts from its directory (the
//! simulated filesystem crashed with seeded loss of unsynced data, the file
//! superblock in the partition directory) and rejoins by repair while a
//! client keeps producing: it resumes after the applied point its
//! superblock records, re-applies the later ops its peers still retain
//! (finding the batches a flush synced but did not record on disk, not
//! writing them twice), and ends with the same polls and byte-identical
//! segment files as the others. When its peers no longer retain what it
//! lacks, it reports the state transfer it needs and serves nothing new.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::ConsumerKind;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome, TimeoutConfig};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, NetworkFaults, Partition,
    PartitionConfig, PartitionError, PollRequest, PollingStrategy,
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

/// Crashes replica `victim(cluster)` mid-run, keeps producing while it is
/// down, restarts it, keeps producing, converges and compares.
fn crash_restart_converge(seed: u64, crash_primary: bool) -> (u64, u64) {
    let mut c = Cluster::new(seed, 512);
    c.produce(40 + seed % 7);
    let primary = c.primary();
    let victim = if crash_primary {
        primary
    } else {
        (primary + 1 + (seed % 2) as u8) % REPLICAS
    };
    let applied_before = c.replica(victim).replica().commit_min();
    c.crash(victim);
    c.produce(25);
    c.restart(victim);
    let restarted = c.replica(victim);
    let resumed_at = restarted.replica().commit_min();
    eprintln!(
        "seed {seed}: resumed at op {resumed_at} offset {}, log end {:?}, had applied {applied_before}",
        restarted.offset_frontier(),
        restarted.recovered_durable_offset()
    );
    assert!(
        resumed_at < applied_before,
        "seed {seed}: resumed at {resumed_at}, had applied {applied_before}: nothing re-applied"
    );
    assert!(!restarted.replica().is_quorum_visible());
    c.produce(30);
    c.converge();
    if crash_primary {
        assert!(c.up().all(|r| r.replica().view() > 0), "no view change");
    }
    c.assert_identical();
    (resumed_at, applied_before)
}

#[test]
fn given_backup_crashed_with_unsynced_loss_when_restarted_should_repair_and_agree_byte_for_byte() {
    for seed in 1..=4 {
        crash_restart_converge(seed, false);
    }
}

#[test]
fn given_primary_crashed_with_unsynced_loss_when_restarted_should_rejoin_the_new_view_and_agree() {
    for seed in 1..=4 {
        crash_restart_converge(seed, true);
    }
}

/// A backup whose journal holds committed batches, a power cut after each
/// filesystem call of its on-demand flush (writes, log sync, superblock
/// record), reboot from that directory, converge, compare.
#[test]
fn given_power_cut_at_every_step_of_a_backup_flush_when_restarted_should_converge() {
    let mut steps = 0;
    for n in 0u64.. {
        assert!(n < 200, "the flush never completed");
        let seed = 100 + n;
        let mut c = Cluster::new(seed, 512);
        let backup = (c.primary() + 1) % REPLICAS;
        c.replicas[usize::from(backup)]
            .as_mut()
            .unwrap()
            .set_flush_thresholds(u64::MAX, u64::MAX);
        c.produce(30);
        c.converge();
        let node = c.replicas[usize::from(backup)].as_mut().unwrap();
        assert!(node.unflushed_messages() > 0);
        let before = node.durable_offset_frontier();
        c.fss[usize::from(backup)].cut_power_after(n);
        let completed = block_on(node.flush_committed_messages()).is_ok();
        if completed {
            assert!(node.durable_offset_frontier() > before);
        }
        c.crash(backup);
        c.produce(5);
        c.restart(backup);
        c.produce(10);
        c.converge();
        c.assert_identical();
        steps += 1;
        if completed {
            break;
        }
    }
    eprintln!("flush: {steps} power cuts");
    assert!(steps >= 4, "only {steps} steps");
}

/// Peers retain 16 applied prepares; the backup is down while 60 ops
/// commit: repair concludes FloorRefused, the core asks for a state
/// transfer, and the replica stays invisible, applies nothing past its
/// recorded point and does not panic, while the others keep serving.
#[test]
fn given_restarted_backup_behind_every_peers_retention_when_repairing_should_ask_for_state_transfer()
 {
    let mut c = Cluster::new(7, 16);
    c.produce(20);
    let victim = (c.primary() + 1) % REPLICAS;
    c.crash(victim);
    c.produce(60);
    c.restart(victim);
    let resumed_at = c.replica(victim).replica().commit_min();
    let mut asked = None;
    for _ in 0..40 {
        c.client_step(true);
        let r = c.replica(victim);
        assert!(r.fenced().is_none());
        assert!(
            !r.replica().is_quorum_visible(),
            "caught up without the ops"
        );
        assert_eq!(r.replica().commit_min(), resumed_at);
        if let Some(need) = r.state_transfer_needed() {
            asked = Some(need);
        }
    }
    let need = asked.expect("no state transfer asked for");
    assert_ne!(need.peer, victim);
    assert!(need.floor > resumed_at, "{need:?} resumed at {resumed_at}");
    let head = c.up().map(|r| r.replica().commit_max()).max().unwrap();
    assert!(need.to_op > need.floor && need.to_op <= head, "{need:?}");
    // The others kept committing.
    c.produce(5);
}

/// A purge is applied on every replica while a backup's power is cut after
/// each filesystem call of its purge steps; the backup reboots from what
/// survived (an interrupted purge's applied point names the op before the
/// purge, so the purge is re-applied and completes), repairs and converges
/// on the purged offset space.
#[test]
fn given_power_cut_at_every_step_of_a_backup_purge_when_restarted_should_converge_purged() {
    let mut steps = 0;
    for n in 0u64.. {
        assert!(n < 300, "the purge never completed");
        let mut c = Cluster::new(500 + n, 512);
        c.produce(25);
        c.converge();
        let primary = c.primary();
        let backup = (primary + 1) % REPLICAS;
        c.fss[usize::from(backup)].cut_power_after(n);
        c.powerless = Some(backup);
        let session = c.session.unwrap();
        let request = c.next_request;
        c.next_request += 1;
        let outcome = block_on(c.replicas[usize::from(primary)].as_mut().unwrap().submit(
            ClientRequest {
                client: CLIENT,
                session,
                request,
                user_id: 1,
                op: ClientOp::Purge { generation: 1 },
            },
            c.now * TICK_US,
        ))
        .unwrap();
        assert!(
            matches!(outcome, RequestOutcome::Prepared { .. }),
            "{outcome:?}"
        );
        for _ in 0..30 {
            c.step();
        }
        let node = c.replica(backup);
        let completed = node.purge_generation() == 1 && node.fenced().is_none();
        c.crash(backup);
        c.acked.clear();
        c.restart(backup);
        c.produce(25);
        c.converge();
        for r in c.up() {
            assert_eq!(r.purge_generation(), 1);
            assert_eq!(r.first_offset(), 0);
        }
        c.assert_identical();
        steps += 1;
        if completed {
            break;
        }
    }
    eprintln!("purge: {steps} power cuts");
    assert!(steps >= 5, "only {steps} steps");
}

/// Five replicas: two backups lose power at once (f = 2), the others keep
/// committing, both restart and rejoin by repair.
#[test]
fn given_two_backups_of_five_crashed_together_when_restarted_should_repair_and_agree() {
    for seed in 1..=2 {
        let mut c = Cluster::with_replicas(5, seed, 512);
        c.produce(40);
        let primary = c.primary();
        let victims = [(primary + 1) % 5, (primary + 3) % 5];
        for v in victims {
            c.crash(v);
        }
        c.produce(25);
        for v in victims {
            c.restart(v);
            assert!(!c.replica(v).replica().is_quorum_visible());
        }
        c.produce(30);
        c.converge();
        c.assert_identical();
    }
}

/// A backup crashes, restarts, crashes again while re-applying (before it
/// caught up), restarts once more and still converges byte for byte.
#[test]
fn given_backup_crashed_again_mid_repair_when_restarted_should_converge() {
    for seed in 1..=3 {
        let mut c = Cluster::new(seed + 40, 512);
        c.produce(45);
        let victim = (c.primary() + 2) % REPLICAS;
        c.crash(victim);
        c.produce(20);
        c.restart(victim);
        for _ in 0..(3 + seed) {
            c.step();
        }
        c.crash(victim);
        c.produce(10);
        c.restart(victim);
        c.produce(20);
        c.converge();
        c.assert_identical();
    }
}

/// A long run of consumer-offset stores (no message, so no message
/// threshold is ever reached) still moves the recorded applied point, so a
/// backup that restarts right after finds its peers (retaining 32 ops)
/// still holding what it lacks, and rejoins without a state transfer.
#[test]
fn given_offset_only_traffic_when_backup_restarts_should_find_its_ops_retained() {
    let mut c = Cluster::new(21, 32);
    c.produce(30);
    c.store_offsets(120);
    c.converge();
    let victim = (c.primary() + 1) % REPLICAS;
    let applied = c.replica(victim).replica().commit_min();
    c.crash(victim);
    c.restart(victim);
    let resumed_at = c.replica(victim).replica().commit_min();
    assert!(
        applied - resumed_at <= 8,
        "resumed at {resumed_at}, had applied {applied}"
    );
    c.produce(20);
    c.converge();
    assert!(c.replica(victim).state_transfer_needed().is_none());
    let stored: Vec<Option<u64>> = c
        .up()
        .map(|r| r.stored_offset(ConsumerKind::Consumer, 7))
        .collect();
    assert!(
        stored.iter().all(|s| s.is_some() && *s == stored[0]),
        "{stored:?}"
    );
    c.assert_identical();
}

/// A superblock with an offset frontier but no applied point (written
/// before the applied point was recorded) names no op to resume after: a
/// replica of a group refuses to boot from it rather than guess.
#[test]
fn given_frontier_without_applied_point_when_replica_of_group_boots_should_refuse() {
    use journal::{MemSuperblock, SuperblockStore, VsrState};
    let fs = fresh_fs(3);
    let mut store = MemSuperblock::new();
    block_on(store.write(&VsrState {
        replica_id: 1,
        replica_count: REPLICAS,
        view: 2,
        log_view: 2,
        commit_max: 30,
        offset_frontier: 5,
        ..VsrState::default()
    }))
    .unwrap();
    let net = InMemoryNetwork::new(1, REPLICAS, NetworkFaults::default());
    let booted = block_on(Partition::open(
        replica_config(1, REPLICAS, 512),
        fs.clone(),
        &pdir(),
        net.endpoint(1),
        store,
    ));
    assert!(
        matches!(
            booted,
            Err(partitions::BootError::RestartNeedsStateTransfer { commit: 30, .. })
        ),
        "{booted:?}"
    );
}
