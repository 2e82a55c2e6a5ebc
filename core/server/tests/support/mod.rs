//! Shared test support.
pub mod metrics;
pub mod process;
pub mod sdk_flows;
