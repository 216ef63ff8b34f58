//! The natively computed element types (integers, `f32`, `f64`): operators as types, the
//! aliasing shapes of a reduction's operands, the monomorphized loops, and the per-type
//! plumbing that connects a [`DataType`](crate::DataType) to its loop.

use std::marker::PhantomData;

use half::{bf16, f16};

use super::half_float::Half;
use super::isa::{Isa, Job, dispatch};
use crate::dtype::ReduceOp;

/// Scalar arithmetic of the natively computed element types (integers, `f32`, `f64`).
pub(super) trait Arith: Copy {
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
pub(super) trait BinOp {
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

/// The three aliasing shapes [`super::reduce`] can be called with, as references.
pub(super) enum Operands<'a, T> {
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
/// See [`super::reduce`]; `T` must be the element type the caller's `dtype` names.
#[inline(always)]
pub(super) unsafe fn reduce_raw<T: Reducible>(
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
pub(super) fn run_kernel<T: Arith, O: BinOp>(ops: Operands<'_, T>) {
    match ops {
        Operands::Three { dst, a, b } => kernel3::<T, O>(dst, a, b),
        Operands::Left { dst, src } => kernel2::<T, O, false>(dst, src),
        Operands::Right { dst, src } => kernel2::<T, O, true>(dst, src),
        Operands::Same { dst } => kernel1::<T, O>(dst),
    }
}

/// `dst ⊕= …` on a natively computed type.
struct Native<'a, T, O>(Operands<'a, T>, PhantomData<O>);
impl<T: Arith, O: BinOp> Job for Native<'_, T, O> {
    #[inline(always)]
    fn run<I: Isa>(self) {
        run_kernel::<T, O>(self.0)
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

/// An element type [`super::reduce`] and [`super::finish_avg`] handle.
pub(super) trait Reducible: Copy {
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
