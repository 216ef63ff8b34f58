//! AllReduce operator: one-shot for small messages, ring otherwise.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest `bytes * world` sent with the one-shot algorithm. Measured on 2 ranks (forced
/// algorithms, `ampccl-perf -g 2`): one-shot wins up to 16 KiB per rank (5.3 vs 5.9 us),
/// the ring from 32 KiB on (7.9 vs 8.7 us); one-shot moves `world` times the data, so the
/// bound scales with the world size.
pub const ONE_SHOT_MAX_BYTES: usize = 32 * 1024;
/// The same bound when ranks outnumber cores: the ring's `2 (P-1)` dependent steps each cost
/// a context switch there, and one-shot still wins at 64 KiB on 3 and 4 ranks on 2 cores
/// (34 vs 43 us and 51 vs 72 us).
pub const ONE_SHOT_MAX_BYTES_OVERSUBSCRIBED: usize = 256 * 1024;

pub struct AllReduceOperator;

impl Operator for AllReduceOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        let max = if ctx.oversubscribed {
            ONE_SHOT_MAX_BYTES_OVERSUBSCRIBED
        } else {
            ONE_SHOT_MAX_BYTES
        };
        if bytes * p.world <= max.min(ctx.ccl_size) {
            ("AllReduceOneShot", 0)
        } else {
            ("AllReduceRing", 0)
        }
    }
}
