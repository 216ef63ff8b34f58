//! The messages the `ofi` provider sends: built in a pool of registered buffers, each sent
//! under its own context and kept for the next message once its send completed (a message
//! costs no allocation), and batched: messages nobody waits for yet (credits, an eager
//! receive's clear-to-send) are deferred per peer and ride with the next message to that peer
//! as one [`wire::Kind::Batch`], or leave on their own once they waited
//! [`crate::hold::HOLD`] or filled [`wire::DEFER_MAX`].

use super::fabric::Mr;
use super::op::{Op, What};
use super::state::State;
use super::sys::{self, Context2};
use super::wire::{self, Header, Kind};

/// Most message buffers kept for reuse.
const SEND_POOL: usize = 64;

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
    /// completion data holds it; the deferred messages then wait for the next carrier.
    pub fn send(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
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
            p.held.clear();
        }
        self.post_send(peer, b, None)
    }

    /// Defers `h` with `payload` to `peer` (see [`super::peer::PeerState`]'s `deferred`).
    pub fn defer(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        if self.peer(peer).deferred.len() + wire::batched_len(payload.len()) > wire::DEFER_MAX {
            self.flush_peer(peer)?;
        }
        let rank = self.rank;
        let p = self.peer(peer);
        wire::push_batch(&mut p.deferred, h, rank, payload);
        p.held.note();
        Ok(())
    }

    /// Sends what is deferred to `peer`, as one message (the deferral's buffer stays).
    fn flush_peer(&mut self, peer: usize) -> Result<(), String> {
        let rank = self.rank;
        let p = self.peer(peer);
        p.held.clear();
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

    /// Sends what is deferred to every peer (`all`), or to those whose oldest deferred
    /// message has waited [`crate::hold::HOLD`], with the clear-to-send entries of eager
    /// receives that are due ([`super::quiet::Quiet::due`]). A peer that is gone needs none
    /// of it.
    pub fn flush(&mut self, all: bool) {
        for peer in 0..self.peers.len() {
            let Some(p) = self.peers[peer].as_mut() else {
                continue;
            };
            let quiet = p.quiet.due(all);
            let due = !quiet.is_empty() || (!p.deferred.is_empty() && (all || p.held.due()));
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
