//! Shards of three replicas hosting many partition groups, in process:
//! produce to all of them, crash and restart a replica, group lifecycle.
#![allow(clippy::unwrap_used)]

mod harness;

use common::Op;
use common::simnet::NetworkFaults;
use common::{ConsumerKind, GroupId, Offset, ReplicaId};
use futures::executor::block_on;
use harness::{Cluster, batch};
use partitions::{PollRequest, PollingStrategy};
use shard::{Answer, Call, CallError, ProducerKey};
use storage::fs::{CrashMode, Fs};

const GROUPS: u64 = 64;

fn group(n: u64) -> GroupId {
    GroupId::partition(
        common::StreamId(1),
        common::TopicId(1),
        common::PartitionId(n as u32),
    )
    .unwrap()
}

fn faults() -> NetworkFaults {
    NetworkFaults {
        drop_per_mille: 20,
        duplicate_per_mille: 20,
        delay_ticks_max: 3,
    }
}

fn produce_all(c: &mut Cluster, round: u64) {
    // Every group gets a batch in flight at once, then the cluster runs
    // until all are answered (following NotPrimary, retrying transient).
    let mut pending = Vec::new();
    for n in 0..GROUPS {
        let g = group(n);
        let primary = c.primary(g).unwrap_or(ReplicaId(0));
        pending.push(c.send(primary, g, Call::produce(batch(round * 1000 + n, 5))));
    }
    let mut retry = Vec::new();
    for _ in 0..400 {
        pending.retain_mut(|p| match p.rx.try_recv() {
            Ok(Some(Ok(Answer::Committed { .. }))) => false,
            Ok(Some(Ok(other))) => panic!("unexpected answer {other:?}"),
            Ok(Some(Err(_))) | Err(_) => {
                retry.push(p.group);
                false
            }
            Ok(None) => true,
        });
        if pending.is_empty() {
            break;
        }
        c.step();
    }
    assert!(
        pending.is_empty(),
        "{} produces never answered",
        pending.len()
    );
    for g in retry {
        let answer = c
            .call_until_done(g, Call::produce(batch(round * 1000 + g.0 % 1000, 5)), 3000)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }));
    }
}

fn poll_all(c: &mut Cluster, r: u8, g: GroupId) -> Vec<(u64, Vec<u8>)> {
    let request = PollRequest {
        consumer: (ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::Offset(0),
        count: 100_000,
        auto_commit: false,
    };
    let node = c.node(r, g);
    let polled = block_on(node.partition(g).unwrap().poll(&request)).unwrap();
    polled
        .messages()
        .map(|m| (m.offset, m.payload.to_vec()))
        .collect()
}

fn assert_converged(c: &mut Cluster, expected_messages: usize) {
    c.flush_all();
    for n in 0..GROUPS {
        let g = group(n);
        let reference = poll_all(c, 0, g);
        assert!(
            reference.len() >= expected_messages,
            "group {n}: {} messages, expected at least {expected_messages}",
            reference.len()
        );
        let files = c.segment_files(0, g);
        for r in 1..c.replicas {
            assert_eq!(poll_all(c, r, g), reference, "group {n} replica {r} polls");
            assert_eq!(c.segment_files(r, g), files, "group {n} replica {r} files");
        }
    }
}

fn settle(c: &mut Cluster) {
    c.net.set_faults(NetworkFaults::default());
    // Long enough for commits to reach every backup and journals to flush.
    c.run(300);
}

#[test]
fn given_three_replicas_of_two_shards_when_producing_to_64_groups_should_agree_byte_for_byte() {
    let mut c = Cluster::new(3, 2, 7, faults());
    for n in 0..GROUPS {
        c.create_everywhere(group(n));
    }
    c.run(100);
    for round in 0..3 {
        produce_all(&mut c, round);
    }
    settle(&mut c);
    assert_converged(&mut c, 15);
    // Both shards of every replica host groups, and no frame crossed to
    // the wrong shard.
    for r in 0..3 {
        for s in 0..2 {
            let node = c.nodes[r][s].as_ref().unwrap();
            assert!(node.groups().count() > 10, "replica {r} shard {s}");
            let stats = node.stats();
            assert_eq!(stats.frames_refused.get("wrong_shard"), None);
            assert_eq!(stats.frames_refused.get("unknown_group"), None);
        }
    }
}

#[test]
fn given_replica_crashed_losing_unsynced_data_when_restarted_should_catch_up_by_repair() {
    let mut c = Cluster::new(3, 2, 11, faults());
    for n in 0..GROUPS {
        c.create_everywhere(group(n));
    }
    c.run(100);
    produce_all(&mut c, 0);
    c.crash(2, CrashMode::DropAll);
    produce_all(&mut c, 1);
    c.restart(2);
    for s in 0..2 {
        let node = c.nodes[2][s].as_ref().unwrap();
        assert!(node.groups().count() > 10, "every group boots from disk");
    }
    produce_all(&mut c, 2);
    settle(&mut c);
    assert_converged(&mut c, 15);
    for r in 0..3u8 {
        for s in 0..2 {
            let installs = c.nodes[usize::from(r)][s]
                .as_ref()
                .unwrap()
                .stats()
                .installs;
            assert_eq!(installs, 0, "caught up by repair, not by transfer");
        }
    }
}

/// One replica is down while 8 of the 16 groups of its single shard run
/// past their peers' retention (64 prepares). When it comes back those 8
/// catch up by state transfer — never more pulls at once than the shard's
/// receive cap — while the 8 others, repaired from their peers' journals,
/// keep committing: every produce to them during the catch-up commits
/// within a bounded number of ticks. Every group ends byte-identical.
#[test]
fn given_a_replica_down_while_8_groups_pass_retention_when_restarted_should_transfer_them_within_the_cap_while_the_others_commit()
 {
    use partitions::state_transfer::RECEIVING_TRANSFERS_MAX_DEFAULT;
    let mut c = Cluster::new(3, 1, 17, NetworkFaults::default());
    let groups: Vec<GroupId> = (0..16).map(group).collect();
    for g in &groups {
        c.create_everywhere(*g);
    }
    c.run(100);
    for (i, g) in groups.iter().enumerate() {
        c.call_until_done(*g, Call::produce(batch(1_000 + i as u64, 3)), 2000)
            .unwrap();
    }
    let victim = 2u8;
    c.crash(victim, CrashMode::KeepAll);
    let (behind, quiet) = groups.split_at(8);
    for round in 0..80u64 {
        for (i, g) in behind.iter().enumerate() {
            c.call_until_done(
                *g,
                Call::produce(batch(10_000 + round * 100 + i as u64, 2)),
                2000,
            )
            .unwrap();
        }
    }
    // What the others had committed when it came back.
    let targets: Vec<u64> = groups
        .iter()
        .map(|g| {
            (0..2usize)
                .filter_map(|r| c.nodes[r][0].as_ref()?.partition(*g))
                .map(|p| p.replica().commit_min().0)
                .max()
                .unwrap()
        })
        .collect();
    c.restart(victim);
    let mut receiving_peak = 0;
    let mut slowest_commit = 0;
    let mut caught_up = false;
    for round in 0..400u64 {
        // One produce to a quiet group per round, timed in ticks.
        let g = quiet[(round % 8) as usize];
        let sent = c.ticks();
        c.call_until_done(g, Call::produce(batch(50_000 + round, 1)), 2000)
            .unwrap();
        slowest_commit = slowest_commit.max(c.ticks() - sent);
        let node = c.nodes[usize::from(victim)][0].as_ref().unwrap();
        receiving_peak = receiving_peak.max(node.slots().receiving());
        assert!(
            node.slots().receiving() <= RECEIVING_TRANSFERS_MAX_DEFAULT,
            "{} pulls at once",
            node.slots().receiving()
        );
        let all_caught_up = groups.iter().zip(&targets).all(|(g, target)| {
            let p = node.partition(*g).unwrap();
            p.state_transfer_needed().is_none()
                && p.missing_history().is_none()
                && p.replica().is_quorum_visible()
                && p.replica().commit_min().0 >= *target
        });
        if all_caught_up && round >= 16 {
            caught_up = true;
            break;
        }
    }
    assert!(caught_up, "the restarted replica never caught up");
    let installs = c.nodes[usize::from(victim)][0]
        .as_ref()
        .unwrap()
        .stats()
        .installs;
    eprintln!(
        "{installs} installs, at most {receiving_peak} pulls at once, slowest quiet commit {slowest_commit} ticks"
    );
    assert!(
        installs >= 8,
        "only {installs} groups caught up by transfer"
    );
    assert!(receiving_peak >= 1);
    assert!(
        slowest_commit <= 300,
        "a quiet group waited {slowest_commit} ticks to commit during the transfers"
    );
    settle(&mut c);
    c.flush_all();
    for g in &groups {
        let files = c.segment_files(0, *g);
        for r in 1..3 {
            assert_eq!(c.segment_files(r, *g), files, "group {} replica {r}", g.0);
        }
    }
}

/// Shards that may keep only 8 KiB of flushed batches in memory for
/// repair, 64 busy groups: one replica is down while every group commits
/// 20 more batches (well inside `retention_ops` = 64, far past what 8 KiB
/// holds), so its peers let go of most of those bodies. On restart it
/// catches up by repair alone, the bodies its peers no longer hold read
/// back from their segments, and no shard ever held more than the budget.
#[test]
fn given_a_small_retained_budget_when_a_backup_repairs_ops_that_left_memory_should_read_them_from_segments_without_transfer()
 {
    const BUDGET: u64 = 8 * 1024;
    // A batch or two per answer: the backup's repair of a slice
    // takes several requests, the highest ops first.
    let mut c = Cluster::with_retained_bytes(3, 1, 23, NetworkFaults::default(), BUDGET, 1024);
    for n in 0..GROUPS {
        c.create_everywhere(group(n));
    }
    c.run(100);
    produce_all(&mut c, 0);
    c.crash(2, CrashMode::KeepAll);
    let mut peak_seen = 0;
    for round in 1..=20 {
        produce_all(&mut c, round);
        for r in 0..2 {
            let stats = c.nodes[r][0].as_ref().unwrap().stats();
            assert!(
                stats.retained_bytes <= BUDGET,
                "replica {r} holds {} bytes for repair",
                stats.retained_bytes
            );
            peak_seen = peak_seen.max(stats.retained_bytes_peak);
        }
    }
    c.restart(2);
    settle(&mut c);
    assert_converged(&mut c, 105);
    let mut spilled = 0;
    let mut read_back = 0;
    for r in 0..3 {
        let node = c.nodes[r][0].as_ref().unwrap();
        let stats = node.stats();
        assert!(
            stats.retained_bytes_peak <= BUDGET,
            "replica {r} held {} bytes for repair at its peak",
            stats.retained_bytes_peak
        );
        assert_eq!(stats.retained_bytes_max, BUDGET);
        assert_eq!(stats.installs, 0, "replica {r} caught up by transfer");
        spilled += stats.retained_spilled;
        read_back += node
            .snapshot(shard::SnapshotDetail::Totals)
            .totals
            .read_back_bodies;
    }
    // Each answer read at most 1 KiB: one or two batches of about 550
    // bytes (the first is read whatever its size).
    let (mut answers, mut bodies) = (0, 0);
    for r in 0..3 {
        let node = c.nodes[r][0].as_ref().unwrap();
        for n in 0..GROUPS {
            let (a, b) = node.partition(group(n)).unwrap().read_backs();
            answers += a;
            bodies += b;
        }
    }
    eprintln!(
        "peak {peak_seen} of {BUDGET} bytes; {spilled} bodies let go, {read_back} read back in {answers} answers"
    );
    assert!(
        bodies <= 4 * answers,
        "{bodies} bodies in {answers} answers"
    );
    // Idle for two handle passes (512 ticks each): every group gives what
    // it kept back to the budget, for the groups that will write.
    let held: Vec<u64> = (0..3)
        .map(|r| c.nodes[r][0].as_ref().unwrap().stats().retained_bytes)
        .collect();
    assert!(held.iter().any(|b| *b > 0), "{held:?}");
    c.run(1100);
    for r in 0..3 {
        let stats = c.nodes[r][0].as_ref().unwrap().stats();
        assert_eq!(stats.retained_bytes, 0, "replica {r} still holds bodies");
    }
    assert!(
        peak_seen > BUDGET / 2,
        "the budget was never used: {peak_seen}"
    );
    // 64 groups × 20 batches of about 320 bytes went past the budget: the
    // restarted replica's repair of most of them came from segments.
    assert!(spilled > 1_000, "{spilled} bodies let go");
    assert!(read_back > 500, "{read_back} bodies read back");
}

/// The same ceiling (0: every flushed batch let go of), and a purge while
/// a backup is down: the ops it must repair were Appends whose batches the
/// purge removed, and new batches now sit at the same offsets. Its peers
/// read back whatever is at those offsets, find it is not the op's body
/// (the header's checksum says so) and answer the ops as evicted: the
/// backup catches up by state transfer instead, and no peer ever sent it
/// a wrong body (the group converges byte for byte).
#[test]
fn given_spilled_batches_purged_and_their_offsets_reused_when_a_backup_repairs_should_transfer_never_serve_them()
 {
    let mut c = Cluster::with_retained_bytes(
        3,
        1,
        29,
        NetworkFaults::default(),
        0,
        partitions::READ_BACK_BYTES_PER_SLICE_DEFAULT,
    );
    let g = group(0);
    c.create_everywhere(g);
    c.run(100);
    let produce = |c: &mut Cluster, tag: u64| {
        let answer = c
            .call_until_done(g, Call::produce(batch(tag, 3)), 3000)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }), "{answer:?}");
    };
    // Tags of two digits throughout: every batch has the same length, so
    // a batch read back at a reused offset differs only in its bytes.
    produce(&mut c, 10);
    let victim = (0..3u8)
        .find(|r| c.primary(g) != Some(ReplicaId(*r)))
        .unwrap();
    c.crash(victim, CrashMode::KeepAll);
    for tag in 11..21 {
        produce(&mut c, tag);
    }
    let answer = c
        .call_until_done(g, Call::Purge { generation: 1 }, 3000)
        .unwrap();
    assert!(matches!(answer, Answer::Committed { .. }), "{answer:?}");
    // The same offsets again, other bytes.
    for tag in 50..62 {
        produce(&mut c, tag);
    }
    c.restart(victim);
    settle(&mut c);
    c.run(1500);
    c.flush_all();
    let reference = poll_all(&mut c, 0, g);
    assert_eq!(reference.len(), 36, "12 batches of 3 after the purge");
    let files = c.segment_files(0, g);
    for r in 1..3 {
        assert_eq!(poll_all(&mut c, r, g), reference, "replica {r} polls");
        assert_eq!(c.segment_files(r, g), files, "replica {r} files");
    }
    let spilled: u64 = (0..3)
        .map(|r| c.nodes[r][0].as_ref().unwrap().stats().retained_spilled)
        .sum();
    assert!(spilled > 0, "nothing was let go of");
    let installs = c.nodes[usize::from(victim)][0]
        .as_ref()
        .unwrap()
        .stats()
        .installs;
    eprintln!("{spilled} bodies let go; the backup installed {installs} transfer(s)");
    assert!(installs >= 1, "the purged ops were repaired from somewhere");
}

/// Every replica stopped cleanly at once (flush, then the shard's one
/// clean-stop file), rebooted: each shard takes its file (gone afterwards),
/// every group resumes as a full member, and the cluster serves again by
/// itself. Without the records nobody could answer the restart rule's
/// probes and no group would ever take a produce again.
#[test]
fn given_every_replica_stopped_cleanly_when_rebooted_should_resume_every_group_from_one_file_per_shard()
 {
    let mut c = Cluster::new(3, 2, 17, faults());
    for n in 0..GROUPS {
        c.create_everywhere(group(n));
    }
    c.run(100);
    produce_all(&mut c, 0);
    settle(&mut c);
    let mut recorded = 0;
    for r in 0..3usize {
        for s in 0..2usize {
            let node = c.nodes[r][s].as_mut().unwrap();
            block_on(node.flush_all());
            let (clean, not) = block_on(node.record_clean_stops());
            assert_eq!(
                not, 0,
                "replica {r} shard {s}: an idle group could not record"
            );
            recorded += clean;
        }
    }
    // Every partition group, and group 0 on each replica.
    assert_eq!(recorded, 3 * (GROUPS as usize + 1));
    for r in 0..3u8 {
        let fs = c.fss[usize::from(r)].clone();
        let dir = c.config(r, 0).dir;
        assert!(block_on(fs.exists(&dir.join(journal::CLEAN_STOPS_FILE))).unwrap());
        // One file per shard, none per group.
        let g = (0..GROUPS)
            .map(group)
            .find(|g| c.shard_of(*g) == 0)
            .unwrap();
        let gdir = shard::group_dir(&dir, g);
        assert!(!block_on(fs.exists(&gdir.join(journal::CLEAN_STOP_FILE))).unwrap());
        c.crash(r, CrashMode::KeepAll);
    }
    for r in 0..3u8 {
        c.restart(r);
        let fs = c.fss[usize::from(r)].clone();
        let dir = c.config(r, 0).dir;
        assert!(
            !block_on(fs.exists(&dir.join(journal::CLEAN_STOPS_FILE))).unwrap(),
            "taken at boot"
        );
    }
    for r in 0..3usize {
        for s in 0..2usize {
            let node = c.nodes[r][s].as_ref().unwrap();
            for g in node.groups() {
                let p = node.partition(g).unwrap();
                assert!(
                    p.replica().is_quorum_visible(),
                    "replica {r} group {} resumed",
                    g.0
                );
            }
        }
    }
    produce_all(&mut c, 1);
    settle(&mut c);
    assert_converged(&mut c, 10);
}

#[test]
fn given_stored_offset_when_read_back_should_answer_it_from_the_primary() {
    let mut c = Cluster::new(3, 1, 3, NetworkFaults::default());
    let g = group(5);
    c.create_everywhere(g);
    c.run(100);
    c.call_until_done(g, Call::produce(batch(1, 10)), 2000)
        .unwrap();
    c.call_until_done(
        g,
        Call::StoreOffset {
            kind: ConsumerKind::Consumer,
            id: 9,
            offset: Offset(4),
        },
        2000,
    )
    .unwrap();
    let got = c
        .call_until_done(
            g,
            Call::GetOffset {
                kind: ConsumerKind::Consumer,
                id: 9,
            },
            2000,
        )
        .unwrap();
    assert_eq!(got, Answer::Offset(Some(Offset(4))));
    // A backup names the primary instead of answering.
    let primary = c.primary(g).unwrap();
    let backup = ReplicaId((primary.0 + 1) % 3);
    let mut p = c.send(
        backup,
        g,
        Call::GetOffset {
            kind: ConsumerKind::Consumer,
            id: 9,
        },
    );
    assert_eq!(
        p.rx.try_recv().unwrap().unwrap(),
        Err(CallError::NotPrimary {
            view: c.node(backup.0, g).partition(g).unwrap().replica().view(),
            primary,
        })
    );
}

/// Steps the cluster until `pending` is answered, at most `ticks` ticks.
fn answer_within(
    c: &mut Cluster,
    pending: &mut harness::Pending,
    ticks: u64,
) -> Option<Result<Answer, CallError>> {
    for _ in 0..ticks {
        if let Ok(Some(answer)) = pending.rx.try_recv() {
            return Some(answer);
        }
        c.step();
    }
    pending.rx.try_recv().ok().flatten()
}

#[test]
fn given_a_primary_cut_off_while_the_others_move_on_when_read_from_should_never_answer_its_stale_state()
 {
    let mut c = Cluster::new(3, 1, 4, NetworkFaults::default());
    let g = group(6);
    c.create_everywhere(g);
    c.run(100);
    let consumer = |offset: u64| Call::StoreOffset {
        kind: ConsumerKind::Consumer,
        id: 9,
        offset: Offset(offset),
    };
    let read = Call::GetOffset {
        kind: ConsumerKind::Consumer,
        id: 9,
    };
    let produce = |tag| Call::produce(batch(tag, 10));
    c.call_until_done(g, produce(1), 2000).unwrap();
    c.call_until_done(g, consumer(4), 2000).unwrap();
    let old = c.primary(g).unwrap();
    // The others elect a new primary and acknowledge a batch and a store
    // the cut-off primary never hears of.
    let new = elect_without(&mut c, g, old);
    let mut p = c.send(new, g, produce(2));
    assert!(matches!(
        answer_within(&mut c, &mut p, 500),
        Some(Ok(Answer::Committed { .. }))
    ));
    let mut p = c.send(new, g, consumer(15));
    assert!(matches!(
        answer_within(&mut c, &mut p, 500),
        Some(Ok(Answer::Committed { .. }))
    ));
    assert!(
        c.node(old.0, g)
            .partition(g)
            .unwrap()
            .replica()
            .is_caught_up_primary(),
        "the cut-off primary still believes it leads"
    );
    // Its own state says offset 4 and an end of 10: a read must not be
    // answered from it, nor a store of offset 15 refused by it.
    let mut stale_read = c.send(old, g, read.clone());
    let mut store = c.send(old, g, consumer(15));
    let read_answer = answer_within(&mut c, &mut stale_read, 300);
    let store_answer = answer_within(&mut c, &mut store, 300);
    assert!(
        matches!(read_answer, Some(Err(CallError::Unavailable { .. }))),
        "a deposed primary answered a read with {read_answer:?}"
    );
    assert!(
        matches!(store_answer, Some(Err(CallError::Unavailable { .. }))),
        "a deposed primary answered a store of an acknowledged offset with {store_answer:?}"
    );
    c.net.set_isolated(old, false);
    assert_eq!(
        c.call_until_done(g, read, 3000).unwrap(),
        Answer::Offset(Some(Offset(15)))
    );
}

/// Cuts `old`, the primary of `g`, off and steps until another replica
/// leads a newer view; returns it.
fn elect_without(c: &mut Cluster, g: GroupId, old: ReplicaId) -> ReplicaId {
    let old_view = c.node(old.0, g).partition(g).unwrap().replica().view();
    c.net.set_isolated(old, true);
    for _ in 0..3000 {
        c.step();
        let new = (0..3u8).map(ReplicaId).find(|&r| {
            r != old && {
                let replica = c.node(r.0, g).partition(g).unwrap().replica();
                replica.is_caught_up_primary() && replica.view() > old_view
            }
        });
        if let Some(new) = new {
            return new;
        }
    }
    panic!("the others elected no new primary");
}

/// A produce whose primary lost its view before the op committed is
/// answered by what became of its op once the deposed primary has
/// applied it: `Committed` at its offset when the next view kept it,
/// `Unavailable` (nothing changed, send it again) when the view change
/// dropped it; never `Indeterminate` while the replica lives.
#[test]
fn given_a_primary_deposed_with_a_produce_in_flight_when_it_catches_up_should_answer_what_became_of_it()
 {
    let mut c = Cluster::new(3, 1, 5, NetworkFaults::default());
    let g = group(7);
    c.create_everywhere(g);
    c.run(100);
    let produce = |tag| Call::produce(batch(tag, 10));
    c.call_until_done(g, produce(1), 2000).unwrap();

    // Dropped: the prepare never leaves the cut-off primary, and the next
    // view gives its op to another batch.
    let old = c.primary(g).unwrap();
    c.net.set_isolated(old, true);
    let mut dropped = c.send(old, g, produce(2));
    let new = elect_without(&mut c, g, old);
    let mut p = c.send(new, g, produce(3));
    assert!(matches!(
        answer_within(&mut c, &mut p, 500),
        Some(Ok(Answer::Committed { .. }))
    ));
    c.net.set_isolated(old, false);
    let answer = answer_within(&mut c, &mut dropped, 3000);
    assert!(
        matches!(answer, Some(Err(CallError::Unavailable { .. }))),
        "a dropped produce answered {answer:?}"
    );

    // Kept: the backups hold the prepare but their acknowledgements never
    // reach the primary, which is then cut off; the next view commits it.
    let old = c.primary(g).unwrap();
    let backups: Vec<ReplicaId> = (0..3u8).map(ReplicaId).filter(|&r| r != old).collect();
    for &b in &backups {
        c.net.set_link_cut(b, old, true);
    }
    let head = c.node(old.0, g).partition(g).unwrap().replica().op();
    let mut kept = c.send(old, g, produce(4));
    for _ in 0..200 {
        c.step();
    }
    for &b in &backups {
        let op = c.node(b.0, g).partition(g).unwrap().replica().op();
        assert!(op > head, "backup {} journaled the prepare", b.0);
    }
    elect_without(&mut c, g, old);
    for &b in &backups {
        c.net.set_link_cut(b, old, false);
    }
    c.net.set_isolated(old, false);
    let answer = answer_within(&mut c, &mut kept, 3000);
    let Some(Ok(Answer::Committed {
        base_offset: Some(base),
        ..
    })) = answer
    else {
        panic!("a kept produce answered {answer:?}");
    };
    // Batch 1 (10 messages) and batch 3 before it; batch 2 is nowhere.
    assert_eq!(base, Offset(20));
    let messages = poll_all(&mut c, old.0, g);
    assert_eq!(messages.len(), 30);
}

#[test]
fn given_unknown_group_when_called_should_answer_unknown_group() {
    let mut c = Cluster::new(1, 1, 1, NetworkFaults::default());
    let mut p = c.send(ReplicaId(0), group(3), Call::Stats);
    assert_eq!(
        p.rx.try_recv().unwrap().unwrap(),
        Err(CallError::UnknownGroup { group: group(3) })
    );
}

/// A fingerprint of everything a refused frame must leave alone.
fn fingerprint(c: &Cluster, r: u8) -> Vec<(u64, u64, u64, u32, u64)> {
    let mut out = Vec::new();
    for node in c.nodes[usize::from(r)].iter().flatten() {
        for g in node.groups() {
            let p = node.partition(g).unwrap();
            out.push((
                g.0,
                p.replica().commit_min().0,
                p.replica().commit_max().0,
                p.replica().view(),
                p.offset_frontier().0,
            ));
        }
    }
    out
}

mod hostile {
    use super::*;
    use bytes::Bytes;
    use consensus::vsr::wire;
    use consensus::vsr::{Frame, Message};
    use proptest::prelude::*;

    fn valid_commit_frame(group: GroupId, from: u8) -> Vec<u8> {
        wire::encode(
            harness::CLUSTER,
            &Frame {
                group: GroupId(group.0),
                replica: ReplicaId(from),
                view: 0,
                message: Message::Commit {
                    commit: Op(0),
                    commit_checksum: 0,
                    timestamp_monotonic: 1,
                },
            },
        )
        .to_vec()
    }

    fn refused(c: &mut Cluster, from: u8, bytes: Vec<u8>) -> &'static str {
        let g = group(1);
        let before = fingerprint(c, 0);
        let node = c.node(0, g);
        let counted_before: u64 = node.stats().frames_refused.values().sum();
        let err = block_on(node.on_frame(ReplicaId(from), Bytes::from(bytes))).unwrap_err();
        let counted_after: u64 = node.stats().frames_refused.values().sum();
        assert_eq!(counted_after, counted_before + 1, "{err}");
        assert_eq!(
            fingerprint(c, 0),
            before,
            "a refused frame changed state: {err}"
        );
        err.reason()
    }

    fn cluster() -> Cluster {
        let mut c = Cluster::new(3, 1, 5, NetworkFaults::default());
        c.create_everywhere(group(1));
        c.run(60);
        c
    }

    #[test]
    fn given_a_well_formed_frame_that_changes_nothing_should_count_it_by_reason() {
        let mut c = cluster();
        let g = group(1);
        let before = fingerprint(&c, 0);
        let late = wire::encode(
            harness::CLUSTER,
            &Frame {
                group: GroupId(g.0),
                replica: ReplicaId(1),
                view: 0,
                message: Message::RepairDone {
                    nonce: 0x5eed,
                    op: Op(0),
                },
            },
        );
        let node = c.node(0, g);
        let ignored = |node: &shard::Shard<shard::testing::TestEnv>| {
            node.snapshot(shard::SnapshotDetail::Totals)
                .ignored
                .get(consensus::vsr::Ignored::NoSuchRepair)
        };
        let counted_before = ignored(node);
        let refused_before: u64 = node.stats().frames_refused.values().sum();
        block_on(node.on_frame(ReplicaId(1), late)).unwrap();
        assert_eq!(ignored(node), counted_before + 1);
        assert_eq!(
            node.stats().frames_refused.values().sum::<u64>(),
            refused_before
        );
        assert_eq!(fingerprint(&c, 0), before);
    }

    #[test]
    fn given_each_kind_of_bad_frame_when_received_should_refuse_it_typed_and_count_it() {
        let mut c = cluster();
        let good = valid_commit_frame(group(1), 1);
        // Wrong cluster.
        let other = wire::encode(
            harness::CLUSTER + 1,
            &wire::decode(
                &good,
                &wire::Expect {
                    cluster: harness::CLUSTER,
                    size_max: 1 << 20,
                    peer: None,
                },
            )
            .unwrap(),
        );
        assert_eq!(refused(&mut c, 1, other.to_vec()), "wrong_cluster");
        // A sender that is not the connection's peer.
        assert_eq!(refused(&mut c, 2, good.clone()), "wrong_sender");
        // Unknown group.
        assert_eq!(
            refused(&mut c, 1, valid_commit_frame(group(77), 1)),
            "unknown_group"
        );
        // A peer outside the cluster, and this replica itself.
        assert_eq!(refused(&mut c, 9, good.clone()), "unknown_peer");
        assert_eq!(refused(&mut c, 0, good.clone()), "unknown_peer");
        // Size past the ceiling: the size field claims 2 GiB.
        let mut huge = good.clone();
        huge[48..52].copy_from_slice(&(2u32 << 30).to_le_bytes());
        assert_eq!(refused(&mut c, 1, huge), "header");
        // Truncated body and truncated header.
        assert_eq!(refused(&mut c, 1, good[..200].to_vec()), "header");
        let mut prepare_like = good.clone();
        prepare_like.extend_from_slice(b"trailing");
        assert_eq!(refused(&mut c, 1, prepare_like), "header");
        // Every field of the header corrupted in turn (one byte at a time).
        for at in 0..256 {
            let mut bad = good.clone();
            bad[at] ^= 0x5A;
            let reason = refused(&mut c, 1, bad);
            assert!(
                [
                    "header",
                    "wrong_cluster",
                    "wrong_sender",
                    "unknown_group",
                    "wrong_shard",
                    "not_vsr"
                ]
                .contains(&reason),
                "byte {at}: {reason}"
            );
        }
        // The untouched frame is still accepted.
        let node = c.node(0, group(1));
        block_on(node.on_frame(ReplicaId(1), Bytes::from(good))).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn given_random_frames_when_received_should_never_panic_nor_change_state(
            from in 0u8..4,
            bytes in proptest::collection::vec(any::<u8>(), 0..700),
            splice in proptest::option::of((0usize..256, any::<u8>())),
        ) {
            let mut c = cluster();
            let mut bytes = bytes;
            if let Some((at, value)) = splice {
                // Start from a valid frame and corrupt it, so decoding gets
                // past the first checks too.
                bytes = valid_commit_frame(group(1), 1);
                bytes[at] = value;
            }
            let before = fingerprint(&c, 0);
            let node = c.node(0, group(1));
            let result = block_on(node.on_frame(ReplicaId(from), Bytes::from(bytes)));
            if result.is_err() {
                prop_assert_eq!(fingerprint(&c, 0), before);
            }
        }
    }
}

#[test]
fn given_one_partition_fenced_when_others_are_called_should_keep_serving_them() {
    let mut c = Cluster::new(1, 1, 2, NetworkFaults::default());
    let doomed = group(40);
    let mut spec = c.spec(doomed);
    // Flushes every commit, so the next write the filesystem sees after
    // the produce is this group's.
    spec.enforce_fsync = true;
    block_on(c.node(0, doomed).create_group(spec)).unwrap();
    for n in 0..8 {
        c.create_everywhere(group(n));
    }
    c.run(50);
    c.fss[0].fail_nth(storage::fs::FaultKind::Write, 1, storage::fs::EIO);
    let result = c.call_until_done(doomed, Call::produce(batch(1, 3)), 500);
    // The call that hit the fault reports it as local; the partition
    // fenced itself (a flush a reply waits for cannot be skipped).
    assert!(
        matches!(
            result,
            Err(CallError::Local { .. } | CallError::Fenced { .. })
        ),
        "{result:?}"
    );
    assert!(
        c.node(0, doomed)
            .partition(doomed)
            .unwrap()
            .fenced()
            .is_some()
    );
    for n in 0..8 {
        let g = group(n);
        let answer = c
            .call_until_done(g, Call::produce(batch(n, 3)), 500)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }));
        assert_eq!(poll_count(&mut c, g), 3, "group {n}");
    }
    // The fenced group keeps refusing, typed.
    let mut p = c.send(ReplicaId(0), doomed, Call::Stats);
    assert!(matches!(
        p.rx.try_recv().unwrap().unwrap(),
        Err(CallError::Fenced { .. })
    ));
}

fn poll_count(c: &mut Cluster, g: GroupId) -> u64 {
    let polled = c
        .call_until_done(
            g,
            Call::Poll(PollRequest {
                consumer: (ConsumerKind::Consumer, 1),
                strategy: PollingStrategy::Offset(0),
                count: 100,
                auto_commit: false,
            }),
            500,
        )
        .unwrap();
    let Answer::Polled(polled) = polled else {
        panic!("not a poll answer")
    };
    polled.count
}

/// A replica's descriptor limit bounds the partitions in use, not those
/// hosted: groups written once and then idle close their files within a
/// pass of the shard's handle sweep (a single replica's unsynced writes
/// are flushed first, so they also survive a power loss after it), and
/// reopen them when next read or written.
#[test]
fn given_groups_written_then_idle_when_a_handle_pass_ran_should_hold_no_files_and_serve_after() {
    let mut c = Cluster::new(1, 1, 5, NetworkFaults::default());
    let count = 40;
    for n in 0..count {
        c.create_everywhere(group(n));
    }
    for n in 0..count {
        let answer = c
            .call_until_done(group(n), Call::produce(batch(n, 3)), 500)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }));
    }
    let holding = |c: &Cluster| {
        (0..count)
            .filter(|n| {
                let g = group(*n);
                c.nodes[0][0]
                    .as_ref()
                    .unwrap()
                    .partition(g)
                    .unwrap()
                    .holds_handles()
            })
            .count()
    };
    assert_eq!(
        holding(&c),
        count as usize,
        "every written group has its files open"
    );
    // One pass to see the groups idle, one more to flush and close them.
    c.run(2 * 512 + 64);
    assert_eq!(holding(&c), 0);
    // What was acknowledged before the pass was made durable by it.
    c.crash(0, CrashMode::DropAll);
    c.restart(0);
    for n in 0..count {
        assert_eq!(
            poll_count(&mut c, group(n)),
            3,
            "group {n} after the power cut"
        );
    }
    // Files reopen on use: reads above, appends now.
    for n in 0..count {
        let answer = c
            .call_until_done(group(n), Call::produce(batch(100 + n, 2)), 500)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }));
        assert_eq!(poll_count(&mut c, group(n)), 5, "group {n}");
    }
}

/// The superblock records replica `r`'s shards wrote so far, and in how
/// many batches.
fn superblock_writes(c: &Cluster, r: u8) -> (u64, u64) {
    c.nodes[usize::from(r)]
        .iter()
        .flatten()
        .map(|n| n.stats().superblock)
        .fold((0, 0), |(records, batches), s| {
            (records + s.slot_writes, batches + s.batches)
        })
}

#[test]
fn given_the_primary_of_every_group_killed_when_the_survivors_change_views_should_write_their_records_in_batches()
 {
    const MANY: u64 = 128;
    let mut c = Cluster::new(3, 1, 11, NetworkFaults::default());
    for n in 0..MANY {
        c.create_everywhere(group(n));
    }
    c.run(100);
    // The victim is the replica that leads the most groups.
    let led = |c: &Cluster, r: u8| -> Vec<u64> {
        (0..MANY)
            .filter(|n| c.primary(group(*n)) == Some(ReplicaId(r)))
            .collect()
    };
    let victim = (0..3).max_by_key(|r| led(&c, *r).len()).unwrap();
    let orphaned = led(&c, victim);
    assert!(orphaned.len() as u64 >= MANY / 3, "{}", orphaned.len());
    let survivors: Vec<u8> = (0..3).filter(|r| *r != victim).collect();
    // The survivors' disks answer as a real runtime does: a yield is a
    // real suspension, so the groups of one step queue their records
    // together.
    for r in &survivors {
        c.fss[usize::from(*r)].set_yielding(true);
    }
    let before: Vec<_> = survivors
        .iter()
        .map(|r| superblock_writes(&c, *r))
        .collect();
    c.crash(victim, CrashMode::DropAll);
    let mut ticks = 0;
    while (0..MANY).any(|n| c.primary(group(n)).is_none()) {
        assert!(ticks < 2_000, "some group found no new primary");
        c.step();
        ticks += 1;
    }
    let views: Vec<u32> = (0..MANY)
        .map(|n| {
            let p = c.primary(group(n)).unwrap();
            c.node(p.0, group(n))
                .partition(group(n))
                .unwrap()
                .replica()
                .view()
        })
        .collect();
    let mut records = 0;
    let mut batches = 0;
    for (r, (records0, batches0)) in survivors.iter().copied().zip(before) {
        let (records1, batches1) = superblock_writes(&c, r);
        records += records1 - records0;
        batches += batches1 - batches0;
    }
    // Each survivor records every orphaned group's new view (the new
    // primary its view, then its log view; a backup both at once).
    let least = 2 * orphaned.len() as u64;
    assert!(records >= least, "{records} records, {least} at least");
    // One at a time, each record would be its own batch (two syncs);
    // together they are a handful of batches for the whole failover.
    assert!(
        batches * 16 <= records,
        "{records} records in {batches} batches over {ticks} ticks"
    );
    eprintln!("failover: {records} records in {batches} batches over {ticks} ticks");
    // Durable: both survivors lose their unsynced state, and every group
    // comes back in its new view.
    for r in &survivors {
        c.fss[usize::from(*r)].set_yielding(false);
        c.crash(*r, CrashMode::DropAll);
        c.restart(*r);
    }
    for (n, view) in (0..MANY).zip(views) {
        for r in survivors.iter().copied() {
            let p = c.nodes[usize::from(r)][0]
                .as_ref()
                .unwrap()
                .partition(group(n))
                .unwrap();
            assert!(p.replica().view() >= view, "group {n} replica {r}");
        }
    }
}

/// A single replica's group owing a committed purge (the effect's call was
/// lost: the process died before the owning shard took it, and boot's
/// reconciliation told the group the committed generation). Nothing else
/// makes a lone replica's group due, so the shard must visit it to propose
/// the purge (before the fix it never was: replog-sim `--replicas 1
/// --purges`, 139 of 300 mixed seeds from 24,100,000 ended with a purge
/// committed by group 0 and never applied).
#[test]
fn given_a_single_replica_group_owing_a_committed_purge_when_idle_should_propose_and_apply_it() {
    let mut c = Cluster::new(1, 2, 41, NetworkFaults::default());
    let g = group(3);
    c.create_everywhere(g);
    c.run(20);
    c.call_until_done(g, Call::produce(batch(1, 4)), 200)
        .unwrap();
    c.run(20);
    let node = c.node(0, g);
    assert_eq!(node.partition(g).unwrap().purge_generation(), 0);
    node.learn_purge_generation(g, 1);
    c.run(150);
    let p = c.node(0, g).partition(g).unwrap();
    assert_eq!(
        p.purge_generation(),
        1,
        "the committed purge was never applied"
    );
    assert_eq!(p.log().next_offset(), 0, "the purge erased the log");
}

/// A produce keyed with a producer's identity and flagged as a replay
/// (the SDK resends a request answered 57 under the same number).
fn keyed(tag: u64, replay: bool) -> Call {
    Call::Produce {
        batch: batch(tag, 3),
        key: ProducerKey {
            key: 0xfeed_0000 + u128::from(tag),
            replay,
            vouched: 0,
        },
    }
}

/// A replay is looked up by its key before it is ordered: a committed
/// send is answered with its original op and offsets and stored once, one
/// still in flight is answered `Indeterminate` (the client sends it
/// again), and a replay of a send the primary never saw is ordered as new
/// when its journal holds every op since the replay window began (a group
/// that applied nothing before this process, or one sampled for the whole
/// window), and told to wait otherwise (every replica restarted since).
#[test]
fn given_a_replayed_send_when_the_original_committed_should_answer_its_offsets_and_store_it_once() {
    let mut c = Cluster::new(3, 2, 29, NetworkFaults::default());
    let g = group(1);
    c.create_everywhere(g);
    c.run(100);
    c.call_until_done(g, Call::produce(batch(1, 2)), 500)
        .unwrap();
    let original = c.call_until_done(g, keyed(2, false), 500).unwrap();
    assert!(
        matches!(
            original,
            Answer::Committed {
                base_offset: Some(Offset(2)),
                ..
            }
        ),
        "{original:?}"
    );
    let replayed = c.call_until_done(g, keyed(2, true), 500).unwrap();
    assert_eq!(replayed, original, "the replay gets the original's answer");
    assert_eq!(
        poll_count(&mut c, g),
        5,
        "the replayed batch is stored once"
    );

    // Never seen by a journal holding the group's whole history: new.
    let fresh = c.call_until_done(g, keyed(3, true), 500).unwrap();
    assert!(matches!(
        fresh,
        Answer::Committed {
            base_offset: Some(Offset(5)),
            ..
        }
    ));
    assert_eq!(poll_count(&mut c, g), 8);

    // Still in flight: the replay waits, then gets the original's answer.
    let primary = c.primary(g).unwrap();
    let mut first = c.send(primary, g, keyed(4, false));
    let mut early = c.send(primary, g, keyed(4, true));
    assert!(
        matches!(
            early.rx.try_recv(),
            Ok(Some(Err(CallError::Indeterminate { .. })))
        ),
        "a replay of a send still being committed waits"
    );
    let mut answer = None;
    for _ in 0..500 {
        if let Ok(Some(a)) = first.rx.try_recv() {
            answer = Some(a.unwrap());
            break;
        }
        c.step();
    }
    let answer = answer.expect("the original send commits");
    let late = c.call_until_done(g, keyed(4, true), 500).unwrap();
    assert_eq!(late, answer);
    assert_eq!(poll_count(&mut c, g), 11, "three sends of 3 and one of 2");

    // Every process restarted: what they applied before is in no journal,
    // so an unknown replay waits until the window has passed.
    c.flush_all();
    for r in 0..3 {
        c.crash(r, CrashMode::KeepAll);
    }
    for r in 0..3 {
        c.restart(r);
    }
    assert_eq!(poll_count(&mut c, g), 11);
    let primary = c.primary(g).unwrap();
    let mut young = c.send(primary, g, keyed(5, true));
    let Ok(Some(Err(CallError::ReplayUnplaced {
        since: Some((boot, _)),
    }))) = young.rx.try_recv()
    else {
        panic!("a replay the primary cannot place waits, naming its boot")
    };
    // Vouched for another boot: still unplaced.
    let mut vouched = keyed(5, true);
    if let Call::Produce { key, .. } = &mut vouched {
        key.vouched = boot ^ 1;
    }
    let mut wrong = c.send(primary, g, vouched.clone());
    assert!(matches!(
        wrong.rx.try_recv(),
        Ok(Some(Err(CallError::ReplayUnplaced { .. })))
    ));
    // Vouched for this boot (the send was first received after it): new.
    if let Call::Produce { key, .. } = &mut vouched {
        key.vouched = boot;
    }
    let placed = c.call_until_done(g, vouched, 500).unwrap();
    assert!(matches!(
        placed,
        Answer::Committed {
            base_offset: Some(Offset(11)),
            ..
        }
    ));
    // Past the window (ticks of 10 ms): the journal holds every op since.
    c.run(partitions::REPLAY_WINDOW_US / 10_000 + 200);
    let placed = c.call_until_done(g, keyed(6, true), 500).unwrap();
    assert!(matches!(
        placed,
        Answer::Committed {
            base_offset: Some(Offset(14)),
            ..
        }
    ));
    assert_eq!(poll_count(&mut c, g), 17);
}
