//! SDK flows shared by the tests that run them against the in-memory
//! test backend (`src/sdk_e2e.rs`) and against real `replog` processes
//! (`tests/replog_sdk.rs`): the official `iggy` 0.11.0 high-level clients,
//! each flow bounded in time by its caller.
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

/// A client logged in as the root user, retried (at most 30 s) while the
/// root user is being created as group 0 elects its first primary.
pub async fn logged_in(addr: SocketAddr) -> IggyClient {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .build()
        .unwrap();
    client.connect().await.unwrap();
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
