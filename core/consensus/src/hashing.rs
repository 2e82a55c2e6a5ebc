//! Artifact checksums: xxh3-64 with seed 0 and the default secret, the one
//! hash every replog integrity stamp uses.
//!
//! [`StateArtifactHasher`] is the streaming form. Its `finish` borrows, so a
//! server hashing a multi-GiB segment in slices between reactor yields can
//! keep the partial state as a memo, read the checksum of the prefix hashed
//! so far, and later extend it when the active segment grows.

use crate::state_manifest::StateArtifact;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// One-shot xxh3-64 (seed 0) of `bytes`.
pub fn state_artifact_checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// True iff `bytes` has exactly the entry's declared length and checksum.
///
/// This proves only that the bytes arrived as offered; the receiving plane
/// still validates their format before installing them.
pub fn verify_state_artifact(entry: &StateArtifact, bytes: &[u8]) -> bool {
    u64::try_from(bytes.len()).is_ok_and(|len| len == entry.len)
        && state_artifact_checksum(bytes) == entry.checksum
}

/// Streaming xxh3-64 (seed 0). Any split of the same bytes into `update`
/// calls gives the same result as [`state_artifact_checksum`].
#[derive(Clone)]
pub struct StateArtifactHasher {
    state: Xxh3,
    hashed_len_bytes: u64,
}

impl std::fmt::Debug for StateArtifactHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateArtifactHasher")
            .field("hashed_len_bytes", &self.hashed_len_bytes)
            .field("checksum", &self.finish())
            .finish()
    }
}

impl Default for StateArtifactHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl StateArtifactHasher {
    /// A hasher over no bytes yet.
    pub fn new() -> Self {
        Self {
            state: Xxh3::new(),
            hashed_len_bytes: 0,
        }
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.state.update(bytes);
        self.hashed_len_bytes += bytes.len() as u64;
    }

    /// The checksum of every byte fed so far. Does not consume the hasher,
    /// so more bytes may follow.
    pub fn finish(&self) -> u64 {
        self.state.digest()
    }

    /// How many bytes have been fed.
    pub const fn hashed_len_bytes(&self) -> u64 {
        self.hashed_len_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_manifest::artifact_kind;
    use proptest::prelude::*;

    #[test]
    fn given_empty_input_when_hashed_should_match_one_shot() {
        assert_eq!(StateArtifactHasher::new().finish(), xxh3_64(&[]));
    }

    #[test]
    fn given_partial_pass_when_finished_then_extended_should_match_one_shot() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = StateArtifactHasher::new();
        h.update(&bytes[..4_321]);
        assert_eq!(h.finish(), xxh3_64(&bytes[..4_321]));
        let memo = h.clone();
        h.update(&bytes[4_321..]);
        assert_eq!(h.finish(), xxh3_64(&bytes));
        assert_eq!(h.hashed_len_bytes(), 10_000);
        // The memo is unaffected by the extension.
        assert_eq!(memo.finish(), xxh3_64(&bytes[..4_321]));
    }

    #[test]
    fn given_artifact_when_verified_should_check_length_and_checksum() {
        let bytes = b"segment bytes".to_vec();
        let entry = StateArtifact::for_bytes(artifact_kind::SEGMENT_LOG, 7, &bytes);
        assert!(verify_state_artifact(&entry, &bytes));
        assert!(!verify_state_artifact(&entry, &bytes[..bytes.len() - 1]));
        let mut flipped = bytes.clone();
        flipped[0] ^= 1;
        assert!(!verify_state_artifact(&entry, &flipped));
        let longer = StateArtifact {
            len: entry.len + 1,
            ..entry
        };
        assert!(!verify_state_artifact(&longer, &bytes));
    }

    proptest! {
        #[test]
        fn given_any_split_when_streamed_should_equal_one_shot(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut h = StateArtifactHasher::new();
            let mut start = 0;
            for p in points {
                h.update(&bytes[start..p]);
                start = p;
            }
            h.update(&bytes[start..]);
            prop_assert_eq!(h.finish(), state_artifact_checksum(&bytes));
            prop_assert_eq!(h.hashed_len_bytes(), bytes.len() as u64);
        }
    }
}
