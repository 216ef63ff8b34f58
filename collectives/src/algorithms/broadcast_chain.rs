//! `BroadcastChain`: pipelined chain `root → root+1 → … → root+P-1` (mod P).
//!
//! The message goes in chunks of half the CCL input buffer. The root sends each chunk of its
//! input to the next rank (and copies it to its output unless in place); every other rank
//! receives chunk `c` into slot `c % 2` of `CclIn`, forwards it from there to the next rank
//! (the last rank does not) and copies it to its output.
//!
//! Messages above [`DIRECT_MAX_BYTES`] go through `CclIn` even when links could write user
//! memory (cross-memory attach): the sender copies chunk `c + 1` while the receiver copies
//! chunk `c` out, both cores busy, whereas a direct write leaves the receiver idle and
//! `process_vm_writev` pins pages as it goes. Measured on 2 ranks (`ampccl-perf -o broadcast
//! -g 2`, direct vs through `CclIn`): 64 KiB 6.9 vs 11.7 us, 128 KiB 11.0 vs 22.9 us, 1 MiB
//! 217 vs 132 us, 8 MiB 1418 vs 1250 us, 64 MiB 19.7 vs 13.2 ms (chunked). (On 2 ranks with
//! such links the operator picks [`super::broadcast_pair`] from 32 KiB.) Chunk `c + 1`'s
//! receive is posted before chunk `c` is forwarded, so after a fill of `P - 1` chunks every
//! link carries a chunk at once: time ≈
//! `(chunks + P - 2) · chunk / bandwidth`. The relay loop and its double-buffer discipline are
//! [`crate::steps::pipe::relay`]. Links: the ring neighbours (the same for every root, so the
//! cached resources fit all roots).

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};
use crate::steps::pipe::{self, Chain, Deliver};

/// Largest message received straight into user memory when links allow it.
pub const DIRECT_MAX_BYTES: usize = 256 * 1024;
pub struct BroadcastChain;

impl Executor for BroadcastChain {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (from, to) = Chain::new(p).from_root();
        let bytes = p.count * p.elem();
        let mut stage = Deliver {
            head: from.is_none(),
            keep: true,
            direct: res.user_mem_links && bytes <= DIRECT_MAX_BYTES,
        };
        pipe::run_chain(p, res, (from, to), &mut stage)
    }
}
