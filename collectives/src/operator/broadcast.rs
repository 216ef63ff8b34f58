//! Broadcast operator: both ranks copying at once on 2 ranks while the message fits the cache,
//! a pipelined chain from the root otherwise.

use crate::algorithms::broadcast_pair;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        let pair = p.world == 2
            && ctx.user_mem_links
            && !ctx.oversubscribed
            && bytes >= broadcast_pair::MIN_BYTES
            && ctx
                .fits_cache_share(bytes, broadcast_pair::CACHE_SHARE)
                .unwrap_or(true);
        if pair {
            ("BroadcastPair", 0)
        } else {
            ("BroadcastChain", 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::operator::selected;

    fn pick(bytes: usize, cache_bytes: usize) -> &'static str {
        let ctx = SelectCtx {
            ccl_size: 4 << 20,
            user_mem_links: true,
            oversubscribed: false,
            cache_bytes,
        };
        selected(OpKind::Broadcast, bytes, 2, true, &ctx)
    }

    #[test]
    fn the_pair_serves_two_ranks_while_the_message_fits_its_share_of_the_cache() {
        let llc = 32 << 20;
        let fits = llc / broadcast_pair::CACHE_SHARE;
        assert_eq!(pick(broadcast_pair::MIN_BYTES - 1, llc), "BroadcastChain");
        assert_eq!(pick(broadcast_pair::MIN_BYTES, llc), "BroadcastPair");
        assert_eq!(pick(fits, llc), "BroadcastPair");
        assert_eq!(pick(fits + 1, llc), "BroadcastChain");
        // Cache size unknown: the pair at every size from its minimum.
        assert_eq!(pick(1 << 30, 0), "BroadcastPair");
    }
}
