//! What the `ofi` provider knows of one peer ([`PeerState`]): the mirror of the shared-memory
//! segment the protocol polls (the peer's clear-to-send entries, completion slots, eager
//! slots, credits, acks), filled in by completions ([`super::state`]), and our side of the
//! link (its rails, the regions our clear-to-send entries opened, writes in flight, messages
//! held back, whether it is dead).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::fabric::Mr;
use super::quiet::Quiet;
use super::sys::FiAddr;
use crate::device::CtsEntry;

/// A clear-to-send entry the peer posted, as its message carried it.
#[derive(Clone, Copy, Default)]
pub struct PeerCts {
    pub entry: CtsEntry,
    /// The memory key of the region the entry names (0: none).
    pub rkey: u64,
    /// The transfer's writes complete it by themselves: we send no immediate for it unless
    /// it fails ([`super::wire::CTS_WRITES_COMPLETE`]).
    pub writes_complete: bool,
}

/// A completion slot: the published immediate and length, and the transfer in progress (its
/// immediate message, the data writes counted so far, and what a transfer whose writes
/// complete it publishes once they have all landed).
#[derive(Default)]
pub struct ImmSlot {
    pub imm: u32,
    pub len: u64,
    /// `(imm, writes, len)` of an immediate whose writes have not all landed yet.
    waiting: Option<(u32, u32, u64)>,
    /// `(imm, writes, len)` the open clear-to-send's transfer publishes once its `writes`
    /// data writes have landed, without an immediate message ([`PeerState::opened`]).
    expected: Option<(u32, u32, u64)>,
    /// Data writes counted since the last published immediate.
    landed: u32,
    /// A clear-to-send for this slot went out and no immediate was published since: only
    /// then may the peer's immediate arrive.
    open: bool,
}

/// A region one of our clear-to-send entries opened to a peer: its registration and, for a
/// transfer cut into more than one stripe, a count held while it is open (the peer's stripes
/// beyond the first come over the other rails, whose completion queue the device then reads:
/// [`super::state::State::progress`]).
pub struct Region {
    /// Held for their drops: the registration closes, the count drops.
    _mr: Mr,
    _striped: Option<Striped>,
}

impl Region {
    pub fn new(mr: Mr, striped: Option<Striped>) -> Region {
        Region {
            _mr: mr,
            _striped: striped,
        }
    }
}

/// One open region counted in a shared count of regions reached over more than rail 0: the
/// count drops with it, whichever way the region closes (its transfer completes, a failure
/// revokes it).
pub struct Striped(Arc<AtomicUsize>);

impl Striped {
    pub fn new(count: &Arc<AtomicUsize>) -> Striped {
        count.fetch_add(1, Ordering::Relaxed);
        Striped(count.clone())
    }
}

impl Drop for Striped {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A receive buffer with its registration (where the provider asks for one).
pub struct RecvBuf {
    pub buf: Box<[u8]>,
    pub mr: Option<Mr>,
}

/// Where an eager message's payload waits for its receiver.
pub enum Payload {
    /// In the receive buffer it arrived in, at the range: the buffer stays with the slot
    /// until the receiver has the message (a spare one is posted in its place), so the
    /// message is copied once on this side, into the receiver's memory.
    Kept(RecvBuf, Range<usize>),
    /// Copied into a buffer of its own size: a small payload would otherwise hold a whole
    /// receive buffer while it waits.
    Copied(Vec<u8>),
}

/// An eager slot: message `idx` with `tag` and its payload while `full`. A peer costs only
/// the messages it has waiting, each at most about four times its size
/// ([`super::incoming::KEEP_MIN`]).
#[derive(Default)]
pub struct EagerSlot {
    /// The message's index; none for a [`super::wire::Compact`] message, which is the
    /// slot's next.
    pub idx: Option<u32>,
    pub tag: u32,
    pub full: bool,
    pub payload: Option<Payload>,
}

impl EagerSlot {
    /// The waiting message's payload (empty while the slot is).
    pub fn payload(&self) -> &[u8] {
        match &self.payload {
            Some(Payload::Kept(m, range)) => &m.buf[range.clone()],
            Some(Payload::Copied(v)) => v,
            None => &[],
        }
    }
}

/// What we know of one peer.
pub struct PeerState {
    /// The peer's rails in our address vector (its rail `r` for our rail `r`).
    pub addrs: Vec<FiAddr>,
    pub desc: String,
    /// Clear-to-send entries the peer posted, one per FIFO slot.
    pub cts: Vec<PeerCts>,
    pub imm: Vec<ImmSlot>,
    pub eager: Vec<EagerSlot>,
    pub credits: Vec<u32>,
    pub acks: u32,
    /// Our clear-to-send regions, by slot.
    pub regions: Vec<Option<Region>>,
    /// Our data writes per slot since its last immediate.
    pub writes: Vec<u32>,
    /// Our data writes per slot not completed yet: the send of that slot still reads its
    /// buffer ([`crate::device::RmaDevice::send_done`]).
    pub pending: Vec<u32>,
    /// The peer's failure message.
    pub failed: Option<String>,
    /// Why the peer is unreachable or was cut off.
    pub dead: Option<String>,
    /// Messages nobody waits for yet (credits; the clear-to-send entries of eager receives
    /// once due, see `quiet`), as a [`super::wire::Kind::Batch`] payload: they leave with the
    /// next message to the peer, or on their own ([`super::state::State::flush`]).
    pub deferred: Vec<u8>,
    /// Credits among `deferred`.
    pub credits_held: usize,
    /// Our eager messages to the peer it has not credited yet (consumed): closing waits for
    /// them ([`super::state::State::consumed`]).
    pub uncredited: u64,
    /// The clear-to-send entries of our eager receives whose message has not arrived: they
    /// leave only if it stays away ([`Quiet`]).
    pub quiet: Quiet,
    /// Our operations to the peer waiting in the backlog, and since when none has moved.
    pub backlogged: usize,
    pub stuck_since: Option<Instant>,
}

impl PeerState {
    pub fn new(addrs: Vec<FiAddr>, desc: String, depth: usize) -> PeerState {
        PeerState {
            addrs,
            desc,
            cts: vec![PeerCts::default(); depth],
            imm: (0..depth).map(|_| ImmSlot::default()).collect(),
            eager: (0..depth).map(|_| EagerSlot::default()).collect(),
            credits: vec![0; depth],
            acks: 0,
            regions: (0..depth).map(|_| None).collect(),
            writes: vec![0; depth],
            pending: vec![0; depth],
            failed: None,
            dead: None,
            deferred: Vec::new(),
            credits_held: 0,
            uncredited: 0,
            quiet: Quiet::default(),
            backlogged: 0,
            stuck_since: None,
        }
    }

    /// Marks the peer dead (the first reason sticks), and closes the regions our
    /// clear-to-send entries opened to it ([`PeerState::revoke`]).
    pub fn kill(&mut self, why: String) {
        if self.dead.is_none() {
            tracing::warn!("ofi: {}: {why}", self.desc);
            self.dead = Some(why);
        }
        self.revoke();
    }

    /// Closes every region our clear-to-send entries opened to the peer: once an operation
    /// of ours failed, its caller may free the memory as soon as it has the error, so nothing
    /// may write into it (or read it) any more. The provider refuses a later access with the
    /// closed key at the peer's side; a write that landed before and is read only now is
    /// dropped (`State::landed`).
    pub fn revoke(&mut self) {
        self.regions.iter_mut().for_each(|r| *r = None);
    }

    /// Our clear-to-send for slot `slot` is posted: the peer's immediate for it may come.
    /// Where it asked for the writes to complete the transfer, `expected` is the
    /// `(imm, writes, len)` that transfer publishes once that many writes have landed: each
    /// write names its slot, so the last one to land completes it, as a write with immediate
    /// data does on an RDMA NIC; the peer then sends an immediate only if the transfer fails.
    pub fn opened(&mut self, slot: usize, expected: Option<(u32, u32, u64)>) {
        let s = &mut self.imm[slot];
        (s.open, s.expected) = (true, expected);
    }

    /// Slot `slot`'s eager message reached its receiver: no immediate comes for it.
    pub fn eager_taken(&mut self, slot: usize) {
        let s = &mut self.imm[slot];
        (s.open, s.expected) = (false, None);
    }

    /// One of the peer's data writes into slot `slot`'s open region landed: the last of a
    /// transfer whose writes complete it publishes it, unless an immediate named its own
    /// count first.
    pub fn write_landed(&mut self, slot: usize) {
        let s = &mut self.imm[slot];
        s.landed += 1;
        if s.waiting.is_none()
            && let Some(e) = s.expected
            && s.landed >= e.1
        {
            s.waiting = Some(e);
        }
        self.complete(slot);
    }

    /// The peer's immediate `(imm, writes, len)` for slot `slot` arrived: published once its
    /// `writes` data writes have landed (before or after it). One for a slot with no
    /// clear-to-send open (a second one, or one nobody asked for), or one naming fewer writes
    /// than already landed, breaks the protocol.
    pub fn immediate(&mut self, slot: usize, imm: (u32, u32, u64)) -> Result<(), String> {
        let s = &self.imm[slot];
        if !s.open || s.waiting.is_some() {
            return Err(format!(
                "an immediate for slot {slot}, which awaits none (no clear-to-send open)"
            ));
        }
        if s.landed > imm.1 {
            return Err(format!(
                "{} writes into slot {slot} for an immediate of {}",
                s.landed, imm.1
            ));
        }
        self.imm[slot].waiting = Some(imm);
        self.complete(slot);
        Ok(())
    }

    /// Publishes slot `slot`'s immediate once all its writes have landed, and closes the
    /// region the transfer wrote.
    fn complete(&mut self, slot: usize) {
        let s = &mut self.imm[slot];
        if let Some((imm, writes, len)) = s.waiting
            && s.landed >= writes
        {
            s.landed -= writes;
            (s.waiting, s.open, s.expected) = (None, false, None);
            (s.imm, s.len) = (imm, len);
            self.regions[slot] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count of striped regions follows their guards, however many and in whatever
    /// order they drop.
    #[test]
    fn striped_regions_count_while_open() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = Striped::new(&count);
        let b = Striped::new(&count);
        assert_eq!(count.load(Ordering::Relaxed), 2);
        drop(a);
        assert_eq!(count.load(Ordering::Relaxed), 1);
        let mut slots = [Some(b), Some(Striped::new(&count))];
        slots.iter_mut().for_each(|s| *s = None);
        assert_eq!(count.load(Ordering::Relaxed), 0, "a revoke drops them all");
    }

    fn peer() -> PeerState {
        PeerState::new(vec![0], "rank 1".into(), 4)
    }

    /// An immediate is published once the writes it names have landed, in either order, and
    /// only for a slot whose clear-to-send is open; surplus writes and immediates nobody asked
    /// for break the protocol instead of completing some later transfer early.
    #[test]
    fn immediates_need_an_open_slot_and_their_own_writes() {
        let mut p = peer();
        let e = p.immediate(0, (1, 0, 0)).unwrap_err();
        assert!(e.contains("awaits none"), "{e}");

        p.opened(1, None);
        p.write_landed(1);
        p.immediate(1, (2, 2, 100)).unwrap();
        assert_eq!(p.imm[1].imm, 0, "one write still in flight");
        p.write_landed(1);
        assert_eq!((p.imm[1].imm, p.imm[1].len), (2, 100));
        let e = p.immediate(1, (2, 0, 0)).unwrap_err();
        assert!(e.contains("awaits none"), "a second immediate: {e}");

        p.opened(2, None);
        p.write_landed(2);
        p.write_landed(2);
        let e = p.immediate(2, (3, 1, 8)).unwrap_err();
        assert!(e.contains("2 writes"), "{e}");

        p.opened(3, None);
        p.eager_taken(3);
        assert!(
            p.immediate(3, (4, 0, 0)).is_err(),
            "an eager receive awaits none"
        );
    }

    /// A transfer whose clear-to-send asked for its writes to complete it is published when
    /// its last write lands, without an immediate; an immediate after that breaks the
    /// protocol, one before it (a failed transfer) is published once the writes it names
    /// have landed.
    #[test]
    fn writes_complete_their_transfer_where_asked() {
        let mut p = peer();
        p.opened(1, Some((5, 2, 4096)));
        p.write_landed(1);
        assert_eq!(p.imm[1].imm, 0, "one write still in flight");
        p.write_landed(1);
        assert_eq!((p.imm[1].imm, p.imm[1].len), (5, 4096));
        let e = p.immediate(1, (5, 2, 4096)).unwrap_err();
        assert!(e.contains("awaits none"), "an immediate after it: {e}");

        // The next transfer in the slot counts its own writes.
        p.opened(1, Some((9, 1, 100)));
        p.write_landed(1);
        assert_eq!((p.imm[1].imm, p.imm[1].len), (9, 100));

        // A failed transfer: its error immediate names the one write that was posted.
        let failed = 6 | crate::device::IMM_ERROR;
        p.opened(2, Some((6, 3, 9000)));
        p.immediate(2, (failed, 1, 0)).unwrap();
        assert_eq!(p.imm[2].imm, 0, "its write has not landed");
        p.write_landed(2);
        assert_eq!(p.imm[2].imm, failed);
    }
}
