//! The CSV format of `ampccl-perf --csv`, shared with the peer scripts
//! (`benches/scripts/compare_peers.py` writes Intel MPI, Open MPI and Gloo results in it), so
//! `ampccl-perf plot` can overlay any of them.
//!
//! One header line, then one row per size and placement:
//! `collective,ranks,bytes,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong`.

use std::path::Path;

/// The header line, also the column order.
pub const HEADER: &str =
    "collective,ranks,bytes,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong";

/// One measured point.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub collective: String,
    pub ranks: usize,
    /// nccl-tests' size: the larger of the input and output buffers.
    pub bytes: usize,
    pub count: usize,
    pub dtype: String,
    pub redop: String,
    /// -1 for collectives without a root.
    pub root: i64,
    /// `out` (out-of-place) or `in` (in-place).
    pub placement: String,
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    pub wrong: usize,
}

impl Row {
    /// The row as one CSV line (no newline).
    pub fn to_line(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{:.3},{:.4},{:.4},{}",
            self.collective,
            self.ranks,
            self.bytes,
            self.count,
            self.dtype,
            self.redop,
            self.root,
            self.placement,
            self.time_us,
            self.algbw_gbs,
            self.busbw_gbs,
            self.wrong
        )
    }

    fn parse(line: &str) -> Result<Row, String> {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 12 {
            return Err(format!("expected 12 fields, found {}", f.len()));
        }
        fn num<T: std::str::FromStr>(name: &str, s: &str) -> Result<T, String> {
            s.parse().map_err(|_| format!("bad {name} {s:?}"))
        }
        Ok(Row {
            collective: f[0].to_string(),
            ranks: num("ranks", f[1])?,
            bytes: num("bytes", f[2])?,
            count: num("count", f[3])?,
            dtype: f[4].to_string(),
            redop: f[5].to_string(),
            root: num("root", f[6])?,
            placement: f[7].to_string(),
            time_us: num("time_us", f[8])?,
            algbw_gbs: num("algbw_gbs", f[9])?,
            busbw_gbs: num("busbw_gbs", f[10])?,
            wrong: num("wrong", f[11])?,
        })
    }
}

/// The whole file: header and rows.
pub fn to_string(rows: &[Row]) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for r in rows {
        s.push_str(&r.to_line());
        s.push('\n');
    }
    s
}

/// Parses a whole file; the first line must be [`HEADER`]. Blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == HEADER => {}
        Some((_, h)) => return Err(format!("not an ampccl-perf CSV: header {h:?}")),
        None => return Err("empty file".into()),
    }
    lines
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| Row::parse(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// Writes `rows` to `path`.
pub fn write(path: &Path, rows: &[Row]) -> Result<(), String> {
    std::fs::write(path, to_string(rows))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Reads and parses `path`.
pub fn read(path: &Path) -> Result<Vec<Row>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: usize, placement: &str, busbw: f64) -> Row {
        Row {
            collective: "allreduce".into(),
            ranks: 2,
            bytes,
            count: bytes / 4,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            placement: placement.into(),
            time_us: 12.125,
            algbw_gbs: 5.4075,
            busbw_gbs: busbw,
            wrong: 0,
        }
    }

    #[test]
    fn round_trip_through_a_file() {
        let rows = vec![
            row(8, "out", 0.0113),
            row(8, "in", 0.0125),
            row(1 << 26, "out", 8.5),
        ];
        let dir = std::env::temp_dir().join(format!("ampccl-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rt.csv");
        write(&path, &rows).unwrap();
        assert_eq!(read(&path).unwrap(), rows);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_other_files_and_bad_fields() {
        assert!(parse("").is_err());
        assert!(parse("bytes,time\n8,1.0\n").unwrap_err().contains("header"));
        let bad = format!("{HEADER}\nallreduce,2,eight,2,float,sum,-1,out,1,1,1,0\n");
        assert!(parse(&bad).unwrap_err().contains("line 2: bad bytes"));
        let short = format!("{HEADER}\nallreduce,2,8\n");
        assert!(parse(&short).unwrap_err().contains("expected 12 fields"));
    }
}
