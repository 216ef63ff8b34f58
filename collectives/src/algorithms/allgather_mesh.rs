//! `AllGatherMesh`: every rank exchanges its block with every peer at once, one side stream
//! per peer (HCCL's pattern of a main stream with side streams joined by notifies).
//!
//! ```text
//! main:     record(fork i) ─────────────────────────── copy own block ── wait(join i) …
//! side i:   wait(fork i) ── [rx from peer ─ tx to peer ─ rx done ─ (copy) ─ tx done]* ── record(join i)
//! ```
//! Side stream `i` (`1..world`) serves peer `rank + i`: fork notify `i - 1` starts it after what
//! the main stream queued before, join notify `world - 2 + i` ends it, so `stream_num =
//! world - 1` and `notify_num = 2 (world - 1)`. Each peer's block lands in its own part of the
//! CCL input buffer (a [`Window`](crate::steps::window::Window) part of `ccl_in_size / world`
//! bytes; the streams never share one), in slots rotating over the part, and is copied into
//! the output, in chunks of at most half the part. Not straight into the output even where
//! links could write user memory: a cross-memory write costs a system call, more than the copy
//! it saves at the sizes the mesh serves (docs/TUNING.md, "Choices without a parameter"). The
//! own block is copied on the main stream unless the call is in place. One round of
//! messages: the latency algorithm; the operator selects it for small messages.

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::exchange::{Landing, copy_own, exchange};

/// The registry name of [`AllGatherMesh`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllGatherMesh";

pub struct AllGatherMesh;

impl Executor for AllGatherMesh {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        let sides = p.world - 1;
        AlgResourceRequest {
            stream_num: sides,
            notify_num: 2 * sides,
            ..AlgResourceRequest::mesh(p.rank, p.world)
        }
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (e, world, me) = (p.elem(), p.world, p.rank);
        let bytes = p.count * e;
        if bytes == 0 {
            return Ok(());
        }
        let sides = world - 1;
        for i in 1..world {
            res.tasks.record(MAIN, i - 1)?;
            res.tasks.wait(i, i - 1)?;
        }
        copy_own(res, p.in_place, me * bytes, 0, bytes)?;
        for i in 1..world {
            let peer = (me + i) % world;
            let landing = Landing::window(p, res, peer, world, bytes)?;
            let own = Mem::of(BufKind::UserIn);
            let dst = Mem::of(BufKind::UserOut).add(peer * bytes);
            exchange(res, i, peer, own, peer, dst, bytes, landing)?;
            res.tasks.record(i, sides + i - 1)?;
        }
        for i in 1..world {
            res.tasks.wait(MAIN, sides + i - 1)?;
        }
        Ok(())
    }
}
