//! `AllToAllPairwise`: pairwise exchange in `world - 1` steps. At step `k` rank `r` sends its
//! block for rank `r + k` to it and receives the block rank `r - k` has for it, into the
//! output block of that source; its own block is copied locally. Every step is one send and
//! one receive per rank, so no link carries more than one message at a time and the steps
//! need no synchronisation besides the transfers themselves.
//!
//! On 2 ranks, or without user-memory links, receives go through the slots of a
//! [`Window`](crate::steps::window::Window) over the whole CCL input buffer (one stream), in
//! chunks of at most half of it, and are copied into the output; on more ranks with such links
//! they land straight in the output. On 2 ranks the system call of a cross-memory write
//! outweighs the copy it saves; on more ranks sharing few cores a direct write completes while
//! its receiver is descheduled, whereas through the window the receiver must run to copy out
//! and the steps' cycles wait for it (docs/TUNING.md, "Choices without a parameter"). In-place
//! all-to-all is refused by the operator (a received block would overwrite one not yet sent).

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::exchange::{Landing, copy_own, exchange};

/// The registry name of [`AllToAllPairwise`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllToAllPairwise";

pub struct AllToAllPairwise;

impl Executor for AllToAllPairwise {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::mesh(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (e, world, me) = (p.elem(), p.world, p.rank);
        let bytes = p.count * e;
        if bytes == 0 {
            return Ok(());
        }
        copy_own(res, p.in_place, me * bytes, me * bytes, bytes)?;
        let landing = if res.user_mem_links && world > 2 {
            Landing::Direct
        } else {
            Landing::window(p, res, 0, 1, bytes)?
        };
        for k in 1..world {
            let to = (me + k) % world;
            let from = (me + world - k) % world;
            let src = Mem::of(BufKind::UserIn).add(to * bytes);
            let dst = Mem::of(BufKind::UserOut).add(from * bytes);
            exchange(res, MAIN, to, src, from, dst, bytes, landing)?;
        }
        Ok(())
    }
}
