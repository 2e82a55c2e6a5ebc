//! The three-replica test cluster shared by the restart, install,
//! transfer-needed and end-to-end transfer tests: an in-memory bus with
//! seeded faults, simulated filesystems that crash and lose unsynced data,
//! a retrying producer, byte comparison of segment files, and (when
//! enabled) a state-transfer driver per replica fed by the bus and ticks.
#![allow(clippy::unwrap_used, dead_code)]

#[path = "../pump/mod.rs"]
mod pump;

use common::{ConsumerKind, GroupId, Offset, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::simnet::NetworkFaults;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome, TimeoutConfig};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::StateTransferNeeded;
use partitions::state_transfer::{
    BuildBudget, BuildClock, InstallInput, LocalFacts, OfferServer, OfferServerConfig,
    ReceiverConfig, TransferDriver, TransferDriverConfig, TransferEvent, TransferReceiver,
    TransferSlots,
};
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, MessageBus, Partition, PartitionConfig,
    PartitionError, PollRequest, PollingStrategy,
};
use storage::BatchBuilder;
use storage::fs::{FileKind, Fs, SimFs};

pub type Replica = Partition<InMemoryBus, FileSuperblock<SimFs>, SimFs>;

pub const REPLICAS: u8 = 3;
pub const GROUP: u64 = 9;
pub const MESSAGES_PER_BATCH: u32 = 10;
pub const RETRY_TICKS: u64 = 30;
pub const TICK_US: u64 = 10_000;
pub const CLIENT: u128 = 42;

pub fn pdir() -> PathBuf {
    PathBuf::from("/data/p")
}

/// The cluster id the transfer drivers stamp on their frames.
pub const CLUSTER: u128 = 0xC1;

/// The size of the data a cluster holds: the defaults are small segments
/// of small batches on a quiet network.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub segment_size: u64,
    /// Messages between flushes.
    pub messages_required_to_save: u64,
    pub messages_per_batch: u32,
    /// Payload bytes per message; 0 for a short text payload.
    pub payload_len: usize,
    pub faults: NetworkFaults,
    /// The `persisted` durability mode (`enforce_fsync`).
    pub enforce_fsync: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            segment_size: 8 * 1024,
            // A flush every three batches, unsynced unless it seals a
            // segment or the recorded applied point lags by
            // `retention_ops / 4`.
            messages_required_to_save: 30,
            messages_per_batch: MESSAGES_PER_BATCH,
            payload_len: 0,
            faults: NetworkFaults::default(),
            enforce_fsync: false,
        }
    }
}

pub fn replica_config(replica: u8, count: u8, retention_ops: u64) -> PartitionConfig {
    shaped_config(replica, count, retention_ops, &Shape::default())
}

pub fn shaped_config(replica: u8, count: u8, retention_ops: u64, shape: &Shape) -> PartitionConfig {
    let mut vsr = Config::new(ReplicaId(replica), count, GroupId(GROUP));
    vsr.timeouts = TimeoutConfig::scaled_down(5);
    vsr.retention_ops = retention_ops;
    vsr.seed = 13;
    let mut c = PartitionConfig::new(vsr);
    c.partition_id = 2;
    c.log.segment_size_bytes = shape.segment_size;
    c.messages_required_to_save = shape.messages_required_to_save;
    c.enforce_fsync = shape.enforce_fsync;
    c
}

/// A transfer-driver configuration for small test clusters: 4 KiB chunks,
/// retries after 10 ticks, a 16 MiB build budget.
pub fn small_chunk_driver_config() -> TransferDriverConfig {
    let mut c = TransferDriverConfig::new(CLUSTER, GroupId(GROUP));
    c.receiver.chunk_len_max_bytes = 4096;
    c.receiver.repair_retry_ticks = 10;
    c.server.chunk_len_max_bytes = 4096;
    c.server.repair_retry_ticks = 10;
    c.server.budget = BuildBudget::bytes(16 << 20);
    c
}

/// A build clock that never advances: rounds are bounded by bytes alone,
/// so runs replay exactly.
pub struct FrozenClock;

impl BuildClock for FrozenClock {
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

pub fn fresh_fs(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(Path::new("/data")).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
        fs.sync_dir(Path::new("/data")).await.unwrap();
    });
    fs
}

pub fn open(fs: &SimFs, net: &InMemoryNetwork, r: u8, count: u8, retention_ops: u64) -> Replica {
    open_shaped(fs, net, r, count, retention_ops, &Shape::default())
}

pub fn open_shaped(
    fs: &SimFs,
    net: &InMemoryNetwork,
    r: u8,
    count: u8,
    retention_ops: u64,
    shape: &Shape,
) -> Replica {
    block_on(Partition::open(
        shaped_config(r, count, retention_ops, shape),
        fs.clone(),
        &pdir(),
        net.endpoint(ReplicaId(r)),
        FileSuperblock::new(fs.clone(), &pdir()),
    ))
    .unwrap()
}

/// The ids of batch `n`'s messages.
pub fn batch(n: u64) -> (Vec<u8>, Vec<u128>) {
    shaped_batch(n, &Shape::default())
}

/// Batch `n` in `shape` and the ids of its messages.
pub fn shaped_batch(n: u64, shape: &Shape) -> (Vec<u8>, Vec<u128>) {
    let mut b = BatchBuilder::new(n);
    let mut ids = Vec::new();
    for i in 0..shape.messages_per_batch {
        let id = CLIENT << 64 | u128::from(n) << 16 | u128::from(i);
        ids.push(id);
        let mut payload = format!("b{n}-m{i}-").into_bytes();
        if shape.payload_len > 0 {
            payload.resize(shape.payload_len, (n as u8) ^ (i as u8));
        }
        b.push(id, i, &payload, b"h");
    }
    (b.build(), ids)
}

/// The drivers of a cluster whose replicas drive their own transfers.
pub struct Drivers {
    pub config: TransferDriverConfig,
    /// One per replica (`None` while it is down).
    pub drivers: Vec<Option<TransferDriver<SimFs>>>,
    /// One shard per replica.
    pub slots: Vec<TransferSlots>,
    /// Everything they reported, by replica.
    pub events: Vec<(u8, TransferEvent)>,
    /// Frames a driver refused.
    pub refused_frames: u64,
    /// Restarts so far (each driver's nonces come from a fresh seed).
    pub incarnations: u64,
}

pub struct Cluster {
    /// Replicas in the group.
    pub n: u8,
    pub net: InMemoryNetwork,
    pub fss: Vec<SimFs>,
    pub replicas: Vec<Option<Replica>>,
    pub retention_ops: u64,
    /// A replica whose power is cut: its errors are expected.
    pub powerless: Option<u8>,
    pub now: u64,
    // The one producing client.
    pub session: Option<u64>,
    pub in_flight: Option<(u64, ClientOp, Vec<u128>)>,
    pub sent_at: u64,
    pub target: u8,
    pub next_request: u64,
    pub acked: Vec<u128>,
    /// Every acknowledged request's op, in order.
    pub acked_ops: Vec<ClientOp>,
    pub shape: Shape,
    /// The state-transfer drivers, once enabled.
    pub drivers: Option<Drivers>,
    /// Called once per tick after the replicas stepped (a test's hook).
    pub on_step: Option<Box<dyn FnMut(u64)>>,
}

impl Cluster {
    pub fn new(seed: u64, retention_ops: u64) -> Self {
        Self::with_replicas(REPLICAS, seed, retention_ops)
    }

    pub fn with_replicas(n: u8, seed: u64, retention_ops: u64) -> Self {
        Self::shaped(n, seed, retention_ops, Shape::default())
    }

    pub fn shaped(n: u8, seed: u64, retention_ops: u64, shape: Shape) -> Self {
        let net = InMemoryNetwork::new(seed, n, shape.faults);
        let fss: Vec<SimFs> = (0..n).map(|r| fresh_fs(seed * 31 + u64::from(r))).collect();
        let replicas = (0..n)
            .map(|r| {
                Some(open_shaped(
                    &fss[usize::from(r)],
                    &net,
                    r,
                    n,
                    retention_ops,
                    &shape,
                ))
            })
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
            acked_ops: Vec::new(),
            shape,
            drivers: None,
            on_step: None,
        }
    }

    /// Gives every replica a state-transfer driver with `config`, fed the
    /// encoded frames of the bus and the cluster's ticks.
    pub fn enable_transfer_drivers(&mut self, config: TransferDriverConfig) {
        let mut d = Drivers {
            config,
            drivers: Vec::new(),
            slots: (0..self.n).map(|_| TransferSlots::default()).collect(),
            events: Vec::new(),
            refused_frames: 0,
            incarnations: 0,
        };
        for r in 0..self.n {
            let driver = self.replicas[usize::from(r)]
                .is_some()
                .then(|| new_driver(&self.fss[usize::from(r)], &config, r, 0));
            d.drivers.push(driver);
        }
        self.drivers = Some(d);
    }

    /// The driver of replica `r`.
    pub fn driver(&self, r: u8) -> &TransferDriver<SimFs> {
        self.drivers.as_ref().unwrap().drivers[usize::from(r)]
            .as_ref()
            .unwrap()
    }

    /// Routes the encoded frames due now to the drivers, then ticks them.
    fn step_drivers(&mut self) {
        let Some(d) = self.drivers.as_mut() else {
            return;
        };
        let mut outgoing = Vec::new();
        for (to, from, frame) in self.net.take_wire() {
            let i = usize::from(to);
            let (Some(replica), Some(driver)) = (self.replicas[i].as_mut(), d.drivers[i].as_mut())
            else {
                continue;
            };
            match block_on(driver.on_frame(replica, &mut d.slots[i], from, frame, &FrozenClock)) {
                Ok(out) => {
                    outgoing.push((to, out.send));
                    d.events.extend(out.events.into_iter().map(|e| (to, e)));
                }
                Err(_) => d.refused_frames += 1,
            }
        }
        for i in 0..usize::from(self.n) {
            let (Some(replica), Some(driver)) = (self.replicas[i].as_mut(), d.drivers[i].as_mut())
            else {
                continue;
            };
            let out = block_on(driver.on_tick(replica, &mut d.slots[i], &FrozenClock));
            outgoing.push((i as u8, out.send));
            d.events
                .extend(out.events.into_iter().map(|e| (i as u8, e)));
        }
        for (from, frames) in outgoing {
            let bus = self.net.endpoint(ReplicaId(from));
            for o in frames {
                bus.send_wire_to_replica(ReplicaId(o.to), o.frame);
            }
        }
    }

    pub fn replica(&self, r: u8) -> &Replica {
        self.replicas[usize::from(r)].as_ref().unwrap()
    }

    pub fn up(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().flatten()
    }

    /// The primary of the highest view any live replica is in.
    pub fn primary(&self) -> u8 {
        let r = self.up().max_by_key(|r| r.replica().view()).unwrap();
        r.replica().primary_index(r.replica().view()).0
    }

    pub fn step(&mut self) {
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
                Err(PartitionError::Fenced { .. }) if r.fenced().is_some() => {}
                // Dropped while its install runs; peers send again.
                Err(PartitionError::InstallInProgress { .. }) if r.installing() => {}
                Err(e) => panic!("replica {to}: {e}"),
            }
        }
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            match block_on(r.on_tick(self.now * TICK_US)) {
                Ok(()) => {}
                Err(_) if self.powerless.is_some_and(|p| usize::from(p) == i) => {}
                Err(PartitionError::Fenced { .. }) if r.fenced().is_some() => {}
                Err(e) => panic!("replica {i}: {e}"),
            }
        }
        self.step_drivers();
        for (i, r) in self.replicas.iter().enumerate() {
            if let Some(r) = r
                && self.powerless.is_none_or(|p| usize::from(p) != i)
                && let Err(v) = r.invariants()
            {
                panic!("replica {i} at tick {}: invariant {v}", self.now);
            }
        }
        if let Some(hook) = self.on_step.as_mut() {
            hook(self.now);
        }
    }

    /// The client sends or retries one request, the cluster steps, replies
    /// are taken. `produce` false: only finish what is in flight.
    pub fn client_step(&mut self, produce: bool) {
        let shape = self.shape;
        self.client_step_with(produce, |n| {
            let (bytes, ids) = shaped_batch(n, &shape);
            (ClientOp::Append(bytes), ids)
        });
    }

    /// One client step whose next request (number `n`) is `next(n)`.
    pub fn client_step_with(&mut self, produce: bool, next: impl Fn(u64) -> (ClientOp, Vec<u128>)) {
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
            for reply in self.net.take_replies(ReplicaId(r)) {
                let Some((request, op, ids)) = self.in_flight.as_ref() else {
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
                            self.acked_ops.push(op.clone());
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

    /// The client gives up its request in flight (lost with the cluster).
    /// It never sends another request under that number: a durable group
    /// may still commit the one it gave up (the replica log keeps what a
    /// quorum acknowledged), and the client table would then answer a
    /// different request under the same number from that one's result.
    pub fn abandon_in_flight(&mut self) {
        if let Some((request, _, _)) = self.in_flight.take()
            && request != 0
        {
            self.next_request = request + 1;
        }
    }

    /// Produces until `batches` more batches are acknowledged.
    pub fn produce(&mut self, batches: u64) {
        let goal = self.next_request + batches;
        let mut ticks = 0;
        while self.next_request < goal {
            ticks += 1;
            assert!(ticks < 50_000, "no progress producing");
            self.client_step(true);
        }
    }

    /// Runs `count` more explicit consumer-offset stores (no messages).
    pub fn store_offsets(&mut self, count: u64) {
        let goal = self.next_request + count;
        let mut ticks = 0;
        while self.next_request < goal {
            ticks += 1;
            assert!(ticks < 50_000, "no progress storing offsets");
            self.client_step_with(true, |n| {
                let op = ClientOp::StoreOffset {
                    kind: ConsumerKind::Consumer,
                    id: 7,
                    offset: Offset(n % 50),
                };
                (op, Vec::new())
            });
        }
    }

    /// Power loss on replica `r`: its process is gone and its disk keeps
    /// what the seeded crash keeps of the unsynced state.
    pub fn crash(&mut self, r: u8) {
        self.powerless = None;
        self.replicas[usize::from(r)] = None;
        self.fss[usize::from(r)].crash();
        if let Some(d) = self.drivers.as_mut() {
            // The process is gone: its sessions and the shard's budget too.
            d.drivers[usize::from(r)] = None;
            d.slots[usize::from(r)] = TransferSlots::default();
        }
    }

    /// Replica `r`'s process is killed: the page cache survives, so its
    /// disk keeps everything written.
    pub fn kill(&mut self, r: u8) {
        self.powerless = None;
        self.replicas[usize::from(r)] = None;
        self.fss[usize::from(r)].crash_with(storage::fs::CrashMode::KeepAll);
        if let Some(d) = self.drivers.as_mut() {
            d.drivers[usize::from(r)] = None;
            d.slots[usize::from(r)] = TransferSlots::default();
        }
    }

    /// Boots replica `r` on its disk as it is, returning the boot's
    /// error instead of a replica when it fails.
    pub fn try_boot(&self, r: u8) -> Result<Replica, partitions::BootError> {
        block_on(Partition::open(
            shaped_config(r, self.n, self.retention_ops, &self.shape),
            self.fss[usize::from(r)].clone(),
            &pdir(),
            self.net.endpoint(ReplicaId(r)),
            FileSuperblock::new(self.fss[usize::from(r)].clone(), &pdir()),
        ))
    }

    pub fn restart(&mut self, r: u8) {
        let p = open_shaped(
            &self.fss[usize::from(r)],
            &self.net,
            r,
            self.n,
            self.retention_ops,
            &self.shape,
        );
        self.replicas[usize::from(r)] = Some(p);
        if let Some(d) = self.drivers.as_mut() {
            d.incarnations += 1;
            d.drivers[usize::from(r)] = Some(new_driver(
                &self.fss[usize::from(r)],
                &d.config,
                r,
                d.incarnations,
            ));
        }
    }

    /// Replica `r`'s disk is replaced: the process and every byte it held
    /// are gone, and it starts again on an empty disk, as a rejoining
    /// replica (`rejoin`, the documented procedure) or as a new one.
    pub fn replace_disk(&mut self, r: u8, rejoin: bool) {
        self.crash(r);
        self.fss[usize::from(r)] = fresh_fs(0xD15C ^ u64::from(r) ^ self.now);
        let mut config = shaped_config(r, self.n, self.retention_ops, &self.shape);
        config.rejoin = rejoin;
        let fs = &self.fss[usize::from(r)];
        let p = block_on(Partition::open(
            config,
            fs.clone(),
            &pdir(),
            self.net.endpoint(ReplicaId(r)),
            FileSuperblock::new(fs.clone(), &pdir()),
        ))
        .unwrap();
        self.replicas[usize::from(r)] = Some(p);
    }

    /// The ids of the messages replica `r` holds below its frontier.
    pub fn stored_ids(&self, r: u8) -> BTreeSet<u128> {
        let end = self.replica(r).offset_frontier().0;
        self.held_below(r, end).into_values().collect()
    }

    /// `(offset, id)` of every message replica `r` serves below `end`.
    pub fn held_below(&self, r: u8, end: u64) -> BTreeMap<u64, u128> {
        let replica = self.replica(r);
        let mut held = BTreeMap::new();
        let mut at = 0;
        while at < end {
            let p = block_on(replica.poll(&PollRequest {
                consumer: (ConsumerKind::Consumer, 1),
                strategy: PollingStrategy::Offset(at),
                count: 500,
                auto_commit: false,
            }))
            .unwrap();
            if p.is_empty() {
                break;
            }
            held.extend(
                p.messages()
                    .filter(|m| m.offset < end)
                    .map(|m| (m.offset, m.id)),
            );
            at = p.last_offset.0 + 1;
        }
        held
    }

    /// Steps until every live replica applied what any committed.
    pub fn converge(&mut self) {
        while self.in_flight.is_some() {
            self.client_step(false);
        }
        for _ in 0..20_000 {
            let target = self.up().map(|r| r.replica().commit_max().0).max().unwrap();
            if self
                .up()
                .all(|r| r.replica().commit_min().0 >= target && r.replica().is_quorum_visible())
            {
                return;
            }
            self.step();
        }
        panic!(
            "no convergence: {:?}",
            self.up()
                .map(|r| (r.replica().commit_min().0, r.replica().commit_max().0))
                .collect::<Vec<_>>()
        );
    }

    /// Same polls everywhere, every acknowledged message present, and after
    /// a flush byte-identical segment files.
    pub fn assert_identical(&mut self) {
        let frontiers: Vec<u64> = self.up().map(|r| r.offset_frontier().0).collect();
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
                at = p.last_offset.0 + 1;
            }
            per_replica.push(all);
        }
        for other in &per_replica[1..] {
            assert_eq!(&per_replica[0], other);
        }
        let offsets: Vec<_> = self.up().map(|r| r.durable_offsets().clone()).collect();
        for (r, other) in offsets.iter().enumerate().skip(1) {
            assert_eq!(
                &offsets[0], other,
                "replica {r} holds other consumer offsets"
            );
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

/// Pulls replica `from`'s offer into replica `to` and installs it.
pub fn transfer(c: &mut Cluster, from: u8, to: u8) -> u64 {
    let input = pull(c, from, to);
    let receiver = c.replicas[usize::from(to)].as_mut().unwrap();
    block_on(receiver.install_partition_state(input))
        .unwrap()
        .applied_commit_op
        .0
}

/// Pulls replica `from`'s offer into replica `to`'s staging files.
pub fn pull(c: &mut Cluster, from: u8, to: u8) -> InstallInput {
    let facts = {
        let r = c.replica(to).replica();
        LocalFacts {
            replica: ReplicaId(to),
            replica_count: c.n,
            view: r.view(),
            primary: ReplicaId(r.primary_index(r.view()).0),
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
    let request = rx.arm(ReplicaId(from));
    let peer = c.replicas[usize::from(from)].as_mut().unwrap();
    let hooks = pump::Hooks {
        view: peer.replica().view(),
        ..pump::Hooks::default()
    };
    let serving = pump::Serving {
        id: from,
        partition: peer,
        fs: &from_fs,
        server: &mut server,
    };
    let done = pump::complete(pump::pump(&mut rx, serving, to, request, &facts, &hooks));
    // Nothing stepped since the offer was built: the server's applied op is
    // the offer's, and its identity is the one the hash chain continues from.
    let peer = c.replica(from).replica();
    assert_eq!(peer.commit_min().0, done.descriptor.commit_op.0);
    server.reset();
    InstallInput::from_received(&done, peer.commit_min_checksum())
}

/// A cluster whose backup restarted behind every peer's retention and asks
/// for a state transfer.
pub fn lagging_backup(seed: u64) -> (Cluster, u8, StateTransferNeeded) {
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

fn new_driver(
    fs: &SimFs,
    config: &TransferDriverConfig,
    r: u8,
    incarnation: u64,
) -> TransferDriver<SimFs> {
    TransferDriver::new(
        fs.clone(),
        &pdir(),
        *config,
        0xD21F_u64 ^ u64::from(r) << 8 ^ incarnation << 16,
    )
}

pub fn segment_files(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = block_on(fs.read_dir(&pdir()))
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == FileKind::File)
        .filter_map(|e| {
            let name = e.name_str()?.to_owned();
            // The replica log is each replica's own journal, not data.
            let segment = name.ends_with(".log") || name.ends_with(".index");
            (segment && name != journal::REPLICA_LOG_FILE).then_some(name)
        })
        .map(|name| {
            let bytes = fs.contents(&pdir().join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}
