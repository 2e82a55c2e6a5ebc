//! One superblock table per shard: every partition group's [`VsrState`] in
//! fixed slots of two shared files, written in batches.
//!
//! A group's own two-copy superblock ([`crate::FileSuperblock`]) costs two
//! data syncs per record, so a view change of every group on a shard —
//! each group persisting its view, then its log view — is four syncs per
//! group, one group after another. Here the groups of a shard share two
//! files, and every record waiting when a batch starts is written in it:
//! the slots of copy A, one sync, the same slots of copy B, one sync. A
//! view change of a thousand groups whose records wait together costs a
//! few syncs, not thousands.
//!
//! # Layout
//!
//! `superblocks.a` and `superblocks.b` in the shard's directory, each an
//! array of [`TABLE_SLOT_LEN`]-byte slots; slot `i` is at `i × 128` in both.
//! A slot is all zeros (free) or one record (little-endian):
//!
//! | offset | width | field |
//! |---|---|---|
//! | 0 | 4 | magic `"SBTB"` |
//! | 4 | 2 | version = 1 |
//! | 6 | 2 | payload length (66) |
//! | 8 | 8 | group id |
//! | 16 | 8 | group incarnation |
//! | 24 | 8 | sequence (per group, grows with every record) |
//! | 32 | len | payload: [`VsrState`] |
//! | … | | zeros up to 120 |
//! | 120 | 8 | xxh3-64 over bytes 0..120 |
//!
//! The incarnation is the group's (`GroupSpec::incarnation`), never reused
//! after a delete: a record left by a deleted group can never be read as
//! a later group's of the same id.
//!
//! # Batches and their crash windows
//!
//! A batch writes its slots in copy A and syncs A, then the same slots in
//! copy B and syncs B; no slot is rewritten while a batch is in flight, and
//! the next batch starts only when this one ended. So, for every slot, at
//! any moment at most one copy is being rewritten and the other holds the
//! last record whose write returned — the per-group protocol's argument,
//! slot by slot:
//!
//! - both copies valid and of one group: the higher sequence wins (a crash
//!   between the copies leaves A newer);
//! - one valid, the other torn, zero, or rotted: the valid one;
//! - a record in one copy and zeros in the other: a first write torn after
//!   A, or a free torn after A — the record if it is whole, otherwise the
//!   slot is free (no write of it returned);
//! - neither copy usable and neither zero: a double fault. Whose record it
//!   was is unknowable, so the table counts it as lost, and a group that
//!   existed at boot with no record refuses to start (a silent fresh start
//!   would let it vote with view 0).
//!
//! The table repairs what it can as it opens, in one batch before it
//! serves: a record found whole in one copy only is written to both again,
//! and a free slot with torn bytes in one copy is zeroed, so a second fault
//! later meets a whole copy.
//!
//! A freed slot (zeros in both copies, durable) is reused only after its
//! free returned, so a slot never holds two groups' records at once; two
//! valid copies of different groups are corruption and count as lost.
//!
//! # Group commit
//!
//! Writers queue their slot and wait. The first waiter that finds no batch
//! in flight runs one: it yields once (so the writers of the same step
//! queue beside it), takes everything queued, writes and syncs, and wakes
//! every waiter; a waiter whose record missed the batch runs the next one.
//! On a simulated disk every call completes at once, so batches hold one
//! record each and runs stay exactly as deterministic as before.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Poll, Waker};

use common::GroupId;
use common::le_cursor::{LeField, tiles};
use storage::fs::{BufResult, Fs, FsFile, OpenOptions};
use xxhash_rust::xxh3::xxh3_64;

use crate::superblock::{SuperblockError, SuperblockStore, VSR_STATE_LEN, VsrState};

/// File names of the two copies, in write order.
pub const TABLE_NAMES: [&str; 2] = ["superblocks.a", "superblocks.b"];
/// Bytes per slot.
pub const TABLE_SLOT_LEN: usize = 128;
/// The most slots a table holds (a shard's groups, with room for the
/// slots deletes left free); 32 MiB per copy.
pub const TABLE_SLOTS_MAX: u32 = 1 << 18;
/// "SBTB" as a little-endian u32.
const TABLE_MAGIC: u32 = u32::from_le_bytes(*b"SBTB");
const TABLE_VERSION: u16 = 1;

// The fields of a slot (module docs), each declared once for the encoder
// and the decoder.
const MAGIC: LeField<u32> = LeField::at(0);
const VERSION: LeField<u16> = LeField::at(4);
const PAYLOAD_LEN: LeField<u16> = LeField::at(6);
const GROUP: LeField<u64> = LeField::at(8);
const INCARNATION: LeField<u64> = LeField::at(16);
const SEQUENCE: LeField<u64> = LeField::at(24);
const PAYLOAD_AT: usize = SEQUENCE.end();
/// xxh3-64 of every byte before it.
const CHECKSUM: LeField<u64> = LeField::at(TABLE_SLOT_LEN - 8);
const PAYLOAD_LEN_MAX: usize = CHECKSUM.start() - PAYLOAD_AT;
const _: () = assert!(tiles(
    TABLE_SLOT_LEN,
    &[
        MAGIC.range(),
        VERSION.range(),
        PAYLOAD_LEN.range(),
        GROUP.range(),
        INCARNATION.range(),
        SEQUENCE.range(),
        PAYLOAD_AT..CHECKSUM.start(),
        CHECKSUM.range(),
    ]
));

/// Whose record a slot holds: a group and its incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableKey {
    /// The consensus group.
    pub group: GroupId,
    /// The group's incarnation (never reused after a delete).
    pub incarnation: u64,
}

/// What a table has done since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Batches written (each: two syncs).
    pub batches: u64,
    /// Records and frees written, over all batches.
    pub slot_writes: u64,
    /// The most slots one batch wrote.
    pub batch_max: u64,
    /// Batches that failed (every waiter in them saw the error).
    pub failed: u64,
}

/// One slot of one copy, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotRead {
    Zero,
    Valid {
        key: TableKey,
        sequence: u64,
        state: VsrState,
    },
    Corrupt,
}

fn encode_slot(key: TableKey, sequence: u64, state: &VsrState) -> [u8; TABLE_SLOT_LEN] {
    let mut b = [0u8; TABLE_SLOT_LEN];
    MAGIC.put(&mut b, TABLE_MAGIC);
    VERSION.put(&mut b, TABLE_VERSION);
    // Lossless: 66 fits a u16.
    PAYLOAD_LEN.put(&mut b, VSR_STATE_LEN as u16);
    GROUP.put(&mut b, key.group.0);
    INCARNATION.put(&mut b, key.incarnation);
    SEQUENCE.put(&mut b, sequence);
    b[PAYLOAD_AT..PAYLOAD_AT + VSR_STATE_LEN].copy_from_slice(&state.encode());
    let checksum = xxh3_64(&b[..CHECKSUM.start()]);
    CHECKSUM.put(&mut b, checksum);
    b
}

/// Reads one slot; `bytes` shorter than a slot (a torn extension of the
/// file) is corrupt unless it is all zeros.
fn decode_slot(bytes: &[u8]) -> SlotRead {
    if bytes.iter().all(|b| *b == 0) {
        return SlotRead::Zero;
    }
    let Ok(slot) = <&[u8; TABLE_SLOT_LEN]>::try_from(bytes) else {
        return SlotRead::Corrupt;
    };
    if CHECKSUM.get(slot) != xxh3_64(&slot[..CHECKSUM.start()]) {
        return SlotRead::Corrupt;
    }
    let magic = MAGIC.get(slot);
    let version = VERSION.get(slot);
    let len = usize::from(PAYLOAD_LEN.get(slot));
    if magic != TABLE_MAGIC || version != TABLE_VERSION || len > PAYLOAD_LEN_MAX {
        return SlotRead::Corrupt;
    }
    // Padding after the payload is zero in every record this code writes.
    if slot[PAYLOAD_AT + len..CHECKSUM.start()]
        .iter()
        .any(|b| *b != 0)
    {
        return SlotRead::Corrupt;
    }
    match VsrState::decode(&slot[PAYLOAD_AT..PAYLOAD_AT + len]) {
        Ok(state) => SlotRead::Valid {
            key: TableKey {
                group: GroupId(GROUP.get(slot)),
                incarnation: INCARNATION.get(slot),
            },
            sequence: SEQUENCE.get(slot),
            state,
        },
        Err(_) => SlotRead::Corrupt,
    }
}

/// What one slot index holds, both copies considered (module docs).
fn combine(a: SlotRead, b: SlotRead) -> Combined {
    use SlotRead::{Corrupt, Valid, Zero};
    match (a, b) {
        (
            Valid {
                key: ka,
                sequence: sa,
                state: a,
            },
            Valid {
                key: kb,
                sequence: sb,
                state: b,
            },
        ) => {
            if ka != kb {
                Combined::Lost
            } else if sb > sa {
                Combined::Record {
                    key: kb,
                    sequence: sb,
                    state: b,
                    damaged: false,
                }
            } else {
                Combined::Record {
                    key: ka,
                    sequence: sa,
                    state: a,
                    damaged: false,
                }
            }
        }
        (
            Valid {
                key,
                sequence,
                state,
            },
            other,
        )
        | (
            other,
            Valid {
                key,
                sequence,
                state,
            },
        ) => Combined::Record {
            key,
            sequence,
            state,
            damaged: other == Corrupt,
        },
        (Zero | Corrupt, Zero) | (Zero, Corrupt) => Combined::Free,
        (Corrupt, Corrupt) => Combined::Lost,
    }
}

enum Combined {
    Free,
    Record {
        key: TableKey,
        sequence: u64,
        state: VsrState,
        /// One copy is unusable (the next write of the slot repairs it).
        damaged: bool,
    },
    Lost,
}

/// A waiter's share of a batch: its outcome once the batch ended.
#[derive(Default)]
struct Ticket {
    outcome: Cell<Option<Result<(), (io::ErrorKind, String)>>>,
}

/// A slot queued for the next batch.
struct Queued {
    bytes: [u8; TABLE_SLOT_LEN],
    /// The record it carries (`None`: a free).
    record: Option<(TableKey, VsrState)>,
    tickets: Vec<Rc<Ticket>>,
}

impl Queued {
    /// Zeroes for the slot: a free, nobody waiting.
    fn free() -> Self {
        Self {
            bytes: [0; TABLE_SLOT_LEN],
            record: None,
            tickets: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    index: u32,
    next_sequence: u64,
    state: Option<VsrState>,
}

#[derive(Default)]
struct Inner {
    entries: BTreeMap<TableKey, Entry>,
    /// Slots whose zeros are durable in both copies.
    free: BTreeSet<u32>,
    /// Slots below this index exist (or are being written).
    high_water: u32,
    queued: BTreeMap<u32, Queued>,
    writing: bool,
    wakers: Vec<Waker>,
    lost: u32,
    stats: TableStats,
}

/// The shard's superblock table (module docs). Single-threaded: shared by
/// the groups of one shard through `Rc`.
pub struct SuperblockTable<F: Fs> {
    fs: F,
    dir: PathBuf,
    paths: [PathBuf; 2],
    files: [F::File; 2],
    inner: RefCell<Inner>,
}

impl<F: Fs> fmt::Debug for SuperblockTable<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.borrow();
        f.debug_struct("SuperblockTable")
            .field("dir", &self.dir)
            .field("records", &inner.entries.len())
            .field("lost", &inner.lost)
            .finish_non_exhaustive()
    }
}

/// Opens both copies in `dir`, creating a missing one durably (copy A
/// before copy B), and reads the existing ones whole.
async fn open_copies<F: Fs>(
    fs: &F,
    dir: &Path,
    paths: &[PathBuf; 2],
) -> Result<([F::File; 2], [Vec<u8>; 2]), SuperblockError> {
    let mut contents: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut opened = Vec::with_capacity(2);
    for (copy, path) in paths.iter().enumerate() {
        let existed = fs.exists(path).await.map_err(|e| io_error(path, e))?;
        let file = fs
            .open(path, OpenOptions::create_read_write())
            .await
            .map_err(|e| io_error(path, e))?;
        if existed {
            let ceiling = u64::from(TABLE_SLOTS_MAX) * TABLE_SLOT_LEN as u64;
            contents[copy] = file
                .read_to_end_bounded(ceiling)
                .await
                .map_err(|e| io_error(path, e))?;
        } else {
            file.sync_all().await.map_err(|e| io_error(path, e))?;
            fs.sync_dir(dir).await.map_err(|e| io_error(dir, e))?;
        }
        opened.push(file);
    }
    let Ok(files) = <[F::File; 2]>::try_from(opened) else {
        unreachable!("two copies opened");
    };
    Ok((files, contents))
}

impl Inner {
    /// Takes slot `index`'s record of `key` into the table. A record with
    /// one copy `damaged` is queued to be written again, to both copies,
    /// before the table serves, so a second fault on the other copy finds
    /// a whole one. A key found in two slots (never written so: one slot
    /// per key while it lives) leaves both unused.
    fn take_record(
        &mut self,
        dir: &Path,
        index: u32,
        key: TableKey,
        sequence: u64,
        state: VsrState,
        damaged: bool,
    ) {
        let mut entry = Entry {
            index,
            next_sequence: sequence.saturating_add(1),
            state: Some(state),
        };
        if damaged {
            self.queued.insert(
                index,
                Queued {
                    bytes: encode_slot(key, entry.next_sequence, &state),
                    record: Some((key, state)),
                    tickets: Vec::new(),
                },
            );
            entry.next_sequence = entry.next_sequence.saturating_add(1);
        }
        if let Some(other) = self.entries.insert(key, entry) {
            tracing::error!(
                dir = %dir.display(),
                group = %key.group,
                slots = ?(other.index, index),
                "superblock table holds one group in two slots; both left unused"
            );
            self.entries.remove(&key);
            self.lost += 2;
        }
    }
}

/// The table as the two copies' bytes describe it, slot by slot: records,
/// free slots, slots to repair, and lost ones.
fn read_slots(dir: &Path, contents: &[Vec<u8>; 2]) -> Inner {
    let mut inner = Inner::default();
    let slots = contents[0]
        .len()
        .max(contents[1].len())
        .div_ceil(TABLE_SLOT_LEN);
    let slot_of = |copy: &[u8], i: usize| -> SlotRead {
        let start = i * TABLE_SLOT_LEN;
        if start >= copy.len() {
            return SlotRead::Zero;
        }
        decode_slot(&copy[start..(start + TABLE_SLOT_LEN).min(copy.len())])
    };
    let mut damaged = 0u32;
    for i in 0..slots {
        // Bounded by the ceiling on the file's length above.
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let copies = (slot_of(&contents[0], i), slot_of(&contents[1], i));
        match combine(copies.0, copies.1) {
            Combined::Free if copies == (SlotRead::Zero, SlotRead::Zero) => {
                inner.free.insert(index);
            }
            // Zeros beside a torn copy: zeroed again (with the first
            // batch) before the slot is handed out, so that a torn
            // first write of its next owner cannot sit beside the old
            // torn bytes and read as a lost slot.
            Combined::Free => {
                inner.queued.insert(index, Queued::free());
            }
            Combined::Record {
                key,
                sequence,
                state,
                damaged: d,
            } => {
                damaged += u32::from(d);
                inner.take_record(dir, index, key, sequence, state, d);
            }
            Combined::Lost => inner.lost += 1,
        }
    }
    inner.high_water = u32::try_from(slots).unwrap_or(u32::MAX);
    if damaged > 0 || inner.lost > 0 {
        tracing::warn!(
            dir = %dir.display(),
            damaged,
            lost = inner.lost,
            "superblock table slots unusable in one copy (repaired by their next write) or in both (lost)"
        );
    }
    inner
}

fn io_error(path: &Path, source: io::Error) -> SuperblockError {
    SuperblockError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl<F: Fs> SuperblockTable<F> {
    /// Opens (or creates) the table in the shard directory `dir`, which
    /// must exist. Copy A is created and made durable before copy B, so a
    /// B beside no A means A was removed by something other than us.
    pub async fn open(fs: F, dir: &Path) -> Result<Self, SuperblockError> {
        let paths = TABLE_NAMES.map(|n| dir.join(n));
        let (files, contents) = open_copies(&fs, dir, &paths).await?;
        let inner = read_slots(dir, &contents);
        let table = Self {
            fs,
            dir: dir.to_path_buf(),
            paths,
            files,
            inner: RefCell::new(inner),
        };
        // Repairs: damaged records rewritten, torn free slots zeroed. If
        // the batch fails, the zeroing is queued again and each record is
        // repaired by its group's next write.
        if !table.inner.borrow().queued.is_empty() {
            table.run_batch().await;
            if table.inner.borrow().stats.failed > 0 {
                tracing::warn!(dir = %table.dir.display(), "superblock table repair at open failed; each damaged record is repaired by its next write");
            }
        }
        Ok(table)
    }

    /// The directory the table lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The keys that hold a record.
    pub fn keys(&self) -> Vec<TableKey> {
        self.inner.borrow().entries.keys().copied().collect()
    }

    /// The record of `key`, if it has one.
    pub fn state(&self, key: TableKey) -> Option<VsrState> {
        self.inner.borrow().entries.get(&key).and_then(|e| e.state)
    }

    /// Slots unusable in both copies at open: records that may have been
    /// any group's.
    pub fn lost(&self) -> u32 {
        self.inner.borrow().lost
    }

    /// What the table has done since it opened.
    pub fn stats(&self) -> TableStats {
        self.inner.borrow().stats
    }

    /// Makes `state` the durable record of `key`: queued, and written with
    /// every record queued beside it (module docs).
    pub async fn write(&self, key: TableKey, state: &VsrState) -> Result<(), SuperblockError> {
        let ticket = {
            let mut inner = self.inner.borrow_mut();
            let entry = match inner.entries.get(&key) {
                Some(entry) => *entry,
                None => {
                    let index = match inner.free.pop_first() {
                        Some(index) => index,
                        None if inner.high_water < TABLE_SLOTS_MAX => {
                            inner.high_water += 1;
                            inner.high_water - 1
                        }
                        None => {
                            return Err(io_error(
                                &self.paths[0],
                                io::Error::new(
                                    io::ErrorKind::StorageFull,
                                    format!("every one of the {TABLE_SLOTS_MAX} slots is taken"),
                                ),
                            ));
                        }
                    };
                    Entry {
                        index,
                        next_sequence: 1,
                        state: None,
                    }
                }
            };
            let bytes = encode_slot(key, entry.next_sequence, state);
            inner.entries.insert(
                key,
                Entry {
                    next_sequence: entry.next_sequence + 1,
                    ..entry
                },
            );
            let ticket = Rc::new(Ticket::default());
            let queued = inner.queued.entry(entry.index).or_insert_with(|| Queued {
                bytes,
                record: None,
                tickets: Vec::new(),
            });
            queued.bytes = bytes;
            queued.record = Some((key, *state));
            queued.tickets.push(Rc::clone(&ticket));
            ticket
        };
        self.wait(&ticket).await
    }

    /// Removes `key`'s record: its slot is zeroed in both copies and reused
    /// only once that is durable. A key without a record is a no-op.
    pub async fn free(&self, key: TableKey) -> Result<(), SuperblockError> {
        self.free_unless(|k| k != key).await.map(|_| ())
    }

    /// Frees every record `keep` rejects, in one batch; returns how many.
    pub async fn free_unless(
        &self,
        keep: impl Fn(TableKey) -> bool,
    ) -> Result<usize, SuperblockError> {
        let ticket = Rc::new(Ticket::default());
        let gone = {
            let mut inner = self.inner.borrow_mut();
            let gone: Vec<TableKey> = inner
                .entries
                .keys()
                .copied()
                .filter(|k| !keep(*k))
                .collect();
            for key in &gone {
                let Some(entry) = inner.entries.remove(key) else {
                    continue;
                };
                let queued = inner.queued.entry(entry.index).or_insert_with(Queued::free);
                queued.bytes = [0; TABLE_SLOT_LEN];
                queued.record = None;
                queued.tickets.push(Rc::clone(&ticket));
            }
            gone.len()
        };
        if gone == 0 {
            return Ok(0);
        }
        self.wait(&ticket).await.map(|()| gone)
    }

    /// Waits for `ticket`'s batch, running batches while none is in flight.
    async fn wait(&self, ticket: &Ticket) -> Result<(), SuperblockError> {
        loop {
            if let Some(outcome) = ticket.outcome.take() {
                return outcome
                    .map_err(|(kind, what)| io_error(&self.dir, io::Error::new(kind, what)));
            }
            if !self.inner.borrow().writing {
                self.run_batch().await;
                continue;
            }
            std::future::poll_fn(|cx| {
                let mut inner = self.inner.borrow_mut();
                if !inner.writing {
                    return Poll::Ready(());
                }
                inner.wakers.push(cx.waker().clone());
                Poll::Pending
            })
            .await;
        }
    }

    /// One batch: everything queued once the writers of this step had a
    /// chance to queue.
    async fn run_batch(&self) {
        self.inner.borrow_mut().writing = true;
        let mut guard = BatchGuard {
            table: self,
            taken: Vec::new(),
        };
        self.fs.yield_now().await;
        guard.taken = std::mem::take(&mut self.inner.borrow_mut().queued)
            .into_iter()
            .collect();
        let result = self.write_copies(&guard.taken).await;
        let taken = std::mem::take(&mut guard.taken);
        let mut inner = self.inner.borrow_mut();
        inner.stats.batches += 1;
        inner.stats.slot_writes += taken.len() as u64;
        inner.stats.batch_max = inner.stats.batch_max.max(taken.len() as u64);
        if result.is_err() {
            inner.stats.failed += 1;
        }
        for (index, queued) in taken {
            match (&result, queued.record) {
                (Ok(()), Some((key, state))) => {
                    if let Some(entry) = inner.entries.get_mut(&key)
                        && entry.index == index
                    {
                        entry.state = Some(state);
                    }
                }
                (Ok(()), None) => {
                    inner.free.insert(index);
                }
                // A free that failed leaves the slot neither reusable nor
                // anyone's: it is queued again for the next batch.
                (Err(_), None) if !inner.queued.contains_key(&index) => {
                    inner.queued.insert(index, Queued::free());
                }
                (Err(_), _) => {}
            }
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err((e.kind(), e.to_string())),
            };
            for ticket in queued.tickets {
                ticket.outcome.set(Some(outcome.clone()));
            }
        }
        drop(inner);
        drop(guard);
    }

    /// Writes `taken` into copy A, syncs it, then into copy B and syncs it.
    /// Adjacent slots go out in one write.
    async fn write_copies(&self, taken: &[(u32, Queued)]) -> io::Result<()> {
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut next = None;
        for (index, queued) in taken {
            let at = u64::from(*index) * TABLE_SLOT_LEN as u64;
            match runs.last_mut() {
                Some((_, bytes)) if next == Some(*index) => bytes.extend_from_slice(&queued.bytes),
                _ => runs.push((at, queued.bytes.to_vec())),
            }
            next = index.checked_add(1);
        }
        for (copy, file) in self.files.iter().enumerate() {
            let path = &self.paths[copy];
            for (at, bytes) in &runs {
                let BufResult(result, _) = file.write_all_at(bytes.clone(), *at).await;
                result.map_err(|e| with_path(path, e))?;
            }
            file.sync_data().await.map_err(|e| with_path(path, e))?;
        }
        Ok(())
    }
}

fn with_path(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Ends a batch however its future ends: a batch dropped mid-way (its
/// writer cancelled) fails its waiters instead of leaving them asleep, and
/// the next waiter runs the next batch.
struct BatchGuard<'a, F: Fs> {
    table: &'a SuperblockTable<F>,
    taken: Vec<(u32, Queued)>,
}

impl<F: Fs> Drop for BatchGuard<'_, F> {
    fn drop(&mut self) {
        let mut inner = self.table.inner.borrow_mut();
        for (_, queued) in self.taken.drain(..) {
            for ticket in queued.tickets {
                ticket.outcome.set(Some(Err((
                    io::ErrorKind::Interrupted,
                    "the batch carrying this record was abandoned".to_owned(),
                ))));
            }
        }
        inner.writing = false;
        for waker in inner.wakers.drain(..) {
            waker.wake();
        }
    }
}

/// One group's view of its shard's table, as a [`SuperblockStore`].
pub struct TableSuperblock<F: Fs> {
    table: Rc<SuperblockTable<F>>,
    key: TableKey,
    existed_at_open: bool,
}

impl<F: Fs> fmt::Debug for TableSuperblock<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableSuperblock")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<F: Fs> TableSuperblock<F> {
    /// The store of `key` in `table`. `existed_at_open`: the group was on
    /// disk when the table opened (a boot), so a slot the table lost may
    /// have been its record; a group created since cannot have written
    /// one before.
    pub fn new(table: Rc<SuperblockTable<F>>, key: TableKey, existed_at_open: bool) -> Self {
        Self {
            table,
            key,
            existed_at_open,
        }
    }

    /// The table.
    pub fn table(&self) -> &Rc<SuperblockTable<F>> {
        &self.table
    }
}

impl<F: Fs> SuperblockStore for TableSuperblock<F> {
    async fn read_latest(&mut self) -> Result<Option<VsrState>, SuperblockError> {
        match self.table.state(self.key) {
            Some(state) => Ok(Some(state)),
            None if self.existed_at_open && self.table.lost() > 0 => {
                Err(SuperblockError::TableSlotsLost {
                    dir: self.table.dir().to_path_buf(),
                    group: self.key.group,
                    lost: self.table.lost(),
                })
            }
            None => Ok(None),
        }
    }

    async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        self.table.write(self.key, state).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use common::{Offset, Op, ReplicaId};

    fn state(view: u32) -> VsrState {
        VsrState {
            cluster: 7,
            replica_id: ReplicaId(1),
            replica_count: 3,
            view,
            log_view: view / 2,
            commit_max: Op(9),
            checkpoint_op: Op(4),
            checkpoint_checksum: 0xABCD,
            offset_frontier: Offset(40),
        }
    }

    const KEY: TableKey = TableKey {
        group: GroupId(12),
        incarnation: 3,
    };

    #[test]
    fn given_slot_when_encoded_should_round_trip_and_fit_its_layout() {
        let bytes = encode_slot(KEY, 5, &state(8));
        assert_eq!(&bytes[0..4], b"SBTB");
        assert_eq!(
            decode_slot(&bytes),
            SlotRead::Valid {
                key: KEY,
                sequence: 5,
                state: state(8)
            }
        );
        assert_eq!(decode_slot(&[0; TABLE_SLOT_LEN]), SlotRead::Zero);
    }

    #[test]
    fn given_every_flipped_bit_or_strict_prefix_when_decoded_should_be_corrupt() {
        let bytes = encode_slot(KEY, 5, &state(8));
        for bit in 0..TABLE_SLOT_LEN * 8 {
            let mut b = bytes;
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_slot(&b), SlotRead::Corrupt, "bit {bit}");
        }
        for len in 1..TABLE_SLOT_LEN {
            assert_eq!(decode_slot(&bytes[..len]), SlotRead::Corrupt, "len {len}");
        }
    }

    #[test]
    fn given_copy_pairs_when_combined_should_follow_the_crash_windows() {
        let v = |seq, group| SlotRead::Valid {
            key: TableKey {
                group,
                incarnation: 3,
            },
            sequence: seq,
            state: state(u32::try_from(seq).unwrap()),
        };
        let seq_of = |c: Combined| match c {
            Combined::Record { sequence, .. } => Some(sequence),
            _ => None,
        };
        assert_eq!(seq_of(combine(v(4, GroupId(1)), v(3, GroupId(1)))), Some(4));
        assert_eq!(seq_of(combine(v(3, GroupId(1)), v(4, GroupId(1)))), Some(4));
        for other in [SlotRead::Corrupt, SlotRead::Zero] {
            assert_eq!(seq_of(combine(v(3, GroupId(1)), other)), Some(3));
            assert_eq!(seq_of(combine(other, v(3, GroupId(1)))), Some(3));
        }
        let free = [
            (SlotRead::Corrupt, SlotRead::Zero),
            (SlotRead::Zero, SlotRead::Corrupt),
            (SlotRead::Zero, SlotRead::Zero),
        ];
        for (a, b) in free {
            assert!(matches!(combine(a, b), Combined::Free), "{a:?} {b:?}");
        }
        assert!(matches!(
            combine(SlotRead::Corrupt, SlotRead::Corrupt),
            Combined::Lost
        ));
        assert!(matches!(
            combine(v(3, GroupId(1)), v(3, GroupId(2))),
            Combined::Lost
        ));
    }
}
