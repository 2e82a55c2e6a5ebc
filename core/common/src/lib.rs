//! Vocabulary shared by every replog crate: the identifiers of streams,
//! topics, partitions and consensus groups, byte-size helpers, and the
//! operation/offset newtypes that keep VSR op numbers and message offsets
//! from being confused, the record of replog's admin status command
//! ([`admin`]), which the server and `replog-cli` share, and the
//! little-endian readers every codec decodes with ([`le_cursor`]).
//!
//! This crate has no dependencies and does no I/O; it sits at the bottom of
//! the dependency graph (`common` ← `consensus`, `journal`, `storage` ←
//! `partitions` ← …).

pub mod admin;
mod ids;
pub mod le_cursor;
mod prng;
pub mod simnet;
mod size;

pub use ids::{
    ConsumerKind, GroupId, METADATA_GROUP, NamespaceError, Offset, Op, PartitionId, ReplicaId,
    StreamId, TopicId,
};
pub use prng::Prng;
pub use size::{GIB, KIB, MIB, format_bytes};
