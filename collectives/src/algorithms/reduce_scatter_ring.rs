//! `ReduceScatterRing`: bandwidth-optimal ring reduce-scatter. For `world - 1` steps each rank
//! receives the previous rank's partial result of one block, combines it with its own input
//! block and forwards it; partial results stay in the receive slots of the CCL input buffer
//! ([`Ring`]) and only the final step writes the user output (block `rank`). Each rank
//! sends and receives `(P-1)/P` of the input once.
//!
//! Rounds of at most one half-buffer and at most [`PIECE`] bytes per block (round `i` reduces
//! elements `[start, start + len)` of every block). `Avg` reduces as `Sum` and divides the
//! output once at the end. In place (output = input + rank * count) is safe: block `rank` of
//! the input is read only by the final reduction, which writes it.
//!
//! Beyond the cache ([`crate::executor::beyond_cache`] of the input) the final reductions go
//! through `reduce_out`, which may write the output with streaming stores instead of reading
//! each line of it from memory first; it times both kinds and keeps the cheaper, because which
//! one wins depends on how busy this shared host's memory is (always streaming loses while the
//! memory is idle, and wins while it is busy). Inside the cache the output is stored plainly.

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::blocks::rounds;
use crate::steps::exchange::copy_own;
use crate::steps::ring::{self, Final, Layout, Ring, Round};

/// Most bytes of a block one round moves: the piece sent from the input, the slot it lands in
/// and the own input and output pieces of its reduction then stay in a core's L2 cache (a
/// half-buffer round spills it; much smaller pieces pay more steps). Measured value:
/// docs/TUNING.md.
pub static PIECE: Param = Param::new(
    "REDUCE_SCATTER_PIECE",
    512 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "most bytes of a block one round of the ring reduce-scatter moves",
);

/// The registry name of [`ReduceScatterRing`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "ReduceScatterRing";

pub struct ReduceScatterRing;

impl Executor for ReduceScatterRing {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (e, n) = (p.elem(), p.count);
        if n == 0 {
            return Ok(());
        }
        if p.world == 1 {
            // Avg over one rank is the value itself.
            return copy_own(res, p.in_place, 0, 0, n * e);
        }
        // Beyond the cache the final reductions may stream into the output (in place they
        // write the input block they read, and `reduce_out` stores plainly).
        let streamed = res.beyond_cache(n * e * p.world);
        let mut r = Ring::new(p, res, PIECE.bytes().min(n * e));
        for (start, len) in rounds(n, r.piece_elems) {
            let out = Mem::of(BufKind::UserOut).add(start * e);
            let round = Round {
                layout: Layout::Strided { stride: n, len },
                base_in: Mem::of(BufKind::UserIn).add(start * e),
                base_out: out,
            };
            // After world - 1 steps rank r holds block r + shift: shift 0.
            let fin = Final { at: out, streamed };
            ring::reduce_scatter(p, res, &mut r, &round, 0, Some(fin), None)?;
        }
        if p.op == ReduceOp::Avg {
            res.tasks
                .finish_avg(MAIN, p.dtype, Mem::of(BufKind::UserOut), n, p.world)?;
        }
        Ok(())
    }
}
