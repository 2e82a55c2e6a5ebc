//! replog's server crate: everything between a client's TCP bytes and the
//! shard, and the `replog` configuration.
//!
//! Where to start:
//! - [`protocol`]: the Apache Iggy 0.11.0 client protocol, sans-IO — frame
//!   reader, request decoder ([`protocol::ClientCommand`]), reply records
//!   and reply/eviction framing;
//! - [`session`]: one connection's state machine ([`session::Session`])
//!   over a [`session::Backend`], the trait the shard and the metadata
//!   plane implement;
//! - [`status`]: the Iggy error codes and the one mapping of internal
//!   errors to them;
//! - [`config`]: the effective configuration (file, environment, flags);
//! - [`node`]: a running replica — shard threads on compio, the handles
//!   that reach them, the client listener.

pub mod config;
pub mod node;
pub mod protocol;
pub mod session;
pub mod status;

#[cfg(test)]
mod sdk_e2e;
