//! The primary's pipeline: prepares built or inherited but not yet
//! committed, each with the set of replicas that acknowledged it.
//!
//! Ops in the pipeline are consecutive and hash-chained (asserted on push),
//! so lookup by op is an index and a cumulative PrepareOk for op `x` can be
//! credited to every entry at or below `x`.

use std::collections::VecDeque;

use super::message::PrepareHeader;

/// Prepares in flight at once (reference `PIPELINE_PREPARE_QUEUE_MAX`).
pub const PIPELINE_PREPARE_QUEUE_MAX: usize = 32;

/// One uncommitted prepare and its acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineEntry {
    /// The prepare's header.
    pub header: PrepareHeader,
    /// Bit `r` set when replica `r` acknowledged this op.
    pub ok_from: u32,
}

/// The ordered, bounded queue of uncommitted prepares.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    entries: VecDeque<PipelineEntry>,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries in flight.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a new request must wait.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= PIPELINE_PREPARE_QUEUE_MAX
    }

    /// Drop everything (view change, state-transfer install).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Append the next op. Asserts the op and the hash chain follow the tail:
    /// a violation is a bug in the caller, not bad peer input.
    pub fn push(&mut self, header: PrepareHeader, ok_from: u32) {
        if let Some(tail) = self.entries.back() {
            assert_eq!(
                header.op.0,
                tail.header.op.0 + 1,
                "pipeline ops are consecutive"
            );
            assert_eq!(
                header.parent, tail.header.checksum,
                "pipeline is hash-chained"
            );
        }
        self.entries.push_back(PipelineEntry { header, ok_from });
    }

    /// The oldest entry.
    pub fn head(&self) -> Option<&PipelineEntry> {
        self.entries.front()
    }

    /// Remove and return the oldest entry.
    pub fn pop_head(&mut self) -> Option<PipelineEntry> {
        self.entries.pop_front()
    }

    /// The entry for `op`, if in flight.
    pub fn get(&self, op: u64) -> Option<&PipelineEntry> {
        let first = self.entries.front()?.header.op.0;
        let index = usize::try_from(op.checked_sub(first)?).ok()?;
        self.entries.get(index)
    }

    /// Whether a prepare from `client` with number `request` is in flight.
    pub fn contains_request(&self, client: u128, request: u64) -> bool {
        self.entries
            .iter()
            .any(|e| e.header.client == client && e.header.request == request)
    }

    /// Credit `replica`'s cumulative acknowledgement of `op` with identity
    /// `checksum`. Returns false (and changes nothing) when `op` is not in
    /// flight or the identity differs from ours.
    pub fn ack(&mut self, replica: u8, op: u64, checksum: u128) -> bool {
        match self.get(op) {
            Some(entry) if entry.header.checksum == checksum => {}
            _ => return false,
        }
        let bit = 1u32 << replica;
        for entry in self.entries.iter_mut() {
            if entry.header.op.0 > op {
                break;
            }
            entry.ok_from |= bit;
        }
        true
    }

    /// All entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &PipelineEntry> {
        self.entries.iter()
    }
}
