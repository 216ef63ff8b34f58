//! `static`: a fixed split (`AMPCCL_SPLIT_CONTROLLER=static:<alpha>`), the baseline the adaptive
//! controllers are measured against. Bandwidths are still recorded for the report.

use super::{Controller, ExecStat, observe_bw};
use crate::key::OpKey;
use crate::param::ParamValue;

/// Fast-path fraction of plain `static`: the share NCCL carries when both paths finish
/// together at the bandwidths measured for a 2-GPU allreduce (`docs/TUNING.md`).
pub const DEFAULT_ALPHA: f64 = 0.875;

/// Fixed-split controller.
#[derive(Debug)]
pub struct Static {
    alpha: f64,
}

impl Static {
    /// Always splits with fast-path fraction `alpha` (`1.0`: fast-only).
    pub fn new(alpha: f64) -> Static {
        Static { alpha }
    }
}

impl Controller for Static {
    fn name(&self) -> &'static str {
        "static"
    }

    fn initial(&self, _key: &OpKey) -> ParamValue {
        ParamValue::split(self.alpha)
    }

    fn update(&mut self, _key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue {
        observe_bw(current, stat).with_alpha(self.alpha)
    }
}
