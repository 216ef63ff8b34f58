//! The frames of the TCP provider: a fixed 32-byte header, then the payload its kind names.
//!
//! ```text
//! offset  0: kind  u32    what the frame does (below)
//!         4: slot  u32    FIFO slot (clear-to-send, immediate, eager, credit, write key)
//!         8: a     u32    kind-specific (immediate value, eager index, credit, read id)
//!        12: b     u32    kind-specific (eager tag)
//!        16: addr  u64    receiver's address of a write or read
//!        24: len   u64    payload bytes (write, eager, read response, failure text) or the
//!                         immediate's byte count
//! ```
//!
//! Every number a peer sends is checked before it is used: a kind that does not exist, a slot
//! beyond the FIFO, an eager payload beyond the slot, a write or read outside the memory the
//! matching clear-to-send named, a read response nobody asked for, a failure text beyond
//! [`MAX_TEXT`] — each ends the connection with an error naming the peer; no payload is
//! received into memory before its bounds are known.

use ampccl_runtime::{Error, Result};

use crate::device::CtsEntry;

/// Bytes of a frame header.
pub const HEADER: usize = 32;
/// Bytes of a clear-to-send entry on the wire.
pub const CTS_BYTES: usize = 32;
/// Longest failure text a peer may send.
pub const MAX_TEXT: u64 = 4096;

/// What a frame does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// A clear-to-send entry for the receiver's FIFO slot `slot` (payload: the entry).
    Cts = 1,
    /// A one-sided write of `len` bytes at `addr` into the memory of clear-to-send `slot`.
    Write = 2,
    /// The immediate `a` with byte count `len` for completion slot `slot`.
    Imm = 3,
    /// An eager message: index `a`, tag `b`, `len` payload bytes for eager slot `slot`.
    Eager = 4,
    /// Credit word `slot` becomes `a`.
    Credit = 5,
    /// One more ack.
    Ack = 6,
    /// Read request `a`: `len` bytes at `addr` of the memory offered in clear-to-send `slot`.
    ReadReq = 7,
    /// The answer to read request `a`: `len` payload bytes.
    ReadResp = 8,
    /// The sender failed; payload: why (text of `len` bytes).
    Fail = 9,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Cts,
            2 => Kind::Write,
            3 => Kind::Imm,
            4 => Kind::Eager,
            5 => Kind::Credit,
            6 => Kind::Ack,
            7 => Kind::ReadReq,
            8 => Kind::ReadResp,
            9 => Kind::Fail,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub slot: u32,
    pub a: u32,
    pub b: u32,
    pub addr: u64,
    pub len: u64,
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            slot: 0,
            a: 0,
            b: 0,
            addr: 0,
            len: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER] {
        let mut out = [0u8; HEADER];
        out[0..4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        out[4..8].copy_from_slice(&self.slot.to_le_bytes());
        out[8..12].copy_from_slice(&self.a.to_le_bytes());
        out[12..16].copy_from_slice(&self.b.to_le_bytes());
        out[16..24].copy_from_slice(&self.addr.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Payload bytes that come whole with the header (a clear-to-send entry, an eager message,
    /// a failure text; bounded by [`Header::decode`]); 0 for the kinds whose payload goes
    /// straight into place or that have none.
    pub fn inline_len(&self) -> usize {
        match self.kind {
            Kind::Cts | Kind::Eager | Kind::Fail => self.len as usize,
            _ => 0,
        }
    }

    /// Decodes and checks what needs no state: the kind, the slot against `depth`, and the
    /// payload lengths of the kinds whose length is bounded by the format.
    pub fn decode(b: &[u8; HEADER], depth: usize, eager_max: usize) -> Result<Header> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let kind = Kind::from_u32(u32_at(0))
            .ok_or_else(|| bad(format!("unknown frame kind {}", u32_at(0))))?;
        let h = Header {
            kind,
            slot: u32_at(4),
            a: u32_at(8),
            b: u32_at(12),
            addr: u64_at(16),
            len: u64_at(24),
        };
        let slotted = matches!(
            kind,
            Kind::Cts | Kind::Write | Kind::Imm | Kind::Eager | Kind::Credit | Kind::ReadReq
        );
        if slotted && h.slot as usize >= depth {
            return Err(bad(format!(
                "{kind:?} frame for slot {} of {depth}",
                h.slot
            )));
        }
        let max = match kind {
            Kind::Cts => CTS_BYTES as u64,
            Kind::Eager => eager_max as u64,
            Kind::Fail => MAX_TEXT,
            _ => u64::MAX,
        };
        if h.len > max || (kind == Kind::Cts && h.len != CTS_BYTES as u64) {
            return Err(bad(format!("{kind:?} frame of {} bytes", h.len)));
        }
        Ok(h)
    }
}

/// A clear-to-send entry as its frame's payload.
pub fn encode_cts(e: &CtsEntry) -> [u8; CTS_BYTES] {
    let mut out = [0u8; CTS_BYTES];
    out[0..8].copy_from_slice(&e.addr.to_le_bytes());
    out[8..16].copy_from_slice(&e.size.to_le_bytes());
    out[16..20].copy_from_slice(&e.key.to_le_bytes());
    out[20..24].copy_from_slice(&e.nreqs.to_le_bytes());
    out[24..28].copy_from_slice(&e.tag.to_le_bytes());
    out[28..32].copy_from_slice(&e.idx.to_le_bytes());
    out
}

/// The entry of a clear-to-send frame's payload.
pub fn decode_cts(b: &[u8; CTS_BYTES]) -> CtsEntry {
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    CtsEntry {
        addr: u64_at(0),
        size: u64_at(8),
        key: u32_at(16),
        nreqs: u32_at(20),
        tag: u32_at(24),
        idx: u32_at(28),
    }
}

/// A protocol violation by the peer.
pub fn bad(msg: String) -> Error {
    Error::Remote(format!("sent a bad frame: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_entries_round_trip() {
        let h = Header {
            kind: Kind::Eager,
            slot: 3,
            a: 7,
            b: 9,
            addr: 0xdead_beef,
            len: 100,
        };
        assert_eq!(Header::decode(&h.encode(), 4, 1024), Ok(h));
        let e = CtsEntry {
            addr: 1,
            size: 2,
            key: 3,
            nreqs: 4,
            tag: 5,
            idx: 6,
        };
        assert_eq!(decode_cts(&encode_cts(&e)), e);
    }

    #[test]
    fn bad_headers_are_refused() {
        let enc = |kind: Kind, slot: u32, len: u64| {
            let mut h = Header::new(kind);
            h.slot = slot;
            h.len = len;
            h.encode()
        };
        let mut unknown = enc(Kind::Ack, 0, 0);
        unknown[0] = 42;
        for (what, b) in [
            ("kind", unknown),
            ("slot", enc(Kind::Imm, 4, 0)),
            ("eager length", enc(Kind::Eager, 0, 1025)),
            ("cts length", enc(Kind::Cts, 0, 31)),
            ("text length", enc(Kind::Fail, 0, MAX_TEXT + 1)),
        ] {
            let e = Header::decode(&b, 4, 1024).unwrap_err();
            assert!(
                matches!(e, Error::Remote(ref m) if m.contains("bad frame")),
                "{what}"
            );
        }
        assert!(Header::decode(&enc(Kind::Write, 3, u64::MAX), 4, 1024).is_ok());
    }
}
