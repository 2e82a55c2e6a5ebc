//! The check phase (ST-I1): every refusal an install can meet, before
//! anything on disk or in memory changes, then the planned offset writes
//! staged as data-synced siblings that nothing trusts until renamed.

use common::{ConsumerKind, Offset, Op};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use journal::SuperblockStore;
use storage::fs::Fs;

use super::errors::PartitionInstallError;
use super::{InstallInput, StagedSegment, segment_files, swap_io, with_retry};
use crate::bus::MessageBus;
use crate::offset_storage::{discard_offset_replacement, stage_offset_replacement};
use crate::partition::Partition;
use crate::state_transfer::wire::ConsumerOffsetsWire;

/// One consumer-offset file the install will write.
#[derive(Debug, Clone)]
pub(super) struct PlannedOffsetWrite {
    pub(super) kind: ConsumerKind,
    pub(super) id: u32,
    pub(super) path: PathBuf,
    pub(super) value: u64,
}

/// An install that passed the check phase.
pub(super) struct CheckedInstall {
    pub(super) commit_op: u64,
    pub(super) checksum: u128,
    pub(super) wire: ConsumerOffsetsWire,
    pub(super) staged: Vec<StagedSegment>,
    pub(super) frontier: u64,
    pub(super) purge_advances: bool,
    pub(super) planned: Vec<PlannedOffsetWrite>,
    /// The directory's segment and staging files when it was checked
    /// ([`segment_files`]); nothing else changes them until the swap.
    pub(super) existing: Vec<PathBuf>,
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// ST-I1: every refusal, in an order that reads nothing it need not.
    pub(super) async fn check_install(
        &self,
        input: InstallInput,
    ) -> Result<CheckedInstall, PartitionInstallError> {
        if let Some(reason) = self.health.fenced() {
            return Err(PartitionInstallError::Fenced {
                reason: reason.to_owned(),
            });
        }
        let InstallInput {
            commit_op,
            commit_checksum,
            mut staged,
            offsets_artifact,
        } = input;
        self.check_install_op(commit_op)?;
        let wire = ConsumerOffsetsWire::decode(&offsets_artifact)?;
        let purge_advances = self.check_offset_space(&wire)?;
        let frontier = wire.next_offset;
        check_segment_chain(&mut staged, frontier)?;
        let existing = self.check_staged_present(&staged).await?;
        let mut scratch = self.replica.client_table().clone();
        scratch
            .install(&wire.dedup)
            .map_err(PartitionInstallError::Dedup)?;
        let planned = self.plan_offset_writes(&wire);
        Ok(CheckedInstall {
            commit_op: commit_op.0,
            checksum: commit_checksum,
            wire,
            staged,
            frontier: frontier.0,
            purge_advances,
            planned,
            existing,
        })
    }

    /// Whether the offer's op may be installed here.
    fn check_install_op(&self, commit_op: Op) -> Result<(), PartitionInstallError> {
        // Below the applied point the install would rewind applied ops;
        // below an op this replica acknowledged it would erase a journaled
        // op whose ack may be part of the quorum that committed it (the
        // install clears the journal above its op). The reference bounds
        // by `commit_max` instead, which also refuses every offer the group
        // committed past during the pull: under steady load a pull never
        // lands. Ops committed above the offer that this replica never
        // acknowledged are not lost by erasing them here: a quorum holds
        // them without this replica, and journal repair brings them back.
        // Peer-supplied: every later step computes the op after it.
        if commit_op > Op(consensus::vsr::OP_MAX) {
            return Err(PartitionInstallError::OpOutOfRange {
                commit_op,
                max: Op(consensus::vsr::OP_MAX),
            });
        }
        let local_commit = self
            .replica
            .commit_min()
            .max(self.replica.acknowledged_max());
        if commit_op < local_commit {
            return Err(PartitionInstallError::StaleTransfer {
                commit_op,
                commit_min: local_commit,
            });
        }
        Ok(())
    }

    /// Whether the offer's offset space may replace this replica's:
    /// returns whether the install advances the purge generation.
    fn check_offset_space(
        &self,
        wire: &ConsumerOffsetsWire,
    ) -> Result<bool, PartitionInstallError> {
        // An offer from before a purge this replica applied would bring
        // back purged data. One from before a purge only the metadata
        // plane committed would not: the partition's purge op, once
        // proposed, comes after the offer's op and is applied by repair.
        // Refusing it (as this did) deadlocks a group whose purge cannot
        // commit without the replicas that need the transfer.
        let local_generation = self.applied_purge_generation;
        if wire.purge_generation < local_generation {
            return Err(PartitionInstallError::PurgeGenerationBehind {
                offered: wire.purge_generation,
                local: local_generation,
            });
        }
        // A purge this replica never applied is the one legitimate way the
        // offset space moves down. `applied_purge_generation` is safe to
        // compare here: a purge's first durable step resets the superblock
        // frontier to 0, so a replica that crashed before recording
        // `purge.gen` already has a local frontier of 0 and the rewind
        // guard below has nothing to protect.
        let purge_advances = wire.purge_generation > self.applied_purge_generation;
        let local_next = Offset(self.applied_next_offset).max(self.durable_offset_frontier());
        let frontier = wire.next_offset;
        if !purge_advances && frontier < local_next {
            return Err(PartitionInstallError::OfferRewindsDurableData {
                offer_next_offset: frontier,
                local_next_offset: local_next,
            });
        }
        Ok(purge_advances)
    }

    /// Whether every staged segment's files are in the directory; returns
    /// the listing, which the swap reuses.
    async fn check_staged_present(
        &self,
        staged: &[StagedSegment],
    ) -> Result<Vec<PathBuf>, PartitionInstallError> {
        // One listing, not a call per file: a chain of thousands of
        // segments is checked without thousands of round trips. The swap
        // reuses it.
        let existing = segment_files(&self.fs, &self.dir)
            .await
            .map_err(swap_io(&self.dir))?;
        let present: HashSet<&Path> = existing.iter().map(PathBuf::as_path).collect();
        for s in staged {
            let (log, index) = s.staging_paths(&self.dir);
            for path in [log, index] {
                if !present.contains(path.as_path()) {
                    return Err(PartitionInstallError::SwapIo {
                        source: io::Error::new(io::ErrorKind::NotFound, "staged file missing"),
                        path,
                    });
                }
            }
        }
        Ok(existing)
    }

    /// The consumer-offset records the install writes, each clamped to the
    /// installed end.
    fn plan_offset_writes(&self, wire: &ConsumerOffsetsWire) -> Vec<PlannedOffsetWrite> {
        // Offsets point at a consumed message, so at most the installed
        // end; with nothing ever minted there is nothing to point at.
        let last = wire.next_offset.checked_prev();
        let mut planned = Vec::with_capacity(wire.consumers.len() + wire.groups.len());
        for (kind, entries) in [
            (ConsumerKind::Consumer, &wire.consumers),
            (ConsumerKind::ConsumerGroup, &wire.groups),
        ] {
            let dir = self.offsets.dir(kind);
            planned.extend(entries.iter().filter_map(|&(id, offset)| {
                last.map(|last| PlannedOffsetWrite {
                    kind,
                    id,
                    path: dir.join(id.to_string()),
                    value: offset.min(last).0,
                })
            }));
        }
        planned
    }

    /// Writes and data-syncs every planned offset as an ignored sibling,
    /// before anything destructive. Sequential on purpose: the filesystem
    /// calls of one partition run on its shard's single reactor (and the
    /// simulator's), so overlapping them buys queue depth, not wall time,
    /// while a fixed order keeps fault injection and crash points
    /// reproducible. Each file is retried with backoff.
    pub(super) async fn stage_offset_writes(
        &self,
        planned: &[PlannedOffsetWrite],
    ) -> Result<(), PartitionInstallError> {
        let mut created_dirs = false;
        for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
            if !planned.iter().any(|w| w.kind == kind) {
                continue;
            }
            let dir = self.offsets.dir(kind);
            let create = async {
                if !self.fs.exists(&dir).await? {
                    self.fs.create_dir_all(&dir).await?;
                    created_dirs = true;
                }
                Ok::<(), io::Error>(())
            };
            create
                .await
                .map_err(|source| PartitionInstallError::OffsetPersistence {
                    path: dir.clone(),
                    source,
                })?;
        }
        if created_dirs {
            // The new directories' names, before files in them count.
            let root = self.dir.join("offsets");
            for d in [root.as_path(), self.dir.as_path()] {
                self.fs.sync_dir(d).await.map_err(|source| {
                    PartitionInstallError::OffsetPersistence {
                        path: d.to_path_buf(),
                        source,
                    }
                })?;
            }
        }
        for write in planned {
            let staged = with_retry(&self.fs, &write.path, || {
                stage_offset_replacement(
                    &self.fs,
                    &write.path,
                    crate::offset_storage::OffsetRecord::settled(Offset(write.value)),
                )
            })
            .await;
            if let Err(source) = staged {
                self.discard_offset_writes(planned).await;
                return Err(PartitionInstallError::OffsetPersistence {
                    path: write.path.clone(),
                    source,
                });
            }
        }
        Ok(())
    }

    pub(super) async fn discard_offset_writes(&self, planned: &[PlannedOffsetWrite]) {
        for write in planned {
            discard_offset_replacement(&self.fs, &write.path).await;
        }
    }
}

/// Sorts the staged segments and checks they form one chain, each holding
/// at least one message, that ends exactly where `frontier` starts.
fn check_segment_chain(
    staged: &mut [StagedSegment],
    frontier: Offset,
) -> Result<(), PartitionInstallError> {
    staged.sort_unstable_by_key(|s| s.start_offset);
    for s in staged.iter() {
        // A staged segment holds at least one message.
        if s.end_offset < s.start_offset {
            return Err(PartitionInstallError::SegmentSetHole {
                previous_end: s.end_offset,
                next_start: s.start_offset,
            });
        }
    }
    for pair in staged.windows(2) {
        if pair[1].start_offset == pair[0].start_offset {
            return Err(PartitionInstallError::DuplicateSegment {
                start_offset: pair[1].start_offset,
            });
        }
        if Some(pair[1].start_offset) != pair[0].end_offset.checked_add(1) {
            return Err(PartitionInstallError::SegmentSetHole {
                previous_end: pair[0].end_offset,
                next_start: pair[1].start_offset,
            });
        }
    }
    // The chain must end exactly where the frontier starts: below it
    // would leave offsets no segment holds under an active segment the
    // storage could not name, above it would contradict the artifact.
    if let Some(last) = staged.last()
        && last.end_offset.checked_add(1) != Some(frontier)
    {
        return Err(PartitionInstallError::SegmentSetHole {
            previous_end: last.end_offset,
            next_start: frontier,
        });
    }
    Ok(())
}
