//! Metadata WAL appends per second, one sync per append against group
//! commit (one write and one sync per 16 appends), on the real filesystem.
//! Prepares carry a 512-byte body. Criterion reports elements (appends)
//! per second; `scripts/bench_ratios.py wal append_sync_each` prints the
//! speed-up of group commit.

use std::time::{Duration, Instant};

use common::{GroupId, Op};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use journal::MetadataWal;
use journal::build_prepare;
use storage::fs::RealFs;

const GROUP: u64 = 16;
const APPENDS: u64 = 256;

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    compio::runtime::Runtime::new()
        .expect("io_uring runtime")
        .block_on(f)
}

/// A chain of `n` prepares from op 1.
fn chain(n: u64) -> Vec<Vec<u8>> {
    let body = vec![0x3Cu8; 512];
    let mut parent = 0u128;
    (1..=n)
        .map(|op| {
            let f = build_prepare(Op(op), parent, GroupId(0), &body);
            parent = u128::from_le_bytes(f[..16].try_into().expect("16 bytes"));
            f
        })
        .collect()
}

fn wal(c: &mut Criterion) {
    let frames = chain(APPENDS);
    let mut group = c.benchmark_group("wal");
    group.throughput(Throughput::Elements(APPENDS));
    group.sample_size(10);
    for grouped in [false, true] {
        let name = if grouped {
            "append_group_commit_16"
        } else {
            "append_sync_each"
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().expect("tempdir");
                    elapsed += run(async {
                        let (mut wal, _) =
                            MetadataWal::open(&RealFs, &dir.path().join("wal"), 1024)
                                .await
                                .expect("open");
                        let start = Instant::now();
                        if grouped {
                            for batch in frames.chunks(GROUP as usize) {
                                wal.append_batch(batch.to_vec()).await.expect("append");
                            }
                        } else {
                            for f in &frames {
                                wal.append(f.clone()).await.expect("append");
                            }
                        }
                        start.elapsed()
                    });
                }
                elapsed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, wal);
criterion_main!(benches);
