//! State transfer end to end (SPEC §11: "serve → spill → install of a
//! multi-GiB partition ≥ 70% of the sequential read+write speed of the disk
//! measured in the same run; receiver memory bounded by a few chunks") on
//! the real filesystem, between two in-process partitions.
//!
//! - **transfer**: a fresh `OfferServer` over the source partition (no
//!   memo: the offer build hashes every segment), a fresh
//!   `TransferReceiver` over an empty receiving partition, the whole
//!   exchange driven in-process (descriptor, every chunk served, walked,
//!   hashed and spilled to staging files with their syncs, indexes rebuilt),
//!   then the install into the receiving partition. The pull runs the
//!   serving and the receiving end as two concurrent futures on the one
//!   runtime thread, joined by two queues, with a window of
//!   `TRANSFER_BENCH_WINDOW` chunk requests in flight (default 32; 1 is
//!   the lockstep pull).
//! - **baseline**: the same segment files read in 4 MiB reads, hashed with
//!   xxh3-64 and written to another directory, one fsync per file, then
//!   one directory fsync.
//!
//! The source's pages are dropped (`POSIX_FADV_DONTNEED`) before every
//! pass, so both read from the disk. Paired rounds (order alternating)
//! print the median per-pair ratio (baseline time / transfer time; goal
//! ≥ 0.7) and the receiver's peak buffer (`ReceiverStats::peak_held_bytes`)
//! and the process's peak RSS. `TRANSFER_BENCH_MIB` sets the partition size
//! (default 128 MiB, in 64 MiB segments), `TRANSFER_BENCH_PAIRS` the
//! number of pairs (default 5), `TRANSFER_BENCH_SYNC_MIB` the receiver's
//! staging sync interval (default the receiver's, 8 MiB),
//! `TRANSFER_BENCH_CHUNK_KIB` the chunk size on both ends (default 256 KiB).
//! Each pair prints
//! the transfer's phases (offer build and accept, pull, install):
//!
//! ```text
//! TRANSFER_BENCH_MIB=2048 cargo bench -p partitions --bench transfer
//! ```
#![allow(clippy::unwrap_used, missing_docs)]

use common::{GroupId, Op, ReplicaId};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use consensus::header::StateTransferTargetHeader;
use consensus::vsr::Config;
use futures::StreamExt;
use futures::channel::mpsc;
use partitions::state_transfer::{
    BuildBudget, ChunkAnswer, ChunkRequest, InstallInput, LocalFacts, MonotonicClock, OfferServer,
    OfferServerConfig, PartitionTransferUnavailable, ReceiveStep, ReceiverConfig, ReceiverStats,
    TransferReceiver, TransferRequest,
};
use partitions::{InMemoryNetwork, PartitionConfig};
use storage::BatchBuilder;
use storage::fs::{Fs, FsFile, OpenOptions, RealFs};

mod support;
use support::*;

const MESSAGES_PER_BATCH: u32 = 1_000;
const MESSAGE_BYTES: usize = 1_024;
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const READ_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
/// Chunk requests in flight unless `TRANSFER_BENCH_WINDOW` says otherwise.
const WINDOW_DEFAULT: u32 = 32;
/// The receiver's replica index.
const ME: u8 = 1;

fn partition_config() -> PartitionConfig {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(1)));
    c.partition_id = 1;
    c.log.segment_size_bytes = SEGMENT_BYTES;
    c
}

async fn open(dir: &Path) -> (BenchPartition, InMemoryNetwork) {
    open_partition(dir, partition_config()).await
}

/// A one-replica partition holding about `bytes` in 64 MiB segments.
async fn populated(dir: &Path, bytes: usize) -> BenchPartition {
    let (mut p, net) = open(dir).await;
    let session = register(&mut p, &net).await;
    let mut template = BatchBuilder::new(1);
    for i in 0..MESSAGES_PER_BATCH {
        let payload = vec![(i % 251) as u8; MESSAGE_BYTES];
        template.push(u128::from(i) + 1, i, &payload, b"");
    }
    let one = template.build();
    append_copies(&mut p, session, &one, bytes.div_ceil(one.len())).await;
    p
}

/// The baseline: every file read in 4 MiB reads, hashed, written to `out`
/// at the same offsets, fsynced; then `out` fsynced.
async fn copy_and_hash(files: &[(PathBuf, u64)], out: &Path) -> u64 {
    let mut sum = 0u64;
    let mut buf = Vec::new();
    for (path, len) in files {
        let src = RealFs.open(path, OpenOptions::read_only()).await.unwrap();
        let dst = RealFs
            .open(
                &out.join(path.file_name().unwrap()),
                OpenOptions::create_read_write().truncate(true),
            )
            .await
            .unwrap();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut pos = 0;
        while pos < *len {
            let want = READ_CHUNK_BYTES.min(len - pos) as usize;
            buf = src.read_exact_into(buf, want, pos).await.unwrap();
            hasher.update(&buf);
            let compio::BufResult(res, back) = dst.write_all_at(buf, pos).await;
            res.unwrap();
            buf = back;
            pos += want as u64;
        }
        dst.sync_all().await.unwrap();
        sum = sum.wrapping_add(hasher.digest());
    }
    RealFs.sync_dir(out).await.unwrap();
    sum
}

/// Phases of one transfer.
#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    /// Offer build (gate, plan, checksum pass, manifest) and accept.
    build: Duration,
    /// Every chunk served, walked, hashed and spilled.
    pull: Duration,
    /// The install.
    install: Duration,
}

/// The whole transfer from `source` into a fresh receiving partition at
/// `rx_dir`: offer build, serve, receive and spill, install. Returns the
/// time it took, its phases, the receiver's counters and the installed
/// commit op.
async fn transfer(
    source: &mut BenchPartition,
    rx_dir: &Path,
) -> (Duration, Phases, ReceiverStats, u64) {
    let (mut receiver, _net) = open(rx_dir).await;
    let facts = LocalFacts {
        replica: ReplicaId(ME),
        replica_count: 2,
        view: 0,
        primary: ReplicaId(0),
        commit_max: Op(0),
        purge_generation: 0,
    };
    let clock = MonotonicClock::new();
    let start = Instant::now();
    let chunk = std::env::var("TRANSFER_BENCH_CHUNK_KIB")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .map(|kib| kib * 1024);
    let mut server_config = OfferServerConfig {
        budget: BuildBudget::bytes(u64::MAX),
        ..OfferServerConfig::default()
    };
    if let Some(chunk) = chunk {
        server_config.chunk_len_max_bytes = chunk;
    }
    let mut server = OfferServer::new(server_config);
    let mut config = ReceiverConfig::default();
    if let Some(mib) = std::env::var("TRANSFER_BENCH_SYNC_MIB")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        config.spill.sync_interval_bytes = mib << 20;
    }
    if let Some(chunk) = chunk {
        config.chunk_len_max_bytes = chunk;
    }
    config.chunks_in_flight = chunks_in_flight();
    let mut rx = TransferReceiver::new(RealFs, rx_dir, config, 1);
    let mut phases = Phases::default();
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
        panic!("arm asks for a descriptor");
    };
    let offer = loop {
        match server
            .on_request_state_transfer(source, ReplicaId(ME), nonce, &clock)
            .await
        {
            Ok(offer) => break offer,
            Err(PartitionTransferUnavailable::OfferBuildInProgress { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    };
    let header = StateTransferTargetHeader {
        nonce,
        commit_op: offer.commit_op(),
        group: GroupId(0),
        available: true,
        unavailable_transient: false,
        commit_max: Op(source.replica().commit_max().0),
    };
    let body = offer.encoded_manifest().to_vec();
    let mut step = rx.on_target(0, 0, &header, &body, &facts).await;
    while matches!(step, ReceiveStep::Wait) {
        step = rx.on_tick(&facts).await;
    }
    phases.build = start.elapsed();
    let ReceiveStep::Send(first) = step else {
        panic!("no chunk asked for: {step:?}");
    };
    // The two ends run concurrently, as two replicas would: the server
    // answers requests in order while the receiver writes and syncs, up to
    // the receiver's window of requests in flight.
    let (requests, mut inbox) = mpsc::unbounded::<TransferRequest>();
    let (chunks, mut arrivals) = mpsc::unbounded();
    requests.unbounded_send(first).unwrap();
    for more in rx.fill_window() {
        requests.unbounded_send(more).unwrap();
    }
    let serve = async {
        while let Some(request) = inbox.next().await {
            let TransferRequest::Chunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } = request
            else {
                panic!("unexpected {request:?}");
            };
            let answer = server
                .on_request_state_chunk(
                    &RealFs,
                    ChunkRequest {
                        requester: ReplicaId(ME),
                        nonce,
                        artifact,
                        offset,
                        len,
                    },
                )
                .await;
            let ChunkAnswer::Chunk(chunk) = answer else {
                panic!("source did not serve: {answer:?}");
            };
            if chunks.unbounded_send((nonce, chunk)).is_err() {
                break;
            }
        }
    };
    let receive = async {
        let requests = requests;
        loop {
            let (nonce, chunk) = arrivals.next().await.unwrap();
            let step = rx
                .on_chunk(
                    0,
                    nonce,
                    chunk.artifact,
                    chunk.offset,
                    chunk.payload,
                    &facts,
                )
                .await;
            match step {
                ReceiveStep::Send(next) => requests.unbounded_send(next).unwrap(),
                ReceiveStep::Wait => {}
                ReceiveStep::Complete(done) => break done,
                other => panic!("transfer did not complete: {other:?}"),
            }
            for more in rx.fill_window() {
                requests.unbounded_send(more).unwrap();
            }
        }
    };
    let ((), done) = futures::join!(serve, receive);
    phases.pull = start.elapsed() - phases.build;
    let input = InstallInput::from_received(&done, source.replica().commit_min_checksum());
    let out = receiver.install_partition_state(input).await.unwrap();
    rx.record_install_completed();
    let elapsed = start.elapsed();
    phases.install = elapsed - phases.build - phases.pull;
    (elapsed, phases, rx.stats(), out.applied_commit_op.0)
}

/// The receiver's window (`TRANSFER_BENCH_WINDOW`, default
/// [`WINDOW_DEFAULT`] chunk requests in flight).
fn chunks_in_flight() -> u32 {
    std::env::var("TRANSFER_BENCH_WINDOW")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(WINDOW_DEFAULT)
        .max(1)
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let bytes = env_usize("TRANSFER_BENCH_MIB", 128) * 1024 * 1024;
    let pairs = env_usize("TRANSFER_BENCH_PAIRS", 5).max(1);
    let rt = compio::runtime::Runtime::new().unwrap();
    let scratch = bench_dir();
    let dir = scratch.path().join("source");
    let mut source = rt.block_on(populated(&dir, bytes));
    let files: Vec<(PathBuf, u64)> = source
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
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    eprintln!(
        "transfer bench: {} segments, {total} bytes, {pairs} pairs",
        files.len()
    );
    let (mut ratios, mut bases, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let mut peak_held = 0u64;
    let mut phases = Phases::default();
    for round in 0..pairs {
        let mut run = |ours: bool| -> Duration {
            for (path, _) in &files {
                drop_cache(path);
            }
            let out = tempfile::tempdir_in(scratch.path()).unwrap();
            if ours {
                let (elapsed, phased, stats, applied) =
                    rt.block_on(transfer(&mut source, &out.path().join("p")));
                phases = phased;
                assert_eq!(applied, source.replica().commit_min().0);
                assert!(stats.chunk_bytes >= total, "{stats:?}");
                peak_held = peak_held.max(stats.peak_held_bytes);
                elapsed
            } else {
                let start = Instant::now();
                std::hint::black_box(rt.block_on(copy_and_hash(&files, out.path())));
                start.elapsed()
            }
        };
        let (base, our) = if round % 2 == 0 {
            let b = run(false);
            (b, run(true))
        } else {
            let o = run(true);
            (run(false), o)
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "pair {round}: baseline {:.0} ms, transfer {:.0} ms (build {:.0}, pull {:.0}, \
             install {:.0}), ratio {:.3}",
            ms(base),
            ms(our),
            ms(phases.build),
            ms(phases.pull),
            ms(phases.install),
            base.as_secs_f64() / our.as_secs_f64()
        );
        ratios.push(base.as_secs_f64() / our.as_secs_f64());
        bases.push(base);
        ours.push(our);
    }
    ratios.sort_by(f64::total_cmp);
    bases.sort();
    ours.sort();
    let mid = pairs / 2;
    let gbps = |d: Duration| total as f64 / d.as_secs_f64() / 1e9;
    eprintln!(
        "paired transfer vs read+xxh3+write+fsync: ratio {:.3} (baseline {:.0} ms = {:.2} GB/s, \
         transfer {:.0} ms = {:.2} GB/s, medians of {pairs}); receiver peak buffer {peak_held} \
         bytes; process peak RSS {} KiB",
        ratios[mid],
        bases[mid].as_secs_f64() * 1e3,
        gbps(bases[mid]),
        ours[mid].as_secs_f64() * 1e3,
        gbps(ours[mid]),
        peak_rss_kib().unwrap_or(0),
    );
}
