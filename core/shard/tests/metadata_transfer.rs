//! Group 0 catching up by snapshot transfer over the replica bus: a
//! replica held down while more ops committed than its peers retain comes
//! back, pulls the metadata snapshot and client table from a caught-up
//! peer and ends byte-identical to them; a power cut at every filesystem
//! call of the step that installs it boots either the old state or the
//! installed one and converges; hostile transfer frames for group 0 are
//! refused typed and change nothing.
#![allow(clippy::unwrap_used)]

mod harness;

use std::cell::RefCell;
use std::collections::BTreeSet;

use common::simnet::NetworkFaults;
use common::{GroupId, METADATA_GROUP, ReplicaId};
use consensus::header::{CommandHeader, decode_frame, encode_frame};
use consensus::{decode_manifest, encode_manifest};
use futures::executor::block_on;
use harness::{CLUSTER, Cluster, data_dir};
use metadata::{Identifier, MetadataOp, MetadataStore, StoreConfig, TopicConfig, encode_snapshot};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use shard::testing::{Packet, TestEnv};
use shard::{
    FrameRefusal, METADATA_DIR, MetadataDescriptorRefusal, MetadataHost, MetadataReceiveError,
    ShardIndex, shard_dir,
};
use storage::fs::CrashMode;

/// Group 0 keeps this many applied ops for its peers' repair here.
const RETENTION: u64 = 4;
/// Ops committed while the victim is down: well past the retention.
const OPS_WHILE_DOWN: usize = 12;

fn meta(c: &Cluster, r: u8) -> &MetadataHost<TestEnv> {
    c.nodes[usize::from(r)][0]
        .as_ref()
        .expect("replica is up")
        .metadata()
        .expect("shard 0 hosts group 0")
}

fn snapshot_bytes(c: &Cluster, r: u8) -> Vec<u8> {
    encode_snapshot(meta(c, r).state())
}

fn topic(name: &str) -> MetadataOp {
    MetadataOp::CreateTopic {
        stream: Identifier::Name("s".into()),
        name: name.into(),
        partitions_count: 1,
        config: TopicConfig::default(),
        created_at_us: 2,
    }
}

/// Three replicas of one shard; a backup of group 0 loses power, more ops
/// than the peers retain commit without it, and it boots again. Returns
/// the cluster and the victim.
fn lagging_backup_restarted(seed: u64) -> (Cluster, u8) {
    let mut c = Cluster::with_metadata_retention(3, 1, seed, NetworkFaults::default(), RETENTION);
    c.run(100);
    c.submit_metadata(MetadataOp::CreateStream {
        name: "s".into(),
        created_at_us: 1,
    })
    .unwrap();
    // Let every backup apply the stream before the crash: a backup that
    // only holds it in its replica log would apply it after the reboot,
    // and the tests below compare the victim's state with its state at boot.
    for _ in 0..2_000 {
        c.step();
        let applied: BTreeSet<u64> = (0..3)
            .map(|r| meta(&c, r).replica().commit_min().0)
            .collect();
        if applied.len() == 1 {
            break;
        }
    }
    let primary = (0..3)
        .find(|r| meta(&c, *r).replica().is_caught_up_primary())
        .expect("group 0 has a primary");
    let victim = (primary + 1) % 3;
    c.crash(victim, CrashMode::DropAll);
    for i in 0..OPS_WHILE_DOWN {
        c.submit_metadata(topic(&format!("t{i}"))).unwrap();
    }
    c.restart_reconciled(victim);
    (c, victim)
}

fn caught_up(c: &Cluster, victim: u8) -> bool {
    let applied: BTreeSet<u64> = (0..3)
        .map(|r| meta(c, r).replica().commit_min().0)
        .collect();
    let host = meta(c, victim);
    applied.len() == 1 && !host.replica().is_transferring() && !host.transfer().pulling()
}

fn run_until_caught_up(c: &mut Cluster, victim: u8, ticks_max: u64) {
    for _ in 0..ticks_max {
        c.step();
        if meta(c, victim).transfer().stats().installs > 0 && caught_up(c, victim) {
            return;
        }
    }
    panic!(
        "replica {victim} did not catch up: applied {:?}, transfer {:?}, last failure {:?}",
        (0..3)
            .map(|r| meta(c, r).replica().commit_min().0)
            .collect::<Vec<_>>(),
        meta(c, victim).transfer().stats(),
        meta(c, victim).transfer().last_failure(),
    );
}

fn assert_converged(c: &mut Cluster, victim: u8) {
    let bytes: Vec<Vec<u8>> = (0..3).map(|r| snapshot_bytes(c, r)).collect();
    assert_eq!(bytes[victim as usize], bytes[((victim + 1) % 3) as usize]);
    assert_eq!(bytes[0], bytes[1]);
    assert_eq!(bytes[1], bytes[2]);
    // The install's effects created the partition groups the victim missed.
    let want: BTreeSet<GroupId> = meta(c, victim)
        .state()
        .partition_groups()
        .iter()
        .map(|i| i.group)
        .collect();
    c.drain_inboxes();
    let held: BTreeSet<GroupId> = c.nodes[usize::from(victim)][0]
        .as_ref()
        .unwrap()
        .groups()
        .collect();
    assert_eq!(held, want);
    assert_eq!(want.len(), OPS_WHILE_DOWN);
    // The tail goes on by ordinary replication: a new op reaches it too.
    c.submit_metadata(topic("after")).unwrap();
}

#[test]
fn given_group_0_backup_down_past_retention_when_restarted_should_catch_up_by_snapshot_transfer() {
    let (mut c, victim) = lagging_backup_restarted(41);
    let applied_at_boot = meta(&c, victim).replica().commit_min().0;
    assert!(applied_at_boot + RETENTION < meta(&c, (victim + 1) % 3).replica().commit_min().0);
    run_until_caught_up(&mut c, victim, 3_000);
    let stats = meta(&c, victim).transfer().stats();
    assert_eq!(stats.installs, 1, "{stats:?}");
    assert!(stats.bytes_received > 0);
    // The server side counted the offer it handed out.
    let served: u64 = (0..3)
        .filter(|r| *r != victim)
        .map(|r| meta(&c, r).transfer().stats().offers_served)
        .sum();
    assert!(served >= 1);
    assert_converged(&mut c, victim);
    c.run(50);
    let bytes: Vec<Vec<u8>> = (0..3).map(|r| snapshot_bytes(&c, r)).collect();
    assert_eq!(bytes[0], bytes[1]);
    assert_eq!(bytes[1], bytes[2]);
    assert!(meta(&c, victim).state().partition_groups().len() > OPS_WHILE_DOWN);
}

/// The metadata store on replica `r`'s disk, as a reboot would open it.
fn durable_snapshot(c: &Cluster, r: u8) -> Vec<u8> {
    let dir = shard_dir(&data_dir(), ShardIndex(0)).join(METADATA_DIR);
    let config = StoreConfig {
        cluster: CLUSTER,
        ..StoreConfig::default()
    };
    let (store, _) = block_on(MetadataStore::open(&c.fss[usize::from(r)], &dir, config)).unwrap();
    encode_snapshot(store.state())
}

#[test]
fn given_a_power_cut_at_every_call_of_the_install_step_when_rebooted_should_hold_old_or_new_state_and_converge()
 {
    const SEED: u64 = 43;
    // A dry run finds the step that installs, and the states either side.
    let (mut c, victim) = lagging_backup_restarted(SEED);
    let mut steps = 0u64;
    let mut old = snapshot_bytes(&c, victim);
    while meta(&c, victim).transfer().stats().installs == 0 {
        old = snapshot_bytes(&c, victim);
        c.step();
        steps += 1;
        assert!(steps < 3_000, "the dry run never installed");
    }
    let new = snapshot_bytes(&c, victim);
    assert_ne!(old, new);
    drop(c);
    // A cut that fenced group 0 left the old state, or the new one when
    // it fell between the snapshot's rename and the WAL's replacement.
    let (mut saw_old, mut saw_new, mut fenced_old, mut fenced_new) = (0, 0, 0, 0);
    for mode in [CrashMode::DropAll, CrashMode::Seeded] {
        let mut cut = 0u64;
        loop {
            let (mut c, v) = lagging_backup_restarted(SEED);
            assert_eq!(v, victim);
            c.run(steps - 1);
            assert_eq!(snapshot_bytes(&c, victim), old, "the replay diverged");
            c.fss[usize::from(victim)].cut_power_after(cut);
            c.step();
            let host = meta(&c, victim);
            let installed_whole = host.transfer().stats().installs == 1;
            let fenced = host.is_fenced();
            c.crash(victim, mode);
            let durable = durable_snapshot(&c, victim);
            if durable == old {
                saw_old += 1;
                fenced_old += u32::from(fenced);
            } else {
                assert_eq!(
                    durable, new,
                    "cut {cut} ({mode:?}): a state neither old nor installed"
                );
                saw_new += 1;
                fenced_new += u32::from(fenced);
            }
            c.restart_reconciled(victim);
            for _ in 0..4_000 {
                c.step();
                if caught_up(&c, victim) {
                    break;
                }
            }
            assert!(
                caught_up(&c, victim),
                "cut {cut} ({mode:?}): did not converge"
            );
            let bytes: Vec<Vec<u8>> = (0..3).map(|r| snapshot_bytes(&c, r)).collect();
            assert_eq!(bytes[0], bytes[1], "cut {cut} ({mode:?})");
            assert_eq!(bytes[1], bytes[2], "cut {cut} ({mode:?})");
            // Past the install's last call the cut changes nothing it did.
            if installed_whole && !fenced && durable == new {
                break;
            }
            cut += 1;
            assert!(cut < 500, "the install step never completed");
        }
    }
    assert!(saw_old > 0 && saw_new > 0, "old {saw_old}, new {saw_new}");
    assert!(
        fenced_old > 0 && fenced_new > 0,
        "cuts inside the install: {fenced_old} left the old state, {fenced_new} the new"
    );
}

/// Delivers due frames after `tamper` (which may rewrite a packet, or
/// drop it by returning false), then ticks every shard.
fn step_tampered(c: &mut Cluster, tamper: &mut dyn FnMut(&mut Packet) -> bool) {
    for mut p in c.net.deliver() {
        if !tamper(&mut p) {
            continue;
        }
        if let Some(node) = c.nodes[usize::from(p.to.0)][usize::from(p.shard.0)].as_mut() {
            let _ = block_on(node.on_frame(p.from, p.bytes));
        }
    }
    for row in &mut c.nodes {
        for node in row.iter_mut().flatten() {
            block_on(node.on_tick());
        }
    }
    c.drain_inboxes();
    c.clock.advance(harness::TICK);
}

/// Re-encodes a group-0 transfer frame to `victim` after `edit` changed
/// its header or body: sealed and checksummed again, so only the
/// receiver's own checks can catch what changed.
fn reseal(p: &mut Packet, victim: u8, edit: &mut dyn FnMut(&mut CommandHeader, &mut Vec<u8>)) {
    if p.to.0 != victim || consensus::vsr::wire::peek_group(&p.bytes) != Some(METADATA_GROUP) {
        return;
    }
    let Ok(frame) = decode_frame(&p.bytes, u32::MAX) else {
        return;
    };
    let mut header = frame.header;
    let mut body = frame.body.to_vec();
    edit(&mut header.command, &mut body);
    p.bytes = encode_frame(&header, &body).into();
}

/// Runs `tamper` on every frame until the victim's driver records a
/// failed attempt other than a peer's "not now" (a peer that is not a
/// caught-up primary refuses so, and the victim moves on to the primary);
/// returns it. The victim's metadata state never changes.
fn failure_under(
    c: &mut Cluster,
    victim: u8,
    tamper: &mut dyn FnMut(&mut Packet) -> bool,
) -> MetadataReceiveError {
    let before = snapshot_bytes(c, victim);
    let mut failed = meta(c, victim).transfer().stats().attempts_failed;
    for _ in 0..20_000 {
        step_tampered(c, tamper);
        assert_eq!(snapshot_bytes(c, victim), before);
        assert_eq!(meta(c, victim).transfer().stats().installs, 0);
        let transfer = meta(c, victim).transfer();
        if transfer.stats().attempts_failed > failed {
            failed = transfer.stats().attempts_failed;
            let error = transfer.last_failure().unwrap().clone();
            if !error.transient() {
                return error;
            }
        }
    }
    panic!("the tampered transfer never failed");
}

#[test]
fn given_hostile_group_0_transfer_frames_when_received_should_refuse_typed_and_change_nothing() {
    let (mut c, victim) = lagging_backup_restarted(47);
    let before = snapshot_bytes(&c, victim);

    // A manifest entry past its ceiling: refused before a byte is pulled.
    let error = failure_under(&mut c, victim, &mut |p| {
        reseal(p, victim, &mut |h, body| {
            if let CommandHeader::StateTransferTarget(t) = h
                && t.available
            {
                let mut entries = decode_manifest(body).unwrap();
                entries[0].len = shard::METADATA_SNAPSHOT_LEN_MAX + 1;
                *body = encode_manifest(&entries);
            }
        });
        true
    });
    assert!(
        matches!(
            error,
            MetadataReceiveError::Descriptor(MetadataDescriptorRefusal::ArtifactTooLarge {
                index: 0,
                ..
            })
        ),
        "{error:?}"
    );

    // A manifest whose count is past the codec's ceiling (trailer valid).
    let error = failure_under(&mut c, victim, &mut |p| {
        reseal(p, victim, &mut |h, body| {
            if let CommandHeader::StateTransferTarget(t) = h
                && t.available
            {
                let content_len = body.len() - 8;
                body[4..8].copy_from_slice(&(1u32 << 20).to_le_bytes());
                let trailer = xxhash_rust::xxh3::xxh3_64(&body[..content_len]);
                body[content_len..].copy_from_slice(&trailer.to_le_bytes());
            }
        });
        true
    });
    assert!(
        matches!(
            error,
            MetadataReceiveError::Descriptor(MetadataDescriptorRefusal::Manifest(
                consensus::ManifestError::TooManyEntries { .. }
            ))
        ),
        "{error:?}"
    );

    // A third artifact listed.
    let error = failure_under(&mut c, victim, &mut |p| {
        reseal(p, victim, &mut |h, body| {
            if let CommandHeader::StateTransferTarget(t) = h
                && t.available
            {
                let mut entries = decode_manifest(body).unwrap();
                entries.push(entries[1]);
                *body = encode_manifest(&entries);
            }
        });
        true
    });
    assert!(
        matches!(
            error,
            MetadataReceiveError::Descriptor(MetadataDescriptorRefusal::ArtifactCount { count: 3 })
        ),
        "{error:?}"
    );

    // Chunk bytes changed in flight (frame sealed again): the artifact
    // fails its manifest checksum when it completes; nothing installs.
    let error = failure_under(&mut c, victim, &mut |p| {
        reseal(p, victim, &mut |h, body| {
            if matches!(h, CommandHeader::StateChunk(_)) && !body.is_empty() {
                body[0] ^= 0x40;
            }
        });
        true
    });
    assert!(
        matches!(error, MetadataReceiveError::ArtifactChecksum { .. }),
        "{error:?}"
    );
    assert_eq!(snapshot_bytes(&c, victim), before);

    // Random bytes routed to group 0's driver: refused by the codec (or as
    // a stray frame), never a panic, nothing changed.
    let peer = (victim + 1) % 3;
    {
        let cell = RefCell::new(&mut c);
        let mut runner = TestRunner::new(ProptestConfig::with_cases(256));
        runner
            .run(
                &(
                    prop::collection::vec(any::<u8>(), 0..700),
                    22u8..=25,
                    any::<bool>(),
                ),
                |(mut bytes, command, reseal_it)| {
                    let mut c = cell.borrow_mut();
                    if bytes.len() > 160 {
                        bytes[60] = command;
                        let at = if command == 22 { 144 } else { 152 };
                        bytes[at..at + 8].copy_from_slice(&METADATA_GROUP.0.to_le_bytes());
                    }
                    // Half the cases sealed properly, so the driver's own
                    // checks (cluster, sender, session) see them.
                    let bytes = match decode_frame(&bytes, u32::MAX) {
                        Ok(f) if reseal_it => {
                            let mut h = f.header;
                            h.cluster = CLUSTER;
                            h.replica = ReplicaId(peer);
                            encode_frame(&h, f.body)
                        }
                        _ => bytes,
                    };
                    let node = c.nodes[usize::from(victim)][0].as_mut().unwrap();
                    let result = block_on(node.on_frame(ReplicaId(peer), bytes.into()));
                    if let Err(refusal) = &result {
                        prop_assert!(
                            matches!(
                                refusal,
                                FrameRefusal::Transfer(_)
                                    | FrameRefusal::Wire(_)
                                    | FrameRefusal::UnknownGroup { .. }
                            ),
                            "{refusal:?}"
                        );
                    }
                    prop_assert_eq!(snapshot_bytes(&c, victim), before.clone());
                    Ok(())
                },
            )
            .unwrap();
    }
    let refused = meta(&c, victim).transfer().stats().frames_refused;
    assert!(refused > 0);

    // Untampered, the same replica catches up from the same peers.
    run_until_caught_up(&mut c, victim, 60_000);
    assert_converged(&mut c, victim);
}
