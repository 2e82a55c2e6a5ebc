//! Boot: [`Partition::open`] as a row of named steps, each in the order
//! its durable effects need (partition.rs's module documentation says why
//! the order is what it is), and [`restart_point`], the pure choice of
//! where the VSR core resumes.
//!
//! 1. [`ensure_dir`]: the directory, durable in its parent.
//! 2. The superblock, then the purge generation.
//! 3. [`recover_records`]: a purge-generation sibling swept, an install a
//!    crash interrupted converged or dropped, the transfer-needed record.
//! 4. [`open_log`]: the segments, set aside when damaged at rest on a
//!    group member.
//! 5. [`restore_client_table`]: the client table as of the applied point
//!    (a single replica: the newest its log reaches, batches past it cut).
//! 6. [`cut_past_applied_point`]: a group member keeps nothing past it.
//! 7. [`load_offsets`]: consumer offsets as of the applied point.
//! 8. [`restart_point`] and [`start_replica`]: the VSR core.

use std::cell::{Cell, RefCell};
use std::path::Path;

use common::{Offset, Op};
use consensus::vsr::{AppliedState, DurableState, LoggedJournal, Replica};
use journal::{
    CleanStop, LogMode, PrepareJournal, REPLICA_LOG_FILE, Replayed, ReplicaLog, Superblock,
    SuperblockStore, VsrState,
};
use storage::fs::Fs;
use storage::{LogConfig, RecoveryError, SegmentedLog};

use crate::bus::MessageBus;
use crate::client_sessions::{ClientTableSlots, RecordedTable};
use crate::error::BootError;
use crate::health::Health;
use crate::missing_history::MissingHistory;
use crate::offset_storage::read_purge_generation;
use crate::offsets::ConsumerOffsets;
use crate::partition::{AppliedPoint, AutoCommits, Partition, PartitionConfig};

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Boots the partition in `dir` (see the module documentation for the
    /// order and what is refused). A clean-stop record in `dir`
    /// ([`Self::record_clean_stop`]) is taken.
    pub async fn open(
        config: PartitionConfig,
        fs: F,
        dir: &Path,
        bus: B,
        store: S,
    ) -> Result<Self, BootError> {
        Self::open_after_stop(config, fs, dir, bus, store, None).await
    }

    /// As [`Self::open`], with the clean-stop record the caller took for
    /// this group (a shard keeps one file for all its groups:
    /// `journal::take_clean_stops`). Without one, a record in `dir` is
    /// taken as by [`Self::open`].
    pub async fn open_after_stop(
        config: PartitionConfig,
        fs: F,
        dir: &Path,
        bus: B,
        store: S,
        clean_stop: Option<CleanStop>,
    ) -> Result<Self, BootError> {
        ensure_dir(&fs, dir).await?;
        let (fresh, durable) = open_superblock(store, &config).await?;
        let sb = *durable.state();
        let generation = read_purge_generation(&fs, dir, config.created_revision)
            .await
            .map_err(|source| BootError::PurgeGenerationUnreadable {
                dir: dir.to_path_buf(),
                source,
            })?;
        let mut missing = recover_records(&fs, dir, &sb).await?;
        // A replica of a group that finds its own committed data damaged
        // repairs it from a peer (docs/consensus.md §5, "Damaged data");
        // a single replica has no peer and refuses to boot instead.
        let member = !fresh && config.vsr.replica_count > 1;
        let mut log = open_log(&fs, dir, &config, &sb, member, &mut missing).await?;
        let (client_slots, recorded_table) =
            restore_client_table(&fs, dir, &config, &sb, fresh, &mut log).await?;
        if !fresh && config.vsr.replica_count > 1 {
            cut_past_applied_point(dir, &config, &sb, &mut log).await?;
        }
        let next = log.next_offset();
        let offsets =
            load_offsets(&fs, dir, &config, &sb, fresh, member, next, &mut missing).await?;
        let rejoining = fresh && config.rejoin && config.vsr.replica_count > 1;
        if rejoining {
            tracing::warn!(dir = %dir.display(), group = %config.vsr.group, "partition rejoining with an empty directory: out of every quorum until caught up");
        }
        let table_op = recorded_table.as_ref().map(|t| t.op);
        let point = choose_restart_point(
            &fs,
            dir,
            &config,
            &sb,
            fresh,
            table_op,
            Offset(next),
            clean_stop,
        )
        .await?;
        let (replica_log, logged) = open_replica_log(&fs, dir, &config, &sb).await?;
        let (mut replica, journaled_point) =
            start_replica(&config, &sb, point, next, logged.as_ref());
        restore_sessions(&mut replica, recorded_table, dir, &config, &sb, fresh);
        let applied_next_offset = journaled_point.next_offset;
        let journal = PrepareJournal::new(config.journal, replica.commit_min() + 1);
        let (messages_count, size_bytes, last_timestamp) = log_totals(&log);
        let mut partition = Self {
            dir: dir.to_path_buf(),
            fs,
            bus,
            durable,
            replica,
            log,
            journal,
            offsets,
            applied_next_offset,
            applied_last_timestamp: last_timestamp,
            applied_purge_generation: generation,
            messages_count,
            size_bytes,
            recovered_durable_offset: next.checked_sub(1),
            installed_frontier: None,
            journaled_point,
            state_transfer_needed: None,
            missing_history: None,
            damage_found: Cell::new(false),
            scrub_cursor: crate::scrub::ScrubCursor::default(),
            scrub_index: crate::scrub::DerivedIndex::default(),
            scrub_index_rewrites: 0,
            now_us: 0,
            recorded_at_us: 0,
            replay_samples: Default::default(),
            ticking: false,
            retained: crate::retained::RetainedBodies::new(
                crate::retained::RetainedBudget::unbounded(),
            ),
            read_back_slices: 0,
            read_back_bodies: 0,
            client_slots,
            clients_dirty: false,
            reply_results: Vec::new(),
            pending_replies: Vec::new(),
            auto_commits: RefCell::new(AutoCommits {
                next_request: 1,
                ..AutoCommits::default()
            }),
            health: Health::default(),
            install: None,
            replica_log,
            held_frames: Vec::new(),
            config,
        };
        if let Some(record) = missing {
            partition.mark_history_missing(record);
        }
        // A restart may need its (view, log_view) persisted at once.
        if let Err(e) = partition.drive().await {
            tracing::warn!(error = %e, "partition boot could not persist its view");
        }
        tracing::info!(dir = %partition.dir.display(), log_next_offset = next, applied_next_offset, applied_op = partition.replica.commit_min().0, generation, view = partition.replica.view(), "partition booted");
        Ok(partition)
    }
}

/// Where the VSR core resumes, from what is on disk: the clean-stop
/// record (the caller's, else the directory's) when one may vouch for this
/// boot, then the pure [`restart_point`].
#[allow(clippy::too_many_arguments)]
async fn choose_restart_point<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    fresh: bool,
    table_op: Option<Op>,
    log_next_offset: Offset,
    clean_stop: Option<CleanStop>,
) -> Result<RestartPoint, BootError> {
    // A record in the directory is taken (removed) even when the
    // caller brought one: left behind, it could match a later crash's
    // superblock and vouch for acknowledgements made after this boot.
    // Absent, it costs one lookup.
    let stop = if takes_clean_stop(fresh, config.rejoin, config.vsr.replica_count, sb) {
        let in_dir = journal::take_clean_stop(fs, dir).await;
        clean_stop.or(in_dir)
    } else {
        None
    };
    let point = restart_point(&RestartFacts {
        fresh,
        rejoin: config.rejoin,
        replica_count: config.vsr.replica_count,
        superblock: *sb,
        table_op,
        log_next_offset,
        clean_stop: stop,
    })?;
    if point == RestartPoint::Resume {
        tracing::info!(dir = %dir.display(), view = sb.view, op = sb.checkpoint_op.0, "resuming after a clean stop");
    }
    Ok(point)
}

fn io_error(op: &'static str, dir: &Path) -> impl FnOnce(std::io::Error) -> BootError {
    let path = dir.to_path_buf();
    move |source| BootError::Recovery(RecoveryError::Io { op, path, source })
}

/// The directory, and its name in the parent, durable before the
/// superblock inside it can be. An error here (EIO, EACCES) is not "does
/// not exist": creating over it would hide a sick disk behind a fresh,
/// empty partition.
async fn ensure_dir<F: Fs>(fs: &F, dir: &Path) -> Result<(), BootError> {
    if fs.exists(dir).await.map_err(io_error("exists", dir))? {
        return Ok(());
    }
    let create = async {
        fs.create_dir_all(dir).await?;
        match dir.parent() {
            Some(parent) => fs.sync_dir(parent).await,
            None => Ok(()),
        }
    };
    create.await.map_err(io_error("create_dir", dir))
}

/// What a partition that never wrote a superblock record starts from.
fn initial_state(config: &PartitionConfig) -> VsrState {
    VsrState {
        cluster: config.cluster,
        replica_id: config.vsr.replica,
        replica_count: config.vsr.replica_count,
        view: 0,
        log_view: 0,
        commit_max: Op(0),
        checkpoint_op: Op(0),
        checkpoint_checksum: 0,
        offset_frontier: Offset(0),
    }
}

/// The records a crash can leave beside the data: a purge-generation
/// replacement sibling (swept; the record itself is whole either way), an
/// interrupted install (converged to an empty partition at the recorded
/// frontier, or dropped if that frontier never became durable:
/// install/marker.rs), and the transfer-needed record a converge
/// wrote (returned; honoured by the caller).
async fn recover_records<F: Fs>(
    fs: &F,
    dir: &Path,
    sb: &VsrState,
) -> Result<Option<MissingHistory>, BootError> {
    let sibling = dir.join(format!(
        "{}{}",
        crate::offset_storage::PURGE_GENERATION_FILE,
        crate::offset_storage::REPLACEMENT_SUFFIX
    ));
    if let Ok(true) = crate::offset_storage::delete_persisted_offset(fs, &sibling).await {
        tracing::warn!(path = %sibling.display(), "swept a purge-generation replacement left by a crash");
    }
    crate::install::recover_interrupted_install(
        fs,
        dir,
        (
            sb.checkpoint_op.0,
            sb.checkpoint_checksum,
            sb.offset_frontier.0,
        ),
    )
    .await
    .map_err(io_error("recover interrupted install", dir))?;
    crate::missing_history::read_missing_history(fs, dir, at_rest(sb))
        .await
        .map_err(io_error("read transfer-needed record", dir))
}

/// The transfer-needed record of damage found at rest: the superblock's
/// applied op and frontier.
fn at_rest(sb: &VsrState) -> MissingHistory {
    MissingHistory {
        commit_op: sb.checkpoint_op,
        frontier: sb.offset_frontier,
    }
}

/// Opens the segments. On a group `member`, segments that do not recover
/// into one log, or that end below the recorded frontier (which was synced
/// before it was recorded, so batches below it are gone), are set aside
/// after the transfer-needed record is written, and an empty log opens at
/// the frontier; a single replica refuses to boot instead.
async fn open_log<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    member: bool,
    missing: &mut Option<MissingHistory>,
) -> Result<SegmentedLog<F>, BootError> {
    let (mut log, report) = match SegmentedLog::open(
        fs.clone(),
        dir,
        config.log,
        sb.offset_frontier.0,
    )
    .await
    {
        Ok(opened) => opened,
        Err(error) if member && error.fences_partition() => {
            tracing::error!(dir = %dir.display(), group = %config.vsr.group, %error, "segments damaged at rest: setting them aside, repairing from a peer");
            let record = *missing.get_or_insert(at_rest(sb));
            set_aside_and_reopen(fs, dir, config.log, record).await?
        }
        Err(error) => return Err(BootError::Recovery(error)),
    };
    for cut in &report.truncated {
        tracing::warn!(path = %cut.path.display(), from = cut.from_bytes, to = cut.to_bytes, "recovery cut a torn segment tail");
    }
    if sb.offset_frontier.0 > log.next_offset() {
        if !member {
            return Err(BootError::FrontierAheadOfLog {
                frontier: sb.offset_frontier,
                log_next_offset: Offset(log.next_offset()),
            });
        }
        tracing::error!(dir = %dir.display(), group = %config.vsr.group, frontier = sb.offset_frontier.0, log_next_offset = log.next_offset(), "synced batches below the recorded frontier are gone: repairing from a peer");
        drop(log);
        let record = *missing.get_or_insert(at_rest(sb));
        (log, _) = set_aside_and_reopen(fs, dir, config.log, record).await?;
    }
    Ok(log)
}

/// Boot of a group member whose segments are damaged at rest: records its
/// history below `record.frontier` missing, sets the segment files aside
/// and opens the log again, now an empty segment at the frontier, which a
/// state transfer from a peer fills (`state_transfer::missing`).
async fn set_aside_and_reopen<F: Fs>(
    fs: &F,
    dir: &Path,
    config: LogConfig,
    record: MissingHistory,
) -> Result<(SegmentedLog<F>, storage::RecoveryReport), BootError> {
    set_aside_damaged_history(fs, dir, record, true)
        .await
        .map_err(io_error("set damaged segments aside", dir))?;
    SegmentedLog::open(fs.clone(), dir, config, record.frontier.0)
        .await
        .map_err(BootError::Recovery)
}

/// The client table as of the recorded applied point (a group applies the
/// ops past it again), or a single replica's newest one that the recovered
/// log reaches (it applies nothing again): client_sessions.rs.
///
/// A single replica writes its table before a step's batches, so batches
/// past the restored table's end belong to a step whose table did not
/// survive: none of their replies went out, and a retry writes them once
/// instead of twice. They are cut here, never below the durable frontier
/// nor below the first segment (a purge in progress).
async fn restore_client_table<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    fresh: bool,
    log: &mut SegmentedLog<F>,
) -> Result<(ClientTableSlots, Option<RecordedTable>), BootError> {
    if fresh {
        return Ok(Default::default());
    }
    let single = config.vsr.replica_count == 1;
    let (op, checksum) = (sb.checkpoint_op, sb.checkpoint_checksum);
    let log_end = log.next_offset();
    let (slots, table) = ClientTableSlots::load(fs, dir, config.vsr.clients_max, |t| {
        if single {
            t.next_offset <= Offset(log_end)
        } else {
            t.op == op && t.checksum == checksum
        }
    })
    .await
    .map_err(|(path, source)| BootError::ClientTableUnreadable { path, source })?;
    if let Some(table) = table.as_ref().filter(|t| {
        single
            && t.next_offset < Offset(log.next_offset())
            && t.next_offset >= sb.offset_frontier
            && log
                .segments()
                .next()
                .is_some_and(|first| first.start_offset <= t.next_offset.0)
    }) {
        let end = log.next_offset();
        log.truncate_to_offset(table.next_offset.0)
            .await
            .map_err(|source| BootError::TruncateToAppliedPoint {
                dir: dir.to_path_buf(),
                frontier: table.next_offset,
                source,
            })?;
        tracing::warn!(dir = %dir.display(), from = table.next_offset.0, to = end, "dropped batches past the recorded client table; their requests were not acknowledged");
    }
    Ok((slots, table))
}

/// A replica of a group keeps nothing past its recorded applied point:
/// batches a flush synced before the process died short of the superblock
/// record are committed, but only the group knows which ops they belong
/// to. After an ordinary restart repair writes the same batches again;
/// after a whole-group restart the census may give those op numbers (and
/// offsets) to new batches, and the old bytes would then disagree with the
/// group (docs/consensus.md §4). Cut, synced, before anything is sent;
/// not while a purge is in progress (the first segment starts past the
/// frontier).
async fn cut_past_applied_point<F: Fs>(
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    log: &mut SegmentedLog<F>,
) -> Result<(), BootError> {
    if log
        .segments()
        .next()
        .is_none_or(|first| first.start_offset > sb.offset_frontier.0)
    {
        return Ok(());
    }
    let end = log.next_offset();
    let cut = log
        .truncate_to_offset(sb.offset_frontier.0)
        .await
        .map_err(|source| BootError::TruncateToAppliedPoint {
            dir: dir.to_path_buf(),
            frontier: sb.offset_frontier,
            source,
        })?;
    if cut {
        tracing::info!(dir = %dir.display(), group = %config.vsr.group, from = sb.offset_frontier.0, to = end, "dropped batches past the recorded applied point; the group repairs them");
    }
    Ok(())
}

/// The consumer offsets, clamped to the log's end, and as of the recorded
/// applied point for a replica of a group (it resumes from there:
/// offsets.rs). Damaged records on a group member are first recorded as
/// missing history (removed first, they would be gone for good here while
/// a peer still holds them), then removed; a single replica removes them
/// with a warning.
#[allow(clippy::too_many_arguments)]
async fn load_offsets<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    fresh: bool,
    member: bool,
    next: u64,
    missing: &mut Option<MissingHistory>,
) -> Result<ConsumerOffsets, BootError> {
    let mut offsets = ConsumerOffsets::new(dir);
    let unreadable = |source| BootError::OffsetsUnreadable {
        dir: dir.to_path_buf(),
        source,
    };
    let recorded_point = (!fresh && config.vsr.replica_count > 1).then_some(sb.checkpoint_op);
    let loaded = offsets
        .load(fs, next.checked_sub(1).map(Offset), recorded_point)
        .await
        .map_err(unreadable)?;
    if !loaded.corrupt.is_empty() {
        if member && missing.is_none() {
            tracing::error!(dir = %dir.display(), group = %config.vsr.group, records = ?loaded.corrupt, "consumer-offset records damaged at rest: repairing from a peer");
            set_aside_damaged_history(fs, dir, at_rest(sb), false)
                .await
                .map_err(unreadable)?;
            *missing = Some(at_rest(sb));
        }
        ConsumerOffsets::remove_corrupt(fs, &loaded.corrupt)
            .await
            .map_err(unreadable)?;
    }
    Ok(offsets)
}

/// What [`restart_point`] decides from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RestartFacts {
    /// No superblock record existed before this boot.
    pub fresh: bool,
    /// The replica was started as rejoining after a lost disk.
    pub rejoin: bool,
    pub replica_count: u8,
    pub superblock: VsrState,
    /// The op of the client table restored, if any.
    pub table_op: Option<Op>,
    /// The recovered log's end.
    pub log_next_offset: Offset,
    /// The clean-stop record taken for this boot, if any.
    pub clean_stop: Option<CleanStop>,
}

/// Where the VSR core resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartPoint {
    /// A new group: view 0, empty log, normal.
    New,
    /// A single replica: nobody to disagree with, so it resumes at once,
    /// its op numbers continuing past this op.
    Single {
        /// The commit bound, the recorded applied point or the restored
        /// client table's op, whichever is the largest.
        op: u64,
    },
    /// A group member that stopped cleanly with nothing acknowledged past
    /// its recorded applied point: a full member of its view at once.
    Resume,
    /// A group member on a replaced disk that has adopted no view yet: the
    /// peers, not the superblock, bound its view.
    Rejoin,
    /// A group member after a crash: quorum-invisible until repair brings
    /// it to the head (docs/consensus.md §4).
    Restart,
}

/// Whether boot takes a clean-stop record: exactly when [`restart_point`]
/// weighs one, for a replica of a group resuming from a recorded applied
/// point (a new partition has none, a single replica needs none, and a
/// frontier that names no op is refused).
fn takes_clean_stop(fresh: bool, rejoin: bool, replica_count: u8, sb: &VsrState) -> bool {
    let rejoining = fresh && rejoin && replica_count > 1;
    (!fresh || rejoining)
        && replica_count > 1
        && !(sb.checkpoint_op == Op::ZERO && sb.offset_frontier != Offset::ZERO)
}

/// Where the VSR core resumes, from what boot found. Pure, so every case
/// is a row in a table test.
///
/// # Errors
/// [`BootError::RestartNeedsStateTransfer`] for a group member whose
/// frontier names no op (written before the applied point was recorded):
/// nothing says where to resume.
pub(crate) fn restart_point(facts: &RestartFacts) -> Result<RestartPoint, BootError> {
    let sb = &facts.superblock;
    let rejoining = facts.fresh && facts.rejoin && facts.replica_count > 1;
    if facts.fresh && !rejoining {
        return Ok(RestartPoint::New);
    }
    if facts.replica_count == 1 {
        // Every batch a reply acknowledged was written before the reply
        // (flush.rs), so a killed process loses none; a power loss can take
        // what was not synced (only without enforce_fsync). Op numbers
        // continue past the commit bound, the recorded applied point and
        // the client table, any of which may be the largest.
        let op = sb
            .commit_max
            .max(sb.checkpoint_op)
            .max(facts.table_op.unwrap_or(Op::ZERO))
            .0;
        return Ok(RestartPoint::Single { op });
    }
    if sb.checkpoint_op == Op::ZERO && sb.offset_frontier != Offset::ZERO {
        return Err(BootError::RestartNeedsStateTransfer {
            commit: sb.commit_max,
            log_next_offset: facts.log_next_offset,
        });
    }
    let clean = facts.clean_stop.is_some_and(|stop| {
        stop.view == sb.view
            && stop.log_view == sb.log_view
            && stop.op == sb.checkpoint_op
            && stop.checksum == sb.checkpoint_checksum
            && sb.commit_max <= stop.op
    });
    Ok(if clean {
        RestartPoint::Resume
    } else if facts.rejoin && sb.view == 0 && sb.log_view == 0 {
        // Created on a replaced disk and no view adopted yet (this boot's
        // or an earlier one's).
        RestartPoint::Rejoin
    } else {
        RestartPoint::Restart
    })
}

/// The VSR core at `point`, and where applying resumes: the op, its
/// identity and the next offset after it. A group member's segments may
/// hold batches of later ops (a flush synced them and the process died
/// before the superblock write); re-applying those finds them on disk.
fn start_replica(
    config: &PartitionConfig,
    sb: &VsrState,
    point: RestartPoint,
    log_next_offset: u64,
    logged: Option<&LoggedJournal>,
) -> (Replica, AppliedPoint) {
    let durable = DurableState {
        view: sb.view,
        log_view: sb.log_view,
        commit: sb.commit_max,
    };
    let recorded = AppliedPoint {
        op: sb.checkpoint_op.0,
        checksum: sb.checkpoint_checksum,
        next_offset: sb.offset_frontier.0,
    };
    let applied = AppliedState {
        commit_min: sb.checkpoint_op,
        checksum: sb.checkpoint_checksum,
    };
    match point {
        RestartPoint::New => (
            Replica::new(config.vsr),
            AppliedPoint {
                next_offset: log_next_offset,
                ..AppliedPoint::default()
            },
        ),
        RestartPoint::Single { op } => (
            Replica::restart(
                config.vsr,
                durable,
                AppliedState {
                    commit_min: Op(op),
                    checksum: 0,
                },
            ),
            AppliedPoint {
                op,
                checksum: 0,
                next_offset: log_next_offset,
            },
        ),
        RestartPoint::Resume => (Replica::resume(config.vsr, durable, applied), recorded),
        RestartPoint::Rejoin => (
            Replica::restart_rejoining(config.vsr, durable, applied),
            recorded,
        ),
        RestartPoint::Restart => match logged {
            Some(logged) => {
                let replica = Replica::resume_with_log(config.vsr, durable, applied, logged);
                tracing::info!(group = %config.vsr.group, applied_op = applied.commit_min.0, logged_ops = logged.ops.len(), view = replica.view(), visible = replica.is_quorum_visible(), "partition resumed from its replica log");
                (replica, recorded)
            }
            None => (Replica::restart(config.vsr, durable, applied), recorded),
        },
    }
}

/// The replica log of a group member (docs/consensus.md §4, "Resume from
/// a durable journal"), and the journal it vouches for above the recorded
/// applied point, if any: synced for a `persisted` group, kept in the page
/// cache for a `replicated` one when the machine boot is known. A single
/// replica keeps none.
async fn open_replica_log<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
) -> Result<(Option<ReplicaLog<F>>, Option<LoggedJournal>), BootError> {
    let mode = if config.enforce_fsync {
        LogMode::SYNCED
    } else {
        LogMode::kept(config.boot_tag)
    };
    if config.vsr.replica_count == 1 || (!mode.sync && mode.boot_tag == 0) {
        return Ok((None, None));
    }
    let path = dir.join(REPLICA_LOG_FILE);
    let (log, replayed) = ReplicaLog::open(fs, &path, sb.checkpoint_op.0, mode)
        .await
        .map_err(BootError::ReplicaLog)?;
    let logged = match replayed {
        Replayed::Journal(logged) => Some(logged),
        Replayed::Empty | Replayed::Stale { .. } => None,
        Replayed::Damaged { offset, reason } => {
            tracing::warn!(dir = %dir.display(), group = %config.vsr.group, offset, %reason, "replica log damaged: restarting without the journal");
            None
        }
    };
    Ok((Some(log), logged))
}

/// Hands the restored client table to the core, or says why dedup starts
/// empty.
fn restore_sessions(
    replica: &mut Replica,
    table: Option<RecordedTable>,
    dir: &Path,
    config: &PartitionConfig,
    sb: &VsrState,
    fresh: bool,
) {
    match table {
        Some(table) => {
            let (op, sessions) = (table.op, table.sessions.len());
            if let Err(error) = replica.client_table_mut().restore(table.sessions) {
                tracing::warn!(dir = %dir.display(), group = %config.vsr.group, op = op.0, %error, "recorded client table refused; dedup starts empty");
            } else {
                tracing::debug!(dir = %dir.display(), group = %config.vsr.group, op = op.0, sessions, "client table restored");
            }
        }
        None if !fresh => {
            tracing::warn!(dir = %dir.display(), group = %config.vsr.group, op = sb.checkpoint_op.0, "no client table recorded at the applied point; dedup starts empty")
        }
        None => {}
    }
}

/// Reads the superblock, noting whether none was ever written (a fresh
/// replica), and refuses ops past the core's range.
async fn open_superblock<S: SuperblockStore>(
    mut store: S,
    config: &PartitionConfig,
) -> Result<(bool, Superblock<S>), BootError> {
    let fresh = store
        .read_latest()
        .await
        .map_err(BootError::Superblock)?
        .is_none();
    let durable = Superblock::open(store, initial_state(config))
        .await
        .map_err(BootError::Superblock)?;
    let sb = *durable.state();
    // Disk-supplied: the core computes the op after each.
    if let Some(op) = [sb.commit_max.0, sb.checkpoint_op.0]
        .into_iter()
        .find(|op| *op > consensus::vsr::OP_MAX)
    {
        return Err(BootError::SuperblockOpOutOfRange {
            op: Op(op),
            max: Op(consensus::vsr::OP_MAX),
        });
    }
    Ok((fresh, durable))
}

/// Messages, bytes and the newest timestamp across the recovered log.
fn log_totals(log: &SegmentedLog<impl Fs>) -> (u64, u64, u64) {
    log.segments().fold((0u64, 0u64, 0u64), |(m, b, t), s| {
        (
            m + (s.next_offset - s.start_offset),
            b + s.size_bytes,
            t.max(s.end_timestamp),
        )
    })
}

/// A group member found its own committed data damaged at boot (segments
/// that do not recover into one contiguous log, synced batches below the
/// recorded frontier gone, a consumer-offset record that does not
/// verify). Records that its history below `record.frontier` is missing —
/// first, so that a crash at any later step still boots lagging — and,
/// with `set_aside_segments`, moves its segment files aside
/// (`<dir>.fenced.<n>`, evidence for an operator that nothing reads again),
/// so the open that follows plants an empty segment at the frontier. A
/// state transfer from a peer then brings the group's state back, as for
/// damage found at runtime (`Partition::repair_damage`).
///
/// # Errors
/// The filesystem's error. If the record was written, the next boot takes
/// this path again.
async fn set_aside_damaged_history<F: Fs>(
    fs: &F,
    dir: &Path,
    record: MissingHistory,
    set_aside_segments: bool,
) -> std::io::Result<()> {
    crate::missing_history::write_missing_history(fs, dir, record).await?;
    if set_aside_segments {
        crate::install::fence_partition(fs, dir).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::ReplicaId;

    fn sb(view: u32, log_view: u32, commit_max: u64, op: u64, frontier: u64) -> VsrState {
        VsrState {
            cluster: 1,
            replica_id: ReplicaId(1),
            replica_count: 3,
            view,
            log_view,
            commit_max: Op(commit_max),
            checkpoint_op: Op(op),
            checkpoint_checksum: 0xC0FFEE,
            offset_frontier: Offset(frontier),
        }
    }

    fn facts(superblock: VsrState) -> RestartFacts {
        RestartFacts {
            fresh: false,
            rejoin: false,
            replica_count: 3,
            superblock,
            table_op: None,
            log_next_offset: Offset(100),
            clean_stop: None,
        }
    }

    fn stop(view: u32, log_view: u32, op: u64, checksum: u128) -> CleanStop {
        CleanStop {
            view,
            log_view,
            op: Op(op),
            checksum,
        }
    }

    #[test]
    fn given_each_kind_of_boot_should_pick_its_restart_point() {
        let after_crash = sb(4, 4, 12, 10, 80);
        let cases: Vec<(&str, RestartFacts, RestartPoint)> = vec![
            (
                "new group",
                RestartFacts {
                    fresh: true,
                    ..facts(VsrState::default())
                },
                RestartPoint::New,
            ),
            (
                "new single replica",
                RestartFacts {
                    fresh: true,
                    replica_count: 1,
                    ..facts(VsrState::default())
                },
                RestartPoint::New,
            ),
            (
                "new single replica told to rejoin: nobody to rejoin",
                RestartFacts {
                    fresh: true,
                    rejoin: true,
                    replica_count: 1,
                    ..facts(VsrState::default())
                },
                RestartPoint::New,
            ),
            (
                "replaced disk",
                RestartFacts {
                    fresh: true,
                    rejoin: true,
                    ..facts(VsrState::default())
                },
                RestartPoint::Rejoin,
            ),
            (
                "replaced disk, rebooted before adopting a view",
                RestartFacts {
                    rejoin: true,
                    ..facts(sb(0, 0, 0, 0, 0))
                },
                RestartPoint::Rejoin,
            ),
            (
                "replaced disk, a view adopted since",
                RestartFacts {
                    rejoin: true,
                    ..facts(sb(2, 2, 0, 0, 0))
                },
                RestartPoint::Restart,
            ),
            ("crash", facts(after_crash), RestartPoint::Restart),
            (
                "clean stop",
                RestartFacts {
                    clean_stop: Some(stop(4, 4, 10, 0xC0FFEE)),
                    ..facts(sb(4, 4, 10, 10, 80))
                },
                RestartPoint::Resume,
            ),
            (
                "clean stop of another identity",
                RestartFacts {
                    clean_stop: Some(stop(4, 4, 10, 0xBAD)),
                    ..facts(sb(4, 4, 10, 10, 80))
                },
                RestartPoint::Restart,
            ),
            (
                "clean stop of an older view",
                RestartFacts {
                    clean_stop: Some(stop(3, 3, 10, 0xC0FFEE)),
                    ..facts(sb(4, 4, 10, 10, 80))
                },
                RestartPoint::Restart,
            ),
            (
                "clean stop below the commit bound",
                RestartFacts {
                    clean_stop: Some(stop(4, 4, 10, 0xC0FFEE)),
                    ..facts(after_crash)
                },
                RestartPoint::Restart,
            ),
            (
                "single replica: the commit bound is the largest",
                RestartFacts {
                    replica_count: 1,
                    table_op: Some(Op(11)),
                    ..facts(after_crash)
                },
                RestartPoint::Single { op: 12 },
            ),
            (
                "single replica: the client table is the largest",
                RestartFacts {
                    replica_count: 1,
                    table_op: Some(Op(15)),
                    ..facts(after_crash)
                },
                RestartPoint::Single { op: 15 },
            ),
            (
                "single replica: the applied point is the largest",
                RestartFacts {
                    replica_count: 1,
                    ..facts(sb(4, 4, 3, 10, 80))
                },
                RestartPoint::Single { op: 10 },
            ),
        ];
        for (name, facts, want) in cases {
            match restart_point(&facts) {
                Ok(got) => assert_eq!(got, want, "{name}"),
                Err(error) => panic!("{name}: {error}"),
            }
            // Boot takes the record exactly when the choice weighs it.
            let weighs = matches!(
                want,
                RestartPoint::Resume | RestartPoint::Rejoin | RestartPoint::Restart
            );
            let takes = takes_clean_stop(
                facts.fresh,
                facts.rejoin,
                facts.replica_count,
                &facts.superblock,
            );
            assert_eq!(takes, weighs, "{name}");
        }
    }

    #[test]
    fn given_a_frontier_that_names_no_op_should_ask_for_a_state_transfer() {
        let got = restart_point(&facts(sb(1, 1, 5, 0, 40)));
        assert!(
            matches!(
                got,
                Err(BootError::RestartNeedsStateTransfer {
                    commit: Op(5),
                    log_next_offset: Offset(100)
                })
            ),
            "{got:?}"
        );
        assert!(!takes_clean_stop(false, false, 3, &sb(1, 1, 5, 0, 40)));
        // A single replica does not need the applied point.
        let single = RestartFacts {
            replica_count: 1,
            ..facts(sb(1, 1, 5, 0, 40))
        };
        assert_eq!(
            restart_point(&single).ok(),
            Some(RestartPoint::Single { op: 5 })
        );
    }
}
