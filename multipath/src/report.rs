//! `AMPCCL_REPORT=1`: the learned table as text, printed at exit.

use std::fmt::Write;

use super::param::ParamCache;

/// Human-readable size of bucket `b` (the upper bound `2^b` bytes).
fn bucket_size(b: u8) -> String {
    match b {
        0..=9 => format!("{} B", 1u64 << b),
        10..=19 => format!("{} KiB", 1u64 << (b - 10)),
        20..=29 => format!("{} MiB", 1u64 << (b - 20)),
        30..=39 => format!("{} GiB", 1u64 << (b - 30)),
        _ => format!("2^{b} B"),
    }
}

/// The learned table, one line per key (op, size, dtype order), headed by the controller.
pub fn report(algo: &str, params: &ParamCache) -> String {
    let mut s = format!(
        "ampccl multipath: controller {algo}, {} entries\n",
        params.len()
    );
    let _ = writeln!(
        s,
        "{:<14} {:>9} {:>9} {:>7} {:>5} {:>9} {:>9} {:>7}",
        "op", "size<=", "dtype", "alpha", "pcie", "fast GB/s", "pcie GB/s", "calls"
    );
    for (k, p) in params.sorted() {
        let _ = writeln!(
            s,
            "{:<14} {:>9} {:>9} {:>7.4} {:>5} {:>9.1} {:>9.1} {:>7}",
            k.op.name(),
            bucket_size(k.bucket),
            k.dtype.name(),
            p.effective_alpha(),
            if p.use_pcie { "on" } else { "off" },
            p.fast_bw,
            p.pcie_bw,
            p.calls
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{MpOp, OpKey};
    use crate::param::ParamValue;
    use ampccl_runtime::DataType;

    #[test]
    fn one_line_per_entry() {
        let mut c = ParamCache::new();
        let key = OpKey::new(MpOp::AllReduce, 64 << 20, DataType::F32);
        c.insert(
            key,
            ParamValue {
                fast_bw: 301.5,
                pcie_bw: 48.25,
                calls: 50,
                ..ParamValue::split(0.8625)
            },
        );
        c.insert(
            OpKey::new(MpOp::AllGather, 1 << 20, DataType::Bf16),
            ParamValue::FAST_ONLY,
        );
        let r = report("bw", &c);
        let lines: Vec<_> = r.lines().collect();
        assert_eq!(lines.len(), 4, "{r}");
        assert!(
            lines[2].starts_with("AllReduce") && lines[2].contains("64 MiB"),
            "{r}"
        );
        assert!(
            lines[2].contains("0.8625") && lines[2].contains(" on "),
            "{r}"
        );
        assert!(
            lines[3].contains("1 MiB") && lines[3].contains("off"),
            "{r}"
        );
    }
}
