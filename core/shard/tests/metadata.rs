//! Group 0 hosted on shard 0: metadata ops replicate and their effects
//! create and delete partition groups on the owning shards of every
//! replica, and a restarted replica reconciles its groups with the
//! committed metadata.
#![allow(clippy::unwrap_used)]

mod harness;

use std::collections::BTreeSet;

use common::ConsumerKind;
use common::GroupId;
use common::simnet::NetworkFaults;
use harness::{Cluster, batch};
use metadata::{Identifier, MetadataOp, Outcome, TopicConfig};
use partitions::{PollRequest, PollingStrategy};
use shard::{Answer, Call, CallError, MetaError};
use storage::fs::CrashMode;

fn partition_groups(c: &Cluster, r: u8) -> BTreeSet<GroupId> {
    c.nodes[usize::from(r)]
        .iter()
        .flatten()
        .flat_map(|n| n.groups().collect::<Vec<_>>())
        .collect()
}

fn expected_groups(c: &Cluster, r: u8) -> BTreeSet<GroupId> {
    c.nodes[usize::from(r)][0]
        .as_ref()
        .unwrap()
        .metadata()
        .unwrap()
        .state()
        .partition_groups()
        .iter()
        .map(|i| i.group)
        .collect()
}

/// Creates stream `stream` with topic `t` of `partitions` partitions
/// through group 0, runs `settle` ticks, and returns the topic's groups.
fn create_topic(c: &mut Cluster, stream: &str, partitions: u32, settle: u64) -> BTreeSet<GroupId> {
    c.submit_metadata(MetadataOp::CreateStream {
        name: stream.into(),
        created_at_us: 1,
    })
    .unwrap();
    c.submit_metadata(MetadataOp::CreateTopic {
        stream: Identifier::Name(stream.into()),
        name: "t".into(),
        partitions_count: partitions,
        config: TopicConfig::default(),
        created_at_us: 2,
    })
    .unwrap();
    c.run(settle);
    let groups = expected_groups(c, 0);
    assert_eq!(groups.len(), partitions as usize);
    groups
}

#[test]
fn given_topic_created_when_committed_should_create_its_groups_on_every_replica() {
    let mut c = Cluster::new(3, 2, 21, NetworkFaults::default());
    c.run(100);
    let stream = c
        .submit_metadata(MetadataOp::CreateStream {
            name: "orders".into(),
            created_at_us: 1,
        })
        .unwrap();
    assert!(matches!(stream, Outcome::StreamCreated(_)));
    let duplicate = c.submit_metadata(MetadataOp::CreateStream {
        name: "orders".into(),
        created_at_us: 2,
    });
    assert!(
        matches!(duplicate, Err(MetaError::Refused(_))),
        "{duplicate:?}"
    );
    let topic = c
        .submit_metadata(MetadataOp::CreateTopic {
            stream: Identifier::Name("orders".into()),
            name: "eu".into(),
            partitions_count: 6,
            config: TopicConfig::default(),
            created_at_us: 3,
        })
        .unwrap();
    assert!(matches!(topic, Outcome::TopicCreated(..)));
    c.run(50);
    let expected = expected_groups(&c, 0);
    assert_eq!(expected.len(), 6);
    for r in 0..3 {
        assert_eq!(expected_groups(&c, r), expected, "replica {r} metadata");
        assert_eq!(partition_groups(&c, r), expected, "replica {r} groups");
    }
    // The groups serve.
    for g in &expected {
        let answer = c
            .call_until_done(*g, Call::produce(batch(g.0, 3)), 2000)
            .unwrap();
        assert!(matches!(answer, Answer::Committed { .. }));
    }
    // Deleting the stream deletes them everywhere, and a restart brings
    // none back.
    c.submit_metadata(MetadataOp::DeleteStream {
        stream: Identifier::Name("orders".into()),
    })
    .unwrap();
    c.run(50);
    for r in 0..3 {
        assert!(partition_groups(&c, r).is_empty(), "replica {r}");
    }
    c.crash(1, CrashMode::DropAll);
    c.restart_reconciled(1);
    c.run(50);
    assert!(partition_groups(&c, 1).is_empty());
}

#[test]
fn given_replica_down_while_topic_created_when_restarted_should_reconcile_its_groups() {
    let mut c = Cluster::new(3, 2, 22, NetworkFaults::default());
    c.run(100);
    c.crash(0, CrashMode::DropAll);
    c.submit_metadata(MetadataOp::CreateStream {
        name: "s".into(),
        created_at_us: 1,
    })
    .unwrap();
    c.submit_metadata(MetadataOp::CreateTopic {
        stream: Identifier::Name("s".into()),
        name: "t".into(),
        partitions_count: 4,
        config: TopicConfig::default(),
        created_at_us: 2,
    })
    .unwrap();
    c.restart_reconciled(0);
    // Repair brings group 0's ops; their effects create the groups.
    c.run(400);
    let expected = expected_groups(&c, 1);
    assert_eq!(expected.len(), 4);
    assert_eq!(expected_groups(&c, 0), expected);
    assert_eq!(partition_groups(&c, 0), expected);
}

/// The purge generation each replica's transfer driver of `group` knows.
fn known_purge_generation(c: &Cluster, r: u8, group: GroupId) -> Option<u64> {
    c.nodes[usize::from(r)]
        .iter()
        .flatten()
        .find_map(|n| n.driver(group))
        .and_then(|d| d.committed_purge_generation())
}

#[test]
fn given_a_committed_purge_when_applied_and_after_a_restart_should_reach_every_transfer_driver() {
    let mut c = Cluster::new(3, 2, 23, NetworkFaults::default());
    c.run(100);
    let groups = create_topic(&mut c, "p", 3, 50);
    for g in &groups {
        for r in 0..3 {
            assert_eq!(known_purge_generation(&c, r, *g), None, "before any purge");
        }
    }
    c.submit_metadata(MetadataOp::PurgeTopic {
        stream: Identifier::Name("p".into()),
        topic: Identifier::Name("t".into()),
    })
    .unwrap();
    c.run(50);
    let committed: Vec<(GroupId, u64)> = c.nodes[0][0]
        .as_ref()
        .unwrap()
        .metadata()
        .unwrap()
        .state()
        .partition_groups()
        .iter()
        .map(|i| (i.group, i.purge_generation))
        .collect();
    for (g, generation) in &committed {
        assert!(*generation > 0);
        for r in 0..3 {
            assert_eq!(
                known_purge_generation(&c, r, *g),
                Some(*generation),
                "replica {r} group {}",
                g.0
            );
        }
    }
    // A restart learns it again from the committed metadata.
    c.crash(2, CrashMode::DropAll);
    c.restart_reconciled(2);
    c.run(100);
    for (g, generation) in &committed {
        assert_eq!(known_purge_generation(&c, 2, *g), Some(*generation));
    }
}

/// The generation each replica's copy of `group` applied.
fn applied_purge_generation(c: &Cluster, r: u8, group: GroupId) -> Option<u64> {
    c.nodes[usize::from(r)]
        .iter()
        .flatten()
        .find_map(|n| n.partition(group))
        .map(|p| p.purge_generation())
}

/// A purge is proposed to a partition group by whichever replica is its
/// primary when group 0's effect is applied. With that primary down, the
/// other replicas' proposals are refused as not primary; the group's next
/// primary must propose the committed generation itself, or the topic is
/// never purged although the client was told it was.
#[test]
fn given_a_purge_committed_while_a_partitions_primary_is_down_should_be_applied_by_its_next_primary()
 {
    let mut c = Cluster::new(3, 2, 24, NetworkFaults::default());
    c.run(100);
    let groups = create_topic(&mut c, "q", 3, 100);
    let first = *groups.iter().next().expect("a group");
    let down = c.primary(first).expect("a primary").0;
    c.crash(down, CrashMode::DropAll);
    c.submit_metadata(MetadataOp::PurgeTopic {
        stream: Identifier::Name("q".into()),
        topic: Identifier::Name("t".into()),
    })
    .unwrap();
    // The survivors elect a new primary for the groups `down` led.
    c.run(1_500);
    let up: Vec<u8> = (0..3).filter(|r| *r != down).collect();
    for g in &groups {
        for &r in &up {
            assert_eq!(
                applied_purge_generation(&c, r, *g),
                known_purge_generation(&c, r, *g),
                "replica {r} group {}",
                g.0
            );
            assert!(applied_purge_generation(&c, r, *g).is_some_and(|a| a > 0));
        }
    }
    c.restart_reconciled(down);
    c.run(1_000);
    for g in &groups {
        assert_eq!(
            applied_purge_generation(&c, down, *g),
            known_purge_generation(&c, down, *g),
            "the restarted replica, group {}",
            g.0
        );
    }
}

/// A primary that knows of a committed purge its partition has not
/// applied refuses every call that reads or writes messages or offsets
/// (transiently, so the caller retries) until the purge has applied: a
/// poll would serve purged messages and a produce would be erased by the
/// purge once acknowledged. It proposes the purge ahead of waiting calls
/// and serves again once it applied.
#[test]
fn given_a_primary_owing_a_committed_purge_when_called_should_refuse_data_calls_until_applied() {
    let mut c = Cluster::new(3, 2, 27, NetworkFaults::default());
    c.run(100);
    let groups = create_topic(&mut c, "w", 1, 100);
    let g = *groups.iter().next().expect("a group");
    c.call_until_done(g, Call::produce(batch(1, 3)), 2_000)
        .unwrap();
    let primary = c.primary(g).expect("a primary");
    // Group 0's effect reaching the primary: the purge is committed, its
    // partition op not yet proposed.
    c.node(primary.0, g).learn_purge_generation(g, 1);
    let poll = Call::Poll(PollRequest {
        consumer: (ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::First,
        count: 10,
        auto_commit: false,
    });
    let offsets = Call::GetOffset {
        kind: ConsumerKind::Consumer,
        id: 1,
    };
    for call in [poll.clone(), Call::produce(batch(2, 1)), offsets] {
        let mut pending = c.send(primary, g, call.clone());
        match pending.rx.try_recv() {
            Ok(Some(Err(e @ CallError::Unavailable { .. }))) => assert!(e.transient()),
            other => panic!("{} while owing a purge answered {other:?}", call.name()),
        }
    }
    // The counters are no data call.
    let mut stats = c.send(primary, g, Call::Stats);
    assert!(matches!(
        stats.rx.try_recv(),
        Ok(Some(Ok(Answer::Stats(_))))
    ));
    c.run(200);
    assert_eq!(applied_purge_generation(&c, primary.0, g), Some(1));
    let Answer::Polled(polled) = c.call_until_done(g, poll, 2_000).unwrap() else {
        panic!("a poll answers Polled");
    };
    assert_eq!(polled.count, 0, "the purge applied");
    c.call_until_done(g, Call::produce(batch(3, 2)), 2_000)
        .unwrap();
}

/// The bytes of `group`'s sealed segments on replica `r` (every log file
/// but the newest), and the base offset of its oldest one.
fn sealed_bytes_and_start(c: &Cluster, r: u8, group: GroupId) -> (u64, u64) {
    let logs: Vec<(String, usize)> = c
        .segment_files(r, group)
        .into_iter()
        .filter(|(name, _)| name.ends_with(".log"))
        .map(|(name, bytes)| (name, bytes.len()))
        .collect();
    let start = logs
        .first()
        .and_then(|(name, _)| name.trim_end_matches(".log").parse().ok())
        .unwrap_or(0);
    let sealed = logs[..logs.len().saturating_sub(1)]
        .iter()
        .map(|(_, len)| *len as u64)
        .sum();
    (sealed, start)
}

/// Retention by size (Iggy's `max_topic_size`): the topic's ceiling is
/// shared by its partitions, each replica's retention keeps every
/// partition's sealed segments within its share, and an update of the
/// topic reaches the existing partitions, on disk too (a restarted replica
/// keeps it).
#[test]
fn given_a_topic_size_ceiling_when_partitions_fill_should_keep_each_within_its_share_and_follow_updates()
 {
    use metadata::{MaxTopicSize, MessageExpiry};
    let mut c = Cluster::new(3, 2, 26, NetworkFaults::default());
    c.run(100);
    c.submit_metadata(MetadataOp::CreateStream {
        name: "r".into(),
        created_at_us: 1,
    })
    .unwrap();
    let share = 8_192u64;
    let sized = TopicConfig {
        segment_size_bytes: 4_096,
        max_topic_size: MaxTopicSize::Bytes { bytes: 2 * share },
        ..TopicConfig::default()
    };
    c.submit_metadata(MetadataOp::CreateTopic {
        stream: Identifier::Name("r".into()),
        name: "t".into(),
        partitions_count: 2,
        config: sized,
        created_at_us: 2,
    })
    .unwrap();
    c.run(50);
    let groups = expected_groups(&c, 0);
    assert_eq!(groups.len(), 2);
    for (i, g) in groups.iter().enumerate() {
        for n in 0..80u64 {
            c.call_until_done(
                *g,
                Call::produce(batch(1_000 * (i as u64 + 1) + n, 5)),
                2_000,
            )
            .unwrap();
        }
    }
    // Past two retention passes on every replica.
    c.run(250);
    for g in &groups {
        for r in 0..3 {
            assert_eq!(c.spec_on_disk(r, *g).unwrap().retained_bytes_max, share);
            let (sealed, start) = sealed_bytes_and_start(&c, r, *g);
            assert!(
                sealed <= share,
                "replica {r} group {}: {sealed} sealed bytes over its share of {share}",
                g.0
            );
            // It removed only what it had to: one more segment would
            // have fitted under the share only past it.
            assert!(sealed + 4_096 + 1_024 > share, "replica {r}: {sealed} kept");
            assert!(start > 0, "replica {r} group {}: nothing removed", g.0);
        }
    }
    // The topic's update reaches the existing groups, and survives a
    // restart.
    c.submit_metadata(MetadataOp::UpdateTopic {
        stream: Identifier::Name("r".into()),
        topic: Identifier::Name("t".into()),
        name: "t".into(),
        config: TopicConfig {
            max_topic_size: MaxTopicSize::Unlimited,
            message_expiry: MessageExpiry::After { micros: 7_000_000 },
            ..sized
        },
    })
    .unwrap();
    c.run(20);
    c.crash(1, CrashMode::KeepAll);
    c.restart_reconciled(1);
    c.run(20);
    for g in &groups {
        for r in 0..3 {
            let spec = c.spec_on_disk(r, *g).unwrap();
            assert_eq!(
                (spec.retained_bytes_max, spec.message_expiry_us),
                (0, 7_000_000),
                "replica {r} group {}",
                g.0
            );
        }
    }
}

/// The path of replica `r`'s metadata WAL.
fn metadata_wal(r: u8) -> std::path::PathBuf {
    let _ = r;
    shard::shard_dir(&harness::data_dir(), shard::ShardIndex(0))
        .join(shard::METADATA_DIR)
        .join(metadata::WAL_FILE)
}

/// A bit flipped inside group 0's WAL on one replica of three (found at
/// boot as interior damage): the replica sets the store aside, restarts
/// group 0 from nothing and takes the state from its peers, and deletes
/// none of its partition groups meanwhile (its metadata names none of
/// them until it has caught up). A single replica with the same damage
/// refuses to boot, naming it.
#[test]
fn given_a_flipped_bit_in_one_replicas_metadata_wal_when_rebooted_should_repair_from_peers_and_keep_its_groups()
 {
    let mut c = Cluster::new(3, 2, 27, NetworkFaults::default());
    c.run(100);
    let groups = create_topic(&mut c, "rot", 3, 50);
    for g in &groups {
        c.call_until_done(*g, Call::produce(batch(g.0, 3)), 2_000)
            .unwrap();
    }
    c.run(50);
    let victim = 2u8;
    c.crash(victim, CrashMode::KeepAll);
    let wal = metadata_wal(victim);
    let fs = &c.fss[usize::from(victim)];
    let len = fs.contents(&wal).unwrap().len() as u64;
    assert!(len > 600, "the WAL holds several ops ({len} bytes)");
    // Inside the first entry's body: a later entry still verifies.
    fs.rot_byte(&wal, 300, 0x10).unwrap();
    c.restart_reconciled(victim);
    let aside = wal
        .parent()
        .unwrap()
        .join(format!("{}0", metadata::DAMAGED_PREFIX))
        .join(metadata::WAL_FILE);
    assert!(
        c.fss[usize::from(victim)].contents(&aside).is_ok(),
        "the damaged WAL is kept aside"
    );
    assert!(
        c.nodes[usize::from(victim)][0]
            .as_ref()
            .unwrap()
            .metadata()
            .unwrap()
            .recovering_from_damage()
    );
    assert_eq!(
        partition_groups(&c, victim),
        groups,
        "groups kept while group 0 repairs"
    );
    // A reboot before it caught up finds an empty store and goes on
    // recovering (the marker is durable): still nothing deleted.
    let marker = wal.parent().unwrap().join(metadata::DAMAGE_RECOVERY_FILE);
    c.crash(victim, CrashMode::DropAll);
    c.restart_reconciled(victim);
    assert_eq!(
        partition_groups(&c, victim),
        groups,
        "groups kept after a reboot mid-recovery"
    );
    c.run(400);
    assert!(
        c.fss[usize::from(victim)].contents(&marker).is_err(),
        "the recovery marker is removed once caught up"
    );
    assert_eq!(expected_groups(&c, victim), groups, "group 0 caught up");
    assert_eq!(partition_groups(&c, victim), groups);
    let node = c.nodes[usize::from(victim)][0].as_ref().unwrap();
    assert!(!node.metadata().unwrap().recovering_from_damage());
    // It counts again: with the third replica down, a new op commits
    // only with it.
    c.crash(1, CrashMode::KeepAll);
    c.submit_metadata(MetadataOp::CreateStream {
        name: "after".into(),
        created_at_us: 9,
    })
    .unwrap();
    c.restart_reconciled(1);

    let mut single = Cluster::new(1, 1, 28, NetworkFaults::default());
    single.run(20);
    create_topic(&mut single, "rot", 1, 20);
    single.crash(0, CrashMode::KeepAll);
    single.fss[0].rot_byte(&metadata_wal(0), 300, 0x10).unwrap();
    let Err(refused) = single.try_boot(0, 0) else {
        panic!("a single replica booted over a damaged metadata WAL");
    };
    assert!(refused.to_string().contains("metadata"), "{refused}");
}
