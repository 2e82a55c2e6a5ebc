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
//!
//! A walk that covers a segment from its first byte to its last also
//! checks the segment's index: it derives the entries the writer's stride
//! rule gives for the batches it verified, and at the segment's end
//! compares them with the entries in memory and the bytes of the `.index`
//! file. A difference (a flipped bit in the file, or entries loaded from
//! one at boot) is repaired locally: the index is derived data and the log
//! it was derived from has just been verified, so the file is rewritten
//! from the walk and memory replaced (`SegmentedLog::rewrite_sealed_index`).
//! Nothing checks a sealed index otherwise: boot trusts a well-formed one,
//! and reads seek by it.

use journal::SuperblockStore;
use storage::ReadBatches;
use storage::fs::Fs;
use storage::{IndexEntry, encode_entries};

use crate::bus::MessageBus;
use crate::partition::Partition;

/// The index entries a scrub derived from the batches it verified in one
/// sealed segment, from its first byte on without a gap.
#[derive(Debug, Default)]
pub(crate) struct DerivedIndex {
    segment_start: u64,
    /// Where the walk continues: the entries cover the bytes before it.
    next_position: u64,
    entries: Vec<IndexEntry>,
    /// The walk of this segment started at byte 0 and has no gap.
    whole: bool,
}

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
        if self.health.fenced().is_some()
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
        let Some((start, size, position)) = scrub_target(&sealed, self.scrub_cursor) else {
            self.scrub_cursor = ScrubCursor::default();
            return 0;
        };
        let advance = |from: u64| next_sealed(&sealed, from);
        match self.log.read_at(start, position, max_bytes).await {
            Ok(read) if read.next_position > position => {
                let bytes = read.next_position - position;
                self.derive_index(start, &read);
                if read.next_position >= size {
                    self.check_index(start, size).await;
                }
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

    /// Extends the derived index of segment `start` with the batches of
    /// `read` (a new derivation when it starts at byte 0; none when it does
    /// not continue the last one).
    fn derive_index(&mut self, start: u64, read: &ReadBatches) {
        let derived = &mut self.scrub_index;
        if read.position == 0 {
            *derived = DerivedIndex {
                segment_start: start,
                next_position: 0,
                entries: Vec::new(),
                whole: true,
            };
        } else if !(derived.whole
            && derived.segment_start == start
            && derived.next_position == read.position)
        {
            derived.whole = false;
            derived.entries = Vec::new();
            return;
        }
        let policy = self.log.config().index;
        let mut at = read.position;
        for batch in read.batches() {
            if policy.should_index(derived.entries.last(), at) {
                derived.entries.push(IndexEntry {
                    offset: batch.header().base_offset,
                    timestamp: batch.header().base_timestamp,
                    position: at,
                });
            }
            at = at.saturating_add(batch.bytes().len() as u64);
        }
        derived.next_position = at;
    }

    /// At the end of sealed segment `start` (`size` bytes): compares the
    /// derived entries with the index in memory and on disk, and rewrites
    /// both from the derivation when either differs.
    async fn check_index(&mut self, start: u64, size: u64) {
        let derived = std::mem::take(&mut self.scrub_index);
        if !derived.whole || derived.segment_start != start || derived.next_position != size {
            return;
        }
        let memory_ok = self.log.index_entries(start) == Some(derived.entries.as_slice());
        let expected = encode_entries(&derived.entries);
        let limit = (expected.len() as u64).saturating_add(1);
        let disk_ok = match self.log.read_sealed_index_file(start, limit).await {
            Ok(bytes) => bytes == expected,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), segment = start, %error, "could not read a sealed segment's index to check it");
                false
            }
        };
        if memory_ok && disk_ok {
            return;
        }
        tracing::warn!(
            dir = %self.dir.display(),
            segment = start,
            memory_ok,
            disk_ok,
            entries = derived.entries.len(),
            "a sealed segment's index differs from its verified log; rewriting it from the log"
        );
        match self.log.rewrite_sealed_index(start, derived.entries).await {
            Ok(()) => self.scrub_index_rewrites += 1,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), segment = start, %error, "could not rewrite a sealed segment's index; the next pass tries again")
            }
        }
    }

    /// Starts the scrub over with a new log (see
    /// [`Partition::replace_log`]): a batch boundary of the old files, read
    /// in the new ones, would be reported as damage.
    pub(crate) fn restart_scrub(&mut self) {
        self.scrub_cursor = ScrubCursor::default();
        self.scrub_index = DerivedIndex::default();
    }

    /// Sealed-segment indexes the scrub found different from their log and
    /// rewrote, since this partition was opened.
    pub fn scrub_index_rewrites(&self) -> u64 {
        self.scrub_index_rewrites
    }
}

/// Where the next scrub step reads, among `sealed` (start offset and size
/// of every sealed segment, by start offset): the cursor's segment where
/// it stopped, or the next one if retention removed it, or the oldest
/// after the newest. `None` when nothing is sealed.
fn scrub_target(sealed: &[(u64, u64)], cursor: ScrubCursor) -> Option<(u64, u64, u64)> {
    let first = *sealed.first()?;
    Some(
        match sealed.iter().find(|(s, _)| *s >= cursor.segment_start) {
            Some(&(s, size)) if s == cursor.segment_start && cursor.position < size => {
                (s, size, cursor.position)
            }
            Some(&(s, size)) if s != cursor.segment_start => (s, size, 0),
            _ => {
                let next = sealed.iter().find(|(s, _)| *s > cursor.segment_start);
                let &(s, size) = next.unwrap_or(&first);
                (s, size, 0)
            }
        },
    )
}

/// The sealed segment after the one starting at `from`, wrapping round to
/// the oldest.
fn next_sealed(sealed: &[(u64, u64)], from: u64) -> u64 {
    sealed
        .iter()
        .find(|(s, _)| *s > from)
        .or(sealed.first())
        .map_or(0, |(s, _)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEALED: [(u64, u64); 3] = [(0, 100), (10, 200), (20, 300)];

    fn at(segment_start: u64, position: u64) -> ScrubCursor {
        ScrubCursor {
            segment_start,
            position,
        }
    }

    #[test]
    fn given_nothing_sealed_when_targeted_should_read_nothing() {
        assert_eq!(scrub_target(&[], at(10, 5)), None);
    }

    #[test]
    fn given_a_cursor_inside_a_segment_when_targeted_should_resume_where_it_stopped() {
        assert_eq!(scrub_target(&SEALED, at(10, 50)), Some((10, 200, 50)));
        assert_eq!(
            scrub_target(&SEALED, ScrubCursor::default()),
            Some((0, 100, 0))
        );
    }

    #[test]
    fn given_a_cursor_whose_segment_retention_removed_when_targeted_should_start_the_next() {
        assert_eq!(scrub_target(&SEALED, at(5, 40)), Some((10, 200, 0)));
    }

    #[test]
    fn given_a_cursor_at_a_segment_end_or_past_the_newest_when_targeted_should_move_on_or_wrap() {
        assert_eq!(scrub_target(&SEALED, at(10, 200)), Some((20, 300, 0)));
        assert_eq!(scrub_target(&SEALED, at(20, 300)), Some((0, 100, 0)));
        assert_eq!(scrub_target(&SEALED, at(99, 0)), Some((0, 100, 0)));
    }

    #[test]
    fn given_sealed_segments_when_advancing_should_take_the_next_and_wrap_to_the_oldest() {
        assert_eq!(next_sealed(&SEALED, 0), 10);
        assert_eq!(next_sealed(&SEALED, 15), 20);
        assert_eq!(next_sealed(&SEALED, 20), 0);
    }
}
