//! Bounding, in bytes, the applied prepares partition groups keep in
//! memory for their peers' repair.
//!
//! A multi-replica group's VSR core keeps the last `retention_ops` applied
//! prepares so that a peer that fell behind can repair from them. Counted
//! in ops alone that is unbounded in bytes: 1,024 prepares of 1 MiB batches
//! is 1 GiB per group and replica. An Append's body, once flushed, is the
//! very record the segment holds (formats.md §12: one batch layout
//! everywhere), so the core need not keep it: it can let go of the body,
//! keep the header, and have the body read back from the segment when a
//! peer asks ([`consensus::vsr::Effect::ReadBack`]).
//!
//! [`RetainedBudget`] is the byte ceiling the groups of one shard share.
//! Each group counts the flushed Append bodies its core still holds
//! ([`RetainedBodies`], oldest first); when a flush would take the shard
//! past the ceiling, the group that flushed lets go of its own oldest
//! bodies until the shard is within it again. A group's freshly flushed
//! body is always among what it can let go of, so the shard's count
//! never stays above the ceiling: `peak` records the highest count left
//! after a flush. The price is a read from the segment (usually the page
//! cache) per body a peer's repair needs.
//!
//! What the ceiling does not count: bodies applied but not flushed yet
//! (bounded by the flush thresholds; they are the data until flushed),
//! the bodies of the small ops (offsets, purge: at most 16 bytes), and the
//! headers, which stay for `retention_ops` ops (about 200 bytes each). The
//! repair floor is therefore still `retention_ops` ops back, or where the
//! segments end if retention or a purge removed the batch earlier: a body
//! that cannot be read back (or no longer matches its header) is answered
//! as evicted and the peer transfers state instead.
//!
//! Fairness: the group that flushes gives back its own bodies, not another
//! group's, so a busy group under a full budget serves its repair from the
//! segments until the idle groups give theirs back: a host calls
//! [`Partition::release_retained`] for a group that stayed idle (the shard
//! does on its handle pass, about every 5 s per group).

use common::Op;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use consensus::vsr::{Prepare, Replica};
use consensus::vsr::{Retained, Spilled};
use journal::SuperblockStore;
use storage::fs::Fs;

use crate::bus::MessageBus;
use crate::partition::Partition;

/// Default [`RetainedBudget`] per shard: 64 MiB.
pub const RETAINED_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// Default `PartitionConfig::read_back_bytes_per_slice`: 4 MiB, so that
/// one answer to a peer's repair holds its shard for a few milliseconds
/// of reads, not the 128 MiB a whole slice of 1 MiB batches would be.
pub const READ_BACK_BYTES_PER_SLICE_DEFAULT: u64 = 4 * 1024 * 1024;

/// The byte ceiling on flushed Append bodies that the groups sharing it
/// keep in memory for repair. Cloning shares it.
#[derive(Debug, Clone)]
pub struct RetainedBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    spilled: AtomicU64,
}

impl RetainedBudget {
    /// A budget of `limit` bytes (0: every body is let go once flushed).
    pub fn new(limit: u64) -> Self {
        Self(Arc::new(BudgetState {
            limit,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
        }))
    }

    /// No ceiling (a group on its own, as in tests).
    pub fn unbounded() -> Self {
        Self::new(u64::MAX)
    }

    /// The ceiling in bytes.
    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.0.used.load(Ordering::Relaxed)
    }

    /// The most bytes held after any flush.
    pub fn peak(&self) -> u64 {
        self.0.peak.load(Ordering::Relaxed)
    }

    /// Bodies let go of so far, to be read back from segments if needed.
    pub fn spilled(&self) -> u64 {
        self.0.spilled.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: u64) {
        self.0.used.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, bytes: u64) {
        // Never below zero: every subtraction pairs with an addition.
        let _ = self
            .0
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    fn over(&self) -> bool {
        self.used() > self.0.limit
    }

    fn note_peak(&self) {
        self.0.peak.fetch_max(self.used(), Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy)]
struct Body {
    op: u64,
    /// The batch's base offset: where the segment holds it.
    offset: u64,
    len: u64,
}

/// One group's flushed Append bodies still held by its core, oldest
/// first, counted against the shared budget.
#[derive(Debug)]
pub(crate) struct RetainedBodies {
    budget: RetainedBudget,
    held: VecDeque<Body>,
    bytes: u64,
}

impl RetainedBodies {
    pub(crate) fn new(budget: RetainedBudget) -> Self {
        Self {
            budget,
            held: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Moves this group's count to `budget`, then brings it within it.
    pub(crate) fn share(&mut self, budget: RetainedBudget, replica: &mut Replica) {
        self.budget.sub(self.bytes);
        self.budget = budget;
        self.budget.add(self.bytes);
        self.enforce(replica);
    }

    /// Applied op `op`'s body (an Append whose batch starts at `offset`,
    /// `len` bytes) is in the segments now; the core may still hold it.
    pub(crate) fn flushed(&mut self, replica: &mut Replica, op: u64, offset: u64, len: u64) {
        self.trim(replica.retained_from().0);
        if op < replica.retained_from().0 {
            return;
        }
        self.held.push_back(Body { op, offset, len });
        self.bytes += len;
        self.budget.add(len);
        self.enforce(replica);
    }

    /// Forgets bodies of ops the core no longer retains at all (pruned by
    /// `retention_ops`, or below an installed state).
    pub(crate) fn trim(&mut self, retained_from: u64) {
        while let Some(front) = self.held.front().copied() {
            if front.op >= retained_from {
                break;
            }
            self.held.pop_front();
            self.release(front.len);
        }
    }

    /// Lets go of every body this group holds (an idle group's, so the
    /// budget goes to the groups that are writing).
    pub(crate) fn release_all(&mut self, replica: &mut Replica) {
        while let Some(front) = self.held.pop_front() {
            if replica.spill_applied(Op(front.op), front.offset).is_some() {
                self.budget.0.spilled.fetch_add(1, Ordering::Relaxed);
            }
            self.release(front.len);
        }
    }

    fn enforce(&mut self, replica: &mut Replica) {
        while self.budget.over() {
            let Some(front) = self.held.pop_front() else {
                break;
            };
            if replica.spill_applied(Op(front.op), front.offset).is_some() {
                self.budget.0.spilled.fetch_add(1, Ordering::Relaxed);
            }
            self.release(front.len);
        }
        self.budget.note_peak();
    }

    fn release(&mut self, len: u64) {
        self.bytes -= len;
        self.budget.sub(len);
    }

    /// Bytes this group holds against the budget.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Carries out [`consensus::vsr::Effect::ReadBack`]: reads each spilled
    /// body of the slice back from the segments and lets the core answer
    /// peer `to`. A body that cannot be read is handed back as `None`; the
    /// core also refuses one that does not match its header, and answers
    /// the peer that everything up to there is evicted.
    ///
    /// At most `read_back_bytes_per_slice` bytes are read (always at least
    /// one body), from the top of the slice down: the peer verifies a
    /// repaired slice down the hash chain from the op above it, so the
    /// highest ops are the ones it can use, and its next request asks for
    /// the ops left out (nothing is announced evicted for them).
    pub(crate) async fn read_back(
        &mut self,
        to: u8,
        nonce: u128,
        from_op: u64,
        slice: Vec<Retained>,
    ) {
        let mut budget = self.config.read_back_bytes_per_slice;
        let slice_len = slice.len();
        let mut read = Vec::with_capacity(slice_len);
        for slot in slice.into_iter().rev() {
            read.push(match slot {
                Retained::Held(prepare) => Some(prepare),
                Retained::Spilled(spilled) => {
                    let len = u64::from(spilled.len);
                    if len > budget && !read.is_empty() {
                        break;
                    }
                    budget = budget.saturating_sub(len);
                    let body = self.read_body(&spilled).await;
                    self.read_back_bodies += u64::from(body.is_some());
                    body
                }
            });
        }
        read.reverse();
        self.read_back_slices += 1;
        // The slice is contiguous from `from_op`: what was left out is at
        // its bottom, for the peer's next request.
        let served_from = from_op.saturating_add((slice_len - read.len()) as u64);
        self.replica.serve_read_back(to, nonce, served_from, read);
    }

    /// The batch starting at offset `spilled.locator`, if the segments
    /// still hold one of the spilled length there.
    async fn read_body(&self, spilled: &Spilled) -> Option<Prepare> {
        let op = spilled.header.op.0;
        let read = match self
            .log
            .read_by_offset(spilled.locator, u64::from(spilled.len))
            .await
        {
            Ok(read) => read,
            Err(error) => {
                // Rot in a committed batch: never served, and repaired
                // like one a poll found.
                self.note_damage(&error);
                tracing::debug!(
                    %error,
                    op,
                    offset = spilled.locator,
                    dir = %self.dir.display(),
                    "a spilled body could not be read back for repair"
                );
                return None;
            }
        };
        let first = read.batches().next()?;
        let (base_offset, length) = (first.header().base_offset, first.bytes().len());
        if base_offset != spilled.locator || length != spilled.len as usize {
            // Retention or a purge removed it, and something else is there.
            return None;
        }
        let body = Bytes::from(read.into_bytes()).slice(..length);
        Some(Prepare {
            header: spilled.header,
            body,
        })
    }
}

impl Drop for RetainedBodies {
    fn drop(&mut self) {
        self.budget.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{GroupId, ReplicaId};
    use consensus::vsr::Config as VsrConfig;

    fn replica() -> Replica {
        Replica::new(VsrConfig::new(ReplicaId(0), 3, GroupId(1)))
    }

    #[test]
    fn given_groups_sharing_a_budget_when_they_flush_should_give_back_their_own_oldest_and_never_stay_above_it()
     {
        let budget = RetainedBudget::new(100);
        let (mut ra, mut rb) = (replica(), replica());
        let mut a = RetainedBodies::new(RetainedBudget::unbounded());
        a.flushed(&mut ra, 1, 0, 60);
        a.flushed(&mut ra, 2, 10, 30);
        // Moving onto the shared budget carries the count (within it).
        a.share(budget.clone(), &mut ra);
        assert_eq!((a.bytes(), budget.used()), (90, 90));
        // Group b's flush would take the shard to 140: b gives back its
        // own body, not a's.
        let mut b = RetainedBodies::new(budget.clone());
        b.flushed(&mut rb, 1, 0, 50);
        assert_eq!((a.bytes(), b.bytes(), budget.used()), (90, 0, 90));
        // a's next flush (110) lets go of a's oldest (60).
        a.flushed(&mut ra, 3, 20, 20);
        assert_eq!((a.bytes(), budget.used()), (50, 50));
        assert!(budget.peak() <= budget.limit());
        // Ops the core no longer retains leave the count.
        a.trim(3);
        assert_eq!((a.bytes(), budget.used()), (20, 20));
        b.flushed(&mut rb, 2, 50, 40);
        drop(a);
        assert_eq!(budget.used(), 40, "a dropped group gives its count back");
        drop(b);
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 90);
    }

    #[test]
    fn given_a_zero_budget_when_flushed_should_hold_nothing() {
        let budget = RetainedBudget::new(0);
        let mut r = replica();
        let mut a = RetainedBodies::new(budget.clone());
        for op in 1..=5 {
            a.flushed(&mut r, op, op * 10, 10);
            assert_eq!(budget.used(), 0);
        }
        assert_eq!(budget.peak(), 0);
    }
}
