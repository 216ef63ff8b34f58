//! The rendezvous root: one background thread that collects every rank's listen address and
//! sends the whole table back, plus the client side of that exchange.
//!
//! Protocol (little-endian):
//! * peer → root, *hello* (80 bytes): magic `b"AMPCHELO"`, token (16), rank (u64), world (u64),
//!   listen address (24, see [`super::unique_id`]), host id (u64), pid (u32), PID-namespace id
//!   (u32, 0 if unknown).
//! * root → peer, *reply*: magic `b"AMPCTABL"`, status (u64), then by status:
//!   * 0, the table: world (u64) then per rank its address (24), host id (u64), pid (u32),
//!     PID-namespace id (u32). Last message; the root then closes.
//!   * 1, refused: reason length (u64, at most 4096) and UTF-8 reason. Last message.
//!   * 2, progress: ranks joined so far (u64), world (u64), `k` (u64, at most 32), then the
//!     first `k` missing ranks (u64 each). Sent whenever the set of joined ranks changed, at
//!     most every 200 ms (longer for big worlds).
//!   * 3, given up: the root reached its deadline; reason length (u64, at most 4096) and UTF-8
//!     reason naming the missing ranks. Last message.
//!
//! **Bounds.** The root never sizes anything by what a connection says: one thread reads every
//! hello (non-blocking sockets and `poll`), at most [`MAX_PENDING_HELLOS`] connections wait for
//! their hello at once (the oldest is dropped to make room) and each gets [`HELLO_WAIT`]; the
//! joined ranks are kept in a map that grows only with ranks that presented the right token,
//! and a world size above [`super::MAX_RANKS`] is refused.
//!
//! A connection with a malformed hello is closed without reply and logged with
//! `tracing::warn!`; a hello with a wrong token (another job's or another unique id's rank, see
//! the module documentation of [`super`]) gets a status-1 reply saying so, as does one with the
//! right token but an out-of-range or inconsistent world size or a duplicate rank. Either way the
//! root keeps waiting for the legitimate peers. The world size is fixed by the first accepted
//! hello. A joined rank whose connection closes before the table is sent is forgotten (it may
//! join again). The root exits once it has sent the table to all `world` ranks, or at its
//! deadline, when it tells every joined rank which ranks are missing.

use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::unique_id::{ADDR_BYTES, Token, decode_addr, encode_addr};
use super::wire::{
    Fields, IoFail, poll_readable, prepare, read_available, read_exact_by, read_resumable,
    write_all_by,
};
use super::{MAX_RANKS, log_every, rank_list};

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"AMPCHELO");
const REPLY_MAGIC: u64 = u64::from_le_bytes(*b"AMPCTABL");
pub(crate) const HELLO_BYTES: usize = 8 + 16 + 8 + 8 + ADDR_BYTES + 8 + 4 + 4;
const ENTRY_BYTES: usize = ADDR_BYTES + 8 + 4 + 4;
const MAX_REASON: u64 = 4096;
const STATUS_TABLE: u64 = 0;
const STATUS_REFUSED: u64 = 1;
const STATUS_PROGRESS: u64 = 2;
const STATUS_GAVE_UP: u64 = 3;
/// Most missing ranks a progress message lists.
const MAX_LISTED: u64 = 32;
/// Longest wait for one connection's hello (a silent stray must not hold a slot for long; a
/// rank sends its hello right after connecting).
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(10);
/// How often the root checks whether a joined rank's connection closed.
const MEMBER_CHECK: Duration = Duration::from_millis(500);
/// Most connections waiting for their hello at once; a newer one pushes out the oldest.
pub(crate) const MAX_PENDING_HELLOS: usize = 128;

/// What a rank tells the others about itself through the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub addr: SocketAddr,
    pub host_id: u64,
    pub pid: u32,
    /// See [`super::wire::pid_namespace`]; 0 if unknown.
    pub pid_ns: u32,
}

/// What a root thread did, returned by its `JoinHandle` (see [`super::UniqueId::generate_with`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootReport {
    /// Ranks that received the address table.
    pub served: usize,
    /// One line per refused connection, saying why.
    pub refused: Vec<String>,
    /// Whether the root gave up at its deadline before all ranks joined.
    pub timed_out: bool,
    /// When it gave up with a known world size: the ranks that had not joined.
    pub missing: Vec<usize>,
}

struct Hello {
    token: Token,
    rank: u64,
    world: u64,
    info: PeerInfo,
}

fn encode_info(out: &mut Vec<u8>, info: &PeerInfo) {
    out.extend_from_slice(&encode_addr(info.addr));
    out.extend_from_slice(&info.host_id.to_le_bytes());
    out.extend_from_slice(&info.pid.to_le_bytes());
    out.extend_from_slice(&info.pid_ns.to_le_bytes());
}

fn decode_info(f: &mut Fields<'_>) -> Option<PeerInfo> {
    let addr = decode_addr(f.take(ADDR_BYTES))?;
    let host_id = f.u64();
    let pid = f.u32();
    let pid_ns = f.u32();
    Some(PeerInfo {
        addr,
        host_id,
        pid,
        pid_ns,
    })
}

fn parse_hello(buf: &[u8; HELLO_BYTES]) -> Result<Hello, String> {
    let mut f = Fields(buf);
    if f.u64() != HELLO_MAGIC {
        return Err("malformed hello: bad magic".into());
    }
    let token = f.u128();
    let rank = f.u64();
    let world = f.u64();
    let info = decode_info(&mut f).ok_or("malformed hello: bad address encoding")?;
    Ok(Hello {
        token,
        rank,
        world,
        info,
    })
}

/// A message with a status and a text (status 1 or 3), the text cut to [`MAX_REASON`] bytes.
fn text_reply(status: u64, why: &str) -> Vec<u8> {
    let mut cut = why.len().min(MAX_REASON as usize);
    while !why.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut reply = Vec::with_capacity(24 + cut);
    reply.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
    reply.extend_from_slice(&status.to_le_bytes());
    reply.extend_from_slice(&(cut as u64).to_le_bytes());
    reply.extend_from_slice(&why.as_bytes()[..cut]);
    reply
}

/// Writes `bytes` to a (possibly non-blocking) socket in blocking mode before `deadline`.
fn send_blocking(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), IoFail> {
    stream.set_nonblocking(false).map_err(IoFail::Other)?;
    write_all_by(stream, &[bytes], deadline)
}

/// Starts the root thread on a bound listener; it serves one rendezvous and exits, at the latest
/// after `timeout`.
pub(crate) fn spawn_root(
    listener: TcpListener,
    token: Token,
    timeout: Duration,
) -> Result<JoinHandle<RootReport>> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::system("bootstrap root: set_nonblocking", e))?;
    let deadline = Instant::now() + timeout;
    std::thread::Builder::new()
        .name("ampccl-bootstrap-root".into())
        .spawn(move || Root::new(listener, token).serve(deadline))
        .map_err(|e| Error::system("bootstrap root: spawn thread", e))
}

/// A connection whose hello has not fully arrived.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: [u8; HELLO_BYTES],
    filled: usize,
    until: Instant,
}

/// A rank that presented a valid hello and waits for the table.
struct Member {
    stream: TcpStream,
    from: SocketAddr,
    info: PeerInfo,
}

struct Root {
    listener: TcpListener,
    local: Option<SocketAddr>,
    token: Token,
    report: RootReport,
    world: Option<usize>,
    joined: BTreeMap<usize, Member>,
    pending: VecDeque<Pending>,
    /// The joined set changed since the last progress message.
    dirty: bool,
    last_progress: Option<Instant>,
    next_member_check: Instant,
}

impl Root {
    fn new(listener: TcpListener, token: Token) -> Root {
        Root {
            local: listener.local_addr().ok(),
            listener,
            token,
            report: RootReport::default(),
            world: None,
            joined: BTreeMap::new(),
            pending: VecDeque::new(),
            dirty: false,
            last_progress: None,
            next_member_check: Instant::now(),
        }
    }

    fn refuse(&mut self, from: SocketAddr, why: String) {
        tracing::warn!(root = ?self.local, %from, "bootstrap root refused a connection: {why}");
        self.report.refused.push(format!("{from}: {why}"));
    }

    fn missing(&self) -> Vec<usize> {
        let world = self.world.unwrap_or(0);
        (0..world)
            .filter(|r| !self.joined.contains_key(r))
            .collect()
    }

    /// Time between progress messages: long enough that a big world's stream of joins does not
    /// turn into a storm of messages.
    fn progress_gap(&self) -> Duration {
        Duration::from_millis(200).max(Duration::from_micros(50) * self.joined.len() as u32)
    }

    fn serve(mut self, deadline: Instant) -> RootReport {
        loop {
            if self.world == Some(self.joined.len()) {
                self.send_table();
                return self.report;
            }
            let now = Instant::now();
            if now >= deadline {
                self.give_up();
                return self.report;
            }
            let mut wake = deadline;
            if let Some(p) = self.pending.front() {
                wake = wake.min(p.until);
            }
            if self.dirty {
                wake = wake.min(self.progress_due().unwrap_or(now));
            }
            // The joined ranks' sockets (to notice one closing) only every MEMBER_CHECK: with a
            // big world, polling them all on every event would cost O(world) per join.
            let check_members = now >= self.next_member_check;
            if check_members {
                self.next_member_check = now + MEMBER_CHECK;
            }
            wake = wake.min(self.next_member_check);
            let members = if check_members { self.joined.len() } else { 0 };
            let mut fds = Vec::with_capacity(1 + self.pending.len() + members);
            fds.push(self.listener.as_raw_fd());
            fds.extend(self.pending.iter().map(|p| p.stream.as_raw_fd()));
            fds.extend(
                self.joined
                    .values()
                    .take(members)
                    .map(|m| m.stream.as_raw_fd()),
            );
            let timeout = if check_members {
                Duration::ZERO
            } else {
                wake.saturating_duration_since(now)
            };
            let ready = match poll_readable(&fds, timeout) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(root = ?self.local, "bootstrap root: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    vec![false; fds.len()]
                }
            };
            let (listen_ready, rest) = ready.split_first().expect("listener polled");
            let (pending_ready, joined_ready) = rest.split_at(self.pending.len());
            let left: Vec<usize> = self
                .joined
                .keys()
                .zip(joined_ready)
                .filter_map(|(&r, &ready)| ready.then_some(r))
                .collect();
            self.check_members(&left);
            self.read_hellos(pending_ready);
            if *listen_ready {
                self.accept();
            }
            if self.dirty && self.progress_due().is_none_or(|t| Instant::now() >= t) {
                self.send_progress();
            }
        }
    }

    /// When the next progress message may go out (`None`: at once).
    fn progress_due(&self) -> Option<Instant> {
        self.last_progress.map(|t| t + self.progress_gap())
    }

    /// Joined ranks whose socket became readable: a rank sends nothing after its hello, so this
    /// is the connection closing (the rank gave up or died) or a protocol violation.
    fn check_members(&mut self, ranks: &[usize]) {
        for &rank in ranks {
            let Some(m) = self.joined.get_mut(&rank) else {
                continue;
            };
            let mut byte = [0u8; 1];
            let mut filled = 0;
            let why = match read_available(&mut m.stream, &mut byte, &mut filled) {
                Ok(false) => continue,
                Ok(true) => "sent bytes after its hello".to_string(),
                Err(IoFail::Closed(_)) => "closed its connection".to_string(),
                Err(e) => e.to_string(),
            };
            let m = self.joined.remove(&rank).expect("present above");
            tracing::warn!(
                root = ?self.local, from = %m.from,
                "bootstrap root: rank {rank} left before the table was complete ({why}); \
                 it may join again"
            );
            self.dirty = true;
        }
    }

    fn read_hellos(&mut self, ready: &[bool]) {
        let now = Instant::now();
        let pending = std::mem::take(&mut self.pending);
        for (mut p, &ready) in pending.into_iter().zip(ready.iter()) {
            if ready {
                match read_available(&mut p.stream, &mut p.buf, &mut p.filled) {
                    Ok(true) => {
                        let hello = parse_hello(&p.buf);
                        self.admit(p.stream, p.from, hello);
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.refuse(p.from, format!("reading hello: {e}"));
                        continue;
                    }
                }
            }
            if now >= p.until {
                self.refuse(
                    p.from,
                    format!(
                        "reading hello: timed out ({} of {HELLO_BYTES} bytes in {HELLO_WAIT:?})",
                        p.filled
                    ),
                );
                continue;
            }
            self.pending.push_back(p);
        }
    }

    fn accept(&mut self) {
        // Bounded per round so that a flood cannot starve the hellos already pending.
        for _ in 0..MAX_PENDING_HELLOS {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if let Err(e) = stream
                        .set_nonblocking(true)
                        .and_then(|()| stream.set_nodelay(true))
                    {
                        self.refuse(from, format!("socket setup: {e}"));
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING_HELLOS
                        && let Some(old) = self.pending.pop_front()
                    {
                        self.refuse(
                            old.from,
                            format!(
                                "reading hello: dropped, {MAX_PENDING_HELLOS} newer connections \
                                 were waiting"
                            ),
                        );
                    }
                    self.pending.push_back(Pending {
                        stream,
                        from,
                        buf: [0; HELLO_BYTES],
                        filled: 0,
                        until: Instant::now() + HELLO_WAIT,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning on it.
                    tracing::warn!(root = ?self.local, "bootstrap root accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, from: SocketAddr, hello: Result<Hello, String>) {
        let hello = match hello {
            Ok(h) => h,
            Err(why) => return self.refuse(from, why),
        };
        let (rank, w) = (hello.rank, hello.world);
        let problem = if hello.token != self.token {
            Some(
                "wrong token: this rendezvous root serves another job (another unique id, or \
                 torchrun-style ranks whose MASTER_ADDR, MASTER_PORT, WORLD_SIZE or job id \
                 differ)"
                    .to_string(),
            )
        } else if w == 0 || w > MAX_RANKS as u64 {
            Some(format!(
                "world size {w} is out of range (1..={MAX_RANKS}), rank {rank}"
            ))
        } else if rank >= w {
            Some(format!("rank {rank} is not in a world of {w}"))
        } else if self.world.is_some_and(|ws| ws as u64 != w) {
            Some(format!(
                "rank {rank} says world {w}, others said {}",
                self.world.unwrap_or(0)
            ))
        } else if self.joined.contains_key(&(rank as usize)) {
            Some(format!(
                "duplicate rank {rank} (already joined from {})",
                self.joined[&(rank as usize)].from
            ))
        } else {
            None
        };
        if let Some(why) = problem {
            let reply = text_reply(STATUS_REFUSED, &why);
            let _ = send_blocking(
                &mut stream,
                &reply,
                Instant::now() + Duration::from_millis(200),
            );
            return self.refuse(from, why);
        }
        self.world.get_or_insert(w as usize);
        self.joined.insert(
            rank as usize,
            Member {
                stream,
                from,
                info: hello.info,
            },
        );
        self.dirty = true;
    }

    fn send_progress(&mut self) {
        self.dirty = false;
        self.last_progress = Some(Instant::now());
        let Some(world) = self.world else { return };
        let missing = self.missing();
        let listed = &missing[..missing.len().min(MAX_LISTED as usize)];
        let mut msg = Vec::with_capacity(48 + 8 * listed.len());
        msg.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
        msg.extend_from_slice(&STATUS_PROGRESS.to_le_bytes());
        msg.extend_from_slice(&(self.joined.len() as u64).to_le_bytes());
        msg.extend_from_slice(&(world as u64).to_le_bytes());
        msg.extend_from_slice(&(listed.len() as u64).to_le_bytes());
        for &r in listed {
            msg.extend_from_slice(&(r as u64).to_le_bytes());
        }
        let mut gone = Vec::new();
        for (&rank, m) in &mut self.joined {
            let sent = send_blocking(
                &mut m.stream,
                &msg,
                Instant::now() + Duration::from_millis(100),
            )
            .and_then(|()| m.stream.set_nonblocking(true).map_err(IoFail::Other));
            if let Err(e) = sent {
                gone.push((rank, e));
            }
        }
        for (rank, e) in gone {
            self.joined.remove(&rank);
            self.dirty = true;
            tracing::warn!(root = ?self.local, "bootstrap root: rank {rank} left ({e})");
        }
    }

    fn give_up(&mut self) {
        let missing = self.missing();
        let why = match self.world {
            Some(world) => format!(
                "the rendezvous timed out with {} of {world} ranks joined; missing {}",
                self.joined.len(),
                rank_list(&missing, missing.len())
            ),
            None => "the rendezvous timed out before any rank joined".into(),
        };
        tracing::warn!(root = ?self.local, "bootstrap root: {why}");
        let reply = text_reply(STATUS_GAVE_UP, &why);
        for m in self.joined.values_mut() {
            let _ = send_blocking(
                &mut m.stream,
                &reply,
                Instant::now() + Duration::from_millis(100),
            );
        }
        self.report.timed_out = true;
        self.report.missing = missing;
    }

    fn send_table(&mut self) {
        let count = self.joined.len();
        let mut table = Vec::with_capacity(24 + count * ENTRY_BYTES);
        table.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
        table.extend_from_slice(&STATUS_TABLE.to_le_bytes());
        table.extend_from_slice(&(count as u64).to_le_bytes());
        for m in self.joined.values() {
            encode_info(&mut table, &m.info);
        }
        for (rank, mut m) in std::mem::take(&mut self.joined) {
            let send_deadline = Instant::now() + Duration::from_secs(10);
            match send_blocking(&mut m.stream, &table, send_deadline) {
                Ok(()) => self.report.served += 1,
                Err(e) => tracing::warn!(
                    root = ?self.local,
                    "bootstrap root: sending table to rank {rank}: {e}"
                ),
            }
            let _ = m.stream.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// Connects to the root, retrying (the root may not be up yet) until `deadline`.
pub(crate) fn connect_root(root: SocketAddr, rank: usize, deadline: Instant) -> Result<TcpStream> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(5);
    let mut next_log = start + log_every();
    loop {
        if Instant::now() >= next_log {
            tracing::warn!(
                "rank {rank}: waiting {:.0?} for the bootstrap root {root} to accept connections \
                 (is the process that hosts it, rank 0 or the unique id's creator, up?)",
                start.elapsed()
            );
            next_log += log_every();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let err = if left.is_zero() {
            None
        } else {
            match TcpStream::connect_timeout(&root, left.min(Duration::from_secs(2))) {
                Ok(s) => {
                    prepare(&s).map_err(|e| Error::system("bootstrap: root socket", e))?;
                    return Ok(s);
                }
                Err(e) => Some(e),
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = err.map(|e| format!(": {e}")).unwrap_or_default();
            return Err(Error::Timeout(format!(
                "rank {rank}: bootstrap root {root} unreachable after {:?}{why}",
                start.elapsed()
            )));
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// What the root last said about who has joined.
struct Progress {
    joined: u64,
    world: u64,
    listed: Vec<usize>,
}

impl Progress {
    fn describe(&self) -> String {
        let missing = (self.world - self.joined) as usize;
        format!(
            "{} of {} ranks joined; missing {}",
            self.joined,
            self.world,
            rank_list(&self.listed, missing)
        )
    }
}

/// Sends this rank's hello over a connected root socket and waits for the address table. While
/// it waits, logs every [`super::PROGRESS_LOG_EVERY`] who has joined and who is missing; a
/// timeout names the missing ranks.
pub(crate) fn exchange(
    mut stream: TcpStream,
    token: Token,
    rank: usize,
    world: usize,
    me: PeerInfo,
    deadline: Instant,
) -> Result<Vec<PeerInfo>> {
    let root = stream
        .peer_addr()
        .map_err(|e| Error::system("bootstrap: root peer_addr", e))?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&token.to_le_bytes());
    hello.extend_from_slice(&(rank as u64).to_le_bytes());
    hello.extend_from_slice(&(world as u64).to_le_bytes());
    encode_info(&mut hello, &me);
    let start = Instant::now();
    let mut progress: Option<Progress> = None;
    let status_line = |progress: &Option<Progress>| match progress {
        Some(p) => p.describe(),
        None => "no word from the root yet on who has joined".into(),
    };
    let fail = |what: &str, e: IoFail, progress: &Option<Progress>| match e {
        IoFail::Timeout => Error::Timeout(format!(
            "rank {rank}: {what} the bootstrap root {root} timed out after {:.1?}: {}",
            start.elapsed(),
            status_line(progress)
        )),
        IoFail::Closed(_) => Error::Remote(format!(
            "rank {rank}: the bootstrap root {root} closed the connection while {what} it \
             (its rendezvous is over, or it is not an ampccl root)"
        )),
        e => Error::Remote(format!(
            "rank {rank}: {what} the bootstrap root {root}: {e}"
        )),
    };
    write_all_by(&mut stream, &[&hello], deadline)
        .map_err(|e| fail("sending hello to", e, &progress))?;
    let malformed = |why: &str| {
        Error::Remote(format!(
            "rank {rank}: malformed reply from bootstrap root {root}: {why}"
        ))
    };
    let mut head = [0u8; 24];
    let mut filled = 0;
    let mut next_log = start + log_every();
    loop {
        match read_resumable(&mut stream, &mut head, &mut filled, deadline.min(next_log)) {
            Ok(()) => filled = 0,
            Err(IoFail::Timeout) if Instant::now() < deadline => {
                tracing::warn!(
                    "rank {rank}: waiting {:.0?} for the bootstrap rendezvous at {root}: {}",
                    start.elapsed(),
                    status_line(&progress)
                );
                next_log += log_every();
                continue;
            }
            Err(e) => return Err(fail("waiting for the table from", e, &progress)),
        }
        let mut f = Fields(&head);
        if f.u64() != REPLY_MAGIC {
            return Err(malformed("bad magic"));
        }
        let (status, n) = (f.u64(), f.u64());
        match status {
            STATUS_TABLE => {
                if n != world as u64 {
                    return Err(malformed(&format!("a table of {n} ranks")));
                }
                break;
            }
            STATUS_REFUSED | STATUS_GAVE_UP => {
                if n > MAX_REASON {
                    return Err(malformed("oversized reason"));
                }
                let mut why = vec![0u8; n as usize];
                read_exact_by(&mut stream, &mut why, deadline)
                    .map_err(|e| fail("reading the refusal from", e, &progress))?;
                let why = String::from_utf8_lossy(&why);
                return Err(if status == STATUS_REFUSED {
                    Error::InvalidUsage(format!(
                        "rank {rank}: bootstrap root {root} refused: {why}"
                    ))
                } else {
                    Error::Timeout(format!(
                        "rank {rank}: bootstrap root {root} gave up after waiting {:.1?} here: \
                         {why}",
                        start.elapsed()
                    ))
                });
            }
            STATUS_PROGRESS => {
                let mut body = [0u8; 16];
                read_exact_by(&mut stream, &mut body, deadline)
                    .map_err(|e| fail("reading progress from", e, &progress))?;
                let mut f = Fields(&body);
                let (w, k) = (f.u64(), f.u64());
                if w != world as u64 || n > w || k > MAX_LISTED || k > w - n {
                    return Err(malformed(&format!(
                        "progress of {n} of {w} ranks listing {k}"
                    )));
                }
                let mut list = vec![0u8; 8 * k as usize];
                read_exact_by(&mut stream, &mut list, deadline)
                    .map_err(|e| fail("reading progress from", e, &progress))?;
                let listed: Vec<usize> = list
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .filter(|&r| r < w)
                    .map(|r| r as usize)
                    .collect();
                progress = Some(Progress {
                    joined: n,
                    world: w,
                    listed,
                });
            }
            s => return Err(malformed(&format!("status {s}"))),
        }
    }
    let mut body = vec![0u8; world * ENTRY_BYTES];
    read_exact_by(&mut stream, &mut body, deadline)
        .map_err(|e| fail("reading the table from", e, &progress))?;
    let mut f = Fields(&body);
    (0..world)
        .map(|_| decode_info(&mut f).ok_or_else(|| malformed("bad address encoding")))
        .collect()
}
