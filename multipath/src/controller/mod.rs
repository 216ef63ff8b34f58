//! Split controllers: sans-I/O state machines that turn per-call timings into the next split.
//!
//! A [`Controller`] is fed one aggregated [`ExecStat`] per call (rank 0 aggregates the ranks'
//! stats as the max over ranks — a collective is as slow as its slowest rank) and returns the
//! [`ParamValue`] the next calls of that [`OpKey`] use. Controllers have no clocks, threads or
//! I/O, so they are deterministic and tested against the simulator in [`super::sim`].
//!
//! One file per algorithm (quinn's `congestion/` pattern), chosen by `AMPCCL_SPLIT_CONTROLLER`
//! ([`by_name`]):
//!
//! | name | algorithm |
//! |---|---|
//! | `bw` (default) | model-based: per-path latency + bandwidth fit, both paths finish together, hysteresis, PCIe off when it does not pay, periodic re-probe ([`bw::Bw`]) |
//! | `tcp` | AIMD on the PCIe share, slow start ([`tcp::Tcp`]) |
//! | `dcqcn` | DCQCN-like rate control on the PCIe share ([`dcqcn::Dcqcn`]) |
//! | `static`, `static:<alpha>` | fixed split ([`static_::Static`]) |
//!
//! ## Comparison (simulator, `cargo nextest run -p ampccl print_comparison --no-capture`)
//!
//! Scenarios of `sim::tests`: `64M` (fast 300 GB/s + 20 µs, PCIe 50 GB/s + 30 µs, optimal
//! alpha 0.864), `8M` (250 + 20 / 45 + 25, latency-heavy), `equal` (two 50 GB/s paths, 0.5).
//! *converge*: calls until the table's alpha stays within 3 % of the optimum (noise-free, 300
//! calls; with `bw`, every 32nd call — every 4th of the first 32 — is a fast-only reference);
//! *noise*: worst relative alpha error over calls 30..300 under ±10 % noise (5 seeds);
//! *degrade*: calls until fast-only (alpha >= 0.999) after the PCIe bandwidth drops 20× in
//! `64M` (in brackets: until alpha >= 0.99, the degraded optimum being 0.992); *recover*:
//! calls until alpha is back within 3 % after the bandwidth is restored; *fail*: calls until
//! fast-only once the PCIe part fails, then until back within 3 % after it works again.
//!
//! | controller | converge 64M / 8M / equal | noise 64M / 8M / equal | degrade | recover | fail / back |
//! |---|---|---|---|---|---|
//! | `bw` | 2 / 2 / 4 | 0.8 % / 0.8 % / 2.9 % | 2 (2) | 11 | 1 / 58 |
//! | `tcp` | 3 / 4 / never | 4.3 % / 5.7 % / 22.4 % | never (17) | 25 | 5 / 26 |
//! | `dcqcn` | 23 / 22 / never | 4.6 % / 5.9 % / 17.9 % | never (11) | 12 | 5 / 28 |
//!
//! `tcp` and `dcqcn` oscillate by a fraction of the PCIe share (sawtooth), so they hold 3 %
//! only where the optimal share is small, and they follow a degradation to its optimum
//! instead of turning the path off. `bw`'s slow return after failures is its probe backoff
//! (8, 16, 32, 64 calls) — failures are costlier than a slow path.
//! So `bw` is the default; `tcp` and `dcqcn` are kept for comparison on hardware.

pub mod bw;
pub mod dcqcn;
pub mod search;
pub mod static_;
pub mod tcp;

use super::key::OpKey;
use super::param::ParamValue;

/// Timing of one call, aggregated over ranks (max of the times).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ExecStat {
    /// µs the fast (NCCL) part took.
    pub fast_time_us: f64,
    /// µs the PCIe part took (0 when it carried nothing).
    pub pcie_time_us: f64,
    pub fast_bytes: u64,
    pub pcie_bytes: u64,
    /// False when the PCIe part failed (its bytes were redone on the fast path).
    pub success: bool,
}

impl ExecStat {
    /// Element-wise aggregate of two ranks' stats: max of the times, bytes of `self`, and
    /// success only if both succeeded.
    pub fn max_with(self, other: &ExecStat) -> ExecStat {
        ExecStat {
            fast_time_us: self.fast_time_us.max(other.fast_time_us),
            pcie_time_us: self.pcie_time_us.max(other.pcie_time_us),
            success: self.success && other.success,
            ..self
        }
    }

    /// True when the times are finite and non-negative (a stat from a broken timer is ignored).
    pub fn is_sane(&self) -> bool {
        self.fast_time_us.is_finite()
            && self.fast_time_us >= 0.0
            && self.pcie_time_us.is_finite()
            && self.pcie_time_us >= 0.0
    }

    /// Total bytes of the call.
    pub fn total_bytes(&self) -> u64 {
        self.fast_bytes.saturating_add(self.pcie_bytes)
    }
}

/// A split controller (one per domain; keeps its own per-key state).
pub trait Controller: Send {
    /// The `AMPCCL_SPLIT_CONTROLLER` name.
    fn name(&self) -> &'static str;
    /// Parameters for a key never seen before.
    fn initial(&self, key: &OpKey) -> ParamValue;
    /// Next parameters for `key`, given the ones the measured call used and its timing.
    fn update(&mut self, key: &OpKey, current: &ParamValue, stat: &ExecStat) -> ParamValue;
    /// Every how many calls of a key one runs on the fast path alone, whatever the table says,
    /// as the *reference* a split is judged against (0: never). While the PCIe path copies,
    /// the fast path runs slower (they share the GPU's memory system and the host), so the
    /// fast path's time in split calls says nothing about a call without a PCIe part.
    fn reference_every(&self) -> u32 {
        0
    }
}

/// Whether the `nth` call of a key (counted from 0, the same on every rank) is a reference
/// call of a controller whose [`Controller::reference_every`] is `every`: every fourth call
/// while the key is new (its first `every` calls, so the reference averages out noise early),
/// then every `every`th.
pub fn is_reference(every: u32, nth: u64) -> bool {
    let every = u64::from(every);
    every > 0 && (nth.is_multiple_of(every) || (nth < every && nth.is_multiple_of(4)))
}

/// Name of the default controller.
pub const DEFAULT: &str = "bw";

/// The controller named by an `AMPCCL_SPLIT_CONTROLLER` value: `bw`, `tcp`, `dcqcn`, `static` or
/// `static:<alpha>`; `None` for anything else.
pub fn by_name(spec: &str) -> Option<Box<dyn Controller>> {
    let spec = spec.trim();
    let (name, arg) = match spec.split_once(':') {
        Some((n, a)) => (n, Some(a)),
        None => (spec, None),
    };
    match (name.to_ascii_lowercase().as_str(), arg) {
        ("bw", None) => Some(Box::new(bw::Bw::new())),
        ("tcp", None) => Some(Box::new(tcp::Tcp::new())),
        ("dcqcn", None) => Some(Box::new(dcqcn::Dcqcn::new())),
        ("static", None) => Some(Box::new(static_::Static::new(static_::DEFAULT_ALPHA))),
        ("static", Some(a)) => {
            let a = a.trim().parse::<f64>().ok()?;
            (0.0..=1.0)
                .contains(&a)
                .then(|| Box::new(static_::Static::new(a)) as Box<dyn Controller>)
        }
        _ => None,
    }
}

/// GB/s (bytes per ns) of `bytes` moved in `us`; 0 when either is 0.
pub(crate) fn gbps(bytes: u64, us: f64) -> f32 {
    if bytes == 0 || us <= 0.0 {
        0.0
    } else {
        (bytes as f64 / (us * 1e3)) as f32
    }
}

/// `current` with informational bandwidths refreshed from `stat` (kept when a path was idle).
pub(crate) fn observe_bw(current: &ParamValue, stat: &ExecStat) -> ParamValue {
    let keep = |new: f32, old: f32| if new > 0.0 { new } else { old };
    ParamValue {
        fast_bw: keep(gbps(stat.fast_bytes, stat.fast_time_us), current.fast_bw),
        pcie_bw: keep(gbps(stat.pcie_bytes, stat.pcie_time_us), current.pcie_bw),
        calls: current.calls.saturating_add(1),
        ..*current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        for n in ["bw", "tcp", "dcqcn", "static", "TCP"] {
            let c = by_name(n).unwrap_or_else(|| panic!("{n}"));
            assert_eq!(c.name(), n.to_ascii_lowercase());
        }
        assert_eq!(by_name(DEFAULT).map(|c| c.name()), Some("bw"));
        assert!(by_name("static:0.75").is_some());
        for bad in ["", "cubic", "static:1.5", "static:x", "bw:1"] {
            assert!(by_name(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn max_with_takes_slowest_times() {
        let a = ExecStat {
            fast_time_us: 10.0,
            pcie_time_us: 5.0,
            fast_bytes: 1,
            pcie_bytes: 1,
            success: true,
        };
        let b = ExecStat {
            fast_time_us: 8.0,
            pcie_time_us: 7.0,
            success: false,
            ..a
        };
        let m = a.max_with(&b);
        assert_eq!(
            (m.fast_time_us, m.pcie_time_us, m.success),
            (10.0, 7.0, false)
        );
    }
}
