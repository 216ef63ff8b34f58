//! Every kernel against a scalar reference: all types, operators, aliasing shapes, lengths
//! and instruction-set variants.

use super::half_float::HalfFloat;
use super::isa::{Isa, Job, dispatch};
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
        let to = (copy.as_mut_ptr(), crate::copy::CopyTo::Output);
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
    let count = crate::copy::TEE_BLOCK.bytes() / 4 * 3 + 5;
    let a0: Vec<f32> = (0..count).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..count).map(|i| (2 * i) as f32).collect();
    let (mut a, mut staged) = (a0.clone(), vec![0f32; count]);
    let to = (a.as_mut_ptr().cast(), crate::copy::CopyTo::Local);
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
    let count = crate::copy::learner::MIN_BYTES.bytes() / 4 * 3 + 5;
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
