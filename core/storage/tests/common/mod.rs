//! Helpers shared by the integration tests: a seeded generator, batch
//! builders, and a full read-back of a log.
#![allow(dead_code, clippy::unwrap_used)]

use storage::fs::Fs;
use storage::{BatchBuilder, SegmentedLog};

/// SplitMix64, so every test input follows from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A stamped batch of `count` messages with `payload_len`-byte payloads.
pub fn batch(base_offset: u64, base_timestamp: u64, count: u32, payload_len: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(base_timestamp.saturating_sub(5));
    for i in 0..count {
        let payload: Vec<u8> = (0..payload_len)
            .map(|j| (base_offset as usize + i as usize + j) as u8)
            .collect();
        b.push(
            u128::from(base_offset) + u128::from(i) + 1,
            i,
            &payload,
            b"h",
        );
    }
    b.build_stamped(1, base_offset, base_timestamp).unwrap()
}

/// Reads every batch of the log back, segment by segment, sequentially by
/// position; returns the batches' bytes in order.
pub async fn read_all<F: Fs>(log: &SegmentedLog<F>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let metas: Vec<_> = log.segments().copied().collect();
    for meta in metas {
        let mut pos = 0;
        while pos < meta.size_bytes {
            let read = log
                .read_at(meta.start_offset, pos, 64 * 1024)
                .await
                .unwrap();
            assert!(
                !read.is_empty(),
                "read at {pos} of segment {} returned nothing",
                meta.start_offset
            );
            for b in read.batches() {
                out.push(b.bytes().to_vec());
            }
            pos = read.next_position;
        }
    }
    out
}
