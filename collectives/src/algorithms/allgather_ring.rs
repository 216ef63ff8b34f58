//! `AllGatherRing`: bandwidth-optimal ring allgather. Each rank first places its own block in
//! the output (unless in place), then for `world - 1` steps forwards to the next rank the block
//! it received last from the previous one, so every rank sends and receives `(P-1)/P` of the
//! output once.
//!
//! The blocks travel through the slots of the CCL input buffer ([`Ring`]), in rounds of at
//! most half of it per block (round `i` moves elements `[start, start + len)` of every block),
//! also where links could write the peer's output directly: through the window the sender's
//! copy and the receiver's copy out run on both cores at once, whereas a cross-memory write
//! costs a system call and pins pages as it goes (docs/TUNING.md, "Choices without a
//! parameter"). A block from another host lands in the output directly: over the network the
//! receiver copies it out of its socket anyway ([`ring::all_gather`]).

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, Mem};
use crate::steps::blocks::rounds;
use crate::steps::exchange::copy_own;
use crate::steps::ring::{self, Layout, Ring, Round};

/// The registry name of [`AllGatherRing`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllGatherRing";

pub struct AllGatherRing;

impl Executor for AllGatherRing {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (e, n) = (p.elem(), p.count);
        copy_own(res, p.in_place, p.rank * n * e, 0, n * e)?;
        if p.world == 1 || n == 0 {
            return Ok(());
        }
        let mut r = Ring::new(p, res, n * e);
        for (start, len) in rounds(n, r.piece_elems) {
            let round = Round {
                layout: Layout::Strided { stride: n, len },
                base_in: Mem::of(BufKind::UserIn).add(start * e),
                base_out: Mem::of(BufKind::UserOut).add(start * e),
            };
            // Rank r starts owning block r (shift 0).
            ring::all_gather(p, res, &mut r, &round, 0, false)?;
        }
        Ok(())
    }
}
