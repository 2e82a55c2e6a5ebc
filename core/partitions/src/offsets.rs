//! Consumer and consumer-group offsets of one partition: the live maps
//! polls read, and the durable records the replicated ops wrote.
//!
//! Two views are kept on purpose:
//!
//! - the **live** maps (papaya, read without locking by the poll path):
//!   what `PollingStrategy::Next` continues from. A poll's auto-commit lands
//!   here at once (monotone) on the replica that served it, before the
//!   replicated store commits;
//! - the **durable** records (`BTreeMap`, deterministic order): exactly what
//!   committed stores and deletes left on disk, identical on every replica.
//!   State transfer snapshots these, never the live maps, so eager
//!   auto-commit progress is never promoted by a transfer.
//!
//! Each stored offset is one small checksummed file replaced through a
//! synced sibling ([`crate::offset_storage`]). The order of one store is:
//! sibling written and data-synced, renamed over the file, directory
//! synced, and only then the maps. A crash before the rename leaves the old
//! record and a sibling that boot sweeps; a crash after it leaves the new
//! record. A failed step leaves the maps at the old value, so the durable
//! record and the maps never disagree about a committed op.
//!
//! **Rolling back to the recorded applied point.** In a group, a record is
//! durable when its op is applied, before the superblock records that op
//! as applied; a restarted replica resumes from the recorded point and
//! applies later ops again as repair brings them back, and after a census
//! (or more than f failures) later op numbers may belong to other
//! requests. So each record carries the op that wrote it and `before`, the
//! value in effect at the applied point durable when it was written, and a
//! delete of an offset with such a value leaves a tombstone instead of
//! unlinking. Boot rolls every record written above the recorded point
//! back to its `before` ([`ConsumerOffsets::load`]).
//!
//! One level is enough because a record and the applied point are never
//! written at the same time (both under the partition's `&mut self`) and
//! the point is recorded only at the op last applied. A point recorded
//! after a record was written is therefore at or above its op; the only
//! recorded point a restart can resume from below its op is the one
//! durable when it was written. A record that replaces one written above
//! that same point inherits the older record's `before`.

use common::{ConsumerKind, Offset, Op};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use storage::fs::Fs;

use crate::offset_storage::{
    OffsetRecord, commit_offset_replacement, delete_persisted_offset, discard_offset_replacement,
    remove_offset_files, scan_offsets_dir, stage_offset_replacement,
};

/// What [`ConsumerOffsets::load`] found.
#[derive(Debug, Default)]
pub(crate) struct LoadedOffsets {
    /// Records clamped to the recovered end or dropped with an empty log.
    pub adjusted: usize,
    /// Records written above the recorded applied point and rolled back.
    pub rolled_back: usize,
    /// Records that did not verify, by offsets directory; left in place
    /// (see [`ConsumerOffsets::remove_corrupt`]).
    pub corrupt: Vec<(PathBuf, Vec<PathBuf>)>,
}

/// The durable state of one stored offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableOffset {
    /// The offset the last committed store made durable.
    pub committed_offset: Offset,
}

/// The committed, durable offsets of both kinds, in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurableOffsets {
    consumers: BTreeMap<u32, DurableOffset>,
    groups: BTreeMap<u32, DurableOffset>,
}

impl DurableOffsets {
    /// Runs `f` over the records of `kind`, in ascending id order.
    pub fn with_entries<R>(
        &self,
        kind: ConsumerKind,
        f: impl FnOnce(&BTreeMap<u32, DurableOffset>) -> R,
    ) -> R {
        f(self.map(kind))
    }

    /// The committed offset of `(kind, id)`.
    pub fn get(&self, kind: ConsumerKind, id: u32) -> Option<Offset> {
        self.map(kind).get(&id).map(|d| d.committed_offset)
    }

    fn map(&self, kind: ConsumerKind) -> &BTreeMap<u32, DurableOffset> {
        match kind {
            ConsumerKind::Consumer => &self.consumers,
            ConsumerKind::ConsumerGroup => &self.groups,
        }
    }

    fn map_mut(&mut self, kind: ConsumerKind) -> &mut BTreeMap<u32, DurableOffset> {
        match kind {
            ConsumerKind::Consumer => &mut self.consumers,
            ConsumerKind::ConsumerGroup => &mut self.groups,
        }
    }
}

/// The op a store or delete is applied for, and the applied point a
/// restart of this replica would resume from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedBy {
    /// The op being applied.
    pub op: Op,
    /// The durable recorded applied point; `None` when a restart keeps
    /// every record (a single replica applies nothing again).
    pub recorded_point: Option<Op>,
}

/// Where a record written above the recorded applied point came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Undo {
    /// The op that wrote it.
    op: Op,
    /// The value as of the applied point durable then.
    before: Option<Offset>,
}

/// What applying a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// The record now holds this offset.
    Stored(u64),
    /// An auto-commit at or below the durable value: nothing written.
    Unchanged,
}

/// The offsets of one partition: live maps, durable records, and the
/// directory they persist in.
#[derive(Debug)]
pub struct ConsumerOffsets {
    root: PathBuf,
    consumers: papaya::HashMap<u32, Offset>,
    groups: papaya::HashMap<u32, Offset>,
    durable: DurableOffsets,
    /// Per kind (consumers, then groups), the records an op wrote that a
    /// restart may still roll back, tombstones included.
    undo: [BTreeMap<u32, Undo>; 2],
}

impl ConsumerOffsets {
    /// Empty offsets persisting under `partition_dir/offsets`.
    pub fn new(partition_dir: &Path) -> Self {
        Self {
            root: partition_dir.join("offsets"),
            consumers: papaya::HashMap::new(),
            groups: papaya::HashMap::new(),
            durable: DurableOffsets::default(),
            undo: [BTreeMap::new(), BTreeMap::new()],
        }
    }

    /// The slot of `kind` in the per-kind arrays.
    fn kind_slot(kind: ConsumerKind) -> usize {
        usize::from(kind == ConsumerKind::ConsumerGroup)
    }

    fn undo_mut(&mut self, kind: ConsumerKind) -> &mut BTreeMap<u32, Undo> {
        &mut self.undo[Self::kind_slot(kind)]
    }

    /// The value of `(kind, id)` as of the applied point `recorded`.
    fn value_at(&self, kind: ConsumerKind, id: u32, recorded: Op) -> Option<Offset> {
        match self.undo[Self::kind_slot(kind)].get(&id) {
            Some(undo) if undo.op > recorded => undo.before,
            _ => self.durable.get(kind, id),
        }
    }

    /// The record `by` writes for `(kind, id)` holding `offset`.
    fn record_for(
        &self,
        kind: ConsumerKind,
        id: u32,
        offset: Option<Offset>,
        by: AppliedBy,
    ) -> OffsetRecord {
        OffsetRecord {
            offset,
            op: by.op,
            before: by
                .recorded_point
                .and_then(|point| self.value_at(kind, id, point)),
        }
    }

    /// The directory of one kind's files.
    pub fn dir(&self, kind: ConsumerKind) -> PathBuf {
        self.root.join(kind.dir_name())
    }

    fn path(&self, kind: ConsumerKind, id: u32) -> PathBuf {
        self.dir(kind).join(id.to_string())
    }

    fn live(&self, kind: ConsumerKind) -> &papaya::HashMap<u32, Offset> {
        match kind {
            ConsumerKind::Consumer => &self.consumers,
            ConsumerKind::ConsumerGroup => &self.groups,
        }
    }

    /// The live offset of `(kind, id)` (what `Next` continues from).
    pub fn get(&self, kind: ConsumerKind, id: u32) -> Option<Offset> {
        self.live(kind).pin().get(&id).copied()
    }

    /// The committed durable records.
    pub fn durable(&self) -> &DurableOffsets {
        &self.durable
    }

    /// A poll's eager auto-commit: the live value only moves forward.
    pub fn advance_live(&self, kind: ConsumerKind, id: u32, offset: Offset) {
        let map = self.live(kind).pin();
        let current = map.get(&id).copied();
        if current.is_none_or(|c| c < offset) {
            map.insert(id, offset);
        }
    }

    /// The lowest committed consumer-group offset (the retention barrier),
    /// `None` when no group has committed one.
    pub fn group_barrier(&self) -> Option<Offset> {
        self.durable
            .groups
            .values()
            .map(|d| d.committed_offset)
            .min()
    }

    /// Loads both directories at boot: leftover siblings are removed, torn
    /// or corrupt files reported and left for the caller (see
    /// [`scan_offsets_dir`] and [`Self::remove_corrupt`]). With
    /// `recorded_point` (a replica of a group), a record an op above it
    /// wrote is rolled back to the value it replaced; tombstones at or
    /// below it are removed. Offsets above `last_offset` (the recovered
    /// end, `None` for an empty log) are then clamped to it, or dropped
    /// with their file when the log is empty. Every change is durable
    /// before this returns, so the next boot reads the same.
    pub(crate) async fn load<F: Fs>(
        &mut self,
        fs: &F,
        last_offset: Option<Offset>,
        recorded_point: Option<Op>,
    ) -> io::Result<LoadedOffsets> {
        let mut loaded = LoadedOffsets::default();
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            let dir = self.dir(kind);
            let stored = scan_offsets_dir(fs, &dir).await?;
            if !stored.corrupt.is_empty() {
                loaded.corrupt.push((dir.clone(), stored.corrupt.clone()));
            }
            let mut removed_any = false;
            for (id, record) in stored.offsets {
                let (value, rolled_back) =
                    settled_value(kind, id, &record, recorded_point, last_offset, &mut loaded);
                match value {
                    Some(v) => {
                        if value != record.offset || rolled_back {
                            // Rewritten so the next boot agrees without
                            // adjusting again (and a transfer ships truth).
                            self.write(fs, kind, id, &OffsetRecord::settled(v)).await?;
                        }
                        // Nothing to undo any more: a record kept here is
                        // at or below the point a restart resumes from.
                        self.live(kind).pin().insert(id, v);
                        self.durable.map_mut(kind).insert(
                            id,
                            DurableOffset {
                                committed_offset: v,
                            },
                        );
                    }
                    None => {
                        delete_persisted_offset(fs, &self.path(kind, id)).await?;
                        removed_any = true;
                    }
                }
            }
            if removed_any {
                fs.sync_dir(&dir).await?;
            }
        }
        Ok(loaded)
    }

    /// Removes the corrupt records [`Self::load`] reported, each directory
    /// synced once.
    pub(crate) async fn remove_corrupt<F: Fs>(
        fs: &F,
        corrupt: &[(PathBuf, Vec<PathBuf>)],
    ) -> io::Result<()> {
        for (dir, paths) in corrupt {
            remove_offset_files(fs, dir, paths).await?;
        }
        Ok(())
    }

    /// Replaces the record of `(kind, id)` with `record` durably (sibling,
    /// rename, directory sync). The maps are not touched.
    async fn write<F: Fs>(
        &self,
        fs: &F,
        kind: ConsumerKind,
        id: u32,
        record: &OffsetRecord,
    ) -> io::Result<()> {
        let dir = self.dir(kind);
        // A no-op once the directory exists; its name must be durable
        // before a file in it can be (the parent is synced once, here).
        if !fs.exists(&dir).await? {
            fs.create_dir_all(&dir).await?;
            fs.sync_dir(&self.root).await?;
            if let Some(parent) = self.root.parent() {
                fs.sync_dir(parent).await?;
            }
        }
        let path = self.path(kind, id);
        if let Err(e) = stage_offset_replacement(fs, &path, *record).await {
            discard_offset_replacement(fs, &path).await;
            return Err(e);
        }
        commit_offset_replacement(fs, &path).await?;
        // The rename is the commit point only once the directory is synced;
        // before that a crash may keep the old record (and the sibling is
        // swept at boot).
        fs.sync_dir(&dir).await
    }

    /// Applies a committed store. An auto-commit only advances the durable
    /// value; an explicit store may rewind it. Durable before the maps move.
    pub async fn apply_store<F: Fs>(
        &mut self,
        fs: &F,
        kind: ConsumerKind,
        id: u32,
        offset: u64,
        auto_commit: bool,
        by: AppliedBy,
    ) -> io::Result<StoreOutcome> {
        let current = self.durable.get(kind, id);
        if auto_commit && current.is_some_and(|c| c >= Offset(offset)) {
            return Ok(StoreOutcome::Unchanged);
        }
        if current == Some(Offset(offset)) {
            return Ok(StoreOutcome::Unchanged);
        }
        let record = self.record_for(kind, id, Some(Offset(offset)), by);
        self.write(fs, kind, id, &record).await?;
        self.durable.map_mut(kind).insert(
            id,
            DurableOffset {
                committed_offset: Offset(offset),
            },
        );
        self.note_undo(kind, id, &record, by);
        let live = self.live(kind).pin();
        // The live map may be ahead through an eager auto-commit; an
        // auto-commit never pulls it back, an explicit store sets it.
        if !auto_commit || live.get(&id).is_none_or(|c| *c < Offset(offset)) {
            live.insert(id, Offset(offset));
        }
        Ok(StoreOutcome::Stored(offset))
    }

    /// Applies a committed delete, durable before the maps change: a
    /// tombstone when a restart could have to bring back an earlier value
    /// (see the module documentation), an unlink otherwise, then the
    /// directory sync. Returns whether a durable offset existed.
    pub async fn apply_delete<F: Fs>(
        &mut self,
        fs: &F,
        kind: ConsumerKind,
        id: u32,
        by: AppliedBy,
    ) -> io::Result<bool> {
        let existed = self.durable.get(kind, id).is_some();
        if existed {
            let tombstone = self.record_for(kind, id, None, by);
            if tombstone.before.is_some() {
                self.write(fs, kind, id, &tombstone).await?;
            } else {
                delete_persisted_offset(fs, &self.path(kind, id)).await?;
                fs.sync_dir(&self.dir(kind)).await?;
            }
            self.note_undo(kind, id, &tombstone, by);
        }
        self.durable.map_mut(kind).remove(&id);
        self.live(kind).pin().remove(&id);
        Ok(existed)
    }

    /// Remembers what `record`, just made durable by `by`, rolls back to,
    /// for the next write of the same id before the point moves past it
    /// (a record with no `before` still needs its entry: the value as of
    /// the point was none).
    fn note_undo(&mut self, kind: ConsumerKind, id: u32, record: &OffsetRecord, by: AppliedBy) {
        if by.recorded_point.is_some() {
            self.undo_mut(kind).insert(
                id,
                Undo {
                    op: record.op,
                    before: record.before,
                },
            );
        }
    }

    /// The applied point `point` is recorded: records at or below it can
    /// no longer be rolled back. Every applied op is at or below a point
    /// recorded at the op last applied, so this usually empties the map.
    pub(crate) fn settle(&mut self, point: u64) {
        for undo in &mut self.undo {
            undo.retain(|_, u| u.op > Op(point));
        }
    }

    /// Replaces both kinds' live and durable maps with `entries` (a
    /// state-transfer install, after its files were renamed in and the
    /// directories synced). The live maps are cleared and refilled in
    /// place, so handles to them keep reading the same maps.
    pub(crate) fn replace_installed(&mut self, entries: &[(ConsumerKind, u32, u64)]) {
        self.consumers.pin().clear();
        self.groups.pin().clear();
        self.durable = DurableOffsets::default();
        self.undo = [BTreeMap::new(), BTreeMap::new()];
        for &(kind, id, offset) in entries {
            self.live(kind).pin().insert(id, Offset(offset));
            self.durable.map_mut(kind).insert(
                id,
                DurableOffset {
                    committed_offset: Offset(offset),
                },
            );
        }
    }

    /// Removes every offset file of both kinds (and any stray file in the
    /// directories), syncing each directory once, then clears the maps
    /// (purge).
    pub async fn clear_all<F: Fs>(&mut self, fs: &F) -> io::Result<()> {
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            let dir = self.dir(kind);
            let entries = match fs.read_dir(&dir).await {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                if entry.kind != storage::fs::FileKind::File {
                    continue;
                }
                match entry.name_str() {
                    Some(name) if crate::offset_storage::is_owned_offset_file(name) => {
                        delete_persisted_offset(fs, &dir.join(name)).await?;
                    }
                    _ => {
                        tracing::warn!(path = %dir.join(&entry.name).display(), "leaving a foreign file in an offsets directory");
                    }
                }
            }
            fs.sync_dir(&dir).await?;
        }
        self.consumers.pin().clear();
        self.groups.pin().clear();
        self.durable = DurableOffsets::default();
        self.undo = [BTreeMap::new(), BTreeMap::new()];
        Ok(())
    }
}

/// What a stored record settles to at boot, and whether it was rolled
/// back: with `recorded_point`, a record an op above it wrote goes back to
/// the value it replaced; then a value above `last_offset` (the recovered
/// end, `None` for an empty log) is clamped to it, or dropped when the log
/// is empty. Each change is logged and counted in `loaded`.
fn settled_value(
    kind: ConsumerKind,
    id: u32,
    record: &OffsetRecord,
    recorded_point: Option<Op>,
    last_offset: Option<Offset>,
    loaded: &mut LoadedOffsets,
) -> (Option<Offset>, bool) {
    let rolled_back = recorded_point.is_some_and(|point| record.op > point);
    let value = if rolled_back {
        tracing::warn!(
            ?kind,
            id,
            op = record.op.0,
            recorded_point = recorded_point.map(|p| p.0),
            offset = record.offset.map(|o| o.0),
            before = record.before.map(|o| o.0),
            "rolling back a consumer offset written above the recorded applied point"
        );
        loaded.rolled_back += 1;
        record.before
    } else {
        record.offset
    };
    let Some(offset) = value else {
        return (None, rolled_back);
    };
    match last_offset {
        Some(last) if offset > last => {
            tracing::warn!(
                ?kind,
                id,
                offset = offset.0,
                last = last.0,
                "clamping a stored offset to the recovered end"
            );
            loaded.adjusted += 1;
            (Some(last), rolled_back)
        }
        Some(_) => (Some(offset), rolled_back),
        None => {
            tracing::warn!(
                ?kind,
                id,
                offset = offset.0,
                "dropping a stored offset: the log is empty"
            );
            loaded.adjusted += 1;
            (None, rolled_back)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The rollback argument checked against a model: random stores,
    //! deletes and applied-point records, a crash (with a fault inside the
    //! last write), boot from the recorded point, then a different history
    //! after it (what a census does), a second crash and boot.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use futures::executor::block_on;
    use proptest::prelude::*;
    use storage::fs::{EIO, FaultKind, SimFs};

    #[derive(Debug, Clone, Copy)]
    enum Event {
        Store { id: u32, offset: u64, auto: bool },
        Delete { id: u32 },
        Record,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => (0u32..4, 0u64..6, any::<bool>())
                .prop_map(|(id, offset, auto)| Event::Store { id, offset, auto }),
            2 => (0u32..4).prop_map(|id| Event::Delete { id }),
            1 => Just(Event::Record),
        ]
    }

    type State = BTreeMap<(bool, u32), u64>;

    /// The committed-offset rules of `apply_store` and `apply_delete`.
    fn model(state: &mut State, kind: bool, event: Event) {
        match event {
            Event::Store { id, offset, auto } => {
                let current = state.get(&(kind, id)).copied();
                if !(auto && current.is_some_and(|c| c >= offset)) {
                    state.insert((kind, id), offset);
                }
            }
            Event::Delete { id } => {
                state.remove(&(kind, id));
            }
            Event::Record => {}
        }
    }

    fn kind_of(group: bool) -> ConsumerKind {
        if group {
            ConsumerKind::ConsumerGroup
        } else {
            ConsumerKind::Consumer
        }
    }

    fn snapshot(offsets: &ConsumerOffsets) -> State {
        let mut out = State::new();
        for group in [false, true] {
            offsets.durable().with_entries(kind_of(group), |m| {
                for (id, d) in m {
                    out.insert((group, *id), d.committed_offset.0);
                }
            });
        }
        out
    }

    struct Life {
        /// The op last applied.
        op: u64,
        /// The recorded applied point.
        recorded: u64,
        /// The model's state after each op from `recorded` on.
        states: BTreeMap<u64, State>,
    }

    /// Applies `events` from `life`'s point; the last one's write fails
    /// when `fail_last` (its op then never took effect).
    fn run(
        fs: &SimFs,
        offsets: &mut ConsumerOffsets,
        life: &mut Life,
        events: &[(bool, Event)],
        fail_last: bool,
    ) {
        for (i, &(group, event)) in events.iter().enumerate() {
            let kind = kind_of(group);
            if let Event::Record = event {
                offsets.settle(life.op);
                life.recorded = life.op;
                continue;
            }
            let failing = fail_last && i + 1 == events.len();
            if failing {
                fs.fail_nth(FaultKind::Rename, 1, EIO);
            }
            let op = life.op + 1;
            let by = AppliedBy {
                op: Op(op),
                recorded_point: Some(Op(life.recorded)),
            };
            let result = block_on(async {
                match event {
                    Event::Store { id, offset, auto } => offsets
                        .apply_store(fs, kind, id, offset, auto, by)
                        .await
                        .map(|_| ()),
                    Event::Delete { id } => {
                        offsets.apply_delete(fs, kind, id, by).await.map(|_| ())
                    }
                    Event::Record => Ok(()),
                }
            });
            fs.clear_faults();
            if result.is_err() {
                // A failed apply fences the partition: nothing more runs.
                return;
            }
            let mut state = life.states[&life.op].clone();
            model(&mut state, group, event);
            life.op = op;
            life.states.insert(op, state);
        }
    }

    fn boot(fs: &SimFs, recorded: u64) -> (ConsumerOffsets, LoadedOffsets) {
        let mut offsets = ConsumerOffsets::new(Path::new("/p"));
        let loaded =
            block_on(offsets.load(fs, Some(Offset(u64::MAX)), Some(Op(recorded)))).unwrap();
        assert!(loaded.corrupt.is_empty());
        (offsets, loaded)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn given_a_crash_anywhere_when_booted_from_the_recorded_point_should_hold_the_state_as_of_it(
            seed in any::<u64>(),
            first in proptest::collection::vec((any::<bool>(), event()), 1..40),
            second in proptest::collection::vec((any::<bool>(), event()), 1..40),
            fail_first in any::<bool>(),
            fail_second in any::<bool>(),
        ) {
            let fs = SimFs::new(seed);
            block_on(async {
                fs.create_dir_all(Path::new("/p")).await.unwrap();
                fs.sync_dir(Path::new("/")).await.unwrap();
            });
            let mut offsets = ConsumerOffsets::new(Path::new("/p"));
            let mut life = Life { op: 0, recorded: 0, states: BTreeMap::from([(0, State::new())]) };
            run(&fs, &mut offsets, &mut life, &first, fail_first);
            fs.crash();
            let (mut offsets, _) = boot(&fs, life.recorded);
            let at_point = life.states[&life.recorded].clone();
            prop_assert_eq!(snapshot(&offsets), at_point.clone(), "first boot from {}", life.recorded);
            // Rebooting again changes nothing.
            fs.crash();
            let (again, loaded) = boot(&fs, life.recorded);
            prop_assert_eq!(snapshot(&again), at_point.clone());
            prop_assert_eq!(loaded.rolled_back, 0);

            // Another history after the point: the same op numbers, other
            // requests.
            let mut life = Life {
                op: life.recorded,
                recorded: life.recorded,
                states: BTreeMap::from([(life.recorded, at_point)]),
            };
            run(&fs, &mut offsets, &mut life, &second, fail_second);
            fs.crash();
            let (offsets, _) = boot(&fs, life.recorded);
            prop_assert_eq!(snapshot(&offsets), life.states[&life.recorded].clone(), "second boot from {}", life.recorded);
        }
    }
}
