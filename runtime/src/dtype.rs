//! Element types and reduction operators, with NCCL's numeric values.
//!
//! The discriminants equal NCCL's `ncclDataType_t` and `ncclRedOp_t`, so the C ABI converts with
//! [`DataType::from_raw`] / [`ReduceOp::from_raw`] and nothing else.

use half::{bf16, f16};

/// Element type of a collective buffer (values as `ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(i32)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

impl DataType {
    /// Every data type, in NCCL's order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Converts an `ncclDataType_t` value.
    pub fn from_raw(v: i32) -> Option<DataType> {
        DataType::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Short name as nccl-tests prints it (`float`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// Parses [`DataType::name`] or the short Rust-style names (`f32`, `i8`, `bf16`, ...).
    pub fn parse(s: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| {
            d.name() == s
                || matches!(
                    (d, s),
                    (DataType::I8, "i8")
                        | (DataType::U8, "u8")
                        | (DataType::I32, "i32")
                        | (DataType::U32, "u32")
                        | (DataType::I64, "i64")
                        | (DataType::U64, "u64")
                        | (DataType::F16, "f16")
                        | (DataType::F32, "f32")
                        | (DataType::F64, "f64")
                        | (DataType::Bf16, "bf16")
                )
        })
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }
}

/// Reduction operator (values as `ncclRedOp_t`). `Avg` sums, then divides by the rank count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl ReduceOp {
    /// Every operator, in NCCL's order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// Converts an `ncclRedOp_t` value.
    pub fn from_raw(v: i32) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Name as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses [`ReduceOp::name`].
    pub fn parse(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// A Rust type that is one of the collective element types.
///
/// # Safety
/// Implementors must be plain-old-data with every bit pattern valid and `size_of::<Self>() ==
/// Self::DTYPE.size()`; the library reinterprets buffers of `Self` as bytes and back.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        // SAFETY: each type is POD, all bit patterns valid, and its size matches the data type.
        $(unsafe impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}
element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
         f16 => F16, f32 => F32, f64 => F64, bf16 => Bf16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_reject_unknown() {
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_raw(i as i32), Some(*d));
            assert_eq!(DataType::parse(d.name()), Some(*d));
        }
        assert_eq!(DataType::from_raw(10), None);
        assert_eq!(DataType::from_raw(-1), None);
        assert_eq!(ReduceOp::from_raw(4), Some(ReduceOp::Avg));
        assert_eq!(ReduceOp::from_raw(5), None);
        assert_eq!(DataType::parse("bf16"), Some(DataType::Bf16));
    }
}
