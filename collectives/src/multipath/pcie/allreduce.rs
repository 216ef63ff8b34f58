//! AllReduce over PCIe: every rank stages its chunk; every rank fetches all peers' chunks and
//! reduces them with its own, in rank order, on the GPU.
//!
//! Per rank and byte of the PCIe part: one byte D2H and `nranks - 1` bytes H2D, both streams
//! running concurrently (PCIe is full duplex). Best for 2 GPUs, where it is optimal.

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct AllReducePcie;

impl PcieAlgorithm for AllReducePcie {
    fn pieces(&self, _nranks: usize) -> usize {
        1
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { x.put(0, x.at(x.op.send, 0)) }
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { x.fetch_and_reduce(0, x.at(x.op.send, 0), x.at(x.op.recv, 0)) }
    }
}
