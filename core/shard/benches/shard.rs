//! The shard's own costs, as ratios measured in the same run:
//!
//! - `tick/idle_groups/N`: one tick of a shard holding N idle one-replica
//!   groups (100, 1,000, 10,000), against the 10 ms tick period. Goal: at
//!   most 5% of the period at 10,000 groups. The printed line gives the
//!   fraction of the period one tick takes.
//! - `produce/shard` against `produce/partition`: the same batches
//!   appended through a shard (call envelope, session, reply matching) and
//!   to a `Partition` driven directly, both single-replica on the same
//!   in-memory filesystem, so the ratio is the shard's overhead alone.
//!   Goal: ≥ 0.9.
//!
//! `cargo bench -p shard` runs both; `SHARD_BENCH_GROUPS_MAX` caps the
//! idle-group counts (default 10,000).
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::simnet::NetworkFaults;
use common::{GroupId, ReplicaId};
use consensus::vsr::{Config, RequestOutcome};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::channel::oneshot;
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::{ClientOp, ClientRequest, InMemoryNetwork, Partition, PartitionConfig};
use shard::testing::{TestClock, TestEnv, TestNet};
use shard::{Answer, Call, Envelope, GroupSpec, Shard, ShardConfig, ShardIndex};
use storage::BatchBuilder;
use storage::fs::{Fs, SimFs};

const TICK: Duration = Duration::from_millis(10);
const BATCHES: u64 = 200;
const MESSAGES_PER_BATCH: u32 = 100;
const MESSAGE_BYTES: usize = 100;

fn fs() -> SimFs {
    let fs = SimFs::new(1);
    block_on(fs.create_dir_all(Path::new("/data"))).unwrap();
    fs
}

fn one_replica_shard(groups: u64) -> (Shard<TestEnv>, Rc<TestClock>) {
    let clock = TestClock::new();
    let env = TestEnv::new(
        ReplicaId(0),
        ShardIndex(0),
        Rc::clone(&clock),
        TestNet::new(1, NetworkFaults::default()),
        fs(),
    );
    let config = ShardConfig::new(
        1,
        ReplicaId(0),
        1,
        ShardIndex(0),
        1,
        PathBuf::from("/data/shard-0"),
    );
    let mut shard = block_on(Shard::open(config, env)).unwrap();
    for g in 0..groups {
        let spec = GroupSpec::new(GroupId(g << 20 | 1), 1);
        block_on(shard.create_group(spec)).unwrap();
    }
    // Past the first ticks, where every group opens its view.
    for _ in 0..20 {
        clock.advance(TICK);
        block_on(shard.on_tick());
    }
    (shard, clock)
}

fn batch(n: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new(n);
    let payload = vec![n as u8; MESSAGE_BYTES];
    for i in 0..MESSAGES_PER_BATCH {
        b.push(
            (u128::from(n) << 32) | (u128::from(i) + 1),
            i,
            &payload,
            b"",
        );
    }
    b.build()
}

fn bench_ticks(c: &mut Criterion) {
    let max: u64 = std::env::var("SHARD_BENCH_GROUPS_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut group = c.benchmark_group("tick");
    group.sample_size(20);
    for n in [100u64, 1_000, 10_000].into_iter().filter(|n| *n <= max) {
        let (mut shard, clock) = one_replica_shard(n);
        // Paired measurement printed as the fraction of the tick period.
        let start = Instant::now();
        let rounds = 50;
        for _ in 0..rounds {
            clock.advance(TICK);
            block_on(shard.on_tick());
        }
        let per_tick = start.elapsed() / rounds;
        println!(
            "tick with {n} idle groups: {per_tick:?} = {:.2}% of the {TICK:?} period ({:.0} ns per group)",
            per_tick.as_secs_f64() / TICK.as_secs_f64() * 100.0,
            per_tick.as_nanos() as f64 / n as f64
        );
        group.bench_function(BenchmarkId::new("idle_groups", n), |b| {
            b.iter(|| {
                clock.advance(TICK);
                block_on(shard.on_tick());
            })
        });
    }
    group.finish();
}

fn produce_through_shard(batches: &[Vec<u8>]) -> Duration {
    let (mut shard, clock) = one_replica_shard(1);
    let group = GroupId(1);
    let start = Instant::now();
    for b in batches {
        let (tx, mut rx) = oneshot::channel();
        block_on(shard.on_call(Envelope {
            group,
            call: Call::produce(b.clone()),
            reply: tx,
        }));
        // A single replica commits at once; a session opens on the first
        // call, which a tick completes.
        let mut answered = rx.try_recv().unwrap();
        while answered.is_none() {
            clock.advance(TICK);
            block_on(shard.on_tick());
            answered = rx.try_recv().unwrap();
        }
        assert!(matches!(answered, Some(Ok(Answer::Committed { .. }))));
    }
    start.elapsed()
}

fn produce_direct(batches: &[Vec<u8>]) -> Duration {
    let fs = fs();
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let mut config = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(1)));
    config.partition_id = 1;
    let mut p = block_on(Partition::open(
        config,
        fs,
        Path::new("/data/p"),
        net.endpoint(ReplicaId(0)),
        MemSuperblock::new(),
    ))
    .unwrap();
    for t in 0..20u64 {
        block_on(p.on_tick(t * 10_000)).unwrap();
    }
    let client = 7u128;
    let register = ClientRequest {
        client,
        session: 0,
        request: 0,
        user_id: 0,
        op: ClientOp::Register,
    };
    block_on(p.submit(register, 200_000)).unwrap();
    let session = net
        .take_replies(ReplicaId(0))
        .first()
        .map(|r| r.session)
        .expect("register committed");
    let start = Instant::now();
    for (i, b) in batches.iter().enumerate() {
        let request = ClientRequest {
            client,
            session,
            request: i as u64 + 1,
            user_id: 0,
            op: ClientOp::Append(b.clone()),
        };
        let outcome = block_on(p.submit(request, 300_000)).unwrap();
        assert!(matches!(outcome, RequestOutcome::Prepared { .. }));
        assert_eq!(net.take_replies(ReplicaId(0)).len(), 1);
    }
    start.elapsed()
}

fn bench_produce(c: &mut Criterion) {
    let batches: Vec<Vec<u8>> = (1..=BATCHES).map(batch).collect();
    let bytes = batches.iter().map(|b| b.len() as u64).sum::<u64>();
    let mut ratios = Vec::new();
    for round in 0..7 {
        let (direct, through) = if round % 2 == 0 {
            (produce_direct(&batches), produce_through_shard(&batches))
        } else {
            let t = produce_through_shard(&batches);
            (produce_direct(&batches), t)
        };
        ratios.push(direct.as_secs_f64() / through.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "produce through the shard / partition driven directly: median {:.2} (pairs {:.2}..{:.2}; goal >= 0.9)",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let mut group = c.benchmark_group("produce");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(10);
    group.bench_function("partition", |b| b.iter(|| produce_direct(&batches)));
    group.bench_function("shard", |b| b.iter(|| produce_through_shard(&batches)));
    group.finish();
}

criterion_group!(benches, bench_ticks, bench_produce);
criterion_main!(benches);
