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
            allreduce_ring::NAME,
            OpKind::AllReduce,
            Arc::new(allreduce_ring::AllReduceRing),
        ),
        (
            allreduce_oneshot::NAME,
            OpKind::AllReduce,
            Arc::new(allreduce_oneshot::AllReduceOneShot),
        ),
        (
            allreduce_pair::NAME,
            OpKind::AllReduce,
            Arc::new(allreduce_pair::AllReducePair),
        ),
        (
            allgather_mesh::NAME,
            OpKind::AllGather,
            Arc::new(allgather_mesh::AllGatherMesh),
        ),
        (
            allgather_pair::NAME,
            OpKind::AllGather,
            Arc::new(allgather_pair::AllGatherPair),
        ),
        (
            allgather_ring::NAME,
            OpKind::AllGather,
            Arc::new(allgather_ring::AllGatherRing),
        ),
        (
            reduce_scatter_ring::NAME,
            OpKind::ReduceScatter,
            Arc::new(reduce_scatter_ring::ReduceScatterRing),
        ),
        (
            alltoall_pairwise::NAME,
            OpKind::AllToAll,
            Arc::new(alltoall_pairwise::AllToAllPairwise),
        ),
        (
            broadcast_chain::NAME,
            OpKind::Broadcast,
            Arc::new(broadcast_chain::BroadcastChain),
        ),
        (
            broadcast_pair::NAME,
            OpKind::Broadcast,
            Arc::new(broadcast_pair::BroadcastPair),
        ),
        (
            reduce_chain::NAME,
            OpKind::Reduce,
            Arc::new(reduce_chain::ReduceChain),
        ),
        (send::NAME, OpKind::Send, Arc::new(send::Send)),
        (recv::NAME, OpKind::Recv, Arc::new(recv::Recv)),
        (
            barrier_mesh::NAME,
            OpKind::Barrier,
            Arc::new(barrier_mesh::BarrierMesh),
        ),
    ]
}
