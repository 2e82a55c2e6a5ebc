//! Shards of three replicas hosting many partition groups, in process:
//! produce to all of them, crash and restart a replica, group lifecycle.
#![allow(clippy::unwrap_used)]

mod harness;

use common::{ConsumerKind, GroupId, Offset, ReplicaId};
use futures::executor::block_on;
use harness::{Cluster, batch};
use partitions::{NetworkFaults, PollRequest, PollingStrategy};
use shard::{Answer, Call, CallError};
use storage::fs::CrashMode;

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
        pending.push(c.send(
            primary,
            g,
            Call::Produce {
                batch: batch(round * 1000 + n, 5),
            },
        ));
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
            .call_until_done(
                g,
                Call::Produce {
                    batch: batch(round * 1000 + g.0 % 1000, 5),
                },
                3000,
            )
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

#[test]
fn given_stored_offset_when_read_back_should_answer_it_from_the_primary() {
    let mut c = Cluster::new(3, 1, 3, NetworkFaults::default());
    let g = group(5);
    c.create_everywhere(g);
    c.run(100);
    c.call_until_done(
        g,
        Call::Produce {
            batch: batch(1, 10),
        },
        2000,
    )
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

#[test]
fn given_unknown_group_when_called_should_answer_unknown_group() {
    let mut c = Cluster::new(1, 1, 1, NetworkFaults::default());
    let mut p = c.send(ReplicaId(0), group(3), Call::Stats);
    assert_eq!(
        p.rx.try_recv().unwrap().unwrap(),
        Err(CallError::UnknownGroup { group: group(3) })
    );
}
