//! Reduction kernels for every [`DataType`] × [`ReduceOp`].
//!
//! Written as plain element-wise loops over typed slices so the compiler vectorizes them.
//! `Avg` is reduced as `Sum`; [`finish_avg`] divides by the rank count afterwards (as NCCL).

use crate::dtype::{DataType, ReduceOp};
use half::{bf16, f16};

/// `dst[i] = a[i] ⊕ b[i]` for `i < count`, elements of type `dtype`.
///
/// # Safety
/// `a` and `b` must be valid for `count` reads, `dst` for `count` writes, all aligned to
/// `dtype.size()`. `dst` may be equal to `a` or `b` (in place) but must not otherwise overlap.
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
            // SAFETY: forwarded from the caller's contract.
            unsafe { reduce_typed::<$t>(op, dst.cast(), a.cast(), b.cast(), count) }
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

/// `dst[i] /= n` — the last step of `Avg` (integer types divide with truncation).
///
/// # Safety
/// `dst` must be valid for `count` reads and writes and aligned to `dtype.size()`.
pub unsafe fn finish_avg(dtype: DataType, dst: *mut u8, count: usize, n: usize) {
    macro_rules! go {
        ($t:ty) => {{
            // SAFETY: forwarded from the caller's contract.
            let d = unsafe { std::slice::from_raw_parts_mut(dst.cast::<$t>(), count) };
            let n = <$t as Arith>::from_count(n);
            for x in d {
                *x = x.div(n);
            }
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

/// Arithmetic every element type supports.
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn from_count(n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn div(self, o: Self) -> Self { self.wrapping_div(o) }
            #[inline(always)] fn from_count(n: usize) -> Self { n as Self }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
            #[inline(always)] fn div(self, o: Self) -> Self { self / o }
            #[inline(always)] fn from_count(n: usize) -> Self { n as Self }
        }
    )*};
}
float_arith!(f32, f64);

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline(always)] fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
            #[inline(always)] fn div(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() / o.to_f32()) }
            #[inline(always)] fn from_count(n: usize) -> Self { <$t>::from_f32(n as f32) }
        }
    )*};
}
half_arith!(f16, bf16);

/// # Safety
/// See [`reduce`].
unsafe fn reduce_typed<T: Arith>(
    op: ReduceOp,
    dst: *mut T,
    a: *const T,
    b: *const T,
    count: usize,
) {
    let f: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Avg => T::add,
        ReduceOp::Prod => T::mul,
        ReduceOp::Max => T::max,
        ReduceOp::Min => T::min,
    };
    for i in 0..count {
        // SAFETY: i < count and the caller guarantees validity for count elements; reads happen
        // before the write of the same index, so dst == a or dst == b is fine.
        unsafe { *dst.add(i) = f(*a.add(i), *b.add(i)) };
    }
}
