//! What the `ofi` provider keeps under its one lock: the endpoint, the operations posted to it
//! ([`super::op`]: each owning its libfabric context and buffer until its completion, with the
//! provider's backlog when it is busy), the pools of message and receive buffers, and per peer
//! ([`super::peer`]) the state that completions deliver plus what validates the peer's
//! traffic: the registration each posted clear-to-send opened, which the transfer's immediate
//! closes again.
//!
//! This file holds the operations' life: posting (or queueing while the provider is busy),
//! and [`State::progress`], which reads the completion queue and applies each completion. That
//! read also drives the provider: with manual data progress, a peer's writes land in our
//! memory only while we read our queue. The messages we send are built and batched in
//! [`super::outgoing`]; what a completed receive or a landed write carries is checked and
//! delivered in [`super::incoming`].

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::hash::BuildHasherDefault;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::fabric::{Endpoint, Mr};
use super::op::{AddrHasher, Op, What};
use super::outgoing::SendBuf;
use super::peer::{PeerState, RecvBuf};
use super::sys::{self, Context2, FiAddr};
use super::wire;

/// Receives kept posted per peer, up to [`RECVS_MAX`] in all (a message beyond them waits in
/// the provider's unexpected queue, so the number only bounds the copies in flight).
pub const RECVS: usize = 32;
/// Most receives kept posted.
pub const RECVS_MAX: usize = 256;

/// How many receives a rank with `peers` peers keeps posted.
pub fn recvs(peers: usize) -> usize {
    (RECVS * peers).clamp(RECVS, RECVS_MAX)
}
/// How long a peer may take no operation of ours (the provider says busy, as `tcp;ofi_rxm`
/// does while it fails to reconnect to a peer that is gone) before it counts as unreachable.
/// The progress thread's liveness messages make this the time to notice a dead peer.
pub const STUCK: Duration = Duration::from_secs(1);
/// Most reads of a queue in one [`State::read_queue`] call (of up to 16 completions each).
const READ_PASSES: usize = 64;

/// Everything behind the device's lock. On drop the endpoint's rails close first (nothing
/// lands in our buffers after that), then the fields drop in order: registrations (in `peers`,
/// `ops`, the pool) and buffers before the rest of the endpoint (its domain).
pub struct State {
    pub peers: Vec<Option<PeerState>>,
    ops: HashMap<usize, Op, BuildHasherDefault<AddrHasher>>,
    /// Operations the provider was too busy to take, in posting order, by context address.
    backlog: VecDeque<(usize, Op)>,
    /// Reads completed, by context address, until their waiter takes them.
    reads_done: Vec<usize>,
    /// Reads whose waiter gave up before they completed ([`State::forget_read`]): their
    /// completion is dropped instead of waiting in `reads_done` for nobody. A context address
    /// stays unique while its operation is in the table.
    reads_abandoned: Vec<usize>,
    /// Reads that failed while their waiter still waited, by context address, until it gives
    /// up ([`State::forget_read`]). The context is freed at the failure, so its address may
    /// name a new operation by then: this list tells the two apart.
    reads_failed: Vec<usize>,
    /// Every region was closed after a failure ([`State::revoke_all`]).
    pub(super) revoked: bool,
    /// Message buffers not in use (see [`SendBuf`]).
    pub(super) send_pool: Vec<SendBuf>,
    /// Receive buffers neither posted nor holding an eager message (see
    /// [`super::peer::EagerSlot`]).
    pub(super) spare_recvs: Vec<RecvBuf>,
    /// Receives applied but not posted again yet: [`State::progress`] posts them before it
    /// next reads the queue, so posting one is not between a message's arrival and the
    /// engine's answer to it.
    reposts: Vec<Op>,
    /// Buffers for small eager payloads ([`super::peer::Payload::Copied`]) not in use, empty:
    /// a message allocates nothing.
    pub(super) spare_copies: Vec<Vec<u8>>,
    /// The eager message of the receive being applied: `(peer, slot, payload address, len)`.
    /// It stays in the receive's buffer, which goes to the slot once the receive is applied.
    pub(super) kept: Option<(usize, usize, usize, usize)>,
    /// Our rank, which every message names.
    pub(super) rank: usize,
    pub depth: usize,
    pub eager_max: usize,
    /// The largest message the provider carries in one piece ([`super::wire::Limits`]).
    pub msg_limit: usize,
    pub ep: Endpoint,
    /// Whether the engine's last poll read the queue (its next one skips it).
    pub polled_fresh: bool,
    /// Our operations with the provider on rails beyond the first (queue 1).
    striped_ops: usize,
    /// Our open regions that peers reach over rails beyond the first
    /// ([`super::peer::Striped`]).
    pub open_stripes: Arc<AtomicUsize>,
}

// SAFETY: the raw buffer pointers of queued writes and reads are only used to post them, under
// the device's lock; their owners keep them valid until the operations complete.
unsafe impl Send for State {}

impl Drop for State {
    fn drop(&mut self) {
        self.ep.close_rails();
    }
}

impl State {
    pub fn new(
        ep: Endpoint,
        rank: usize,
        peers: Vec<Option<PeerState>>,
        depth: usize,
        limits: wire::Limits,
    ) -> State {
        State {
            peers,
            ops: HashMap::default(),
            backlog: VecDeque::new(),
            reads_done: Vec::new(),
            reads_abandoned: Vec::new(),
            reads_failed: Vec::new(),
            revoked: false,
            send_pool: Vec::new(),
            spare_recvs: Vec::new(),
            reposts: Vec::new(),
            spare_copies: Vec::new(),
            kept: None,
            polled_fresh: false,
            striped_ops: 0,
            open_stripes: Arc::default(),
            rank,
            depth,
            eager_max: limits.eager_max,
            msg_limit: limits.msg_limit,
            ep,
        }
    }

    pub fn peer(&mut self, peer: usize) -> &mut PeerState {
        self.peers[peer]
            .as_mut()
            .expect("a link connects two distinct ranks")
    }

    /// Where `what` goes (any source for a receive), or why it cannot: its peer is dead.
    fn target(&mut self, what: &What) -> Result<FiAddr, String> {
        let Some(peer) = what.peer() else {
            return Ok(sys::FI_ADDR_UNSPEC);
        };
        let rail = match *what {
            What::Write { rail, .. } | What::Read { rail, .. } => rail,
            _ => 0,
        };
        let p = self.peer(peer);
        match &p.dead {
            Some(why) => Err(format!("the peer {why}")),
            None => Ok(p.addrs[rail]),
        }
    }

    /// Posts `what` with a fresh context (the context's address identifies it); when the
    /// provider is busy, or earlier operations to the same peer wait, it waits in the backlog
    /// that [`State::progress`] retries.
    fn post(&mut self, what: What) -> Result<usize, String> {
        self.post_op(Op {
            ctx: Box::default(),
            what,
        })
    }

    /// As [`State::post`] with the context `op` brings (that of a completed operation).
    pub(super) fn post_op(&mut self, mut op: Op) -> Result<usize, String> {
        let key = &mut *op.ctx as *mut Context2 as usize;
        let to = self.target(&op.what)?;
        let peer = op.what.peer();
        if peer.is_none_or(|p| self.peer(p).backlogged == 0) {
            // SAFETY: the op table or the backlog owns the buffer and context from here on.
            let rc = unsafe { op.what.post(&self.ep, to, key as *mut c_void) };
            if rc == 0 {
                self.track(key, op);
                return Ok(key);
            }
            if rc != -sys::FI_EAGAIN {
                let why = self.ep.strerror(rc as i64);
                if let Some(p) = peer {
                    // What a message carried (held-back credits, a clear-to-send) is lost
                    // with it, and the callers of messages nobody waits for ignore the
                    // error: the peer's waits fail now, as after an error completion
                    // (`failed`), rather than at their timeout.
                    self.peer(p).kill(format!("is unreachable: {why}"));
                }
                return Err(why);
            }
            if let Some(p) = peer {
                self.peer(p).stuck_since = Some(Instant::now());
            }
        }
        if let Some(p) = peer {
            self.peer(p).backlogged += 1;
        }
        self.backlog.push_back((key, op));
        Ok(key)
    }

    /// Keeps posted operation `op` under its context address `key` until its completion,
    /// counting those on rails beyond the first.
    fn track(&mut self, key: usize, op: Op) {
        self.striped_ops += usize::from(self.ep.queue_of(op.what.rail()) > 0);
        self.ops.insert(key, op);
    }

    /// Takes back the operation under `key` at its completion.
    fn untrack(&mut self, key: usize) -> Option<Op> {
        let op = self.ops.remove(&key)?;
        self.striped_ops -= usize::from(self.ep.queue_of(op.what.rail()) > 0);
        Some(op)
    }

    /// Posts what waits in the backlog, in order per peer; a peer whose operations have not
    /// moved for [`STUCK`] is unreachable.
    fn retry_backlog(&mut self) {
        let mut blocked = Vec::new();
        for _ in 0..self.backlog.len() {
            let (key, op) = self.backlog.pop_front().expect("counted");
            let peer = op.what.peer();
            let rc = match self.target(&op.what) {
                Err(_) => -(libc::ECONNRESET as isize),
                Ok(_) if blocked.contains(&peer) => -sys::FI_EAGAIN,
                // SAFETY: as in `post`.
                Ok(to) => unsafe { op.what.post(&self.ep, to, key as *mut c_void) },
            };
            if rc == -sys::FI_EAGAIN {
                blocked.push(peer);
                self.backlog.push_back((key, op));
                continue;
            }
            if let Some(peer) = peer {
                let p = self.peer(peer);
                p.backlogged -= 1;
                p.stuck_since = (p.backlogged > 0).then(Instant::now);
            }
            if rc == 0 {
                self.track(key, op);
            } else {
                let why = self.ep.strerror(rc as i64);
                self.track(key, op);
                self.failed(key, why);
            }
        }
        for p in self.peers.iter_mut().flatten() {
            if p.stuck_since.is_some_and(|t| t.elapsed() >= STUCK) {
                p.kill(format!(
                    "is unreachable: nothing could be sent to it for {:.1} s",
                    STUCK.as_secs_f64()
                ));
            }
        }
    }

    /// Registers `[ptr, ptr + len)` for our own operations' `access` where the provider asks.
    pub(super) fn local(
        &mut self,
        ptr: *const u8,
        len: usize,
        access: u64,
    ) -> Result<Option<Mr>, String> {
        if !self.ep.caps.local_mr {
            return Ok(None);
        }
        self.ep.register(ptr, len, access).map(Some)
    }

    /// Posts one receive from any peer into `buf` (registering it where the provider asks).
    pub fn post_recv(&mut self, buf: Box<[u8]>) -> Result<(), String> {
        let mr = self.local(buf.as_ptr(), buf.len(), sys::FI_RECV)?;
        self.post(What::Recv { buf, mr }).map(drop)
    }

    /// Writes `[src, src+len)` on `rail` to `peer`'s `(key, addr)` with completion data
    /// `data`.
    ///
    /// # Safety
    /// `src` must stay valid for `len` reads until the peer's `pending` count of the write's
    /// slot drops back.
    pub unsafe fn write(
        &mut self,
        (peer, rail): (usize, usize),
        (src, len): (*const u8, usize),
        rma: (u64, u64, u64),
    ) -> Result<(), String> {
        let mr = self.local(src, len, sys::FI_WRITE)?;
        self.post(What::Write {
            peer,
            rail,
            src,
            len,
            rma,
            mr,
        })?;
        let (_, slot) = wire::parse_write_data(rma.2);
        self.peer(peer).pending[slot] += 1;
        Ok(())
    }

    /// Reads `peer`'s `(key, addr)` on `rail` into `[dst, dst+len)`; the operation's id for
    /// [`State::take_read`].
    ///
    /// # Safety
    /// `dst` must stay valid for `len` writes until the read completes or the peer dies.
    pub unsafe fn read(
        &mut self,
        (peer, rail): (usize, usize),
        (dst, len): (*mut u8, usize),
        rma: (u64, u64),
    ) -> Result<usize, String> {
        let mr = self.local(dst, len, sys::FI_READ)?;
        let id = self.post(What::Read {
            peer,
            rail,
            dst,
            len,
            rma,
            mr,
        })?;
        Ok(id)
    }

    /// Closes every region our clear-to-send entries opened, to every peer
    /// ([`PeerState::revoke`]): an operation of ours failed, and with it the communicator.
    /// From here a write completion naming a slot without a region is one that landed before
    /// and is read only now, not a protocol violation ([`State::revoked`]).
    pub fn revoke_all(&mut self) {
        self.peers.iter_mut().flatten().for_each(PeerState::revoke);
        self.revoked = true;
    }

    /// Withdraws the data writes still waiting in the backlog (the provider never had them):
    /// after a failure they must not start reading the application's memory. Their sends
    /// count them done.
    pub fn withdraw_queued_writes(&mut self) {
        for (_, op) in self.withdraw(|_, op| matches!(op.what, What::Write { .. })) {
            if let What::Write { peer, rma, .. } = op.what {
                self.wrote(peer, rma.2);
            }
        }
    }

    /// Takes the operations `pick` chooses out of the backlog, in order, and counts them off
    /// their peers' queues (a peer with none left is no longer stuck).
    fn withdraw(&mut self, mut pick: impl FnMut(usize, &Op) -> bool) -> Vec<(usize, Op)> {
        let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.backlog)
            .into_iter()
            .partition(|(key, op)| pick(*key, op));
        self.backlog = kept.into();
        for peer in taken.iter().filter_map(|(_, op)| op.what.peer()) {
            let p = self.peer(peer);
            p.backlogged -= 1;
            if p.backlogged == 0 {
                p.stuck_since = None;
            }
        }
        taken
    }

    /// Whether messages, writes or reads of ours have not completed yet (receives aside).
    pub fn sending(&self) -> bool {
        let outgoing = |op: &Op| !matches!(op.what, What::Recv { .. });
        self.backlog.iter().any(|(_, op)| outgoing(op)) || self.ops.values().any(outgoing)
    }

    /// Whether every live peer has consumed our eager messages (credited each). Closing the
    /// endpoint before races the peer's last credits: over socket providers they then meet
    /// a closed connection, which resets it, and the peer's provider fails what it had not
    /// delivered yet (`ofi2_tcp_eager_edges_w2` lost its last messages so in about one run
    /// in five).
    pub fn consumed(&self) -> bool {
        self.peers
            .iter()
            .flatten()
            .all(|p| p.uncredited == 0 || p.dead.is_some())
    }

    /// Whether data writes or reads of ours (which touch the application's memory, unlike
    /// messages) are still with the provider or in the backlog.
    pub fn accessing(&self) -> bool {
        let rma = |op: &Op| matches!(op.what, What::Write { .. } | What::Read { .. });
        self.backlog.iter().any(|(_, op)| rma(op)) || self.ops.values().any(rma)
    }

    /// The waiter of read `id` gives up (its destination is the caller's again): a read still
    /// in the backlog never starts, one with the provider has its completion dropped when it
    /// comes, and one that already ended (done, or failed) leaves nothing behind.
    pub fn forget_read(&mut self, id: usize) {
        if let Some(i) = self.reads_failed.iter().position(|&r| r == id) {
            self.reads_failed.swap_remove(i);
            return;
        }
        if self.withdraw(|key, _| key == id).is_empty()
            && !self.take_read(id)
            && self.ops.contains_key(&id)
        {
            self.reads_abandoned.push(id);
        }
    }

    /// Read `id` ended (done or failed): whether its waiter had given up (forgetting that).
    fn was_abandoned(&mut self, id: usize) -> bool {
        let at = self.reads_abandoned.iter().position(|&r| r == id);
        at.map(|i| self.reads_abandoned.swap_remove(i)).is_some()
    }

    /// Whether read `id` has completed (forgetting it if so).
    pub fn take_read(&mut self, id: usize) -> bool {
        let Some(i) = self.reads_done.iter().position(|&r| r == id) else {
            return false;
        };
        self.reads_done.swap_remove(i);
        true
    }

    /// Posts the receives waiting to be posted again, then reads and applies every completion
    /// ready on queue 0 (rail 0: messages, transfers of one stripe), and on queue 1 (the
    /// other rails) while a transfer cut into stripes may use them: one of ours is with the
    /// provider there, or a region of ours awaits a peer's stripes. Over `ofi_rxm` a read
    /// drives every rail of its queue, a system call per idle rail with socket providers
    /// (docs/TUNING.md, "Fixed constants"); whether there was any.
    pub fn progress(&mut self) -> bool {
        let stripes = self.striped_ops > 0 || self.open_stripes.load(Ordering::Relaxed) > 0;
        self.progress_queues(stripes)
    }

    /// [`State::progress`] of every queue: for whoever blocks on the queues' descriptors
    /// next.
    pub fn progress_all(&mut self) -> bool {
        self.progress_queues(true)
    }

    fn progress_queues(&mut self, stripes: bool) -> bool {
        let mut any = self.read_queue(0);
        if stripes && self.ep.queues() > 1 {
            any |= self.read_queue(1);
        }
        if !self.backlog.is_empty() {
            self.retry_backlog();
        }
        any
    }

    /// Reads and applies every completion ready on `queue`; whether there was any. A read
    /// that returns fewer entries than asked for has emptied the queue: reading again would
    /// only cost another pass through the provider (a system call with socket providers)
    /// right when something arrived. At most [`READ_PASSES`] reads: a failed receive is posted
    /// again before the next one, and a broken endpoint could fail it again for ever, with
    /// the lock held; the next call reads on.
    fn read_queue(&mut self, queue: usize) -> bool {
        const BATCH: usize = 16;
        let mut entries = [const { MaybeUninit::uninit() }; BATCH];
        let mut any = false;
        for _ in 0..READ_PASSES {
            if !self.reposts.is_empty() {
                self.post_reposts();
            }
            match self.ep.poll(queue, &mut entries) {
                Ok(got) => {
                    any |= !got.is_empty();
                    let full = got.len() == BATCH;
                    for e in got {
                        self.apply(e.op_context as usize, e.flags, e.len, e.data);
                    }
                    if !full {
                        return any;
                    }
                }
                Err((ctx, why)) if ctx.is_null() => {
                    // An error naming no operation of ours, or the queue itself failing:
                    // reading it again at once could only fail again, with the lock held. The
                    // next poll reads on; waits meanwhile end at their timeout.
                    tracing::warn!("ofi: a completion-queue error naming no operation: {why}");
                    return any;
                }
                Err((ctx, why)) => {
                    any = true;
                    self.failed(ctx as usize, why);
                }
            }
        }
        any
    }

    /// An error completion of the operation with context `key`: its peer is unreachable (a
    /// receive's buffer is posted again: it names no peer).
    fn failed(&mut self, key: usize, why: String) {
        let Some(op) = self.untrack(key) else {
            tracing::warn!("ofi: an error completion of no operation of ours: {why}");
            return;
        };
        let Some(peer) = op.what.peer() else {
            tracing::warn!("ofi: a receive failed: {why}");
            if let What::Recv { buf, mr } = op.what {
                self.repost(op.ctx, buf, mr);
            }
            return;
        };
        match op.what {
            What::Write { rma, .. } => self.wrote(peer, rma.2),
            What::Read { .. } => {
                if !self.was_abandoned(key) {
                    self.reads_failed.push(key);
                }
            }
            What::Send { buf, mr, .. } => self.recycle(SendBuf {
                ctx: op.ctx,
                buf,
                mr,
            }),
            What::Recv { .. } => {}
        }
        self.peer(peer).kill(format!("is unreachable: {why}"));
    }

    /// Queues a completed receive's buffer (with its registration, if any) to be posted again
    /// under its context before the queue is read next ([`State::reposts`]).
    pub(super) fn repost(&mut self, ctx: Box<Context2>, buf: Box<[u8]>, mr: Option<Mr>) {
        let what = What::Recv { buf, mr };
        self.reposts.push(Op { ctx, what });
    }

    /// Posts the receives [`State::repost`] queued. A receive the provider refuses (other than
    /// for now: those wait in the backlog) leaves the endpoint with fewer receives than its
    /// peers' credits count on, and a provider that refuses one refuses the next: every
    /// peer's waits fail now, naming why, rather than at their timeout.
    fn post_reposts(&mut self) {
        while let Some(op) = self.reposts.pop() {
            if let Err(why) = self.post_op(op) {
                for p in self.peers.iter_mut().flatten() {
                    p.kill(format!("is unreachable: no receive can be posted: {why}"));
                }
            }
        }
    }

    /// One data write to `peer` with completion data `data` completed: its slot's send has
    /// one write less reading its buffer.
    fn wrote(&mut self, peer: usize, data: u64) {
        let (_, slot) = wire::parse_write_data(data);
        self.peer(peer).pending[slot] -= 1;
    }

    /// Applies one completion.
    fn apply(&mut self, key: usize, flags: u64, len: usize, data: u64) {
        if flags & sys::FI_REMOTE_CQ_DATA != 0 && flags & sys::FI_RECV == 0 {
            self.landed(data);
            return;
        }
        let Some(op) = self.untrack(key) else {
            tracing::warn!("ofi: a completion of no operation of ours (flags {flags:#x})");
            return;
        };
        match op.what {
            What::Send { buf, mr, .. } => self.recycle(SendBuf {
                ctx: op.ctx,
                buf,
                mr,
            }),
            What::Write { peer, rma, .. } => self.wrote(peer, rma.2),
            What::Read { .. } if self.was_abandoned(key) => {}
            What::Read { .. } => self.reads_done.push(key),
            What::Recv { buf, mr } => {
                let msg = &buf[..len.min(buf.len())];
                if flags & sys::FI_REMOTE_CQ_DATA != 0 {
                    self.receive_compact(msg, data);
                } else {
                    self.receive(msg);
                }
                match self.kept.take() {
                    Some((peer, slot, at, len)) => {
                        let off = at - buf.as_ptr() as usize;
                        self.keep((peer, slot), op.ctx, RecvBuf { buf, mr }, off..off + len);
                    }
                    None => self.repost(op.ctx, buf, mr),
                }
            }
        }
    }
}
