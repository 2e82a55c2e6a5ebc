//! The client table on disk, so that dedup survives a restart.
//!
//! A retried request must be answered from the client table, never
//! executed twice, across any crash the configuration tolerates. The core
//! rebuilds the table only from the ops it applies, and a restarted
//! replica applies only the ops past its recorded applied point (a single
//! replica none at all), so the table as of that point is recorded here.
//!
//! **Two slots.** The table is written whole into one of two files,
//! [`CLIENT_TABLE_FILES`], always the one the last write did not use, so
//! the slot an earlier record relies on is never overwritten: a torn or
//! lost write leaves the other intact. Each slot names the applied op
//! (number and identity) its table is the state after, and carries a
//! checksum over everything it uses (bytes past that are left over from a
//! longer table and ignored).
//!
//! **When** (`Partition::record_applied_point`, `flush.rs`):
//!
//! - a replica of a group writes the table, synced, before every
//!   superblock record of its applied point (flush, purge, install), and
//!   boot restores the slot whose op and identity are the recorded point's;
//!   the ops past it are applied again and rebuild the rest;
//! - a single replica, which applies nothing again after a restart, also
//!   writes it at every step whose replies are about to go out, *before*
//!   that step's batches (synced first with `enforce_fsync`). Boot restores
//!   the slot with the higher op among those whose `next_offset` the
//!   recovered log reaches (a table naming a batch the log lacks would
//!   answer a retry with offsets that hold nothing), and cuts the log back
//!   to that slot's `next_offset`: batches past it belong to a step whose
//!   table did not survive, so no reply of theirs went out, and a retry
//!   then writes them once rather than twice.
//!
//! No slot to restore (a directory from before this record, a slot that
//! does not verify) leaves the table empty, with a warning: retries of
//! requests from before the restart are then refused for want of a
//! session, as before this record existed.

use common::{Offset, Op};
use std::io;
use std::path::{Path, PathBuf};

use common::le_cursor::{LeCursor, Truncated};
use consensus::DedupWatermark;
use consensus::SessionRecord;
use consensus::vsr::{Reply, ReplyStatus};
use storage::fs::{BufResult, Fs, FsFile, OpenOptions};
use xxhash_rust::xxh3::xxh3_64;

/// The two slot files in the partition directory.
pub const CLIENT_TABLE_FILES: [&str; 2] = ["clients.0", "clients.1"];

const MAGIC: &[u8; 4] = b"RCT1";
/// Magic, op, op identity, next offset, record count.
const HEADER_LEN: usize = 4 + 8 + 16 + 8 + 4;
/// Client, session, user, watermark, latest commit, window, reply flag,
/// then the reply: request, op, commit, timestamp, operation, status,
/// session, result.
const RECORD_LEN: usize = 16 + 8 + 4 + 8 + 8 + 16 + 1 + (8 * 4 + 1 + 1 + 8 + 8);
const TRAILER_LEN: usize = 8;

/// The longest slot a table of `capacity` sessions can leave.
fn slot_len_max(capacity: usize) -> u64 {
    (HEADER_LEN as u64)
        .saturating_add((capacity as u64).saturating_mul(RECORD_LEN as u64))
        .saturating_add(TRAILER_LEN as u64)
}

/// A slot's contents: the table as of one applied op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedTable {
    /// The op the table is the state after.
    pub op: Op,
    /// That op's identity.
    pub checksum: u128,
    /// The offset after the last message appended up to that op.
    pub next_offset: Offset,
    /// Every session, sorted by client id.
    pub sessions: Vec<SessionRecord>,
}

/// Why a slot's bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTableFileError {
    /// Shorter than its header, its records and its checksum.
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the header's count needs.
        needed: u64,
    },
    /// Not a client-table slot.
    BadMagic,
    /// More sessions than the table holds.
    TooManySessions {
        /// Sessions the header names.
        count: u32,
        /// The table's capacity.
        capacity: usize,
    },
    /// The checksum does not match (a torn write, a flipped bit).
    Checksum,
    /// A session's reply flag or status is not one this code writes.
    BadRecord {
        /// The record's index.
        index: usize,
    },
}

impl std::fmt::Display for ClientTableFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { len, needed } => {
                write!(f, "{len} bytes, but the header needs {needed}")
            }
            Self::BadMagic => write!(f, "not a client-table slot (bad magic)"),
            Self::TooManySessions { count, capacity } => write!(
                f,
                "{count} sessions, but the table holds at most {capacity}"
            ),
            Self::Checksum => write!(f, "checksum mismatch"),
            Self::BadRecord { index } => {
                write!(f, "session record {index} has an unknown flag or status")
            }
        }
    }
}

impl std::error::Error for ClientTableFileError {}

fn status_code(status: ReplyStatus) -> u8 {
    match status {
        ReplyStatus::Ok => 0,
        ReplyStatus::AlreadyApplied => 1,
        ReplyStatus::NoSession => 2,
        ReplyStatus::Fenced => 3,
    }
}

fn status_from(code: u8) -> Option<ReplyStatus> {
    Some(match code {
        0 => ReplyStatus::Ok,
        1 => ReplyStatus::AlreadyApplied,
        2 => ReplyStatus::NoSession,
        3 => ReplyStatus::Fenced,
        _ => return None,
    })
}

impl RecordedTable {
    /// The slot's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_LEN + self.sessions.len() * RECORD_LEN + TRAILER_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.op.0.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.extend_from_slice(&self.next_offset.0.to_le_bytes());
        let count = u32::try_from(self.sessions.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_le_bytes());
        for s in self.sessions.iter().take(count as usize) {
            let w = &s.watermark;
            out.extend_from_slice(&w.client.to_le_bytes());
            out.extend_from_slice(&s.session.to_le_bytes());
            out.extend_from_slice(&w.user_id.to_le_bytes());
            out.extend_from_slice(&w.watermark.to_le_bytes());
            out.extend_from_slice(&w.latest_commit.0.to_le_bytes());
            out.extend_from_slice(&w.committed_window.to_le_bytes());
            match &s.reply {
                None => out.extend_from_slice(&[0u8; 1 + 8 * 4 + 1 + 1 + 8 + 8]),
                Some(r) => {
                    out.push(1);
                    out.extend_from_slice(&r.request.to_le_bytes());
                    out.extend_from_slice(&r.op.0.to_le_bytes());
                    out.extend_from_slice(&r.commit.0.to_le_bytes());
                    out.extend_from_slice(&r.timestamp.to_le_bytes());
                    out.push(r.operation);
                    out.push(status_code(r.status));
                    out.extend_from_slice(&r.session.to_le_bytes());
                    out.extend_from_slice(&r.result.to_le_bytes());
                }
            }
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads a slot, failing closed: the count is checked against
    /// `capacity` and the bytes present before anything is allocated,
    /// and the checksum before any record is read. Bytes past the
    /// checksum are ignored.
    ///
    /// # Errors
    /// [`ClientTableFileError`] saying what is wrong.
    pub fn decode(bytes: &[u8], capacity: usize) -> Result<Self, ClientTableFileError> {
        let truncated = |needed: u64| ClientTableFileError::Truncated {
            len: bytes.len(),
            needed,
        };
        let header_truncated = |Truncated| truncated(HEADER_LEN as u64);
        // The whole header is checked for first, so a short slot is
        // reported as truncated even when its magic is already wrong.
        if bytes.len() < HEADER_LEN {
            return Err(truncated(HEADER_LEN as u64));
        }
        let mut at = LeCursor::new(bytes);
        if at.take(MAGIC.len()).map_err(header_truncated)? != MAGIC {
            return Err(ClientTableFileError::BadMagic);
        }
        let op = at.u64().map_err(header_truncated)?;
        let checksum = at.u128().map_err(header_truncated)?;
        let next_offset = at.u64().map_err(header_truncated)?;
        let count = at.u32().map_err(header_truncated)?;
        if count as usize > capacity {
            return Err(ClientTableFileError::TooManySessions { count, capacity });
        }
        let body = (count as u64).saturating_mul(RECORD_LEN as u64);
        let needed = (HEADER_LEN as u64 + TRAILER_LEN as u64).saturating_add(body);
        if (bytes.len() as u64) < needed {
            return Err(truncated(needed));
        }
        // `needed` fits in the slice, so in usize.
        let used = needed as usize - TRAILER_LEN;
        let mut sum = [0u8; TRAILER_LEN];
        sum.copy_from_slice(&bytes[used..used + TRAILER_LEN]);
        if u64::from_le_bytes(sum) != xxh3_64(&bytes[..used]) {
            return Err(ClientTableFileError::Checksum);
        }
        // The length was checked against the count, so no read below can
        // run short; if one did, it would be reported as this truncation.
        let short = |Truncated| truncated(needed);
        let mut sessions = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            sessions.push(read_record(&mut at, index, short)?);
        }
        Ok(Self {
            op: Op(op),
            checksum,
            next_offset: Offset(next_offset),
            sessions,
        })
    }
}

/// Reads one session record at the cursor. An absent reply must be all
/// zeros and a present one must carry a known status; anything else is
/// refused as [`ClientTableFileError::BadRecord`].
fn read_record(
    at: &mut LeCursor<'_>,
    index: usize,
    short: impl Fn(Truncated) -> ClientTableFileError + Copy,
) -> Result<SessionRecord, ClientTableFileError> {
    let client = at.u128().map_err(short)?;
    let session = at.u64().map_err(short)?;
    let user_id = at.u32().map_err(short)?;
    let watermark = at.u64().map_err(short)?;
    let latest_commit = at.u64().map_err(short)?;
    let committed_window = at.u128().map_err(short)?;
    let flag = at.u8().map_err(short)?;
    let request = at.u64().map_err(short)?;
    let reply_op = at.u64().map_err(short)?;
    let commit = at.u64().map_err(short)?;
    let timestamp = at.u64().map_err(short)?;
    let operation = at.u8().map_err(short)?;
    let status = at.u8().map_err(short)?;
    let reply_session = at.u64().map_err(short)?;
    let result = at.u64().map_err(short)?;
    let reply = match (flag, status_from(status)) {
        (1, Some(status)) => Some(Reply {
            client,
            request,
            op: Op(reply_op),
            commit: Op(commit),
            timestamp,
            operation,
            status,
            session: reply_session,
            result,
        }),
        // An absent reply is written as zeros; anything else is
        // not this code's.
        (0, _)
            if request | reply_op | commit | timestamp | reply_session | result == 0
                && operation == 0
                && status == 0 =>
        {
            None
        }
        _ => return Err(ClientTableFileError::BadRecord { index }),
    };
    Ok(SessionRecord {
        session,
        watermark: DedupWatermark {
            client,
            user_id,
            watermark,
            latest_commit: Op(latest_commit),
            committed_window,
        },
        reply,
    })
}

/// Which slot the next write goes to, and which slot names are known to
/// be durable in the directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientTableSlots {
    /// The slot last written whole (or restored from); the next write
    /// takes the other.
    last: Option<usize>,
    /// Whether this life synced the directory since the slot was created
    /// or found (a name a killed process created may not be durable yet).
    dir_synced: [bool; 2],
}

impl ClientTableSlots {
    /// Writes `table` into the slot the last write did not use; with
    /// `sync`, makes it durable (data, and the directory entry once per
    /// life) before returning.
    ///
    /// # Errors
    /// The filesystem's error; the other slot is untouched, and the next
    /// write takes the same slot again.
    pub(crate) async fn write<F: Fs>(
        &mut self,
        fs: &F,
        dir: &Path,
        table: &RecordedTable,
        sync: bool,
    ) -> io::Result<()> {
        let slot = self.last.map_or(0, |last| 1 - last);
        let path = dir.join(CLIENT_TABLE_FILES[slot]);
        let name_synced = self.dir_synced[slot];
        // A failed write leaves `last` as it was: the slot may hold
        // anything now, so the next write takes it again rather than the
        // other, which holds the last good table (a full disk fails writes
        // until space is freed; alternating would tear both slots).
        Self::write_slot(fs, dir, &path, table, sync, name_synced).await?;
        self.last = Some(slot);
        self.dir_synced[slot] |= sync;
        Ok(())
    }

    /// Writes `table` into the slot at `path`, synced (with its name,
    /// unless that is durable already) when `sync` is set.
    async fn write_slot<F: Fs>(
        fs: &F,
        dir: &Path,
        path: &Path,
        table: &RecordedTable,
        sync: bool,
        name_synced: bool,
    ) -> io::Result<()> {
        let file = fs.open(path, OpenOptions::create_read_write()).await?;
        let BufResult(written, _) = file.write_all_at(table.encode(), 0).await;
        written?;
        if sync {
            file.sync_data().await?;
            if !name_synced {
                fs.sync_dir(dir).await?;
            }
        }
        Ok(())
    }

    /// Reads both slots of `dir` and keeps the one `choose` picks (boot).
    /// A slot that is absent or does not verify is skipped (the latter with
    /// a warning).
    ///
    /// # Errors
    /// The filesystem's error other than `NotFound`, naming the file.
    pub(crate) async fn load<F: Fs>(
        fs: &F,
        dir: &Path,
        capacity: usize,
        choose: impl Fn(&RecordedTable) -> bool,
    ) -> Result<(Self, Option<RecordedTable>), (PathBuf, io::Error)> {
        let mut slots = Self::default();
        let mut chosen: Option<(usize, RecordedTable)> = None;
        for (slot, name) in CLIENT_TABLE_FILES.iter().enumerate() {
            let path = dir.join(name);
            let bytes = match fs.open(&path, OpenOptions::read_only()).await {
                Ok(file) => match file.read_to_end_bounded(slot_len_max(capacity)).await {
                    Ok(bytes) => bytes,
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        tracing::warn!(path = %path.display(), error = %e, "client-table slot refused");
                        continue;
                    }
                    Err(e) => return Err((path, e)),
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err((path, e)),
            };
            match RecordedTable::decode(&bytes, capacity) {
                Ok(table) if choose(&table) => {
                    if chosen.as_ref().is_none_or(|(_, c)| table.op > c.op) {
                        chosen = Some((slot, table));
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "client-table slot does not verify; not restored");
                }
            }
        }
        Ok(match chosen {
            Some((slot, table)) => {
                slots.last = Some(slot);
                (slots, Some(table))
            }
            None => (slots, None),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn table(n: u128) -> RecordedTable {
        let sessions = (1..=n)
            .map(|client| SessionRecord {
                session: 3,
                watermark: DedupWatermark {
                    client,
                    user_id: 9,
                    watermark: 40 + client as u64,
                    latest_commit: Op(77),
                    committed_window: u128::MAX - 6,
                },
                reply: (client % 2 == 1).then_some(Reply {
                    client,
                    request: 40 + client as u64,
                    op: Op(77),
                    commit: Op(78),
                    timestamp: 123,
                    operation: 3,
                    status: ReplyStatus::Ok,
                    session: 0,
                    result: 4_096,
                }),
            })
            .collect();
        RecordedTable {
            op: Op(77),
            checksum: 0xfeed,
            next_offset: Offset(1_234),
            sessions,
        }
    }

    #[test]
    fn given_a_table_when_encoded_should_decode_to_it_and_ignore_trailing_bytes() {
        for n in [0, 1, 4] {
            let t = table(n);
            let mut bytes = t.encode();
            assert_eq!(
                bytes.len(),
                HEADER_LEN + n as usize * RECORD_LEN + TRAILER_LEN
            );
            assert_eq!(RecordedTable::decode(&bytes, 4), Ok(t.clone()));
            bytes.extend_from_slice(&[0xAB; 300]);
            assert_eq!(RecordedTable::decode(&bytes, 4), Ok(t));
        }
    }

    #[test]
    fn given_damaged_bytes_when_decoded_should_refuse() {
        let bytes = table(3).encode();
        for len in 0..bytes.len() {
            assert!(
                RecordedTable::decode(&bytes[..len], 4).is_err(),
                "a slot cut to {len} bytes was accepted"
            );
        }
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(
                RecordedTable::decode(&b, 4).is_err(),
                "a flipped bit at {at} was accepted"
            );
        }
        assert_eq!(
            RecordedTable::decode(&bytes, 2),
            Err(ClientTableFileError::TooManySessions {
                count: 3,
                capacity: 2
            })
        );
    }

    #[test]
    fn given_a_huge_count_when_decoded_should_refuse_before_allocating() {
        let mut bytes = table(1).encode();
        bytes[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            RecordedTable::decode(&bytes, usize::MAX),
            Err(ClientTableFileError::Truncated { .. })
        ));
    }

    #[test]
    fn given_an_unknown_flag_or_status_when_decoded_should_refuse() {
        let reseal = |mut b: Vec<u8>| {
            let used = b.len() - TRAILER_LEN;
            let sum = xxh3_64(&b[..used]);
            b[used..].copy_from_slice(&sum.to_le_bytes());
            b
        };
        let flag_at = HEADER_LEN + 16 + 8 + 4 + 8 + 8 + 16;
        let status_at = flag_at + 1 + 8 * 4 + 1;
        for (at, value) in [(flag_at, 2u8), (status_at, 4)] {
            let mut b = table(1).encode();
            b[at] = value;
            assert_eq!(
                RecordedTable::decode(&reseal(b), 4),
                Err(ClientTableFileError::BadRecord { index: 0 })
            );
        }
        // Client 2 has no reply: bytes behind a zero flag must be zero.
        let mut b = table(2).encode();
        b[HEADER_LEN + RECORD_LEN + flag_at - HEADER_LEN + 3] = 1;
        assert_eq!(
            RecordedTable::decode(&reseal(b), 4),
            Err(ClientTableFileError::BadRecord { index: 1 })
        );
    }
}
