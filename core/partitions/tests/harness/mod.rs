//! The three-replica test cluster shared by the restart, install and
//! transfer-needed tests: an in-memory bus with seeded faults, simulated
//! filesystems that crash and lose unsynced data, a retrying producer, and
//! byte comparison of segment files.
#![allow(clippy::unwrap_used, dead_code)]

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

pub fn replica_config(replica: u8, count: u8, retention_ops: u64) -> PartitionConfig {
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
pub fn batch(n: u64) -> (Vec<u8>, Vec<u128>) {
    let mut b = BatchBuilder::new(n);
    let mut ids = Vec::new();
    for i in 0..MESSAGES_PER_BATCH {
        let id = CLIENT << 64 | u128::from(n) << 16 | u128::from(i);
        ids.push(id);
        b.push(id, i, format!("b{n}-m{i}").as_bytes(), b"h");
    }
    (b.build(), ids)
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
}

impl Cluster {
    pub fn new(seed: u64, retention_ops: u64) -> Self {
        Self::with_replicas(REPLICAS, seed, retention_ops)
    }

    pub fn with_replicas(n: u8, seed: u64, retention_ops: u64) -> Self {
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

    pub fn replica(&self, r: u8) -> &Replica {
        self.replicas[usize::from(r)].as_ref().unwrap()
    }

    pub fn up(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().flatten()
    }

    /// The primary of the highest view any live replica is in.
    pub fn primary(&self) -> u8 {
        let r = self.up().max_by_key(|r| r.replica().view()).unwrap();
        r.replica().primary_index(r.replica().view())
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
    pub fn client_step(&mut self, produce: bool) {
        self.client_step_with(produce, |n| {
            let (bytes, ids) = batch(n);
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
                    offset: n % 50,
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
    }

    pub fn restart(&mut self, r: u8) {
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
    pub fn converge(&mut self) {
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
    pub fn assert_identical(&mut self) {
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

pub fn segment_files(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
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
