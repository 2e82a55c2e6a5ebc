//! The transfer-needed record: a backup whose install a power cut
//! interrupted reboots converged to an empty partition at the offer's
//! frontier, and the durable record keeps it honestly lagging until a
//! completed install clears it: it reports `state_transfer_needed()`,
//! serves no offer, answers polls below its frontier "not available"
//! rather than "empty", and acknowledges nothing, so a group whose other
//! backup is cut off cannot commit through it. (The cluster harness is the
//! one of `tests/install_cluster.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::PathBuf;

use common::ConsumerKind;
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::state_transfer::{
    BuildBudget, OfferServer, OfferServerConfig, PartitionTransferUnavailable, TRANSFER_NEEDED_FILE,
};
use partitions::{
    InMemoryNetwork, NetworkFaults, Partition, PollError, PollRequest, PollingStrategy,
};
use storage::fs::Fs;

mod harness;
use harness::*;

/// Power cuts at every filesystem call of the backup's install until one
/// reboots converged (the install got past its frontier record). Returns
/// the cluster with the rebooted victim and the cut that did it.
fn rebooted_converged(seed: u64) -> (Cluster, u8, u64) {
    for n in 1..300 {
        let (mut c, victim, need) = lagging_backup(seed);
        let input = pull(&mut c, need.peer, victim);
        let fs = c.fss[usize::from(victim)].clone();
        fs.cut_power_after(n);
        let receiver = c.replicas[usize::from(victim)].as_mut().unwrap();
        let result = block_on(receiver.install_partition_state(input));
        c.crash(victim);
        c.restart(victim);
        let r = c.replica(victim);
        // Converged: the only segment is the empty one at the frontier.
        let converged = r.log().segments().count() == 1
            && r.log().next_offset() == r.offset_frontier()
            && r.first_offset() == r.offset_frontier()
            && r.offset_frontier() > 0;
        if converged {
            return (c, victim, n);
        }
        assert!(result.is_err() || n > 1, "cut {n}");
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
    let frontier = r.offset_frontier();
    eprintln!(
        "cut {cut}: converged at frontier {frontier}, op {}",
        r.replica().commit_min()
    );

    // The record is durable and honoured after the reboot.
    assert!(block_on(fs.exists(&record_path())).unwrap(), "no record");
    let missing = r.missing_history().expect("record not honoured at boot");
    assert_eq!(missing.frontier, frontier);
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
            matches!(polled, Err(PollError::HistoryMissing { frontier: f }) if f == frontier),
            "{strategy:?}: {polled:?}"
        );
    }
    // It survives another reboot (the record, not memory, says so).
    c.crash(victim);
    c.restart(victim);
    assert_eq!(
        c.replica(victim).missing_history().map(|m| m.frontier),
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
    c.net.isolate(Some(other));
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
        net.endpoint(0),
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
    let refused = block_on(server.on_request_state_transfer(&mut solo, 1, 77, &FrozenClock));
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
