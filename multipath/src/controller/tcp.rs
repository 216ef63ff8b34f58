//! `tcp`: AIMD on the PCIe share `s = 1 - alpha`, TCP Reno style.
//!
//! The path that finished first gets more work: while the PCIe part finishes before the fast
//! part, `s` grows (doubling in slow start, then by [`AI_STEP`] per call); when the PCIe part is
//! the late one, `s` is cut multiplicatively by [`MD_FACTOR`] (by half on a failure). Below
//! [`MIN_SHARE`] the PCIe path is turned off and re-probed every [`PROBE_PERIOD`] calls with a
//! fresh slow start. By design it oscillates (a sawtooth of depth `(1 - MD_FACTOR) * s` around
//! the optimum), so it does not settle within a few percent when the optimal share is large.

use std::collections::HashMap;

use super::{Controller, ExecStat, observe_bw};
use crate::key::OpKey;
use crate::param::ParamValue;

/// Additive increase of the PCIe share per call in congestion avoidance.
pub const AI_STEP: f64 = 0.004;
/// Multiplicative decrease when the PCIe part finished last.
pub const MD_FACTOR: f64 = 0.85;
/// Below this share the PCIe path is off.
pub const MIN_SHARE: f64 = 0.005;
/// Calls spent fast-only before a new slow start.
pub const PROBE_PERIOD: u32 = 12;
/// Largest PCIe share.
pub const MAX_SHARE: f64 = 0.9;
/// Share a slow start begins with.
const START_SHARE: f64 = 0.02;

#[derive(Clone, Copy, Debug)]
struct State {
    slow_start: bool,
    off_calls: u32,
}

/// AIMD controller.
#[derive(Debug, Default)]
pub struct Tcp {
    keys: HashMap<OpKey, State>,
}

impl Tcp {
    pub fn new() -> Tcp {
        Tcp::default()
    }
}

impl Controller for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn initial(&self, _key: &OpKey) -> ParamValue {
        ParamValue::split(1.0 - START_SHARE)
    }

    fn update(&mut self, key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue {
        let st = self.keys.entry(*key).or_insert(State {
            slow_start: true,
            off_calls: 0,
        });
        let next = observe_bw(current, stat);
        if !current.use_pcie || stat.pcie_bytes == 0 {
            st.off_calls += 1;
            if st.off_calls < PROBE_PERIOD {
                return next.with_alpha(1.0);
            }
            st.off_calls = 0;
            st.slow_start = true;
            return next.with_alpha(1.0 - START_SHARE);
        }
        let s = 1.0 - f64::from(current.alpha);
        let s = if !stat.success {
            st.slow_start = false;
            s * 0.5
        } else if stat.pcie_time_us > stat.fast_time_us {
            st.slow_start = false;
            s * MD_FACTOR
        } else if st.slow_start {
            (s * 2.0).min(MAX_SHARE)
        } else {
            s + AI_STEP
        };
        if s < MIN_SHARE {
            st.off_calls = 0;
            return next.with_alpha(1.0);
        }
        next.with_alpha(1.0 - s)
    }
}
