//! What `persisted` produce costs against `replicated`, on one replica and
//! on a group of three, over the real filesystem, in the same run (SPEC
//! §11: ratios, never absolute figures, on this shared 2-core machine).
//!
//! - `replicated` (`enforce_fsync = false`): a reply waits for the batch
//!   to be in the primary's file (page cache) and, with three replicas,
//!   for a quorum of prepare-oks; nothing is synced per batch.
//! - `persisted` (`enforce_fsync = true`): every step that applied a
//!   batch syncs the log before its replies, and on a group of three the
//!   primary then records its applied point in the superblock (one record
//!   per drive step, two slot files each synced) before the replies go out
//!   (`src/flush.rs`). Backups sync their log per applied step too.
//!
//! One client, one request in flight: 1 KiB messages in client batches of
//! `DURABILITY_BENCH_BATCH_MESSAGES` (default 100, ~100 KiB per op), about
//! `DURABILITY_BENCH_MIB` MiB in all (default 4), then every replica
//! converges and flushes with a sync (the final flush is timed and
//! counted, so a run's one-off costs are in the per-op figures: small next
//! to persisted's per-op ones, visible next to replicated's). Replicas run
//! in process, each on `RealFs` in its own directory with a real
//! `FileSuperblock`, driven over an `InMemoryNetwork` without faults by
//! the `Cluster` loop of `tests/harness` (deliver due frames, tick every
//! replica, take the primary's replies), all on one compio thread: the
//! three replicas' work, fsyncs included, is serialised, as it would not
//! be on three machines. Every replica's filesystem and superblock are
//! wrapped in `storage::fs::CountingFs`, the superblock's separately, so
//! its syncs are told from the log's.
//!
//! First the paired rounds (replicated and persisted back to back, order
//! alternating, `support::PAIRS` pairs per replica count): the median
//! persisted/replicated throughput ratio, then per mode the group's
//! fsyncs per produced op (log files, directories, superblock slots),
//! superblock record writes per op, and bytes written (by every replica,
//! log, index and superblock) per byte produced. Then the criterion
//! functions (`durability/replicas={1,3}/{replicated,persisted}`).
//!
//! `DURABILITY_BENCH_REPLICAS` (default `1,3`) picks the group sizes and
//! their order.
//!
//! Measured on this shared machine (defaults: 40 ops of 104 KiB; medians
//! of 7 pairs; 11 runs over ten minutes). The disk's fsync latency is
//! bimodal, and the ratio follows it: about 0.1 ms per added fsync while
//! the neighbour's build is quiet, 2.5–5 ms while it writes (ext4 commits
//! its journal, and the neighbour's dirty data, on an fdatasync that grew
//! a file).
//! - one replica: persisted/replicated throughput **0.43–0.53** quiet,
//!   **0.05–0.09** contended; replicated 0.10 fsyncs/op and 0.025
//!   superblock writes/op (all of it the final flush), persisted 2.10
//!   fsyncs/op (2 per op: the segment and its index, `SegmentedLog::sync`
//!   syncs both) and the same 0.025 superblock writes/op (a single replica
//!   records no applied point per step); 1.0003 bytes written per byte
//!   produced in both modes.
//! - three replicas: **0.36–0.42** quiet, **0.044–0.060** contended (one
//!   run caught between the two: 0.16);
//!   replicated 0.30 fsyncs/op, 0.075 superblock writes/op (the final
//!   flushes), 3.0008 bytes/byte; persisted 8.25 fsyncs/op (6.15 log and
//!   index: 2 per replica per op; 2.10 superblock: the primary's record
//!   per op, 2 slot syncs each), 1.05 superblock writes/op, 3.0027
//!   bytes/byte.
//! - with 10 KiB ops (`DURABILITY_BENCH_MIB=1
//!   DURABILITY_BENCH_BATCH_MESSAGES=10`, 96 ops), contended: 0.028–0.041
//!   and 0.024–0.027, the same fsyncs per op (2.04 and 8.10).
//!
//! Napkin: the persisted time minus the replicated one, over the fsyncs
//! it added, is the disk's sync latency of the moment (a Python loop of
//! 104 KiB appends with an fdatasync each: 0.2 ms at one moment, 6.4 ms
//! at another), so persisted produce's extra time is fsync latency, as far
//! as these figures tell: per op it adds 2 syncs on one replica, and on
//! three 4 on the primary (log, index, two superblock slots) plus 2 per
//! backup, which this single thread and disk run in series with the
//! primary's (three machines would take at most part of the backups' onto
//! the primary's path). Bytes written are the bytes handed to `write_at`;
//! the device writes at least a 4 KiB page per synced superblock slot,
//! about 8 KiB per persisted op on the primary (≈ +8 % of a 104 KiB op),
//! which the 1.0027 does not show.
#![allow(clippy::unwrap_used, missing_docs)]

use common::{GroupId, ReplicaId};
use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::simnet::NetworkFaults;
use consensus::vsr::{Config, ReplyStatus, RequestOutcome};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use journal::{FileSuperblock, SuperblockError, SuperblockStore, VsrState};
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, Partition, PartitionConfig,
};
use storage::BatchBuilder;
use storage::fs::{CountingFs, FsCounts, RealFs};

mod support;
use support::*;

const MESSAGE_BYTES: usize = 1_024;
const CLIENT: u128 = 1;
/// Virtual microseconds per step (the harness's tick).
const TICK_US: u64 = 10_000;
/// Steps one request may take before the run is declared stuck.
const STEPS_PER_REQUEST_MAX: u64 = 1_000;

type CountedFs = CountingFs<RealFs>;
type Replica = Partition<InMemoryBus, CountingStore<FileSuperblock<CountedFs>>, CountedFs>;

/// A superblock store that counts its record writes (each one is two slot
/// writes and two syncs in a [`FileSuperblock`]).
struct CountingStore<S> {
    inner: S,
    writes: Rc<Cell<u64>>,
}

impl<S: SuperblockStore> SuperblockStore for CountingStore<S> {
    async fn read_latest(&mut self) -> Result<Option<VsrState>, SuperblockError> {
        self.inner.read_latest().await
    }

    async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        self.inner.write(state).await?;
        self.writes.set(self.writes.get() + 1);
        Ok(())
    }
}

/// What a run cost the disks of the whole group.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    /// Log, index and directory work of every replica.
    log: FsCounts,
    /// The superblock files of every replica.
    superblock: FsCounts,
    /// Superblock records written by every replica.
    superblock_records: u64,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    elapsed: Duration,
    cost: Cost,
}

fn messages_per_batch() -> u32 {
    env_usize("DURABILITY_BENCH_BATCH_MESSAGES", 100) as u32
}

/// The group sizes to run, in order (`DURABILITY_BENCH_REPLICAS`, e.g.
/// `3,1`; default `1,3`).
fn replica_counts() -> Vec<u8> {
    std::env::var("DURABILITY_BENCH_REPLICAS")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().parse().unwrap()).collect())
        .unwrap_or_else(|| vec![1, 3])
}

fn total_bytes() -> usize {
    env_usize("DURABILITY_BENCH_MIB", 4) * 1024 * 1024
}

/// Client batches (unstamped) of about `total_bytes()` in all.
fn client_batches() -> Vec<Vec<u8>> {
    let mut template = BatchBuilder::new(1);
    let payload = vec![0x5Au8; MESSAGE_BYTES];
    for i in 0..messages_per_batch() {
        template.push(u128::from(i) + 1, i, &payload, b"");
    }
    let one = template.build();
    let count = total_bytes().div_ceil(one.len());
    vec![one; count]
}

fn config(replica: u8, replicas: u8, enforce_fsync: bool) -> PartitionConfig {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(replica), replicas, GroupId(1)));
    c.partition_id = 1;
    c.enforce_fsync = enforce_fsync;
    // The runs are small; a 1 GiB reservation per replica would measure
    // the allocator (and this machine's disk is nearly full).
    c.log.preallocate = false;
    c
}

/// A group of replicas on the real filesystem, one directory each.
struct Group {
    net: InMemoryNetwork,
    replicas: Vec<Replica>,
    log_fs: Vec<CountedFs>,
    superblock_fs: Vec<CountedFs>,
    superblock_records: Vec<Rc<Cell<u64>>>,
    now: u64,
    session: u64,
    next_request: u64,
}

impl Group {
    async fn open(dir: &Path, n: u8, enforce_fsync: bool) -> Self {
        let net = InMemoryNetwork::new(1, n, NetworkFaults::default());
        let mut g = Self {
            net,
            replicas: Vec::new(),
            log_fs: Vec::new(),
            superblock_fs: Vec::new(),
            superblock_records: Vec::new(),
            now: 0,
            session: 0,
            next_request: 1,
        };
        for r in 0..n {
            let pdir = dir.join(format!("r{r}"));
            let (log_fs, sb_fs) = (CountingFs::new(RealFs), CountingFs::new(RealFs));
            let writes = Rc::new(Cell::new(0));
            let store = CountingStore {
                inner: FileSuperblock::new(sb_fs.clone(), &pdir),
                writes: Rc::clone(&writes),
            };
            let p = Partition::open(
                config(r, n, enforce_fsync),
                log_fs.clone(),
                &pdir,
                g.net.endpoint(ReplicaId(r)),
                store,
            )
            .await
            .unwrap();
            g.replicas.push(p);
            g.log_fs.push(log_fs);
            g.superblock_fs.push(sb_fs);
            g.superblock_records.push(writes);
        }
        g.session = g.request(0, ClientOp::Register).await;
        g
    }

    fn primary(&self) -> usize {
        let r = self.replicas[0].replica();
        r.primary_index(r.view()).index()
    }

    /// Delivers the frames due now, then ticks every replica.
    async fn step(&mut self) {
        self.now += 1;
        for (to, frame) in self.net.tick() {
            self.replicas[usize::from(to)]
                .on_frame(frame)
                .await
                .unwrap();
        }
        for r in &mut self.replicas {
            r.on_tick(self.now * TICK_US).await.unwrap();
        }
    }

    /// Submits one request to the primary and steps until its reply;
    /// returns the reply's session.
    async fn request(&mut self, request: u64, op: ClientOp) -> u64 {
        let primary = self.primary();
        let out = self.replicas[primary]
            .submit(
                ClientRequest {
                    client: CLIENT,
                    session: self.session,
                    request,
                    user_id: 1,
                    op,
                },
                self.now * TICK_US,
            )
            .await
            .unwrap();
        assert!(matches!(out, RequestOutcome::Prepared { .. }), "{out:?}");
        for _ in 0..STEPS_PER_REQUEST_MAX {
            let replies = self.net.take_replies(ReplicaId(primary as u8));
            if let Some(reply) = replies.iter().find(|r| r.request == request) {
                assert_eq!(reply.status, ReplyStatus::Ok);
                return reply.session;
            }
            self.step().await;
        }
        panic!("request {request} got no reply");
    }

    async fn produce(&mut self, batch: Vec<u8>) {
        let request = self.next_request;
        self.next_request += 1;
        self.request(request, ClientOp::Append(batch)).await;
    }

    /// Steps until every replica applied what the primary committed, then
    /// flushes every replica with a sync.
    async fn settle(&mut self) {
        let target = self.replicas[self.primary()].replica().commit_max().0;
        let mut steps = 0;
        while self
            .replicas
            .iter()
            .any(|r| r.replica().commit_min().0 < target)
        {
            steps += 1;
            assert!(steps < STEPS_PER_REQUEST_MAX, "backups never caught up");
            self.step().await;
        }
        for r in &mut self.replicas {
            r.flush_committed_messages().await.unwrap();
        }
    }

    fn cost(&self) -> Cost {
        let mut c = Cost::default();
        let add = |to: &mut FsCounts, from: FsCounts| {
            to.sync_data_calls += from.sync_data_calls;
            to.sync_all_calls += from.sync_all_calls;
            to.sync_dir_calls += from.sync_dir_calls;
            to.write_calls += from.write_calls;
            to.written_bytes += from.written_bytes;
        };
        for fs in &self.log_fs {
            add(&mut c.log, fs.counts());
        }
        for fs in &self.superblock_fs {
            add(&mut c.superblock, fs.counts());
        }
        c.superblock_records = self.superblock_records.iter().map(|w| w.get()).sum();
        c
    }
}

impl Cost {
    fn since(&self, earlier: &Cost) -> Cost {
        Cost {
            log: self.log.since(&earlier.log),
            superblock: self.superblock.since(&earlier.superblock),
            superblock_records: self.superblock_records - earlier.superblock_records,
        }
    }
}

/// Opens a fresh group in `dir` (not timed, not counted), produces every
/// batch and settles; removes the directory afterwards.
async fn produce_run(dir: &Path, replicas: u8, persisted: bool, batches: &[Vec<u8>]) -> Run {
    let mut g = Group::open(dir, replicas, persisted).await;
    let owned: Vec<Vec<u8>> = batches.to_vec();
    let before = g.cost();
    let start = Instant::now();
    for b in owned {
        g.produce(b).await;
    }
    g.settle().await;
    let elapsed = start.elapsed();
    let cost = g.cost().since(&before);
    let frontier = batches.len() as u64 * u64::from(messages_per_batch());
    assert!(g.replicas.iter().all(|r| r.offset_frontier().0 == frontier));
    drop(g);
    std::fs::remove_dir_all(dir).unwrap();
    Run { elapsed, cost }
}

fn median<T: Copy>(mut v: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    v.sort_by(|a, b| key(a).total_cmp(&key(b)));
    v[v.len() / 2]
}

fn print_cost(mode: &str, run: &Run, ops: u64, produced_bytes: u64) {
    let c = &run.cost;
    let per_op = |n: u64| n as f64 / ops as f64;
    let written = c.log.written_bytes + c.superblock.written_bytes;
    eprintln!(
        "  {mode:<10} {:>8.2} ms  fsyncs/op {:>6.3} (log {:.3}, dir {:.3}, superblock {:.3})  \
         superblock writes/op {:.3}  bytes written/byte produced {:.4}",
        run.elapsed.as_secs_f64() * 1e3,
        per_op(c.log.syncs() + c.superblock.syncs()),
        per_op(c.log.file_syncs()),
        per_op(c.log.sync_dir_calls + c.superblock.sync_dir_calls),
        per_op(c.superblock.file_syncs()),
        per_op(c.superblock_records),
        written as f64 / produced_bytes as f64,
    );
}

/// Paired rounds for `replicas`: the median persisted/replicated
/// throughput ratio, then each mode's median run and its costs.
fn paired_costs(replicas: u8, mut run: impl FnMut(bool) -> Run, ops: u64, produced_bytes: u64) {
    let mut ratios = Vec::with_capacity(PAIRS);
    let (mut replicated, mut persisted) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let (r, p) = if i % 2 == 0 {
            let r = run(false);
            (r, run(true))
        } else {
            let p = run(true);
            (run(false), p)
        };
        ratios.push(r.elapsed.as_secs_f64() / p.elapsed.as_secs_f64());
        replicated.push(r);
        persisted.push(p);
    }
    let ratio = median(ratios, |r| *r);
    let by_time = |r: &Run| r.elapsed.as_secs_f64();
    let (r, p) = (median(replicated, by_time), median(persisted, by_time));
    let added_syncs = (p.cost.log.syncs() + p.cost.superblock.syncs())
        .saturating_sub(r.cost.log.syncs() + r.cost.superblock.syncs());
    let added = p.elapsed.saturating_sub(r.elapsed);
    eprintln!(
        "paired durability/replicas={replicas}: persisted/replicated throughput {ratio:.3} \
         (medians of {PAIRS}; {ops} ops of {} KiB; {:.3} ms per added fsync)",
        produced_bytes / ops / 1024,
        added.as_secs_f64() * 1e3 / added_syncs.max(1) as f64,
    );
    print_cost("replicated", &r, ops, produced_bytes);
    print_cost("persisted", &p, ops, produced_bytes);
}

fn bench_durability(c: &mut Criterion) {
    let rt = compio::runtime::Runtime::new().unwrap();
    let batches = client_batches();
    let ops = batches.len() as u64;
    let bytes: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let scratch = bench_dir();
    let mut g = c.benchmark_group("durability");
    g.throughput(Throughput::Bytes(bytes));
    // A persisted run of three replicas takes about a second: flat
    // sampling keeps criterion to ten of them instead of fifty-five.
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    for replicas in replica_counts() {
        let run = |persisted: bool| {
            let dir = scratch.path().join("g");
            rt.block_on(produce_run(&dir, replicas, persisted, &batches))
        };
        paired_costs(replicas, run, ops, bytes);
        for (persisted, mode) in [(false, "replicated"), (true, "persisted")] {
            g.bench_function(format!("replicas={replicas}/{mode}"), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| run(persisted).elapsed).sum())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_durability);
criterion_main!(benches);
