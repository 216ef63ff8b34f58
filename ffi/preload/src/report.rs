//! Per-communicator tally of the split calls' measured path times, printed at
//! `ncclCommDestroy` when `AMPCCL_REPORT=1`.

use std::collections::BTreeMap;

use ampccl::multipath::pcie::CallTiming;

/// What a timing tag encodes: the collective, the size bucket (`ceil(log2(bytes))`), the data
/// type and the fast fraction used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub op: &'static str,
    pub bucket: u8,
    pub dtype: ampccl::DataType,
}

const OPS: [&str; 5] = [
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
];

/// Packs a key, the fast fraction and the part sizes' ratio into a timing tag.
pub fn tag(op: usize, bytes: usize, dtype: ampccl::DataType, alpha: f64) -> u64 {
    let bucket = usize::BITS - bytes.saturating_sub(1).leading_zeros();
    ((op as u64) << 56)
        | (u64::from(bucket) << 48)
        | ((dtype as u64) << 40)
        | (alpha.clamp(0.0, 1.0) * 65535.0) as u64
}

fn untag(t: u64) -> (Key, f64) {
    let op = OPS[((t >> 56) as usize).min(OPS.len() - 1)];
    let dtype =
        ampccl::DataType::from_raw(((t >> 40) & 0xff) as i32).unwrap_or(ampccl::DataType::U8);
    (
        Key {
            op,
            bucket: ((t >> 48) & 0xff) as u8,
            dtype,
        },
        (t & 0xffff) as f64 / 65535.0,
    )
}

#[derive(Default)]
struct Sum {
    calls: u64,
    alpha: f64,
    fast: f64,
    pcie: f64,
    wall: f64,
}

/// Accumulated timings of one communicator.
#[derive(Default)]
pub struct Tally {
    sums: BTreeMap<Key, Sum>,
}

impl Tally {
    /// Adds completed calls.
    pub fn add(&mut self, done: &[CallTiming]) {
        for t in done {
            let (key, alpha) = untag(t.tag);
            let s = self.sums.entry(key).or_default();
            s.calls += 1;
            s.alpha += alpha;
            s.fast += f64::from(t.fast_ms);
            s.pcie += f64::from(t.pcie_ms);
            s.wall += f64::from(t.wall_ms);
        }
    }

    /// The table, one line per key, means over the timed calls.
    pub fn render(&self, rank: usize) -> String {
        let mut out = format!(
            "ampccl report, rank {rank}\n{:>13} {:>9} {:>8} {:>6} {:>6} {:>10} {:>10} {:>10}\n",
            "op", "<=bytes", "dtype", "calls", "alpha", "nccl ms", "pcie ms", "wall ms"
        );
        for (k, s) in &self.sums {
            let n = s.calls.max(1) as f64;
            out += &format!(
                "{:>13} {:>9} {:>8} {:>6} {:>6.3} {:>10.3} {:>10.3} {:>10.3}\n",
                k.op,
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

    #[test]
    fn tags_round_trip_and_tally() {
        let t = tag(1, 1 << 30, ampccl::DataType::Bf16, 0.875);
        let (k, a) = untag(t);
        assert_eq!(
            k,
            Key {
                op: "allgather",
                bucket: 30,
                dtype: ampccl::DataType::Bf16
            }
        );
        assert!((a - 0.875).abs() < 1e-4);
        let mut tally = Tally::default();
        tally.add(&[
            CallTiming {
                tag: t,
                fast_ms: 1.0,
                pcie_ms: 3.0,
                wall_ms: 3.0,
            },
            CallTiming {
                tag: t,
                fast_ms: 3.0,
                pcie_ms: 1.0,
                wall_ms: 3.0,
            },
        ]);
        let text = tally.render(0);
        assert!(text.contains("allgather"), "{text}");
        assert!(text.contains("2.000"), "{text}");
    }
}
