//! `dcqcn`: DCQCN-like rate control (Zhu et al., SIGCOMM 2015) on the PCIe share.
//!
//! "Congestion" is the PCIe part finishing last (or failing). Per key the controller keeps the
//! current share `rc`, a target share `rt` and the congestion estimate `a` (an EWMA with gain
//! [`G`] of "was this call congested"). On congestion: `rt = rc`, `rc *= 1 - a/2`, `a` grows.
//! Otherwise `a` decays and `rc` climbs back in stages counted since the last cut: fast
//! recovery (`rc = (rt + rc)/2`, first [`FAST_RECOVERY`] calls), additive increase (`rt +=`
//! [`R_AI`]) and hyper increase (`rt += i *` [`R_HAI`]). Below [`MIN_SHARE`] the PCIe path is off
//! and re-probed every [`PROBE_PERIOD`] calls. Like the original it oscillates around the
//! operating point rather than settling.

use std::collections::HashMap;

use super::{Controller, ExecStat, observe_bw};
use crate::key::OpKey;
use crate::param::ParamValue;

/// EWMA gain of the congestion estimate.
pub const G: f64 = 1.0 / 16.0;
/// Calls of fast recovery after a cut.
pub const FAST_RECOVERY: u32 = 3;
/// Calls of additive increase after fast recovery (then hyper increase).
pub const ADDITIVE: u32 = 5;
/// Additive increase of the target share.
pub const R_AI: f64 = 0.005;
/// Hyper-increase step of the target share.
pub const R_HAI: f64 = 0.01;
/// Below this share the PCIe path is off.
pub const MIN_SHARE: f64 = 0.005;
/// Calls spent fast-only before re-probing.
pub const PROBE_PERIOD: u32 = 12;
const START_SHARE: f64 = 0.05;

#[derive(Clone, Copy, Debug)]
struct State {
    rt: f64,
    a: f64,
    since_cut: u32,
    off_calls: u32,
}

impl State {
    fn fresh() -> State {
        State {
            rt: 0.5,
            a: 1.0,
            since_cut: 0,
            off_calls: 0,
        }
    }
}

/// DCQCN-like controller.
#[derive(Debug, Default)]
pub struct Dcqcn {
    keys: HashMap<OpKey, State>,
}

impl Dcqcn {
    pub fn new() -> Dcqcn {
        Dcqcn::default()
    }
}

impl Controller for Dcqcn {
    fn name(&self) -> &'static str {
        "dcqcn"
    }

    fn initial(&self, _key: &OpKey) -> ParamValue {
        ParamValue::split(1.0 - START_SHARE)
    }

    fn update(&mut self, key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue {
        let st = self.keys.entry(*key).or_insert_with(State::fresh);
        let next = observe_bw(current, stat);
        if !current.use_pcie || stat.pcie_bytes == 0 {
            st.off_calls += 1;
            if st.off_calls < PROBE_PERIOD {
                return next.with_alpha(1.0);
            }
            *st = State::fresh();
            return next.with_alpha(1.0 - START_SHARE);
        }
        let mut rc = 1.0 - f64::from(current.alpha);
        if !stat.success || stat.pcie_time_us > stat.fast_time_us {
            let a = if stat.success { st.a } else { 1.0 };
            st.rt = rc;
            rc *= 1.0 - a / 2.0;
            st.a = (1.0 - G) * st.a + G;
            st.since_cut = 0;
        } else {
            st.a *= 1.0 - G;
            st.since_cut += 1;
            let i = st.since_cut;
            if i > FAST_RECOVERY + ADDITIVE {
                st.rt += f64::from(i - FAST_RECOVERY - ADDITIVE) * R_HAI;
            } else if i > FAST_RECOVERY {
                st.rt += R_AI;
            }
            st.rt = st.rt.min(1.0);
            rc = (st.rt + rc) / 2.0;
        }
        if rc < MIN_SHARE {
            st.off_calls = 0;
            return next.with_alpha(1.0);
        }
        next.with_alpha(1.0 - rc)
    }
}
