//! Bulk copies of stream tasks: `memcpy`, or — for copies of at least [`STREAM_MIN`] bytes on
//! x86-64 with AVX2 — non-temporal (streaming) stores.
//!
//! A plain store to a line that is not cached first reads the line from memory (read for
//! ownership), so a large `memcpy` moves three bytes through the memory bus per byte copied.
//! Streaming stores write whole lines without reading them: two bytes per byte. They also
//! leave the cache alone, which is right for large copies into a final destination (the
//! destination of a multi-megabyte copy does not fit in the cache anyway) and wrong for data
//! another core reads at once, so only stream tasks' copies and reads out of a peer's window
//! (which land in their final place) use them, not the transports' writes into a peer's
//! window. [`copy_out`] streams from a smaller size, for callers that know the destination is
//! an operation's output that nothing reads again soon.
//!
//! Streaming stores are weakly ordered: [`copy`] ends with `sfence`, so a release store after
//! it (a completion flag another process polls) is ordered after the copied data, as it is after
//! a plain `memcpy`.

/// Copies at least this long use streaming stores (where the CPU has AVX2). Measured on the
/// dev machine (`cargo bench -p ampccl-runtime --bench copy`): at 1 MiB (cache-resident) the
/// streaming copy is slower than `memcpy`, from 4 MiB up it is faster (docs/PERFORMANCE.md).
pub const STREAM_MIN: usize = 4 << 20;
/// The same for [`copy_out`]: pieces of a large operation's output, which nothing reads again
/// soon, stream from this size (the 2 MiB pieces of `AllReducePair`, docs/PERFORMANCE.md).
pub const STREAM_OUT_MIN: usize = 1 << 20;

/// Copies of at least this many bytes run the library's own vector loop (where the CPU has
/// AVX2) instead of `memcpy`. Above glibc's threshold (8 KiB on AVX-512 machines) its `memcpy`
/// is `rep movsb`, which on AMD Zen 4 moves lines another core has just written at half the
/// rate of a vector loop or less: a 2-thread producer/consumer test through a 1 MiB window
/// copied 12 GB/s with `memcpy` against 30–37 GB/s with AVX2 loads and stores (session 10,
/// docs/PERFORMANCE.md). Below it `memcpy` is a vector loop already.
pub const VECTOR_MIN: usize = 8 << 10;

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` reads, `dst` for `len` writes,
/// the two ranges disjoint.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_MIN) }
}

/// Copies `len` bytes into an operation's output that is not read again soon: streaming
/// stores from [`STREAM_OUT_MIN`] bytes.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_out(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_OUT_MIN) }
}

/// Copies `len` bytes into memory another core reads at once (a peer's window): plain stores
/// at every size, so the data stays in the cache.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_shared(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, usize::MAX) }
}

/// A copy with streaming stores from `min` bytes and the vector loop from [`VECTOR_MIN`]
/// (where the CPU has AVX2), else `memcpy`.
///
/// # Safety
/// As [`copy`].
unsafe fn copy_streaming_from(dst: *mut u8, src: *const u8, len: usize, min: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= VECTOR_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above); the ranges are the caller's.
        unsafe {
            if len >= min {
                vector_avx2::<true>(dst, src, len)
            } else {
                vector_avx2::<false>(dst, src, len)
            }
        };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// The vector copy: a plain copy up to the first 32-byte boundary of `dst`, aligned 32-byte
/// stores (four per loop; streaming ones when `STREAM`), a plain copy of the tail, and after
/// streaming stores an `sfence`.
///
/// # Safety
/// The CPU supports AVX2; the ranges as for [`copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vector_avx2<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{
        __m256i, _mm_sfence, _mm256_loadu_si256, _mm256_store_si256, _mm256_stream_si256,
    };
    const V: usize = 32;
    /// One aligned 32-byte store, streaming when `STREAM`.
    ///
    /// # Safety
    /// AVX2 is present; `d` is 32-byte aligned and valid for 32 bytes of writes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store<const STREAM: bool>(d: *mut __m256i, v: __m256i) {
        // SAFETY: the function's contract.
        unsafe {
            if STREAM {
                _mm256_stream_si256(d, v)
            } else {
                _mm256_store_si256(d, v)
            }
        }
    }
    let head = dst.align_offset(V).min(len);
    // SAFETY: `head <= len`, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    // In both loops `dst + i` is 32-byte aligned (the head brought it there, and `i` moves in
    // multiples of 32), as the aligned and streaming stores require; loads may be unaligned.
    while i + 4 * V <= len {
        // SAFETY: `i + 4 * V <= len`: the four loads and stores lie inside the caller's
        // ranges; alignment as above.
        unsafe {
            let s = src.add(i).cast::<__m256i>();
            let d = dst.add(i).cast::<__m256i>();
            let (a, b, c, e) = (
                _mm256_loadu_si256(s),
                _mm256_loadu_si256(s.add(1)),
                _mm256_loadu_si256(s.add(2)),
                _mm256_loadu_si256(s.add(3)),
            );
            store::<STREAM>(d, a);
            store::<STREAM>(d.add(1), b);
            store::<STREAM>(d.add(2), c);
            store::<STREAM>(d.add(3), e);
        }
        i += 4 * V;
    }
    while i + V <= len {
        // SAFETY: `i + V <= len`; alignment as above.
        unsafe { store::<STREAM>(dst.add(i).cast(), _mm256_loadu_si256(src.add(i).cast())) };
        i += V;
    }
    // SAFETY: `i <= len`: the rest of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
    if STREAM {
        // Streaming stores are weakly ordered: make them visible before anything that follows.
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every offset of source and destination within a cache line, lengths around the
    /// threshold and around vector boundaries: the copy is exact and writes nothing outside.
    #[test]
    fn copies_exactly_at_any_alignment() {
        let max = STREAM_MIN + 300;
        let src: Vec<u8> = (0..max + 64).map(|i| (i * 7 + 3) as u8).collect();
        for len in [
            0,
            1,
            31,
            32,
            127,
            129,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 33,
            max,
        ] {
            for (so, dof) in [(0, 0), (1, 0), (0, 5), (17, 31), (63, 1)] {
                let mut dst = vec![0xEEu8; max + 128];
                // SAFETY: both ranges lie inside their vectors and are disjoint.
                unsafe { copy(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), len) };
                assert_eq!(
                    &dst[dof..dof + len],
                    &src[so..so + len],
                    "len {len} at {so}/{dof}"
                );
                assert!(dst[..dof].iter().all(|&b| b == 0xEE), "before, len {len}");
                assert!(
                    dst[dof + len..].iter().all(|&b| b == 0xEE),
                    "after, len {len}"
                );
            }
        }
    }
}
