//! Full mesh of bootstrap connections, built once the root has sent the address table.
//!
//! Rank `r` connects to every higher rank and sends each a handshake; then, in one loop, it
//! accepts until every lower rank has connected (answering each valid handshake with an ack)
//! and reads the acks of the higher ranks. Nobody waits in a cycle: a rank's connections to
//! higher ranks are made before it waits for anything.
//!
//! Handshake and ack (48 bytes, little-endian): magic `b"AMPCMESH"`, token (16), sender rank
//! (u64), receiver rank (u64), world (u64). An accepted connection with a malformed handshake, a
//! wrong token, the wrong receiver or world, or a rank that is not an expected lower rank is
//! closed and logged with `tracing::warn!`; accepting goes on.
//!
//! All handshakes are read by the calling thread through `poll`, each with its own
//! [`SHAKE_WAIT`], and at most [`MAX_PENDING_SHAKES`] at once (a newer connection pushes out the
//! oldest): stray or silent connections to the listener cost nothing but their slot. While it
//! waits, the loop checks every [`CHECK_EVERY`] that the peers it waits for still exist (on this
//! host: [`process_gone`]; elsewhere: their connection closing) and fails at once naming a dead
//! one; it logs every [`super::PROGRESS_LOG_EVERY`] which peers it still waits for, and a
//! timeout names them.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::unique_id::Token;
use super::wire::{
    CHECK_EVERY, Fields, IoFail, poll_readable, prepare, process_gone, read_available, remaining,
    write_all_by,
};
use super::{log_every, rank_list};

const MESH_MAGIC: u64 = u64::from_le_bytes(*b"AMPCMESH");
const SHAKE_BYTES: usize = 48;
/// Longest wait for the handshake of one accepted connection.
pub(crate) const SHAKE_WAIT: Duration = Duration::from_secs(5);
/// Most accepted connections waiting for their handshake at once.
pub(crate) const MAX_PENDING_SHAKES: usize = 64;

fn handshake(token: Token, from: usize, to: usize, world: usize) -> [u8; SHAKE_BYTES] {
    let mut b = [0u8; SHAKE_BYTES];
    b[0..8].copy_from_slice(&MESH_MAGIC.to_le_bytes());
    b[8..24].copy_from_slice(&token.to_le_bytes());
    b[24..32].copy_from_slice(&(from as u64).to_le_bytes());
    b[32..40].copy_from_slice(&(to as u64).to_le_bytes());
    b[40..48].copy_from_slice(&(world as u64).to_le_bytes());
    b
}

/// Parses a handshake; returns the sender rank if magic, token, receiver and world match.
fn check(b: &[u8; SHAKE_BYTES], token: Token, to: usize, world: usize) -> Result<usize, String> {
    let mut f = Fields(b);
    if f.u64() != MESH_MAGIC {
        return Err("malformed handshake: bad magic".into());
    }
    if f.u128() != token {
        return Err("wrong token".into());
    }
    let (from, dest, w) = (f.u64(), f.u64(), f.u64());
    if dest != to as u64 || w != world as u64 || from >= w {
        return Err(format!(
            "handshake for rank {dest} of {w} from rank {from} does not fit"
        ));
    }
    Ok(from as usize)
}

/// The peers of a mesh under construction: who they are and how to tell they died.
pub(crate) struct Peers<'a> {
    pub rank: usize,
    pub world: usize,
    pub token: Token,
    pub addrs: &'a [SocketAddr],
    /// Per rank, the pid to watch with [`process_gone`] (same host and PID namespace), if any.
    pub watch: &'a [Option<u32>],
}

impl Peers<'_> {
    /// The ranks among `ranks` whose process is known to have exited.
    fn dead_among(&self, ranks: impl Iterator<Item = usize>) -> Vec<usize> {
        ranks
            .filter(|&p| self.watch[p].is_some_and(process_gone))
            .collect()
    }

    /// The error naming the dead peers `dead` (with their pids) and what was going on.
    fn died(&self, dead: &[usize], during: &str) -> Error {
        let who: Vec<String> = dead
            .iter()
            .map(|&p| format!("{} (pid {})", p, self.watch[p].unwrap_or(0)))
            .collect();
        Error::Remote(format!(
            "rank {}: peer rank(s) {} exited during bootstrap set-up ({during})",
            self.rank,
            who.join(", ")
        ))
    }

    /// The error for a failed exchange with `peer`; if some peer has died meanwhile (the usual
    /// cause), the error names it instead.
    fn io_err(&self, peer: usize, what: &str, e: IoFail) -> Error {
        let during = format!("{what} peer rank {peer}: {e}");
        let dead = self.dead_among(0..self.world);
        if !dead.is_empty() {
            return self.died(&dead, &during);
        }
        match e {
            IoFail::Timeout => Error::Timeout(format!("rank {}: {during}", self.rank)),
            _ => Error::Remote(format!("rank {}: {during}", self.rank)),
        }
    }
}

struct Shake {
    stream: TcpStream,
    from: SocketAddr,
    buf: [u8; SHAKE_BYTES],
    filled: usize,
    until: Instant,
}

/// Builds the mesh; entry `p` is the connection to rank `p` (`None` for `rank` itself).
pub(crate) fn build(
    listener: TcpListener,
    peers: &Peers<'_>,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let (rank, world, token) = (peers.rank, peers.world, peers.token);
    let start = Instant::now();
    let mut conns: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    // Connect to all higher ranks (their listeners are bound before the table exists).
    for (peer, addr) in peers.addrs.iter().enumerate().skip(rank + 1) {
        let left = remaining(deadline)
            .ok_or_else(|| peers.io_err(peer, "connecting to", IoFail::Timeout))?;
        let mut s = TcpStream::connect_timeout(addr, left)
            .map_err(|e| peers.io_err(peer, &format!("connecting to {addr},"), IoFail::Other(e)))?;
        prepare(&s).map_err(|e| Error::system("bootstrap: peer socket", e))?;
        write_all_by(&mut s, &[&handshake(token, rank, peer, world)], deadline)
            .map_err(|e| peers.io_err(peer, "sending the handshake to", e))?;
        s.set_nonblocking(true)
            .map_err(|e| Error::system("bootstrap: peer socket", e))?;
        conns[peer] = Some(s);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::system("bootstrap: listener", e))?;
    // Acks of the higher ranks: bytes read so far, `None` once complete.
    let mut acks: Vec<Option<([u8; SHAKE_BYTES], usize)>> = (0..world)
        .map(|p| (p > rank).then_some(([0; SHAKE_BYTES], 0)))
        .collect();
    let mut pending: VecDeque<Shake> = VecDeque::new();
    let mut next_check = Instant::now();
    let mut next_log = start + log_every();
    let waiting_for = |conns: &[Option<TcpStream>], acks: &[Option<([u8; SHAKE_BYTES], usize)>]| {
        (0..world)
            .filter(|&p| (p < rank && conns[p].is_none()) || acks[p].is_some())
            .collect::<Vec<usize>>()
    };
    loop {
        let waiting = waiting_for(&conns, &acks);
        if waiting.is_empty() {
            break;
        }
        let now = Instant::now();
        if now >= next_check {
            let dead = peers.dead_among(waiting.iter().copied());
            if !dead.is_empty() {
                return Err(peers.died(&dead, "while building the bootstrap mesh"));
            }
            next_check = now + CHECK_EVERY;
        }
        if now >= deadline {
            return Err(Error::Timeout(format!(
                "rank {rank}: building the bootstrap mesh timed out after {:.1?}: no connection \
                 or acknowledgement from peer {}",
                start.elapsed(),
                rank_list(&waiting, waiting.len())
            )));
        }
        if now >= next_log {
            tracing::warn!(
                "rank {rank}: waiting {:.0?} to build the bootstrap mesh: {} of {} peers \
                 connected; waiting for peer {}",
                start.elapsed(),
                world - 1 - waiting.len(),
                world - 1,
                rank_list(&waiting, waiting.len())
            );
            next_log += log_every();
        }
        let mut wake = deadline.min(next_check).min(next_log);
        if let Some(p) = pending.front() {
            wake = wake.min(p.until);
        }
        let ack_peers: Vec<usize> = (0..world).filter(|&p| acks[p].is_some()).collect();
        let mut fds = Vec::with_capacity(1 + pending.len() + ack_peers.len());
        fds.push(listener.as_raw_fd());
        fds.extend(pending.iter().map(|s| s.stream.as_raw_fd()));
        fds.extend(
            ack_peers
                .iter()
                .map(|&p| conns[p].as_ref().expect("connected").as_raw_fd()),
        );
        let ready = poll_readable(&fds, wake.saturating_duration_since(now))
            .map_err(|e| Error::system("bootstrap: poll", e))?;
        let (listen_ready, rest) = ready.split_first().expect("listener polled");
        let (shake_ready, ack_ready) = rest.split_at(pending.len());
        // Acks of higher ranks.
        for (&peer, _) in ack_peers.iter().zip(ack_ready).filter(|(_, r)| **r) {
            let s = conns[peer].as_mut().expect("connected");
            let (buf, filled) = acks[peer].as_mut().expect("waiting");
            match read_available(s, buf, filled) {
                Ok(false) => {}
                Ok(true) => match check(buf, token, rank, world) {
                    Ok(p) if p == peer => acks[peer] = None,
                    Ok(p) => {
                        return Err(Error::Remote(format!(
                            "rank {rank}: ack from rank {p} on the link to {peer}"
                        )));
                    }
                    Err(why) => {
                        return Err(Error::Remote(format!(
                            "rank {rank}: bad ack from peer rank {peer}: {why}"
                        )));
                    }
                },
                Err(e) => return Err(peers.io_err(peer, "waiting for the ack of", e)),
            }
        }
        // Handshakes of lower ranks.
        let now = Instant::now();
        for (mut sh, ready) in std::mem::take(&mut pending)
            .into_iter()
            .zip(shake_ready.iter().copied())
        {
            let got = if ready {
                match read_available(&mut sh.stream, &mut sh.buf, &mut sh.filled) {
                    Ok(false) => None,
                    Ok(true) => Some(check(&sh.buf, token, rank, world).and_then(|p| {
                        match p < rank && conns[p].is_none() {
                            true => Ok(p),
                            false => {
                                Err(format!("unexpected or duplicate connection from rank {p}"))
                            }
                        }
                    })),
                    Err(e) => Some(Err(format!("reading handshake: {e}"))),
                }
            } else {
                None
            };
            match got {
                Some(Ok(peer)) => {
                    let mut s = sh.stream;
                    prepare(&s).map_err(|e| Error::system("bootstrap: peer socket", e))?;
                    write_all_by(&mut s, &[&handshake(token, rank, peer, world)], deadline)
                        .map_err(|e| peers.io_err(peer, "acknowledging", e))?;
                    conns[peer] = Some(s);
                }
                Some(Err(why)) => {
                    tracing::warn!(rank, from = %sh.from, "bootstrap refused a peer connection: {why}")
                }
                None if now >= sh.until => tracing::warn!(
                    rank, from = %sh.from,
                    "bootstrap refused a peer connection: no handshake within {SHAKE_WAIT:?}"
                ),
                None => pending.push_back(sh),
            }
        }
        if *listen_ready {
            accept(&listener, rank, &mut pending)?;
        }
    }
    for s in conns.iter().flatten() {
        prepare(s).map_err(|e| Error::system("bootstrap: peer socket", e))?;
    }
    Ok(conns)
}

/// Accepts what is pending on the listener into `pending`, pushing out the oldest beyond
/// [`MAX_PENDING_SHAKES`].
fn accept(listener: &TcpListener, rank: usize, pending: &mut VecDeque<Shake>) -> Result<()> {
    for _ in 0..MAX_PENDING_SHAKES {
        match listener.accept() {
            Ok((s, from)) => {
                if let Err(e) = s.set_nonblocking(true).and_then(|()| s.set_nodelay(true)) {
                    tracing::warn!(rank, %from, "bootstrap: peer socket setup: {e}");
                    continue;
                }
                if pending.len() >= MAX_PENDING_SHAKES
                    && let Some(old) = pending.pop_front()
                {
                    tracing::warn!(
                        rank, from = %old.from,
                        "bootstrap refused a peer connection: {MAX_PENDING_SHAKES} newer \
                         connections were waiting"
                    );
                }
                pending.push_back(Shake {
                    stream: s,
                    from,
                    buf: [0; SHAKE_BYTES],
                    filled: 0,
                    until: Instant::now() + SHAKE_WAIT,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(rank, "bootstrap: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                return Ok(());
            }
        }
    }
    Ok(())
}
