//! Which shard of a replica owns a group.
//!
//! The function depends only on the group id and the shard count, never on
//! the order groups were created in or on the replica, so every replica
//! places a group on the same shard index. That is what lets the replica
//! bus run one connection per shard index: a frame for group `g` arrives
//! on the connection of the shard that owns `g` and never crosses a core.
//!
//! The metadata group lives on shard 0. A partition group goes to
//! `(xxh3_64(group id, little-endian) >> 32) % shard_count`: the high half
//! of the hash, because neighbouring group ids differ in their low bits
//! and a good hash spreads them evenly there too, but taking the high bits
//! keeps the result independent of how `%` treats small counts.
//! Changing the shard count moves groups between shards, so a replica
//! refuses to boot on a data directory laid out for another count (the
//! server checks it; see docs/architecture.md).

use common::GroupId;
use xxhash_rust::xxh3::xxh3_64;

/// A shard's index inside its replica, `0..shard_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardIndex(pub u16);

/// The shard of a replica with `shard_count` shards that owns `group`.
///
/// # Panics
/// When `shard_count` is 0 (a configuration the server refuses).
pub fn shard_of(group: GroupId, shard_count: u16) -> ShardIndex {
    assert!(shard_count > 0, "a replica runs at least one shard");
    if group.is_metadata() {
        return ShardIndex(0);
    }
    let hash = xxh3_64(&group.0.to_le_bytes()) >> 32;
    // The remainder is below shard_count, which fits in u16.
    ShardIndex((hash % u64::from(shard_count)) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::METADATA_GROUP;

    #[test]
    fn given_one_shard_when_placing_should_use_shard_zero() {
        for g in 0..1000 {
            assert_eq!(shard_of(GroupId(g), 1), ShardIndex(0));
        }
    }

    #[test]
    fn given_metadata_group_when_placing_should_use_shard_zero() {
        for count in 1..16 {
            assert_eq!(shard_of(METADATA_GROUP, count), ShardIndex(0));
        }
    }

    #[test]
    fn given_many_groups_when_placing_should_spread_them_within_ten_percent() {
        let count = 4u16;
        let mut per_shard = [0u64; 4];
        for g in 0..40_000u64 {
            let shard = shard_of(GroupId(g << 20 | 7), count);
            per_shard[usize::from(shard.0)] += 1;
        }
        for n in per_shard {
            assert!((9_000..=11_000).contains(&n), "{per_shard:?}");
        }
    }

    #[test]
    fn given_known_groups_when_placing_should_match_the_documented_function() {
        // Pinned literals: a change here moves every group of every
        // existing data directory to another shard.
        let placed: Vec<u16> = (0..8).map(|g| shard_of(GroupId(g), 4).0).collect();
        assert_eq!(placed, vec![3, 1, 0, 1, 2, 2, 2, 0]);
        let formula: Vec<u16> = (0..8u64)
            .map(|g| ((xxh3_64(&g.to_le_bytes()) >> 32) % 4) as u16)
            .collect();
        assert_eq!(placed, formula, "the documented function");
    }
}
