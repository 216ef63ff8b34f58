//! AllGather operator: mesh (every rank writes to every peer at once, HCCL's main-and-side-streams
//! pattern) while the whole output fits the CCL buffer and messages are small; beyond that the
//! pair on 2 ranks of one host with a core each, the ring otherwise (across hosts the
//! pair's reads are round trips).

use ampccl_runtime::param::{Param, Unit};

use crate::algorithms::{allgather_mesh, allgather_pair, allgather_ring};
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest per-rank message sent with the mesh algorithm. The mesh is one round of messages
/// but forks a stream per peer; beyond this size the pair's or the ring's fewer, larger
/// copies win. Measured value: docs/TUNING.md.
pub static MESH_MAX_BYTES: Param = Param::new(
    "ALLGATHER_MESH_MAX",
    64 << 10,
    (0, 1 << 30),
    Unit::Bytes,
    "largest per-rank allgather message sent with the mesh algorithm",
);

pub struct AllGatherOperator;

impl Operator for AllGatherOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        let out = bytes * p.world;
        if bytes <= MESH_MAX_BYTES.bytes() && out <= ctx.ccl_size {
            return (allgather_mesh::NAME, 0);
        }
        // Across hosts the pair's reads are round trips; the ring streams.
        if p.world == 2 && !ctx.oversubscribed && ctx.topology.hosts() == 1 {
            (allgather_pair::NAME, 0)
        } else {
            (allgather_ring::NAME, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::operator::selected;
    use ampccl_transport::topology::Topology;

    fn pick(world: usize, bytes: usize, cache_bytes: usize, oversubscribed: bool) -> &'static str {
        pick_on(
            &Topology::single_host(world, 0),
            world,
            bytes,
            (cache_bytes, oversubscribed),
        )
    }

    /// As `pick`, on the hosts `topology` describes.
    fn pick_on(
        topology: &Topology,
        world: usize,
        bytes: usize,
        (cache_bytes, oversubscribed): (usize, bool),
    ) -> &'static str {
        let ctx = SelectCtx {
            ccl_size: 4 << 20,
            user_mem_links: true,
            oversubscribed,
            cache_bytes,
            topology,
        };
        selected(OpKind::AllGather, bytes, world, false, &ctx)
    }

    /// Across hosts the pair (reads of the peer's memory, a round trip each) gives way to the
    /// ring.
    #[test]
    fn two_hosts_take_the_ring_beyond_the_mesh() {
        let two_hosts = Topology::new(&[1, 2], 0);
        let big = 64 << 20;
        assert_eq!(pick(2, big, 32 << 20, false), allgather_pair::NAME);
        assert_eq!(
            pick_on(&two_hosts, 2, big, (32 << 20, false)),
            allgather_ring::NAME
        );
    }

    #[test]
    fn two_ranks_with_a_core_each_take_the_pair_beyond_the_mesh() {
        let llc = 32 << 20;
        let mesh_max = MESH_MAX_BYTES.bytes();
        assert_eq!(
            pick(2, 1024.min(mesh_max), llc, false),
            allgather_mesh::NAME
        );
        assert_eq!(pick(2, mesh_max, llc, false), allgather_mesh::NAME);
        for cache in [llc, 0] {
            assert_eq!(pick(2, mesh_max + 1, cache, false), allgather_pair::NAME);
            assert_eq!(pick(2, 64 << 20, cache, false), allgather_pair::NAME);
        }
        assert_eq!(pick(2, mesh_max + 1, llc, true), allgather_ring::NAME);
        assert_eq!(pick(3, mesh_max + 1, llc, false), allgather_ring::NAME);
        assert_eq!(pick(3, 64 << 20, llc, false), allgather_ring::NAME);
    }
}
