//! The official `iggy` 0.11.0 SDK against a three-replica `replog`
//! cluster on loopback, each replica its own process with a roster file,
//! ports chosen free at run time, every wait bounded.
//!
//! - The low-level flow with the client connected to each replica in
//!   turn (a backup forwards to the primary over the replica bus).
//! - The high-level producer and consumer flows, each through another
//!   replica.
//! - `kill -9` of a backup and then of the primary in the middle of a
//!   produce loop through a third replica: every acknowledged message is read back, in order;
//!   the restarted replicas catch up and their segment files end
//!   byte-identical to their peers'.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use iggy::prelude::*;

mod support;
use support::cluster::{Cluster, await_identical_segments, free_ports, poll_all, transient};
use support::process::Replog;
use support::sdk_flows::{self, bounded, logged_in, runtime};

/// Purge rounds of the low-level flow, on each replica.
const PURGE_ROUNDS: u32 = 4;

fn id(name: &str) -> Identifier {
    Identifier::named(name).unwrap()
}

/// Evaluates the call until it does not fail transiently (no primary yet,
/// a view change, an op not yet known committed), for at most 30 s.
macro_rules! retried {
    ($what:expr, $call:expr) => {{
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match $call.await {
                Ok(v) => break v,
                Err(e) if transient(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{}: {e:?} (code {})", $what, e.as_code()),
            }
        }
    }};
}

#[test]
fn given_a_cluster_of_three_when_the_sdk_runs_the_low_level_flow_on_each_replica_should_get_back_what_it_sent()
 {
    let cluster = Cluster::start(|_| {});
    let rt = runtime();
    for (i, addr) in cluster.clients.clone().into_iter().enumerate() {
        rt.block_on(bounded("low-level flow on a replica", async move {
            let client = logged_in(addr).await;
            client.ping().await.unwrap();
            let nodes = client.get_cluster_metadata().await.unwrap().nodes;
            assert_eq!(nodes.len(), 1, "the connected replica is the one leader");
            assert_eq!(nodes[0].endpoints.tcp, addr.port(), "{nodes:?}");
            let stream = format!("orders-{i}");
            retried!("create stream", client.create_stream(&stream));
            let err = client.create_stream(&stream).await.unwrap_err();
            assert_eq!(err.as_code(), 1012, "{err:?}");
            let options = TopicCreateOptions {
                partitions_count: Some(3),
                ..TopicCreateOptions::default()
            };
            let topic = retried!(
                "create topic",
                client.create_topic(&id(&stream), "eu", &options)
            );
            assert_eq!(topic.partitions_count, 3);
            let texts: Vec<String> = (0..10).map(|n| format!("r{i}-m{n}")).collect();
            let mut messages: Vec<IggyMessage> = texts
                .iter()
                .map(|t| IggyMessage::from_str(t).unwrap())
                .collect();
            retried!(
                "send",
                client.send_messages(
                    &id(&stream),
                    &id("eu"),
                    &Partitioning::partition_id(1),
                    &mut messages,
                )
            );
            let got = poll_all(&client, &stream, "eu", 1).await;
            let expected: Vec<(u64, String)> = texts
                .iter()
                .enumerate()
                .map(|(n, t)| (n as u64, t.clone()))
                .collect();
            assert_eq!(got, expected, "through replica {i}");
            let consumer = Consumer::new(Identifier::numeric(7).unwrap());
            retried!(
                "store offset",
                client.store_consumer_offset(&consumer, &id(&stream), &id("eu"), Some(1), 4)
            );
            let offset = retried!(
                "get offset",
                client.get_consumer_offset(&consumer, &id(&stream), &id("eu"), Some(1))
            )
            .unwrap();
            assert_eq!(offset.stored_offset, 4);
            let next = retried!(
                "poll next",
                client.poll_messages(
                    &id(&stream),
                    &id("eu"),
                    Some(1),
                    &consumer,
                    &PollingStrategy::next(),
                    3,
                    true,
                )
            );
            let offsets: Vec<u64> = next.messages.iter().map(|m| m.header.offset).collect();
            assert_eq!(offsets, vec![5, 6, 7], "through replica {i}");
            let err = client
                .send_messages(
                    &id(&stream),
                    &id("eu"),
                    &Partitioning::partition_id(9),
                    &mut [IggyMessage::from_str("x").unwrap()],
                )
                .await
                .unwrap_err();
            assert_eq!(err.as_code(), 3007, "{err:?}");

            // A purge is answered once every partition has applied it: a
            // poll right after finds nothing, and a produce sent right
            // after is not erased by it. Several rounds, because which
            // replica applies the purge first is a race.
            for round in 0..PURGE_ROUNDS {
                for partition in 0..3 {
                    retried!(
                        "send before the purge",
                        client.send_messages(
                            &id(&stream),
                            &id("eu"),
                            &Partitioning::partition_id(partition),
                            &mut [IggyMessage::from_str("before").unwrap()],
                        )
                    );
                }
                retried!("purge topic", client.purge_topic(&id(&stream), &id("eu")));
                for partition in 0..3 {
                    let left = poll_all(&client, &stream, "eu", partition).await;
                    assert_eq!(
                        left,
                        Vec::new(),
                        "round {round}, partition {partition}, replica {i}"
                    );
                }
                let after = format!("after-{round}");
                let partition = round % 3;
                retried!(
                    "send after the purge",
                    client.send_messages(
                        &id(&stream),
                        &id("eu"),
                        &Partitioning::partition_id(partition),
                        &mut [IggyMessage::from_str(&after).unwrap()],
                    )
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                let kept = poll_all(&client, &stream, "eu", partition).await;
                assert_eq!(kept, vec![(0, after)], "round {round}, replica {i}");
            }
            retried!("purge stream", client.purge_stream(&id(&stream)));
            let left = poll_all(&client, &stream, "eu", 1).await;
            assert_eq!(left, Vec::new(), "stream purge through replica {i}");
        }));
    }
    cluster.stop();
}

#[test]
fn given_a_cluster_of_three_when_producers_and_consumers_use_each_replica_should_deliver_every_message_once()
 {
    let cluster = Cluster::start(|_| {});
    let rt = runtime();
    let [a, b, c] = [cluster.clients[0], cluster.clients[1], cluster.clients[2]];
    rt.block_on(bounded("high-level flows across replicas", async move {
        drop(logged_in(a).await);
        sdk_flows::producer_into_consumer_group(b).await;
        sdk_flows::key_partitioning_into_group_of_three(c).await;
        sdk_flows::standalone_consumer_resumes_after_auto_commit(a).await;
    }));
    cluster.stop();
}

/// Logs in at `addr` and creates stream "load" with the one-partition
/// topic "t" (`options` but for the partition count), retrying transient
/// failures; returns the client.
async fn load_topic(addr: SocketAddr, options: TopicCreateOptions) -> IggyClient {
    let client = logged_in(addr).await;
    retried!("create stream", client.create_stream("load"));
    let options = TopicCreateOptions {
        partitions_count: Some(1),
        ..options
    };
    retried!(
        "create topic",
        client.create_topic(&id("load"), "t", &options)
    );
    client
}

/// What a test's produce loop into "load"/"t" sent so far: the texts
/// acknowledged with their offsets, in order, and every text attempted.
#[derive(Debug, Default)]
struct Produced {
    acked: Vec<(String, u64)>,
    attempted: Vec<String>,
}

impl Produced {
    /// Sends `texts` one message at a time to partition 0, retrying
    /// transient failures, and keeps what was acknowledged and attempted;
    /// returns how many sends failed transiently.
    async fn send(&mut self, client: &IggyClient, texts: &[String]) -> u64 {
        let mut transients = 0;
        for text in texts {
            self.attempted.push(text.clone());
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let mut batch = [IggyMessage::from_str(text).unwrap()];
                match client
                    .send_messages(
                        &id("load"),
                        &id("t"),
                        &Partitioning::partition_id(0),
                        &mut batch,
                    )
                    .await
                {
                    Ok(response) => {
                        let confirmation = response
                            .confirmations
                            .first()
                            .unwrap_or_else(|| panic!("{text}: no confirmation"));
                        self.acked.push((text.clone(), confirmation.base_offset));
                        break;
                    }
                    Err(e) if transient(&e) && Instant::now() < deadline => {
                        transients += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("send {text}: {e:?} (code {})", e.as_code()),
                }
            }
        }
        transients
    }

    /// [`Produced::send`] on `rt`, bounded in time.
    fn range(
        &mut self,
        rt: &tokio::runtime::Runtime,
        client: &IggyClient,
        texts: &[String],
    ) -> u64 {
        rt.block_on(bounded("produce", self.send(client, texts)))
    }
}

/// Every acknowledged text is read back at the offset its confirmation
/// named, in the order acknowledged; nothing read was never sent;
/// offsets are dense.
fn check_read_back(read: &[(u64, String)], acked: &[(String, u64)], attempted: &[String]) {
    for (n, (offset, _)) in read.iter().enumerate() {
        assert_eq!(*offset, n as u64, "offsets are dense");
    }
    let attempted: std::collections::BTreeSet<&String> = attempted.iter().collect();
    for (_, text) in read {
        assert!(attempted.contains(text), "{text} was read but never sent");
    }
    let mut last = None;
    for (text, offset) in acked {
        let held = read.get(usize::try_from(*offset).unwrap()).map(|(_, t)| t);
        assert_eq!(
            held,
            Some(text),
            "offset {offset} holds what its confirmation named"
        );
        assert!(last < Some(*offset), "{text} is out of order");
        last = Some(*offset);
    }
}

/// What retention left is the tail of what was acknowledged: offsets
/// dense from the first held, nothing read that was never sent, and every
/// acknowledged message from the first one held to the last, in order.
fn check_tail(read: &[(u64, String)], acked: &[(String, u64)], attempted: &[String]) {
    let first = read
        .first()
        .map(|(o, _)| *o)
        .expect("the active segment is never expired");
    for (n, (offset, _)) in read.iter().enumerate() {
        assert_eq!(*offset, first + n as u64, "offsets are dense");
    }
    let attempted: std::collections::BTreeSet<&String> = attempted.iter().collect();
    for (_, text) in read {
        assert!(attempted.contains(text), "{text} was read but never sent");
    }
    let last = read.last().map(|(o, _)| *o).unwrap_or(first);
    let tail: Vec<&(String, u64)> = acked.iter().filter(|(_, o)| *o >= first).collect();
    assert!(
        !tail.is_empty(),
        "the newest acknowledged messages are held"
    );
    for (text, offset) in tail {
        assert!(*offset <= last, "{text} at {offset} is past the end {last}");
        let held = &read[usize::try_from(offset - first).unwrap()].1;
        assert_eq!(
            held, text,
            "offset {offset} holds what its confirmation named"
        );
    }
}

#[test]
fn given_a_produce_loop_when_a_backup_and_then_the_primary_are_killed_should_lose_nothing_acknowledged()
 {
    let mut cluster = Cluster::start_logging(|_| {}, Some("warn,shard::shard=info"));
    let rt = runtime();
    // The topic's one partition is group 1, the first the metadata
    // creates; in view 0 the primary of group g is replica g mod 3, so
    // replica 1 is its primary and 0 and 2 are backups. The client talks
    // to replica 0, which forwards every send.
    let via = cluster.clients[0];
    let texts = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|n| format!("load-{n:05}")).collect()
    };
    let client = rt.block_on(bounded(
        "set up",
        load_topic(via, TopicCreateOptions::default()),
    ));
    let mut produced = Produced::default();
    let mut run = |cluster_step: &mut dyn FnMut(), range: Vec<String>| -> u64 {
        let (half_a, half_b) = range.split_at(range.len() / 2);
        let before = produced.range(&rt, &client, half_a);
        cluster_step();
        before + produced.range(&rt, &client, half_b)
    };
    // Kill the backup replica 2 mid-loop (it is also group 0's primary),
    // then restart it.
    let backup_kill = run(&mut || cluster.kill9(2), texts(0, 200));
    cluster.start_replica(2);
    run(&mut || {}, texts(200, 300));
    // A restarted replica counts as faulty until it has caught up (its
    // prepare journal is in memory, so it may not vote before it learns
    // the view's log from the primary): wait for that before the next
    // failure, or the cluster would be asked to survive two at once.
    await_identical_segments(&cluster);
    // Kill the primary, replica 1, mid-loop: the client, connected to
    // replica 0, goes on once a new primary is elected.
    let primary_kill = run(&mut || cluster.kill9(1), texts(300, 500));
    let moved = cluster.nodes[0]
        .as_ref()
        .is_some_and(|n| n.logged("group view changed group=1 "));
    assert!(moved, "group 1 changed view when its primary died");
    cluster.start_replica(1);
    run(&mut || {}, texts(500, 600));
    println!(
        "failures the SDK did not retry away: {backup_kill} with a backup down, {primary_kill} across the primary's death"
    );
    let read = rt.block_on(bounded("read back", poll_all(&client, "load", "t", 0)));
    check_read_back(&read, &produced.acked, &produced.attempted);
    assert_eq!(produced.acked.len(), 600);
    let segments = await_identical_segments(&cluster);
    let bytes: usize = segments.values().map(Vec::len).sum();
    println!(
        "{} acknowledged, {} read, {} segment files of {bytes} bytes identical on every replica",
        produced.acked.len(),
        read.len(),
        segments.len()
    );
    drop(client);
    cluster.stop();
}

/// A topic purged right after its partition's primary died: group 0
/// commits the purge at once, and the answer waits (the backend asks the
/// partition again) until the group's new primary has carried it out, so
/// the client is told it is done, not asked to retry (the SDK retries a
/// request answered 57/58 by itself, and each retry purged again). A poll right
/// after reads nothing and a produce right after is kept.
#[test]
fn given_a_partitions_primary_killed_when_its_topic_is_purged_should_answer_once_the_next_primary_applied_it()
 {
    let mut cluster = Cluster::start_logging(
        |_| {},
        Some("warn,shard::shard=info,partitions::purge=info"),
    );
    let rt = runtime();
    // As in the kill test above: the partition is group 1, whose view-0
    // primary is replica 1; the client talks to replica 0.
    let client = rt.block_on(bounded(
        "set up",
        load_topic(cluster.clients[0], TopicCreateOptions::default()),
    ));
    let texts: Vec<String> = (0..20).map(|n| format!("old-{n}")).collect();
    Produced::default().range(&rt, &client, &texts);
    cluster.kill9(1);
    rt.block_on(bounded("purge across the view change", async {
        let started = Instant::now();
        if let Err(e) = client.purge_topic(&id("load"), &id("t")).await {
            panic!(
                "purge answered {e:?} (code {}) after {:?}",
                e.as_code(),
                started.elapsed()
            );
        }
        println!("purge answered after {:?}", started.elapsed());
        assert_eq!(poll_all(&client, "load", "t", 0).await, Vec::new());
        retried!(
            "send after the purge",
            client.send_messages(
                &id("load"),
                &id("t"),
                &Partitioning::partition_id(0),
                &mut [IggyMessage::from_str("new").unwrap()],
            )
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            poll_all(&client, "load", "t", 0).await,
            vec![(0, "new".to_owned())]
        );
    }));
    let moved = cluster.nodes[0]
        .as_ref()
        .is_some_and(|n| n.logged("group view changed group=1 "));
    assert!(moved, "group 1 changed view when its primary died");
    // One purge, not one per retry: the SDK sends a request answered
    // 57/58 again, and each would have been a purge of its own.
    for r in [0, 2] {
        let node = cluster.nodes[r].as_ref().unwrap();
        let purges = node.log_lines("purging partition");
        assert!(!purges.is_empty(), "replica {r} purged");
        for line in purges {
            assert!(
                line.ends_with(" generation=1"),
                "replica {r}: one purge, generation 1: {line}"
            );
        }
    }
    drop(client);
    cluster.stop();
}

/// A replica's disk is lost mid produce loop (killed, its whole data
/// directory deleted) and it is started again by the documented procedure
/// (`replog --config FILE --rejoin`): group 0 and the partition start out
/// of every quorum, catch up from their peers, and the replica then says
/// so; it ends byte-identical, and a kill -9 of another replica afterwards
/// loses nothing acknowledged.
#[test]
fn given_a_replica_whose_disk_was_lost_when_restarted_with_rejoin_should_catch_up_before_it_counts_and_lose_nothing()
 {
    let mut cluster = Cluster::start_logging(|_| {}, Some("warn,shard::shard=info"));
    let rt = runtime();
    let via = cluster.clients[0];
    let texts = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|n| format!("disk-{n:05}")).collect()
    };
    let client = rt.block_on(bounded(
        "set up",
        load_topic(via, TopicCreateOptions::default()),
    ));
    let mut produced = Produced::default();
    let mut produce_range = |range: Vec<String>| {
        produced.range(&rt, &client, &range);
    };
    produce_range(texts(0, 150));
    // Replica 2's disk dies: the process and every byte it held.
    cluster.kill9(2);
    std::fs::remove_dir_all(&cluster.data[2]).unwrap();
    produce_range(texts(150, 300));
    cluster.start_replica_with(2, &["--rejoin"]);
    produce_range(texts(300, 400));
    let segments = await_identical_segments(&cluster);
    let node = cluster.nodes[2].as_ref().unwrap();
    for line in [
        "rejoining after a disk replacement",
        "metadata group rejoining with an empty directory",
        "partition rejoining with an empty directory",
        "rejoin: group 0 caught up",
    ] {
        assert!(
            node.logged_within(line, Duration::from_secs(10)),
            "replica 2 did not log {line:?}"
        );
    }
    // The rejoined replica is a full member now: another replica's death
    // is the one failure the cluster must survive.
    cluster.kill9(1);
    produce_range(texts(400, 500));
    cluster.start_replica(1);
    produce_range(texts(500, 600));
    let read = rt.block_on(bounded("read back", poll_all(&client, "load", "t", 0)));
    check_read_back(&read, &produced.acked, &produced.attempted);
    assert_eq!(produced.acked.len(), 600);
    let after = await_identical_segments(&cluster);
    println!(
        "{} acknowledged, {} read; {} segment files identical after the rejoin, {} after the second kill",
        produced.acked.len(),
        read.len(),
        segments.len(),
        after.len()
    );
    drop(client);
    cluster.stop();
}

/// The base offsets of replica `i`'s segment files.
fn base_offsets(segments: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<u64> {
    segments
        .keys()
        .filter_map(|p| p.file_stem()?.to_str()?.parse().ok())
        .collect()
}

#[test]
fn given_a_backup_stopped_past_retention_when_restarted_should_catch_up_by_state_transfer_over_tcp()
{
    let mut cluster = Cluster::start_logging(
        |c| {
            c.storage.segment_size_bytes = 4096;
            c.storage.fsync = false;
        },
        Some("warn,partitions::state_transfer=info,partitions::install=info"),
    );
    let rt = runtime();
    let via = cluster.clients[0];
    let texts = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|n| format!("xfer-{n:05}")).collect()
    };
    let expiring = TopicCreateOptions {
        message_expiry: Some(IggyExpiry::ExpireDuration(IggyDuration::from(
            Duration::from_secs(2),
        ))),
        ..TopicCreateOptions::default()
    };
    let client = rt.block_on(bounded("set up", load_topic(via, expiring)));
    let mut produced = Produced::default();
    let mut produce_range = |range: Vec<String>| {
        produced.range(&rt, &client, &range);
    };
    produce_range(texts(0, 100));
    cluster.kill9(2);
    // More ops than the primary keeps for repair (1,024 prepares), then
    // long enough for retention (2 s expiry, a pass a second) to remove
    // the sealed segments the stopped backup would need.
    produce_range(texts(100, 1300));
    std::thread::sleep(Duration::from_secs(4));
    produce_range(texts(1300, 1320));
    let live = cluster.segments(0);
    let first = base_offsets(&live).first().copied().unwrap_or(0);
    assert!(
        first > 100,
        "retention removed the old segments (first base {first})"
    );
    cluster.start_replica(2);
    // Producers keep writing while the backup catches up.
    produce_range(texts(1320, 1500));
    let segments = await_identical_segments(&cluster);
    let installed = cluster.nodes[2]
        .as_ref()
        .is_some_and(|n| n.logged_within("partition state installed", Duration::from_secs(10)));
    assert!(
        installed,
        "the restarted backup caught up by state transfer"
    );
    let read = rt.block_on(bounded("read back", poll_all(&client, "load", "t", 0)));
    check_tail(&read, &produced.acked, &produced.attempted);
    println!(
        "{} acknowledged; {} still held after retention; {} segment files identical on every replica",
        produced.acked.len(),
        read.len(),
        segments.len()
    );
    drop(client);
    cluster.stop();
}

/// A base port with the next `n` ports free, below the ephemeral range.
fn free_port_run(n: u16) -> u16 {
    for _ in 0..1000 {
        let base = free_ports(1)[0];
        if base.checked_add(n).is_none_or(|end| end >= 32_768) {
            continue;
        }
        let all_free = (base..base + n)
            .map(|p| std::net::TcpListener::bind(("127.0.0.1", p)))
            .collect::<Result<Vec<_>, _>>()
            .is_ok();
        if all_free {
            return base;
        }
    }
    panic!("no run of {n} free ports");
}

/// Kills the `replog dev` process if the test ends early; its replicas
/// stop when it is gone (their stdin closes).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn given_replog_dev_when_started_should_serve_the_sdk_on_every_replica_and_stop_them_all() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_run(6);
    let dev = std::process::Command::new(env!("CARGO_BIN_EXE_replog"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--shards", "2", "dev", "--replicas", "3", "--base-port"])
        .arg(base.to_string())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut dev = KillOnDrop(dev);
    let stdout = dev.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut serving = std::collections::BTreeSet::new();
    while serving.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("every replica serves within 30 s");
        if let Some(rest) = line.strip_prefix("[r")
            && line.contains("serving Iggy clients")
        {
            serving.insert(rest.chars().next().unwrap());
        }
    }
    let clients: Vec<SocketAddr> = (0..3)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], base + 2 * i)))
        .collect();
    runtime().block_on(bounded("dev cluster", async {
        for (i, addr) in clients.iter().enumerate() {
            let client = logged_in(*addr).await;
            let stream = format!("dev-{i}");
            retried!("create stream", client.create_stream(&stream));
            let streams = retried!("get streams", client.get_streams());
            assert!(
                streams.iter().any(|s| s.name == stream),
                "through replica {i}"
            );
        }
    }));
    let pid = dev.0.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(status) = dev.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "replog dev did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "replog dev exited with {status}");
    // Every replica is gone: its client port can be bound again.
    for addr in &clients {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind(addr).is_err() {
            assert!(Instant::now() < deadline, "{addr} is still taken");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn given_a_cluster_stopped_whole_when_restarted_should_serve_everything_again() {
    let mut cluster = Cluster::start(|_| {});
    let rt = runtime();
    let via = cluster.clients[2];
    let texts: Vec<String> = (0..50).map(|n| format!("whole-{n:03}")).collect();
    let mut produced = Produced::default();
    rt.block_on(bounded("before", async {
        let client = load_topic(via, TopicCreateOptions::default()).await;
        produced.send(&client, &texts).await;
    }));
    for i in 0..3 {
        cluster.nodes[i].take().unwrap().stop();
    }
    for i in 0..3 {
        cluster.start_replica(i);
    }
    rt.block_on(bounded("after a whole-cluster restart", async {
        let client = logged_in(via).await;
        let more: Vec<String> = (50..60).map(|n| format!("whole-{n:03}")).collect();
        produced.send(&client, &more).await;
        let read = poll_all(&client, "load", "t", 0).await;
        check_read_back(&read, &produced.acked, &produced.attempted);
    }));
    cluster.stop();
}

/// The whole-cluster SIGKILL of the two tests below: produces 200
/// messages named `{prefix}-N` to a new `load/t` created with `options`,
/// waits `settle` if given, kills every replica at once, starts them all
/// again and produces 100 more. Returns what was produced and what a poll
/// from offset 0 then reads, checked: every acknowledged message at its
/// confirmed offset, nothing unsent, offsets dense, all 300 acknowledged.
fn kill_whole_between_loads(
    cluster: &mut Cluster,
    options: TopicCreateOptions,
    prefix: &str,
    settle: Option<Duration>,
    power_loss: bool,
) -> (Produced, Vec<(u64, String)>) {
    let rt = runtime();
    let via = cluster.clients[0];
    let texts = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|n| format!("{prefix}-{n:05}")).collect()
    };
    let client = rt.block_on(bounded("set up", load_topic(via, options)));
    let mut produced = Produced::default();
    produced.range(&rt, &client, &texts(0, 200));
    drop(client);
    if let Some(settle) = settle {
        std::thread::sleep(settle);
    }
    for i in 0..3 {
        cluster.kill9(i);
    }
    if power_loss {
        // What a machine restart does to a `replicated` group's replica
        // logs, kept unsynced: they are set aside at the next boot
        // (another boot id). Removing them is the same to the boot.
        for dir in &cluster.data {
            remove_replica_logs(dir);
        }
    }
    for i in 0..3 {
        cluster.start_replica(i);
    }
    let client = rt.block_on(bounded("log in again", logged_in(via)));
    produced.range(&rt, &client, &texts(200, 300));
    let read = rt.block_on(bounded("read back", poll_all(&client, "load", "t", 0)));
    check_read_back(&read, &produced.acked, &produced.attempted);
    assert_eq!(produced.acked.len(), 300);
    (produced, read)
}

/// Removes every partition's replica log below `dir`.
fn remove_replica_logs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            remove_replica_logs(&path);
        } else if path
            .file_name()
            .is_some_and(|n| n == journal::REPLICA_LOG_FILE)
            && path.parent().is_some_and(|p| !p.ends_with("metadata"))
        {
            std::fs::remove_file(&path).unwrap();
        }
    }
}

/// A whole-cluster crash: every replica is killed with SIGKILL at once
/// (no clean stop) and started again. The topic is `persisted` (the SDK
/// asks for it by name: its default options name `replicated`), so each
/// replica of its partition resumes from its replica log and the group
/// forms a view by an ordinary view change, without the census
/// (docs/consensus.md §4, "Resume from a durable journal"), and every
/// acknowledged message is still at its offset.
#[test]
fn given_a_cluster_killed_whole_when_restarted_should_serve_again_by_itself_and_lose_nothing_acknowledged()
 {
    let mut cluster =
        Cluster::start_logging(|_| {}, Some("warn,shard::shard=info,partitions::boot=info"));
    let persisted = TopicCreateOptions {
        durability: Durability::Persisted,
        ..TopicCreateOptions::default()
    };
    let (produced, read) =
        kill_whole_between_loads(&mut cluster, persisted, "blackout", None, false);
    // Every replica resumed the partition from its replica log at boot;
    // none needed the census.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let node = node.as_ref().expect("every replica runs");
        assert!(
            node.logged("partition resumed from its replica log"),
            "replica {i} resumed the persisted partition from its log"
        );
        assert!(
            !node.logged("every replica of the group restarted: started a view"),
            "replica {i}: a persisted group needs no census"
        );
    }
    let segments = await_identical_segments(&cluster);
    println!(
        "{} acknowledged, {} read after a kill -9 of every replica; {} segment files identical",
        produced.acked.len(),
        read.len(),
        segments.len()
    );
    cluster.stop();
}

/// A whole-cluster power loss with a `replicated` topic (the SDK's
/// default): every replica is killed and its replica log, kept unsynced,
/// is set aside as a machine restart makes a boot do, so the group comes
/// back through the census once every replica has reported
/// (docs/consensus.md §4, "Whole-group restart") and keeps what its
/// recorded applied points hold. (A plain kill -9 of the whole cluster
/// loses nothing: each replica resumes from its log; the nemesis checks
/// that.)
#[test]
fn given_a_replicated_topic_when_the_cluster_is_killed_whole_should_come_back_by_census_and_keep_what_was_recorded()
 {
    let mut cluster = Cluster::start_logging(|_| {}, Some("warn,shard::shard=info"));
    // Well past the 100 ms time bound and the tick that makes its record.
    let settle = Some(Duration::from_millis(600));
    let (produced, read) = kill_whole_between_loads(
        &mut cluster,
        TopicCreateOptions::default(),
        "census",
        settle,
        true,
    );
    assert_eq!(read.len(), 300, "every recorded message survived");
    let census = cluster.nodes.iter().flatten().any(|n| {
        n.logged_within(
            "every replica of the group restarted: started a view",
            Duration::from_secs(10),
        )
    });
    assert!(census, "a replica started the partition's view by census");
    let segments = await_identical_segments(&cluster);
    println!(
        "{} acknowledged, {} read after a kill -9 of every replica (replicated); {} segment files identical",
        produced.acked.len(),
        read.len(),
        segments.len()
    );
    cluster.stop();
}

/// Scrapes replica `node`'s metrics until `ok` holds, for at most 30 s.
fn scrape_until(
    node: &Replog,
    what: &str,
    ok: impl Fn(&support::metrics::Exposition) -> bool,
) -> support::metrics::Exposition {
    let addr = node.metrics_addr().expect("metrics served");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scraped = support::metrics::scrape(addr);
        if ok(&scraped) {
            return scraped;
        }
        assert!(Instant::now() < deadline, "{what} within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn given_a_cluster_with_metrics_when_a_replica_dies_and_returns_should_count_its_lanes_down_and_up_again()
 {
    let mut cluster = Cluster::start(|c| c.metrics.listen = Some("127.0.0.1:0".parse().unwrap()));
    let peer2 = r#"peer="2""#;
    let shard_lane = r#"lane="shard""#;
    let metadata = r#"group="9223372036854775808""#;
    let forward_in = r#"lane="forward_in""#;
    // Two shard lanes (one per shard index) to each peer, a forward lane
    // to each peer dialled from here, and one from each peer served here.
    let r0 = cluster.nodes[0].as_ref().unwrap();
    let up = scrape_until(r0, "every lane of replica 0 up", |m| {
        m.sum("replog_bus_lanes_up", &[shard_lane]) == 4.0
            && m.sum("replog_bus_lanes_up", &[r#"lane="forward""#]) == 2.0
            && m.sum("replog_bus_lanes_up", &[forward_in]) == 2.0
    });
    assert_eq!(up.sum("replog_bus_lane_reconnects_total", &[]), 0.0);
    // Group 0 has one primary across the cluster, and its heartbeats flow.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let primaries: f64 = cluster
            .nodes
            .iter()
            .map(|n| {
                let addr = n.as_ref().unwrap().metrics_addr().unwrap();
                support::metrics::scrape(addr).sum("replog_group_primary", &[metadata])
            })
            .sum();
        if primaries == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "one metadata primary: {primaries}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r0 = cluster.nodes[0].as_ref().unwrap();
    scrape_until(r0, "frames from the peers", |m| {
        m.sum("replog_shard_frames_in_total", &[]) > 0.0
    });

    cluster.kill9(2);
    let r0 = cluster.nodes[0].as_ref().unwrap();
    let down = scrape_until(r0, "replica 2's lanes down", |m| {
        m.sum("replog_bus_lanes_up", &[peer2, shard_lane]) == 0.0
            && m.sum("replog_bus_lanes_up", &[peer2, forward_in]) == 0.0
    });
    assert!(down.sum("replog_bus_lane_drops_total", &[peer2, shard_lane]) >= 2.0);
    assert_eq!(
        down.sum("replog_bus_lane_drops_total", &[peer2, forward_in]),
        1.0
    );

    cluster.start_replica(2);
    let r0 = cluster.nodes[0].as_ref().unwrap();
    let back = scrape_until(r0, "replica 2's lanes up again", |m| {
        m.sum("replog_bus_lanes_up", &[peer2, shard_lane]) == 2.0
            && m.sum("replog_bus_lanes_up", &[peer2, forward_in]) == 1.0
    });
    assert!(back.sum("replog_bus_lane_reconnects_total", &[peer2, shard_lane]) >= 2.0);
    assert_eq!(
        back.sum("replog_bus_lane_reconnects_total", &[peer2, forward_in]),
        1.0
    );
    assert_eq!(
        back.sum("replog_bus_lane_reconnects_total", &[r#"peer="1""#]),
        0.0
    );
    cluster.stop();
}

/// `REPLOG_STATUS` from every replica (raw, through the SDK), until `ok`
/// holds for all three answers, for at most 30 s.
fn statuses_until(
    rt: &tokio::runtime::Runtime,
    clients: &[Option<IggyClient>],
    what: &str,
    ok: impl Fn(&[common::admin::ReplicaStatus]) -> bool,
) -> Vec<common::admin::ReplicaStatus> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answers: Vec<common::admin::ReplicaStatus> = clients
            .iter()
            .flatten()
            .map(|c| {
                let body = rt
                    .block_on(bounded(
                        "status",
                        c.send_binary_request(
                            common::admin::REPLOG_STATUS_CODE,
                            bytes::Bytes::new(),
                        ),
                    ))
                    .unwrap();
                common::admin::ReplicaStatus::decode(&body).unwrap()
            })
            .collect();
        if ok(&answers) {
            return answers;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within 30 s: {answers:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn given_a_cluster_when_each_replica_is_asked_for_its_status_should_report_every_group_and_agree() {
    use common::admin::GroupState;
    let mut cluster = Cluster::start(|_| {});
    let rt = runtime();
    let client = rt.block_on(bounded(
        "set up",
        load_topic(cluster.clients[0], TopicCreateOptions::default()),
    ));
    let mut produced = Produced::default();
    let texts: Vec<String> = (0..20).map(|n| format!("status-{n}")).collect();
    produced.range(&rt, &client, &texts);
    let clients: Vec<Option<IggyClient>> = cluster
        .clients
        .iter()
        .map(|&a| Some(rt.block_on(bounded("log in", logged_in(a)))))
        .collect();
    // Settled: every replica Normal in one view with the partition's 20
    // messages applied, and one primary per group across the replicas.
    let settled = |all: &[common::admin::ReplicaStatus]| {
        all.len() == 3
            && all.iter().all(|s| {
                s.groups.len() == 2
                    && s.groups
                        .iter()
                        .all(|g| g.state == GroupState::Normal && g.lag() == 0)
                    && s.groups[1].partition.is_some_and(|p| p.messages == 20)
            })
            && (0..2).all(|i| {
                all.iter().filter(|s| s.groups[i].primary_here).count() == 1
                    && all.iter().all(|s| {
                        s.groups[i].view == all[0].groups[i].view
                            && s.groups[i].commit_min == all[0].groups[i].commit_min
                    })
            })
    };
    let all = statuses_until(&rt, &clients, "a settled status", settled);
    for (i, s) in all.iter().enumerate() {
        assert_eq!(usize::from(s.replica), i);
        assert_eq!((s.shards, s.shards_answered), (2, 2));
        let roster: Vec<(u8, String)> = s
            .roster
            .iter()
            .map(|r| (r.id, r.client_address.clone()))
            .collect();
        let expected: Vec<(u8, String)> = (0..3u8)
            .map(|id| (id, cluster.clients[usize::from(id)].to_string()))
            .collect();
        assert_eq!(roster, expected);
        assert!(s.groups[0].is_metadata());
        assert!(s.groups[0].partition.is_none());
        let p = s.groups[1].partition.unwrap();
        assert_eq!((p.stream, p.topic, p.partition), (0, 0, 0));
        assert_eq!((p.next_offset, p.fenced), (20, false));
        assert!(s.groups[1].transfer.is_none());
    }
    // A backup of the partition goes away: the others still answer, and
    // after it returns it reports the same commit again.
    let backup = (0..3)
        .find(|&i| !all[i].groups[1].primary_here && !all[i].groups[0].primary_here)
        .unwrap_or_else(|| (0..3).find(|&i| !all[i].groups[1].primary_here).unwrap());
    let mut clients = clients;
    clients[backup] = None;
    cluster.kill9(backup);
    let two = statuses_until(&rt, &clients, "two answers", |a| a.len() == 2);
    assert!(two.iter().all(|s| s.groups.len() == 2));
    cluster.start_replica(backup);
    clients[backup] =
        Some(rt.block_on(bounded("log in again", logged_in(cluster.clients[backup]))));
    statuses_until(&rt, &clients, "a settled status after the restart", settled);
    drop(clients);
    drop(client);
    cluster.stop();
}
