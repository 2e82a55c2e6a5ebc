//! A bit flipped at rest in a sealed segment of one replica of a group:
//! the scrub (or a poll) finds it, nothing of the damaged range is served,
//! the replica leaves every quorum and repairs itself by state transfer
//! from a peer, and all replicas end byte-identical. A healthy group
//! scrubbed for a long time (across a purge) never reports damage.
#![allow(clippy::unwrap_used)]

use futures::executor::block_on;
use partitions::{ClientOp, PollRequest, PollingStrategy};
use storage::fs::Fs;

mod harness;
use harness::*;

/// One scrub step of 4 KiB on every live replica.
fn scrub_all(c: &mut Cluster) {
    for r in c.replicas.iter_mut().flatten() {
        block_on(r.scrub_step(4096));
    }
}

#[test]
fn given_a_bit_flipped_in_a_backups_sealed_segment_when_scrubbed_should_never_serve_it_and_repair_from_a_peer()
 {
    let mut c = Cluster::new(21, 512);
    c.enable_transfer_drivers(small_chunk_driver_config());
    c.produce(60);
    c.converge();
    let victim = (c.primary() + 1) % REPLICAS;
    let sealed = {
        let segs: Vec<_> = c.replica(victim).log().segments().copied().collect();
        assert!(segs.len() >= 3, "{} segments", segs.len());
        segs[1]
    };
    let path = pdir().join(format!("{:020}.log", sealed.start_offset));
    c.fss[usize::from(victim)]
        .rot_byte(&path, sealed.size_bytes / 2, 0x10)
        .unwrap();
    // A poll of the damaged range answers an error, never the bytes.
    let poll = block_on(c.replica(victim).poll(&PollRequest {
        consumer: (common::ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::Offset(sealed.start_offset),
        count: u32::try_from(sealed.next_offset - sealed.start_offset).unwrap(),
        auto_commit: false,
    }));
    let served: Vec<u64> = poll
        .as_ref()
        .map(|p| p.messages().map(|m| m.offset).collect())
        .unwrap_or_default();
    assert!(
        poll.is_err()
            || served.len() < usize::try_from(sealed.next_offset - sealed.start_offset).unwrap(),
        "the damaged range was served whole: {served:?}"
    );
    // The scrub (and the poll's finding) starts the repair.
    let mut detected = false;
    for _ in 0..2_000 {
        scrub_all(&mut c);
        c.client_step(false);
        if c.replica(victim).missing_history().is_some() {
            detected = true;
            break;
        }
    }
    assert!(detected, "the damage was never found");
    assert!(
        !c.replica(victim).replica().is_quorum_visible()
            || c.replica(victim).missing_history().is_some()
    );
    for _ in 0..20_000 {
        scrub_all(&mut c);
        c.client_step(true);
        if c.replica(victim).missing_history().is_none() {
            break;
        }
    }
    assert!(
        c.replica(victim).missing_history().is_none(),
        "the transfer never repaired the damage"
    );
    c.produce(10);
    c.converge();
    c.assert_identical();
}

#[test]
fn given_a_healthy_group_when_scrubbed_across_a_purge_should_report_no_damage() {
    let mut c = Cluster::new(22, 512);
    c.enable_transfer_drivers(small_chunk_driver_config());
    for round in 0..3 {
        c.produce(30);
        for _ in 0..300 {
            scrub_all(&mut c);
            c.step();
        }
        if round == 1 {
            // A purge plants a new segment set under the scrub's cursor.
            c.client_step_with(true, |_| (ClientOp::Purge { generation: 1 }, Vec::new()));
            c.converge();
            c.acked.clear();
        }
    }
    for r in 0..REPLICAS {
        assert!(c.replica(r).missing_history().is_none(), "replica {r}");
    }
    c.converge();
}

/// Runs until replica `victim` no longer lacks history (a transfer
/// installed), producing meanwhile.
fn repair(c: &mut Cluster, victim: u8) {
    for _ in 0..20_000 {
        scrub_all(c);
        c.client_step(true);
        if c.replica(victim).missing_history().is_none() {
            return;
        }
    }
    panic!("the transfer never repaired replica {victim}");
}

/// Where a flipped bit lands in a backup's segments while it is down.
#[derive(Debug, Clone, Copy)]
enum AtRest {
    /// Past the last index entry of a sealed segment: recovery ends that
    /// segment early, and the next one no longer follows it (a hole).
    SealedTail,
    /// In the synced part of the active segment: recovery cuts it as a
    /// torn tail, below the recorded frontier.
    ActiveSynced,
}

#[test]
fn given_a_bit_flipped_in_a_backups_segments_while_it_is_down_when_it_reboots_should_set_them_aside_and_repair_from_a_peer()
 {
    for (seed, place) in [(31u64, AtRest::SealedTail), (32, AtRest::ActiveSynced)] {
        let mut c = Cluster::new(seed, 512);
        c.enable_transfer_drivers(small_chunk_driver_config());
        c.produce(60);
        c.converge();
        let victim = (c.primary() + 1) % REPLICAS;
        // Everything the victim applied is synced and recorded.
        block_on(
            c.replicas[usize::from(victim)]
                .as_mut()
                .unwrap()
                .flush_committed_messages(),
        )
        .unwrap();
        let segs: Vec<_> = c.replica(victim).log().segments().copied().collect();
        assert!(segs.len() >= 3, "{} segments", segs.len());
        let (seg, pos) = match place {
            AtRest::SealedTail => (segs[1], segs[1].size_bytes - 8),
            AtRest::ActiveSynced => {
                let active = segs[segs.len() - 1];
                assert!(
                    active.size_bytes > 0,
                    "seed {seed}: an empty active segment"
                );
                (active, active.size_bytes / 2)
            }
        };
        let frontier = c.replica(victim).offset_frontier().0;
        c.kill(victim);
        let path = pdir().join(format!("{:020}.log", seg.start_offset));
        c.fss[usize::from(victim)]
            .rot_byte(&path, pos, 0x04)
            .unwrap();
        // It boots (a single replica would refuse), lacking its history,
        // out of every quorum, with the damaged files set aside.
        c.restart(victim);
        let missing = c.replica(victim).missing_history();
        assert!(missing.is_some(), "{place:?}: booted as if whole");
        assert_eq!(missing.unwrap().frontier.0, frontier, "{place:?}");
        assert!(c.replica(victim).log().next_offset() >= frontier);
        let fenced = block_on(c.fss[usize::from(victim)].exists(&{
            let mut name = pdir().into_os_string();
            name.push(".fenced.0");
            std::path::PathBuf::from(name)
        }))
        .unwrap();
        assert!(fenced, "{place:?}: the damaged files were not kept aside");
        repair(&mut c, victim);
        c.produce(10);
        c.converge();
        c.assert_identical();
    }
}

#[test]
fn given_a_consumer_offset_record_flipped_while_a_backup_is_down_when_it_reboots_should_repair_it_from_a_peer()
 {
    let mut c = Cluster::new(33, 512);
    c.enable_transfer_drivers(small_chunk_driver_config());
    c.produce(30);
    c.store_offsets(5);
    c.converge();
    let victim = (c.primary() + 1) % REPLICAS;
    let stored = c
        .replica(victim)
        .stored_offset(common::ConsumerKind::Consumer, 7);
    assert!(stored.is_some());
    c.kill(victim);
    let record = pdir().join("offsets").join("consumers").join("7");
    c.fss[usize::from(victim)]
        .rot_byte(&record, 3, 0x01)
        .unwrap();
    c.restart(victim);
    assert!(
        c.replica(victim).missing_history().is_some(),
        "a damaged offset record was dropped as if the consumer had none"
    );
    repair(&mut c, victim);
    c.converge();
    let primary = c.primary();
    assert_eq!(
        c.replica(victim)
            .stored_offset(common::ConsumerKind::Consumer, 7),
        c.replica(primary)
            .stored_offset(common::ConsumerKind::Consumer, 7),
    );
    c.assert_identical();
}

/// The boot that sets damaged segments aside, with the power cut after
/// each of its filesystem calls in turn (both what a cut keeps and the
/// worst case): the next boot still lacks its history, never comes back
/// as if whole, and a transfer repairs it.
#[test]
fn given_power_cut_at_every_step_of_setting_damaged_segments_aside_when_rebooted_should_still_repair()
 {
    use storage::fs::CrashMode;
    let mut completed = false;
    for n in 1..200u64 {
        for mode in [CrashMode::Seeded, CrashMode::DropAll] {
            let mut c = Cluster::new(34, 512);
            c.enable_transfer_drivers(small_chunk_driver_config());
            c.produce(60);
            c.converge();
            let victim = (c.primary() + 1) % REPLICAS;
            block_on(
                c.replicas[usize::from(victim)]
                    .as_mut()
                    .unwrap()
                    .flush_committed_messages(),
            )
            .unwrap();
            let segs: Vec<_> = c.replica(victim).log().segments().copied().collect();
            let sealed = segs[1];
            c.kill(victim);
            let fs = c.fss[usize::from(victim)].clone();
            let path = pdir().join(format!("{:020}.log", sealed.start_offset));
            fs.rot_byte(&path, sealed.size_bytes - 8, 0x04).unwrap();
            fs.cut_power_after(n);
            let first = c.try_boot(victim);
            let booted = first.is_ok();
            drop(first);
            fs.crash_with(mode);
            c.restart(victim);
            assert!(
                c.replica(victim).missing_history().is_some(),
                "cut {n} {mode:?}: rebooted as if whole"
            );
            repair(&mut c, victim);
            c.produce(5);
            c.converge();
            c.assert_identical();
            completed |= booted;
        }
        if completed {
            break;
        }
    }
    assert!(completed, "the damaged boot never completed");
}

/// A flipped bit in one replica's sealed index file (the simulator's index
/// rot): the scrub derives the entries from the log it verifies, finds the file
/// (or, rotted while the replica was down, the entries boot loaded from it)
/// different, and rewrites both from the log; the files agree with the peers'
/// again and every offset is served. Before the check, nothing read a sealed
/// index against its log.
#[test]
fn given_a_bit_flipped_in_a_sealed_segments_index_when_scrubbed_should_rewrite_it_from_the_log() {
    for (seed, while_down) in [(41u64, false), (42, true)] {
        // About 40 KB batches in 256 KiB segments: several entries per
        // sealed index at the 64 KiB stride.
        let shape = Shape {
            segment_size: 256 * 1024,
            messages_per_batch: 10,
            payload_len: 4000,
            ..Shape::default()
        };
        let mut c = Cluster::shaped(REPLICAS, seed, 512, shape);
        c.produce(40);
        c.converge();
        let victim = (c.primary() + 1) % REPLICAS;
        let peer = c.primary();
        for r in c.replicas.iter_mut().flatten() {
            block_on(r.flush_committed_messages()).unwrap();
        }
        let seg = {
            let log = c.replica(victim).log();
            let segs: Vec<_> = log.segments().copied().collect();
            let sealed = &segs[..segs.len() - 1];
            *sealed
                .iter()
                .find(|s| log.index_entries(s.start_offset).unwrap().len() >= 3)
                .expect("a sealed segment with three index entries")
        };
        let entries = |c: &Cluster, r: u8| {
            c.replica(r)
                .log()
                .index_entries(seg.start_offset)
                .unwrap()
                .to_vec()
        };
        let path = pdir().join(format!("{:020}.index", seg.start_offset));
        let file = |c: &Cluster, r: u8| c.fss[usize::from(r)].contents(&path).unwrap();
        assert_eq!(file(&c, victim), file(&c, peer));
        // Entry 1's timestamp (bytes 8..16 of a 24-byte entry): still a
        // well-formed, increasing index, so boot trusts and loads it.
        if while_down {
            c.kill(victim);
        }
        c.fss[usize::from(victim)]
            .rot_byte(&path, 24 + 8 + 2, 0x20)
            .unwrap();
        if while_down {
            c.restart(victim);
            assert_ne!(
                entries(&c, victim),
                entries(&c, peer),
                "boot did not load the rotted entry"
            );
        }
        assert_ne!(file(&c, victim), file(&c, peer));
        let mut rewritten = false;
        for _ in 0..5_000 {
            scrub_all(&mut c);
            c.step();
            if c.replica(victim).scrub_index_rewrites() > 0 {
                rewritten = true;
                break;
            }
        }
        assert!(rewritten, "seed {seed}: the rotted index was never found");
        assert_eq!(file(&c, victim), file(&c, peer), "seed {seed}");
        assert_eq!(entries(&c, victim), entries(&c, peer), "seed {seed}");
        assert!(c.replica(victim).missing_history().is_none());
        // A healthy index is never rewritten: a whole pass more changes
        // nothing.
        for _ in 0..2_000 {
            scrub_all(&mut c);
            c.step();
        }
        assert_eq!(c.replica(victim).scrub_index_rewrites(), 1);
        assert_eq!(c.replica(peer).scrub_index_rewrites(), 0);
        c.produce(5);
        c.converge();
        c.assert_identical();
    }
}
