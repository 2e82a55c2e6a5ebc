//! A nemesis over real processes (issue H3, item 2): three `replog`
//! replicas, a producer on the official `iggy` 0.11.0 SDK sending
//! numbered batches round robin to the three partitions of one topic, and
//! a schedule of `kill -9`s running beside it:
//!
//! - `rolling`: every period one replica in turn is killed and started
//!   again `down` later (never two down at once);
//! - `connected`: the same, the victim being the replica the producer is
//!   connected to at that moment;
//! - `whole`: every replica killed at once, all started again `down`
//!   later.
//!
//! The producer never resends a batch: a confirmed send goes into its
//! ledger with the base offset the confirmation named, a failed one as
//! attempted and unconfirmed, and it moves on to the next replica. At the
//! end every partition is read from offset 0 through each replica and
//! [`check`] compares the reads with the ledger. Which schedules and
//! durabilities run, how many kills and at what pace, come from the
//! environment (see [`Params::from_env`]); `scripts/nemesis.sh` runs a
//! long set in release.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use iggy::prelude::*;

#[path = "nemesis/check.rs"]
mod check;
mod support;
use check::{PartitionReport, Sent, Totals};
use support::cluster::{Cluster, transient, try_poll_all};
use support::sdk_flows::{logged_in, runtime};

const STREAM: &str = "nemesis";
const TOPIC: &str = "log";
const PARTITIONS: u32 = 3;
const BATCH_LEN: u32 = 10;
/// Every SDK call's bound: the SDK itself replays transient answers for
/// up to 30 s.
const SDK_CALL_TIMEOUT: Duration = Duration::from_secs(35);
/// A connect's bound (the SDK redials a refused address by itself).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Replicas tried, round robin, before the producer gives up.
const RECONNECT_ATTEMPTS_MAX: u32 = 300;
/// Batches one run sends at most, whatever the schedule's length.
const BATCHES_MAX: u64 = 500_000;
/// Rounds of reading every replica until their reads agree.
const READ_ROUNDS_MAX: u32 = 10;

/// A fault schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    Rolling,
    Connected,
    Whole,
}

impl Schedule {
    fn parse(name: &str) -> Self {
        match name.trim() {
            "rolling" => Self::Rolling,
            "connected" | "rolling-connected" => Self::Connected,
            "whole" => Self::Whole,
            other => panic!("NEMESIS_SCHEDULES: unknown schedule {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Rolling => "rolling",
            Self::Connected => "connected",
            Self::Whole => "whole",
        }
    }
}

fn durability_name(d: Durability) -> &'static str {
    if d.is_persisted() {
        "persisted"
    } else {
        "replicated"
    }
}

/// What a run does, from the environment.
#[derive(Clone, Debug)]
struct Params {
    schedules: Vec<Schedule>,
    durabilities: Vec<Durability>,
    kills: u32,
    period: Duration,
    down: Duration,
}

impl Params {
    /// `NEMESIS_SCHEDULES` (comma list of `rolling`, `connected`, `whole`;
    /// all by default), `NEMESIS_DURABILITY` (`replicated`, `persisted`;
    /// both by default), `NEMESIS_KILLS` (kill steps per schedule and
    /// durability, default 3; a whole-cluster step is one kill),
    /// `NEMESIS_PERIOD_MS` (default 3000) and `NEMESIS_DOWN_MS` (default
    /// 2000, below the period).
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| {
            var(name).map_or(default, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: not a number: {v:?}"))
            })
        };
        let schedules = var("NEMESIS_SCHEDULES")
            .unwrap_or_else(|| "rolling,connected,whole".into())
            .split(',')
            .map(Schedule::parse)
            .collect();
        let durabilities = var("NEMESIS_DURABILITY")
            .unwrap_or_else(|| "replicated,persisted".into())
            .split(',')
            .map(|d| match d.trim() {
                "replicated" => Durability::Replicated,
                "persisted" => Durability::Persisted,
                other => panic!("NEMESIS_DURABILITY: unknown durability {other:?}"),
            })
            .collect();
        let params = Self {
            schedules,
            durabilities,
            kills: u32::try_from(number("NEMESIS_KILLS", 3)).unwrap(),
            period: Duration::from_millis(number("NEMESIS_PERIOD_MS", 3000)),
            down: Duration::from_millis(number("NEMESIS_DOWN_MS", 2000)),
        };
        assert!(
            params.down < params.period,
            "NEMESIS_DOWN_MS must be below NEMESIS_PERIOD_MS"
        );
        params
    }
}

/// Something the nemesis did, at a time since the run's start.
#[derive(Clone, Debug)]
struct Event {
    at: Duration,
    what: String,
}

/// What the producer did.
#[derive(Debug, Default)]
struct Produced {
    ledger: Vec<Sent>,
    /// When each batch of the ledger was sent, since the run's start.
    sent_at: Vec<Duration>,
    /// Logins that succeeded (the first included).
    connects: u32,
    /// Sends answered Ok without a confirmation for their partition.
    unconfirmed_ok: u32,
    /// Sends that took a second or more to answer (or fail).
    slow_sends: u32,
    /// The longest a send took.
    slowest_send: Duration,
    /// The first few send failures, for the report.
    errors: Vec<String>,
    /// Whether it stopped because no replica let it log in.
    gave_up: bool,
}

/// One (schedule, durability) run's outcome.
struct Outcome {
    schedule: Schedule,
    durability: Durability,
    kills: u32,
    produced: Produced,
    reports: Vec<PartitionReport>,
    totals: Totals,
    reads_ok: usize,
    segments_agree: bool,
    elapsed: Duration,
}

impl Outcome {
    fn summary(&self) -> String {
        let confirmed = self
            .produced
            .ledger
            .iter()
            .filter(|s| s.confirmed.is_some())
            .count();
        let t = &self.totals;
        format!(
            "nemesis schedule={} durability={} kills={} sent={} confirmed={} lost={} reminted={} \
             duplicated={} (confirmed {}, unconfirmed {}) reordered={} gaps={} phantom={} \
             unconfirmed_held={} held={} replicas_agree={} reads={}/3 segments_agree={} \
             connects={} ok_unconfirmed={} slow_sends={} slowest={:.1}s gave_up={} elapsed={:.1}s",
            self.schedule.name(),
            durability_name(self.durability),
            self.kills,
            self.produced.ledger.len(),
            confirmed,
            t.lost,
            t.reminted,
            t.duplicated_confirmed + t.duplicated_unconfirmed,
            t.duplicated_confirmed,
            t.duplicated_unconfirmed,
            t.reordered,
            t.gaps,
            t.phantom,
            t.unconfirmed_held,
            t.held,
            t.replicas_agree,
            self.reads_ok,
            self.segments_agree,
            self.produced.connects,
            self.produced.unconfirmed_ok,
            self.produced.slow_sends,
            self.produced.slowest_send.as_secs_f64(),
            self.produced.gave_up,
            self.elapsed.as_secs_f64(),
        )
    }

    /// What this run's schedule and durability promise, broken.
    fn violations(&self) -> Vec<String> {
        let t = &self.totals;
        let name = format!(
            "{}/{}",
            self.schedule.name(),
            durability_name(self.durability)
        );
        // A kill -9 keeps the page cache, so every schedule here, a
        // whole-cluster kill of a replicated topic included, loses nothing
        // confirmed (docs/operations.md, "Durability": each replica
        // resumes from its replica log). Only a power loss may lose the
        // last recorded-point window of a replicated group.
        let mut broken = Vec::new();
        let mut expect = |ok: bool, what: String| {
            if !ok {
                broken.push(format!("{name}: {what}"));
            }
        };
        expect(t.reminted == 0, format!("{} batches re-minted", t.reminted));
        expect(
            t.duplicated_confirmed == 0,
            format!("{} confirmed batches duplicated", t.duplicated_confirmed),
        );
        expect(t.phantom == 0, format!("{} messages never sent", t.phantom));
        expect(t.gaps == 0, format!("{} offsets missing", t.gaps));
        expect(t.replicas_agree, "the replicas' reads differ".into());
        expect(
            self.reads_ok == 3,
            format!("{}/3 replicas read", self.reads_ok),
        );
        expect(t.lost == 0, format!("{} confirmed batches lost", t.lost));
        expect(
            t.reordered == 0,
            format!("{} confirmed batches reordered", t.reordered),
        );
        broken
    }
}

/// A client of `addr` logged in as root, or why not, each step bounded.
async fn try_login(addr: SocketAddr) -> Result<IggyClient, String> {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .build()
        .map_err(|e| format!("build: {e}"))?;
    match tokio::time::timeout(CONNECT_TIMEOUT, client.connect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("connect {addr}: {e}")),
        Err(_) => return Err(format!("connect {addr}: timed out")),
    }
    match tokio::time::timeout(SDK_CALL_TIMEOUT, client.login_user("iggy", "iggy")).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(format!("login {addr}: {e}")),
        Err(_) => Err(format!("login {addr}: timed out")),
    }
}

/// Logs in on the replicas round robin from `*next`, at most
/// [`RECONNECT_ATTEMPTS_MAX`] attempts and not past `deadline`; records
/// the replica connected to in `current`. `None` when stopped or out of
/// attempts.
async fn reconnect(
    clients: &[SocketAddr],
    next: &mut usize,
    current: &AtomicUsize,
    stop: &AtomicBool,
    deadline: Instant,
) -> Option<IggyClient> {
    for _ in 0..RECONNECT_ATTEMPTS_MAX {
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            return None;
        }
        let i = *next;
        *next = (*next + 1) % clients.len();
        if let Ok(client) = try_login(clients[i]).await {
            current.store(i, Ordering::Relaxed);
            return Some(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Creates the stream and its topic of [`PARTITIONS`] partitions with
/// `durability` through `addr` (logging in as soon as the root user
/// exists), retrying transient answers (30 s).
async fn create_topic(addr: SocketAddr, durability: Durability) {
    let client = logged_in(addr).await;
    let stream = Identifier::named(STREAM).unwrap();
    let options = TopicCreateOptions {
        partitions_count: Some(PARTITIONS),
        durability,
        ..TopicCreateOptions::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut created_stream = false;
    loop {
        let step = if created_stream {
            client
                .create_topic(&stream, TOPIC, &options)
                .await
                .map(|_| true)
        } else {
            client.create_stream(STREAM).await.map(|_| false)
        };
        match step {
            Ok(true) => return,
            Ok(false) => created_stream = true,
            Err(e) if transient(&e) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("create: {e:?} (code {})", e.as_code()),
        }
    }
}

/// Sends batches of [`BATCH_LEN`] round robin to the partitions until
/// `stop` (or `deadline`, or [`BATCHES_MAX`]), one at a time, never
/// resending one; after a failed send it logs in on the next replica.
async fn produce(
    clients: &[SocketAddr],
    current: &AtomicUsize,
    stop: &AtomicBool,
    t0: Instant,
    deadline: Instant,
) -> Produced {
    let stream = Identifier::named(STREAM).unwrap();
    let topic = Identifier::named(TOPIC).unwrap();
    let mut produced = Produced::default();
    let mut next = current.load(Ordering::Relaxed);
    let mut client: Option<IggyClient> = None;
    let mut batch = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && batch < BATCHES_MAX {
        let Some(connected) = &client else {
            match reconnect(clients, &mut next, current, stop, deadline).await {
                Some(c) => {
                    produced.connects += 1;
                    next = (current.load(Ordering::Relaxed) + 1) % clients.len();
                    client = Some(c);
                    continue;
                }
                None => {
                    produced.gave_up = !stop.load(Ordering::Relaxed);
                    break;
                }
            }
        };
        let partition = u32::try_from(batch % u64::from(PARTITIONS)).unwrap();
        let mut messages: Vec<IggyMessage> = (0..BATCH_LEN)
            .map(|i| IggyMessage::from_str(&check::payload(batch, i)).unwrap())
            .collect();
        let sent_at = t0.elapsed();
        let answer = tokio::time::timeout(
            SDK_CALL_TIMEOUT,
            connected.send_messages(
                &stream,
                &topic,
                &Partitioning::partition_id(partition),
                &mut messages,
            ),
        )
        .await;
        let took = t0.elapsed() - sent_at;
        produced.slowest_send = produced.slowest_send.max(took);
        if took >= Duration::from_secs(1) {
            produced.slow_sends += 1;
        }
        let confirmed = match answer {
            Ok(Ok(response)) => {
                let found = response
                    .confirmations
                    .iter()
                    .find(|c| c.partition_id == partition)
                    .map(|c| c.base_offset);
                if found.is_none() {
                    produced.unconfirmed_ok += 1;
                }
                found
            }
            Ok(Err(e)) => {
                if produced.errors.len() < 20 {
                    produced.errors.push(format!(
                        "batch {batch} at {sent_at:?}: {e} (code {})",
                        e.as_code()
                    ));
                }
                client = None;
                None
            }
            Err(_) => {
                if produced.errors.len() < 20 {
                    produced
                        .errors
                        .push(format!("batch {batch} at {sent_at:?}: timed out"));
                }
                client = None;
                None
            }
        };
        produced.ledger.push(Sent {
            batch,
            partition,
            confirmed,
        });
        produced.sent_at.push(sent_at);
        batch += 1;
    }
    produced
}

/// Sets the flag when dropped: the producer stops even if the nemesis
/// panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `schedule` on `cluster`: `params.kills` kill steps, one every
/// `params.period` after a first quiet period, each victim started again
/// `params.down` later, then a last quiet period. Returns what it did.
fn run_nemesis(
    cluster: &mut Cluster,
    schedule: Schedule,
    params: &Params,
    current: &AtomicUsize,
    t0: Instant,
) -> Vec<Event> {
    let mut events = Vec::new();
    let mut note = |what: String| {
        events.push(Event {
            at: t0.elapsed(),
            what,
        })
    };
    let sleep_until =
        |at: Instant| std::thread::sleep(at.saturating_duration_since(Instant::now()));
    let start = Instant::now();
    for k in 0..params.kills {
        // The grid point, or at once when the last restart ran late: never
        // two steps overlap, so at most one replica is down (rolling).
        sleep_until(start + params.period * (k + 1));
        let victims: Vec<usize> = match schedule {
            Schedule::Rolling => vec![k as usize % 3],
            Schedule::Connected => vec![current.load(Ordering::Relaxed)],
            Schedule::Whole => vec![0, 1, 2],
        };
        for &v in &victims {
            cluster.kill9(v);
        }
        note(format!("kill -9 {victims:?}"));
        std::thread::sleep(params.down);
        for &v in &victims {
            cluster.start_replica(v);
        }
        note(format!("started {victims:?}"));
    }
    std::thread::sleep(params.period);
    note("schedule over".into());
    events
}

/// Every partition read through each replica: `None` for a replica that
/// could not be read within its bounds.
fn read_replicas(rt: &tokio::runtime::Runtime, clients: &[SocketAddr]) -> Vec<check::ReplicaReads> {
    clients
        .iter()
        .map(|&addr| {
            rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(60);
                let client = loop {
                    match try_login(addr).await {
                        Ok(c) => break c,
                        Err(e) if Instant::now() >= deadline => {
                            eprintln!("nemesis: no read through {addr}: {e}");
                            return None;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                };
                let mut partitions = Vec::new();
                for p in 0..PARTITIONS {
                    let read = tokio::time::timeout(
                        Duration::from_secs(120),
                        try_poll_all(&client, STREAM, TOPIC, p),
                    )
                    .await;
                    match read {
                        Ok(Ok(read)) => partitions.push(read),
                        Ok(Err(e)) => {
                            eprintln!("nemesis: partition {p} through {addr}: {e}");
                            return None;
                        }
                        Err(_) => {
                            eprintln!("nemesis: partition {p} through {addr}: timed out");
                            return None;
                        }
                    }
                }
                Some(partitions)
            })
        })
        .collect()
}

/// The nemesis event last before `at`, and the first after it.
fn around(events: &[Event], at: Duration) -> String {
    let before = events.iter().rev().find(|e| e.at <= at);
    let after = events.iter().find(|e| e.at > at);
    let show = |e: Option<&Event>| {
        e.map_or("-".into(), |e| {
            format!("{} at {:.3}s", e.what, e.at.as_secs_f64())
        })
    };
    format!("after {}; before {}", show(before), show(after))
}

/// One schedule with one durability on a fresh cluster.
fn run_one(schedule: Schedule, durability: Durability, params: &Params) -> Outcome {
    let started = Instant::now();
    let mut cluster =
        Cluster::start_logging(|_| {}, Some("warn,shard::shard=info,partitions::boot=info"));
    let clients = cluster.clients.clone();
    let rt = runtime();
    rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            create_topic(clients[0], durability),
        )
        .await
        .expect("the topic is created within 60 s")
    });
    let current = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    // Each step may wait 30 s for a restarted replica's serving line.
    let deadline = t0 + (params.period + Duration::from_secs(40)) * (params.kills + 2);
    let (events, produced) = std::thread::scope(|s| {
        let nemesis = s.spawn(|| {
            let _stop = SetOnDrop(&stop);
            run_nemesis(&mut cluster, schedule, params, &current, t0)
        });
        let produced = rt.block_on(produce(&clients, &current, &stop, t0, deadline));
        let events = match nemesis.join() {
            Ok(events) => events,
            Err(_) => vec![Event {
                at: t0.elapsed(),
                what: "the nemesis panicked".into(),
            }],
        };
        (events, produced)
    });
    // Read until the replicas agree: a send the producer gave up on may
    // still commit, between one replica's read and the next.
    let mut reads = read_replicas(&rt, &clients);
    for _ in 1..READ_ROUNDS_MAX {
        let first = &reads[0];
        if first.is_some() && reads.iter().all(|r| r == first) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        reads = read_replicas(&rt, &clients);
    }
    let reports = check::check(&produced.ledger, PARTITIONS, BATCH_LEN, &reads);
    let totals = check::totals(&reports);
    let segments_agree = cluster
        .identical_segments_within(Duration::from_secs(20))
        .is_ok();
    let kills = events.iter().filter(|e| e.what.starts_with("kill")).count();
    let outcome = Outcome {
        schedule,
        durability,
        kills: u32::try_from(kills).unwrap(),
        reads_ok: reads.iter().flatten().count(),
        produced,
        reports,
        totals,
        segments_agree,
        elapsed: started.elapsed(),
    };
    report_details(&outcome, &events);
    drop(rt);
    cluster.stop();
    outcome
}

/// The timeline, the producer's first errors, and each lost or re-minted
/// batch with the nemesis step before it.
fn report_details(outcome: &Outcome, events: &[Event]) {
    let label = format!(
        "{}/{}",
        outcome.schedule.name(),
        durability_name(outcome.durability)
    );
    for e in events {
        println!("  [{label}] {:>8.3}s {}", e.at.as_secs_f64(), e.what);
    }
    for e in &outcome.produced.errors {
        println!("  [{label}] send failed: {e}");
    }
    let produced = &outcome.produced;
    let describe = |kind: &str, batch: u64| {
        let i = usize::try_from(batch).unwrap();
        let (sent, at) = (&produced.ledger[i], produced.sent_at[i]);
        println!(
            "  [{label}] {kind}: batch {batch} partition {} confirmed at {:?}, sent at {:.3}s, {}",
            sent.partition,
            sent.confirmed,
            at.as_secs_f64(),
            around(events, at)
        );
    };
    for r in &outcome.reports {
        for &b in r.worst.lost.iter().take(20) {
            describe("lost", b);
        }
        for &b in r.worst.reminted.iter().take(20) {
            describe("re-minted", b);
        }
        for &b in r.worst.duplicated_confirmed.iter().take(20) {
            describe("duplicated", b);
        }
        for &b in r.worst.reordered.iter().take(20) {
            describe("reordered", b);
        }
        if !r.replicas_agree {
            println!(
                "  [{label}] partition {}: the replicas' reads differ",
                r.partition
            );
        }
    }
}

/// Every configured schedule with every configured durability, one after
/// the other on a fresh cluster each; a summary line per run, then every
/// broken promise at once.
#[test]
fn given_kill9_schedules_while_producing_should_keep_every_confirmed_batch_at_its_offset() {
    let params = Params::from_env();
    let mut summaries = Vec::new();
    let mut broken = Vec::new();
    for &schedule in &params.schedules {
        for &durability in &params.durabilities {
            let name = format!("{}/{}", schedule.name(), durability_name(durability));
            let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
                run_one(schedule, durability, &params)
            }));
            match run {
                Ok(outcome) => {
                    let line = outcome.summary();
                    println!("{line}");
                    summaries.push(line);
                    broken.extend(outcome.violations());
                }
                Err(_) => {
                    let line = format!("nemesis {name}: the run panicked");
                    println!("{line}");
                    summaries.push(line.clone());
                    broken.push(line);
                }
            }
        }
    }
    println!("nemesis summary:");
    for line in &summaries {
        println!("{line}");
    }
    assert!(broken.is_empty(), "broken: {broken:#?}");
}

// The checker's own tests: each category counted on a crafted history.

/// A read holding `batches` (batch, first offset) back to back.
fn read_of(batches: &[(u64, u64)], batch_len: u32) -> Vec<(u64, String)> {
    batches
        .iter()
        .flat_map(|&(batch, base)| {
            (0..batch_len).map(move |i| (base + u64::from(i), check::payload(batch, i)))
        })
        .collect()
}

fn sent(batch: u64, partition: u32, confirmed: Option<u64>) -> Sent {
    Sent {
        batch,
        partition,
        confirmed,
    }
}

#[test]
fn given_a_clean_history_when_checked_should_find_nothing() {
    let ledger = [
        sent(0, 0, Some(0)),
        sent(1, 0, None),
        sent(2, 0, Some(4)),
        sent(3, 1, Some(0)),
    ];
    let read = read_of(&[(0, 0), (1, 2), (2, 4)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(
        f,
        check::Findings {
            unconfirmed_held: 1,
            held: 6,
            ..check::Findings::default()
        }
    );
    let reports = check::check(
        &ledger,
        2,
        2,
        &[
            Some(vec![read.clone(), read_of(&[(3, 0)], 2)]),
            Some(vec![read, read_of(&[(3, 0)], 2)]),
        ],
    );
    let t = check::totals(&reports);
    assert!(t.replicas_agree);
    assert_eq!((t.lost, t.reminted, t.gaps, t.held), (0, 0, 0, 8));
}

#[test]
fn given_a_confirmed_batch_read_nowhere_when_checked_should_count_it_lost() {
    let ledger = [
        sent(0, 0, Some(0)),
        sent(1, 0, Some(2)),
        sent(2, 0, Some(4)),
    ];
    // Batch 2 is missing whole, and the last message of batch 1.
    let mut read = read_of(&[(0, 0), (1, 2)], 2);
    read.remove(3);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.lost, vec![1, 2]);
    assert_eq!(f.reminted, Vec::<u64>::new());
    assert_eq!(f.gaps, 0, "a missing tail is no gap");
    let read = read_of(&[(0, 0), (2, 4)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.lost, vec![1]);
    assert_eq!(f.gaps, 2);
}

#[test]
fn given_a_confirmed_offset_holding_another_batch_when_checked_should_count_it_reminted() {
    // Batch 0 was confirmed at 0, then lost, and batch 1 (unconfirmed)
    // got its offsets; batch 2 confirmed at 2 is read at 2 as it should.
    let ledger = [sent(0, 0, Some(0)), sent(1, 0, None), sent(2, 0, Some(2))];
    let read = read_of(&[(1, 0), (2, 2)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.reminted, vec![0]);
    assert_eq!(f.lost, vec![0]);
    // Two confirmations naming one offset: the later one holds it.
    let ledger = [sent(0, 0, Some(0)), sent(1, 0, Some(0))];
    let read = read_of(&[(1, 0), (0, 2)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.reminted, vec![0]);
    assert_eq!(f.lost, Vec::<u64>::new());
    assert_eq!(f.reordered, vec![1]);
}

#[test]
fn given_a_batch_read_twice_when_checked_should_count_it_duplicated_by_confirmation() {
    let ledger = [sent(0, 0, Some(0)), sent(1, 0, None), sent(2, 0, Some(6))];
    let read = read_of(&[(0, 0), (0, 2), (1, 4), (2, 6), (1, 8)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.duplicated_confirmed, vec![0]);
    assert_eq!(f.duplicated_unconfirmed, vec![1]);
    assert_eq!(f.lost, Vec::<u64>::new());
    assert_eq!(f.reminted, Vec::<u64>::new());
    assert_eq!(f.gaps, 0);
}

#[test]
fn given_confirmed_offsets_going_back_in_send_order_when_checked_should_count_them_reordered() {
    let ledger = [
        sent(0, 0, Some(2)),
        sent(1, 1, Some(0)),
        sent(2, 0, Some(0)),
        sent(3, 0, Some(4)),
    ];
    let read = read_of(&[(2, 0), (0, 2), (3, 4)], 2);
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.reordered, vec![2]);
    assert_eq!(
        (f.lost.len(), f.reminted.len()),
        (0, 0),
        "each at its offset"
    );
}

#[test]
fn given_offsets_not_dense_when_checked_should_count_the_gaps() {
    let ledger = [sent(0, 0, None)];
    let mut read = read_of(&[(0, 3)], 3);
    read.push((1, check::payload(0, 0)));
    let f = check::check_read(&ledger, 0, 3, &read);
    // 0..3 missing before the first, and one offset read out of order.
    assert_eq!(f.gaps, 4);
}

#[test]
fn given_messages_never_sent_to_the_partition_when_checked_should_count_them_phantom() {
    let ledger = [sent(0, 0, Some(0)), sent(1, 1, Some(0))];
    let mut read = read_of(&[(0, 0)], 2);
    read.push((2, "garbage".into()));
    read.push((3, check::payload(1, 0)));
    read.push((4, check::payload(0, 7)));
    let f = check::check_read(&ledger, 0, 2, &read);
    assert_eq!(f.phantom, vec![2, 3, 4]);
    assert_eq!(f.lost, Vec::<u64>::new());
}

#[test]
fn given_replicas_reading_differently_when_checked_should_say_they_disagree_and_keep_the_worst() {
    let ledger = [sent(0, 0, Some(0)), sent(1, 0, Some(2))];
    let full = read_of(&[(0, 0), (1, 2)], 2);
    let short = read_of(&[(0, 0)], 2);
    let reports = check::check(
        &ledger,
        1,
        2,
        &[
            Some(vec![full.clone()]),
            Some(vec![short]),
            Some(vec![full.clone()]),
        ],
    );
    assert!(!reports[0].replicas_agree);
    assert_eq!(reports[0].worst.lost, vec![1]);
    let unread = check::check(&ledger, 1, 2, &[Some(vec![full.clone()]), None]);
    assert!(
        !unread[0].replicas_agree,
        "a replica not read is no agreement"
    );
    let same = check::check(&ledger, 1, 2, &[Some(vec![full.clone()]), Some(vec![full])]);
    assert!(same[0].replicas_agree);
    assert_eq!(check::totals(&same).lost, 0);
}

#[test]
fn given_a_payload_when_parsed_should_give_back_its_batch_and_index() {
    assert_eq!(
        check::parse_payload(&check::payload(1234, 9)),
        Some((1234, 9))
    );
    assert_eq!(check::payload(7, 3), "b00000007-3");
    assert_eq!(check::parse_payload("x00000007-3"), None);
    assert_eq!(check::parse_payload("b7"), None);
}
