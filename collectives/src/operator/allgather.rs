//! AllGather operator: mesh (every rank writes to every peer at once, the source documents'
//! example) while the whole output fits the CCL buffer and messages are small; on 2 ranks the
//! streaming pair once the output is beyond the cache; ring otherwise.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest per-rank message sent with the mesh algorithm.
pub const MESH_MAX_BYTES: usize = 64 * 1024;

pub struct AllGatherOperator;

impl Operator for AllGatherOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        let out = bytes * p.world;
        if bytes <= MESH_MAX_BYTES && out <= ctx.ccl_size {
            return ("AllGatherMesh", 0);
        }
        if p.world == 2 && !ctx.oversubscribed && ctx.beyond_cache(out) {
            ("AllGatherPair", 0)
        } else {
            ("AllGatherRing", 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{CACHE_SHARE, MIN_BYTES_UNKNOWN_CACHE};
    use crate::op::OpKind;
    use crate::operator::selected;

    fn pick(world: usize, bytes: usize, cache_bytes: usize, oversubscribed: bool) -> &'static str {
        let ctx = SelectCtx {
            ccl_size: 4 << 20,
            user_mem_links: true,
            oversubscribed,
            cache_bytes,
        };
        selected(OpKind::AllGather, bytes, world, false, &ctx)
    }

    #[test]
    fn two_ranks_take_the_pair_once_the_output_leaves_its_share_of_the_cache() {
        let llc = 32 << 20;
        let share = llc / CACHE_SHARE;
        assert_eq!(pick(2, 1024, llc, false), "AllGatherMesh");
        assert_eq!(pick(2, share / 2, llc, false), "AllGatherRing");
        assert_eq!(pick(2, share / 2 + 1, llc, false), "AllGatherPair");
        assert_eq!(pick(2, share / 2 + 1, llc, true), "AllGatherRing");
        assert_eq!(pick(3, share, llc, false), "AllGatherRing");
        let unknown = MIN_BYTES_UNKNOWN_CACHE / 2;
        assert_eq!(pick(2, unknown - 1, 0, false), "AllGatherRing");
        assert_eq!(pick(2, unknown, 0, false), "AllGatherPair");
    }
}
