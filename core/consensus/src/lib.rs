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

pub mod chunk;
pub mod client_table;
pub mod dedup;
pub mod hashing;
pub mod header;
pub mod state_manifest;
pub mod vsr;

pub use chunk::{
    AcceptedChunk, ArtifactProgress, ChunkProgress, ChunkRejection, PendingChunk, append_chunk,
    check_chunk, next_pending_chunk,
};
pub use dedup::DedupWatermark;
pub use hashing::{StateArtifactHasher, state_artifact_checksum};
pub use state_manifest::{StateArtifact, artifact_kind, verify_state_artifact};
