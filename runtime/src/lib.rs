//! ampccl runtime: the execution vocabulary every algorithm is written in.

pub mod dtype;
pub mod error;
pub mod reduce;
pub mod sync;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
