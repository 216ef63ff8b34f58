//! [`OfiDevice`]: the connected `ofi` provider ([`connect`]) and its RMA device and transport
//! interfaces.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::mem::HostBuffer;
use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use super::fabric::{Endpoint, Pick};
use super::state::{self, PeerState, State};
use super::sys::{self, Lib};
use super::wire::{self, Header, Kind};
use crate::bootstrap::Bootstrap;
use crate::device::{
    CTS_READ, CtsEntry, EagerHeader, IMM_ERROR, OpRecord, RmaDevice, eager_payload,
};
use crate::handback::{Handback, PollMark};
use crate::oplog::OpLog;
use crate::transport::{OpFormatter, Transport, TransportConfig};

/// Largest eager message (as the TCP provider's: one round trip saved per small message).
pub const EAGER_MAX: usize = 4096;

/// Endpoints (rails) per rank (rank 0's value holds for the whole communicator).
pub static RAILS: Param = Param::new(
    "OFI_RAILS",
    4,
    (1, 16),
    Unit::Count,
    "libfabric endpoints per rank (rails), each with its own connections; large writes are \
     striped over them",
);
/// Operation records this rank keeps for its own mismatch messages.
/// How often the progress thread sends each peer a liveness message: a send to a dead peer
/// fails, which is how its death shows within about a second.
const PING_EVERY: Duration = Duration::from_millis(300);
/// Longest sleep of the progress thread on the completion queue's descriptor.
const IDLE_WAIT_MS: i32 = 100;
/// How often the progress thread looks whether the engine still polls, while it does (with
/// manual progress, a peer's writes move only while somebody reads our queue: an engine busy
/// elsewhere leaves them to the thread after [`crate::handback::ENGINE_GRACE`] and this).
const ENGINE_RECHECK_MS: i32 = 1;
/// How long closing waits for our last messages to leave.
const FLUSH_WAIT: Duration = Duration::from_millis(500);
/// Bootstrap tags of the set-up exchanges.
const TAG_PROVIDER: u64 = 0x4f46_4900_0000_0001;
const TAG_ADDRS: u64 = 0x4f46_4900_0000_0002;
const TAG_READY: u64 = 0x4f46_4900_0000_0003;

/// The loaded libfabric, or why there is none.
pub fn library() -> std::result::Result<&'static Lib, String> {
    static LIB: OnceLock<std::result::Result<&'static Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| Lib::load().map(|l| &*Box::leak(Box::new(l))))
        .clone()
}

/// The libfabric provider `AMPCCL_OFI_PROVIDER` names (like `FI_PROVIDER`), if any.
pub fn provider_from_env() -> Option<String> {
    std::env::var("AMPCCL_OFI_PROVIDER")
        .ok()
        .filter(|s| !s.is_empty())
}

/// The core providers of RDMA fabrics, which ampccl takes across hosts without being asked
/// (libfabric's socket providers lose to ampccl's own TCP provider on Ethernet).
pub const FABRICS: &str = "verbs,efa,psm3,psm2,opx,ucx,usnic";

/// The core providers `AMPCCL_OFI_FABRICS` lists (comma-separated; empty: none), else
/// [`FABRICS`].
pub fn fabrics_from_env() -> Vec<String> {
    std::env::var("AMPCCL_OFI_FABRICS")
        .unwrap_or_else(|_| FABRICS.into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The `ofi` provider connected to every peer of a communicator.
pub struct OfiDevice {
    rank: usize,
    depth: usize,
    rails: usize,
    state: Mutex<State>,
    descs: Vec<String>,
    wait_fd: Option<i32>,
    virt_addr: bool,
    bell: Doorbell,
    /// The engine's polls of the endpoint, and its word before it sleeps
    /// ([`crate::handback`]): the progress thread reads the queue only while nobody polls.
    polled: PollMark,
    handback: Handback,
    window: HostBuffer,
    failed: AtomicBool,
    ops: OpLog,
    timeout: Duration,
}

fn setup_err(what: &str) -> Error {
    Error::Remote(format!("ofi set-up: {what}"))
}

/// Connects this rank to every peer of `boot` through libfabric: rank 0 picks the provider
/// (`auto`: the first of an RDMA fabric, [`fabrics_from_env`]; else `AMPCCL_OFI_PROVIDER`, else
/// the first suitable one, leaving out `shm` when the ranks span hosts) and the number of
/// rails (`AMPCCL_OFI_RAILS`), every rank opens that many endpoints of it, and the ranks swap
/// their addresses. Where rank 0 finds no provider or some rank cannot open it, every rank
/// fails with the reason, or, when `auto`, returns `None` (the caller takes another provider).
pub fn connect(
    boot: &Bootstrap,
    cfg: &TransportConfig,
    auto: bool,
) -> Result<Option<Arc<OfiDevice>>> {
    let (rank, world) = (boot.rank(), boot.world());
    if world > 1 << 16 || cfg.fifo_depth > 1 << 16 {
        return Err(setup_err("at most 65536 ranks and FIFO slots"));
    }
    let lib = library();
    // Rank 0 opens first and tells the others which provider to open (or why none).
    let mut ep = None;
    let chosen = if rank == 0 {
        let one_host = boot.host_ids().iter().all(|h| *h == boot.host_id());
        let rails = RAILS.get() as usize;
        let opened = if auto {
            let fabrics = fabrics_from_env();
            lib.clone()
                .and_then(|lib| Endpoint::open(lib, Pick::Among(&fabrics), rails))
        } else {
            open_default(lib.clone(), provider_from_env().as_deref(), one_host, rails)
        };
        let msg = match &opened {
            Ok(e) => format!("ok\n{}\n{}", e.rails(), e.caps.provider),
            Err(why) => format!("error\n{why}"),
        };
        ep = opened.ok();
        boot.broadcast(TAG_PROVIDER, 0, Some(msg.as_bytes()))?
    } else {
        boot.broadcast(TAG_PROVIDER, 0, None)?
    };
    let chosen = String::from_utf8_lossy(&chosen).into_owned();
    let (rails, name) = match chosen.split_once('\n') {
        Some(("ok", rest)) => match rest.split_once('\n') {
            Some((n, name)) => (n.parse::<usize>().unwrap_or(0), name.to_string()),
            None => (0, String::new()),
        },
        Some((_, why)) if auto => {
            if rank == 0 {
                tracing::debug!("ofi: not across these hosts: {why}");
            }
            return Ok(None);
        }
        Some((_, why)) => return Err(Error::Remote(format!("ofi: rank 0: {why}"))),
        None => return Err(setup_err("rank 0 sent no provider")),
    };
    if !(1..=RAILS.max as usize).contains(&rails) {
        return Err(setup_err("rank 0 sent no rail count"));
    }
    let ep = match ep {
        Some(ep) => Ok(ep),
        None => lib.and_then(|lib| Endpoint::open(lib, Pick::Named(&name), rails)),
    };
    // Every rank tells whether it opened the provider, so that a host without the library
    // or the device fails (or, when `auto`, declines) everywhere at once: 1, its host name
    // and its rails' addresses, or 0 and why not.
    let mine = match &ep {
        Ok(ep) => {
            let mut m = vec![1];
            m.extend_from_slice(hostname().as_bytes());
            m.push(b'\n');
            for rail in 0..rails {
                let addr = ep.name(rail).map_err(|e| setup_err(&e))?;
                m.extend_from_slice(&(addr.len() as u16).to_le_bytes());
                m.extend_from_slice(&addr);
            }
            m
        }
        Err(why) => [&[0][..], why.as_bytes()].concat(),
    };
    let all = boot.allgather(TAG_ADDRS, &mine)?;
    if let Some((r, e)) = all.iter().enumerate().find(|(_, e)| e.first() != Some(&1)) {
        let why = format!(
            "rank {r} cannot open {name}: {}",
            String::from_utf8_lossy(e.get(1..).unwrap_or_default())
        );
        if auto {
            if rank == 0 {
                tracing::info!("ofi: not across these hosts: {why}");
            }
            return Ok(None);
        }
        return Err(Error::Remote(format!("ofi: {why}")));
    }
    let ep = ep.map_err(|why| Error::Remote(format!("ofi: {why}")))?;
    let mut peers = Vec::with_capacity(world);
    let mut descs = Vec::with_capacity(world);
    for (r, entry) in all.iter().map(|e| &e[1..]).enumerate() {
        let split = entry
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(entry.len());
        let host = String::from_utf8_lossy(&entry[..split]);
        let pid = boot.pids().get(r).copied().unwrap_or(0);
        descs.push(format!("rank {r} (pid {pid} on {host})"));
        if r == rank {
            peers.push(None);
            continue;
        }
        let their = split_addrs(entry.get(split + 1..).unwrap_or_default(), rails)
            .ok_or_else(|| setup_err(&format!("{}: sent malformed addresses", descs[r])))?;
        let fi_addrs = their
            .into_iter()
            .map(|a| ep.insert(a))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| setup_err(&format!("{}: {e}", descs[r])))?;
        peers.push(Some(PeerState::new(
            fi_addrs,
            descs[r].clone(),
            cfg.fifo_depth,
            EAGER_MAX,
        )));
    }
    let caps = ep.caps.clone();
    let wait_fd = ep.wait_fd();
    let version = ep.version();
    let mut state = State::new(ep, rank, peers, cfg.fifo_depth, EAGER_MAX);
    for _ in 0..state::recvs(world - 1) {
        let buf = vec![0u8; wire::HEADER + EAGER_MAX.max(wire::MAX_TEXT)].into_boxed_slice();
        state
            .post_recv(buf)
            .map_err(|e| setup_err(&format!("post a receive: {e}")))?;
    }
    // Every rank's receives are posted before anyone sends.
    boot.barrier(TAG_READY)?;
    tracing::info!(
        "rank {rank}: ofi: libfabric {version}, provider {}, {rails} rail(s) ({} progress, {} \
         keys, registered memory addressed by {}{})",
        caps.provider,
        if caps.manual { "manual" } else { "auto" },
        if caps.prov_key {
            "provider"
        } else {
            "application"
        },
        if caps.virt_addr { "address" } else { "offset" },
        if caps.local_mr {
            ", local buffers registered"
        } else {
            ""
        },
    );
    let dev = Arc::new(OfiDevice {
        rank,
        depth: cfg.fifo_depth,
        rails,
        state: Mutex::new(state),
        descs,
        wait_fd,
        virt_addr: caps.virt_addr,
        bell: Doorbell::new(),
        polled: PollMark::default(),
        handback: Handback::new().map_err(|e| Error::system("ofi: eventfd", e))?,
        window: HostBuffer::zeroed(cfg.window),
        failed: AtomicBool::new(false),
        ops: OpLog::default(),
        timeout: boot.timeout(),
    });
    let weak = Arc::downgrade(&dev);
    std::thread::Builder::new()
        .name("ampccl-ofi-progress".into())
        .spawn(move || progress_thread(weak))
        .map_err(|e| Error::system("ofi: spawn the progress thread", e))?;
    Ok(Some(dev))
}

/// Opens the endpoints rank 0 chooses: `named`, else the first suitable provider other than
/// `shm` unless every rank is on this host.
fn open_default(
    lib: std::result::Result<&'static Lib, String>,
    named: Option<&str>,
    one_host: bool,
    rails: usize,
) -> std::result::Result<Endpoint, String> {
    let lib = lib?;
    if let Some(name) = named {
        return Endpoint::open(lib, Pick::Named(name), rails);
    }
    let first = Endpoint::open(lib, Pick::First, rails)?;
    if first.caps.provider != "shm" || one_host {
        return Ok(first);
    }
    drop(first);
    Endpoint::open(lib, Pick::Named("tcp;ofi_rxm"), rails)
}

/// The `rails` addresses of a peer's entry (each a 2-byte length and the address), or `None`
/// when the entry does not hold exactly that.
fn split_addrs(mut entry: &[u8], rails: usize) -> Option<Vec<&[u8]>> {
    let mut addrs = Vec::with_capacity(rails);
    for _ in 0..rails {
        let (len, rest) = entry.split_first_chunk::<2>()?;
        let len = u16::from_le_bytes(*len) as usize;
        addrs.push(rest.get(..len)?);
        entry = &rest[len..];
    }
    entry.is_empty().then_some(addrs)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Blocks until the completion queue's descriptor `cq` or `also` is readable or `ms` pass
/// (without a queue descriptor, a sleep of at most a millisecond: the provider then only
/// moves when polled).
fn block(cq: Option<i32>, also: Option<i32>, ms: i32) {
    let mut fds: Vec<libc::pollfd> = [cq, also]
        .into_iter()
        .flatten()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = if cq.is_some() { ms } else { ms.clamp(0, 1) };
    // SAFETY: valid pollfds; a descriptor closed meanwhile only makes poll return.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

/// Drives the endpoint while the engine does not: reads completions (so that peers' writes
/// land and the engine's waiters wake: it rings the doorbell when something arrived) and
/// otherwise blocks on the completion queue's descriptor and the engine's [`Handback`]. While
/// the engine polls the endpoint itself, the thread leaves the queue alone and waits for the
/// engine's word. Either way it sends the liveness messages.
fn progress_thread(dev: Weak<OfiDevice>) {
    let mut last_ping = Instant::now();
    loop {
        let Some(d) = dev.upgrade() else { return };
        d.handback.take();
        let ping = last_ping.elapsed() >= PING_EVERY;
        let engine = d.polled.recent();
        let (any, may_block) = if engine && !ping {
            (false, true)
        } else {
            let mut s = d.lock();
            let any = !engine && s.progress();
            if ping {
                last_ping = Instant::now();
                for peer in (0..s.peers.len()).filter(|&p| p != d.rank) {
                    if s.peer(peer).dead.is_none()
                        && let Err(why) = s.send(peer, &Header::new(Kind::Ping, 0, 0, 0, 0), &[])
                    {
                        s.peer(peer).kill(format!("is unreachable: {why}"));
                    }
                }
            }
            (any, engine || (!any && s.ep.trywait()))
        };
        if any {
            d.bell.ring();
        }
        let (cq, word) = (d.wait_fd, d.handback.fd());
        drop(d);
        if may_block {
            if engine {
                block(None, Some(word), ENGINE_RECHECK_MS);
            } else {
                block(cq, Some(word), IDLE_WAIT_MS);
            }
        }
    }
}

impl OfiDevice {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state after reading the completions ready (an engine's poll).
    fn polled(&self) -> MutexGuard<'_, State> {
        self.polled.mark();
        let mut s = self.lock();
        s.progress();
        s
    }

    /// An error naming `peer` for a failed post.
    fn post_err(&self, peer: usize, what: &str, why: String) -> Error {
        Error::Remote(format!("ofi: {what} to {}: {why}", self.descs[peer]))
    }

    /// Drives the endpoint until `done` says so, blocking on the completion queue between
    /// tries; fails when `peer` dies or the wait exceeds the timeout.
    fn wait(
        &self,
        peer: usize,
        what: &str,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            self.polled.mark();
            let may_block = {
                let mut s = self.lock();
                let any = s.progress();
                if done(&mut s) {
                    return Ok(());
                }
                if let Some(why) = &s.peer(peer).dead {
                    return Err(Error::Remote(format!("{} {why}", self.descs[peer])));
                }
                !any && s.ep.trywait()
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "{what} with {} took longer than {:.1} s",
                    self.descs[peer],
                    self.timeout.as_secs_f64()
                )));
            }
            if may_block {
                block(self.wait_fd, None, 1);
            }
        }
    }

    /// Sends a control message to `peer`.
    fn send(&self, peer: usize, h: &Header, payload: &[u8]) -> Result<()> {
        self.lock()
            .send(peer, h, payload)
            .map_err(|why| self.post_err(peer, "a message", why))
    }

    /// The remote address of `addr` in the region of `peer`'s entry `slot`: checked against
    /// the entry, as the provider addresses registered memory.
    fn remote(
        &self,
        s: &mut State,
        peer: usize,
        slot: u32,
        addr: u64,
        len: usize,
    ) -> Result<(u64, u64)> {
        let desc = &self.descs[peer];
        let Some(&(entry, rkey)) = s.peer(peer).cts.get(slot as usize) else {
            return Err(Error::Remote(format!(
                "{desc}: its clear-to-send names the key {slot} (slots: {})",
                self.depth
            )));
        };
        let off = addr.wrapping_sub(entry.addr);
        if off > entry.size || len as u64 > entry.size - off {
            return Err(Error::Internal(format!(
                "ofi: {len} bytes at offset {off} of {desc}'s region of {} bytes",
                entry.size
            )));
        }
        Ok((if self.virt_addr { addr } else { off }, rkey))
    }
}

impl RmaDevice for OfiDevice {
    fn fifo_depth(&self) -> usize {
        self.depth
    }

    fn channels(&self) -> usize {
        self.rails
    }

    fn expose(&self, ptr: *mut u8, _len: usize) -> Option<(u32, u64)> {
        // The key is set per clear-to-send (its slot, see `post_cts`).
        Some((0, ptr as u64))
    }

    fn exposes_user_memory(&self) -> bool {
        true
    }

    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        let read = entry.nreqs & CTS_READ != 0;
        let mut s = self.lock();
        // An eager-sized write entry only tells a rendezvous sender of a length mismatch: no
        // data is written into it, so it opens no region (nor does an empty one).
        let rkey = if entry.size > 0 && (read || entry.size as usize > EAGER_MAX) {
            let access = if read {
                sys::FI_REMOTE_READ
            } else {
                sys::FI_REMOTE_WRITE
            };
            let mr =
                s.ep.register(entry.addr as *const u8, entry.size as usize, access)
                    .map_err(|why| self.post_err(peer, "a clear-to-send", why))?;
            let rkey = mr.key;
            s.peer(peer).regions[slot] = Some(mr);
            rkey
        } else {
            0
        };
        let h = Header::new(Kind::Cts, slot, 0, 0, rkey);
        let e = CtsEntry {
            key: slot as u32,
            ..*entry
        };
        let payload = wire::encode_cts(&e);
        // A peer that is gone by now needs no clear-to-send: the wait for its message names
        // the lost peer (`peer_health`). An eager receive's entry only exposes a length
        // mismatch to a rendezvous sender, which can wait for our next message or idle moment.
        let _ = if rkey == 0 && !read {
            s.defer(peer, &h, &payload)
        } else {
            s.send(peer, &h, &payload)
        };
        Ok(())
    }

    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        let (e, _) = self.polled().peer(peer).cts[slot];
        (e.idx == idx).then_some(e)
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
        let mut s = self.lock();
        let (raddr, rkey) = self.remote(&mut s, peer, key, addr, len)?;
        let data = wire::write_data(self.rank, key as usize);
        // SAFETY: `src` is valid for `len` reads by contract, and stays so until `write_imm`
        // (which the protocol calls before it lets the buffer go) waits for the write.
        unsafe { s.write(peer, (src, len), (raddr, rkey, data)) }
            .map_err(|why| self.post_err(peer, "a write", why))?;
        s.peer(peer).writes[key as usize] += 1;
        Ok(())
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
        let id = {
            let mut s = self.lock();
            let (raddr, rkey) = self.remote(&mut s, peer, key, addr, len)?;
            // SAFETY: `dst` is valid for `len` writes by contract; we wait for the read below.
            unsafe { s.read(peer, (dst, len), (raddr, rkey)) }
                .map_err(|why| self.post_err(peer, "a read", why))?
        };
        self.wait(peer, "a read", |s| s.take_read(id))
    }

    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        // The immediate names how many writes it completes, so it may overtake them: it
        // leaves at once, and the receiver publishes it once they have all landed.
        {
            let mut s = self.lock();
            let writes = std::mem::take(&mut s.peer(peer).writes[slot]);
            let h = Header::new(Kind::Imm, slot, imm, writes, len);
            s.send(peer, &h, &[])
                .map_err(|why| self.post_err(peer, "an immediate", why))?;
        }
        // The writes must have left our buffer before the send counts as complete.
        self.wait(peer, "a write", |s| s.peer(peer).in_flight == 0)
    }

    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        let mut s = self.polled();
        let i = &s.peer(peer).imm[slot];
        (i.imm & !IMM_ERROR == want).then_some((i.imm, i.len))
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
        // SAFETY: `src` is valid for `len` reads by contract.
        let payload = unsafe { eager_payload(src, len, EAGER_MAX)? };
        let h = Header::new(Kind::Eager, slot, idx, tag, len as u64);
        self.send(peer, &h, payload)
    }

    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        let mut s = self.polled();
        let e = &s.peer(peer).eager[slot];
        (e.full && e.idx == idx).then_some(EagerHeader {
            tag: e.tag,
            len: e.len,
        })
    }

    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        let mut s = self.lock();
        let e = &s.peer(peer).eager[slot];
        // SAFETY: `dst` is valid for `len` writes and the slot holds at least `len` bytes (the
        // caller's contract, checked by `eager_peek`).
        unsafe { std::ptr::copy_nonoverlapping(e.data.as_ptr(), dst, len.min(e.len)) };
    }

    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        let mut s = self.lock();
        s.peer(peer).eager[slot].full = false;
        let h = Header::new(Kind::Credit, slot, seq.wrapping_add(1), 0, 0);
        // Deferred: the sender needs it only `depth` messages later. The receive is complete:
        // a peer that is gone by now needs no credit.
        let _ = s.defer(peer, &h, &[]);
        Ok(())
    }

    fn credit(&self, peer: usize, slot: usize) -> u32 {
        self.polled().peer(peer).credits[slot]
    }

    fn post_ack(&self, peer: usize) -> Result<()> {
        // As for credits: a peer that is gone waits for no ack.
        let _ = self.send(peer, &Header::new(Kind::Ack, 0, 0, 0, 0), &[]);
        Ok(())
    }

    fn acks(&self, peer: usize) -> u32 {
        self.polled().peer(peer).acks
    }

    fn peer_health(&self, peer: usize) -> Result<()> {
        self.check_peers_failed()?;
        let mut s = self.lock();
        match &s.peer(peer).dead {
            Some(why) => Err(Error::Remote(format!("{} {why}", self.descs[peer]))),
            None => Ok(()),
        }
    }

    fn peer_desc(&self, peer: usize) -> String {
        self.descs[peer].clone()
    }

    fn op_history(&self, peer: Option<usize>) -> Vec<OpRecord> {
        match peer {
            None => self.ops.newest_first(),
            // Peers' records stay on their hosts.
            Some(_) => Vec::new(),
        }
    }

    fn peer_op(&self, _peer: usize, _tag: u32) -> Option<String> {
        None
    }

    fn local_op(&self, tag: u32) -> Option<String> {
        self.ops.describe(tag)
    }
}

impl Drop for OfiDevice {
    /// Lets what we sent last (a credit, a failure note) leave before the endpoint closes:
    /// with manual progress nothing moves unless we drive it.
    fn drop(&mut self) {
        self.lock().flush();
        let deadline = Instant::now() + FLUSH_WAIT;
        while Instant::now() < deadline {
            let mut s = self.lock();
            s.progress();
            if !s.sending() {
                break;
            }
            drop(s);
            block(self.wait_fd, None, 1);
        }
    }
}

impl Transport for OfiDevice {
    fn name(&self) -> &'static str {
        "ofi"
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
    fn mark_failed(&self, msg: &str) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let text = &msg.as_bytes()[..msg.len().min(wire::MAX_TEXT)];
        let mut s = self.lock();
        for peer in (0..s.peers.len()).filter(|&p| p != self.rank) {
            // Best effort: a peer that is gone has nobody waiting for this.
            let _ = s.send(peer, &Header::new(Kind::Fail, 0, 0, 0, 0), text);
        }
    }
    fn holds_frames_back(&self) -> bool {
        true
    }
    fn flush(&self) {
        self.lock().flush();
    }
    fn driver_sleeps(&self) {
        if self.polled.stop() {
            self.handback.give();
        }
    }
    fn check_peers_failed(&self) -> Result<()> {
        let s = self.lock();
        for p in s.peers.iter().flatten() {
            if let Some(m) = &p.failed {
                return Err(Error::Remote(format!("{} failed: {m}", p.desc)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::split_addrs;

    #[test]
    fn rail_addresses_split_or_are_refused() {
        let entry = [2, 0, b'a', b'b', 1, 0, b'c'];
        assert_eq!(split_addrs(&entry, 2), Some(vec![&b"ab"[..], &b"c"[..]]));
        assert_eq!(split_addrs(&entry, 1), None, "bytes left over");
        assert_eq!(split_addrs(&entry, 3), None, "a rail missing");
        assert_eq!(split_addrs(&entry[..5], 2), None, "an address cut short");
    }
}
