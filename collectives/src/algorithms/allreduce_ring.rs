//! `AllReduceRing`: bandwidth-optimal ring allreduce (reduce-scatter then allgather), in
//! rounds that fit the CCL buffer. Each rank moves `2 (P-1)/P` of the data.

use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::blocks::{Blocks, rounds};
use crate::steps::ring::{self, Layout, Ring, Round};

/// The registry name of [`AllReduceRing`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllReduceRing";

pub struct AllReduceRing;

impl Executor for AllReduceRing {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let e = p.elem();
        if p.world == 1 {
            if !p.in_place && p.count > 0 {
                res.tasks.copy(
                    MAIN,
                    Mem::of(BufKind::UserOut),
                    Mem::of(BufKind::UserIn),
                    p.count * e,
                )?;
            }
            return Ok(());
        }
        let mut r = Ring::new(p, res, p.count.div_ceil(p.world) * e);
        let per_round = r.piece_elems * p.world;
        for (start, len) in rounds(p.count, per_round) {
            let round = Round {
                layout: Layout::Split(Blocks {
                    count: len,
                    parts: p.world,
                }),
                base_in: Mem::of(BufKind::UserIn).add(start * e),
                base_out: Mem::of(BufKind::UserOut).add(start * e),
            };
            // After reduce-scatter rank r owns block r + 1 (shift 1).
            let early = ring::early_gather(p, res, &r, &round, 1);
            ring::reduce_scatter(p, res, &mut r, &round, 1, None, early)?;
            if p.op == ReduceOp::Avg {
                let (own, n) = round.output(r.block_at(1), e);
                res.tasks.finish_avg(MAIN, p.dtype, own, n, p.world)?;
            }
            ring::all_gather(p, res, &mut r, &round, 1, early.is_some())?;
        }
        Ok(())
    }
}
