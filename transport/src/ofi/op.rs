//! One operation posted to the `ofi` endpoint ([`Op`]): what it is ([`What`]: a receive, a
//! message, a data write or a read), which holds what it needs to be posted again after the
//! provider said it was busy, and the libfabric context whose address identifies it in the
//! completion queue and keys it in the state's op table ([`AddrHasher`]).

use std::ffi::c_void;
use std::hash::Hasher;

use super::fabric::{self, Endpoint, Mr};
use super::sys::{Context2, FiAddr};

/// What a posted operation is: what it needs to be posted (again, after the provider said
/// it was busy) and, at its completion, what to do.
pub(super) enum What {
    /// A receive from any peer into `buf` (registered where the provider asks).
    Recv { buf: Box<[u8]>, mr: Option<Mr> },
    /// The message in `buf` to `peer`, with remote completion `data` if any (a compact eager
    /// message, [`super::wire::Compact`]); the buffer lives until sent.
    Send {
        peer: usize,
        buf: Vec<u8>,
        mr: Option<Mr>,
        data: Option<u64>,
    },
    /// A data write of `[src, src+len)` on `rail` to `peer`'s `(key, addr)` with completion
    /// `data`.
    Write {
        peer: usize,
        rail: usize,
        src: *const u8,
        len: usize,
        rma: (u64, u64, u64),
        mr: Option<Mr>,
    },
    /// A read of `peer`'s `(key, addr)` on `rail` into `[dst, dst+len)`.
    Read {
        peer: usize,
        rail: usize,
        dst: *mut u8,
        len: usize,
        rma: (u64, u64),
        mr: Option<Mr>,
    },
}

impl What {
    /// The rail it goes on (messages: rail 0).
    pub(super) fn rail(&self) -> usize {
        match *self {
            What::Write { rail, .. } | What::Read { rail, .. } => rail,
            What::Send { .. } | What::Recv { .. } => 0,
        }
    }

    /// The peer the operation goes to (none for a receive).
    pub(super) fn peer(&self) -> Option<usize> {
        match *self {
            What::Recv { .. } => None,
            What::Send { peer, .. } | What::Write { peer, .. } | What::Read { peer, .. } => {
                Some(peer)
            }
        }
    }

    /// Posts the operation to `to` with context `ctx` (libfabric's return code).
    ///
    /// # Safety
    /// The buffers must stay valid and `ctx` live and unmoved until the completion: the op
    /// table owns the buffers and the context; the callers of
    /// [`State::write`](super::state::State::write) and
    /// [`State::read`](super::state::State::read) keep theirs valid.
    pub(super) unsafe fn post(&self, ep: &Endpoint, to: FiAddr, ctx: *mut c_void) -> isize {
        // SAFETY: as the function's contract says.
        unsafe {
            match self {
                What::Recv { buf, mr } => ep.recv(
                    buf.as_ptr().cast_mut(),
                    buf.len(),
                    fabric::desc(mr),
                    to,
                    ctx,
                ),
                What::Send { buf, mr, data, .. } => match data {
                    None => ep.send(buf.as_ptr(), buf.len(), fabric::desc(mr), to, ctx),
                    Some(d) => ep.senddata(buf.as_ptr(), buf.len(), fabric::desc(mr), *d, to, ctx),
                },
                What::Write {
                    src,
                    len,
                    rail,
                    rma: (addr, key, data),
                    mr,
                    ..
                } => ep.writedata(
                    *rail,
                    *src,
                    *len,
                    fabric::desc(mr),
                    *data,
                    to,
                    *addr,
                    *key,
                    ctx,
                ),
                What::Read {
                    dst,
                    len,
                    rail,
                    rma: (addr, key),
                    mr,
                    ..
                } => ep.read(*rail, *dst, *len, fabric::desc(mr), to, *addr, *key, ctx),
            }
        }
    }
}

/// A posted operation: its context (whose address identifies it) and what it is.
pub(super) struct Op {
    pub ctx: Box<Context2>,
    pub what: What,
}

/// Hashes the keys of the op table: context addresses, distinct by construction, so one
/// multiplication spreads them (the default SipHash costs more than the table's lookup).
#[derive(Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
