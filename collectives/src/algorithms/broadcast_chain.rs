//! `BroadcastChain`: pipelined chain `root → root+1 → … → root+P-1` (mod P).
//!
//! The message goes in chunks (at most half the CCL input buffer). The root sends each chunk
//! of its input to the next rank (and copies it to its output unless in place); every other
//! rank receives chunk `c` into the next slot of its `CclIn` window, forwards it from there to
//! the next rank (the last rank does not) and copies it to its output. Chunk `c + 1`'s receive
//! is posted before chunk `c` is forwarded, so after a fill of `P - 1` chunks every link
//! carries a chunk at once: time ≈ `(chunks + P - 2) · chunk / bandwidth`. The relay loop and
//! its slot discipline are [`crate::steps::pipe::relay`]. Links: the ring neighbours (the same
//! for every root, so the cached resources fit all roots).
//!
//! Every chunk goes through the window, also where links could write user memory
//! (cross-memory attach): a direct write leaves the receiver idle while the sender copies and
//! `process_vm_writev` pins pages as it goes, whereas through the window the sender copies
//! chunk `c + 1` while the receiver copies chunk `c` out (docs/TUNING.md, "Choices without a
//! parameter"). 2-rank broadcasts run [`super::broadcast_pair`] instead, in which both ranks
//! copy at once: its receiver pulls from shared memory rather than through cross-memory
//! attach, which lost to the chain.
//!
//! A chunk from a rank on another host is received straight into the output and forwarded from
//! there: over the network the receiver's own core copies every byte out of its socket
//! wherever it lands, so the window would only add a copy.

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};
use crate::steps::pipe::{self, Chain, Deliver};

/// The registry name of [`BroadcastChain`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "BroadcastChain";

pub struct BroadcastChain;

impl Executor for BroadcastChain {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (from, to) = Chain::new(p).from_root();
        // Only the network half of `lands_directly`: on one host the window lets both ranks
        // copy at once even where the output is shared.
        let direct = from.is_some_and(|r| res.lands_from_network(r));
        let mut stage = Deliver {
            head: from.is_none(),
            keep: true,
            direct,
        };
        pipe::run_chain(p, res, (from, to), &mut stage)
    }
}
