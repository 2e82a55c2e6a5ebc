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

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use common::ConsumerKind;
use storage::fs::Fs;

use crate::offset_storage::{
    commit_offset_replacement, delete_persisted_offset, discard_offset_replacement,
    remove_offset_files, scan_offsets_dir, stage_offset_replacement,
};

/// What [`ConsumerOffsets::load`] found.
#[derive(Debug, Default)]
pub(crate) struct LoadedOffsets {
    /// Records clamped to the recovered end or dropped with an empty log.
    pub adjusted: usize,
    /// Records that did not verify, by offsets directory; left in place
    /// (see [`ConsumerOffsets::remove_corrupt`]).
    pub corrupt: Vec<(PathBuf, Vec<PathBuf>)>,
}

/// The durable state of one stored offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableOffset {
    /// The offset the last committed store made durable.
    pub committed_offset: u64,
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
    pub fn get(&self, kind: ConsumerKind, id: u32) -> Option<u64> {
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
    consumers: papaya::HashMap<u32, u64>,
    groups: papaya::HashMap<u32, u64>,
    durable: DurableOffsets,
}

impl ConsumerOffsets {
    /// Empty offsets persisting under `partition_dir/offsets`.
    pub fn new(partition_dir: &Path) -> Self {
        Self {
            root: partition_dir.join("offsets"),
            consumers: papaya::HashMap::new(),
            groups: papaya::HashMap::new(),
            durable: DurableOffsets::default(),
        }
    }

    /// The directory of one kind's files.
    pub fn dir(&self, kind: ConsumerKind) -> PathBuf {
        self.root.join(kind.dir_name())
    }

    fn path(&self, kind: ConsumerKind, id: u32) -> PathBuf {
        self.dir(kind).join(id.to_string())
    }

    fn live(&self, kind: ConsumerKind) -> &papaya::HashMap<u32, u64> {
        match kind {
            ConsumerKind::Consumer => &self.consumers,
            ConsumerKind::ConsumerGroup => &self.groups,
        }
    }

    /// The live offset of `(kind, id)` (what `Next` continues from).
    pub fn get(&self, kind: ConsumerKind, id: u32) -> Option<u64> {
        self.live(kind).pin().get(&id).copied()
    }

    /// The committed durable records.
    pub fn durable(&self) -> &DurableOffsets {
        &self.durable
    }

    /// A poll's eager auto-commit: the live value only moves forward.
    pub fn advance_live(&self, kind: ConsumerKind, id: u32, offset: u64) {
        let map = self.live(kind).pin();
        let current = map.get(&id).copied();
        if current.is_none_or(|c| c < offset) {
            map.insert(id, offset);
        }
    }

    /// The lowest committed consumer-group offset (the retention barrier),
    /// `None` when no group has committed one.
    pub fn group_barrier(&self) -> Option<u64> {
        self.durable
            .groups
            .values()
            .map(|d| d.committed_offset)
            .min()
    }

    /// Loads both directories at boot: leftover siblings are removed, torn
    /// or corrupt files reported and left for the caller (see
    /// [`scan_offsets_dir`] and [`Self::remove_corrupt`]); offsets above
    /// `last_offset` (the recovered end, `None` for an empty log) are
    /// clamped to it, or dropped with their file when the log is empty.
    pub(crate) async fn load<F: Fs>(
        &mut self,
        fs: &F,
        last_offset: Option<u64>,
    ) -> io::Result<LoadedOffsets> {
        let mut loaded = LoadedOffsets::default();
        let mut adjusted = 0;
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            let dir = self.dir(kind);
            let stored = scan_offsets_dir(fs, &dir).await?;
            if !stored.corrupt.is_empty() {
                loaded.corrupt.push((dir.clone(), stored.corrupt.clone()));
            }
            let mut removed_any = false;
            for (id, offset) in stored.offsets {
                let value = match last_offset {
                    Some(last) if offset > last => {
                        tracing::warn!(
                            ?kind,
                            id,
                            offset,
                            last,
                            "clamping a stored offset to the recovered end"
                        );
                        adjusted += 1;
                        Some(last)
                    }
                    Some(_) => Some(offset),
                    None => {
                        tracing::warn!(
                            ?kind,
                            id,
                            offset,
                            "dropping a stored offset: the log is empty"
                        );
                        adjusted += 1;
                        None
                    }
                };
                match value {
                    Some(v) => {
                        if v != offset {
                            // Rewrite it so the next boot agrees without
                            // clamping again (and a transfer ships truth).
                            self.write(fs, kind, id, v).await?;
                        }
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
        loaded.adjusted = adjusted;
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

    /// Replaces the record of `(kind, id)` with `offset` durably (sibling,
    /// rename, directory sync). The maps are not touched.
    async fn write<F: Fs>(
        &self,
        fs: &F,
        kind: ConsumerKind,
        id: u32,
        offset: u64,
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
        if let Err(e) = stage_offset_replacement(fs, &path, offset).await {
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
    ) -> io::Result<StoreOutcome> {
        let current = self.durable.get(kind, id);
        if auto_commit && current.is_some_and(|c| c >= offset) {
            return Ok(StoreOutcome::Unchanged);
        }
        if current == Some(offset) {
            return Ok(StoreOutcome::Unchanged);
        }
        self.write(fs, kind, id, offset).await?;
        self.durable.map_mut(kind).insert(
            id,
            DurableOffset {
                committed_offset: offset,
            },
        );
        let live = self.live(kind).pin();
        // The live map may be ahead through an eager auto-commit; an
        // auto-commit never pulls it back, an explicit store sets it.
        if !auto_commit || live.get(&id).is_none_or(|c| *c < offset) {
            live.insert(id, offset);
        }
        Ok(StoreOutcome::Stored(offset))
    }

    /// Applies a committed delete: unlink, directory sync, then the maps.
    /// Returns whether a durable record existed.
    pub async fn apply_delete<F: Fs>(
        &mut self,
        fs: &F,
        kind: ConsumerKind,
        id: u32,
    ) -> io::Result<bool> {
        let existed = delete_persisted_offset(fs, &self.path(kind, id)).await?;
        if existed {
            fs.sync_dir(&self.dir(kind)).await?;
        }
        self.durable.map_mut(kind).remove(&id);
        self.live(kind).pin().remove(&id);
        Ok(existed)
    }

    /// Replaces both kinds' live and durable maps with `entries` (a
    /// state-transfer install, after its files were renamed in and the
    /// directories synced). The live maps are cleared and refilled in
    /// place, so handles to them keep reading the same maps.
    pub(crate) fn replace_installed(&mut self, entries: &[(ConsumerKind, u32, u64)]) {
        self.consumers.pin().clear();
        self.groups.pin().clear();
        self.durable = DurableOffsets::default();
        for &(kind, id, offset) in entries {
            self.live(kind).pin().insert(id, offset);
            self.durable.map_mut(kind).insert(
                id,
                DurableOffset {
                    committed_offset: offset,
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
        Ok(())
    }
}
