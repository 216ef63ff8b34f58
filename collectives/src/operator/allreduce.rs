//! AllReduce operator: one-shot for small messages, the pair for large ones on 2 ranks, ring
//! otherwise.

use crate::algorithms::allreduce_pair;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest `bytes * world` sent with the one-shot algorithm (it moves `world` times the data,
/// so the bound scales with the world size). 2 ranks, forced algorithms, 2 alternated runs,
/// µs out of place / in place (`ampccl-perf -g 2 -o allreduce -b 8K -e 256K -f 2 -n 1000 -w
/// 100`), one-shot vs ring: 32 KiB 7.2–7.5/7.0 vs 7.3/10.0–10.4, 128 KiB 15.9–16.0/15.0–15.6
/// vs 17.8–17.9/18.6–19.5, 256 KiB 32.2–33.1/30.2–32.3 vs 25.8–27.2/32.0–33.1. On 3 and 4
/// ranks on 2 cores one-shot still wins at 64 KiB (34 vs 43 µs and 51 vs 72 µs): the ring's
/// `2 (P-1)` dependent steps each cost a context switch there.
pub const ONE_SHOT_MAX_BYTES: usize = 256 * 1024;

pub struct AllReduceOperator;

impl Operator for AllReduceOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        if bytes * p.world <= ONE_SHOT_MAX_BYTES.min(ctx.ccl_size) {
            ("AllReduceOneShot", 0)
        } else if p.world == 2 && bytes >= allreduce_pair::MIN_BYTES {
            ("AllReducePair", 0)
        } else {
            ("AllReduceRing", 0)
        }
    }
}
