//! `Recv`: the receiving half of a point-to-point transfer (HCCL's chunked loop through the CCL buffer).
//!
//! Chunks of half the CCL input buffer, the same as [`crate::algorithms::send`] computes. For
//! each chunk: post the receive into slot `c % 2` of `CclIn` — or straight into the user's
//! output when the link writes user memory —, wait for the data, copy it to the output. Chunk
//! `c + 1` is posted before chunk `c` is copied out, so the sender's next write overlaps the
//! copy. Runs the tail of [`crate::steps::pipe::relay`].

use ampccl_runtime::Result;

use crate::algorithms::send::{check_peer, p2p_bound};
use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};
use crate::steps::pipe::{self, Deliver, Pipe};

/// The registry name of [`Recv`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "Recv";

pub struct Recv;

impl Executor for Recv {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::mesh(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        check_peer(p)?;
        let bound = p2p_bound(res.ccl_in_size);
        let pipe = Pipe {
            from: Some(p.root),
            to: None,
            bound,
        };
        let mut stage = Deliver {
            head: false,
            keep: true,
            direct: res.user_mem_links,
        };
        pipe::relay(
            res,
            &pipe,
            &bound.chunks(p.count * p.elem(), true),
            &mut stage,
        )
    }
}
