//! Bulk copies of stream tasks: on x86-64 with AVX2 a vector loop from [`VECTOR_MIN`] bytes
//! (`memcpy` below it, and without AVX2), with non-temporal (streaming) stores from
//! [`STREAM_MIN`].
//!
//! A plain store to a line that is not cached first reads the line from memory (read for
//! ownership), so a large `memcpy` moves three bytes through the memory bus per byte copied.
//! Streaming stores write whole lines without reading them: two bytes per byte. They also
//! leave the cache alone, which is right for large copies into a final destination (the
//! destination of a multi-megabyte copy does not fit in the cache anyway) and wrong for data
//! another core reads at once. So each copy names who reads its bytes next ([`CopyTo`]):
//! - [`copy`]: this rank, soon; streams only from [`STREAM_MIN`];
//! - [`copy_out`]: an operation's output that nothing reads again soon; streams from the
//!   smaller [`STREAM_OUT_MIN`];
//! - [`copy_to_peer`] and [`SharedCopy`]: memory another core reads at once (a peer's window);
//!   plain or streaming stores, whichever the online [`learner`] measures cheaper at the time.
//!
//! Where one source goes to two places (an operation's own output and memory a peer reads),
//! [`tee()`] copies it in one pass, block by block, each destination stored for its reader.
//!
//! Streaming stores are weakly ordered: [`copy`] ends with `sfence`, so a release store after
//! it (a completion flag another process polls) is ordered after the copied data, as it is after
//! a plain `memcpy`.
//!
//! Layout: this file holds the entry points and the dispatch between `memcpy` and the vector
//! loop; [`learner`] the store-kind choice; `tee` the one-pass double copy; `vector` the AVX2
//! loop.

pub mod learner;
mod tee;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vector;

pub use learner::{SharedCopy, StoreChoice};
pub(crate) use tee::with_tee_choice;
pub use tee::{TEE_BLOCK, tee};

use crate::param::{Param, Unit};

/// Who reads a copy's bytes next, which decides how they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyTo {
    /// This rank, soon ([`copy`]).
    Local,
    /// Nobody soon: an operation's output ([`copy_out`], streaming stores from a smaller size).
    Output,
    /// A peer, at once: memory staged for a peer to read ([`copy_to_peer`], the store kind
    /// chosen by measuring, as for writes into a peer's window).
    Peer,
}

/// Copies at least this long use streaming stores (where the CPU has AVX2): a cache-resident
/// destination is faster with plain stores, a larger one with streaming stores, which skip the
/// read for ownership.
pub static STREAM_MIN: Param = Param::new(
    "STREAM_MIN",
    4 << 20,
    (0, u64::MAX),
    Unit::Bytes,
    "copies of at least this many bytes use streaming stores",
);

/// The same for [`copy_out`]: pieces of a large operation's output, which nothing reads again
/// soon, stream from this size.
pub static STREAM_OUT_MIN: Param = Param::new(
    "STREAM_OUT_MIN",
    1 << 20,
    (0, u64::MAX),
    Unit::Bytes,
    "copies into an operation's output of at least this many bytes use streaming stores",
);

/// Copies of at least this many bytes run the library's own vector loop (where the CPU has
/// AVX2) instead of `memcpy`. Above glibc's threshold its `memcpy` is `rep movsb`, which on some
/// CPUs (AMD Zen 4) moves lines another core has just written at half the rate of a vector
/// loop or less. Below it `memcpy` is a vector loop already.
pub static VECTOR_MIN: Param = Param::new(
    "VECTOR_MIN",
    8 << 10,
    (0, u64::MAX),
    Unit::Bytes,
    "copies of at least this many bytes use the AVX2 loop instead of memcpy",
);

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` reads, `dst` for `len` writes,
/// the two ranges disjoint.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_MIN.bytes()) }
}

/// Copies `len` bytes into an operation's output that is not read again soon: streaming
/// stores from [`STREAM_OUT_MIN`] bytes.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_out(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_OUT_MIN.bytes()) }
}

/// Copies `len` bytes stored for who reads them next: [`copy`], [`copy_out`] or
/// [`copy_to_peer`].
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_to(to: CopyTo, dst: *mut u8, src: *const u8, len: usize) {
    let f = match to {
        CopyTo::Local => copy,
        CopyTo::Output => copy_out,
        CopyTo::Peer => copy_to_peer,
    };
    // SAFETY: forwarded.
    unsafe { f(dst, src, len) }
}

/// The store choice of [`copy_to_peer`].
static TO_PEER: std::sync::LazyLock<SharedCopy> = std::sync::LazyLock::new(SharedCopy::default);

/// Copies into memory this rank offers a peer, which the peer reads at once (a piece staged
/// in the window), as [`SharedCopy`] writes into a peer's window.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_to_peer(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { TO_PEER.copy(dst, src, len) }
}

/// A copy with streaming stores from `min` bytes and the vector loop from [`VECTOR_MIN`]
/// (where the CPU has AVX2), else `memcpy`.
///
/// # Safety
/// As [`copy`].
pub(crate) unsafe fn copy_streaming_from(dst: *mut u8, src: *const u8, len: usize, min: usize) {
    let stream = len >= min.max(VECTOR_MIN.bytes());
    // SAFETY: forwarded.
    unsafe { copy_unfenced(dst, src, len, stream) };
    if stream {
        fence();
    }
}

/// A copy with the vector loop (where the CPU has AVX2) from [`VECTOR_MIN`] bytes or wherever
/// `stream` asks for streaming stores, else `memcpy`; streamed without the closing [`fence`].
///
/// # Safety
/// As [`copy`]; where `stream`, the caller runs [`fence`] before anything that must see the
/// bytes.
pub(crate) unsafe fn copy_unfenced(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if (stream || len >= VECTOR_MIN.bytes()) && can_stream() {
        // SAFETY: AVX2 is present (checked above); the ranges are the caller's.
        unsafe {
            if stream {
                vector::avx2::<true>(dst, src, len)
            } else {
                vector::avx2::<false>(dst, src, len)
            }
        };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Whether [`copy_unfenced`] can stream (x86-64 with AVX2).
pub(crate) fn can_stream() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Orders streaming stores (which are weakly ordered) before every later store, as a release
/// store after a plain copy would be: a completion flag another process polls must not become
/// visible before the data.
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, in the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}
