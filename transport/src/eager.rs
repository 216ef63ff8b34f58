//! The eager variant of the receiver-driven protocol ([`crate::protocol`]), for messages of at
//! most the device's `eager_max` bytes.
//!
//! A rendezvous message costs two one-way trips: the receiver's clear-to-send, then the data.
//! For a small message the trip is the whole cost, so the sender writes it straight into a
//! slot the receiver owns for it:
//!
//! - send number `seq` waits only for its credit: the receiver's credit word `seq % depth`
//!   shows receive `seq - depth` completed (so that receive's eager slot is free). It then
//!   writes payload, tag and length into the receiver's eager slot `seq % depth`, `idx = seq + 1`
//!   last with release;
//! - receive number `seq` still posts a clear-to-send (naming no memory), so a peer that sends
//!   this message as a large one finds a size mismatch instead of waiting forever; it completes
//!   when its eager slot shows `idx`, checks tag and length, copies the payload out and stores
//!   the credit `seq + 1` into the sender's memory.
//!
//! As with MPI's eager messages, a send completes once written: a mismatch (tag or length) is
//! found by the receiver, which fails and marks itself failed, and a pure sender (a broadcast's
//! root, a `send`) learns it at its next operation with that peer. In symmetric operations
//! (allreduce, allgather) every rank receives too, so every rank fails on the call itself.
//! Checking the clear-to-send at the sender's wait-done instead would catch it there, but costs
//! two more cache-line transfers per message, a quarter of a small allreduce's time.
//!
//! In steady state the credit of slot `seq % depth` is `depth` receives old, so the sender
//! never waits for it: one one-way trip per message. The sender reads credits a cache line at a
//! time into [`Credits`] and goes back to the shared words only when its copy is too old, so
//! reading them costs one cache miss per [`CREDIT_GROUP`] messages instead of one per message.
//! Which variant a message takes depends on its length alone ([`is_eager`]); a receive watches
//! for the other variant too and reports the mismatch.

use std::task::Poll;

use ampccl_runtime::sync::{AtomicU32, Ordering};
use ampccl_runtime::{Error, Result};

use crate::device::{CtsEntry, IMM_ERROR, RmaDevice};
use crate::protocol::{at_least, idx_of, len_mismatch, op_mismatch, slot_of};

/// Whether a message of `len` bytes travels eagerly over `dev`.
pub fn is_eager(dev: &dyn RmaDevice, len: usize) -> bool {
    let max = dev.eager_max();
    max > 0 && len <= max
}

/// Posts eager receive `seq` of `len` bytes once `slot_free` (as [`crate::protocol::post_recv`]):
/// a clear-to-send that names no memory, only there to expose a length mismatch to a peer
/// that sends with the rendezvous protocol.
pub fn post_recv(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    slot_free: bool,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    if !slot_free {
        return Poll::Pending;
    }
    let entry = CtsEntry {
        addr: 0,
        size: len as u64,
        key: 0,
        nreqs: 0,
        tag,
        idx: idx_of(seq),
    };
    Poll::Ready(dev.post_cts(peer, slot_of(dev, seq), &entry))
}

/// Credit words read together: one 64-byte cache line of `u32` words (layout, not tuning).
pub const CREDIT_GROUP: usize = 16;

/// The sender's copy of one peer's credit words.
pub struct Credits {
    seen: Box<[AtomicU32]>,
}

impl Credits {
    /// A copy for `depth` slots, as the shared words start (0: never written).
    pub fn new(depth: usize) -> Credits {
        Credits {
            seen: (0..depth).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Whether send `seq` may use its eager slot: receive `seq - depth` completed (credit `c`
    /// means receive `c - 1` completed). Refreshes the copy of the slot's group first when
    /// the copy does not show it.
    fn allow(&self, dev: &dyn RmaDevice, peer: usize, seq: u32) -> bool {
        let depth = self.seen.len();
        let slot = seq as usize % depth;
        let ok = |c: u32| at_least(c.wrapping_add(depth as u32), seq.wrapping_add(1));
        if ok(self.seen[slot].load(Ordering::Acquire)) {
            return true;
        }
        let first = slot - slot % CREDIT_GROUP;
        let mut words = [0u32; CREDIT_GROUP];
        let words = &mut words[..CREDIT_GROUP.min(depth - first)];
        dev.credit_group(peer, first, words);
        for (s, &w) in (first..).zip(words.iter()) {
            // Release/acquire through the copy: a thread that finds the credit here still
            // happens after the receiver's release of the slot.
            self.seen[s].store(w, Ordering::Release);
        }
        ok(self.seen[slot].load(Ordering::Acquire))
    }
}

/// Sends `len <= eager_max` bytes from `src` as send `seq`, once its slot's credit is there
/// (`credits`: this link's copy of the peer's credit words).
///
/// # Safety
/// `src` must be valid for `len` reads.
pub unsafe fn try_send(
    dev: &dyn RmaDevice,
    credits: &Credits,
    peer: usize,
    seq: u32,
    src: *const u8,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    if !credits.allow(dev, peer, seq) {
        return Poll::Pending;
    }
    let slot = slot_of(dev, seq);
    // SAFETY: `src` valid for `len` by the caller's contract.
    Poll::Ready(unsafe { dev.eager_write(peer, slot, idx_of(seq), tag, src, len) })
}

/// Completes eager receive `seq` into `dst` once the message is in its slot; it must carry
/// exactly `len` bytes and tag `tag`. Then returns the slot to the sender (credit).
///
/// # Safety
/// `dst` must be valid for `len` writes.
pub unsafe fn poll_recv(
    dev: &dyn RmaDevice,
    peer: usize,
    seq: u32,
    dst: *mut u8,
    len: usize,
    tag: u32,
) -> Poll<Result<()>> {
    let slot = slot_of(dev, seq);
    let idx = idx_of(seq);
    let Some(h) = dev.eager_peek(peer, slot, idx) else {
        // The sender took the rendezvous variant: it either refused our clear-to-send (size
        // mismatch, flagged immediate) or, impossible with equal lengths, wrote data.
        return match dev.poll_imm(peer, slot, idx) {
            None => Poll::Pending,
            Some((imm, _)) if imm & IMM_ERROR != 0 => Poll::Ready(Err(Error::Remote(format!(
                "{} failed the transfer (it reported a mismatch or an error)",
                dev.peer_desc(peer)
            )))),
            Some((_, got)) => Poll::Ready(Err(len_mismatch(dev, peer, got, len))),
        };
    };
    if h.tag != tag {
        return Poll::Ready(Err(op_mismatch(dev, peer, h.tag, tag)));
    }
    if h.len != len {
        return Poll::Ready(Err(len_mismatch(dev, peer, h.len as u64, len)));
    }
    // SAFETY: the slot holds `len` bytes and stays ours until the credit below; `dst` is valid
    // by the caller's contract.
    unsafe { dev.eager_read(peer, slot, dst, len) };
    Poll::Ready(dev.post_credit(peer, slot, seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol;
    use crate::protocol::tests::ready;
    use crate::testdev::PairDevice;

    #[test]
    fn sender_goes_before_the_receiver_posts() {
        let (a, b) = PairDevice::pair(4, 64);
        let credits = Credits::new(4);
        assert!(is_eager(&a, 0) && is_eager(&a, a.eager_max()) && !is_eager(&a, a.eager_max() + 1));
        let src: Vec<u8> = (1..=40).collect();
        // SAFETY: src is valid.
        ready(unsafe { try_send(&a, &credits, 1, 0, src.as_ptr(), 40, 9) }).unwrap();
        let mut dst = vec![0u8; 40];
        ready(post_recv(&b, 0, 0, true, 40, 9)).unwrap();
        // SAFETY: dst is valid.
        ready(unsafe { poll_recv(&b, 0, 0, dst.as_mut_ptr(), 40, 9) }).unwrap();
        assert_eq!(dst, src);
    }

    #[test]
    fn credits_bound_the_sender_and_wrap() {
        let (a, b) = PairDevice::pair(4, 64);
        let credits = Credits::new(4);
        let mut received = 0u32;
        for seq in 0..23u32 {
            let data = [seq as u8; 3];
            // SAFETY: data is valid.
            let mut sent = unsafe { try_send(&a, &credits, 1, seq, data.as_ptr(), 3, 1) };
            if seq >= received + 4 {
                // Four messages in flight: slot `seq % 4` is still the receiver's.
                assert!(sent.is_pending());
                let mut dst = [0u8; 3];
                ready(post_recv(&b, 0, received, true, 3, 1)).unwrap();
                // SAFETY: dst is valid.
                ready(unsafe { poll_recv(&b, 0, received, dst.as_mut_ptr(), 3, 1) }).unwrap();
                assert_eq!(dst, [received as u8; 3]);
                received += 1;
                // SAFETY: data is valid.
                sent = unsafe { try_send(&a, &credits, 1, seq, data.as_ptr(), 3, 1) };
            }
            ready(sent).unwrap();
        }
        while received < 23 {
            let mut dst = [0u8; 3];
            // SAFETY: dst is valid.
            ready(unsafe { poll_recv(&b, 0, received, dst.as_mut_ptr(), 3, 1) }).unwrap();
            assert_eq!(dst, [received as u8; 3]);
            received += 1;
        }
    }

    #[test]
    fn rendezvous_receives_free_eager_slots_too() {
        let (a, b) = PairDevice::pair(2, 4096);
        let credits = Credits::new(2);
        let big = [7u8; 100];
        for seq in 0..2u32 {
            let dst = b.window_ptr(0);
            ready(protocol::post_recv(&b, 0, seq, true, dst, 100, 1)).unwrap();
            // SAFETY: big is valid.
            ready(unsafe { protocol::try_send(&a, 1, seq, big.as_ptr(), 100, 1) }).unwrap();
            ready(protocol::poll_recv(&b, 0, seq, 100)).unwrap();
        }
        let small = [5u8; 8];
        // SAFETY: small is valid.
        ready(unsafe { try_send(&a, &credits, 1, 2, small.as_ptr(), 8, 1) }).unwrap();
    }

    #[test]
    fn tag_and_length_mismatches_fail() {
        let (a, b) = PairDevice::pair(4, 4096);
        let credits = Credits::new(4);
        let data = [0u8; 16];
        let mut dst = [0u8; 16];
        // SAFETY (all blocks below): data and dst are valid for 16 bytes.
        ready(unsafe { try_send(&a, &credits, 1, 0, data.as_ptr(), 16, 2) }).unwrap();
        ready(post_recv(&b, 0, 0, true, 16, 1)).unwrap();
        let e = ready(unsafe { poll_recv(&b, 0, 0, dst.as_mut_ptr(), 16, 1) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("mismatch")),
            "{e}"
        );
        ready(unsafe { try_send(&a, &credits, 1, 1, data.as_ptr(), 8, 1) }).unwrap();
        ready(post_recv(&b, 0, 1, true, 16, 1)).unwrap();
        let e = ready(unsafe { poll_recv(&b, 0, 1, dst.as_mut_ptr(), 16, 1) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("expected 16")),
            "{e}"
        );
    }

    #[test]
    fn a_large_send_against_a_small_receive_fails_both_sides() {
        let (a, b) = PairDevice::pair(4, 4096);
        let big = [1u8; 200];
        let mut dst = [0u8; 8];
        ready(post_recv(&b, 0, 0, true, 8, 1)).unwrap();
        // SAFETY: big is valid.
        let e = ready(unsafe { protocol::try_send(&a, 1, 0, big.as_ptr(), 200, 1) }).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("expects 8")),
            "{e}"
        );
        // SAFETY: dst is valid.
        let e = ready(unsafe { poll_recv(&b, 0, 0, dst.as_mut_ptr(), 8, 1) }).unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
    }

    #[test]
    fn a_small_send_against_a_large_receive_fails_the_receiver() {
        let (a, b) = PairDevice::pair(4, 4096);
        let credits = Credits::new(4);
        let dst = b.window_ptr(0);
        ready(protocol::post_recv(&b, 0, 0, true, dst, 200, 1)).unwrap();
        let small = [1u8; 8];
        // SAFETY: small is valid.
        ready(unsafe { try_send(&a, &credits, 1, 0, small.as_ptr(), 8, 1) }).unwrap();
        let e = ready(protocol::poll_recv(&b, 0, 0, 200)).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("expected 200")),
            "{e}"
        );
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::device::EagerHeader;

    /// Eager slots and credit words of one direction (A sends to B), depth 1, 4-byte payloads:
    /// just what [`try_send`], [`post_recv`] and [`poll_recv`] touch, over loom's atomics and
    /// cells, so the model checks the real functions' orderings.
    struct Dir {
        idx: AtomicU32,
        tag: AtomicU32,
        len: AtomicU32,
        payload: UnsafeCell<[u8; 4]>,
        credit: AtomicU32,
    }

    struct Dev {
        me: usize,
        dir: loom::sync::Arc<Dir>,
    }

    // SAFETY: the payload cell is accessed only under the protocol the model checks.
    unsafe impl Sync for Dev {}
    // SAFETY: as above.
    unsafe impl Send for Dev {}

    impl RmaDevice for Dev {
        fn expose(&self, _: *mut u8, _: usize) -> Option<(u32, u64)> {
            None
        }
        fn exposes_user_memory(&self) -> bool {
            false
        }
        fn post_cts(&self, _: usize, _: usize, _: &CtsEntry) -> Result<()> {
            Ok(())
        }
        fn poll_cts(&self, _: usize, _: usize, _: u32) -> Option<CtsEntry> {
            None
        }
        unsafe fn write(&self, _: usize, _: *const u8, _: usize, _: u32, _: u64) -> Result<()> {
            unreachable!("no rendezvous messages in the model")
        }
        unsafe fn read(
            &self,
            _: usize,
            _: *mut u8,
            _: usize,
            _: u32,
            _: u64,
            _: ampccl_runtime::task::CopyTo,
        ) -> Result<()> {
            unreachable!("no rendezvous messages in the model")
        }
        fn write_imm(&self, _: usize, _: usize, _: u32, _: u64) -> Result<()> {
            unreachable!("no rendezvous messages in the model")
        }
        fn poll_imm(&self, _: usize, _: usize, _: u32) -> Option<(u32, u64)> {
            None
        }
        fn eager_max(&self) -> usize {
            4
        }
        unsafe fn eager_write(
            &self,
            _: usize,
            _: usize,
            idx: u32,
            tag: u32,
            src: *const u8,
            len: usize,
        ) -> Result<()> {
            assert_eq!(self.me, 0);
            // SAFETY: src holds len <= 4 bytes (model contract).
            self.dir
                .payload
                .with_mut(|p| unsafe { std::ptr::copy_nonoverlapping(src, p.cast::<u8>(), len) });
            self.dir.tag.store(tag, Ordering::Relaxed);
            self.dir.len.store(len as u32, Ordering::Relaxed);
            self.dir.idx.store(idx, Ordering::Release);
            Ok(())
        }
        fn eager_peek(&self, _: usize, _: usize, idx: u32) -> Option<EagerHeader> {
            (self.dir.idx.load(Ordering::Acquire) == idx).then(|| EagerHeader {
                tag: self.dir.tag.load(Ordering::Relaxed),
                len: self.dir.len.load(Ordering::Relaxed) as usize,
            })
        }
        unsafe fn eager_read(&self, _: usize, _: usize, dst: *mut u8, len: usize) {
            assert_eq!(self.me, 1);
            // SAFETY: dst holds len bytes (model contract).
            self.dir
                .payload
                .with(|p| unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), dst, len) });
        }
        fn post_credit(&self, _: usize, _: usize, seq: u32) -> Result<()> {
            self.dir
                .credit
                .store(seq.wrapping_add(1), Ordering::Release);
            Ok(())
        }
        fn credit(&self, _: usize, _: usize) -> u32 {
            self.dir.credit.load(Ordering::Acquire)
        }
        crate::testdev::model_shape!();
    }

    /// Three messages through one slot: the sender reuses it only after the receiver's credit,
    /// so the receiver reads every payload whole (loom's cell reports any overlap of the
    /// sender's write with the receiver's read) and in order.
    #[test]
    fn credits_hand_the_slot_back_before_it_is_rewritten() {
        loom::model(|| {
            let dir = loom::sync::Arc::new(Dir {
                idx: AtomicU32::new(0),
                tag: AtomicU32::new(0),
                len: AtomicU32::new(0),
                payload: UnsafeCell::new([0; 4]),
                credit: AtomicU32::new(0),
            });
            let (a, b) = (
                Dev {
                    me: 0,
                    dir: dir.clone(),
                },
                Dev { me: 1, dir },
            );
            let sender = loom::thread::spawn(move || {
                let credits = Credits::new(1);
                for seq in 0..3u32 {
                    let data = [seq as u8 + 1; 4];
                    // SAFETY: data is valid for 4 bytes.
                    while unsafe { try_send(&a, &credits, 1, seq, data.as_ptr(), 4, 7) }
                        .is_pending()
                    {
                        loom::thread::yield_now();
                    }
                }
            });
            for seq in 0..3u32 {
                assert!(post_recv(&b, 0, seq, true, 4, 7).is_ready());
                let mut got = [0u8; 4];
                loop {
                    // SAFETY: got is valid for 4 bytes.
                    match unsafe { poll_recv(&b, 0, seq, got.as_mut_ptr(), 4, 7) } {
                        Poll::Ready(r) => break r.unwrap(),
                        Poll::Pending => loom::thread::yield_now(),
                    }
                }
                assert_eq!(got, [seq as u8 + 1; 4]);
            }
            sender.join().unwrap();
        });
    }
}
