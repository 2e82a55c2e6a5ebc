//! The serving side's offer: what a caught-up primary hands a lagging
//! replica, and how it is built without freezing the shard.
//!
//! An offer ([`PartitionOffer`]) is the partition's state at one op,
//! `commit_op`: one `SEGMENT_LOG` artifact per non-empty retained segment,
//! ascending, then the `CONSUMER_OFFSETS` artifact (ICO2) last. Segment
//! artifacts are addressed by path and length — the bytes stay on disk and
//! are loaded one artifact at a time when chunks are served (`serve.rs`);
//! only the small offsets artifact is resident.
//!
//! Building takes three steps, so the expensive one needs no borrow of the
//! partition (SPEC §7, ST-S2):
//!
//! 1. **plan** ([`Partition::plan_state_transfer_offer`], `&mut`): the gate
//!    (ST-S1), a flush of the committed prefix, `commit_op = commit_min`,
//!    the segment list with each segment's current length, the manifest
//!    ceiling, and the offsets snapshot — all at one op;
//! 2. **hash** ([`OfferBuilder::hash_round`], no partition borrow): extend
//!    each segment's checksum memo, within a budget per round (ST-S3,
//!    ST-B3);
//! 3. **finish** ([`Partition::finish_state_transfer_offer`], `&mut`):
//!    re-validate the planned chain against the live one and assemble the
//!    offer, cached per `commit_op`.
//!
//! [`Partition::build_state_transfer_offer`] runs the three in one call: one
//! round per call, `OfferBuildInProgress` until the memo covers the chain.
//!
//! **Why memos survive across rounds.** A segment instance is append-only,
//! so the streaming hash of its first `n` bytes stays valid while it grows:
//! sealed segments are hashed once, and the active segment only pays for
//! what it gained since the last round. A memo is keyed by the segment's
//! identity — purge generation, start offset and the timestamp of its first
//! batch — so a file planted anew at the same start offset (a purge, an
//! install) never extends an old memo; every round prunes the memos to the
//! planned chain.

use common::{ConsumerKind, Offset, Op, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use consensus::{ArtifactKind, StateArtifact, StateArtifactHasher};
use consensus::{STATE_MANIFEST_ENTRIES_MAX, encode_manifest};
use journal::SuperblockStore;
use storage::fs::{Fs, FsFile, OpenOptions};
use storage::log_file_name;

use super::errors::{
    PartitionTransferUnavailable, SegmentLoadError, validate_consumer_offset_transfer_count,
};
use super::wire::{CONSUMER_OFFSETS_ENTRIES_MAX, ConsumerOffsetsWire};
use crate::bus::MessageBus;
use crate::offsets::DurableOffsets;
use crate::partition::Partition;

/// Bytes read from a segment file per read call, both when hashing for an
/// offer and when loading an artifact to serve. Large enough that a read
/// costs far more than the yield after it, small enough that the reactor
/// gets a turn every few milliseconds.
pub const OFFER_READ_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Default byte ceiling of one build round (the reference's whole budget;
/// here the fallback behind the time bound).
pub const OFFER_ROUND_BYTES_MAX_DEFAULT: u64 = 256 * 1024 * 1024;

/// Default time bound of one build round: two ticks of 10 ms. Far below
/// every consensus timeout, so the shard's other groups miss at most a
/// couple of ticks while this partition hashes.
pub const OFFER_ROUND_TIME_MAX_DEFAULT: Duration = Duration::from_millis(20);

/// The clock a build round measures its time bound with.
///
/// Production passes [`MonotonicClock`]; tests and the simulator pass a
/// deterministic clock, which may advance in [`BuildClock::observe_hashed`]
/// as bytes are hashed, so that the time bound is exercised without a real
/// clock.
pub trait BuildClock {
    /// Time since an arbitrary fixed origin; never decreases.
    fn now(&self) -> Duration;

    /// Called after every chunk a round hashed, with its length.
    fn observe_hashed(&self, _bytes: u64) {}
}

/// The production [`BuildClock`]: [`Instant`], measured from its creation.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl BuildClock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// How much one build round may do (ST-S3, ST-B3). A round stops at
/// whichever bound it reaches first, but always hashes at least one chunk,
/// so a build converges however small the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildBudget {
    /// Elapsed time per round, by the caller's [`BuildClock`]; `None` leaves
    /// only the byte bound.
    pub time_max: Option<Duration>,
    /// Bytes hashed per round.
    pub bytes_max: u64,
}

impl Default for BuildBudget {
    fn default() -> Self {
        Self {
            time_max: Some(OFFER_ROUND_TIME_MAX_DEFAULT),
            bytes_max: OFFER_ROUND_BYTES_MAX_DEFAULT,
        }
    }
}

impl BuildBudget {
    /// A byte bound alone (the reference's budget).
    pub const fn bytes(bytes_max: u64) -> Self {
        Self {
            time_max: None,
            bytes_max,
        }
    }
}

/// Which file a segment artifact is: a new file at an old start offset is a
/// different segment, and must not extend the old one's checksum memo.
///
/// The first batch's timestamp comes free with the segment's metadata and
/// separates a re-planted file from the old one in every realistic case;
/// the purge generation separates them by construction after a purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentIdentity {
    /// The purge generation in effect when the segment was planned.
    pub purge_generation: u64,
    /// The segment's base offset (its file name).
    pub start_offset: Offset,
    /// The base timestamp of its first batch.
    pub start_timestamp: u64,
}

/// One segment of a plan: which file, and how many of its bytes the offer
/// covers (the active segment may grow past it afterwards).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSegment {
    /// The segment.
    pub identity: SegmentIdentity,
    /// Bytes of whole batches at planning time.
    pub len_bytes: u64,
    /// Its `.log` file.
    pub path: PathBuf,
}

/// The state an offer will describe, fixed at one op; see the module
/// documentation for the three steps.
#[derive(Debug, Clone)]
pub struct OfferPlan {
    commit_op: Op,
    purge_generation: u64,
    segments: Vec<PlannedSegment>,
    offsets: ConsumerOffsetsWire,
}

impl OfferPlan {
    /// The op the offer describes.
    pub fn commit_op(&self) -> Op {
        self.commit_op
    }

    /// The planned segments, ascending.
    pub fn segments(&self) -> &[PlannedSegment] {
        &self.segments
    }

    /// Bytes of every planned segment.
    pub fn total_segment_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len_bytes).sum()
    }
}

/// What planning found: a cached offer still valid for this op, or a plan
/// to hash.
#[derive(Debug)]
pub enum Planned {
    /// The offer cached for this `commit_op`, checked against the live
    /// chain.
    Cached(Rc<PartitionOffer>),
    /// A plan whose segments must be hashed.
    Plan(OfferPlan),
}

/// A plan whose every segment the memo covers, with their checksums.
#[derive(Debug)]
pub struct HashedPlan {
    plan: OfferPlan,
    checksums: Vec<u64>,
}

/// What one hashing round achieved.
#[derive(Debug)]
pub enum HashRound {
    /// Every planned byte is hashed.
    Complete(HashedPlan),
    /// The round's budget ran out first. Both figures are over the planned
    /// chain and cumulative across rounds (read back from the memos), so
    /// successive refusals show a build converging, or not.
    InProgress {
        /// Planned bytes the memos cover.
        hashed: u64,
        /// Planned bytes still to hash.
        remaining: u64,
    },
}

/// One segment artifact of an offer: its manifest entry and where its
/// bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedSegment {
    /// The manifest entry (`SEGMENT_LOG`, frontier = base offset).
    pub entry: StateArtifact,
    /// Which segment instance was hashed.
    pub identity: SegmentIdentity,
    /// Its `.log` file; the artifact is the first `entry.len` bytes.
    pub path: PathBuf,
}

/// One artifact of an offer, by manifest index.
#[derive(Debug, Clone, Copy)]
pub enum OfferedArtifact<'a> {
    /// A segment, loaded from disk when served.
    Segment(&'a OfferedSegment),
    /// The consumer-offsets artifact, resident.
    Offsets {
        /// Its manifest entry.
        entry: &'a StateArtifact,
        /// Its bytes.
        bytes: &'a Bytes,
    },
}

impl OfferedArtifact<'_> {
    /// The artifact's manifest entry.
    pub fn entry(&self) -> &StateArtifact {
        match self {
            Self::Segment(segment) => &segment.entry,
            Self::Offsets { entry, .. } => entry,
        }
    }
}

/// A built partition state-transfer offer (ST-S2): the state at
/// `commit_op`, segments ascending, the offsets artifact last.
#[derive(Debug)]
pub struct PartitionOffer {
    commit_op: u64,
    purge_generation: u64,
    segments: Vec<OfferedSegment>,
    offsets_entry: StateArtifact,
    offsets_bytes: Bytes,
    manifest_bytes: Bytes,
}

impl PartitionOffer {
    /// The op the offer describes (`commit_min` at build).
    pub fn commit_op(&self) -> Op {
        Op(self.commit_op)
    }

    /// The purge generation the offer was built under.
    pub fn purge_generation(&self) -> u64 {
        self.purge_generation
    }

    /// The segment artifacts, ascending by base offset.
    pub fn segments(&self) -> &[OfferedSegment] {
        &self.segments
    }

    /// The manifest entries in manifest order.
    pub fn manifest(&self) -> Vec<StateArtifact> {
        let mut entries: Vec<StateArtifact> = self.segments.iter().map(|s| s.entry).collect();
        entries.push(self.offsets_entry);
        entries
    }

    /// The encoded manifest ("ISM1"), the body of the offer's frame.
    pub fn encoded_manifest(&self) -> &Bytes {
        &self.manifest_bytes
    }

    /// Artifacts in the manifest; never 0 (the offsets artifact is always
    /// there).
    pub fn artifact_count(&self) -> usize {
        self.segments.len() + 1
    }

    /// The artifact at manifest `index`, `None` past the end.
    pub fn artifact(&self, index: usize) -> Option<OfferedArtifact<'_>> {
        match index.cmp(&self.segments.len()) {
            std::cmp::Ordering::Less => self.segments.get(index).map(OfferedArtifact::Segment),
            std::cmp::Ordering::Equal => Some(OfferedArtifact::Offsets {
                entry: &self.offsets_entry,
                bytes: &self.offsets_bytes,
            }),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// The encoded consumer-offsets artifact.
    pub fn offsets_bytes(&self) -> &Bytes {
        &self.offsets_bytes
    }

    /// Bytes of every artifact.
    pub fn total_len_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.entry.len).sum::<u64>() + self.offsets_entry.len
    }
}

/// The streaming hash of a segment's first `hashed_len_bytes()` bytes.
/// `StateArtifactHasher::finish` borrows, so a partial pass is simply a
/// memo whose checksum nobody reads yet.
#[derive(Debug, Default)]
struct SegmentChecksumMemo {
    hasher: StateArtifactHasher,
}

/// The building half of the serving side, owned per partition by its
/// driver: the checksum memos, the offer cached per `commit_op` and the
/// per-round budget.
#[derive(Debug)]
pub struct OfferBuilder {
    budget: BuildBudget,
    memos: BTreeMap<SegmentIdentity, SegmentChecksumMemo>,
    cached: Option<Rc<PartitionOffer>>,
    /// The replica the offer being built is for, when known (the gate
    /// lets a caught-up backup serve its view's primary).
    requester: Option<ReplicaId>,
}

impl OfferBuilder {
    /// An empty builder with this per-round budget.
    pub fn new(budget: BuildBudget) -> Self {
        Self {
            budget,
            memos: BTreeMap::new(),
            cached: None,
            requester: None,
        }
    }

    /// Names the replica the next builds are for (`None`: unknown, so only
    /// the caught-up primary may serve).
    pub fn set_requester(&mut self, requester: Option<ReplicaId>) {
        self.requester = requester;
    }

    /// The per-round budget.
    pub fn budget(&self) -> BuildBudget {
        self.budget
    }

    /// Changes the per-round budget.
    pub fn set_budget(&mut self, budget: BuildBudget) {
        self.budget = budget;
    }

    /// How many bytes of `identity` the memos cover, if any.
    pub fn memo_hashed_len(&self, identity: &SegmentIdentity) -> Option<u64> {
        self.memos
            .get(identity)
            .map(|memo| memo.hasher.hashed_len_bytes())
    }

    /// The segments that have a memo.
    pub fn memoized(&self) -> impl Iterator<Item = &SegmentIdentity> {
        self.memos.keys()
    }

    /// The offer cached for its `commit_op`, if any.
    pub fn cached(&self) -> Option<&Rc<PartitionOffer>> {
        self.cached.as_ref()
    }

    /// Drops the cached offer (its sessions expired, or it proved stale).
    pub fn clear_cached(&mut self) {
        self.cached = None;
    }

    /// Forgets one segment's memo (its file no longer matches what was
    /// hashed).
    pub fn forget(&mut self, identity: &SegmentIdentity) {
        self.memos.remove(identity);
    }

    /// Forgets everything. Whatever replaces the chain wholesale (an
    /// install, a converge) calls this: the identities of the new files
    /// could coincide with the old ones.
    pub fn reset(&mut self) {
        self.memos.clear();
        self.cached = None;
    }

    /// Bytes of the plan the memos cover, each clamped to its planned
    /// length.
    fn hashed_prefix_len(&self, plan: &OfferPlan) -> u64 {
        plan.segments
            .iter()
            .map(|s| {
                self.memo_hashed_len(&s.identity)
                    .map_or(0, |hashed| hashed.min(s.len_bytes))
            })
            .sum()
    }

    /// Drops the memos of segments outside the plan (retention removed
    /// them, a purge replaced them), so the map tracks the live chain.
    fn retain_planned(&mut self, plan: &OfferPlan) {
        let live: BTreeSet<SegmentIdentity> = plan.segments.iter().map(|s| s.identity).collect();
        self.memos.retain(|identity, _| live.contains(identity));
    }

    /// One budgeted round of the checksum pass over `plan` (ST-S3).
    ///
    /// Reads [`OFFER_READ_CHUNK_BYTES`] at a time, yields to the reactor
    /// after each chunk, and stops once the round's bytes or time are spent
    /// (after at least one chunk). A memo is fed only whole chunks that
    /// were read completely, so a read error leaves it exact and the next
    /// round resumes from it.
    ///
    /// # Errors
    /// [`PartitionTransferUnavailable::SegmentSetChanged`] when a planned
    /// file is gone or shorter than planned (the chain moved under the
    /// plan, as far as this step can tell; [`Partition::build_state_transfer_offer`]
    /// also checks the live chain and reports a file lost under an
    /// unchanged chain as `SegmentMissing`);
    /// [`PartitionTransferUnavailable::SegmentUnreadable`] for a local disk
    /// fault.
    pub async fn hash_round<F: Fs, C: BuildClock>(
        &mut self,
        fs: &F,
        plan: OfferPlan,
        clock: &C,
    ) -> Result<HashRound, PartitionTransferUnavailable> {
        match self.hash_round_classified(fs, plan, clock).await {
            Err(PartitionTransferUnavailable::SegmentMissing {
                start_offset,
                source,
            }) => {
                tracing::info!(start_offset = start_offset.0, error = %source, "planned segment changed while it was hashed");
                Err(PartitionTransferUnavailable::SegmentSetChanged)
            }
            other => other,
        }
    }

    /// [`Self::hash_round`], with a planned file gone or short reported as
    /// `SegmentMissing` for the caller to classify against the live chain.
    async fn hash_round_classified<F: Fs, C: BuildClock>(
        &mut self,
        fs: &F,
        plan: OfferPlan,
        clock: &C,
    ) -> Result<HashRound, PartitionTransferUnavailable> {
        self.retain_planned(&plan);
        let mut spend = RoundSpend {
            budget: self.budget,
            started: clock.now(),
            spent_bytes: 0,
            exhausted: false,
        };
        let mut buf = Vec::new();
        for segment in &plan.segments {
            let memo = self.memos.entry(segment.identity).or_default();
            forget_if_shrunk(memo, segment);
            if memo.hasher.hashed_len_bytes() == segment.len_bytes {
                continue;
            }
            if spend.exhausted {
                break;
            }
            buf = hash_segment(fs, segment, memo, &mut spend, clock, buf).await?;
            if spend.exhausted && memo.hasher.hashed_len_bytes() < segment.len_bytes {
                break;
            }
        }
        let hashed = self.hashed_prefix_len(&plan);
        let total = plan.total_segment_bytes();
        tracing::debug!(
            commit_op = plan.commit_op.0,
            round_bytes = spend.spent_bytes,
            hashed,
            total,
            "offer checksum round"
        );
        if hashed < total {
            return Ok(HashRound::InProgress {
                hashed,
                remaining: total - hashed,
            });
        }
        let checksums = self.finished_checksums(&plan)?;
        Ok(HashRound::Complete(HashedPlan { plan, checksums }))
    }

    /// Every planned segment's checksum, once all of them are hashed whole.
    fn finished_checksums(
        &self,
        plan: &OfferPlan,
    ) -> Result<Vec<u64>, PartitionTransferUnavailable> {
        let mut checksums = Vec::with_capacity(plan.segments.len());
        for segment in &plan.segments {
            let Some(memo) = self.memos.get(&segment.identity) else {
                // Covered by `hashed == total` in the round; a missing memo
                // here would be this module's own bug.
                return Err(PartitionTransferUnavailable::SegmentSetChanged);
            };
            debug_assert_eq!(memo.hasher.hashed_len_bytes(), segment.len_bytes);
            checksums.push(memo.hasher.finish());
        }
        Ok(checksums)
    }
}

/// What one hashing round has spent of its budget, and whether it is spent.
struct RoundSpend {
    budget: BuildBudget,
    started: Duration,
    spent_bytes: u64,
    exhausted: bool,
}

/// A memo longer than its segment is dropped: a segment instance only
/// grows, so the file is not the one that was hashed.
fn forget_if_shrunk(memo: &mut SegmentChecksumMemo, segment: &PlannedSegment) {
    if memo.hasher.hashed_len_bytes() > segment.len_bytes {
        tracing::warn!(
            start_offset = segment.identity.start_offset.0,
            memo_bytes = memo.hasher.hashed_len_bytes(),
            planned_bytes = segment.len_bytes,
            "segment shorter than its checksum memo; hashing it again"
        );
        *memo = SegmentChecksumMemo::default();
    }
}

/// Hashes `segment` on from where its memo stopped, a chunk at a time,
/// until it is whole or the round's budget (bytes or time) is spent.
/// Returns the read buffer for the next segment to reuse.
async fn hash_segment<F: Fs, C: BuildClock>(
    fs: &F,
    segment: &PlannedSegment,
    memo: &mut SegmentChecksumMemo,
    spend: &mut RoundSpend,
    clock: &C,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, PartitionTransferUnavailable> {
    let file = fs
        .open(&segment.path, OpenOptions::read_only())
        .await
        .map_err(|source| hash_failure(segment, source))?;
    while memo.hasher.hashed_len_bytes() < segment.len_bytes {
        let position = memo.hasher.hashed_len_bytes();
        let bytes_left = spend
            .budget
            .bytes_max
            .saturating_sub(spend.spent_bytes)
            .max(1);
        let want = (segment.len_bytes - position)
            .min(OFFER_READ_CHUNK_BYTES as u64)
            .min(bytes_left);
        // `want` ≤ OFFER_READ_CHUNK_BYTES, so it fits a usize.
        let want = usize::try_from(want).unwrap_or(OFFER_READ_CHUNK_BYTES);
        buf = file
            .read_exact_into(buf, want, position)
            .await
            .map_err(|source| hash_failure(segment, source))?;
        memo.hasher.update(&buf);
        spend.spent_bytes += want as u64;
        clock.observe_hashed(want as u64);
        fs.yield_now().await;
        let out_of_time = spend
            .budget
            .time_max
            .is_some_and(|max| clock.now().saturating_sub(spend.started) >= max);
        if spend.spent_bytes >= spend.budget.bytes_max || out_of_time {
            spend.exhausted = true;
            break;
        }
    }
    Ok(buf)
}

impl Default for OfferBuilder {
    fn default() -> Self {
        Self::new(BuildBudget::default())
    }
}

/// A read error while hashing, by cause: a file gone or cut short means the
/// chain moved under the plan (ask again); anything else is this node's
/// disk.
fn hash_failure(segment: &PlannedSegment, source: io::Error) -> PartitionTransferUnavailable {
    match SegmentLoadError::classify(source) {
        SegmentLoadError::LocalFault(source) => PartitionTransferUnavailable::SegmentUnreadable {
            start_offset: segment.identity.start_offset,
            source,
        },
        SegmentLoadError::Stale(source) => PartitionTransferUnavailable::SegmentMissing {
            start_offset: segment.identity.start_offset,
            source,
        },
        SegmentLoadError::ChecksumMismatch => PartitionTransferUnavailable::SegmentSetChanged,
    }
}

/// What the serve gate (ST-S1) looks at, gathered from the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeGateFacts {
    /// `Replica::serves_applied_state`: the primary, not transferring,
    /// everything it knows committed applied.
    pub caught_up_primary: bool,
    /// The requester is this replica's view's primary, and this replica
    /// is a normal, quorum-visible backup with everything it knows
    /// committed applied. A primary missing ops no peer retains can only
    /// be served by a backup: nobody else is its view's primary.
    pub backup_serving_its_primary: bool,
    /// This replica is in a view change, quorum-visible, not transferring,
    /// with everything it knows committed applied. While no view forms
    /// there is no primary to serve, and the requester may be the vote the
    /// view change needs (it cannot vote before it catches up).
    pub view_change_member_serving: bool,
    /// The partition directory exists.
    pub dir_present: bool,
    /// A repair session is open, or the partition waits for a transfer of
    /// its own.
    pub repairing: bool,
    /// The group's `commit_max`.
    pub commit_max: Op,
    /// Where a state-transfer install started the offset space, if one did.
    pub installed_frontier: Option<Offset>,
}

/// The serve gate (ST-S1), in the seed's order.
///
/// # Errors
/// The first refusal that applies.
pub fn check_serve_gate(facts: ServeGateFacts) -> Result<(), PartitionTransferUnavailable> {
    if !facts.caught_up_primary
        && !facts.backup_serving_its_primary
        && !facts.view_change_member_serving
    {
        return Err(PartitionTransferUnavailable::NotCaughtUpPrimary);
    }
    if !facts.dir_present {
        return Err(PartitionTransferUnavailable::NoPartitionDir);
    }
    if facts.repairing {
        return Err(PartitionTransferUnavailable::RepairInProgress);
    }
    // A group that committed nothing is trivially "caught up", so a replica
    // that came up at view 0 as primary by index passes every check above.
    // Its offer would be an empty chain at frontier 0, and a receiver would
    // unlink real data to install it. Nobody arms a transfer against a group
    // whose replicas all report commit 0, so refusing here wedges nothing.
    if facts.commit_max == Op(0) && facts.installed_frontier.is_none() {
        return Err(PartitionTransferUnavailable::NothingCommitted);
    }
    Ok(())
}

/// The consumer-offset tables of an offer, from the durable records only
/// (ST-S4): an eager auto-commit lives in the live map until a replicated
/// store commits it, and a transfer must not promote it. `live_has` says
/// whether the live map holds `(kind, id)`; a durable record without a live
/// entry means the two views disagree, and the snapshot would describe
/// neither. `entries_max` is the ceiling per kind.
///
/// # Errors
/// `ConsumerOffsetsTooLarge`, `ConsumerOffsetStateInconsistent`.
pub fn snapshot_offset_tables(
    durable: &DurableOffsets,
    live_has: impl Fn(ConsumerKind, u32) -> bool,
    entries_max: usize,
) -> Result<[Vec<(u32, Offset)>; 2], PartitionTransferUnavailable> {
    let mut tables = [Vec::new(), Vec::new()];
    for (table, kind) in tables
        .iter_mut()
        .zip([ConsumerKind::Consumer, ConsumerKind::ConsumerGroup])
    {
        durable.with_entries(kind, |entries| {
            if let Err(error) =
                validate_consumer_offset_transfer_count(kind, entries.len(), entries_max)
            {
                tracing::error!(
                    ?kind,
                    count = entries.len(),
                    max = entries_max,
                    "consumer offsets exceed the transfer ceiling"
                );
                return Err(error);
            }
            table.reserve_exact(entries.len());
            // BTreeMap order: ids ascend, as ICO2 requires.
            for (&consumer_id, record) in entries {
                if !live_has(kind, consumer_id) {
                    return Err(
                        PartitionTransferUnavailable::ConsumerOffsetStateInconsistent {
                            kind,
                            consumer_id,
                        },
                    );
                }
                table.push((consumer_id, record.committed_offset));
            }
            Ok(())
        })?;
    }
    Ok(tables)
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// The gate's inputs, as this partition sees them now.
    async fn serve_gate_facts(&self, requester: Option<ReplicaId>) -> ServeGateFacts {
        let r = &self.replica;
        // One predicate covers both: a backup serves only its primary, a
        // member of a view change anyone (Replica::serves_transfer_as_non_primary).
        let non_primary = requester.is_some_and(|q| r.serves_transfer_as_non_primary(q));
        let in_view_change = r.status() == consensus::vsr::Status::ViewChange;
        let backup_serving_its_primary = non_primary && !in_view_change;
        let view_change_member_serving = non_primary && in_view_change;
        let dir_present = match self.fs.exists(&self.dir).await {
            Ok(present) => present,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "partition directory cannot be checked");
                false
            }
        };
        ServeGateFacts {
            caught_up_primary: self.replica.serves_applied_state(),
            backup_serving_its_primary,
            view_change_member_serving,
            dir_present,
            // The accessor, not the field: the field keeps the last request
            // after the core abandoned it.
            repairing: self.replica.is_repairing()
                || self.state_transfer_needed().is_some()
                || self.missing_history.is_some(),
            commit_max: self.replica.commit_max(),
            installed_frontier: self.installed_frontier(),
        }
    }

    /// This partition's offsets artifact content at the current op.
    fn offsets_wire_snapshot(&self) -> Result<ConsumerOffsetsWire, PartitionTransferUnavailable> {
        let [consumers, groups] = snapshot_offset_tables(
            self.offsets.durable(),
            |kind, id| self.offsets.get(kind, id).is_some(),
            CONSUMER_OFFSETS_ENTRIES_MAX as usize,
        )?;
        Ok(ConsumerOffsetsWire {
            purge_generation: self.applied_purge_generation,
            // The append counter, not the end of the last segment: retention
            // may have removed every segment while the counter stands at N,
            // and the receiver must go on minting at N.
            next_offset: self.offset_frontier(),
            consumers,
            groups,
            dedup: self.dedup_export(),
        })
    }

    /// The planned segments as they are now: non-empty, ascending.
    fn plan_segments(&self) -> Vec<PlannedSegment> {
        let generation = self.applied_purge_generation;
        self.log
            .segments()
            .filter(|meta| !meta.is_empty())
            .map(|meta| PlannedSegment {
                identity: SegmentIdentity {
                    purge_generation: generation,
                    start_offset: Offset(meta.start_offset),
                    start_timestamp: meta.start_timestamp,
                },
                len_bytes: meta.size_bytes,
                path: self.dir.join(log_file_name(meta.start_offset)),
            })
            .collect()
    }

    /// Whether every planned segment is still in the live chain, the same
    /// instance, at least as long as planned.
    fn chain_still_holds<'a>(
        &self,
        purge_generation: u64,
        mut planned: impl Iterator<Item = (&'a SegmentIdentity, u64)>,
    ) -> bool {
        if purge_generation != self.applied_purge_generation {
            return false;
        }
        let live: BTreeMap<u64, (u64, u64)> = self
            .log
            .segments()
            .map(|m| (m.start_offset, (m.start_timestamp, m.size_bytes)))
            .collect();
        planned.all(|(identity, len)| {
            live.get(&identity.start_offset.0)
                .is_some_and(|&(timestamp, size)| {
                    timestamp == identity.start_timestamp && size >= len
                })
        })
    }

    /// Step 1 of a build: the gate, a flush of the committed prefix, and
    /// either the offer cached for this `commit_op` or a plan to hash.
    ///
    /// # Errors
    /// Gate refusals (ST-S1), `FlushFailed`, `ManifestTooLarge`, and the
    /// offsets refusals of ST-S4.
    pub async fn plan_state_transfer_offer(
        &mut self,
        builder: &OfferBuilder,
    ) -> Result<Planned, PartitionTransferUnavailable> {
        check_serve_gate(self.serve_gate_facts(builder.requester).await)?;
        // Every committed batch into the segments first, so that the
        // segments and the offsets table describe the same op.
        self.flush_committed_messages()
            .await
            .map_err(PartitionTransferUnavailable::FlushFailed)?;
        let commit_op = self.replica.commit_min().0;
        if let Some(cached) = builder.cached()
            && cached.commit_op == commit_op
        {
            // Checked against the live chain (in memory, no I/O), so a
            // retention pass on an idle partition does not leave a cached
            // offer that fails at its first served chunk.
            let planned = cached.segments.iter().map(|s| (&s.identity, s.entry.len));
            if self.chain_still_holds(cached.purge_generation, planned) {
                return Ok(Planned::Cached(Rc::clone(cached)));
            }
        }
        let segments = self.plan_segments();
        // One entry per segment plus the offsets artifact. The manifest
        // encoder asserts its ceiling (in release builds too), so a long
        // chain — ordinary with a small segment size — is refused here
        // rather than allowed to panic the shard.
        let entries = segments.len() + 1;
        if entries > STATE_MANIFEST_ENTRIES_MAX {
            return Err(PartitionTransferUnavailable::ManifestTooLarge {
                entries,
                max: STATE_MANIFEST_ENTRIES_MAX,
            });
        }
        let offsets = self.offsets_wire_snapshot()?;
        Ok(Planned::Plan(OfferPlan {
            commit_op: Op(commit_op),
            purge_generation: self.applied_purge_generation,
            segments,
            offsets,
        }))
    }

    /// Step 3 of a build: re-validate the hashed plan against the live
    /// chain and assemble the offer, which becomes the builder's cached one.
    ///
    /// # Errors
    /// `SegmentSetChanged` when a purge, retention or a replaced file moved
    /// the chain since planning; `NothingCommitted` for an empty chain at
    /// frontier 0 under generation 0.
    pub fn finish_state_transfer_offer(
        &self,
        builder: &mut OfferBuilder,
        hashed: HashedPlan,
    ) -> Result<Rc<PartitionOffer>, PartitionTransferUnavailable> {
        let HashedPlan { plan, checksums } = hashed;
        let planned = plan.segments.iter().map(|s| (&s.identity, s.len_bytes));
        if !self.chain_still_holds(plan.purge_generation, planned) {
            tracing::info!(
                commit_op = plan.commit_op.0,
                "segment chain changed while the offer was hashed"
            );
            return Err(PartitionTransferUnavailable::SegmentSetChanged);
        }
        // An empty chain at frontier 0 tells a receiver to drop its own; it
        // is the truth only when a purge says so, or when this caught-up
        // server applied ops and none of them appended anything (a group
        // that only registered sessions or stored offsets: after a whole-
        // group restart the census primary serves it this way, having no
        // journal to repair from).
        if plan.segments.is_empty()
            && plan.offsets.next_offset == Offset(0)
            && plan.offsets.purge_generation == 0
            && plan.commit_op == Op(0)
        {
            return Err(PartitionTransferUnavailable::NothingCommitted);
        }
        let segments: Vec<OfferedSegment> = plan
            .segments
            .into_iter()
            .zip(checksums)
            .map(|(segment, checksum)| OfferedSegment {
                entry: StateArtifact {
                    kind: ArtifactKind::SegmentLog {
                        base_offset: segment.identity.start_offset,
                    },
                    len: segment.len_bytes,
                    checksum,
                },
                identity: segment.identity,
                path: segment.path,
            })
            .collect();
        let offsets_bytes = Bytes::from(plan.offsets.encode());
        let offsets_entry = StateArtifact::for_bytes(
            ArtifactKind::ConsumerOffsets {
                commit_op: plan.commit_op,
            },
            &offsets_bytes,
        );
        let mut manifest: Vec<StateArtifact> = segments.iter().map(|s| s.entry).collect();
        manifest.push(offsets_entry);
        let manifest_bytes = Bytes::from(encode_manifest(&manifest));
        let offer = Rc::new(PartitionOffer {
            commit_op: plan.commit_op.0,
            purge_generation: plan.purge_generation,
            segments,
            offsets_entry,
            offsets_bytes,
            manifest_bytes,
        });
        tracing::info!(
            dir = %self.dir.display(),
            commit_op = offer.commit_op,
            segments = offer.segments.len(),
            total_bytes = offer.total_len_bytes(),
            "state-transfer offer built"
        );
        builder.cached = Some(Rc::clone(&offer));
        Ok(offer)
    }

    /// Builds (or returns the cached) state-transfer offer, one budgeted
    /// hashing round per call (ST-S1..S4, ST-B3).
    ///
    /// # Errors
    /// [`PartitionTransferUnavailable`]; `OfferBuildInProgress` while the
    /// memos do not cover the chain yet — call again (the driver may do so
    /// on its next tick, or when the requester asks again).
    pub async fn build_state_transfer_offer<C: BuildClock>(
        &mut self,
        builder: &mut OfferBuilder,
        clock: &C,
    ) -> Result<Rc<PartitionOffer>, PartitionTransferUnavailable> {
        let plan = match self.plan_state_transfer_offer(builder).await? {
            Planned::Cached(offer) => return Ok(offer),
            Planned::Plan(plan) => plan,
        };
        let generation = plan.purge_generation;
        let planned: Vec<(SegmentIdentity, u64)> = plan
            .segments
            .iter()
            .map(|s| (s.identity, s.len_bytes))
            .collect();
        let round = match builder.hash_round_classified(&self.fs, plan, clock).await {
            Err(PartitionTransferUnavailable::SegmentMissing {
                start_offset,
                source,
            }) => {
                // Gone or short while the live chain still lists every
                // planned segment at least as long: nothing moved, the
                // file itself is lost or cut. Reported as a local fault,
                // so requesters rotate and back off instead of re-asking
                // this node at the flat interval forever.
                if self.chain_still_holds(generation, planned.iter().map(|(i, l)| (i, *l))) {
                    tracing::error!(dir = %self.dir.display(), start_offset = start_offset.0, error = %source, "a segment this node's log records is missing or short on disk; refusing to serve");
                    return Err(PartitionTransferUnavailable::SegmentMissing {
                        start_offset,
                        source,
                    });
                }
                tracing::info!(start_offset = start_offset.0, error = %source, "planned segment changed while it was hashed");
                return Err(PartitionTransferUnavailable::SegmentSetChanged);
            }
            other => other?,
        };
        match round {
            HashRound::InProgress { hashed, remaining } => {
                Err(PartitionTransferUnavailable::OfferBuildInProgress { hashed, remaining })
            }
            HashRound::Complete(hashed) => self.finish_state_transfer_offer(builder, hashed),
        }
    }
}

impl fmt::Display for SegmentIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "segment {:020} (generation {}, first batch at {})",
            self.start_offset, self.purge_generation, self.start_timestamp
        )
    }
}
