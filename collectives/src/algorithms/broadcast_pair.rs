//! `BroadcastPair`: a 2-rank broadcast in which the root pushes half of the chunks and the
//! receiver pulls the other half, so that the two cores copy at once.
//!
//! ```text
//! chunks in pairs j = (push 2j, pull 2j+1):
//!   root:     offer(pull 0) ; for j: tx(push j) ; offer(pull j+1) ; own copy (push j) ; waits
//!   receiver: rx(push 0)    ; for j: rx(push j+1) ; read(pull j) ; waits ; copy out (push j)
//! ```
//! A push chunk is written by the root into the memory the receiver's clear-to-send names: its
//! output where that lies in shared user memory ([`SharedMem`]), else a slot of its window,
//! copied out afterwards. A pull chunk is read by the receiver, straight into its output, from
//! the memory the root's offer names: the root's input where that is shared, else a slot of the
//! root's window the root copied the chunk into first. Which memory is named is each rank's own
//! choice; the pattern of transfers is the same on both, so mixed setups match.
//!
//! Out of place the root copies each pull chunk into its output in the pass that stages it for
//! the receiver ([`copy_tee`]: the input is read once), and each push chunk after sending it.
//!
//! With both ranks' buffers shared, every byte is copied once and the two halves are copied at
//! the same time, as two threads of one process would (the 2-thread ceiling, `ampccl-perf
//! ceiling`). Without, the root still writes every byte into shared memory (half
//! into the receiver's window, half into its own) and the receiver copies every byte out, as in
//! the chain ([`super::broadcast_chain`]), with the same pipelining: the transfers of pair
//! `j + 1` are posted before pair `j` is waited for, and pair `j + 2` reuses pair `j`'s slots
//! only after pair `j` completed.
//!
//! [`SharedMem`]: ampccl_transport::shm::SharedMem
//! [`copy_tee`]: crate::resource::TaskSink::copy_tee

use ampccl_runtime::Result;
use ampccl_runtime::param::{Param, Unit};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, CopyTo, MAIN, Mem};
use crate::steps::pipe::{ChunkBound, Chunks, MIN_PIPELINE_CHUNK, copy_through};
use crate::steps::window::Window;

/// The registry name of [`BroadcastPair`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "BroadcastPair";

pub struct BroadcastPair;

/// The pair's largest chunk; a message is cut into chunks of half its size, at least
/// [`MIN_PIPELINE_CHUNK`] and at most this. Larger than a chain's pieces
/// ([`ChunkBound::pipelined`], a sixteenth of the message): the pair has no chain to fill, and
/// each chunk costs a handshake. Measured value: docs/TUNING.md.
pub static PAIR_CHUNK: Param = Param::new(
    "BROADCAST_PAIR_CHUNK",
    512 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "largest chunk of the 2-rank broadcast pair",
);

/// The bytes of the pair's chunks for a `bytes`-byte message (see [`PAIR_CHUNK`]); where the
/// two bounds cross, [`MIN_PIPELINE_CHUNK`] wins.
pub fn chunk_bytes(bytes: usize) -> usize {
    (bytes / 2)
        .min(PAIR_CHUNK.bytes())
        .max(MIN_PIPELINE_CHUNK.bytes())
}

/// The largest [`chunk_bytes`] of any message.
pub fn max_chunk_bytes() -> usize {
    PAIR_CHUNK.bytes().max(MIN_PIPELINE_CHUNK.bytes())
}

impl Executor for BroadcastPair {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let bytes = p.count * p.elem();
        if p.world == 1 {
            return copy_through(p, res, bytes);
        }
        let peer = p.pair_peer(NAME)?;
        let chunks =
            ChunkBound::new(res.ccl_in_size, p.elem()).sized(bytes, p.elem(), chunk_bytes(bytes));
        let pairs = Pairs { chunks };
        if p.rank == p.root {
            root(res, peer, &pairs)
        } else {
            receiver(res, peer, &pairs)
        }
    }
}

/// The chunks of a message, taken two at a time.
struct Pairs {
    chunks: Chunks,
}

impl Pairs {
    fn len(&self) -> usize {
        self.chunks.len().div_ceil(2)
    }

    /// `(off, len)` of pair `j`'s push chunk.
    fn push(&self, j: usize) -> (usize, usize) {
        self.chunks.get(2 * j)
    }

    /// `(off, len)` of pair `j`'s pull chunk, if it has one.
    fn pull(&self, j: usize) -> Option<(usize, usize)> {
        (2 * j + 1 < self.chunks.len()).then(|| self.chunks.get(2 * j + 1))
    }

    /// The largest chunk (the slot size).
    fn slot_bytes(&self) -> usize {
        self.push(0).1
    }
}

fn root(res: &mut AlgResourceResponse<'_>, peer: usize, pairs: &Pairs) -> Result<()> {
    let input = Mem::of(BufKind::UserIn);
    let output = Mem::of(BufKind::UserOut);
    let shared = res.shared_user.input;
    let window = Window::new(res, pairs.slot_bytes().max(1));
    // Offers the pull chunk of pair `j`, staged through slot `j` unless the input is shared; out
    // of place the same pass copies it into the output.
    let offer = |res: &mut AlgResourceResponse<'_>, j: usize| -> Result<()> {
        let Some((off, len)) = pairs.pull(j) else {
            return Ok(());
        };
        let at = if shared {
            input.add(off)
        } else {
            window.slot(j)
        };
        let dsts = [(at, CopyTo::Peer), (output.add(off), CopyTo::Local)];
        res.tasks.copy_tee(MAIN, dsts, input.add(off), len)?;
        res.tasks.offer_async(MAIN, peer, at, len)
    };
    if pairs.len() > 0 {
        offer(res, 0)?;
    }
    for j in 0..pairs.len() {
        let (off, len) = pairs.push(j);
        res.tasks.tx_async(MAIN, peer, input.add(off), len)?;
        if j + 1 < pairs.len() {
            offer(res, j + 1)?;
        }
        res.tasks.copy(MAIN, output.add(off), input.add(off), len)?;
        res.tasks.tx_wait_done(MAIN, peer)?;
        if let Some((_, len)) = pairs.pull(j) {
            res.tasks.offer_wait_done(MAIN, peer, len)?;
        }
    }
    Ok(())
}

fn receiver(res: &mut AlgResourceResponse<'_>, peer: usize, pairs: &Pairs) -> Result<()> {
    let output = Mem::of(BufKind::UserOut);
    let direct = res.shared_user.output;
    let window = Window::new(res, pairs.slot_bytes().max(1));
    // Where pair `j`'s push chunk lands.
    let at = |j: usize| {
        if direct {
            output.add(pairs.push(j).0)
        } else {
            window.slot(j)
        }
    };
    if pairs.len() > 0 {
        let (_, len) = pairs.push(0);
        res.tasks.rx_async(MAIN, peer, at(0), len)?;
    }
    for j in 0..pairs.len() {
        if j + 1 < pairs.len() {
            let (_, len) = pairs.push(j + 1);
            res.tasks.rx_async(MAIN, peer, at(j + 1), len)?;
        }
        if let Some((off, len)) = pairs.pull(j) {
            res.tasks
                .read_async(MAIN, peer, output.add(off), len, CopyTo::Output)?;
            res.tasks.tx_wait_done(MAIN, peer)?;
        }
        let (off, len) = pairs.push(j);
        res.tasks.rx_wait_done(MAIN, peer, len)?;
        res.tasks.copy(MAIN, output.add(off), at(j), len)?;
    }
    Ok(())
}
