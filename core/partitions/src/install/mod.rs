//! The receiving replica's install of a transferred partition state
//! (SPEC §7 ST-I1..I5). By file: `check` (the check phase), `errors` (its
//! outcome and failures), `marker` (the install marker and boot's
//! recovery of an interrupted install), `fence` (the converge and the
//! fence), and here the install's steps.
//!
//! The input is what the receive side left behind: validated segment
//! artifacts staged as `{base:020}.log.staging` + `{base:020}.index.staging`
//! in the partition directory (written, data-synced, directory synced) and
//! the encoded consumer-offsets artifact. [`Partition::install_partition_state`]
//! turns them into the live partition in two phases:
//! [`Partition::begin_install`] checks and records the frontier, then
//! [`Partition::advance_install`] carries out the rest a bounded number of
//! filesystem calls at a time (the transfer driver calls it once per tick,
//! so a chain of thousands of segments never holds the shard's other
//! groups for more than a step). Between steps the partition refuses every
//! input ([`Partition::installing`]).
//!
//! **Check phase** (changes nothing; every refusal leaves the directory and
//! the live state as they were): fenced, stale op, offsets artifact decode,
//! purge generation not behind, offset space not rewound, staged chain
//! without duplicates or holes ending exactly at the offer's frontier, the
//! staged files present, the dedup slice accepted by a scratch client table.
//! Then the offset writes are planned (clamped to the installed end) and
//! each is staged as a data-synced `{id}.replacing` sibling, which nothing
//! trusts until renamed.
//!
//! **Mutate phase**, each durable step with the crash it defends against:
//!
//! 1. **Install marker, then the superblock** (frontier first, ST-I2). The
//!    marker file [`INSTALL_MARKER_FILE`] (op, identity, frontier) is made
//!    durable, then one superblock record carries the applied point
//!    `(commit_op, identity)` together with the incoming frontier
//!    (`reset_applied`). Both precede the first unlink: once old segments go,
//!    nothing else on disk names the frontier, and a reboot minting from a
//!    lower counter would stamp batches no peer shares. The marker is what
//!    lets boot tell an interrupted install (superblock frontier above the
//!    segments, legitimately) from synced data gone missing (refused as
//!    `FrontierAheadOfLog`): boot compares it with the superblock; equal
//!    means the install got past step 1 and boot converges the directory to
//!    an empty segment at the frontier with no offset files (see
//!    [`recover_interrupted_install`]); different means the superblock write
//!    never landed and the old state stands. A failure here refuses with
//!    `FrontierNotDurable` after discarding the siblings, and keeps the
//!    marker: a fault on the superblock's second copy leaves the first
//!    holding the new frontier, which only the marker explains at boot.
//! 2. **Swap** (ST-I3): stray staging files swept; old chain unlinked
//!    oldest first; directory synced (so no old `.log` can reappear beside
//!    the new chain); every staged index renamed; directory synced (a `.log`
//!    is never visible without its index); every staged log renamed;
//!    directory synced. One sync per phase, not per rename: until the
//!    marker goes, boot converges whatever subset of these a crash kept, so
//!    no intermediate directory is trusted. Then each segment is recovered
//!    from the directory as boot reads it and checked against the staged
//!    description, and the log is assembled from them (writers opened on
//!    first use). An empty offer plants an empty segment at the frontier
//!    (synced into the directory), which recovery reads as a frontier
//!    marker.
//! 3. **State** (ST-I4): journal cleared; every offset file not in the plan
//!    unlinked (strays included), siblings renamed in, each changed offsets
//!    directory synced once, then the maps replaced in place; dedup slice,
//!    counters from the artifact's frontier, purge generation recorded when
//!    it advanced, commit floor, sequencer, pipeline, commit max, end of the
//!    transfer. **The marker is removed last**: until then a reboot converges
//!    rather than trust a chain whose offsets may be half renamed.
//!
//! **Converge** (ST-I5): any mutate-phase failure converges disk and memory
//! to the empty, honestly lagging shape boot would produce from the marker:
//! every segment and staging file unlinked, directory synced, an empty
//! segment planted at the frontier, every offset file removed, dedup
//! cleared, the applied point the superblock already holds; the core stays
//! in its transfer so the driver pulls the missing history again, and the
//! durable transfer-needed record ([`crate::missing_history`]) keeps it lagging
//! across reboots until an install removes it (before the marker). If that
//! fails too the install returns `ConvergeFailed`, the partition is fenced in
//! memory (refuses all input) and the caller quarantines its files with
//! [`fence_partition`].
//!
//! Dropping the serving side's memo and offer cache is the caller's job:
//! it calls `OfferServer::reset()` after this returns, success or not (the
//! partition does not own the server). The segment read cache lives in the
//! `SegmentedLog`, which is replaced wholesale here.

use common::{ConsumerKind, Offset, Op};
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::task::Poll;
use std::time::Duration;

use journal::SuperblockStore;
use storage::SegmentedLog;
use storage::fs::{FileKind, Fs, replace_file_durably};
use storage::{RecoveredSegment, recover_segment};
use storage::{SegmentFileName, index_file_name, log_file_name, parse_file_name};

use crate::bus::MessageBus;
use crate::missing_history::{MissingHistory, clear_missing_history, write_missing_history};
use crate::offset_storage::{
    PURGE_GENERATION_FILE, PurgeGeneration, REPLACEMENT_SUFFIX, commit_offset_replacement,
    delete_persisted_offset, persist_purge_generation,
};
use crate::partition::{AppliedPoint, Partition};

mod check;
mod errors;
mod fence;
mod marker;

use check::CheckedInstall;
pub use errors::{PartitionInstallError, PartitionInstallOutcome};
pub use fence::fence_partition;
pub use marker::INSTALL_MARKER_FILE;
use marker::InstallMarker;
pub(crate) use marker::recover_interrupted_install;

const STAGING_SUFFIX: &str = ".staging";
/// Attempts per offset-file mutation (staging a sibling, unlinking).
const OFFSET_IO_ATTEMPTS: u32 = 3;
/// First retry delay; each further retry doubles it.
const OFFSET_IO_BACKOFF: Duration = Duration::from_millis(10);

/// One staged segment, as the receive side describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedSegment {
    /// Base offset (the file names' offset).
    pub start_offset: Offset,
    /// Offset of the last message.
    pub end_offset: Offset,
    /// Length of the staged log.
    pub size_bytes: u64,
    /// Base timestamp of the first batch.
    pub start_timestamp: u64,
    /// Base timestamp of the last batch.
    pub end_timestamp: u64,
    /// Largest base timestamp.
    pub max_timestamp: u64,
}

impl StagedSegment {
    /// `{base:020}.log.staging` and `{base:020}.index.staging` in `dir`.
    pub fn staging_paths(&self, dir: &Path) -> (PathBuf, PathBuf) {
        (
            dir.join(format!(
                "{}{STAGING_SUFFIX}",
                log_file_name(self.start_offset.0)
            )),
            dir.join(format!(
                "{}{STAGING_SUFFIX}",
                index_file_name(self.start_offset.0)
            )),
        )
    }
}

/// Everything an install needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallInput {
    /// The op the transferred state represents.
    pub commit_op: Op,
    /// Identity (checksum) of op `commit_op`: the hash chain continues
    /// from it.
    pub commit_checksum: u128,
    /// The staged segments, in any order.
    pub staged: Vec<StagedSegment>,
    /// The encoded consumer-offsets artifact (ICO2; ICO1 decodes).
    pub offsets_artifact: Vec<u8>,
}

/// Filesystem calls an install makes per call of
/// [`Partition::advance_install`] from the transfer driver, roughly: an
/// unlink, a rename or a directory sync counts one, a segment's recovery
/// [`SEGMENT_LOAD_COST`]. A few milliseconds of disk work, so the shard's
/// other groups keep their ticks while a long chain is swapped in.
pub const INSTALL_FILE_OPS_PER_STEP: usize = 64;

/// What one installed segment's recovery counts against a step's budget:
/// its filesystem calls (index checked for, both files opened and sized,
/// the index read, the last batches read).
const SEGMENT_LOAD_COST: usize = 7;

/// An install past its check phase and its frontier record (ST-I1, ST-I2),
/// swapped in over several calls. Every state between two calls is one a
/// crash may leave: the marker matches the superblock, so boot converges
/// it ([`recover_interrupted_install`]).
pub(crate) struct InstallJob<F: Fs> {
    checked: CheckedInstall,
    step: SwapStep<F>,
}

impl<F: Fs> fmt::Debug for InstallJob<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstallJob")
            .field("commit_op", &self.checked.commit_op)
            .field("frontier", &self.checked.frontier)
            .field("segments", &self.checked.staged.len())
            .field("step", &self.step)
            .finish()
    }
}

/// Where the swap (ST-I3) stands. Each phase ends in one directory sync.
enum SwapStep<F: Fs> {
    /// Stray staging files (best effort), then the old chain oldest first
    /// (each must go): `files[next..]` are left.
    Unlink {
        strays: Vec<PathBuf>,
        files: Vec<PathBuf>,
        next: usize,
    },
    /// Staged indexes from `staged[next]` on are left to rename.
    RenameIndexes { next: usize },
    /// Staged logs from `staged[next]` on are left to rename.
    RenameLogs { next: usize },
    /// The installed segments recovered so far, as boot would read them.
    Load {
        segments: Vec<RecoveredSegment>,
        index_written: bool,
    },
    /// The installed log, for the state phase (ST-I4), which runs in a
    /// call of its own: it syncs several files.
    Loaded(SegmentedLog<F>),
}

impl<F: Fs> fmt::Debug for SwapStep<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlink {
                strays,
                files,
                next,
            } => write!(
                f,
                "Unlink {{ strays: {}, {next} of {} }}",
                strays.len(),
                files.len()
            ),
            Self::RenameIndexes { next } => write!(f, "RenameIndexes {{ next: {next} }}"),
            Self::RenameLogs { next } => write!(f, "RenameLogs {{ next: {next} }}"),
            Self::Load { segments, .. } => write!(f, "Load {{ loaded: {} }}", segments.len()),
            Self::Loaded(log) => write!(f, "Loaded {{ next_offset: {} }}", log.next_offset()),
        }
    }
}

/// Retries `op` up to [`OFFSET_IO_ATTEMPTS`] times, sleeping with a
/// doubling backoff between attempts.
async fn with_retry<F: Fs, T, Fut: Future<Output = io::Result<T>>>(
    fs: &F,
    what: &Path,
    mut op: impl FnMut() -> Fut,
) -> io::Result<T> {
    let mut delay = OFFSET_IO_BACKOFF;
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(error) if attempt < OFFSET_IO_ATTEMPTS => {
                tracing::debug!(path = %what.display(), attempt, %error, "offset file mutation failed, retrying");
                fs.sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

fn swap_io(path: &Path) -> impl FnOnce(io::Error) -> PartitionInstallError + '_ {
    move |source| PartitionInstallError::SwapIo {
        path: path.to_path_buf(),
        source,
    }
}

/// The segment files (`.log`, `.index`) and staging files in `dir`, oldest
/// segment first (a segment's log before its index; staging last).
async fn segment_files<F: Fs>(fs: &F, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs.read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files: Vec<(u64, u8, PathBuf)> = entries
        .into_iter()
        .filter(|e| e.kind == FileKind::File)
        .filter_map(|e| {
            let (start, order) = match parse_file_name(e.name_str()?) {
                SegmentFileName::Log(start) => (start, 0),
                SegmentFileName::Index(start) => (start, 1),
                SegmentFileName::Staging => (u64::MAX, 2),
                SegmentFileName::Other => return None,
            };
            Some((start, order, dir.join(&e.name)))
        })
        .collect();
    files.sort();
    Ok(files.into_iter().map(|(_, _, path)| path).collect())
}

/// An installed segment as recovery read it must be the staged one the
/// receive side verified: the same offsets and the same length. Anything
/// else means the files changed under the install.
fn check_installed_segment(
    dir: &Path,
    staged: &StagedSegment,
    recovered: &RecoveredSegment,
) -> Result<(), PartitionInstallError> {
    let meta = &recovered.meta;
    let expected_next = staged.end_offset.checked_add(1);
    if meta.start_offset == staged.start_offset.0
        && Some(meta.next_offset) == expected_next.map(|v| v.0)
        && meta.size_bytes == staged.size_bytes
    {
        return Ok(());
    }
    Err(PartitionInstallError::SegmentOpen {
        path: dir.join(log_file_name(staged.start_offset.0)),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "installed segment holds offsets {}..{} in {} bytes, but the staged one held {}..={} in {} bytes",
                meta.start_offset,
                meta.next_offset,
                meta.size_bytes,
                staged.start_offset,
                staged.end_offset,
                staged.size_bytes
            ),
        ),
    })
}

async fn remove_if_present<F: Fs>(fs: &F, path: &Path) -> io::Result<()> {
    match fs.remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Installs a transferred partition state in one call (see the module
    /// documentation for the phases and their durable order):
    /// [`Self::begin_install`], then [`Self::advance_install`] until it
    /// ends. The transfer driver calls the two itself, a step per tick.
    ///
    /// # Errors
    /// As [`Self::begin_install`] and [`Self::advance_install`].
    pub async fn install_partition_state(
        &mut self,
        input: InstallInput,
    ) -> Result<PartitionInstallOutcome, PartitionInstallError> {
        self.begin_install(input).await?;
        loop {
            if let Poll::Ready(result) = self.advance_install(INSTALL_FILE_OPS_PER_STEP).await {
                return result;
            }
        }
    }

    /// Checks an install and records its frontier (ST-I1, ST-I2); the swap
    /// and the state (ST-I3, ST-I4) follow in [`Self::advance_install`].
    /// From a successful return until the install ends the partition
    /// refuses every input ([`Self::installing`]).
    ///
    /// # Errors
    /// Check-phase refusals ([`PartitionInstallError::StaleTransfer`],
    /// `Offsets`, `PurgeGenerationBehind`, `OfferRewindsDurableData`,
    /// `DuplicateSegment`, `SegmentSetHole`, `Dedup`, `Fenced`,
    /// `AlreadyInstalling`, a missing staged file as `SwapIo`) and
    /// `OffsetPersistence` while staging siblings change nothing.
    /// `FrontierNotDurable` changes nothing either (siblings discarded).
    pub async fn begin_install(
        &mut self,
        input: InstallInput,
    ) -> Result<(), PartitionInstallError> {
        if self.install.is_some() {
            return Err(PartitionInstallError::AlreadyInstalling);
        }
        let checked = self.check_install(input).await?;
        self.stage_offset_writes(&checked.planned).await?;
        if let Err(source) = self.record_install_frontier(&checked).await {
            tracing::warn!(dir = %self.dir.display(), frontier = checked.frontier, %source, "install refused: the incoming frontier is not durable");
            self.discard_offset_writes(&checked.planned).await;
            return Err(PartitionInstallError::FrontierNotDurable {
                frontier: Offset(checked.frontier),
            });
        }
        // Staging files of an abandoned attempt, then the old chain.
        let keep: HashSet<PathBuf> = checked
            .staged
            .iter()
            .flat_map(|s| {
                let (log, index) = s.staging_paths(&self.dir);
                [log, index]
            })
            .collect();
        let (staging, files): (Vec<PathBuf>, Vec<PathBuf>) = checked
            .existing
            .iter()
            .cloned()
            .partition(|p| p.to_str().is_some_and(|s| s.ends_with(STAGING_SUFFIX)));
        let strays = staging.into_iter().filter(|p| !keep.contains(p)).collect();
        tracing::info!(dir = %self.dir.display(), commit_op = checked.commit_op, frontier = checked.frontier, segments = checked.staged.len(), replacing = files.len(), "install started");
        self.install = Some(Box::new(InstallJob {
            checked,
            step: SwapStep::Unlink {
                strays,
                files,
                next: 0,
            },
        }));
        Ok(())
    }

    /// Carries the install in flight on by at most `budget` file operations
    /// (at least one step's worth of progress). `Pending` while there is
    /// more; `Ready` once it ended, installed or converged.
    ///
    /// # Errors
    /// `NotInstalling` without an install in flight. Failures of the swap
    /// (`SwapIo`, `SegmentOpen`, `OffsetPersistence`) return after the
    /// partition converged to an empty one at the offer's frontier;
    /// `ConvergeFailed` leaves it fenced and the caller runs
    /// [`fence_partition`].
    pub async fn advance_install(
        &mut self,
        budget: usize,
    ) -> Poll<Result<PartitionInstallOutcome, PartitionInstallError>> {
        let Some(mut job) = self.install.take() else {
            return Poll::Ready(Err(PartitionInstallError::NotInstalling));
        };
        let mut spent = 0;
        loop {
            if spent >= budget.max(1) {
                self.install = Some(job);
                return Poll::Pending;
            }
            if matches!(job.step, SwapStep::Loaded(_)) {
                if spent > 0 {
                    self.install = Some(job);
                    return Poll::Pending;
                }
                let InstallJob {
                    checked,
                    step: SwapStep::Loaded(log),
                } = *job
                else {
                    // Matched just above.
                    return Poll::Ready(Err(PartitionInstallError::NotInstalling));
                };
                let finished = self.finish_install(&checked, log).await;
                return Poll::Ready(self.end_install(&checked, finished).await);
            }
            if let Err(error) = self.swap_step(&mut job, &mut spent).await {
                return Poll::Ready(self.end_install(&job.checked, Err(error)).await);
            }
        }
    }

    /// Logs the end of an install; a failure converges first.
    async fn end_install(
        &mut self,
        checked: &CheckedInstall,
        result: Result<PartitionInstallOutcome, PartitionInstallError>,
    ) -> Result<PartitionInstallOutcome, PartitionInstallError> {
        let error = match result {
            Ok(outcome) => {
                tracing::info!(dir = %self.dir.display(), commit_op = checked.commit_op, frontier = checked.frontier, segments = checked.staged.len(), "partition state installed");
                return Ok(outcome);
            }
            Err(error) => error,
        };
        tracing::warn!(dir = %self.dir.display(), %error, frontier = checked.frontier, "install failed; converging to an empty partition");
        self.discard_offset_writes(&checked.planned).await;
        match self.converge_after_failed_install(checked).await {
            Ok(()) => Err(error),
            Err(source) => {
                let failed = PartitionInstallError::ConvergeFailed {
                    source,
                    frontier: Offset(checked.frontier),
                };
                tracing::error!(dir = %self.dir.display(), error = %failed, "install converge failed; partition fenced");
                self.health.fence(|| failed.to_string());
                Err(failed)
            }
        }
    }

    /// Keeps the consensus core waiting for the live transfer session (see
    /// `Replica::hold_state_transfer`); the driver calls it on every tick
    /// of a session.
    pub fn hold_state_transfer(&mut self) {
        self.replica.hold_state_transfer();
    }

    /// ST-I2: the marker, then the frontier and applied point in one
    /// superblock record. The record is written as a reset: under an
    /// advancing purge the frontier legitimately moves down, and otherwise
    /// the check phase proved it is at least the durable one, so the reset
    /// is an advance.
    async fn record_install_frontier(&mut self, checked: &CheckedInstall) -> io::Result<()> {
        // The replica log's ops chain from the applied point this record
        // replaces: from here until the next step's record it vouches for
        // nothing, so a crash never resumes them on the installed state.
        if let Some(log) = self.replica_log.as_mut() {
            log.withdraw(&self.fs)
                .await
                .map_err(|e| io::Error::new(e.source.kind(), e.to_string()))?;
        }
        let marker = InstallMarker {
            commit_op: checked.commit_op,
            checksum: checked.checksum,
            frontier: checked.frontier,
        };
        let path = self.dir.join(INSTALL_MARKER_FILE);
        replace_file_durably(&self.fs, &path, marker.encode(), REPLACEMENT_SUFFIX).await?;
        if !checked.purge_advances {
            debug_assert!(checked.frontier >= self.durable_offset_frontier().0);
        }
        // A failed record may still have landed in part: the two-copy
        // superblock writes copy A, syncs it, then copy B, so a fault on B
        // leaves A (the newer sequence) holding the new frontier, and the
        // next boot reads it. The marker therefore stays: boot compares it
        // with whatever record won and converges when it is the new one
        // (an empty partition at the frontier, lagging), or drops it when
        // the old one stands. Removing it here would leave a frontier
        // above the old chain with nothing to explain it
        // (`FrontierAheadOfLog`, an unbootable partition). The next install
        // overwrites it; a later superblock write in this life replaces
        // both copies with the old lineage, which the marker then does not
        // match.
        // The offer's client table under the new point, before the record
        // boot matches it against (client_sessions.rs). Its sessions are
        // the ones `install` makes of the watermarks (no cached replies).
        let mut table = consensus::ClientTable::new(self.config.vsr.clients_max);
        table
            .install(&checked.wire.dedup)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let recorded = crate::client_sessions::RecordedTable {
            op: Op(checked.commit_op),
            checksum: checked.checksum,
            next_offset: Offset(checked.frontier),
            sessions: table.sessions(),
        };
        self.client_slots
            .write(&self.fs, &self.dir, &recorded, true)
            .await?;
        self.durable
            .reset_applied(
                Op(checked.commit_op),
                checked.checksum,
                Offset(checked.frontier),
            )
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(())
    }

    /// One file operation of the swap (ST-I3), or a phase's closing
    /// directory sync, counted into `spent`. Leaves the installed log in
    /// the job once every segment is loaded. Every error is converged from
    /// by the caller.
    ///
    /// The durable order: the old chain unlinked oldest first, synced (no
    /// old `.log` can reappear beside the new chain); every staged index
    /// renamed, synced; every staged log renamed, synced; each segment then
    /// recovered from the directory as boot would read it, which checks
    /// that the files are the chain the receive side verified. One sync per
    /// step, not one per rename: until the marker goes, any subset of these
    /// changes that a crash keeps is converged at boot, so no intermediate
    /// directory is ever trusted.
    async fn swap_step(
        &mut self,
        job: &mut InstallJob<F>,
        spent: &mut usize,
    ) -> Result<(), PartitionInstallError> {
        let dir = self.dir.clone();
        let fs = self.fs.clone();
        let staged = &job.checked.staged;
        *spent += 1;
        match &mut job.step {
            SwapStep::Unlink {
                strays,
                files,
                next,
            } => {
                if let Some(path) = strays.pop() {
                    if let Err(error) = fs.remove_file(&path).await {
                        tracing::warn!(path = %path.display(), %error, "could not sweep a stray staging file (boot sweeps it)");
                    }
                } else if let Some(path) = files.get(*next) {
                    remove_if_present(&fs, path).await.map_err(swap_io(path))?;
                    *next += 1;
                } else {
                    fs.sync_dir(&dir).await.map_err(swap_io(&dir))?;
                    job.step = SwapStep::RenameIndexes { next: 0 };
                }
            }
            SwapStep::RenameIndexes { next } => {
                // Every index before any log: a `.log` never shows without
                // its index.
                if let Some(s) = staged.get(*next) {
                    let (_, index) = s.staging_paths(&dir);
                    let target = dir.join(index_file_name(s.start_offset.0));
                    fs.rename(&index, &target).await.map_err(swap_io(&index))?;
                    *next += 1;
                } else {
                    fs.sync_dir(&dir).await.map_err(swap_io(&dir))?;
                    job.step = SwapStep::RenameLogs { next: 0 };
                }
            }
            SwapStep::RenameLogs { next } => {
                if let Some(s) = staged.get(*next) {
                    let (log, _) = s.staging_paths(&dir);
                    let target = dir.join(log_file_name(s.start_offset.0));
                    fs.rename(&log, &target).await.map_err(swap_io(&log))?;
                    *next += 1;
                } else {
                    fs.sync_dir(&dir).await.map_err(swap_io(&dir))?;
                    job.step = SwapStep::Load {
                        segments: Vec::with_capacity(staged.len()),
                        index_written: false,
                    };
                }
            }
            SwapStep::Load {
                segments,
                index_written,
            } => {
                if let Some(s) = staged.get(segments.len()) {
                    *spent += SEGMENT_LOAD_COST - 1;
                    let last = segments.len() + 1 == staged.len();
                    let (segment, written) = self.load_installed_segment(s, last).await?;
                    segments.push(segment);
                    *index_written |= written;
                } else {
                    let log = self
                        .assemble_installed_log(
                            std::mem::take(segments),
                            *index_written,
                            job.checked.frontier,
                        )
                        .await?;
                    job.step = SwapStep::Loaded(log);
                }
            }
            SwapStep::Loaded(_) => {}
        }
        Ok(())
    }

    /// Recovers one renamed segment as boot would read it and checks it
    /// against the staged description. Returns whether recovery wrote its
    /// index (the directory then needs a sync before the log is trusted).
    async fn load_installed_segment(
        &self,
        s: &StagedSegment,
        last: bool,
    ) -> Result<(RecoveredSegment, bool), PartitionInstallError> {
        let (segment, written) = recover_segment(
            &self.fs,
            &self.dir,
            s.start_offset.0,
            last,
            self.config.log.recovery(),
        )
        .await
        .map_err(|e| PartitionInstallError::SegmentOpen {
            path: self.dir.join(log_file_name(s.start_offset.0)),
            source: io::Error::other(e.to_string()),
        })?;
        check_installed_segment(&self.dir, s, &segment)?;
        Ok((segment, written))
    }

    /// The installed chain as one log, which must end exactly at the
    /// offer's frontier. An empty offer has no segment: the log plants one
    /// at the frontier, which recovery reads as a frontier marker.
    async fn assemble_installed_log(
        &self,
        segments: Vec<RecoveredSegment>,
        index_written: bool,
        frontier: u64,
    ) -> Result<SegmentedLog<F>, PartitionInstallError> {
        let dir = &self.dir;
        if index_written {
            self.fs.sync_dir(dir).await.map_err(swap_io(dir))?;
        }
        let log =
            SegmentedLog::from_recovered(self.fs.clone(), dir, self.config.log, segments, frontier)
                .await
                .map_err(|e| PartitionInstallError::SegmentOpen {
                    path: dir.clone(),
                    source: io::Error::other(e.to_string()),
                })?;
        if log.next_offset() != frontier {
            return Err(PartitionInstallError::SegmentOpen {
                path: dir.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "installed chain ends at {} but the offer's frontier is {frontier}",
                        log.next_offset(),
                    ),
                ),
            });
        }
        Ok(log)
    }

    /// ST-I4 over the installed log: journal, offsets, dedup, counters,
    /// bookkeeping, and the marker last. Every error is converged from by
    /// the caller.
    async fn finish_install(
        &mut self,
        checked: &CheckedInstall,
        log: SegmentedLog<F>,
    ) -> Result<PartitionInstallOutcome, PartitionInstallError> {
        self.replace_log(log);
        self.journal.clear_all(Op(checked.commit_op + 1));
        self.swap_in_offsets(checked).await?;
        let entries: Vec<(ConsumerKind, u32, u64)> = checked
            .planned
            .iter()
            .map(|w| (w.kind, w.id, w.value))
            .collect();
        self.offsets.replace_installed(&entries);
        self.replica
            .client_table_mut()
            .install(&checked.wire.dedup)
            .map_err(PartitionInstallError::Dedup)?;

        // Counters from the artifact's frontier and the installed chain.
        let (messages, size_bytes, last_timestamp) = staged_totals(&checked.staged);
        self.count_replaced_log(messages, size_bytes, last_timestamp);
        let installed_end = checked.staged.last().map(|s| s.end_offset);
        self.record_offered_generation(checked).await?;
        self.lift_to_installed_point(checked, installed_end.map(|v| v.0), true);
        self.clear_missing_history().await;
        self.remove_install_marker().await;
        if let Err(error) = self.drive().await {
            tracing::warn!(dir = %self.dir.display(), %error, "driving the core after an install failed");
        }
        Ok(PartitionInstallOutcome {
            applied_commit_op: Op(checked.commit_op),
        })
    }

    /// The offset records: everything not in the plan goes (strays
    /// included), then the planned siblings are renamed in, then each
    /// changed directory is synced.
    async fn swap_in_offsets(&self, checked: &CheckedInstall) -> Result<(), PartitionInstallError> {
        let fs = self.fs.clone();
        let planned_names: HashSet<(ConsumerKind, String)> = checked
            .planned
            .iter()
            .map(|w| (w.kind, format!("{}{REPLACEMENT_SUFFIX}", w.id)))
            .collect();
        let mut changed = [false; 2];
        for (slot, kind) in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup]
            .into_iter()
            .enumerate()
        {
            let odir = self.offsets.dir(kind);
            let entries = match fs.read_dir(&odir).await {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(source) => {
                    return Err(PartitionInstallError::OffsetPersistence { path: odir, source });
                }
            };
            for entry in entries {
                if entry.kind != FileKind::File {
                    continue;
                }
                let Some(name) = entry.name_str() else {
                    continue;
                };
                if planned_names.contains(&(kind, name.to_owned())) {
                    continue;
                }
                // Only files this code writes (ids and their siblings):
                // anything else is not an offset record, boot ignores it,
                // and it is not this install's to delete.
                if !crate::offset_storage::is_owned_offset_file(name) {
                    tracing::warn!(path = %odir.join(name).display(), "leaving a foreign file in an offsets directory");
                    continue;
                }
                let path = odir.join(name);
                with_retry(&fs, &path, || delete_persisted_offset(&fs, &path))
                    .await
                    .map_err(|source| PartitionInstallError::OffsetPersistence {
                        path: path.clone(),
                        source,
                    })?;
                changed[slot] = true;
            }
        }
        for write in &checked.planned {
            commit_offset_replacement(&fs, &write.path)
                .await
                .map_err(|source| PartitionInstallError::OffsetPersistence {
                    path: write.path.clone(),
                    source,
                })?;
            changed[usize::from(write.kind == ConsumerKind::ConsumerGroup)] = true;
        }
        for (slot, kind) in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup]
            .into_iter()
            .enumerate()
        {
            if changed[slot] {
                let odir = self.offsets.dir(kind);
                fs.sync_dir(&odir).await.map_err(swap_io(&odir))?;
            }
        }
        Ok(())
    }

    /// Records the offered purge generation when it advanced, before the
    /// marker goes. A failure fails the install (and the caller converges):
    /// an installed purged state under the old generation on disk would
    /// boot behind the generation group 0 committed, and nothing but a
    /// later purge would ever record it (mixed seed 20000993).
    async fn record_offered_generation(
        &mut self,
        checked: &CheckedInstall,
    ) -> Result<(), PartitionInstallError> {
        if !checked.purge_advances {
            return Ok(());
        }
        let record = PurgeGeneration {
            generation: checked.wire.purge_generation,
            created_revision: self.config.created_revision,
        };
        let fs = self.fs.clone();
        let dir = self.dir.clone();
        let path = dir.join(PURGE_GENERATION_FILE);
        with_retry(&fs, &path, || persist_purge_generation(&fs, &dir, record))
            .await
            .map_err(|source| PartitionInstallError::PurgeGenerationNotDurable {
                generation: record.generation,
                path: path.clone(),
                source,
            })?;
        self.purge_generation_installed(record.generation);
        Ok(())
    }

    /// The applied bookkeeping and the consensus core after an install or
    /// a converge: both leave the partition applied at `commit_op` with its
    /// next offset at the frontier (what the superblock already records).
    /// `complete` ends the core's transfer; a converge leaves it waiting
    /// (see [`Self::converge_after_failed_install`]).
    fn lift_to_installed_point(
        &mut self,
        checked: &CheckedInstall,
        installed_end: Option<u64>,
        complete: bool,
    ) {
        self.applied_installed(
            AppliedPoint {
                op: checked.commit_op,
                checksum: checked.checksum,
                next_offset: checked.frontier,
            },
            installed_end,
        );
        if checked.commit_op >= self.replica.commit_min().0 {
            self.replica
                .set_commit_floor(Op(checked.commit_op), checked.checksum);
        }
        self.replica.set_sequence(Op(checked.commit_op));
        self.replica.clear_pipeline();
        self.replica.advance_commit_max(Op(checked.commit_op));
        if complete {
            self.transfer_completed();
            self.replica.finish_state_transfer();
        }
    }

    /// After a converge: the history below the frontier is missing here.
    /// The partition stays lagging in memory at once; the record is made
    /// durable before the install marker goes. If the record cannot be
    /// written the marker stays, so a reboot converges again and writes it.
    async fn record_missing_history(&mut self, checked: &CheckedInstall) {
        let record = MissingHistory {
            commit_op: Op(checked.commit_op),
            frontier: Offset(checked.frontier),
        };
        self.mark_history_missing(record);
        self.retry_missing_history_record(record).await;
    }

    /// Writes the transfer-needed record, then removes the install marker.
    /// On failure the marker stays and the record is retried on every
    /// tick; meanwhile no applied point past the install is recorded
    /// (`flush`), so the marker keeps matching the superblock and a reboot
    /// converges and writes the record itself.
    pub(crate) async fn retry_missing_history_record(&mut self, record: MissingHistory) {
        match write_missing_history(&self.fs, &self.dir, record).await {
            Ok(()) => {
                self.health.missing_history_recorded();
                self.remove_install_marker().await;
            }
            Err(error) => {
                if self.health.retries().missing_history_record().is_none() {
                    tracing::warn!(dir = %self.dir.display(), %error, "could not record the missing history; the install marker stays, the applied point stays at the install, and the record is retried every tick");
                }
                self.health.missing_history_unrecorded(record);
            }
        }
    }

    /// After a completed install: the record goes (before the install
    /// marker, so a crash in between converges and records it again). A
    /// failed removal keeps the partition lagging and is retried on ticks.
    pub(crate) async fn clear_missing_history(&mut self) {
        match clear_missing_history(&self.fs, &self.dir).await {
            Ok(()) => self.history_restored(),
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "could not remove the transfer-needed record; retried on the next tick");
                self.health.missing_history_uncleared();
            }
        }
    }
}

/// Messages, bytes and the newest timestamp across the staged chain.
fn staged_totals(staged: &[StagedSegment]) -> (u64, u64, u64) {
    let messages = staged
        .iter()
        // The check phase proved start <= end < frontier per segment.
        .map(|s| {
            s.end_offset
                .messages_since(s.start_offset)
                .saturating_add(1)
        })
        .fold(0u64, u64::saturating_add);
    let size_bytes = staged
        .iter()
        .map(|s| s.size_bytes)
        .fold(0u64, u64::saturating_add);
    let last_timestamp = staged.iter().map(|s| s.max_timestamp).max().unwrap_or(0);
    (messages, size_bytes, last_timestamp)
}
