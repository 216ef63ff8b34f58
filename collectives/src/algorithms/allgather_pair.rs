//! `AllGatherPair`: a 2-rank allgather of messages beyond the cache, which reads each input
//! byte from memory once and streams every output byte.
//!
//! ```text
//! per piece (PIECE bytes of each rank's block):
//!   rx(peer's piece → CclIn slot) ── (copy_out my input piece → output[me])
//!   ── tx(my input piece → peer's slot) ── rx done ── copy_out(slot → output[peer]) ── tx done
//! ```
//! The ring ([`super::allgather_ring`]) on 2 ranks first copies the whole input into the
//! output, then sends the block from there: once the message exceeds the cache, the input
//! and the own block each come from memory twice, and the store into the peer's output (a
//! cross-memory write until session 10, a copy out of the window since) is a plain store that
//! first reads each line it overwrites. Here the message moves
//! in pieces: the piece is read from memory once (the own copy), sent from the cache into the
//! peer's window slot, and both output blocks are written with streaming stores (`copy_out`
//! streams pieces of [`PIECE`] bytes). The window traffic stays in the cache; each rank moves
//! 3 bytes through memory per byte of its block instead of about 5. Inside the cache the
//! extra pass through the window and the streaming stores lose, so the operator hands this
//! algorithm only messages beyond the cache ([`crate::executor::CACHE_SHARE`]). Needs no links
//! into user memory: every transfer lands in a window, or, where this rank's output is shared
//! user memory, straight in the output (the peer's piece is then copied once, by the peer).
//!
//! Out of place the own copy goes first: it takes the piece from memory while its streaming
//! stores go out, and the send then reads the piece from the cache. Sent first, the send read it
//! from memory, at about twice the cost per byte of the broadcast's sends (session 13,
//! docs/PERFORMANCE.md). µs out of place, 4 clean alternated pairs (`ab_probed.py 8 X=1
//! AMPCCL_TMP_SW=1 -o allgather -b 16M -e 64M -f 2 -n 30 -w 8`, the order set by a temporary
//! variable), send first against own copy first: 16 MiB 1588 → 1524, 32 MiB 3538 → 3219,
//! 64 MiB 7171 → 6607.

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, CopyTo, MAIN, Mem};
use crate::steps::blocks::rounds;
use crate::steps::pipe::copy_through;
use crate::steps::ring::Ring;

/// Bytes of a piece (at most one ring slot): large enough for `copy_out` to stream it
/// ([`ampccl_runtime::copy::STREAM_OUT_MIN`]), small enough that a piece and its copies stay
/// in the cache. µs out of place / in place, 16 MiB output, 3 alternated runs (session 8, AMD
/// EPYC; `AMPCCL_ALGO_ALLGATHER=AllGatherPair ampccl-perf -g 2 -o allgather -b 1M -e 64M -f 4
/// -n 20 -w 4`, the piece size set by a temporary variable): 256 KiB pieces (no streaming)
/// 1894/1073, 1 MiB 1492/912, 2 MiB 1564/932; 64 MiB: 8603/5843, 7010/4098, 7052/4412.
pub const PIECE: usize = 1 << 20;

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
        let (me, peer) = (p.rank, p.pair_peer("AllGatherPair")?);
        let (input, output) = (Mem::of(BufKind::UserIn), Mem::of(BufKind::UserOut));
        let mut r = Ring::new(p, res, PIECE.min(bytes));
        let piece = r.piece_elems;
        for (start, len) in rounds(p.count, piece) {
            let (off, n) = (start * e, len * e);
            let slot = r.next_slot();
            let dst = output.add(peer * bytes + off);
            let at = if res.shared_user.output { dst } else { slot };
            let t = &mut *res.tasks;
            t.rx_async(MAIN, peer, at, n)?;
            if !p.in_place {
                t.copy_to(
                    MAIN,
                    output.add(me * bytes + off),
                    input.add(off),
                    n,
                    CopyTo::Output,
                )?;
            }
            t.tx_async(MAIN, peer, input.add(off), n)?;
            t.rx_wait_done(MAIN, peer, n)?;
            t.copy_to(MAIN, dst, at, n, CopyTo::Output)?;
            t.tx_wait_done(MAIN, peer)?;
        }
        Ok(())
    }
}
