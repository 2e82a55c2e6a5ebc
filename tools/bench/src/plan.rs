//! The run a command line asks for, checked whole before anything is sent:
//! which actors, where each one sends or reads, how many batches.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::args::{Cli, DurabilityArg, Mode};
use crate::schedule::ByteRate;

/// The topic every bench stream holds.
pub const TOPIC: &str = "bench";

/// The consumer group of each stream in `balanced-consumer-group`.
pub const GROUP: &str = "replog-bench-group";

/// The mode of a run (`transfer` has a plan of its own,
/// [`crate::cluster::transfer::TransferPlan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Producers, each on its own partition.
    PinnedProducer,
    /// Consumers, each on its own partition, polling by offset.
    PinnedConsumer,
    /// Producers spreading round robin over a topic's partitions.
    BalancedProducer,
    /// Consumers in one group per stream.
    BalancedConsumerGroup,
    /// Producing consumers: send and receive on one partition each.
    EndToEnd,
    /// Pinned producers against the in-process baseline receiver.
    Baseline,
}

impl Kind {
    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::PinnedProducer => "pinned-producer",
            Self::PinnedConsumer => "pinned-consumer",
            Self::BalancedProducer => "balanced-producer",
            Self::BalancedConsumerGroup => "balanced-consumer-group",
            Self::EndToEnd => "end-to-end",
            Self::Baseline => "baseline",
        }
    }

    /// Whether the measured actors send (and so whether the bench must fill
    /// the topics first when they do not).
    pub fn measures_producers(self) -> bool {
        matches!(
            self,
            Self::PinnedProducer | Self::BalancedProducer | Self::EndToEnd | Self::Baseline
        )
    }

    /// Whether the latency samples are the producers' (else the consumers').
    pub fn samples_producers(self) -> bool {
        matches!(
            self,
            Self::PinnedProducer | Self::BalancedProducer | Self::Baseline
        )
    }

    fn actor_noun(self) -> &'static str {
        match self {
            Self::PinnedProducer | Self::BalancedProducer | Self::Baseline => "producers",
            Self::PinnedConsumer | Self::BalancedConsumerGroup => "consumers",
            Self::EndToEnd => "producing consumers",
        }
    }

    fn is_pinned(self) -> bool {
        matches!(
            self,
            Self::PinnedProducer | Self::PinnedConsumer | Self::EndToEnd | Self::Baseline
        )
    }
}

/// A checked run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The mode.
    pub kind: Kind,
    /// Producers, consumers or producing consumers.
    pub actors: u32,
    /// Streams, one topic each.
    pub streams: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Payload bytes per message.
    pub message_size: u32,
    /// Messages per batch.
    pub messages_per_batch: u32,
    /// Measured batches per actor.
    pub batches_per_actor: u64,
    /// The aggregate open-loop rate in bytes per second, if any.
    pub rate_bytes_per_second: Option<f64>,
    /// Warm-up per actor.
    #[serde(serialize_with = "seconds")]
    pub warmup: Duration,
    /// `replicated` or `persisted`.
    pub durability: DurabilityArg,
    /// The server.
    pub addr: SocketAddr,
    /// Login.
    #[serde(skip)]
    pub username: String,
    /// Login.
    #[serde(skip)]
    pub password: String,
    /// Delete the streams afterwards.
    #[serde(skip)]
    pub cleanup: bool,
    /// Where the baseline receiver's directory goes (`baseline` only).
    #[serde(skip)]
    pub baseline_dir: Option<std::path::PathBuf>,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Plan {
    /// Checks the command line and makes the plan; the error is a sentence
    /// saying what to change.
    pub fn from_cli(cli: &Cli) -> Result<Self, String> {
        let mut baseline_dir = None;
        let (kind, actors, streams, partitions) = match &cli.mode {
            Mode::PinnedProducer(p) => (
                Kind::PinnedProducer,
                p.producers,
                p.streams.unwrap_or(p.producers),
                p.partitions,
            ),
            Mode::EndToEnd(p) => (
                Kind::EndToEnd,
                p.producers,
                p.streams.unwrap_or(p.producers),
                p.partitions,
            ),
            Mode::PinnedConsumer(c) => (
                Kind::PinnedConsumer,
                c.consumers,
                c.streams.unwrap_or(c.consumers),
                c.partitions,
            ),
            Mode::BalancedProducer(p) => {
                (Kind::BalancedProducer, p.producers, p.streams, p.partitions)
            }
            Mode::BalancedConsumerGroup(c) => (
                Kind::BalancedConsumerGroup,
                c.consumers,
                c.streams,
                c.partitions,
            ),
            Mode::Baseline(b) => {
                baseline_dir.clone_from(&b.dir);
                let p = &b.producers;
                (
                    Kind::Baseline,
                    p.producers,
                    p.streams.unwrap_or(p.producers),
                    p.partitions,
                )
            }
            Mode::Transfer(_) | Mode::Failover(_) | Mode::Memory(_) => {
                return Err("the cluster modes are planned by TransferPlan, FailoverPlan and MemoryPlan, not as a producer or consumer run".into());
            }
        };
        if actors == 0 || streams == 0 || partitions == 0 {
            return Err(format!(
                "{}: {} {}, {streams} streams and {partitions} partitions per topic; each must be at least 1",
                kind.name(),
                actors,
                kind.actor_noun()
            ));
        }
        if cli.message_size == 0 || cli.messages_per_batch == 0 {
            return Err("--message-size and --messages-per-batch must be at least 1".into());
        }
        if kind.is_pinned() && u64::from(actors) > u64::from(streams) * u64::from(partitions) {
            return Err(format!(
                "{} gives each of its {} {} a partition of its own, but {streams} streams × {partitions} partitions is only {}; raise --streams or --partitions",
                kind.name(),
                actors,
                kind.actor_noun(),
                u64::from(streams) * u64::from(partitions)
            ));
        }
        if kind == Kind::BalancedConsumerGroup && actors < streams {
            return Err(format!(
                "balanced-consumer-group needs at least one consumer per stream: {actors} consumers for {streams} streams"
            ));
        }
        let batch_bytes = u64::from(cli.message_size) * u64::from(cli.messages_per_batch);
        let batches_per_actor = match (cli.message_batches, cli.total_data) {
            (Some(b), _) => b,
            (None, Some(total)) => {
                let per_actor = total.bytes_per_second / f64::from(actors);
                (per_actor / batch_bytes as f64).ceil().max(1.0) as u64
            }
            (None, None) => 1000,
        };
        if batches_per_actor == 0 {
            return Err("--message-batches must be at least 1".into());
        }
        Ok(Self {
            kind,
            actors,
            streams,
            partitions,
            message_size: cli.message_size,
            messages_per_batch: cli.messages_per_batch,
            batches_per_actor,
            rate_bytes_per_second: cli.rate.map(|r| r.bytes_per_second),
            warmup: cli.warmup_time,
            durability: cli.durability,
            addr: cli.connection.addr,
            username: cli.connection.username.clone(),
            password: cli.connection.password.clone(),
            cleanup: cli.cleanup,
            baseline_dir,
        })
    }

    /// Payload bytes in one batch.
    pub fn batch_bytes(&self) -> u64 {
        u64::from(self.message_size) * u64::from(self.messages_per_batch)
    }

    /// Messages every actor together sends or reads in the measured phase.
    pub fn messages_expected(&self) -> u64 {
        u64::from(self.actors) * self.batches_per_actor * u64::from(self.messages_per_batch)
    }

    /// The open-loop rate.
    pub fn rate(&self) -> Option<ByteRate> {
        self.rate_bytes_per_second
            .map(|bytes_per_second| ByteRate { bytes_per_second })
    }

    /// The name of stream `s` (0-based).
    pub fn stream_name(s: u32) -> String {
        format!("replog-bench-{}", s + 1)
    }

    /// Where a pinned actor sends or reads: (stream index, partition id).
    /// Actors fill the first partition of every stream, then the second…
    pub fn pinned_target(&self, actor: u32) -> (u32, u32) {
        (actor % self.streams, actor / self.streams)
    }

    /// The stream a balanced actor uses.
    pub fn balanced_stream(&self, actor: u32) -> u32 {
        actor % self.streams
    }

    /// How many balanced actors share stream `s`.
    pub fn actors_on_stream(&self, s: u32) -> u32 {
        (0..self.actors)
            .filter(|&a| self.balanced_stream(a) == s)
            .count() as u32
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let mut argv = vec!["replog-bench"];
        argv.extend_from_slice(args);
        Plan::from_cli(&Cli::try_parse_from(argv).map_err(|e| e.to_string())?)
    }

    #[test]
    fn given_pinned_producers_when_planned_should_give_each_its_own_partition() {
        let p = plan(&[
            "pp",
            "--producers",
            "4",
            "--streams",
            "2",
            "--partitions",
            "2",
        ])
        .unwrap();
        let targets: Vec<_> = (0..4).map(|a| p.pinned_target(a)).collect();
        assert_eq!(targets, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
    }

    #[test]
    fn given_more_pinned_actors_than_partitions_when_planned_should_refuse() {
        let err = plan(&["pc", "--consumers", "3", "--streams", "1"]).unwrap_err();
        assert!(
            err.contains("3 consumers") && err.contains("raise --streams"),
            "{err}"
        );
    }

    #[test]
    fn given_total_data_when_planned_should_split_into_whole_batches_per_actor() {
        // 10 MB over 4 producers of 1 MB batches: 2.5 → 3 batches each.
        let p = plan(&["-t", "10MB", "pp", "--producers", "4"]).unwrap();
        assert_eq!(p.batches_per_actor, 3);
        assert_eq!(p.messages_expected(), 4 * 3 * 1000);
    }

    #[test]
    fn given_the_baseline_mode_when_planned_should_pin_producers_as_pinned_producer_does() {
        let b = plan(&["baseline", "--producers", "4", "--dir", "/tmp/x"]).unwrap();
        let p = plan(&["pp", "--producers", "4"]).unwrap();
        assert_eq!(b.kind, Kind::Baseline);
        assert_eq!(
            b.baseline_dir.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        assert_eq!(
            (b.actors, b.streams, b.partitions),
            (p.actors, p.streams, p.partitions)
        );
        let targets = |p: &Plan| (0..4).map(|a| p.pinned_target(a)).collect::<Vec<_>>();
        assert_eq!(targets(&b), targets(&p));
        assert!(b.kind.samples_producers() && b.kind.measures_producers());
    }

    #[test]
    fn given_balanced_consumers_when_planned_should_count_them_per_stream() {
        let p = plan(&["bcg", "--consumers", "5", "--streams", "2"]).unwrap();
        assert_eq!((p.actors_on_stream(0), p.actors_on_stream(1)), (3, 2));
        assert!(plan(&["bcg", "--consumers", "1", "--streams", "2"]).is_err());
    }
}
