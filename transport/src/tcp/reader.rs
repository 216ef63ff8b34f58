//! The receiving side of one peer's connection: an [`Inbox`] that applies the peer's frames
//! to its state ([`super::peer`]), from two places. The engine, while it polls the device,
//! applies whatever has arrived ([`Inbox::progress`]): no thread hand-off between a message's
//! arrival and the wait that needs it. One receiving thread per device ([`run`]) blocks in
//! `epoll_wait` on all its connections while nothing arrives (no core burnt while idle) and
//! applies what arrives while no engine polls; it rings the engine's doorbell after each frame.
//! The inbox's lock keeps the two from reading a socket at once.
//!
//! Both read the socket without blocking, in as few `recv` calls as possible: headers and
//! small payloads go through a receive buffer (one `recv` takes every frame that is there),
//! a one-sided write's payload goes straight into the memory the matching clear-to-send named
//! (what came with the buffer is copied, the rest is received in place) and may arrive over
//! several calls, from either side ([`Inbox`]'s `partial`). Only a read response is taken
//! whole once its header is in, under the pending read's lock (the read cannot give its
//! buffer up halfway); its payload follows its header in one `sendmsg`.
//!
//! While a socket is parked (the engine polls it), its `SO_RCVLOWAT` is raised to
//! [`POLLED_LOWAT`]. Nothing waits for its readiness then, and the kernel's choice of when to
//! acknowledge depends on it: a message of more than one segment is acknowledged on arrival only
//! while less than the low-water mark is unread, or while the window it would advertise has not
//! shrunk since the last one. Once a connection has carried messages of several sizes, the
//! window test fails for the larger ones, and the acknowledgement leaves from the reader's
//! `recv` instead, on the critical path (over a veth pair that `recv` also runs the peer's
//! receipt of it). The mark goes back to 1 before the socket is watched again, and around the
//! one blocking read ([`Inbox`]'s read responses), whose wake-up needs it.
//!
//! The thread ends when the connection closes or the peer breaks the protocol; either way the
//! peer is recorded dead with the reason, so every wait on it fails at its next health check.

use std::io::Read;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{Error, Result};

use super::frame::{self, CTS_BYTES, HEADER, Header, Kind, MAX_TEXT, bad};
use super::peer::{Peer, lock};
use crate::handback::Handback;

/// Bytes of the receive buffer: many small frames per `recv`; at least a header and the
/// largest payload that is taken whole (an eager message, a failure text).
const RX_BUF: usize = 64 << 10;

/// `AMPCCL_TCP_POLLED_LOWAT`: the receive low-water mark of a socket the engine polls.
pub static POLLED_LOWAT: Param = Param::new(
    "TCP_POLLED_LOWAT",
    16 << 10,
    (0, 1 << 20),
    Unit::Bytes,
    "receive low-water mark (SO_RCVLOWAT) of a TCP socket while the engine polls it: the kernel \
     acknowledges messages up to this size on arrival instead of in the reader's recv; 0: left \
     alone",
);

/// The receiving half of one connection.
pub(super) struct Inbox {
    peer: Arc<Peer>,
    stream: TcpStream,
    depth: usize,
    eager_max: usize,
    /// Connections per peer: the most copies a striped immediate may have.
    nsocks: usize,
    /// Why the stream can no longer be read (a bad frame or the end of the stream).
    broken: Option<String>,
    /// Received bytes not applied yet: `buf[start..end]`.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The rest of a one-sided write's payload, still to come: where and how much.
    partial: Option<(*mut u8, usize)>,
    /// The last `recv` returned less than it had room for: the socket was empty then, so the
    /// next step that needs more bytes ends this pass instead of asking again (one system call
    /// saved per arrival; the next poll, or the level-triggered `epoll`, asks again).
    drained: bool,
    /// The socket's `SO_RCVLOWAT` as last set: raised while parked, 1 while watched.
    lowat: usize,
}

// SAFETY: `partial` points into memory a posted clear-to-send named, which the receive that
// owns it keeps valid until the transfer's immediate, after this payload in stream order; it
// is only written under the inbox's lock, from whichever thread holds it.
unsafe impl Send for Inbox {}

/// What one step of receiving did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A frame was applied (waiters may proceed).
    Applied,
    /// Bytes moved but no frame completed.
    Moved,
    /// Nothing more has arrived.
    Idle,
}

/// How often the receiving thread looks whether the engine still polls the peers of parked
/// sockets when nothing wakes it: the engine says when its driver goes to sleep
/// ([`Handback`]), so this only bounds how long a socket stays parked after the engine ended
/// its work without sleeping (nobody waits for that socket then).
pub(super) const PARKED_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// A connection the receiving thread watches: its socket, inbox and peer.
pub(super) type Watched = (RawFd, Arc<Mutex<Inbox>>, Arc<Peer>);

/// The receiving thread of one device: blocks in `epoll_wait` on every connection in
/// `conns` (their sockets and inboxes), applies what arrives where no engine polls, rings
/// `bell` after each frame; a connection that ends or breaks is recorded (its peer is dead)
/// and dropped from the set. Returns when no connection is left.
///
/// A socket whose peer the engine polls is taken out of the set (*parked*) until the engine
/// stops polling that peer: the engine applies what arrives itself, and a thread woken for
/// every message would take a core from it on a small host. The engine's driver says so
/// through `handback` right before it sleeps (after clearing the peers' poll marks,
/// [`crate::handback::PollMark::stop`]), and the thread re-arms the parked sockets at once; what arrived
/// meanwhile is reported then (level-triggered), so a message after the driver's last look
/// rings the doorbell it sleeps on. Without that word the thread looks every `recheck` whether
/// a peer went unpolled for [`crate::handback::ENGINE_GRACE`]; it does not wake while the engine
/// polls.
pub(super) fn run(conns: Vec<Watched>, bell: Doorbell, handback: Arc<Handback>, recheck: Duration) {
    let fail_all = |why: Error| {
        for (_, inbox, _) in &conns {
            lock(inbox).break_with(why.clone());
        }
        bell.ring();
    };
    let epoll = match Epoll::new(&conns, handback.fd()) {
        Ok(e) => e,
        Err(e) => return fail_all(Error::system("tcp: epoll", &e)),
    };
    let mut live = conns.len();
    let mut parked = vec![false; conns.len()];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; conns.len().min(256)];
    while live > 0 {
        // Sockets whose peer the engine stopped polling are watched again (level-triggered:
        // what arrived meanwhile is reported at once).
        let mut any_parked = false;
        for (i, (fd, _, peer)) in conns.iter().enumerate() {
            if parked[i] && !peer.polled.recent() {
                parked[i] = false;
                // Readiness needs the low-water mark back at 1 before the socket is watched.
                if let Err(e) = lock(&conns[i].1).set_lowat(1) {
                    return fail_all(e);
                }
                if let Err(e) = epoll.watch(*fd, i, true) {
                    return fail_all(Error::system("tcp: epoll_ctl", &e));
                }
            }
            any_parked |= parked[i];
        }
        let timeout = if any_parked {
            recheck.as_millis().clamp(1, i32::MAX as u128) as i32
        } else {
            -1
        };
        let ready = match epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(e) => return fail_all(Error::Remote(format!("tcp: epoll_wait: {e}"))),
        };
        for ev in &events[..ready] {
            let i = ev.u64 as usize;
            if i == HANDBACK {
                // The parked sockets are re-armed at the top of the loop (their peers' marks
                // are cleared).
                handback.take();
                continue;
            }
            let (fd, inbox, peer) = &conns[i];
            if parked[i] {
                continue;
            }
            if peer.polled.recent() && lock(inbox).broken.is_none() {
                parked[i] = true;
                if let Err(e) = epoll.watch(*fd, i, false) {
                    return fail_all(Error::system("tcp: epoll_ctl", &e));
                }
                if let Err(e) = lock(inbox).set_lowat(POLLED_LOWAT.get().max(1) as usize) {
                    return fail_all(e);
                }
                continue;
            }
            if lock(inbox).drain(&bell).is_err() {
                epoll.remove(*fd);
                live -= 1;
                bell.ring();
            }
        }
    }
}

/// The index the [`Handback`] is registered with in the receiving thread's `epoll` set.
const HANDBACK: usize = usize::MAX;

/// An epoll instance over a device's sockets (each registered with its index in the set) and
/// its [`Handback`].
struct Epoll(OwnedFd);

impl Epoll {
    fn new(conns: &[Watched], handback: RawFd) -> std::io::Result<Epoll> {
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let e = Epoll(unsafe { OwnedFd::from_raw_fd(fd) });
        let socks = conns
            .iter()
            .enumerate()
            .map(|(i, (sock, _, _))| (*sock, (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, i as u64));
        let word = (handback, libc::EPOLLIN as u32, HANDBACK as u64);
        for (sock, events, index) in socks.chain([word]) {
            let mut ev = libc::epoll_event { events, u64: index };
            // SAFETY: `ev` is a valid event for the call; `sock` is an open descriptor.
            if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, sock, &mut ev) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(e)
    }

    /// Waits for ready sockets (at most `timeout_ms`, -1: no limit); returns how many of
    /// `events` were filled.
    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> std::io::Result<usize> {
        loop {
            // SAFETY: `events` is valid for `events.len()` entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.0.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout_ms,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Watches `sock` (number `index` of the set) for input again (`on`), or stops (errors and
    /// hang-ups still report).
    fn watch(&self, sock: RawFd, index: usize, on: bool) -> std::io::Result<()> {
        let events = if on {
            libc::EPOLLIN | libc::EPOLLRDHUP
        } else {
            0
        };
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: index as u64,
        };
        // SAFETY: `ev` is a valid event for the call; `sock` is registered.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_MOD, sock, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn remove(&self, sock: RawFd) {
        // SAFETY: plain system call on our epoll descriptor (a null event is allowed for DEL).
        unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                sock,
                std::ptr::null_mut(),
            );
        }
    }
}

/// One `recv` without blocking into `dst`: `Some(n)` bytes (0: the end of the stream), `None`
/// when nothing is there.
fn recv_some(fd: RawFd, dst: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        // SAFETY: `dst` is valid for `dst.len()` bytes of writes.
        let n = unsafe { libc::recv(fd, dst.as_mut_ptr().cast(), dst.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(None),
            std::io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

impl Inbox {
    /// The inbox of one of `peer`'s connections, for `depth` slots, eager messages of up to
    /// `eager_max` bytes and `nsocks` connections per peer.
    pub fn new(
        peer: Arc<Peer>,
        stream: TcpStream,
        (depth, eager_max, nsocks): (usize, usize, usize),
    ) -> Inbox {
        assert!(HEADER + eager_max.max(MAX_TEXT as usize).max(CTS_BYTES) <= RX_BUF);
        Inbox {
            peer,
            stream,
            depth,
            eager_max,
            nsocks,
            broken: None,
            buf: vec![0u8; RX_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            partial: None,
            drained: false,
            lowat: 1,
        }
    }

    /// Sets the socket's receive low-water mark (`SO_RCVLOWAT`) to `bytes`.
    fn set_lowat(&mut self, bytes: usize) -> Result<()> {
        if bytes == self.lowat {
            return Ok(());
        }
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: plain system call on the inbox's open socket with a valid `c_int` option.
        let r = unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(Error::system(
                "tcp: SO_RCVLOWAT",
                std::io::Error::last_os_error(),
            ));
        }
        self.lowat = bytes;
        Ok(())
    }

    /// The receiving thread's share: applies frames until nothing more has arrived, ringing
    /// `bell` after each; `Err(why)` once the stream ended or broke.
    fn drain(&mut self, bell: &Doorbell) -> std::result::Result<(), String> {
        loop {
            match self.step() {
                Ok(Step::Applied) => bell.ring(),
                Ok(Step::Moved) => {}
                Ok(Step::Idle) => return Ok(()),
                Err(e) => return Err(self.break_with(e)),
            }
        }
    }

    /// The engine's share, on every poll of the device: applies whatever has arrived, without
    /// blocking (but for the rest of a read response whose header came).
    pub fn progress(&mut self) {
        loop {
            match self.step() {
                Ok(Step::Applied | Step::Moved) => {}
                Ok(Step::Idle) => return,
                Err(e) => {
                    self.break_with(e);
                    return;
                }
            }
        }
    }

    /// Records that the stream cannot be read any further and why (the peer is dead).
    fn break_with(&mut self, e: Error) -> String {
        let why = self.broken.get_or_insert_with(|| e.to_string()).clone();
        self.peer.set_dead(why.clone());
        why
    }

    /// Bytes received and not applied yet.
    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Receives more into the buffer: `Ok(true)` if bytes came; `Ok(false)` without a system
    /// call right after a `recv` that emptied the socket (see `drained`).
    fn fill_buf(&mut self) -> Result<bool> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if std::mem::take(&mut self.drained) {
            return Ok(false);
        }
        let fd = self.stream.as_raw_fd();
        let room = self.buf.len() - self.end;
        match recv_some(fd, &mut self.buf[self.end..]) {
            Ok(Some(0)) if self.buffered() == 0 && self.partial.is_none() => {
                Err(Error::Remote("the connection was closed".into()))
            }
            Ok(Some(0)) => Err(Error::Remote("connection lost in a frame".into())),
            Ok(Some(n)) => {
                self.end += n;
                self.drained = n < room;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(Error::Remote(format!("connection lost: {e}"))),
        }
    }

    /// One step: the rest of a partial write, or the next frame if it is there.
    fn step(&mut self) -> Result<Step> {
        if let Some(why) = &self.broken {
            return Err(Error::Remote(why.clone()));
        }
        if let Some((dst, left)) = self.partial {
            return self.continue_write(dst, left);
        }
        if self.buffered() < HEADER {
            return Ok(if self.fill_buf()? {
                Step::Moved
            } else {
                Step::Idle
            });
        }
        let head: &[u8; HEADER] = self.buf[self.start..self.start + HEADER]
            .try_into()
            .expect("a header");
        let h = Header::decode(head, self.depth, self.eager_max)?;
        let whole = h.inline_len();
        if self.buffered() < HEADER + whole {
            return Ok(if self.fill_buf()? {
                Step::Moved
            } else {
                Step::Idle
            });
        }
        self.start += HEADER;
        let body = self.start;
        self.start += whole;
        self.apply(&h, body)?;
        Ok(match h.kind {
            Kind::Write if self.partial.is_some() => Step::Moved,
            _ => Step::Applied,
        })
    }

    /// Receives more of the write whose `left` bytes go to `dst`: first from the buffer, then
    /// straight from the socket.
    fn continue_write(&mut self, dst: *mut u8, left: usize) -> Result<Step> {
        // SAFETY: see `Inbox`'s `Send`: `dst` stays valid for `left` bytes until we finish.
        let out = unsafe { std::slice::from_raw_parts_mut(dst, left) };
        let n = if self.buffered() > 0 {
            let n = left.min(self.buffered());
            out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            n
        } else {
            match recv_some(self.stream.as_raw_fd(), out) {
                Ok(Some(0)) => return Err(Error::Remote("connection lost in a frame".into())),
                Ok(Some(n)) => {
                    // Whatever emptied the socket before, more has come since.
                    self.drained = false;
                    n
                }
                Ok(None) => return Ok(Step::Idle),
                Err(e) => return Err(Error::Remote(format!("connection lost in a frame: {e}"))),
            }
        };
        self.partial = (n < left).then(|| (dst.wrapping_add(n), left - n));
        Ok(if self.partial.is_some() {
            Step::Moved
        } else {
            Step::Applied
        })
    }

    /// Applies frame `h`, whose payload (if taken whole) starts at `buf[body]`.
    fn apply(&mut self, h: &Header, body: usize) -> Result<()> {
        let slot = h.slot as usize;
        match h.kind {
            Kind::Write => {
                self.check_region(slot, h.addr, h.len, false)?;
                if h.len > 0 {
                    // Its bounds are checked: the rest comes in `continue_write`.
                    self.partial = Some((h.addr as *mut u8, h.len as usize));
                    self.continue_write(h.addr as *mut u8, h.len as usize)?;
                }
                return Ok(());
            }
            Kind::ReadResp => return self.read_response(h),
            _ => {}
        }
        let peer = &*self.peer;
        let payload = &self.buf[body..body + h.inline_len()];
        match h.kind {
            Kind::Cts => {
                let b: &[u8; CTS_BYTES] = payload.try_into().expect("a clear-to-send entry");
                peer.cts[slot].store(&frame::decode_cts(b));
            }
            Kind::Imm => {
                // A striped transfer's immediate comes once per connection that carried a
                // stripe; the last copy publishes it (see `super::stripe`).
                let copies = h.b.max(1);
                if copies as usize > self.nsocks {
                    return Err(bad(format!("an immediate in {copies} copies")));
                }
                let parts = &peer.imm_parts[slot];
                if parts.fetch_add(1, Ordering::AcqRel) + 1 < copies {
                    return Ok(());
                }
                parts.store(0, Ordering::Relaxed);
                peer.close_region(slot);
                let (imm, len) = &peer.imm[slot];
                len.store(h.len, Ordering::Relaxed);
                imm.store(h.a, Ordering::Release);
            }
            Kind::Eager => {
                let put = peer.eager[slot].put(h.a, h.b, payload.len(), |dst| {
                    dst.copy_from_slice(payload);
                    Ok(())
                })?;
                if !put {
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
                peer.send_response(&resp, src)?;
            }
            Kind::Write | Kind::ReadResp => unreachable!("applied above"),
            Kind::Fail => peer.set_failed(String::from_utf8_lossy(payload).into_owned()),
        }
        Ok(())
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

    /// Receives the answer to our pending read straight into its buffer (what came with the
    /// receive buffer is copied). The pending read's lock is held while the payload comes in,
    /// so the read cannot give its buffer up (at its timeout) in the middle of it.
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
        let n = dst.len().min(self.buffered());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        // A blocking read is woken only once the low-water mark's worth has arrived.
        let parked = self.lowat;
        self.set_lowat(1)?;
        self.stream
            .read_exact(&mut dst[n..])
            .map_err(|e| Error::Remote(format!("connection lost in a read response: {e}")))?;
        self.set_lowat(parked)?;
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

    fn pair() -> (TcpStream, Inbox, Arc<Peer>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let out = rx.try_clone().unwrap();
        let path = Arc::new(crate::tcp::stripe::SendPath::Sendmsg);
        let peer = Arc::new(Peer::new((out, Vec::new()), path, 4, 64, "rank 1".into()));
        (tx, Inbox::new(peer.clone(), rx, (4, 64, 1)), peer)
    }

    /// Applies until `done` or a second passes.
    fn pump(inbox: &mut Inbox, done: impl Fn(&Inbox) -> bool) {
        let t0 = std::time::Instant::now();
        while !done(inbox) && t0.elapsed() < std::time::Duration::from_secs(1) {
            inbox.progress();
        }
    }

    /// A header that claims more payload than the address space holds is refused (no
    /// clear-to-send names it) before anything is received for it: an error, no overflow.
    #[test]
    fn a_huge_claimed_length_is_refused() {
        let (mut tx, mut inbox, peer) = pair();
        let mut h = Header::new(Kind::Write);
        h.len = u64::MAX;
        tx.write_all(&h.encode()).unwrap();
        pump(&mut inbox, |i| i.broken.is_some());
        let e = peer.health().unwrap_err().to_string();
        assert!(e.contains("outside what clear-to-send"), "{e}");
    }

    /// Many small frames in one `recv`, a frame split across two, and a write whose payload
    /// arrives in pieces: each applied once whole, the write straight into its memory.
    #[test]
    fn frames_split_and_batched_are_applied_whole() {
        let (mut tx, mut inbox, peer) = pair();
        let mut target = vec![0u8; 100_000];
        *lock(&peer.regions).get_mut(2).unwrap() = super::super::peer::Region {
            open: true,
            read: false,
            wide: false,
            addr: target.as_mut_ptr() as u64,
            len: target.len() as u64,
        };
        let mut bytes = Vec::new();
        for s in 0..4u32 {
            let mut c = Header::new(Kind::Credit);
            (c.slot, c.a) = (s, 10 + s);
            bytes.extend_from_slice(&c.encode());
        }
        let mut w = Header::new(Kind::Write);
        (w.slot, w.addr, w.len) = (2, target.as_ptr() as u64, target.len() as u64);
        bytes.extend_from_slice(&w.encode());
        bytes.extend((0..target.len()).map(|i| (i % 251) as u8));
        let mut imm = Header::new(Kind::Imm);
        (imm.slot, imm.a, imm.len) = (2, 77, target.len() as u64);
        bytes.extend_from_slice(&imm.encode());
        // In pieces that cut headers and the payload anywhere.
        for piece in bytes.chunks(7_919) {
            tx.write_all(piece).unwrap();
            tx.flush().unwrap();
            inbox.progress();
        }
        pump(&mut inbox, |_| peer.imm[2].0.load(Ordering::Acquire) == 77);
        assert!(inbox.broken.is_none(), "{:?}", inbox.broken);
        for s in 0..4 {
            assert_eq!(peer.credits[s].load(Ordering::Acquire), 10 + s as u32);
        }
        assert!(
            target
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8)
        );
        assert_eq!(peer.imm[2].1.load(Ordering::Relaxed), target.len() as u64);
        assert!(!lock(&peer.regions)[2].open);
    }

    /// A striped immediate publishes with its last copy; more copies than connections is a
    /// protocol violation.
    #[test]
    fn striped_immediates_publish_with_the_last_copy() {
        let (mut tx, mut inbox, peer) = pair();
        inbox.nsocks = 2;
        let mut imm = Header::new(Kind::Imm);
        (imm.slot, imm.a, imm.b, imm.len) = (1, 5, 2, 9);
        tx.write_all(&imm.encode()).unwrap();
        pump(&mut inbox, |_| {
            peer.imm_parts[1].load(Ordering::Acquire) == 1
        });
        assert_eq!(peer.imm[1].0.load(Ordering::Acquire), 0, "one copy of two");
        tx.write_all(&imm.encode()).unwrap();
        pump(&mut inbox, |_| peer.imm[1].0.load(Ordering::Acquire) == 5);
        assert_eq!(peer.imm_parts[1].load(Ordering::Acquire), 0);
        imm.b = 3;
        tx.write_all(&imm.encode()).unwrap();
        pump(&mut inbox, |i| i.broken.is_some());
        let e = peer.health().unwrap_err().to_string();
        assert!(e.contains("an immediate in 3 copies"), "{e}");
    }

    /// While the engine polls a peer the receiving thread leaves its frames alone (parked);
    /// the engine's word before it sleeps hands them back at once, well before the thread
    /// would look again by itself, and the thread rings the doorbell for what it applies.
    #[test]
    fn the_engine_hands_parked_sockets_back_before_it_sleeps() {
        let (mut tx, inbox, peer) = pair();
        let fd = inbox.stream.as_raw_fd();
        let bell = Doorbell::new();
        let handback = Arc::new(Handback::new().unwrap());
        peer.polled.hold();
        let watched = vec![(fd, Arc::new(Mutex::new(inbox)), peer.clone())];
        let (b, h) = (bell.clone(), handback.clone());
        let minute = Duration::from_secs(60);
        let thread = std::thread::spawn(move || run(watched, b, h, minute));
        let mut c = Header::new(Kind::Credit);
        (c.slot, c.a) = (1, 42);
        tx.write_all(&c.encode()).unwrap();
        let credit = || peer.credits[1].load(Ordering::Acquire);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(credit(), 0, "applied while the engine polls");
        assert_eq!(
            lowat(fd),
            POLLED_LOWAT.get() as i32,
            "parked at the polled mark"
        );
        let seen = bell.seq();
        assert!(peer.polled.stop());
        handback.give();
        let t0 = std::time::Instant::now();
        while credit() != 42 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(credit(), 42, "not handed back");
        assert_ne!(bell.seq(), seen, "the doorbell did not ring");
        assert_eq!(lowat(fd), 1, "watched with the mark raised");
        drop(tx);
        thread.join().unwrap();
    }

    /// The socket's `SO_RCVLOWAT`.
    fn lowat(fd: RawFd) -> i32 {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for the call; `fd` is an open socket.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        v
    }

    /// A read response whose payload trickles in, short of the raised low-water mark, still
    /// completes: the blocking read takes the mark down while it waits, and puts it back.
    #[test]
    fn a_read_response_completes_under_a_raised_low_water_mark() {
        let (mut tx, mut inbox, peer) = pair();
        inbox.set_lowat(64 << 10).unwrap();
        // A read the mark keeps asleep sleeps until this timeout instead of forever (it then
        // finds the bytes that were there all along).
        let limit = Duration::from_secs(5);
        inbox.stream.set_read_timeout(Some(limit)).unwrap();
        let t0 = std::time::Instant::now();
        let mut dst = vec![0u8; 3000];
        *lock(&peer.read) = Some(super::super::peer::PendingRead {
            id: 9,
            dst: dst.as_mut_ptr(),
            len: dst.len() as u64,
            done: false,
        });
        let mut h = Header::new(Kind::ReadResp);
        (h.a, h.len) = (9, dst.len() as u64);
        tx.write_all(&h.encode()).unwrap();
        tx.write_all(&[7u8; 1000]).unwrap();
        let rest = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.write_all(&[7u8; 2000]).unwrap();
            tx
        });
        let fd = inbox.stream.as_raw_fd();
        let done = std::thread::spawn(move || {
            pump(&mut inbox, |_| lock(&peer.read).is_some_and(|p| p.done));
            let finished = lock(&peer.read).is_some_and(|p| p.done);
            (inbox, finished)
        });
        let _tx = rest.join().unwrap();
        let (inbox, finished) = done.join().unwrap();
        assert!(inbox.broken.is_none(), "{:?}", inbox.broken);
        assert!(finished, "the read response did not complete");
        assert!(t0.elapsed() < limit, "the read slept until its timeout");
        assert!(dst.iter().all(|&b| b == 7));
        assert_eq!(lowat(fd), 64 << 10, "the mark was not put back");
    }

    /// The end of the stream in the middle of a frame is a lost connection naming it.
    #[test]
    fn the_end_of_the_stream_inside_a_frame_is_an_error() {
        let (mut tx, mut inbox, peer) = pair();
        tx.write_all(&Header::new(Kind::Ack).encode()[..10])
            .unwrap();
        drop(tx);
        pump(&mut inbox, |i| i.broken.is_some());
        let e = peer.health().unwrap_err().to_string();
        assert!(e.contains("connection lost in a frame"), "{e}");
    }
}
