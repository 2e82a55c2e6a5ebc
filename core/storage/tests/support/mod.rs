//! Helpers shared by the integration tests: batch builders and a full
//! read-back of a log.
#![allow(dead_code, clippy::unwrap_used)]

use storage::fs::Fs;
use storage::{BatchBuilder, SegmentedLog};

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
