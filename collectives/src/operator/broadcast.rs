//! Broadcast operator: pipelined chain from the root.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        ("BroadcastChain", 0)
    }
}
