//! ampccl: adaptive multi-path collective communication — the native Rust API.
//!
//! ```text
//! Communicator::all_reduce ─► operator (validate, select_alg → name, new_tag)
//!        ─► resources by new_tag (executor's calc_res_request, cached)
//!        ─► executor.orchestrate ─► tasks on streams (runtime) over links (transport)
//! ```
//! - [`Communicator`]: init from a [`UniqueId`] or the environment; blocking calls on slices,
//!   asynchronous calls on owned buffers ([`Communicator::on`] a stream), groups, split, abort.
//! - [`executor::Executor`] / [`registry::Registry`]: algorithms by name; register your own.
//! - [`verify`]: the offline verifier of executors' task graphs.
//! - [`params`]: every tuned constant with its environment override ([`tuning`],
//!   docs/TUNING.md).

pub mod algorithms;
mod api;
mod comm;
pub mod config;
pub mod executor;
mod fasthash;
pub mod op;
pub mod operator;
pub mod registry;
pub mod resource;
mod sink;
pub mod steps;
pub mod tuning;
pub mod verify;

pub use ampccl_runtime::stream::{Event, Stream};
pub use ampccl_runtime::{DataType, Element, Error, ReduceOp, Result};
pub use ampccl_transport::bootstrap::UniqueId;
pub use ampccl_transport::shm::SharedMem;
pub use api::{Group, OnStream, OpFuture, OpSpec, RawOp, SharedBuf, SizedOp, StableBuf};
pub use comm::Communicator;
pub use config::Config;
pub use half::{bf16, f16};
pub use tuning::params;
