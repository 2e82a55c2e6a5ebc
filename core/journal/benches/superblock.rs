//! Superblock write latency against its floor, measured in the same run:
//! one 4 KiB append followed by one fdatasync on a plain file.
//!
//! A superblock write rewrites both copies in place, each followed by an
//! fdatasync (two syncs; no directory sync after the first write), so the
//! expected ratio to the floor is about 2×.
//! `scripts/bench_ratios.py superblock append_4KiB_fdatasync` prints it.

use common::Offset;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use journal::{FileSuperblock, SuperblockStore, VsrState};
use storage::fs::{Fs, FsFile, OpenOptions, RealFs};

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    compio::runtime::Runtime::new()
        .expect("io_uring runtime")
        .block_on(f)
}

fn superblock(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("superblock");
    group.sample_size(50);

    group.bench_function("append_4KiB_fdatasync", |b| {
        b.iter_custom(|iters| {
            run(async {
                let path = dir.path().join("floor");
                let file = RealFs
                    .open(&path, OpenOptions::create_read_write().truncate(true))
                    .await
                    .expect("open");
                let block = vec![0xA5u8; 4096];
                let start = Instant::now();
                for i in 0..iters {
                    let storage::fs::BufResult(res, _) =
                        file.write_all_at(block.clone(), i * 4096).await;
                    res.expect("write");
                    file.sync_data().await.expect("sync");
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("write_both_copies", |b| {
        b.iter_custom(|iters| {
            run(async {
                let mut sb = FileSuperblock::new(RealFs, dir.path());
                sb.read_latest().await.expect("read");
                // The first write creates the files; keep it out of the
                // measurement.
                sb.write(&VsrState::default()).await.expect("first write");
                let mut elapsed = Duration::ZERO;
                for i in 0..iters {
                    let state = VsrState {
                        view: i as u32,
                        log_view: i as u32,
                        offset_frontier: Offset(i),
                        ..VsrState::default()
                    };
                    let start = Instant::now();
                    sb.write(&state).await.expect("write");
                    elapsed += start.elapsed();
                }
                elapsed
            })
        })
    });
    group.finish();
}

criterion_group!(benches, superblock);
criterion_main!(benches);
