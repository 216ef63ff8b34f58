//! ampccl transports: bootstrap, links, receiver-driven protocol and the shared-memory provider.

pub mod shm;

pub use ampccl_runtime::{Error, Result};
