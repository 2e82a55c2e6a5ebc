//! The `memory` mode: what a three-replica cluster holds in memory with
//! many partitions, idle and after a burst of large batches to every one
//! of them, next to the byte budget of what its shards keep for repair.
//!
//! The run, in order: start a three-replica cluster ([`super::process`])
//! with `storage.retained_bytes_per_shard` set if `--retained-bytes-per-shard`
//! is given; create one topic of `--partitions` partitions and wait until
//! every replica holds every group with one primary; send one small message
//! to every partition (its files exist and every group has committed an
//! op), wait `--settle`, and read each replica's resident set
//! (`/proc/PID/status`, `VmRSS`) and its shards' retained bytes (the
//! `replog_shard_retained_bytes*` series); then send one batch of the
//! global shape (`--messages-per-batch` × `--message-size`, 1 MB by
//! default) to every partition, wait `--settle` again (the backups apply
//! and flush), and read the same figures. Without a ceiling every
//! replica's groups would keep each burst batch in memory for repair
//! (their last `retention_ops` applied prepares): `partitions` × the
//! batch per replica.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::metrics::Scrape;
use super::probe::{connect_probers, probe_until_each_accepts, wait_for_layout};
use super::process::{Cluster, REPLICAS};
use super::{ClusterError, RunSetup, create_topic, in_run_dir, run_dir, scrape_each, sender_plan};
use crate::args::{Cli, DurabilityArg, Memory};
use crate::error::BenchError;
use crate::plan::Plan;

/// A checked memory run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// Partitions of the one topic.
    pub partitions: u32,
    /// Shards per replica.
    pub shards: u32,
    /// Concurrent senders of the burst.
    pub senders: u32,
    /// The burst's payload bytes per message.
    pub message_size: u32,
    /// The burst's messages per batch.
    pub messages_per_batch: u32,
    /// The topic's durability.
    pub durability: DurabilityArg,
    /// `storage.retained_bytes_per_shard`, if not the replicas' default.
    pub retained_bytes_per_shard: Option<u64>,
    /// How long to wait before each measurement, seconds.
    pub settle_seconds: f64,
    /// The binary, the directory, the timeout, the root user.
    #[serde(flatten)]
    pub setup: RunSetup,
}

impl MemoryPlan {
    /// Checks the flags; the error is a sentence saying what to change.
    pub fn from_cli(cli: &Cli, args: &Memory) -> Result<Self, String> {
        if cli.message_size == 0 || cli.messages_per_batch == 0 {
            return Err("--message-size and --messages-per-batch must be at least 1".into());
        }
        if args.partitions == 0 || args.shards == 0 || args.senders == 0 {
            return Err("memory: --partitions, --shards and --senders must be at least 1".into());
        }
        if cli.rate.is_some() || cli.message_batches.is_some() || cli.total_data.is_some() {
            return Err(
                "memory sends one batch to every partition; --rate, --message-batches and --total-data do not apply"
                    .into(),
            );
        }
        Ok(Self {
            partitions: args.partitions,
            shards: args.shards,
            senders: args.senders,
            message_size: cli.message_size,
            messages_per_batch: cli.messages_per_batch,
            durability: cli.durability,
            retained_bytes_per_shard: args
                .retained_bytes_per_shard
                .map(|b| b.bytes_per_second as u64),
            settle_seconds: args.settle.as_secs_f64(),
            setup: RunSetup::from_cli(cli, &args.run, args.timeout)?,
        })
    }

    /// The replicas' `[storage]` section, if a flag sets one.
    fn storage_toml(&self) -> String {
        self.retained_bytes_per_shard
            .map(|b| format!("\n[storage]\nretained_bytes_per_shard = {b}\n"))
            .unwrap_or_default()
    }

    /// A sender's plan against `addr`.
    fn client_plan(
        &self,
        addr: std::net::SocketAddr,
        message_size: u32,
        messages_per_batch: u32,
    ) -> Plan {
        sender_plan(
            &self.setup,
            self.durability,
            self.partitions,
            addr,
            (message_size, messages_per_batch),
        )
    }
}

/// One replica's figures at one point of the run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ReplicaMemory {
    /// Resident set, bytes.
    pub resident_bytes: u64,
    /// Bytes its shards keep for repair now, summed.
    pub retained_bytes: u64,
    /// The most they kept after any flush, summed over shards.
    pub retained_bytes_peak: u64,
    /// Their ceiling, summed over shards.
    pub retained_bytes_max: u64,
    /// Batches let go of to stay within it, summed.
    pub retained_spilled: u64,
}

/// A memory run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// The run as planned.
    pub plan: MemoryPlan,
    /// The run's directory.
    pub dir: PathBuf,
    /// Whether it was kept.
    pub kept: bool,
    /// Bytes of one burst batch as sent (payload and message headers).
    pub burst_batch_bytes: u64,
    /// How long the burst took, seconds.
    pub burst_seconds: f64,
    /// Per replica, after one small message to every partition.
    pub idle: Vec<ReplicaMemory>,
    /// Per replica, after the burst.
    pub after_burst: Vec<ReplicaMemory>,
}

impl MemoryReport {
    /// The text report.
    pub fn render(&self) -> String {
        let p = &self.plan;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut out = format!(
            "replog-bench memory: {REPLICAS} replicas ({} shard(s) each, {}), run in {}{}\n",
            p.shards,
            p.setup.replog.display(),
            self.dir.display(),
            if self.kept { " (kept)" } else { " (deleted)" }
        );
        out.push_str(&format!(
            "topic: {} partitions ({}); burst: one batch of {} x {} B ({:.2} MiB) to every partition, {:.1} s; measured {:.1} s after each step\n",
            p.partitions,
            p.durability.name(),
            p.messages_per_batch,
            p.message_size,
            mib(self.burst_batch_bytes),
            self.burst_seconds,
            p.settle_seconds
        ));
        let unbounded = self
            .burst_batch_bytes
            .saturating_mul(u64::from(p.partitions));
        out.push_str(&format!(
            "without a ceiling each replica would keep {:.0} MiB of burst batches for repair\n",
            mib(unbounded)
        ));
        for (r, (idle, burst)) in self.idle.iter().zip(&self.after_burst).enumerate() {
            out.push_str(&format!(
                "replica {r}: resident {:.0} MiB idle, {:.0} MiB after the burst (+{:.0} MiB); kept for repair {:.1} MiB (peak {:.1} MiB) of a {:.0} MiB ceiling, {} batches let go\n",
                mib(idle.resident_bytes),
                mib(burst.resident_bytes),
                mib(burst.resident_bytes.saturating_sub(idle.resident_bytes)),
                mib(burst.retained_bytes),
                mib(burst.retained_bytes_peak),
                mib(burst.retained_bytes_max),
                burst.retained_spilled
            ));
        }
        out
    }
}

/// Runs `plan` in a fresh directory below its `--dir`.
pub async fn run(plan: MemoryPlan) -> Result<MemoryReport, BenchError> {
    let dir = run_dir(&plan.setup.parent_dir, "replog-bench-memory")?;
    let mut report = in_run_dir(&dir, plan.setup.keep, run_in(&plan, &dir)).await?;
    report.kept = plan.setup.keep;
    Ok(report)
}

fn progress(what: std::fmt::Arguments<'_>) {
    super::progress("memory", what);
}

async fn run_in(plan: &MemoryPlan, dir: &Path) -> Result<MemoryReport, ClusterError> {
    let mut cluster = Cluster::configure(
        &plan.setup.replog,
        dir,
        plan.shards,
        &plan.setup.username,
        &plan.setup.password,
        &plan.storage_toml(),
    )?;
    progress(format_args!(
        "starting {REPLICAS} replicas in {}",
        dir.display()
    ));
    for id in 0..REPLICAS {
        tokio::task::block_in_place(|| cluster.start(id, false))?;
    }
    let addrs: Vec<_> = cluster.specs.iter().map(|s| s.client).collect();
    let admin_plan = plan.client_plan(addrs[0], 16, 1);
    progress(format_args!(
        "creating a topic of {} partitions",
        plan.partitions
    ));
    let (stream_id, topic_id) =
        create_topic(&admin_plan, plan.partitions, plan.setup.timeout).await?;
    wait_for_layout(
        plan.partitions,
        plan.setup.timeout,
        &mut cluster,
        stream_id,
        topic_id,
    )
    .await?;
    let all: Vec<u32> = (0..plan.partitions).collect();
    let settle = Duration::from_secs_f64(plan.settle_seconds);

    progress(format_args!("one small message to every partition"));
    let small = connect_probers(
        (0..plan.senders as usize).map(|i| plan.client_plan(addrs[i % addrs.len()], 16, 1)),
    )
    .await?;
    send_to_each(plan, &small, &all).await?;
    drop(small);
    tokio::time::sleep(settle).await;
    let idle = measure(&mut cluster).await?;

    progress(format_args!(
        "one batch of {} x {} B to every partition",
        plan.messages_per_batch, plan.message_size
    ));
    let senders = connect_probers((0..plan.senders as usize).map(|i| {
        plan.client_plan(
            addrs[i % addrs.len()],
            plan.message_size,
            plan.messages_per_batch,
        )
    }))
    .await?;
    let started = Instant::now();
    send_to_each(plan, &senders, &all).await?;
    let burst_seconds = started.elapsed().as_secs_f64();
    drop(senders);
    tokio::time::sleep(settle).await;
    let after_burst = measure(&mut cluster).await?;
    tokio::task::block_in_place(|| cluster.stop_all())?;
    // Each message: its payload and the 64 bytes of its header on the wire
    // (the stored frame's header is 48 of them); the batch: its messages
    // and the 256-byte batch header.
    let burst_batch_bytes =
        256 + u64::from(plan.messages_per_batch) * (u64::from(plan.message_size) + 48);
    Ok(MemoryReport {
        plan: plan.clone(),
        dir: dir.to_path_buf(),
        kept: false,
        burst_batch_bytes,
        burst_seconds,
        idle,
        after_burst,
    })
}

/// One acknowledged batch to each partition, or an error naming how many
/// were.
async fn send_to_each(
    plan: &MemoryPlan,
    senders: &[super::probe::Prober],
    partitions: &[u32],
) -> Result<(), ClusterError> {
    let accepted =
        probe_until_each_accepts(senders, partitions, Instant::now(), plan.setup.timeout).await?;
    if accepted.len() != partitions.len() {
        return Err(ClusterError::Timeout {
            phase: "one batch to every partition",
            limit: plan.setup.timeout,
            last: format!("{} of {} accepted", accepted.len(), partitions.len()),
        });
    }
    Ok(())
}

/// Every replica's resident set and retained bytes now.
async fn measure(cluster: &mut Cluster) -> Result<Vec<ReplicaMemory>, ClusterError> {
    let ids: Vec<usize> = (0..REPLICAS).collect();
    let scrapes: Vec<Scrape> = scrape_each(cluster, &ids).await?;
    let mut out = Vec::with_capacity(REPLICAS);
    for (id, s) in ids.iter().zip(&scrapes) {
        let pid = cluster.pid(*id).ok_or_else(|| ClusterError::Io {
            what: format!("reading replica {id}'s process id"),
            source: std::io::Error::other("the replica is not running"),
        })?;
        out.push(ReplicaMemory {
            resident_bytes: resident_bytes(pid)?,
            retained_bytes: s.sum("replog_shard_retained_bytes") as u64,
            retained_bytes_peak: s.sum("replog_shard_retained_bytes_peak") as u64,
            retained_bytes_max: s.sum("replog_shard_retained_bytes_max") as u64,
            retained_spilled: s.sum("replog_shard_retained_spilled_total") as u64,
        });
    }
    Ok(out)
}

/// `VmRSS` of process `pid`, bytes.
fn resident_bytes(pid: u32) -> Result<u64, ClusterError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|source| ClusterError::Io {
        what: format!("reading {path}"),
        source,
    })?;
    parse_vm_rss(&text).ok_or_else(|| ClusterError::Io {
        what: format!("reading {path}"),
        source: std::io::Error::other("no VmRSS line"),
    })
}

/// The `VmRSS:  1234 kB` line of a `/proc/PID/status`, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_a_proc_status_when_parsed_should_give_the_resident_set_in_bytes() {
        let status = "Name:\treplog\nVmPeak:\t  900 kB\nVmRSS:\t  12345 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("Name:\treplog\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
    }
}
