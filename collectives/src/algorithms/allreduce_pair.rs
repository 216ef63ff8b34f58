//! `AllReducePair`: a large allreduce between 2 ranks that writes each output byte once, with
//! streaming stores.
//!
//! ```text
//! per round (one slot's worth of each rank's half):
//!   rx(peer's piece of my half → CclIn slot) ── tx(my piece of the peer's half → peer's slot)
//!   ── both done ── reduce(my input + slot → CclOut, each block copied on to my output)
//!   ── offer(CclOut) ── read(peer's CclOut → my output) ── both done
//! ```
//! The ring ([`super::allreduce_ring`]) on 2 ranks reduces into the output and then sends the
//! reduced half to the peer, which copies it into its output (through its window). Beyond the
//! cache both stores miss it, and each first reads the line it is about to overwrite (read for
//! ownership), so each output byte costs three bytes of memory traffic. Here the reduction
//! lands in `CclOut`, a cache-resident piece of the shared window. Each rank copies its own
//! result into its output and reads the peer's result out of the peer's window (a read offer)
//! into its output, with streaming stores in both cases: two bytes of traffic per output byte,
//! and the two ranks still copy at the same time. It costs one more pass over each half, so it
//! pays only once the outputs far exceed the cache ([`MIN_BYTES`]). In place, with links that
//! reach user memory, a rank reduces straight into its output and offers it from there (no
//! extra pass, nothing to stream). Without such links every transfer goes through the windows.
//!
//! The copy into the own output takes each block of the result while it is in the L1 cache
//! ([`reduce_tee`]; an average, final only after its division, is copied afterwards) instead
//! of a second pass over the piece. Inside the cache the pair still loses to one-shot and the
//! ring: its extra pass costs more than the streaming stores save.
//!
//! [`reduce_tee`]: crate::resource::TaskSink::reduce_tee

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, CopyTo, MAIN, Mem};
use crate::steps::blocks::{Blocks, rounds};
use crate::steps::pipe::copy_through;
use crate::steps::ring::Ring;

/// Smallest message the operator hands to this algorithm on 2 ranks: from here the two
/// outputs exceed the cache far enough that storing each output byte once, streamed, outweighs
/// the extra pass. In place the pair reads the peer's result where the ring writes it: about a
/// tie. Measured value (it differs by machine): docs/TUNING.md.
pub static MIN_BYTES: Param = Param::new(
    "ALLREDUCE_PAIR_MIN",
    8 << 20,
    (0, u64::MAX),
    Unit::Bytes,
    "on 2 ranks, allreduces from this size (beyond the one-shot range) take the pair algorithm",
);

/// The registry name of [`AllReducePair`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllReducePair";

pub struct AllReducePair;

impl Executor for AllReducePair {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let e = p.elem();
        if p.world == 1 {
            return copy_through(p, res, p.count * e);
        }
        let peer = p.pair_peer(NAME)?;
        // Each round reduces one slot (and at most one `CclOut`) per rank.
        let mut r = Ring::new(p, res, res.ccl_out_size.min(p.count.div_ceil(2) * e));
        let piece = r.piece_elems;
        let (input, output) = (Mem::of(BufKind::UserIn), Mem::of(BufKind::UserOut));
        // In place (links reaching user memory), or with the output in shared user memory,
        // the result is reduced into the output and offered from there: the ring's passes,
        // the output cached. Otherwise it goes through `CclOut` (above). The peer reads
        // whichever memory the offer names, so the two ranks may choose differently.
        let direct = (p.in_place && res.user_mem_links) || res.shared_user.output;
        let staged = Mem::of(BufKind::CclOut);
        let own_to = if res.beyond_cache(p.count * e) {
            CopyTo::Output
        } else {
            CopyTo::Local
        };
        for (start, len) in rounds(p.count, 2 * piece) {
            let halves = Blocks {
                count: len,
                parts: 2,
            };
            let ((mo, ml), (to, tl)) = (halves.block(p.rank), halves.block(peer));
            let (mo, to) = ((start + mo) * e, (start + to) * e);
            let slot = r.next_slot();
            let t = &mut *res.tasks;
            t.rx_async(MAIN, peer, slot, ml * e)?;
            t.tx_async(MAIN, peer, input.add(to), tl * e)?;
            t.rx_wait_done(MAIN, peer, ml * e)?;
            t.tx_wait_done(MAIN, peer)?;
            let (at, own) = (if direct { output.add(mo) } else { staged }, output.add(mo));
            if direct || p.op == ReduceOp::Avg {
                // Straight into the output, or an average (final only after the division):
                // reduce, divide, copy.
                t.reduce(MAIN, p.dtype, p.op, at, input.add(mo), slot, ml)?;
                if p.op == ReduceOp::Avg {
                    t.finish_avg(MAIN, p.dtype, at, ml, 2)?;
                }
                t.copy_to(MAIN, own, at, ml * e, own_to)?;
            } else {
                let operands = (staged, input.add(mo), slot);
                t.reduce_tee(MAIN, (p.dtype, p.op), operands, ml, (own, own_to))?;
            }
            t.offer_async(MAIN, peer, at, ml * e)?;
            t.read_async(MAIN, peer, output.add(to), tl * e, own_to)?;
            t.tx_wait_done(MAIN, peer)?;
            t.offer_wait_done(MAIN, peer, ml * e)?;
        }
        Ok(())
    }
}
