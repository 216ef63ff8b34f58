//! Broadcast operator: the pipelined chain from the root at every size and rank count
//! (why the chain beats the alternatives: [`crate::algorithms::broadcast_chain`]).

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        ("BroadcastChain", 0)
    }
}
