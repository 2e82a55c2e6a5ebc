//! Committed ops per second of three replica cores wired in memory.
//!
//! No I/O and no faults: frames go through a FIFO, superblock writes are
//! acknowledged at once, and one client keeps the primary's 32-deep
//! pipeline full with 128-byte requests. This measures the cost of the
//! core itself (hashing, journal, pipeline, acks, apply), so it shows
//! whether the core can be the bottleneck next to fsync and the network.
//! Both prepare topologies are measured; a deterministic simulation with a
//! one-tick network delay also reports each topology's request latency.
#![allow(clippy::unwrap_used, missing_docs)]

use common::{GroupId, ReplicaId};
use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use consensus::vsr::{
    Action, Config, Effect, Frame, OPERATION_APPEND, OPERATION_REGISTER, Replica, Request,
    RequestOutcome, Topology,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vsr_harness::{SimConfig, Simulation};

struct Cluster {
    replicas: Vec<Replica>,
    queue: VecDeque<(u8, Frame)>,
    applied_on_primary: u64,
    frames: u64,
}

impl Cluster {
    fn new(n: u8, topology: Topology) -> Self {
        let replicas = (0..n)
            .map(|r| {
                let mut c = Config::new(ReplicaId(r), n, GroupId(0));
                c.topology = topology;
                Replica::new(c)
            })
            .collect();
        Self {
            replicas,
            queue: VecDeque::new(),
            applied_on_primary: 0,
            frames: 0,
        }
    }

    fn drain(&mut self, r: u8) {
        loop {
            let actions = self.replicas[usize::from(r)].take_actions();
            if actions.is_empty() {
                return;
            }
            for action in actions {
                match action {
                    Action::Send { to, frame } => self.queue.push_back((to.0, frame)),
                    Action::Effect(Effect::PersistState { view, log_view, .. }) => {
                        self.replicas[usize::from(r)].on_persisted(view, log_view);
                    }
                    Action::Effect(Effect::Apply { .. }) if r == 0 => self.applied_on_primary += 1,
                    _ => {}
                }
            }
        }
    }

    fn pump(&mut self) {
        while let Some((to, frame)) = self.queue.pop_front() {
            self.frames += 1;
            self.replicas[usize::from(to)].on_frame(frame).unwrap();
            self.drain(to);
        }
    }

    fn request(&mut self, request: Request) -> RequestOutcome {
        let outcome = self.replicas[0].on_client_request(request);
        self.drain(0);
        outcome
    }
}

fn request(session: u64, number: u64, operation: u8, body: &Bytes) -> Request {
    Request {
        client: 7,
        session,
        request: number,
        operation,
        user_id: 1,
        request_checksum: 0,
        body: body.clone(),
    }
}

/// Commit `ops` requests; returns the elapsed time.
fn run(ops: u64, topology: Topology) -> (Duration, u64) {
    let body = Bytes::from(vec![0xAB; 128]);
    let mut c = Cluster::new(3, topology);
    c.request(request(0, 0, OPERATION_REGISTER, &body));
    c.pump();
    let session = c.replicas[0].client_table().session(7).unwrap();
    let base = c.applied_on_primary;
    let start = Instant::now();
    let mut next = 1;
    while c.applied_on_primary - base < ops {
        while next <= ops
            && matches!(
                c.request(request(session, next, OPERATION_APPEND, &body)),
                RequestOutcome::Prepared { .. }
            )
        {
            next += 1;
        }
        c.pump();
    }
    let elapsed = start.elapsed();
    black_box(&c.replicas);
    (elapsed, c.frames)
}

/// Mean ticks from a request's first send to its reply, with every frame
/// taking exactly one tick: the commit path's length in network hops.
fn latency_ticks(replica_count: u8, topology: Topology) -> f64 {
    let mut config = SimConfig::quiet(1, replica_count);
    config.topology = topology;
    config.clients = 1;
    config.requests_per_client = 200;
    let mut sim = Simulation::new(config);
    sim.set_random_faults(false);
    sim.run_until(100_000, |s| s.acknowledged().len() >= 200)
        .unwrap();
    let report = sim.report();
    report.reply_latency_ticks_total as f64 / report.acknowledged as f64
}

fn bench(c: &mut Criterion) {
    const OPS: u64 = 10_000;
    for topology in [Topology::Star, Topology::Chain] {
        let (elapsed, frames) = run(OPS, topology);
        eprintln!(
            "vsr {topology:?}: 3 replicas, {OPS} ops in {elapsed:?}: {:.0} committed ops/s, \
             {:.2} frames/op; request latency with 1-tick hops: n=3 {:.2} ticks, n=5 {:.2} ticks",
            OPS as f64 / elapsed.as_secs_f64(),
            frames as f64 / OPS as f64,
            latency_ticks(3, topology),
            latency_ticks(5, topology),
        );
    }
    let mut group = c.benchmark_group("vsr");
    group.throughput(Throughput::Elements(OPS));
    group.sample_size(10);
    group.bench_function("three_replicas_commit_10k_ops_star", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run(OPS, Topology::Star).0).sum())
    });
    group.bench_function("three_replicas_commit_10k_ops_chain", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run(OPS, Topology::Chain).0).sum())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
