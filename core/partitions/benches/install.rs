//! How long a state-transfer install holds its shard
//! (docs/state-transfer.md §8.7), on the real filesystem.
//!
//! A one-replica source partition holds `INSTALL_BENCH_SEGMENTS` (default
//! 2,000) one-batch segments. Each round copies its segment files into a
//! fresh receiver's directory as staged pairs (as the receive side leaves
//! them, synced), then installs them twice over, on two fresh receivers,
//! in an order that alternates per round:
//!
//! - **one call**: `begin_install`, then `advance_install(usize::MAX)`:
//!   the whole swap and load in one call, the longest the shard's other
//!   groups would wait if the install were not stepped;
//! - **stepped**: `begin_install`, then `advance_install` with the
//!   driver's budget (`INSTALL_FILE_OPS_PER_STEP`) until it ends, each
//!   call timed: the longest is what a tick of the shard can be delayed by.
//!
//! It prints per round the start (`begin_install`), the one-call swap, the
//! stepped install's longest and median step and its total, and the
//! medians over the rounds: the ratio of the one-call stall to the longest
//! step, and the longest step against the default 10 ms tick.
//!
//! ```text
//! cargo bench -p partitions --bench install
//! INSTALL_BENCH_SEGMENTS=10000 INSTALL_BENCH_ROUNDS=3 cargo bench -p partitions --bench install
//! ```
#![allow(clippy::unwrap_used, missing_docs)]

use common::{GroupId, Offset, Op, ReplicaId};
use std::path::Path;
use std::task::Poll;
use std::time::{Duration, Instant};

use consensus::vsr::Config;
use partitions::state_transfer::{
    ConsumerOffsetsWire, INSTALL_FILE_OPS_PER_STEP, InstallInput, StagedSegment,
};
use partitions::{InMemoryNetwork, PartitionConfig};
use storage::BatchBuilder;

mod support;
use support::*;

/// The shard's default tick.
const TICK: Duration = Duration::from_millis(10);

fn partition_config(segment_size: u64) -> PartitionConfig {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(1)));
    c.partition_id = 1;
    c.log.segment_size_bytes = segment_size;
    c
}

async fn open(dir: &Path, segment_size: u64) -> (BenchPartition, InMemoryNetwork) {
    open_partition(dir, partition_config(segment_size)).await
}

/// A source partition of `segments` segments, one 10-message batch each.
async fn source(dir: &Path, segments: usize) -> BenchPartition {
    let (mut p, net) = open(dir, 1).await;
    let session = register(&mut p, &net).await;
    let mut template = BatchBuilder::new(1);
    for i in 0..10u32 {
        template.push(u128::from(i) + 1, i, &[i as u8; 100], b"");
    }
    let one = template.build();
    append_copies(&mut p, session, &one, segments).await;
    p
}

/// Copies the source's sealed segments into `dir` as staged pairs,
/// synced, and returns the install input.
fn stage(src: &BenchPartition, dir: &Path) -> InstallInput {
    std::fs::create_dir_all(dir).unwrap();
    let mut staged = Vec::new();
    for s in src.log().segments().filter(|s| s.size_bytes > 0) {
        let seg = StagedSegment {
            start_offset: Offset(s.start_offset),
            end_offset: Offset(s.next_offset - 1),
            size_bytes: s.size_bytes,
            start_timestamp: s.start_timestamp,
            end_timestamp: s.end_timestamp,
            max_timestamp: s.end_timestamp,
        };
        let (log, index) = seg.staging_paths(dir);
        for (from, to) in [
            (src.dir().join(storage::log_file_name(s.start_offset)), log),
            (
                src.dir().join(storage::index_file_name(s.start_offset)),
                index,
            ),
        ] {
            std::fs::copy(&from, &to).unwrap();
            std::fs::File::open(&to).unwrap().sync_all().unwrap();
        }
        staged.push(seg);
    }
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    let next_offset = src.log().next_offset();
    InstallInput {
        commit_op: Op(src.replica().commit_min().0),
        commit_checksum: src.replica().commit_min_checksum(),
        staged,
        offsets_artifact: ConsumerOffsetsWire {
            purge_generation: 0,
            next_offset: Offset(next_offset),
            consumers: vec![(1, Offset(next_offset - 1))],
            groups: vec![],
            dedup: vec![],
        }
        .encode(),
    }
}

struct Timing {
    begin: Duration,
    steps: Vec<Duration>,
}

/// Installs the staged chain into `p` with `budget` file operations per
/// call; times the start and every call.
async fn install(mut p: BenchPartition, input: InstallInput, budget: usize) -> Timing {
    let start = Instant::now();
    p.begin_install(input).await.unwrap();
    let begin = start.elapsed();
    let mut steps = Vec::new();
    loop {
        let t = Instant::now();
        let progress = p.advance_install(budget).await;
        steps.push(t.elapsed());
        if let Poll::Ready(result) = progress {
            result.unwrap();
            return Timing { begin, steps };
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let segments = env_usize("INSTALL_BENCH_SEGMENTS", 2_000);
    let rounds = env_usize("INSTALL_BENCH_ROUNDS", 5).max(1);
    let rt = compio::runtime::Runtime::new().unwrap();
    let scratch = bench_dir();
    let made = Instant::now();
    let src = rt.block_on(source(&scratch.path().join("src"), segments));
    let chain = src.log().segments().filter(|s| s.size_bytes > 0).count();
    eprintln!(
        "source: {chain} segments in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let (mut ratios, mut tick_shares, mut one_calls, mut longest) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let run = |stepped: bool, name: &str| {
            let dir = scratch.path().join(format!("rx-{round}-{name}"));
            // Opened first: a boot sweeps staging files.
            let (p, _net) = rt.block_on(open(&dir, 1 << 30));
            let input = stage(&src, &dir);
            let budget = if stepped {
                INSTALL_FILE_OPS_PER_STEP
            } else {
                usize::MAX
            };
            let timing = rt.block_on(install(p, input, budget));
            std::fs::remove_dir_all(&dir).unwrap();
            timing
        };
        let (one, stepped) = if round % 2 == 0 {
            let one = run(false, "one");
            (one, run(true, "stepped"))
        } else {
            let stepped = run(true, "stepped");
            (run(false, "one"), stepped)
        };
        let one_call = ms(one.steps.iter().copied().max().unwrap());
        let max_step = ms(stepped.steps.iter().copied().max().unwrap());
        let longest_at = stepped
            .steps
            .iter()
            .enumerate()
            .max_by_key(|(_, d)| **d)
            .map_or(0, |(i, _)| i);
        let step_median = median(stepped.steps.iter().copied().map(ms).collect());
        let total: Duration = stepped.steps.iter().sum();
        eprintln!(
            "round {round}: begin {:.2} / {:.2} ms; one call {one_call:.1} ms; stepped: {} steps of {INSTALL_FILE_OPS_PER_STEP} ops, longest {max_step:.2} ms (step {longest_at}), median {step_median:.2} ms, total {:.1} ms",
            ms(one.begin),
            ms(stepped.begin),
            stepped.steps.len(),
            ms(total),
        );
        ratios.push(one_call / max_step);
        tick_shares.push(max_step / ms(TICK));
        one_calls.push(one_call);
        longest.push(max_step);
    }
    eprintln!(
        "install of {chain} segments, medians of {rounds} rounds: one call {:.1} ms, longest step {:.2} ms; one call / longest step {:.1}; longest step / 10 ms tick {:.3}",
        median(one_calls),
        median(longest),
        median(ratios),
        median(tick_shares),
    );
}
