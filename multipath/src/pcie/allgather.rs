//! AllGather over PCIe: every rank stages its chunk; every rank copies each peer's chunk
//! straight into that peer's block of its output (and its own input into its own block when
//! out of place). No reduction, no scratch.

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct AllGatherPcie;

impl PcieAlgorithm for AllGatherPcie {
    fn pieces(&self, _nranks: usize) -> usize {
        1
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { x.put(0, x.at(x.op.send, 0)) }
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        for p in 0..x.nranks() {
            // SAFETY: forwarded from the caller; block p of the output is `block` elements.
            unsafe {
                if p == x.me() {
                    x.copy_local(x.at(x.op.recv, p), x.at(x.op.send, 0))?;
                } else {
                    x.fetch(p, 0, x.at(x.op.recv, p))?;
                }
            }
        }
        Ok(())
    }
}
