//! `f16` and `bf16`: reduced in `f32`, [`HALF_LANES`] elements at a time, widened exactly and
//! rounded once (see the module docs of [`crate::reduce`]).

use half::{bf16, f16};

use super::isa::{Isa, Job};
use super::kernels::Operands;

/// Elements of `f16`/`bf16` converted and reduced at a time: two AVX2 vectors of `f32`.
pub const HALF_LANES: usize = 16;

/// `f16`/`bf16` conversion to and from `f32`, [`HALF_LANES`] elements at a time (exact
/// widening, round-to-nearest-even narrowing, bit-identical to `half`'s scalar `to_f32` /
/// `from_f32`).
///
/// `widen` may arrange a group's elements in another order than memory's, the one that is
/// cheapest for the variant; `narrow` takes them in that order. Only element-wise functions
/// may be applied in between.
pub(super) trait HalfFloat: Copy {
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

    /// F16C's `vcvtph2ps` where [`super::isa::dispatch`] enabled it, else `half`'s conversion.
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

    /// F16C's `vcvtps2ph` (round to nearest even) where [`super::isa::dispatch`] enabled it, else `half`'s.
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

/// `dst = f(x, y)` on `f16`/`bf16`, through `f32`: a reduction, or `Avg`'s division.
pub(super) struct Half<'a, H, F>(pub(super) Operands<'a, H>, pub(super) F);
impl<H: HalfFloat, F: Fn(f32, f32) -> f32 + Copy> Job for Half<'_, H, F> {
    const BF16: bool = H::BF16;
    #[inline(always)]
    fn run<I: Isa>(self) {
        run_half::<H, I>(self.0, self.1)
    }
}
