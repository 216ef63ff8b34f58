//! Full mesh of bootstrap connections, built once the root has sent the address table.
//!
//! Rank `r` connects to every higher rank and accepts from every lower one, in three phases so
//! nobody waits in a cycle: (1) connect to all higher ranks and send each a handshake,
//! (2) accept until every lower rank has connected, answering each valid handshake with an ack,
//! (3) read the acks of the higher ranks.
//!
//! Handshake and ack (48 bytes, little-endian): magic `b"AMPCMESH"`, token (16), sender rank
//! (u64), receiver rank (u64), world (u64). An accepted connection with a malformed handshake, a
//! wrong token, the wrong receiver or world, or a rank that is not an expected lower rank is
//! closed and logged with `tracing::warn!`; accepting goes on.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::unique_id::Token;
use super::wire::{Fields, IoFail, prepare, read_exact_by, remaining, write_all_by};

const MESH_MAGIC: u64 = u64::from_le_bytes(*b"AMPCMESH");
const SHAKE_BYTES: usize = 48;
/// Longest wait for the handshake of one accepted connection.
const SHAKE_WAIT: Duration = Duration::from_secs(5);

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

fn io_err(rank: usize, peer: usize, what: &str, e: IoFail) -> Error {
    match e {
        IoFail::Timeout => {
            Error::Timeout(format!("rank {rank}: {what} peer rank {peer} timed out"))
        }
        e => Error::Remote(format!("rank {rank}: {what} peer rank {peer}: {e}")),
    }
}

/// Builds the mesh; entry `p` is the connection to rank `p` (`None` for `rank` itself).
pub(crate) fn build(
    listener: TcpListener,
    token: Token,
    rank: usize,
    world: usize,
    addrs: &[SocketAddr],
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let mut conns: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    // Phase 1: connect to all higher ranks (their listeners are bound before the table exists).
    for (peer, addr) in addrs.iter().enumerate().skip(rank + 1) {
        let left = remaining(deadline).ok_or_else(|| {
            Error::Timeout(format!(
                "rank {rank}: connecting to peer rank {peer} timed out"
            ))
        })?;
        let mut s = TcpStream::connect_timeout(addr, left).map_err(|e| {
            io_err(
                rank,
                peer,
                &format!("connecting to {addr},"),
                IoFail::Other(e),
            )
        })?;
        prepare(&s).map_err(|e| Error::system("bootstrap: peer socket", e))?;
        write_all_by(&mut s, &[&handshake(token, rank, peer, world)], deadline)
            .map_err(|e| io_err(rank, peer, "sending the handshake to", e))?;
        conns[peer] = Some(s);
    }
    // Phase 2: accept every lower rank, refusing strays.
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::system("bootstrap: listener", e))?;
    let mut missing = rank;
    while missing > 0 {
        let (mut s, from) = match listener.accept() {
            Ok(x) => x,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted =>
            {
                if remaining(deadline).is_none() {
                    let absent: Vec<usize> = (0..rank).filter(|&p| conns[p].is_none()).collect();
                    return Err(Error::Timeout(format!(
                        "rank {rank}: peer rank(s) {absent:?} did not connect in time"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(Error::system("bootstrap: accept", e)),
        };
        let mut buf = [0u8; SHAKE_BYTES];
        let got = prepare(&s)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                read_exact_by(&mut s, &mut buf, deadline.min(Instant::now() + SHAKE_WAIT))
                    .map_err(|e| format!("reading handshake: {e}"))
            })
            .and_then(|()| check(&buf, token, rank, world))
            .and_then(|p| match p < rank && conns[p].is_none() {
                true => Ok(p),
                false => Err(format!("unexpected or duplicate connection from rank {p}")),
            });
        match got {
            Ok(peer) => {
                write_all_by(&mut s, &[&handshake(token, rank, peer, world)], deadline)
                    .map_err(|e| io_err(rank, peer, "acknowledging", e))?;
                conns[peer] = Some(s);
                missing -= 1;
            }
            Err(why) => tracing::warn!(rank, %from, "bootstrap refused a peer connection: {why}"),
        }
    }
    // Phase 3: the acks of the higher ranks.
    for (peer, conn) in conns.iter_mut().enumerate().skip(rank + 1) {
        let s = conn.as_mut().expect("connected in phase 1");
        let mut buf = [0u8; SHAKE_BYTES];
        read_exact_by(s, &mut buf, deadline)
            .map_err(|e| io_err(rank, peer, "waiting for the ack of", e))?;
        match check(&buf, token, rank, world) {
            Ok(p) if p == peer => {}
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
        }
    }
    Ok(conns)
}
