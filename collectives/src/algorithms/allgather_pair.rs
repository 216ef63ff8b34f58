//! `AllGatherPair`: a 2-rank allgather in which each rank copies its input once, into its output
//! and into memory the peer reads, and reads the peer's block out of the peer's memory.
//!
//! ```text
//! per piece (PIECE bytes of each rank's block):
//!   tee(my input piece → output[me], my CclIn slot) ── offer(slot)
//!   ── read(peer's slot → output[peer]) ── read done ── peer's read of my slot done
//! ```
//! Three copies per byte of a rank's block are the least without shared user memory: into the
//! own output, into shared memory, out of it into the peer's output. The ring
//! ([`super::allgather_ring`]) makes them three passes: the own copy, a send of the block into
//! the peer's window, the peer's copy out. Here the first two are one pass ([`copy_tee`]): a
//! block of the input goes to the output and the slot while it is in the L1 cache, so the input
//! is read once. The peer then reads the slot (a read offer) instead of being written to: the
//! send needs no copy of its own. Where this rank's input lies in shared user memory it is
//! offered as it is, and the peer's read is the only copy of its block.
//!
//! Beyond the cache ([`crate::executor::beyond_cache`]) both output blocks are written with
//! streaming stores (`CopyTo::Output`: pieces of [`PIECE`] bytes stream), which skip reading
//! the lines they overwrite, while the slot stays in the cache: each rank moves 3 bytes through
//! memory per byte of its block. Inside the cache the outputs are stored plainly, as the next
//! user of the data reads them from the cache.
//!
//! [`copy_tee`]: crate::resource::TaskSink::copy_tee

use ampccl_runtime::Result;
use ampccl_runtime::param::{Param, Unit};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, CopyTo, MAIN, Mem};
use crate::steps::blocks::rounds;
use crate::steps::pipe::copy_through;
use crate::steps::ring::Ring;

/// Bytes of a piece (at most one ring slot): large enough for `copy_out` to stream it
/// ([`ampccl_runtime::copy::STREAM_OUT_MIN`]) beyond the cache, small enough that a piece and
/// its copies stay in the cache. Measured value: docs/TUNING.md.
pub static PIECE: Param = Param::new(
    "ALLGATHER_PAIR_PIECE",
    1 << 20,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "bytes of each rank's block one step of the 2-rank allgather pair moves",
);

/// The registry name of [`AllGatherPair`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllGatherPair";

pub struct AllGatherPair;

impl Executor for AllGatherPair {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let e = p.elem();
        let bytes = p.count * e;
        if p.world == 1 {
            return copy_through(p, res, bytes);
        }
        let (me, peer) = (p.rank, p.pair_peer(NAME)?);
        let (input, output) = (Mem::of(BufKind::UserIn), Mem::of(BufKind::UserOut));
        let shared = res.shared_user.input;
        let beyond = res.beyond_cache(bytes * p.world);
        let own_to = if beyond {
            CopyTo::Output
        } else {
            CopyTo::Local
        };
        let mut r = Ring::new(p, res, PIECE.bytes().min(bytes));
        let piece = r.piece_elems;
        for (start, len) in rounds(p.count, piece) {
            let (off, n) = (start * e, len * e);
            let (src, own) = (input.add(off), output.add(me * bytes + off));
            let at = if shared { src } else { r.next_slot() };
            let t = &mut *res.tasks;
            // The own block and the copy the peer reads, in one pass over the input (no copy
            // where the destination is the input: in place, or offered from shared memory).
            t.copy_tee(MAIN, [(own, own_to), (at, CopyTo::Peer)], src, n)?;
            t.offer_async(MAIN, peer, at, n)?;
            t.read_async(MAIN, peer, output.add(peer * bytes + off), n, own_to)?;
            t.tx_wait_done(MAIN, peer)?;
            t.offer_wait_done(MAIN, peer, n)?;
        }
        Ok(())
    }
}
