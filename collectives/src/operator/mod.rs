//! Operators, one per collective: validation beyond the generic checks, and algorithm
//! selection by size and world size (thresholds chosen by measurement, each a [`Param`] that
//! the environment can override; docs/TUNING.md lists them).
//!
//! [`Param`]: ampccl_runtime::param::Param

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

/// Test support: the algorithm the operator of `kind` selects for rank 0's call (root 0) of
/// `bytes` in `u8` elements on `world` ranks.
#[cfg(test)]
pub(crate) fn selected(
    kind: OpKind,
    bytes: usize,
    world: usize,
    in_place: bool,
    ctx: &crate::executor::SelectCtx,
) -> &'static str {
    let p = crate::op::OpParam {
        kind,
        count: bytes,
        dtype: ampccl_runtime::DataType::U8,
        op: ampccl_runtime::ReduceOp::Sum,
        root: 0,
        rank: 0,
        world,
        in_place,
        seq: 0,
    };
    for_kind(kind).select_alg(&p, ctx).0
}

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
