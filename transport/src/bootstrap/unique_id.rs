//! [`UniqueId`]: the 128-byte rendezvous handle (the `ncclUniqueId` of ampccl).
//!
//! One process calls [`UniqueId::generate`], which binds the rendezvous root and starts its
//! thread, then hands the id to every rank out of band (MPI broadcast, a file, or the
//! `AMPCCL_UNIQUE_ID` environment variable as 256 hex characters).
//!
//! # Layout (all multi-byte integers little-endian unless stated)
//!
//! | bytes     | content                                                        |
//! |-----------|----------------------------------------------------------------|
//! | `0..4`    | magic `b"AMPC"`                                                |
//! | `4..6`    | layout version, currently `1`                                  |
//! | `6..8`    | zero                                                           |
//! | `8..32`   | root socket address, encoded as in [`encode_addr`] (24 bytes)  |
//! | `32..48`  | 128-bit random token (OS RNG), proves membership               |
//! | `48..128` | zero padding                                                   |
//!
//! [`UniqueId::from_bytes`]/[`UniqueId::from_hex`] reject a wrong magic, an unknown version, a
//! bad address encoding or non-zero padding with [`Error::InvalidArgument`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener};
use std::time::Duration;

use ampccl_runtime::{Error, Result};
use rand::TryRngCore;

use super::root;

/// Size of a [`UniqueId`] in bytes (same as `NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
/// Magic of the [`UniqueId`] layout.
const MAGIC: [u8; 4] = *b"AMPC";
/// Layout version of the [`UniqueId`].
const VERSION: u16 = 1;
/// Encoded size of a socket address (see [`encode_addr`]).
pub(crate) const ADDR_BYTES: usize = 24;

/// The 128-bit secret shared by all ranks of one rendezvous.
pub type Token = u128;

/// Opaque 128-byte rendezvous handle: root address + random token. `#[repr(C)]` so it can cross
/// the C ABI as `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    /// Raw bytes (layout in the module documentation).
    pub internal: [u8; UNIQUE_ID_BYTES],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret of sorts: print the address only.
        match self.root_addr() {
            Ok(a) => write!(f, "UniqueId {{ root: {a} }}"),
            Err(_) => write!(f, "UniqueId {{ <invalid> }}"),
        }
    }
}

impl UniqueId {
    /// Builds an id from a root address and a token.
    pub fn new(root: SocketAddr, token: Token) -> UniqueId {
        let mut internal = [0u8; UNIQUE_ID_BYTES];
        internal[0..4].copy_from_slice(&MAGIC);
        internal[4..6].copy_from_slice(&VERSION.to_le_bytes());
        internal[8..8 + ADDR_BYTES].copy_from_slice(&encode_addr(root));
        internal[32..48].copy_from_slice(&token.to_le_bytes());
        UniqueId { internal }
    }

    /// Like `ncclGetUniqueId`: binds the rendezvous root and starts its thread, which serves one
    /// rendezvous and exits (also when nobody shows up within `AMPCCL_TIMEOUT_S`, default 300 s).
    ///
    /// The root binds `AMPCCL_BOOTSTRAP_ADDR` if set (an IP address, or `ip:port`), else
    /// `127.0.0.1`, on an ephemeral port unless a port is given. Set `AMPCCL_BOOTSTRAP_ADDR` to an
    /// address reachable by the other hosts for multi-host runs.
    pub fn generate() -> Result<UniqueId> {
        let lookup = |k: &str| std::env::var(k).ok();
        let mut bind = super::env::bootstrap_addr_from(&lookup)?;
        // Without an explicit address, `AMPCCL_SOCKET_IFNAME` chooses the root's interface,
        // else the default interface (never loopback where another one is up).
        if lookup("AMPCCL_BOOTSTRAP_ADDR").is_none() {
            let ifaces = super::ifname::interfaces()?;
            bind.set_ip(match super::ifname::from_env()? {
                Some(f) => f.pick(&ifaces)?,
                None => super::ifname::default_address(&ifaces),
            });
        }
        let timeout = super::env::timeout_from(&lookup)?;
        Ok(UniqueId::generate_with(bind, timeout)?.0)
    }

    /// [`UniqueId::generate`] with an explicit bind address and root lifetime; also returns the
    /// root thread's handle, whose result reports what the root did.
    pub fn generate_with(
        bind: SocketAddr,
        timeout: Duration,
    ) -> Result<(UniqueId, std::thread::JoinHandle<root::RootReport>)> {
        let token = random_token()?;
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::system(format!("bootstrap root: bind {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::system("bootstrap root: local_addr", e))?;
        let handle = root::spawn_root(listener, token, timeout)?;
        Ok((UniqueId::new(addr, token), handle))
    }

    /// Raw bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.internal
    }

    /// Parses and validates raw bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let internal: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "unique id must be {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        let id = UniqueId { internal };
        id.validate()?;
        Ok(id)
    }

    /// Checks magic, version, address encoding and padding.
    pub fn validate(&self) -> Result<()> {
        let b = &self.internal;
        if b[0..4] != MAGIC {
            return Err(Error::InvalidArgument("unique id: bad magic".into()));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(Error::InvalidArgument(format!(
                "unique id: unsupported version {version} (expected {VERSION})"
            )));
        }
        if b[6..8].iter().chain(&b[48..]).any(|&x| x != 0) {
            return Err(Error::InvalidArgument("unique id: non-zero padding".into()));
        }
        self.root_addr().map(|_| ())
    }

    /// The root's socket address.
    pub fn root_addr(&self) -> Result<SocketAddr> {
        decode_addr(&self.internal[8..8 + ADDR_BYTES])
            .ok_or_else(|| Error::InvalidArgument("unique id: bad root address encoding".into()))
    }

    /// The rendezvous token.
    pub fn token(&self) -> Token {
        u128::from_le_bytes(self.internal[32..48].try_into().expect("16 bytes"))
    }

    /// 256 lowercase hex characters (for `AMPCCL_UNIQUE_ID`).
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut s = String::with_capacity(2 * UNIQUE_ID_BYTES);
        for b in &self.internal {
            write!(s, "{b:02x}").expect("write to String");
        }
        s
    }

    /// Parses [`UniqueId::to_hex`] output (case-insensitive, surrounding whitespace ignored).
    pub fn from_hex(hex: &str) -> Result<UniqueId> {
        let hex = hex.trim().as_bytes();
        if hex.len() != 2 * UNIQUE_ID_BYTES {
            return Err(Error::InvalidArgument(format!(
                "unique id hex must be {} characters, got {}",
                2 * UNIQUE_ID_BYTES,
                hex.len()
            )));
        }
        let digit = |c: u8| -> Result<u8> {
            (c as char).to_digit(16).map(|d| d as u8).ok_or_else(|| {
                Error::InvalidArgument(format!("unique id hex: bad character {:?}", c as char))
            })
        };
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            bytes[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        UniqueId::from_bytes(&bytes)
    }
}

/// A fresh 128-bit token from the OS random number generator.
pub fn random_token() -> Result<Token> {
    let mut buf = [0u8; 16];
    rand::rngs::OsRng
        .try_fill_bytes(&mut buf)
        .map_err(|e| Error::system("bootstrap: OS random number generator", e))?;
    Ok(u128::from_le_bytes(buf))
}

/// Encodes a socket address in 24 bytes: family (`4` or `6`), zero, port (big-endian), 16 address
/// bytes (IPv4 in the first 4, rest zero), IPv6 scope id (little-endian u32, zero for IPv4).
pub(crate) fn encode_addr(addr: SocketAddr) -> [u8; ADDR_BYTES] {
    let mut out = [0u8; ADDR_BYTES];
    out[2..4].copy_from_slice(&addr.port().to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            out[0] = 4;
            out[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out[0] = 6;
            out[4..20].copy_from_slice(&a.ip().octets());
            out[20..24].copy_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out
}

/// Inverse of [`encode_addr`]; `None` on a malformed encoding.
pub(crate) fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    if b.len() != ADDR_BYTES || b[1] != 0 {
        return None;
    }
    let port = u16::from_be_bytes([b[2], b[3]]);
    match b[0] {
        4 if b[8..].iter().all(|&x| x == 0) => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        6 => {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[4..20]).ok()?);
            let scope = u32::from_le_bytes(b[20..24].try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_v4_and_v6() {
        for addr in ["127.0.0.1:4242", "[fe80::1%3]:9", "[::1]:65535"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let id = UniqueId::new(addr, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
            let hex = id.to_hex();
            assert_eq!(hex.len(), 256);
            let back = UniqueId::from_hex(&hex).unwrap();
            assert_eq!(back, id);
            assert_eq!(back.root_addr().unwrap(), addr);
            assert_eq!(back.token(), id.token());
            assert_eq!(UniqueId::from_hex(&hex.to_uppercase()).unwrap(), id);
        }
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    }

    #[test]
    fn bad_hex_rejected() {
        let id = UniqueId::new("127.0.0.1:1".parse().unwrap(), 7);
        let hex = id.to_hex();
        let bad = |s: &str| matches!(UniqueId::from_hex(s), Err(Error::InvalidArgument(_)));
        assert!(bad(&hex[..254]), "short");
        assert!(bad(&format!("{hex}00")), "long");
        assert!(bad(&format!("zz{}", &hex[2..])), "non-hex");
        assert!(bad(&format!("00{}", &hex[2..])), "magic");
        let mut v = id;
        v.internal[4] = 9;
        assert!(bad(&v.to_hex()), "version");
        let mut p = id;
        p.internal[100] = 1;
        assert!(bad(&p.to_hex()), "padding");
        let mut f = id;
        f.internal[8] = 5;
        assert!(bad(&f.to_hex()), "address family");
        assert!(matches!(
            UniqueId::from_bytes(&[0; 12]),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn random_tokens_differ() {
        assert_ne!(random_token().unwrap(), random_token().unwrap());
    }
}
