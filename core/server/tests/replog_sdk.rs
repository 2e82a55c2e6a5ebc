//! The official `iggy` 0.11.0 SDK against real `replog` processes on
//! loopback: the low-level flow, a producer with a consumer group, a clean
//! restart and a `kill -9`, each bounded in time. The server picks its
//! port (`--listen 127.0.0.1:0`) and prints it; every process started is
//! stopped when its handle drops.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::str::FromStr;

use iggy::prelude::*;

mod support;
use support::process::Replog;
use support::sdk_flows::{self, bounded, logged_in, runtime};

/// Up to `count` messages of `partition` of the low-level flow's topic.
async fn poll_texts(client: &IggyClient, partition: u32, count: u32) -> Vec<(u64, String)> {
    sdk_flows::poll_texts(
        client,
        sdk_flows::LOW_LEVEL_STREAM,
        sdk_flows::LOW_LEVEL_TOPIC,
        partition,
        0,
        count,
    )
    .await
}

/// Sends `texts` to `partition` of the low-level flow's topic.
async fn send(client: &IggyClient, partition: u32, texts: &[String]) {
    sdk_flows::send_texts(
        client,
        sdk_flows::LOW_LEVEL_STREAM,
        sdk_flows::LOW_LEVEL_TOPIC,
        partition,
        texts,
    )
    .await;
}

#[test]
fn given_replog_when_the_sdk_runs_the_low_level_flow_should_get_back_what_it_sent_across_restarts()
{
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    let rt = runtime();
    rt.block_on(bounded("low-level flow", async {
        let client = logged_in(server.addr).await;
        client.ping().await.unwrap();
        sdk_flows::low_level_flow(&client).await;
    }));
    server.stop();

    // A clean restart serves everything.
    let server = Replog::start(dir.path());
    rt.block_on(bounded("after a clean restart", async {
        let client = logged_in(server.addr).await;
        assert_eq!(poll_texts(&client, 1, 100).await.len(), 10);
        let more: Vec<String> = (10..20).map(|i| format!("message-{i}")).collect();
        send(&client, 2, &more).await;
    }));
    // kill -9: every acknowledged send survives (written before its reply).
    server.kill9();
    let server = Replog::start(dir.path());
    rt.block_on(bounded("after kill -9", async {
        let client = logged_in(server.addr).await;
        assert_eq!(poll_texts(&client, 1, 100).await.len(), 10);
        let got = poll_texts(&client, 2, 100).await;
        let texts: Vec<String> = got.into_iter().map(|(_, t)| t).collect();
        let expected: Vec<String> = (10..20).map(|i| format!("message-{i}")).collect();
        assert_eq!(texts, expected);
    }));
    server.stop();
}

/// `storage.fsync = false` (topics `replicated`): a single replica killed
/// with SIGKILL in the middle of a produce loop still serves every batch it
/// acknowledged, at the offsets it gave them (one sequential producer into
/// one partition, so batch `i` holds offsets `10i..10i+9`), and nothing
/// else except possibly the one batch in flight at the kill. The reply
/// waits for the batch's write (not its sync), and the page cache outlives
/// the process.
#[test]
fn given_replicated_mode_when_killed_mid_produce_loop_should_keep_every_acknowledged_batch_at_its_offset()
 {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("replog.toml");
    std::fs::write(&config, "[storage]\nfsync = false\n").unwrap();
    let data = dir.path().join("data");
    let args: Vec<std::ffi::OsString> = vec![
        "--config".into(),
        config.clone().into(),
        "--data-dir".into(),
        data.clone().into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--shards".into(),
        "2".into(),
    ];
    let server = Replog::start_with(&args);
    let rt = runtime();
    let acked = Arc::new(Mutex::new(0u64));
    let addr = server.addr;
    let text = |batch: u64, i: u64| format!("b{batch}-m{i}");
    let producer = {
        let acked = Arc::clone(&acked);
        rt.spawn(async move {
            let client = logged_in(addr).await;
            client.create_stream("orders").await.unwrap();
            let options = TopicCreateOptions {
                partitions_count: Some(1),
                ..TopicCreateOptions::default()
            };
            let stream = Identifier::named("orders").unwrap();
            client.create_topic(&stream, "eu", &options).await.unwrap();
            let topic = Identifier::named("eu").unwrap();
            for batch in 0..100_000u64 {
                let mut messages: Vec<IggyMessage> = (0..10)
                    .map(|i| IggyMessage::from_str(&text(batch, i)).unwrap())
                    .collect();
                let sent = client
                    .send_messages(
                        &stream,
                        &topic,
                        &Partitioning::partition_id(0),
                        &mut messages,
                    )
                    .await;
                if sent.is_err() {
                    return;
                }
                *acked.lock().unwrap() = batch + 1;
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while *acked.lock().unwrap() < 300 {
        assert!(
            std::time::Instant::now() < deadline,
            "the produce loop stalled"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    server.kill9();
    // The SDK retries a send whose connection died; the restarted server
    // listens elsewhere, so stop the loop here.
    producer.abort();
    let acknowledged = *acked.lock().unwrap();

    let server = Replog::start_with(&args);
    rt.block_on(bounded("after kill -9", async {
        let client = logged_in(server.addr).await;
        let stream = Identifier::named("orders").unwrap();
        let topic = Identifier::named("eu").unwrap();
        let consumer = Consumer::new(Identifier::numeric(1).unwrap());
        let mut got: Vec<(u64, String)> = Vec::new();
        for _ in 0..10_000 {
            let polled = client
                .poll_messages(
                    &stream,
                    &topic,
                    Some(0),
                    &consumer,
                    &PollingStrategy::offset(got.len() as u64),
                    1_000,
                    false,
                )
                .await
                .unwrap();
            if polled.messages.is_empty() {
                break;
            }
            got.extend(polled.messages.iter().map(|m| {
                (
                    m.header.offset,
                    String::from_utf8(m.payload.to_vec()).unwrap(),
                )
            }));
        }
        let held = got.len() as u64;
        assert!(
            held == acknowledged * 10 || held == (acknowledged + 1) * 10,
            "{acknowledged} batches acknowledged, {held} messages held"
        );
        for (k, (offset, payload)) in got.iter().enumerate() {
            let k = k as u64;
            assert_eq!(
                (*offset, payload.as_str()),
                (k, text(k / 10, k % 10).as_str())
            );
        }
        eprintln!(
            "{acknowledged} batches acknowledged before the kill, {held} messages held after it"
        );
    }));
    server.stop();
}

/// Runs one shared SDK flow against a fresh `replog` process.
fn against_replog(
    what: &str,
    flow: fn(SocketAddr) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    let addr = server.addr;
    runtime().block_on(bounded(what, async move {
        // The high-level clients log in once; wait for the root user.
        drop(logged_in(addr).await);
        flow(addr).await;
    }));
    server.stop();
}

#[test]
fn given_replog_when_a_producer_feeds_a_consumer_group_should_deliver_every_message_once() {
    against_replog("producer and consumer group", |a| {
        Box::pin(sdk_flows::producer_into_consumer_group(a))
    });
}

#[test]
fn given_replog_when_keyed_and_balanced_producers_feed_a_group_of_three_should_deliver_in_order_once()
 {
    against_replog("group of three", |a| {
        Box::pin(sdk_flows::key_partitioning_into_group_of_three(a))
    });
}

#[test]
fn given_replog_when_a_standalone_consumer_auto_commits_should_resume_after_its_offset() {
    against_replog("stand-alone consumer", |a| {
        Box::pin(sdk_flows::standalone_consumer_resumes_after_auto_commit(a))
    });
}

/// Reads from a raw connection until the server closes it (or 10 s pass);
/// returns what it sent before closing.
fn read_until_closed(stream: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server neither answered nor closed: {e}"),
        }
    }
}

#[test]
fn given_hostile_bytes_and_bad_requests_when_sent_should_refuse_them_and_keep_serving_others() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    let addr = server.addr;
    let rt = runtime();
    let good = rt.block_on(bounded("log in", logged_in(addr)));
    // Garbage where a header should be: the stream cannot be aligned on
    // frames again, so the server closes it.
    let mut garbage = std::net::TcpStream::connect(addr).unwrap();
    let noise: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    garbage.write_all(&noise).unwrap();
    read_until_closed(&mut garbage);
    // A header declaring a size past the ceiling: closed before anything
    // of the body is buffered.
    let mut huge = std::net::TcpStream::connect(addr).unwrap();
    let mut header = [0u8; 256];
    header[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.write_all(&header).unwrap();
    read_until_closed(&mut huge);
    // A frame cut mid-way, then the client leaves.
    let mut cut = std::net::TcpStream::connect(addr).unwrap();
    let mut partial = [0u8; 300];
    partial[48..52].copy_from_slice(&1000u32.to_le_bytes());
    cut.write_all(&partial).unwrap();
    cut.shutdown(std::net::Shutdown::Write).unwrap();
    read_until_closed(&mut cut);
    rt.block_on(bounded("bad requests", async {
        // Commands before login: Unauthenticated (40).
        let anonymous = sdk_flows::connected(addr).await;
        anonymous.ping().await.unwrap();
        let err = anonymous.get_streams().await.unwrap_err();
        assert_eq!(err.as_code(), 40, "{err:?}");
        // A wrong password is refused, and the connection can still log
        // in properly afterwards.
        assert!(anonymous.login_user("iggy", "wrong").await.is_err());
        anonymous.login_user("iggy", "iggy").await.unwrap();
        // Ids that name nothing: the not-found codes the SDK expects.
        let missing = Identifier::numeric(4242).unwrap();
        assert!(anonymous.get_stream(&missing).await.unwrap().is_none());
        let err = anonymous
            .create_topic(&missing, "t", &TopicCreateOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.as_code(), 1009, "{err:?}");
        // The first connection was never disturbed.
        good.ping().await.unwrap();
        good.create_stream("still-serving").await.unwrap();
        assert!(
            good.get_stream(&Identifier::named("still-serving").unwrap())
                .await
                .unwrap()
                .is_some()
        );
    }));
    drop(good);
    server.stop();
}

/// Open descriptors of process `pid` (Linux: its `/proc/<pid>/fd`).
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A partition in use holds its active segment's log and index; once a
/// pass of its shard's handle sweep (512 ticks, about 5 s) has seen it
/// idle, none: the open-file limit bounds the partitions in use, not
/// those hosted. The superblock is opened only to be written.
#[test]
fn given_two_hundred_idle_partitions_when_their_descriptors_are_counted_should_hold_none_after_a_pass()
 {
    const PARTITIONS: u32 = 200;
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(&dir.path().join("data"));
    let rt = runtime();
    let client = rt.block_on(bounded("log in", logged_in(server.addr)));
    rt.block_on(bounded("create the stream", client.create_stream("fds")))
        .unwrap();
    let before = descriptors(server.pid());
    let options = TopicCreateOptions {
        partitions_count: Some(PARTITIONS),
        ..TopicCreateOptions::default()
    };
    rt.block_on(bounded(
        "create the topic",
        client.create_topic(&Identifier::named("fds").unwrap(), "t", &options),
    ))
    .unwrap();
    // The groups open on their shards as the op applies, each with its
    // new segment's files; then the pass closes them. Wait (bounded) for
    // both: the peak, then the count back near where it started.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut peak = before;
    let mut now = before;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(250));
        now = descriptors(server.pid());
        peak = peak.max(now);
        if peak > before + PARTITIONS as usize && now <= before + 8 {
            break;
        }
    }
    let per_group = (peak - before) as f64 / f64::from(PARTITIONS);
    println!(
        "{PARTITIONS} new partitions: {before} → {peak} descriptors ({per_group:.2} per partition), {now} once idle"
    );
    assert!(
        peak - before <= 2 * PARTITIONS as usize + 8,
        "{per_group:.2} descriptors per new partition ({before} → {peak})"
    );
    assert!(
        now <= before + 8,
        "idle partitions kept their files: {before} → {now} descriptors after the pass"
    );
    drop(client);
    server.stop();
}

/// The SDK's `update_topic` patches: a setting the update leaves out keeps
/// its value (a rename alone changes nothing else), the named ones change
/// (and reach the partitions' retention), and a setting fixed at creation
/// is refused by name (4041) instead of being ignored.
#[test]
fn given_a_topic_when_updated_with_some_settings_should_keep_the_others_and_refuse_fixed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    runtime().block_on(bounded("topic update", async {
        let client = logged_in(server.addr).await;
        client.create_stream("upd").await.unwrap();
        let stream = Identifier::named("upd").unwrap();
        let expiry = IggyExpiry::from_str("1h").unwrap();
        let options = TopicCreateOptions {
            partitions_count: Some(2),
            message_expiry: Some(expiry),
            max_topic_size: Some(MaxTopicSize::from_str("10MB").unwrap()),
            ..TopicCreateOptions::default()
        };
        client.create_topic(&stream, "t", &options).await.unwrap();
        let topic = Identifier::named("t").unwrap();
        let bigger = MaxTopicSize::from_str("20MB").unwrap();
        let resize = TopicUpdateOptions {
            max_topic_size: Some(bigger),
            ..TopicUpdateOptions::default()
        };
        client
            .update_topic(&stream, &topic, "t", &resize)
            .await
            .unwrap();
        let t = client.get_topic(&stream, &topic).await.unwrap().unwrap();
        assert_eq!((t.message_expiry, t.max_topic_size), (expiry, bigger));
        client
            .update_topic(&stream, &topic, "renamed", &TopicUpdateOptions::default())
            .await
            .unwrap();
        let renamed = Identifier::named("renamed").unwrap();
        let t = client.get_topic(&stream, &renamed).await.unwrap().unwrap();
        assert_eq!(t.name, "renamed");
        assert_eq!((t.message_expiry, t.max_topic_size), (expiry, bigger));
        let fixed = TopicUpdateOptions {
            raw: [("segment_size".to_owned(), "1048576".to_owned())].into(),
            ..TopicUpdateOptions::default()
        };
        let err = client
            .update_topic(&stream, &renamed, "renamed", &fixed)
            .await
            .unwrap_err();
        assert_eq!(err.as_code(), 4041, "{err:?}");
        // No stream option is updatable: a key is refused, the rename
        // does not happen.
        let keyed = StreamUpdateOptions {
            raw: [("colour".to_owned(), "blue".to_owned())].into(),
        };
        let err = client
            .update_stream(&stream, "moved", &keyed)
            .await
            .unwrap_err();
        assert_eq!(err.as_code(), 4041, "{err:?}");
        assert!(client.get_stream(&stream).await.unwrap().is_some());
    }));
    server.stop();
}

/// A topic's size ceiling is carried out by the server: with 4 KiB
/// segments and a 16 KiB ceiling on one partition, about 60 KiB sent
/// leaves the oldest segments removed within a few retention passes (one
/// a second), what is left within the ceiling plus the active segment,
/// and the newest messages all still there.
#[test]
fn given_a_topic_size_ceiling_when_exceeded_should_remove_the_oldest_segments() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    runtime().block_on(bounded("retention by size", async {
        let client = logged_in(server.addr).await;
        client.create_stream("cap").await.unwrap();
        let options = TopicCreateOptions {
            partitions_count: Some(1),
            segment_size: Some(IggyByteSize::from(4_096u64)),
            max_topic_size: Some(MaxTopicSize::from_str("16KB").unwrap()),
            ..TopicCreateOptions::default()
        };
        let stream = Identifier::named("cap").unwrap();
        client.create_topic(&stream, "t", &options).await.unwrap();
        let texts: Vec<String> = (0..600).map(|i| format!("{i:0>90}")).collect();
        for chunk in texts.chunks(10) {
            sdk_flows::send_texts(&client, "cap", "t", 0, chunk).await;
        }
        let first = || async {
            client
                .poll_messages(
                    &stream,
                    &Identifier::named("t").unwrap(),
                    Some(0),
                    &Consumer::new(Identifier::numeric(7).unwrap()),
                    &PollingStrategy::first(),
                    1,
                    false,
                )
                .await
                .unwrap()
                .messages
                .first()
                .map(|m| m.header.offset)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while first().await == Some(0) {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing removed within 20 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let t = client
            .get_topic(&stream, &Identifier::named("t").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert!(
            t.size.as_bytes_u64() <= 16_384 + 4_096 + 2_048,
            "{} bytes kept",
            t.size.as_bytes_u64()
        );
        let tail = sdk_flows::poll_texts(&client, "cap", "t", 0, 590, 10).await;
        assert_eq!(tail.len(), 10);
        assert_eq!(tail[9], (599, texts[599].clone()));
    }));
    server.stop();
}
