//! Streaming artifact hashing against one-shot xxh3-64 over the same bytes.
//!
//! The offer builder hashes multi-GiB segments in slices between reactor
//! yields; this measures what the slicing costs. Goal: streaming throughput
//! ≥ 0.9 × one-shot. `scripts/bench_ratios.py hashing` prints the ratio.

use consensus::{StateArtifactHasher, state_artifact_checksum};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const TOTAL_BYTES: usize = 64 * 1024 * 1024;
const UPDATE_BYTES: usize = 4 * 1024 * 1024;

fn hashing(c: &mut Criterion) {
    let bytes: Vec<u8> = (0..TOTAL_BYTES)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7])
        .collect();
    let mut group = c.benchmark_group("hashing");
    group.throughput(Throughput::Bytes(TOTAL_BYTES as u64));
    group.sample_size(20);
    group.bench_function("one_shot_xxh3_64MiB", |b| {
        b.iter(|| state_artifact_checksum(black_box(&bytes)))
    });
    group.bench_function("streaming_4MiB_updates_64MiB", |b| {
        b.iter(|| {
            let mut hasher = StateArtifactHasher::new();
            for slice in black_box(&bytes).chunks(UPDATE_BYTES) {
                hasher.update(slice);
            }
            hasher.finish()
        })
    });
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
