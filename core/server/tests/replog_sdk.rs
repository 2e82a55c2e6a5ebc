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
