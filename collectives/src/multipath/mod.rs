//! Multipath: splitting one collective between the fast path (the real NCCL) and ampccl's own
//! PCIe path through pinned host memory.
//!
//! - [`planner`]: the split of one call (`AMPCCL_ALPHA`, `AMPCCL_MIN_MSG_SIZE`, ...).
//! - `pcie` (feature `cuda`): the PCIe path itself, on CUDA streams.

pub mod planner;

#[cfg(feature = "cuda")]
pub mod pcie;
