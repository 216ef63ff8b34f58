//! `Link`: HCCL's link primitives between the local rank and one peer, as stream tasks.
//!
//! `tx_ack`/`rx_ack` exchange readiness; `rx_async` posts a clear-to-send for a local buffer;
//! `tx_async` writes into the buffer the peer posted (receiver-driven, see
//! [`crate::protocol`]); `tx_wait_done`/`rx_wait_done` complete them. `offer_async` and
//! `read_async` are the same pair with the data flowing the other way: the owner offers its
//! buffer like a receive, the peer reads it like a send (`offer_wait_done`/`tx_wait_done`).
//! Messages the device takes eagerly ([`crate::eager`]) are sent without waiting for the
//! clear-to-send and copied out of their slot by `rx_wait_done`. Sequence numbers are taken when an operation is enqueued, so a
//! link's operations must be enqueued in the order the two sides agree on (as with NCCL, issue
//! order defines matching).

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::task::Poll;

use ampccl_runtime::Result;
use ampccl_runtime::stream::Stream;
use ampccl_runtime::task::{CopyTo, LinkDriver, LinkOp, Task};

use crate::device::{NOT_COLLECTIVE, RmaDevice};
use crate::eager;
use crate::protocol::{self, SlotTracker};

/// Issue-order counters of one direction of a link.
#[derive(Default)]
struct Counters {
    /// Next sequence number of an async operation.
    issued: AtomicU32,
    /// Next sequence number of a wait-done operation.
    waited: AtomicU32,
}

/// A posted receive, per FIFO slot: its tag and, for an eager one, where `rx_wait_done` copies
/// the message to. The message may arrive before the receive is posted, so `posted` (its
/// sequence number + 1, stored last) tells `rx_wait_done` whether `dst` and `tag` are this
/// receive's yet.
#[derive(Default)]
struct PostedRecv {
    posted: AtomicU32,
    dst: AtomicPtr<u8>,
    tag: AtomicU32,
}

/// A link from the local rank to `peer` over a device.
pub struct Link {
    dev: Arc<dyn RmaDevice>,
    peer: usize,
    tx: Counters,
    rx: Counters,
    tx_acks: AtomicU32,
    rx_acks: AtomicU32,
    /// Receives completed, per FIFO slot (frees slots; receives on different streams may
    /// complete out of order).
    rx_done: SlotTracker,
    /// Sends completed, per slot.
    tx_done: SlotTracker,
    /// Receives posted, per slot.
    posted_rx: Box<[PostedRecv]>,
    /// Our copy of the peer's credit words (eager sends).
    credits: eager::Credits,
}

impl Link {
    /// A link to `peer`.
    pub fn new(dev: Arc<dyn RmaDevice>, peer: usize) -> Arc<Link> {
        let depth = dev.fifo_depth();
        Arc::new(Link {
            dev,
            peer,
            tx: Counters::default(),
            rx: Counters::default(),
            tx_acks: AtomicU32::new(0),
            rx_acks: AtomicU32::new(0),
            rx_done: SlotTracker::new(depth),
            tx_done: SlotTracker::new(depth),
            posted_rx: (0..depth).map(|_| PostedRecv::default()).collect(),
            credits: eager::Credits::new(depth),
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// True when `rx_async` accepts any local memory (e.g. cross-memory attach), not only
    /// registered windows.
    pub fn receives_into_user_memory(&self) -> bool {
        self.dev.exposes_user_memory()
    }

    fn push(self: &Arc<Self>, s: &Stream, op: LinkOp) {
        // SAFETY: the pointers inside `op` were guaranteed by the callers below.
        unsafe {
            s.enqueue(Task::Link {
                link: self.clone(),
                op,
            })
        }
    }

    /// Tells the peer we are ready (HCCL `TxAck`).
    pub fn tx_ack(self: &Arc<Self>, s: &Stream) {
        let seq = self.tx_acks.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::TxAck { seq });
    }

    /// Waits for the peer's next ack (HCCL `RxAck`).
    pub fn rx_ack(self: &Arc<Self>, s: &Stream) {
        let seq = self.rx_acks.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::RxAck { seq });
    }

    /// Sends `len` bytes at `src` into the peer's next posted receive.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until the matching `tx_wait_done` completes.
    pub unsafe fn tx_async(self: &Arc<Self>, s: &Stream, src: *const u8, len: usize, tag: u32) {
        let seq = self.tx.issued.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::TxAsync { seq, src, len, tag });
    }

    /// Posts a receive of exactly `len` bytes into `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid and untouched until the matching `rx_wait_done` completes, and be
    /// inside a registered window unless [`Link::receives_into_user_memory`].
    pub unsafe fn rx_async(self: &Arc<Self>, s: &Stream, dst: *mut u8, len: usize, tag: u32) {
        let seq = self.rx.issued.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::RxAsync { seq, dst, len, tag });
    }

    /// Offers `len` bytes at `src` for the peer to read with its next `read_async` from us
    /// (numbered and completed like a receive: [`Link::offer_wait_done`]).
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until the matching `offer_wait_done` completes, and
    /// be inside a registered window unless [`Link::receives_into_user_memory`].
    pub unsafe fn offer_async(self: &Arc<Self>, s: &Stream, src: *const u8, len: usize, tag: u32) {
        let seq = self.rx.issued.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::Offer { seq, src, len, tag });
    }

    /// Reads `len` bytes into `dst` from the peer's next offer to us (numbered and completed
    /// like a send: [`Link::tx_wait_done`]).
    ///
    /// # Safety
    /// `dst` must stay valid and untouched until the matching `tx_wait_done` completes.
    pub unsafe fn read_async(
        self: &Arc<Self>,
        s: &Stream,
        dst: *mut u8,
        len: usize,
        to: CopyTo,
        tag: u32,
    ) {
        let seq = self.tx.issued.fetch_add(1, Ordering::Relaxed);
        self.push(
            s,
            LinkOp::Read {
                seq,
                dst,
                len,
                to,
                tag,
            },
        );
    }

    /// Completes the oldest outstanding offer, which must have been read as `len` bytes.
    pub fn offer_wait_done(self: &Arc<Self>, s: &Stream, len: usize) {
        let seq = self.rx.waited.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::OfferWaitDone { seq, len });
    }

    /// Completes the oldest outstanding send (or read).
    pub fn tx_wait_done(self: &Arc<Self>, s: &Stream) {
        let seq = self.tx.waited.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::TxWaitDone { seq });
    }

    /// Completes the oldest outstanding receive, which must carry `len` bytes.
    pub fn rx_wait_done(self: &Arc<Self>, s: &Stream, len: usize) {
        let seq = self.rx.waited.fetch_add(1, Ordering::Relaxed);
        self.push(s, LinkOp::RxWaitDone { seq, len });
    }

    /// Convenience: a whole send (`tx_async` + `tx_wait_done`).
    ///
    /// # Safety
    /// As [`Link::tx_async`].
    pub unsafe fn send(self: &Arc<Self>, s: &Stream, src: *const u8, len: usize, tag: u32) {
        // SAFETY: forwarded.
        unsafe { self.tx_async(s, src, len, tag) };
        self.tx_wait_done(s);
    }

    /// Convenience: a whole receive (`rx_async` + `rx_wait_done`).
    ///
    /// # Safety
    /// As [`Link::rx_async`].
    pub unsafe fn recv(self: &Arc<Self>, s: &Stream, dst: *mut u8, len: usize, tag: u32) {
        // SAFETY: forwarded.
        unsafe { self.rx_async(s, dst, len, tag) };
        self.rx_wait_done(s, len);
    }
}

impl Link {
    /// The posted-receive record of receive `seq`'s slot.
    fn posted(&self, seq: u32) -> &PostedRecv {
        &self.posted_rx[seq as usize % self.posted_rx.len()]
    }

    /// The tag of receive `seq`, once posted.
    fn posted_tag(&self, seq: u32) -> Option<u32> {
        let e = self.posted(seq);
        (e.posted.load(Ordering::Acquire) == seq.wrapping_add(1))
            .then(|| e.tag.load(Ordering::Relaxed))
    }

    /// Fails an operation stuck under `tag` when it is a collective and the peer ran a
    /// different operation as the same collective (the same number among the communicator's
    /// collectives, see [`crate::device::OpRecord`]): every rank runs its collectives in one order, so the
    /// two can never match (ranks that disagree on a root, on a count, on the collective). A
    /// peer that has not reached the collective yet says nothing.
    fn check_same_collective(&self, tag: u32) -> Result<()> {
        if tag & protocol::TAG_P2P != 0 {
            return Ok(());
        }
        let Some(ours) = self
            .dev
            .op_history(None)
            .into_iter()
            .find(|r| r[0] as u32 == tag && r[1] != NOT_COLLECTIVE)
        else {
            return Ok(());
        };
        let theirs = self.dev.op_history(Some(self.peer));
        match theirs.iter().find(|r| r[1] == ours[1]) {
            Some(r) if r[0] as u32 != tag => Err(protocol::op_mismatch(
                &*self.dev,
                self.peer,
                r[0] as u32,
                tag,
            )),
            _ => Ok(()),
        }
    }

    /// Fails receive `seq` when the peer is waiting for a message from this
    /// rank that this rank has not even enqueued, under another operation's tag: both ranks
    /// then wait to receive from each other and neither will send (ranks that disagree on a
    /// reduce's root, a recv against a recv of another size). Between collectives, whose ranks
    /// run their operations in one order, that is always a mismatch; two point-to-point tags
    /// prove nothing (a group may send later on another lane), so only a tag of a collective
    /// on either side counts ([`protocol::TAG_P2P`]).
    fn check_crossed_receives(&self, seq: u32) -> Result<()> {
        let Some(ours) = self.posted_tag(seq) else {
            return Ok(());
        };
        let next_send = self.tx.issued.load(Ordering::Relaxed);
        let slot = protocol::slot_of(&*self.dev, next_send);
        let Some(cts) = self
            .dev
            .poll_cts(self.peer, slot, protocol::idx_of(next_send))
        else {
            return Ok(());
        };
        let both_p2p = cts.tag & ours & protocol::TAG_P2P != 0;
        if cts.tag == ours || both_p2p {
            return Ok(());
        }
        // The peer posted this clear-to-send after finishing whatever it sent us before: the
        // stream polls the receive once more before it takes this error, so a message that
        // arrived in the meantime completes it.
        Err(protocol::op_mismatch(&*self.dev, self.peer, cts.tag, ours))
    }
}

impl LinkDriver for Link {
    fn poll_op(&self, op: &mut LinkOp) -> Poll<Result<()>> {
        let dev = &*self.dev;
        match *op {
            LinkOp::TxAck { .. } => Poll::Ready(dev.post_ack(self.peer)),
            LinkOp::RxAck { seq } => {
                if (dev.acks(self.peer).wrapping_sub(seq.wrapping_add(1)) as i32) >= 0 {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            LinkOp::RxAsync { seq, dst, len, tag } => {
                let free = self.rx_done.is_free(seq);
                let r = if eager::is_eager(dev, len) {
                    eager::post_recv(dev, self.peer, seq, free, len, tag)
                } else {
                    protocol::post_recv(dev, self.peer, seq, free, dst, len, tag)
                };
                if r.is_ready() {
                    let e = self.posted(seq);
                    e.dst.store(dst, Ordering::Relaxed);
                    e.tag.store(tag, Ordering::Relaxed);
                    e.posted.store(seq.wrapping_add(1), Ordering::Release);
                }
                r
            }
            LinkOp::TxAsync { seq, src, len, tag } => {
                // SAFETY: `src` valid by the `tx_async` contract.
                let r = unsafe {
                    if eager::is_eager(dev, len) {
                        eager::try_send(dev, &self.credits, self.peer, seq, src, len, tag)
                    } else {
                        protocol::try_send(dev, self.peer, seq, src, len, tag)
                    }
                };
                if r.is_ready() {
                    // Issued: a device whose writes complete later tells when at
                    // `tx_wait_done` (`send_done`).
                    self.tx_done.complete(seq);
                }
                r
            }
            LinkOp::Offer { seq, src, len, tag } => protocol::post_offer(
                dev,
                self.peer,
                seq,
                self.rx_done.is_free(seq),
                src,
                len,
                tag,
            ),
            LinkOp::Read {
                seq,
                dst,
                len,
                to,
                tag,
            } => {
                // SAFETY: `dst` valid by the `read_async` contract.
                let r = unsafe { protocol::try_read(dev, self.peer, seq, dst, len, to, tag) };
                if r.is_ready() {
                    // The read is complete once issued (shared memory), as a write.
                    self.tx_done.complete(seq);
                }
                r
            }
            LinkOp::OfferWaitDone { seq, len } => {
                let r = protocol::poll_recv(dev, self.peer, seq, len);
                if r.is_ready() {
                    self.rx_done.complete(seq);
                }
                r
            }
            LinkOp::TxWaitDone { seq } => {
                if self.tx_done.is_done(seq)
                    && dev.send_done(self.peer, protocol::slot_of(dev, seq))
                {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            LinkOp::RxWaitDone { seq, len } => {
                let r = if eager::is_eager(dev, len) {
                    let e = self.posted(seq);
                    if e.posted.load(Ordering::Acquire) != seq.wrapping_add(1) {
                        return Poll::Pending;
                    }
                    let (dst, tag) = (e.dst.load(Ordering::Relaxed), e.tag.load(Ordering::Relaxed));
                    // SAFETY: `dst` was posted by `rx_async` for this receive, whose contract
                    // keeps it valid until this completes.
                    unsafe { eager::poll_recv(dev, self.peer, seq, dst, len, tag) }
                } else {
                    protocol::poll_recv(dev, self.peer, seq, len)
                };
                if r.is_ready() {
                    self.rx_done.complete(seq);
                }
                r
            }
        }
    }

    fn check_health(&self, op: &LinkOp) -> Result<()> {
        self.dev.peer_health(self.peer)?;
        let tag = match *op {
            LinkOp::RxWaitDone { seq, .. } => {
                self.check_crossed_receives(seq)?;
                self.posted_tag(seq)
            }
            LinkOp::TxAsync { tag, .. }
            | LinkOp::RxAsync { tag, .. }
            | LinkOp::Offer { tag, .. }
            | LinkOp::Read { tag, .. } => Some(tag),
            _ => None,
        };
        tag.map_or(Ok(()), |tag| self.check_same_collective(tag))
    }

    fn peer_desc(&self) -> String {
        self.dev.peer_desc(self.peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdev::PairDevice;

    /// A send whose writes complete after it was issued (as `ofi`'s, on the completion
    /// queue) is waited for until the device reports them done: its buffer is still read.
    #[test]
    fn a_send_completes_when_the_device_says_its_writes_did() {
        let (a, b) = PairDevice::pair(4, 4096);
        let dst = b.window_ptr(0);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let (to_b, from_a) = (Link::new(a.clone(), 1), Link::new(b.clone(), 0));
        let src = vec![5u8; 300];
        let ready = |p: Poll<Result<()>>| matches!(p, Poll::Ready(Ok(())));
        let mut rx = LinkOp::RxAsync {
            seq: 0,
            dst,
            len: 300,
            tag: 7,
        };
        assert!(ready(from_a.poll_op(&mut rx)));
        a.hold_sends(true);
        let mut tx = LinkOp::TxAsync {
            seq: 0,
            src: src.as_ptr(),
            len: 300,
            tag: 7,
        };
        assert!(ready(to_b.poll_op(&mut tx)), "issued");
        let mut done = LinkOp::TxWaitDone { seq: 0 };
        assert!(to_b.poll_op(&mut done).is_pending(), "its writes still run");
        assert!(ready(
            from_a.poll_op(&mut LinkOp::RxWaitDone { seq: 0, len: 300 })
        ));
        a.hold_sends(false);
        assert!(ready(to_b.poll_op(&mut done)));
        assert_eq!(b.window(0, 300), src);
    }
}
