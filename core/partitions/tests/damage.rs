//! A bit flipped at rest in a sealed segment of one replica of a group:
//! the scrub (or a poll) finds it, nothing of the damaged range is served,
//! the replica leaves every quorum and repairs itself by state transfer
//! from a peer, and all replicas end byte-identical. A healthy group
//! scrubbed for a long time (across a purge) never reports damage.
#![allow(clippy::unwrap_used)]

use futures::executor::block_on;
use partitions::{ClientOp, PollRequest, PollingStrategy};

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
