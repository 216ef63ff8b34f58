//! Ring steps: reduce-scatter and allgather over `world` blocks of a round, double-buffering the
//! receive side through the slots of the CCL input buffer ([`Window`]). Over network links,
//! which reach any memory, blocks land straight in the output where it does not hold the input
//! (the allgather's always, the allreduce's reduce-scatter out of place), and the allgather's
//! first receive is posted during the reduce-scatter ([`early_gather`]).
//!
//! Every step posts its receive before its send, so mismatched calls are detected (the CTS
//! carries the fingerprint) instead of deadlocking.

use ampccl_runtime::Result;

use crate::op::OpParam;
use crate::resource::{AlgResourceResponse, MAIN, Mem};
use crate::steps::blocks::Blocks;
use crate::steps::window::{SPAN, Window};

/// Ring geometry and the receive slots of one operation.
pub struct Ring<'a> {
    pub rank: usize,
    pub world: usize,
    pub next: usize,
    pub prev: usize,
    /// Elements of a round's piece per block (what one receive slot holds).
    pub piece_elems: usize,
    window: Window<'a>,
    slot: usize,
}

impl<'a> Ring<'a> {
    /// Ring for `p` whose pieces take at most `max_bytes`, half the CCL input buffer and half
    /// the window's [`SPAN`], whole elements, at least one. Callers pass no more than the
    /// largest block a step of the call moves: the window's slots are a piece long, and slots
    /// larger than the data would land every call on the same lines (a 128 KiB block in 2 MiB
    /// slots alternates between the buffer's two halves; see [`Window`]). Pieces larger than
    /// half the span would widen the window beyond it, which costs more in the shared cache
    /// than the fewer steps save; much smaller pieces pay more steps (docs/TUNING.md,
    /// `AMPCCL_WINDOW_SPAN`).
    pub fn new(p: &OpParam, res: &AlgResourceResponse<'a>, max_bytes: usize) -> Ring<'a> {
        let e = p.elem();
        let piece_elems = (res.ccl_in_size / 2 / e)
            .min(max_bytes.min(SPAN.bytes() / 2) / e)
            .max(1);
        Ring {
            rank: p.rank,
            world: p.world,
            next: (p.rank + 1) % p.world,
            prev: (p.rank + p.world - 1) % p.world,
            piece_elems,
            window: Window::new(res, piece_elems * e),
            slot: 0,
        }
    }

    /// The next receive slot (see [`Window`]).
    pub fn next_slot(&mut self) -> Mem {
        self.slot += 1;
        self.window.slot(self.slot - 1)
    }

    /// Block index `rank + delta` modulo the world size.
    pub fn block_at(&self, delta: isize) -> usize {
        (self.rank as isize + delta).rem_euclid(self.world as isize) as usize
    }
}

/// How the `world` blocks of a round are laid out (offsets in elements from the round's base).
#[derive(Clone, Copy, Debug)]
pub enum Layout {
    /// The round's elements split into near-equal blocks (AllReduce).
    Split(Blocks),
    /// Blocks of `len` elements, block `j` at `j * stride` (ReduceScatter input, AllGather
    /// output: one block per rank).
    Strided { stride: usize, len: usize },
}

/// One round: the block layout and where it starts in the user buffers.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub layout: Layout,
    pub base_in: Mem,
    pub base_out: Mem,
}

impl Round {
    /// `(offset, len)` of block `j` in elements.
    fn block(&self, j: usize) -> (usize, usize) {
        match self.layout {
            Layout::Split(b) => b.block(j),
            Layout::Strided { stride, len } => (j * stride, len),
        }
    }
    /// Block `j` of the input: position and length in elements.
    pub fn input(&self, j: usize, e: usize) -> (Mem, usize) {
        let (off, len) = self.block(j);
        (self.base_in.add(off * e), len)
    }
    /// Block `j` of the output.
    pub fn output(&self, j: usize, e: usize) -> (Mem, usize) {
        let (off, len) = self.block(j);
        (self.base_out.add(off * e), len)
    }
}

/// Where [`reduce_scatter`] leaves a rank's final block when the partial sums stay in the
/// receive slots.
#[derive(Clone, Copy, Debug)]
pub struct Final {
    pub at: Mem,
    /// `at` is the operation's output and nothing reads it again soon (a call beyond the
    /// cache): the final reduction may stream it (`reduce_to` with `out`).
    pub streamed: bool,
}

/// The first receive of an allgather that follows a reduce-scatter, posted with the
/// reduce-scatter's last step ([`early_gather`]).
#[derive(Clone, Copy, Debug)]
pub struct EarlyRecv {
    at: Mem,
    bytes: usize,
}

/// The first receive of the allgather that will follow the reduce-scatter of `round`, where
/// it lands straight in the output: posted with the reduce-scatter's last step, its
/// clear-to-send reaches the previous rank while both still reduce, and that rank's send
/// starts as soon as its block is final instead of after our clear-to-send crossed the
/// network (across hosts a one-way trip, and the wait until the rank next reads its queue).
/// `None` where the block goes through a slot: it would take a slot the reduce-scatter may
/// still use. The block is not written by the reduce-scatter (it is the one this rank sends
/// first, read by its first step in place, which is complete before the previous rank can
/// have its block final).
pub fn early_gather(
    p: &OpParam,
    res: &AlgResourceResponse<'_>,
    ring: &Ring<'_>,
    round: &Round,
    shift: isize,
) -> Option<EarlyRecv> {
    let e = p.elem();
    let (at, len) = round.output(ring.block_at(shift - 1), e);
    res.lands_directly(ring.prev, at.buf)
        .then_some(EarlyRecv { at, bytes: len * e })
}

/// Ring reduce-scatter over the blocks of `round`. Partial sums travel from rank to rank.
/// Without `final_out` the accumulators are the output blocks (AllReduce); with it partial
/// sums are kept in the receive slot and only the final block is reduced into `final_out`
/// (ReduceScatter, whose output holds one block). `then` is posted with the last step's
/// receive, before its send (receives from a peer match its sends in order).
///
/// At step `k` rank `r` sends block `r - k - 1 + shift` and receives `r - k - 2 + shift`; after
/// `world - 1` steps rank `r` holds block `r + shift` (mod world).
pub fn reduce_scatter(
    p: &OpParam,
    res: &mut AlgResourceResponse<'_>,
    ring: &mut Ring<'_>,
    round: &Round,
    shift: isize,
    final_out: Option<Final>,
    then: Option<EarlyRecv>,
) -> Result<()> {
    let e = p.elem();
    // Out of place over a network link, the partial sums land straight in their output block
    // (not written yet, and each block is received once) and are reduced there: one buffer
    // less in the cache than through a slot. In place the block still holds this rank's input.
    let in_output = final_out.is_none() && !p.in_place && res.lands_from_network(ring.prev);
    let mut prev_slot: Option<Mem> = None;
    for k in 0..ring.world - 1 {
        let ks = k as isize;
        let send_j = ring.block_at(shift - ks - 1);
        let recv_j = ring.block_at(shift - ks - 2);
        let (_, recv_len) = round.input(recv_j, e);
        // Where the previous rank's partial sum lands.
        let at = if in_output {
            round.output(recv_j, e).0
        } else {
            ring.next_slot()
        };
        res.tasks.rx_async(MAIN, ring.prev, at, recv_len * e)?;
        // What we forward: our own input at the first step, then the partial sum we made.
        let (send_src, send_len) = match (k, final_out, prev_slot) {
            (0, _, _) => round.input(send_j, e),
            (_, None, _) => round.output(send_j, e),
            (_, Some(_), Some(s)) => (s, round.input(send_j, e).1),
            (_, Some(_), None) => unreachable!("slot set after the first step"),
        };
        let last = k == ring.world - 2;
        if let (true, Some(g)) = (last, then) {
            res.tasks.rx_async(MAIN, ring.prev, g.at, g.bytes)?;
        }
        res.tasks
            .tx_async(MAIN, ring.next, send_src, send_len * e)?;
        res.tasks.rx_wait_done(MAIN, ring.prev, recv_len * e)?;
        let (own, _) = round.input(recv_j, e);
        let (dst, streamed) = match final_out {
            None => (round.output(recv_j, e).0, false),
            Some(f) if last => (f.at, f.streamed),
            Some(_) => (at, false),
        };
        res.tasks
            .reduce_to(MAIN, p.dtype, p.op, (dst, own, at), recv_len, streamed)?;
        res.tasks.tx_wait_done(MAIN, ring.next)?;
        prev_slot = Some(at);
    }
    Ok(())
}

/// Ring allgather over the output blocks of `round`: rank `r` starts owning block
/// `r + shift`; after `world - 1` steps every rank has every block in the output. Blocks land
/// in a slot and are copied out, or straight in the output where that costs no extra copy
/// ([`AlgResourceResponse::lands_directly`]: shared user memory, or a link from another host).
/// `posted`: the first receive was posted ahead ([`early_gather`]).
pub fn all_gather(
    p: &OpParam,
    res: &mut AlgResourceResponse<'_>,
    ring: &mut Ring<'_>,
    round: &Round,
    shift: isize,
    posted: bool,
) -> Result<()> {
    let e = p.elem();
    for k in 0..ring.world - 1 {
        let ks = k as isize;
        let send_j = ring.block_at(shift - ks);
        let recv_j = ring.block_at(shift - ks - 1);
        let (dst, recv_len) = round.output(recv_j, e);
        let (src, send_len) = round.output(send_j, e);
        let bytes = recv_len * e;
        let slot = ring.next_slot();
        // Straight into the output where that saves the copy out (`copy` skips a copy onto
        // itself).
        let at = if res.lands_directly(ring.prev, dst.buf) {
            dst
        } else {
            slot
        };
        if !(posted && k == 0) {
            res.tasks.rx_async(MAIN, ring.prev, at, bytes)?;
        }
        res.tasks.tx_async(MAIN, ring.next, src, send_len * e)?;
        res.tasks.rx_wait_done(MAIN, ring.prev, bytes)?;
        res.tasks.copy(MAIN, dst, at, bytes)?;
        res.tasks.tx_wait_done(MAIN, ring.next)?;
    }
    Ok(())
}
