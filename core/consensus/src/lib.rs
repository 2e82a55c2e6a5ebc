//! replog's consensus crate: the wire primitives every plane rests on and
//! the sans-IO Viewstamped Replication replica.
//!
//! - [`hashing`]: xxh3-64 artifact checksums, streaming and one-shot, and
//!   the checksum trailer shared by the manifest and the transfer artifacts
//!   (their fields are read with `common::le_cursor`).
//! - [`state_manifest`]: the "ISM1" list of artifacts a state-transfer offer
//!   consists of.
//! - [`chunk`]: the receiver's cursor over a manifest — which artifact and
//!   byte to ask for next, and which chunks to accept.
//! - [`dedup`]: the client-table watermark carried in state transfer.
//! - [`header`]: the 256-byte consensus frame header codec.
//! - [`vsr`]: the replica core (normal operation, view change, repair).

mod chunk;
mod client_table;
mod dedup;
mod hashing;
pub mod header;
mod state_manifest;
pub mod vsr;

pub use chunk::{
    AcceptedChunk, ArtifactProgress, ChunkProgress, ChunkRejection, PendingChunk, append_chunk,
    check_chunk, next_pending_chunk,
};
pub use client_table::{ClientTable, ClientTableError, RequestCheck, SessionRecord};
pub use dedup::DedupWatermark;
pub use hashing::{
    StateArtifactHasher, TRAILER_LEN, push_trailer, split_verified_trailer, state_artifact_checksum,
};
pub use state_manifest::{
    ArtifactKind, ManifestError, STATE_MANIFEST_ENTRIES_MAX, StateArtifact, artifact_kind,
    decode_manifest, encode_manifest, verify_state_artifact,
};
