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

use crate::copy::StoreChoice;
use crate::dtype::{DataType, Element, ReduceOp};
use half::{bf16, f16};
use std::marker::PhantomData;
use std::sync::LazyLock;

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

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
    also: (*mut u8, crate::task::CopyTo),
    a: *const u8,
    b: *const u8,
    count: usize,
) {
    let size = dtype.size();
    crate::copy::with_tee_choice([also.1], count * size, |[stream]| {
        let per = crate::copy::TEE_BLOCK / size;
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

// ---------------------------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------------------------

/// Scalar arithmetic of the natively computed element types (integers, `f32`, `f64`).
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            // See the module docs: NaN in `self` wins, NaN in `o` is ignored.
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
        }
    )*};
}
float_arith!(f32, f64);

/// A reduction operator as a type, so every (type, operator) loop is monomorphized.
trait BinOp {
    fn apply<T: Arith>(a: T, b: T) -> T;
}

macro_rules! bin_op {
    ($($name:ident => $method:ident),*) => {$(
        struct $name;
        impl BinOp for $name {
            #[inline(always)]
            fn apply<T: Arith>(a: T, b: T) -> T { a.$method(b) }
        }
    )*};
}
bin_op!(OpSum => add, OpProd => mul, OpMax => max, OpMin => min);

/// Calls `f` with `$O` bound to the operator type of `op` (`Avg` reduces as `Sum`).
macro_rules! with_op {
    ($op:expr, $O:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                type $O = OpSum;
                $body
            }
            ReduceOp::Prod => {
                type $O = OpProd;
                $body
            }
            ReduceOp::Max => {
                type $O = OpMax;
                $body
            }
            ReduceOp::Min => {
                type $O = OpMin;
                $body
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Slice kernels
// ---------------------------------------------------------------------------------------------

/// The three aliasing shapes [`reduce`] can be called with, as references.
enum Operands<'a, T> {
    /// `dst = a ⊕ b`, `dst` disjoint from both.
    Three {
        dst: &'a mut [T],
        a: &'a [T],
        b: &'a [T],
    },
    /// `dst = dst ⊕ src` (`dst == a`).
    Left { dst: &'a mut [T], src: &'a [T] },
    /// `dst = src ⊕ dst` (`dst == b`); kept apart from `Left` because float `Max`/`Min` are not
    /// symmetric in NaN.
    Right { dst: &'a mut [T], src: &'a [T] },
    /// `dst = dst ⊕ dst` (`dst == a == b`).
    Same { dst: &'a mut [T] },
}

/// # Safety
/// See [`reduce`]; `T` must be the element type the caller's `dtype` names.
#[inline(always)]
unsafe fn reduce_raw<T: Reducible>(
    op: ReduceOp,
    dst: *mut T,
    a: *const T,
    b: *const T,
    count: usize,
) {
    if count == 0 {
        return;
    }
    let d = dst.cast_const();
    // SAFETY (all four arms): the caller guarantees validity and alignment of every buffer for
    // `count` elements and exclusive access to `dst`. `dst` is disjoint from any operand it does
    // not equal, so in each arm the `&mut` slice overlaps none of the shared slices built next to
    // it; `a` and `b` may overlap each other, which is fine for shared slices.
    let operands = unsafe {
        if d == a && d == b {
            Operands::Same {
                dst: std::slice::from_raw_parts_mut(dst, count),
            }
        } else if d == a {
            Operands::Left {
                dst: std::slice::from_raw_parts_mut(dst, count),
                src: std::slice::from_raw_parts(b, count),
            }
        } else if d == b {
            Operands::Right {
                dst: std::slice::from_raw_parts_mut(dst, count),
                src: std::slice::from_raw_parts(a, count),
            }
        } else {
            Operands::Three {
                dst: std::slice::from_raw_parts_mut(dst, count),
                a: std::slice::from_raw_parts(a, count),
                b: std::slice::from_raw_parts(b, count),
            }
        }
    };
    T::reduce(op, operands);
}

/// `dst = a ⊕ b` on equal-length slices.
#[inline(always)]
fn kernel3<T: Arith, O: BinOp>(dst: &mut [T], a: &[T], b: &[T]) {
    let n = dst.len();
    let (a, b) = (&a[..n], &b[..n]);
    for i in 0..n {
        dst[i] = O::apply(a[i], b[i]);
    }
}

/// `dst = dst ⊕ src` (`SWAP == false`) or `dst = src ⊕ dst` (`SWAP == true`).
#[inline(always)]
fn kernel2<T: Arith, O: BinOp, const SWAP: bool>(dst: &mut [T], src: &[T]) {
    let src = &src[..dst.len()];
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = if SWAP {
            O::apply(s, *d)
        } else {
            O::apply(*d, s)
        };
    }
}

/// `dst = dst ⊕ dst`.
#[inline(always)]
fn kernel1<T: Arith, O: BinOp>(dst: &mut [T]) {
    for d in dst {
        *d = O::apply(*d, *d);
    }
}

/// Runs one of the kernels above on already-split operands.
#[inline(always)]
fn run_kernel<T: Arith, O: BinOp>(ops: Operands<'_, T>) {
    match ops {
        Operands::Three { dst, a, b } => kernel3::<T, O>(dst, a, b),
        Operands::Left { dst, src } => kernel2::<T, O, false>(dst, src),
        Operands::Right { dst, src } => kernel2::<T, O, true>(dst, src),
        Operands::Same { dst } => kernel1::<T, O>(dst),
    }
}

/// Elements of `f16`/`bf16` converted and reduced at a time: two AVX2 vectors of `f32`.
pub const HALF_LANES: usize = 16;

/// `f16`/`bf16` conversion to and from `f32`, [`HALF_LANES`] elements at a time (exact
/// widening, round-to-nearest-even narrowing, bit-identical to `half`'s scalar `to_f32` /
/// `from_f32`).
///
/// `widen` may arrange a group's elements in another order than memory's, the one that is
/// cheapest for the variant; `narrow` takes them in that order. Only element-wise functions
/// may be applied in between.
trait HalfFloat: Copy {
    const ZERO: Self;
    /// Whether jobs on this type take the AVX-512 BF16 variant where the CPU has it.
    const BF16: bool = false;
    fn widen<I: Isa>(src: &[Self; HALF_LANES]) -> [f32; HALF_LANES];
    fn narrow<I: Isa>(src: &[f32; HALF_LANES]) -> [Self; HALF_LANES];
    /// The lane of `widen`'s result that holds element `k` of the group.
    #[cfg(test)]
    fn lane<I: Isa>(k: usize) -> usize {
        k
    }
}

impl HalfFloat for f16 {
    const ZERO: Self = f16::ZERO;

    /// F16C's `vcvtph2ps` where [`dispatch`] enabled it, else `half`'s conversion.
    #[inline(always)]
    fn widen<I: Isa>(src: &[Self; HALF_LANES]) -> [f32; HALF_LANES] {
        #[cfg(target_arch = "x86_64")]
        if I::AVX2 {
            use std::arch::x86_64::{__m128i, __m256, _mm_loadu_si128, _mm256_cvtph_ps};
            let p = src.as_ptr().cast::<__m128i>();
            // SAFETY: `I::AVX2` is true only inside `dispatch`'s function compiled with AVX2 and
            // F16C, entered after detecting both. `src` holds 16 `f16`, 32 bytes: the two
            // unaligned 16-byte loads stay inside it. `[__m256; 2]` and `[f32; 16]` have the
            // same size and every bit pattern is valid for both.
            return unsafe {
                std::mem::transmute::<[__m256; 2], [f32; HALF_LANES]>([
                    _mm256_cvtph_ps(_mm_loadu_si128(p)),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(1))),
                ])
            };
        }
        src.map(f16::to_f32)
    }

    /// F16C's `vcvtps2ph` (round to nearest even) where [`dispatch`] enabled it, else `half`'s.
    #[inline(always)]
    fn narrow<I: Isa>(src: &[f32; HALF_LANES]) -> [Self; HALF_LANES] {
        #[cfg(target_arch = "x86_64")]
        if I::AVX2 {
            use std::arch::x86_64::{__m128i, __m256, _MM_FROUND_TO_NEAREST_INT, _mm256_cvtps_ph};
            // SAFETY: as in `widen`. `[f32; 16]` and `[__m256; 2]` have the same size and every
            // bit pattern is valid for both, as for `[__m128i; 2]` and `[f16; 16]`. The empty
            // `asm!` reads and writes only the two registers it names.
            return unsafe {
                let [lo, hi]: [__m256; 2] = std::mem::transmute(*src);
                let mut lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo);
                let mut hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi);
                // Keeps the results in registers: LLVM would otherwise fold the stores into
                // `vcvtps2ph` itself, whose memory form is slow on AMD Zen (1 MiB f16 sum on
                // Zen 4: 15.4 GiB/s folded, 19.3 in registers).
                std::arch::asm!(
                    "/* {lo} {hi} */",
                    lo = inout(xmm_reg) lo,
                    hi = inout(xmm_reg) hi,
                    options(pure, nomem, nostack, preserves_flags)
                );
                std::mem::transmute::<[__m128i; 2], [f16; HALF_LANES]>([lo, hi])
            };
        }
        src.map(f16::from_f32)
    }
}

impl HalfFloat for bf16 {
    const ZERO: Self = bf16::ZERO;
    const BF16: bool = true;

    /// A shift: `bf16` is the upper half of an `f32`. In AVX2 the group is read as eight
    /// 32-bit words, each holding an even element in its low half and an odd one in its high
    /// half: shifting left gives the even elements, masking the odd ones, without a shuffle.
    /// Lanes 0–7 hold elements 0, 2, …, 14; lanes 8–15 elements 1, 3, …, 15.
    #[inline(always)]
    fn widen<I: Isa>(src: &[Self; HALF_LANES]) -> [f32; HALF_LANES] {
        #[cfg(target_arch = "x86_64")]
        if I::AVX2 {
            use std::arch::x86_64::{
                __m256i, _mm256_and_si256, _mm256_loadu_si256, _mm256_set1_epi32, _mm256_slli_epi32,
            };
            // SAFETY: as in `f16::widen`; `src` holds 32 bytes, one unaligned `__m256i` load.
            // `[__m256i; 2]` and `[f32; 16]` have the same size and every bit pattern is valid
            // for both.
            return unsafe {
                let words = _mm256_loadu_si256(src.as_ptr().cast::<__m256i>());
                std::mem::transmute::<[__m256i; 2], [f32; HALF_LANES]>([
                    _mm256_slli_epi32::<16>(words),
                    _mm256_and_si256(words, _mm256_set1_epi32(HIGH_HALF as i32)),
                ])
            };
        }
        src.map(|h| f32::from_bits(u32::from(h.to_bits()) << 16))
    }

    /// Round to nearest, ties to even: add `0x7fff` plus the kept part's lowest bit and keep
    /// the upper half, which carries into the exponent (up to infinity) as it should. NaNs are
    /// truncated and made quiet instead, as `bf16::from_f32` does. In AVX2 (lanes as `widen`
    /// arranges them) the even elements' results are shifted into the low halves of the
    /// words, the odd ones' masked in the high halves, and the two combined.
    #[inline(always)]
    fn narrow<I: Isa>(src: &[f32; HALF_LANES]) -> [Self; HALF_LANES] {
        #[cfg(target_arch = "x86_64")]
        if I::BF16 {
            // SAFETY: `I::BF16` is true only inside `dispatch`'s BF16 function compiled with
            // the features `bf16_narrow16` needs, entered after detecting them.
            if let Some(out) = unsafe { bf16_narrow16(src) } {
                return out;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if I::AVX2 {
            use std::arch::x86_64::{
                __m256, __m256i, _mm256_and_si256, _mm256_or_si256, _mm256_set1_epi32,
                _mm256_srli_epi32,
            };
            // SAFETY: as in `f16::widen`; `[f32; 16]` and `[__m256; 2]`, and `__m256i` and
            // `[bf16; 16]`, have the same size and every bit pattern is valid for each.
            return unsafe {
                let [even, odd]: [__m256; 2] = std::mem::transmute(*src);
                let even = _mm256_srli_epi32::<16>(bf16_round8(even));
                let odd = _mm256_and_si256(bf16_round8(odd), _mm256_set1_epi32(HIGH_HALF as i32));
                std::mem::transmute::<__m256i, [bf16; HALF_LANES]>(_mm256_or_si256(even, odd))
            };
        }
        src.map(|x| bf16::from_bits((bf16_round(x) >> 16) as u16))
    }

    #[cfg(test)]
    fn lane<I: Isa>(k: usize) -> usize {
        if I::AVX2 {
            k / 2 + k % 2 * HALF_LANES / 2
        } else {
            k
        }
    }
}

/// The upper 16 bits of a 32-bit word, where `bf16` sits in an `f32`.
const HIGH_HALF: u32 = 0xffff_0000;

/// The bit that makes an `f32` NaN quiet, which survives narrowing to `bf16`.
const BF16_QUIET: u32 = 0x0040_0000;

/// `x` rounded to `bf16` as `bf16::narrow` describes, in the upper half of the word.
#[inline(always)]
fn bf16_round(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        b | BF16_QUIET
    } else {
        b.wrapping_add(0x7fff + ((b >> 16) & 1))
    }
}

/// `bf16::narrow` of a group in AVX-512 BF16: `vcvtne2ps2bf16` rounds both halves (to nearest
/// even, NaNs truncated and made quiet, as [`bf16_round`]) and `vpermw` interleaves the even
/// and odd elements again. The instruction takes subnormal lanes as zero, so a group with one
/// is left to the caller (`None`); sums of data that is not itself that small never hit it.
///
/// # Safety
/// Only inside code compiled with AVX-512 BF16, VL, BW and DQ on a CPU that has them
/// (`Isa::BF16`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bf16_narrow16(src: &[f32; HALF_LANES]) -> Option<[bf16; HALF_LANES]> {
    use std::arch::x86_64::{
        __m256, __m256i, _mm256_cvtne2ps_pbh, _mm256_fpclass_ps_mask, _mm256_permutexvar_epi16,
        _mm256_setr_epi16,
    };
    /// `vfpclassps` category: subnormal.
    const SUBNORMAL: i32 = 0x20;
    // SAFETY: the caller runs this with the features above enabled and present. `[f32; 16]`
    // and `[__m256; 2]`, and `__m256i`, `__m256bh` and `[bf16; 16]`, have the same size and
    // every bit pattern is valid for each.
    unsafe {
        let [even, odd]: [__m256; 2] = std::mem::transmute(*src);
        if _mm256_fpclass_ps_mask::<SUBNORMAL>(even) | _mm256_fpclass_ps_mask::<SUBNORMAL>(odd) != 0
        {
            return None;
        }
        // Lanes 0–7: the even elements, 8–15: the odd ones; output element `k` takes lane
        // `k / 2 + 8 * (k % 2)`.
        let packed: __m256i = std::mem::transmute(_mm256_cvtne2ps_pbh(odd, even));
        let order = _mm256_setr_epi16(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        Some(std::mem::transmute::<__m256i, [bf16; HALF_LANES]>(
            _mm256_permutexvar_epi16(order, packed),
        ))
    }
}

/// [`bf16_round`] on eight lanes.
///
/// # Safety
/// Only inside code compiled with AVX2 on a CPU that has it (`Isa::AVX2`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bf16_round8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::{
        _CMP_UNORD_Q, _mm256_add_epi32, _mm256_and_si256, _mm256_blendv_epi8, _mm256_castps_si256,
        _mm256_cmp_ps, _mm256_or_si256, _mm256_set1_epi32, _mm256_srli_epi32,
    };
    // SAFETY: the caller runs this with AVX2 enabled and present.
    unsafe {
        let b = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        let quiet = _mm256_or_si256(b, _mm256_set1_epi32(BF16_QUIET as i32));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }
}

/// `f(x, y)` on one lane group, computed in `f32` and rounded once.
#[inline(always)]
fn half_group<H: HalfFloat, I: Isa>(
    x: &[H; HALF_LANES],
    y: &[H; HALF_LANES],
    f: impl Fn(f32, f32) -> f32,
) -> [H; HALF_LANES] {
    let (mut x, y) = (H::widen::<I>(x), H::widen::<I>(y));
    for (x, y) in x.iter_mut().zip(y) {
        *x = f(*x, y);
    }
    H::narrow::<I>(&x)
}

/// `dst[k] = f(x(k, dst[k]), y(k, dst[k]))` over whole lane groups.
#[inline(always)]
fn half_groups<H: HalfFloat, I: Isa>(
    dst: &mut [[H; HALF_LANES]],
    x: impl Fn(usize, [H; HALF_LANES]) -> [H; HALF_LANES],
    y: impl Fn(usize, [H; HALF_LANES]) -> [H; HALF_LANES],
    f: impl Fn(f32, f32) -> f32 + Copy,
) {
    for (k, d) in dst.iter_mut().enumerate() {
        *d = half_group::<H, I>(&x(k, *d), &y(k, *d), f);
    }
}

/// `dst[i] = f(x[i], y[i])` over `f16`/`bf16` operands, through `f32` lane groups; an operand
/// that is `dst` itself (in place) is `None`.
#[inline(always)]
fn run_half<H: HalfFloat, I: Isa>(ops: Operands<'_, H>, f: impl Fn(f32, f32) -> f32 + Copy) {
    let (dst, x, y) = match ops {
        Operands::Three { dst, a, b } => (dst, Some(a), Some(b)),
        Operands::Left { dst, src } => (dst, None, Some(src)),
        Operands::Right { dst, src } => (dst, Some(src), None),
        Operands::Same { dst } => (dst, None, None),
    };
    let (xs, ys) = (x.map(<[H]>::as_chunks), y.map(<[H]>::as_chunks));
    let (full, tail) = dst.as_chunks_mut::<HALF_LANES>();
    // One loop per aliasing shape, so none tests per group where its operands come from.
    let n = full.len();
    match (xs.map(|(g, _)| &g[..n]), ys.map(|(g, _)| &g[..n])) {
        (Some(x), Some(y)) => half_groups::<H, I>(full, |k, _| x[k], |k, _| y[k], f),
        (None, Some(y)) => half_groups::<H, I>(full, |_, d| d, |k, _| y[k], f),
        (Some(x), None) => half_groups::<H, I>(full, |k, _| x[k], |_, d| d, f),
        (None, None) => half_groups::<H, I>(full, |_, d| d, |_, d| d, f),
    }
    if !tail.is_empty() {
        // The last, partial group, zero-padded.
        let pad = |s: &[H]| {
            let mut v = [H::ZERO; HALF_LANES];
            v[..s.len()].copy_from_slice(s);
            v
        };
        let x = pad(xs.map_or(tail, |(_, t)| t));
        let y = pad(ys.map_or(tail, |(_, t)| t));
        let out = half_group::<H, I>(&x, &y, f);
        tail.copy_from_slice(&out[..tail.len()]);
    }
}

/// The instruction set a [`Job`] is compiled for (see [`dispatch`]).
trait Isa {
    /// Whether AVX2 and F16C intrinsics may be used.
    const AVX2: bool;
    /// Whether AVX-512 BF16 (with VL, BW and DQ) intrinsics may be used too.
    const BF16: bool = false;
}

/// The target's baseline (SSE2 on x86-64).
struct Baseline;
impl Isa for Baseline {
    const AVX2: bool = false;
}

/// AVX2 and F16C (every CPU with AVX2 so far also has F16C; both are checked).
#[cfg(target_arch = "x86_64")]
struct Avx2;
#[cfg(target_arch = "x86_64")]
impl Isa for Avx2 {
    const AVX2: bool = true;
}

/// AVX2 and F16C plus AVX-512 BF16, VL, BW and DQ: only for `bf16` jobs ([`Job::BF16`]),
/// so that no other loop is recompiled for 512-bit vectors.
#[cfg(target_arch = "x86_64")]
struct Avx2Bf16;
#[cfg(target_arch = "x86_64")]
impl Isa for Avx2Bf16 {
    const AVX2: bool = true;
    const BF16: bool = true;
}

/// One monomorphized kernel invocation, runnable under different target features.
///
/// A trait rather than a closure because `run` must be `#[inline(always)]`: its body has to be
/// generated inside the AVX2 function of [`dispatch`], not called from it.
trait Job {
    /// Whether [`dispatch`] may take the AVX-512 BF16 variant ([`Avx2Bf16`]) for this job.
    const BF16: bool = false;
    fn run<I: Isa>(self);
}

/// `dst ⊕= …` on a natively computed type.
struct Native<'a, T, O>(Operands<'a, T>, PhantomData<O>);
impl<T: Arith, O: BinOp> Job for Native<'_, T, O> {
    #[inline(always)]
    fn run<I: Isa>(self) {
        run_kernel::<T, O>(self.0)
    }
}

/// `dst = f(x, y)` on `f16`/`bf16`, through `f32`: a reduction, or `Avg`'s division.
struct Half<'a, H, F>(Operands<'a, H>, F);
impl<H: HalfFloat, F: Fn(f32, f32) -> f32 + Copy> Job for Half<'_, H, F> {
    const BF16: bool = H::BF16;
    #[inline(always)]
    fn run<I: Isa>(self) {
        run_half::<H, I>(self.0, self.1)
    }
}

/// `dst[i] /= n` for `f32`/`f64`.
struct DivFloat<'a, T>(&'a mut [T], T);
impl<T: Copy + std::ops::DivAssign> Job for DivFloat<'_, T> {
    #[inline(always)]
    fn run<I: Isa>(self) {
        let n = self.1;
        self.0.iter_mut().for_each(|x| *x /= n);
    }
}

/// Whether [`dispatch`] takes the AVX2 variant (tests can force the baseline per thread).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn use_avx2() -> bool {
    #[cfg(test)]
    if tests::LEVEL.get() == tests::Level::Baseline {
        return false;
    }
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether [`dispatch`] takes the AVX-512 BF16 variant for `bf16` jobs (tests can force a
/// lower one).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn use_bf16() -> bool {
    #[cfg(test)]
    if tests::LEVEL.get() != tests::Level::Best {
        return false;
    }
    use std::arch::is_x86_feature_detected as has;
    use_avx2()
        && has!("avx512f")
        && has!("avx512vl")
        && has!("avx512bw")
        && has!("avx512dq")
        && has!("avx512bf16")
}

/// Runs `job`, compiled with AVX2 and F16C enabled when the CPU has them (x86-64), else as
/// compiled (SSE2 baseline); a `bf16` job (`J::BF16`) with AVX-512 BF16 too where the CPU has
/// it, whose `vcvtne2ps2bf16` rounds sixteen lanes in one instruction.
#[inline(always)]
fn dispatch<J: Job>(job: J) {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support every feature enabled here ([`use_bf16`]).
        #[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
        unsafe fn with_bf16<J: Job>(job: J) {
            job.run::<Avx2Bf16>()
        }
        if J::BF16 && use_bf16() {
            // SAFETY: `use_bf16` detected every feature `with_bf16` enables.
            unsafe { with_bf16(job) };
            return;
        }
        /// # Safety
        /// The CPU must support AVX2 and F16C.
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn with_avx2<J: Job>(job: J) {
            job.run::<Avx2>()
        }
        if use_avx2() {
            // SAFETY: the CPU supports AVX2 and F16C, which is all `with_avx2` requires.
            unsafe { with_avx2(job) };
            return;
        }
    }
    job.run::<Baseline>()
}

// ---------------------------------------------------------------------------------------------
// Per-type plumbing
// ---------------------------------------------------------------------------------------------

/// An element type [`reduce`] and [`finish_avg`] handle.
trait Reducible: Copy {
    fn reduce(op: ReduceOp, ops: Operands<'_, Self>);
    fn finish_avg(dst: &mut [Self], n: usize);
}

macro_rules! int_reducible {
    ($($t:ty => $wide:ty),*) => {$(
        impl Reducible for $t {
            fn reduce(op: ReduceOp, ops: Operands<'_, Self>) {
                with_op!(op, O => dispatch(Native::<$t, O>(ops, PhantomData)))
            }
            fn finish_avg(dst: &mut [Self], n: usize) {
                // Divide in a type that holds both every value and `n`, so the quotient is exact
                // truncation (`|x / n| <= |x|`, so it fits back in `$t`).
                match <$t>::try_from(n) {
                    // Common case: `n` fits the element type itself.
                    Ok(n) => dst.iter_mut().for_each(|x| *x /= n),
                    Err(_) => {
                        let n = <$wide>::try_from(n).unwrap_or(<$wide>::MAX);
                        dst.iter_mut().for_each(|x| *x = (<$wide>::from(*x) / n) as $t);
                    }
                }
            }
        }
    )*};
}
int_reducible!(i8 => i128, u8 => u128, i32 => i128, u32 => u128, i64 => i128, u64 => u128);

macro_rules! float_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            fn reduce(op: ReduceOp, ops: Operands<'_, Self>) {
                with_op!(op, O => dispatch(Native::<$t, O>(ops, PhantomData)))
            }
            fn finish_avg(dst: &mut [Self], n: usize) {
                dispatch(DivFloat(dst, n as $t));
            }
        }
    )*};
}
float_reducible!(f32, f64);

macro_rules! half_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            fn reduce(op: ReduceOp, ops: Operands<'_, Self>) {
                with_op!(op, O => dispatch(Half(ops, O::apply::<f32>)))
            }
            fn finish_avg(dst: &mut [Self], n: usize) {
                let n = n as f32;
                dispatch(Half(Operands::Same { dst }, move |x: f32, _| x / n));
            }
        }
    )*};
}
half_reducible!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Debug;

    /// The best variant `dispatch` may take on this thread, so that every
    /// variant the CPU has gets tested.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Level {
        /// Whatever the CPU allows.
        Best,
        /// At most AVX2 and F16C.
        Avx2,
        /// The baseline.
        Baseline,
    }

    impl Level {
        const ALL: [Level; 3] = [Level::Best, Level::Avx2, Level::Baseline];
    }

    thread_local! {
        pub(super) static LEVEL: std::cell::Cell<Level> = const { std::cell::Cell::new(Level::Best) };
    }

    /// Runs `f` once per [`Level`], that level set while it runs.
    fn at_every_level(mut f: impl FnMut(Level)) {
        for level in Level::ALL {
            LEVEL.set(level);
            f(level);
        }
        LEVEL.set(Level::Best);
    }

    /// Up to several of `reduce_streaming`'s blocks for every element size.
    const COUNTS: [usize; 6] = [0, 1, 7, 1021, 4099, 2 * OUT_BLOCK + 3];
    const AVG_N: usize = 3;

    /// Test-side view of an element type: data generation and a scalar reference.
    trait TestElem: Element + Debug {
        fn sample(rng: &mut u64) -> Self;
        fn reference(op: ReduceOp, a: Self, b: Self) -> Self;
        fn reference_avg(x: Self, n: usize) -> Self;
        /// Exact equality, except that any NaN equals any NaN (payloads are unspecified).
        fn same(self, o: Self) -> bool;
    }

    fn next(rng: &mut u64) -> u64 {
        // splitmix64
        *rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Mostly finite values in [-100, 100), one in eight a special value (±0, ±1, ±inf, NaN).
    fn gen_f64(rng: &mut u64) -> f64 {
        const SPECIAL: [f64; 7] = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let r = next(rng);
        if r & 7 == 0 {
            SPECIAL[(r >> 8) as usize % SPECIAL.len()]
        } else {
            ((r >> 11) as f64 / (1u64 << 53) as f64) * 200.0 - 100.0
        }
    }

    macro_rules! int_test_elem {
        ($($t:ty),*) => {$(
            impl TestElem for $t {
                fn sample(rng: &mut u64) -> Self { next(rng) as $t }
                fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Max => if a > b { a } else { b },
                        ReduceOp::Min => if a < b { a } else { b },
                    }
                }
                fn reference_avg(x: Self, n: usize) -> Self { (x as i128 / n as i128) as $t }
                fn same(self, o: Self) -> bool { self == o }
            }
        )*};
    }
    int_test_elem!(i8, u8, i32, u32, i64, u64);

    macro_rules! float_test_elem {
        ($($t:ty),*) => {$(
            impl TestElem for $t {
                fn sample(rng: &mut u64) -> Self { gen_f64(rng) as $t }
                fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + b,
                        ReduceOp::Prod => a * b,
                        ReduceOp::Max => if b > a { b } else { a },
                        ReduceOp::Min => if b < a { b } else { a },
                    }
                }
                fn reference_avg(x: Self, n: usize) -> Self { x / n as $t }
                fn same(self, o: Self) -> bool {
                    (self.is_nan() && o.is_nan()) || self.to_bits() == o.to_bits()
                }
            }
        )*};
    }
    float_test_elem!(f32, f64);

    macro_rules! half_test_elem {
        ($($t:ty),*) => {$(
            impl TestElem for $t {
                fn sample(rng: &mut u64) -> Self { <$t>::from_f64(gen_f64(rng)) }
                fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                    <$t>::from_f32(<f32 as TestElem>::reference(op, a.to_f32(), b.to_f32()))
                }
                fn reference_avg(x: Self, n: usize) -> Self {
                    <$t>::from_f32(x.to_f32() / n as f32)
                }
                fn same(self, o: Self) -> bool {
                    (self.is_nan() && o.is_nan()) || self.to_bits() == o.to_bits()
                }
            }
        )*};
    }
    half_test_elem!(f16, bf16);

    fn gen_vec<T: TestElem>(rng: &mut u64, n: usize) -> Vec<T> {
        (0..n).map(|_| T::sample(rng)).collect()
    }

    fn assert_same<T: TestElem>(what: &str, got: &[T], want: &[T]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(g.same(*w), "{what}: element {i}: got {g:?}, want {w:?}");
        }
    }

    /// How the operands of one `reduce` call alias.
    #[derive(Clone, Copy, Debug)]
    enum Shape {
        /// dst, a, b all distinct.
        Three,
        /// dst == a.
        Left,
        /// dst == b.
        Right,
        /// a == b, dst distinct.
        SameInputs,
        /// dst == a == b.
        AllSame,
    }
    const SHAPES: [Shape; 5] = [
        Shape::Three,
        Shape::Left,
        Shape::Right,
        Shape::SameInputs,
        Shape::AllSame,
    ];

    /// A reduction entry point: [`reduce`], [`reduce_out`] or [`reduce_streaming`].
    type Kernel = unsafe fn(DataType, ReduceOp, *mut u8, *const u8, *const u8, usize);

    /// The entry points and whether each takes operands that alias the destination.
    const KERNELS: [(&str, Kernel, bool); 4] = [
        ("reduce", reduce, true),
        ("reduce_out", reduce_out, true),
        ("reduce_streaming", reduce_streaming, false),
        ("reduce_tee", reduce_tee_checked, true),
    ];

    /// [`reduce_tee`] with its copy in a buffer of its own, which must then hold exactly what
    /// it left in `dst` (stored as an output; at these counts plainly, in one block or several).
    ///
    /// # Safety
    /// As [`reduce`].
    unsafe fn reduce_tee_checked(
        dtype: DataType,
        op: ReduceOp,
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        count: usize,
    ) {
        let n = count * dtype.size();
        let mut copy = vec![0xA5u8; n + 1];
        // SAFETY: the caller's ranges; `copy` holds `n` bytes of its own.
        let result = unsafe {
            let to = (copy.as_mut_ptr(), crate::task::CopyTo::Output);
            reduce_tee(dtype, op, dst, to, a, b, count);
            std::slice::from_raw_parts(dst, n)
        };
        assert!(
            copy[..n] == *result,
            "reduce_tee's copy of {count} {dtype:?}"
        );
        assert_eq!(copy[n], 0xA5, "reduce_tee wrote past its copy");
    }

    /// `reduce_tee` copying its result onto an operand (in place: each block of the operand
    /// is read before it is overwritten) leaves the reduction there.
    #[test]
    fn reduce_tee_onto_an_operand() {
        let count = crate::copy::TEE_BLOCK / 4 * 3 + 5;
        let a0: Vec<f32> = (0..count).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..count).map(|i| (2 * i) as f32).collect();
        let (mut a, mut staged) = (a0.clone(), vec![0f32; count]);
        let to = (a.as_mut_ptr().cast(), crate::task::CopyTo::Local);
        // SAFETY: three vectors of `count` elements; the copy goes onto `a`, an operand.
        unsafe {
            let (s, bp) = (staged.as_mut_ptr().cast(), b.as_ptr().cast());
            reduce_tee(DataType::F32, ReduceOp::Sum, s, to, to.0, bp, count);
        }
        let want: Vec<f32> = (0..count).map(|i| (3 * i) as f32).collect();
        assert_eq!((a, staged), (want.clone(), want));
    }

    /// Runs `kernel` (and `finish_avg` for `Avg`) in `shape` at element offset `off` (to start
    /// the slices off vector alignment) and compares every element with the scalar reference.
    fn check_one<T: TestElem>(
        rng: &mut u64,
        (name, kernel): (&str, Kernel),
        op: ReduceOp,
        count: usize,
        (shape, off): (Shape, usize),
    ) {
        let a0: Vec<T> = gen_vec(rng, count + off);
        let b0: Vec<T> = match shape {
            Shape::SameInputs | Shape::AllSame => a0.clone(),
            _ => gen_vec(rng, count + off),
        };
        let mut want: Vec<T> = a0[off..]
            .iter()
            .zip(&b0[off..])
            .map(|(&a, &b)| T::reference(op, a, b))
            .collect();
        let what = format!(
            "{name}: {:?} {op:?} count={count} {shape:?} off={off}",
            T::DTYPE
        );
        let (mut a, mut b) = (a0.clone(), b0.clone());
        // Sentinel-filled output, one element longer, to catch writes past `count`.
        let mut out: Vec<T> = gen_vec(rng, count + off + 1);
        let out0 = out.clone();
        let (ap, bp) = (a[off..].as_mut_ptr(), b[off..].as_mut_ptr());
        let op_ptr = out[off..].as_mut_ptr();
        // SAFETY: every pointer covers `count` elements of its live vector, aligned for `T`;
        // `dst` either equals an input exactly (not for `reduce_streaming`) or lies in a vector
        // of its own.
        unsafe {
            let (d, x, y) = match shape {
                Shape::Three => (op_ptr, ap, bp),
                Shape::Left => (ap, ap, bp),
                Shape::Right => (bp, ap, bp),
                Shape::SameInputs => (op_ptr, ap, ap),
                Shape::AllSame => (ap, ap, ap),
            };
            kernel(T::DTYPE, op, d.cast(), x.cast(), y.cast(), count);
            if op == ReduceOp::Avg {
                finish_avg(T::DTYPE, d.cast(), count, AVG_N);
            }
        }
        if op == ReduceOp::Avg {
            want.iter_mut()
                .for_each(|x| *x = T::reference_avg(*x, AVG_N));
        }
        let (got, untouched_a, untouched_b): (&[T], bool, bool) = match shape {
            Shape::Three | Shape::SameInputs => (&out[off..off + count], true, true),
            Shape::Left | Shape::AllSame => (&a[off..], false, true),
            Shape::Right => (&b[off..], true, false),
        };
        assert_same(&what, got, &want);
        if untouched_a {
            assert_same(&format!("{what} (a unchanged)"), &a, &a0);
        }
        if untouched_b {
            assert_same(&format!("{what} (b unchanged)"), &b, &b0);
        }
        if matches!(shape, Shape::Three | Shape::SameInputs) {
            assert_same(&format!("{what} (out prefix)"), &out[..off], &out0[..off]);
            assert_same(
                &format!("{what} (out suffix)"),
                &out[off + count..],
                &out0[off + count..],
            );
        } else {
            assert_same(&format!("{what} (out untouched)"), &out, &out0);
        }
        // Prefix of the in-place buffer untouched too.
        assert_same(&format!("{what} (a prefix)"), &a[..off], &a0[..off]);
        assert_same(&format!("{what} (b prefix)"), &b[..off], &b0[..off]);
    }

    /// Every op × count × shape × offset, through the kernels of every variant (as far as the
    /// CPU has them).
    fn check_all<T: TestElem>() {
        at_every_level(|_| check_all_once::<T>());
    }

    fn check_all_once<T: TestElem>() {
        let mut rng = 0x1234_5678 ^ T::DTYPE as u64;
        for (name, kernel, aliasing) in KERNELS {
            for op in ReduceOp::ALL {
                for count in COUNTS {
                    for shape in SHAPES {
                        if !aliasing && !matches!(shape, Shape::Three | Shape::SameInputs) {
                            continue;
                        }
                        for off in [0, 1] {
                            check_one::<T>(&mut rng, (name, kernel), op, count, (shape, off));
                        }
                    }
                }
            }
        }
    }

    macro_rules! per_dtype {
        ($($name:ident: $t:ty),*) => {$(
            #[test]
            fn $name() { check_all::<$t>(); }
        )*};
    }
    per_dtype!(all_ops_i8: i8, all_ops_u8: u8, all_ops_i32: i32, all_ops_u32: u32,
               all_ops_i64: i64, all_ops_u64: u64, all_ops_f16: f16, all_ops_f32: f32,
               all_ops_f64: f64, all_ops_bf16: bf16);

    /// `reduce_out` of timed sizes is exact with whichever kind it picks (its first calls try
    /// both: plain stores, then streaming ones, not measured yet).
    #[test]
    fn reduce_out_of_timed_sizes_is_exact() {
        let mut rng = 7;
        let count = StoreChoice::MIN_BYTES / 4 * 3 + 5;
        for _ in 0..4 {
            let kernel: (&str, Kernel) = ("reduce_out", reduce_out);
            check_one::<f32>(&mut rng, kernel, ReduceOp::Sum, count, (Shape::Three, 1));
        }
    }

    /// The documented float `Max`/`Min` semantics, identical for every float type and for both
    /// in-place directions: NaN in `a` wins, NaN in `b` is ignored, equal zeros return `a`.
    #[test]
    fn float_max_min_nan_and_zero_semantics() {
        fn case<T: TestElem + Copy>(from: fn(f32) -> T) {
            let nan = from(f32::NAN);
            let (one, pz, nz) = (from(1.0), from(0.0), from(-0.0));
            // (a, b, max, min)
            let table = [
                (nan, one, nan, nan),
                (one, nan, one, one),
                (nz, pz, nz, nz),
                (pz, nz, pz, pz),
                (one, from(2.0), from(2.0), one),
            ];
            // Repeat each case so the vector loop (not just a scalar tail) handles it.
            let a: Vec<T> = table.iter().flat_map(|c| [c.0; 64]).collect();
            let b: Vec<T> = table.iter().flat_map(|c| [c.1; 64]).collect();
            for (op, pick) in [(ReduceOp::Max, 2), (ReduceOp::Min, 3)] {
                let want: Vec<T> = table
                    .iter()
                    .flat_map(|c| [if pick == 2 { c.2 } else { c.3 }; 64])
                    .collect();
                let mut out = a.clone();
                reduce_into(op, &mut out, &a, &b);
                assert_same(&format!("{:?} {op:?} 3-operand", T::DTYPE), &out, &want);
                let mut left = a.clone();
                reduce_slice(op, &mut left, &b);
                assert_same(&format!("{:?} {op:?} dst==a", T::DTYPE), &left, &want);
                let mut right = b.clone();
                // SAFETY: `right` and `a` are live, equally long vectors of `T`; dst == b.
                unsafe {
                    let r = right.as_mut_ptr().cast::<u8>();
                    reduce(T::DTYPE, op, r, a.as_ptr().cast(), r, a.len());
                }
                assert_same(&format!("{:?} {op:?} dst==b", T::DTYPE), &right, &want);
            }
        }
        at_every_level(|_| {
            case::<f32>(|x| x);
            case::<f64>(f64::from);
            case::<f16>(f16::from_f32);
            case::<bf16>(bf16::from_f32);
        });
    }

    /// Narrows `f` and widens the result back through `H`'s lane conversions, in the variant
    /// [`dispatch`] picks (so `LEVEL` selects a lower one), each element through the
    /// lane the variant keeps it in.
    struct RoundTrip<'a, H>(&'a [f32], &'a mut Vec<H>, &'a mut Vec<f32>);
    impl<H: HalfFloat> Job for RoundTrip<'_, H> {
        const BF16: bool = H::BF16;
        fn run<I: Isa>(self) {
            for chunk in self.0.chunks(HALF_LANES) {
                let mut lanes = [0f32; HALF_LANES];
                for (k, &x) in chunk.iter().enumerate() {
                    lanes[H::lane::<I>(k)] = x;
                }
                let h = H::narrow::<I>(&lanes);
                self.1.extend_from_slice(&h[..chunk.len()]);
                let back = H::widen::<I>(&h);
                self.2
                    .extend((0..chunk.len()).map(|k| back[H::lane::<I>(k)]));
            }
        }
    }

    /// The lane conversions of both variants against `half`'s scalar ones: narrowing over a
    /// sweep of every f32 bit pattern class (ties, carries into the exponent, overflow to
    /// infinity, subnormal results, NaNs), widening over every 16-bit pattern.
    fn lane_conversion_matches_half<H: HalfFloat + TestElem>(
        to_f32: fn(H) -> f32,
        from_f32: fn(f32) -> H,
        from_bits: fn(u16) -> H,
        extra: &[u32],
    ) {
        let bits = (0..=u32::MAX).step_by(977).chain(extra.iter().copied());
        let f: Vec<f32> = bits.map(f32::from_bits).collect();
        let every: Vec<f32> = (0..=u16::MAX).map(|b| to_f32(from_bits(b))).collect();
        at_every_level(|level| {
            let (mut narrowed, mut widened) = (Vec::new(), Vec::new());
            dispatch(RoundTrip::<H>(&f, &mut narrowed, &mut widened));
            let want: Vec<H> = f.iter().map(|&x| from_f32(x)).collect();
            assert_same(&format!("narrow, {level:?}"), &narrowed, &want);
            let want_back: Vec<f32> = narrowed.iter().map(|&x| to_f32(x)).collect();
            assert_same(&format!("widen, {level:?}"), &widened, &want_back);
            // Every half value is exact in f32: narrowing it back must give the same bits,
            // and widening those bits the same f32 again.
            let (mut again, mut back) = (Vec::new(), Vec::new());
            dispatch(RoundTrip::<H>(&every, &mut again, &mut back));
            let all: Vec<H> = (0..=u16::MAX).map(from_bits).collect();
            assert_same(&format!("every pattern, {level:?}"), &again, &all);
            assert_same(&format!("every value, {level:?}"), &back, &every);
        });
    }

    #[test]
    fn bf16_lane_conversion_matches_half() {
        let extra = [
            0x7f7f_ffff,
            0x7f7f_8000,
            0x3f80_8000,
            0x3f81_8000,
            0x7f80_0001,
            0xff80_0001,
        ];
        lane_conversion_matches_half::<bf16>(bf16::to_f32, bf16::from_f32, bf16::from_bits, &extra);
    }

    #[test]
    fn f16_lane_conversion_matches_half() {
        // 65504 (max), 65519.996 and 65520 (round down / to infinity), 2^-24 and half of it
        // (smallest subnormal, a tie to zero), 1 + 2^-11 (a tie to even), a signalling NaN.
        let extra = [
            0x477f_e000,
            0x477f_efff,
            0x477f_f000,
            0x3380_0000,
            0x3300_0000,
            0x3f80_1000,
            0x7f80_0001,
        ];
        lane_conversion_matches_half::<f16>(f16::to_f32, f16::from_f32, f16::from_bits, &extra);
    }

    #[test]
    fn finish_avg_integers_truncate_toward_zero_for_any_n() {
        let mut v: Vec<i8> = vec![-128, -7, -1, 0, 1, 7, 127];
        finish_avg_slice(&mut v, 2);
        assert_eq!(v, [-64, -3, 0, 0, 0, 3, 63]);
        // n larger than the element type: exact division, not a wrapped divisor.
        let mut v: Vec<i8> = vec![-128, -127, 127];
        finish_avg_slice(&mut v, 128);
        assert_eq!(v, [-1, 0, 0]);
        let mut v: Vec<u8> = vec![255, 200];
        finish_avg_slice(&mut v, 300);
        assert_eq!(v, [0, 0]);
        let mut v: Vec<u64> = vec![u64::MAX];
        finish_avg_slice(&mut v, 3);
        assert_eq!(v, [u64::MAX / 3]);
    }

    #[test]
    fn finish_avg_halves_divide_by_exact_count() {
        // 257 is not representable in bf16; the divisor must not be rounded to the type first.
        // (Rounding it to 256 first would give exactly 4.0.)
        let mut v = vec![bf16::from_f32(1024.0)];
        finish_avg_slice(&mut v, 257);
        assert_eq!(v[0], bf16::from_f32(1024.0 / 257.0));
        assert_ne!(v[0], bf16::from_f32(4.0));
        let mut v = vec![f16::from_f32(6.0); 300];
        finish_avg_slice(&mut v, 4);
        assert!(v.iter().all(|&x| x == f16::from_f32(1.5)));
    }

    #[test]
    #[should_panic(expected = "rank count must be positive")]
    fn finish_avg_rejects_zero_ranks() {
        finish_avg_slice(&mut [1i32, 2], 0);
    }

    #[test]
    #[should_panic(expected = "length mismatch")]
    fn reduce_slice_rejects_length_mismatch() {
        reduce_slice(ReduceOp::Sum, &mut [1i32, 2], &[1]);
    }

    proptest! {
        #[test]
        fn prop_f32_matches_reference(
            data in prop::collection::vec((any::<f32>(), any::<f32>()), 0..2000),
            op_idx in 0usize..5,
        ) {
            let op = ReduceOp::ALL[op_idx];
            let (a, b): (Vec<f32>, Vec<f32>) = data.into_iter().unzip();
            let want: Vec<f32> = a.iter().zip(&b).map(|(&x, &y)| f32::reference(op, x, y)).collect();
            let mut out = vec![0f32; a.len()];
            reduce_into(op, &mut out, &a, &b);
            let mut inplace = a.clone();
            reduce_slice(op, &mut inplace, &b);
            for i in 0..a.len() {
                prop_assert!(out[i].same(want[i]), "3-operand {:?} [{}]: {} vs {}", op, i, out[i], want[i]);
                prop_assert!(inplace[i].same(want[i]), "in place {:?} [{}]: {} vs {}", op, i, inplace[i], want[i]);
            }
        }

        #[test]
        fn prop_i32_matches_reference(
            data in prop::collection::vec((any::<i32>(), any::<i32>()), 0..2000),
            op_idx in 0usize..5,
            n in 1usize..64,
        ) {
            let op = ReduceOp::ALL[op_idx];
            let (a, b): (Vec<i32>, Vec<i32>) = data.into_iter().unzip();
            let mut want: Vec<i32> =
                a.iter().zip(&b).map(|(&x, &y)| i32::reference(op, x, y)).collect();
            let mut out = vec![0i32; a.len()];
            reduce_into(op, &mut out, &a, &b);
            let mut inplace = a.clone();
            reduce_slice(op, &mut inplace, &b);
            if op == ReduceOp::Avg {
                finish_avg_slice(&mut out, n);
                finish_avg_slice(&mut inplace, n);
                want.iter_mut().for_each(|x| *x = i32::reference_avg(*x, n));
            }
            prop_assert_eq!(&out, &want);
            prop_assert_eq!(&inplace, &want);
        }
    }
}
