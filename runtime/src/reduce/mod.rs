//! Reduction kernels for every [`DataType`] × [`ReduceOp`].
//!
//! # Design
//!
//! * Each (element type, operator) pair gets its own monomorphized loop: the operator is a
//!   zero-sized type implementing `BinOp`, so the loop body is a single inlined expression that
//!   LLVM vectorizes (packed SSE2 on the x86-64 baseline).
//! * The raw-pointer entry point [`reduce`] turns its pointers into slices before looping, picking
//!   one of three shapes so that no `&mut` ever aliases another reference: three disjoint slices
//!   (`dst = a ⊕ b`), one `&mut` plus one `&` (in place, `dst == a` or `dst == b`), or a single
//!   `&mut` (`dst == a == b`). Non-aliasing slices are what lets LLVM vectorize without runtime
//!   overlap checks.
//! * `f16` / `bf16` are reduced in `f32`, [`HALF_LANES`] elements at a time held in registers:
//!   widened (`f16`: F16C's `vcvtph2ps`; `bf16`: a shift), reduced, and rounded back (`f16`:
//!   `vcvtps2ph`; `bf16`: AVX-512 BF16's `vcvtne2ps2bf16` where the CPU has it, else bit
//!   manipulation in AVX2 intrinsics, on lanes kept in even/odd order so that no shuffle is
//!   needed). Each result is rounded once, exactly as the per-element
//!   `from_f32(op(a.to_f32(), b.to_f32()))` would (`vcvtne2ps2bf16` takes subnormals as zero,
//!   so groups with a subnormal result take the AVX2 rounding).
//! * On x86-64 the loops are additionally compiled with AVX2 and F16C enabled and chosen at run
//!   time with `is_x86_feature_detected!` (the detection result is cached by `std`); `bf16`
//!   loops get a third variant with AVX-512 BF16 as well. All variants come from the same
//!   generic source; nothing is written twice. The variant a loop is compiled for is a type
//!   (`Isa`), so code that uses AVX2, F16C or BF16 intrinsics can test for it.
//!
//! # Semantics
//!
//! * Integer `Sum` and `Prod` wrap (two's complement), as on the GPU.
//! * Float `Max` is `if b > a { b } else { a }` and `Min` is `if b < a { b } else { a }` for
//!   every float type (`f16`, `bf16` compared after exact widening to `f32`). Consequently a NaN in
//!   `a` is returned as is, and a NaN in `b` is ignored (the result is `a`). This is *not* IEEE
//!   `maxNum` nor CUDA's `fmaxf` (which return the non-NaN operand in both cases); it is what x86
//!   `maxps`/`minps` compute, so it costs one instruction per vector. `-0.0` and `+0.0` compare
//!   equal, so `a` is returned.
//! * `Avg` is reduced as `Sum`; [`finish_avg`] divides by the rank count afterwards (as NCCL's
//!   sum-then-divide). Integer division truncates toward zero; `f16`/`bf16` divide in `f32` by the
//!   exact count and round once.
//!
//! Layout: this file holds the entry points; `kernels` the native types' loops and the per-type
//! plumbing, `half_float` the `f16`/`bf16` lane conversions, `isa` the run-time choice of instruction
//! set.

mod half_float;
mod isa;
mod kernels;
#[cfg(test)]
mod tests;

pub use half_float::HALF_LANES;

use std::sync::LazyLock;

use half::{bf16, f16};

use crate::copy::StoreChoice;
use crate::dtype::{DataType, Element, ReduceOp};
use kernels::{Reducible, reduce_raw};

/// `dst[i] = a[i] ⊕ b[i]` for `i < count`, elements of type `dtype`.
///
/// `Avg` is reduced as `Sum`; call [`finish_avg`] on the final result.
///
/// # Safety
/// `a` and `b` must be valid for `count` reads, `dst` for `count` writes, all aligned to
/// `dtype.size()`. `dst` may be equal to `a` or `b` (in place) but must not otherwise overlap.
/// `a` and `b` may overlap each other arbitrarily (they are only read). No other thread may write
/// `a` or `b`, or access `dst`, during the call.
pub unsafe fn reduce(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    count: usize,
) {
    macro_rules! go {
        ($t:ty) => {{
            // SAFETY: forwarded from the caller's contract; `$t` is the element type of `dtype`,
            // so the alignment and validity requirements are the ones the caller promised.
            unsafe { reduce_raw::<$t>(op, dst.cast(), a.cast(), b.cast(), count) }
        }};
    }
    match dtype {
        DataType::I8 => go!(i8),
        DataType::U8 => go!(u8),
        DataType::I32 => go!(i32),
        DataType::U32 => go!(u32),
        DataType::I64 => go!(i64),
        DataType::U64 => go!(u64),
        DataType::F16 => go!(f16),
        DataType::F32 => go!(f32),
        DataType::F64 => go!(f64),
        DataType::Bf16 => go!(bf16),
    }
}

/// Bytes of the cache-resident block [`reduce_out`] reduces into before streaming it out:
/// small enough to stay in the first-level cache next to the operands' lines.
const OUT_BLOCK: usize = 8 << 10;

/// How [`reduce_out`] stores, learnt per process: which kind is cheaper depends on whether
/// the output's lines are still cached and on how busy the memory is.
static OUTPUT_STORES: LazyLock<StoreChoice> = LazyLock::new(StoreChoice::default);

/// As [`reduce`], into an operation's output that nothing reads again soon (a large
/// operation's final pieces). Plain stores to lines that are not cached read each line from
/// memory first (three bytes of memory traffic per byte written); streaming stores do not.
/// They lose where the output is still cached, which the caller cannot know for sure, so
/// where `dst` is disjoint from both operands and the CPU can stream a [`StoreChoice`] picks
/// the kind by measured cost. Streaming reduces each `OUT_BLOCK` (8 KiB) into a buffer on the
/// stack and streams it to `dst`. In place it is [`reduce`]: the lines were just read.
///
/// # Safety
/// As [`reduce`].
pub unsafe fn reduce_out(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    count: usize,
) {
    if dst.cast_const() == a || dst.cast_const() == b || !crate::copy::can_stream() {
        // SAFETY: forwarded.
        unsafe { reduce(dtype, op, dst, a, b, count) };
        return;
    }
    OUTPUT_STORES.run(count * dtype.size(), |streaming| {
        // SAFETY (both): forwarded; `dst` is disjoint from `a` and `b` (checked above).
        unsafe {
            if streaming {
                reduce_streaming(dtype, op, dst, a, b, count)
            } else {
                reduce(dtype, op, dst, a, b, count)
            }
        }
    });
}

/// [`reduce`] through a block on the stack, streamed to `dst` ([`reduce_out`]).
///
/// # Safety
/// As [`reduce`], and `dst` disjoint from `a` and `b`.
unsafe fn reduce_streaming(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    count: usize,
) {
    /// The block, aligned so that streaming from it reads whole lines.
    #[repr(C, align(64))]
    struct Block([u8; OUT_BLOCK]);
    let mut block = Block([0; OUT_BLOCK]);
    let size = dtype.size();
    let per = OUT_BLOCK / size;
    let mut i = 0;
    while i < count {
        let n = per.min(count - i);
        // SAFETY: `i + n <= count`: the offsets stay inside the caller's ranges; `block` holds
        // `n * size <= OUT_BLOCK` bytes, is aligned for every element type (64 bytes) and is
        // disjoint from `a`, `b` and `dst` (it is this frame's); `dst` is disjoint from both
        // operands (the caller's contract).
        unsafe {
            let off = i * size;
            reduce(dtype, op, block.0.as_mut_ptr(), a.add(off), b.add(off), n);
            crate::copy::copy_unfenced(dst.add(off), block.0.as_ptr(), n * size, true);
        }
        i += n;
    }
    crate::copy::fence();
}

/// As [`reduce`] into `dst` (plain stores), and the result copied to `also.0` as well, stored
/// for who reads it next (`also.1`, as [`crate::copy::tee`] stores): block by block
/// ([`crate::copy::TEE_BLOCK`]), so the copy reads each block of the result from the L1 cache
/// instead of in a second pass over it.
///
/// # Safety
/// As [`reduce`]; `also.0` is valid for `count` elements of writes, disjoint from `dst`, and
/// disjoint from `a` and `b` or equal to one of them (each block of an operand is read before
/// the same block of `also.0` is written).
pub unsafe fn reduce_tee(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    also: (*mut u8, crate::copy::CopyTo),
    a: *const u8,
    b: *const u8,
    count: usize,
) {
    let size = dtype.size();
    crate::copy::with_tee_choice([also.1], count * size, |[stream]| {
        let per = crate::copy::TEE_BLOCK.bytes() / size;
        let mut i = 0;
        while i < count {
            let (n, off) = (per.min(count - i), i * size);
            // SAFETY: `i + n <= count`: inside the caller's ranges; `dst` may be `a` or `b` as
            // for `reduce`; `also.0` is disjoint from `dst`, and from `a` and `b` unless it is
            // one of them, whose block was read by the reduction just before (the caller's
            // contract).
            unsafe {
                reduce(dtype, op, dst.add(off), a.add(off), b.add(off), n);
                crate::copy::copy_unfenced(also.0.add(off), dst.add(off), n * size, stream);
            }
            i += n;
        }
    });
}

/// `dst[i] /= n` — the last step of `Avg`.
///
/// Integer types divide with truncation toward zero (exactly, whatever the size of `n`); `f32` and
/// `f64` divide by `n` converted to the type; `f16`/`bf16` divide in `f32` and round once.
///
/// # Panics
/// If `n == 0`.
///
/// # Safety
/// `dst` must be valid for `count` reads and writes, aligned to `dtype.size()`, and not accessed
/// by anyone else during the call.
pub unsafe fn finish_avg(dtype: DataType, dst: *mut u8, count: usize, n: usize) {
    assert!(n > 0, "finish_avg: rank count must be positive");
    macro_rules! go {
        ($t:ty) => {{
            // SAFETY: the caller guarantees `dst` is valid, aligned and exclusively ours for
            // `count` elements of the type of `dtype`, which is `$t`.
            let d = unsafe { std::slice::from_raw_parts_mut(dst.cast::<$t>(), count) };
            <$t as Reducible>::finish_avg(d, n);
        }};
    }
    match dtype {
        DataType::I8 => go!(i8),
        DataType::U8 => go!(u8),
        DataType::I32 => go!(i32),
        DataType::U32 => go!(u32),
        DataType::I64 => go!(i64),
        DataType::U64 => go!(u64),
        DataType::F16 => go!(f16),
        DataType::F32 => go!(f32),
        DataType::F64 => go!(f64),
        DataType::Bf16 => go!(bf16),
    }
}

/// Safe in-place reduction: `dst[i] = dst[i] ⊕ src[i]`.
///
/// # Panics
/// If `dst.len() != src.len()`.
pub fn reduce_slice<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "reduce_slice: length mismatch");
    let dst_ptr = dst.as_mut_ptr().cast::<u8>();
    // SAFETY: `dst` and `src` are live slices of `T` (whose data type is `T::DTYPE`, per the
    // `Element` contract) of equal length, so both are valid and aligned for `len` elements.
    // `dst` is passed as both `dst` and `a` (exact in-place, allowed); a `&mut` and a `&` never
    // overlap, so `src` is disjoint from `dst`.
    unsafe {
        reduce(
            T::DTYPE,
            op,
            dst_ptr,
            dst_ptr,
            src.as_ptr().cast(),
            dst.len(),
        )
    }
}

/// Safe out-of-place reduction: `dst[i] = a[i] ⊕ b[i]`.
///
/// # Panics
/// If the three lengths differ.
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    assert_eq!(dst.len(), a.len(), "reduce_into: length mismatch");
    assert_eq!(dst.len(), b.len(), "reduce_into: length mismatch");
    // SAFETY: all three are live slices of `T` (data type `T::DTYPE`) of equal length, hence
    // valid and aligned; `dst` is a `&mut`, so it overlaps neither `a` nor `b`.
    unsafe {
        reduce(
            T::DTYPE,
            op,
            dst.as_mut_ptr().cast(),
            a.as_ptr().cast(),
            b.as_ptr().cast(),
            dst.len(),
        )
    }
}

/// Safe counterpart of [`finish_avg`]: `dst[i] /= n`.
///
/// # Panics
/// If `n == 0`.
pub fn finish_avg_slice<T: Element>(dst: &mut [T], n: usize) {
    // SAFETY: `dst` is a live, exclusively borrowed slice of `T`, whose data type is `T::DTYPE`.
    unsafe { finish_avg(T::DTYPE, dst.as_mut_ptr().cast(), dst.len(), n) }
}
