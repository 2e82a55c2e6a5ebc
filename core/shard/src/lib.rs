//! replog's shard: the groups of one core and the loop that drives them.
//!
//! Where to start:
//! - [`Shard`] holds the groups (a [`partitions::Partition`] and its
//!   state-transfer driver each) and takes the three inputs: a frame from
//!   a peer ([`Shard::on_frame`]), a tick ([`Shard::on_tick`]) and a
//!   client call ([`Shard::on_call`]), plus group creation and deletion.
//! - [`pump::run`] is the task that feeds a shard its inputs: a biased
//!   select over stop, the tick timer and the inbox.
//! - [`Env`] is the seam to the world (clock, timers, tasks, the replica
//!   bus, the filesystem). The server implements it over compio, the
//!   simulator over its deterministic executor, [`testing`] for tests.
//! - [`shard_of`] places a group on a shard, the same on every replica.
//! - `catalog` is the on-disk list of groups and its crash-safe create
//!   and delete.
//! - `metadata_transfer` pulls and serves group 0's snapshot over the
//!   chunk protocol when a replica fell behind every peer's retention.
//!
//! docs/architecture.md describes the layers and the path of a frame and
//! a client request through them.

mod call;
mod catalog;
mod env;
mod metadata_host;
mod metadata_transfer;
mod placement;
pub mod pump;
pub mod rejoin;
mod session;
mod shard;
pub mod snapshot;
pub mod testing;

pub use call::{Answer, Call, CallError, Envelope, ProducerKey, ReplyTx};
pub use catalog::{GroupSpec, group_dir, read_spec};
pub use env::{Env, LocalFuture, Sent};
pub use metadata_host::{MetaCall, MetaError, MetaQuery, MetaReplyTx, MetadataHost};
pub use metadata_transfer::{
    METADATA_SNAPSHOT_LEN_MAX, MetadataDescriptorRefusal, MetadataReceiveError, MetadataTransfer,
    MetadataTransferConfig, MetadataTransferStats,
};
pub use placement::{ShardIndex, shard_of};
pub use pump::{Inbox, Input, inbox};
pub use shard::{
    FrameRefusal, GroupError, METADATA_DIR, Shard, ShardBus, ShardConfig, ShardPartition,
    ShardStats, TICK_DEFAULT, shard_dir,
};
pub use snapshot::{IgnoredTotals, ShardSnapshot, SnapshotDetail, SnapshotReply};
