//! Command-line flags. Where a flag exists in iggy-bench it has the same
//! name (and short form): `--message-size/-m`, `--messages-per-batch/-p`,
//! `--message-batches/-b`, `--total-data/-t`, `--warmup-time/-w`,
//! `--rate-limit/-r` (here also `--rate`: the aggregate open-loop rate),
//! and per mode `--producers`, `--consumers`, `--streams/-s`,
//! `--partitions/-a`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use testkit::connection::Connection;

use crate::schedule::ByteRate;

/// replog-bench: throughput and tail latency of an Apache Iggy 0.11.0
/// server (replog or any other), over the official SDK.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    pub mode: Mode,

    /// Payload bytes per message.
    #[arg(long, short = 'm', default_value_t = 1000, global = true)]
    pub message_size: u32,

    /// Messages per batch (one send or one poll).
    #[arg(long, short = 'p', default_value_t = 1000, global = true)]
    pub messages_per_batch: u32,

    /// Batches per actor (producer, consumer, producing consumer). Excludes
    /// --total-data; 1000 when neither is given.
    #[arg(long, short = 'b', global = true, conflicts_with = "total_data")]
    pub message_batches: Option<u64>,

    /// Payload across all actors, e.g. 1GB (decimal units; KiB/MiB/GiB
    /// for binary ones), split evenly into whole batches per actor.
    #[arg(long, short = 't', global = true)]
    pub total_data: Option<ByteRate>,

    /// Open loop: the aggregate payload rate over all sending actors, e.g.
    /// 100MB (per second). Batches go out on a fixed schedule and latency
    /// is measured from each batch's scheduled time, so a stall is charged
    /// to every batch it delays. Without it, each actor sends (or polls)
    /// as fast as it is answered.
    #[arg(
        long = "rate",
        short = 'r',
        visible_alias = "rate-limit",
        global = true
    )]
    pub rate: Option<ByteRate>,

    /// Time each actor runs the same load before measuring, e.g. 1s, 500ms.
    #[arg(long, short = 'w', default_value = "0s", value_parser = parse_duration, global = true)]
    pub warmup_time: Duration,

    /// Durability of the topics the bench creates.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Replicated, global = true)]
    pub durability: DurabilityArg,

    /// Write the report as JSON to this file as well.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,

    /// Delete the bench's streams after the run.
    #[arg(long, global = true)]
    pub cleanup: bool,

    /// `--addr`, `--username`, `--password`.
    #[command(flatten)]
    pub connection: Connection,
}

/// The benchmark modes.
#[derive(Debug, Clone, Subcommand)]
pub enum Mode {
    /// Each producer sends to its own partition.
    #[command(visible_alias = "pp")]
    PinnedProducer(Producers),
    /// Each consumer polls its own partition by offset (the bench fills the
    /// partitions first; the fill is not measured).
    #[command(visible_alias = "pc")]
    PinnedConsumer(Consumers),
    /// Producers spread their batches round robin over the partitions of a
    /// stream's topic.
    #[command(visible_alias = "bp")]
    BalancedProducer(BalancedProducers),
    /// Consumers share one consumer group per stream and poll what the
    /// group assigns them (the bench fills the topics first).
    #[command(visible_alias = "bcg")]
    BalancedConsumerGroup(BalancedConsumers),
    /// Each actor produces into its own partition and consumes it at the
    /// same time; latency is from a batch's send (or scheduled) time to its
    /// arrival at the consumer.
    #[command(visible_alias = "e2e")]
    EndToEnd(Producers),
    /// The path's physical limit: the same producers as pinned-producer,
    /// against a minimal receiver inside the bench (127.0.0.1, a free port)
    /// that appends each request frame's bytes to a file and answers OK,
    /// parsing nothing. `--addr` is not used; no streams are set up.
    Baseline(Baseline),
    /// Fill a partition on a three-replica cluster the bench starts, wipe
    /// one backup, restart it, and time its catch-up next to the disk's own
    /// write+read speed of as many bytes in the same directory.
    Transfer(Transfer),
    /// Start a three-replica cluster with one topic of many partitions,
    /// load it, kill -9 the replica that leads the most partitions, and
    /// time until every partition accepts a produce again.
    Failover(Failover),
    /// Start a three-replica cluster with one topic of many partitions and
    /// read each replica's resident memory, idle and after one batch of
    /// the global shape to every partition, next to the ceiling on what
    /// its shards keep in memory for repair.
    Memory(Memory),
}

/// The baseline receiver's producers.
#[derive(Debug, Clone, Args)]
pub struct Baseline {
    /// The producers, as in pinned-producer.
    #[command(flatten)]
    pub producers: Producers,
    /// Where the receiver's files go (a fresh directory below it, deleted
    /// after the run); the system's temporary directory by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The transfer run.
#[derive(Debug, Clone, Args)]
pub struct Transfer {
    /// How much to fill the partition with: payload bytes (`256MiB`,
    /// `2GiB`, `100MB`), in whole batches of the global batch shape.
    #[arg(long, default_value = "256MiB")]
    pub size: ByteRate,
    /// The binary and the run's directory.
    #[command(flatten)]
    pub run: ClusterRun,
    /// Shards per replica.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// Concurrent producers filling the partition.
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Give up on any phase (start, fill, convergence, catch-up) that takes
    /// longer than this.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Where a cluster mode's replicas come from and where they run.
#[derive(Debug, Clone, Args)]
pub struct ClusterRun {
    /// The `replog` binary; by default the one beside this executable,
    /// else `REPLOG_BIN`.
    #[arg(long)]
    pub replog: Option<PathBuf>,
    /// Where the replicas' data, configuration files and logs go (a fresh
    /// directory below it, deleted after the run unless --keep); the
    /// system's temporary directory by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the run's directory (data, logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// The failover run.
#[derive(Debug, Clone, Args)]
pub struct Failover {
    /// Partitions of the topic (one group each).
    #[arg(long, short = 'a', default_value_t = 1000)]
    pub partitions: u32,
    /// Load producers, on the two replicas that survive (0: no load).
    #[arg(long, default_value_t = 2)]
    pub producers: u32,
    /// Concurrent probers after the kill, each retrying its share of the
    /// partitions until each accepts a one-message batch.
    #[arg(long, default_value_t = 32)]
    pub probers: u32,
    /// How long the load runs before the kill.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub load: Duration,
    /// Shards per replica.
    #[arg(long, default_value_t = 2)]
    pub shards: u32,
    /// The replicas' `consensus.heartbeat_ms` (their default if unset).
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// The replicas' `consensus.primary_timeout_ms` (their default if
    /// unset).
    #[arg(long)]
    pub primary_timeout_ms: Option<u64>,
    /// The binary and the run's directory.
    #[command(flatten)]
    pub run: ClusterRun,
    /// Give up on any phase (start, creation, recovery) that takes longer
    /// than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The memory run.
#[derive(Debug, Clone, Args)]
pub struct Memory {
    /// Partitions of the topic (one group each).
    #[arg(long, short = 'a', default_value_t = 1000)]
    pub partitions: u32,
    /// Shards per replica.
    #[arg(long, default_value_t = 2)]
    pub shards: u32,
    /// Concurrent senders (spread over the three replicas).
    #[arg(long, default_value_t = 8)]
    pub senders: u32,
    /// The replicas' `storage.retained_bytes_per_shard` (their default,
    /// 64 MiB, if unset), e.g. 1GiB.
    #[arg(long)]
    pub retained_bytes_per_shard: Option<ByteRate>,
    /// How long to wait after each step before measuring.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub settle: Duration,
    /// The binary and the run's directory.
    #[command(flatten)]
    pub run: ClusterRun,
    /// Give up on any phase (start, creation, sends) that takes longer
    /// than this.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Pinned producers (and end-to-end producing consumers).
#[derive(Debug, Clone, Args)]
pub struct Producers {
    /// Producers, one partition each.
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Streams (one topic each); defaults to one per producer.
    #[arg(long, short = 's')]
    pub streams: Option<u32>,
    /// Partitions per topic.
    #[arg(long, short = 'a', default_value_t = 1)]
    pub partitions: u32,
}

/// Pinned consumers.
#[derive(Debug, Clone, Args)]
pub struct Consumers {
    /// Consumers, one partition each.
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Streams (one topic each); defaults to one per consumer.
    #[arg(long, short = 's')]
    pub streams: Option<u32>,
    /// Partitions per topic.
    #[arg(long, short = 'a', default_value_t = 1)]
    pub partitions: u32,
}

/// Balanced producers.
#[derive(Debug, Clone, Args)]
pub struct BalancedProducers {
    /// Producers; producer i sends to stream i mod streams.
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Streams (one topic each).
    #[arg(long, short = 's', default_value_t = 1)]
    pub streams: u32,
    /// Partitions per topic.
    #[arg(long, short = 'a', default_value_t = 4)]
    pub partitions: u32,
}

/// A consumer group per stream.
#[derive(Debug, Clone, Args)]
pub struct BalancedConsumers {
    /// Consumers; consumer i joins the group of stream i mod streams.
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Streams (one topic and one consumer group each).
    #[arg(long, short = 's', default_value_t = 1)]
    pub streams: u32,
    /// Partitions per topic.
    #[arg(long, short = 'a', default_value_t = 4)]
    pub partitions: u32,
}

/// A topic's durability (`replicated`: committed by a quorum; `persisted`:
/// also synced to stable storage before the reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// Quorum commit.
    Replicated,
    /// Quorum commit with each commit synced before the reply.
    Persisted,
}

impl DurabilityArg {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Replicated => "replicated",
            Self::Persisted => "persisted",
        }
    }
}

/// `1s`, `500ms`, `2m`, `1.5s`, `250us`, or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 1s or 500ms"))?;
    let seconds = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use us, ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn given_the_cli_definition_when_checked_should_be_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn given_iggy_bench_style_flags_when_parsed_should_fill_the_plan() {
        let cli = Cli::try_parse_from([
            "replog-bench",
            "-m",
            "100",
            "-p",
            "10",
            "-b",
            "5",
            "--rate-limit",
            "10MB",
            "pinned-producer",
            "--producers",
            "4",
        ])
        .unwrap();
        assert_eq!(cli.message_size, 100);
        assert_eq!(cli.messages_per_batch, 10);
        assert_eq!(cli.message_batches, Some(5));
        assert_eq!(cli.rate.map(|r| r.bytes_per_second), Some(10e6));
        let Mode::PinnedProducer(p) = cli.mode else {
            panic!("mode");
        };
        assert_eq!((p.producers, p.streams, p.partitions), (4, None, 1));
    }

    #[test]
    fn given_batches_and_total_data_when_parsed_should_refuse_both() {
        let err = Cli::try_parse_from(["replog-bench", "-b", "5", "-t", "1GB", "pp"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn given_durations_when_parsed_should_scale() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
