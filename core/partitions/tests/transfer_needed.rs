//! The transfer-needed record: a backup whose install a power cut
//! interrupted reboots converged to an empty partition at the offer's
//! frontier, and the durable record keeps it honestly lagging until a
//! completed install clears it: it reports `state_transfer_needed()`,
//! serves no offer, answers polls below its frontier "not available"
//! rather than "empty", and acknowledges nothing, so a group whose other
//! backup is cut off cannot commit through it. (The cluster harness is the
//! one of `tests/install_cluster.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use common::{ConsumerKind, Offset, ReplicaId};
use std::path::PathBuf;

use common::simnet::NetworkFaults;
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::state_transfer::{
    BuildBudget, OfferServer, OfferServerConfig, PartitionTransferUnavailable, TRANSFER_NEEDED_FILE,
};
use partitions::{InMemoryNetwork, Partition, PollError, PollRequest, PollingStrategy};
use storage::fs::Fs;

mod harness;
use harness::*;

/// Power cuts at every filesystem call of the backup's install until one
/// reboots converged (the install got past its frontier record). Returns
/// the cluster with the rebooted victim and the cut that did it.
fn rebooted_converged(seed: u64) -> (Cluster, u8, u64) {
    for n in 1..300 {
        let (mut c, victim, need) = lagging_backup(seed);
        let input = pull(&mut c, need.peer.0, victim);
        let offer_frontier =
            partitions::state_transfer::ConsumerOffsetsWire::decode(&input.offsets_artifact)
                .unwrap()
                .next_offset;
        let old_frontier = c.replica(victim).offset_frontier().0;
        assert!(
            offer_frontier > Offset(old_frontier),
            "the offer must move the frontier"
        );
        let fs = c.fss[usize::from(victim)].clone();
        fs.cut_power_after(n);
        let receiver = c.replicas[usize::from(victim)].as_mut().unwrap();
        let result = block_on(receiver.install_partition_state(input));
        c.crash(victim);
        c.restart(victim);
        let r = c.replica(victim);
        // Converged: the only segment is the empty one at the frontier.
        let converged = r.log().segments().count() == 1
            && r.log().next_offset() == r.offset_frontier().0
            && r.first_offset() == r.offset_frontier()
            && r.offset_frontier().0 > 0;
        if converged {
            assert_eq!(r.offset_frontier().0, offer_frontier.0, "cut {n}");
            return (c, victim, n);
        }
        // Not converged: the cut came before the frontier record and the
        // old state stands (the install reported the cut), or the install
        // completed and the new chain stands whole. Nothing in between,
        // and no record of missing history either way.
        assert!(
            r.missing_history().is_none(),
            "cut {n}: lagging but not converged"
        );
        if r.offset_frontier().0 == old_frontier {
            assert!(result.is_err(), "cut {n}: reported installed, booted old");
        } else {
            assert_eq!(
                r.offset_frontier().0,
                offer_frontier.0,
                "cut {n}: neither old nor new"
            );
            assert!(
                r.first_offset() < offer_frontier,
                "cut {n}: new frontier, no chain"
            );
        }
    }
    panic!("no power cut left the backup converged");
}

fn record_path() -> PathBuf {
    pdir().join(TRANSFER_NEEDED_FILE)
}

#[test]
fn given_power_cut_mid_install_when_rebooted_should_stay_lagging_until_an_install_clears_the_record()
 {
    let (mut c, victim, cut) = rebooted_converged(9);
    let fs = c.fss[usize::from(victim)].clone();
    let r = c.replica(victim);
    let frontier = r.offset_frontier().0;
    eprintln!(
        "cut {cut}: converged at frontier {frontier}, op {}",
        r.replica().commit_min().0
    );

    // The record is durable and honoured after the reboot.
    assert!(block_on(fs.exists(&record_path())).unwrap(), "no record");
    let missing = r.missing_history().expect("record not honoured at boot");
    assert_eq!(missing.frontier.0, frontier);
    assert!(
        r.state_transfer_needed().is_some(),
        "converged replica does not ask for a transfer"
    );
    // Polls below the frontier are "not available", not "empty".
    for strategy in [
        PollingStrategy::Offset(0),
        PollingStrategy::Offset(frontier - 1),
        PollingStrategy::First,
        PollingStrategy::Next,
    ] {
        let polled = block_on(r.poll(&PollRequest {
            consumer: (ConsumerKind::Consumer, 1),
            strategy,
            count: 10,
            auto_commit: false,
        }));
        assert!(
            matches!(polled, Err(PollError::HistoryMissing { frontier: f }) if f == Offset(frontier)),
            "{strategy:?}: {polled:?}"
        );
    }
    // It survives another reboot (the record, not memory, says so).
    c.crash(victim);
    c.restart(victim);
    assert_eq!(
        c.replica(victim).missing_history().map(|m| m.frontier.0),
        Some(frontier)
    );

    // It acknowledges nothing: with the other backup cut off, the primary
    // cannot commit through it (without the record it would, over a hole).
    for _ in 0..200 {
        c.step();
    }
    let primary = c.primary();
    assert_ne!(primary, victim);
    let other = (0..REPLICAS)
        .find(|r| *r != primary && *r != victim)
        .unwrap();
    let acked_before = c.next_request;
    c.net.isolate(Some(ReplicaId(other)));
    for _ in 0..400 {
        c.client_step(true);
    }
    assert_eq!(
        c.next_request, acked_before,
        "committed through a replica with missing history"
    );
    c.net.isolate(None);
    c.produce(2);

    // A pull and an install clear it; the replica agrees byte for byte.
    for _ in 0..2_000 {
        if c.replica(c.primary()).replica().is_caught_up_primary() {
            break;
        }
        c.step();
    }
    let peer = c.primary();
    transfer(&mut c, peer, victim);
    let r = c.replica(victim);
    assert!(r.missing_history().is_none());
    assert!(r.state_transfer_needed().is_none());
    assert!(
        !block_on(fs.exists(&record_path())).unwrap(),
        "record left behind"
    );
    c.produce(5);
    c.converge();
    c.assert_identical();
    // Cleared for good: a reboot does not bring it back.
    c.crash(victim);
    c.restart(victim);
    assert!(c.replica(victim).missing_history().is_none());
    c.produce(3);
    c.converge();
    c.assert_identical();
}

/// The serve gate refuses a replica with missing history even when it is
/// the group's caught-up primary (a single replica, which is primary by
/// itself once booted).
#[test]
fn given_single_replica_converged_at_boot_when_asked_for_an_offer_should_refuse() {
    let (mut c, victim, _) = rebooted_converged(11);
    drop(c.replicas[usize::from(victim)].take());
    // Reopen the victim's disk as a one-replica group: primary at once.
    let fs = c.fss[usize::from(victim)].clone();
    let net = InMemoryNetwork::new(3, 1, NetworkFaults::default());
    let mut solo = block_on(Partition::open(
        replica_config(0, 1, 16),
        fs,
        &pdir(),
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(c.fss[usize::from(victim)].clone(), &pdir()),
    ))
    .unwrap();
    assert!(solo.replica().is_caught_up_primary());
    assert!(solo.missing_history().is_some());
    let mut server = OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 4096,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });
    let refused =
        block_on(server.on_request_state_transfer(&mut solo, ReplicaId(1), 77, &FrozenClock));
    assert!(
        matches!(refused, Err(PartitionTransferUnavailable::RepairInProgress)),
        "{refused:?}"
    );
}

/// It does not vote: with the primary crashed, the other backup and the
/// replica with missing history are a majority by count, but no view forms
/// through it (without the record the two would start a view whose log the
/// lagging replica could lead over its hole). The group stalls instead:
/// the lagging replica counts as failed, as an invisible one does.
#[test]
fn given_missing_history_when_the_primary_crashes_should_not_form_a_view_through_it() {
    let (mut c, victim, _) = rebooted_converged(9);
    assert!(c.replica(victim).missing_history().is_some());
    for _ in 0..200 {
        c.step();
    }
    let primary = c.primary();
    assert_ne!(primary, victim);
    let view = c.replica(victim).replica().view();
    c.crash(primary);
    for _ in 0..3_000 {
        c.step();
    }
    for r in c.up() {
        assert!(
            !(r.replica().is_primary() && r.replica().view() > view),
            "replica {} leads view {} formed through a replica with missing history",
            r.replica().replica(),
            r.replica().view()
        );
    }
}

/// The backup's install fails mid-swap (its first staged index rename) and
/// converges, and the converge cannot write its transfer-needed record:
/// `record_fault` arms the faults that hit the record. Returns the cluster
/// and the victim, or `None` when the faults missed the record.
fn converged_without_record(
    seed: u64,
    record_fault: impl FnOnce(&storage::fs::SimFs),
) -> Option<(Cluster, u8)> {
    let (mut c, victim, need) = lagging_backup(seed);
    let input = pull(&mut c, need.peer.0, victim);
    let fs = c.fss[usize::from(victim)].clone();
    // Rename #1 is the install marker's, #2 the first staged index.
    fs.fail_nth(storage::fs::FaultKind::Rename, 2, storage::fs::EIO);
    record_fault(&fs);
    let receiver = c.replicas[usize::from(victim)].as_mut().unwrap();
    let result = block_on(receiver.install_partition_state(input));
    let converged = matches!(
        result,
        Err(partitions::state_transfer::PartitionInstallError::SwapIo { .. })
    );
    let marker = pdir().join(partitions::state_transfer::INSTALL_MARKER_FILE);
    if !converged
        || block_on(fs.exists(&record_path())).unwrap()
        || !block_on(fs.exists(&marker)).unwrap()
    {
        fs.clear_faults();
        return None;
    }
    Some((c, victim))
}

/// After the tail ran and a reboot, the victim still knows its history is
/// missing: it asks for a transfer, is refused by the serve gate (as a
/// solo primary over the same disk) and acknowledges nothing.
fn assert_still_missing_after_tail_and_reboot(mut c: Cluster, victim: u8, what: &str) {
    let fs = c.fss[usize::from(victim)].clone();
    let op_before = c.replica(victim).replica().commit_min().0;
    // The tail: the group commits; the victim's transfer timer runs out,
    // it repairs and applies above the install (and records the applied
    // point unless the record is still not durable).
    // Within the peers' retention (16 ops), past the flush's lag bound (4).
    c.produce(8);
    for _ in 0..5_000 {
        if c.replica(victim).replica().commit_min().0 >= op_before + 6 {
            break;
        }
        c.step();
    }
    assert!(
        c.replica(victim).replica().commit_min().0 > op_before,
        "{what}: the victim never ran the tail"
    );
    fs.clear_faults();
    c.crash(victim);
    c.restart(victim);
    let r = c.replica(victim);
    assert!(
        r.missing_history().is_some(),
        "{what}: rebooted complete with nothing below its frontier"
    );
    assert!(
        r.state_transfer_needed().is_some(),
        "{what}: stopped asking"
    );
    assert!(
        block_on(fs.exists(&record_path())).unwrap(),
        "{what}: no record"
    );
    // No acknowledgements: with the other backup cut off nothing commits.
    for _ in 0..200 {
        c.step();
    }
    let primary = c.primary();
    let other = (0..REPLICAS)
        .find(|r| *r != primary && *r != victim)
        .unwrap();
    let acked_before = c.next_request;
    c.net.isolate(Some(ReplicaId(other)));
    for _ in 0..300 {
        c.client_step(true);
    }
    assert_eq!(c.next_request, acked_before, "{what}: committed through it");
    c.net.isolate(None);
    // The serve gate refuses it as a solo primary over the same disk.
    drop(c.replicas[usize::from(victim)].take());
    let net = InMemoryNetwork::new(3, 1, NetworkFaults::default());
    let mut solo = block_on(Partition::open(
        replica_config(0, 1, 16),
        fs.clone(),
        &pdir(),
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(fs, &pdir()),
    ))
    .unwrap();
    let mut server = OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 4096,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });
    let refused =
        block_on(server.on_request_state_transfer(&mut solo, ReplicaId(1), 77, &FrozenClock));
    assert!(refused.is_err(), "{what}: served an offer: {refused:?}");
}

/// Issue 15 item 2: a converge whose transfer-needed record fails at each
/// of its filesystem calls (open, write, sync, rename of the sibling, the
/// directory sync) keeps the evidence: the record is retried on ticks, and
/// until it is durable the applied point is not recorded past the install,
/// so the marker still matches at boot. Without that, the tail moved the
/// superblock's applied point, boot read the marker as "the old state
/// stands", and the replica came back complete with nothing below its
/// frontier.
#[test]
fn given_transfer_needed_record_failing_at_every_call_when_tail_runs_and_reboots_should_stay_missing()
 {
    use storage::fs::FaultKind;
    let mut hit = std::collections::BTreeSet::new();
    for kind in [
        FaultKind::Open,
        FaultKind::Write,
        FaultKind::Sync,
        FaultKind::Rename,
    ] {
        for nth in 1..=24 {
            let seed = 40;
            let Some((c, victim)) = converged_without_record(seed, |fs| {
                // A rename fault counts the install's own failed rename.
                let nth = if kind == FaultKind::Rename {
                    nth + 1
                } else {
                    nth
                };
                fs.fail_nth(kind, nth, storage::fs::EIO);
            }) else {
                continue;
            };
            hit.insert(format!("{kind:?}"));
            assert_still_missing_after_tail_and_reboot(c, victim, &format!("{kind:?} #{nth}"));
            break;
        }
    }
    assert_eq!(hit.len(), 4, "the scan missed the record's calls: {hit:?}");
    // The record never becomes durable while the tail runs: every rename
    // fails (the tail itself renames nothing).
    let (c, victim) = converged_without_record(41, |fs| {
        for nth in 3..=2_000 {
            fs.fail_nth(storage::fs::FaultKind::Rename, nth, storage::fs::EIO);
        }
    })
    .expect("the rename faults missed the record");
    assert_still_missing_after_tail_and_reboot(c, victim, "every rename failing");
}
