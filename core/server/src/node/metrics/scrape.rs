//! One scrape's view of the shards: a snapshot from every shard (asked
//! through its inbox, answered between two of its inputs) and, for the
//! per-partition series, each group's stream, topic and partition ids
//! from the metadata plane; then encoded as OpenMetrics families.
//!
//! A shard that does not answer within [`SCRAPE_TIMEOUT`] (busy with a
//! long input, or stopping) is reported by `replog_shard_up 0` and its
//! series are left out of that scrape, rather than the scrape hanging.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::GroupId;
use consensus::vsr::Status;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::MetricType::{Counter, Gauge};
use prometheus_client::registry::Registry;
use shard::snapshot::DurationBuckets;
use shard::{Input, MetaCall, ShardSnapshot, SnapshotDetail, SnapshotReply};

use crate::node::handle::ShardHandles;

/// How long a scrape waits for the shards' answers, all together.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// A partition group's place in the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionName {
    /// The stream id.
    pub stream: u32,
    /// The topic id.
    pub topic: u32,
    /// The partition id.
    pub partition: u32,
}

/// What one scrape gathered.
#[derive(Debug, Default)]
pub struct Collected {
    /// Per shard index: its snapshot, or `None` when it did not answer.
    pub shards: Vec<Option<ShardSnapshot>>,
    /// Partition groups by id (empty without per-group detail, or when the
    /// metadata shard did not answer).
    pub names: BTreeMap<GroupId, PartitionName>,
}

/// Asks every shard for its snapshot (and shard 0 for the partition
/// names, with per-group detail) and waits at most `timeout` in all.
pub fn collect(handles: &ShardHandles, detail: SnapshotDetail, timeout: Duration) -> Collected {
    let deadline = Instant::now() + timeout;
    let (tx, rx) = mpsc::channel::<(usize, ShardSnapshot)>();
    let count = handles.inboxes().len();
    for (index, inbox) in handles.inboxes().iter().enumerate() {
        let tx = tx.clone();
        let reply = SnapshotReply::new(move |snapshot| {
            let _ = tx.send((index, snapshot));
        });
        // A fresh clone of a futures sender always has a slot of its own,
        // so this does not fail on a full inbox; it fails only when the
        // shard is gone.
        let _ = inbox.clone().try_send(Input::Snapshot { detail, reply });
    }
    drop(tx);
    let (names_tx, names_rx) = mpsc::channel();
    if detail == SnapshotDetail::Groups
        && let Some(inbox) = handles.inboxes().first()
    {
        let query = MetaCall::Query(Box::new(move |state| {
            let names: BTreeMap<GroupId, PartitionName> = state
                .partition_groups()
                .iter()
                .map(|info| {
                    let name = PartitionName {
                        stream: info.stream.0,
                        topic: info.topic.0,
                        partition: info.partition.0,
                    };
                    (info.group, name)
                })
                .collect();
            let _ = names_tx.send(names);
        }));
        let _ = inbox.clone().try_send(Input::Meta(query));
    } else {
        drop(names_tx);
    }
    let mut shards: Vec<Option<ShardSnapshot>> = vec![None; count];
    let mut answered = 0;
    while answered < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((index, snapshot)) => {
                if let Some(slot) = shards.get_mut(index) {
                    *slot = Some(snapshot);
                }
                answered += 1;
            }
            Err(_) => break,
        }
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let names = names_rx.recv_timeout(left).unwrap_or_default();
    Collected { shards, names }
}

/// Appends the families of `collected` to `out` (no end marker).
///
/// # Errors
/// Only a formatting error from the encoder.
pub fn encode(out: &mut impl Write, collected: Collected) -> std::fmt::Result {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(collected)));
    prometheus_client::encoding::text::encode_registry(out, &registry)
}

#[derive(Debug)]
struct SnapshotCollector(Collected);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardReason {
    shard: u16,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupPeer {
    group: u64,
    peer: u8,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    group: u64,
    stream: u32,
    topic: u32,
    partition: u32,
}

type Label1 = [(&'static str, u64); 1];

fn shard_label(s: &ShardSnapshot) -> Label1 {
    [("shard", u64::from(s.shard.0))]
}

/// Writes one family: a descriptor and its rows.
fn family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in rows {
        let mut row = metric.encode_family(&labels)?;
        match kind {
            MetricType::Counter => row.encode_counter::<NoLabelSet, u64, u64>(&value, None)?,
            _ => row.encode_gauge(&value)?,
        }
    }
    Ok(())
}

fn status_code(status: Status) -> u64 {
    match status {
        Status::Normal => 0,
        Status::ViewChange => 1,
        Status::Recovering => 2,
    }
}

/// A family with one row per answering shard: its name, its help, its
/// type and how to read it from a snapshot.
type ShardFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&ShardSnapshot) -> u64,
);

/// The families read straight from each shard's snapshot, labelled by
/// shard, in the order a scrape lists them.
const PER_SHARD: [ShardFamily; 27] = [
    ("replog_shard_ticks", "Ticks the shard ran", Counter, |s| {
        s.stats.ticks
    }),
    (
        "replog_shard_calls",
        "Client calls the shard answered",
        Counter,
        |s| s.stats.calls,
    ),
    (
        "replog_shard_frames_in",
        "Replica frames the shard accepted",
        Counter,
        |s| s.stats.frames_in,
    ),
    (
        "replog_shard_frames_out",
        "Replica frames the shard handed to the bus",
        Counter,
        |s| s.stats.frames_out,
    ),
    (
        "replog_shard_frames_dropped",
        "Replica frames dropped at send (peer not connected or its queue full)",
        Counter,
        |s| s.stats.frames_dropped,
    ),
    (
        "replog_shard_partition_groups",
        "Partition groups on the shard",
        Gauge,
        |s| s.partition_groups,
    ),
    (
        "replog_shard_messages",
        "Messages held by the shard's partitions",
        Gauge,
        |s| s.totals.messages,
    ),
    (
        "replog_shard_size_bytes",
        "Bytes of batches held by the shard's partitions",
        Gauge,
        |s| s.totals.size_bytes,
    ),
    (
        "replog_shard_segments",
        "Segments of the shard's partitions",
        Gauge,
        |s| s.totals.segments,
    ),
    (
        "replog_shard_retained_bytes",
        "Bytes of flushed batches the shard's partitions keep in memory for their peers' repair",
        Gauge,
        |s| s.stats.retained_bytes,
    ),
    (
        "replog_shard_retained_bytes_peak",
        "The most bytes of flushed batches the shard's partitions kept for repair after any flush",
        Gauge,
        |s| s.stats.retained_bytes_peak,
    ),
    (
        "replog_shard_retained_bytes_max",
        "The ceiling on bytes of flushed batches the shard's partitions keep for repair",
        Gauge,
        |s| s.stats.retained_bytes_max,
    ),
    (
        "replog_shard_retained_spilled",
        "Batches let go of to stay within the ceiling, served from segments if repair needs them",
        Counter,
        |s| s.stats.retained_spilled,
    ),
    (
        "replog_shard_superblock_batches",
        "Batches the shard's superblock table wrote (two syncs each)",
        Counter,
        |s| s.stats.superblock.batches,
    ),
    (
        "replog_shard_superblock_records",
        "Partition superblock records and frees the shard's table wrote, over all batches",
        Counter,
        |s| s.stats.superblock.slot_writes,
    ),
    (
        "replog_shard_superblock_batches_failed",
        "Batches of the shard's superblock table that failed (each writer in them saw the error)",
        Counter,
        |s| s.stats.superblock.failed,
    ),
    (
        "replog_shard_repair_read_back_batches",
        "Batches the shard's open partitions read back from segments to serve a peer's repair",
        Gauge,
        |s| s.totals.read_back_bodies,
    ),
    (
        "replog_shard_partitions_fenced",
        "Partitions of the shard that are fenced",
        Gauge,
        |s| s.totals.fenced,
    ),
    (
        "replog_shard_partitions_out_of_space",
        "Partitions of the shard whose disk is full: writes refused, reads served, retried until space is freed",
        Gauge,
        |s| s.totals.out_of_space,
    ),
    (
        "replog_transfers_receiving",
        "Partitions of the shard receiving a state transfer",
        Gauge,
        |s| s.totals.transferring,
    ),
    (
        "replog_transfer_received_bytes",
        "State-transfer chunk bytes received and accepted",
        Counter,
        |s| s.transfer.received_bytes,
    ),
    (
        "replog_transfer_chunks_served",
        "State-transfer chunks served to peers",
        Counter,
        |s| s.transfer.chunks_served,
    ),
    (
        "replog_transfer_offers_served",
        "State-transfer offers served to peers",
        Counter,
        |s| s.transfer.offers_served,
    ),
    (
        "replog_transfer_installs",
        "State transfers installed",
        Counter,
        |s| s.stats.installs,
    ),
    (
        "replog_transfer_install_failures",
        "State-transfer installs that failed",
        Counter,
        |s| s.transfer.install_failures,
    ),
    (
        "replog_shard_fenced_events",
        "Partitions fenced since boot",
        Counter,
        |s| s.stats.fenced,
    ),
    (
        "replog_shard_group_open_failures",
        "Partition groups the metadata names that could not be created or opened since boot (out of file descriptors, a disk fault); each is logged",
        Counter,
        |s| s.stats.groups_not_opened,
    ),
];

impl SnapshotCollector {
    fn live(&self) -> impl Iterator<Item = &ShardSnapshot> + Clone {
        self.0.shards.iter().flatten()
    }

    /// Every shard-level family, in the order a scrape lists them.
    fn shard_families(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        self.shard_up(e)?;
        self.per_shard(e)?;
        self.frames_refused(e)?;
        self.frames_ignored(e)?;
        self.transfer_durations(e)
    }

    /// `replog_shard_up`: a row for every shard, answered or not, so that a
    /// silent shard shows as 0 rather than as missing series.
    fn shard_up(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let up = self.0.shards.iter().enumerate().map(|(i, s)| {
            let label: Label1 = [("shard", i as u64)];
            (label, u64::from(s.is_some()))
        });
        family(
            e,
            "replog_shard_up",
            "Whether the shard answered this scrape's snapshot request in time",
            Gauge,
            up,
        )
    }

    /// The [`PER_SHARD`] families.
    fn per_shard(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        for (name, help, kind, field) in PER_SHARD {
            family(
                e,
                name,
                help,
                kind,
                self.live().map(|s| (shard_label(s), field(s))),
            )?;
        }
        Ok(())
    }

    /// `replog_shard_frames_refused`, by shard and reason.
    fn frames_refused(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let refused = self.live().flat_map(|s| {
            s.stats.frames_refused.iter().map(move |(reason, n)| {
                (
                    ShardReason {
                        shard: s.shard.0,
                        reason,
                    },
                    *n,
                )
            })
        });
        family(
            e,
            "replog_shard_frames_refused",
            "Replica frames the shard refused, by reason",
            Counter,
            refused,
        )
    }

    /// `replog_shard_frames_ignored`, by shard and reason.
    fn frames_ignored(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        // Only the reasons that happened: fifteen rows per shard of zeros
        // would bury the ones that matter.
        let ignored = self.live().flat_map(|s| {
            s.ignored
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(move |(reason, n)| {
                    (
                        ShardReason {
                            shard: s.shard.0,
                            reason: reason.name(),
                        },
                        n,
                    )
                })
        });
        family(
            e,
            "replog_shard_frames_ignored",
            "Well-formed replica frames the shard's groups took no action on, by reason",
            Counter,
            ignored,
        )
    }

    /// `replog_transfer_duration_seconds`, a histogram per shard.
    fn transfer_durations(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut metric = e.encode_descriptor(
            "replog_transfer_duration_seconds",
            "State transfers installed, from first armed to installed",
            None,
            MetricType::Histogram,
        )?;
        for s in self.live() {
            let b = &s.stats.transfer_durations;
            let mut buckets = Vec::with_capacity(DurationBuckets::BOUNDS_SECONDS.len() + 1);
            let mut below = 0;
            for (bound, cumulative) in DurationBuckets::BOUNDS_SECONDS.iter().zip(b.cumulative) {
                buckets.push((*bound, cumulative - below));
                below = cumulative;
            }
            buckets.push((f64::INFINITY, b.count - below));
            let label = shard_label(s);
            metric
                .encode_family(&label)?
                .encode_histogram::<NoLabelSet>(b.sum_us as f64 / 1e6, b.count, &buckets, None)?;
        }
        Ok(())
    }

    /// Every group this node's live shards hold.
    fn groups(&self) -> impl Iterator<Item = &shard::snapshot::GroupSnapshot> + Clone {
        self.live().flat_map(|s| s.groups.iter())
    }

    /// The families per group (consensus), per partition and per receiving
    /// transfer.
    fn group_families(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        self.consensus_families(e)?;
        self.partition_families(e)?;
        self.transfer_families(e)
    }

    /// One gauge family per consensus field, labelled by group.
    fn consensus_families(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        type Field = fn(&shard::snapshot::ConsensusSnapshot) -> u64;
        let per_group: [(&str, &str, Field); 7] = [
            ("replog_group_view", "The group's view", |c| {
                u64::from(c.view)
            }),
            (
                "replog_group_status",
                "The group's status here: 0 normal, 1 view change, 2 recovering",
                |c| status_code(c.status),
            ),
            (
                "replog_group_primary",
                "1 when this replica is the group's primary",
                |c| u64::from(c.primary_here),
            ),
            (
                "replog_group_op",
                "The highest op in the group's log here",
                |c| c.op.0,
            ),
            (
                "replog_group_commit_min",
                "The highest op applied here",
                |c| c.commit_min.0,
            ),
            (
                "replog_group_commit_max",
                "The highest op known committed in the group",
                |c| c.commit_max.0,
            ),
            (
                "replog_group_commit_lag_ops",
                "Ops known committed but not yet applied here (commit_max - commit_min)",
                |c| c.commit_lag_ops(),
            ),
        ];
        for (name, help, field) in per_group {
            let rows = self.groups().map(|g| {
                let label: Label1 = [("group", g.group.0)];
                (label, field(&g.consensus))
            });
            family(e, name, help, Gauge, rows)?;
        }
        Ok(())
    }

    /// One gauge family per partition statistic, labelled by group and by
    /// the stream, topic and partition the metadata names it.
    fn partition_families(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let partitions = || {
            self.groups().filter_map(|g| {
                let p = g.partition.as_ref()?;
                let name = self.0.names.get(&g.group)?;
                let labels = PartitionLabels {
                    group: g.group.0,
                    stream: name.stream,
                    topic: name.topic,
                    partition: name.partition,
                };
                Some((labels, p))
            })
        };
        type PField = fn(&shard::snapshot::PartitionSnapshot) -> u64;
        let per_partition: [(&str, &str, PField); 5] = [
            (
                "replog_partition_messages",
                "Messages the partition holds",
                |p| p.stats.messages_count,
            ),
            (
                "replog_partition_size_bytes",
                "Bytes of the batches the partition holds",
                |p| p.stats.size_bytes,
            ),
            (
                "replog_partition_segments",
                "Segments of the partition",
                |p| p.stats.segments_count,
            ),
            (
                "replog_partition_next_offset",
                "The offset the partition's next message gets",
                |p| p.next_offset().0,
            ),
            (
                "replog_partition_fenced",
                "1 when the partition is fenced",
                |p| u64::from(p.fenced),
            ),
        ];
        for (name, help, field) in per_partition {
            family(
                e,
                name,
                help,
                Gauge,
                partitions().map(|(l, p)| (l, field(p))),
            )?;
        }
        Ok(())
    }

    /// A receiving state transfer's progress, labelled by group and peer.
    fn transfer_families(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let transfers = || {
            self.groups().filter_map(|g| {
                let t = g.transfer?;
                Some((
                    GroupPeer {
                        group: g.group.0,
                        peer: t.peer.0,
                    },
                    t,
                ))
            })
        };
        family(
            e,
            "replog_transfer_progress_bytes",
            "A receiving state transfer's bytes so far",
            Gauge,
            transfers().map(|(l, t)| (l, t.received_bytes)),
        )?;
        family(
            e,
            "replog_transfer_expected_bytes",
            "A receiving state transfer's bytes in all (0 until its offer is accepted)",
            Gauge,
            transfers().map(|(l, t)| (l, t.expected_bytes)),
        )
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.shard_families(&mut encoder)?;
        self.group_families(&mut encoder)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use common::ReplicaId;
    use consensus::vsr::{Config, Frame, Ignored, Message, Replica};
    use shard::{IgnoredTotals, ShardIndex};

    #[test]
    fn given_ignored_frames_when_encoded_should_list_only_the_reasons_that_happened() {
        // A backup told of a repair it never asked for, twice.
        let mut replica = Replica::new(Config::new(common::ReplicaId(1), 3, GroupId(4)));
        for _ in 0..2 {
            let late = Frame {
                group: GroupId(4),
                replica: ReplicaId(2),
                view: 0,
                message: Message::RepairDone {
                    nonce: 9,
                    op: common::Op(0),
                },
            };
            let handled = replica.on_frame(late).unwrap();
            assert_eq!(handled.ignored(), Some(Ignored::NoSuchRepair));
        }
        let mut ignored = IgnoredTotals::default();
        ignored.add(&replica);
        let snapshot = ShardSnapshot {
            shard: ShardIndex(1),
            stats: shard::ShardStats::default(),
            partition_groups: 0,
            totals: shard::snapshot::PartitionTotals::default(),
            transfer: shard::snapshot::TransferTotals::default(),
            ignored,
            groups: Vec::new(),
        };
        let mut out = String::new();
        let collected = Collected {
            shards: vec![None, Some(snapshot)],
            names: BTreeMap::new(),
        };
        encode(&mut out, collected).unwrap();
        let rows: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("replog_shard_frames_ignored_total"))
            .collect();
        assert_eq!(
            rows,
            ["replog_shard_frames_ignored_total{shard=\"1\",reason=\"no_such_repair\"} 2"]
        );
    }
}
