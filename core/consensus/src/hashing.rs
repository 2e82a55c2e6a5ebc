//! Artifact checksums: xxh3-64 with seed 0 and the default secret, the one
//! hash every replog integrity stamp uses.
//!
//! [`StateArtifactHasher`] is the streaming form. Its `finish` borrows, so a
//! server hashing a multi-GiB segment in slices between reactor yields can
//! keep the partial state as a memo, read the checksum of the prefix hashed
//! so far, and later extend it when the active segment grows.
//!
//! [`push_trailer`] and [`split_verified_trailer`] close an encoding with
//! the checksum of everything before it: the manifest, the transfer
//! artifacts and several disk records end that way.

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// One-shot xxh3-64 (seed 0) of `bytes`.
pub fn state_artifact_checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// Length of the xxh3-64 trailer that closes a checksummed encoding.
pub const TRAILER_LEN: usize = 8;

/// Splits the trailing little-endian xxh3-64 off `bytes`, checks it against
/// every byte before it, and returns that content.
///
/// The two failures are distinct: `Err(None)` means the input is shorter
/// than the trailer itself (codecs report it as truncated), and
/// `Err(Some((expected, actual)))` means the stored trailer `expected`
/// differs from the checksum `actual` of the content.
pub fn split_verified_trailer(bytes: &[u8]) -> Result<&[u8], Option<(u64, u64)>> {
    let Some((content, trailer)) = bytes.split_last_chunk::<TRAILER_LEN>() else {
        return Err(None);
    };
    let expected = u64::from_le_bytes(*trailer);
    let actual = state_artifact_checksum(content);
    if expected != actual {
        return Err(Some((expected, actual)));
    }
    Ok(content)
}

/// Appends the xxh3-64 trailer over everything already in `out`.
pub fn push_trailer(out: &mut Vec<u8>) {
    let checksum = state_artifact_checksum(out);
    out.extend_from_slice(&checksum.to_le_bytes());
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
    fn given_valid_trailer_when_split_should_return_content() {
        let mut bytes = b"manifest body".to_vec();
        push_trailer(&mut bytes);
        assert_eq!(split_verified_trailer(&bytes), Ok(&b"manifest body"[..]));
    }

    #[test]
    fn given_empty_content_with_trailer_when_split_should_return_empty() {
        let mut bytes = Vec::new();
        push_trailer(&mut bytes);
        assert_eq!(split_verified_trailer(&bytes), Ok(&[][..]));
    }

    #[test]
    fn given_fewer_than_eight_bytes_when_split_should_report_too_short() {
        for len in 0..TRAILER_LEN {
            let bytes = vec![0u8; len];
            assert_eq!(split_verified_trailer(&bytes), Err(None));
        }
    }

    #[test]
    fn given_any_flipped_bit_when_split_should_report_mismatch() {
        let mut bytes = b"abc".to_vec();
        push_trailer(&mut bytes);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let stored = u64::from_le_bytes(flipped[3..].try_into().expect("8 bytes"));
            let actual = state_artifact_checksum(&flipped[..3]);
            assert_eq!(
                split_verified_trailer(&flipped),
                Err(Some((stored, actual)))
            );
        }
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
