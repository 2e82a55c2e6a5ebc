//! replog's partition plane.
//!
//! - [`offset_storage`]: consumer and consumer-group offsets on disk, one
//!   small checksummed file per id, replaced atomically through a sibling;
//!   and the partition's durable purge generation.
//!
//! The replicated `Partition` (append, polls, flush, purge, retention and
//! boot over `storage` and `journal`) is being built on top of these.

pub mod offset_storage;

pub use offset_storage::{
    OffsetRecord, OffsetRecordError, PURGE_GENERATION_FILE, PurgeGeneration, StoredOffsets,
    commit_offset_replacement, delete_persisted_offset, discard_offset_replacement,
    load_offsets_dir, offset_replacement_id, persist_purge_generation, read_purge_generation,
    stage_offset_replacement,
};
