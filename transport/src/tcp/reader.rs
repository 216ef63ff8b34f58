//! The receiving side of one peer's connection: an [`Inbox`] that applies the peer's frames
//! to its state ([`super::peer`]), from two places. The engine, while it polls the device,
//! applies every complete small frame already waiting in the socket ([`Inbox::progress`]): no
//! thread hand-off between a message's arrival and the wait that needs it. A receiving thread
//! per connection ([`run`]) blocks in `poll` while nothing arrives (no core burnt while idle)
//! and applies what the engine leaves: large payloads (a one-sided write's, received straight
//! into the memory the matching clear-to-send named; a read response's, into the reader's
//! buffer: no staging copy) and frames that arrive while no engine polls; it rings the engine's
//! doorbell after each. The inbox's lock keeps the two from reading the socket at once.
//!
//! The thread ends when the connection closes or the peer breaks the protocol; either way the
//! peer is recorded dead with the reason, so every wait on it fails at its next health check.

use std::io::Read;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::{Error, Result};

use super::frame::{self, CTS_BYTES, HEADER, Header, Kind, bad};
use super::peer::{Peer, lock};

/// The receiving half of one connection.
pub(super) struct Inbox {
    pub peer: Arc<Peer>,
    pub stream: TcpStream,
    pub depth: usize,
    pub eager_max: usize,
    /// Why the stream can no longer be read (a frame the engine's progress found bad, after
    /// part of it was consumed).
    pub broken: Option<String>,
}

/// How long the receiving thread leaves a readable socket to an engine that polled it last
/// less than this long ago.
const ENGINE_GRACE: std::time::Duration = std::time::Duration::from_micros(200);

/// The receiving thread of `inbox`'s connection (socket `fd`): runs until the connection ends
/// and records why.
pub(super) fn run(inbox: Arc<Mutex<Inbox>>, fd: RawFd, bell: Doorbell, peer: Arc<Peer>) {
    let why = loop {
        if let Err(e) = wait_readable(fd) {
            break format!("connection lost: {e}");
        }
        // While the engine polls this peer it applies what arrives itself; taking the inbox
        // now would only make it wait (and cost a core on a small host).
        if peer.polled_recently() {
            std::thread::sleep(ENGINE_GRACE);
            continue;
        }
        match lock(&inbox).drain(&bell) {
            Ok(true) => {}
            Ok(false) => break "the connection was closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    peer.set_dead(why);
    bell.ring();
}

/// Blocks until `fd` has something to read (data, the end of the stream, or an error).
fn wait_readable(fd: RawFd) -> std::io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Bytes waiting in the socket `fd` (0 when it cannot be asked).
fn available(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if r < 0 { 0 } else { n.max(0) as usize }
}

impl Inbox {
    /// Applies frames while the socket has bytes (each frame read whole, waiting for its rest);
    /// `Ok(false)` at the end of the stream.
    fn drain(&mut self, bell: &Doorbell) -> Result<bool> {
        if let Some(why) = &self.broken {
            return Err(Error::Remote(why.clone()));
        }
        loop {
            let mut one = [0u8; 1];
            // SAFETY: `one` is valid for one byte; MSG_PEEK leaves it in the socket.
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    one.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => return Ok(false),
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    return match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => {
                            Ok(true)
                        }
                        _ => Err(Error::Remote(format!("connection lost: {e}"))),
                    };
                }
                _ => {
                    if !self.next()? {
                        return Ok(false);
                    }
                    bell.ring();
                }
            }
        }
    }

    /// Applies every frame that is already whole in the socket, without blocking (a payload
    /// larger than what has arrived is left to the receiving thread): the engine's share of
    /// the receiving, on every poll of the device.
    pub fn progress(&mut self) {
        if self.broken.is_some() {
            return;
        }
        let fd = self.stream.as_raw_fd();
        loop {
            let waiting = available(fd);
            if waiting < HEADER {
                return;
            }
            let mut head = [0u8; HEADER];
            // SAFETY: `head` is valid for HEADER bytes; MSG_PEEK leaves them in the socket.
            let n = unsafe {
                libc::recv(
                    fd,
                    head.as_mut_ptr().cast(),
                    HEADER,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n != HEADER as isize {
                return;
            }
            // A bad header is the receiving thread's to report (it reads the same bytes).
            let Ok(h) = Header::decode(&head, self.depth, self.eager_max) else {
                return;
            };
            let payload = match h.kind {
                Kind::Imm | Kind::Credit | Kind::Ack | Kind::ReadReq => 0,
                _ => usize::try_from(h.len).unwrap_or(usize::MAX),
            };
            if waiting < HEADER.saturating_add(payload) {
                return;
            }
            if let Err(e) = self.next() {
                // Part of the frame is consumed: the stream cannot be read any further.
                self.broken = Some(e.to_string());
                self.peer.set_dead(e.to_string());
                return;
            }
        }
    }

    /// Receives and applies one frame; `Ok(false)` at a clean end of the stream.
    fn next(&mut self) -> Result<bool> {
        let mut head = [0u8; HEADER];
        match self.stream.read(&mut head[..1]) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(e) => return Err(Error::Remote(format!("connection lost: {e}"))),
        }
        self.fill(&mut head[1..])?;
        let h = Header::decode(&head, self.depth, self.eager_max)?;
        let peer = self.peer.clone();
        let slot = h.slot as usize;
        match h.kind {
            Kind::Cts => {
                let mut b = [0u8; CTS_BYTES];
                self.fill(&mut b)?;
                peer.cts[slot].store(&frame::decode_cts(&b));
            }
            Kind::Write => {
                self.check_region(slot, h.addr, h.len, false)?;
                // SAFETY: `[addr, addr + len)` lies inside the memory our clear-to-send of this
                // slot named, which the receive owning it keeps valid and untouched until the
                // transfer's immediate closes the region (after this payload, in stream order).
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(h.addr as *mut u8, h.len as usize) };
                self.fill(dst)?;
            }
            Kind::Imm => {
                lock(&peer.regions)[slot].open = false;
                let (imm, len) = &peer.imm[slot];
                len.store(h.len, Ordering::Relaxed);
                imm.store(h.a, Ordering::Release);
            }
            Kind::Eager => {
                let len = h.len as usize;
                if !peer.eager[slot].put(h.a, h.b, len, |buf| self.fill(buf))? {
                    return Err(bad(format!("eager message into the full slot {slot}")));
                }
            }
            Kind::Credit => peer.credits[slot].store(h.a, Ordering::Release),
            Kind::Ack => {
                peer.acks.fetch_add(1, Ordering::Release);
            }
            Kind::ReadReq => {
                self.check_region(slot, h.addr, h.len, true)?;
                // SAFETY: inside the memory our offer of this slot named, which stays valid
                // and unmodified until the reader's immediate completes the offer.
                let src =
                    unsafe { std::slice::from_raw_parts(h.addr as *const u8, h.len as usize) };
                let mut resp = Header::new(Kind::ReadResp);
                resp.a = h.a;
                resp.len = h.len;
                peer.send(&resp, src)?;
            }
            Kind::ReadResp => self.read_response(&h)?,
            Kind::Fail => {
                let mut text = vec![0u8; h.len as usize];
                self.fill(&mut text)?;
                peer.set_failed(String::from_utf8_lossy(&text).into_owned());
            }
        }
        Ok(true)
    }

    /// Fills `buf` from the stream (the frame's rest must come).
    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        self.stream
            .read_exact(buf)
            .map_err(|e| Error::Remote(format!("connection lost in a frame: {e}")))
    }

    /// Checks that the peer's write (or read) of `len` bytes at `addr` lies inside the open
    /// region of clear-to-send `slot`, of the right way.
    fn check_region(&self, slot: usize, addr: u64, len: u64, read: bool) -> Result<()> {
        let r = lock(&self.peer.regions)[slot];
        let inside = addr.checked_add(len).is_some_and(|end| {
            addr >= r.addr && r.addr.checked_add(r.len).is_some_and(|r_end| end <= r_end)
        });
        if r.open && r.read == read && (inside || len == 0) {
            return Ok(());
        }
        Err(bad(format!(
            "{} of {len} bytes at {addr:#x} outside what clear-to-send {slot} offers",
            if read { "a read" } else { "a write" }
        )))
    }

    /// Receives the answer to our pending read straight into its buffer. The pending read's
    /// lock is held while the payload comes in, so the read cannot give its buffer up (at its
    /// timeout) in the middle of it.
    fn read_response(&mut self, h: &Header) -> Result<()> {
        let peer = self.peer.clone();
        let mut pending = lock(&peer.read);
        let Some(p) = pending
            .as_mut()
            .filter(|p| p.id == h.a && p.len == h.len && !p.done)
        else {
            return Err(bad(format!(
                "an unexpected read response ({} bytes)",
                h.len
            )));
        };
        // SAFETY: the read that owns `dst` keeps it valid for `len` bytes while it is pending,
        // and it stops being pending only under this lock.
        let dst = unsafe { std::slice::from_raw_parts_mut(p.dst, p.len as usize) };
        self.stream
            .read_exact(dst)
            .map_err(|e| Error::Remote(format!("connection lost in a read response: {e}")))?;
        p.done = true;
        peer.read_done.notify_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A header that claims more payload than the address space holds is left to the receiving
    /// thread (which rejects the write: no clear-to-send names it), never an overflow.
    #[test]
    fn a_huge_claimed_length_is_not_applied_by_the_engine() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let out = rx.try_clone().unwrap();
        let peer = Arc::new(Peer::new(out, 4, 64, "rank 1".into()));
        let mut h = Header::new(Kind::Write);
        h.len = u64::MAX;
        tx.write_all(&h.encode()).unwrap();
        let mut inbox = Inbox {
            peer: peer.clone(),
            stream: rx,
            depth: 4,
            eager_max: 64,
            broken: None,
        };
        while available(inbox.stream.as_raw_fd()) < HEADER {
            std::thread::yield_now();
        }
        inbox.progress();
        assert!(inbox.broken.is_none() && peer.health().is_ok());
        // The receiving thread's path reads it and refuses it.
        let e = inbox.next().unwrap_err().to_string();
        assert!(e.contains("outside what clear-to-send"), "{e}");
    }
}
