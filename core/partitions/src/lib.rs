//! replog's partition plane: the replicated [`Partition`].
//!
//! A partition is one VSR group's state machine and driver, generic over
//! the message bus ([`MessageBus`]), the superblock store and the
//! filesystem. By file:
//!
//! - `partition`: the struct, its configuration and errors, boot, the
//!   driver loop that carries out the VSR core's actions, counters;
//! - `ops`: the replicated operations and their fail-closed codec;
//! - `error`: [`BootError`] and [`PartitionError`];
//! - `boot`: [`Partition::open`] as named steps and the pure choice of
//!   where the VSR core resumes;
//! - `append`: validation and stamping on the primary, the base-offset
//!   check on backups;
//! - `flush`: the committed journal prefix to segments;
//! - `health`: the fence and the durable writes owed a retry;
//! - `poll`: polls by every strategy over segments and journal;
//! - `offsets`: consumer offsets (live maps, durable records);
//! - `purge`: the purge op and its crash-ordered durable steps;
//! - `retention`: age- and size-based removal of sealed segments;
//! - `bus`: the bus trait and an in-memory network for tests;
//! - `offset_storage`: consumer-offset files and `purge.gen` on disk;
//! - `client_sessions`: the client table on disk, so dedup survives a
//!   restart;
//! - `install`: a transferred state made live, crash-safely, a bounded
//!   number of file operations per step (the driver in `state_transfer`
//!   runs it);
//! - `missing_history`: the durable record that history below the
//!   frontier is missing after a failed install;
//! - `state_transfer`: the offer, the pull and the driver.

mod append;
mod boot;
mod bus;
mod client_sessions;
mod error;
mod flush;
mod health;
mod install;
mod missing_history;
mod offset_storage;
mod offsets;
mod ops;
mod partition;
mod poll;
mod purge;
mod retained;
mod retention;
mod scrub;
pub mod state_transfer;

pub use append::{KeyedAppend, REPLAY_WINDOW_US};
pub use bus::{InMemoryBus, InMemoryNetwork, MessageBus};
pub use client_sessions::CLIENT_TABLE_FILES;
pub use error::{BootError, PartitionError};
pub use flush::FlushOutcome;
pub use offset_storage::{
    OFFSET_RECORD_LEN, OffsetRecord, OffsetRecordError, PURGE_GENERATION_FILE, PurgeGeneration,
    REPLACEMENT_SUFFIX, StoredOffsets, commit_offset_replacement, delete_persisted_offset,
    discard_offset_replacement, load_offsets_dir, offset_replacement_id, persist_purge_generation,
    read_purge_generation, stage_offset_replacement,
};
pub use offsets::{AppliedBy, ConsumerOffsets, DurableOffset, DurableOffsets};
pub use ops::{OpDecodeError, PartitionOp};
pub use partition::{
    ClientOp, ClientRequest, INTERNAL_CLIENT, MESSAGES_REQUIRED_TO_SAVE_DEFAULT, Partition,
    PartitionConfig, PartitionStats, RECORD_INTERVAL_US_DEFAULT, StateTransferNeeded,
};
pub use poll::{
    POLL_REPLY_BYTES_MAX_CEILING, POLL_REPLY_BYTES_MAX_DEFAULT, PollError, PollRequest, Polled,
    PollingStrategy,
};
pub use retained::{READ_BACK_BYTES_PER_SLICE_DEFAULT, RETAINED_BYTES_MAX_DEFAULT, RetainedBudget};
pub use retention::{RetentionOutcome, RetentionPolicy};
