//! The messages the `ofi` provider sends: built in a pool of registered buffers, each sent
//! under its own context and kept for the next message once its send completed (a message
//! costs no allocation), and batched: messages nobody waits for yet (credits, an eager
//! receive's clear-to-send) are deferred per peer and ride with the next message to that peer
//! as one [`wire::Kind::Batch`], or leave on their own once they filled [`wire::DEFER_MAX`],
//! or from the engine's idle steps ([`State::flush`]).

use super::fabric::Mr;
use super::op::{Op, What};
use super::state::State;
use super::sys::{self, Context2};
use super::wire::{self, Header, Kind};

/// Most message buffers kept for reuse.
const SEND_POOL: usize = 64;

/// Credits held for a peer that leave on their own at the engine's next idle step (fewer for
/// a FIFO of less than twice as many slots): one message of credits per this many received
/// where none rides on a message back. docs/TUNING.md ("Fixed constants") has the measurement.
const CREDIT_BATCH: usize = 16;

/// A message buffer ([`wire::msg_max`] bytes of capacity, registered where the provider asks)
/// with a context to send it under: kept for the next message once its send completed, so a
/// message costs no allocation.
pub(super) struct SendBuf {
    pub ctx: Box<Context2>,
    pub buf: Vec<u8>,
    pub mr: Option<Mr>,
}

impl State {
    /// A buffer for a message of `len` bytes: one of the pool, or a new one.
    pub(super) fn send_buf(&mut self, len: usize) -> Result<SendBuf, String> {
        let msg_max = wire::msg_max(self.eager_max);
        if len > msg_max {
            return Err(format!("a message of {len} bytes (at most {msg_max})"));
        }
        if let Some(mut b) = self.send_pool.pop() {
            b.buf.clear();
            return Ok(b);
        }
        // Never grown past its capacity (`len` is checked above), so a registration of the
        // capacity covers every message built in it.
        let buf = Vec::with_capacity(msg_max);
        let mr = self.local(buf.as_ptr(), msg_max, sys::FI_SEND)?;
        Ok(SendBuf {
            ctx: Box::default(),
            buf,
            mr,
        })
    }

    /// Keeps a buffer whose send completed for the next message.
    pub(super) fn recycle(&mut self, b: SendBuf) {
        if self.send_pool.len() < SEND_POOL {
            self.send_pool.push(b);
        }
    }

    /// Posts the message built in `b` to `peer`, with remote completion `data` if any.
    fn post_send(&mut self, peer: usize, b: SendBuf, data: Option<u64>) -> Result<(), String> {
        let SendBuf { ctx, buf, mr } = b;
        let what = What::Send {
            peer,
            buf,
            mr,
            data,
        };
        self.post_op(Op { ctx, what }).map(drop)
    }

    /// Sends `h` with `payload` to `peer`, in one batch with the messages deferred to it when
    /// they fit together within the provider's message limit (always, from
    /// [`wire::msg_max`]'s receives, where the provider takes any size). An eager message
    /// that does not fit the limit with its header goes as a [`wire::Compact`] one where the
    /// completion data holds it; the deferred messages then wait for the next carrier. An
    /// eager message counts as uncredited once it went (`PeerState::uncredited`).
    pub fn send(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        self.send_message(peer, h, payload)?;
        if h.kind == Kind::Eager {
            self.peer(peer).uncredited += 1;
        }
        Ok(())
    }

    /// [`State::send`] without the count.
    fn send_message(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        if h.kind == Kind::Eager
            && wire::HEADER + payload.len() > self.msg_limit
            && self.ep.caps.cq_data >= wire::Compact::BYTES
        {
            let c = wire::Compact {
                tag: h.b,
                slot: h.slot,
                from: self.rank as u32,
            };
            let mut b = self.send_buf(payload.len())?;
            b.buf.extend_from_slice(payload);
            return self.post_send(peer, b, Some(c.encode()));
        }
        let rank = self.rank;
        let batch_max = wire::msg_max(self.eager_max).min(self.msg_limit) - wire::HEADER;
        let deferred = self.peer(peer).deferred.len();
        if deferred > 0 && deferred + wire::batched_len(payload.len()) > batch_max {
            self.flush_peer(peer)?;
        }
        let len = match self.peer(peer).deferred.len() {
            0 => wire::HEADER + payload.len(),
            d => wire::HEADER + d + wire::batched_len(payload.len()),
        };
        let mut b = self.send_buf(len)?;
        let p = self.peer(peer);
        if p.deferred.is_empty() {
            h.encode_into(&mut b.buf, rank, payload);
        } else {
            wire::batch_into(&mut b.buf, rank, &p.deferred, Some((h, payload)));
            p.deferred.clear();
            p.credits_held = 0;
        }
        self.post_send(peer, b, None)
    }

    /// Defers `h` with `payload` to `peer` (see [`super::peer::PeerState`]'s `deferred`).
    pub fn defer(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        if self.peer(peer).deferred.len() + wire::batched_len(payload.len()) > wire::DEFER_MAX {
            self.flush_peer(peer)?;
        }
        let rank = self.rank;
        wire::push_batch(&mut self.peer(peer).deferred, h, rank, payload);
        Ok(())
    }

    /// Defers the credit `h` to `peer`: it rides with the next message there, or leaves
    /// from an idle step of the engine once [`CREDIT_BATCH`] credits wait, or before the
    /// driver sleeps ([`State::flush`]).
    pub fn defer_credit(&mut self, peer: usize, h: &Header) -> Result<(), String> {
        self.defer(peer, h, &[])?;
        self.peer(peer).credits_held += 1;
        Ok(())
    }

    /// Sends what is deferred to `peer`, as one message (the deferral's buffer stays).
    fn flush_peer(&mut self, peer: usize) -> Result<(), String> {
        let rank = self.rank;
        let p = self.peer(peer);
        p.credits_held = 0;
        if p.deferred.is_empty() {
            return Ok(());
        }
        let len = wire::HEADER + p.deferred.len();
        let mut b = self.send_buf(len)?;
        let p = self.peer(peer);
        wire::batch_into(&mut b.buf, rank, &p.deferred, None);
        p.deferred.clear();
        self.post_send(peer, b, None)
    }

    /// Sends the clear-to-send entries of eager receives that are due
    /// ([`super::quiet::Quiet::due`]) and a peer's credits once [`CREDIT_BATCH`] wait, each
    /// with what else is deferred to that peer; with `all` (the driver is about to sleep),
    /// what is deferred to every peer. A peer that is gone needs none of it.
    ///
    /// Credits wait for a count, not a clock: timing them out after [`crate::hold::HOLD`], as
    /// the TCP provider does, sent one more message per hold where no message carries them
    /// back, as where every message is [`wire::Compact`] (16 KiB ping-pong over `ofi_rxm`).
    /// Holding fewer than half a FIFO leaves the peer at least half its eager slots: its
    /// sends wait for a credit only while this rank does not receive what it already sent,
    /// and a rank that waits for anything runs idle steps.
    pub fn flush(&mut self, all: bool) {
        let batch = CREDIT_BATCH.min(self.depth / 2).max(1);
        for peer in 0..self.peers.len() {
            let Some(p) = self.peers[peer].as_mut() else {
                continue;
            };
            let quiet = p.quiet.due(all);
            let due =
                !quiet.is_empty() || (!p.deferred.is_empty() && (all || p.credits_held >= batch));
            for e in &quiet {
                let (h, payload) = wire::cts_message(e, false, 0);
                let _ = self.defer(peer, &h, &payload);
            }
            if due {
                let _ = self.flush_peer(peer);
            }
        }
    }
}
