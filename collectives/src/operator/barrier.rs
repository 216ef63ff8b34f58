//! Barrier operator: acks with every peer.

use crate::algorithms::barrier_mesh;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BarrierOperator;

impl Operator for BarrierOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (barrier_mesh::NAME, 0)
    }
}
