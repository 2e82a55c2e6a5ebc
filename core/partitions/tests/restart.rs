//! A replica of a three-replica group restarts from its directory (the
//! simulated filesystem crashed with seeded loss of unsynced data, the file
//! superblock in the partition directory) and rejoins by repair while a
//! client keeps producing: it resumes after the applied point its
//! superblock records, re-applies the later ops its peers still retain
//! (finding the batches a flush synced but did not record on disk, not
//! writing them twice), and ends with the same polls and byte-identical
//! segment files as the others. When its peers no longer retain what it
//! lacks, it reports the state transfer it needs and serves nothing new.
#![allow(clippy::unwrap_used)]

use common::simnet::NetworkFaults;
use common::{ConsumerKind, Offset, Op, ReplicaId};
use consensus::vsr::RequestOutcome;
use futures::executor::block_on;
use partitions::{ClientOp, ClientRequest, InMemoryNetwork, Partition};

mod harness;
use harness::*;

/// Crashes replica `victim(cluster)` mid-run, keeps producing while it is
/// down, restarts it, keeps producing, converges and compares. Returns
/// whether the restarted replica had ops to re-apply (its recorded applied
/// point below what it had applied); a seal just before the crash records
/// the point, and then there is nothing to re-apply.
fn crash_restart_converge(seed: u64, crash_primary: bool) -> bool {
    let mut c = Cluster::new(seed, 512);
    c.produce(40 + seed % 7);
    let primary = c.primary();
    let victim = if crash_primary {
        primary
    } else {
        (primary + 1 + (seed % 2) as u8) % REPLICAS
    };
    let applied_before = c.replica(victim).replica().commit_min().0;
    c.crash(victim);
    c.produce(25);
    c.restart(victim);
    let restarted = c.replica(victim);
    let resumed_at = restarted.replica().commit_min().0;
    eprintln!(
        "seed {seed}: resumed at op {resumed_at} offset {}, log end {:?}, had applied {applied_before}",
        restarted.offset_frontier().0,
        restarted.recovered_durable_offset()
    );
    assert!(resumed_at <= applied_before);
    assert!(!restarted.replica().is_quorum_visible());
    c.produce(30);
    c.converge();
    if crash_primary {
        assert!(c.up().all(|r| r.replica().view() > 0), "no view change");
    }
    c.assert_identical();
    resumed_at < applied_before
}

#[test]
fn given_backup_crashed_with_unsynced_loss_when_restarted_should_repair_and_agree_byte_for_byte() {
    let reapplied = (1..=4)
        .filter(|&seed| crash_restart_converge(seed, false))
        .count();
    assert!(
        reapplied >= 3,
        "only {reapplied} of 4 seeds re-applied anything"
    );
}

#[test]
fn given_primary_crashed_with_unsynced_loss_when_restarted_should_rejoin_the_new_view_and_agree() {
    // A primary writes every batch before its reply, so segments seal (and
    // record the applied point) as it goes; some seeds crash it right after
    // a seal.
    let reapplied = (1..=6)
        .filter(|&seed| crash_restart_converge(seed, true))
        .count();
    assert!(
        reapplied >= 3,
        "only {reapplied} of 6 seeds re-applied anything"
    );
}

/// A backup whose journal holds committed batches, a power cut after each
/// filesystem call of its on-demand flush (writes, log sync, superblock
/// record), reboot from that directory, converge, compare.
#[test]
fn given_power_cut_at_every_step_of_a_backup_flush_when_restarted_should_converge() {
    let mut steps = 0;
    for n in 0u64.. {
        assert!(n < 200, "the flush never completed");
        let seed = 100 + n;
        let mut c = Cluster::new(seed, 512);
        let backup = (c.primary() + 1) % REPLICAS;
        c.replicas[usize::from(backup)]
            .as_mut()
            .unwrap()
            .set_flush_thresholds(u64::MAX, u64::MAX);
        c.replicas[usize::from(backup)]
            .as_mut()
            .unwrap()
            .set_record_interval(0);
        c.produce(30);
        c.converge();
        let node = c.replicas[usize::from(backup)].as_mut().unwrap();
        assert!(node.unflushed_messages() > 0);
        let before = node.durable_offset_frontier().0;
        c.fss[usize::from(backup)].cut_power_after(n);
        let completed = block_on(node.flush_committed_messages()).is_ok();
        if completed {
            assert!(node.durable_offset_frontier().0 > before);
        }
        c.crash(backup);
        c.produce(5);
        c.restart(backup);
        c.produce(10);
        c.converge();
        c.assert_identical();
        steps += 1;
        if completed {
            break;
        }
    }
    eprintln!("flush: {steps} power cuts");
    assert!(steps >= 4, "only {steps} steps");
}

/// Peers retain 16 applied prepares; the backup is down while 60 ops
/// commit: repair concludes FloorRefused, the core asks for a state
/// transfer, and the replica stays invisible, applies nothing past its
/// recorded point and does not panic, while the others keep serving.
#[test]
fn given_restarted_backup_behind_every_peers_retention_when_repairing_should_ask_for_state_transfer()
 {
    let mut c = Cluster::new(7, 16);
    c.produce(20);
    let victim = (c.primary() + 1) % REPLICAS;
    c.crash(victim);
    c.produce(60);
    c.restart(victim);
    let resumed_at = c.replica(victim).replica().commit_min().0;
    let mut asked = None;
    for _ in 0..40 {
        c.client_step(true);
        let r = c.replica(victim);
        assert!(r.fenced().is_none());
        assert!(
            !r.replica().is_quorum_visible(),
            "caught up without the ops"
        );
        assert_eq!(r.replica().commit_min().0, resumed_at);
        if let Some(need) = r.state_transfer_needed() {
            asked = Some(need);
        }
    }
    let need = asked.expect("no state transfer asked for");
    assert_ne!(need.peer.0, victim);
    assert!(
        need.floor.0 > resumed_at,
        "{need:?} resumed at {resumed_at}"
    );
    let head = c.up().map(|r| r.replica().commit_max().0).max().unwrap();
    assert!(need.to_op > need.floor && need.to_op.0 <= head, "{need:?}");
    // The others kept committing.
    c.produce(5);
}

/// A purge is applied on every replica while a backup's power is cut after
/// each filesystem call of its purge steps; the backup reboots from what
/// survived (an interrupted purge's applied point names the op before the
/// purge, so the purge is re-applied and completes), repairs and converges
/// on the purged offset space.
#[test]
fn given_power_cut_at_every_step_of_a_backup_purge_when_restarted_should_converge_purged() {
    let mut steps = 0;
    for n in 0u64.. {
        assert!(n < 300, "the purge never completed");
        let mut c = Cluster::new(500 + n, 512);
        c.produce(25);
        c.converge();
        let primary = c.primary();
        let backup = (primary + 1) % REPLICAS;
        c.fss[usize::from(backup)].cut_power_after(n);
        c.powerless = Some(backup);
        let session = c.session.unwrap();
        let request = c.next_request;
        c.next_request += 1;
        let outcome = block_on(c.replicas[usize::from(primary)].as_mut().unwrap().submit(
            ClientRequest {
                client: CLIENT,
                session,
                request,
                user_id: 1,
                op: ClientOp::Purge { generation: 1 },
            },
            c.now * TICK_US,
        ))
        .unwrap();
        assert!(
            matches!(outcome, RequestOutcome::Prepared { .. }),
            "{outcome:?}"
        );
        for _ in 0..30 {
            c.step();
        }
        let node = c.replica(backup);
        let completed = node.purge_generation() == 1 && node.fenced().is_none();
        c.crash(backup);
        c.acked.clear();
        c.restart(backup);
        c.produce(25);
        c.converge();
        for r in c.up() {
            assert_eq!(r.purge_generation(), 1);
            assert_eq!(r.first_offset(), Offset(0));
        }
        c.assert_identical();
        steps += 1;
        if completed {
            break;
        }
    }
    eprintln!("purge: {steps} power cuts");
    assert!(steps >= 5, "only {steps} steps");
}

/// Five replicas: two backups lose power at once (f = 2), the others keep
/// committing, both restart and rejoin by repair.
#[test]
fn given_two_backups_of_five_crashed_together_when_restarted_should_repair_and_agree() {
    for seed in 1..=2 {
        let mut c = Cluster::with_replicas(5, seed, 512);
        c.produce(40);
        let primary = c.primary();
        let victims = [(primary + 1) % 5, (primary + 3) % 5];
        for v in victims {
            c.crash(v);
        }
        c.produce(25);
        for v in victims {
            c.restart(v);
            assert!(!c.replica(v).replica().is_quorum_visible());
        }
        c.produce(30);
        c.converge();
        c.assert_identical();
    }
}

/// A backup crashes, restarts, crashes again while re-applying (before it
/// caught up), restarts once more and still converges byte for byte.
#[test]
fn given_backup_crashed_again_mid_repair_when_restarted_should_converge() {
    for seed in 1..=3 {
        let mut c = Cluster::new(seed + 40, 512);
        c.produce(45);
        let victim = (c.primary() + 2) % REPLICAS;
        c.crash(victim);
        c.produce(20);
        c.restart(victim);
        for _ in 0..(3 + seed) {
            c.step();
        }
        c.crash(victim);
        c.produce(10);
        c.restart(victim);
        c.produce(20);
        c.converge();
        c.assert_identical();
    }
}

/// A long run of consumer-offset stores (no message, so no message
/// threshold is ever reached) still moves the recorded applied point, so a
/// backup that restarts right after finds its peers (retaining 32 ops)
/// still holding what it lacks, and rejoins without a state transfer.
#[test]
fn given_offset_only_traffic_when_backup_restarts_should_find_its_ops_retained() {
    let mut c = Cluster::new(21, 32);
    c.produce(30);
    c.store_offsets(120);
    c.converge();
    let victim = (c.primary() + 1) % REPLICAS;
    let applied = c.replica(victim).replica().commit_min().0;
    c.crash(victim);
    c.restart(victim);
    let resumed_at = c.replica(victim).replica().commit_min().0;
    assert!(
        applied - resumed_at <= 8,
        "resumed at {resumed_at}, had applied {applied}"
    );
    c.produce(20);
    c.converge();
    assert!(c.replica(victim).state_transfer_needed().is_none());
    let stored: Vec<Option<u64>> = c
        .up()
        .map(|r| r.stored_offset(ConsumerKind::Consumer, 7).map(|o| o.0))
        .collect();
    assert!(
        stored.iter().all(|s| s.is_some() && *s == stored[0]),
        "{stored:?}"
    );
    c.assert_identical();
}

/// A superblock with an offset frontier but no applied point (written
/// before the applied point was recorded) names no op to resume after: a
/// replica of a group refuses to boot from it rather than guess.
#[test]
fn given_frontier_without_applied_point_when_replica_of_group_boots_should_refuse() {
    use journal::{MemSuperblock, SuperblockStore, VsrState};
    let fs = fresh_fs(3);
    let mut store = MemSuperblock::new();
    block_on(store.write(&VsrState {
        replica_id: ReplicaId(1),
        replica_count: REPLICAS,
        view: 2,
        log_view: 2,
        commit_max: Op(30),
        offset_frontier: Offset(5),
        ..VsrState::default()
    }))
    .unwrap();
    let net = InMemoryNetwork::new(1, REPLICAS, NetworkFaults::default());
    let booted = block_on(Partition::open(
        replica_config(1, REPLICAS, 512),
        fs.clone(),
        &pdir(),
        net.endpoint(ReplicaId(1)),
        store,
    ));
    assert!(
        matches!(
            booted,
            Err(partitions::BootError::RestartNeedsStateTransfer { commit: Op(30), .. })
        ),
        "{booted:?}"
    );
}

/// The time bound on a replicated group's applied point: a few ops, far
/// below the op-count bound (`retention_ops / 4` = 256 here), are recorded
/// by every replica once the record interval has passed in ticks. The
/// record is made on the group's tick (flush.rs), so without ticks past the
/// interval nothing would ever record them.
#[test]
fn given_a_few_ops_below_the_op_bound_when_ticks_pass_the_interval_should_record_them_on_every_replica()
 {
    let mut c = Cluster::new(0x7155, 1024);
    c.produce(3);
    c.converge();
    let interval_ticks = partitions::RECORD_INTERVAL_US_DEFAULT / TICK_US;
    for _ in 0..interval_ticks + 2 {
        c.step();
    }
    for r in c.up() {
        assert!(r.offset_frontier().0 > 0);
        assert_eq!(r.durable_offset_frontier().0, r.offset_frontier().0);
    }
}
