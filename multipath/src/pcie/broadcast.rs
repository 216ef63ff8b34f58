//! Broadcast over PCIe: the root stages its chunk; every other rank copies it into its output
//! (the root copies input to output itself when out of place).

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct BroadcastPcie;

impl PcieAlgorithm for BroadcastPcie {
    fn pieces(&self, _nranks: usize) -> usize {
        1
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        if x.me() == x.root() {
            // SAFETY: forwarded from the caller.
            unsafe { x.put(0, x.at(x.op.send, 0)) }?;
        }
        Ok(())
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            if x.me() == x.root() {
                x.copy_local(x.at(x.op.recv, 0), x.at(x.op.send, 0))
            } else {
                x.fetch(x.root(), 0, x.at(x.op.recv, 0))
            }
        }
    }
}
