//! The shard: every group of one core, and the three inputs that drive
//! them — frames from peer replicas, ticks, and client calls.
//!
//! Groups live in a `BTreeMap` keyed by group id, so every walk over them
//! is in the same order on every replica and every run. A group is a
//! [`Partition`] with its [`TransferDriver`]; the shard owns both through
//! `&mut` and never holds a borrow across an await that another input
//! could need (inputs are handled one at a time by the pump).
//!
//! Frames arrive as bytes from a connection whose peer is known. The shard
//! checks them once, here: the state-transfer commands go to the group's
//! driver (which runs the header codec and its own checks), every other
//! command through [`consensus::vsr::wire::decode`] with the cluster, the
//! size ceiling and the connection's peer. A refused frame is counted by
//! its reason ([`FrameRefusal`]) and changes nothing.
//!
//! Replicated client calls (produce, offset store and delete, purge) need
//! a VSR client session with the group. The shard is that client: one
//! client id per shard and boot, a session registered with each group the
//! first time a call needs it, request numbers in order. Calls wait in the
//! group's queue while the session is being opened and are answered from
//! the replies the partition delivers when their ops commit.

mod bus;
mod calls;
mod config;
mod errors;
mod frames;
mod group;
mod plane;
mod tick;

pub use bus::ShardBus;
pub use config::{ShardConfig, TICK_DEFAULT};
pub use errors::{FrameRefusal, GroupError};

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use common::{GroupId, METADATA_GROUP};
use consensus::vsr::Config as VsrConfig;
use journal::{CleanStop, SuperblockTable, TableSuperblock};
use partitions::state_transfer::{BuildClock, TransferDriver, TransferSlots};
use partitions::{Partition, RetentionPolicy};
use storage::fs::Fs;

use crate::catalog;
use crate::env::Env;
use crate::metadata_host::MetadataHost;
use crate::metadata_transfer::MetadataTransferConfig;
use crate::placement::ShardIndex;
use crate::pump::Inbox;
use crate::rejoin::{self, Rejoin};
use crate::snapshot::{
    DurationBuckets, GroupSnapshot, IgnoredTotals, PartitionSnapshot, PartitionTotals,
    ShardSnapshot, SnapshotDetail, TransferProgress, TransferTotals, consensus_of,
};

use bus::ReplyQueue;
use group::Group;
use tick::Visits;

/// Group 0's directory under shard 0's.
pub const METADATA_DIR: &str = "metadata";

/// Counters of a shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Frames accepted.
    pub frames_in: u64,
    /// Frames refused, by [`FrameRefusal::reason`].
    pub frames_refused: BTreeMap<&'static str, u64>,
    /// Frames handed to the environment.
    pub frames_out: u64,
    /// Frames the environment dropped.
    pub frames_dropped: u64,
    /// Ticks run.
    pub ticks: u64,
    /// Groups visited by ticks (a group is visited only on ticks when it
    /// has something due).
    pub group_visits: u64,
    /// Calls answered, successful or not.
    pub calls: u64,
    /// Groups fenced since boot.
    pub fenced: u64,
    /// Groups the metadata names that could not be created or opened
    /// since boot (at boot, at runtime, or by a reconcile); each is also
    /// logged. Such a group is absent here until a restart opens it.
    pub groups_not_opened: u64,
    /// Transfers installed since boot.
    pub installs: u64,
    /// How long the installed transfers took, armed to installed.
    pub transfer_durations: DurationBuckets,
    /// Bytes of flushed batches the partition groups keep in memory for
    /// repair, now and at most after any flush, and the ceiling
    /// ([`ShardConfig::retained_bytes_max`]).
    pub retained_bytes: u64,
    /// See [`ShardStats::retained_bytes`].
    pub retained_bytes_peak: u64,
    /// See [`ShardStats::retained_bytes`].
    pub retained_bytes_max: u64,
    /// Batches let go of to stay within the ceiling (read back from the
    /// segments if a peer's repair needs them).
    pub retained_spilled: u64,
    /// What the shard's superblock table wrote since boot: batches (two
    /// syncs each), the records and frees they carried, the largest.
    pub superblock: journal::TableStats,
}

/// The partition type a shard hosts.
pub type ShardPartition<E> =
    Partition<ShardBus<E>, TableSuperblock<<E as Env>::Fs>, <E as Env>::Fs>;

/// A build clock over the environment's monotonic time.
struct EnvClock<'a, E: Env>(&'a E);

impl<E: Env> BuildClock for EnvClock<'_, E> {
    fn now(&self) -> Duration {
        self.0.now()
    }
}

/// The groups of one core and what drives them.
pub struct Shard<E: Env> {
    config: ShardConfig,
    env: Rc<E>,
    groups: BTreeMap<GroupId, Group<E>>,
    slots: TransferSlots,
    /// The byte ceiling the partition groups' retained bodies share.
    retained: partitions::RetainedBudget,
    replies: ReplyQueue,
    sent: Rc<RefCell<(u64, u64)>>,
    client: u128,
    /// Groups with replicated calls waiting for their commit.
    in_flight_groups: BTreeSet<GroupId>,
    /// Groups with reads waiting for their read check.
    reading_groups: BTreeSet<GroupId>,
    /// Which groups the next tick visits, and which inputs reached since
    /// the last rescheduling.
    visits: Visits,
    /// Group 0, on the shard that hosts it.
    metadata: Option<MetadataHost<E>>,
    /// The rejoin marker, on the shard that hosts group 0, while this
    /// replica rejoins after a disk replacement (or has rejoined: it then
    /// names the last op whose groups it may have seen before).
    rejoin: Option<Rejoin>,
    /// Every shard's inbox of this replica, by index (set by the node once
    /// all shards exist): where effects for other shards' groups go.
    siblings: Vec<Inbox>,
    tick: u64,
    stats: ShardStats,
    /// The transfer counters of deleted groups (the shard's sums stay
    /// monotonic).
    transfer_retired: TransferTotals,
    /// Ignored frames of the groups deleted since boot.
    ignored_retired: IgnoredTotals,
    retention: RetentionPolicy,
    /// The group the next tick's scrub starts after.
    scrub_after: GroupId,
    /// The last group the handle pass saw.
    handles_after: GroupId,
    /// Every partition group's superblock record, in batches
    /// (journal::superblock_table).
    superblocks: Rc<SuperblockTable<E::Fs>>,
    /// The groups whose directories existed when the table opened: only
    /// they may have had a record in a slot the table lost.
    booted: BTreeSet<GroupId>,
}

impl<E: Env> std::fmt::Debug for Shard<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("replica", &self.config.replica)
            .field("shard", &self.config.shard)
            .field("groups", &self.groups.len())
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

impl<E: Env> Shard<E> {
    /// Boots the shard from its directory: finishes interrupted deletes,
    /// removes creates that never recorded their spec, and opens every
    /// group that has one. A group that fails to boot is logged and left
    /// on disk; the shard serves the others.
    ///
    /// # Errors
    /// Only when the shard directory itself cannot be listed.
    pub async fn open(config: ShardConfig, env: Rc<E>) -> std::io::Result<Self> {
        let fs = env.fs().clone();
        let listing = catalog::list(&fs, &config.dir).await?;
        let superblocks = SuperblockTable::open(fs.clone(), &config.dir)
            .await
            .map(Rc::new)
            .map_err(std::io::Error::other)?;
        // Unique per replica, shard and boot: a restarted shard must not
        // reuse request numbers a table still holds for its last boot.
        let client = (u128::from(config.seed) << 64)
            | (u128::from(config.replica.0) << 16)
            | u128::from(config.shard.0)
            | (1 << 127);
        let mut shard = Self {
            replies: Rc::new(RefCell::new(Vec::new())),
            sent: Rc::new(RefCell::new((0, 0))),
            slots: TransferSlots::default(),
            retained: partitions::RetainedBudget::new(config.retained_bytes_max),
            groups: BTreeMap::new(),
            client,
            in_flight_groups: BTreeSet::new(),
            reading_groups: BTreeSet::new(),
            visits: Visits::default(),
            metadata: None,
            rejoin: None,
            siblings: Vec::new(),
            tick: 0,
            stats: ShardStats::default(),
            transfer_retired: TransferTotals::default(),
            ignored_retired: IgnoredTotals::default(),
            retention: RetentionPolicy::default(),
            scrub_after: GroupId(0),
            handles_after: GroupId(0),
            superblocks,
            booted: listing.groups.iter().copied().collect(),
            config,
            env,
        };
        if shard.config.host_metadata {
            shard.open_metadata_host().await?;
        }
        shard.warn_foreign_entries(&listing.foreign);
        // Taken (read and removed durably) before any group opens, so no
        // group sends anything while a record that vouches for it stands.
        let clean_stops = journal::take_clean_stops(&fs, &shard.config.dir).await;
        for group in listing.deleted {
            if let Err(error) = catalog::finish_delete(&fs, &shard.config.dir, group).await {
                tracing::error!(group = group.0, %error, "could not finish an interrupted delete");
            }
        }
        shard.free_deleted_records().await;
        shard.open_listed_groups(listing.groups, clean_stops).await;
        tracing::info!(
            replica = shard.config.replica.0,
            shard = shard.config.shard.0,
            groups = shard.groups.len(),
            dir = %shard.config.dir.display(),
            "shard open"
        );
        Ok(shard)
    }

    /// Opens group 0 on a shard that hosts it, writing the rejoin marker
    /// first when the replica rejoins after a disk replacement.
    async fn open_metadata_host(&mut self) -> std::io::Result<()> {
        let fs = self.env.fs().clone();
        let mut vsr = VsrConfig::new(
            self.config.replica,
            self.config.replica_count,
            METADATA_GROUP,
        );
        vsr.timeouts = self.config.timeouts;
        vsr.retention_ops = self.config.metadata_retention_ops;
        vsr.seed = self.config.seed ^ 0x0E7A;
        if self.config.rejoin && rejoin::read(&fs, &self.config.dir).await?.is_none() {
            // Before group 0 exists on disk: a crash after this finds
            // the marker, a crash before it finds an empty directory.
            rejoin::write(&fs, &self.config.dir, &Rejoin { through_op: None }).await?;
            tracing::warn!(dir = %self.config.dir.display(), "rejoining after a disk replacement: every group stays out of every quorum until it caught up");
        }
        self.rejoin = rejoin::read(&fs, &self.config.dir).await?;
        let dir = self.config.dir.join(METADATA_DIR);
        let rejoining = self.rejoin.is_some();
        let mut transfer = MetadataTransferConfig::new(self.config.cluster);
        transfer.frame_size_max = self.config.frame_size_max;
        match MetadataHost::open(Rc::clone(&self.env), &dir, vsr, transfer, rejoining).await {
            Ok(host) => self.metadata = Some(host),
            Err(reason) => {
                return Err(std::io::Error::other(reason));
            }
        }
        Ok(())
    }

    /// Logs every entry of the shard directory that no code here owns.
    fn warn_foreign_entries(&self, foreign: &[String]) {
        for name in foreign.iter().filter(|n| {
            n.as_str() != METADATA_DIR
                && !n.starts_with(rejoin::REJOIN_FILE)
                && !n.starts_with(journal::CLEAN_STOPS_FILE)
                && !journal::TABLE_NAMES.contains(&n.as_str())
        }) {
            tracing::warn!(dir = %self.config.dir.display(), name, "unknown entry in shard directory left alone");
        }
    }

    /// Frees the superblock records of groups whose directory is gone.
    async fn free_deleted_records(&self) {
        // Records of groups whose directory is gone: a delete the process
        // did not live to free (the directory goes first, then the record).
        let booted = self.booted.clone();
        match self
            .superblocks
            .free_unless(|key| booted.contains(&key.group))
            .await
        {
            Ok(0) => {}
            Ok(freed) => tracing::info!(freed, "freed the superblock records of deleted groups"),
            Err(error) => tracing::warn!(%error, "superblock records of deleted groups not freed"),
        }
    }

    /// Opens every listed group with its clean-stop record, removing the
    /// ones whose create never finished.
    async fn open_listed_groups(
        &mut self,
        groups: Vec<GroupId>,
        mut clean_stops: BTreeMap<u64, CleanStop>,
    ) {
        let fs = self.env.fs().clone();
        for group in groups {
            let dir = catalog::group_dir(&self.config.dir, group);
            match catalog::read_spec(&fs, &dir).await {
                Ok(Some(spec)) if spec.group == group => {
                    let stop = clean_stops.remove(&group.0);
                    if let Err(error) = self.open_group(spec, stop).await {
                        self.stats.groups_not_opened += 1;
                        tracing::error!(group = group.0, %error, "group left closed");
                    }
                }
                Ok(Some(spec)) => tracing::error!(
                    group = group.0,
                    spec_group = spec.group.0,
                    "group directory holds another group's spec; left alone"
                ),
                Ok(None) => {
                    tracing::info!(
                        group = group.0,
                        "removing a group whose create never finished"
                    );
                    if let Err(error) =
                        catalog::remove_unfinished(&fs, &self.config.dir, group).await
                    {
                        tracing::error!(group = group.0, %error, "could not remove it");
                    }
                }
                Err(error) => {
                    tracing::error!(group = group.0, %error, "group spec unreadable; left closed")
                }
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// The environment.
    pub fn env(&self) -> Rc<E> {
        Rc::clone(&self.env)
    }

    /// Flushes every group's committed messages (on stop).
    pub async fn flush_all(&mut self) {
        for (id, g) in &mut self.groups {
            // An install in flight holds nothing to flush; a restart
            // converges it (the marker) and pulls again.
            if g.partition.fenced().is_some() || g.partition.installing() {
                continue;
            }
            if let Err(error) = g.partition.flush_committed_messages().await {
                tracing::warn!(group = id.0, %error, "flush on stop failed");
            }
        }
    }

    /// The last step of a clean stop, after [`Shard::flush_all`] and with
    /// no input served after it: every group (group 0 included) that has
    /// acknowledged nothing past its durable state records so, and comes
    /// back from the next boot as a full member of its view rather than a
    /// quorum-invisible one (`journal::clean_stop`). Returns how many
    /// groups recorded and how many could not (they restart under the
    /// rule of docs/consensus.md §4, as after a crash).
    pub async fn record_clean_stops(&mut self) -> (usize, usize) {
        let (mut clean, mut not) = (0, 0);
        if let Some(host) = self.metadata.as_mut() {
            match host.group.record_clean_stop().await {
                Ok(true) => clean += 1,
                Ok(false) => not += 1,
                Err(error) => {
                    not += 1;
                    tracing::warn!(%error, "metadata clean-stop record failed");
                }
            }
        }
        // One file for every partition group of the shard: one durable
        // write at stop, one read and one removal at boot.
        let stops: BTreeMap<u64, journal::CleanStop> = self
            .groups
            .iter()
            .filter_map(|(id, g)| Some((id.0, g.partition.clean_stop()?)))
            .collect();
        let fs = self.env.fs().clone();
        match journal::record_clean_stops(&fs, &self.config.dir, &stops).await {
            Ok(()) => {
                clean += stops.len();
                not += self.groups.len() - stops.len();
            }
            Err(error) => {
                not += self.groups.len();
                tracing::warn!(dir = %self.config.dir.display(), %error, "clean-stop records failed");
            }
        }
        (clean, not)
    }

    /// The groups that hold a record in the shard's superblock table.
    pub fn superblock_records(&self) -> BTreeSet<GroupId> {
        self.superblocks
            .keys()
            .into_iter()
            .map(|k| k.group)
            .collect()
    }

    /// The counters.
    pub fn stats(&self) -> ShardStats {
        let mut stats = self.stats.clone();
        stats.superblock = self.superblocks.stats();
        let sent = *self.sent.borrow();
        stats.frames_out = sent.0;
        stats.frames_dropped = sent.1;
        stats.retained_bytes = self.retained.used();
        stats.retained_bytes_peak = self.retained.peak();
        stats.retained_bytes_max = self.retained.limit();
        stats.retained_spilled = self.retained.spilled();
        stats
    }

    /// The shard's state for an observer (the metrics endpoint): its
    /// counters, sums over its partitions and, with
    /// [`SnapshotDetail::Groups`], every group's position. A pure read.
    pub fn snapshot(&self, detail: SnapshotDetail) -> ShardSnapshot {
        let mut totals = PartitionTotals::default();
        let mut transfer = self.transfer_retired;
        let mut ignored = self.ignored_retired;
        let mut groups = Vec::new();
        if let Some(host) = self.metadata.as_ref() {
            ignored.add(host.replica());
            groups.push(GroupSnapshot {
                group: METADATA_GROUP,
                consensus: consensus_of(host.replica()),
                partition: None,
                transfer: None,
            });
        }
        for (id, g) in &self.groups {
            let stats = g.partition.stats();
            let fenced = g.partition.fenced().is_some();
            totals.messages += stats.messages_count;
            totals.size_bytes += stats.size_bytes;
            totals.segments += stats.segments_count;
            totals.fenced += u64::from(fenced);
            totals.out_of_space += u64::from(g.partition.out_of_space());
            totals.read_back_bodies += g.partition.read_backs().1;
            add_transfer_totals(&mut transfer, &g.driver);
            ignored.add(g.partition.replica());
            let progress = transfer_progress(&g.driver);
            totals.transferring += u64::from(progress.is_some());
            if detail == SnapshotDetail::Groups {
                groups.push(GroupSnapshot {
                    group: *id,
                    consensus: consensus_of(g.partition.replica()),
                    partition: Some(PartitionSnapshot {
                        partition_id: g.spec.partition_id,
                        stats,
                        fenced,
                    }),
                    transfer: progress,
                });
            }
        }
        ShardSnapshot {
            shard: self.config.shard,
            stats: self.stats(),
            partition_groups: self.groups.len() as u64,
            totals,
            transfer,
            ignored,
            groups,
        }
    }

    /// The groups on this shard, ascending.
    pub fn groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.groups.keys().copied()
    }

    /// A group's partition, for inspection.
    pub fn partition(&self, group: GroupId) -> Option<&ShardPartition<E>> {
        self.groups.get(&group).map(|g| &g.partition)
    }

    /// A group's transfer driver, for inspection.
    pub fn driver(&self, group: GroupId) -> Option<&TransferDriver<E::Fs>> {
        self.groups.get(&group).map(|g| &g.driver)
    }

    /// The shard-wide transfer budget.
    pub fn slots(&self) -> &TransferSlots {
        &self.slots
    }
}

fn add_transfer_totals<F: Fs>(totals: &mut TransferTotals, driver: &TransferDriver<F>) {
    let stats = driver.stats();
    totals.received_bytes += driver.receiver().stats().chunk_bytes;
    totals.chunks_served += stats.chunks_served;
    totals.offers_served += stats.offers_served;
    totals.install_failures += stats.install_failures;
}

/// A receiving session's progress: what its artifacts hold so far against
/// what the accepted manifest declares.
fn transfer_progress<F: Fs>(driver: &TransferDriver<F>) -> Option<TransferProgress> {
    use consensus::ChunkProgress;
    let session = driver.receiver().session()?;
    let (received_bytes, expected_bytes) = session.accepted().map_or((0, 0), |accepted| {
        accepted.artifacts.iter().fold((0u64, 0u64), |(r, e), a| {
            (
                r.saturating_add(a.received_len()),
                e.saturating_add(a.declared_len()),
            )
        })
    });
    Some(TransferProgress {
        peer: session.peer,
        received_bytes,
        expected_bytes,
    })
}

/// The directory of shard `shard` under a replica's data directory.
pub fn shard_dir(data_dir: &Path, shard: ShardIndex) -> PathBuf {
    data_dir.join(format!("shard-{}", shard.0))
}
