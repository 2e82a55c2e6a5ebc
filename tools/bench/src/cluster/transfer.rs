//! The `transfer` mode: how fast a replica whose disk was lost gets a
//! partition back, next to what the disk itself can do.
//!
//! The run, in order: start a three-replica cluster of `replog` processes
//! ([`super::process`]); create one stream with one topic of one partition; fill
//! it to `--size` payload bytes with the global batch shape; wait until the
//! three replicas agree on its group ([`super::metrics`]: status normal, the same
//! commit point, the same bytes); stop one backup, delete its data
//! directory and start it again with `--rejoin` (docs/operations.md,
//! "Replacing a lost disk"); time until its group is normal at the
//! primary's commit point with the primary's bytes; stop the cluster; and
//! measure the disk's sequential write+read of as many bytes in the same
//! directory ([`super::disk`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;

use super::disk::{self, DiskSpeed};
use super::metrics::{self, GroupState, Scrape};
use super::process::{Cluster, REPLICAS};
use super::{
    ClusterError, METADATA_GROUP, POLL_INTERVAL, RunSetup, create_topic, in_run_dir, per_second,
    primaries, run_dir, scrape_all, wait_for,
};
use crate::actors::{self, Target};
use crate::args::{Cli, DurabilityArg, Transfer};
use crate::error::BenchError;
use crate::plan::{Kind, Plan};

/// A checked transfer run.
#[derive(Debug, Clone, Serialize)]
pub struct TransferPlan {
    /// Payload bytes asked for (`--size`).
    pub size_bytes: u64,
    /// Payload bytes per message.
    pub message_size: u32,
    /// Messages per batch.
    pub messages_per_batch: u32,
    /// Batches in all: `size` in whole batches, rounded up.
    pub batches: u64,
    /// Concurrent producers of the fill.
    pub producers: u32,
    /// The topic's durability.
    pub durability: DurabilityArg,
    /// Shards per replica.
    pub shards: u32,
    /// The binary, the directory, the timeout, the root user.
    #[serde(flatten)]
    pub setup: RunSetup,
}

impl TransferPlan {
    /// Checks the flags; the error is a sentence saying what to change.
    pub fn from_cli(cli: &Cli, args: &Transfer) -> Result<Self, String> {
        if cli.message_size == 0 || cli.messages_per_batch == 0 {
            return Err("--message-size and --messages-per-batch must be at least 1".into());
        }
        if args.producers == 0 || args.shards == 0 {
            return Err("transfer: --producers and --shards must be at least 1".into());
        }
        if cli.rate.is_some() || cli.message_batches.is_some() || cli.total_data.is_some() {
            return Err(
                "transfer fills by --size; --rate, --message-batches and --total-data do not apply"
                    .into(),
            );
        }
        let size_bytes = args.size.bytes_per_second as u64;
        let batch_bytes = u64::from(cli.message_size) * u64::from(cli.messages_per_batch);
        let batches = size_bytes.div_ceil(batch_bytes).max(1);
        Ok(Self {
            size_bytes,
            message_size: cli.message_size,
            messages_per_batch: cli.messages_per_batch,
            batches,
            producers: args.producers,
            durability: cli.durability,
            shards: args.shards,
            setup: RunSetup::from_cli(cli, &args.run, args.timeout)?,
        })
    }

    /// The plan of the producers that fill the partition through `addr`.
    fn producer_plan(&self, addr: SocketAddr) -> Plan {
        Plan {
            kind: Kind::PinnedProducer,
            actors: self.producers,
            streams: 1,
            partitions: 1,
            message_size: self.message_size,
            messages_per_batch: self.messages_per_batch,
            batches_per_actor: 0,
            rate_bytes_per_second: None,
            warmup: Duration::ZERO,
            durability: self.durability,
            addr,
            username: self.setup.username.clone(),
            password: self.setup.password.clone(),
            cleanup: false,
            baseline_dir: None,
        }
    }
}

/// The filled partition, as its primary reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// The stream's id.
    pub stream_id: u32,
    /// The topic's id.
    pub topic_id: u32,
    /// The partition's id.
    pub partition_id: u32,
    /// Its group's id.
    pub group: String,
    /// The group's primary.
    pub primary_replica: usize,
    /// Where the group stood on the primary once the replicas agreed.
    pub state: GroupState,
}

/// The fill.
#[derive(Debug, Clone, Serialize)]
pub struct FillReport {
    /// Payload bytes sent.
    pub payload_bytes: u64,
    /// Messages sent.
    pub messages: u64,
    /// From the first send to the last reply.
    pub seconds: f64,
    /// Payload 10^6 B/s.
    pub megabytes_per_second: f64,
    /// From the last reply until the three replicas agreed.
    pub converge_seconds: f64,
}

/// The wiped replica's way back.
#[derive(Debug, Clone, Serialize)]
pub struct CatchUpReport {
    /// The replica stopped, wiped and restarted.
    pub replica: usize,
    /// From its restart to its serving line.
    pub serving_seconds: f64,
    /// From its restart until its group was normal at the primary's commit
    /// point with the primary's bytes.
    pub seconds: f64,
    /// The partition's bytes over `seconds`, 10^6 B/s.
    pub megabytes_per_second: f64,
    /// State-transfer installs on the replica (0: caught up by journal
    /// repair alone).
    pub transfer_installs: u64,
    /// State-transfer chunk bytes it received.
    pub transfer_received_bytes: u64,
    /// The replica's own account of its transfers, first armed to
    /// installed, retries included (`replog_transfer_duration_seconds`'
    /// sum); the rest of `seconds` is boot, group 0's catch-up and repair.
    pub transfer_seconds: f64,
    /// Its group's state at the end.
    pub state: GroupState,
}

/// A transfer run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TransferReport {
    /// The run as planned.
    pub plan: TransferPlan,
    /// The run's directory.
    pub dir: PathBuf,
    /// Whether it was kept (`--keep`).
    pub kept: bool,
    /// The fill.
    pub fill: FillReport,
    /// The partition.
    pub partition: PartitionReport,
    /// The catch-up.
    pub catch_up: CatchUpReport,
    /// The disk, same directory, same run.
    pub disk: DiskSpeed,
    /// Catch-up MB/s over the disk's read+write MB/s.
    pub ratio_to_disk_read_write: f64,
}

impl TransferReport {
    /// The text report.
    pub fn render(&self) -> String {
        let p = &self.plan;
        let f = &self.fill;
        let part = &self.partition;
        let c = &self.catch_up;
        let d = &self.disk;
        let mut out = format!(
            "replog-bench transfer: {REPLICAS} replicas ({} shard(s) each, {}), run in {}{}\n",
            p.shards,
            p.setup.replog.display(),
            self.dir.display(),
            if self.kept { " (kept)" } else { " (deleted)" }
        );
        out.push_str(&format!(
            "fill: {:.3} MB of payload ({} batches of {} x {} B, {}) by {} producer(s) in {:.3} s: {:.2} MB/s; replicas agreed {:.3} s later\n",
            f.payload_bytes as f64 / 1e6,
            p.batches,
            p.messages_per_batch,
            p.message_size,
            p.durability.name(),
            p.producers,
            f.seconds,
            f.megabytes_per_second,
            f.converge_seconds
        ));
        out.push_str(&format!(
            "partition: stream {} topic {} partition {} (group {}): {:.3} MB in {} segment(s), {} messages, commit op {}; primary replica {}\n",
            part.stream_id,
            part.topic_id,
            part.partition_id,
            part.group,
            part.state.size_bytes as f64 / 1e6,
            part.state.segments,
            part.state.messages,
            part.state.commit_min,
            part.primary_replica
        ));
        let how = if c.transfer_installs > 0 {
            format!(
                "by state transfer: {} install(s), {:.3} MB of chunks received, {:.3} s from armed to installed",
                c.transfer_installs,
                c.transfer_received_bytes as f64 / 1e6,
                c.transfer_seconds
            )
        } else {
            "by journal repair alone: no state-transfer install".to_owned()
        };
        out.push_str(&format!(
            "catch-up: replica {} stopped, data directory deleted, restarted with --rejoin: serving after {:.3} s, caught up after {:.3} s ({how}): {:.2} MB/s\n",
            c.replica, c.serving_seconds, c.seconds, c.megabytes_per_second
        ));
        out.push_str(&format!(
            "disk (same directory, same run): {:.3} MB written + fsync in {:.3} s ({:.2} MB/s), read back {} in {:.3} s ({:.2} MB/s): read+write {:.2} MB/s\n",
            d.bytes as f64 / 1e6,
            d.write_seconds,
            d.write_megabytes_per_second,
            if d.read_direct {
                "with O_DIRECT"
            } else {
                "through the page cache (O_DIRECT refused)"
            },
            d.read_seconds,
            d.read_megabytes_per_second,
            d.read_write_megabytes_per_second
        ));
        out.push_str(&format!(
            "catch-up / disk read+write: {:.3}\n",
            self.ratio_to_disk_read_write
        ));
        out
    }
}

/// Runs `plan` in a fresh directory below its `--dir`.
pub async fn run(plan: TransferPlan) -> Result<TransferReport, BenchError> {
    let dir = run_dir(&plan.setup.parent_dir, "replog-bench-transfer")?;
    let mut report = in_run_dir(&dir, plan.setup.keep, run_in(&plan, &dir)).await?;
    report.kept = plan.setup.keep;
    Ok(report)
}

async fn run_in(plan: &TransferPlan, dir: &Path) -> Result<TransferReport, ClusterError> {
    let mut cluster = Cluster::configure(
        &plan.setup.replog,
        dir,
        plan.shards,
        &plan.setup.username,
        &plan.setup.password,
        "",
    )?;
    progress(format_args!(
        "starting {REPLICAS} replicas in {}",
        dir.display()
    ));
    for id in 0..REPLICAS {
        tokio::task::block_in_place(|| cluster.start(id, false))?;
    }
    let admin_plan = plan.producer_plan(cluster.specs[0].client);
    let (stream_id, topic_id) = create_topic(&admin_plan, 1, plan.setup.timeout).await?;
    let (group, primary) = find_group(plan, &mut cluster, stream_id, topic_id).await?;

    progress(format_args!(
        "filling group {group} with {} batches through its primary, replica {primary}",
        plan.batches
    ));
    let fill_started = Instant::now();
    let payload_bytes = fill(plan, cluster.specs[primary].client).await?;
    let fill_seconds = fill_started.elapsed().as_secs_f64();
    let converge_started = Instant::now();
    let (agreed, primary) = converge(plan, &mut cluster, &group).await?;
    let converge_seconds = converge_started.elapsed().as_secs_f64();

    let victim = pick_backup(&mut cluster, primary).await?;
    progress(format_args!(
        "replicas agree; stopping replica {victim}, deleting its data, restarting it with --rejoin"
    ));
    tokio::task::block_in_place(|| cluster.stop(victim))?;
    let data_dir = cluster.specs[victim].data_dir.clone();
    std::fs::remove_dir_all(&data_dir).map_err(|source| ClusterError::Io {
        what: format!(
            "deleting replica {victim}'s data directory {}",
            data_dir.display()
        ),
        source,
    })?;
    let restarted = Instant::now();
    tokio::task::block_in_place(|| cluster.start(victim, true))?;
    let serving_seconds = restarted.elapsed().as_secs_f64();
    let (state, scrape) = caught_up(plan, &mut cluster, victim, &group, &agreed).await?;
    let seconds = restarted.elapsed().as_secs_f64();

    progress(format_args!(
        "caught up; stopping the cluster, measuring the disk with {} bytes",
        agreed.size_bytes
    ));
    tokio::task::block_in_place(|| cluster.stop_all())?;
    let probe_dir = dir.to_path_buf();
    let bytes = agreed.size_bytes;
    let disk = tokio::task::spawn_blocking(move || disk::probe(&probe_dir, bytes))
        .await
        .map_err(|e| ClusterError::Io {
            what: "the disk probe's thread".into(),
            source: std::io::Error::other(e.to_string()),
        })??;
    let catch_up_mbps = per_second(agreed.size_bytes, seconds) / 1e6;
    let messages = plan.batches * u64::from(plan.messages_per_batch);
    Ok(TransferReport {
        plan: plan.clone(),
        dir: dir.to_path_buf(),
        kept: plan.setup.keep,
        fill: FillReport {
            payload_bytes,
            messages,
            seconds: fill_seconds,
            megabytes_per_second: per_second(payload_bytes, fill_seconds) / 1e6,
            converge_seconds,
        },
        partition: PartitionReport {
            stream_id,
            topic_id,
            partition_id: 0,
            group,
            primary_replica: primary,
            state: agreed,
        },
        catch_up: CatchUpReport {
            replica: victim,
            serving_seconds,
            seconds,
            megabytes_per_second: catch_up_mbps,
            transfer_installs: scrape.sum("replog_transfer_installs_total") as u64,
            transfer_received_bytes: scrape.sum("replog_transfer_received_bytes_total") as u64,
            transfer_seconds: scrape.sum("replog_transfer_duration_seconds_sum"),
            state,
        },
        ratio_to_disk_read_write: if disk.read_write_megabytes_per_second > 0.0 {
            catch_up_mbps / disk.read_write_megabytes_per_second
        } else {
            0.0
        },
        disk,
    })
}

fn progress(what: std::fmt::Arguments<'_>) {
    super::progress("transfer", what);
}

/// The partition's group and its primary, once every replica holds it.
async fn find_group(
    plan: &TransferPlan,
    cluster: &mut Cluster,
    stream_id: u32,
    topic_id: u32,
) -> Result<(String, usize), ClusterError> {
    wait_for(
        plan.setup.timeout,
        cluster,
        "the partition's creation on every replica",
        |scrapes| {
            let groups: Vec<Option<String>> = scrapes
                .iter()
                .map(|s| s.partition_group(stream_id, topic_id, 0))
                .collect();
            let Some(Some(group)) = groups.first().cloned() else {
                return Err(format!("groups per replica {groups:?}"));
            };
            if groups.iter().any(|g| g.as_deref() != Some(&group)) {
                return Err(format!("groups per replica {groups:?}"));
            }
            let primaries = primaries(scrapes, &group);
            match primaries.as_slice() {
                [p] => Ok((group, *p)),
                _ => Err(format!("group {group}: primaries {primaries:?}")),
            }
        },
    )
    .await
}

/// Sends `plan.batches` batches to partition 0 through `addr` from
/// `plan.producers` concurrent producers; the payload bytes sent.
async fn fill(plan: &TransferPlan, addr: SocketAddr) -> Result<u64, ClusterError> {
    let producer_plan = Arc::new(plan.producer_plan(addr));
    let producers = u64::from(plan.producers);
    let mut set = JoinSet::new();
    for i in 0..producers {
        let batches = plan.batches / producers + u64::from(i < plan.batches % producers);
        let producer_plan = producer_plan.clone();
        set.spawn(async move {
            let client = actors::connect(&producer_plan).await?;
            let mut messages = actors::batch(&producer_plan)?;
            let target = Target {
                stream: Plan::stream_name(0),
                partition: Some(0),
            };
            for _ in 0..batches {
                actors::send_batch(&client, &producer_plan, &target, &mut messages, None).await?;
            }
            Ok::<u64, BenchError>(batches)
        });
    }
    let deadline = tokio::time::Instant::now() + plan.setup.timeout;
    let mut sent = 0u64;
    loop {
        let joined = match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(joined)) => joined,
            Ok(None) => break,
            Err(_) => {
                set.abort_all();
                return Err(ClusterError::Timeout {
                    phase: "the fill",
                    limit: plan.setup.timeout,
                    last: format!(
                        "{sent} of {} batches acknowledged by finished producers",
                        plan.batches
                    ),
                });
            }
        };
        match joined {
            Ok(Ok(batches)) => sent += batches,
            Ok(Err(e)) => {
                set.abort_all();
                return Err(ClusterError::Clients {
                    what: "filling the partition",
                    source: Box::new(e),
                });
            }
            Err(e) => {
                set.abort_all();
                return Err(ClusterError::Clients {
                    what: "filling the partition",
                    source: Box::new(BenchError::Actor(e.to_string())),
                });
            }
        }
    }
    Ok(sent * u64::from(plan.messages_per_batch) * u64::from(plan.message_size))
}

/// Waits until every replica's group is normal, applied up to the
/// committed point, at one commit point with one size; that state (the
/// primary's) and the primary.
async fn converge(
    plan: &TransferPlan,
    cluster: &mut Cluster,
    group: &str,
) -> Result<(GroupState, usize), ClusterError> {
    wait_for(
        plan.setup.timeout,
        cluster,
        "the replicas' agreement after the fill",
        |scrapes| {
            let states: Vec<Option<GroupState>> =
                scrapes.iter().map(|s| s.group_state(group)).collect();
            let all: Option<Vec<GroupState>> = states.iter().copied().collect();
            let primaries = primaries(scrapes, group);
            match (all, primaries.as_slice()) {
                (Some(all), [p])
                    if all.iter().all(|g| {
                        g.status == 0
                            && g.commit_min == g.commit_max
                            && g.commit_min == all[*p].commit_min
                            && g.size_bytes == all[*p].size_bytes
                            && g.messages == all[*p].messages
                    }) =>
                {
                    Ok((all[*p], *p))
                }
                _ => Err(format!("group {group} per replica: {states:?}")),
            }
        },
    )
    .await
}

/// A backup of the partition's group (any replica but `primary`), preferring one that is not group 0's primary too
/// (stopping that one would add a metadata view change to the catch-up).
async fn pick_backup(cluster: &mut Cluster, primary: usize) -> Result<usize, ClusterError> {
    let scrapes = scrape_all(cluster).await?;
    let metadata_primary = primaries(&scrapes, METADATA_GROUP);
    let backups: Vec<usize> = (0..REPLICAS).filter(|&i| i != primary).collect();
    Ok(backups
        .iter()
        .copied()
        .find(|b| !metadata_primary.contains(b))
        .unwrap_or(backups[0]))
}

/// Waits until the restarted `victim`'s group is normal at `agreed`'s
/// commit point with its size and messages; its state and last scrape.
async fn caught_up(
    plan: &TransferPlan,
    cluster: &mut Cluster,
    victim: usize,
    group: &str,
    agreed: &GroupState,
) -> Result<(GroupState, Scrape), ClusterError> {
    let deadline = Instant::now() + plan.setup.timeout;
    let addr = cluster
        .metrics(victim)
        .ok_or_else(|| ClusterError::Exited {
            replica: victim,
            status: "not running after its restart".into(),
            log: cluster.specs[victim].log.clone(),
        })?;
    loop {
        cluster.check_alive()?;
        let scrape = metrics::scrape(addr).await?;
        let state = scrape.group_state(group);
        if let Some(s) = state
            && s.status == 0
            && s.commit_min >= agreed.commit_min
            && s.size_bytes == agreed.size_bytes
            && s.messages == agreed.messages
        {
            return Ok((s, scrape));
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::Timeout {
                phase: "the wiped replica's catch-up",
                limit: plan.setup.timeout,
                last: format!("replica {victim}: {state:?}; wanted {agreed:?}"),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
