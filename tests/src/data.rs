//! Deterministic test data: every rank can compute every rank's input from `(rank, index,
//! dtype, op)`, and so the expected result of any collective, locally.
//!
//! * Integers: arbitrary bit patterns; `Sum`/`Prod` wrap exactly like the library's kernels
//!   (two's complement), and wrapping add/mul, min and max are associative and commutative, so
//!   the reference is exact whatever order the algorithm reduces in. `Avg` is the wrapped sum
//!   divided with truncation toward zero.
//! * Floats: small integers (`-20..=40`), so every partial sum of up to 4 ranks is exact even in
//!   `bf16`; for `Prod`, mostly 1 with sparse 2 and -1, so products stay exact; `Avg` is the
//!   exact sum divided once (in `f32` for `f16`/`bf16`), compared within about one ulp.

use std::fmt::Debug;

use ampccl::{Element, ReduceOp, bf16, f16};

/// splitmix64 of the inputs.
pub fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(c.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An element type the tests know how to generate, reduce and compare.
pub trait TestElem: Element + Debug + PartialEq {
    const NAME: &'static str;
    /// Value of element `i` of `rank`'s input (`salt` separates buffers of one scenario).
    fn value(rank: usize, i: usize, op: ReduceOp, salt: u64) -> Self;
    /// `a op b` as the library computes it (`Avg` combines as `Sum`).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// The final division of `Avg`.
    fn avg(sum: Self, n: usize) -> Self;
    /// Whether `got` is acceptable for `want` (exact, except `Avg` of floats: ~1 ulp).
    fn matches(op: ReduceOp, got: Self, want: Self) -> bool;
    /// A value that no generator produces, to fill buffers whose contents must be overwritten.
    fn poison() -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            const NAME: &'static str = stringify!($t);
            fn value(rank: usize, i: usize, op: ReduceOp, salt: u64) -> Self {
                mix(rank as u64, i as u64, salt ^ ((op as u64) << 40)) as $t
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
            fn avg(sum: Self, n: usize) -> Self {
                (sum as i128 / n as i128) as $t
            }
            fn matches(_: ReduceOp, got: Self, want: Self) -> bool {
                got == want
            }
            fn poison() -> Self {
                // Any pattern is a possible integer; the checks compare against the reference
                // anyway, so a fixed unlikely value is enough.
                0x5a as $t
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

fn small_float(rank: usize, i: usize, op: ReduceOp, salt: u64) -> f32 {
    let h = mix(rank as u64, i as u64, salt ^ ((op as u64) << 40));
    if op == ReduceOp::Prod {
        match h % 16 {
            0 | 1 => 2.0,
            2 => -1.0,
            _ => 1.0,
        }
    } else {
        (h % 61) as f32 - 20.0
    }
}

macro_rules! float_elem {
    ($t:ty, $eps:expr, $from:expr, $to:expr) => {
        impl TestElem for $t {
            const NAME: &'static str = stringify!($t);
            fn value(rank: usize, i: usize, op: ReduceOp, salt: u64) -> Self {
                $from(small_float(rank, i, op, salt))
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = ($to(a), $to(b));
                $from(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Max => {
                        if y > x {
                            y
                        } else {
                            x
                        }
                    }
                    ReduceOp::Min => {
                        if y < x {
                            y
                        } else {
                            x
                        }
                    }
                })
            }
            fn avg(sum: Self, n: usize) -> Self {
                $from($to(sum) / n as f32)
            }
            fn matches(op: ReduceOp, got: Self, want: Self) -> bool {
                let (g, w) = ($to(got) as f64, $to(want) as f64);
                if op == ReduceOp::Avg {
                    (g - w).abs() <= $eps * w.abs().max(f64::MIN_POSITIVE)
                } else {
                    g == w
                }
            }
            fn poison() -> Self {
                $from(1234.5)
            }
        }
    };
}
float_elem!(f32, 1.2e-7, |x: f32| x, |x: f32| x);
float_elem!(f16, 9.8e-4, f16::from_f32, f16::to_f32);
float_elem!(bf16, 7.9e-3, bf16::from_f32, bf16::to_f32);

impl TestElem for f64 {
    const NAME: &'static str = "f64";
    fn value(rank: usize, i: usize, op: ReduceOp, salt: u64) -> Self {
        small_float(rank, i, op, salt) as f64
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Max => {
                if b > a {
                    b
                } else {
                    a
                }
            }
            ReduceOp::Min => {
                if b < a {
                    b
                } else {
                    a
                }
            }
        }
    }
    fn avg(sum: Self, n: usize) -> Self {
        sum / n as f64
    }
    fn matches(op: ReduceOp, got: Self, want: Self) -> bool {
        if op == ReduceOp::Avg {
            (got - want).abs() <= 2.3e-16 * want.abs().max(f64::MIN_POSITIVE)
        } else {
            got == want
        }
    }
    fn poison() -> Self {
        1234.5
    }
}

/// `rank`'s input of `len` elements.
pub fn input<T: TestElem>(rank: usize, len: usize, op: ReduceOp, salt: u64) -> Vec<T> {
    (0..len).map(|i| T::value(rank, i, op, salt)).collect()
}

/// `op` over the inputs of `world` ranks (rank order), `Avg` finished.
pub fn reduced<T: TestElem>(world: usize, len: usize, op: ReduceOp, salt: u64) -> Vec<T> {
    let mut acc = input::<T>(0, len, op, salt);
    for r in 1..world {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = T::combine(op, *a, T::value(r, i, op, salt));
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = T::avg(*a, world);
        }
    }
    acc
}

/// Compares `got` with `want` element-wise; the error names the first mismatches.
pub fn check<T: TestElem>(what: &str, op: ReduceOp, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: length {} instead of {}",
            got.len(),
            want.len()
        ));
    }
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| !T::matches(op, got[i], want[i]))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = bad
        .iter()
        .take(5)
        .map(|&i| format!("[{i}] got {:?} want {:?}", got[i], want[i]))
        .collect();
    Err(format!(
        "{what}: {} of {} elements wrong: {}",
        bad.len(),
        got.len(),
        shown.join(", ")
    ))
}
