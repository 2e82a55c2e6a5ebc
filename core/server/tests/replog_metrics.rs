//! The Prometheus endpoint of a real `replog` process on loopback: the
//! official `iggy` 0.11.0 SDK produces and polls, a plain `TcpStream`
//! scrapes `/metrics`, and the exposition must parse (every line a HELP,
//! TYPE, sample or the final `# EOF`, every sample of a declared family)
//! and its values must move with what was done: the partition's message
//! count and next offset equal what was sent, the produce histogram
//! counts each send. Ports are picked at run time (`127.0.0.1:0`); every
//! wait is bounded.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use iggy::prelude::*;

mod support;
use support::metrics::{http_get, scrape};
use support::process::Replog;
use support::sdk_flows::{self, bounded, logged_in, runtime};

async fn send(client: &IggyClient, texts: &[&str]) {
    sdk_flows::send_texts(client, "metered", "t", 1, texts).await;
}

#[test]
fn given_a_replica_with_metrics_when_the_sdk_produces_should_expose_parsable_series_that_move() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<std::ffi::OsString> = vec![
        "--data-dir".into(),
        dir.path().into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--shards".into(),
        "2".into(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
    ];
    let server = Replog::start_with(&args);
    let metrics = server
        .metrics_addr()
        .expect("a metrics line before serving");
    assert!(metrics.ip().is_loopback());

    let before = scrape(metrics);
    assert_eq!(
        before.sum("replog_shard_up", &[]),
        2.0,
        "both shards answer"
    );
    assert_eq!(
        before.sum(
            "replog_client_request_duration_seconds_count",
            &[r#"command="send_messages""#]
        ),
        0.0
    );
    assert!(before.has("replog_group_view"), "group 0's position");
    assert_eq!(before.sum("replog_shard_partition_groups", &[]), 0.0);

    let rt = runtime();
    rt.block_on(bounded("produce and poll", async {
        let client = logged_in(server.addr).await;
        client.create_stream("metered").await.unwrap();
        let options = TopicCreateOptions {
            partitions_count: Some(2),
            ..TopicCreateOptions::default()
        };
        let stream = Identifier::named("metered").unwrap();
        client.create_topic(&stream, "t", &options).await.unwrap();
        send(&client, &["a", "b", "c", "d", "e"]).await;
        send(&client, &["f", "g", "h"]).await;
        let topic = Identifier::named("t").unwrap();
        let consumer = Consumer::new(Identifier::numeric(1).unwrap());
        let polled = client
            .poll_messages(
                &stream,
                &topic,
                Some(1),
                &consumer,
                &PollingStrategy::offset(0),
                100,
                false,
            )
            .await
            .unwrap();
        assert_eq!(polled.messages.len(), 8);
    }));

    // The replies went out after the commit; a scrape or two later the
    // snapshot shows it (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let after = scrape(metrics);
        if after.sum("replog_partition_messages", &[]) == 8.0 {
            break after;
        }
        assert!(
            Instant::now() < deadline,
            "partition messages never reached 8: {:?}",
            after
                .samples
                .iter()
                .filter(|(k, _)| k.starts_with("replog_partition"))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // One stream, one topic: partition 1 got every message.
    let partition_one = [r#"partition="1""#];
    assert_eq!(after.sum("replog_partition_messages", &partition_one), 8.0);
    assert_eq!(
        after.sum("replog_partition_next_offset", &partition_one),
        8.0
    );
    assert!(after.sum("replog_partition_size_bytes", &partition_one) > 0.0);
    assert_eq!(
        after.sum("replog_shard_messages", &[]),
        8.0,
        "the shards' sums agree"
    );
    assert_eq!(after.sum("replog_shard_partition_groups", &[]), 2.0);
    assert_eq!(
        after.sum(
            "replog_client_request_duration_seconds_count",
            &[r#"command="send_messages""#]
        ),
        2.0,
        "each send timed once"
    );
    assert_eq!(
        after.sum(
            "replog_client_request_duration_seconds_bucket",
            &[r#"command="send_messages""#, r#"le="+Inf""#]
        ),
        2.0
    );
    assert!(
        after.sum(
            "replog_client_request_duration_seconds_sum",
            &[r#"command="send_messages""#]
        ) > 0.0
    );
    assert_eq!(
        after.sum(
            "replog_client_request_duration_seconds_count",
            &[r#"command="poll_messages""#]
        ),
        1.0
    );
    assert!(
        after.sum("replog_fsync_duration_seconds_count", &[]) > 0.0,
        "persisted topics sync"
    );
    assert_eq!(
        after.sum("replog_client_connections_accepted_total", &[]),
        1.0
    );
    // Every partition group is primary here (one replica) and caught up.
    let groups = after.sum("replog_group_primary", &[]);
    assert_eq!(groups, 3.0, "group 0 and two partitions");
    assert_eq!(after.sum("replog_group_commit_lag_ops", &[]), 0.0);
    assert!(after.sum("replog_group_commit_max", &[]) > before.sum("replog_group_commit_max", &[]));
    assert!(
        after.sum("replog_shard_ticks_total", &[]) > before.sum("replog_shard_ticks_total", &[])
    );

    // Anything but GET /metrics is refused, and the endpoint keeps serving.
    assert_eq!(http_get(metrics, "/").0, 404);
    let mut raw = TcpStream::connect(metrics).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"\x16\x03\x01garbage\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = raw.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(scrape(metrics).sum("replog_shard_up", &[]), 2.0);
    server.stop();
}

#[test]
fn given_no_metrics_listen_when_started_should_bind_no_metrics_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(dir.path());
    assert_eq!(server.metrics_addr(), None);
    assert!(!server.banner.iter().any(|l| l.contains("metrics")));
    // It serves clients all the same. (This also gives the process time
    // to install its signal handlers: the serving line is printed just
    // before it does, so a SIGTERM right after it can still kill it.)
    runtime().block_on(bounded("ping", async {
        logged_in(server.addr).await.ping().await.unwrap();
    }));
    server.stop();
}
