//! Polls: by offset, timestamp, first, last and next, bounded by a message
//! count, by the commit point, and by a byte budget
//! (`PartitionConfig::poll_reply_bytes_max`: whole batches, the first one
//! always, so a reply stays far below any frame ceiling and a poll of
//! `u32::MAX` messages reads only what the budget allows).
//!
//! The ceiling is the applied (committed) end: nothing prepared but not yet
//! committed is ever served (a single replica whose disk is full serves
//! only what is in its segments, see `readable_end`). Committed batches live in two tiers, read in
//! offset order without a gap between them:
//!
//! - the **segments** (everything flushed), read through the storage
//!   crate, which finds the start in a sealed segment through its sparse
//!   index and validates every batch it returns;
//! - the **journal** (committed, not yet flushed), served from memory.
//!
//! A read fault ends the poll with an error rather than skipping to the
//! journal: falling through would silently lose offsets. Results are whole
//! batches (shared, not copied); [`Polled::messages`] yields exactly the
//! messages in the requested range.
//!
//! Auto-commit stores the last polled offset: at once in the live map of
//! this replica (monotone, so `Next` continues from it), and as a
//! replicated StoreOffset op with `auto_commit` set, queued for the
//! partition's internal client and submitted on the next tick while this
//! replica is a caught-up primary.

use common::{ConsumerKind, Offset};
use std::fmt;

use bytes::Bytes;
use journal::SuperblockStore;
use storage::StorageError;
use storage::fs::Fs;
use storage::{BatchHeader, BatchView, Integrity, MessageView};

use crate::bus::MessageBus;
use crate::partition::Partition;

/// The most a poll reads from a segment per storage call.
pub const POLL_READ_BYTES_MAX: u64 = 1024 * 1024;
/// The least a poll reads per storage call.
pub const POLL_READ_BYTES_MIN: u64 = 64 * 1024;
/// Default `PartitionConfig::poll_reply_bytes_max`.
pub const POLL_REPLY_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;
/// The largest budget a configuration may set: with one batch past it (a
/// batch is at most a 64 MiB request), a reply stays under the forward
/// lane's 256 MiB frame ceiling.
pub const POLL_REPLY_BYTES_MAX_CEILING: u64 = 128 * 1024 * 1024;

/// What a poll may still take: whole batches until its bytes run out,
/// the first batch always.
struct Budget {
    left: u64,
    exhausted: bool,
}

impl Budget {
    /// Whether a batch of `len` bytes is taken (and counted).
    fn take(&mut self, len: usize, batches_so_far: usize) -> bool {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        if batches_so_far > 0 && len > self.left {
            self.exhausted = true;
            return false;
        }
        self.left = self.left.saturating_sub(len);
        true
    }
}

/// Bytes per message assumed when sizing a read from a poll's count (a
/// guess only: a short read just means one more call).
const POLL_BYTES_PER_MESSAGE_GUESS: u64 = 1024;

/// Where a poll starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollingStrategy {
    /// At this offset.
    Offset(u64),
    /// At the first batch whose timestamp (µs) is at or after this one.
    Timestamp(u64),
    /// At the oldest offset held.
    First,
    /// At the last `count` committed messages.
    Last,
    /// After the consumer's stored offset (or at the oldest offset held).
    Next,
}

/// A poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollRequest {
    /// Who polls (for `Next` and auto-commit).
    pub consumer: (ConsumerKind, u32),
    /// Where to start.
    pub strategy: PollingStrategy,
    /// At most this many messages.
    pub count: u32,
    /// Store the last polled offset.
    pub auto_commit: bool,
}

/// Why a poll failed; nothing was committed.
#[derive(Debug)]
pub enum PollError {
    /// A segment read failed or returned a batch that does not verify.
    Storage(StorageError),
    /// The poll starts below `frontier` (or names no offset: first,
    /// timestamp, a consumer with nothing stored), and this replica holds
    /// nothing below it until a state transfer installs: not available
    /// here, which is not the same as empty.
    HistoryMissing {
        /// The offset below which nothing is held.
        frontier: Offset,
    },
}

impl fmt::Display for PollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Storage(e) => write!(f, "poll stopped at a segment read failure: {e}"),
            Self::HistoryMissing { frontier } => write!(
                f,
                "history below offset {frontier} is missing on this replica until a state transfer"
            ),
        }
    }
}

impl std::error::Error for PollError {}

/// What a poll returned: whole batches and the offset range wanted from
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Polled {
    /// Whole batches, in offset order; the first may start before
    /// `first_offset` and the last may end after `last_offset`.
    pub batches: Vec<Bytes>,
    /// The first offset returned.
    pub first_offset: Offset,
    /// The last offset returned (inclusive).
    pub last_offset: Offset,
    /// Messages in `first_offset..=last_offset`.
    pub count: u64,
}

impl Polled {
    /// True when nothing was returned.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The messages in range, in order.
    pub fn messages(&self) -> impl Iterator<Item = MessageView<'_>> {
        let (first, last) = (self.first_offset, self.last_offset);
        let empty = self.count == 0;
        self.batches
            .iter()
            .filter_map(|b| BatchView::decode_exact(b, Integrity::LayoutOnly, u64::MAX).ok())
            .flat_map(|v| v.messages())
            .filter(move |m| !empty && m.offset >= first.0 && m.offset <= last.0)
    }
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// The oldest offset held (retention and purge move it).
    pub fn first_offset(&self) -> Offset {
        Offset(self.log.segments().next().map_or(0, |s| s.start_offset))
    }

    /// Serves a poll (see the module documentation).
    pub async fn poll(&self, request: &PollRequest) -> Result<Polled, PollError> {
        let end = self.readable_end();
        let first = self.first_offset().0;
        let count = u64::from(request.count);
        let (kind, id) = request.consumer;
        if count > 0 {
            self.check_history_held(request, end)?;
        }
        if count == 0 || end <= first {
            return Ok(Polled::default());
        }
        let Some(start) = self.poll_start(request, first, end).await? else {
            return Ok(Polled::default());
        };
        if start >= end {
            return Ok(Polled::default());
        }
        let last_wanted = (end - 1).min(start.saturating_add(count - 1));
        let mut out = Polled {
            first_offset: Offset(start),
            ..Polled::default()
        };
        let flushed_end = self.log.next_offset();
        let mut budget = Budget {
            left: self.config.poll_reply_bytes_max,
            exhausted: false,
        };
        let mut at = self
            .read_flushed(
                start,
                last_wanted,
                count,
                flushed_end,
                &mut out.batches,
                &mut budget,
            )
            .await?;
        if at >= flushed_end && at <= last_wanted && !budget.exhausted {
            at = self.read_journaled(at, last_wanted, &mut out.batches, &mut budget);
        }
        if out.batches.is_empty() {
            return Ok(Polled::default());
        }
        out.last_offset = Offset(at.saturating_sub(1).min(last_wanted));
        out.count = out.last_offset.messages_since(out.first_offset) + 1;
        if request.auto_commit {
            self.offsets.advance_live(kind, id, out.last_offset);
            self.auto_commits
                .borrow_mut()
                .queue(kind, id, out.last_offset.0);
        }
        Ok(out)
    }

    /// The offset polls stop before: the applied end, except on a single
    /// replica whose disk is full, where the batches still in the journal
    /// are not served. Their replies are held until they are written (a
    /// reply never leaves before its batch is in the file), and a replica
    /// with no peers keeps nothing of them across a crash: a consumer must
    /// not read a message that a restart then gives another offset to. A
    /// group's member serves them: they are committed in a quorum.
    fn readable_end(&self) -> u64 {
        if self.config.vsr.replica_count == 1 && self.health.retries().no_space().is_some() {
            self.applied_next_offset.min(self.log.next_offset())
        } else {
            self.applied_next_offset
        }
    }

    /// Refuses a poll that would read below the frontier of a partition
    /// whose history there is missing (it would read as empty).
    fn check_history_held(&self, request: &PollRequest, end: u64) -> Result<(), PollError> {
        let Some(missing) = self.missing_history else {
            return Ok(());
        };
        let count = u64::from(request.count);
        let (kind, id) = request.consumer;
        let below = match request.strategy {
            PollingStrategy::Offset(o) => o < missing.frontier.0,
            PollingStrategy::Last => end.saturating_sub(count) < missing.frontier.0,
            PollingStrategy::Next => self
                .offsets
                .get(kind, id)
                .is_none_or(|o| o.0.saturating_add(1) < missing.frontier.0),
            PollingStrategy::First | PollingStrategy::Timestamp(_) => true,
        };
        if below {
            return Err(PollError::HistoryMissing {
                frontier: missing.frontier,
            });
        }
        Ok(())
    }

    /// The first offset the strategy names, never below `first`; `None`
    /// when a timestamp names no batch.
    async fn poll_start(
        &self,
        request: &PollRequest,
        first: u64,
        end: u64,
    ) -> Result<Option<u64>, PollError> {
        let count = u64::from(request.count);
        let (kind, id) = request.consumer;
        let start = match request.strategy {
            PollingStrategy::Offset(o) => o,
            PollingStrategy::First => first,
            PollingStrategy::Last => end.saturating_sub(count),
            PollingStrategy::Next => self.offsets.get(kind, id).map_or(first, |o| o.0 + 1),
            PollingStrategy::Timestamp(ts) => match self.offset_at_timestamp(ts).await? {
                Some(o) => o,
                None => return Ok(None),
            },
        };
        Ok(Some(start.max(first)))
    }

    /// Appends the flushed batches from `at` up to `last_wanted` (whole
    /// batches, read straight from the segments) and returns the offset
    /// after the last one taken.
    async fn read_flushed(
        &self,
        mut at: u64,
        last_wanted: u64,
        count: u64,
        flushed_end: u64,
        batches: &mut Vec<Bytes>,
        budget: &mut Budget,
    ) -> Result<u64, PollError> {
        // Sized by the count, so a poll of a few messages does not read a
        // megabyte.
        let read_bytes = count
            .saturating_mul(POLL_BYTES_PER_MESSAGE_GUESS)
            .clamp(POLL_READ_BYTES_MIN, POLL_READ_BYTES_MAX);
        while at < flushed_end && at <= last_wanted && !budget.exhausted {
            let read = self.log.read_by_offset(at, read_bytes).await.map_err(|e| {
                self.note_damage(&e);
                PollError::Storage(e)
            })?;
            if read.is_empty() {
                break;
            }
            let bytes = Bytes::from(read.bytes);
            let mut pos = 0usize;
            while pos < bytes.len() && at <= last_wanted {
                let Ok(h) = BatchHeader::decode(&bytes[pos..], u64::MAX) else {
                    break;
                };
                let len = usize::try_from(h.batch_length).unwrap_or(usize::MAX);
                let Some(batch) = bytes.get(pos..pos.saturating_add(len)) else {
                    break;
                };
                if h.last_offset() >= at {
                    if !budget.take(len, batches.len()) {
                        break;
                    }
                    batches.push(bytes.slice_ref(batch));
                    at = h.next_offset();
                }
                pos += len;
            }
        }
        Ok(at)
    }

    /// Appends the applied, not yet flushed batches from `at` up to
    /// `last_wanted` (the journal's frames, shared) and returns the offset
    /// after the last one taken.
    fn read_journaled(
        &self,
        mut at: u64,
        last_wanted: u64,
        batches: &mut Vec<Bytes>,
        budget: &mut Budget,
    ) -> u64 {
        for e in self.journal.live() {
            if at > last_wanted {
                break;
            }
            if e.stats.messages == 0 {
                continue;
            }
            let next = e.stats.base_offset.0 + u64::from(e.stats.messages);
            if next > at {
                if !budget.take(e.frame.len(), batches.len()) {
                    break;
                }
                batches.push(e.frame.clone());
                at = next;
            }
        }
        at
    }

    /// The offset of the first committed batch whose timestamp is at or
    /// after `timestamp`.
    async fn offset_at_timestamp(&self, timestamp: u64) -> Result<Option<u64>, PollError> {
        let read = self
            .log
            .read_by_timestamp(timestamp, 1)
            .await
            .map_err(|e| {
                self.note_damage(&e);
                PollError::Storage(e)
            })?;
        if let Some(b) = read.batches().next() {
            return Ok(Some(b.header().base_offset));
        }
        Ok(self
            .journal
            .live()
            .find(|e| e.stats.messages > 0 && e.stats.timestamp >= timestamp)
            .map(|e| e.stats.base_offset.0))
    }
}
