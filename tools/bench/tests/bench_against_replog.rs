//! `replog-bench` against a real `replog` process on a free loopback port
//! with a temporary data directory: small workloads of every mode, each
//! bounded in time, whose JSON reports must add up — every message the
//! plan calls for counted once, one latency sample per batch, percentiles
//! in order, throughput equal to bytes over time — and whose messages the
//! server must actually hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use iggy::prelude::*;
use serde_json::Value;
use testkit::{Replog, run_bounded};

fn bench(server: &Replog, dir: &Path, name: &str, args: &[&str]) -> Value {
    let addr = server.addr.to_string();
    let mut with_addr = vec!["--addr", addr.as_str()];
    with_addr.extend_from_slice(args);
    let (stdout, report) = run_bench(dir, name, &with_addr);
    assert!(stdout.contains("p99.99"), "{stdout}");
    report
}

/// Runs the bench with `args` and `--json`; its stdout and the JSON.
fn run_bench(dir: &Path, name: &str, args: &[&str]) -> (String, Value) {
    let json = dir.join(format!("{name}.json"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_replog-bench"));
    command.arg("--json").arg(&json).args(args);
    let done = run_bounded(command, b"", Duration::from_secs(120)).unwrap();
    assert!(
        done.status.success(),
        "{name}: {}\nstdout:\n{}\nstderr:\n{}",
        done.status,
        done.stdout,
        done.stderr
    );
    // Not a terminal: the report alone, no progress bar.
    assert!(done.stdout.starts_with("replog-bench "), "{}", done.stdout);
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (done.stdout, report)
}

/// A cluster mode deletes its run's directory after a successful run: no
/// replica data, no logs left behind below `parent`.
fn assert_run_dir_removed(parent: &Path, prefix: &str) {
    let left: Vec<_> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

fn u(v: &Value, path: &[&str]) -> u64 {
    f(v, path) as u64
}

/// The checks every report must pass.
fn assert_consistent(name: &str, report: &Value, message_size: u64) {
    let expected = u(report, &["totals", "messages_expected"]);
    let messages = u(report, &["totals", "messages"]);
    assert_eq!(messages, expected, "{name}: messages counted");
    let bytes = u(report, &["totals", "payload_bytes"]);
    assert_eq!(bytes, messages * message_size, "{name}: payload bytes");
    let secs = f(report, &["totals", "elapsed_seconds"]);
    assert!(secs > 0.0, "{name}: elapsed");
    let mbps = f(report, &["totals", "megabytes_per_second"]);
    assert!(
        (mbps - bytes as f64 / secs / 1e6).abs() <= 1e-6 * mbps.max(1.0),
        "{name}: MB/s {mbps} vs {bytes} B in {secs} s"
    );
    let mps = f(report, &["totals", "messages_per_second"]);
    assert!(
        (mps - messages as f64 / secs).abs() <= 1e-6 * mps.max(1.0),
        "{name}: msg/s"
    );
    let latency = &report["latency"];
    let order = [
        "min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "p9999_ms", "max_ms",
    ];
    let values: Vec<f64> = order.iter().map(|k| f(latency, &[k])).collect();
    assert!(values[0] > 0.0, "{name}: min latency {values:?}");
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "{name}: percentiles out of order: {values:?}"
    );
    // The merged histogram holds every actor's samples, no more, no less.
    let per_actor: u64 = report["actors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["latency"].is_object())
        .filter(|a| {
            let role = a["role"].as_str().unwrap();
            let producers = ["pinned-producer", "balanced-producer", "baseline"]
                .contains(&report["plan"]["kind"].as_str().unwrap());
            (role == "producer") == producers
        })
        .map(|a| u(a, &["latency", "samples"]))
        .sum();
    assert_eq!(
        u(latency, &["samples"]),
        per_actor,
        "{name}: merged samples"
    );
}

async fn logged_in(addr: std::net::SocketAddr) -> IggyClient {
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
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("login: {e:?}"),
        }
    }
}

/// Messages the server holds in the bench's stream `s` (1-based name).
async fn messages_in(client: &IggyClient, stream: u32) -> u64 {
    let topic = client
        .get_topic(
            &Identifier::named(&format!("replog-bench-{stream}")).unwrap(),
            &Identifier::named("bench").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    topic.partitions.iter().map(|p| p.messages_count).sum()
}

#[test]
fn given_replog_when_every_mode_runs_a_small_workload_should_report_consistent_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(&dir.path().join("data")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(40), logged_in(server.addr))
            .await
            .expect("logged in within 40 s")
    });
    let shape = ["-m", "200", "-p", "20", "-b", "30"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        shape.iter().copied().chain(extra.iter().copied()).collect()
    };

    // Two pinned producers: 2 × 30 batches × 20 messages, on the server too.
    let r = bench(
        &server,
        dir.path(),
        "pp",
        &with(&["pinned-producer", "--producers", "2"]),
    );
    assert_consistent("pinned-producer", &r, 200);
    assert_eq!(u(&r, &["latency", "samples"]), 60);
    let held = rt.block_on(async { messages_in(&client, 1).await + messages_in(&client, 2).await });
    assert_eq!(held, 1_200, "the server holds what the producers counted");

    // Balanced producers over 3 partitions of one stream.
    let r = bench(
        &server,
        dir.path(),
        "bp",
        &with(&["balanced-producer", "--producers", "2", "--partitions", "3"]),
    );
    assert_consistent("balanced-producer", &r, 200);
    assert_eq!(rt.block_on(messages_in(&client, 1)), 1_200);

    // Pinned consumers read exactly what the fill wrote; warm-up re-reads
    // the start and is not counted.
    let r = bench(
        &server,
        dir.path(),
        "pc",
        &with(&["-w", "200ms", "pinned-consumer", "--consumers", "2"]),
    );
    assert_consistent("pinned-consumer", &r, 200);

    // Three members of one group over two partitions: every message once.
    let r = bench(
        &server,
        dir.path(),
        "bcg",
        &with(&[
            "balanced-consumer-group",
            "--consumers",
            "3",
            "--partitions",
            "2",
        ]),
    );
    assert_consistent("balanced-consumer-group", &r, 200);

    // End to end, open loop at 2 MB/s with a warm-up: one latency sample
    // per measured batch, and it takes at least the schedule's length
    // (2 actors × 30 batches × 4 KB at 2 MB/s ≈ 0.12 s).
    let r = bench(
        &server,
        dir.path(),
        "e2e",
        &with(&[
            "--rate",
            "2MB",
            "-w",
            "100ms",
            "end-to-end",
            "--producers",
            "2",
        ]),
    );
    assert_consistent("end-to-end", &r, 200);
    assert_eq!(u(&r, &["latency", "samples"]), 60);
    assert_eq!(u(&r, &["totals", "messages_sent"]), 1_200);
    assert!(f(&r, &["totals", "elapsed_seconds"]) >= 0.11, "{r}");
    // The warm-up's messages are on the server but not in the report.
    assert!(rt.block_on(messages_in(&client, 1)) > 600);

    drop(client);
    server.stop().unwrap();
}

#[test]
fn given_the_baseline_receiver_when_pinned_producers_send_to_it_should_report_every_frame_appended()
{
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("receiver");
    std::fs::create_dir(&files).unwrap();
    let files_arg = files.to_str().unwrap();
    // 3 producers × (warm-up + 40 batches) of 25 messages × 300 B.
    let (stdout, r) = run_bench(
        dir.path(),
        "baseline",
        &[
            "-m",
            "300",
            "-p",
            "25",
            "-b",
            "40",
            "-w",
            "100ms",
            "baseline",
            "--producers",
            "3",
            "--dir",
            files_arg,
        ],
    );
    assert_consistent("baseline", &r, 300);
    assert_eq!(r["plan"]["kind"], "baseline");
    assert_eq!(u(&r, &["latency", "samples"]), 120);
    assert_eq!(r["actors"].as_array().unwrap().len(), 3);
    let receiver = &r["receiver"];
    assert_eq!(u(receiver, &["files"]), 3, "{r}");
    assert_eq!(u(receiver, &["connections"]), 3, "{r}");
    // Warm-up frames are appended too; each frame holds at least its
    // payload (300 B × 25) and a 256-byte header.
    let frames = u(receiver, &["frames_appended"]);
    assert!(frames >= 120, "{r}");
    assert!(
        u(receiver, &["bytes_appended"]) >= frames * (256 + 25 * 300),
        "{r}"
    );
    assert!(stdout.contains("baseline receiver: "), "{stdout}");
    assert!(stdout.contains("p99.99"), "{stdout}");
    // The receiver's own directory is gone; the parent stays.
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), 0);
}

#[test]
fn given_a_small_partition_when_the_transfer_mode_runs_should_time_the_wiped_replicas_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let replog = testkit::replog_binary().unwrap();
    // 1,200 sends: past the 1,024 prepares a primary keeps per group, so
    // the wiped replica needs a state transfer, not only journal repair.
    let (stdout, r) = run_bench(
        dir.path(),
        "transfer",
        &[
            "-m",
            "500",
            "-p",
            "2",
            "transfer",
            "--size",
            "1200KB",
            "--timeout",
            "60s",
            "--replog",
            replog.to_str().unwrap(),
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let plan = &r["plan"];
    assert_eq!(u(plan, &["batches"]), 1_200, "{r}");
    assert_eq!(u(&r, &["fill", "payload_bytes"]), 1_200_000, "{r}");
    assert_eq!(u(&r, &["fill", "messages"]), 2_400, "{r}");
    let agreed = &r["partition"]["state"];
    assert_eq!(u(agreed, &["messages"]), 2_400, "{r}");
    // One op per send, on top of the partition's creation.
    assert!(u(agreed, &["commit_min"]) >= 1_200, "{r}");
    let catch_up = &r["catch_up"];
    assert_ne!(
        u(catch_up, &["replica"]),
        u(&r, &["partition", "primary_replica"]),
        "a backup is wiped"
    );
    assert_eq!(
        &catch_up["state"]["size_bytes"], &agreed["size_bytes"],
        "{r}"
    );
    assert_eq!(&catch_up["state"]["messages"], &agreed["messages"], "{r}");
    assert!(u(catch_up, &["transfer_installs"]) >= 1, "{r}");
    assert!(u(catch_up, &["transfer_received_bytes"]) > 0, "{r}");
    let secs = f(catch_up, &["seconds"]);
    assert!(
        secs >= f(catch_up, &["serving_seconds"]) && secs > 0.0,
        "{r}"
    );
    let size = u(agreed, &["size_bytes"]) as f64;
    assert!((f(catch_up, &["megabytes_per_second"]) - size / secs / 1e6).abs() < 1e-6);
    let disk = &r["disk"];
    assert!(u(disk, &["bytes"]) >= size as u64, "{r}");
    let rw = f(disk, &["read_write_megabytes_per_second"]);
    assert!(rw > 0.0, "{r}");
    let ratio = f(&r, &["ratio_to_disk_read_write"]);
    assert!(
        (ratio - f(catch_up, &["megabytes_per_second"]) / rw).abs() < 1e-9,
        "{r}"
    );
    assert!(stdout.contains("catch-up / disk read+write: "), "{stdout}");
    assert_run_dir_removed(dir.path(), "replog-bench-transfer");
}

#[test]
fn given_a_few_partitions_when_the_failover_mode_kills_their_primary_should_time_each_partitions_return()
 {
    let dir = tempfile::tempdir().unwrap();
    let replog = testkit::replog_binary().unwrap();
    let (stdout, r) = run_bench(
        dir.path(),
        "failover",
        &[
            "-m",
            "100",
            "-p",
            "10",
            "failover",
            "--partitions",
            "12",
            "--producers",
            "1",
            "--probers",
            "4",
            "--load",
            "1s",
            "--heartbeat-ms",
            "300",
            "--primary-timeout-ms",
            "1500",
            "--timeout",
            "60s",
            "--replog",
            replog.to_str().unwrap(),
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let led = u(&r, &["victim_partitions"]);
    // The victim led the most partitions once they were created (at
    // least a third); a view change since may have moved some away.
    assert!((1..=12).contains(&led), "{r}");
    let victim = &r["victim_recovery"];
    let all = &r["all_recovery"];
    assert_eq!(u(victim, &["count"]), led, "{r}");
    assert_eq!(u(all, &["count"]), 12, "{r}");
    for spread in [victim, all] {
        let (p50, p90, p99, max) = (
            f(spread, &["p50"]),
            f(spread, &["p90"]),
            f(spread, &["p99"]),
            f(spread, &["max"]),
        );
        assert!(0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= max, "{r}");
    }
    // A partition that lost its primary cannot take a produce before a
    // backup stops waiting for it: the primary timeout less the heartbeat
    // it may have just heard (1.5 s − 0.3 s). Well under the default 5 s
    // timeout, so the replicas ran with the configured one.
    assert!(f(victim, &["p50"]) >= 1.2, "{r}");
    assert!(f(victim, &["max"]) < 5.0, "{r}");
    assert_eq!(f(all, &["max"]), f(victim, &["max"]), "{r}");
    let over = u(&r, &["over_goal"]);
    assert!(over <= 12, "{r}");
    assert!(u(&r, &["load", "batches_ok"]) > 0, "{r}");
    let syncs = &r["syncs"];
    assert!(u(syncs, &["groups_changed_view"]) >= led, "{r}");
    assert!(u(syncs, &["during_failover"]) > 0, "{r}");
    assert!(syncs["per_view_change_without_load"].is_null(), "{r}");
    assert!(
        stdout.contains("produce accepted again, from the kill"),
        "{stdout}"
    );
    assert!(
        stdout.contains("consensus.primary_timeout_ms 1500"),
        "{stdout}"
    );
    assert_run_dir_removed(dir.path(), "replog-bench-failover");
}

#[test]
fn given_a_small_retained_ceiling_when_the_memory_mode_bursts_every_partition_should_report_what_was_kept_within_it()
 {
    let dir = tempfile::tempdir().unwrap();
    let replog = testkit::replog_binary().unwrap();
    // 12 batches of about 100 KB against 64 KiB per shard (two shards).
    let (stdout, r) = run_bench(
        dir.path(),
        "memory",
        &[
            "-m",
            "1000",
            "-p",
            "100",
            "memory",
            "--partitions",
            "12",
            "--senders",
            "3",
            "--retained-bytes-per-shard",
            "64KiB",
            "--settle",
            "1s",
            "--timeout",
            "60s",
            "--replog",
            replog.to_str().unwrap(),
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let batch = u(&r, &["burst_batch_bytes"]);
    assert!(batch > 100_000, "{r}");
    for phase in ["idle", "after_burst"] {
        let replicas = r[phase].as_array().unwrap();
        assert_eq!(replicas.len(), 3, "{r}");
        for m in replicas {
            assert!(u(m, &["resident_bytes"]) > 1024 * 1024, "{r}");
            assert_eq!(u(m, &["retained_bytes_max"]), 2 * 64 * 1024, "{r}");
            assert!(u(m, &["retained_bytes"]) <= 2 * 64 * 1024, "{r}");
            assert!(u(m, &["retained_bytes_peak"]) <= 2 * 64 * 1024, "{r}");
        }
    }
    for m in r["after_burst"].as_array().unwrap() {
        // Each replica applied all 12 burst batches, each larger than a
        // shard's ceiling: it let go of every one.
        assert!(u(m, &["retained_spilled"]) >= 12, "{r}");
    }
    assert!(
        stdout.contains("without a ceiling each replica would keep"),
        "{stdout}"
    );
    assert_run_dir_removed(dir.path(), "replog-bench-memory");
}
