//! Helpers shared by the partition tests: a single-replica partition over
//! the simulated filesystem, a registered producer, and batch builders.
#![allow(clippy::unwrap_used, dead_code)]

use common::{ConsumerKind, GroupId, Offset, ReplicaId};
use std::path::{Path, PathBuf};

use common::simnet::NetworkFaults;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome};
use futures::executor::block_on;
use journal::SuperblockStore;
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, Partition, PartitionConfig, PollRequest,
    Polled, PollingStrategy,
};
use storage::BatchBuilder;
use storage::fs::{Fs, SimFs};

/// The partition directory used by the tests.
pub fn dir() -> PathBuf {
    PathBuf::from("/data/p0")
}

/// A single-replica configuration with small thresholds.
pub fn config() -> PartitionConfig {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(7)));
    c.partition_id = 3;
    c.created_revision = 11;
    c
}

/// A fresh simulated fs with the parent directories durable.
pub fn fresh_fs(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(Path::new("/data")).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
        fs.sync_dir(Path::new("/data")).await.unwrap();
    });
    fs
}

/// A partition replica with its network endpoint.
pub struct Node<S: SuperblockStore> {
    pub partition: Partition<InMemoryBus, S, SimFs>,
    pub net: InMemoryNetwork,
    pub session: u64,
    pub next_request: u64,
    pub now_us: u64,
}

/// Opens a single replica and registers client 1.
pub fn open<S: SuperblockStore>(fs: &SimFs, store: S, config: PartitionConfig) -> Node<S> {
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let partition = block_on(Partition::open(
        config,
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(0)),
        store,
    ))
    .unwrap();
    let mut node = Node {
        partition,
        net,
        session: 0,
        next_request: 1,
        now_us: 1_000_000,
    };
    node.register();
    node
}

/// A batch of `n` messages whose payloads name `tag` and their index.
pub fn batch(tag: u64, n: u32) -> Vec<u8> {
    let mut b = BatchBuilder::new(tag);
    for i in 0..n {
        let payload = format!("m-{tag}-{i}");
        b.push(
            u128::from(tag) << 32 | u128::from(i),
            i,
            payload.as_bytes(),
            b"",
        );
    }
    b.build()
}

impl<S: SuperblockStore> Node<S> {
    pub fn register(&mut self) {
        let out = block_on(self.partition.submit(
            ClientRequest {
                client: 1,
                session: 0,
                request: 0,
                user_id: 1,
                op: ClientOp::Register,
            },
            self.now_us,
        ))
        .unwrap();
        // A restored session no request used yet is answered from the
        // client table: registering is idempotent.
        assert!(
            matches!(
                out,
                RequestOutcome::Prepared { .. } | RequestOutcome::Answered
            ),
            "{out:?}"
        );
        let replies = self.net.take_replies(ReplicaId(0));
        let reply = replies.last().unwrap();
        assert_eq!(reply.status, ReplyStatus::Ok);
        self.session = reply.session;
        // A client keeps numbering its requests past what committed (a
        // session restored across a restart keeps its watermark).
        self.next_request = self
            .partition
            .replica()
            .client_table()
            .export()
            .iter()
            .find(|w| w.client == 1)
            .map_or(1, |w| w.watermark + 1);
    }

    /// Submits an op as client 1 and expects an Ok reply.
    pub fn request(&mut self, op: ClientOp) {
        let request = self.next_request;
        self.next_request += 1;
        let out = block_on(self.partition.submit(
            ClientRequest {
                client: 1,
                session: self.session,
                request,
                user_id: 1,
                op,
            },
            self.now_us,
        ))
        .unwrap();
        assert!(matches!(out, RequestOutcome::Prepared { .. }), "{out:?}");
        let replies = self.net.take_replies(ReplicaId(0));
        assert!(
            replies
                .iter()
                .any(|r| r.request == request && r.status == ReplyStatus::Ok),
            "no Ok reply for request {request}: {replies:?}"
        );
    }

    /// Produces one batch of `n` messages at the node's clock, which then
    /// advances by 1 ms.
    pub fn produce(&mut self, tag: u64, n: u32) {
        self.request(ClientOp::Append(batch(tag, n)));
        self.now_us += 1_000;
    }

    pub fn store(&mut self, kind: ConsumerKind, id: u32, offset: u64) {
        self.request(ClientOp::StoreOffset {
            kind,
            id,
            offset: Offset(offset),
        });
    }

    pub fn poll(&self, strategy: PollingStrategy, count: u32) -> Polled {
        self.poll_as((ConsumerKind::Consumer, 1), strategy, count, false)
    }

    pub fn poll_as(
        &self,
        consumer: (ConsumerKind, u32),
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Polled {
        block_on(self.partition.poll(&PollRequest {
            consumer,
            strategy,
            count,
            auto_commit,
        }))
        .unwrap()
    }

    pub fn tick(&mut self) {
        self.now_us += 10_000;
        block_on(self.partition.on_tick(self.now_us)).unwrap();
    }
}

/// The offsets and payloads of a poll's messages.
pub fn contents(p: &Polled) -> Vec<(u64, Vec<u8>)> {
    p.messages()
        .map(|m| (m.offset, m.payload.to_vec()))
        .collect()
}

/// The offsets of a poll's messages.
pub fn offsets(p: &Polled) -> Vec<u64> {
    p.messages().map(|m| m.offset).collect()
}
