//! ampccl transports: bootstrap (out-of-band rendezvous and TCP mesh), links, receiver-driven
//! protocol, shared-memory provider.

pub mod bootstrap;

pub use ampccl_runtime::{Error, Result};
