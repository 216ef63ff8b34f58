//! Pipelined point-to-point steps: messages chunked through the bounded CCL input buffer,
//! double-buffered receive slots, and the relay loop every chain-shaped algorithm (Broadcast,
//! Reduce, Send, Recv) runs on each rank.
//!
//! A *relay* rank receives chunk `c` from its upstream peer (unless it is the head, which reads
//! its own source), processes it, and forwards it downstream (unless it is the tail). Its tasks,
//! on the main stream, are:
//!
//! ```text
//! post(0)
//! for c: post(c + 1); wait(c); arrived(c); send(c); forwarded(c); send_done(c)
//! ```
//!
//! - receives are posted before the sends of the same step (a mismatch is detected through the
//!   clear-to-send fingerprint instead of deadlocking), and chunk `c + 1` is posted before
//!   chunk `c` is forwarded, so consecutive ranks work on consecutive chunks at once;
//! - chunk `c` lands in slot `c` of a [`Window`] of chunk-sized slots in `CclIn`; slot `c + 1`
//!   never overlaps slot `c`, and memory of chunk `c - 1` is re-posted only after that chunk
//!   was forwarded (`send_done`) and consumed (`forwarded`): tasks of a stream run in order;
//! - a sender needs no word that the receiver's slot is free: a rendezvous write waits for the
//!   receiver's clear-to-send, posted only when the slot is, and an eager message lands in the
//!   link's own eager slots.

use ampccl_runtime::Result;
use ampccl_runtime::param::{Param, Unit};

use crate::op::OpParam;
use crate::resource::{AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::window::Window;

/// Chunks a chain pipeline aims for (see [`ChunkBound::pipelined`]): more chunks shorten the
/// pipeline's fill and drain, each costs a handshake. Measured value: docs/TUNING.md.
pub static PIPELINE_DEPTH: Param = Param::new(
    "CHAIN_PIPELINE_DEPTH",
    16,
    (1, 4096),
    Unit::Count,
    "chunks a chain pipeline (broadcast, reduce) aims to cut a message into",
);

/// Smallest chunk a chain pipeline cuts: below it the per-chunk costs (a clear-to-send and a
/// completion per chunk) outweigh the overlap of the ranks' copies. Also the smallest chunk
/// of the broadcast pair. Measured value: docs/TUNING.md.
pub static MIN_PIPELINE_CHUNK: Param = Param::new(
    "CHAIN_MIN_CHUNK",
    128 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "smallest chunk of a chain pipeline (and of the broadcast pair)",
);

/// Smallest chunk of a chain pipeline on a communicator that spans hosts: a TCP write is
/// striped over every connection of a pair only from `AMPCCL_NSOCKS` × `AMPCCL_TCP_STRIPE_MIN`
/// bytes (1 MiB by default), and one connection carries less than four. The same on every rank
/// (the topology is), as chunk boundaries must be. Measured value: docs/TUNING.md.
pub static NET_MIN_CHUNK: Param = Param::new(
    "CHAIN_NET_MIN_CHUNK",
    1 << 20,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "smallest chunk of a chain pipeline (broadcast, reduce) on a communicator that spans hosts",
);

/// The chunk bound of a pipeline: half of the CCL input buffer, whole elements, so that two
/// chunks fit its [`Window`].
#[derive(Clone, Copy, Debug)]
pub struct ChunkBound {
    /// Most bytes of one chunk.
    pub bytes: usize,
}

impl ChunkBound {
    /// Halves of a `ccl_in_size`-byte buffer holding whole `elem`-byte elements.
    pub fn new(ccl_in_size: usize, elem: usize) -> ChunkBound {
        ChunkBound {
            bytes: (ccl_in_size / 2 / elem).max(1) * elem,
        }
    }

    /// The chunks of a `bytes`-byte message relayed along a chain: at least
    /// [`PIPELINE_DEPTH`] chunks when that keeps them at `min_chunk` bytes or more (whole
    /// `elem`-byte elements), so that the ranks of the chain copy at the same time instead of
    /// one after the other; never more than a slot.
    pub fn pipelined(&self, bytes: usize, elem: usize, min_chunk: usize) -> Chunks {
        self.sized(
            bytes,
            elem,
            (bytes / PIPELINE_DEPTH.get() as usize).max(min_chunk),
        )
    }

    /// The chunks of a `bytes`-byte message cut into pieces of about `want` bytes: whole
    /// `elem`-byte elements, at least one element, never more than a slot.
    pub fn sized(&self, bytes: usize, elem: usize, want: usize) -> Chunks {
        let chunk = (want.div_ceil(elem) * elem).min(self.bytes).max(elem);
        Chunks {
            bytes,
            chunk,
            count: bytes.div_ceil(chunk),
        }
    }

    /// `(offset, len)` in bytes of the chunks of a `bytes`-byte message. A point-to-point
    /// message of zero bytes is still one (empty) chunk, so a 0-vs-N mismatch is detected;
    /// collectives of zero bytes have no chunks.
    pub fn chunks(&self, bytes: usize, empty_is_message: bool) -> Chunks {
        let count = if bytes == 0 && empty_is_message {
            1
        } else {
            bytes.div_ceil(self.bytes)
        };
        Chunks {
            bytes,
            chunk: self.bytes,
            count,
        }
    }
}

/// The chunks of one message, computed on demand (no allocation per operation).
#[derive(Clone, Copy, Debug)]
pub struct Chunks {
    bytes: usize,
    chunk: usize,
    count: usize,
}

impl Chunks {
    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `(offset, len)` in bytes of chunk `c < len()`.
    pub fn get(&self, c: usize) -> (usize, usize) {
        let off = c * self.chunk;
        (off, self.chunk.min(self.bytes.saturating_sub(off)))
    }

    /// Every chunk in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.count).map(|c| self.get(c))
    }
}

/// Ranks `root, root + 1, ..., root + P - 1` (mod P) in a line; `pos` is this rank's place.
#[derive(Clone, Copy, Debug)]
pub struct Chain {
    pub pos: usize,
    pub root: usize,
    pub world: usize,
}

impl Chain {
    pub fn new(p: &OpParam) -> Chain {
        Chain {
            pos: (p.rank + p.world - p.root) % p.world,
            root: p.root,
            world: p.world,
        }
    }

    fn rank_at(&self, pos: usize) -> usize {
        (self.root + pos) % self.world
    }

    /// Data flowing away from the root: `(from, to)`.
    pub fn from_root(&self) -> (Option<usize>, Option<usize>) {
        (
            (self.pos > 0).then(|| self.rank_at(self.pos - 1)),
            (self.pos + 1 < self.world).then(|| self.rank_at(self.pos + 1)),
        )
    }

    /// Data flowing toward the root: `(from, to)`.
    pub fn to_root(&self) -> (Option<usize>, Option<usize>) {
        let (toward, away) = self.from_root();
        (away, toward)
    }
}

/// What one rank of a relay does with each chunk (`off`, `len`: bytes into the message).
pub trait Stage {
    /// Where chunk `off` is on this rank: at the head its source; otherwise the memory it is
    /// received into (`slot`, or user memory where the link allows it).
    fn at(&self, off: usize, slot: Mem) -> Mem;
    /// Tasks once the chunk is at `at`; returns the memory to forward (if there is a
    /// downstream).
    fn arrived(
        &mut self,
        _res: &mut AlgResourceResponse<'_>,
        _off: usize,
        _len: usize,
        at: Mem,
    ) -> Result<Mem> {
        Ok(at)
    }
    /// Tasks after the forward was issued (overlapping it), e.g. delivering to the output.
    fn forwarded(
        &mut self,
        _res: &mut AlgResourceResponse<'_>,
        _off: usize,
        _len: usize,
        _at: Mem,
    ) -> Result<()> {
        Ok(())
    }
}

/// This rank's links in a relay.
#[derive(Clone, Copy, Debug)]
pub struct Pipe {
    pub from: Option<usize>,
    pub to: Option<usize>,
    /// The most bytes of one chunk.
    pub bound: ChunkBound,
}

/// Runs the relay loop over `chunks` (see the module docs).
pub fn relay(
    res: &mut AlgResourceResponse<'_>,
    pipe: &Pipe,
    chunks: &Chunks,
    stage: &mut dyn Stage,
) -> Result<()> {
    // Slots of the first chunk's size, not the bound's: a message shorter than the bound then
    // rotates over more slots (see `Window`) instead of landing on the same lines call after
    // call.
    let window = Window::new(res, chunks.get(0).1.max(1));
    let post = |res: &mut AlgResourceResponse<'_>, stage: &dyn Stage, c: usize| -> Result<()> {
        let Some(from) = pipe.from else {
            return Ok(());
        };
        let (off, len) = chunks.get(c);
        res.tasks
            .rx_async(MAIN, from, stage.at(off, window.slot(c)), len)
    };
    if !chunks.is_empty() {
        post(res, stage, 0)?;
    }
    for (c, (off, len)) in chunks.iter().enumerate() {
        if c + 1 < chunks.len() {
            post(res, stage, c + 1)?;
        }
        if let Some(from) = pipe.from {
            res.tasks.rx_wait_done(MAIN, from, len)?;
        }
        let at = stage.at(off, window.slot(c));
        let src = stage.arrived(res, off, len, at)?;
        if let Some(to) = pipe.to {
            res.tasks.tx_async(MAIN, to, src, len)?;
        }
        stage.forwarded(res, off, len, at)?;
        if let Some(to) = pipe.to {
            res.tasks.tx_wait_done(MAIN, to)?;
        }
    }
    Ok(())
}

/// The stage of data that is passed on unchanged (Broadcast, Send, Recv): the head reads
/// `UserIn`; other ranks receive into `UserOut` directly when the link writes user memory,
/// else into the slot, and then copy it to `UserOut` (when `keep`).
#[derive(Clone, Copy, Debug)]
pub struct Deliver {
    /// This rank reads the data from `UserIn` instead of receiving it.
    pub head: bool,
    /// Copy the data to `UserOut` (the head: unless in place, which the sink skips).
    pub keep: bool,
    /// Receive straight into `UserOut` (`res.user_mem_links`).
    pub direct: bool,
}

impl Stage for Deliver {
    fn at(&self, off: usize, slot: Mem) -> Mem {
        if self.head {
            Mem::of(BufKind::UserIn).add(off)
        } else if self.direct && self.keep {
            Mem::of(BufKind::UserOut).add(off)
        } else {
            slot
        }
    }

    fn forwarded(
        &mut self,
        res: &mut AlgResourceResponse<'_>,
        off: usize,
        len: usize,
        at: Mem,
    ) -> Result<()> {
        let out = Mem::of(BufKind::UserOut).add(off);
        if self.keep && at != out {
            res.tasks.copy(MAIN, out, at, len)?;
        }
        Ok(())
    }
}

/// A collective along a chain (Broadcast, Reduce): `stage` relays the operation's bytes from
/// `from` to `to` in pipeline chunks ([`ChunkBound::pipelined`], at least
/// [`MIN_PIPELINE_CHUNK`] on one host and [`NET_MIN_CHUNK`] across hosts); on one rank it is a
/// plain copy.
pub fn run_chain(
    p: &OpParam,
    res: &mut AlgResourceResponse<'_>,
    (from, to): (Option<usize>, Option<usize>),
    stage: &mut dyn Stage,
) -> Result<()> {
    let bytes = p.count * p.elem();
    if p.world == 1 {
        return copy_through(p, res, bytes);
    }
    let pipe = Pipe {
        from,
        to,
        bound: ChunkBound::new(res.ccl_in_size, p.elem()),
    };
    let min_chunk = if res.topology.hosts() > 1 {
        NET_MIN_CHUNK.bytes()
    } else {
        MIN_PIPELINE_CHUNK.bytes()
    };
    let chunks = pipe.bound.pipelined(bytes, p.elem(), min_chunk);
    relay(res, &pipe, &chunks, stage)
}

/// World 1 (and the like): `UserOut = UserIn` unless in place.
pub fn copy_through(p: &OpParam, res: &mut AlgResourceResponse<'_>, bytes: usize) -> Result<()> {
    if !p.in_place && bytes > 0 {
        res.tasks.copy(
            MAIN,
            Mem::of(BufKind::UserOut),
            Mem::of(BufKind::UserIn),
            bytes,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ampccl_runtime::{DataType, ReduceOp};

    use crate::op::OpKind;

    #[test]
    fn chain_positions_and_chunks() {
        let p = |rank, root| OpParam {
            kind: OpKind::Broadcast,
            count: 0,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root,
            rank,
            world: 4,
            in_place: false,
            seq: 0,
        };
        let c = Chain::new(&p(2, 3));
        assert_eq!(c.pos, 3);
        assert_eq!(c.from_root(), (Some(1), None));
        assert_eq!(c.to_root(), (None, Some(1)));
        let c = Chain::new(&p(3, 3));
        assert_eq!(c.from_root(), (None, Some(0)));
        assert_eq!(c.to_root(), (Some(0), None));
        let s = ChunkBound::new(1000, 8);
        assert_eq!(s.bytes, 496);
        let v = |c: Chunks| c.iter().collect::<Vec<_>>();
        assert_eq!(v(s.chunks(0, true)), vec![(0, 0)]);
        assert!(s.chunks(0, false).is_empty());
        assert_eq!(
            v(s.chunks(1000, false)),
            vec![(0, 496), (496, 496), (992, 8)]
        );
    }
}
