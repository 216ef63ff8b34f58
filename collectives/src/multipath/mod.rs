//! Multipath: split a collective between the fast path (the real NCCL) and ampccl's PCIe path,
//! with a learned, rank-consistent split.
//!
//! - [`key::OpKey`] / [`param::ParamValue`]: what is learned, per collective, size bucket, dtype.
//! - [`controller`]: sans-I/O controllers (`bw` default, `tcp`, `dcqcn`, `static`).
//! - [`sim`]: a simulated two-path link the controllers are tested against.

pub mod controller;
pub mod key;
pub mod param;
pub mod sim;
pub mod store;

#[cfg(all(test, ampccl_loom))]
mod tests {
    mod loom_store;
}
