//! Broadcast operator: both ranks copying at once on 2 ranks, a pipelined chain from the root
//! otherwise.

use crate::algorithms::broadcast_pair;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let pair = p.world == 2
            && ctx.user_mem_links
            && !ctx.oversubscribed
            && p.count * p.elem() >= broadcast_pair::MIN_BYTES;
        if pair {
            ("BroadcastPair", 0)
        } else {
            ("BroadcastChain", 0)
        }
    }
}
