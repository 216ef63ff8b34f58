//! Reduce operator: pipelined chain toward the root.

use crate::algorithms::reduce_chain;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct ReduceOperator;

impl Operator for ReduceOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (reduce_chain::NAME, 0)
    }
}
