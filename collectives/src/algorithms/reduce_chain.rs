//! `ReduceChain`: pipelined chain toward the root: `root+P-1 → root+P-2 → … → root` (mod P).
//!
//! The message goes in chunks of half the CCL input buffer. The first rank of the chain
//! (`root + P - 1`) sends each chunk of its input; every middle rank receives the partial
//! result of chunk `c` into slot `c % 2` of `CclIn`, reduces its own input into it **in the
//! slot itself** (`slot = input op slot`: no extra memory, one pass over the data) and forwards
//! the slot; the root receives the partial and reduces it with its input into its output
//! (`out = input op slot`, which is also correct in place, where `out` is `input`), then
//! divides by `P` for `Avg` (reduced as `Sum` until then). The slot is re-posted only after its
//! partial was forwarded, and chunk `c + 1` is received while chunk `c` is reduced and forwarded
//! (see [`crate::steps::pipe::relay`]). Non-root ranks never touch their output (NCCL lets them
//! pass none). Partial results are combined in chain order, the same on every call.

use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::pipe::{self, Chain, Stage};

/// The registry name of [`ReduceChain`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "ReduceChain";

pub struct ReduceChain;

/// One rank's part: the head sends its input, the others reduce into the slot (middle) or the
/// output (root).
struct Combine<'p> {
    p: &'p OpParam,
    head: bool,
    root: bool,
}

impl Stage for Combine<'_> {
    fn at(&self, off: usize, slot: Mem) -> Mem {
        if self.head {
            Mem::of(BufKind::UserIn).add(off)
        } else {
            slot
        }
    }

    fn arrived(
        &mut self,
        res: &mut AlgResourceResponse<'_>,
        off: usize,
        len: usize,
        at: Mem,
    ) -> Result<Mem> {
        if self.head {
            return Ok(at);
        }
        let p = self.p;
        let (e, own) = (p.elem(), Mem::of(BufKind::UserIn).add(off));
        let dst = if self.root {
            Mem::of(BufKind::UserOut).add(off)
        } else {
            at
        };
        res.tasks
            .reduce(MAIN, p.dtype, p.op, dst, own, at, len / e)?;
        if self.root && p.op == ReduceOp::Avg {
            res.tasks.finish_avg(MAIN, p.dtype, dst, len / e, p.world)?;
        }
        Ok(dst)
    }
}

impl Executor for ReduceChain {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        // On one rank Avg is the value itself: `run_chain` copies.
        let (from, to) = Chain::new(p).to_root();
        let mut stage = Combine {
            p,
            head: from.is_none(),
            root: to.is_none(),
        };
        pipe::run_chain(p, res, (from, to), &mut stage)
    }
}
