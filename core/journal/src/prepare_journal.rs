//! The partition plane's prepare journal: applied prepares by op, in
//! memory only, from the oldest op not yet flushed to segments up to the
//! head.
//!
//! Persistence of a partition comes from its segments and the superblock's
//! offset frontier, so this journal is never fsynced and is empty after a
//! restart. It keeps the **live** entries, consecutive ops bounded by count
//! and bytes, that polls read before they reach a segment and the flush
//! writes to segments, and [`JournalInfo`], the flush accounting (messages,
//! bytes, offsets and timestamps of the live entries) the flush thresholds
//! test against. A flushed entry leaves at once: repair is served from the
//! VSR replica's own journal and, past it, read back from segments.

use std::collections::VecDeque;
use std::fmt;

use bytes::Bytes;
use common::{Offset, Op};

/// What an entry contributes to the flush accounting. The partition
/// derives it from the prepare's batch; ops that carry no messages
/// (consumer-offset stores) report `messages == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryStats {
    /// Messages in the entry's batch.
    pub messages: u32,
    /// Offset of the batch's first message (meaningless when `messages`
    /// is 0).
    pub base_offset: Offset,
    /// The batch's timestamp (the prepare's timestamp).
    pub timestamp: u64,
}

/// One journaled prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The op number.
    pub op: Op,
    /// The prepare's identity checksum.
    pub checksum: u128,
    /// The previous op's identity.
    pub parent: u128,
    /// The whole prepare frame (header and body), shared, never copied.
    pub frame: Bytes,
    /// Its flush accounting.
    pub stats: EntryStats,
}

/// Bounds of a [`PrepareJournal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalLimits {
    /// Most live (unflushed) entries.
    pub entries_max: usize,
    /// Most bytes of live entries.
    pub bytes_max: u64,
}

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            entries_max: 8192,
            bytes_max: 256 * 1024 * 1024,
        }
    }
}

/// The flush accounting of the live entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalInfo {
    /// Live entries.
    pub entries: usize,
    /// Messages across the live entries.
    pub messages_count: u64,
    /// Bytes of the live entries' frames.
    pub size_bytes: u64,
    /// First message offset held, if any entry carries messages.
    pub base_offset: Option<Offset>,
    /// Last message offset held, if any entry carries messages.
    pub current_offset: Option<Offset>,
    /// Timestamp of the first entry with messages.
    pub first_timestamp: u64,
    /// Timestamp of the last entry with messages.
    pub end_timestamp: u64,
    /// Largest timestamp of an entry with messages.
    pub max_timestamp: u64,
}

impl JournalInfo {
    fn add(&mut self, entry: &JournalEntry) {
        self.entries += 1;
        self.size_bytes += entry.frame.len() as u64;
        let s = entry.stats;
        if s.messages == 0 {
            return;
        }
        if self.base_offset.is_none() {
            self.base_offset = Some(s.base_offset);
            self.first_timestamp = s.timestamp;
        }
        self.messages_count += u64::from(s.messages);
        self.current_offset = Some(s.base_offset + u64::from(s.messages) - 1);
        self.end_timestamp = s.timestamp;
        self.max_timestamp = self.max_timestamp.max(s.timestamp);
    }
}

/// Why the journal refused an operation; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalError {
    /// The op does not follow the head.
    NotNextOp {
        /// The op the journal expects next.
        expected: Op,
        /// The op offered.
        op: Op,
    },
    /// The prepare does not chain to the head's identity.
    ParentMismatch {
        /// The op offered.
        op: Op,
    },
    /// Taking the entry would exceed the live bounds; flush first.
    Full {
        /// Live entries.
        entries: usize,
        /// Live bytes.
        bytes: u64,
    },
    /// A batch whose last offset overflows u64.
    OffsetOverflow {
        /// The op offered.
        op: Op,
    },
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotNextOp { expected, op } => {
                write!(
                    f,
                    "op {op} does not follow the journal head (expected {expected})"
                )
            }
            Self::ParentMismatch { op } => {
                write!(f, "op {op} does not chain to the journal head's checksum")
            }
            Self::Full { entries, bytes } => write!(
                f,
                "journal is full ({entries} entries, {bytes} bytes); flush before appending"
            ),
            Self::OffsetOverflow { op } => write!(f, "op {op} carries offsets past u64::MAX"),
        }
    }
}

impl std::error::Error for JournalError {}

/// The in-memory journal of one partition group.
#[derive(Debug)]
pub struct PrepareJournal {
    limits: JournalLimits,
    live: VecDeque<JournalEntry>,
    info: JournalInfo,
    /// The op the next append must carry.
    next_op: Op,
    /// Identity the next append must chain to (0 = unknown, not checked:
    /// after a restart, a clear or an install the head is not held).
    head_checksum: u128,
}

impl PrepareJournal {
    /// An empty journal whose first append is op `next_op`.
    pub fn new(limits: JournalLimits, next_op: Op) -> Self {
        Self {
            limits,
            live: VecDeque::new(),
            info: JournalInfo::default(),
            next_op,
            head_checksum: 0,
        }
    }

    /// The flush accounting of the live entries.
    pub const fn info(&self) -> &JournalInfo {
        &self.info
    }

    /// The op the next append must carry.
    pub const fn next_op(&self) -> Op {
        self.next_op
    }

    /// Live entries, oldest first.
    pub fn live(&self) -> impl Iterator<Item = &JournalEntry> {
        self.live.iter()
    }

    /// Appends the next prepare. It must carry [`Self::next_op`] and chain
    /// to the head's identity when the head is known.
    pub fn append(&mut self, entry: JournalEntry) -> Result<(), JournalError> {
        if entry.op != self.next_op {
            return Err(JournalError::NotNextOp {
                expected: self.next_op,
                op: entry.op,
            });
        }
        if self.head_checksum != 0 && entry.parent != self.head_checksum {
            return Err(JournalError::ParentMismatch { op: entry.op });
        }
        if entry.stats.messages > 0
            && entry
                .stats
                .base_offset
                .checked_add(u64::from(entry.stats.messages) - 1)
                .is_none()
        {
            return Err(JournalError::OffsetOverflow { op: entry.op });
        }
        let bytes = self.info.size_bytes + entry.frame.len() as u64;
        if self.live.len() >= self.limits.entries_max || bytes > self.limits.bytes_max {
            return Err(JournalError::Full {
                entries: self.live.len(),
                bytes: self.info.size_bytes,
            });
        }
        self.info.add(&entry);
        self.next_op += 1;
        self.head_checksum = entry.checksum;
        self.live.push_back(entry);
        Ok(())
    }

    /// Drops the live entries with `op ≤ up_to` (they are flushed) and
    /// recomputes the accounting from what stays. The head is kept: the
    /// next append still chains to it.
    pub fn evict_flushed(&mut self, up_to: Op) {
        let before = self.live.len();
        while self.live.pop_front_if(|e| e.op <= up_to).is_some() {}
        if self.live.len() != before {
            self.recompute_info();
        }
    }

    fn recompute_info(&mut self) {
        let mut info = JournalInfo::default();
        for e in &self.live {
            info.add(e);
        }
        self.info = info;
    }

    /// Empties the journal (purge or state-transfer install); the next
    /// append must carry `next_op`.
    pub fn clear_all(&mut self, next_op: Op) {
        self.live.clear();
        self.info = JournalInfo::default();
        self.next_op = next_op;
        self.head_checksum = 0;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(op: u64, parent: u128, len: usize, messages: u32) -> JournalEntry {
        JournalEntry {
            op: Op(op),
            checksum: u128::from(op) * 1000 + 7,
            parent,
            frame: Bytes::from(vec![op as u8; len]),
            stats: EntryStats {
                messages,
                base_offset: Offset((op - 1) * 10),
                timestamp: 100 + op,
            },
        }
    }

    fn chain(j: &mut PrepareJournal, ops: std::ops::RangeInclusive<u64>, len: usize) {
        for op in ops {
            let parent = if op == 1 {
                0
            } else {
                u128::from(op - 1) * 1000 + 7
            };
            j.append(entry(op, parent, len, 10)).unwrap();
        }
    }

    fn limits(entries: usize, bytes: u64) -> JournalLimits {
        JournalLimits {
            entries_max: entries,
            bytes_max: bytes,
        }
    }

    #[test]
    fn given_appends_when_read_should_account_and_list_them_in_order() {
        let mut j = PrepareJournal::new(JournalLimits::default(), Op(1));
        chain(&mut j, 1..=5, 100);
        let info = j.info();
        assert_eq!(info.entries, 5);
        assert_eq!(info.messages_count, 50);
        assert_eq!(info.size_bytes, 500);
        assert_eq!(info.base_offset, Some(Offset(0)));
        assert_eq!(info.current_offset, Some(Offset(49)));
        assert_eq!((info.first_timestamp, info.end_timestamp), (101, 105));
        assert_eq!(
            j.live().map(|e| e.op.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(j.next_op(), Op(6));
    }

    #[test]
    fn given_gap_or_broken_chain_when_appended_should_refuse_unchanged() {
        let mut j = PrepareJournal::new(JournalLimits::default(), Op(1));
        chain(&mut j, 1..=2, 10);
        assert_eq!(
            j.append(entry(4, 3007, 10, 1)),
            Err(JournalError::NotNextOp {
                expected: Op(3),
                op: Op(4)
            })
        );
        assert_eq!(
            j.append(entry(3, 999, 10, 1)),
            Err(JournalError::ParentMismatch { op: Op(3) })
        );
        let mut overflow = entry(3, 2007, 10, 2);
        overflow.stats.base_offset = Offset(u64::MAX);
        assert_eq!(
            j.append(overflow),
            Err(JournalError::OffsetOverflow { op: Op(3) })
        );
        assert_eq!(j.info().entries, 2);
        assert_eq!(j.next_op(), Op(3));
    }

    #[test]
    fn given_bounds_when_full_should_refuse_until_flushed() {
        let mut j = PrepareJournal::new(limits(3, 1000), Op(1));
        chain(&mut j, 1..=3, 10);
        assert!(matches!(
            j.append(entry(4, 3007, 10, 1)),
            Err(JournalError::Full { entries: 3, .. })
        ));
        j.evict_flushed(Op(2));
        chain(&mut j, 4..=5, 10);
        let mut j = PrepareJournal::new(limits(100, 25), Op(1));
        chain(&mut j, 1..=2, 10);
        assert!(matches!(
            j.append(entry(3, 2007, 10, 1)),
            Err(JournalError::Full { bytes: 20, .. })
        ));
    }

    #[test]
    fn given_flushed_entries_when_evicted_should_drop_them_and_still_chain_to_the_head() {
        let mut j = PrepareJournal::new(JournalLimits::default(), Op(1));
        chain(&mut j, 1..=6, 10);
        j.evict_flushed(Op(5));
        assert_eq!(j.info().entries, 1);
        assert_eq!(j.info().base_offset, Some(Offset(50)));
        assert_eq!(j.live().map(|e| e.op.0).collect::<Vec<_>>(), [6]);
        j.evict_flushed(Op(6));
        assert_eq!(j.info(), &JournalInfo::default());
        assert_eq!(
            j.append(entry(7, 1, 10, 1)),
            Err(JournalError::ParentMismatch { op: Op(7) })
        );
        chain(&mut j, 7..=7, 10);
    }

    #[test]
    fn given_journal_when_cleared_should_restart_at_given_op() {
        let mut j = PrepareJournal::new(JournalLimits::default(), Op(1));
        chain(&mut j, 1..=3, 10);
        j.evict_flushed(Op(1));
        j.clear_all(Op(50));
        assert_eq!(j.info(), &JournalInfo::default());
        assert_eq!(j.live().count(), 0);
        // Any parent is accepted after a clear: the head is not held.
        j.append(entry(50, 12345, 10, 1)).unwrap();
    }
}
