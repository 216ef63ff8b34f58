//! Broadcast operator: on 2 ranks of one host the pair, in which root and receiver share the
//! copying ([`crate::algorithms::broadcast_pair`]); otherwise the pipelined chain from the root
//! (why the chain beats the alternatives there: [`crate::algorithms::broadcast_chain`]).
//!
//! The pair is chosen whether or not the buffers are shared user memory (each rank knows only
//! its own, and both must run the same algorithm), and at every size: with both cores copying,
//! it beats the chain in place at every size, and out of place too since the root stages each
//! pull chunk and copies it into its output in one pass ([`copy_tee`]). The comparison that
//! decided it is in docs/TUNING.md ("Choices without a parameter").
//!
//! [`copy_tee`]: crate::resource::TaskSink::copy_tee

use crate::algorithms::{broadcast_chain, broadcast_pair};
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        // Across hosts the pair's pulls are round trips and its staging copies buy nothing (the
        // kernel copies on both ends); the chain streams straight into the output.
        if p.world == 2 && ctx.topology.hosts() == 1 {
            (broadcast_pair::NAME, 0)
        } else {
            (broadcast_chain::NAME, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::operator::selected;
    use ampccl_transport::topology::Topology;

    #[test]
    fn the_pair_on_one_host_the_chain_across_hosts_and_on_more_ranks() {
        let pick = |topology: &Topology, world: usize| {
            let ctx = SelectCtx {
                ccl_size: 4 << 20,
                user_mem_links: true,
                oversubscribed: false,
                cache_bytes: 0,
                topology,
            };
            selected(OpKind::Broadcast, 1 << 20, world, false, &ctx)
        };
        assert_eq!(pick(&Topology::single_host(2, 0), 2), broadcast_pair::NAME);
        assert_eq!(pick(&Topology::new(&[1, 2], 1), 2), broadcast_chain::NAME);
        assert_eq!(pick(&Topology::single_host(3, 0), 3), broadcast_chain::NAME);
    }
}
