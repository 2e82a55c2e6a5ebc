//! Shared test support.
pub mod sdk_flows;
