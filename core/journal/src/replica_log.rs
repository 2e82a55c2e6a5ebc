//! A replica's durable log of its VSR journal: what lets a `persisted`
//! partition group resume after a crash without forgetting anything it
//! acknowledged (docs/consensus.md §4, "Resume from a durable journal").
//!
//! The partition journal of the core is memory-only. A group whose driver
//! keeps this log writes, after each step and before any frame of that
//! step leaves, one record of what changed in the core's
//! [`LoggedJournal`] and syncs it; at boot the records are replayed into
//! the journal the replica held when its last record was written.
//!
//! # Format (docs/formats.md §19)
//!
//! The file is a sequence of records, each
//!
//! ```text
//! 0   u32  magic 0x474F_4C52 ("RLOG")
//! 4   u32  payload length
//! 8   u64  xxh3-64 of the payload
//! 16  u64  xxh3-64 of bytes 0..16
//! 24  payload:
//!     0   u32  view
//!     4   u32  log_view
//!     8   u64  commit
//!     16  u64  cut head (0: none)
//!     24  u8   visible (0 or 1)
//!     25  u8   kept: 1 when written without a sync (see below), else 0
//!     26  6    zero
//!     32  u64  from_op: every op at or above it is replaced
//!     40  u32  entries
//!     44  u32  the writing machine boot's tag when kept, else 0
//!     48  entries, in strictly increasing op order, all at or above
//!         from_op, each a 129-byte prepare header, a u8 (1 = the body
//!         follows), a u32 body length and the body
//! ```
//!
//! A record replaces the log's ops from `from_op` up with its entries and
//! its view, log view, commit and visibility with its own. Every header
//! must verify (its identity is a function of its fields) and every body
//! must match its header's body checksum, so a record either decodes into
//! prepares the core itself could have journaled or is refused whole.
//!
//! # Damage
//!
//! A record whose header verifies but whose payload runs past the end of
//! the file (or a file ending inside a record's header) was being appended
//! when the process stopped: a synced record's length is durable with it,
//! so its step never synced, none of its frames left, and it is cut off.
//! The header's own checksum is what makes the length believable: a bit
//! flipped in it cannot pass for an unfinished append. Any other damage (a
//! bad header, a bad payload checksum, an entry that does not verify) may
//! be a synced record that rotted: the log then vouches for nothing ([`Replayed::Damaged`]) and the
//! replica restarts as one that lost its journal, which is always safe.
//! The damaged file is replaced by an empty one before anything is
//! appended, so the next boot does not find the same damage again.
//!
//! # Kept records (a `replicated` group)
//!
//! A log opened with [`LogMode::kept`] writes its records without syncing
//! them: a `kill -9` keeps every page the process wrote (the page cache
//! belongs to the kernel), so such a record is as good as a synced one
//! for as long as the machine has not restarted; a power loss or a kernel
//! crash may drop any unsynced page. Each kept record therefore carries
//! the tag of the machine boot that wrote it (from
//! `/proc/sys/kernel/random/boot_id`), and the log vouches for its journal
//! only when its last record is synced or was kept by the boot that reads
//! it ([`Replayed::Stale`] otherwise, and tag 0, unknown, never matches).
//!
//! # Size
//!
//! The writer keeps every logged op above the recorded applied point in
//! memory (the bodies are shared with the core's journal), and once the
//! file passes [`COMPACT_BYTES`] it writes them as one record to a sibling
//! and renames it over the file, so the file holds only what a boot needs.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::{GroupId, Op};
use consensus::vsr::{LoggedJournal, Prepare, PrepareHeader, body_checksum};
use storage::fs::{BufResult, Fs, FsFile, OpenOptions, replace_file_durably};
use xxhash_rust::xxh3::xxh3_64;

/// The file name, in a partition's directory.
pub const REPLICA_LOG_FILE: &str = "replica.log";
/// A record's first four bytes.
pub const RECORD_MAGIC: u32 = 0x474F_4C52;
/// Bytes before a record's payload.
pub const RECORD_HEADER_LEN: usize = 24;
/// The fixed part of a payload.
pub const RECORD_META_LEN: usize = 48;
/// An encoded prepare header.
pub const LOGGED_HEADER_LEN: usize = 129;
/// The smallest entry: a header, the body flag and the body length.
pub const ENTRY_LEN_MIN: usize = LOGGED_HEADER_LEN + 1 + 4;
/// The largest payload accepted; a larger length is damage.
pub const RECORD_PAYLOAD_MAX: u32 = 1 << 30;
/// The file size past which the writer rewrites the file with only the
/// ops a boot needs.
pub const COMPACT_BYTES: u64 = 16 * 1024 * 1024;
const SIBLING_SUFFIX: &str = ".compact";

/// What the log said at boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// No record: nothing is vouched for.
    Empty,
    /// The journal as the last whole record left it.
    Journal(LoggedJournal),
    /// The last record was written without a sync by an earlier machine
    /// boot (its unsynced pages may be gone): nothing is vouched for.
    Stale {
        /// The boot tag the record carries.
        written: u32,
        /// The boot reading it.
        now: u32,
    },
    /// A record is damaged: nothing is vouched for.
    Damaged {
        /// The record's offset in the file.
        offset: u64,
        /// What was wrong.
        reason: RecordDamage,
    },
}

/// How a log's records reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogMode {
    /// Whether each record is synced before its call returns.
    pub sync: bool,
    /// The tag of this machine boot (0: unknown), written into records
    /// kept without a sync and compared with the last one at open.
    pub boot_tag: u32,
}

impl LogMode {
    /// Every record synced (a `persisted` group, the metadata group).
    pub const SYNCED: Self = Self {
        sync: true,
        boot_tag: 0,
    };

    /// Records kept in the page cache, good until the machine restarts
    /// (a `replicated` group): they survive a process kill, not a power
    /// loss.
    pub fn kept(boot_tag: u32) -> Self {
        Self {
            sync: false,
            boot_tag,
        }
    }

    /// The boot tag a record written in this mode carries (`None`: synced).
    fn record_tag(self) -> Option<u32> {
        (!self.sync).then_some(self.boot_tag)
    }
}

/// The tag of a machine boot: the low 32 bits of xxh3-64 of the kernel's
/// boot id text (never 0; 0 when there is none).
pub fn boot_tag_of(boot_id: &str) -> u32 {
    let boot_id = boot_id.trim();
    if boot_id.is_empty() {
        return 0;
    }
    (xxh3_64(boot_id.as_bytes()) as u32).max(1)
}

/// Why a record is not believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordDamage {
    /// The header's own checksum does not match.
    Header,
    /// The first four bytes are not [`RECORD_MAGIC`].
    Magic,
    /// The payload length is past [`RECORD_PAYLOAD_MAX`].
    Length(u32),
    /// The checksum does not match.
    Checksum,
    /// The payload's fixed part is malformed (a reserved byte set, the
    /// visibility not 0 or 1, more entries than bytes).
    Meta,
    /// An entry is truncated, out of order, below `from_op`, or does not
    /// verify.
    Entry {
        /// The entry's index in its record.
        index: u32,
    },
}

impl fmt::Display for RecordDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header => write!(f, "record header checksum mismatch"),
            Self::Magic => write!(f, "bad magic"),
            Self::Length(len) => write!(f, "payload length {len} past the ceiling"),
            Self::Checksum => write!(f, "checksum mismatch"),
            Self::Meta => write!(f, "malformed record fields"),
            Self::Entry { index } => write!(f, "entry {index} malformed or unverified"),
        }
    }
}

/// An I/O failure of the log, naming its file.
#[derive(Debug)]
pub struct ReplicaLogError {
    /// The file.
    pub path: PathBuf,
    /// What failed.
    pub source: io::Error,
}

impl fmt::Display for ReplicaLogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica log {}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for ReplicaLogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The state the records describe: the last record's fields and every op
/// logged and not replaced since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct LogState {
    view: u32,
    log_view: u32,
    commit: u64,
    cut_head: u64,
    visible: bool,
    /// The boot tag of the last record, when it was kept without a sync.
    kept_by: Option<u32>,
    ops: BTreeMap<u64, (PrepareHeader, Option<Prepare>)>,
}

impl LogState {
    fn same_meta(&self, logged: &LoggedJournal) -> bool {
        (self.view, self.log_view, self.commit, self.visible)
            == (
                logged.view,
                logged.log_view,
                logged.commit.0,
                logged.visible,
            )
    }

    fn apply(&mut self, record: Record) {
        self.view = record.view;
        self.log_view = record.log_view;
        self.commit = record.commit;
        self.cut_head = record.cut_head;
        self.visible = record.visible;
        self.kept_by = record.kept_by;
        self.ops.split_off(&record.from_op);
        for (header, body) in record.entries {
            self.ops.insert(header.op.0, (header, body));
        }
    }

    fn journal_above(&self, applied: u64) -> LoggedJournal {
        LoggedJournal {
            view: self.view,
            log_view: self.log_view,
            commit: Op(self.commit),
            cut_head: Op(self.cut_head),
            visible: self.visible,
            ops: self
                .ops
                .range(applied.saturating_add(1)..)
                .map(|(_, e)| e.clone())
                .collect(),
        }
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    view: u32,
    log_view: u32,
    commit: u64,
    cut_head: u64,
    visible: bool,
    /// The writing boot's tag, for a record kept without a sync.
    kept_by: Option<u32>,
    from_op: u64,
    entries: Vec<(PrepareHeader, Option<Prepare>)>,
}

/// The writer of one group's log.
pub struct ReplicaLog<F: Fs> {
    path: PathBuf,
    /// Open while in use; [`ReplicaLog::release_handle`] closes it (every
    /// record is synced before it returns, so nothing waits on it) and the
    /// next write opens it again, so an idle group holds no descriptor.
    file: Option<F::File>,
    end: u64,
    state: LogState,
    /// Whether any record was written or read: an empty log describes no
    /// journal, even an empty one.
    described: bool,
    syncs: u64,
    mode: LogMode,
}

impl<F: Fs> fmt::Debug for ReplicaLog<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaLog")
            .field("path", &self.path)
            .field("end", &self.end)
            .field("ops", &self.state.ops.len())
            .finish_non_exhaustive()
    }
}

impl<F: Fs> ReplicaLog<F> {
    /// Opens the log at `path` (creating it), replays its records, cuts off
    /// a record whose append never finished, and replaces a damaged file
    /// with an empty one. Returns the writer and the journal the log
    /// describes above `applied` (the recorded applied op). Records are
    /// written as `mode` says.
    pub async fn open(
        fs: &F,
        path: &Path,
        applied: u64,
        mode: LogMode,
    ) -> Result<(Self, Replayed), ReplicaLogError> {
        let err = |source| ReplicaLogError {
            path: path.to_path_buf(),
            source,
        };
        // A compaction a crash interrupted before its rename left its
        // sibling; the file itself is whole.
        let mut sibling = path.as_os_str().to_os_string();
        sibling.push(SIBLING_SUFFIX);
        let sibling = PathBuf::from(sibling);
        if fs.exists(&sibling).await.map_err(err)? {
            fs.remove_file(&sibling).await.map_err(err)?;
        }
        let existed = fs.exists(path).await.map_err(err)?;
        let file = fs
            .open(path, OpenOptions::create_read_write())
            .await
            .map_err(err)?;
        if !existed && let Some(parent) = path.parent() {
            fs.sync_dir(parent).await.map_err(err)?;
        }
        let len = file.len().await.map_err(err)?;
        let bytes = match usize::try_from(len) {
            Ok(len) => file.read_exact_at(len, 0).await.map_err(err)?,
            Err(_) => {
                return Err(err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "replica log larger than memory",
                )));
            }
        };
        let mut state = LogState::default();
        let mut pos = 0usize;
        let mut described = false;
        let mut damage = None;
        while pos < bytes.len() {
            match decode_record(&bytes[pos..]) {
                Decoded::Whole(record, size) => {
                    state.apply(record);
                    described = true;
                    pos += size;
                }
                Decoded::Unfinished => break,
                Decoded::Damaged(reason) => {
                    damage = Some((pos as u64, reason));
                    break;
                }
            }
        }
        let mut log = Self {
            path: path.to_path_buf(),
            file: Some(file),
            end: pos as u64,
            state,
            described,
            syncs: 0,
            mode,
        };
        if let Some((offset, reason)) = damage {
            tracing::warn!(path = %path.display(), offset, %reason, "replica log damaged: it vouches for nothing, and is started again empty");
            log.state = LogState::default();
            log.described = false;
            log.end = 0;
            let file = log.file.as_ref().ok_or_else(|| err(not_open()))?;
            file.set_len(0).await.map_err(err)?;
            file.sync_data().await.map_err(err)?;
            return Ok((log, Replayed::Damaged { offset, reason }));
        }
        if log.end < len {
            tracing::info!(path = %path.display(), offset = log.end, bytes = len - log.end, "replica log: cutting off a record whose append never finished");
            let file = log.file.as_ref().ok_or_else(|| err(not_open()))?;
            file.set_len(log.end).await.map_err(err)?;
            file.sync_data().await.map_err(err)?;
        }
        if let Some(written) = log.state.kept_by
            && (written == 0 || written != mode.boot_tag)
        {
            // Any of its unsynced records may be gone, so later records
            // must not build on what it replays: started again empty.
            tracing::info!(path = %path.display(), written, now = mode.boot_tag, "replica log kept without a sync by an earlier machine boot: it vouches for nothing, and is started again empty");
            log.state = LogState::default();
            log.described = false;
            log.end = 0;
            let file = log.file.as_ref().ok_or_else(|| err(not_open()))?;
            file.set_len(0).await.map_err(err)?;
            file.sync_data().await.map_err(err)?;
            let now = mode.boot_tag;
            return Ok((log, Replayed::Stale { written, now }));
        }
        let replayed = if log.described {
            Replayed::Journal(log.state.journal_above(applied))
        } else {
            Replayed::Empty
        };
        Ok((log, replayed))
    }

    /// Bytes in the file.
    pub fn len_bytes(&self) -> u64 {
        self.end
    }

    /// Syncs made since open.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Writes what changed since the last record, `applied` being the
    /// core's applied op (ops at or below it are not compared: they stay
    /// logged until `recorded` passes them) and `recorded` the applied op
    /// a boot starts from. Returns whether it wrote (and synced); when it
    /// returns `Ok`, the log describes `logged`. Past [`COMPACT_BYTES`] the
    /// file is rewritten with only the ops above `recorded`.
    pub async fn record(
        &mut self,
        fs: &F,
        logged: &LoggedJournal,
        applied: u64,
        recorded: u64,
    ) -> Result<bool, ReplicaLogError> {
        let kept = self.state.ops.split_off(&recorded.saturating_add(1));
        self.state.ops = kept;
        let from_op = first_difference(&self.state.ops, &logged.ops, applied);
        if self.described && from_op.is_none() && self.state.same_meta(logged) {
            return Ok(false);
        }
        let from_op = from_op.unwrap_or_else(|| {
            logged
                .ops
                .last()
                .map_or(applied, |(h, _)| h.op.0)
                .max(applied)
                .saturating_add(1)
        });
        let record = Record {
            view: logged.view,
            log_view: logged.log_view,
            commit: logged.commit.0,
            cut_head: logged.cut_head.0,
            visible: logged.visible,
            kept_by: self.mode.record_tag(),
            from_op,
            entries: logged
                .ops
                .iter()
                .filter(|(h, _)| h.op.0 >= from_op)
                .cloned()
                .collect(),
        };
        let bytes = encode_record(&record);
        self.state.apply(record);
        self.described = true;
        if self.end + bytes.len() as u64 > COMPACT_BYTES {
            return self.compact(fs).await.map(|()| true);
        }
        self.append(fs, bytes).await?;
        Ok(true)
    }

    /// Appends `bytes` at the end and syncs them (unless the mode keeps
    /// records in the page cache).
    async fn append(&mut self, fs: &F, bytes: Vec<u8>) -> Result<(), ReplicaLogError> {
        let err = |source| ReplicaLogError {
            path: self.path.clone(),
            source,
        };
        if self.file.is_none() {
            let file = fs
                .open(&self.path, OpenOptions::read_write())
                .await
                .map_err(err)?;
            self.file = Some(file);
        }
        let file = self.file.as_ref().ok_or_else(|| err(not_open()))?;
        let len = bytes.len() as u64;
        let BufResult(res, _) = file.write_all_at(bytes, self.end).await;
        res.map_err(err)?;
        if self.mode.sync {
            file.sync_data().await.map_err(err)?;
            self.syncs += 1;
        }
        self.end += len;
        Ok(())
    }

    /// Closes the file; the next write opens it again. Every record is
    /// synced before its call returns, or kept in the page cache, which a
    /// close does not drop, so this is always safe.
    pub fn release_handle(&mut self) {
        self.file = None;
    }

    /// Whether the file is open.
    pub fn holds_handle(&self) -> bool {
        self.file.is_some()
    }

    /// Writes a record that vouches for nothing (not visible), keeping
    /// the ops, and syncs it. Called before a durable step that moves the
    /// recorded applied point to another history than the logged ops
    /// chain from (a state-transfer install, whose op's identity may be
    /// unknown): a crash after that step must not resume with ops the
    /// install replaced. The next [`Self::record`] vouches again for the
    /// core's journal as it then stands.
    pub async fn withdraw(&mut self, fs: &F) -> Result<(), ReplicaLogError> {
        if !self.state.visible && self.described {
            return Ok(());
        }
        let record = Record {
            view: self.state.view,
            log_view: self.state.log_view,
            commit: self.state.commit,
            cut_head: self.state.cut_head,
            visible: false,
            kept_by: self.mode.record_tag(),
            from_op: u64::MAX,
            entries: Vec::new(),
        };
        let bytes = encode_record(&record);
        self.state.apply(record);
        self.described = true;
        self.append(fs, bytes).await
    }

    /// Rewrites the file as one record of the current state.
    async fn compact(&mut self, fs: &F) -> Result<(), ReplicaLogError> {
        let err = |source| ReplicaLogError {
            path: self.path.clone(),
            source,
        };
        let record = Record {
            view: self.state.view,
            log_view: self.state.log_view,
            commit: self.state.commit,
            cut_head: self.state.cut_head,
            visible: self.state.visible,
            kept_by: None,
            from_op: 0,
            entries: self.state.ops.values().cloned().collect(),
        };
        let bytes = encode_record(&record);
        let len = bytes.len() as u64;
        replace_file_durably(fs, &self.path, bytes, SIBLING_SUFFIX)
            .await
            .map_err(err)?;
        self.file = Some(
            fs.open(&self.path, OpenOptions::read_write())
                .await
                .map_err(err)?,
        );
        self.end = len;
        self.syncs += 1;
        tracing::debug!(path = %self.path.display(), bytes = len, ops = self.state.ops.len(), "replica log compacted");
        Ok(())
    }
}

fn not_open() -> io::Error {
    io::Error::other("replica log file not open")
}

/// The lowest op above `applied` at which the log's ops and `logged`'s
/// differ (a header, or whether the body is held), if any.
fn first_difference(
    ops: &BTreeMap<u64, (PrepareHeader, Option<Prepare>)>,
    logged: &[(PrepareHeader, Option<Prepare>)],
    applied: u64,
) -> Option<u64> {
    let mut have = ops.range(applied.saturating_add(1)..).map(|(_, e)| e);
    let mut want = logged.iter().filter(|(h, _)| h.op.0 > applied);
    loop {
        match (have.next(), want.next()) {
            (None, None) => return None,
            (Some((h, _)), None) | (None, Some((h, _))) => return Some(h.op.0),
            (Some((a, ab)), Some((b, bb))) => {
                if a.op != b.op {
                    return Some(a.op.0.min(b.op.0));
                }
                if a != b || ab.is_some() != bb.is_some() {
                    return Some(a.op.0);
                }
            }
        }
    }
}

fn encode_record(record: &Record) -> Vec<u8> {
    let mut payload = Vec::with_capacity(
        RECORD_META_LEN
            + record
                .entries
                .iter()
                .map(|(_, b)| ENTRY_LEN_MIN + b.as_ref().map_or(0, |p| p.body.len()))
                .sum::<usize>(),
    );
    payload.extend_from_slice(&record.view.to_le_bytes());
    payload.extend_from_slice(&record.log_view.to_le_bytes());
    payload.extend_from_slice(&record.commit.to_le_bytes());
    payload.extend_from_slice(&record.cut_head.to_le_bytes());
    payload.push(u8::from(record.visible));
    payload.push(u8::from(record.kept_by.is_some()));
    payload.extend_from_slice(&[0; 6]);
    payload.extend_from_slice(&record.from_op.to_le_bytes());
    let count = u32::try_from(record.entries.len()).unwrap_or(u32::MAX);
    payload.extend_from_slice(&count.to_le_bytes());
    payload.extend_from_slice(&record.kept_by.unwrap_or(0).to_le_bytes());
    for (header, body) in &record.entries {
        encode_header(header, &mut payload);
        match body {
            Some(p) => {
                payload.push(1);
                let len = u32::try_from(p.body.len()).unwrap_or(u32::MAX);
                payload.extend_from_slice(&len.to_le_bytes());
                payload.extend_from_slice(&p.body);
            }
            None => {
                payload.push(0);
                payload.extend_from_slice(&[0; 4]);
            }
        }
    }
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&xxh3_64(&payload).to_le_bytes());
    let head = xxh3_64(&out);
    out.extend_from_slice(&head.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn encode_header(h: &PrepareHeader, out: &mut Vec<u8>) {
    out.extend_from_slice(&h.checksum.to_le_bytes());
    out.extend_from_slice(&h.checksum_body.to_le_bytes());
    out.extend_from_slice(&h.parent.to_le_bytes());
    out.extend_from_slice(&h.client.to_le_bytes());
    out.extend_from_slice(&h.request_checksum.to_le_bytes());
    out.extend_from_slice(&h.view.to_le_bytes());
    out.extend_from_slice(&h.op.0.to_le_bytes());
    out.extend_from_slice(&h.commit.0.to_le_bytes());
    out.extend_from_slice(&h.timestamp.to_le_bytes());
    out.extend_from_slice(&h.request.to_le_bytes());
    out.push(h.operation);
    out.extend_from_slice(&h.group.0.to_le_bytes());
    out.extend_from_slice(&h.user_id.to_le_bytes());
}

/// Reads fixed-size little-endian fields off the front of a slice; every
/// read is bounds-checked, so a short slice gives `None`.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|b| b.try_into().ok())
    }
    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    fn u128(&mut self) -> Option<u128> {
        self.array().map(u128::from_le_bytes)
    }
}

fn decode_header(r: &mut Reader<'_>) -> Option<PrepareHeader> {
    Some(PrepareHeader {
        checksum: r.u128()?,
        checksum_body: r.u128()?,
        parent: r.u128()?,
        client: r.u128()?,
        request_checksum: r.u128()?,
        view: r.u32()?,
        op: Op(r.u64()?),
        commit: Op(r.u64()?),
        timestamp: r.u64()?,
        request: r.u64()?,
        operation: r.u8()?,
        group: GroupId(r.u64()?),
        user_id: r.u32()?,
    })
}

enum Decoded {
    /// A record and its size in bytes.
    Whole(Record, usize),
    /// The bytes end inside a record whose header is intact.
    Unfinished,
    Damaged(RecordDamage),
}

fn decode_record(bytes: &[u8]) -> Decoded {
    let mut r = Reader { bytes };
    let (Some(magic), Some(len), Some(checksum), Some(head)) = (r.u32(), r.u32(), r.u64(), r.u64())
    else {
        return Decoded::Unfinished;
    };
    if xxh3_64(&bytes[..16]) != head {
        return Decoded::Damaged(RecordDamage::Header);
    }
    if magic != RECORD_MAGIC {
        return Decoded::Damaged(RecordDamage::Magic);
    }
    if len > RECORD_PAYLOAD_MAX {
        return Decoded::Damaged(RecordDamage::Length(len));
    }
    let Some(payload) = r.take(len as usize) else {
        return Decoded::Unfinished;
    };
    if xxh3_64(payload) != checksum {
        return Decoded::Damaged(RecordDamage::Checksum);
    }
    match decode_payload(payload) {
        Ok(record) => Decoded::Whole(record, RECORD_HEADER_LEN + payload.len()),
        Err(damage) => Decoded::Damaged(damage),
    }
}

fn decode_payload(payload: &[u8]) -> Result<Record, RecordDamage> {
    let mut r = Reader { bytes: payload };
    fn meta<T>(v: Option<T>) -> Result<T, RecordDamage> {
        v.ok_or(RecordDamage::Meta)
    }
    let view = meta(r.u32())?;
    let log_view = meta(r.u32())?;
    let commit = meta(r.u64())?;
    let cut_head = meta(r.u64())?;
    let visible = match meta(r.u8())? {
        0 => false,
        1 => true,
        _ => return Err(RecordDamage::Meta),
    };
    let kept = match meta(r.u8())? {
        0 => false,
        1 => true,
        _ => return Err(RecordDamage::Meta),
    };
    if meta(r.array::<6>())? != [0; 6] {
        return Err(RecordDamage::Meta);
    }
    let from_op = meta(r.u64())?;
    let count = meta(r.u32())?;
    let tag = meta(r.u32())?;
    if !kept && tag != 0 {
        return Err(RecordDamage::Meta);
    }
    let kept_by = kept.then_some(tag);
    // Checked against the bytes present before anything is allocated.
    if (count as usize).saturating_mul(ENTRY_LEN_MIN) > r.bytes.len() {
        return Err(RecordDamage::Meta);
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut below: Option<u64> = None;
    for index in 0..count {
        let bad = RecordDamage::Entry { index };
        let header = decode_header(&mut r).ok_or(bad)?;
        let flag = r.u8().ok_or(bad)?;
        let len = r.u32().ok_or(bad)? as usize;
        let op = header.op.0;
        if !header.verify() || op < from_op || below.is_some_and(|b| b >= op) {
            return Err(bad);
        }
        let body = match flag {
            0 if len == 0 => None,
            1 => {
                let body = r.take(len).ok_or(bad)?;
                if body_checksum(body) != header.checksum_body {
                    return Err(bad);
                }
                Some(Prepare {
                    header,
                    body: Bytes::copy_from_slice(body),
                })
            }
            _ => return Err(bad),
        };
        below = Some(op);
        entries.push((header, body));
    }
    if !r.bytes.is_empty() {
        return Err(RecordDamage::Meta);
    }
    Ok(Record {
        view,
        log_view,
        commit,
        cut_head,
        visible,
        kept_by,
        from_op,
        entries,
    })
}

#[cfg(test)]
mod tests;
