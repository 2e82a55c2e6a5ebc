//! The replica bus's trust boundary against real `replog` processes: a
//! three-replica cluster on loopback (ports chosen free at run time,
//! every wait bounded), dialed by impostors that know the cluster id, the
//! roster and the bus layout (docs/formats.md §14) but not the secret.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::ReplicaId;
use iggy::prelude::*;
use server::node::bus::auth::ClusterKey;
use server::node::bus::hello::{
    CHALLENGE_SIZE, Challenge, HELLO_SIZE, Hello, Lane, Proof, Refusal, VERDICT_SIZE, Verdict,
};

mod support;
use std::str::FromStr;
use support::cluster::{CLUSTER_ID, Cluster, SECRET, transient};
use support::metrics::scrape;
use support::process::Replog;
use support::sdk_flows::{bounded, logged_in, runtime};

const TIMEOUT: Duration = Duration::from_secs(10);

/// What an impostor's handshake got: the accepter's challenge, if it sent
/// one, and its verdict.
fn handshake(
    addr: SocketAddr,
    hello: &[u8; HELLO_SIZE],
    answer: impl FnOnce(&Challenge) -> Proof,
) -> (Option<Challenge>, Verdict) {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(hello).unwrap();
    let mut bytes = [0u8; CHALLENGE_SIZE];
    s.read_exact(&mut bytes[..VERDICT_SIZE]).unwrap();
    if !Challenge::starts(&bytes) {
        return (None, Verdict::decode(&bytes[..VERDICT_SIZE]).unwrap());
    }
    s.read_exact(&mut bytes[VERDICT_SIZE..]).unwrap();
    let challenge = Challenge::decode(&bytes).unwrap();
    s.write_all(&answer(&challenge).encode()).unwrap();
    let mut verdict = [0u8; VERDICT_SIZE];
    s.read_exact(&mut verdict).unwrap();
    (Some(challenge), Verdict::decode(&verdict).unwrap())
}

async fn stream_names(client: &IggyClient) -> Vec<String> {
    let mut names: Vec<String> = client
        .get_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

/// An impostor with the right cluster id but no secret, one with another
/// secret, one replaying a recorded handshake, and one speaking the old
/// unauthenticated hello are each refused on a shard lane and on the
/// forward lane of a real replica, with the verdict naming why; nothing
/// changes in any group, and the cluster goes on serving.
#[test]
fn given_impostors_on_both_lane_kinds_when_they_dial_a_replica_should_be_refused_and_change_nothing()
 {
    let cluster = Cluster::start(|_| {});
    let rt = runtime();
    let via = cluster.clients[0];
    rt.block_on(bounded("a stream before the impostors", async {
        let client = logged_in(via).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match client.create_stream("before").await {
                Ok(_) => break,
                Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("create stream: {e:?}"),
            }
        }
    }));
    let key = ClusterKey::from_secret(SECRET.as_bytes()).unwrap();
    let wrong = ClusterKey::from_secret(b"another cluster's secret, also 32+ bytes").unwrap();
    let target = cluster.peers[2];
    // A shard lane is dialed by the lower id; any replica may forward.
    for (from, lane) in [(0u8, Lane::Shard(0)), (1, Lane::Forward)] {
        let hello = Hello {
            cluster: u128::from(CLUSTER_ID),
            from: ReplicaId(from),
            to: ReplicaId(2),
            lane,
            shard_count: 2,
            incarnation: u64::MAX,
            nonce: [7; 16],
        };
        let bytes = hello.encode();
        let unauthenticated = Verdict::Refused(Refusal::Unauthenticated);

        let (challenge, verdict) = handshake(target, &bytes, |_| Proof([0; 32]));
        assert!(challenge.is_some());
        assert_eq!(verdict, unauthenticated, "no secret, {lane:?}");

        let (_, verdict) = handshake(target, &bytes, |c| {
            assert!(
                !wrong.check_accepter(&bytes, &c.nonce, &c.proof),
                "the replica's proof holds only under the cluster's key"
            );
            assert!(key.check_accepter(&bytes, &c.nonce, &c.proof));
            Proof(wrong.dialer_proof(&bytes, &c.nonce, &c.proof))
        });
        assert_eq!(verdict, unauthenticated, "another secret, {lane:?}");

        // The recording: a handshake made with the secret by a boot older
        // than the real replica's, so it is refused as stale only after
        // the proofs, and pins nothing.
        let old = Hello {
            incarnation: 1,
            ..hello
        }
        .encode();
        let mut recorded = None;
        let (_, verdict) = handshake(target, &old, |c| {
            let p = Proof(key.dialer_proof(&old, &c.nonce, &c.proof));
            recorded = Some(p);
            p
        });
        assert_eq!(
            verdict,
            Verdict::Refused(Refusal::StaleIncarnation),
            "the recording, {lane:?}"
        );
        let recorded = recorded.unwrap();
        let (_, verdict) = handshake(target, &old, |_| recorded);
        assert_eq!(verdict, unauthenticated, "a replayed handshake, {lane:?}");

        // Version 1 had no proofs: the hello alone is refused.
        let mut v1 = bytes;
        v1[4..6].copy_from_slice(&1u16.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&v1[..56]);
        v1[56..].copy_from_slice(&sum.to_le_bytes());
        let (challenge, verdict) = handshake(target, &v1, |_| unreachable!());
        assert!(challenge.is_none());
        assert_eq!(verdict, Verdict::Refused(Refusal::Malformed), "{lane:?}");
    }
    rt.block_on(bounded("the cluster after the impostors", async {
        for addr in cluster.clients.clone() {
            let client = logged_in(addr).await;
            assert_eq!(stream_names(&client).await, ["before"], "via {addr}");
        }
        // The real replicas' lanes still carry the groups: a new stream
        // through a backup is ordered by the primary and seen everywhere.
        let client = logged_in(cluster.clients[2]).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match client.create_stream("after").await {
                Ok(_) => break,
                Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("create stream after: {e:?}"),
            }
        }
        for addr in cluster.clients.clone() {
            let client = logged_in(addr).await;
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while stream_names(&client).await != ["after", "before"] {
                assert!(std::time::Instant::now() < deadline, "via {addr}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }));
    cluster.stop();
}

/// A single replica started with `client` (TOML lines of its `[client]`
/// section), metrics on a free port.
fn replica_with_client_limits(dir: &std::path::Path, client: &str) -> Replog {
    let config = dir.join("replog.toml");
    std::fs::write(&config, format!("[client]\n{client}\n")).unwrap();
    let args: Vec<std::ffi::OsString> = [
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.join("data").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(std::ffi::OsString::from)
    .to_vec();
    Replog::start_with(&args)
}

fn limited(replica: &Replog, reason: &str) -> f64 {
    scrape(replica.metrics_addr().unwrap()).sum(
        "replog_client_connections_limited_total",
        &[&format!("reason=\"{reason}\"")],
    )
}

/// Whether the server closed `s` (a read sees the end of the stream).
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Ok(0))
        || matches!(s.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
}

/// 2,000 connections that never log in (half silent, half stalled in
/// the middle of a frame header) do not keep a logged-in client from
/// producing and reading back; the server closes every one of them at the
/// login timeout.
#[test]
fn given_2000_idle_connections_when_a_logged_in_client_produces_should_serve_it_and_close_them_at_the_login_timeout()
 {
    let _ = server::node::limits::raise_open_file_limit();
    let dir = tempfile::tempdir().unwrap();
    let replica = replica_with_client_limits(dir.path(), "login_timeout_ms = 4000");
    let addr = replica.addr;
    let rt = runtime();
    let client = rt.block_on(bounded("login", logged_in(addr)));
    rt.block_on(bounded("a topic", async {
        client.create_stream("s").await.unwrap();
        let options = TopicCreateOptions {
            partitions_count: Some(1),
            ..TopicCreateOptions::default()
        };
        client
            .create_topic(&Identifier::named("s").unwrap(), "t", &options)
            .await
            .unwrap();
    }));
    let mut idle: Vec<TcpStream> = (0..2000)
        .map(|i| {
            let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
            if i % 2 == 1 {
                // Part of a header, then nothing: a stalled frame.
                s.write_all(&[0u8; 100]).unwrap();
            }
            s
        })
        .collect();
    rt.block_on(bounded("produce beside the idle connections", async {
        let stream = Identifier::named("s").unwrap();
        let topic = Identifier::named("t").unwrap();
        for n in 0..200 {
            let mut batch = vec![IggyMessage::from_str(&format!("m{n}")).unwrap()];
            client
                .send_messages(&stream, &topic, &Partitioning::partition_id(0), &mut batch)
                .await
                .unwrap();
        }
        let polled = client
            .poll_messages(
                &stream,
                &topic,
                Some(0),
                &Consumer::new(Identifier::numeric(1).unwrap()),
                &PollingStrategy::offset(0),
                1000,
                false,
            )
            .await
            .unwrap();
        assert_eq!(polled.messages.len(), 200);
    }));
    // Every idle one is closed once its login timeout passed.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    let still_open = idle.iter_mut().map(closed_by_server).filter(|c| !c).count();
    assert_eq!(
        still_open, 0,
        "connections left open past the login timeout"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while limited(&replica, "login_timeout") < 2000.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            limited(&replica, "login_timeout")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The logged-in client was never idle long enough to be closed.
    rt.block_on(bounded("after", async {
        client.ping().await.unwrap();
    }));
    replica.stop();
}

/// Past `connections_max` a connection is closed at accept and counted;
/// a frame larger than the pre-login ceiling closes its connection; the
/// last failed login a connection is allowed closes it.
#[test]
fn given_client_limits_when_exceeded_should_close_the_connection_and_count_why() {
    let dir = tempfile::tempdir().unwrap();
    let replica = replica_with_client_limits(
        dir.path(),
        "connections_max = 8\nlogin_failures_max = 2\nframe_size_before_login_bytes = 1024",
    );
    let addr = replica.addr;
    let rt = runtime();
    let client = rt.block_on(bounded("login", logged_in(addr)));
    // 1 logged in + 7 more fill the cap; 5 past it are closed at once.
    let mut held: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect_timeout(&addr, TIMEOUT).unwrap())
        .collect();
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
    }
    let closed = held.iter_mut().map(closed_by_server).filter(|c| *c).count();
    assert_eq!(closed, 5);
    assert_eq!(limited(&replica, "connections_max"), 5.0);
    drop(held);
    rt.block_on(bounded("still served", async {
        client.ping().await.unwrap();
    }));
    // A header declaring 1 MiB before login: closed before the body.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut big = loop {
        // The cap frees as the server notices the dropped ones.
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut header = [0u8; 256];
        header[48..52].copy_from_slice(&(1u32 << 20).to_le_bytes());
        if s.write_all(&header).is_ok() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline);
    };
    assert!(
        closed_by_server(&mut big),
        "an oversized pre-login frame closes"
    );
    // Two bad logins: the second is the last this connection gets.
    rt.block_on(bounded("bad logins", async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let bad = loop {
            // Wait for the cap to free (the refused ones above).
            let bad = support::sdk_flows::connected(addr).await;
            if bad.login_user("iggy", "wrong").await.is_err() {
                break bad;
            }
            assert!(std::time::Instant::now() < deadline);
        };
        assert!(bad.login_user("iggy", "wrong again").await.is_err());
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while limited(&replica, "login_failures") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the connection was not closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    replica.stop();
}

/// Logs in as `iggy` with `password` on a fresh connection, retrying (at
/// most 30 s) while the replica is not ready; whether it was accepted.
async fn login_with(addr: std::net::SocketAddr, password: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let client = support::sdk_flows::connected(addr).await;
        match client.login_user("iggy", password).await {
            Ok(_) => return true,
            Err(e) if e.as_code() == 42 || e.as_code() == 9 => return false,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("login: {e:?}"),
        }
    }
}

/// A `root.password` changed in the configuration takes effect at the
/// next boot; the old one stops working.
#[test]
fn given_a_changed_root_password_when_the_replica_restarts_should_take_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let start = |password: &str| {
        let args: Vec<std::ffi::OsString> = [
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "1",
            "--root-password",
            password,
        ]
        .map(std::ffi::OsString::from)
        .to_vec();
        Replog::start_with(&args)
    };
    let rt = runtime();
    let first = start("first password");
    assert!(rt.block_on(bounded(
        "first login",
        login_with(first.addr, "first password")
    )));
    first.stop();
    let second = start("second password");
    rt.block_on(bounded("after the change", async {
        assert!(login_with(second.addr, "second password").await);
        assert!(!login_with(second.addr, "first password").await);
    }));
    second.stop();
}

/// A poll of `u32::MAX` messages on a partition of 8 MiB returns a reply
/// bounded by `client.poll_reply_bytes_max` (whole batches), and polling
/// on from the next offset reads every message once.
#[test]
fn given_a_large_partition_when_polled_for_u32_max_messages_should_return_a_bounded_reply() {
    let dir = tempfile::tempdir().unwrap();
    let replica = replica_with_client_limits(dir.path(), "poll_reply_bytes_max = 1048576");
    let rt = runtime();
    rt.block_on(bounded("a large partition, polled", async {
        let client = logged_in(replica.addr).await;
        client.create_stream("big").await.unwrap();
        let options = TopicCreateOptions {
            partitions_count: Some(1),
            ..TopicCreateOptions::default()
        };
        let stream = Identifier::named("big").unwrap();
        client.create_topic(&stream, "t", &options).await.unwrap();
        let topic = Identifier::named("t").unwrap();
        let payload = "x".repeat(1024);
        for _ in 0..80 {
            let mut batch: Vec<IggyMessage> = (0..100)
                .map(|_| IggyMessage::from_str(&payload).unwrap())
                .collect();
            client
                .send_messages(&stream, &topic, &Partitioning::partition_id(0), &mut batch)
                .await
                .unwrap();
        }
        let consumer = Consumer::new(Identifier::numeric(1).unwrap());
        let mut next = 0u64;
        let mut polls = 0;
        while next < 8000 {
            let polled = client
                .poll_messages(
                    &stream,
                    &topic,
                    Some(0),
                    &consumer,
                    &PollingStrategy::offset(next),
                    u32::MAX,
                    false,
                )
                .await
                .unwrap();
            let bytes: usize = polled.messages.iter().map(|m| m.payload.len()).sum();
            // The budget plus at most one batch of 100 KiB.
            assert!(
                bytes <= (1 << 20) + 100 * 1024,
                "{bytes} payload bytes in one reply"
            );
            assert!(!polled.messages.is_empty());
            assert_eq!(polled.messages[0].header.offset, next);
            next = polled.messages.last().unwrap().header.offset + 1;
            polls += 1;
            assert!(polls <= 100);
        }
        assert!(polls >= 8, "{polls} polls for 8 MiB under a 1 MiB budget");
    }));
    replica.stop();
}
