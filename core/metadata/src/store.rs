//! [`MetadataStore`]: the metadata state made durable — committed ops in
//! the metadata WAL (`journal::MetadataWal`), the whole state in a
//! snapshot now and then, boot by snapshot + WAL replay.
//!
//! Files in the store's directory:
//!
//! - `metadata.wal`: one prepare frame per committed op (the body is the
//!   op's codec bytes), appended and synced before the op is applied, so
//!   an applied op — and any effect the shard acts on — is always durable
//!   first;
//! - `metadata.snapshot`: [`crate::snapshot`] bytes of the state at its
//!   applied op;
//! - `*.tmp`: a sibling being written; swept at boot.
//!
//! **Snapshot, in order, each step against the crash it defends from:**
//! 1. write `metadata.snapshot.tmp`, sync it, rename it over
//!    `metadata.snapshot`, sync the directory: a crash before the rename
//!    leaves the old snapshot (and the full WAL), after the directory sync
//!    the new one is the durable one;
//! 2. only then replace the WAL by an empty file the same way: a crash
//!    before that rename leaves the old WAL, whose ops are all at or below
//!    the new snapshot and are skipped at replay; the WAL is never emptied
//!    while the snapshot that covers it could still be lost.
//!
//! A failure in step 2 after the rename leaves the open WAL handle on a
//! file that is no longer the WAL: the store refuses every later commit
//! ([`StoreError::Poisoned`]) until it is reopened.
//!
//! **Boot:** sweep siblings, decode the snapshot if there is one (a
//! snapshot that does not decode refuses boot: falling back to an empty
//! state would forget committed ops), open the WAL (which cuts a torn tail
//! and refuses interior damage), then apply every WAL op above the
//! snapshot's op in order. A gap between them refuses boot.

use common::{METADATA_GROUP, Op, ReplicaId};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use consensus::header::{CommandHeader, FrameHeader, PrepareCommand, decode_frame, encode_frame};
use consensus::vsr::OPERATION_APPEND;
use journal::WAL_ENTRY_SIZE_MAX;
use journal::{MetadataWal, WalError};
use storage::fs::{Fs, FsFile, OpenOptions, replace_file_durably};

use crate::op::MetadataOp;
use crate::op_codec::{OpDecodeError, OpEncodeError};
use crate::refusal::Refusal;
use crate::snapshot::{SnapshotDecodeError, decode_snapshot, encode_snapshot};
use crate::state::{Applied, ApplyError, MetadataState};

/// The WAL's file name.
pub const WAL_FILE: &str = "metadata.wal";
/// The snapshot's file name.
pub const SNAPSHOT_FILE: &str = "metadata.snapshot";
/// Where [`MetadataStore::set_aside`] moves damaged files
/// (`damaged.<n>`).
pub const DAMAGED_PREFIX: &str = "damaged.";
/// Present (durably) from before a damaged store is set aside until the
/// shard has caught up and reconciled its partition groups: a reboot in
/// between must still not delete groups the empty state does not name.
pub const DAMAGE_RECOVERY_FILE: &str = "damage.recovering";
/// The suffix of a sibling being written.
pub const SIBLING_SUFFIX: &str = ".tmp";
/// Default ops between snapshots.
pub const SNAPSHOT_EVERY_OPS_DEFAULT: u64 = 1024;

/// The store's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// The cluster id stamped into WAL frames.
    pub cluster: u128,
    /// [`MetadataStore::snapshot_due`] turns true after this many ops.
    pub snapshot_every_ops: u64,
    /// Entries the WAL's in-memory index covers.
    pub wal_slots: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            cluster: 0,
            snapshot_every_ops: SNAPSHOT_EVERY_OPS_DEFAULT,
            wal_slots: journal::WAL_SLOTS_DEFAULT,
        }
    }
}

/// Who asked for an op, recorded in its WAL frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpOrigin {
    /// The client id (0 for the server itself).
    pub client: u128,
    /// The client's request number.
    pub request: u64,
    /// The primary's timestamp of the prepare (µs).
    pub timestamp_us: u64,
    /// The requesting user.
    pub user_id: u32,
    /// The committed prepare's VSR identity (0 outside replication),
    /// recorded in the entry's `request_checksum` field.
    pub identity: u128,
}

/// Why the store could not boot, commit or snapshot.
#[derive(Debug)]
pub enum StoreError {
    /// A filesystem call failed.
    Io {
        /// What the store was doing.
        step: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The WAL refused to open or append.
    Wal(WalError),
    /// The snapshot does not decode: boot is refused.
    Snapshot {
        /// The file.
        path: PathBuf,
        /// Why.
        error: SnapshotDecodeError,
    },
    /// A WAL entry's body is not a metadata op.
    WalEntryUndecodable {
        /// The op.
        op: Op,
        /// Why.
        error: OpDecodeError,
    },
    /// The WAL does not continue the snapshot (an op is missing).
    WalGap {
        /// The op expected next.
        expected: u64,
        /// The op found.
        found: u64,
    },
    /// The op cannot be encoded (the caller built an invalid op).
    Encode(OpEncodeError),
    /// The op is not the next one.
    Apply(ApplyError),
    /// An earlier snapshot failed after replacing the WAL file: reopen.
    Poisoned,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { step, path, source } => {
                write!(f, "metadata store: {step} {}: {source}", path.display())
            }
            Self::Wal(e) => write!(f, "metadata WAL: {e}"),
            Self::Snapshot { path, error } => {
                write!(f, "metadata snapshot {} unusable: {error}", path.display())
            }
            Self::WalEntryUndecodable { op, error } => {
                write!(f, "metadata WAL op {op} does not decode: {error}")
            }
            Self::WalGap { expected, found } => write!(
                f,
                "metadata WAL holds op {found} where {expected} was expected"
            ),
            Self::Encode(e) => write!(f, "metadata op cannot be encoded: {e}"),
            Self::Apply(e) => write!(f, "metadata op not applied: {e}"),
            Self::Poisoned => f.write_str(
                "metadata store failed while replacing its WAL; reopen it before committing",
            ),
        }
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// Whether boot failed on damaged bytes at rest (a flipped bit or a
    /// lost write inside the WAL, a snapshot that does not decode), not on
    /// a failing call: a replica with peers can set the files aside and
    /// take the state from them instead ([`MetadataStore::set_aside`]).
    pub fn is_damage_at_rest(&self) -> bool {
        matches!(
            self,
            Self::Wal(WalError::InteriorCorruption { .. } | WalError::TornTailTooLarge { .. })
                | Self::Snapshot { .. }
                | Self::WalEntryUndecodable { .. }
                | Self::WalGap { .. }
        )
    }
}

impl From<WalError> for StoreError {
    fn from(e: WalError) -> Self {
        Self::Wal(e)
    }
}

/// What boot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BootReport {
    /// The snapshot's applied op, if a snapshot was loaded.
    pub snapshot_op: Option<Op>,
    /// WAL ops applied on top of it.
    pub replayed: u64,
    /// WAL ops skipped (at or below the snapshot).
    pub skipped: u64,
    /// Bytes of torn WAL tail cut.
    pub truncated_bytes: u64,
}

/// The durable metadata state.
pub struct MetadataStore<F: Fs> {
    fs: F,
    dir: PathBuf,
    config: StoreConfig,
    wal: MetadataWal<F>,
    state: MetadataState,
    parent: u128,
    ops_since_snapshot: u64,
    poisoned: bool,
}

impl<F: Fs> fmt::Debug for MetadataStore<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataStore")
            .field("dir", &self.dir)
            .field("applied", &self.state.applied())
            .field("ops_since_snapshot", &self.ops_since_snapshot)
            .finish_non_exhaustive()
    }
}

fn io_err(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { step, path, source }
}

fn sibling(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(SIBLING_SUFFIX);
    PathBuf::from(s)
}

impl<F: Fs> MetadataStore<F> {
    /// Boots from `dir` (created if absent): snapshot, then WAL replay.
    pub async fn open(
        fs: &F,
        dir: &Path,
        config: StoreConfig,
    ) -> Result<(Self, BootReport), StoreError> {
        Self::create_dir(fs, dir).await?;
        let wal_path = dir.join(WAL_FILE);
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        Self::sweep_siblings(fs, &[&wal_path, &snapshot_path]).await?;
        let mut report = BootReport::default();
        let loaded = Self::load_snapshot(fs, &snapshot_path).await?;
        report.snapshot_op = loaded.as_ref().map(MetadataState::applied);
        let mut state = loaded.unwrap_or_else(MetadataState::new);
        let (wal, recovery) = MetadataWal::open(fs, &wal_path, config.wal_slots).await?;
        report.truncated_bytes = recovery.truncated_bytes;
        let ops_since_snapshot = Self::replay(fs, &wal_path, &mut state, &mut report).await?;
        let parent = wal.head().map_or(0, |(_, checksum)| checksum);
        let store = Self {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            config,
            wal,
            state,
            parent,
            ops_since_snapshot,
            poisoned: false,
        };
        tracing::info!(
            dir = %dir.display(),
            applied = store.state.applied().0,
            snapshot_op = ?report.snapshot_op.map(|o| o.0),
            replayed = report.replayed,
            "metadata store booted"
        );
        Ok((store, report))
    }

    /// Moves the WAL and the snapshot of the store in `dir` into a new
    /// `damaged.<n>` directory beside them (evidence for an operator;
    /// nothing reads them again), durably: the next open finds an empty
    /// store. Returns the directory.
    ///
    /// # Errors
    /// The failing step's I/O error (what was moved before it stays moved,
    /// so a retry finishes the job).
    pub async fn set_aside(fs: &F, dir: &Path) -> Result<PathBuf, StoreError> {
        let marker = dir.join(DAMAGE_RECOVERY_FILE);
        replace_file_durably(fs, &marker, Vec::new(), SIBLING_SUFFIX)
            .await
            .map_err(io_err("record the damage recovery", &marker))?;
        let mut n = 0u32;
        let aside = loop {
            let candidate = dir.join(format!("{DAMAGED_PREFIX}{n}"));
            if !fs
                .exists(&candidate)
                .await
                .map_err(io_err("probe", &candidate))?
            {
                break candidate;
            }
            n = n.checked_add(1).ok_or_else(|| StoreError::Io {
                step: "name a damaged directory",
                path: candidate.clone(),
                source: io::Error::other("every damaged.<n> name is taken"),
            })?;
        };
        fs.create_dir_all(&aside)
            .await
            .map_err(io_err("create directory", &aside))?;
        fs.sync_dir(dir)
            .await
            .map_err(io_err("sync directory", dir))?;
        for name in [WAL_FILE, SNAPSHOT_FILE] {
            let from = dir.join(name);
            if fs.exists(&from).await.map_err(io_err("probe", &from))? {
                fs.rename(&from, &aside.join(name))
                    .await
                    .map_err(io_err("move aside", &from))?;
            }
        }
        fs.sync_dir(&aside)
            .await
            .map_err(io_err("sync directory", &aside))?;
        fs.sync_dir(dir)
            .await
            .map_err(io_err("sync directory", dir))?;
        Ok(aside)
    }

    /// Whether a damage recovery set up by [`Self::set_aside`] has not
    /// been ended ([`Self::end_damage_recovery`]).
    ///
    /// # Errors
    /// The probe's I/O error.
    pub async fn damage_recovery_pending(fs: &F, dir: &Path) -> Result<bool, StoreError> {
        let marker = dir.join(DAMAGE_RECOVERY_FILE);
        fs.exists(&marker).await.map_err(io_err("probe", &marker))
    }

    /// Ends a damage recovery durably (the marker removed, the directory
    /// synced).
    ///
    /// # Errors
    /// The failing step's I/O error (the recovery then stays pending).
    pub async fn end_damage_recovery(fs: &F, dir: &Path) -> Result<(), StoreError> {
        let marker = dir.join(DAMAGE_RECOVERY_FILE);
        fs.remove_file(&marker)
            .await
            .map_err(io_err("remove", &marker))?;
        fs.sync_dir(dir)
            .await
            .map_err(io_err("sync directory", dir))
    }

    async fn create_dir(fs: &F, dir: &Path) -> Result<(), StoreError> {
        if fs.exists(dir).await.map_err(io_err("probe", dir))? {
            return Ok(());
        }
        fs.create_dir_all(dir)
            .await
            .map_err(io_err("create directory", dir))?;
        // The new name must survive a crash before anything in it is
        // acknowledged.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs.sync_dir(parent)
                .await
                .map_err(io_err("sync directory", parent))?;
        }
        Ok(())
    }

    /// A sibling is a replacement that never reached its rename: garbage.
    async fn sweep_siblings(fs: &F, paths: &[&Path]) -> Result<(), StoreError> {
        for path in paths {
            let s = sibling(path);
            if fs.exists(&s).await.map_err(io_err("probe", &s))? {
                fs.remove_file(&s)
                    .await
                    .map_err(io_err("sweep sibling", &s))?;
            }
        }
        Ok(())
    }

    async fn load_snapshot(fs: &F, path: &Path) -> Result<Option<MetadataState>, StoreError> {
        if !fs.exists(path).await.map_err(io_err("probe", path))? {
            return Ok(None);
        }
        let bytes = read_all(fs, path).await?;
        decode_snapshot(&bytes)
            .map(Some)
            .map_err(|error| StoreError::Snapshot {
                path: path.to_path_buf(),
                error,
            })
    }

    /// Applies the WAL's ops above the state's; returns how many it holds
    /// above the snapshot.
    async fn replay(
        fs: &F,
        path: &Path,
        state: &mut MetadataState,
        report: &mut BootReport,
    ) -> Result<u64, StoreError> {
        // MetadataWal::open has verified every entry and cut a torn tail;
        // the walk here only extracts ops and bodies.
        let bytes = read_all(fs, path).await?;
        let mut pos = 0usize;
        let mut held = 0u64;
        while pos < bytes.len() {
            // The header's `size` (bytes 48..52) delimits the frame.
            let size = bytes
                .get(pos + 48..pos + 52)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            let entry = bytes.get(pos..pos.saturating_add(size)).unwrap_or(&[]);
            let frame = decode_frame(entry, WAL_ENTRY_SIZE_MAX)
                .map_err(|e| StoreError::Wal(WalError::InvalidPrepare(e)))?;
            let CommandHeader::Prepare(p) = frame.header.command else {
                return Err(StoreError::Wal(WalError::NotAPrepare));
            };
            pos += frame.header.size as usize;
            held += 1;
            if p.op <= state.applied() {
                report.skipped += 1;
                continue;
            }
            let expected = state.applied().0 + 1;
            if p.op.0 != expected {
                return Err(StoreError::WalGap {
                    expected,
                    found: p.op.0,
                });
            }
            if frame.body.is_empty() {
                // A skipped op (Register or duplicate): occupies its number.
                state.skip(p.op).map_err(StoreError::Apply)?;
                state.set_applied_identity(p.request_checksum);
                report.replayed += 1;
                continue;
            }
            let op = MetadataOp::decode(frame.body)
                .map_err(|error| StoreError::WalEntryUndecodable { op: p.op, error })?;
            match state.apply(p.op, &op) {
                // A refusal replays as a refusal: the same as when committed.
                Ok(_) | Err(ApplyError::Refused(_)) => report.replayed += 1,
                Err(e) => return Err(StoreError::Apply(e)),
            }
            state.set_applied_identity(p.request_checksum);
        }
        Ok(held)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The filesystem it lives on.
    pub const fn fs(&self) -> &F {
        &self.fs
    }

    /// The applied state.
    pub const fn state(&self) -> &MetadataState {
        &self.state
    }

    /// The last op applied.
    pub const fn applied(&self) -> Op {
        self.state.applied()
    }

    /// The op a standalone store commits next.
    pub const fn next_op(&self) -> Op {
        self.state.applied().next()
    }

    /// Whether enough ops accumulated since the last snapshot.
    pub const fn snapshot_due(&self) -> bool {
        self.ops_since_snapshot >= self.config.snapshot_every_ops
    }

    /// Ops in the WAL (since the last snapshot).
    pub const fn wal_ops(&self) -> u64 {
        self.ops_since_snapshot
    }

    /// Makes committed op `op` durable in the WAL, then applies it. The
    /// outer error means nothing was applied (the op is not the next one,
    /// or the append failed); the inner result is the op's own outcome,
    /// identical on every replica.
    pub async fn commit(
        &mut self,
        op: Op,
        body: &MetadataOp,
        origin: OpOrigin,
    ) -> Result<Result<Applied, Refusal>, StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned);
        }
        self.check_next(op)?;
        let bytes = body.encode().map_err(StoreError::Encode)?;
        let frame = self.frame(op, &bytes, origin);
        self.append(frame).await?;
        let result = self.state.apply(op, body);
        self.state.set_applied_identity(origin.identity);
        match result {
            Ok(applied) => Ok(Ok(applied)),
            Err(ApplyError::Refused(r)) => Ok(Err(r)),
            Err(e) => Err(StoreError::Apply(e)),
        }
    }

    /// Makes committed op `op` durable as a skipped op (a Register, or a
    /// request already committed at an earlier op): an empty WAL entry;
    /// the state only records the op as applied.
    pub async fn commit_skip(&mut self, op: Op, origin: OpOrigin) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned);
        }
        self.check_next(op)?;
        let frame = self.frame(op, &[], origin);
        self.append(frame).await?;
        self.state.skip(op).map_err(StoreError::Apply)?;
        self.state.set_applied_identity(origin.identity);
        Ok(())
    }

    fn check_next(&self, op: Op) -> Result<(), StoreError> {
        let expected = self.next_op();
        if op == expected {
            return Ok(());
        }
        Err(StoreError::Apply(if op < expected {
            ApplyError::AlreadyApplied {
                op,
                applied: self.applied(),
            }
        } else {
            ApplyError::Gap { op, expected }
        }))
    }

    async fn append(&mut self, frame: Vec<u8>) -> Result<(), StoreError> {
        let identity = u128::from_le_bytes(frame[..16].try_into().unwrap_or([0; 16]));
        // Durable before applied: an effect is only ever handed out for an
        // op a reboot will replay.
        self.wal.append(frame).await?;
        self.parent = identity;
        self.ops_since_snapshot += 1;
        Ok(())
    }

    fn frame(&self, op: Op, body: &[u8], origin: OpOrigin) -> Vec<u8> {
        let header = FrameHeader {
            checksum: 0,
            checksum_body: 0,
            cluster: self.config.cluster,
            size: 0,
            view: 0,
            replica: ReplicaId(0),
            command: CommandHeader::Prepare(PrepareCommand {
                client: origin.client,
                parent: self.parent,
                request_checksum: origin.identity,
                op,
                commit: Op(op.0 - 1),
                timestamp: origin.timestamp_us,
                request: origin.request,
                operation: OPERATION_APPEND,
                group: METADATA_GROUP,
                user_id: origin.user_id,
            }),
        };
        encode_frame(&header, body)
    }

    /// Writes a snapshot of the applied state and empties the WAL (the
    /// order and its crash arguments are in the module documentation).
    pub async fn snapshot(&mut self) -> Result<(), StoreError> {
        let bytes = encode_snapshot(&self.state);
        self.write_snapshot(bytes).await
    }

    /// Replaces the state by `state` (a state transfer's, strictly ahead of
    /// the applied op): it becomes the durable snapshot, then the WAL is
    /// emptied, exactly as [`Self::snapshot`] orders it. A crash before the
    /// snapshot's rename boots the old state; after it, the new one (the
    /// old WAL's ops are all below it and skipped).
    pub async fn install(&mut self, state: MetadataState) -> Result<(), StoreError> {
        if state.applied() <= self.applied() {
            return Err(StoreError::Apply(ApplyError::AlreadyApplied {
                op: state.applied(),
                applied: self.applied(),
            }));
        }
        self.write_snapshot(encode_snapshot(&state)).await?;
        self.state = state;
        Ok(())
    }

    async fn write_snapshot(&mut self, bytes: Vec<u8>) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned);
        }
        let snapshot_path = self.dir.join(SNAPSHOT_FILE);
        let wal_path = self.dir.join(WAL_FILE);
        replace_file_durably(&self.fs, &snapshot_path, bytes, SIBLING_SUFFIX)
            .await
            .map_err(io_err("write snapshot", &snapshot_path))?;
        // From here the WAL file may be replaced under the open handle.
        self.poisoned = true;
        replace_file_durably(&self.fs, &wal_path, Vec::new(), SIBLING_SUFFIX)
            .await
            .map_err(io_err("empty WAL", &wal_path))?;
        let (wal, _) = MetadataWal::open(&self.fs, &wal_path, self.config.wal_slots).await?;
        self.wal = wal;
        self.poisoned = false;
        self.ops_since_snapshot = 0;
        tracing::debug!(
            applied = self.state.applied().0,
            "metadata snapshot written"
        );
        Ok(())
    }
}

async fn read_all<F: Fs>(fs: &F, path: &Path) -> Result<Vec<u8>, StoreError> {
    let file = fs
        .open(path, OpenOptions::read_only())
        .await
        .map_err(io_err("open", path))?;
    let len = file.len().await.map_err(io_err("stat", path))?;
    let len = usize::try_from(len).map_err(|_| StoreError::Io {
        step: "read",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, "file larger than memory"),
    })?;
    file.read_exact_at(len, 0)
        .await
        .map_err(io_err("read", path))
}
