//! Operators, one per collective: validation beyond the generic checks, and algorithm
//! selection by size and world size (thresholds from measurements, see docs/PERFORMANCE.md).

use crate::executor::Operator;
use crate::op::OpKind;

pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod barrier;
pub mod broadcast;
pub mod reduce;
pub mod reduce_scatter;
pub mod send_recv;

/// The operator for `kind`.
pub fn for_kind(kind: OpKind) -> &'static dyn Operator {
    match kind {
        OpKind::AllReduce => &allreduce::AllReduceOperator,
        OpKind::AllGather => &allgather::AllGatherOperator,
        OpKind::ReduceScatter => &reduce_scatter::ReduceScatterOperator,
        OpKind::Broadcast => &broadcast::BroadcastOperator,
        OpKind::Reduce => &reduce::ReduceOperator,
        OpKind::AllToAll => &alltoall::AllToAllOperator,
        OpKind::Send => &send_recv::SendOperator,
        OpKind::Recv => &send_recv::RecvOperator,
        OpKind::Barrier => &barrier::BarrierOperator,
    }
}
