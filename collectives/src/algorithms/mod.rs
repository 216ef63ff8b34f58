//! The built-in algorithms, one file each, named after the algorithm.

use std::sync::Arc;

use crate::executor::Executor;
use crate::op::OpKind;

pub mod allreduce_oneshot;
pub mod allreduce_ring;

/// `(name, kind, executor)` of every built-in algorithm.
pub fn builtin() -> Vec<(&'static str, OpKind, Arc<dyn Executor>)> {
    vec![
        (
            "AllReduceRing",
            OpKind::AllReduce,
            Arc::new(allreduce_ring::AllReduceRing),
        ),
        (
            "AllReduceOneShot",
            OpKind::AllReduce,
            Arc::new(allreduce_oneshot::AllReduceOneShot),
        ),
    ]
}
