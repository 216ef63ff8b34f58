//! The planner: turns a collective call and a split fraction into the part NCCL carries and
//! the part the PCIe path carries.
//!
//! The split is made per rank block (the whole buffer for allreduce/broadcast/reduce; each
//! rank's block for allgather/reduce-scatter): the fast path takes elements `0..fast`, the PCIe
//! path `fast..block`. The PCIe part is a whole number of `align` bytes, and no split is made
//! for calls under `min_msg_bytes` or PCIe parts under `min_pcie_bytes`, where the PCIe path's
//! fixed costs outweigh what it carries.

/// Planner rules (see [`crate`] for the environment variables).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerRules {
    /// Calls moving fewer bytes (the larger of send and receive size) are not split.
    pub min_msg_bytes: usize,
    /// The PCIe part is a multiple of this many bytes.
    pub align_bytes: usize,
    /// Smaller PCIe parts are not worth it: the call goes fast-only.
    pub min_pcie_bytes: usize,
}

impl Default for PlannerRules {
    /// `min_msg_bytes` 256 MiB: on 2×H200, split calls of 16 and 64 MiB ran at 0.83× and 0.95×
    /// of NCCL alone with the best split the controller found, those of 256 MiB at 1.0–1.04×
    /// (docs/GPU.md).
    fn default() -> PlannerRules {
        PlannerRules {
            min_msg_bytes: 256 << 20,
            align_bytes: 4096,
            min_pcie_bytes: 1 << 20,
        }
    }
}

/// Elements of each rank block per path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Elements `0..fast` of each block go through NCCL.
    pub fast: usize,
    /// Elements `fast..fast + pcie` of each block go through the PCIe path.
    pub pcie: usize,
}

impl Split {
    /// Everything through NCCL.
    pub fn fast_only(block: usize) -> Split {
        Split {
            fast: block,
            pcie: 0,
        }
    }

    /// Whether the PCIe path takes part.
    pub fn uses_pcie(&self) -> bool {
        self.pcie > 0
    }
}

impl PlannerRules {
    /// Splits blocks of `block` elements of `elem_size` bytes in a call moving `call_bytes`,
    /// giving the fast path the fraction `alpha` (clamped to `0..=1`) of each block's bytes.
    /// The same inputs give the same split on every rank.
    pub fn split(&self, block: usize, elem_size: usize, call_bytes: usize, alpha: f64) -> Split {
        if call_bytes < self.min_msg_bytes || elem_size == 0 || !alpha.is_finite() {
            return Split::fast_only(block);
        }
        let alpha = alpha.clamp(0.0, 1.0);
        let block_bytes = block * elem_size;
        let align = self.align_bytes.max(elem_size).next_multiple_of(elem_size);
        let want = ((1.0 - alpha) * block_bytes as f64) as usize;
        let pcie_bytes = want / align * align;
        if pcie_bytes < self.min_pcie_bytes.max(1) {
            return Split::fast_only(block);
        }
        let pcie = (pcie_bytes / elem_size).min(block);
        Split {
            fast: block - pcie,
            pcie,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_calls_and_small_parts_stay_fast() {
        let r = PlannerRules::default();
        assert_eq!(r.split(1 << 20, 4, 4 << 20, 0.5), Split::fast_only(1 << 20));
        // Under the 256 MiB minimum: never split.
        assert_eq!(
            r.split(16 << 20, 4, 64 << 20, 0.5),
            Split::fast_only(16 << 20)
        );
        // 1 GiB call, alpha 0.9995 → 0.54 MiB PCIe < 1 MiB minimum.
        assert_eq!(
            r.split(256 << 20, 4, 1 << 30, 0.9995),
            Split::fast_only(256 << 20)
        );
        assert!(r.split(256 << 20, 4, 1 << 30, 0.99).uses_pcie());
        assert!(!r.split(256 << 20, 4, 1 << 30, 1.0).uses_pcie());
        assert!(!r.split(256 << 20, 4, 1 << 30, f64::NAN).uses_pcie());
    }

    #[test]
    fn parts_cover_the_block_and_are_aligned() {
        let r = PlannerRules {
            min_msg_bytes: 1 << 20,
            ..PlannerRules::default()
        };
        for (block, es) in [
            (16_777_259usize, 4usize),
            (50_000_017, 2),
            (9_999_991, 8),
            (40_000_003, 1),
        ] {
            for alpha in [0.0, 0.3, 0.85, 0.9] {
                let s = r.split(block, es, block * es, alpha);
                assert_eq!(s.fast + s.pcie, block);
                assert_eq!((s.pcie * es) % 4096, 0, "aligned");
                let got = s.fast as f64 / block as f64;
                assert!(
                    got >= alpha - 1e-9 && got <= alpha + (4096.0 / (block * es) as f64) + 1e-9,
                    "{alpha} {got}"
                );
            }
        }
    }
}
