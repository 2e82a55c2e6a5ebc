//! The preparation of an accepted offer (ST-R3 reuse, ST-B2 resume): the
//! staged files an earlier attempt left are re-read in budgeted steps,
//! whole logs that match are adopted, the synced prefix of an interrupted
//! spill is continued, and everything else is swept, before the first
//! chunk is requested.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use consensus::{ArtifactKind, ArtifactProgress};
use storage::fs::Fs;

use super::{
    AcceptedDescriptor, AcceptedTransfer, IgnoreReason, LocalFacts, PendingArtifact, Preparation,
    ReceiveStep, ReceiverConfig, ReceiverStats, SessionStage, TransferArtifact, TransferReceiver,
};
use crate::state_transfer::spill::{
    PrefixRehash, ResumePoint, SegmentSpill, StagedSegmentMeta, segment_manifest_digest,
    staged_len_matches, sweep_staging_except,
};

/// The result of the last reuse scan, keyed by the manifest's segment
/// digest, kept current as new segments are staged.
#[derive(Debug, Clone)]
pub(super) struct ReuseScanMemo {
    pub(super) digest: u64,
    pub(super) adopted: BTreeMap<usize, StagedSegmentMeta>,
}

impl ReuseScanMemo {
    /// Records a segment staged for the offer with manifest `digest`, so a
    /// re-armed pull of the same offer adopts it without a re-read. A memo
    /// for another offer is replaced.
    pub(super) fn remember(
        memo: &mut Option<Self>,
        digest: u64,
        artifact: usize,
        meta: StagedSegmentMeta,
    ) {
        match memo.as_mut().filter(|m| m.digest == digest) {
            Some(memo) => {
                memo.adopted.insert(artifact, meta);
            }
            None => {
                *memo = Some(Self {
                    digest,
                    adopted: BTreeMap::from([(artifact, meta)]),
                });
            }
        }
    }
}

/// Which staged file an accepted offer's preparation is re-reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Candidate {
    /// A whole staged log, to adopt if it matches.
    Adopt,
    /// The synced prefix of an interrupted spill, to continue.
    Resume,
}

impl<F: Fs> TransferReceiver<F> {
    /// Starts preparing an accepted offer: a memo hit (the same segments
    /// as the last scan, their files still there) adopts from the memo;
    /// otherwise every staged log is a candidate for a re-read.
    pub(super) async fn begin_preparation(
        &mut self,
        descriptor: AcceptedDescriptor,
    ) -> Preparation<F::File> {
        let digest = segment_manifest_digest(&descriptor.manifest);
        let mut adopted = BTreeMap::new();
        let mut memo_hit = false;
        if let Some(memo) = self.reuse_memo.as_ref().filter(|m| m.digest == digest) {
            // The memo proves the bytes were validated; only their presence
            // needs checking (an install or a sweep may have removed them).
            let mut intact = true;
            for meta in memo.adopted.values() {
                let log = self.fs.metadata(&meta.log_staging).await;
                let index = self.fs.metadata(&meta.index_staging).await;
                if !matches!(log, Ok(m) if m.len == meta.size_bytes) || index.is_err() {
                    intact = false;
                    break;
                }
            }
            if intact {
                adopted.clone_from(&memo.adopted);
                memo_hit = true;
            }
        }
        if !memo_hit {
            self.reuse_memo = None;
            self.stats.reuse_scans += 1;
        }
        Preparation {
            descriptor,
            digest,
            memo_hit,
            next_index: 0,
            current: None,
            adopted,
            newly_adopted: 0,
            keep: HashSet::new(),
            resumed: None,
        }
    }

    /// Continues the preparation by one budget of re-reading; once every
    /// candidate is done, finishes it and requests the first chunk.
    pub(super) async fn prepare(&mut self, local: &LocalFacts) -> ReceiveStep {
        let Some(session) = self.session.as_mut() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        let SessionStage::Preparing(preparation) = &mut session.stage else {
            return ReceiveStep::Wait;
        };
        let done = advance_preparation(
            &self.fs,
            &self.dir,
            &self.config,
            preparation,
            self.resume,
            &mut self.stats,
        )
        .await;
        if !done {
            return ReceiveStep::Wait;
        }
        let stage = std::mem::replace(&mut session.stage, SessionStage::AwaitingDescriptor);
        let SessionStage::Preparing(preparation) = stage else {
            return ReceiveStep::Wait;
        };
        let accepted = self.finish_preparation(*preparation).await;
        tracing::info!(
            staged = accepted
                .artifacts
                .iter()
                .filter(|a| matches!(a, TransferArtifact::Staged(_)))
                .count(),
            resumed = self.stats.resumed_spills,
            "state-transfer offer prepared"
        );
        let Some(session) = self.session.as_mut() else {
            return ReceiveStep::Ignored(IgnoreReason::NoSession);
        };
        session.stage = SessionStage::Fetching(accepted);
        session.idle_ticks = 0;
        self.progress(local).await
    }

    /// Ends a preparation: one directory sync for every rewritten index
    /// (if it fails no adoption stands: an index whose name a crash could
    /// undo would be a missing rename source for the install), every
    /// staging file that is neither adopted nor resumed swept, the memo
    /// recorded, and the slots built.
    pub(super) async fn finish_preparation(
        &mut self,
        mut preparation: Preparation<F::File>,
    ) -> AcceptedTransfer<F::File> {
        if !preparation.memo_hit {
            if preparation.newly_adopted > 0 && self.fs.sync_dir(&self.dir).await.is_err() {
                preparation.adopted.clear();
                preparation.keep = preparation
                    .resumed
                    .as_ref()
                    .map(|(_, spill)| HashSet::from([spill.log_path().to_path_buf()]))
                    .unwrap_or_default();
            }
            let swept = sweep_staging_except(&self.fs, &self.dir, &preparation.keep).await;
            self.stats.adopted_segments += preparation.adopted.len() as u64;
            tracing::debug!(
                adopted = preparation.adopted.len(),
                swept,
                "staged-segment reuse scan"
            );
        }
        self.reuse_memo = Some(ReuseScanMemo {
            digest: preparation.digest,
            adopted: preparation.adopted.clone(),
        });
        // Consumed, or for an entry this offer does not list (its file was
        // just swept, and must not be built on later).
        self.resume = None;
        let mut resumed = preparation.resumed.take();
        let mut artifacts = Vec::with_capacity(preparation.descriptor.manifest.len());
        for (index, entry) in preparation.descriptor.manifest.iter().enumerate() {
            if let Some(meta) = preparation.adopted.get(&index) {
                artifacts.push(TransferArtifact::Staged(meta.clone()));
            } else if matches!(entry.kind, ArtifactKind::ConsumerOffsets { .. }) {
                artifacts.push(TransferArtifact::Pending(PendingArtifact::Offsets(
                    ArtifactProgress::new(*entry),
                )));
            } else {
                let spill = resumed
                    .take_if(|(i, _)| *i == index)
                    .map(|(_, spill)| Box::new(spill));
                artifacts.push(TransferArtifact::Pending(PendingArtifact::Segment {
                    entry: *entry,
                    spill,
                }));
            }
        }
        AcceptedTransfer {
            descriptor: preparation.descriptor,
            artifacts,
        }
    }
}

/// Advances a preparation by at most one budget of re-reading: finishes the candidate in hand, then picks the next manifest
/// entry whose staged log has its exact length (adopt) or is the
/// interrupted spill of `resume` (resume). Returns whether every entry was
/// examined.
pub(super) async fn advance_preparation<F: Fs>(
    fs: &F,
    dir: &Path,
    config: &ReceiverConfig,
    preparation: &mut Preparation<F::File>,
    resume: Option<ResumePoint>,
    stats: &mut ReceiverStats,
) -> bool {
    let slice = config.spill.rehash_slice_bytes;
    let mut budget = config.prepare_budget_bytes.max(1);
    let mut spent_this_call = 0u64;
    let done = loop {
        if let Some((_, _, rehash)) = preparation.current.as_mut() {
            if budget == 0 {
                break false;
            }
            let before = rehash.rehashed_len_bytes();
            let advanced = rehash.advance(fs, budget, slice).await;
            let spent = rehash.rehashed_len_bytes() - before;
            spent_this_call += spent;
            budget = budget.saturating_sub(spent);
            match advanced {
                Ok(false) => break false,
                Ok(true) => {}
                Err(error) => {
                    tracing::warn!(%error, "staged file unusable; it will be pulled");
                    preparation.current = None;
                    continue;
                }
            }
            let Some((index, candidate, rehash)) = preparation.current.take() else {
                continue;
            };
            finish_candidate(fs, config, preparation, index, candidate, rehash, stats).await;
            continue;
        }
        let index = preparation.next_index;
        let Some(entry) = preparation.descriptor.manifest.get(index).copied() else {
            break true;
        };
        preparation.next_index += 1;
        let Some(base_offset) = entry.kind.base_offset() else {
            continue;
        };
        if preparation.adopted.contains_key(&index) {
            continue;
        }
        let opened = if !preparation.memo_hit && staged_len_matches(fs, dir, &entry).await {
            PrefixRehash::open(fs, dir, entry, entry.len, false)
                .await
                .map(|r| (Candidate::Adopt, r))
        } else if let Some(point) = resume.filter(|p| p.entry == entry) {
            PrefixRehash::open(fs, dir, entry, point.synced_len_bytes, true)
                .await
                .map(|r| (Candidate::Resume, r))
        } else {
            continue;
        };
        match opened {
            Ok((candidate, rehash)) => preparation.current = Some((index, candidate, rehash)),
            Err(error) => {
                tracing::warn!(start_offset = base_offset.0, %error, "staged file unreadable; it will be pulled");
            }
        }
    };
    stats.rehashed_bytes += spent_this_call;
    stats.rehashed_bytes_max_per_call = stats.rehashed_bytes_max_per_call.max(spent_this_call);
    done
}

/// Takes a candidate whose re-read completed: an adopted segment is kept
/// as staged, a resumed spill continues from its synced length. A
/// candidate that fails is pulled whole instead.
async fn finish_candidate<F: Fs>(
    fs: &F,
    config: &ReceiverConfig,
    preparation: &mut Preparation<F::File>,
    index: usize,
    candidate: Candidate,
    rehash: PrefixRehash<F::File>,
    stats: &mut ReceiverStats,
) {
    let start_offset = rehash.entry().kind.wire_frontier();
    match candidate {
        Candidate::Adopt => match rehash.adopt(fs).await {
            Ok(Some(meta)) => {
                preparation.keep.insert(meta.log_staging.clone());
                preparation.keep.insert(meta.index_staging.clone());
                preparation.adopted.insert(index, meta);
                preparation.newly_adopted += 1;
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(start_offset, %error, "cannot adopt staged segment");
            }
        },
        Candidate::Resume => match SegmentSpill::from_rehash(rehash, config.spill).await {
            Ok(spill) => {
                stats.resumed_spills += 1;
                stats.resumed_bytes += spill.received_len_bytes();
                tracing::info!(
                    start_offset,
                    resumed_bytes = spill.received_len_bytes(),
                    "resuming an interrupted segment spill"
                );
                preparation.keep.insert(spill.log_path().to_path_buf());
                preparation.resumed = Some((index, spill));
            }
            Err(error) => {
                tracing::warn!(start_offset, %error, "cannot resume spill; pulling it whole");
            }
        },
    }
}
