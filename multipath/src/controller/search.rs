//! Local search on measured call times around a model's split.
//!
//! A model that sets the split so that both paths finish together is right only as far as its
//! assumptions go. On 2×H200 the fast path slows more the longer the PCIe path runs alongside,
//! and a call whose PCIe part finishes last delays the next one on every rank: allreduce of
//! 1 GiB gains 3 % at the equal-finish split (alpha 0.91) and 7 % at alpha 0.92. So the
//! controller tries a few splits next to the model's ([`OFFSETS`], relative to it, on a grid
//! of [`GRID`]), [`SAMPLES`] calls each, and keeps the one whose calls took least time. The
//! candidates follow the model as it converges; each sample is filed under the split the call
//! actually ran with (its byte counts), so stats that arrive calls late are never
//! misattributed. The measurements are dropped when the model's split moves by more than
//! [`RECENTRE`] (relative) from where they started, and every [`REFRESH`] samples.

use std::collections::BTreeMap;

/// Resolution of the splits tried.
pub const GRID: f64 = 0.0025;
/// Splits tried, relative to the model's: the model's own, then towards the fast path, the
/// side where the optimum lay in every measurement. The other side makes the PCIe part the
/// last to finish, where a call slows by the PCIe path's whole per-byte cost (for alpha 0.9 on
/// 2×H200, 1 % less alpha costs 7 % more time): not worth trying.
pub const OFFSETS: [f64; 3] = [0.0, 0.01, 0.02];
/// Calls measured per split before the splits are compared.
pub const SAMPLES: u32 = 3;
/// Relative move of the model's split that restarts the search around the new one.
pub const RECENTRE: f64 = 0.02;
/// Samples after which the search starts over (conditions drift).
pub const REFRESH: u32 = 256;

#[derive(Clone, Copy, Debug, Default)]
struct Mean {
    n: u32,
    sum: f64,
}

impl Mean {
    fn value(&self) -> f64 {
        self.sum / f64::from(self.n.max(1))
    }
}

/// The search state of one key.
#[derive(Debug, Default)]
pub struct LocalSearch {
    /// The model's split when the search (re)started (the candidates follow the model; what
    /// was measured stays filed under its grid point until the model moves this far).
    centre: Option<f64>,
    /// Mean µs per byte of the calls run at each grid point.
    tried: BTreeMap<i64, Mean>,
    samples: u32,
}

fn cell(alpha: f64) -> i64 {
    (alpha / GRID).round() as i64
}

fn alpha_of(cell: i64) -> f64 {
    cell as f64 * GRID
}

impl LocalSearch {
    /// Records a split call that ran with fast-path fraction `alpha` and took `wall_us` for
    /// `bytes` in all.
    pub fn observe(&mut self, alpha: f64, bytes: f64, wall_us: f64) {
        if self.centre.is_none() || bytes <= 0.0 || wall_us.is_nan() || wall_us <= 0.0 {
            return;
        }
        let m = self.tried.entry(cell(alpha)).or_default();
        m.n += 1;
        m.sum += wall_us / bytes;
        self.samples += 1;
    }

    /// The split to run next, given the model's `model`: the first candidate still short of
    /// samples, else the one measured fastest.
    pub fn choose(&mut self, model: f64) -> f64 {
        let stale = self.centre.is_none_or(|c| (model - c).abs() > RECENTRE * c);
        if stale || self.samples >= REFRESH {
            self.centre = Some(model);
            self.tried.clear();
            self.samples = 0;
        }
        let mut candidates: Vec<i64> = OFFSETS
            .iter()
            .map(|o| cell(model * (1.0 + o)))
            .filter(|&c| alpha_of(c) > 0.0 && alpha_of(c) < 1.0)
            .collect();
        candidates.dedup();
        let count = |c: &i64| self.tried.get(c).map_or(0, |m| m.n);
        if let Some(c) = candidates.iter().find(|c| count(c) < SAMPLES) {
            return alpha_of(*c);
        }
        let best = candidates.iter().min_by(|a, b| {
            let (ma, mb) = (self.tried[*a].value(), self.tried[*b].value());
            ma.total_cmp(&mb)
        });
        best.map_or(model, |c| alpha_of(*c))
    }

    /// Forgets everything (the path went off or failed).
    pub fn reset(&mut self) {
        *self = LocalSearch::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls at `alpha` take `t(alpha)`; the search settles on the best candidate.
    fn run(model: f64, t: impl Fn(f64) -> f64) -> f64 {
        let mut s = LocalSearch::default();
        let mut a = s.choose(model);
        for _ in 0..40 {
            s.observe(a, 1.0, t(a));
            a = s.choose(model);
        }
        a
    }

    #[test]
    fn settles_on_the_fastest_candidate() {
        // Fastest two steps towards the fast path.
        let a = run(0.9, |a| 1.0 + (a - 0.918).abs());
        assert!((a - alpha_of(cell(0.9 * 1.02))).abs() < 1e-9, "{a}");
        // Fastest at the model's split.
        let a = run(0.5, |a| 1.0 + (a - 0.5).abs());
        assert!((a - 0.5).abs() < 1e-9, "{a}");
    }

    #[test]
    fn samples_are_filed_under_the_split_they_ran_with() {
        let mut s = LocalSearch::default();
        let first = s.choose(0.9);
        // A late stat of a call at another split does not count for the candidate.
        s.observe(0.7, 1.0, 0.1);
        assert_eq!(s.choose(0.9), first);
        for _ in 0..SAMPLES {
            s.observe(first, 1.0, 1.0);
        }
        assert_ne!(s.choose(0.9), first, "the next candidate is tried");
    }

    #[test]
    fn a_moved_model_restarts_the_search() {
        let mut s = LocalSearch::default();
        for _ in 0..20 {
            let a = s.choose(0.9);
            s.observe(a, 1.0, 1.0);
        }
        assert!((s.choose(0.8) - 0.8).abs() < 1e-9);
    }
}
