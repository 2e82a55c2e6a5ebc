//! Partition state transfer: what a replica that fell behind every peer's
//! retained range pulls from the group's caught-up primary, and how it is
//! checked.
//!
//! - `wire`: the consumer-offsets artifact ("ICO2", decoding "ICO1").
//! - `walk`: validation of a received segment artifact, incremental so it
//!   can run chunk by chunk as bytes arrive.
//! - `errors`: the refusal and failure taxonomy, each error saying
//!   whether retrying can help.
//! - `offer`: the serving side's offer: gate, plan, budgeted and
//!   memoized checksum rounds, the offsets artifact.
//! - `serve`: the offer cache per requester and nonce, chunk answers,
//!   idle expiry.
//! - `receive`: the receiver's pull session, descriptor checks, stall
//!   handling, reuse of staged files, re-arm backoff.
//! - `spill`: streaming a segment artifact to its staging files, resume
//!   from the last synced byte, adoption of staged files.
//! - Two parts of a transfer are the partition's own, at the crate root and
//!   re-exported here: the crash-safe install, its converge and the fence
//!   (`install/`: the partition holds the job between steps and boot
//!   finishes an interrupted one), and the durable record that history
//!   below the frontier is missing after a converge (`missing_history.rs`:
//!   the partition reads it at boot and consults it on every poll). So the
//!   partition's files never import this module; `install` uses only the
//!   `wire` codec, which imports nothing else of the crate.
//! - `driver`: what a shard calls per partition: frames in and out on the
//!   consensus header, ticks, arming, admission, install and the fence.
//!
//! `docs/state-transfer.md` describes the protocol, the install's durable
//! orderings and where this goes past the reference.

pub(crate) mod driver;
pub(crate) mod errors;
pub(crate) mod offer;
pub(crate) mod receive;
pub(crate) mod serve;
pub(crate) mod spill;
pub(crate) mod walk;
pub(crate) mod wire;

pub use crate::install::{
    INSTALL_FILE_OPS_PER_STEP, INSTALL_MARKER_FILE, InstallInput, PartitionInstallError,
    PartitionInstallOutcome, StagedSegment, fence_partition,
};
pub use crate::missing_history::{MissingHistory, TRANSFER_NEEDED_FILE};
pub use driver::{
    CheckedTransferFrame, DRIVER_CHUNKS_IN_FLIGHT_DEFAULT, DRIVER_LOAD_BLOCKS_PER_CALL,
    DriverOutput, DriverStats, OfferHeaderRefusal, Outgoing, RECEIVING_TRANSFERS_MAX_DEFAULT,
    SERVING_TRANSFERS_MAX_DEFAULT, TransferDriver, TransferDriverConfig, TransferEvent,
    TransferFrameError, TransferFrameExpect, TransferSlots, check_offer_header,
    check_transfer_frame, encode_transfer_frame,
};
pub use errors::{
    PartitionTransferUnavailable, SegmentLoadError, SpillError,
    validate_consumer_offset_transfer_count,
};
pub use offer::{
    BuildBudget, BuildClock, HashRound, HashedPlan, MonotonicClock, OFFER_READ_CHUNK_BYTES,
    OfferBuilder, OfferPlan, OfferedArtifact, OfferedSegment, PartitionOffer, Planned,
    PlannedSegment, SegmentIdentity, ServeGateFacts, check_serve_gate, snapshot_offset_tables,
};
pub use receive::{
    AcceptedDescriptor, AcceptedTransfer, DescriptorRefusal, IgnoreReason, LocalFacts,
    PendingArtifact, PendingRearm, Preparation, ReceiveError, ReceiveStep, ReceivedTransfer,
    ReceiverConfig, ReceiverStats, STALL_ATTEMPTS_MAX_DEFAULT, SessionStage, TransferArtifact,
    TransferBackoff, TransferReceiver, TransferRequest, TransferSession, peer_after_refusal,
    rotate_peer,
};
pub use serve::{
    ChunkAnswer, ChunkRefusal, ChunkRequest, OfferServer, OfferServerConfig,
    REPAIR_RETRY_TICKS_DEFAULT, STATE_CHUNK_LEN_MAX_DEFAULT, ServedChunk,
    load_verified_segment_artifact,
};
pub use spill::{
    PrefixRehash, ResumePoint, SegmentSpill, SpillConfig, StagedSegmentMeta, adopt_staged_segment,
    segment_manifest_digest, staged_len_matches, staging_paths, sweep_staging_except,
};
pub use walk::{SegmentWalkError, SegmentWalkStats, SegmentWalker, walk_segment_payload};
pub use wire::{
    CONSUMER_OFFSETS_ENTRIES_MAX, ConsumerOffsetsWire, ConsumerOffsetsWireError,
    offered_purge_generation,
};
