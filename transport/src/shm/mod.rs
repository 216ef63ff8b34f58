//! Shared-memory provider: processes on one host.
//!
//! - [`segment`]: POSIX shared-memory segments (0600, unguessable names, unlinked once mapped,
//!   stale ones swept);
//! - [`cma`]: cross-memory attach (`process_vm_writev`) and its probe;
//! - [`layout`]: what a rank's segment holds; [`mod@connect`]: setup; [`device`]: the data path
//!   (an [`RmaDevice`](crate::device::RmaDevice));
//! - [`shared`]: user buffers in memory peers map ([`SharedMem`]), reached with plain copies.

pub mod cma;
pub mod connect;
pub mod device;
pub mod layout;
#[cfg(all(test, not(ampccl_loom)))]
mod notify_test;
pub mod segment;
pub mod shared;

pub use connect::{ShmConfig, connect};
pub use device::ShmDevice;
pub use shared::SharedMem;
