//! `AllToAllPairwise`: pairwise exchange in `world - 1` steps. At step `k` rank `r` sends its
//! block for rank `r + k` to it and receives the block rank `r - k` has for it, into the
//! output block of that source; its own block is copied locally. Every step is one send and
//! one receive per rank, so no link carries more than one message at a time and the steps
//! need no synchronisation besides the transfers themselves.
//!
//! Without user-memory links receives go through the CCL input buffer (one stream, so the
//! whole buffer is the bounce slot) in chunks of its size and are copied into the output;
//! with them they land straight in the output. In-place all-to-all is refused by the operator
//! (a received block would overwrite one not yet sent).

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::blocks::chunk_elems;
use crate::steps::exchange::{Landing, copy_own, exchange};

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
        let slot_bytes = chunk_elems(res.ccl_in_size, e) * e;
        let landing = Landing::for_links(res, Mem::of(BufKind::CclIn), slot_bytes);
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
