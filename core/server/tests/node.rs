//! A real replica (shard threads on compio, the real filesystem) driven
//! through its handles: metadata ops create partition groups on their
//! shards, produce and poll go through the groups' shards, and a restart
//! finds everything acknowledged.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use common::{ConsumerKind, GroupId, ReplicaId};
use futures::executor::block_on;
use metadata::{Identifier, MetadataOp, TopicConfig};
use partitions::{PollRequest, PollingStrategy};
use server::node::{Node, NodeConfig};
use shard::{Answer, Call, CallError, MetaError};
use storage::BatchBuilder;

fn config(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        cluster: 0xC1,
        replica: ReplicaId(0),
        replica_count: 1,
        shard_count: 2,
        data_dir: dir.to_path_buf(),
        tick: Duration::from_millis(10),
        client_addr: "127.0.0.1:0".parse().unwrap(),
        client_frame_size_max_bytes: 64 << 20,
        client_limits: server::session::ClientLimits::default(),
        poll_reply_bytes_max: partitions::POLL_REPLY_BYTES_MAX_DEFAULT,
        bus: None,
        rejoin: false,
        metrics: None,
        scrub_bytes_per_sec: 64 * 1024 * 100,
        record_interval: Duration::from_millis(100),
        retained_bytes_per_shard: partitions::RETAINED_BYTES_MAX_DEFAULT,
        heartbeat: Duration::from_millis(500),
        primary_timeout: Duration::from_secs(5),
    }
}

/// Retries `f` while it fails transiently (the group opening its first
/// view), for at most ten seconds.
fn retry<T, E: std::fmt::Debug>(
    mut f: impl FnMut() -> Result<T, E>,
    transient: fn(&E) -> bool,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if transient(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

fn meta_transient(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::Unavailable { .. } | MetaError::NotPrimary { .. }
    )
}

fn call_transient(e: &CallError) -> bool {
    e.transient()
}

fn groups_of_topic(node: &Node) -> Vec<GroupId> {
    block_on(node.handles().meta_query(|state| {
        state
            .partition_groups()
            .iter()
            .map(|i| i.group)
            .collect::<Vec<_>>()
    }))
    .unwrap()
}

fn batch(n: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new(n);
    for i in 0..4u32 {
        b.push(
            (u128::from(n) << 8) | u128::from(i + 1),
            i,
            format!("m{n}-{i}").as_bytes(),
            b"",
        );
    }
    b.build()
}

fn poll_all(node: &Node, g: GroupId) -> Vec<Vec<u8>> {
    let answer = retry(
        || {
            block_on(node.handles().call(
                g,
                Call::Poll(PollRequest {
                    consumer: (ConsumerKind::Consumer, 1),
                    strategy: PollingStrategy::Offset(0),
                    count: 1000,
                    auto_commit: false,
                }),
            ))
        },
        call_transient,
    );
    let Answer::Polled(polled) = answer else {
        panic!("not a poll")
    };
    polled.messages().map(|m| m.payload.to_vec()).collect()
}

#[test]
fn given_a_running_replica_when_topics_are_created_and_written_should_serve_them_across_a_restart()
{
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path()), None).unwrap();
    retry(
        || {
            block_on(node.handles().meta_submit(
                MetadataOp::CreateStream {
                    name: "s".into(),
                    created_at_us: 1,
                },
                0,
            ))
        },
        meta_transient,
    );
    retry(
        || {
            block_on(node.handles().meta_submit(
                MetadataOp::CreateTopic {
                    stream: Identifier::Name("s".into()),
                    name: "t".into(),
                    partitions_count: 4,
                    config: TopicConfig::default(),
                    created_at_us: 2,
                },
                0,
            ))
        },
        meta_transient,
    );
    let groups = groups_of_topic(&node);
    assert_eq!(groups.len(), 4);
    for (n, g) in groups.iter().enumerate() {
        for b in 0..3 {
            let answer = retry(
                || {
                    block_on(
                        node.handles()
                            .call(*g, Call::produce(batch(n as u64 * 10 + b))),
                    )
                },
                call_transient,
            );
            assert!(matches!(answer, Answer::Committed { .. }));
        }
    }
    let before: Vec<Vec<Vec<u8>>> = groups.iter().map(|g| poll_all(&node, *g)).collect();
    assert!(before.iter().all(|msgs| msgs.len() == 12));
    node.stop();

    let node = Node::start(config(dir.path()), None).unwrap();
    assert_eq!(groups_of_topic(&node), groups);
    let after: Vec<Vec<Vec<u8>>> = groups.iter().map(|g| poll_all(&node, *g)).collect();
    assert_eq!(after, before);
    node.stop();
}

#[test]
fn given_data_directory_of_another_cluster_when_started_should_refuse() {
    let dir = tempfile::tempdir().unwrap();
    Node::start(config(dir.path()), None).unwrap().stop();
    let mut other = config(dir.path());
    other.cluster = 0xC2;
    let err = Node::start(other, None).unwrap_err();
    assert!(err.contains("belongs to cluster"), "{err}");
}
