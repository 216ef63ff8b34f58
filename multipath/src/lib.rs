//! ampccl-multipath: split a collective between the fast path (the real NCCL) and ampccl's PCIe
//! path through pinned host memory, with a learned, rank-consistent split. The NCCL interposer
//! (`ffi/preload`) is its only user; it depends on the runtime alone, not on the native
//! collective stack.
//!
//! - [`planner`]: the split of one call into NCCL's and the PCIe path's elements.
//! - `pcie` (feature `cuda`): the PCIe path itself, on CUDA streams, and lazy path timing.
//! - [`key::OpKey`] / [`param::ParamValue`]: what is learned, per collective, size bucket, dtype.
//! - [`controller`]: sans-I/O controllers (`bw` default, `tcp`, `dcqcn`, `static`).
//! - [`store::ShmParamStore`]: the per-domain shared table (rank 0 aggregates the ranks' stats
//!   and writes it) and the decision ring that makes every rank use the same split per call.
//! - [`persist`]: `AMPCCL_PARAM_FILE` warm start; [`config`]: the env tunables; [`report()`]:
//!   the learned table as text (`AMPCCL_REPORT=1`).
//! - [`schedule`]: the PCIe pipeline's flag schedule (loom-checked).
//! - [`sim`]: a simulated two-path link the controllers are tested against.

pub mod config;
pub mod controller;
pub mod key;
pub mod param;
#[cfg(feature = "cuda")]
pub mod pcie;
pub mod persist;
pub mod planner;
mod report;
pub mod schedule;
pub mod sim;
pub mod store;

pub use ampccl_runtime::{DataType, Error, ReduceOp, Result};
pub use report::report;

#[cfg(all(test, ampccl_loom))]
mod tests {
    mod loom_schedule;
    mod loom_store;
}
