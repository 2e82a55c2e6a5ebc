//! A running replica: one OS thread per shard, each with its own compio
//! runtime running the shard's pump over [`env::CompioEnv`], and the
//! [`handle::ShardHandles`] through which the client listener reaches
//! them.

pub mod backend;
pub mod env;
pub mod handle;
