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
    256 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "smallest stripe when a transfer is split over an RMA device's channels (the ofi \
     provider's rails)",
);

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
    let stripe = stripe_len(len, cts.nreqs);
    let mut off = 0;
    while off < len {
        let piece = stripe.min(len - off);
        let addr = cts.addr + off as u64;
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
pub(crate) mod tests {
    use super::*;
    use crate::testdev::PairDevice;

    /// The value of a poll that must be ready (test helper, shared with the eager tests).
    pub(crate) fn ready<T>(p: Poll<T>) -> T {
        match p {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("unexpectedly pending"),
        }
    }

    #[test]
    fn stripes_are_at_least_the_minimum_and_at_most_one_per_channel() {
        let k = 256 << 10;
        assert_eq!(stripe_count(0, 4, k), 1, "an empty transfer is one write");
        assert_eq!(stripe_count(k - 1, 4, k), 1);
        assert_eq!(
            stripe_count(2 * k - 1, 4, k),
            1,
            "two stripes would be short"
        );
        assert_eq!(stripe_count(2 * k, 4, k), 2);
        assert_eq!(stripe_count(4 << 20, 4, k), 4, "one per channel");
        assert_eq!(stripe_count(4 << 20, 1, k), 1);
        assert_eq!(stripe_count(1 << 20, 4, 1), 4, "the smallest minimum");
        assert_eq!(stripe_count(1 << 20, 4, 0), 4, "a zero minimum counts as 1");
    }

    #[test]
    fn each_stripe_knows_its_number_from_its_offset() {
        for (len, nreqs) in [(1000, 1), (1 << 20, 2), ((1 << 20) + 3, 3), (4 << 20, 4)] {
            let stripe = stripe_len(len, nreqs | CTS_READ);
            assert_eq!(stripe, stripe_len(len, nreqs), "the read flag is no count");
            let offs: Vec<usize> = (0..len).step_by(stripe).collect();
            assert_eq!(offs.len(), nreqs as usize, "{len} bytes in {nreqs}");
            for (k, off) in offs.into_iter().enumerate() {
                assert_eq!(stripe_of(off as u64, len, nreqs), k);
            }
        }
    }

    #[test]
    fn receiver_drives_the_transfer() {
        let (a, b) = PairDevice::pair(4, 4096);
        let src: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        // Sender cannot go before the clear-to-send.
        // SAFETY: src is valid.
        assert!(unsafe { try_send(&a, 1, 0, src.as_ptr(), 300, 7) }.is_pending());
        assert!(poll_recv(&b, 0, 0, 300).is_pending());
        let dst = b.window_ptr(100);
        ready(post_recv(&b, 0, 0, true, dst, 300, 7)).unwrap();
        // SAFETY: src is valid.
        ready(unsafe { try_send(&a, 1, 0, src.as_ptr(), 300, 7) }).unwrap();
        ready(poll_recv(&b, 0, 0, 300)).unwrap();
        assert_eq!(b.window(100, 300), src);
    }

    #[test]
    fn fifo_flow_control_and_wraparound() {
        let (a, b) = PairDevice::pair(4, 4096);
        let t = SlotTracker::new(4);
        let mut completed = 0u32;
        for seq in 0..20u32 {
            let dst = b.window_ptr((seq as usize % 4) * 8);
            if seq >= 4 {
                // The slot of receive seq - 4 is still in use until that receive completes.
                assert!(post_recv(&b, 0, seq, t.is_free(seq), dst, 8, 1).is_pending());
            }
            while seq.wrapping_sub(completed) >= 4 {
                ready(poll_recv(&b, 0, completed, 8)).unwrap();
                t.complete(completed);
                completed += 1;
            }
            ready(post_recv(&b, 0, seq, t.is_free(seq), dst, 8, 1)).unwrap();
            let data = [seq as u8; 8];
            // SAFETY: data is valid.
            ready(unsafe { try_send(&a, 1, seq, data.as_ptr(), 8, 1) }).unwrap();
        }
        while completed < 20 {
            ready(poll_recv(&b, 0, completed, 8)).unwrap();
            completed += 1;
        }
        assert_eq!(b.window(3 * 8, 8), vec![19u8; 8]);
    }

    #[test]
    fn slots_free_exactly_when_their_predecessor_completed() {
        let t = SlotTracker::new(4);
        assert!((0..4).all(|s| t.is_free(s)));
        assert!(!t.is_free(4) && !t.is_done(0));
        // Out of order: 3 completes first; slot 3 frees for 7, slot 0 stays taken.
        t.complete(3);
        assert!(t.is_done(3) && !t.is_done(0));
        assert!(t.is_free(7) && !t.is_free(4));
        t.complete(0);
        assert!(t.is_free(4));
        // A late record of an older operation does not move a slot back.
        t.complete(4);
        t.complete(0);
        assert!(t.is_done(4) && t.is_free(8));
        // Wrapping sequence numbers.
        let w = SlotTracker::new(4);
        for seq in (u32::MAX - 5)..=u32::MAX {
            w.complete(seq);
        }
        assert!(w.is_free(u32::MAX.wrapping_add(4)));
    }

    #[test]
    fn reader_pulls_an_offer() {
        let (a, b) = PairDevice::pair(4, 4096);
        let src = b.window_ptr(64);
        for i in 0..200 {
            // SAFETY: inside b's window; nothing else touches it.
            unsafe { *src.add(i) = i as u8 ^ 0x5a };
        }
        let mut got = vec![0u8; 200];
        // The reader cannot go before the offer, nor the offer complete before the read.
        // SAFETY: `got` is valid for 200 writes.
        assert!(
            unsafe { try_read(&a, 1, 0, got.as_mut_ptr(), 200, CopyTo::Output, 3) }.is_pending()
        );
        ready(post_offer(&b, 0, 0, true, src, 200, 3)).unwrap();
        assert!(poll_recv(&b, 0, 0, 200).is_pending());
        // SAFETY: as above.
        ready(unsafe { try_read(&a, 1, 0, got.as_mut_ptr(), 200, CopyTo::Output, 3) }).unwrap();
        ready(poll_recv(&b, 0, 0, 200)).unwrap();
        assert_eq!(got, b.window(64, 200));
    }

    #[test]
    fn a_write_meeting_an_offer_or_a_read_meeting_a_receive_fails_both_sides() {
        let (a, b) = PairDevice::pair(4, 4096);
        let data = [7u8; 16];
        let mut buf = [0u8; 16];
        // A send finds an offer: refused, so the offered (read-only) buffer is never written.
        ready(post_offer(&b, 0, 0, true, b.window_ptr(0), 16, 1)).unwrap();
        // SAFETY: data is valid.
        let e = ready(unsafe { try_send(&a, 1, 0, data.as_ptr(), 16, 1) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("offers its buffer")),
            "{e}"
        );
        assert!(matches!(
            ready(poll_recv(&b, 0, 0, 16)).unwrap_err(),
            Error::Remote(_)
        ));
        assert_eq!(b.window(0, 16), vec![0u8; 16]);
        // A read finds a plain clear-to-send.
        ready(post_recv(&b, 0, 1, true, b.window_ptr(0), 16, 1)).unwrap();
        // SAFETY: buf is valid.
        let e = ready(unsafe { try_read(&a, 1, 1, buf.as_mut_ptr(), 16, CopyTo::Output, 1) })
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("expects a write")),
            "{e}"
        );
        assert!(ready(poll_recv(&b, 0, 1, 16)).is_err());
        // A read of another size than offered.
        ready(post_offer(&b, 0, 2, true, b.window_ptr(0), 16, 1)).unwrap();
        // SAFETY: buf is valid.
        let e = ready(unsafe { try_read(&a, 1, 2, buf.as_mut_ptr(), 8, CopyTo::Output, 1) })
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("offers 16")),
            "{e}"
        );
        assert!(ready(poll_recv(&b, 0, 2, 16)).is_err());
    }

    #[test]
    fn tag_or_size_mismatch_fails_both_sides() {
        let (a, b) = PairDevice::pair(4, 4096);
        let dst = b.window_ptr(0);
        ready(post_recv(&b, 0, 0, true, dst, 16, 1)).unwrap();
        let data = [0u8; 16];
        // SAFETY: data is valid.
        let e = ready(unsafe { try_send(&a, 1, 0, data.as_ptr(), 16, 2) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("mismatch")),
            "{e}"
        );
        let e = ready(poll_recv(&b, 0, 0, 16)).unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");

        ready(post_recv(&b, 0, 1, true, dst, 16, 1)).unwrap();
        // SAFETY: data is valid.
        let e = ready(unsafe { try_send(&a, 1, 1, data.as_ptr(), 8, 1) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("expects 16")),
            "{e}"
        );
    }

    #[test]
    fn zero_length_messages_match_and_mismatch() {
        let (a, b) = PairDevice::pair(4, 64);
        // An empty receive buffer may be null (an empty user slice) and outside any window.
        ready(post_recv(&b, 0, 0, true, std::ptr::null_mut(), 0, 1)).unwrap();
        // SAFETY: zero bytes are read.
        ready(unsafe { try_send(&a, 1, 0, std::ptr::null(), 0, 1) }).unwrap();
        ready(poll_recv(&b, 0, 0, 0)).unwrap();
        // 0 bytes against a receive of 8: the sender refuses, the receiver learns it.
        let dst = b.window_ptr(0);
        ready(post_recv(&b, 0, 1, true, dst, 8, 1)).unwrap();
        // SAFETY: zero bytes are read.
        let e = ready(unsafe { try_send(&a, 1, 1, std::ptr::null(), 0, 1) }).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(ready(poll_recv(&b, 0, 1, 8)).is_err());
    }

    #[test]
    fn unregistered_receive_buffer_is_refused() {
        let (_a, b) = PairDevice::pair(4, 64);
        let mut private = [0u8; 8];
        let e = ready(post_recv(&b, 0, 0, true, private.as_mut_ptr(), 8, 1)).unwrap_err();
        assert!(matches!(e, Error::Internal(_)));
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::*;
    use crate::device::EagerHeader;

    /// One clear-to-send slot (B's offers, in A's memory), one completion slot (A's reads, in
    /// B's memory) and B's offered buffer: what [`post_offer`], [`try_read`] and [`poll_recv`]
    /// touch, over loom's atomics and cells, so the model checks the real functions' orderings.
    struct Shared {
        cts_size: AtomicU64,
        cts_nreqs: AtomicU32,
        cts_tag: AtomicU32,
        cts_idx: AtomicU32,
        imm: AtomicU32,
        imm_len: AtomicU64,
        offered: UnsafeCell<[u8; 4]>,
    }

    /// Rank `me` of the pair: 0 reads, 1 offers.
    struct Dev {
        me: usize,
        sh: loom::sync::Arc<Shared>,
    }

    // SAFETY: the offered cell is accessed only under the protocol the model checks.
    unsafe impl Sync for Dev {}
    // SAFETY: as above.
    unsafe impl Send for Dev {}

    impl RmaDevice for Dev {
        fn fifo_depth(&self) -> usize {
            1
        }
        fn channels(&self) -> usize {
            1
        }
        fn expose(&self, _: *mut u8, _: usize) -> Option<(u32, u64)> {
            Some((1, 0))
        }
        fn exposes_user_memory(&self) -> bool {
            false
        }
        fn post_cts(&self, _: usize, _: usize, e: &CtsEntry) -> Result<()> {
            assert_eq!(self.me, 1);
            let sh = &self.sh;
            sh.cts_size.store(e.size, Ordering::Relaxed);
            sh.cts_nreqs.store(e.nreqs, Ordering::Relaxed);
            sh.cts_tag.store(e.tag, Ordering::Relaxed);
            sh.cts_idx.store(e.idx, Ordering::Release);
            Ok(())
        }
        fn poll_cts(&self, _: usize, _: usize, idx: u32) -> Option<CtsEntry> {
            assert_eq!(self.me, 0);
            let sh = &self.sh;
            (sh.cts_idx.load(Ordering::Acquire) == idx).then(|| CtsEntry {
                addr: 0,
                size: sh.cts_size.load(Ordering::Relaxed),
                key: 1,
                nreqs: sh.cts_nreqs.load(Ordering::Relaxed),
                tag: sh.cts_tag.load(Ordering::Relaxed),
                idx,
            })
        }
        unsafe fn write(&self, _: usize, _: *const u8, _: usize, _: u32, _: u64) -> Result<()> {
            unreachable!("the model only reads")
        }
        unsafe fn read(
            &self,
            _: usize,
            dst: *mut u8,
            len: usize,
            _: u32,
            _: u64,
            _: CopyTo,
        ) -> Result<()> {
            assert_eq!(self.me, 0);
            // SAFETY: dst holds len <= 4 bytes (model contract).
            self.sh
                .offered
                .with(|p| unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), dst, len) });
            Ok(())
        }
        fn write_imm(&self, _: usize, _: usize, imm: u32, len: u64) -> Result<()> {
            self.sh.imm_len.store(len, Ordering::Relaxed);
            self.sh.imm.store(imm, Ordering::Release);
            Ok(())
        }
        fn poll_imm(&self, _: usize, _: usize, want: u32) -> Option<(u32, u64)> {
            let imm = self.sh.imm.load(Ordering::Acquire);
            (imm & !IMM_ERROR == want).then(|| (imm, self.sh.imm_len.load(Ordering::Relaxed)))
        }
        fn eager_max(&self) -> usize {
            0
        }
        unsafe fn eager_write(
            &self,
            _: usize,
            _: usize,
            _: u32,
            _: u32,
            _: *const u8,
            _: usize,
        ) -> Result<()> {
            unreachable!("no eager messages in the model")
        }
        fn eager_peek(&self, _: usize, _: usize, _: u32) -> Option<EagerHeader> {
            None
        }
        unsafe fn eager_read(&self, _: usize, _: usize, _: *mut u8, _: usize) {
            unreachable!("no eager messages in the model")
        }
        fn post_credit(&self, _: usize, _: usize, _: u32) -> Result<()> {
            Ok(())
        }
        fn credit(&self, _: usize, _: usize) -> u32 {
            0
        }
        fn post_ack(&self, _: usize) -> Result<()> {
            Ok(())
        }
        fn acks(&self, _: usize) -> u32 {
            0
        }
        fn peer_health(&self, _: usize) -> Result<()> {
            Ok(())
        }
        fn peer_desc(&self, peer: usize) -> String {
            format!("rank {peer}")
        }
        fn op_history(&self, _: Option<usize>) -> Vec<crate::device::OpRecord> {
            Vec::new()
        }
        fn peer_op(&self, _: usize, _: u32) -> Option<String> {
            None
        }
        fn local_op(&self, _: u32) -> Option<String> {
            None
        }
    }

    /// Two offers of one buffer through one slot: the owner fills the buffer, offers it, and
    /// refills it only once the offer completed; the reader reads each offer whole (loom's
    /// cell reports any overlap of the owner's refill with the peer's read) and in order.
    #[test]
    fn loom_an_offered_buffer_is_rewritten_only_after_the_read() {
        loom::model(|| {
            let sh = loom::sync::Arc::new(Shared {
                cts_size: AtomicU64::new(0),
                cts_nreqs: AtomicU32::new(0),
                cts_tag: AtomicU32::new(0),
                cts_idx: AtomicU32::new(0),
                imm: AtomicU32::new(0),
                imm_len: AtomicU64::new(0),
                offered: UnsafeCell::new([0; 4]),
            });
            let (a, b) = (
                Dev {
                    me: 0,
                    sh: sh.clone(),
                },
                Dev { me: 1, sh },
            );
            let reader = loom::thread::spawn(move || {
                for seq in 0..2u32 {
                    let mut got = [0u8; 4];
                    // SAFETY: got is valid for 4 bytes.
                    while unsafe { try_read(&a, 1, seq, got.as_mut_ptr(), 4, CopyTo::Output, 7) }
                        .is_pending()
                    {
                        loom::thread::yield_now();
                    }
                    assert_eq!(got, [seq as u8 + 1; 4]);
                }
            });
            for seq in 0..2u32 {
                // SAFETY: the buffer is ours until offered (the previous offer completed).
                b.sh.offered
                    .with_mut(|p| unsafe { *p = [seq as u8 + 1; 4] });
                let ptr = std::ptr::null::<u8>();
                assert!(post_offer(&b, 0, seq, true, ptr, 4, 7).is_ready());
                loop {
                    match poll_recv(&b, 0, seq, 4) {
                        Poll::Ready(r) => break r.unwrap(),
                        Poll::Pending => loom::thread::yield_now(),
                    }
                }
            }
            reader.join().unwrap();
        });
    }
}
