//! One bootstrap connection to one peer: framed, tagged messages with an unmatched-message
//! buffer, safe to use from several threads at once.
//!
//! Frame (little-endian, 32-byte header): tag space (u64), tag (u64), kind (u32), magic
//! `0xB007_F4A3` (u32), payload length (u64, at most 1 GiB), payload. A frame with a bad magic or
//! an oversized length is malformed and breaks the connection. The payload buffer grows with
//! the bytes that actually arrive (doubling from 64 KiB), not with the length the header
//! claims.
//!
//! A link to a peer on this host (same PID namespace) knows the peer's pid: a receive or send
//! that waits re-checks every [`CHECK_EVERY`] that the process still exists and fails at once
//! with [`Error::Remote`] when it does not (the connection alone may stay open after the peer
//! died, e.g. when a child it forked inherited the socket).
//!
//! Writes hold a per-connection mutex for the whole frame. Reads: whichever receiving thread finds
//! no matching message becomes the single *reader* (flag in the inbox) and reads one frame at a
//! time without holding the inbox lock; every frame goes into the inbox keyed by
//! (space, kind, tag) and wakes all waiters, so concurrent receivers of different tags never
//! block each other. A read interrupted by a timeout keeps its partial frame and resumes later.

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use ampccl_runtime::{Error, Result};

use super::wire::{
    CHECK_EVERY, Fields, IoFail, MAX_PAYLOAD, process_gone, read_resumable, remaining,
    write_all_watched,
};

const FRAME_MAGIC: u32 = 0xB007_F4A3;
const HEADER_BYTES: usize = 32;
/// Payloads up to this size are written together with their header in one `write`.
const COALESCE_BYTES: usize = 64 * 1024;
/// First allocation for a frame's payload; it doubles as bytes arrive, up to the frame length.
const BODY_CHUNK: usize = 64 * 1024;

/// Message kinds: one namespace of tags each, so collectives never match point-to-point messages.
pub(crate) const KIND_P2P: u32 = 0;
pub(crate) const KIND_ALLGATHER: u32 = 1;
pub(crate) const KIND_BARRIER: u32 = 2;
pub(crate) const KIND_BROADCAST: u32 = 3;

/// Matching key of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub space: u64,
    pub kind: u32,
    pub tag: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Tx {
    stream: TcpStream,
    broken: Option<String>,
}

struct Rx {
    stream: TcpStream,
    head: [u8; HEADER_BYTES],
    head_filled: usize,
    /// The frame being read: its key, the bytes so far (`len()` is what has been allocated
    /// and zeroed, `body_filled` of them are received) and its full length.
    body: Option<(Key, Vec<u8>, usize)>,
    body_filled: usize,
}

impl Rx {
    /// Reads (or resumes) one frame; `Ok(None)` when `deadline` passes first.
    fn read_frame(&mut self, deadline: Instant) -> Result<Option<(Key, Vec<u8>)>, String> {
        if self.body.is_none() {
            match read_resumable(
                &mut self.stream,
                &mut self.head,
                &mut self.head_filled,
                deadline,
            ) {
                Ok(()) => {}
                Err(IoFail::Timeout) => return Ok(None),
                Err(e) => return Err(e.to_string()),
            }
            self.head_filled = 0;
            let mut f = Fields(&self.head);
            let (space, tag, kind, magic, len) = (f.u64(), f.u64(), f.u32(), f.u32(), f.u64());
            if magic != FRAME_MAGIC || len > MAX_PAYLOAD || kind > KIND_BROADCAST {
                return Err(format!(
                    "malformed frame (magic {magic:#x}, kind {kind}, length {len})"
                ));
            }
            let len = len as usize;
            self.body = Some((
                Key { space, kind, tag },
                vec![0u8; len.min(BODY_CHUNK)],
                len,
            ));
            self.body_filled = 0;
        }
        let (_, buf, len) = self.body.as_mut().expect("body set above");
        loop {
            match read_resumable(&mut self.stream, buf, &mut self.body_filled, deadline) {
                Ok(()) if buf.len() == *len => {
                    return Ok(self.body.take().map(|(key, buf, _)| (key, buf)));
                }
                // What has arrived fills the buffer: grow it for more.
                Ok(()) => buf.resize((*len).min(2 * buf.len()), 0),
                Err(IoFail::Timeout) => return Ok(None),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

#[derive(Default)]
struct Inbox {
    pending: HashMap<Key, VecDeque<Vec<u8>>>,
    reading: bool,
    closed: Option<String>,
}

/// Connection to one peer (or the loopback to oneself, which has no socket).
pub(crate) struct Link {
    tx: Option<Mutex<Tx>>,
    rx: Option<Mutex<Rx>>,
    inbox: Mutex<Inbox>,
    cv: Condvar,
    /// The peer's pid, where [`process_gone`] can check it (same host and PID namespace).
    watch: Option<u32>,
}

/// Names a peer in error messages: its rank in the handle and, if different, its global rank.
pub(crate) fn who(local: usize, global: usize) -> String {
    if local == global {
        format!("peer rank {local}")
    } else {
        format!("peer rank {local} (global rank {global})")
    }
}

impl Link {
    /// Loopback link: messages to oneself go straight into the inbox.
    pub(crate) fn loopback() -> Link {
        Link {
            tx: None,
            rx: None,
            inbox: Mutex::default(),
            cv: Condvar::new(),
            watch: None,
        }
    }

    /// Link over an established, handshaken connection; `watch` is the peer's pid if
    /// [`process_gone`] can check it.
    pub(crate) fn remote(stream: TcpStream, watch: Option<u32>) -> std::io::Result<Link> {
        let rx = Rx {
            stream: stream.try_clone()?,
            head: [0; HEADER_BYTES],
            head_filled: 0,
            body: None,
            body_filled: 0,
        };
        Ok(Link {
            tx: Some(Mutex::new(Tx {
                stream,
                broken: None,
            })),
            rx: Some(Mutex::new(rx)),
            inbox: Mutex::default(),
            cv: Condvar::new(),
            watch,
        })
    }

    /// Why the peer is known to be dead, if it is.
    fn gone(&self) -> Option<String> {
        let pid = self.watch?;
        process_gone(pid).then(|| format!("its process (pid {pid}) has exited"))
    }

    /// Bytes allocated for the frame being received (tests: the buffer follows the bytes that
    /// arrived, not the length a header claims).
    #[cfg(test)]
    pub(crate) fn receive_buffer_bytes(&self) -> usize {
        self.rx.as_ref().map_or(0, |rx| {
            lock(rx)
                .body
                .as_ref()
                .map_or(0, |(_, buf, _)| buf.capacity())
        })
    }

    /// Sends one message; `peer` names the peer in errors. A failed or timed-out write breaks the
    /// link (the frame may be half written), so later sends fail with [`Error::Remote`].
    pub(crate) fn send(
        &self,
        key: Key,
        data: &[u8],
        deadline: Instant,
        peer: &dyn Fn() -> String,
    ) -> Result<()> {
        let gone = || self.gone();
        if data.len() as u64 > MAX_PAYLOAD {
            return Err(Error::InvalidArgument(format!(
                "bootstrap message of {} bytes to {} exceeds the 1 GiB limit",
                data.len(),
                peer()
            )));
        }
        let Some(tx) = &self.tx else {
            let mut inbox = lock(&self.inbox);
            inbox
                .pending
                .entry(key)
                .or_default()
                .push_back(data.to_vec());
            self.cv.notify_all();
            return Ok(());
        };
        let mut head = Vec::with_capacity(HEADER_BYTES + data.len().min(COALESCE_BYTES));
        head.extend_from_slice(&key.space.to_le_bytes());
        head.extend_from_slice(&key.tag.to_le_bytes());
        head.extend_from_slice(&key.kind.to_le_bytes());
        head.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        head.extend_from_slice(&(data.len() as u64).to_le_bytes());
        let mut tx = lock(tx);
        if let Some(why) = &tx.broken {
            return Err(Error::Remote(format!(
                "bootstrap link to {} is broken: {why}",
                peer()
            )));
        }
        let res = if data.len() <= COALESCE_BYTES {
            head.extend_from_slice(data);
            write_all_watched(&mut tx.stream, &[&head], deadline, &gone)
        } else {
            write_all_watched(&mut tx.stream, &[&head, data], deadline, &gone)
        };
        res.map_err(|e| {
            let _ = tx.stream.shutdown(Shutdown::Write);
            tx.broken = Some(format!("an earlier send failed: {e}"));
            match e {
                IoFail::Timeout => Error::Timeout(format!(
                    "bootstrap send to {} (tag {}) timed out",
                    peer(),
                    key.tag
                )),
                e => Error::Remote(format!(
                    "bootstrap send to {} (tag {}): {e}",
                    peer(),
                    key.tag
                )),
            }
        })
    }

    /// Receives the oldest message with `key`, buffering the others.
    pub(crate) fn recv(
        &self,
        key: Key,
        deadline: Instant,
        peer: &dyn Fn() -> String,
    ) -> Result<Vec<u8>> {
        let mut inbox = lock(&self.inbox);
        loop {
            if let Some(msg) = inbox.pending.get_mut(&key).and_then(VecDeque::pop_front) {
                if inbox.pending.get(&key).is_some_and(VecDeque::is_empty) {
                    inbox.pending.remove(&key);
                }
                return Ok(msg);
            }
            if let Some(why) = &inbox.closed {
                return Err(Error::Remote(format!(
                    "bootstrap recv from {} (tag {}): {why}",
                    peer(),
                    key.tag
                )));
            }
            let Some(left) = remaining(deadline) else {
                return Err(Error::Timeout(format!(
                    "bootstrap recv from {} (tag {}) timed out",
                    peer(),
                    key.tag
                )));
            };
            match &self.rx {
                Some(rx) if !inbox.reading => {
                    inbox.reading = true;
                    drop(inbox);
                    // In slices, so that a peer that died is noticed while we wait.
                    let frame = lock(rx).read_frame(deadline.min(Instant::now() + CHECK_EVERY));
                    inbox = lock(&self.inbox);
                    inbox.reading = false;
                    match frame {
                        Ok(Some((k, msg))) => inbox.pending.entry(k).or_default().push_back(msg),
                        Ok(None) => {
                            if let Some(why) = self.gone() {
                                inbox.closed = Some(why);
                            }
                        }
                        Err(why) => inbox.closed = Some(why),
                    }
                    self.cv.notify_all();
                }
                _ => {
                    inbox = self
                        .cv
                        .wait_timeout(inbox, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            }
        }
    }
}
