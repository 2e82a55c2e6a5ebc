//! Seeds that once failed the cluster simulation, each named for the bug
//! it found. Each replays the configuration it failed with
//! (`SimConfig::for_seed_v1` for the first sweep).
#![allow(clippy::unwrap_used)]

use consensus::vsr::harness::{SimConfig, run_config};

fn must_pass(seed: u64) {
    if let Err(failure) = run_config(SimConfig::for_seed_v1(seed)) {
        panic!("{failure}");
    }
}

/// A new primary behind the repair floor installed a transfer whose
/// `set_sequence`/`clear_pipeline` dropped its own uncommitted op, so it
/// could neither apply nor repair it (the anchor went with the journal).
#[test]
fn seed_839_primary_installing_transfer_keeps_its_log() {
    must_pass(839);
}

/// Same family as 839, with a five-replica cluster and crashes.
#[test]
fn seed_249_transferring_primary_converges() {
    must_pass(249);
}

/// Both surviving backups missed the same prepare; without explicit nacks
/// above the contiguous frontier the merge waited forever for the crashed
/// primary's vote.
#[test]
fn seed_2164_ops_above_every_frontier_are_nacked_and_truncated() {
    must_pass(2164);
}

/// The merge took the committed op's anchor header from a lower-log_view
/// voter holding a stale op there, broke the hash chain and deadlocked.
#[test]
fn seed_3266_merge_anchor_comes_from_canonical_voter() {
    must_pass(3266);
}

/// The harness refused to serve a transfer whose source had applied
/// exactly up to the floor, so a lagging primary retried forever.
#[test]
fn seed_4181_transfer_source_at_the_floor_is_served() {
    must_pass(4181);
}
