//! Per-communicator tally of the timed calls' measured path times (split calls, and calls on
//! NCCL alone in their own rows), printed at `ncclCommDestroy` when `AMPCCL_REPORT=1` (next to
//! the learned table).

use std::collections::BTreeMap;

use ampccl_multipath::key::{MpOp, OpKey};
use ampccl_multipath::pcie::CallTiming;

#[derive(Default)]
struct Sum {
    calls: u64,
    alpha: f64,
    fast: f64,
    pcie: f64,
    wall: f64,
}

/// A row of the tally: the op key's sort key and whether the calls were split.
type Row = ((MpOp, u8, i32), bool);

/// Accumulated timings of one communicator, per collective, size bucket and data type.
#[derive(Default)]
pub struct Tally {
    sums: BTreeMap<Row, (OpKey, Sum)>,
}

impl Tally {
    /// Adds one completed call of `key` that gave NCCL the fraction `alpha` of its bytes.
    pub fn add(&mut self, key: OpKey, alpha: f64, t: &CallTiming) {
        let (_, s) = self
            .sums
            .entry((key.sort_key(), alpha < 1.0))
            .or_insert_with(|| (key, Sum::default()));
        s.calls += 1;
        s.alpha += alpha;
        s.fast += f64::from(t.fast_ms);
        s.pcie += f64::from(t.pcie_ms);
        s.wall += f64::from(t.wall_ms);
    }

    /// The table, one line per key, means over the timed calls.
    pub fn render(&self, rank: usize) -> String {
        let mut out = format!(
            "ampccl timed calls, rank {rank} (means; alpha 1: NCCL alone)\n{:>13} {:>11} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9}\n",
            "op", "<=bytes", "dtype", "calls", "alpha", "nccl ms", "pcie ms", "wall ms"
        );
        for (k, s) in self.sums.values() {
            let n = s.calls.max(1) as f64;
            out += &format!(
                "{:>13} {:>11} {:>8} {:>6} {:>6.3} {:>9.3} {:>9.3} {:>9.3}\n",
                k.op.name(),
                1u64 << k.bucket,
                k.dtype.name(),
                s.calls,
                s.alpha / n,
                s.fast / n,
                s.pcie / n,
                s.wall / n
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ampccl_runtime::DataType;

    #[test]
    fn tally_means_per_key() {
        let key = OpKey::new(MpOp::AllGather, 1 << 30, DataType::Bf16);
        let mut tally = Tally::default();
        let t = |f, p| CallTiming {
            tag: 0,
            fast_ms: f,
            pcie_ms: p,
            wall_ms: 3.0,
        };
        tally.add(key, 0.875, &t(1.0, 3.0));
        tally.add(key, 0.875, &t(3.0, 1.0));
        let text = tally.render(0);
        assert!(
            text.contains("AllGather") && text.contains("1073741824"),
            "{text}"
        );
        assert!(
            text.contains(" 2 ") && text.contains("0.875") && text.contains("2.000"),
            "{text}"
        );
    }
}
