//! The AVX2 copy loop, with plain or streaming stores.

/// The vector copy: a plain copy up to the first 32-byte boundary of `dst`, aligned 32-byte
/// stores (four per loop; streaming ones when `STREAM`, which the caller then [`super::fence`]s), and
/// a plain copy of the tail.
///
/// # Safety
/// The CPU supports AVX2; the ranges as for [`super::copy`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn avx2<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_stream_si256};
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
}
