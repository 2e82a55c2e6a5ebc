//! Shared test support.
pub mod cluster;
pub mod metrics;
pub mod process;
pub mod sdk_flows;
