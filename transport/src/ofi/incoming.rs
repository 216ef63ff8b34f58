//! The messages and writes the `ofi` provider receives: a completed receive's message is
//! decoded and checked ([`super::wire`]) before it touches a peer's state, then delivered
//! (each message of a batch in turn) into that peer's FIFO entries, completion slots, eager
//! slots, credits and failure note ([`super::peer`]); a write's completion data must name a
//! slot whose region is open. A peer whose traffic is wrong is cut off with a message naming
//! what was wrong; a message that names no peer of ours is dropped.
//!
//! An eager payload from [`KEEP_MIN`] bytes waits in the receive buffer it arrived in (a
//! spare buffer is posted in its place, or it is copied out where none can be registered); a
//! smaller one is copied out, so the buffer is posted again at once.

use super::peer::{Payload, PeerCts, RecvBuf};
use super::state::State;
use super::sys::{self, Context2};
use super::wire::{self, Header, Kind};
use crate::device::CtsEntry;
use std::ops::Range;

/// Most spare receive buffers (and buffers for small payloads) kept for reuse (more are
/// freed): as many as eager messages usually wait at once, across all peers.
const SPARE_RECVS: usize = 64;
/// Smallest eager payload that waits in the receive buffer it arrived in (a quarter of the
/// largest: a waiting message holds at most four times its size); smaller ones are copied
/// out, which costs less than half a microsecond below it.
pub const KEEP_MIN: usize = 8 << 10;

impl State {
    /// Hands the eager payload at `range` of receive buffer `buf` to `peer`'s `slot` and posts
    /// a receive under `ctx` in its place: a spare buffer (a new one when none is left), the
    /// payload staying where it arrived; where no spare can be had (its registration failed),
    /// the payload is copied out and `buf` itself is posted again, so the number of posted
    /// receives never shrinks.
    pub(super) fn keep(
        &mut self,
        (peer, slot): (usize, usize),
        ctx: Box<Context2>,
        RecvBuf { buf, mr }: RecvBuf,
        range: Range<usize>,
    ) {
        let spare = match self.spare_recvs.pop() {
            Some(b) => Ok(b),
            None => {
                let buf = vec![0u8; wire::msg_max(self.eager_max)].into_boxed_slice();
                self.local(buf.as_ptr(), buf.len(), sys::FI_RECV)
                    .map(|mr| RecvBuf { buf, mr })
            }
        };
        let payload = match spare {
            Ok(spare) => {
                self.repost(ctx, spare.buf, spare.mr);
                Payload::Kept(RecvBuf { buf, mr }, range)
            }
            Err(why) => {
                tracing::warn!("ofi: cannot register a receive buffer, copying instead: {why}");
                let copy = self.copied(&buf[range]);
                self.repost(ctx, buf, mr);
                copy
            }
        };
        self.peer(peer).eager[slot].payload = Some(payload);
    }

    /// A peer's data write landed in our memory: count it for its slot. One naming a slot
    /// without a region is a protocol violation, unless we closed the regions after a failure
    /// (or cut the peer off): then it landed before and is read only now, and nothing waits
    /// for it.
    pub(super) fn landed(&mut self, data: u64) {
        let (rank, slot) = wire::parse_write_data(data);
        let Some(Some(p)) = self.peers.get_mut(rank) else {
            tracing::warn!("ofi: a write naming rank {rank}, not a peer");
            return;
        };
        match p.regions.get(slot) {
            Some(Some(_)) => p.write_landed(slot),
            Some(None) if self.revoked || p.dead.is_some() => {}
            _ => {
                let why = format!("protocol violation: a write for slot {slot}, which is not open");
                self.cut_off(rank, why);
            }
        }
    }

    /// Cuts `peer` off for what it sent: tells it first (best effort), so that its own waits
    /// end at once with the reason instead of at their timeout, then marks it dead.
    fn cut_off(&mut self, peer: usize, why: String) {
        let text = format!("rank {} cut it off: {why}", self.rank);
        let text = &text.as_bytes()[..text.len().min(wire::MAX_TEXT)];
        let _ = self.send(peer, &Header::new(Kind::Fail, 0, 0, 0, 0), text);
        self.peer(peer).kill(why);
    }

    /// Checks and applies a received message: a peer whose message is wrong is cut off (one
    /// that does not decode is blamed on the rank its header names); one that names no peer
    /// of ours is dropped (nobody to blame for it).
    pub(super) fn receive(&mut self, msg: &[u8]) {
        let decoded = wire::decode(msg, self.depth, self.eager_max);
        let from = match &decoded {
            Ok((h, _)) => Some(h.from),
            Err(_) => wire::sender_of(msg),
        };
        let Some(peer) = from
            .map(|r| r as usize)
            .filter(|&r| self.peers.get(r).is_some_and(Option::is_some))
        else {
            tracing::warn!("ofi: dropped a message of {} bytes from no peer", msg.len());
            return;
        };
        let r = match decoded {
            Ok((h, payload)) => self.receive_from(peer, &h, payload),
            Err(why) => Err(format!("sent {why}")),
        };
        if let Err(why) = r {
            self.cut_off(peer, why);
        }
    }

    /// Checks and applies a received [`wire::Compact`] eager message: the payload `msg` with
    /// its header in the completion `data`. A peer whose message is wrong is cut off; one that
    /// names no peer of ours is dropped.
    pub(super) fn receive_compact(&mut self, msg: &[u8], data: u64) {
        let c = wire::Compact::decode(data);
        let from = c.from as usize;
        if !self.peers.get(from).is_some_and(Option::is_some) {
            tracing::warn!(
                "ofi: dropped a compact message of {} bytes from no peer",
                msg.len()
            );
            return;
        }
        let r = c.check(self.depth).and_then(|()| {
            if msg.len() > self.eager_max {
                return Err(format!(
                    "a compact eager message of {} bytes (at most {})",
                    msg.len(),
                    self.eager_max
                ));
            }
            self.store_eager(from, c.slot as usize, None, c.tag, msg)
        });
        if let Err(why) = r {
            self.cut_off(from, format!("protocol violation: {why}"));
        }
    }

    /// Applies message `h` with `payload` from `peer` (each message of a batch in turn); what
    /// is wrong with it.
    fn receive_from(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        if h.kind != Kind::Batch {
            return self
                .deliver(peer, h, payload)
                .map_err(|w| format!("protocol violation: {w}"));
        }
        for inner in wire::split_batch(payload) {
            let inner = inner.map_err(|w| format!("sent {w}"))?;
            let (h, payload) =
                wire::decode(inner, self.depth, self.eager_max).map_err(|w| format!("sent {w}"))?;
            if h.from as usize != peer {
                return Err(format!("sent a batch naming rank {} inside", h.from));
            }
            self.deliver(peer, &h, payload)
                .map_err(|w| format!("protocol violation: {w}"))?;
        }
        Ok(())
    }

    /// Fills eager slot `slot` of `peer` with message `idx` (the slot's next where none) of
    /// `tag`: a `payload` from [`KEEP_MIN`] stays in the receive's buffer ([`State::kept`]),
    /// a smaller one is copied out. A receive carries at most one eager message (a batch
    /// holds credits and clear-to-send entries, and one more message).
    fn store_eager(
        &mut self,
        peer: usize,
        slot: usize,
        idx: Option<u32>,
        tag: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        if self.peer(peer).eager[slot].full {
            return Err(format!("an eager message into the full slot {slot}"));
        }
        // A kept payload is handed to the slot once the receive is applied (`apply`).
        let copied = if payload.len() >= KEEP_MIN {
            if self.kept.is_some() {
                return Err("two eager messages in one batch".into());
            }
            self.kept = Some((peer, slot, payload.as_ptr() as usize, payload.len()));
            None
        } else {
            Some(self.copied(payload))
        };
        let p = self.peer(peer);
        p.quiet.arrived(slot as u32, idx);
        let s = &mut p.eager[slot];
        (s.idx, s.tag, s.full, s.payload) = (idx, tag, true, copied);
        Ok(())
    }

    /// `payload` copied into a buffer of its own (a pooled one where there is).
    fn copied(&mut self, payload: &[u8]) -> Payload {
        let mut v = self.spare_copies.pop().unwrap_or_default();
        v.extend_from_slice(payload);
        Payload::Copied(v)
    }

    /// Empties eager slot `slot` of `peer` (its receiver has the message), keeping the
    /// buffer as a spare while there are few.
    pub fn release_eager(&mut self, peer: usize, slot: usize) {
        self.peer(peer).eager_taken(slot);
        let s = &mut self.peer(peer).eager[slot];
        s.full = false;
        match s.payload.take() {
            Some(Payload::Kept(b, _)) if self.spare_recvs.len() < SPARE_RECVS => {
                self.spare_recvs.push(b);
            }
            Some(Payload::Copied(mut v)) if self.spare_copies.len() < SPARE_RECVS => {
                v.clear();
                self.spare_copies.push(v);
            }
            _ => {}
        }
    }

    /// Applies a decoded message from `peer`.
    fn deliver(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        let p = self.peer(peer);
        let slot = h.slot as usize;
        match h.kind {
            Kind::Cts => {
                if h.a & !wire::CTS_WRITES_COMPLETE != 0 {
                    return Err(format!("a clear-to-send with unknown flags {:#x}", h.a));
                }
                let entry = CtsEntry {
                    key: h.slot,
                    ..wire::decode_cts(payload)
                };
                p.cts[slot] = PeerCts {
                    entry,
                    rkey: h.value,
                    writes_complete: h.a & wire::CTS_WRITES_COMPLETE != 0,
                };
            }
            Kind::Imm => p.immediate(slot, (h.a, h.b, h.value))?,
            Kind::Eager => return self.store_eager(peer, slot, Some(h.a), h.b, payload),
            Kind::Credit => {
                p.credits[slot] = h.a;
                // One credit per eager message (more only from a broken peer).
                p.uncredited = p.uncredited.saturating_sub(1);
            }
            Kind::Ack => p.acks = p.acks.wrapping_add(1),
            Kind::Fail => {
                p.failed
                    .get_or_insert_with(|| String::from_utf8_lossy(payload).into_owned());
            }
            Kind::Ping | Kind::Batch => {}
        }
        Ok(())
    }
}
