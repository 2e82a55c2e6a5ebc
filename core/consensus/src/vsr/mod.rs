//! The sans-IO Viewstamped Replication replica core.
//!
//! One [`Replica`] per consensus group and replica: inputs are decoded
//! frames ([`Replica::on_frame`]), ticks ([`Replica::on_tick`]) and client
//! requests ([`Replica::on_client_request`]); outputs, drained with
//! [`Replica::take_actions`], are frames to send, replies to clients and
//! [`Effect`]s (persist the superblock state, journal, apply, start a state
//! transfer). No clock, socket or file lives here, so one thread can drive
//! a whole cluster deterministically (the `vsr_harness` crate does, for
//! the tests and benchmarks).
//!
//! - `message`: the typed VSR messages.
//! - `io`: the vocabulary between a replica and its driver (configuration,
//!   durable state, actions and effects, what an input answers).
//! - `replica`: state, inputs, normal operation.
//! - `view_change`: StartViewChange / DoViewChange / StartView, probes.
//! - `census`: the whole-group restart (every replica restarted at once).
//! - `merge`: the DoViewChange merge rule and quorums.
//! - `read_check`: a primary confirms it still leads its view before it
//!   serves a read (Ping / Pong).
//! - `repair`: journal repair, the repair floor and state-transfer hooks.
//! - `journal`: the in-memory, hash-chain-verified log.
//! - `pipeline`: the primary's bounded queue of uncommitted prepares.
//! - `timeout`: tick timers with backoff and the seeded PRNG.
//! - [`wire`]: the one codec between [`Frame`]s and the bytes between
//!   replicas.
//!
//! The design, with the arguments for its safety rules, is in
//! `docs/consensus.md`.

mod census;
mod invariants;
mod io;
mod journal;
mod merge;
mod message;
mod pipeline;
mod read_check;
mod repair;
mod replica;
mod timeout;
mod view_change;
pub mod wire;

pub use invariants::InvariantViolation;
pub use io::{
    Action, AppliedState, Config, DurableState, Effect, FrameError, Handled, Ignored,
    LoggedJournal, OP_MAX, REPLICAS_MAX, RequestOutcome, Status, Topology, VIEW_MAX,
};
pub use journal::{RestoreRefused, Retained, Spilled};
pub use merge::{DVC_HEADERS_MAX, MergeStall, MergedLog, Quorums};
pub use message::{
    Census, DoViewChange, Frame, Message, OPERATION_APPEND, OPERATION_REGISTER, Prepare,
    PrepareHeader, Reply, ReplyStatus, Request, StartView, SuffixSlot, body_checksum,
};
pub use pipeline::PIPELINE_PREPARE_QUEUE_MAX;
pub use repair::{REPAIR_CHUNK_MAX, UNKNOWN_CHECKSUM};
pub use replica::Replica;
pub use timeout::TimeoutConfig;
