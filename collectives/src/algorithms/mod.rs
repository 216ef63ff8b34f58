//! The built-in algorithms, one file each, named after the algorithm.

use std::sync::Arc;

use crate::executor::Executor;
use crate::op::OpKind;

pub mod allreduce_oneshot;
pub mod allreduce_ring;
pub mod barrier_mesh;
pub mod broadcast_chain;
pub mod recv;
pub mod reduce_chain;
pub mod send;

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
        (
            "BroadcastChain",
            OpKind::Broadcast,
            Arc::new(broadcast_chain::BroadcastChain),
        ),
        (
            "ReduceChain",
            OpKind::Reduce,
            Arc::new(reduce_chain::ReduceChain),
        ),
        ("Send", OpKind::Send, Arc::new(send::Send)),
        ("Recv", OpKind::Recv, Arc::new(recv::Recv)),
        (
            "BarrierMesh",
            OpKind::Barrier,
            Arc::new(barrier_mesh::BarrierMesh),
        ),
    ]
}
