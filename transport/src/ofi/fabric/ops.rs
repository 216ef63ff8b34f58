//! The data path of an [`Endpoint`]: posting receives, sends, writes and reads on its rails,
//! reading its completion queues, and asking whether a thread may block on them. Each call
//! goes through the function table of the endpoint or queue, as libfabric's inline functions
//! do ([`sys`]).

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr::null_mut;

use super::Endpoint;
use crate::ofi::sys::{self, Fid};

impl Endpoint {
    /// Posts a receive of up to `len` bytes into `buf` on rail 0, from `src` only (or any
    /// sender: `FI_ADDR_UNSPEC`). In this and the calls below, `desc` is the descriptor of the
    /// local buffer's registration (NULL where the provider needs none, [`super::Caps::local_mr`]).
    ///
    /// # Safety
    /// `buf` must stay valid for `len` writes and `ctx` live and unmoved until the completion.
    pub unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        src: sys::FiAddr,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.eps[0];
        // SAFETY: a live endpoint's `msg` table; the rest by the caller's contract.
        unsafe { ((*(*ep).msg).recv)(ep, buf.cast(), len, desc, src, ctx) }
    }

    /// Sends `len` bytes at `buf` on rail 0 to `dest` (a peer's rail 0).
    ///
    /// # Safety
    /// `buf` must stay valid for `len` reads and `ctx` live and unmoved until the completion.
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: sys::FiAddr,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.eps[0];
        // SAFETY: a live endpoint's `msg` table; the rest by the caller's contract.
        unsafe { ((*(*ep).msg).send)(ep, buf.cast(), len, desc, dest, ctx) }
    }

    /// Sends `len` bytes at `buf` on rail 0 to `dest` with remote completion `data`.
    ///
    /// # Safety
    /// As for [`Endpoint::send`].
    pub unsafe fn senddata(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: sys::FiAddr,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.eps[0];
        // SAFETY: a live endpoint's `msg` table; the rest by the caller's contract.
        unsafe { ((*(*ep).msg).senddata)(ep, buf.cast(), len, desc, data, dest, ctx) }
    }

    /// Writes `len` bytes at `buf` on rail `rail` to `dest`'s `(key, addr)` (`dest`: the
    /// peer's same rail), with remote completion `data`.
    ///
    /// # Safety
    /// As for [`Endpoint::send`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn writedata(
        &self,
        rail: usize,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: sys::FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.eps[rail];
        // SAFETY: a live endpoint's `rma` table; the rest by the caller's contract.
        unsafe { ((*(*ep).rma).writedata)(ep, buf.cast(), len, desc, data, dest, addr, key, ctx) }
    }

    /// Reads `len` bytes of `src`'s `(key, addr)` into `buf` on rail `rail` (`src`: the
    /// peer's same rail).
    ///
    /// # Safety
    /// `buf` must stay valid for `len` writes and `ctx` live and unmoved until the completion.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn read(
        &self,
        rail: usize,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        src: sys::FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.eps[rail];
        // SAFETY: a live endpoint's `rma` table; the rest by the caller's contract.
        unsafe { ((*(*ep).rma).read)(ep, buf.cast(), len, desc, src, addr, key, ctx) }
    }

    /// Reads completions of queue `queue` into `out` (drives the provider's progress on its
    /// rails): the entries read, or the error completion (the operation's context and its
    /// message) that stopped it.
    pub fn poll<'a>(
        &self,
        queue: usize,
        out: &'a mut [MaybeUninit<sys::CqDataEntry>],
    ) -> Result<&'a [sys::CqDataEntry], (*mut c_void, String)> {
        let cq = self.cqs[queue];
        // SAFETY: a live CQ's `read` writes at most `out.len()` entries of the DATA format.
        let n = unsafe { ((*(*cq).ops).read)(cq, out.as_mut_ptr().cast(), out.len()) };
        if n >= 0 {
            // SAFETY: the provider initialized the first `n` (<= `out.len()`) entries.
            return Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast(), n as usize) });
        }
        if n == -sys::FI_EAGAIN {
            return Ok(&[]);
        }
        if n != -sys::FI_EAVAIL {
            return Err((
                null_mut(),
                format!("fi_cq_read: {}", self.lib.strerror(n as i64)),
            ));
        }
        // SAFETY: a zeroed error entry (all-integer/pointer struct) with room to spare.
        let mut err: sys::CqErrEntry = unsafe { std::mem::zeroed() };
        // SAFETY: a live CQ's `readerr` fills one entry.
        let got = unsafe { ((*(*cq).ops).readerr)(cq, &mut err, 0) };
        if got < 1 {
            return Err((null_mut(), "fi_cq_readerr found no error".into()));
        }
        Err((err.op_context, self.lib.strerror(err.err.into())))
    }

    /// Whether the caller may now block on [`Endpoint::wait_fds`] (`fi_trywait` over every
    /// queue: false when completions are ready and must be read first); true without wait
    /// objects.
    pub fn trywait(&self) -> bool {
        if self.wait_fds.is_empty() {
            return true;
        }
        let mut fids = [null_mut::<Fid>(); 2];
        for (f, cq) in fids.iter_mut().zip(&self.cqs) {
            *f = cq.cast();
        }
        // SAFETY: a live fabric's `trywait` over our live CQs (`fids` holds `cqs.len()`).
        let rc = unsafe {
            ((*(*self.fabric).ops).trywait)(self.fabric, fids.as_mut_ptr(), self.cqs.len() as c_int)
        };
        if rc != 0 && rc as isize != -sys::FI_EAGAIN {
            tracing::trace!("ofi: fi_trywait: {}", self.lib.strerror(rc.into()));
        }
        rc == 0
    }
}
