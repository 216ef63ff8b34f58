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
//! over fast-only falls under [`OFF_GAIN`] by more than twice its standard error, and on only
//! above [`ON_GAIN`]. While off, every [`PROBE_PERIOD`] calls (doubling per consecutive failure
//! or unsuccessful probe, up to [`MAX_PROBE_PERIOD`]) one call
//! sends a small share ([`PROBE_SHARE`], less if the model predicts the PCIe part would then
//! take over half the fast part's time) over PCIe — every [`MAX_PROBE_PERIOD`] calls when even
//! the smallest probe is predicted to outlast a fast-only call; a probe faster than predicted turns the path
//! back on and the next samples refine the split.
//!
//! The model's split is then refined by measured call times ([`super::search`]): a few splits
//! next to it are tried and the fastest is kept.
//!
//! The gain is judged against a *reference*: every [`REFERENCE_EVERY`]th call of a key runs on
//! the fast path alone ([`Controller::reference_every`]), and those calls feed a third model.
//! The fast path's samples from split calls cannot stand in for it: while the PCIe path copies,
//! the fast path runs slower (on 2×H200, NCCL's part of a split allreduce takes ~5 % longer than
//! the same bytes alone), and a model fitted to them would promise gains that are not there.

use std::collections::{HashMap, VecDeque};

use super::search::LocalSearch;
use super::{Controller, ExecStat, observe_bw};
use crate::key::OpKey;
use crate::param::ParamValue;

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
/// Every how many calls of a key one is a fast-only reference.
pub const REFERENCE_EVERY: u32 = 32;

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

    /// The shortest time in the window (µs; infinite without samples).
    fn fastest(&self) -> f64 {
        self.samples
            .iter()
            .map(|s| s.1)
            .fold(f64::INFINITY, f64::min)
    }

    /// Standard error of the model's prediction relative to it, from the window's residuals
    /// (0 with fewer than two samples).
    fn rel_stderr(&self) -> f64 {
        let n = self.samples.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        let ss: f64 = self
            .samples
            .iter()
            .map(|&(b, t)| (t / self.predict(b) - 1.0).powi(2))
            .sum();
        (ss / (n - 1.0) / n).sqrt()
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
    /// The fast path's part of split calls.
    fast: Path,
    pcie: Path,
    /// The fast path alone (reference calls and fast-only calls).
    solo: Path,
    mode: Mode,
    /// Consecutive PCIe failures.
    fails: u32,
    /// Consecutive probes that did not turn the path back on.
    misses: u32,
    /// Refines the model's split by measured call times.
    search: LocalSearch,
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

impl KeyState {
    /// Whether the reference model has enough samples (two) to judge splits by.
    fn has_reference(&self) -> bool {
        self.solo.samples.len() >= 2
    }

    /// Predicted µs of a fast-only call of `s` bytes: the reference model once it has samples.
    fn fast_only(&self, s: f64) -> f64 {
        if self.has_reference() {
            self.solo.predict(s)
        } else {
            self.fast.predict(s)
        }
    }

    /// Uncertainty of a predicted gain (relative): the standard errors of the two models it
    /// compares.
    fn gain_stderr(&self) -> f64 {
        if self.has_reference() {
            self.solo.rel_stderr() + self.fast.rel_stderr()
        } else {
            0.0
        }
    }
}

/// Best alpha and the predicted relative gain of splitting over fast-only, for `s` bytes.
fn optimum(st: &KeyState, s: f64) -> (f64, f64) {
    let (fast, pcie) = (&st.fast, &st.pcie);
    let alpha =
        ((pcie.lat - fast.lat + s * pcie.cost) / (s * (fast.cost + pcie.cost))).clamp(0.0, 1.0);
    let t_fast_only = st.fast_only(s);
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
    let budget = 0.5 * st.fast_only(s) - st.pcie.lat;
    (budget / (st.pcie.cost * s)).clamp(MIN_PROBE_SHARE, PROBE_SHARE)
}

impl Controller for Bw {
    fn name(&self) -> &'static str {
        "bw"
    }

    fn initial(&self, _key: &OpKey) -> ParamValue {
        ParamValue::split(INITIAL_ALPHA)
    }

    fn reference_every(&self) -> u32 {
        REFERENCE_EVERY
    }

    fn update(&mut self, key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue {
        let st = self.keys.entry(*key).or_insert_with(|| KeyState {
            fast: Path::default(),
            pcie: Path::default(),
            solo: Path::default(),
            mode: Mode::On,
            fails: 0,
            misses: 0,
            search: LocalSearch::default(),
        });
        let next = observe_bw(current, stat);
        let s = stat.total_bytes() as f64;
        if s == 0.0 {
            return next;
        }
        if stat.pcie_bytes == 0 {
            st.solo.observe(stat.fast_bytes, stat.fast_time_us, false);
        } else if stat.success {
            st.fast.observe(stat.fast_bytes, stat.fast_time_us, false);
        }
        // Even the smallest probe would outlast a fast-only call (by the model, or because no
        // PCIe part in the window, however small, was quicker than one): probe rarely.
        let t_ref = st.fast_only(s);
        let hopeless = st.pcie.known()
            && st.fast.known()
            && (st.pcie.predict(MIN_PROBE_SHARE * s) >= t_ref || st.pcie.fastest() >= t_ref);
        let period = if hopeless {
            MAX_PROBE_PERIOD
        } else {
            (PROBE_PERIOD << (st.fails + st.misses).min(3)).min(MAX_PROBE_PERIOD)
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
            st.search.reset();
            return next.with_alpha(1.0);
        }
        st.search.observe(
            stat.fast_bytes as f64 / s,
            s,
            stat.fast_time_us.max(stat.pcie_time_us),
        );
        let probing = st.mode != Mode::On;
        // A probe clearly faster than the model predicted: the path recovered.
        let improved = probing
            && st.pcie.known()
            && stat.pcie_time_us < (1.0 - CHANGE) * st.pcie.predict(stat.pcie_bytes as f64);
        st.pcie.observe(stat.pcie_bytes, stat.pcie_time_us, probing);
        if probing {
            st.fails = 0;
        }
        let (alpha, gain) = optimum(st, s);
        // Off only when the models say so beyond their noise (two standard errors); on again
        // only when a probe promises a clear gain.
        let doubt = 2.0 * st.gain_stderr();
        let loses = if probing {
            gain < ON_GAIN
        } else {
            gain + doubt < OFF_GAIN
        };
        if alpha >= 1.0 - MIN_PROBE_SHARE || (loses && !improved) {
            if probing {
                st.misses += 1;
            }
            st.mode = Mode::Off(0);
            st.search.reset();
            return next.with_alpha(1.0);
        }
        st.misses = 0;
        st.mode = Mode::On;
        let alpha = if probing {
            alpha
        } else {
            st.search.choose(alpha)
        };
        let cur = f64::from(current.alpha);
        if current.use_pcie && !probing && (alpha - cur).abs() < DEADBAND {
            next
        } else {
            next.with_alpha(alpha)
        }
    }
}
