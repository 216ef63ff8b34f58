//! AllReduce operator: one-shot for small messages (and mid-sized ones on 2 ranks), the pair
//! for large ones on 2 ranks, ring otherwise.

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

/// On 2 ranks one-shot again from this size, as far as the CCL buffer holds both inputs. Each
/// rank copies all of its input once and reduces all of it (2 bytes of work per byte, against
/// the ring's 1.5), but in one step, with plain copies into the peer's window: the ring's
/// second half then wrote into the peer's output with cross-memory attach, whose page pinning
/// took 15-17 % of a 1 MiB ring's cycles (`perf record`; since session 10 it goes through the
/// peer's window, and these figures were not re-measured). Session 7 (AMD EPYC dev machine), 5
/// alternated runs, medians, µs out of place / in place (`AMPCCL_ALGO_ALLREDUCE=...
/// ampccl-perf -g 2 -b 128K -e 2M -f 2 -n 300 -w 50`), one-shot vs ring: 256 KiB 38.6/38.2 vs
/// 33.0/42.5, 512 KiB 46.6/54.1 vs 51.2/69.9, 1 MiB 60.0/86.8 vs 77.2/77.2, 2 MiB
/// 117.7/131.9 vs 145.5/136.2. The choice may not depend on the placement (ranks may differ
/// in it), so in place 1 MiB pays 12 %.
pub const ONE_SHOT_PAIR_MIN_BYTES: usize = 512 * 1024;

pub struct AllReduceOperator;

impl Operator for AllReduceOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        let one_shot = bytes * p.world <= ONE_SHOT_MAX_BYTES
            || (p.world == 2 && bytes >= ONE_SHOT_PAIR_MIN_BYTES);
        if one_shot && bytes * p.world <= ctx.ccl_size {
            ("AllReduceOneShot", 0)
        } else if p.world == 2 && bytes >= allreduce_pair::MIN_BYTES {
            ("AllReducePair", 0)
        } else {
            ("AllReduceRing", 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::operator::selected;

    fn pick(bytes: usize, world: usize, in_place: bool, ccl_size: usize) -> &'static str {
        let ctx = SelectCtx {
            ccl_size,
            user_mem_links: true,
            oversubscribed: false,
            cache_bytes: 0,
        };
        selected(OpKind::AllReduce, bytes, world, in_place, &ctx)
    }

    #[test]
    fn two_ranks_take_one_shot_again_while_the_buffer_holds_both_inputs() {
        let ccl = 4 << 20;
        for in_place in [false, true] {
            let at = |bytes| pick(bytes, 2, in_place, ccl);
            assert_eq!(at(ONE_SHOT_MAX_BYTES / 2), "AllReduceOneShot");
            assert_eq!(at(ONE_SHOT_MAX_BYTES), "AllReduceRing");
            assert_eq!(at(ONE_SHOT_PAIR_MIN_BYTES - 4), "AllReduceRing");
            assert_eq!(at(ONE_SHOT_PAIR_MIN_BYTES), "AllReduceOneShot");
            assert_eq!(at(ccl / 2), "AllReduceOneShot");
            assert_eq!(at(ccl / 2 + 4), "AllReduceRing");
            assert_eq!(at(allreduce_pair::MIN_BYTES), "AllReducePair");
        }
        // A smaller CCL buffer bounds the one-shot range.
        assert_eq!(
            pick(ONE_SHOT_PAIR_MIN_BYTES, 2, false, 512 << 10),
            "AllReduceRing"
        );
        // More ranks: one-shot only for small messages.
        assert_eq!(
            pick(ONE_SHOT_PAIR_MIN_BYTES, 3, false, ccl),
            "AllReduceRing"
        );
        assert_eq!(
            pick(ONE_SHOT_MAX_BYTES / 4, 4, false, ccl),
            "AllReduceOneShot"
        );
    }
}
