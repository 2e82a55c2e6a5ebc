//! replog's deterministic cluster simulator.
//!
//! One thread runs R replicas × S shards of the real [`shard::Shard`] over
//! [`shard::testing::TestEnv`]: a virtual clock moved only by the driver, a
//! seeded network between same-index shards ([`shard::testing::TestNet`])
//! and one [`storage::fs::SimFs`] disk per replica, whose crashes keep only
//! what a real disk must keep. A seeded fault plan drops, duplicates,
//! delays and reorders frames per link, isolates and splits replicas,
//! crashes and restarts them and fails their disks; a workload of clients
//! creates topics through the metadata plane, produces, polls and stores
//! offsets through the shard's call path, retrying what the errors say
//! may be retried; an oracle of what was acknowledged checks the safety
//! properties of SPEC §5 during the run and, after healing and a quiet
//! period, that every replica converged to byte-identical segment files.
//!
//! Where to start: [`Options`] and [`run`]. The same options give the same
//! run: every delivered frame, call and answer is folded into the
//! [`Summary::schedule_hash`], the final segment bytes into
//! [`Summary::state_hash`]. docs/simulator.md describes the fault profiles
//! and how to replay a failing seed.

mod cluster;
mod exec;
mod faults;
mod oracle;
mod profile;
mod run;
mod trace;
mod workload;

pub use oracle::{Property, Violation};
pub use profile::{FaultProfile, UnknownProfile};
pub use run::{Failure, FaultCounts, Options, OptionsError, SimError, Summary, run};
