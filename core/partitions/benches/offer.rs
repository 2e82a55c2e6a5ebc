//! The state-transfer offer build (SPEC §11: "the offer's checksum pass ≥
//! 90% of sequential read speed from disk") on the real filesystem, against
//! baselines over the same segment files taken in the same run:
//!
//! - `cold`: pages of every segment file dropped (`POSIX_FADV_DONTNEED`)
//!   before each pass; the baseline is a raw sequential read of the files in
//!   4 MiB reads, the build a full offer from a fresh builder (no memo):
//!   gate, flush (nothing to flush), plan, one unbounded checksum round,
//!   re-validation, offsets artifact, manifest. Goal: ≥ 0.9.
//! - `hot`: page cache warm; the baseline reads the files and runs xxh3-64
//!   over every byte (the least any checksum pass can do), so the ratio is
//!   the overhead of the offer path itself. Goal: ≥ 0.9.
//!
//! Paired rounds (order alternating) print the median per-pair ratio
//! (baseline time / offer time; 1.0 = as fast as the baseline).
//! `OFFER_BENCH_MIB` sets the data size (default 32 MiB, in 8 MiB
//! segments); `OFFER_BENCH_PAIRED_ONLY=1` skips the criterion functions.
//!
//! Measured on this shared 2-core machine: 32 MiB cold 0.96–1.0, hot
//! 0.97–0.98; 128 MiB cold 0.90, hot 0.93. Cold, the build reads and then
//! hashes each 4 MiB chunk in turn while the baseline only reads, so the
//! gap is the hashing the kernel's readahead does not hide. (A hand-rolled
//! compio read loop measured about 1 GB/s hot here, slower than the same
//! reads through `RealFs`, for reasons not chased; the baseline uses the
//! `RealFs` reads so both sides issue identical I/O.)
#![allow(clippy::unwrap_used, missing_docs)]

use common::{GroupId, ReplicaId};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use consensus::vsr::Config;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use partitions::PartitionConfig;
use partitions::state_transfer::{BuildBudget, MonotonicClock, OfferBuilder};
use storage::BatchBuilder;
use storage::fs::{Fs, FsFile, OpenOptions, RealFs};

mod support;
use support::*;

const MESSAGES_PER_BATCH: u32 = 1_000;
const MESSAGE_BYTES: usize = 1_024;
const SEGMENT_BYTES: u64 = 8 * 1024 * 1024;
const READ_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

fn paired_only() -> bool {
    std::env::var_os("OFFER_BENCH_PAIRED_ONLY").is_some()
}

fn total_bytes() -> usize {
    std::env::var("OFFER_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(32)
        * 1024
        * 1024
}

/// A one-replica partition holding about `total_bytes()` in 8 MiB segments.
async fn populated(dir: &Path) -> BenchPartition {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(1)));
    c.partition_id = 1;
    c.log.segment_size_bytes = SEGMENT_BYTES;
    let (mut p, net) = open_partition(dir, c).await;
    let session = register(&mut p, &net).await;
    let mut template = BatchBuilder::new(1);
    let payload = vec![0x5Au8; MESSAGE_BYTES];
    for i in 0..MESSAGES_PER_BATCH {
        template.push(u128::from(i) + 1, i, &payload, b"");
    }
    let one = template.build();
    append_copies(&mut p, session, &one, total_bytes().div_ceil(one.len())).await;
    p
}

/// Reads every file sequentially in 4 MiB positional reads into one reused
/// buffer through [`RealFs`] (compio, the same read the offer path issues,
/// with no partition code around it), hashing every read when `hash` is
/// set.
async fn raw_pass(files: &[(PathBuf, u64)], hash: bool) -> u64 {
    let mut sum = 0u64;
    let mut buf = Vec::new();
    for (path, len) in files {
        let file = RealFs.open(path, OpenOptions::read_only()).await.unwrap();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut pos = 0;
        while pos < *len {
            let want = READ_CHUNK_BYTES.min(len - pos) as usize;
            buf = file.read_exact_into(buf, want, pos).await.unwrap();
            if hash {
                hasher.update(&buf);
            }
            pos += want as u64;
        }
        sum = sum.wrapping_add(hasher.digest());
    }
    sum
}

fn bench_offer(c: &mut Criterion) {
    let rt = compio::runtime::Runtime::new().unwrap();
    let scratch = bench_dir();
    let dir = scratch.path().join("p");
    let mut p = rt.block_on(populated(&dir));
    let files: Vec<(PathBuf, u64)> = p
        .log()
        .segments()
        .filter(|s| !s.is_empty())
        .map(|s| {
            (
                dir.join(storage::log_file_name(s.start_offset)),
                s.size_bytes,
            )
        })
        .collect();
    let bytes: u64 = files.iter().map(|(_, len)| len).sum();
    eprintln!("offer bench: {} segments, {bytes} bytes", files.len());
    let clock = MonotonicClock::new();
    let mut g = c.benchmark_group("offer_build");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    for cold in [true, false] {
        let label = if cold { "cold" } else { "hot" };
        let mut run = |ours: bool| {
            if cold {
                for (path, _) in &files {
                    drop_cache(path);
                }
            }
            rt.block_on(async {
                let start = Instant::now();
                if ours {
                    let mut builder = OfferBuilder::new(BuildBudget::bytes(u64::MAX));
                    let offer = p
                        .build_state_transfer_offer(&mut builder, &clock)
                        .await
                        .unwrap();
                    std::hint::black_box(offer.total_len_bytes());
                } else {
                    std::hint::black_box(raw_pass(&files, !cold).await);
                }
                start.elapsed()
            })
        };
        let baseline = if cold { "raw_read" } else { "raw_read_xxh3" };
        paired(
            &format!("offer_build/{label} vs {baseline}"),
            "offer",
            &mut run,
        );
        if paired_only() {
            continue;
        }
        g.bench_function(format!("{baseline}_{label}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| run(false)).sum())
        });
        g.bench_function(format!("offer_build_{label}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| run(true)).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, bench_offer);
criterion_main!(benches);
