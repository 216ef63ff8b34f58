//! ampccl runtime: the execution vocabulary every algorithm is written in.
//!
//! - [`stream::Stream`]: an ordered asynchronous task queue; [`stream::Event`]: a point in it
//!   (a `Future`, queryable, waitable); [`notify::Notify`]: a generation-counted cross-stream
//!   (and cross-process) signal; [`task::Task`]: copies, reductions, notify record/wait, link
//!   operations, host callbacks.
//! - [`engine::Engine`]: drives streams. The thread that waits drives progress (MPI style);
//!   a lazily started background thread serves work nobody waits on.
//! - [`doorbell::Doorbell`]: the word an idle driver sleeps on (a shared futex).
//! - [`reduce`]: reduction kernels for every [`dtype::DataType`] × [`dtype::ReduceOp`].
//! - [`mem`]: aligned host buffers and regions.
//! - [`log`]: the `tracing` subscriber (`AMPCCL_LOG`).
//! - [`copy`]: the stream tasks' bulk copy (streaming stores for large copies).
//! - [`param`]: tuned constants with their environment overrides (`docs/TUNING.md`).
//! - [`sync`]: std or loom atomics (`--cfg ampccl_loom`).

pub mod copy;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod doorbell;
pub mod dtype;
pub mod engine;
pub mod error;
#[cfg(not(ampccl_loom))]
pub mod futex;
pub mod log;
pub mod mem;
pub mod notify;
pub mod param;
pub mod park;
pub mod reduce;
pub mod stream;
pub mod sync;
pub mod task;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
