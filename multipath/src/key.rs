//! [`OpKey`]: what the learned split is keyed by — the collective, its size bucket and dtype.
//!
//! Sizes are bucketed by `ceil(log2(total bytes))`, so calls of 33–64 MiB share one entry. The
//! key packs into a nonzero `u32` ([`OpKey::pack`]) for the shared-memory table.

use ampccl_runtime::DataType;

/// The collectives the multipath layer splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MpOp {
    AllReduce = 0,
    AllGather = 1,
    ReduceScatter = 2,
    Broadcast = 3,
    Reduce = 4,
}

impl MpOp {
    /// Every operation, in a fixed order.
    pub const ALL: [MpOp; 5] = [
        MpOp::AllReduce,
        MpOp::AllGather,
        MpOp::ReduceScatter,
        MpOp::Broadcast,
        MpOp::Reduce,
    ];

    /// Stable name (used in the parameter file and the report).
    pub const fn name(self) -> &'static str {
        match self {
            MpOp::AllReduce => "AllReduce",
            MpOp::AllGather => "AllGather",
            MpOp::ReduceScatter => "ReduceScatter",
            MpOp::Broadcast => "Broadcast",
            MpOp::Reduce => "Reduce",
        }
    }

    /// Inverse of [`MpOp::name`].
    pub fn parse(s: &str) -> Option<MpOp> {
        MpOp::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// Key of one learned parameter set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpKey {
    pub op: MpOp,
    /// `ceil(log2(total bytes))` (0 for 0 or 1 byte).
    pub bucket: u8,
    pub dtype: DataType,
}

impl OpKey {
    /// The key of a call moving `total_bytes` in all.
    pub fn new(op: MpOp, total_bytes: u64, dtype: DataType) -> OpKey {
        OpKey {
            op,
            bucket: size_bucket(total_bytes),
            dtype,
        }
    }

    /// Packs the key into a nonzero word (0 marks an empty table slot).
    pub fn pack(self) -> u32 {
        1 | (self.op as u32) << 1 | (self.dtype as u32) << 4 | u32::from(self.bucket) << 8
    }

    /// Inverse of [`OpKey::pack`]; `None` for a word no key packs to.
    pub fn unpack(w: u32) -> Option<OpKey> {
        if w & 1 == 0 || w >> 16 != 0 {
            return None;
        }
        let op = *MpOp::ALL.get(((w >> 1) & 7) as usize)?;
        let dtype = DataType::from_raw(((w >> 4) & 15) as i32)?;
        Some(OpKey {
            op,
            bucket: (w >> 8) as u8,
            dtype,
        })
    }

    /// Order used by reports and files: op, size, dtype.
    pub fn sort_key(&self) -> (MpOp, u8, i32) {
        (self.op, self.bucket, self.dtype as i32)
    }
}

/// `ceil(log2(bytes))`, 0 for 0 and 1.
pub fn size_bucket(bytes: u64) -> u8 {
    if bytes <= 1 {
        0
    } else {
        (64 - (bytes - 1).leading_zeros()) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ceil_log2() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 0);
        assert_eq!(size_bucket(2), 1);
        assert_eq!(size_bucket(3), 2);
        assert_eq!(size_bucket(1 << 20), 20);
        assert_eq!(size_bucket((1 << 20) + 1), 21);
        assert_eq!(size_bucket(u64::MAX), 64);
    }

    #[test]
    fn pack_round_trips_and_is_nonzero() {
        for op in MpOp::ALL {
            for dtype in DataType::ALL {
                for bucket in [0u8, 17, 64] {
                    let k = OpKey { op, bucket, dtype };
                    assert_ne!(k.pack(), 0);
                    assert_eq!(OpKey::unpack(k.pack()), Some(k));
                }
            }
        }
        assert_eq!(OpKey::unpack(0), None);
        assert_eq!(OpKey::unpack(1 | 7 << 1), None);
    }
}
