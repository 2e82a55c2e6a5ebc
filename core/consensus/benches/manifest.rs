//! Manifest encode and decode at the 65,536-entry ceiling.

use common::Offset;
use consensus::{ArtifactKind, StateArtifact};
use consensus::{STATE_MANIFEST_ENTRIES_MAX, decode_manifest, encode_manifest};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn manifest(c: &mut Criterion) {
    let entries: Vec<StateArtifact> = (0..STATE_MANIFEST_ENTRIES_MAX as u64)
        .map(|i| StateArtifact {
            kind: ArtifactKind::SegmentLog {
                base_offset: Offset(i << 20),
            },
            len: 1 << 30,
            checksum: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        })
        .collect();
    let encoded = encode_manifest(&entries);
    let mut group = c.benchmark_group("manifest");
    group.throughput(Throughput::Elements(entries.len() as u64));
    group.bench_function("encode_65536", |b| {
        b.iter(|| encode_manifest(black_box(&entries)))
    });
    group.bench_function("decode_65536", |b| {
        b.iter(|| decode_manifest(black_box(&encoded)))
    });
    group.finish();
}

criterion_group!(benches, manifest);
criterion_main!(benches);
