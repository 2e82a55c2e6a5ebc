//! SDK flows shared by the tests that run them against the in-memory
//! test backend (`src/sdk_e2e.rs`) and against real `replog` processes
//! (`tests/replog_sdk.rs`, `tests/replog_cluster.rs`): the low-level smoke
//! flow and the official `iggy` 0.11.0 high-level clients, each flow
//! bounded in time by its caller.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use iggy::prelude::*;

/// A tokio runtime for the SDK (tests only).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f`, failing the test after 90 s.
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(90), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within 90 s"),
    }
}

/// A low-level TCP client connected to `addr`, not logged in.
pub async fn connected(addr: SocketAddr) -> IggyClient {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .build()
        .unwrap();
    client.connect().await.unwrap();
    client
}

/// A client logged in as the root user, retried (at most 30 s) while the
/// root user is being created as group 0 elects its first primary.
pub async fn logged_in(addr: SocketAddr) -> IggyClient {
    let client = connected(addr).await;
    // The root user is created as group 0 elects its first primary.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.login_user("iggy", "iggy").await {
            Ok(_) => return client,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("login: {e:?}"),
        }
    }
}

/// Sends `texts` as one batch to `partition` of `stream`/`topic`.
pub async fn send_texts(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
    texts: &[impl AsRef<str>],
) {
    let mut messages: Vec<IggyMessage> = texts
        .iter()
        .map(|t| IggyMessage::from_str(t.as_ref()).unwrap())
        .collect();
    client
        .send_messages(
            &Identifier::named(stream).unwrap(),
            &Identifier::named(topic).unwrap(),
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .unwrap();
}

/// Up to `count` messages of `partition` of `stream`/`topic` from
/// `offset`, as consumer 7 without committing: (offset, text) pairs.
pub async fn poll_texts(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
    offset: u64,
    count: u32,
) -> Vec<(u64, String)> {
    let polled = client
        .poll_messages(
            &Identifier::named(stream).unwrap(),
            &Identifier::named(topic).unwrap(),
            Some(partition),
            &Consumer::new(Identifier::numeric(7).unwrap()),
            &PollingStrategy::offset(offset),
            count,
            false,
        )
        .await
        .unwrap();
    assert_eq!(polled.partition_id, partition);
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

/// The stream and topic [`low_level_flow`] creates.
pub const LOW_LEVEL_STREAM: &str = "orders";
/// See [`LOW_LEVEL_STREAM`].
pub const LOW_LEVEL_TOPIC: &str = "eu";

/// The texts [`low_level_flow`] sends to partition 1, at offsets 0 to 9.
pub fn low_level_texts() -> Vec<String> {
    (0..10).map(|i| format!("message-{i}")).collect()
}

/// The low-level smoke flow (client_protocol.md §12.2) on a logged-in
/// client of a server with no streams: creates stream "orders" with the
/// three-partition topic "eu", sends [`low_level_texts`] to partition 1,
/// reads them back, stores, reads and auto-commits consumer 7's offset,
/// and gets the SDK's own codes for a duplicate stream and a missing
/// partition. What it wrote stays.
pub async fn low_level_flow(client: &IggyClient) {
    assert_eq!(client.get_cluster_metadata().await.unwrap().nodes.len(), 1);
    let stream_id = Identifier::named(LOW_LEVEL_STREAM).unwrap();
    let topic_id = Identifier::named(LOW_LEVEL_TOPIC).unwrap();
    assert!(client.get_stream(&stream_id).await.unwrap().is_none());
    let stream = client.create_stream(LOW_LEVEL_STREAM).await.unwrap();
    assert_eq!(stream.name, LOW_LEVEL_STREAM);
    let err = client.create_stream(LOW_LEVEL_STREAM).await.unwrap_err();
    assert_eq!(err.as_code(), 1012, "{err:?}");
    assert!(
        client
            .get_topic(&stream_id, &topic_id)
            .await
            .unwrap()
            .is_none()
    );
    let options = TopicCreateOptions {
        partitions_count: Some(3),
        ..TopicCreateOptions::default()
    };
    let topic = client
        .create_topic(&stream_id, LOW_LEVEL_TOPIC, &options)
        .await
        .unwrap();
    assert_eq!(topic.partitions_count, 3);
    assert_eq!(topic.partitions.len(), 3);

    let texts = low_level_texts();
    send_texts(client, LOW_LEVEL_STREAM, LOW_LEVEL_TOPIC, 1, &texts).await;
    let got = poll_texts(client, LOW_LEVEL_STREAM, LOW_LEVEL_TOPIC, 1, 0, 100).await;
    let expected: Vec<(u64, String)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (i as u64, t.clone()))
        .collect();
    assert_eq!(got, expected);
    // A poll starting mid-batch gets a cut batch with the right offsets.
    let tail = poll_texts(client, LOW_LEVEL_STREAM, LOW_LEVEL_TOPIC, 1, 7, 2).await;
    let offsets: Vec<u64> = tail.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(offsets, vec![7, 8]);

    let consumer = Consumer::new(Identifier::numeric(7).unwrap());
    // Offsets: none before a store, then store, read back, poll next with
    // auto-commit.
    assert!(
        client
            .get_consumer_offset(&consumer, &stream_id, &topic_id, Some(1))
            .await
            .unwrap()
            .is_none()
    );
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
    assert_eq!(offset.current_offset, 9);
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
}

pub async fn consume_exactly(consumer: &mut IggyConsumer, n: usize) -> Vec<(u32, u64, String)> {
    use futures::StreamExt;
    let mut got = Vec::new();
    while got.len() < n {
        let m = consumer.next().await.unwrap().unwrap();
        let text = String::from_utf8(m.message.payload.to_vec()).unwrap();
        got.push((m.partition_id, m.message.header.offset, text));
    }
    got
}

/// The producer and consumer group flow.
pub async fn producer_into_consumer_group(addr: SocketAddr) {
    let url = format!("iggy://iggy:iggy@{}", addr);
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
}

/// The group of three flow.
pub async fn key_partitioning_into_group_of_three(addr: SocketAddr) {
    let url = format!("iggy://iggy:iggy@{}", addr);
    let client = IggyClient::from_connection_string(&url).unwrap();
    client.connect().await.unwrap();
    let producer = client
        .producer("keyed", "events")
        .unwrap()
        .direct(DirectConfig::builder().batch_length(1).build())
        .partitioning(Partitioning::messages_key_str("k").unwrap())
        .create_topic_if_not_exists(3, IggyExpiry::ServerDefault, MaxTopicSize::ServerDefault)
        .build();
    producer.init().await.unwrap();
    // The SDK hashes the key itself and sends partition ids: one key,
    // one partition, so these 12 must read back in order.
    for i in 0..12 {
        producer
            .send(vec![IggyMessage::from_str(&format!("k{i:02}")).unwrap()])
            .await
            .unwrap();
    }
    // Nine more spread round robin by the balanced partitioner.
    let balanced = client
        .producer("keyed", "events")
        .unwrap()
        .direct(DirectConfig::builder().batch_length(1).build())
        .partitioning(Partitioning::balanced())
        .build();
    balanced.init().await.unwrap();
    for i in 0..9 {
        balanced
            .send(vec![IggyMessage::from_str(&format!("b{i:02}")).unwrap()])
            .await
            .unwrap();
    }

    let mut clients = Vec::new();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let c = IggyClient::from_connection_string(&url).unwrap();
        c.connect().await.unwrap();
        let mut consumer = c
            .consumer_group("trio", "keyed", "events")
            .unwrap()
            .auto_join_consumer_group()
            .create_consumer_group_if_not_exists()
            .polling_strategy(PollingStrategy::next())
            .poll_interval(IggyDuration::from(Duration::from_millis(5)))
            .batch_length(4)
            .build();
        consumer.init().await.unwrap();
        clients.push(c);
        consumers.push(consumer);
    }
    // Each member owns one of the three partitions (which one is the
    // server's assignment); together they see all 21 messages exactly
    // once, in offset order per partition. The members are read in turn,
    // each for a short while, until every message arrived.
    use futures::StreamExt;
    use std::collections::BTreeMap;
    let mut by_member: Vec<Vec<(u32, u64, String)>> = vec![Vec::new(); consumers.len()];
    let mut total = 0;
    while total < 21 {
        for (i, consumer) in consumers.iter_mut().enumerate() {
            if let Ok(Some(m)) =
                tokio::time::timeout(Duration::from_millis(20), consumer.next()).await
            {
                let m = m.unwrap();
                let text = String::from_utf8(m.message.payload.to_vec()).unwrap();
                by_member[i].push((m.partition_id, m.message.header.offset, text));
                total += 1;
            }
        }
    }
    let mut owners: BTreeMap<u32, usize> = BTreeMap::new();
    let mut per_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut all = Vec::new();
    for (member, got) in by_member.into_iter().enumerate() {
        for (partition, offset, text) in got {
            let owner = *owners.entry(partition).or_insert(member);
            assert_eq!(owner, member, "partition {partition} read by two members");
            per_partition.entry(partition).or_default().push(offset);
            all.push(text);
        }
    }
    for (partition, offsets) in &per_partition {
        let n = offsets.len() as u64;
        assert_eq!(
            offsets,
            &(0..n).collect::<Vec<_>>(),
            "partition {partition} in order from 0"
        );
    }
    all.sort();
    let mut want: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
    want.extend((0..9).map(|i| format!("b{i:02}")));
    want.sort();
    assert_eq!(all, want);
    for mut consumer in consumers {
        consumer.shutdown().await.unwrap();
    }
}

/// The stand-alone consumer flow.
pub async fn standalone_consumer_resumes_after_auto_commit(addr: SocketAddr) {
    let url = format!("iggy://iggy:iggy@{}", addr);
    let client = IggyClient::from_connection_string(&url).unwrap();
    client.connect().await.unwrap();
    let producer = client
        .producer("solo", "events")
        .unwrap()
        .direct(DirectConfig::builder().build())
        .partitioning(Partitioning::partition_id(0))
        .create_topic_if_not_exists(1, IggyExpiry::ServerDefault, MaxTopicSize::ServerDefault)
        .build();
    producer.init().await.unwrap();
    let batch: Vec<IggyMessage> = (0..10)
        .map(|i| IggyMessage::from_str(&format!("s{i}")).unwrap())
        .collect();
    producer.send(batch).await.unwrap();

    let mut consumer = client
        .consumer("reader-1", "solo", "events", 0)
        .unwrap()
        .polling_strategy(PollingStrategy::next())
        .auto_commit(AutoCommit::When(AutoCommitWhen::PollingMessages))
        .poll_interval(IggyDuration::from(Duration::from_millis(5)))
        .batch_length(4)
        .build();
    consumer.init().await.unwrap();
    let got = consume_exactly(&mut consumer, 6).await;
    let offsets: Vec<u64> = got.iter().map(|(_, o, _)| *o).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3, 4, 5]);
    // The server-side cursor moved with the polls.
    let stored = client
        .get_consumer_offset(
            &Consumer::new(Identifier::named("reader-1").unwrap()),
            &Identifier::named("solo").unwrap(),
            &Identifier::named("events").unwrap(),
            Some(0),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(stored.stored_offset >= 3, "{stored:?}");
}
