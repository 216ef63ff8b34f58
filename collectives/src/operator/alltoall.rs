//! AllToAll operator: pairwise exchange.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct AllToAllOperator;

impl Operator for AllToAllOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        ("AllToAllPairwise", 0)
    }
}
