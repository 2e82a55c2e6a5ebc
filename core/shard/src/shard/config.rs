//! The shard's static configuration, [`ShardConfig`], and its defaults.

use std::path::PathBuf;
use std::time::Duration;

use common::{GroupId, ReplicaId};
use consensus::vsr::{Config as VsrConfig, TimeoutConfig};

use crate::placement::ShardIndex;

/// Default tick period.
pub const TICK_DEFAULT: Duration = Duration::from_millis(10);

/// Static configuration of one shard.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// The cluster id every frame carries.
    pub cluster: u128,
    /// This replica.
    pub replica: ReplicaId,
    /// Replicas in the cluster.
    pub replica_count: u8,
    /// This shard's index.
    pub shard: ShardIndex,
    /// Shards per replica (the same on every replica).
    pub shard_count: u16,
    /// The shard's directory (its groups live below it).
    pub dir: PathBuf,
    /// Ceiling on an inbound frame, header included.
    pub frame_size_max: u32,
    /// The groups' VSR timeouts, in ticks.
    pub timeouts: TimeoutConfig,
    /// Applied prepares a partition group keeps in memory for its peers'
    /// repair.
    pub retention_ops: u64,
    /// The same for group 0 (kept apart so that tests can push group 0
    /// past its peers' retention without changing the partitions').
    pub metadata_retention_ops: u64,
    /// Seeds the groups' PRNGs and the shard's client id (per boot).
    pub seed: u64,
    /// The tick period.
    pub tick: Duration,
    /// Whether this shard hosts the metadata group (shard 0 does).
    pub host_metadata: bool,
    /// Bytes of sealed segments the shard reads back and verifies per tick
    /// (`partitions::scrub`), spread over its groups in turn; 0 turns
    /// scrubbing off. At the default 64 KiB and 10 ms ticks that is at most
    /// 6.4 MB/s of reads per shard.
    pub scrub_bytes_per_tick: u64,
    /// Every partition group's `PartitionConfig::record_interval_us`.
    pub record_interval_us: u64,
    /// Every partition group's `PartitionConfig::poll_reply_bytes_max`.
    pub poll_reply_bytes_max: u64,
    /// This boot starts an empty data directory as a replica whose disk
    /// was replaced: shard 0 records the rejoin marker ([`crate::rejoin`])
    /// before it opens group 0. Later boots find the marker; this flag
    /// only matters on the first.
    pub rejoin: bool,
    /// File operations a partition's state-transfer install carries out
    /// per tick (`TransferDriverConfig::install_file_ops_per_step`).
    pub install_file_ops_per_step: usize,
    /// Bytes of flushed batches the shard's partition groups keep in
    /// memory, together, for their peers' repair; past it a group lets go
    /// of its oldest and serves them from its segments
    /// (`partitions::retained`).
    pub retained_bytes_max: u64,
    /// Every partition group's `PartitionConfig::read_back_bytes_per_slice`.
    pub read_back_bytes_per_slice: u64,
    /// Every partition group's `PartitionConfig::boot_tag`: the tag of
    /// this machine boot, 0 when unknown.
    pub boot_tag: u32,
}

impl ShardConfig {
    /// A configuration with the defaults around the identity fields.
    pub fn new(
        cluster: u128,
        replica: ReplicaId,
        replica_count: u8,
        shard: ShardIndex,
        shard_count: u16,
        dir: PathBuf,
    ) -> Self {
        Self {
            cluster,
            replica,
            replica_count,
            shard,
            shard_count,
            dir,
            frame_size_max: consensus::header::FRAME_SIZE_MAX_DEFAULT,
            timeouts: TimeoutConfig::default(),
            retention_ops: VsrConfig::new(ReplicaId(0), 1, GroupId(0)).retention_ops,
            metadata_retention_ops: VsrConfig::new(ReplicaId(0), 1, GroupId(0)).retention_ops,
            seed: 0,
            tick: TICK_DEFAULT,
            host_metadata: shard == ShardIndex(0),
            scrub_bytes_per_tick: SCRUB_BYTES_PER_TICK_DEFAULT,
            record_interval_us: partitions::RECORD_INTERVAL_US_DEFAULT,
            poll_reply_bytes_max: partitions::POLL_REPLY_BYTES_MAX_DEFAULT,
            rejoin: false,
            install_file_ops_per_step: partitions::state_transfer::INSTALL_FILE_OPS_PER_STEP,
            retained_bytes_max: partitions::RETAINED_BYTES_MAX_DEFAULT,
            read_back_bytes_per_slice: partitions::READ_BACK_BYTES_PER_SLICE_DEFAULT,
            boot_tag: 0,
        }
    }
}

/// Default [`ShardConfig::scrub_bytes_per_tick`].
pub const SCRUB_BYTES_PER_TICK_DEFAULT: u64 = 64 * 1024;
