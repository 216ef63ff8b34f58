//! A client of PyTorch's `TCPStore`, the key-value store that torchrun's agent hosts at
//! `MASTER_ADDR:MASTER_PORT` for its workers (`TORCHELASTIC_USE_AGENT_STORE=True`). Under
//! torchrun that port is taken by the store, so ampccl rendezvouses *through* it: rank 0 makes a
//! [`UniqueId`](super::UniqueId) (its root on an ephemeral port) and stores its hex under a key
//! of this job; the other ranks wait for the key and read it.
//!
//! # Wire protocol (the facts this client relies on)
//!
//! One TCP connection; requests are a query byte followed by fields, integers in the host's
//! byte order (little-endian on every platform ampccl builds for), strings and byte vectors as a
//! `u64` length then the bytes:
//!
//! | query | code | request fields | reply |
//! |---|---|---|---|
//! | `VALIDATE` | 0 | `u32` magic `0x3C85F7CE` | none (a wrong magic closes the connection) |
//! | `SET` | 1 | key, value | none |
//! | `GET` | 3 | key | value (a missing key: empty, or the connection closes) |
//! | `ADD` | 4 | key, `i64` | `i64`, the new value (stored as decimal text) |
//! | `CHECK` | 5 | `u64` n, n keys | `u8`: 0 ready, 1 not ready |
//! | `WAIT` | 6 | `u64` n, n keys | `u8` 0 (`STOP_WAITING`) once every key exists |
//! | `PING` | 13 | `u32` nonce | the nonce |
//!
//! PyTorch's own client puts `/` in front of every key; ampccl's keys (`ampccl/...`) never
//! start with one, so they cannot meet torch's. The first request of a connection must be
//! `VALIDATE`. A `WAIT` blocks the connection until
//! its keys exist; this client bounds it with the caller's deadline and then drops the
//! connection (the store forgets the waits of a closed connection). Stores refuse keys over
//! 8 KiB and values over 8 MiB; this client checks keys before sending and refuses any reply
//! value longer than [`MAX_VALUE`] before allocating for it.

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::wire::{IoFail, prepare, read_exact_by, write_all_by};

/// The magic of the `VALIDATE` query.
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
/// Query codes (`QueryType` of the store).
const Q_VALIDATE: u8 = 0;
const Q_SET: u8 = 1;
const Q_GET: u8 = 3;
const Q_ADD: u8 = 4;
const Q_CHECK: u8 = 5;
const Q_WAIT: u8 = 6;
const Q_PING: u8 = 13;
/// `WaitResponseType::STOP_WAITING` / `CheckResponseType::READY`.
const READY: u8 = 0;
const NOT_READY: u8 = 1;
/// Longest key the store accepts.
pub const MAX_KEY: usize = 8 * 1024;
/// Longest value this client accepts in a reply (ampccl stores 256-byte ids).
pub const MAX_VALUE: u64 = 64 * 1024;

/// A validated connection to a `TCPStore`.
#[derive(Debug)]
pub struct StoreClient {
    stream: TcpStream,
    /// `host:port` as given, for messages.
    name: String,
}

impl StoreClient {
    /// Connects to the store at `host:port` (every address `host` resolves to, retried until
    /// `deadline` while the store is not up yet) and validates the connection.
    pub fn connect(host: &str, port: u16, deadline: Instant) -> Result<StoreClient> {
        let name = format!("{host}:{port}");
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| {
                Error::InvalidArgument(format!("TCPStore address {name} does not resolve: {e}"))
            })?
            .collect();
        let start = Instant::now();
        let mut backoff = Duration::from_millis(10);
        let stream = 'found: loop {
            let mut last = None;
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                    Ok(s) => break 'found s,
                    Err(e) => last = Some(format!("{a}: {e}")),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "TCPStore at {name} unreachable after {:.1?} ({}); is torchrun's agent up?",
                    start.elapsed(),
                    last.unwrap_or_else(|| "no address".into())
                )));
            }
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(Duration::from_millis(500));
        };
        prepare(&stream).map_err(|e| Error::system(format!("TCPStore {name}: socket"), e))?;
        let mut client = StoreClient { stream, name };
        let mut req = vec![Q_VALIDATE];
        req.extend_from_slice(&VALIDATE_MAGIC.to_le_bytes());
        client.send(&req, deadline, "validate")?;
        Ok(client)
    }

    /// This end's address: the interface that routes to the store.
    pub fn local_ip(&self) -> Result<IpAddr> {
        self.stream
            .local_addr()
            .map(|a| a.ip())
            .map_err(|e| Error::system(format!("TCPStore {}: local_addr", self.name), e))
    }

    fn fail(&self, what: &str, e: IoFail) -> Error {
        match e {
            IoFail::Timeout => Error::Timeout(format!("TCPStore {}: {what} timed out", self.name)),
            e => Error::Remote(format!(
                "TCPStore {}: {what}: {e} (is {} a PyTorch TCPStore?)",
                self.name, self.name
            )),
        }
    }

    fn send(&mut self, req: &[u8], deadline: Instant, what: &str) -> Result<()> {
        write_all_by(&mut self.stream, &[req], deadline).map_err(|e| self.fail(what, e))
    }

    fn read<const N: usize>(&mut self, deadline: Instant, what: &str) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        read_exact_by(&mut self.stream, &mut buf, deadline).map_err(|e| self.fail(what, e))?;
        Ok(buf)
    }

    /// Stores `value` under `key` (waking the ranks that wait for it).
    pub fn set(&mut self, key: &str, value: &[u8], deadline: Instant) -> Result<()> {
        let mut req = vec![Q_SET];
        push_key(&mut req, key)?;
        push_bytes(&mut req, value);
        self.send(&req, deadline, &format!("set {key:?}"))
    }

    /// The value of `key`. For a missing key some stores answer an empty value and others
    /// (PyTorch 2.15's default) close the connection: [`StoreClient::wait`] first.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let what = format!("get {key:?}");
        let mut req = vec![Q_GET];
        push_key(&mut req, key)?;
        self.send(&req, deadline, &what)?;
        let len = u64::from_le_bytes(self.read::<8>(deadline, &what)?);
        if len > MAX_VALUE {
            return Err(Error::Remote(format!(
                "TCPStore {}: {what}: the store answered a value of {len} bytes, more than the \
                 {MAX_VALUE} this client accepts",
                self.name
            )));
        }
        let mut value = vec![0u8; len as usize];
        read_exact_by(&mut self.stream, &mut value, deadline).map_err(|e| self.fail(&what, e))?;
        Ok(value)
    }

    /// Adds `delta` to the counter `key` (0 if missing) and returns the new value.
    pub fn add(&mut self, key: &str, delta: i64, deadline: Instant) -> Result<i64> {
        let what = format!("add {key:?}");
        let mut req = vec![Q_ADD];
        push_key(&mut req, key)?;
        req.extend_from_slice(&delta.to_le_bytes());
        self.send(&req, deadline, &what)?;
        Ok(i64::from_le_bytes(self.read::<8>(deadline, &what)?))
    }

    /// Whether every key of `keys` exists, without waiting.
    pub fn check(&mut self, keys: &[&str], deadline: Instant) -> Result<bool> {
        let what = format!("check {keys:?}");
        self.send(&keys_request(Q_CHECK, keys)?, deadline, &what)?;
        match self.read::<1>(deadline, &what)?[0] {
            READY => Ok(true),
            NOT_READY => Ok(false),
            b => Err(self.bad_reply(&what, b)),
        }
    }

    /// Blocks until every key of `keys` exists or `deadline` passes ([`Error::Timeout`]). The
    /// connection is unusable after a timeout (the store still owes the reply): drop it.
    pub fn wait(&mut self, keys: &[&str], deadline: Instant) -> Result<()> {
        let what = format!("wait for {keys:?}");
        self.send(&keys_request(Q_WAIT, keys)?, deadline, &what)?;
        match self.read::<1>(deadline, &what)?[0] {
            READY => Ok(()),
            b => Err(self.bad_reply(&what, b)),
        }
    }

    /// Round trip of a nonce (stores of PyTorch 2.4 and later).
    pub fn ping(&mut self, deadline: Instant) -> Result<()> {
        let nonce = std::process::id();
        let mut req = vec![Q_PING];
        req.extend_from_slice(&nonce.to_le_bytes());
        self.send(&req, deadline, "ping")?;
        let back = u32::from_le_bytes(self.read::<4>(deadline, "ping")?);
        if back != nonce {
            return Err(Error::Remote(format!(
                "TCPStore {}: ping answered {back:#x}, expected {nonce:#x}",
                self.name
            )));
        }
        Ok(())
    }

    fn bad_reply(&self, what: &str, b: u8) -> Error {
        Error::Remote(format!(
            "TCPStore {}: {what}: unexpected reply byte {b} (is {} a PyTorch TCPStore?)",
            self.name, self.name
        ))
    }
}

fn push_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn push_key(out: &mut Vec<u8>, key: &str) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!(
            "TCPStore key of {} bytes: the store accepts at most {MAX_KEY}",
            key.len()
        )));
    }
    push_bytes(out, key.as_bytes());
    Ok(())
}

fn keys_request(query: u8, keys: &[&str]) -> Result<Vec<u8>> {
    let mut req = vec![query];
    req.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        push_key(&mut req, k)?;
    }
    Ok(req)
}

#[cfg(test)]
#[path = "tcpstore_tests.rs"]
pub(crate) mod tests;
