//! What the partition benchmarks share: the scratch directory, page-cache
//! eviction, environment knobs and the paired baseline/ours measurement.
#![allow(dead_code, clippy::unwrap_used)]

use common::ReplicaId;
use std::path::Path;
use std::time::Duration;

use common::simnet::NetworkFaults;
use consensus::vsr::RequestOutcome;
use journal::MemSuperblock;
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, Partition, PartitionConfig,
};
use storage::fs::RealFs;

/// Paired rounds per [`paired`] measurement.
pub const PAIRS: usize = 7;

pub type BenchPartition = Partition<InMemoryBus, MemSuperblock, RealFs>;

/// A one-replica partition on the real filesystem in `dir`, with its
/// network (replies land there).
pub async fn open_partition(
    dir: &Path,
    config: PartitionConfig,
) -> (BenchPartition, InMemoryNetwork) {
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let p = Partition::open(
        config,
        RealFs,
        dir,
        net.endpoint(ReplicaId(0)),
        MemSuperblock::new(),
    )
    .await
    .unwrap();
    (p, net)
}

/// Registers client 1 with `p` and returns its session.
pub async fn register(p: &mut BenchPartition, net: &InMemoryNetwork) -> u64 {
    let register = ClientRequest {
        client: 1,
        session: 0,
        request: 0,
        user_id: 1,
        op: ClientOp::Register,
    };
    let out = p.submit(register, 1).await.unwrap();
    assert!(matches!(out, RequestOutcome::Prepared { .. }));
    net.take_replies(ReplicaId(0)).last().unwrap().session
}

/// Appends `count` copies of `batch` as client 1's requests 1, 2, …, each
/// stamped 1 µs after the last, then flushes.
pub async fn append_copies(p: &mut BenchPartition, session: u64, batch: &[u8], count: usize) {
    for i in 0..count {
        let request = ClientRequest {
            client: 1,
            session,
            request: i as u64 + 1,
            user_id: 1,
            op: ClientOp::Append(batch.to_vec()),
        };
        p.submit(request, 1_000 + i as u64).await.unwrap();
    }
    p.flush_committed_messages().await.unwrap();
}

/// A scratch directory beside the target directory: the same disk as the
/// build, not tmpfs.
pub fn bench_dir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-scratch");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// Evicts a file's pages from the page cache (a cold read follows).
pub fn drop_cache(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
}

/// An integer from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(default)
}

/// Runs the baseline (`run(false)`) and ours (`run(true)`) [`PAIRS`] times,
/// alternating which goes first, and prints the median per-pair ratio
/// (baseline time / ours) with both medians; `ours` names our side.
pub fn paired(name: &str, ours: &str, mut run: impl FnMut(bool) -> Duration) {
    let mut ratios = Vec::with_capacity(PAIRS);
    let (mut raws, mut outs) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let (raw, out) = if i % 2 == 0 {
            let r = run(false);
            (r, run(true))
        } else {
            let o = run(true);
            (run(false), o)
        };
        ratios.push(raw.as_secs_f64() / out.as_secs_f64());
        raws.push(raw);
        outs.push(out);
    }
    ratios.sort_by(f64::total_cmp);
    raws.sort();
    outs.sort();
    eprintln!(
        "paired {name}: ratio {:.3} (baseline {:.2} ms, {ours} {:.2} ms, medians of {PAIRS})",
        ratios[PAIRS / 2],
        raws[PAIRS / 2].as_secs_f64() * 1e3,
        outs[PAIRS / 2].as_secs_f64() * 1e3,
    );
}
