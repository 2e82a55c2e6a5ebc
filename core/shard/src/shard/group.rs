//! One group on the shard (its partition, transfer driver and client
//! session) and the shard's steps that create, open and delete groups.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use common::GroupId;
use consensus::vsr::Config as VsrConfig;
use journal::{FileSuperblock, TableKey, TableSuperblock};
use partitions::state_transfer::{TransferDriver, TransferDriverConfig};
use partitions::{Partition, PartitionConfig, PartitionError, RetentionPolicy};
use storage::fs::Fs;

use super::bus::ShardBus;
use super::calls::{InFlight, Orphan, PendingRead};
use super::errors::GroupError;
use super::{Shard, ShardPartition, add_transfer_totals};
use crate::call::{Call, CallError, ReplyTx};
use crate::catalog::{self, GroupSpec};
use crate::env::Env;
use crate::placement::shard_of;
use crate::session::Session;

/// How long a primary waits for a purge it proposed to apply before it
/// proposes it again.
pub(super) const PURGE_RETRY_TICKS: u64 = 100;

pub(super) struct Group<E: Env> {
    pub(super) spec: GroupSpec,
    pub(super) partition: ShardPartition<E>,
    pub(super) driver: TransferDriver<E::Fs>,
    pub(super) session: Session,
    pub(super) next_request: u64,
    /// Calls waiting for the session.
    pub(super) queued: VecDeque<(Call, ReplyTx)>,
    /// Replicated calls sent, by request number.
    pub(super) in_flight: BTreeMap<u64, InFlight>,
    /// Calls prepared here before this replica stopped being primary, by
    /// request number, until their op's fate is known here.
    pub(super) orphans: BTreeMap<u64, Orphan>,
    /// Reads waiting for their read check, oldest first.
    pub(super) reads: VecDeque<PendingRead>,
    pub(super) fenced_reported: bool,
    /// The view and whether this replica was its primary, as last logged.
    seen_view: (u32, bool),
    /// Census views this replica started, as last logged.
    seen_census: u64,
    /// When the running transfer was first armed (the environment's clock),
    /// for its duration once installed.
    pub(super) transfer_armed_at: Option<Duration>,
    /// The shard tick through which the partition's ticks are counted
    /// (ticked, or skipped while nothing was due).
    pub(super) counted_to: u64,
    /// The shard tick the group is scheduled to be visited at.
    pub(super) due_at: u64,
    /// The partition's op when the handle pass last found its files busy
    /// with unsynced writes.
    pub(super) handles_seen_op: Option<u64>,
    /// The group's head when the handle pass last saw it holding bodies
    /// for repair (an idle one lets them go on the next pass).
    pub(super) retained_seen_op: Option<u64>,
    /// The purge generation this replica last proposed as the group's
    /// primary, and the shard tick it did.
    pub(super) purge_proposed: Option<(u64, u64)>,
}

impl<E: Env> Group<E> {
    /// Whether group 0 committed a purge generation this partition has not
    /// applied yet.
    pub(super) fn owes_purge(&self) -> bool {
        self.driver
            .committed_purge_generation()
            .is_some_and(|committed| committed > self.partition.purge_generation())
    }

    /// A purge group 0 committed is proposed to the partition group by
    /// whichever replica is its primary when the effect is applied; a
    /// primary that was down, changing views or not yet caught up then
    /// leaves it unproposed, and no client is told. So the group's
    /// primary proposes any committed generation its partition has not
    /// applied, again every `PURGE_RETRY_TICKS` until it has (a second
    /// copy applies as nothing: a purge needs a newer generation).
    pub(super) fn propose_missing_purge(&mut self, id: GroupId, tick: u64) {
        let Some(committed) = self.driver.committed_purge_generation() else {
            return;
        };
        let due = self.owes_purge()
            && self.partition.replica().is_caught_up_primary()
            && self.partition.fenced().is_none()
            && self.purge_proposed.is_none_or(|(generation, at)| {
                generation < committed || tick.saturating_sub(at) >= PURGE_RETRY_TICKS
            });
        if !due {
            return;
        }
        tracing::info!(
            group = id.0,
            generation = committed,
            applied = self.partition.purge_generation(),
            "proposing a committed purge the group has not applied"
        );
        self.purge_proposed = Some((committed, tick));
        // Nobody waits for the answer (the client's purge asks its own
        // copy). Ahead of the calls already waiting: they are proposed
        // after it, so the purge does not erase them once acknowledged.
        let (reply, _) = futures::channel::oneshot::channel();
        self.queued.push_front((
            Call::Purge {
                generation: committed,
            },
            reply,
        ));
    }

    /// What a tick does to this group alone: the ticks since its last
    /// visit counted, its partition's tick and, when `retention` is given,
    /// its retention pass. Touches nothing of the shard, so the due groups'
    /// own ticks can run at once.
    pub(super) async fn own_tick(
        &mut self,
        id: GroupId,
        tick: u64,
        now_us: u64,
        retention: Option<&RetentionPolicy>,
    ) {
        // The ticks since its last visit did nothing: count them.
        self.partition
            .skip_ticks(tick.saturating_sub(self.counted_to).saturating_sub(1));
        self.counted_to = tick;
        if let Err(error) = self.partition.on_tick(now_us).await
            && !matches!(error, PartitionError::Fenced { .. })
        {
            tracing::warn!(group = id.0, %error, "tick failed");
        }
        if let Some(base) = retention
            && self.spec.retains()
            && self.partition.fenced().is_none()
            && !self.partition.installing()
        {
            let policy = RetentionPolicy {
                max_age_us: (self.spec.message_expiry_us > 0)
                    .then_some(self.spec.message_expiry_us),
                max_total_bytes: (self.spec.retained_bytes_max > 0)
                    .then_some(self.spec.retained_bytes_max),
                ..*base
            };
            if let Err(error) = self.partition.retention_pass(now_us, &policy).await {
                tracing::warn!(group = id.0, %error, "retention pass failed");
            }
        }
    }

    /// Logs a change of the group's view, or of whether this replica is
    /// its primary: what an operator watches after a replica fails.
    pub(super) fn note_view(&mut self, id: GroupId) {
        let replica = self.partition.replica();
        let now = (replica.view(), replica.is_primary());
        if now == self.seen_view {
            return;
        }
        let primary = replica.primary_index(now.0);
        let census = replica.census_views_started();
        if census > self.seen_census {
            self.seen_census = census;
            // docs/consensus.md §4, "Whole-group restart".
            tracing::info!(
                group = id.0,
                view = now.0,
                op = replica.commit_min().0,
                "every replica of the group restarted: started a view from the longest applied state"
            );
        } else if now.0 != self.seen_view.0 {
            tracing::info!(
                group = id.0,
                view = now.0,
                primary = primary.0,
                "group view changed"
            );
        } else {
            // The view's start (this replica finishing it as primary):
            // every group of a new cluster does this once.
            tracing::debug!(
                group = id.0,
                view = now.0,
                primary = primary.0,
                primary_here = now.1,
                "group view started"
            );
        }
        self.seen_view = now;
    }
}

impl<E: Env> Shard<E> {
    /// Creates a group durably and opens it.
    ///
    /// # Errors
    /// [`GroupError`]; a create cut short leaves nothing a boot would keep.
    pub async fn create_group(&mut self, spec: GroupSpec) -> Result<(), GroupError> {
        let owner = shard_of(spec.group, self.config.shard_count);
        if owner != self.config.shard {
            return Err(GroupError::WrongShard {
                group: spec.group,
                owner,
            });
        }
        if self.groups.contains_key(&spec.group) {
            return Err(GroupError::AlreadyExists(spec.group));
        }
        let fs = self.env.fs().clone();
        let created = catalog::create(&fs, &self.config.dir, &spec)
            .await
            .map_err(|source| GroupError::Io {
                group: spec.group,
                step: "create",
                source,
            });
        let result = match created {
            Ok(_) => self.open_group(spec, None).await,
            Err(error) => Err(error),
        };
        if result.is_err() {
            self.stats.groups_not_opened += 1;
        }
        result
    }

    /// Deletes a group: it stops serving at once, and its directory is
    /// gone for good once this returns (a crash after the commit point
    /// finishes the removal at boot, never brings the group back).
    ///
    /// # Errors
    /// [`GroupError`].
    pub async fn delete_group(&mut self, group: GroupId) -> Result<(), GroupError> {
        let Some(mut removed) = self.groups.remove(&group) else {
            return Err(GroupError::Unknown(group));
        };
        self.visits.schedule.remove(&(removed.due_at, group));
        removed.driver.release(&mut self.slots);
        add_transfer_totals(&mut self.transfer_retired, &removed.driver);
        self.ignored_retired.add(removed.partition.replica());
        for (_, reply) in removed.queued.drain(..) {
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
        }
        let replies = std::mem::take(&mut removed.in_flight)
            .into_values()
            .map(|f| f.reply)
            .chain(
                std::mem::take(&mut removed.orphans)
                    .into_values()
                    .map(|o| o.reply),
            );
        for reply in replies {
            let _ = reply.send(Err(CallError::Indeterminate {
                reason: "the group was deleted",
            }));
        }
        let key = TableKey {
            group,
            incarnation: removed.spec.incarnation,
        };
        drop(removed);
        self.booted.remove(&group);
        let fs = self.env.fs().clone();
        catalog::delete(&fs, &self.config.dir, group)
            .await
            .map_err(|source| GroupError::Io {
                group,
                step: "delete",
                source,
            })?;
        // After the directory: a crash between the two leaves a record
        // with no group, which boot frees; the other order could leave a
        // group with no record, which would boot as new.
        if let Err(error) = self.superblocks.free(key).await {
            tracing::warn!(group = group.0, %error, "superblock record not freed; the next boot frees it");
        }
        Ok(())
    }

    /// A group directory from before the shard's table, holding its own
    /// two-copy superblock: its record moves into the table (durably)
    /// before the old files go, so a crash between finds it in one or the
    /// other — the table's once it is there.
    async fn adopt_legacy_superblock(&self, key: TableKey, dir: &Path) -> Result<(), GroupError> {
        let group = key.group;
        let fs = self.env.fs().clone();
        let io = |step: &'static str| {
            move |source: std::io::Error| GroupError::Io {
                group,
                step,
                source,
            }
        };
        let names = journal::SLOT_NAMES.map(|n| dir.join(n));
        let mut present = false;
        for path in &names {
            present |= fs.exists(path).await.map_err(io("superblock adoption"))?;
        }
        if !present {
            return Ok(());
        }
        let boot = |e: journal::SuperblockError| GroupError::Boot {
            group,
            reason: e.to_string(),
        };
        // Once the table holds the record (an adoption cut short after
        // its write), only the files are left to remove.
        if self.superblocks.state(key).is_none() {
            let mut legacy = FileSuperblock::new(fs.clone(), dir);
            if let Some(state) = journal::SuperblockStore::read_latest(&mut legacy)
                .await
                .map_err(boot)?
            {
                self.superblocks.write(key, &state).await.map_err(boot)?;
            }
        }
        for path in &names {
            match fs.remove_file(path).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("superblock adoption")(e)),
            }
        }
        fs.sync_dir(dir).await.map_err(io("superblock adoption"))?;
        tracing::info!(group = group.0, dir = %dir.display(), "moved the group's superblock into the shard's table");
        Ok(())
    }

    pub(super) async fn open_group(
        &mut self,
        spec: GroupSpec,
        clean_stop: Option<journal::CleanStop>,
    ) -> Result<(), GroupError> {
        let group = spec.group;
        let dir = catalog::group_dir(&self.config.dir, group);
        let fs = self.env.fs().clone();
        let mut vsr = VsrConfig::new(self.config.replica, self.config.replica_count, group);
        vsr.timeouts = self.config.timeouts;
        vsr.retention_ops = self.config.retention_ops;
        vsr.seed = self.config.seed ^ group.0.rotate_left(17);
        let mut config = PartitionConfig::new(vsr);
        config.partition_id = spec.partition_id;
        config.created_revision = spec.incarnation;
        config.cluster = self.config.cluster;
        config.log.segment_size_bytes = spec.segment_size_bytes;
        config.messages_required_to_save = spec.messages_required_to_save;
        config.enforce_fsync = spec.enforce_fsync;
        config.rejoin = spec.rejoin;
        config.record_interval_us = self.config.record_interval_us;
        config.poll_reply_bytes_max = self.config.poll_reply_bytes_max;
        config.read_back_bytes_per_slice = self.config.read_back_bytes_per_slice;
        config.boot_tag = self.config.boot_tag;
        let bus = ShardBus {
            env: Rc::clone(&self.env),
            cluster: self.config.cluster,
            group,
            replies: Rc::clone(&self.replies),
            sent: Rc::clone(&self.sent),
        };
        let key = TableKey {
            group,
            incarnation: spec.incarnation,
        };
        self.adopt_legacy_superblock(key, &dir).await?;
        let store = TableSuperblock::new(
            Rc::clone(&self.superblocks),
            key,
            self.booted.contains(&group),
        );
        let mut partition =
            Partition::open_after_stop(config, fs.clone(), &dir, bus, store, clean_stop)
                .await
                .map_err(|e| GroupError::Boot {
                    group,
                    reason: e.to_string(),
                })?;
        partition.share_retained_budget(self.retained.clone());
        // From now on its journal holds every op above what it applied.
        let now_us = u64::try_from(self.env.now().as_micros()).unwrap_or(u64::MAX);
        partition.start_replay_window(now_us);
        let mut driver_config = TransferDriverConfig::new(self.config.cluster, group);
        driver_config.frame_size_max = self.config.frame_size_max;
        driver_config.install_file_ops_per_step = self.config.install_file_ops_per_step;
        let driver = TransferDriver::new(fs, &dir, driver_config, vsr.seed ^ 0x5EED);
        let seen_view = (partition.replica().view(), partition.replica().is_primary());
        self.groups.insert(
            group,
            Group {
                spec,
                partition,
                driver,
                session: Session::Closed,
                next_request: 1,
                queued: VecDeque::new(),
                in_flight: BTreeMap::new(),
                orphans: BTreeMap::new(),
                reads: VecDeque::new(),
                fenced_reported: false,
                seen_view,
                seen_census: 0,
                transfer_armed_at: None,
                counted_to: self.visits.settled_tick,
                due_at: self.tick + 1,
                handles_seen_op: None,
                retained_seen_op: None,
                purge_proposed: None,
            },
        );
        self.visits.schedule.insert((self.tick + 1, group));
        Ok(())
    }
}
