//! AllReduce over PCIe.
//!
//! **Two GPUs:** each rank stages its chunk and fetches its peer's, then reduces the two in
//! rank order on the GPU. Per rank and byte of the PCIe part: one byte D2H, one byte H2D, the
//! least any scheme moves.
//!
//! **More GPUs:** fetching every peer's chunk would cost `nranks − 1` bytes H2D per byte, and
//! H2D is the scarce direction when every GPU copies both ways. Instead each chunk takes two
//! rounds, a reduce-scatter and an allgather through host memory: the chunk is cut into one
//! part per rank; in round 0 every rank stages the parts of its peers and reduces its own part
//! from every rank's piece (rank order) into its output; in round 1 it stages that reduced part
//! and fetches its peers' reduced parts into their places. Per byte: one byte D2H and
//! `2 (nranks − 1) / nranks` H2D (1.5 on 4 GPUs instead of 3). Every element is reduced by one
//! rank only, so all ranks hold bit-identical results.

use super::{ChunkCtx, PcieAlgorithm};
use crate::Result;

pub(super) struct AllReducePcie;

/// Whether `nranks` GPUs use the two-round scheme.
fn two_rounds(nranks: usize) -> bool {
    nranks > 2
}

impl PcieAlgorithm for AllReducePcie {
    fn pieces(&self, nranks: usize) -> usize {
        if two_rounds(nranks) { nranks } else { 1 }
    }

    fn parts(&self, nranks: usize) -> usize {
        self.pieces(nranks)
    }

    fn rounds(&self, nranks: usize) -> usize {
        if two_rounds(nranks) { 2 } else { 1 }
    }

    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()> {
        let (n, me) = (x.nranks(), x.me());
        // SAFETY (all three): forwarded from the caller; parts lie within the chunk.
        match (two_rounds(n), x.round) {
            (false, _) => unsafe { x.put(0, x.at(x.op.send, 0)) },
            (true, 0) => {
                for q in (0..n).filter(|&q| q != me) {
                    let y = x.part(q, n);
                    unsafe { y.put(q, y.at(x.op.send, 0)) }?;
                }
                Ok(())
            }
            (true, _) => {
                let y = x.part(me, n);
                unsafe { y.put(me, y.at(x.op.recv, 0)) }
            }
        }
    }

    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()> {
        let (n, me) = (x.nranks(), x.me());
        // SAFETY (all three): as `send`.
        match (two_rounds(n), x.round) {
            (false, _) => unsafe { x.fetch_and_reduce(0, x.at(x.op.send, 0), x.at(x.op.recv, 0)) },
            (true, 0) => {
                let y = x.part(me, n);
                unsafe { y.fetch_and_reduce(me, y.at(x.op.send, 0), y.at(x.op.recv, 0)) }
            }
            (true, _) => {
                for p in (0..n).filter(|&p| p != me) {
                    let y = x.part(p, n);
                    unsafe { y.fetch(p, p, y.at(x.op.recv, 0)) }?;
                }
                Ok(())
            }
        }
    }
}
