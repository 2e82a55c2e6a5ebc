//! Retention: deleting the oldest sealed segments by age and by total size.
//!
//! Local to each replica (not replicated): segment boundaries are decided
//! by committed bytes alone, so every replica holds the same segments and
//! the same policy removes the same ones. A pass:
//!
//! - computes two cut points over the **sealed** segments (the active one
//!   is never removed): the leading run whose newest timestamp is older
//!   than `max_age_us`, and the oldest ones that must go for the sealed
//!   bytes to fit `max_total_bytes` (active bytes are left out, so a budget
//!   near one segment does not wipe all history); it takes the larger;
//! - never removes a segment holding an offset above the lowest committed
//!   consumer-group offset when `respect_group_offsets` is set (a group
//!   that has not consumed it yet would lose it);
//! - removes at most `segments_per_pass_max` segments, so a pass never
//!   stalls the shard's other groups for long; `budget_spent` tells the
//!   caller to run again.
//!
//! Each removal is the storage crate's `remove_oldest_sealed`: log then
//! index unlinked, directory synced. A crash mid-way leaves a contiguous
//! suffix of the chain and an orphan index that boot sweeps; the offset
//! counter is untouched because the active segment always survives.
//! `&mut self` is the write lock: no flush or apply interleaves.

use journal::SuperblockStore;
use storage::SegmentMeta;
use storage::fs::Fs;

use crate::bus::MessageBus;
use crate::error::PartitionError;
use crate::partition::Partition;

/// Default bound on segments removed per pass.
pub const SEGMENTS_PER_PASS_MAX_DEFAULT: usize = 16;

/// What retention keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Remove sealed segments whose newest batch is older than this (µs).
    pub max_age_us: Option<u64>,
    /// Keep the sealed segments' total size within this.
    pub max_total_bytes: Option<u64>,
    /// Never remove past the lowest committed consumer-group offset.
    pub respect_group_offsets: bool,
    /// At most this many segments per pass.
    pub segments_per_pass_max: usize,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            max_age_us: None,
            max_total_bytes: None,
            respect_group_offsets: true,
            segments_per_pass_max: SEGMENTS_PER_PASS_MAX_DEFAULT,
        }
    }
}

/// What a pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionOutcome {
    /// Segments removed.
    pub segments: u64,
    /// Messages they held.
    pub messages: u64,
    /// Bytes they held.
    pub bytes: u64,
    /// More segments were due than the pass could remove.
    pub budget_spent: bool,
    /// A segment was kept because a consumer group has not consumed it.
    pub held_by_group: bool,
}

/// How many of the oldest sealed segments the policy wants gone.
fn due_count(sealed: &[SegmentMeta], now_us: u64, policy: &RetentionPolicy) -> usize {
    let expired = policy.max_age_us.map_or(0, |age| {
        sealed
            .iter()
            .take_while(|s| !s.is_empty() && s.end_timestamp.saturating_add(age) <= now_us)
            .count()
    });
    let oversized = policy.max_total_bytes.map_or(0, |max| {
        let mut total: u64 = sealed.iter().map(|s| s.size_bytes).sum();
        let mut n = 0;
        for s in sealed {
            if total <= max {
                break;
            }
            total -= s.size_bytes;
            n += 1;
        }
        n
    });
    expired.max(oversized)
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Runs one retention pass at time `now_us`.
    pub async fn retention_pass(
        &mut self,
        now_us: u64,
        policy: &RetentionPolicy,
    ) -> Result<RetentionOutcome, PartitionError> {
        self.check_fenced()?;
        let segments: Vec<SegmentMeta> = self.log.segments().copied().collect();
        let sealed = &segments[..segments.len().saturating_sub(1)];
        let due = due_count(sealed, now_us, policy);
        let barrier = if policy.respect_group_offsets {
            self.offsets.group_barrier()
        } else {
            None
        };
        let mut outcome = RetentionOutcome::default();
        for (i, seg) in sealed.iter().take(due).enumerate() {
            if i >= policy.segments_per_pass_max {
                outcome.budget_spent = true;
                break;
            }
            if let (Some(b), Some(end)) = (barrier, seg.end_offset())
                && end > b.0
            {
                tracing::info!(
                    segment = seg.start_offset,
                    end,
                    barrier = b.0,
                    "segment retained for a consumer group"
                );
                outcome.held_by_group = true;
                break;
            }
            let removed = match self.log.remove_oldest_sealed().await {
                Ok(Some(meta)) => meta,
                Ok(None) => break,
                Err(e) => {
                    let e = PartitionError::Storage(e);
                    self.fence(&e);
                    return Err(e);
                }
            };
            let messages = removed.next_offset - removed.start_offset;
            self.count_removed_segment(messages, removed.size_bytes);
            outcome.segments += 1;
            outcome.messages += messages;
            outcome.bytes += removed.size_bytes;
        }
        if outcome.segments > 0 {
            tracing::info!(dir = %self.dir.display(), segments = outcome.segments, messages = outcome.messages, "retention removed segments");
        }
        Ok(outcome)
    }
}
