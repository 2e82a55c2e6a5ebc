//! The `failover` mode: how long the partitions of a killed replica stay
//! unable to take a produce.
//!
//! The run, in order: start a three-replica cluster ([`super::process`]);
//! create one topic of `--partitions` partitions; wait until every replica
//! holds every partition's group and each group has one primary
//! ([`super::metrics`]); send one message to every partition through the
//! two replicas that will survive (so each knows where every primary is);
//! start `--producers` producers on the survivors, spreading the global
//! batch shape over the partitions round robin, for `--load`; then
//! `kill -9` the replica that is primary of the most partitions. From the
//! kill, `--probers` probers (on the survivors) send a one-message batch to
//! every partition that has not yet accepted one, over and over, until
//! every partition has: a partition's recovery time is the time from the
//! kill to the first produce it acknowledged.
//!
//! The syncs the view changes cost are the survivors' fsyncs
//! (`replog_fsync_duration_seconds_count`) from the kill until every
//! partition recovered, next to the same survivors' fsyncs in as long a
//! window of the same load just before the kill.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;

use super::metrics::Scrape;
use super::probe::{connect_probers, probe_until_each_accepts, wait_for_layout};
use super::process::{Cluster, REPLICAS};
use super::{ClusterError, RunSetup, create_topic, in_run_dir, run_dir, scrape_each, sender_plan};
use crate::actors::{self, Target};
use crate::args::{Cli, DurabilityArg, Failover};
use crate::error::BenchError;
use crate::plan::Plan;

/// The goal this mode measures against (docs/benchmarks.md).
const GOAL: Duration = Duration::from_secs(2);
/// A series name.
const FSYNCS: &str = "replog_fsync_duration_seconds_count";

/// A checked failover run.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverPlan {
    /// Partitions of the one topic.
    pub partitions: u32,
    /// Shards per replica.
    pub shards: u32,
    /// Load producers (on the survivors), 0 for none.
    pub producers: u32,
    /// Concurrent probers after the kill.
    pub probers: u32,
    /// How long the load runs before the kill, seconds.
    pub load_seconds: f64,
    /// The load's payload bytes per message.
    pub message_size: u32,
    /// The load's messages per batch.
    pub messages_per_batch: u32,
    /// The topic's durability.
    pub durability: DurabilityArg,
    /// `consensus.heartbeat_ms` of the replicas, if not their default.
    pub heartbeat_ms: Option<u64>,
    /// `consensus.primary_timeout_ms`, if not their default.
    pub primary_timeout_ms: Option<u64>,
    /// The binary, the directory, the timeout, the root user.
    #[serde(flatten)]
    pub setup: RunSetup,
}

impl FailoverPlan {
    /// Checks the flags; the error is a sentence saying what to change.
    pub fn from_cli(cli: &Cli, args: &Failover) -> Result<Self, String> {
        if cli.message_size == 0 || cli.messages_per_batch == 0 {
            return Err("--message-size and --messages-per-batch must be at least 1".into());
        }
        if args.partitions == 0 || args.shards == 0 || args.probers == 0 {
            return Err("failover: --partitions, --shards and --probers must be at least 1".into());
        }
        if cli.rate.is_some() || cli.message_batches.is_some() || cli.total_data.is_some() {
            return Err(
                "failover loads for --load; --rate, --message-batches and --total-data do not apply"
                    .into(),
            );
        }
        Ok(Self {
            partitions: args.partitions,
            shards: args.shards,
            producers: args.producers,
            probers: args.probers,
            load_seconds: args.load.as_secs_f64(),
            message_size: cli.message_size,
            messages_per_batch: cli.messages_per_batch,
            durability: cli.durability,
            heartbeat_ms: args.heartbeat_ms,
            primary_timeout_ms: args.primary_timeout_ms,
            setup: RunSetup::from_cli(cli, &args.run, args.timeout)?,
        })
    }

    /// The replicas' `[consensus]` section, if a flag sets one.
    fn consensus_toml(&self) -> String {
        let mut keys = String::new();
        if let Some(ms) = self.heartbeat_ms {
            keys.push_str(&format!("heartbeat_ms = {ms}\n"));
        }
        if let Some(ms) = self.primary_timeout_ms {
            keys.push_str(&format!("primary_timeout_ms = {ms}\n"));
        }
        if keys.is_empty() {
            keys
        } else {
            format!("\n[consensus]\n{keys}")
        }
    }

    /// A client plan against `addr` with `messages_per_batch` messages of
    /// `message_size` bytes.
    fn client_plan(&self, addr: SocketAddr, message_size: u32, messages_per_batch: u32) -> Plan {
        sender_plan(
            &self.setup,
            self.durability,
            self.partitions,
            addr,
            (message_size, messages_per_batch),
        )
    }

    /// A prober's plan: one small message per batch.
    fn probe_plan(&self, addr: SocketAddr) -> Plan {
        self.client_plan(addr, 16, 1)
    }
}

/// Percentiles of a set of durations, seconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// How many.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// The longest.
    pub max: f64,
}

impl Spread {
    /// Nearest-rank percentiles of `seconds` (exact: every value is kept).
    pub fn of(seconds: &[f64]) -> Self {
        let mut v = seconds.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let r = (q * v.len() as f64).ceil() as usize;
            v[r.clamp(1, v.len()) - 1]
        };
        Self {
            count: v.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }

    fn render(&self) -> String {
        format!(
            "{} partitions: P50 {:.3} s, P90 {:.3} s, P99 {:.3} s, max {:.3} s",
            self.count, self.p50, self.p90, self.p99, self.max
        )
    }
}

/// The load beside the failover.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LoadReport {
    /// Batches acknowledged, from the load's start to the last recovery.
    pub batches_ok: u64,
    /// Batches refused or failed (a partition between primaries).
    pub batches_failed: u64,
}

/// The syncs the failover cost the survivors.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SyncReport {
    /// Survivors' fsyncs from the kill to the last recovery.
    pub during_failover: u64,
    /// Survivors' fsyncs in as long a window of load just before the kill.
    pub before_kill_same_window: u64,
    /// Survivors' fsyncs while the probers sent one message to every
    /// partition before the kill (no load yet; the second such round, as
    /// the first creates the partitions' files): what the probes alone
    /// cost, since a produce costs syncs too (the applied point's record).
    pub probe_round: u64,
    /// How long that round took, seconds: one produce into every
    /// partition with no failure.
    pub probe_round_seconds: f64,
    /// Group replicas whose view rose on a survivor (partitions and group
    /// 0; a group counts once per survivor).
    pub groups_changed_view: u64,
    /// `(during_failover − probe_round) / groups_changed_view` when the
    /// run had no load (`--producers 0`), so that every other sync belongs
    /// to the failover.
    /// Under load the load's own syncs mix in, and the load stalls on the
    /// partitions that lost their primary, so no difference of the two
    /// windows isolates the view changes.
    pub per_view_change_without_load: Option<f64>,
}

/// A failover run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    /// The run as planned.
    pub plan: FailoverPlan,
    /// The run's directory.
    pub dir: PathBuf,
    /// Whether it was kept.
    pub kept: bool,
    /// The killed replica.
    pub victim: usize,
    /// Partitions whose primary it was at the kill (read just before it).
    pub victim_partitions: u32,
    /// Whether it was also group 0's primary.
    pub victim_led_metadata: bool,
    /// Seconds from the kill to each recovery: the victim's partitions.
    pub victim_recovery: Spread,
    /// The same over every partition.
    pub all_recovery: Spread,
    /// Partitions that took longer than the goal (2 s).
    pub over_goal: usize,
    /// The load.
    pub load: LoadReport,
    /// The survivors' syncs.
    pub syncs: SyncReport,
}

impl FailoverReport {
    /// The text report.
    pub fn render(&self) -> String {
        let p = &self.plan;
        let mut out = format!(
            "replog-bench failover: {REPLICAS} replicas ({} shard(s) each, {}), run in {}{}\n",
            p.shards,
            p.setup.replog.display(),
            self.dir.display(),
            if self.kept { " (kept)" } else { " (deleted)" }
        );
        let timers = match (p.heartbeat_ms, p.primary_timeout_ms) {
            (None, None) => "the replicas' default consensus timers".to_owned(),
            (h, t) => format!(
                "consensus.heartbeat_ms {}, consensus.primary_timeout_ms {}",
                h.map_or("default".to_owned(), |v| v.to_string()),
                t.map_or("default".to_owned(), |v| v.to_string())
            ),
        };
        out.push_str(&format!("timers: {timers}\n"));
        out.push_str(&format!(
            "topic: {} partitions ({}); load: {} producer(s) of {} x {} B batches on the survivors, {:.1} s before the kill\n",
            p.partitions,
            p.durability.name(),
            p.producers,
            p.messages_per_batch,
            p.message_size,
            p.load_seconds
        ));
        out.push_str(&format!(
            "killed replica {} (kill -9): primary of {} partitions{}\n",
            self.victim,
            self.victim_partitions,
            if self.victim_led_metadata {
                " and of the metadata group"
            } else {
                ""
            }
        ));
        out.push_str(&format!(
            "produce accepted again, from the kill: its {}\n",
            self.victim_recovery.render()
        ));
        out.push_str(&format!(
            "                                       all {}\n",
            self.all_recovery.render()
        ));
        out.push_str(&format!(
            "over {:?}: {} partition(s)\n",
            GOAL, self.over_goal
        ));
        out.push_str(&format!(
            "load: {} batches acknowledged, {} refused or failed\n",
            self.load.batches_ok, self.load.batches_failed
        ));
        let s = &self.syncs;
        let per = match s.per_view_change_without_load {
            Some(per) => format!("{per:.2} fsyncs per view change (no load)"),
            None => "run with --producers 0 to charge every sync to the view changes".into(),
        };
        out.push_str(&format!(
            "survivors' fsyncs: {} from the kill to the last recovery, {} in as long a window of load before it, {} for one probe of every partition before the kill ({:.3} s); {} group replica(s) changed view: {per}\n",
            s.during_failover,
            s.before_kill_same_window,
            s.probe_round,
            s.probe_round_seconds,
            s.groups_changed_view
        ));
        out
    }
}

/// Runs `plan` in a fresh directory below its `--dir`.
pub async fn run(plan: FailoverPlan) -> Result<FailoverReport, BenchError> {
    let dir = run_dir(&plan.setup.parent_dir, "replog-bench-failover")?;
    let mut report = in_run_dir(&dir, plan.setup.keep, run_in(&plan, &dir)).await?;
    report.kept = plan.setup.keep;
    Ok(report)
}

fn progress(what: std::fmt::Arguments<'_>) {
    super::progress("failover", what);
}

async fn run_in(plan: &FailoverPlan, dir: &Path) -> Result<FailoverReport, ClusterError> {
    let mut cluster = Cluster::configure(
        &plan.setup.replog,
        dir,
        plan.shards,
        &plan.setup.username,
        &plan.setup.password,
        &plan.consensus_toml(),
    )?;
    progress(format_args!(
        "starting {REPLICAS} replicas in {}",
        dir.display()
    ));
    for id in 0..REPLICAS {
        tokio::task::block_in_place(|| cluster.start(id, false))?;
    }
    let admin_plan = plan.probe_plan(cluster.specs[0].client);
    progress(format_args!(
        "creating a topic of {} partitions",
        plan.partitions
    ));
    let (stream_id, topic_id) =
        create_topic(&admin_plan, plan.partitions, plan.setup.timeout).await?;
    let layout = wait_for_layout(
        plan.partitions,
        plan.setup.timeout,
        &mut cluster,
        stream_id,
        topic_id,
    )
    .await?;

    // The victim: the replica that leads the most partitions.
    let mut led = [0u32; REPLICAS];
    for (_, p) in &layout.partitions {
        led[*p] += 1;
    }
    let victim = (0..REPLICAS)
        .max_by_key(|&i| (led[i], REPLICAS - i))
        .unwrap_or(0);
    let survivors: Vec<usize> = (0..REPLICAS).filter(|&i| i != victim).collect();
    let survivor_addrs: Vec<SocketAddr> =
        survivors.iter().map(|&i| cluster.specs[i].client).collect();

    progress(format_args!(
        "every replica holds the {} groups; one message to each through the survivors {survivors:?}",
        plan.partitions
    ));
    let probers = connect_probers(
        (0..plan.probers as usize)
            .map(|i| plan.probe_plan(survivor_addrs[i % survivor_addrs.len()])),
    )
    .await?;
    let all: Vec<u32> = (0..plan.partitions).collect();
    // Twice: the first produce into a new partition creates its files, so
    // the second round is what a probe after the kill costs without the
    // failover.
    let mut probe_round = 0;
    let mut probe_round_seconds = 0.0;
    for _ in 0..2 {
        let before_probe = fsyncs(&mut cluster, &survivors).await?;
        let probe_started = Instant::now();
        let accepted =
            probe_until_each_accepts(&probers, &all, probe_started, plan.setup.timeout).await?;
        probe_round_seconds = probe_started.elapsed().as_secs_f64();
        probe_round = fsyncs(&mut cluster, &survivors)
            .await?
            .saturating_sub(before_probe);
        if accepted.len() != all.len() {
            return Err(ClusterError::Timeout {
                phase: "one message to every partition before the kill",
                limit: plan.setup.timeout,
                last: format!("{} of {} accepted", accepted.len(), all.len()),
            });
        }
    }

    let load = Load::start(plan, &survivor_addrs);
    let load_for = Duration::from_secs_f64(plan.load_seconds);
    tokio::time::sleep(load_for / 2).await;
    let window_start = Instant::now();
    let before_start = fsyncs(&mut cluster, &survivors).await?;
    tokio::time::sleep(load_for / 2).await;
    // Read again: a view change since the first reading (a shard stalled
    // past the primary timeout while the partitions were created or
    // loaded) may have moved some primaries. The victim stays the one the
    // probers and the load were kept away from; what it leads now is what
    // the kill takes.
    let layout = wait_for_layout(
        plan.partitions,
        plan.setup.timeout,
        &mut cluster,
        stream_id,
        topic_id,
    )
    .await?;
    let led_at_kill = layout
        .partitions
        .iter()
        .filter(|(_, p)| *p == victim)
        .count() as u32;
    let (before_kill, views_before) = fsyncs_and_views(&mut cluster, &survivors).await?;
    let window = window_start.elapsed();

    progress(format_args!(
        "killing replica {victim} (primary of {led_at_kill} partitions)"
    ));
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim))?;
    let (led_by_victim, others): (Vec<u32>, Vec<u32>) = all
        .iter()
        .partition(|p| layout.partitions[**p as usize].1 == victim);
    let order: Vec<u32> = others.into_iter().chain(led_by_victim).collect();
    let recovered =
        probe_until_each_accepts(&probers, &order, killed_at, plan.setup.timeout).await?;
    let failover = killed_at.elapsed();
    let (after, views_after) = fsyncs_and_views(&mut cluster, &survivors).await?;
    let load = load.stop().await;
    if recovered.len() != all.len() {
        return Err(ClusterError::Timeout {
            phase: "every partition accepting produce after the kill",
            limit: plan.setup.timeout,
            last: format!("{} of {} accepted", recovered.len(), all.len()),
        });
    }
    progress(format_args!(
        "every partition accepts produce again; stopping the cluster"
    ));
    tokio::task::block_in_place(|| cluster.stop_all())?;

    let mut victim_times = Vec::new();
    let mut all_times = Vec::new();
    for (partition, seconds) in &recovered {
        all_times.push(*seconds);
        if layout.partitions[*partition as usize].1 == victim {
            victim_times.push(*seconds);
        }
    }
    let during = after.saturating_sub(before_kill);
    // The window before the kill, stretched to the failover's length.
    let before_same = if window.is_zero() {
        0
    } else {
        ((before_kill.saturating_sub(before_start)) as f64 * failover.as_secs_f64()
            / window.as_secs_f64())
        .round() as u64
    };
    let changed = views_after
        .iter()
        .filter(|(key, v)| views_before.get(*key).is_some_and(|b| *v > b))
        .count() as u64;
    Ok(FailoverReport {
        plan: plan.clone(),
        dir: dir.to_path_buf(),
        kept: plan.setup.keep,
        victim,
        victim_partitions: led_at_kill,
        victim_led_metadata: layout.metadata_primary == Some(victim),
        victim_recovery: Spread::of(&victim_times),
        all_recovery: Spread::of(&all_times),
        over_goal: all_times
            .iter()
            .filter(|s| **s > GOAL.as_secs_f64())
            .count(),
        load,
        syncs: SyncReport {
            during_failover: during,
            before_kill_same_window: before_same,
            probe_round,
            probe_round_seconds,
            groups_changed_view: changed,
            per_view_change_without_load: (plan.producers == 0 && changed > 0)
                .then(|| during.saturating_sub(probe_round) as f64 / changed as f64),
        },
    })
}

/// The survivors' fsyncs so far, summed.
async fn fsyncs(cluster: &mut Cluster, ids: &[usize]) -> Result<u64, ClusterError> {
    let scrapes = scrape_each(cluster, ids).await?;
    Ok(scrapes.iter().map(|s| s.sum(FSYNCS) as u64).sum())
}

/// Each survivor's view of each group: (replica, group) → view.
type Views = std::collections::BTreeMap<(usize, String), f64>;

/// The survivors' fsyncs so far and their groups' views, from one scrape
/// of each.
async fn fsyncs_and_views(
    cluster: &mut Cluster,
    ids: &[usize],
) -> Result<(u64, Views), ClusterError> {
    let scrapes = scrape_each(cluster, ids).await?;
    let fsyncs = scrapes.iter().map(|s| s.sum(FSYNCS) as u64).sum();
    let views = ids
        .iter()
        .zip(&scrapes)
        .flat_map(|(&id, s): (&usize, &Scrape)| {
            s.per_group("replog_group_view")
                .into_iter()
                .map(move |(g, v)| ((id, g), v))
        })
        .collect();
    Ok((fsyncs, views))
}

/// The load producers, running until [`Load::stop`].
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: JoinSet<()>,
}

impl Load {
    /// Starts `plan.producers` producers, producer `i` on `addrs[i mod
    /// len]`, each sending the global batch shape to partitions `i`,
    /// `i + producers`, … in turn. A failed send is counted, not fatal (a
    /// partition between primaries refuses it).
    fn start(plan: &FailoverPlan, addrs: &[SocketAddr]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        let partitions = plan.partitions;
        let producers = plan.producers;
        for i in 0..producers {
            let producer_plan = plan.client_plan(
                addrs[i as usize % addrs.len()],
                plan.message_size,
                plan.messages_per_batch,
            );
            let (stop, ok, failed) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
            tasks.spawn(async move {
                let Ok(client) = actors::connect(&producer_plan).await else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let Ok(mut messages) = actors::batch(&producer_plan) else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let mut p = i % partitions;
                while !stop.load(Ordering::Relaxed) {
                    let target = Target {
                        stream: Plan::stream_name(0),
                        partition: Some(p),
                    };
                    let sent =
                        actors::send_batch(&client, &producer_plan, &target, &mut messages, None)
                            .await;
                    let counter = if sent.is_ok() { &ok } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                    p = (p + producers) % partitions;
                }
            });
        }
        Self {
            stop,
            ok,
            failed,
            tasks,
        }
    }

    /// Stops the producers (each finishes its send in flight) and counts.
    async fn stop(mut self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        LoadReport {
            batches_ok: self.ok.load(Ordering::Relaxed),
            batches_failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_durations_when_spread_should_give_nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Spread::of(&v);
        assert_eq!(s.count, 100);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50.0, 90.0, 99.0, 100.0));
        let one = Spread::of(&[0.25]);
        assert_eq!((one.p50, one.p99, one.max), (0.25, 0.25, 0.25));
        let none = Spread::of(&[]);
        assert_eq!((none.count, none.p50, none.max), (0, 0.0, 0.0));
    }
}
