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
//! chunk `c + 1` while the receiver copies chunk `c` out. Measured with session 10's window
//! copy (`AMPCCL_SHM_CMA=1` vs `0`, `ampccl-perf -g P -o broadcast -b 1K -e 1M -f 4 -n 40
//! -w 10`, 3 alternated runs, µs in place, direct vs window): 3 ranks 4 KiB 9.1 vs 5.1, 64 KiB
//! 23.8 vs 8.2, 256 KiB 62.2 vs 24.4; 4 ranks 4 KiB 14.6 vs 7.6, 256 KiB 89.3 vs 31.5. On 2
//! ranks the chain also beat both ranks copying at once through cross-memory attach (session
//! 9's pair, removed) at every size from 32 KiB to 8 MiB: 32 KiB 2.9 vs 4.7 µs, 1 MiB 35 vs
//! 43, 4 MiB 133 vs 161 (in place, 5 alternated runs). Since session 14 2-rank broadcasts run
//! [`super::broadcast_pair`], whose receiver pulls from shared memory instead.

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};
use crate::steps::pipe::{self, Chain, Deliver};

pub struct BroadcastChain;

impl Executor for BroadcastChain {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (from, to) = Chain::new(p).from_root();
        let mut stage = Deliver {
            head: from.is_none(),
            keep: true,
            direct: false,
        };
        pipe::run_chain(p, res, (from, to), &mut stage)
    }
}
