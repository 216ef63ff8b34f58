//! ReduceScatter operator: ring.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct ReduceScatterOperator;

impl Operator for ReduceScatterOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        ("ReduceScatterRing", 0)
    }
}
