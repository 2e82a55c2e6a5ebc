//! replog's journal crate: what a consensus group must keep durable beyond
//! its data.
//!
//! - `superblock`: the per-group record of `(view, log_view)`, commit and
//!   offset frontier, in two checksummed copies, so that a replica never
//!   answers a view change with a state older than one it acted in.
//! - `superblock_table`: the same records for every partition group of a
//!   shard in two shared files, written in batches.
//! - `prepare_journal`: the partition plane's in-memory journal of
//!   applied prepares not yet flushed to segments (repair is served from
//!   the VSR replica's own journal and from segments, not from here).
//! - `wal`: the metadata plane's durable, append-only log of prepares.
//!
//! All file I/O goes through `storage::fs::Fs`, so every durable step can
//! be crashed and faulted in tests.

mod clean_stop;
mod prepare_journal;
mod replica_log;
mod superblock;
mod superblock_table;
mod wal;

pub use clean_stop::{
    CLEAN_STOP_FILE, CLEAN_STOPS_FILE, CLEAN_STOPS_MAX, CleanStop, record_clean_stop,
    record_clean_stops, take_clean_stop, take_clean_stops,
};
pub use prepare_journal::{
    EntryStats, JournalEntry, JournalError, JournalInfo, JournalLimits, PrepareJournal,
};
pub use replica_log::{
    COMPACT_BYTES, LogMode, RECORD_MAGIC, REPLICA_LOG_FILE, RecordDamage, Replayed, ReplicaLog,
    ReplicaLogError, boot_tag_of,
};
pub use superblock::{
    FileSuperblock, MemSuperblock, SLOT_NAMES, SUPERBLOCK_MAGIC, SUPERBLOCK_PAYLOAD_MAX,
    SUPERBLOCK_VERSION, SlotError, Superblock, SuperblockError, SuperblockStore, VSR_STATE_LEN,
    VSR_STATE_LEN_V0, VsrState,
};
pub use superblock_table::{
    SuperblockTable, TABLE_NAMES, TABLE_SLOT_LEN, TABLE_SLOTS_MAX, TableKey, TableStats,
    TableSuperblock,
};
pub use wal::{
    MetadataWal, WAL_ENTRY_SIZE_MAX, WAL_SLOTS_DEFAULT, WalError, WalRecovery, build_prepare,
};
