//! What the TCP provider knows about one peer: the connection's sending half, and the state its
//! frames deliver — the mirror of what the shared-memory provider keeps in its segment (the
//! clear-to-send FIFO, completion slots, eager slots, credits, acks), which the protocol polls
//! with loads, plus what validates the peer's writes and reads (the memory each posted
//! clear-to-send names) and the peer's health.
//!
//! Frames nobody waits for in the common case (credits, and the clear-to-send entries of eager
//! receives, which only expose a length mismatch) are *deferred* ([`crate::hold`]): appended
//! to the peer's outbox and sent in front of the next frame to that peer, in the same
//! `sendmsg`, or once the engine has idled [`crate::hold::HOLD`] ([`Peer::flush_due`]) or is
//! about to sleep ([`Peer::flush`]), or once [`DEFER_MAX`] bytes wait. A small exchange then
//! costs one system call per message instead of three.
//!
//! Whoever holds the connection's inbox ([`super::reader`]: the engine while it polls, or the
//! receiving thread) is the only writer of the delivered state; everything else only reads it,
//! except the eager slots, which pass between the two sides by their `full` flag: the inbox
//! fills a slot only while it is empty, the protocol reads it only while it is full, and empties
//! it when it posts the slot's credit.

use ampccl_runtime::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering, UnsafeCell};
use std::io::IoSlice;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex};

use ampccl_runtime::{Error, Result};

use super::frame::{HEADER, Header};
use super::stripe::{Job, SendPath};
use crate::device::{CtsEntry, EagerHeader};
use crate::handback::PollMark;
use crate::hold::Held;

/// One eager slot: the inbox fills it while it is empty ([`EagerSlot::put`]), the protocol
/// reads it once its index shows ([`EagerSlot::peek`], [`EagerSlot::read`]) and empties it
/// before posting the slot's credit ([`EagerSlot::release`]); the sender writes the slot again
/// only after that credit. `full` hands the payload between the two sides.
pub(super) struct EagerSlot {
    idx: AtomicU32,
    tag: AtomicU32,
    len: AtomicU32,
    full: AtomicBool,
    payload: UnsafeCell<Box<[u8]>>,
}

// SAFETY: the payload is handed between the inbox and the protocol side by `full`: written
// only while empty, read only while full (see the type's documentation); the rest is atomics.
unsafe impl Sync for EagerSlot {}

impl EagerSlot {
    pub fn new(capacity: usize) -> EagerSlot {
        EagerSlot {
            idx: AtomicU32::new(0),
            tag: AtomicU32::new(0),
            len: AtomicU32::new(0),
            full: AtomicBool::new(false),
            payload: UnsafeCell::new(vec![0u8; capacity].into_boxed_slice()),
        }
    }

    /// Inbox side: stores message `idx` (`len <= capacity` bytes, written by `fill`) if the
    /// slot is empty; `Ok(false)` when it is full (the sender broke the credit protocol).
    pub fn put(
        &self,
        idx: u32,
        tag: u32,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<bool> {
        if self.full.load(Ordering::Acquire) {
            return Ok(false);
        }
        // SAFETY: the slot is empty, so the protocol side does not touch the payload until
        // `full` is set below (and the inbox lock keeps other fillers out).
        self.payload
            .with_mut(|p| fill(&mut unsafe { &mut *p }[..len]))?;
        self.tag.store(tag, Ordering::Relaxed);
        self.len.store(len as u32, Ordering::Relaxed);
        self.full.store(true, Ordering::Relaxed);
        self.idx.store(idx, Ordering::Release);
        Ok(true)
    }

    /// Protocol side: the header of message `idx` once it is in.
    pub fn peek(&self, idx: u32) -> Option<EagerHeader> {
        (self.idx.load(Ordering::Acquire) == idx).then(|| EagerHeader {
            tag: self.tag.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed) as usize,
        })
    }

    /// Protocol side: copies the first `dst.len()` payload bytes of the message `peek` saw.
    pub fn read(&self, dst: &mut [u8]) {
        // SAFETY: the caller saw the message with `peek` (acquire), so the slot is full and the
        // inbox leaves the payload alone until `release`.
        self.payload
            .with(|p| dst.copy_from_slice(&unsafe { &*p }[..dst.len()]));
    }

    /// Protocol side: empties the slot (before the credit that lets the sender reuse it).
    pub fn release(&self) {
        self.full.store(false, Ordering::Release);
    }
}

/// The memory a posted clear-to-send names, which the peer's writes (or reads, for an offer)
/// must stay inside; closed again by the transfer's immediate.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Region {
    pub open: bool,
    pub read: bool,
    /// Large enough for a striped write (counted in [`Peer::wide_open`] while open).
    pub wide: bool,
    pub addr: u64,
    pub len: u64,
}

/// A read of ours in flight to this peer: where the answer goes.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingRead {
    pub id: u32,
    pub dst: *mut u8,
    pub len: u64,
    pub done: bool,
}

// SAFETY: `dst` is only written by the reader thread while the read that owns it waits for it
// (see `TcpDevice::read`).
unsafe impl Send for PendingRead {}

/// A clear-to-send entry slot, written by the reader, polled by the engine (`idx` last).
#[derive(Default)]
pub(super) struct CtsCell {
    addr: AtomicU64,
    size: AtomicU64,
    key: AtomicU32,
    nreqs: AtomicU32,
    tag: AtomicU32,
    idx: AtomicU32,
}

impl CtsCell {
    pub fn store(&self, e: &CtsEntry) {
        self.addr.store(e.addr, Ordering::Relaxed);
        self.size.store(e.size, Ordering::Relaxed);
        self.key.store(e.key, Ordering::Relaxed);
        self.nreqs.store(e.nreqs, Ordering::Relaxed);
        self.tag.store(e.tag, Ordering::Relaxed);
        self.idx.store(e.idx, Ordering::Release);
    }

    pub fn load(&self, idx: u32) -> Option<CtsEntry> {
        (self.idx.load(Ordering::Acquire) == idx).then(|| CtsEntry {
            addr: self.addr.load(Ordering::Relaxed),
            size: self.size.load(Ordering::Relaxed),
            key: self.key.load(Ordering::Relaxed),
            nreqs: self.nreqs.load(Ordering::Relaxed),
            tag: self.tag.load(Ordering::Relaxed),
            idx,
        })
    }
}

/// Bytes of deferred frames after which they go out without waiting for a carrier.
pub const DEFER_MAX: usize = 1024;

/// The sending half of a connection: frames go out whole under its lock.
pub(super) struct Outbox {
    pub stream: TcpStream,
    /// Deferred frames, sent in front of the next frame.
    deferred: Vec<u8>,
    /// Since when the oldest of `deferred` waits.
    held: Held,
}

/// Everything about one peer.
pub(super) struct Peer {
    /// Connection 0: every frame.
    pub out: Mutex<Outbox>,
    /// How frames leave (shared by the device's peers).
    path: std::sync::Arc<SendPath>,
    /// Connections 1..: stripes of large writes and their immediates ([`super::stripe`]).
    pub stripes: Box<[Mutex<TcpStream>]>,
    /// Per slot, which of `stripes` carried a stripe since that slot's last immediate (bit i:
    /// connection i + 1).
    pub striped: Box<[AtomicU32]>,
    /// Per completion slot, copies of a striped immediate received so far.
    pub imm_parts: Box<[AtomicU32]>,
    /// Open regions that stripes may arrive for: only then does the engine poll connections
    /// 1.. too (each poll of an idle socket is a system call).
    pub wide_open: AtomicU32,
    /// Whether `out` holds deferred frames (read without its lock by [`Peer::flush`]).
    has_deferred: AtomicBool,
    pub cts: Box<[CtsCell]>,
    pub imm: Box<[(AtomicU32, AtomicU64)]>,
    pub eager: Box<[EagerSlot]>,
    pub credits: Box<[AtomicU32]>,
    pub acks: AtomicU32,
    /// Per slot, what our clear-to-send of that slot lets the peer touch.
    pub regions: Mutex<Box<[Region]>>,
    pub read: Mutex<Option<PendingRead>>,
    pub read_done: Condvar,
    /// Serializes our reads from this peer (one in flight at a time).
    pub reading: Mutex<u32>,
    /// Why the peer is gone (connection lost, bad frame), once it is.
    pub dead: Mutex<Option<String>>,
    /// The failure the peer reported, once it did.
    pub failed: Mutex<Option<String>>,
    pub any_down: AtomicBool,
    /// When the engine last polled this peer (its receiving thread leaves it alone then).
    pub polled: PollMark,
    /// "rank 3 (pid 123 on host-b)".
    pub desc: String,
}

impl Peer {
    /// A peer reached over `out` (connection 0) and `stripes` (connections 1..).
    pub fn new(
        (out, stripes): (TcpStream, Vec<TcpStream>),
        path: std::sync::Arc<SendPath>,
        depth: usize,
        eager_max: usize,
        desc: String,
    ) -> Peer {
        Peer {
            path,
            stripes: stripes.into_iter().map(Mutex::new).collect(),
            striped: (0..depth).map(|_| AtomicU32::new(0)).collect(),
            imm_parts: (0..depth).map(|_| AtomicU32::new(0)).collect(),
            wide_open: AtomicU32::new(0),
            out: Mutex::new(Outbox {
                stream: out,
                deferred: Vec::with_capacity(DEFER_MAX + 2 * HEADER),
                held: Held::default(),
            }),
            has_deferred: AtomicBool::new(false),
            cts: (0..depth).map(|_| CtsCell::default()).collect(),
            imm: (0..depth).map(|_| Default::default()).collect(),
            eager: (0..depth).map(|_| EagerSlot::new(eager_max)).collect(),
            credits: (0..depth).map(|_| AtomicU32::new(0)).collect(),
            acks: AtomicU32::new(0),
            regions: Mutex::new(vec![Region::default(); depth].into_boxed_slice()),
            read: Mutex::new(None),
            read_done: Condvar::new(),
            reading: Mutex::new(0),
            dead: Mutex::new(None),
            failed: Mutex::new(None),
            any_down: AtomicBool::new(false),
            polled: PollMark::default(),
            desc,
        }
    }

    /// Opens `slot`'s region as `r` (closing what was open there).
    pub fn open_region(&self, slot: usize, r: Region) {
        let mut regions = lock(&self.regions);
        Self::shut(&mut regions[slot], &self.wide_open);
        if r.wide {
            self.wide_open.fetch_add(1, Ordering::AcqRel);
        }
        regions[slot] = r;
    }

    /// Closes `slot`'s region (its transfer's immediate arrived).
    pub fn close_region(&self, slot: usize) {
        Self::shut(&mut lock(&self.regions)[slot], &self.wide_open);
    }

    fn shut(r: &mut Region, wide_open: &AtomicU32) {
        if r.open && r.wide {
            wide_open.fetch_sub(1, Ordering::AcqRel);
        }
        r.open = false;
    }

    /// Sends one frame: the deferred frames, the header, then `payload`, in one `sendmsg`
    /// where the socket takes it all (whole, or an error naming the peer).
    pub fn send(&self, h: &Header, payload: &[u8]) -> Result<()> {
        let mut out = lock(&self.out);
        self.send_out(&mut out, &h.encode(), payload, |job| {
            self.path.send(std::slice::from_mut(job))
        })
        .map_err(|e| self.lost(e))
    }

    /// Sends the answer to the peer's read request from the receiving side, always with
    /// `sendmsg`: it returns once the socket has taken the bytes. (A zero-copy send returns
    /// only when the peer has read them; two ranks answering each other's reads from their
    /// receiving threads would then each wait for the other's thread: a deadlock.)
    pub fn send_response(&self, h: &Header, payload: &[u8]) -> Result<()> {
        let mut out = lock(&self.out);
        self.send_out(&mut out, &h.encode(), payload, super::stripe::send_blocking)
            .map_err(|e| self.lost(e))
    }

    /// Sends on connection 0 the deferred frames, then `head` and `payload`, through `send`;
    /// the deferred frames are gone afterwards either way (a lost connection loses them).
    fn send_out(
        &self,
        out: &mut Outbox,
        head: &[u8],
        payload: &[u8],
        send: impl FnOnce(&mut Job<'_>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let fd = out.stream.as_raw_fd();
        let bufs = [
            IoSlice::new(&out.deferred),
            IoSlice::new(head),
            IoSlice::new(payload),
        ];
        let sent = send(&mut Job::new(fd, bufs));
        out.deferred.clear();
        out.held.clear();
        self.has_deferred.store(false, Ordering::Relaxed);
        sent
    }

    fn lost(&self, e: std::io::Error) -> Error {
        Error::Remote(format!("{}: connection lost while sending: {e}", self.desc))
    }

    /// Queues one small frame to go out in front of the next one (see the module
    /// documentation); sends what waits once it reaches [`DEFER_MAX`] bytes. Returns whether
    /// frames are left waiting. A lost connection is not reported here: nothing waits for a
    /// deferred frame's delivery, and the receiving side records the loss.
    pub fn defer(&self, h: &Header, payload: &[u8]) -> bool {
        let mut out = lock(&self.out);
        out.deferred.extend_from_slice(&h.encode());
        out.deferred.extend_from_slice(payload);
        out.held.note();
        if out.deferred.len() < DEFER_MAX {
            self.has_deferred.store(true, Ordering::Relaxed);
            return true;
        }
        self.send_deferred(&mut out);
        false
    }

    /// Sends the deferred frames, if any.
    pub fn flush(&self) {
        if !self.has_deferred.load(Ordering::Relaxed) {
            return;
        }
        self.send_deferred(&mut lock(&self.out));
    }

    /// Sends the deferred frames once the oldest has waited [`crate::hold::HOLD`]; whether
    /// frames are left waiting.
    pub fn flush_due(&self) -> bool {
        if !self.has_deferred.load(Ordering::Relaxed) {
            return false;
        }
        let mut out = lock(&self.out);
        if out.held.due() {
            self.send_deferred(&mut out);
        }
        !out.deferred.is_empty()
    }

    /// Sends the deferred frames, if any (clearing `has_deferred`).
    fn send_deferred(&self, out: &mut Outbox) {
        if !out.deferred.is_empty() {
            let _ = self.send_out(out, &[], &[], super::stripe::send_blocking);
        }
    }

    /// Sends the deferred frames and ends our sending side of every connection (the peer
    /// reads to the end).
    pub fn close(&self) {
        let mut out = lock(&self.out);
        self.send_deferred(&mut out);
        let _ = out.stream.shutdown(std::net::Shutdown::Write);
        for s in self.stripes.iter() {
            let _ = lock(s).shutdown(std::net::Shutdown::Write);
        }
    }

    /// Sends the write frames `heads[i]` with `payloads[i]`, the first on connection 0 (after
    /// the deferred frames), the others on connections 1.., all at once.
    pub fn send_striped(&self, heads: &[[u8; HEADER]], payloads: &[&[u8]]) -> Result<()> {
        let mut out = lock(&self.out);
        let stripes: Vec<_> = self.stripes[..heads.len() - 1].iter().map(lock).collect();
        let mut jobs = Vec::with_capacity(heads.len());
        jobs.push(Job::new(
            out.stream.as_raw_fd(),
            [
                IoSlice::new(&out.deferred),
                IoSlice::new(&heads[0]),
                IoSlice::new(payloads[0]),
            ],
        ));
        for (i, s) in stripes.iter().enumerate() {
            jobs.push(Job::new(
                s.as_raw_fd(),
                [
                    IoSlice::new(&[]),
                    IoSlice::new(&heads[i + 1]),
                    IoSlice::new(payloads[i + 1]),
                ],
            ));
        }
        let sent = self.path.send(&mut jobs);
        drop(jobs);
        out.deferred.clear();
        out.held.clear();
        self.has_deferred.store(false, Ordering::Relaxed);
        sent.map_err(|e| self.lost(e))
    }

    /// Sends `h` on stripe connection `i` (1-based), for the immediates of striped writes.
    pub fn send_on_stripe(&self, i: usize, h: &Header) -> Result<()> {
        let s = lock(&self.stripes[i - 1]);
        let head = h.encode();
        let none: &[u8] = &[];
        let bufs = [IoSlice::new(none), IoSlice::new(&head), IoSlice::new(none)];
        self.path
            .send(&mut [Job::new(s.as_raw_fd(), bufs)])
            .map_err(|e| self.lost(e))
    }

    /// The peer's failure or loss, as the error a waiter reports.
    pub fn health(&self) -> Result<()> {
        if !self.any_down.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(m) = &*lock(&self.failed) {
            return Err(Error::Remote(format!("{} failed: {m}", self.desc)));
        }
        match &*lock(&self.dead) {
            Some(m) => Err(Error::Remote(format!("{} is unreachable: {m}", self.desc))),
            None => Ok(()),
        }
    }

    /// Records why the peer is gone (the first reason stays) and wakes a read waiting on it.
    pub fn set_dead(&self, why: String) {
        lock(&self.dead).get_or_insert(why);
        self.any_down.store(true, Ordering::Release);
        let _read = lock(&self.read);
        self.read_done.notify_all();
    }

    /// Records the failure the peer reported.
    pub fn set_failed(&self, why: String) {
        lock(&self.failed).get_or_insert(why);
        self.any_down.store(true, Ordering::Release);
        let _read = lock(&self.read);
        self.read_done.notify_all();
    }
}

/// Locks `m`, ignoring poisoning (the state stays consistent: every critical section only
/// stores whole values).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use super::*;
    use ampccl_runtime::sync::{Arc, thread};

    /// Two messages through one slot: the inbox fills it only once the protocol side released
    /// the previous one (and the sender got its credit); the reader sees each payload whole.
    #[test]
    fn loom_eager_slot_hands_the_payload_over() {
        loom::model(|| {
            let slot = Arc::new(EagerSlot::new(4));
            let credit = Arc::new(AtomicU32::new(0));
            let (s2, c2) = (slot.clone(), credit.clone());
            let inbox = thread::spawn(move || {
                for (idx, byte) in [(1u32, 7u8), (2, 9)] {
                    while c2.load(Ordering::Acquire) + 1 < idx {
                        thread::yield_now();
                    }
                    let put = s2.put(idx, 0, 4, |b| {
                        b.fill(byte);
                        Ok(())
                    });
                    assert!(put.unwrap(), "the slot was released before its credit");
                }
            });
            for (idx, byte) in [(1u32, 7u8), (2, 9)] {
                while slot.peek(idx).is_none() {
                    thread::yield_now();
                }
                let mut out = [0u8; 4];
                slot.read(&mut out);
                assert_eq!(out, [byte; 4]);
                slot.release();
                credit.store(idx, Ordering::Release);
            }
            inbox.join().unwrap();
        });
    }
}
