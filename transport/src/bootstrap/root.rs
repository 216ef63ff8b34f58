//! The rendezvous root: one background thread that collects every rank's listen address and
//! sends the whole table back, plus the client side of that exchange.
//!
//! Protocol (little-endian):
//! * peer → root, *hello* (80 bytes): magic `b"AMPCHELO"`, token (16), rank (u64), world (u64),
//!   listen address (24, see [`super::unique_id`]), host id (u64), pid (u32), zero (u32).
//! * root → peer, *reply*: magic `b"AMPCTABL"`, status (u64). Status 0: world (u64) then per rank
//!   its address (24), host id (u64), pid (u32), zero (u32). Status 1 (refused): reason length
//!   (u64, at most 4096) and UTF-8 reason.
//!
//! A connection with a malformed hello or a wrong token is closed without reply (and logged with
//! `tracing::warn!`); one with the right token but an inconsistent world size or a duplicate rank
//! gets a status-1 reply. Either way the root keeps waiting for the legitimate peers. The world
//! size is fixed by the first accepted hello. The root exits once it has sent the table to all
//! `world` ranks, or at its deadline.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::unique_id::{ADDR_BYTES, Token, decode_addr, encode_addr};
use super::wire::{Fields, IoFail, prepare, read_exact_by, write_all_by};

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"AMPCHELO");
const REPLY_MAGIC: u64 = u64::from_le_bytes(*b"AMPCTABL");
const HELLO_BYTES: usize = 8 + 16 + 8 + 8 + ADDR_BYTES + 8 + 4 + 4;
const ENTRY_BYTES: usize = ADDR_BYTES + 8 + 4 + 4;
const MAX_REASON: u64 = 4096;
/// Longest wait for one connection's hello (a silent stray must not pin a thread for long).
const HELLO_WAIT: Duration = Duration::from_secs(60);

/// What a rank tells the others about itself through the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub addr: SocketAddr,
    pub host_id: u64,
    pub pid: u32,
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
    out.extend_from_slice(&0u32.to_le_bytes());
}

fn decode_info(f: &mut Fields<'_>) -> Option<PeerInfo> {
    let addr = decode_addr(f.take(ADDR_BYTES))?;
    let host_id = f.u64();
    let pid = f.u32();
    (f.u32() == 0).then_some(PeerInfo { addr, host_id, pid })
}

fn read_hello(stream: &mut TcpStream, deadline: Instant) -> Result<Hello, String> {
    let mut buf = [0u8; HELLO_BYTES];
    read_exact_by(stream, &mut buf, deadline).map_err(|e| format!("reading hello: {e}"))?;
    let mut f = Fields(&buf);
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
        .spawn(move || serve(listener, token, deadline))
        .map_err(|e| Error::system("bootstrap root: spawn thread", e))
}

type Incoming = (TcpStream, SocketAddr, Result<Hello, String>);

fn serve(listener: TcpListener, token: Token, deadline: Instant) -> RootReport {
    let local = listener.local_addr().ok();
    let (tx, rx) = mpsc::channel::<Incoming>();
    let mut report = RootReport::default();
    let mut world: Option<usize> = None;
    let mut joined: Vec<Option<(TcpStream, PeerInfo)>> = Vec::new();
    let mut count = 0usize;
    let refuse = |report: &mut RootReport, from: SocketAddr, why: String| {
        tracing::warn!(root = ?local, %from, "bootstrap root refused a connection: {why}");
        report.refused.push(format!("{from}: {why}"));
    };
    while world != Some(count) {
        if Instant::now() >= deadline {
            tracing::warn!(
                root = ?local,
                "bootstrap root timed out with {count} of {world:?} ranks joined"
            );
            report.timed_out = true;
            return report;
        }
        // Accept everything pending; each hello is read on its own thread so a slow or silent
        // connection cannot hold up the others.
        loop {
            match listener.accept() {
                Ok((mut stream, from)) => {
                    let tx = tx.clone();
                    let hello_deadline = deadline.min(Instant::now() + HELLO_WAIT);
                    let spawned = std::thread::Builder::new()
                        .name("ampccl-bootstrap-hello".into())
                        .spawn(move || {
                            let hello = prepare(&stream)
                                .map_err(|e| e.to_string())
                                .and_then(|()| read_hello(&mut stream, hello_deadline));
                            let _ = tx.send((stream, from, hello));
                        });
                    if let Err(e) = spawned {
                        refuse(
                            &mut report,
                            from,
                            format!("cannot spawn a reader thread: {e}"),
                        );
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(root = ?local, "bootstrap root accept failed: {e}");
                    break;
                }
            }
        }
        let (mut stream, from, hello) = match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(x) => x,
            Err(_) => continue,
        };
        let hello = match hello {
            Ok(h) if h.token == token => h,
            Ok(_) => {
                refuse(&mut report, from, "wrong token".into());
                continue;
            }
            Err(why) => {
                refuse(&mut report, from, why);
                continue;
            }
        };
        let (rank, w) = (hello.rank, hello.world);
        let problem = if w == 0 || rank >= w || w > u32::MAX as u64 {
            Some(format!("rank {rank} / world {w} is out of range"))
        } else if world.is_some_and(|ws| ws as u64 != w) {
            Some(format!(
                "rank {rank} says world {w}, others said {}",
                world.unwrap_or(0)
            ))
        } else if joined.get(rank as usize).is_some_and(Option::is_some) {
            Some(format!("duplicate rank {rank}"))
        } else {
            None
        };
        if let Some(why) = problem {
            let mut reply = Vec::new();
            reply.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
            reply.extend_from_slice(&1u64.to_le_bytes());
            reply.extend_from_slice(&(why.len() as u64).min(MAX_REASON).to_le_bytes());
            reply.extend_from_slice(&why.as_bytes()[..why.len().min(MAX_REASON as usize)]);
            let _ = write_all_by(
                &mut stream,
                &[&reply],
                Instant::now() + Duration::from_secs(1),
            );
            refuse(&mut report, from, why);
            continue;
        }
        if world.is_none() {
            world = Some(w as usize);
            joined.resize_with(w as usize, || None);
        }
        joined[rank as usize] = Some((stream, hello.info));
        count += 1;
    }
    let mut table = Vec::with_capacity(24 + count * ENTRY_BYTES);
    table.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
    table.extend_from_slice(&0u64.to_le_bytes());
    table.extend_from_slice(&(count as u64).to_le_bytes());
    for (_, info) in joined.iter().flatten() {
        encode_info(&mut table, info);
    }
    for (rank, (mut stream, _)) in joined.into_iter().flatten().enumerate() {
        let send_deadline = Instant::now() + Duration::from_secs(10);
        match write_all_by(&mut stream, &[&table], send_deadline) {
            Ok(()) => report.served += 1,
            Err(e) => {
                tracing::warn!(root = ?local, "bootstrap root: sending table to rank {rank}: {e}")
            }
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    report
}

/// Connects to the root, retrying (the root may not be up yet) until `deadline`.
pub(crate) fn connect_root(root: SocketAddr, rank: usize, deadline: Instant) -> Result<TcpStream> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(5);
    loop {
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

/// Sends this rank's hello over a connected root socket and waits for the address table.
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
    let fail = |what: &str, e: IoFail| match e {
        IoFail::Timeout => Error::Timeout(format!(
            "rank {rank}: {what} the bootstrap root {root} timed out (did all {world} ranks join?)"
        )),
        IoFail::Closed(_) => Error::Remote(format!(
            "rank {rank}: the bootstrap root {root} closed the connection while {what} it \
             (wrong token, or its rendezvous is over)"
        )),
        IoFail::Other(e) => Error::Remote(format!(
            "rank {rank}: {what} the bootstrap root {root}: {e}"
        )),
    };
    write_all_by(&mut stream, &[&hello], deadline).map_err(|e| fail("sending hello to", e))?;
    let mut head = [0u8; 24];
    read_exact_by(&mut stream, &mut head, deadline)
        .map_err(|e| fail("waiting for the table from", e))?;
    let mut f = Fields(&head);
    let malformed = || {
        Error::Remote(format!(
            "rank {rank}: malformed reply from bootstrap root {root}"
        ))
    };
    if f.u64() != REPLY_MAGIC {
        return Err(malformed());
    }
    let status = f.u64();
    let n = f.u64();
    if status == 1 {
        if n > MAX_REASON {
            return Err(malformed());
        }
        let mut why = vec![0u8; n as usize];
        read_exact_by(&mut stream, &mut why, deadline)
            .map_err(|e| fail("reading the refusal from", e))?;
        return Err(Error::InvalidUsage(format!(
            "rank {rank}: bootstrap root {root} refused: {}",
            String::from_utf8_lossy(&why)
        )));
    }
    if status != 0 || n != world as u64 {
        return Err(malformed());
    }
    let mut body = vec![0u8; world * ENTRY_BYTES];
    read_exact_by(&mut stream, &mut body, deadline)
        .map_err(|e| fail("reading the table from", e))?;
    let mut f = Fields(&body);
    (0..world)
        .map(|_| decode_info(&mut f).ok_or_else(malformed))
        .collect()
}
