//! What the TCP provider knows about one peer: the connection's sending half, and the state its
//! frames deliver — the mirror of what the shared-memory provider keeps in its segment (the
//! clear-to-send FIFO, completion slots, eager slots, credits, acks), which the protocol polls
//! with loads, plus what validates the peer's writes and reads (the memory each posted
//! clear-to-send names) and the peer's health.
//!
//! Whoever holds the connection's inbox ([`super::reader`]: the engine while it polls, or the
//! receiving thread) is the only writer of the delivered state; everything else only reads it,
//! except the eager slots, which pass between the two sides by their `full` flag: the inbox
//! fills a slot only while it is empty, the protocol reads it only while it is full, and empties
//! it when it posts the slot's credit.

use std::cell::UnsafeCell;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use ampccl_runtime::{Error, Result};

use super::frame::Header;
use crate::device::CtsEntry;

/// One eager slot.
pub(super) struct EagerSlot {
    pub idx: AtomicU32,
    pub tag: AtomicU32,
    pub len: AtomicU32,
    /// Set by the reader once the payload is in, cleared by the engine with the credit.
    pub full: AtomicBool,
    pub payload: UnsafeCell<Box<[u8]>>,
}

/// The memory a posted clear-to-send names, which the peer's writes (or reads, for an offer)
/// must stay inside; closed again by the transfer's immediate.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Region {
    pub open: bool,
    pub read: bool,
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

/// Everything about one peer.
pub(super) struct Peer {
    /// The sending half (frames go out whole under the lock).
    pub out: Mutex<TcpStream>,
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
    /// "rank 3 (pid 123 on host-b)".
    pub desc: String,
}

// SAFETY: the eager payloads are handed between the reader thread and the engine by the
// slots' `full` flags (module docs); everything else is atomics and locks.
unsafe impl Sync for Peer {}

impl Peer {
    pub fn new(out: TcpStream, depth: usize, eager_max: usize, desc: String) -> Peer {
        Peer {
            out: Mutex::new(out),
            cts: (0..depth).map(|_| CtsCell::default()).collect(),
            imm: (0..depth).map(|_| Default::default()).collect(),
            eager: (0..depth)
                .map(|_| EagerSlot {
                    idx: AtomicU32::new(0),
                    tag: AtomicU32::new(0),
                    len: AtomicU32::new(0),
                    full: AtomicBool::new(false),
                    payload: UnsafeCell::new(vec![0u8; eager_max].into_boxed_slice()),
                })
                .collect(),
            credits: (0..depth).map(|_| AtomicU32::new(0)).collect(),
            acks: AtomicU32::new(0),
            regions: Mutex::new(vec![Region::default(); depth].into_boxed_slice()),
            read: Mutex::new(None),
            read_done: Condvar::new(),
            reading: Mutex::new(0),
            dead: Mutex::new(None),
            failed: Mutex::new(None),
            any_down: AtomicBool::new(false),
            desc,
        }
    }

    /// Sends one frame: the header, then `payload` (whole, or an error naming the peer).
    pub fn send(&self, h: &Header, payload: &[u8]) -> Result<()> {
        let out = lock(&self.out);
        let head = h.encode();
        send_all(out.as_raw_fd(), &[&head[..], payload]).map_err(|e| {
            Error::Remote(format!("{}: connection lost while sending: {e}", self.desc))
        })
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

/// Writes every buffer of `bufs` to the socket `fd` whole (`MSG_NOSIGNAL`: a closed peer is
/// an error, not a `SIGPIPE` that kills a C host program).
fn send_all(fd: i32, bufs: &[&[u8]]) -> std::io::Result<()> {
    for buf in bufs {
        let mut off = 0;
        while off < buf.len() {
            let rest = &buf[off..];
            // SAFETY: `rest` is a live slice; `send` reads at most `rest.len()` bytes of it.
            let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            off += n as usize;
        }
    }
    Ok(())
}

/// Locks `m`, ignoring poisoning (the state stays consistent: every critical section only
/// stores whole values).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
