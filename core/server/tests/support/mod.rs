//! Shared test support.
pub mod process;
pub mod sdk_flows;
