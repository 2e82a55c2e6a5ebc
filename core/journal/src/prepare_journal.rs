//! The partition plane's prepare journal: prepares by op, in memory only,
//! from the oldest op not yet flushed to segments up to the head.
//!
//! Persistence of a partition comes from its segments and the superblock's
//! offset frontier, so this journal is never fsynced and is empty after a
//! restart. It keeps:
//!
//! - the **live** entries: consecutive ops, bounded by count and bytes, that
//!   the commit walk reads and the flush writes to segments;
//! - a **repair ring** of recently flushed entries (capped at 4,096 entries
//!   and 16 MiB by default), so a briefly absent peer can catch up by journal
//!   repair instead of a state transfer;
//! - [`JournalInfo`], the flush accounting (messages, bytes, offsets and
//!   timestamps of the live entries) the flush thresholds test against.
//!
//! Entries are looked up by op and by prepare identity (checksum).

use std::collections::{HashMap, VecDeque};
use std::fmt;

use bytes::Bytes;

/// What an entry contributes to the flush accounting. The partition
/// derives it from the prepare's batch; ops that carry no messages
/// (consumer-offset stores) report `messages == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryStats {
    /// Messages in the entry's batch.
    pub messages: u32,
    /// Offset of the batch's first message (meaningless when `messages`
    /// is 0).
    pub base_offset: u64,
    /// The batch's timestamp (the prepare's timestamp).
    pub timestamp: u64,
}

/// One journaled prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The op number.
    pub op: u64,
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
    /// Most entries kept in the repair ring (0 disables it, as for a
    /// single-replica group).
    pub ring_entries_max: usize,
    /// Most bytes kept in the repair ring.
    pub ring_bytes_max: u64,
}

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            entries_max: 8192,
            bytes_max: 256 * 1024 * 1024,
            ring_entries_max: 4096,
            ring_bytes_max: 16 * 1024 * 1024,
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
    pub base_offset: Option<u64>,
    /// Last message offset held, if any entry carries messages.
    pub current_offset: Option<u64>,
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
        expected: u64,
        /// The op offered.
        op: u64,
    },
    /// The prepare does not chain to the head's identity.
    ParentMismatch {
        /// The op offered.
        op: u64,
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
        op: u64,
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
    ring: VecDeque<JournalEntry>,
    ring_bytes: u64,
    by_checksum: HashMap<u128, u64>,
    info: JournalInfo,
    /// The op the next append must carry when the journal is empty.
    next_op: u64,
    /// Identity the next append must chain to (0 = unknown, not checked:
    /// after a restart, a truncation or an install the head is not held).
    head_checksum: u128,
}

impl PrepareJournal {
    /// An empty journal whose first append is op `next_op`.
    pub fn new(limits: JournalLimits, next_op: u64) -> Self {
        Self {
            limits,
            live: VecDeque::new(),
            ring: VecDeque::new(),
            ring_bytes: 0,
            by_checksum: HashMap::new(),
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
    pub const fn next_op(&self) -> u64 {
        self.next_op
    }

    /// The lowest op this journal can still serve to repair (live or in the
    /// ring), or `None` when it holds nothing.
    pub fn retained_from(&self) -> Option<u64> {
        self.ring
            .front()
            .or_else(|| self.live.front())
            .map(|e| e.op)
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
        self.by_checksum.insert(entry.checksum, entry.op);
        self.next_op += 1;
        self.head_checksum = entry.checksum;
        self.live.push_back(entry);
        Ok(())
    }

    fn find(&self, op: u64) -> Option<&JournalEntry> {
        find_in(&self.live, op).or_else(|| find_in(&self.ring, op))
    }

    /// The entry for `op`, live or in the repair ring.
    pub fn entry(&self, op: u64) -> Option<&JournalEntry> {
        self.find(op).filter(|e| e.op == op)
    }

    /// The entry whose identity is `checksum`.
    pub fn entry_by_checksum(&self, checksum: u128) -> Option<&JournalEntry> {
        let op = *self.by_checksum.get(&checksum)?;
        self.entry(op).filter(|e| e.checksum == checksum)
    }

    /// The live entries with `op ≤ commit_max`, oldest first: the committed
    /// prefix a flush writes. Nothing is removed.
    pub fn committed_prefix(&self, commit_max: u64) -> impl Iterator<Item = &JournalEntry> {
        self.live.iter().take_while(move |e| e.op <= commit_max)
    }

    /// Moves the live entries with `op ≤ up_to` (they are flushed) into the
    /// repair ring, evicting the ring's oldest entries past its bounds, and
    /// recomputes the accounting from what stays live.
    pub fn evict_flushed(&mut self, up_to: u64) {
        let mut moved = false;
        while self.live.front().is_some_and(|e| e.op <= up_to) {
            let Some(entry) = self.live.pop_front() else {
                break;
            };
            moved = true;
            self.push_ring(entry);
        }
        if moved {
            self.recompute_info();
        }
    }

    fn push_ring(&mut self, entry: JournalEntry) {
        let len = entry.frame.len() as u64;
        if self.limits.ring_entries_max == 0 || len > self.limits.ring_bytes_max {
            self.by_checksum.remove(&entry.checksum);
            // The ring must stay consecutive: an entry that cannot enter
            // it empties it.
            self.clear_ring();
            return;
        }
        self.ring.push_back(entry);
        self.ring_bytes += len;
        while self.ring.len() > self.limits.ring_entries_max
            || self.ring_bytes > self.limits.ring_bytes_max
        {
            let Some(old) = self.ring.pop_front() else {
                break;
            };
            self.ring_bytes -= old.frame.len() as u64;
            self.by_checksum.remove(&old.checksum);
        }
    }

    fn clear_ring(&mut self) {
        for e in self.ring.drain(..) {
            self.by_checksum.remove(&e.checksum);
        }
        self.ring_bytes = 0;
    }

    fn recompute_info(&mut self) {
        let mut info = JournalInfo::default();
        for e in &self.live {
            info.add(e);
        }
        self.info = info;
    }

    /// Drops every entry with `op ≥ from` (an uncommitted suffix a view
    /// change proved dead), from the live entries and from the ring. The
    /// next append must carry `from`; its parent is not checked (the head
    /// it chains to is the view's, which the caller verified).
    pub fn truncate_from(&mut self, from: u64) {
        while let Some(e) = self.live.pop_back_if(|e| e.op >= from) {
            self.by_checksum.remove(&e.checksum);
        }
        while let Some(e) = self.ring.pop_back_if(|e| e.op >= from) {
            self.ring_bytes -= e.frame.len() as u64;
            self.by_checksum.remove(&e.checksum);
        }
        self.next_op = self.next_op.min(from);
        self.head_checksum = self
            .live
            .back()
            .or_else(|| self.ring.back())
            .filter(|e| e.op + 1 == self.next_op)
            .map_or(0, |e| e.checksum);
        self.recompute_info();
    }

    /// Empties the journal (purge or state-transfer install); the next
    /// append must carry `next_op`.
    pub fn clear_all(&mut self, next_op: u64) {
        self.live.clear();
        self.ring.clear();
        self.ring_bytes = 0;
        self.by_checksum.clear();
        self.info = JournalInfo::default();
        self.next_op = next_op;
        self.head_checksum = 0;
    }

    /// Bytes held by the repair ring.
    pub const fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }

    /// Entries held by the repair ring.
    pub fn ring_len(&self) -> usize {
        self.ring.len()
    }
}

/// The entry for `op` in a queue of consecutive ops.
fn find_in(q: &VecDeque<JournalEntry>, op: u64) -> Option<&JournalEntry> {
    let first = q.front()?.op;
    q.get(usize::try_from(op.checked_sub(first)?).ok()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(op: u64, parent: u128, len: usize, messages: u32) -> JournalEntry {
        JournalEntry {
            op,
            checksum: u128::from(op) * 1000 + 7,
            parent,
            frame: Bytes::from(vec![op as u8; len]),
            stats: EntryStats {
                messages,
                base_offset: (op - 1) * 10,
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

    fn limits(entries: usize, bytes: u64, ring: usize, ring_bytes: u64) -> JournalLimits {
        JournalLimits {
            entries_max: entries,
            bytes_max: bytes,
            ring_entries_max: ring,
            ring_bytes_max: ring_bytes,
        }
    }

    #[test]
    fn given_appends_when_read_should_account_and_look_up() {
        let mut j = PrepareJournal::new(JournalLimits::default(), 1);
        chain(&mut j, 1..=5, 100);
        let info = j.info();
        assert_eq!(info.entries, 5);
        assert_eq!(info.messages_count, 50);
        assert_eq!(info.size_bytes, 500);
        assert_eq!(info.base_offset, Some(0));
        assert_eq!(info.current_offset, Some(49));
        assert_eq!((info.first_timestamp, info.end_timestamp), (101, 105));
        assert_eq!(j.entry(3).unwrap().op, 3);
        assert_eq!(j.entry_by_checksum(3007).unwrap().op, 3);
        assert!(j.entry(6).is_none());
        assert_eq!(j.committed_prefix(3).count(), 3);
    }

    #[test]
    fn given_gap_or_broken_chain_when_appended_should_refuse_unchanged() {
        let mut j = PrepareJournal::new(JournalLimits::default(), 1);
        chain(&mut j, 1..=2, 10);
        assert_eq!(
            j.append(entry(4, 3007, 10, 1)),
            Err(JournalError::NotNextOp { expected: 3, op: 4 })
        );
        assert_eq!(
            j.append(entry(3, 999, 10, 1)),
            Err(JournalError::ParentMismatch { op: 3 })
        );
        let mut overflow = entry(3, 2007, 10, 2);
        overflow.stats.base_offset = u64::MAX;
        assert_eq!(
            j.append(overflow),
            Err(JournalError::OffsetOverflow { op: 3 })
        );
        assert_eq!(j.info().entries, 2);
    }

    #[test]
    fn given_bounds_when_full_should_refuse_until_flushed() {
        let mut j = PrepareJournal::new(limits(3, 1000, 10, 10_000), 1);
        chain(&mut j, 1..=3, 10);
        assert!(matches!(
            j.append(entry(4, 3007, 10, 1)),
            Err(JournalError::Full { entries: 3, .. })
        ));
        j.evict_flushed(2);
        chain(&mut j, 4..=5, 10);
        let mut j = PrepareJournal::new(limits(100, 25, 10, 10_000), 1);
        chain(&mut j, 1..=2, 10);
        assert!(matches!(
            j.append(entry(3, 2007, 10, 1)),
            Err(JournalError::Full { bytes: 20, .. })
        ));
    }

    #[test]
    fn given_flushed_entries_when_evicted_should_serve_from_ring_until_capped() {
        let mut j = PrepareJournal::new(limits(100, 1 << 20, 3, 1 << 20), 1);
        chain(&mut j, 1..=6, 10);
        j.evict_flushed(5);
        assert_eq!(j.info().entries, 1);
        assert_eq!(j.info().base_offset, Some(50));
        // The ring keeps the newest three flushed ops.
        assert_eq!(j.ring_len(), 3);
        assert_eq!(j.retained_from(), Some(3));
        assert!(j.entry(2).is_none());
        assert!(j.entry_by_checksum(2007).is_none());
        assert_eq!(j.entry(4).unwrap().op, 4);
        assert_eq!(j.entry_by_checksum(5007).unwrap().op, 5);
        // The byte cap also evicts.
        let mut j = PrepareJournal::new(limits(100, 1 << 20, 100, 25), 1);
        chain(&mut j, 1..=4, 10);
        j.evict_flushed(4);
        assert_eq!(j.ring_len(), 2);
        assert_eq!(j.ring_bytes(), 20);
        assert_eq!(j.retained_from(), Some(3));
    }

    #[test]
    fn given_disabled_ring_when_evicted_should_keep_nothing() {
        let mut j = PrepareJournal::new(limits(100, 1 << 20, 0, 0), 1);
        chain(&mut j, 1..=3, 10);
        j.evict_flushed(3);
        assert_eq!(j.retained_from(), None);
        assert!(j.entry(3).is_none());
        chain(&mut j, 4..=4, 10);
    }

    #[test]
    fn given_uncommitted_suffix_when_truncated_should_drop_it_and_accept_new_head() {
        let mut j = PrepareJournal::new(JournalLimits::default(), 1);
        chain(&mut j, 1..=6, 10);
        j.truncate_from(4);
        assert_eq!(j.next_op(), 4);
        assert!(j.entry(4).is_none() && j.entry_by_checksum(5007).is_none());
        assert_eq!(j.info().entries, 3);
        assert_eq!(j.info().current_offset, Some(29));
        // The new view's op 4 must chain to op 3.
        assert_eq!(
            j.append(entry(4, 1, 10, 1)),
            Err(JournalError::ParentMismatch { op: 4 })
        );
        j.append(entry(4, 3007, 10, 1)).unwrap();
        // Truncating into the ring drops ring entries too.
        j.evict_flushed(4);
        j.truncate_from(3);
        assert_eq!(j.retained_from(), Some(1));
        assert!(j.entry(3).is_none());
        assert_eq!(j.ring_len(), 2);
        assert_eq!(j.ring_bytes(), 20);
    }

    #[test]
    fn given_journal_when_cleared_should_restart_at_given_op() {
        let mut j = PrepareJournal::new(JournalLimits::default(), 1);
        chain(&mut j, 1..=3, 10);
        j.evict_flushed(1);
        j.clear_all(50);
        assert_eq!(j.info(), &JournalInfo::default());
        assert_eq!(j.retained_from(), None);
        // Any parent is accepted after a clear: the head is not held.
        j.append(entry(50, 12345, 10, 1)).unwrap();
    }
}
