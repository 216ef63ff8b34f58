//! ReduceScatter operator: ring.

use crate::algorithms::reduce_scatter_ring;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct ReduceScatterOperator;

impl Operator for ReduceScatterOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (reduce_scatter_ring::NAME, 0)
    }
}
