//! A simulated two-path link for testing controllers without GPUs: each path takes
//! `latency + bytes / bandwidth`, the fast path slows by a set fraction for as long as the PCIe
//! path runs alongside (interference), times get seeded multiplicative noise, and the PCIe path can be
//! degraded or made to fail. Deterministic (SplitMix64), so tests and benches reproduce.

use super::controller::ExecStat;
use super::param::ParamValue;

/// One simulated path.
#[derive(Clone, Copy, Debug)]
pub struct SimPath {
    /// GB/s (bytes per ns).
    pub bw_gbps: f64,
    /// Fixed cost per call, µs.
    pub lat_us: f64,
}

impl SimPath {
    /// Noise-free µs to move `bytes` (0 bytes cost nothing: the path is not used).
    pub fn time_us(&self, bytes: u64) -> f64 {
        if bytes == 0 {
            0.0
        } else {
            self.lat_us + bytes as f64 / (self.bw_gbps * 1e3)
        }
    }
}

/// Two paths with noise and fault injection.
#[derive(Clone, Debug)]
pub struct TwoPath {
    pub fast: SimPath,
    pub pcie: SimPath,
    /// Relative noise amplitude: each time is multiplied by `1 + u`, `u` uniform in `±noise`.
    pub noise: f64,
    /// When true the PCIe part fails (its stat says `success: false`).
    pub pcie_fails: bool,
    /// Relative slowdown of the fast path while the PCIe path runs alongside (0.05: 5 %
    /// slower when the PCIe part lasts as long as the fast part).
    pub interference: f64,
    /// Relative extra time of a PCIe part that finishes after the fast part (on GPUs the
    /// ranks' next calls then start skewed).
    pub pcie_bound_penalty: f64,
    /// Split alignment in bytes (the planner's).
    pub align: u64,
    rng: u64,
}

impl TwoPath {
    pub fn new(fast: SimPath, pcie: SimPath, seed: u64) -> TwoPath {
        TwoPath {
            fast,
            pcie,
            noise: 0.0,
            pcie_fails: false,
            interference: 0.0,
            pcie_bound_penalty: 0.0,
            align: 4096,
            rng: seed,
        }
    }

    /// SplitMix64 in `[0, 1)`.
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn noisy(&mut self, t: f64) -> f64 {
        let u = self.uniform() * 2.0 - 1.0;
        t * (1.0 + self.noise * u)
    }

    /// Bytes on the fast path for a split of `total` bytes (aligned down, like the planner).
    pub fn fast_bytes(&self, total: u64, p: &ParamValue) -> u64 {
        let alpha = p.effective_alpha();
        if alpha >= 1.0 {
            return total;
        }
        let f = (alpha * total as f64) as u64;
        (f / self.align * self.align).min(total)
    }

    /// Runs one call of `total` bytes with parameters `p`.
    pub fn run(&mut self, total: u64, p: &ParamValue) -> ExecStat {
        let fast_bytes = self.fast_bytes(total, p);
        let pcie_bytes = total - fast_bytes;
        let (fast_us, pcie_us) = self.times(fast_bytes, pcie_bytes);
        let fast_time_us = self.noisy(fast_us);
        let pcie_time_us = self.noisy(pcie_us);
        ExecStat {
            fast_time_us,
            pcie_time_us,
            fast_bytes,
            pcie_bytes,
            success: pcie_bytes == 0 || !self.pcie_fails,
        }
    }

    /// Noise-free µs of the fast path's `bytes` next to `pcie_us` of PCIe work: slowed by
    /// `interference` for the fraction of its time the PCIe path runs alongside.
    fn fast_time(&self, bytes: u64, pcie_us: f64) -> f64 {
        let alone = self.fast.time_us(bytes);
        if alone == 0.0 {
            return 0.0;
        }
        alone * (1.0 + self.interference * (pcie_us / alone).min(1.0))
    }

    /// The noise-free best alpha for `total` bytes, to 1e-4 (1.0 when splitting does not pay).
    pub fn optimal_alpha(&self, total: u64) -> f64 {
        if self.pcie_fails {
            return 1.0;
        }
        (0..10_000)
            .map(|i| f64::from(i) / 10_000.0)
            .fold(1.0, |best, a| {
                if self.time_at(total, a) < self.time_at(total, best) {
                    a
                } else {
                    best
                }
            })
    }

    /// Noise-free µs of the two parts of a call.
    fn times(&self, fast_bytes: u64, pcie_bytes: u64) -> (f64, f64) {
        let pcie = self.pcie.time_us(pcie_bytes);
        let fast = self.fast_time(fast_bytes, pcie);
        if pcie > fast {
            (fast, pcie * (1.0 + self.pcie_bound_penalty))
        } else {
            (fast, pcie)
        }
    }

    /// Noise-free time of a call with fast-path fraction `alpha`.
    pub fn time_at(&self, total: u64, alpha: f64) -> f64 {
        let f = ((alpha * total as f64) as u64).min(total);
        let (fast, pcie) = self.times(f, total - f);
        fast.max(pcie)
    }
}

#[cfg(test)]
mod tests;
