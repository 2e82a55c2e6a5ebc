//! Seeds that once failed the cluster simulation, each named for the bug
//! it found. Each replays the configuration it failed with
//! (`SimConfig::for_seed_v1` for the first sweep).
#![allow(clippy::unwrap_used)]

use vsr_harness::{SimConfig, run_config};

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

/// Seeds of the current mix (`SimConfig::for_seed`) that ended "no
/// convergence after healing" in the sweep of 10,000,000..10,100,000:
/// every replica Normal at the same op, a client never
/// answered. In each a primary had installed a state transfer at its own
/// head without the op's identity (the offer carries none) and refused
/// every request as `Unavailable`, because every proposal chains to that
/// identity and nothing could tell it: backups learn it from the
/// primary's heartbeat, and the primary's log held nothing above the op.
/// Two fixes: the install keeps the identity the primary's own log named
/// (`set_commit_floor`), and a primary that still cannot learn it starts a
/// view change once a backup's election timeout passed (seed 10087433:
/// its peers knew the identity only from a heartbeat, without the header,
/// so not even the merge could name it).
const NO_CONVERGENCE_SEEDS: [u64; 18] = [
    10_002_976, 10_004_839, 10_009_684, 10_023_746, 10_024_589, 10_037_276, 10_042_640, 10_043_066,
    10_046_872, 10_051_880, 10_053_693, 10_056_665, 10_065_475, 10_072_865, 10_087_433, 10_089_354,
    10_091_155, 10_098_571,
];

#[test]
fn seeds_of_the_10m_sweep_primary_with_unknown_applied_identity_converges() {
    for seed in NO_CONVERGENCE_SEEDS {
        if let Err(failure) = run_config(SimConfig::for_seed(seed)) {
            panic!("{failure}");
        }
    }
}

/// The primary of seed 10024589 installed at its head while its own log
/// held the op's header: it keeps its view (learned from its log) instead
/// of needing a view change to learn the identity from a peer.
#[test]
fn seed_10024589_primary_keeps_the_identity_its_log_names_across_an_install() {
    let report = run_config(SimConfig::for_seed(10_024_589)).unwrap();
    assert!(report.transfers > 0);
    assert_eq!(
        report.view_max, 1,
        "the primary had to step down to learn its own applied identity"
    );
}

/// Seed 10087433: nobody holds the header of the primary's applied op,
/// only its identity; without stepping down the primary waits forever.
#[test]
fn seed_10087433_primary_that_cannot_learn_its_applied_identity_steps_down() {
    let report = run_config(SimConfig::for_seed(10_087_433)).unwrap();
    assert!(report.view_max > 2, "{report:?}");
}

/// Found by the cluster simulator (replog-sim seed 1000005, partition
/// profile, five replicas): a new primary whose DVC quorum had not heard
/// of the last commit started its view with `commit_max` one below an op
/// the old primary had committed and acknowledged, called itself caught
/// up, and served a read of the state before that op. A caught-up primary
/// must have applied every op any replica ever knew committed (they are
/// all in the log it started its view with).
#[test]
fn caught_up_primary_has_applied_everything_ever_committed() {
    let mut exercised = 0;
    for seed in 0..60 {
        let config = SimConfig::for_seed(seed);
        let n = config.replica_count;
        let mut s = vsr_harness::Simulation::new(config);
        let mut committed_max = 0;
        let mut stale = None;
        let done = s
            .run_until(3_000, |s| {
                for r in 0..n {
                    if let Some(v) = s.replica(r) {
                        committed_max = committed_max.max(v.commit_max().0);
                    }
                }
                // A primary cut off in an older view may still believe it
                // leads; only the newest view's primary speaks for the group.
                let view_max = (0..n).filter_map(|r| s.replica(r)).map(|v| v.view()).max();
                for r in 0..n {
                    if let Some(v) = s.replica(r)
                        && v.is_caught_up_primary()
                        && Some(v.view()) == view_max
                    {
                        if v.view() > 0 {
                            exercised += 1;
                        }
                        if v.commit_min().0 < committed_max {
                            stale = Some((r, v.view(), v.commit_min().0, committed_max));
                            return true;
                        }
                    }
                }
                false
            })
            .unwrap();
        assert!(
            !done,
            "seed {seed}: (replica, view, applied, committed) {stale:?}: a caught-up primary behind a committed op"
        );
    }
    assert!(exercised > 0, "no seed reached a view change");
}

/// Seed 1007353 (five replicas, two crashed): a member in a view change
/// counted a report whose sender had since adopted a view (its repair
/// request reached the member, its votes did not), judged its vote
/// useless and started waiting in place, leaving two voters of five, no
/// primary to answer the waiting ones and no census. A repair request now
/// voids its sender's report (docs/consensus.md §4).
#[test]
fn seed_1007353_member_keeps_its_vote_when_a_reporter_asked_for_repair() {
    if let Err(failure) = run_config(SimConfig::for_seed(1_007_353)) {
        panic!("{failure}");
    }
}

/// Seed 2016646 (five replicas): replica 0 reported to replica 4 while it
/// waited in view 0, then adopted view 0 from that view's primary and
/// talked to it alone. Replica 4, in a view change of view 4, counted the
/// old report next to two fresh ones, started waiting in place and left
/// two voters of five for good: the primary of view 0 ignores a probe of
/// view 4. A member now counts only reports of its own view or a later
/// one, and a waiting replica raises its view to a member's
/// StartViewChange and answers it with its report (docs/consensus.md §4).
#[test]
fn seed_2016646_member_counts_only_reports_of_its_view() {
    if let Err(failure) = run_config(SimConfig::for_seed(2_016_646)) {
        panic!("{failure}");
    }
}

/// Seed 2013461 (five replicas): a member that started waiting in place
/// lowered `commit_max` to its applied op (19 to 18), as a restarted
/// replica does, and the harness checked it as if the life went on. A
/// restart in place now begins a new life for that check (within a life
/// it never goes back). The member had also counted a report of view 0
/// whose sender then adopted view 10; that report no longer counts.
#[test]
fn seed_2013461_restart_in_place_begins_a_new_life() {
    if let Err(failure) = run_config(SimConfig::for_seed(2_013_461)) {
        panic!("{failure}");
    }
}

/// Seed 4002255 (three replicas): the primary of view 1 crashed with op 11
/// of that view held by nobody else; the other member of view 1 held ops
/// 12 and 13 but not 11, and the third replica (log view 0) held view 0's
/// different op 11. The merge saw a blank and an abstention and waited for
/// a vote that a recovering replica never gives, cycling views. The header
/// above a canonical blank names it through its parent, so a lower log
/// view's different op there is a nack (docs/consensus.md §3).
#[test]
fn seed_4002255_the_op_above_names_a_canonical_blank() {
    if let Err(failure) = run_config(SimConfig::for_seed(4_002_255)) {
        panic!("{failure}");
    }
}

/// Seed 4091500 (three replicas): the same shape as 4002255 at op 32.
#[test]
fn seed_4091500_the_op_above_names_a_canonical_blank() {
    if let Err(failure) = run_config(SimConfig::for_seed(4_091_500)) {
        panic!("{failure}");
    }
}

/// Seed 3025597 (five replicas, two waiting): the only voter of the
/// highest log view had its log cut at op 32 by a state transfer and
/// offered a blank there; two voters of log view 0 held the same op 32.
/// Whichever op the canonical log had, those two and the canonical nack
/// prove any other one never committed, so the merge keeps theirs.
#[test]
fn seed_3025597_lower_log_views_agreeing_with_a_nack_quorum_keep_their_op() {
    if let Err(failure) = run_config(SimConfig::for_seed(3_025_597)) {
        panic!("{failure}");
    }
}
