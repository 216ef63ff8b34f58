//! AllReduce operator: one-shot for small messages, ring otherwise.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest message (bytes per rank) sent with the one-shot algorithm.
pub const ONE_SHOT_MAX_BYTES: usize = 64 * 1024;

pub struct AllReduceOperator;

impl Operator for AllReduceOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        if bytes <= ONE_SHOT_MAX_BYTES && bytes * p.world <= ctx.ccl_size {
            ("AllReduceOneShot", 0)
        } else {
            ("AllReduceRing", 0)
        }
    }
}
