//! The official `iggy` 0.11.0 SDK against real `replog` processes on
//! loopback: the low-level flow, a producer with a consumer group, a clean
//! restart and a `kill -9`, each bounded in time. The server picks its
//! port (`--listen 127.0.0.1:0`) and prints it; every process started is
//! stopped when its handle drops.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use iggy::prelude::*;

struct Replog {
    child: Child,
    addr: SocketAddr,
}

impl Replog {
    fn start(data_dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_replog"))
            .args(["--data-dir"])
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "--shards", "2"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("replog printed its address within 30 s");
            if line.contains("serving") {
                break line;
            }
        };
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        Self { child, addr }
    }

    /// SIGTERM, then wait (at most 20 s) for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "replog exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "replog did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(90), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within 90 s"),
    }
}

async fn logged_in(addr: SocketAddr) -> IggyClient {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .build()
        .unwrap();
    client.connect().await.unwrap();
    // The root user is created as group 0 elects its first primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.login_user("iggy", "iggy").await {
            Ok(_) => return client,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("login: {e:?}"),
        }
    }
}

async fn poll_texts(client: &IggyClient, partition: u32, count: u32) -> Vec<(u64, String)> {
    let stream = Identifier::named("orders").unwrap();
    let topic = Identifier::named("eu").unwrap();
    let consumer = Consumer::new(Identifier::numeric(1).unwrap());
    let polled = client
        .poll_messages(
            &stream,
            &topic,
            Some(partition),
            &consumer,
            &PollingStrategy::offset(0),
            count,
            false,
        )
        .await
        .unwrap();
    polled
        .messages
        .iter()
        .map(|m| {
            (
                m.header.offset,
                String::from_utf8(m.payload.to_vec()).unwrap(),
            )
        })
        .collect()
}

async fn send(client: &IggyClient, partition: u32, texts: &[String]) {
    let stream = Identifier::named("orders").unwrap();
    let topic = Identifier::named("eu").unwrap();
    let mut messages: Vec<IggyMessage> = texts
        .iter()
        .map(|t| IggyMessage::from_str(t).unwrap())
        .collect();
    client
        .send_messages(
            &stream,
            &topic,
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .unwrap();
}

#[test]
fn given_replog_when_the_sdk_runs_the_low_level_flow_should_get_back_what_it_sent_across_restarts()
{
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    let rt = runtime();
    let texts: Vec<String> = (0..10).map(|i| format!("message-{i}")).collect();
    rt.block_on(bounded("low-level flow", async {
        let client = logged_in(server.addr).await;
        client.ping().await.unwrap();
        assert_eq!(client.get_cluster_metadata().await.unwrap().nodes.len(), 1);
        let stream_id = Identifier::named("orders").unwrap();
        assert!(client.get_stream(&stream_id).await.unwrap().is_none());
        client.create_stream("orders").await.unwrap();
        let err = client.create_stream("orders").await.unwrap_err();
        assert_eq!(err.as_code(), 1012, "{err:?}");
        let options = TopicCreateOptions {
            partitions_count: Some(3),
            ..TopicCreateOptions::default()
        };
        let topic = client
            .create_topic(&stream_id, "eu", &options)
            .await
            .unwrap();
        assert_eq!(topic.partitions_count, 3);
        send(&client, 1, &texts).await;
        let got = poll_texts(&client, 1, 100).await;
        let expected: Vec<(u64, String)> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u64, t.clone()))
            .collect();
        assert_eq!(got, expected);
        // Offsets: store, read back, poll next with auto-commit.
        let topic_id = Identifier::named("eu").unwrap();
        let consumer = Consumer::new(Identifier::numeric(7).unwrap());
        client
            .store_consumer_offset(&consumer, &stream_id, &topic_id, Some(1), 4)
            .await
            .unwrap();
        let offset = client
            .get_consumer_offset(&consumer, &stream_id, &topic_id, Some(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(offset.stored_offset, 4);
        let next = client
            .poll_messages(
                &stream_id,
                &topic_id,
                Some(1),
                &consumer,
                &PollingStrategy::next(),
                3,
                true,
            )
            .await
            .unwrap();
        let offsets: Vec<u64> = next.messages.iter().map(|m| m.header.offset).collect();
        assert_eq!(offsets, vec![5, 6, 7]);
        // A send to a missing partition answers the SDK's own code.
        let err = client
            .send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::partition_id(9),
                &mut [IggyMessage::from_str("x").unwrap()],
            )
            .await
            .unwrap_err();
        assert_eq!(err.as_code(), 3007, "{err:?}");
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

#[test]
fn given_replog_when_a_producer_feeds_a_consumer_group_should_deliver_every_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    runtime().block_on(bounded("producer and consumer group", async {
        // Wait for the root user before the high-level clients log in.
        drop(logged_in(server.addr).await);
        let url = format!("iggy://iggy:iggy@{}", server.addr);
        let client = IggyClient::from_connection_string(&url).unwrap();
        client.connect().await.unwrap();
        let producer = client
            .producer("high", "level")
            .unwrap()
            .direct(
                DirectConfig::builder()
                    .batch_length(1)
                    .linger_time(IggyDuration::from(Duration::from_millis(1)))
                    .build(),
            )
            .partitioning(Partitioning::balanced())
            .create_topic_if_not_exists(3, IggyExpiry::ServerDefault, MaxTopicSize::ServerDefault)
            .build();
        producer.init().await.unwrap();
        for i in 0..30 {
            producer
                .send(vec![IggyMessage::from_str(&format!("m{i}")).unwrap()])
                .await
                .unwrap();
        }
        let consumer_client = IggyClient::from_connection_string(&url).unwrap();
        consumer_client.connect().await.unwrap();
        let mut consumer = consumer_client
            .consumer_group("readers", "high", "level")
            .unwrap()
            .auto_join_consumer_group()
            .create_consumer_group_if_not_exists()
            .polling_strategy(PollingStrategy::next())
            .poll_interval(IggyDuration::from(Duration::from_millis(5)))
            .batch_length(10)
            .build();
        consumer.init().await.unwrap();
        let mut seen = std::collections::BTreeSet::new();
        use futures::StreamExt;
        while seen.len() < 30 {
            let m = consumer.next().await.unwrap().unwrap();
            let text = String::from_utf8(m.message.payload.to_vec()).unwrap();
            assert!(seen.insert(text), "a message arrived twice");
        }
        consumer.shutdown().await.unwrap();
    }));
    server.stop();
}
