//! What the `ofi` provider keeps under its one lock: the endpoint, the operations posted to it
//! (each owning its libfabric context and buffer until its completion), and per peer the
//! state that completions deliver — the mirror of the shared-memory segment the protocol polls
//! (clear-to-send FIFO, completion slots, eager slots, credits, acks) — plus what validates
//! the peer's traffic: the registration each posted clear-to-send opened, which the transfer's
//! immediate closes again.
//!
//! [`State::progress`] reads the completion queue, which also drives the provider's progress:
//! with manual data progress, a peer's writes land in our memory only while we read our
//! queue. A message is decoded and checked ([`super::wire`]) before it touches the state; a
//! write completion must name a slot whose region is open. Anything else marks that peer dead
//! with a message naming it, which every wait on the peer then reports.

use std::collections::HashMap;
use std::ffi::c_void;

use super::fabric::{Endpoint, Mr};
use super::sys::{self, Context2, FiAddr};
use super::wire::{self, Header, Kind};
use crate::device::CtsEntry;

/// Receives kept posted per peer (a message beyond them waits in the provider's unexpected
/// queue, so the number only bounds the copies in flight).
pub const RECVS: usize = 32;

/// A completion slot: the published immediate and length, and the transfer in progress (its
/// immediate message, and the data writes counted so far).
#[derive(Default)]
pub struct ImmSlot {
    pub imm: u32,
    pub len: u64,
    /// `(imm, writes, len)` of an immediate whose writes have not all landed yet.
    waiting: Option<(u32, u32, u64)>,
    landed: u32,
}

/// An eager slot: message `idx` with `tag` and `len` payload bytes while `full`.
pub struct EagerSlot {
    pub idx: u32,
    pub tag: u32,
    pub len: usize,
    pub full: bool,
    pub data: Box<[u8]>,
}

/// What we know of one peer.
pub struct PeerState {
    pub addr: FiAddr,
    pub desc: String,
    /// Clear-to-send entries the peer posted, with the key of the region each names.
    pub cts: Vec<(CtsEntry, u64)>,
    pub imm: Vec<ImmSlot>,
    pub eager: Vec<EagerSlot>,
    pub credits: Vec<u32>,
    pub acks: u32,
    /// Registrations of our clear-to-send regions, by slot.
    pub regions: Vec<Option<Mr>>,
    /// Our data writes per slot since its last immediate.
    pub writes: Vec<u32>,
    /// Our writes and reads to the peer not completed yet.
    pub in_flight: usize,
    /// The peer's failure message.
    pub failed: Option<String>,
    /// Why the peer is unreachable or was cut off.
    pub dead: Option<String>,
}

impl PeerState {
    pub fn new(addr: FiAddr, desc: String, depth: usize, eager_max: usize) -> PeerState {
        PeerState {
            addr,
            desc,
            cts: vec![(CtsEntry::default(), 0); depth],
            imm: (0..depth).map(|_| ImmSlot::default()).collect(),
            eager: (0..depth)
                .map(|_| EagerSlot {
                    idx: 0,
                    tag: 0,
                    len: 0,
                    full: false,
                    data: vec![0u8; eager_max].into_boxed_slice(),
                })
                .collect(),
            credits: vec![0; depth],
            acks: 0,
            regions: (0..depth).map(|_| None).collect(),
            writes: vec![0; depth],
            in_flight: 0,
            failed: None,
            dead: None,
        }
    }

    /// Marks the peer dead (the first reason sticks).
    pub fn kill(&mut self, why: String) {
        if self.dead.is_none() {
            tracing::warn!("ofi: {}: {why}", self.desc);
            self.dead = Some(why);
        }
    }

    /// Publishes slot `slot`'s immediate once all its writes have landed, and closes the
    /// region the transfer wrote.
    fn complete(&mut self, slot: usize) {
        let s = &mut self.imm[slot];
        if let Some((imm, writes, len)) = s.waiting
            && s.landed >= writes
        {
            s.landed -= writes;
            s.waiting = None;
            (s.imm, s.len) = (imm, len);
            self.regions[slot] = None;
        }
    }
}

/// What a posted operation is, for its completion.
enum What {
    /// A receive from `peer` into `buf`.
    Recv { peer: usize, buf: Box<[u8]> },
    /// A message to `peer`; the buffer lives until sent.
    Send { peer: usize, buf: Vec<u8> },
    /// A data write to `peer`.
    Write { peer: usize },
    /// A read from `peer`; `done` when complete.
    Read { peer: usize },
}

/// A posted operation: its context (whose address identifies it) and what it is.
struct Op {
    ctx: Box<Context2>,
    what: What,
}

/// Everything behind the device's lock. Fields drop in order: registrations (in `peers`)
/// before the endpoint.
pub struct State {
    pub peers: Vec<Option<PeerState>>,
    ops: HashMap<usize, Op>,
    /// Reads completed, by context address, until their waiter takes them.
    reads_done: Vec<usize>,
    pub depth: usize,
    pub eager_max: usize,
    pub ep: Endpoint,
}

impl State {
    pub fn new(
        ep: Endpoint,
        peers: Vec<Option<PeerState>>,
        depth: usize,
        eager_max: usize,
    ) -> State {
        State {
            peers,
            ops: HashMap::new(),
            reads_done: Vec::new(),
            depth,
            eager_max,
            ep,
        }
    }

    pub fn peer(&mut self, peer: usize) -> &mut PeerState {
        self.peers[peer]
            .as_mut()
            .expect("a link connects two distinct ranks")
    }

    /// Posts `post` with a fresh context recorded as `what`; retries while the provider is
    /// busy (driving progress). The context's address on success.
    fn post(
        &mut self,
        what: What,
        post: impl Fn(&Endpoint, &What, *mut c_void) -> isize,
    ) -> Result<usize, String> {
        let mut ctx = Box::<Context2>::default();
        let key = &mut *ctx as *mut Context2 as usize;
        for _ in 0..1_000_000 {
            let rc = post(&self.ep, &what, key as *mut c_void);
            if rc == 0 {
                self.ops.insert(key, Op { ctx, what });
                return Ok(key);
            }
            if rc != -sys::FI_EAGAIN {
                return Err(self.ep.strerror(rc as i64));
            }
            self.progress();
        }
        Err("the provider stays busy".into())
    }

    /// Posts one receive from `peer` into `buf`.
    pub fn post_recv(&mut self, peer: usize, buf: Box<[u8]>) -> Result<(), String> {
        let src = self.peer(peer).addr;
        self.post(What::Recv { peer, buf }, |ep, what, ctx| match what {
            // SAFETY: the buffer and the context live in the op table until the completion.
            What::Recv { buf, .. } => unsafe {
                ep.recv(buf.as_ptr().cast_mut(), buf.len(), src, ctx)
            },
            _ => unreachable!("posting a receive"),
        })
        .map(drop)
    }

    /// Sends `h` with `payload` to `peer`.
    pub fn send(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        let dest = self.peer(peer).addr;
        let buf = h.encode(payload);
        self.post(What::Send { peer, buf: buf }, |ep, what, ctx| match what {
            // SAFETY: the buffer and the context live in the op table until the completion.
            What::Send { buf, .. } => unsafe { ep.send(buf.as_ptr(), buf.len(), dest, ctx) },
            _ => unreachable!("posting a send"),
        })
        .map(drop)
    }

    /// Writes `[src, src+len)` to `peer`'s `(key, addr)` with completion data `data`.
    ///
    /// # Safety
    /// `src` must stay valid for `len` reads until the peer's `in_flight` drops back.
    pub unsafe fn write(
        &mut self,
        peer: usize,
        (src, len): (*const u8, usize),
        (addr, key, data): (u64, u64, u64),
    ) -> Result<(), String> {
        let dest = self.peer(peer).addr;
        self.post(What::Write { peer }, |ep, _, ctx| {
            // SAFETY: `src` by the caller's contract; the context lives in the op table.
            unsafe { ep.writedata(src, len, data, dest, addr, key, ctx) }
        })?;
        self.peer(peer).in_flight += 1;
        Ok(())
    }

    /// Reads `peer`'s `(key, addr)` into `[dst, dst+len)`; the operation's id for
    /// [`State::take_read`].
    ///
    /// # Safety
    /// `dst` must stay valid for `len` writes until the read completes or the peer dies.
    pub unsafe fn read(
        &mut self,
        peer: usize,
        (dst, len): (*mut u8, usize),
        (addr, key): (u64, u64),
    ) -> Result<usize, String> {
        let src = self.peer(peer).addr;
        let id = self.post(What::Read { peer }, |ep, _, ctx| {
            // SAFETY: `dst` by the caller's contract; the context lives in the op table.
            unsafe { ep.read(dst, len, src, addr, key, ctx) }
        })?;
        self.peer(peer).in_flight += 1;
        Ok(id)
    }

    /// Whether read `id` has completed (forgetting it if so).
    pub fn take_read(&mut self, id: usize) -> bool {
        let Some(i) = self.reads_done.iter().position(|&r| r == id) else {
            return false;
        };
        self.reads_done.swap_remove(i);
        true
    }

    /// Reads and applies every completion ready; whether there was any.
    pub fn progress(&mut self) -> bool {
        let mut entries: [sys::CqDataEntry; 16] =
            // SAFETY: all-integer/pointer entries, zero is a valid value.
            unsafe { std::mem::zeroed() };
        let mut any = false;
        loop {
            match self.ep.poll(&mut entries) {
                Ok(0) => return any,
                Ok(n) => {
                    any = true;
                    for e in &entries[..n] {
                        self.apply(e.op_context as usize, e.flags, e.len, e.data);
                    }
                }
                Err((ctx, why)) => {
                    any = true;
                    self.failed(ctx as usize, why);
                }
            }
        }
    }

    /// An error completion of the operation with context `key`: its peer is unreachable.
    fn failed(&mut self, key: usize, why: String) {
        let Some(op) = self.ops.remove(&key) else {
            tracing::warn!("ofi: an error completion of no operation of ours: {why}");
            return;
        };
        let peer = match op.what {
            What::Recv { peer, .. } | What::Send { peer, .. } => peer,
            What::Write { peer } | What::Read { peer } => {
                self.peer(peer).in_flight -= 1;
                peer
            }
        };
        self.peer(peer).kill(format!("is unreachable: {why}"));
    }

    /// Applies one completion.
    fn apply(&mut self, key: usize, flags: u64, len: usize, data: u64) {
        if flags & sys::FI_REMOTE_CQ_DATA != 0 && flags & sys::FI_RECV == 0 {
            self.landed(data);
            return;
        }
        let Some(op) = self.ops.remove(&key) else {
            tracing::warn!("ofi: a completion of no operation of ours (flags {flags:#x})");
            return;
        };
        match op.what {
            What::Send { .. } => {}
            What::Write { peer } => self.peer(peer).in_flight -= 1,
            What::Read { peer } => {
                self.peer(peer).in_flight -= 1;
                self.reads_done.push(key);
            }
            What::Recv { peer, buf } => {
                let msg = &buf[..len.min(buf.len())];
                match wire::decode(msg, self.depth, self.eager_max) {
                    Ok((h, payload)) => {
                        if let Err(why) = self.deliver(peer, &h, payload) {
                            self.peer(peer).kill(format!("protocol violation: {why}"));
                        }
                    }
                    Err(why) => self.peer(peer).kill(format!("sent {why}")),
                }
                // Reposted even for a dead peer: the receive is only a buffer.
                if let Err(why) = self.post_recv(peer, buf) {
                    self.peer(peer)
                        .kill(format!("cannot post a receive: {why}"));
                }
            }
        }
        drop(op.ctx);
    }

    /// A peer's data write landed in our memory: count it for its slot.
    fn landed(&mut self, data: u64) {
        let (rank, slot) = wire::parse_write_data(data);
        let depth = self.depth;
        let Some(Some(p)) = self.peers.get_mut(rank) else {
            tracing::warn!("ofi: a write naming rank {rank}, not a peer");
            return;
        };
        if slot >= depth || p.regions[slot].is_none() {
            p.kill(format!(
                "protocol violation: a write for slot {slot}, which is not open"
            ));
            return;
        }
        p.imm[slot].landed += 1;
        p.complete(slot);
    }

    /// Applies a decoded message from `peer`.
    fn deliver(&mut self, peer: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        let p = self.peer(peer);
        let slot = h.slot as usize;
        match h.kind {
            Kind::Cts => {
                let entry = CtsEntry {
                    key: h.slot,
                    ..wire::decode_cts(payload)
                };
                p.cts[slot] = (entry, h.value);
            }
            Kind::Imm => {
                if p.imm[slot].waiting.is_some() {
                    return Err(format!("a second immediate for slot {slot}"));
                }
                p.imm[slot].waiting = Some((h.a, h.b, h.value));
                p.complete(slot);
            }
            Kind::Eager => {
                let s = &mut p.eager[slot];
                if s.full {
                    return Err(format!("an eager message into the full slot {slot}"));
                }
                s.data[..payload.len()].copy_from_slice(payload);
                (s.idx, s.tag, s.len, s.full) = (h.a, h.b, payload.len(), true);
            }
            Kind::Credit => p.credits[slot] = h.a,
            Kind::Ack => p.acks = p.acks.wrapping_add(1),
            Kind::Fail => {
                p.failed
                    .get_or_insert_with(|| String::from_utf8_lossy(payload).into_owned());
            }
            Kind::Ping => {}
        }
        Ok(())
    }
}
