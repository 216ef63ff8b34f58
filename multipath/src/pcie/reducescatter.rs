//! ReduceScatter over PCIe: every rank stages, for each peer `q`, its chunk of block `q`
//! (piece `q` of its slot); rank `q` fetches piece `q` of every peer and reduces them with its
//! own block, in rank order, into its output.
//!
//! Per rank and byte of output: `nranks - 1` bytes D2H and as many H2D.

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct ReduceScatterPcie;

impl PcieAlgorithm for ReduceScatterPcie {
    fn pieces(&self, nranks: usize) -> usize {
        nranks
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        for q in (0..x.nranks()).filter(|&q| q != x.me()) {
            // SAFETY: forwarded from the caller; the input holds nranks blocks.
            unsafe { x.put(q, x.at(x.op.send, q)) }?;
        }
        Ok(())
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        let me = x.me();
        // SAFETY: forwarded from the caller; the output is one block.
        unsafe { x.fetch_and_reduce(me, x.at(x.op.send, me), x.at(x.op.recv, 0)) }
    }
}
