//! header
