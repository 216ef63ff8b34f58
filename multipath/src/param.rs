//! [`ParamValue`]: the learned split of one [`OpKey`]; [`ParamCache`]: a process-local table.
//!
//! `alpha` is the fraction of the bytes the fast path (the real NCCL) carries; `1.0` with
//! `use_pcie == false` is fast-only. Bandwidths are the controller's current estimates (GB/s,
//! i.e. bytes per ns), informational except to the controller that wrote them.

use std::collections::HashMap;

use super::key::OpKey;

/// The learned parameters of one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamValue {
    /// Fraction of the bytes on the fast (NCCL) path, `0..=1`; `1.0` is fast-only.
    pub alpha: f32,
    /// Whether the PCIe path takes part at all.
    pub use_pcie: bool,
    /// Fast-path bandwidth estimate, GB/s (0 when unknown).
    pub fast_bw: f32,
    /// PCIe-path bandwidth estimate, GB/s (0 when unknown).
    pub pcie_bw: f32,
    /// Calls that updated this entry.
    pub calls: u32,
}

impl ParamValue {
    /// Fast-only, nothing learned.
    pub const FAST_ONLY: ParamValue = ParamValue {
        alpha: 1.0,
        use_pcie: false,
        fast_bw: 0.0,
        pcie_bw: 0.0,
        calls: 0,
    };

    /// A split with the given fast-path fraction (clamped; `>= 1` means fast-only).
    pub fn split(alpha: f64) -> ParamValue {
        ParamValue::FAST_ONLY.with_alpha(alpha)
    }

    /// This value with `alpha` replaced (clamped to `0..=1`); `use_pcie` follows `alpha < 1`.
    pub fn with_alpha(self, alpha: f64) -> ParamValue {
        let a = if alpha.is_nan() {
            1.0
        } else {
            alpha.clamp(0.0, 1.0)
        };
        ParamValue {
            alpha: a as f32,
            use_pcie: a < 1.0,
            ..self
        }
    }

    /// The fraction actually used: 1 when the PCIe path is off.
    pub fn effective_alpha(&self) -> f64 {
        if self.use_pcie {
            f64::from(self.alpha)
        } else {
            1.0
        }
    }

    /// True when every field is in range (alpha in `0..=1`, finite non-negative bandwidths).
    pub fn is_valid(&self) -> bool {
        (0.0..=1.0).contains(&self.alpha)
            && self.fast_bw.is_finite()
            && self.fast_bw >= 0.0
            && self.pcie_bw.is_finite()
            && self.pcie_bw >= 0.0
    }
}

/// Process-local map of learned parameters.
#[derive(Clone, Debug, Default)]
pub struct ParamCache {
    map: HashMap<OpKey, ParamValue>,
}

impl ParamCache {
    pub fn new() -> ParamCache {
        ParamCache::default()
    }

    pub fn get(&self, key: &OpKey) -> Option<ParamValue> {
        self.map.get(key).copied()
    }

    pub fn insert(&mut self, key: OpKey, value: ParamValue) {
        self.map.insert(key, value);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries in report order (op, size, dtype).
    pub fn sorted(&self) -> Vec<(OpKey, ParamValue)> {
        let mut v: Vec<_> = self.map.iter().map(|(k, p)| (*k, *p)).collect();
        v.sort_by_key(|(k, _)| k.sort_key());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::MpOp;
    use ampccl_runtime::DataType;

    #[test]
    fn alpha_is_clamped_and_drives_use_pcie() {
        assert_eq!(ParamValue::split(1.5), ParamValue::FAST_ONLY);
        assert_eq!(ParamValue::split(f64::NAN), ParamValue::FAST_ONLY);
        let p = ParamValue::split(0.8);
        assert!(p.use_pcie && (p.effective_alpha() - 0.8).abs() < 1e-6);
        assert!(!ParamValue { alpha: -0.1, ..p }.is_valid());
    }

    #[test]
    fn cache_sorts_by_op_then_size() {
        let mut c = ParamCache::new();
        let k = |op, bucket| OpKey {
            op,
            bucket,
            dtype: DataType::F32,
        };
        c.insert(k(MpOp::AllGather, 20), ParamValue::FAST_ONLY);
        c.insert(k(MpOp::AllReduce, 26), ParamValue::split(0.9));
        c.insert(k(MpOp::AllReduce, 20), ParamValue::split(0.8));
        let order: Vec<_> = c
            .sorted()
            .into_iter()
            .map(|(k, _)| (k.op, k.bucket))
            .collect();
        assert_eq!(
            order,
            [
                (MpOp::AllReduce, 20),
                (MpOp::AllReduce, 26),
                (MpOp::AllGather, 20)
            ]
        );
    }
}
