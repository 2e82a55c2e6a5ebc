//! Scrubbing: a background walk over the sealed segments that reads every
//! batch back through the log's integrity checks, so damage at rest (bit
//! rot, a torn sector, a foreign write) is found while a peer can still
//! repair it, not only when a consumer happens to poll the damaged range.
//!
//! A step verifies at most a given number of bytes from where the last
//! one stopped (a segment and a batch boundary in it), moving to the next
//! sealed segment at the end of one and back to the oldest after the
//! newest. The active segment is left alone: its tail is still being
//! written and every batch in it was verified when appended. A segment
//! that retention removed under the cursor is skipped. Damage found is
//! handled as a poll's is ([`Partition::note_damage`]): never served, and
//! repaired from a peer by state transfer on the next tick.

use journal::SuperblockStore;
use storage::fs::Fs;

use crate::bus::MessageBus;
use crate::partition::Partition;

/// Where the next scrub step starts: a sealed segment's start offset and a
/// batch boundary in its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubCursor {
    /// The segment's start offset.
    pub segment_start: u64,
    /// The byte position in its log.
    pub position: u64,
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Verifies up to `max_bytes` (at least one batch) of sealed segments
    /// and returns how many bytes it read; 0 when there is nothing sealed
    /// to verify, or the partition is fenced, installing or lagging for a
    /// transfer, or already repairing damage.
    pub async fn scrub_step(&mut self, max_bytes: u64) -> u64 {
        if self.fenced.is_some()
            || self.install.is_some()
            || self.missing_history.is_some()
            || self.damage_found.get()
        {
            return 0;
        }
        // Every segment but the last (the active one), by start offset.
        let sealed: Vec<(u64, u64)> = {
            let all: Vec<(u64, u64)> = self
                .log
                .segments()
                .map(|s| (s.start_offset, s.size_bytes))
                .collect();
            all.split_last()
                .map(|(_, rest)| rest.to_vec())
                .unwrap_or_default()
        };
        let Some(&(oldest, _)) = sealed.first() else {
            self.scrub_cursor = ScrubCursor::default();
            return 0;
        };
        let cursor = self.scrub_cursor;
        // The cursor's segment, or the next one if retention removed it,
        // or the oldest after the newest.
        let (start, size, position) = match sealed.iter().find(|(s, _)| *s >= cursor.segment_start)
        {
            Some(&(s, size)) if s == cursor.segment_start && cursor.position < size => {
                (s, size, cursor.position)
            }
            Some(&(s, size)) if s != cursor.segment_start => (s, size, 0),
            _ => {
                let next = sealed.iter().find(|(s, _)| *s > cursor.segment_start);
                let &(s, size) = next.unwrap_or(&sealed[0]);
                (s, size, 0)
            }
        };
        let advance = |from: u64| {
            sealed
                .iter()
                .find(|(s, _)| *s > from)
                .map_or(oldest, |(s, _)| *s)
        };
        match self.log.read_at(start, position, max_bytes).await {
            Ok(read) if read.next_position > position => {
                let bytes = read.next_position - position;
                self.scrub_cursor = if read.next_position >= size {
                    ScrubCursor {
                        segment_start: advance(start),
                        position: 0,
                    }
                } else {
                    ScrubCursor {
                        segment_start: start,
                        position: read.next_position,
                    }
                };
                bytes
            }
            Ok(_) => {
                self.scrub_cursor = ScrubCursor {
                    segment_start: advance(start),
                    position: 0,
                };
                0
            }
            Err(error) => {
                self.note_damage(&error);
                self.scrub_cursor = ScrubCursor {
                    segment_start: advance(start),
                    position: 0,
                };
                0
            }
        }
    }
}
