//! `bw` (default): model-based split — fit each path's latency and per-byte cost, then choose
//! the split at which both paths finish together.
//!
//! Per key and path the controller keeps the last [`WINDOW`] samples `(bytes, µs)` and fits
//! `t = lat + bytes * cost`: `lat` by least squares when the window's byte counts spread by at
//! least [`MIN_SPREAD`]× (probes and convergence steps provide the spread), otherwise the last
//! fitted `lat` is kept; `cost` is the window mean of `(t - lat) / bytes`, which averages noise.
//! Two consecutive samples more than [`CHANGE`] off the prediction (one for a probe) mean the
//! path changed: the window restarts from them, so a degradation is followed within a few calls.
//!
//! The optimum `alpha* = (lat_p - lat_f + S cost_p) / (S (cost_f + cost_p))` equalises the
//! finish times (a fixed point of the iteration even while `lat` is unknown). Hysteresis: alpha
//! moves only by more than [`DEADBAND`]; the PCIe path is turned off when the predicted gain
//! over fast-only falls under [`OFF_GAIN`] and on only above [`ON_GAIN`]. While off, every
//! [`PROBE_PERIOD`] calls (doubling per consecutive failure up to [`MAX_PROBE_PERIOD`]) one call
//! sends a small share ([`PROBE_SHARE`], less if the model predicts the PCIe part would then
//! take over half the fast part's time) over PCIe — every [`MAX_PROBE_PERIOD`] calls when even
//! the smallest probe is predicted to outlast a fast-only call; a probe faster than predicted turns the path
//! back on and the next samples refine the split.

use std::collections::{HashMap, VecDeque};

use super::{Controller, ExecStat, observe_bw};
use crate::multipath::key::OpKey;
use crate::multipath::param::ParamValue;

/// Samples per path in the fit.
pub const WINDOW: usize = 16;
/// Relative deviation from the prediction that counts as a change of the path.
pub const CHANGE: f64 = 0.35;
/// Least spread (max/min bytes) of a window for fitting the latency.
pub const MIN_SPREAD: f64 = 1.5;
/// Smallest alpha move applied.
pub const DEADBAND: f64 = 0.002;
/// Predicted relative gain above which an off PCIe path is turned on.
pub const ON_GAIN: f64 = 0.04;
/// Predicted relative gain below which an on PCIe path is turned off.
pub const OFF_GAIN: f64 = 0.015;
/// Calls fast-only between probes.
pub const PROBE_PERIOD: u32 = 8;
/// Longest probe period (after repeated failures).
pub const MAX_PROBE_PERIOD: u32 = 64;
/// Largest PCIe share of a probe.
pub const PROBE_SHARE: f64 = 0.02;
/// Smallest PCIe share of a probe.
const MIN_PROBE_SHARE: f64 = 0.002;
/// Alpha of a key's first call.
pub const INITIAL_ALPHA: f64 = 0.9;

/// One path's samples and fitted model.
#[derive(Debug, Default)]
struct Path {
    samples: VecDeque<(f64, f64)>,
    lat: f64,
    /// µs per byte; 0 until the first sample.
    cost: f64,
    strikes: u32,
}

impl Path {
    fn known(&self) -> bool {
        self.cost > 0.0
    }

    fn predict(&self, bytes: f64) -> f64 {
        self.lat + self.cost * bytes
    }

    /// Adds a sample; `trusted` (a probe) restarts the window on a single deviating sample.
    fn observe(&mut self, bytes: u64, us: f64, trusted: bool) {
        if bytes == 0 || us.is_nan() || us <= 0.0 {
            return;
        }
        let b = bytes as f64;
        let deviated = self.known() && (us / self.predict(b) - 1.0).abs() > CHANGE;
        self.strikes = if deviated { self.strikes + 1 } else { 0 };
        self.samples.push_back((b, us));
        if self.samples.len() > WINDOW {
            self.samples.pop_front();
        }
        let keep = if trusted { 1 } else { 2 };
        if self.strikes >= keep {
            while self.samples.len() > keep as usize {
                self.samples.pop_front();
            }
            self.strikes = 0;
        }
        self.fit();
    }

    fn fit(&mut self) {
        let n = self.samples.len() as f64;
        let (mut bmin, mut bmax, mut tmin) = (f64::MAX, 0.0f64, f64::MAX);
        let (mut sb, mut st) = (0.0, 0.0);
        for &(b, t) in &self.samples {
            bmin = bmin.min(b);
            bmax = bmax.max(b);
            tmin = tmin.min(t);
            sb += b;
            st += t;
        }
        if n >= 3.0 && bmax >= MIN_SPREAD * bmin {
            let (mb, mt) = (sb / n, st / n);
            let (mut sxx, mut sxy) = (0.0, 0.0);
            for &(b, t) in &self.samples {
                sxx += (b - mb) * (b - mb);
                sxy += (b - mb) * (t - mt);
            }
            if sxy > 0.0 {
                self.lat = mt - sxy / sxx * mb;
            }
        }
        self.lat = self.lat.clamp(0.0, 0.9 * tmin);
        let lat = self.lat;
        self.cost = self
            .samples
            .iter()
            .map(|&(b, t)| (t - lat) / b)
            .sum::<f64>()
            / n;
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    On,
    /// Fast-only; calls since it went off or since the last probe.
    Off(u32),
    /// A probe value is out; calls waiting for its stat.
    Probing(u32),
}

#[derive(Debug)]
struct KeyState {
    fast: Path,
    pcie: Path,
    mode: Mode,
    /// Consecutive PCIe failures.
    fails: u32,
}

/// Model-based controller.
#[derive(Debug, Default)]
pub struct Bw {
    keys: HashMap<OpKey, KeyState>,
}

impl Bw {
    pub fn new() -> Bw {
        Bw::default()
    }
}

/// Best alpha and the predicted relative gain of splitting over fast-only, for `s` bytes.
fn optimum(fast: &Path, pcie: &Path, s: f64) -> (f64, f64) {
    let alpha =
        ((pcie.lat - fast.lat + s * pcie.cost) / (s * (fast.cost + pcie.cost))).clamp(0.0, 1.0);
    let t_fast_only = fast.predict(s);
    let t_split = fast.predict(alpha * s).max(pcie.predict((1.0 - alpha) * s));
    let gain = if alpha < 1.0 {
        (t_fast_only - t_split) / t_fast_only
    } else {
        0.0
    };
    (alpha, gain)
}

fn probe_share(st: &KeyState, s: f64) -> f64 {
    if !(st.pcie.known() && st.fast.known()) {
        return PROBE_SHARE;
    }
    let budget = 0.5 * st.fast.predict(s) - st.pcie.lat;
    (budget / (st.pcie.cost * s)).clamp(MIN_PROBE_SHARE, PROBE_SHARE)
}

impl Controller for Bw {
    fn name(&self) -> &'static str {
        "bw"
    }

    fn initial(&self, _key: &OpKey) -> ParamValue {
        ParamValue::split(INITIAL_ALPHA)
    }

    fn update(&mut self, key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue {
        let st = self.keys.entry(*key).or_insert_with(|| KeyState {
            fast: Path::default(),
            pcie: Path::default(),
            mode: Mode::On,
            fails: 0,
        });
        let next = observe_bw(current, stat);
        let s = stat.total_bytes() as f64;
        if s == 0.0 {
            return next;
        }
        st.fast.observe(stat.fast_bytes, stat.fast_time_us, false);
        // Even the smallest probe would outlast a fast-only call: probe rarely.
        let hopeless = st.pcie.known()
            && st.fast.known()
            && st.pcie.predict(MIN_PROBE_SHARE * s) >= st.fast.predict(s);
        let period = if hopeless {
            MAX_PROBE_PERIOD
        } else {
            (PROBE_PERIOD << st.fails.min(3)).min(MAX_PROBE_PERIOD)
        };
        if stat.pcie_bytes == 0 {
            return match st.mode {
                Mode::On => next,
                Mode::Off(n) if n + 1 >= period => {
                    st.mode = Mode::Probing(0);
                    next.with_alpha(1.0 - probe_share(st, s))
                }
                Mode::Off(n) => {
                    st.mode = Mode::Off(n + 1);
                    next.with_alpha(1.0)
                }
                // The probe has not been measured yet (stats lag calls): keep it out a while.
                Mode::Probing(n) if n < period => {
                    st.mode = Mode::Probing(n + 1);
                    *current
                }
                Mode::Probing(_) => {
                    st.mode = Mode::Off(0);
                    next.with_alpha(1.0)
                }
            };
        }
        if !stat.success {
            st.fails += 1;
            st.mode = Mode::Off(0);
            return next.with_alpha(1.0);
        }
        let probing = st.mode != Mode::On;
        // A probe clearly faster than the model predicted: the path recovered.
        let improved = probing
            && st.pcie.known()
            && stat.pcie_time_us < (1.0 - CHANGE) * st.pcie.predict(stat.pcie_bytes as f64);
        st.pcie.observe(stat.pcie_bytes, stat.pcie_time_us, probing);
        if probing {
            st.fails = 0;
        }
        let (alpha, gain) = optimum(&st.fast, &st.pcie, s);
        let threshold = if probing { ON_GAIN } else { OFF_GAIN };
        if alpha >= 1.0 - MIN_PROBE_SHARE || (gain < threshold && !improved) {
            st.mode = Mode::Off(0);
            return next.with_alpha(1.0);
        }
        st.mode = Mode::On;
        let cur = f64::from(current.alpha);
        if current.use_pcie && !probing && (alpha - cur).abs() < DEADBAND {
            next
        } else {
            next.with_alpha(alpha)
        }
    }
}
