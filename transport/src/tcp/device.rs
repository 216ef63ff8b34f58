//! [`TcpDevice`]: the connected provider ([`connect`]) and its RMA device and transport
//! interfaces.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::mem::HostBuffer;
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};
use rand::TryRngCore;

use super::frame::{self, Header, Kind, MAX_TEXT};
use super::peer::{Peer, PendingRead, Region, lock};
use super::reader::{self, Inbox};
use super::stripe::{self, NSOCKS, STRIPE_MIN};
use crate::bootstrap::Bootstrap;
use crate::device::{
    CTS_READ, CtsEntry, EagerHeader, IMM_ERROR, OpRecord, RmaDevice, eager_payload,
};
use crate::handback::Handback;
use crate::oplog::OpLog;
use crate::transport::{OpFormatter, Transport, TransportConfig};

/// Largest eager message: one round trip saved per small message, at the price of
/// `depth * EAGER_MAX` bytes of slots per peer.
pub const EAGER_MAX: usize = 4096;
/// Operation records this rank keeps for its own mismatch messages.
/// Bootstrap tags of the set-up exchanges.
const TAG_SECRET: u64 = 0x5443_5000_0000_0001;
const TAG_ADDRS: u64 = 0x5443_5000_0000_0002;
/// The hello a connecting rank sends: magic, secret, rank, world, connection index.
const HELLO_MAGIC: &[u8; 8] = b"AMPCTCP2";
const HELLO_BYTES: usize = 36;
/// How long an accepted connection may take to say hello, and how many may wait at once.
const HELLO_WAIT: Duration = Duration::from_secs(2);
const MAX_PENDING: usize = 64;

/// The TCP provider connected to every peer of a communicator.
pub struct TcpDevice {
    depth: usize,
    /// Indexed by rank; `None` for this rank.
    peers: Vec<Option<Arc<Peer>>>,
    /// The receiving half of each connection to each peer (same indexing; connection 0
    /// first).
    inboxes: Vec<Vec<Arc<Mutex<Inbox>>>>,
    /// Connections per peer.
    nsocks: usize,
    /// Smallest stripe (rank 0's `AMPCCL_TCP_STRIPE_MIN`, so that receivers know which
    /// regions may receive stripes).
    stripe_min: usize,
    bell: Doorbell,
    window: HostBuffer,
    failed: AtomicBool,
    ops: OpLog,
    read_ids: AtomicU32,
    timeout: Duration,
    /// Whether a peer may hold deferred frames (see [`super::peer`]).
    any_deferred: AtomicBool,
    /// Wakes the receiving thread when the engine stops polling (see [`reader::run`]).
    handback: Arc<Handback>,
}

/// Connects this rank to every peer of `boot` over TCP.
pub fn connect(boot: &Bootstrap, cfg: &TransportConfig) -> Result<Arc<TcpDevice>> {
    let all = vec![true; boot.world()];
    connect_to(boot, cfg, &all, Doorbell::new(), cfg.window)
}

/// Connects this rank over TCP to the peers `wanted` marks (every rank of `boot` passes the
/// same marks, symmetric: `wanted[j]` on rank `i` iff `wanted[i]` on rank `j`), ringing `bell`
/// when frames arrive, with a window of `window` bytes of its own.
pub fn connect_to(
    boot: &Bootstrap,
    cfg: &TransportConfig,
    wanted: &[bool],
    bell: Doorbell,
    window: usize,
) -> Result<Arc<TcpDevice>> {
    let (rank, world) = (boot.rank(), boot.world());
    let deadline = Instant::now() + boot.timeout();
    let listener = TcpListener::bind((boot.local_ip(), 0))
        .map_err(|e| Error::system("tcp: bind the data listener", e))?;
    let me = listener
        .local_addr()
        .map_err(|e| Error::system("tcp: local_addr", e))?;
    // Rank 0 draws the secret and says how many connections each pair holds and how small a
    // stripe may be.
    let mut setup = [0u8; 28];
    if rank == 0 {
        rand::rngs::OsRng
            .try_fill_bytes(&mut setup[..16])
            .map_err(|e| Error::system("tcp: OS random number generator", e))?;
        setup[16..20].copy_from_slice(&(NSOCKS.get() as u32).to_le_bytes());
        setup[20..].copy_from_slice(&STRIPE_MIN.get().to_le_bytes());
    }
    let got = boot.broadcast(TAG_SECRET, 0, (rank == 0).then_some(&setup[..]))?;
    let got: &[u8; 28] = got
        .get(..28)
        .and_then(|g| g.try_into().ok())
        .ok_or_else(|| bad_setup("short secret"))?;
    let mut secret = [0u8; 16];
    secret.copy_from_slice(&got[..16]);
    let nsocks = u32::from_le_bytes(got[16..20].try_into().expect("4 bytes")) as usize;
    let stripe_min = u64::from_le_bytes(got[20..].try_into().expect("8 bytes"));
    if !(NSOCKS.min as usize..=NSOCKS.max as usize).contains(&nsocks)
        || !(STRIPE_MIN.min..=STRIPE_MIN.max).contains(&stripe_min)
    {
        return Err(bad_setup(&format!(
            "rank 0 asks for {nsocks} connections per pair, stripes from {stripe_min} bytes"
        )));
    }
    let stripe_min = stripe_min as usize;
    let mine = format!("{me}\n{}", hostname());
    let all = boot.allgather(TAG_ADDRS, mine.as_bytes())?;
    let mut addrs = Vec::with_capacity(world);
    let mut descs = Vec::with_capacity(world);
    for (r, entry) in all.iter().enumerate() {
        let text = String::from_utf8_lossy(entry);
        let (addr, host) = text.split_once('\n').unwrap_or((&text, "?"));
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| bad_setup(&format!("rank {r} sent the address {addr:?}")))?;
        addrs.push(addr);
        let pid = boot.pids().get(r).copied().unwrap_or(0);
        descs.push(format!("rank {r} (pid {pid} on {host})"));
    }
    let mut streams: Vec<Vec<Option<TcpStream>>> = (0..world)
        .map(|_| (0..nsocks).map(|_| None).collect())
        .collect();
    for (peer, addr) in addrs.iter().enumerate().skip(rank + 1) {
        if wanted[peer] {
            for (i, s) in streams[peer].iter_mut().enumerate() {
                *s = Some(dial(
                    *addr,
                    &secret,
                    (rank, world, i),
                    deadline,
                    &descs[peer],
                )?);
            }
        }
    }
    let expect: Vec<bool> = (0..world).map(|r| r < rank && wanted[r]).collect();
    accept(
        &listener,
        &secret,
        (rank, world, &expect),
        deadline,
        &mut streams,
        &descs,
    )?;
    let eager = EAGER_MAX;
    let mut peers = Vec::with_capacity(world);
    let mut inboxes = Vec::with_capacity(world);
    let mut watched = Vec::new();
    let path = Arc::new(stripe::SendPath::from_env()?);
    for (r, conns) in streams.into_iter().enumerate() {
        let conns: Vec<TcpStream> = conns.into_iter().flatten().collect();
        if conns.is_empty() {
            peers.push(None);
            inboxes.push(Vec::new());
            continue;
        }
        let mut outs = Vec::with_capacity(nsocks);
        for s in &conns {
            s.set_nodelay(true)
                .map_err(|e| Error::system("tcp: TCP_NODELAY", e))?;
            outs.push(s.try_clone().map_err(|e| Error::system("tcp: clone", e))?);
        }
        let out = outs.remove(0);
        let peer = Arc::new(Peer::new(
            (out, outs),
            path.clone(),
            cfg.fifo_depth,
            eager,
            descs[r].clone(),
        ));
        let mut mine = Vec::with_capacity(nsocks);
        for s in conns {
            let fd = s.as_raw_fd();
            let inbox = Arc::new(Mutex::new(Inbox::new(
                peer.clone(),
                s,
                (cfg.fifo_depth, eager, nsocks),
            )));
            watched.push((fd, inbox.clone(), peer.clone()));
            mine.push(inbox);
        }
        inboxes.push(mine);
        peers.push(Some(peer));
    }
    let handback = Arc::new(Handback::new().map_err(|e| Error::system("tcp: eventfd", e))?);
    if !watched.is_empty() {
        let (thread_bell, word) = (bell.clone(), handback.clone());
        std::thread::Builder::new()
            .name("ampccl-tcp-rx".into())
            .spawn(move || reader::run(watched, thread_bell, word, reader::PARKED_RECHECK))
            .map_err(|e| Error::system("tcp: spawn the receiving thread", e))?;
    }
    tracing::debug!(
        "rank {rank}: tcp connected to {} peers, {nsocks} connection(s) each, sending with {}",
        world - 1,
        path.name()
    );
    Ok(Arc::new(TcpDevice {
        depth: cfg.fifo_depth,
        peers,
        inboxes,
        nsocks,
        stripe_min,
        bell,
        window: HostBuffer::zeroed(window),
        failed: AtomicBool::new(false),
        ops: OpLog::default(),
        read_ids: AtomicU32::new(0),
        timeout: boot.timeout(),
        any_deferred: AtomicBool::new(false),
        handback,
    }))
}

/// Connects to `peer`'s listener (retrying until `deadline`) and says hello.
fn dial(
    addr: SocketAddr,
    secret: &[u8; 16],
    (rank, world, index): (usize, usize, usize),
    deadline: Instant,
    desc: &str,
) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(mut s) => {
                s.write_all(&hello(secret, rank, world, index))
                    .map_err(|e| Error::Remote(format!("tcp: hello to {desc}: {e}")))?;
                return Ok(s);
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Timeout(format!(
                    "tcp: cannot connect to {desc} at {addr}: {e}"
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Accepts the lower ranks' connections (every connection index) into `streams`: hellos are read from every pending
/// connection at once, each within [`HELLO_WAIT`]; a connection without the right hello is
/// dropped and costs nothing else.
fn accept(
    listener: &TcpListener,
    secret: &[u8; 16],
    (rank, world, expect): (usize, usize, &[bool]),
    deadline: Instant,
    streams: &mut [Vec<Option<TcpStream>>],
    descs: &[String],
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::system("tcp: nonblocking listener", e))?;
    let mut pending: Vec<(TcpStream, Vec<u8>, Instant)> = Vec::new();
    let missing = |streams: &[Vec<Option<TcpStream>>]| {
        (0..world)
            .filter(|&r| expect[r] && streams[r].iter().any(Option::is_none))
            .collect::<Vec<_>>()
    };
    while !missing(streams).is_empty() {
        if Instant::now() >= deadline {
            let missing: Vec<&str> = missing(streams)
                .into_iter()
                .map(|r| descs[r].as_str())
                .collect();
            return Err(Error::Timeout(format!(
                "tcp: no connection from {}",
                missing.join(", ")
            )));
        }
        let mut idle = true;
        while let Ok((s, _)) = listener.accept() {
            idle = false;
            if s.set_nonblocking(true).is_ok() {
                if pending.len() == MAX_PENDING {
                    pending.remove(0);
                }
                pending.push((s, Vec::with_capacity(HELLO_BYTES), Instant::now()));
            }
        }
        let now = Instant::now();
        pending.retain_mut(|(s, buf, since)| {
            let mut chunk = [0u8; HELLO_BYTES];
            let want = HELLO_BYTES - buf.len();
            match s.read(&mut chunk[..want]) {
                Ok(0) => return false,
                Ok(n) => {
                    idle = false;
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return false,
            }
            if buf.len() < HELLO_BYTES {
                return now.duration_since(*since) < HELLO_WAIT;
            }
            let nsocks = streams[0].len();
            let Some((peer, i)) =
                check_hello(buf, secret, rank, world).filter(|&(p, i)| expect[p] && i < nsocks)
            else {
                tracing::warn!("rank {rank}: tcp: dropped a connection with a wrong hello");
                return false;
            };
            if streams[peer][i].is_none() && s.set_nonblocking(false).is_ok() {
                streams[peer][i] = s.try_clone().ok();
            }
            false
        });
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

fn hello(secret: &[u8; 16], rank: usize, world: usize, index: usize) -> [u8; HELLO_BYTES] {
    let mut h = [0u8; HELLO_BYTES];
    h[..8].copy_from_slice(HELLO_MAGIC);
    h[8..24].copy_from_slice(secret);
    h[24..28].copy_from_slice(&(rank as u32).to_le_bytes());
    h[28..32].copy_from_slice(&(world as u32).to_le_bytes());
    h[32..36].copy_from_slice(&(index as u32).to_le_bytes());
    h
}

/// The rank and connection index a hello names, if it is ours (magic, secret, world) and
/// from a lower rank.
fn check_hello(h: &[u8], secret: &[u8; 16], rank: usize, world: usize) -> Option<(usize, usize)> {
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let ok = &h[..8] == HELLO_MAGIC && &h[8..24] == secret && u32_at(28) as usize == world;
    let peer = u32_at(24) as usize;
    (ok && peer < rank).then_some((peer, u32_at(32) as usize))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn bad_setup(what: &str) -> Error {
    Error::Remote(format!("tcp set-up: {what}"))
}

impl TcpDevice {
    /// The state of `peer` (links only connect distinct ranks).
    fn peer(&self, peer: usize) -> &Peer {
        self.peers[peer]
            .as_deref()
            .expect("a link connects two distinct ranks")
    }

    /// Notes that a peer holds deferred frames (`waiting`), for [`Transport::flush`].
    fn deferred(&self, waiting: bool) {
        if waiting {
            self.any_deferred.store(true, Ordering::Release);
        }
    }

    /// The state of `peer` after applying the complete small frames waiting in its socket,
    /// unless its receiving thread is at it (see [`super::reader`]).
    fn polled(&self, peer: usize) -> &Peer {
        let p = self.peer(peer);
        p.polled.mark();
        // Connections 1.. carry only stripes: polled while a region may receive some.
        let n = if p.wide_open.load(Ordering::Acquire) > 0 {
            self.nsocks
        } else {
            1
        };
        for inbox in &self.inboxes[peer][..n] {
            if let Ok(mut inbox) = inbox.try_lock() {
                inbox.progress();
            }
        }
        p
    }
}

impl RmaDevice for TcpDevice {
    fn fifo_depth(&self) -> usize {
        self.depth
    }

    fn channels(&self) -> usize {
        1
    }

    fn expose(&self, ptr: *mut u8, _len: usize) -> Option<(u32, u64)> {
        // The key is set per clear-to-send (its slot, see `post_cts`).
        Some((0, ptr as u64))
    }

    fn exposes_user_memory(&self) -> bool {
        true
    }

    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        let p = self.peer(peer);
        p.open_region(
            slot,
            Region {
                open: true,
                read: entry.nreqs & CTS_READ != 0,
                wide: self.nsocks > 1 && entry.size >= 2 * self.stripe_min as u64,
                addr: entry.addr,
                len: entry.size,
            },
        );
        let mut h = Header::new(Kind::Cts);
        h.slot = slot as u32;
        h.len = frame::CTS_BYTES as u64;
        let e = CtsEntry {
            key: slot as u32,
            ..*entry
        };
        let payload = frame::encode_cts(&e);
        // An eager receive's entry only exposes a length mismatch to a rendezvous sender, which
        // can wait for our next frame or idle moment; a rendezvous receive's sender waits.
        if entry.size as usize <= EAGER_MAX && entry.nreqs & CTS_READ == 0 {
            self.deferred(p.defer(&h, &payload));
        } else {
            // A peer that is gone by now needs no clear-to-send: if its message is here, the
            // receive completes; if not, the wait for it names the lost peer (`peer_health`).
            let _ = p.send(&h, &payload);
        }
        Ok(())
    }

    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        self.polled(peer).cts[slot].load(idx)
    }

    unsafe fn write(
        &self,
        peer: usize,
        src: *const u8,
        len: usize,
        key: u32,
        addr: u64,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: `src` is valid for `len` reads by contract.
        let payload = unsafe { std::slice::from_raw_parts(src, len) };
        // `addr` comes from the peer's clear-to-send: wrapping, the receiver checks the bounds.
        let frame = |&(off, l): &(usize, usize)| {
            let mut h = Header::new(Kind::Write);
            (h.slot, h.addr, h.len) = (key, addr.wrapping_add(off as u64), l as u64);
            h
        };
        let p = self.peer(peer);
        if crate::protocol::stripe_count(len, self.nsocks, self.stripe_min) == 1 {
            return p.send(&frame(&(0, len)), payload);
        }
        let parts = stripe::stripes(len, self.nsocks, self.stripe_min);
        let heads: Vec<_> = parts.iter().map(|s| frame(s).encode()).collect();
        let payloads: Vec<&[u8]> = parts.iter().map(|&(o, l)| &payload[o..o + l]).collect();
        // The slot's immediate must follow these stripes on their connections too.
        let used = (1u32 << (parts.len() - 1)) - 1;
        let Some(mask) = p.striped.get(key as usize) else {
            return Err(Error::Remote(format!(
                "{}: its clear-to-send names the key {key} (slots: {})",
                p.desc, self.depth
            )));
        };
        mask.fetch_or(used, Ordering::Relaxed);
        p.send_striped(&heads, &payloads)
    }

    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        _to: CopyTo,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let p = self.peer(peer);
        let _one_at_a_time = lock(&p.reading);
        let id = self.read_ids.fetch_add(1, Ordering::Relaxed);
        *lock(&p.read) = Some(PendingRead {
            id,
            dst,
            len: len as u64,
            done: false,
        });
        let mut h = Header::new(Kind::ReadReq);
        (h.slot, h.a, h.addr, h.len) = (key, id, addr, len as u64);
        let sent = p.send(&h, &[]);
        let deadline = Instant::now() + self.timeout;
        let mut pending = lock(&p.read);
        let outcome = loop {
            if let Err(e) = &sent {
                break Err(e.clone());
            }
            if pending.is_some_and(|r| r.done) {
                break Ok(());
            }
            if let Some(why) = &*lock(&p.dead) {
                break Err(Error::Remote(format!("{} is unreachable: {why}", p.desc)));
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(Error::Timeout(format!(
                    "a read of {len} bytes from {} took longer than {:.1} s",
                    p.desc,
                    self.timeout.as_secs_f64()
                )));
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            pending = p
                .read_done
                .wait_timeout(pending, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        // No longer pending: a late response finds nothing to fill (and ends the connection).
        *pending = None;
        outcome
    }

    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        let p = self.peer(peer);
        // One copy on connection 0 and on every connection that carried a stripe of this
        // transfer; each says how many copies complete it (see `super::stripe`).
        let used = p.striped[slot].swap(0, Ordering::Relaxed);
        let mut h = Header::new(Kind::Imm);
        (h.slot, h.a, h.b, h.len) = (slot as u32, imm, used.count_ones() + 1, len);
        for i in (0..p.stripes.len()).filter(|i| used & (1 << i) != 0) {
            p.send_on_stripe(i + 1, &h)?;
        }
        p.send(&h, &[])
    }

    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        let (imm, len) = &self.polled(peer).imm[slot];
        let v = imm.load(Ordering::Acquire);
        (v & !IMM_ERROR == want).then(|| (v, len.load(Ordering::Relaxed)))
    }

    fn eager_max(&self) -> usize {
        EAGER_MAX
    }

    unsafe fn eager_write(
        &self,
        peer: usize,
        slot: usize,
        idx: u32,
        tag: u32,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        let mut h = Header::new(Kind::Eager);
        (h.slot, h.a, h.b, h.len) = (slot as u32, idx, tag, len as u64);
        // SAFETY: `src` is valid for `len` reads by contract.
        let payload = unsafe { eager_payload(src, len, EAGER_MAX)? };
        self.peer(peer).send(&h, payload)
    }

    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        self.polled(peer).eager[slot].peek(idx)
    }

    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        // SAFETY: `dst` is valid for `len` writes (the caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        self.peer(peer).eager[slot].read(dst);
    }

    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        let p = self.peer(peer);
        p.eager[slot].release();
        let mut h = Header::new(Kind::Credit);
        (h.slot, h.a) = (slot as u32, seq.wrapping_add(1));
        // Deferred: the sender needs it only `depth` messages later. The receive is complete:
        // a peer that is gone by now (it finished and closed the connection) needs no credit,
        // and one that still sends learns of the loss itself.
        self.deferred(p.defer(&h, &[]));
        Ok(())
    }

    fn credit(&self, peer: usize, slot: usize) -> u32 {
        self.polled(peer).credits[slot].load(Ordering::Acquire)
    }

    fn post_ack(&self, peer: usize) -> Result<()> {
        // As for credits: a peer that is gone waits for no ack.
        let _ = self.peer(peer).send(&Header::new(Kind::Ack), &[]);
        Ok(())
    }

    fn acks(&self, peer: usize) -> u32 {
        self.polled(peer).acks.load(Ordering::Acquire)
    }

    fn peer_health(&self, peer: usize) -> Result<()> {
        self.check_peers_failed()?;
        self.peer(peer).health()
    }

    fn peer_desc(&self, peer: usize) -> String {
        self.peer(peer).desc.clone()
    }

    fn op_history(&self, peer: Option<usize>) -> Vec<OpRecord> {
        match peer {
            None => self.ops.newest_first(),
            // Peers' records stay on their hosts.
            Some(_) => Vec::new(),
        }
    }

    fn local_op(&self, tag: u32) -> Option<String> {
        self.ops.describe(tag)
    }
}

impl Transport for TcpDevice {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn doorbell(&self) -> Doorbell {
        self.bell.clone()
    }
    fn window(&self) -> (*mut u8, usize) {
        (self.window.as_ptr(), self.window.len())
    }
    fn user_mem_links(&self) -> bool {
        true
    }
    fn is_shared_user_memory(&self, _ptr: *const u8, _len: usize) -> bool {
        false
    }
    fn set_op(&self, record: &OpRecord) {
        self.ops.push(record);
    }
    fn set_op_formatter(&self, f: OpFormatter) {
        self.ops.set_formatter(f);
    }
    fn holds_frames_back(&self) -> bool {
        true
    }
    fn driver_sleeps(&self) {
        // A frame deferred after the swap sets the flag again; one deferred before it is
        // found under its peer's lock.
        if self.any_deferred.swap(false, Ordering::AcqRel) {
            for p in self.peers.iter().flatten() {
                p.flush();
            }
        }
        // Only when the engine polled some peer since the last word: a driver that naps again
        // and again costs the thread nothing.
        let mut polled = false;
        for p in self.peers.iter().flatten() {
            polled |= p.polled.stop();
        }
        if polled {
            self.handback.give();
        }
    }
    fn flush(&self) {
        // As in `driver_sleeps`; frames not due yet raise the flag again.
        if self.any_deferred.swap(false, Ordering::AcqRel) {
            let mut left = false;
            for p in self.peers.iter().flatten() {
                left |= p.flush_due();
            }
            self.deferred(left);
        }
    }
    fn mark_failed(&self, msg: &str) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let text = &msg.as_bytes()[..msg.len().min(MAX_TEXT as usize)];
        let mut h = Header::new(Kind::Fail);
        h.len = text.len() as u64;
        for p in self.peers.iter().flatten() {
            // Best effort: a peer that is gone learns it from the closed connection.
            let _ = p.send(&h, text);
        }
    }
    fn check_peers_failed(&self) -> Result<()> {
        for p in self.peers.iter().flatten() {
            if let Some(m) = &*lock(&p.failed) {
                return Err(Error::Remote(format!("{} failed: {m}", p.desc)));
            }
        }
        Ok(())
    }
}

impl Drop for TcpDevice {
    /// Closes each connection gracefully: our side stops sending (the peer reads to the end
    /// of what we sent), and the receiving thread keeps draining until the peer closes too. A
    /// socket closed with unread data would send a reset instead, which can make the peer lose
    /// data it has received but not read yet.
    fn drop(&mut self) {
        for p in self.peers.iter().flatten() {
            p.close();
        }
    }
}
