//! The built-in algorithms, one file each, named after the algorithm.

use std::sync::Arc;

use crate::executor::Executor;
use crate::op::OpKind;

pub mod allgather_mesh;
pub mod allgather_pair;
pub mod allgather_ring;
pub mod allreduce_oneshot;
pub mod allreduce_pair;
pub mod allreduce_ring;
pub mod alltoall_pairwise;
pub mod barrier_mesh;
pub mod broadcast_chain;
pub mod broadcast_pair;
pub mod recv;
pub mod reduce_chain;
pub mod reduce_scatter_ring;
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
            "AllReducePair",
            OpKind::AllReduce,
            Arc::new(allreduce_pair::AllReducePair),
        ),
        (
            "AllGatherMesh",
            OpKind::AllGather,
            Arc::new(allgather_mesh::AllGatherMesh),
        ),
        (
            "AllGatherPair",
            OpKind::AllGather,
            Arc::new(allgather_pair::AllGatherPair),
        ),
        (
            "AllGatherRing",
            OpKind::AllGather,
            Arc::new(allgather_ring::AllGatherRing),
        ),
        (
            "ReduceScatterRing",
            OpKind::ReduceScatter,
            Arc::new(reduce_scatter_ring::ReduceScatterRing),
        ),
        (
            "AllToAllPairwise",
            OpKind::AllToAll,
            Arc::new(alltoall_pairwise::AllToAllPairwise),
        ),
        (
            "BroadcastChain",
            OpKind::Broadcast,
            Arc::new(broadcast_chain::BroadcastChain),
        ),
        (
            "BroadcastPair",
            OpKind::Broadcast,
            Arc::new(broadcast_pair::BroadcastPair),
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
