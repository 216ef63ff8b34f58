//! Reduce over PCIe: every rank but the root stages its chunk; the root fetches them and
//! reduces them with its own, in rank order, into its output.

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct ReducePcie;

impl PcieAlgorithm for ReducePcie {
    fn pieces(&self, _nranks: usize) -> usize {
        1
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        if x.me() != x.root() {
            // SAFETY: forwarded from the caller.
            unsafe { x.put(0, x.at(x.op.send, 0)) }?;
        }
        Ok(())
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        if x.me() != x.root() {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        unsafe { x.fetch_and_reduce(0, x.at(x.op.send, 0), x.at(x.op.recv, 0)) }
    }
}
