//! AllReduce operator: one-shot for small messages (and mid-sized ones on 2 ranks), the pair
//! for large ones on 2 ranks of one host, ring otherwise.

use ampccl_runtime::param::{Param, Unit};

use crate::algorithms::{allreduce_oneshot, allreduce_pair, allreduce_ring};
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest `bytes * world` sent with the one-shot algorithm (it moves `world` times the data,
/// so the bound scales with the world size). Below it one round of messages beats the ring's
/// `2 (P-1)` dependent steps; where ranks outnumber cores each of those steps costs a context
/// switch, so one-shot keeps winning there up to the same bound. Measured value:
/// docs/TUNING.md.
pub static ONE_SHOT_MAX_BYTES: Param = Param::new(
    "ALLREDUCE_ONESHOT_MAX",
    256 << 10,
    (0, 1 << 30),
    Unit::Bytes,
    "largest bytes x world of an allreduce sent with the one-shot algorithm",
);

/// On 2 ranks one-shot again from this size, as far as the CCL buffer holds both inputs. Each
/// rank copies all of its input once and reduces all of it (2 bytes of work per byte, against
/// the ring's 1.5), but in one step, with plain copies into the peer's window, where the ring
/// hands the reduced half over in a second step. The choice may not depend on the placement
/// (ranks may differ in it), so in place, where the ring's second step is cheaper, pays a
/// little at some sizes. The measurement behind the value predates the ring's second step
/// going through the peer's window (it wrote with cross-memory attach then): docs/TUNING.md.
pub static ONE_SHOT_PAIR_MIN_BYTES: Param = Param::new(
    "ALLREDUCE_ONESHOT_PAIR_MIN",
    512 << 10,
    (0, u64::MAX),
    Unit::Bytes,
    "on 2 ranks, allreduces from this size take one-shot again while the CCL buffer holds both inputs",
);

pub struct AllReduceOperator;

impl Operator for AllReduceOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        // Across hosts the pair's one-shot waits for the whole message before it reduces; the
        // ring's two halves overlap the network with the reductions.
        let one_shot = bytes * p.world <= ONE_SHOT_MAX_BYTES.bytes()
            || (p.world == 2
                && bytes >= ONE_SHOT_PAIR_MIN_BYTES.bytes()
                && ctx.topology.hosts() == 1);
        if one_shot && bytes * p.world <= ctx.ccl_size {
            (allreduce_oneshot::NAME, 0)
        } else if p.world == 2
            && bytes >= allreduce_pair::MIN_BYTES.bytes()
            && ctx.topology.hosts() == 1
        {
            // Across hosts the pair's reads are round trips; the ring streams.
            (allreduce_pair::NAME, 0)
        } else {
            (allreduce_ring::NAME, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::operator::selected;
    use ampccl_transport::topology::Topology;

    fn pick(bytes: usize, world: usize, in_place: bool, ccl_size: usize) -> &'static str {
        pick_on(
            &Topology::single_host(world, 0),
            world,
            bytes,
            (in_place, ccl_size),
        )
    }

    /// As `pick`, on the hosts `topology` describes.
    fn pick_on(
        topology: &Topology,
        world: usize,
        bytes: usize,
        (in_place, ccl_size): (bool, usize),
    ) -> &'static str {
        let ctx = SelectCtx {
            ccl_size,
            user_mem_links: true,
            oversubscribed: false,
            cache_bytes: 0,
            topology,
        };
        selected(OpKind::AllReduce, bytes, world, in_place, &ctx)
    }

    /// Across hosts the pair (reads of the peer's memory, a round trip each) and the 2-rank
    /// one-shot of mid-sized messages (no overlap of network and reduction) give way to the
    /// ring.
    #[test]
    fn two_hosts_take_the_ring_where_one_host_takes_the_pair_or_one_shot() {
        let two_hosts = Topology::new(&[1, 2], 0);
        let mid = ONE_SHOT_PAIR_MIN_BYTES.bytes();
        for (bytes, one_host) in [
            (allreduce_pair::MIN_BYTES.bytes(), allreduce_pair::NAME),
            (mid, allreduce_oneshot::NAME),
        ] {
            assert_eq!(pick(bytes, 2, false, 4 << 20), one_host);
            assert_eq!(
                pick_on(&two_hosts, 2, bytes, (false, 4 << 20)),
                allreduce_ring::NAME
            );
        }
        // Small messages stay one-shot everywhere.
        assert_eq!(
            pick_on(&two_hosts, 2, 8, (false, 4 << 20)),
            allreduce_oneshot::NAME
        );
    }

    #[test]
    fn two_ranks_take_one_shot_again_while_the_buffer_holds_both_inputs() {
        let ccl = 4 << 20;
        let (one_shot_max, pair_min) =
            (ONE_SHOT_MAX_BYTES.bytes(), ONE_SHOT_PAIR_MIN_BYTES.bytes());
        for in_place in [false, true] {
            let at = |bytes| pick(bytes, 2, in_place, ccl);
            assert_eq!(at(one_shot_max / 2), allreduce_oneshot::NAME);
            assert_eq!(at(one_shot_max), allreduce_ring::NAME);
            assert_eq!(at(pair_min - 4), allreduce_ring::NAME);
            assert_eq!(at(pair_min), allreduce_oneshot::NAME);
            assert_eq!(at(ccl / 2), allreduce_oneshot::NAME);
            assert_eq!(at(ccl / 2 + 4), allreduce_ring::NAME);
            assert_eq!(at(allreduce_pair::MIN_BYTES.bytes()), allreduce_pair::NAME);
        }
        // A smaller CCL buffer bounds the one-shot range.
        assert_eq!(pick(pair_min, 2, false, 512 << 10), allreduce_ring::NAME);
        // More ranks: one-shot only for small messages.
        assert_eq!(pick(pair_min, 3, false, ccl), allreduce_ring::NAME);
        assert_eq!(
            pick(one_shot_max / 4, 4, false, ccl),
            allreduce_oneshot::NAME
        );
    }
}
