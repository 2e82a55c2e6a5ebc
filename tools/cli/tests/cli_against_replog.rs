//! `replog-cli` against a real `replog` process on a free loopback port
//! with a temporary data directory: create → produce → consume → offsets
//! → status → delete, and the errors a user meets, each command bounded
//! in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{Finished, Replog, run_bounded};

fn cli(addr: SocketAddr, args: &[&str], stdin: &str) -> Finished {
    let mut command = Command::new(env!("CARGO_BIN_EXE_replog-cli"));
    command.arg("--addr").arg(addr.to_string()).args(args);
    run_bounded(command, stdin.as_bytes(), Duration::from_secs(30)).unwrap()
}

/// Runs a command that must succeed and returns its stdout.
fn ok(addr: SocketAddr, args: &[&str], stdin: &str) -> String {
    let done = cli(addr, args, stdin);
    assert!(
        done.status.success(),
        "replog-cli {args:?}: {}\nstdout:\n{}\nstderr:\n{}",
        done.status,
        done.stdout,
        done.stderr
    );
    done.stdout
}

/// Runs a command that must fail and returns its stderr.
fn fails(addr: SocketAddr, args: &[&str]) -> String {
    let done = cli(addr, args, "");
    assert!(
        !done.status.success(),
        "replog-cli {args:?} succeeded: {}",
        done.stdout
    );
    done.stderr
}

#[test]
fn given_replog_when_the_cli_round_trips_streams_messages_and_offsets_should_read_back_what_it_wrote()
 {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(&dir.path().join("data")).unwrap();
    let addr = server.addr;
    // The root user exists once group 0 has elected its first primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(addr, &["stream", "list"], "").status.success() {
        assert!(Instant::now() < deadline, "no login within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }

    assert!(ok(addr, &["stream", "create", "orders"], "").contains("created stream orders"));
    let err = fails(addr, &["stream", "create", "orders"]);
    assert!(
        err.contains("\"orders\"") && err.contains(&addr.to_string()),
        "{err}"
    );
    let out = ok(
        addr,
        &["topic", "create", "orders", "eu", "--partitions", "2"],
        "",
    );
    assert!(out.contains("with 2 partitions"), "{out}");
    assert!(ok(addr, &["stream", "list"], "").contains("orders"));
    assert!(ok(addr, &["topic", "list", "orders"], "").contains("eu"));

    // Produce from stdin (the empty line is skipped) and from a file.
    let done = cli(
        addr,
        &[
            "produce",
            "orders",
            "eu",
            "--partition",
            "1",
            "--batch",
            "2",
        ],
        "alpha\nbeta\n\ngamma\n",
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert!(done.stderr.contains("sent 3 messages"), "{}", done.stderr);
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, "one\ntwo\n").unwrap();
    ok(
        addr,
        &[
            "produce",
            "orders",
            "eu",
            "--partition",
            "0",
            "--file",
            file.to_str().unwrap(),
        ],
        "",
    );

    // Consume from an offset, with offsets shown.
    let out = ok(
        addr,
        &[
            "consume",
            "orders",
            "eu",
            "--partition",
            "1",
            "--offset",
            "1",
            "--show-offsets",
        ],
        "",
    );
    assert_eq!(out, "1 1\tbeta\n1 2\tgamma\n");

    // Consume after the stored offset, committing: two now, one later.
    let reader = ["--consumer", "reader"];
    let mut args = vec![
        "consume",
        "orders",
        "eu",
        "--partition",
        "1",
        "--count",
        "2",
    ];
    args.extend(reader);
    assert_eq!(ok(addr, &args, ""), "alpha\nbeta\n");
    let mut get = vec!["offset", "get", "orders", "eu", "--partition", "1"];
    get.extend(reader);
    assert!(
        ok(addr, &get, "").starts_with("stored offset 1 "),
        "{}",
        ok(addr, &get, "")
    );
    let mut args = vec!["consume", "orders", "eu", "--partition", "1"];
    args.extend(reader);
    assert_eq!(ok(addr, &args, ""), "gamma\n");
    // Rewind by storing an offset: the next read starts after it.
    let mut set = vec!["offset", "set", "orders", "eu", "--partition", "1", "0"];
    set.extend(reader);
    ok(addr, &set, "");
    assert_eq!(ok(addr, &args, ""), "beta\ngamma\n");
    let err = fails(
        addr,
        &[
            "offset",
            "get",
            "orders",
            "eu",
            "--partition",
            "0",
            "--consumer",
            "nobody",
        ],
    );
    assert!(
        err.contains("has no stored offset") && err.contains("\"nobody\""),
        "{err}"
    );

    // --follow sees a message produced after it started.
    let follower = {
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_replog-cli"));
            command.args([
                "--addr",
                &addr,
                "consume",
                "orders",
                "eu",
                "--partition",
                "0",
                "--offset",
                "2",
                "--follow",
                "--count",
                "1",
            ]);
            run_bounded(command, b"", Duration::from_secs(30)).unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    ok(
        addr,
        &["produce", "orders", "eu", "--partition", "0"],
        "late\n",
    );
    let followed = follower.join().unwrap();
    assert!(followed.status.success(), "{}", followed.stderr);
    assert_eq!(followed.stdout, "late\n");

    // A consumer group member reads both partitions, each message once.
    let out = ok(
        addr,
        &["consume", "orders", "eu", "--group", "g1", "--show-offsets"],
        "",
    );
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "0 0\tone",
            "0 1\ttwo",
            "0 2\tlate",
            "1 0\talpha",
            "1 1\tbeta",
            "1 2\tgamma"
        ]
    );
    assert_eq!(
        ok(addr, &["consume", "orders", "eu", "--group", "g1"], ""),
        ""
    );
    // A group whose first partition is empty still reads the others (the
    // SDK polls one assigned partition per poll, in turn).
    ok(
        addr,
        &["topic", "create", "orders", "sparse", "--partitions", "3"],
        "",
    );
    ok(
        addr,
        &["produce", "orders", "sparse", "--partition", "2"],
        "x\ny\n",
    );
    assert_eq!(
        ok(
            addr,
            &[
                "consume",
                "orders",
                "sparse",
                "--group",
                "g2",
                "--show-offsets"
            ],
            ""
        ),
        "2 0\tx\n2 1\ty\n"
    );
    ok(addr, &["topic", "delete", "orders", "sparse"], "");

    // Status: the node, every partition with its message count, the group.
    let status = ok(addr, &["status"], "");
    assert!(status.contains(": 1 node\n"), "{status}");
    let port = addr.port().to_string();
    assert!(
        status
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().any(|w| w == port)),
        "the node row names the client port: {status}"
    );
    let partition_rows: Vec<Vec<&str>> = status
        .lines()
        .filter(|l| l.starts_with("orders "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        partition_rows.contains(&vec![
            "orders",
            "eu",
            "0",
            "3",
            partition_rows[0][4],
            "2",
            "1"
        ]),
        "{status}"
    );
    assert!(
        partition_rows.iter().any(|r| r[2] == "1" && r[3] == "3"),
        "{status}"
    );
    assert!(partition_rows.iter().any(|r| r[2] == "g1"), "{status}");
    // The per-group table (REPLOG_STATUS): one replica, the metadata group
    // and every partition group, each primary here and Normal; partition 0
    // of "eu" holds its 3 messages.
    assert!(status.contains("\nreplica  address"), "{status}");
    let group_rows: Vec<Vec<&str>> = status
        .lines()
        .skip_while(|l| !l.starts_with("group "))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        group_rows
            .iter()
            .any(|r| r[..5] == ["metadata", "-", "0", "primary", "normal"]),
        "{status}"
    );
    assert!(
        group_rows
            .iter()
            .any(|r| r[1].ends_with("/0") && r[3] == "primary" && r[9] == "3" && r[10] == "-"),
        "{status}"
    );
    assert!(
        group_rows.iter().all(|r| r[4] == "normal" && r[8] == "0"),
        "{status}"
    );

    // Delete, then the errors name what is missing.
    ok(addr, &["topic", "delete", "orders", "eu"], "");
    let err = fails(addr, &["consume", "orders", "eu", "--offset", "0"]);
    assert!(
        err.contains("\"eu\"") && err.contains("\"orders\""),
        "{err}"
    );
    ok(addr, &["stream", "delete", "orders"], "");
    let err = fails(addr, &["stream", "delete", "orders"]);
    assert!(err.contains("deleting stream \"orders\""), "{err}");
    assert!(!ok(addr, &["stream", "list"], "").contains("orders"));

    // A wrong password and a dead address are sentences, not panics.
    let mut command = Command::new(env!("CARGO_BIN_EXE_replog-cli"));
    command.args(["--addr", &addr.to_string(), "--password", "wrong", "status"]);
    let done = run_bounded(command, b"", Duration::from_secs(30)).unwrap();
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("logging in as \"iggy\""),
        "{}",
        done.stderr
    );
    server.stop().unwrap();
    let err = fails(addr, &["status"]);
    assert!(err.contains("could not connect to"), "{err}");
}

/// A topic's expiry and size ceiling are set at creation, shown by `topic
/// list`, and changed by `topic update`, which keeps what it is not given
/// (the name too); a value the SDK cannot parse is a usage error.
#[test]
fn given_a_topic_with_retention_when_updated_should_change_only_what_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let server = Replog::start(&dir.path().join("data")).unwrap();
    let addr = server.addr;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(addr, &["stream", "create", "logs"], "")
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "no login within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(
        addr,
        &[
            "topic",
            "create",
            "logs",
            "app",
            "--message-expiry",
            "1h",
            "--max-size",
            "10MB",
        ],
        "",
    );
    let row = |listing: String| {
        listing
            .lines()
            .find(|l| l.contains(" app ") || l.contains(" web "))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let created = row(ok(addr, &["topic", "list", "logs"], ""));
    assert!(
        created.contains("1h") && created.contains("10.00 MB"),
        "{created}"
    );
    ok(
        addr,
        &["topic", "update", "logs", "app", "--max-size", "20MB"],
        "",
    );
    let resized = row(ok(addr, &["topic", "list", "logs"], ""));
    assert!(
        resized.contains(" app ") && resized.contains("1h") && resized.contains("20.00 MB"),
        "{resized}"
    );
    ok(
        addr,
        &["topic", "update", "logs", "app", "--name", "web"],
        "",
    );
    let renamed = row(ok(addr, &["topic", "list", "logs"], ""));
    assert!(
        renamed.contains(" web ") && renamed.contains("1h") && renamed.contains("20.00 MB"),
        "{renamed}"
    );
    let err = fails(
        addr,
        &["topic", "update", "logs", "web", "--message-expiry", "soon"],
    );
    assert!(err.contains("--message-expiry"), "{err}");
}
