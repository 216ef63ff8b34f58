//! `AllGatherMesh`: every rank exchanges its block with every peer at once, one slave stream
//! per peer (the source documents' example of main/slave streams and notifies).
//!
//! ```text
//! main:     record(fork i) ─────────────────────────── copy own block ── wait(join i) …
//! slave i:  wait(fork i) ── [rx from peer ─ tx to peer ─ rx done ─ (copy) ─ tx done]* ── record(join i)
//! ```
//! Slave `i` (`1..world`) serves peer `rank + i`: fork notify `i - 1` starts it after what
//! the main stream queued before, join notify `world - 2 + i` ends it, so `stream_num =
//! world - 1` and `notify_num = 2 (world - 1)`. Without user-memory links each peer receives
//! into its own slot of the CCL input buffer (`ccl_in_size / world`, whole elements; the
//! streams never share a slot) and the block is copied into the output, in chunks of the
//! slot size; with them it lands straight in the output block, in one transfer. The own block
//! is copied on the main stream unless the call is in place. One round of messages: the
//! latency algorithm; the operator selects it for small messages.

use ampccl_runtime::{Error, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::exchange::{Landing, copy_own, exchange};

pub struct AllGatherMesh;

impl Executor for AllGatherMesh {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        let slaves = p.world - 1;
        AlgResourceRequest {
            stream_num: slaves,
            notify_num: 2 * slaves,
            ..AlgResourceRequest::mesh(p.rank, p.world)
        }
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (e, world, me) = (p.elem(), p.world, p.rank);
        let bytes = p.count * e;
        if bytes == 0 {
            return Ok(());
        }
        let slot_bytes = res.ccl_in_size / world / e * e;
        if slot_bytes == 0 && !res.user_mem_links {
            return Err(Error::InvalidArgument(format!(
                "AllGatherMesh: a CCL buffer of {} bytes has no room for one {} per rank",
                res.ccl_in_size,
                p.dtype.name()
            )));
        }
        let slaves = world - 1;
        for i in 1..world {
            res.tasks.record(MAIN, i - 1)?;
            res.tasks.wait(i, i - 1)?;
        }
        copy_own(res, p.in_place, me * bytes, 0, bytes)?;
        for i in 1..world {
            let peer = (me + i) % world;
            let slot = Mem::of(BufKind::CclIn).add(peer * slot_bytes);
            let landing = Landing::for_links(res, slot, slot_bytes);
            let own = Mem::of(BufKind::UserIn);
            let dst = Mem::of(BufKind::UserOut).add(peer * bytes);
            exchange(res, i, peer, own, peer, dst, bytes, landing)?;
            res.tasks.record(i, slaves + i - 1)?;
        }
        for i in 1..world {
            res.tasks.wait(MAIN, slaves + i - 1)?;
        }
        Ok(())
    }
}
