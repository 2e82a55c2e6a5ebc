//! The superblock: per consensus group, the durable `(view, log_view)`,
//! commit number and, on partitions, the applied point (`checkpoint_op`,
//! `checkpoint_checksum`) with the offset frontier after it.
//!
//! VSR's safety rests on a replica never answering a view change with a
//! state older than one it acted in, so the record must survive any crash
//! or torn write, and an unreadable record must refuse to start the group
//! rather than read as "fresh" (a silent reset to view 0 would let the
//! replica vote with `(0, 0)`).
//!
//! # Layout
//!
//! Two files per group directory, `superblock.a` and `superblock.b`, each
//! holding one record (little-endian):
//!
//! | offset | width | field |
//! |---|---|---|
//! | 0 | 4 | magic `0x5342_4C4B` ("SBLK" as a u32) |
//! | 4 | 2 | version = 1 |
//! | 6 | 2 | reserved = 0 |
//! | 8 | 8 | sequence |
//! | 16 | 8 | parent checksum (0, reserved) |
//! | 24 | 4 | payload length (≤ 4096) |
//! | 28 | len | payload: [`VsrState`] |
//! | 28 + len | 8 | xxh3-64 over every byte before it |
//!
//! # Write protocol and its crash windows
//!
//! Every write overwrites **both** copies in place, in a fixed order: slot A
//! is written and `fdatasync`ed, then slot B. The first write creates the
//! files and syncs the directory after each, so B exists only once A is
//! durable. Hence, once `write` returns, both copies hold the new record;
//! and at any moment at most one copy is being rewritten:
//!
//! - crash while A is in flight: A is old, new or torn; B still holds the
//!   last acknowledged record intact → reading yields it (or the new one);
//! - crash while B is in flight: A already holds the new record, synced →
//!   reading yields it;
//! - bit rot of one copy after a completed write: the other copy holds the
//!   same record → nothing regresses.
//!
//! Falling back to the surviving copy is therefore safe: the only record a
//! corrupt copy can hide is one whose write had not returned, which no
//! replica acted on. Two corrupt copies (a double fault) refuse to start the
//! group, with one exception the ordering makes safe: a torn A beside an
//! absent B can only be a first write that never returned, and reads as a
//! fresh group. Cost: two data syncs per write, against the floor of one — the
//! reference's temp-file-and-rename protocol costs two file syncs plus a
//! directory sync per write and keeps only one copy of the newest record.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use common::le_cursor::{LeCursor, Truncated, u64_at};
use common::{GroupId, Offset, Op, ReplicaId};
use consensus::vsr::Replica;
use storage::fs::{BufResult, Fs, FsFile, OpenOptions};
use xxhash_rust::xxh3::xxh3_64;

/// Magic that opens a superblock record ("SBLK" as a little-endian u32).
pub const SUPERBLOCK_MAGIC: u32 = 0x5342_4C4B;
/// The record version this code writes and reads.
pub const SUPERBLOCK_VERSION: u16 = 1;
/// The largest payload a record may carry.
pub const SUPERBLOCK_PAYLOAD_MAX: usize = 4096;
const RECORD_HEADER_LEN: usize = 28;
const RECORD_LEN_MAX: usize = RECORD_HEADER_LEN + SUPERBLOCK_PAYLOAD_MAX + 8;
/// File names of the two copies, in write order.
pub const SLOT_NAMES: [&str; 2] = ["superblock.a", "superblock.b"];

/// The durable consensus state of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VsrState {
    /// Cluster id (misplacement check).
    pub cluster: u128,
    /// This replica's index (misplacement check).
    pub replica_id: ReplicaId,
    /// Replicas in the cluster; quorums and primaries derive from it.
    pub replica_count: u8,
    /// The highest view this replica has entered.
    pub view: u32,
    /// The latest view in which this replica's log changed; ≤ `view`.
    pub log_view: u32,
    /// A lower bound on the group's commit number, for recovery.
    pub commit_max: Op,
    /// Metadata group: op of the paired snapshot. Partition groups: the
    /// applied point, the last op whose effects are durable (its batches
    /// synced in segments); a restart resumes applying after it.
    pub checkpoint_op: Op,
    /// Identity (header checksum) of op `checkpoint_op`, so the restarted
    /// replica's hash chain continues from it (0 when it is op 0).
    pub checkpoint_checksum: u128,
    /// Partition groups: the next message offset after op `checkpoint_op`
    /// (hence a durable lower bound of the next offset to mint). Always 0
    /// on the metadata group.
    pub offset_frontier: Offset,
}

/// Encoded length of [`VsrState`] in this version.
pub const VSR_STATE_LEN: usize = 66;
/// Encoded length of the previous version, before `offset_frontier`.
pub const VSR_STATE_LEN_V0: usize = 58;

/// The fields of the [`VsrState`] payload (module docs), each declared once
/// for the encoder and the decoder.
mod vsr_state {
    use common::le_cursor::{LeField, tiles};

    pub(super) const CLUSTER: LeField<u128> = LeField::at(0);
    pub(super) const REPLICA_ID: LeField<u8> = LeField::at(16);
    pub(super) const REPLICA_COUNT: LeField<u8> = LeField::at(17);
    pub(super) const VIEW: LeField<u32> = LeField::at(18);
    pub(super) const LOG_VIEW: LeField<u32> = LeField::at(22);
    pub(super) const COMMIT_MAX: LeField<u64> = LeField::at(26);
    pub(super) const CHECKPOINT_OP: LeField<u64> = LeField::at(34);
    pub(super) const CHECKPOINT_CHECKSUM: LeField<u128> = LeField::at(42);
    /// Absent from the previous version, which ends where it starts.
    pub(super) const OFFSET_FRONTIER: LeField<u64> = LeField::at(58);
    const _: () = assert!(OFFSET_FRONTIER.start() == super::VSR_STATE_LEN_V0);
    const _: () = assert!(tiles(
        super::VSR_STATE_LEN,
        &[
            CLUSTER.range(),
            REPLICA_ID.range(),
            REPLICA_COUNT.range(),
            VIEW.range(),
            LOG_VIEW.range(),
            COMMIT_MAX.range(),
            CHECKPOINT_OP.range(),
            CHECKPOINT_CHECKSUM.range(),
            OFFSET_FRONTIER.range(),
        ]
    ));
}

impl VsrState {
    /// The 66-byte payload.
    pub fn encode(&self) -> [u8; VSR_STATE_LEN] {
        let mut b = [0u8; VSR_STATE_LEN];
        vsr_state::CLUSTER.put(&mut b, self.cluster);
        vsr_state::REPLICA_ID.put(&mut b, self.replica_id.0);
        vsr_state::REPLICA_COUNT.put(&mut b, self.replica_count);
        vsr_state::VIEW.put(&mut b, self.view);
        vsr_state::LOG_VIEW.put(&mut b, self.log_view);
        vsr_state::COMMIT_MAX.put(&mut b, self.commit_max.0);
        vsr_state::CHECKPOINT_OP.put(&mut b, self.checkpoint_op.0);
        vsr_state::CHECKPOINT_CHECKSUM.put(&mut b, self.checkpoint_checksum);
        vsr_state::OFFSET_FRONTIER.put(&mut b, self.offset_frontier.0);
        b
    }

    /// Decodes a 66-byte payload, or a 58-byte one from before the offset
    /// frontier existed (the frontier then reads 0).
    pub fn decode(payload: &[u8]) -> Result<Self, SlotError> {
        if payload.len() != VSR_STATE_LEN && payload.len() != VSR_STATE_LEN_V0 {
            return Err(SlotError::PayloadLength { len: payload.len() });
        }
        // The previous version is this one without its last field, so
        // read through zeros there: its frontier is 0.
        let mut b = [0u8; VSR_STATE_LEN];
        b[..payload.len()].copy_from_slice(payload);
        let state = Self {
            cluster: vsr_state::CLUSTER.get(&b),
            replica_id: ReplicaId(vsr_state::REPLICA_ID.get(&b)),
            replica_count: vsr_state::REPLICA_COUNT.get(&b),
            view: vsr_state::VIEW.get(&b),
            log_view: vsr_state::LOG_VIEW.get(&b),
            commit_max: Op(vsr_state::COMMIT_MAX.get(&b)),
            checkpoint_op: Op(vsr_state::CHECKPOINT_OP.get(&b)),
            checkpoint_checksum: vsr_state::CHECKPOINT_CHECKSUM.get(&b),
            offset_frontier: Offset(vsr_state::OFFSET_FRONTIER.get(&b)),
        };
        if state.log_view > state.view {
            return Err(SlotError::LogViewAheadOfView {
                view: state.view,
                log_view: state.log_view,
            });
        }
        Ok(state)
    }
}

/// Encodes one record around `payload`.
///
/// # Panics
/// If the payload exceeds [`SUPERBLOCK_PAYLOAD_MAX`] (our own payloads are
/// fixed at 66 bytes).
pub fn encode_record(sequence: u64, payload: &[u8]) -> Vec<u8> {
    assert!(
        payload.len() <= SUPERBLOCK_PAYLOAD_MAX,
        "superblock payload too large"
    );
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len() + 8);
    out.extend_from_slice(&SUPERBLOCK_MAGIC.to_le_bytes());
    out.extend_from_slice(&SUPERBLOCK_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    // Lossless: bounded by the assertion above.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let checksum = xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// Decodes one record: `(sequence, payload)`.
pub fn decode_record(bytes: &[u8]) -> Result<(u64, &[u8]), SlotError> {
    if bytes.len() > RECORD_LEN_MAX {
        return Err(SlotError::TooLong { len: bytes.len() });
    }
    let mut c = LeCursor::new(bytes);
    let magic = c
        .u32()
        .map_err(|_| SlotError::Truncated { len: bytes.len() })?;
    if magic != SUPERBLOCK_MAGIC {
        return Err(SlotError::BadMagic { magic });
    }
    let version = c
        .u16()
        .map_err(|_| SlotError::Truncated { len: bytes.len() })?;
    if version != SUPERBLOCK_VERSION {
        return Err(SlotError::UnknownVersion { version });
    }
    let header = (|| -> Result<(u16, u64, u64, u32), Truncated> {
        Ok((c.u16()?, c.u64()?, c.u64()?, c.u32()?))
    })()
    .map_err(|_| SlotError::Truncated { len: bytes.len() })?;
    let (reserved, sequence, parent, payload_len) = header;
    let payload_len = payload_len as usize;
    if payload_len > SUPERBLOCK_PAYLOAD_MAX {
        return Err(SlotError::PayloadLength { len: payload_len });
    }
    let total = RECORD_HEADER_LEN + payload_len + 8;
    if bytes.len() < total {
        return Err(SlotError::Truncated { len: bytes.len() });
    }
    if bytes.len() > total {
        return Err(SlotError::TrailingBytes {
            extra: bytes.len() - total,
        });
    }
    // `bytes` is exactly `total` long, so the trailer is its last 8 bytes.
    let stored = bytes
        .last_chunk::<8>()
        .map_or(0, |trailer| u64_at(trailer, 0));
    let computed = xxh3_64(&bytes[..total - 8]);
    if stored != computed {
        return Err(SlotError::ChecksumMismatch { stored, computed });
    }
    // Checked after the checksum: a nonzero value in a sealed record is a
    // newer writer's field, not noise.
    if reserved != 0 || parent != 0 {
        return Err(SlotError::NonzeroReserved);
    }
    Ok((sequence, &bytes[RECORD_HEADER_LEN..total - 8]))
}

/// Why one copy of the superblock could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotError {
    /// The file is shorter than its record.
    Truncated {
        /// Bytes present.
        len: usize,
    },
    /// The file is longer than any record can be.
    TooLong {
        /// Bytes present.
        len: usize,
    },
    /// Bytes after the record.
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// Not a superblock record.
    BadMagic {
        /// The magic found.
        magic: u32,
    },
    /// Written by a version this code does not know (a downgrade).
    UnknownVersion {
        /// The version found.
        version: u16,
    },
    /// The record's checksum does not match.
    ChecksumMismatch {
        /// Stored checksum.
        stored: u64,
        /// Computed checksum.
        computed: u64,
    },
    /// Reserved fields are not zero.
    NonzeroReserved,
    /// The payload is not a [`VsrState`] of a known length.
    PayloadLength {
        /// The payload length.
        len: usize,
    },
    /// `log_view` is ahead of `view`: only corruption produces that.
    LogViewAheadOfView {
        /// The view.
        view: u32,
        /// The log view.
        log_view: u32,
    },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len } => write!(f, "record truncated at {len} bytes"),
            Self::TooLong { len } => write!(f, "{len} bytes is longer than any record"),
            Self::TrailingBytes { extra } => write!(f, "{extra} bytes after the record"),
            Self::BadMagic { magic } => write!(f, "bad magic {magic:#010x}"),
            Self::UnknownVersion { version } => write!(f, "unknown record version {version}"),
            Self::ChecksumMismatch { stored, computed } => write!(
                f,
                "checksum {stored:#018x} does not match the record ({computed:#018x})"
            ),
            Self::NonzeroReserved => f.write_str("reserved fields are not zero"),
            Self::PayloadLength { len } => write!(f, "payload of {len} bytes is not a VSR state"),
            Self::LogViewAheadOfView { view, log_view } => {
                write!(f, "log_view {log_view} is ahead of view {view}")
            }
        }
    }
}

/// A superblock that cannot be read or written.
#[derive(Debug)]
pub enum SuperblockError {
    /// Neither copy is usable (and at least one holds bytes): the group must
    /// not start, since any default would be older than what it acted on.
    Unreadable {
        /// The group directory.
        dir: PathBuf,
        /// Why copy A failed (`None`: absent).
        a: Option<SlotError>,
        /// Why copy B failed (`None`: absent).
        b: Option<SlotError>,
    },
    /// The shard's superblock table lost slots (both copies unusable) and
    /// holds no record of this group, which existed when it opened: the
    /// lost record may have been its own.
    TableSlotsLost {
        /// The shard directory holding the table.
        dir: PathBuf,
        /// The group.
        group: GroupId,
        /// How many slots were lost.
        lost: u32,
    },
    /// An I/O error on a superblock file.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for SuperblockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = |s: &Option<SlotError>| match s {
            Some(e) => e.to_string(),
            None => "absent".to_owned(),
        };
        match self {
            Self::Unreadable { dir, a, b } => write!(
                f,
                "no usable superblock in {}: copy a: {}; copy b: {}",
                dir.display(),
                slot(a),
                slot(b)
            ),
            Self::TableSlotsLost { dir, group, lost } => write!(
                f,
                "group {} has no record in the superblock table in {}, which lost {lost} slot(s) in both copies; one may have been this group's",
                group.0,
                dir.display()
            ),
            Self::Io { path, source } => {
                write!(f, "superblock I/O on {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for SuperblockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Unreadable { .. } | Self::TableSlotsLost { .. } => None,
        }
    }
}

/// Where a group's [`VsrState`] is kept. `write` is durable when it returns
/// `Ok`; a crash during it never loses the previous record.
#[allow(async_fn_in_trait)] // thread-per-core: futures never cross threads.
pub trait SuperblockStore {
    /// The newest record, `None` for a group that never wrote one.
    async fn read_latest(&mut self) -> Result<Option<VsrState>, SuperblockError>;
    /// Makes `state` the durable record.
    async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError>;
}

/// An in-memory store for tests and for single-process harnesses; "durable"
/// means "kept by this value".
#[derive(Debug, Clone, Default)]
pub struct MemSuperblock {
    state: Option<VsrState>,
    writes: u64,
}

impl MemSuperblock {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many writes succeeded.
    pub const fn writes(&self) -> u64 {
        self.writes
    }
}

impl SuperblockStore for MemSuperblock {
    async fn read_latest(&mut self) -> Result<Option<VsrState>, SuperblockError> {
        Ok(self.state)
    }

    async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        self.state = Some(*state);
        self.writes += 1;
        Ok(())
    }
}

/// The two-copy file store described in the module documentation.
pub struct FileSuperblock<F: Fs> {
    fs: F,
    dir: PathBuf,
    paths: [PathBuf; 2],
    /// Whether both names are known to be durable in the directory.
    names_durable: bool,
    next_sequence: u64,
}

impl<F: Fs> fmt::Debug for FileSuperblock<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileSuperblock")
            .field("dir", &self.dir)
            .field("next_sequence", &self.next_sequence)
            .finish_non_exhaustive()
    }
}

fn io_error(path: &Path, source: io::Error) -> SuperblockError {
    SuperblockError::Io {
        path: path.to_path_buf(),
        source,
    }
}

enum SlotRead {
    Absent,
    Valid { sequence: u64, state: VsrState },
    Corrupt(SlotError),
}

impl<F: Fs> FileSuperblock<F> {
    /// A store for the group directory `dir` (which must exist). Nothing is
    /// read until [`SuperblockStore::read_latest`].
    pub fn new(fs: F, dir: &Path) -> Self {
        Self {
            fs,
            dir: dir.to_path_buf(),
            paths: SLOT_NAMES.map(|n| dir.join(n)),
            names_durable: false,
            next_sequence: 1,
        }
    }

    async fn read_slot(&self, index: usize) -> Result<SlotRead, SuperblockError> {
        let path = &self.paths[index];
        let file = match self.fs.open(path, OpenOptions::read_only()).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SlotRead::Absent),
            Err(e) => return Err(io_error(path, e)),
        };
        let len = file.len().await.map_err(|e| io_error(path, e))?;
        if len == 0 {
            return Ok(SlotRead::Absent);
        }
        // Bounded before allocating: a record cannot be longer than this.
        if len > RECORD_LEN_MAX as u64 {
            return Ok(SlotRead::Corrupt(SlotError::TooLong {
                len: usize::try_from(len).unwrap_or(usize::MAX),
            }));
        }
        let bytes = file
            .read_exact_at(len as usize, 0)
            .await
            .map_err(|e| io_error(path, e))?;
        Ok(
            match decode_record(&bytes).and_then(|(sequence, payload)| {
                VsrState::decode(payload).map(|state| (sequence, state))
            }) {
                Ok((sequence, state)) => SlotRead::Valid { sequence, state },
                Err(e) => SlotRead::Corrupt(e),
            },
        )
    }

    /// Writes `record` as slot `index`'s whole content and syncs it. The
    /// file is opened for the write and closed after it: a group writes its
    /// superblock only at view changes and applied-point records, and two
    /// descriptors held for each of thousands of idle groups would spend
    /// half of a process's descriptor budget (docs/architecture.md).
    async fn write_slot(&self, index: usize, record: Vec<u8>) -> Result<(), SuperblockError> {
        let path = &self.paths[index];
        let record_len = record.len() as u64;
        let file = self
            .fs
            .open(path, OpenOptions::create_read_write())
            .await
            .map_err(|e| io_error(path, e))?;
        let result = async {
            let BufResult(res, _) = file.write_all_at(record, 0).await;
            res?;
            if file.len().await? != record_len {
                file.set_len(record_len).await?;
            }
            file.sync_data().await
        }
        .await;
        result.map_err(|e| io_error(path, e))
    }
}

impl<F: Fs> SuperblockStore for FileSuperblock<F> {
    async fn read_latest(&mut self) -> Result<Option<VsrState>, SuperblockError> {
        let a = self.read_slot(0).await?;
        let b = self.read_slot(1).await?;
        let pick = match (&a, &b) {
            (SlotRead::Absent, SlotRead::Absent) => None,
            (
                SlotRead::Valid {
                    sequence: sa,
                    state: a,
                },
                SlotRead::Valid {
                    sequence: sb,
                    state: b,
                },
            ) => Some(if sb > sa { (*sb, *b) } else { (*sa, *a) }),
            (SlotRead::Valid { sequence, state }, other)
            | (other, SlotRead::Valid { sequence, state }) => {
                if let SlotRead::Corrupt(e) = other {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        error = %e,
                        "one superblock copy is unusable; using the other, the next write repairs it"
                    );
                }
                Some((*sequence, *state))
            }
            (SlotRead::Corrupt(e), SlotRead::Absent) => {
                // B is created only after A's name and content are durable,
                // and every completed write leaves both valid: a corrupt A
                // beside no B is a first write that never returned (short
                // of a double fault: B unlinked and A rotted).
                tracing::warn!(
                    dir = %self.dir.display(),
                    error = %e,
                    "superblock copy a is torn and copy b absent: the first write never completed; starting fresh"
                );
                None
            }
            _ => {
                let why = |s: &SlotRead| match s {
                    SlotRead::Corrupt(e) => Some(*e),
                    _ => None,
                };
                return Err(SuperblockError::Unreadable {
                    dir: self.dir.clone(),
                    a: why(&a),
                    b: why(&b),
                });
            }
        };
        // Both names exist on disk only if both slots held bytes; otherwise
        // the next write must make the names durable again.
        self.names_durable = !matches!(a, SlotRead::Absent) && !matches!(b, SlotRead::Absent);
        Ok(pick.map(|(sequence, state)| {
            self.next_sequence = sequence + 1;
            state
        }))
    }

    async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        let record = encode_record(self.next_sequence, &state.encode());
        // A before B, each synced before the next starts: at most one copy
        // is ever in flight, so the other holds an acknowledged record.
        // Until both names are durable (the first write), the directory is
        // synced after each copy, so that B can exist only once A's name
        // and content are durable: a torn A beside an absent B then proves
        // the first write never completed (see `read_latest`).
        for slot in 0..2 {
            self.write_slot(slot, record.clone()).await?;
            if !self.names_durable {
                self.fs
                    .sync_dir(&self.dir)
                    .await
                    .map_err(|e| io_error(&self.dir, e))?;
            }
        }
        self.names_durable = true;
        self.next_sequence += 1;
        Ok(())
    }
}

/// A group's superblock together with what it durably holds, and the
/// operations the planes need: persist a view before acting in it, and move
/// the offset frontier — up only, except by a recorded purge.
#[derive(Debug)]
pub struct Superblock<S> {
    store: S,
    durable: VsrState,
}

impl<S: SuperblockStore> Superblock<S> {
    /// Opens the store. A group that never wrote a record starts from
    /// `initial` (its identity fields set, everything else 0), which is
    /// written at once so that "no record" cannot recur once acted on.
    pub async fn open(mut store: S, initial: VsrState) -> Result<Self, SuperblockError> {
        match store.read_latest().await? {
            Some(durable) => Ok(Self { store, durable }),
            None => {
                store.write(&initial).await?;
                Ok(Self {
                    store,
                    durable: initial,
                })
            }
        }
    }

    /// What the store durably holds.
    pub const fn state(&self) -> &VsrState {
        &self.durable
    }

    /// The underlying store.
    pub const fn store(&self) -> &S {
        &self.store
    }

    async fn write(&mut self, next: VsrState) -> Result<(), SuperblockError> {
        if next == self.durable {
            return Ok(());
        }
        self.store.write(&next).await?;
        // Record what was written, never a re-read of live state that may
        // have moved during the await.
        self.durable = next;
        Ok(())
    }

    /// Makes `(view, log_view)` and the commit bound durable. Views never
    /// move backwards: lower values than the durable ones are kept at the
    /// durable ones (a caller bug, asserted in debug builds).
    pub async fn persist_view(
        &mut self,
        view: u32,
        log_view: u32,
        commit_max: Op,
    ) -> Result<(), SuperblockError> {
        debug_assert!(log_view <= view, "log_view {log_view} ahead of view {view}");
        debug_assert!(view >= self.durable.view, "view moved backwards");
        let next = VsrState {
            view: view.max(self.durable.view),
            log_view: log_view
                .max(self.durable.log_view)
                .min(view.max(self.durable.view)),
            commit_max: commit_max.max(self.durable.commit_max),
            ..self.durable
        };
        self.write(next).await
    }

    /// Makes `replica`'s current view, log view and commit bound durable,
    /// then tells it the write finished with exactly those values
    /// ([`Replica::on_persisted`]): what a driver does to retry a failed
    /// `PersistState`, when the core may have moved on since.
    pub async fn persist_replica_view(
        &mut self,
        replica: &mut Replica,
    ) -> Result<(), SuperblockError> {
        let (view, log_view) = (replica.view(), replica.log_view());
        self.persist_view(view, log_view, replica.commit_max())
            .await?;
        replica.on_persisted(view, log_view);
        Ok(())
    }

    /// Records the offset frontier as an advance: the durable value becomes
    /// `max(frontier, durable)`, never lower. Returns the durable frontier.
    pub async fn advance_offset_frontier(
        &mut self,
        frontier: Offset,
    ) -> Result<Offset, SuperblockError> {
        let next = VsrState {
            offset_frontier: frontier.max(self.durable.offset_frontier),
            ..self.durable
        };
        self.write(next).await?;
        Ok(self.durable.offset_frontier)
    }

    /// Records a partition's applied point: op `op` (identity `checksum`)
    /// is applied and everything it implies is durable, and the next offset
    /// after it is `offset_frontier`. The three fields are written in one
    /// record, so a crash leaves the old triple or the new one. An `op` at
    /// or below the durable `checkpoint_op` changes nothing (the applied
    /// point never moves back here; see [`Self::reset_applied`]). Between
    /// purges the frontier only grows with the op, so it is kept at least
    /// the durable one (a lower bound).
    pub async fn record_applied(
        &mut self,
        op: Op,
        checksum: u128,
        offset_frontier: Offset,
    ) -> Result<(), SuperblockError> {
        if op <= self.durable.checkpoint_op {
            return Ok(());
        }
        debug_assert!(
            offset_frontier >= self.durable.offset_frontier,
            "frontier {offset_frontier} below the durable {}",
            self.durable.offset_frontier
        );
        let next = VsrState {
            checkpoint_op: op,
            checkpoint_checksum: checksum,
            offset_frontier: offset_frontier.max(self.durable.offset_frontier),
            ..self.durable
        };
        self.write(next).await
    }

    /// Records the applied point as exactly `(op, checksum, offset_frontier)`
    /// (a purge restarting offsets, an install): the only way the frontier
    /// may move down or the applied point move back.
    pub async fn reset_applied(
        &mut self,
        op: Op,
        checksum: u128,
        offset_frontier: Offset,
    ) -> Result<(), SuperblockError> {
        let next = VsrState {
            checkpoint_op: op,
            checkpoint_checksum: checksum,
            offset_frontier,
            ..self.durable
        };
        self.write(next).await
    }

    /// Records the offset frontier as a reset to exactly `frontier` (a purge
    /// restarting offsets, or an install under an advancing purge). The only
    /// way the durable frontier moves down.
    pub async fn reset_offset_frontier(&mut self, frontier: Offset) -> Result<(), SuperblockError> {
        let next = VsrState {
            offset_frontier: frontier,
            ..self.durable
        };
        self.write(next).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> VsrState {
        VsrState {
            cluster: 0xC1,
            replica_id: ReplicaId(1),
            replica_count: 3,
            view: 7,
            log_view: 6,
            commit_max: Op(100),
            checkpoint_op: Op(0),
            checkpoint_checksum: 0,
            offset_frontier: Offset(12_345),
        }
    }

    #[test]
    fn given_state_when_encoded_should_round_trip_and_match_layout() {
        let s = state();
        let b = s.encode();
        assert_eq!(&b[18..22], &7u32.to_le_bytes());
        assert_eq!(&b[58..66], &12_345u64.to_le_bytes());
        assert_eq!(VsrState::decode(&b), Ok(s));
    }

    #[test]
    fn given_legacy_58_byte_payload_when_decoded_should_read_frontier_zero() {
        let b = state().encode();
        let legacy = VsrState::decode(&b[..VSR_STATE_LEN_V0]).expect("legacy decodes");
        assert_eq!(legacy.offset_frontier, Offset(0));
        assert_eq!(legacy.view, 7);
    }

    #[test]
    fn given_other_payload_lengths_or_log_view_ahead_when_decoded_should_reject() {
        let b = state().encode();
        for len in [0, 57, 59, 65, 67] {
            let mut v = b.to_vec();
            v.resize(len, 0);
            assert_eq!(VsrState::decode(&v), Err(SlotError::PayloadLength { len }));
        }
        let ahead = VsrState {
            log_view: 8,
            ..state()
        };
        assert_eq!(
            VsrState::decode(&ahead.encode()),
            Err(SlotError::LogViewAheadOfView {
                view: 7,
                log_view: 8
            })
        );
    }

    #[test]
    fn given_record_when_encoded_should_round_trip() {
        let payload = state().encode();
        let r = encode_record(9, &payload);
        assert_eq!(r.len(), 28 + 66 + 8);
        assert_eq!(&r[..4], &SUPERBLOCK_MAGIC.to_le_bytes());
        assert_eq!(decode_record(&r), Ok((9, &payload[..])));
    }

    #[test]
    fn given_every_strict_prefix_or_flipped_bit_when_decoded_should_reject() {
        let r = encode_record(3, &state().encode());
        for len in 0..r.len() {
            assert!(decode_record(&r[..len]).is_err(), "prefix {len}");
        }
        for bit in 0..r.len() * 8 {
            let mut f = r.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            let decoded = decode_record(&f).and_then(|(_, p)| VsrState::decode(p));
            assert!(decoded.is_err(), "bit {bit}");
        }
        let mut long = r.clone();
        long.push(0);
        assert_eq!(
            decode_record(&long),
            Err(SlotError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn given_unknown_version_or_magic_when_decoded_should_name_it() {
        let mut r = encode_record(3, &state().encode());
        r[4] = 2;
        assert_eq!(
            decode_record(&r),
            Err(SlotError::UnknownVersion { version: 2 })
        );
        r[0] = 0;
        assert!(matches!(decode_record(&r), Err(SlotError::BadMagic { .. })));
    }

    #[test]
    fn given_payload_length_past_ceiling_when_decoded_should_reject_before_reading() {
        let mut r = encode_record(3, &state().encode());
        r[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_record(&r),
            Err(SlotError::PayloadLength {
                len: u32::MAX as usize
            })
        );
    }
}
