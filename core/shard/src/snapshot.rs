//! What a shard shows an observer: its counters and, per group, the
//! consensus position, the partition's size and a running state
//! transfer's progress, copied out in one step between two inputs.
//!
//! The server's metrics endpoint asks each shard for one on every scrape
//! ([`crate::Input::Snapshot`]), so the hot paths carry no shared counters
//! and no lock: the shard's own `&mut` state is the source, read on its
//! own thread. Taking one is a walk over the groups and no I/O; with
//! [`SnapshotDetail::Totals`] the per-group list is left out (sums only),
//! which bounds what a scrape costs and how many series it makes on a
//! replica with tens of thousands of partitions.

use std::fmt;
use std::time::Duration;

use common::{GroupId, Offset, Op, ReplicaId};
use consensus::vsr::{Ignored, Replica, Status};
use partitions::PartitionStats;

use crate::placement::ShardIndex;
use crate::shard::ShardStats;

/// How much a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotDetail {
    /// Every group, one entry each.
    Groups,
    /// The shard's sums only (group 0's consensus position still listed).
    Totals,
}

/// One shard's state for an observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSnapshot {
    /// The shard.
    pub shard: ShardIndex,
    /// Its counters.
    pub stats: ShardStats,
    /// Partition groups on the shard.
    pub partition_groups: u64,
    /// Sums over the shard's partitions.
    pub totals: PartitionTotals,
    /// Transfer counters over the shard's groups, deleted ones included.
    pub transfer: TransferTotals,
    /// Frames from peers the shard's groups (group 0 included) took no
    /// action on, by reason, deleted groups included.
    pub ignored: IgnoredTotals,
    /// Per group (group 0 first where hosted); partition groups only with
    /// [`SnapshotDetail::Groups`].
    pub groups: Vec<GroupSnapshot>,
}

/// Frames from peers that changed nothing, per [`Ignored`] reason, summed
/// over a shard's groups. Monotonic: a deleted group's counts stay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IgnoredTotals([u64; Ignored::ALL.len()]);

impl IgnoredTotals {
    /// Adds a replica's counts.
    pub fn add(&mut self, replica: &Replica) {
        for (sum, reason) in self.0.iter_mut().zip(Ignored::ALL) {
            *sum += replica.frames_ignored(reason);
        }
    }

    /// The count for one reason.
    pub fn get(&self, reason: Ignored) -> u64 {
        Ignored::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.0[i])
    }

    /// Every reason with its count, in [`Ignored::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Ignored, u64)> + '_ {
        Ignored::ALL.into_iter().zip(self.0.iter().copied())
    }
}

/// Sums over a shard's partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionTotals {
    /// Messages held.
    pub messages: u64,
    /// Bytes of the batches held.
    pub size_bytes: u64,
    /// Segments on disk.
    pub segments: u64,
    /// Partitions fenced.
    pub fenced: u64,
    /// Partitions whose disk is full: writes refused, reads served, the
    /// flush retried until space is freed.
    pub out_of_space: u64,
    /// Partitions with a state transfer receiving.
    pub transferring: u64,
    /// Batches the partitions read back from their segments to serve a
    /// peer's repair (`partitions::retained`), since each opened.
    pub read_back_bodies: u64,
}

/// State-transfer counters of a shard. Monotonic: a deleted group's
/// counts are kept in the shard's sums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferTotals {
    /// Chunk bytes received and accepted.
    pub received_bytes: u64,
    /// Chunks served to peers.
    pub chunks_served: u64,
    /// Offers served to peers.
    pub offers_served: u64,
    /// Installs that failed.
    pub install_failures: u64,
}

/// One group's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// The group.
    pub group: GroupId,
    /// Its consensus position.
    pub consensus: ConsensusSnapshot,
    /// The partition's size (`None` for group 0).
    pub partition: Option<PartitionSnapshot>,
    /// A receiving transfer's progress, while one runs.
    pub transfer: Option<TransferProgress>,
}

/// A group's VSR position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsensusSnapshot {
    /// The view.
    pub view: u32,
    /// The status.
    pub status: Status,
    /// Whether this replica is the view's primary.
    pub primary_here: bool,
    /// The view's primary.
    pub primary: ReplicaId,
    /// The highest op in the log.
    pub op: Op,
    /// The highest op applied here.
    pub commit_min: Op,
    /// The highest op known committed in the group.
    pub commit_max: Op,
}

impl ConsensusSnapshot {
    /// Ops known committed but not applied here yet.
    pub fn commit_lag_ops(&self) -> u64 {
        self.commit_max.0.saturating_sub(self.commit_min.0)
    }

    fn of(replica: &consensus::vsr::Replica) -> Self {
        let view = replica.view();
        Self {
            view,
            status: replica.status(),
            primary_here: replica.is_primary(),
            primary: replica.primary_index(view),
            op: replica.op(),
            commit_min: replica.commit_min(),
            commit_max: replica.commit_max(),
        }
    }
}

/// A partition's size and offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSnapshot {
    /// Its partition id within the topic.
    pub partition_id: u32,
    /// Messages held, bytes, segments, last offset.
    pub stats: PartitionStats,
    /// Whether it is fenced.
    pub fenced: bool,
}

impl PartitionSnapshot {
    /// The offset the next message will get.
    pub fn next_offset(&self) -> Offset {
        self.stats.current_offset.map_or(Offset::ZERO, Offset::next)
    }
}

/// How far a receiving transfer got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferProgress {
    /// The serving peer.
    pub peer: ReplicaId,
    /// Bytes received (staged or in flight to staging).
    pub received_bytes: u64,
    /// Bytes the accepted manifest declares (0 before it is accepted).
    pub expected_bytes: u64,
}

/// Durations of completed transfers (armed to installed), by the
/// environment's clock, in fixed buckets: what the metrics endpoint
/// exposes as a histogram without the shard depending on its library.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurationBuckets {
    /// Observations at or below each bound of [`Self::BOUNDS_SECONDS`].
    pub cumulative: [u64; TRANSFER_BUCKETS],
    /// Observations.
    pub count: u64,
    /// Their sum, in microseconds.
    pub sum_us: u64,
}

const TRANSFER_BUCKETS: usize = 10;

impl DurationBuckets {
    /// The bucket bounds, in seconds (a transfer takes from a fraction of
    /// a second for an empty partition to hours for a large one).
    pub const BOUNDS_SECONDS: [f64; TRANSFER_BUCKETS] =
        [0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

    /// Records one duration.
    pub fn observe(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bound, count) in Self::BOUNDS_SECONDS.iter().zip(self.cumulative.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum_us = self
            .sum_us
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }
}

/// Where a shard delivers a snapshot (called once, on the shard's thread).
pub struct SnapshotReply(Box<dyn FnOnce(ShardSnapshot) + Send>);

impl SnapshotReply {
    /// A reply that hands the snapshot to `deliver`.
    pub fn new(deliver: impl FnOnce(ShardSnapshot) + Send + 'static) -> Self {
        Self(Box::new(deliver))
    }

    /// Delivers the snapshot.
    pub fn send(self, snapshot: ShardSnapshot) {
        (self.0)(snapshot);
    }
}

impl fmt::Debug for SnapshotReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotReply")
    }
}

pub(crate) fn consensus_of(replica: &consensus::vsr::Replica) -> ConsensusSnapshot {
    ConsensusSnapshot::of(replica)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_durations_when_observed_should_count_each_in_every_bucket_at_or_above_it() {
        let mut b = DurationBuckets::default();
        b.observe(Duration::from_millis(50));
        b.observe(Duration::from_secs(2));
        b.observe(Duration::from_secs(7200));
        assert_eq!(b.count, 3);
        assert_eq!(b.cumulative[0], 1, "0.1 s");
        assert_eq!(b.cumulative[2], 1, "1 s");
        assert_eq!(b.cumulative[3], 2, "5 s");
        assert_eq!(
            b.cumulative[TRANSFER_BUCKETS - 1],
            2,
            "an hour; 2 h is past it"
        );
        assert_eq!(b.sum_us, 50_000 + 2_000_000 + 7_200_000_000);
    }
}
