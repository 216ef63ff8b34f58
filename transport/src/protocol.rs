//! The receiver-driven point-to-point protocol (NCCL's IB transport), once, over any
//! [`RmaDevice`].
//!
//! - receive number `seq`: the receiver names its buffer and posts a clear-to-send entry
//!   `{addr, size, key, nreqs, tag, idx = seq + 1}` into slot `seq % depth` of the sender's FIFO;
//!   it may do so only when receive `seq - depth` has completed (so the slot and the matching
//!   completion slot are free);
//! - send number `seq`: the sender waits until its FIFO slot shows `idx == seq + 1`, checks the
//!   tag and size, writes the data into the receiver's buffer striped over `nreqs` writes, the
//!   last one carrying the immediate `seq + 1` and the length;
//! - the receiver completes when its completion slot shows that immediate, and stores
//!   `seq + 1` into its credit word `seq % depth` in the sender's memory.
//!
//! A *read offer* turns the transfer around for one message, for a receiver that wants to pull
//! data instead of waiting for it to be pushed (a broadcast's receiver sharing the copying
//! with the root): the owner of the data posts receive `seq` with a clear-to-send that names
//! its data and carries [`CTS_READ`]; the peer's send number `seq` is a *read*: it checks tag,
//! size and the flag as above, reads the data striped over `nreqs` reads, then writes the
//! immediate, which completes the offer. A write meeting an offer, or a read meeting a plain
//! clear-to-send, fails both sides like a tag mismatch. Offers and reads never go eagerly.
//!
//! Messages of at most the device's `eager_max` bytes take the eager variant instead
//! ([`crate::eager`]): one one-way trip instead of two. Both sides pick the variant from the
//! length, and each side also watches for the other variant, so a length mismatch fails both
//! instead of leaving them waiting.
//!
//! Every step is a non-blocking poll returning `Pending` until it can act, so the same code runs
//! under the stream engine, in unit tests against an in-memory device, and under loom.

use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use crate::device::{CTS_READ, CtsEntry, IMM_ERROR, RmaDevice};

/// Sequence numbers live in 31 bits (the top immediate bit is the error flag).
const SEQ_MASK: u32 = !IMM_ERROR;

pub fn idx_of(seq: u32) -> u32 {
    seq.wrapping_add(1) & SEQ_MASK
}

/// The FIFO slot of operation `seq` on `dev` (its clear-to-send entry, completion slot, eager
/// slot and credit word).
pub(crate) fn slot_of(dev: &dyn RmaDevice, seq: u32) -> usize {
    (seq % dev.fifo_depth() as u32) as usize
}

/// Posts receive `seq` for `len` bytes at `dst` once `slot_free`: receive `seq - depth`, the
/// previous user of slot `seq % depth` (its CTS entry and its completion slot), has completed.
/// The caller tracks that per slot (see [`SlotTracker`]): receives on different streams may
/// complete out of order, so a count or a maximum of completed receives is not enough.
pub fn post_recv(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    slot_free: bool,
    dst: *mut u8,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    post(dev, peer, seq, slot_free, dst, len, tag, Way::Write)
}

/// Posts offer `seq` (a receive, numbered and freed like one) of `len` bytes at `src` for the
/// peer to read; it completes with [`poll_recv`] once the peer's read is done.
pub fn post_offer(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    slot_free: bool,
    src: *const u8,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    post(
        dev,
        peer,
        seq,
        slot_free,
        src.cast_mut(),
        len,
        tag,
        Way::Read,
    )
}

/// Which way the data of a rendezvous transfer flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// The sender writes into the receiver's buffer.
    Write,
    /// The sender reads the receiver's offered buffer.
    Read,
}

#[allow(clippy::too_many_arguments)]
fn post(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    slot_free: bool,
    buf: *mut u8,
    len: usize,
    tag: u32,
    way: Way,
) -> Poll<Result<()>> {
    if !slot_free {
        return Poll::Pending;
    }
    // A zero-length receive names no memory (the sender writes nothing, only the immediate),
    // so its buffer need not be exposable: an empty user buffer may be null or lie outside
    // every window, and a zero-byte message must still match (or mismatch) a peer's send.
    let exposed = if len == 0 {
        Some(dev.expose(buf, 0).unwrap_or((0, 0)))
    } else {
        dev.expose(buf, len)
    };
    let Some((key, addr)) = exposed else {
        return Poll::Ready(Err(Error::Internal(format!(
            "buffer {buf:p}+{len} is not in a registered window"
        ))));
    };
    let nreqs = stripe_count(len, dev.channels(), STRIPE_MIN.bytes()) as u32;
    let entry = CtsEntry {
        addr,
        size: len as u64,
        key,
        nreqs: if way == Way::Read {
            nreqs | CTS_READ
        } else {
            nreqs
        },
        tag,
        idx: idx_of(seq),
    };
    Poll::Ready(dev.post_cts(peer, slot_of(dev, seq), &entry))
}

/// Per-slot completion record of one direction of a link: operation `seq` may reuse slot
/// `seq % depth` once operation `seq - depth` completed, and "operation `seq` completed" is
/// known exactly — whatever order operations on different streams complete in.
pub struct SlotTracker {
    /// `done[s]`: sequence number + 1 of the latest completed operation in slot `s`.
    done: Box<[AtomicU32]>,
}

impl SlotTracker {
    /// A tracker for `depth` slots, every slot free.
    pub fn new(depth: usize) -> SlotTracker {
        let d = depth as u32;
        // As if operation `s - depth` (wrapping) had completed in every slot `s`.
        let done = (0..d)
            .map(|s| AtomicU32::new(s.wrapping_sub(d).wrapping_add(1)))
            .collect();
        SlotTracker { done }
    }

    fn slot(&self, seq: u32) -> &AtomicU32 {
        &self.done[seq as usize % self.done.len()]
    }

    /// Records that operation `seq` completed.
    pub fn complete(&self, seq: u32) {
        raise(self.slot(seq), seq.wrapping_add(1));
    }

    /// Whether operation `seq` completed.
    pub fn is_done(&self, seq: u32) -> bool {
        at_least(self.slot(seq).load(Ordering::Acquire), seq.wrapping_add(1))
    }

    /// Whether operation `seq` may use its slot (its predecessor there completed).
    pub fn is_free(&self, seq: u32) -> bool {
        let prev = seq.wrapping_sub(self.done.len() as u32);
        at_least(self.slot(seq).load(Ordering::Acquire), prev.wrapping_add(1))
    }
}

/// `a >= b` for sequence numbers that may wrap.
pub(crate) fn at_least(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// Raises `counter` to `to` unless it is already there or beyond (wrapping order): a late
/// record of an older operation must not move a slot back.
fn raise(counter: &AtomicU32, to: u32) {
    let _ = counter.fetch_update(Ordering::Release, Ordering::Acquire, |cur| {
        (!at_least(cur, to)).then_some(to)
    });
}

/// Smallest piece a transfer is striped into (the receiver's value holds: it names the stripe
/// count in its clear-to-send entry).
pub static STRIPE_MIN: Param = Param::new(
    "RMA_STRIPE_MIN",
    512 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "smallest stripe when a transfer is split over an RMA device's channels (the ofi \
     provider's rails)",
);

/// Most stripes a clear-to-send may ask for: a receiver asks for at most one per channel
/// (the `ofi` provider has at most 16 rails), so a larger count comes from a broken or hostile
/// peer, whose transfer of `len` bytes would otherwise cost `len / 64` operations.
pub const MAX_STRIPES: u32 = 64;

/// How many stripes `len` bytes are cut into over at most `ways` channels or connections,
/// each of at least `min` bytes (1 when short). The TCP provider cuts its writes the same way.
pub fn stripe_count(len: usize, ways: usize, min: usize) -> usize {
    (len / min.max(1)).clamp(1, ways.max(1))
}

/// The bytes of each stripe but the last when a transfer of `len` bytes is cut as the
/// clear-to-send's `nreqs` asks (whole cache lines, so stripes do not share one).
pub fn stripe_len(len: usize, nreqs: u32) -> usize {
    let n = (nreqs & !CTS_READ).max(1) as usize;
    len.div_ceil(n).next_multiple_of(64).max(1)
}

/// How many writes (or reads) a transfer of `len` bytes cut as `nreqs` asks takes: one per
/// stripe of [`stripe_len`] bytes, none when empty. A receiver that lets the writes complete
/// its transfer counts them against this.
pub fn stripe_pieces(len: usize, nreqs: u32) -> usize {
    len.div_ceil(stripe_len(len, nreqs))
}

/// Which stripe (from 0) of a transfer of `len` bytes cut as `nreqs` asks starts at byte
/// `off`: a device that spreads stripes over channels picks the channel from it.
pub fn stripe_of(off: u64, len: usize, nreqs: u32) -> usize {
    (off / stripe_len(len, nreqs) as u64) as usize
}

/// Sends `len` bytes from `src` as send `seq`, once the receiver's clear-to-send is there.
///
/// # Safety
/// `src` must be valid for `len` reads.
pub unsafe fn try_send(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    src: *const u8,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    // SAFETY: forwarded; a write only reads `src`.
    unsafe { transfer(dev, peer, seq, src.cast_mut(), len, tag, None) }
}

/// Reads `len` bytes into `dst` as send `seq`, once the peer's offer is there, stored for who
/// reads them next (`to`).
///
/// # Safety
/// `dst` must be valid for `len` writes.
pub unsafe fn try_read(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    dst: *mut u8,
    len: usize,
    to: CopyTo,
    tag: u32,
) -> Poll<Result<()>> {
    // SAFETY: forwarded.
    unsafe { transfer(dev, peer, seq, dst, len, tag, Some(to)) }
}

/// Send `seq`: moves `len` bytes between local `buf` and the memory the peer's clear-to-send
/// names, into it (`read` is `None`) or out of it (a read, stored as `read` says), then writes
/// the immediate.
///
/// # Safety
/// `buf` must be valid for `len` reads (a write) or writes (a read).
unsafe fn transfer(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    buf: *mut u8,
    len: usize,
    tag: u32,
    read: Option<CopyTo>,
) -> Poll<Result<()>> {
    let slot = slot_of(dev, seq);
    let Some(cts) = dev.poll_cts(peer, slot, idx_of(seq)) else {
        return Poll::Pending;
    };
    let fail = |e: Error| {
        // Tell the receiver instead of leaving it waiting, then report locally.
        let _ = dev.write_imm(peer, slot, idx_of(seq) | IMM_ERROR, 0);
        Poll::Ready(Err(e))
    };
    if cts.tag != tag {
        return fail(op_mismatch(dev, peer, cts.tag, tag));
    }
    let offered = cts.nreqs & CTS_READ != 0;
    if offered != read.is_some() {
        let (theirs, ours) = if offered {
            ("offers its buffer to be read", "writes")
        } else {
            ("expects a write", "reads")
        };
        return fail(Error::InvalidUsage(format!(
            "transfer mismatch: {} {theirs}, this rank {ours}",
            dev.peer_desc(peer)
        )));
    }
    if len as u64 != cts.size {
        let verb = if offered { "offers" } else { "expects" };
        return fail(Error::InvalidUsage(format!(
            "size mismatch: {} {verb} {} bytes, this rank {} {len}",
            dev.peer_desc(peer),
            cts.size,
            if offered { "reads" } else { "sends" },
        )));
    }
    if cts.nreqs & !CTS_READ > MAX_STRIPES {
        return fail(Error::Remote(format!(
            "protocol violation: {} asks for {} stripes (at most {MAX_STRIPES})",
            dev.peer_desc(peer),
            cts.nreqs & !CTS_READ
        )));
    }
    let stripe = stripe_len(len, cts.nreqs);
    let mut off = 0;
    while off < len {
        let piece = stripe.min(len - off);
        // The device checks the address against the entry's region; a peer's address near
        // the top of the range must not overflow on the way there.
        let addr = cts.addr.wrapping_add(off as u64);
        // SAFETY: off + piece <= len, valid by the caller's contract.
        let r = unsafe {
            match read {
                None => dev.write(peer, buf.add(off), piece, cts.key, addr),
                Some(to) => dev.read(peer, buf.add(off), piece, cts.key, addr, to),
            }
        };
        if let Err(e) = r {
            return fail(e);
        }
        off += piece;
    }
    Poll::Ready(dev.write_imm(peer, slot, idx_of(seq), len as u64))
}

/// Tag bit of point-to-point operations (sends and receives), whose matching across ranks does
/// not follow one operation order the way collectives' does; collectives' tags have it clear.
pub const TAG_P2P: u32 = 1 << 30;

/// The error for a peer running another operation (tags differ).
pub(crate) fn op_mismatch(dev: &dyn RmaDevice, peer: usize, theirs: u32, ours: u32) -> Error {
    let theirs = dev
        .peer_op(peer, theirs)
        .unwrap_or_else(|| format!("tag {theirs:#x}"));
    let ours = dev
        .local_op(ours)
        .unwrap_or_else(|| format!("tag {ours:#x}"));
    Error::InvalidUsage(format!(
        "operation mismatch: {} is running {theirs}, this rank is running {ours}",
        dev.peer_desc(peer)
    ))
}

/// The error for a peer that sent `got` bytes where this rank expected `len`.
pub(crate) fn len_mismatch(dev: &dyn RmaDevice, peer: usize, got: u64, len: usize) -> Error {
    Error::InvalidUsage(format!(
        "{} sent {got} bytes, this rank expected {len}",
        dev.peer_desc(peer)
    ))
}

/// Completes receive `seq` once its immediate has arrived; it must carry exactly `len` bytes.
/// Then frees the slot for the sender (credit).
pub fn poll_recv(dev: &dyn RmaDevice, peer: usize, seq: u32, len: usize) -> Poll<Result<()>> {
    let slot = slot_of(dev, seq);
    let Some((imm, got)) = dev.poll_imm(peer, slot, idx_of(seq)) else {
        // A small message where this rank expects a large one: the sender used the eager
        // variant and will never look at our clear-to-send.
        if let Some(h) = dev.eager_peek(peer, slot, idx_of(seq)) {
            return Poll::Ready(Err(len_mismatch(dev, peer, h.len as u64, len)));
        }
        return Poll::Pending;
    };
    if imm & IMM_ERROR != 0 {
        return Poll::Ready(Err(Error::Remote(format!(
            "{} failed the transfer (it reported a mismatch or an error)",
            dev.peer_desc(peer)
        ))));
    }
    if got != len as u64 {
        return Poll::Ready(Err(len_mismatch(dev, peer, got, len)));
    }
    Poll::Ready(dev.post_credit(peer, slot, seq))
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(all(test, ampccl_loom))]
mod loom_tests;
