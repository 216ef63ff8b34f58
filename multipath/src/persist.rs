//! `AMPCCL_PARAM_FILE`: the learned table saved as JSON and loaded at init (warm start).
//!
//! ```json
//! {"format":"ampccl-multipath-params","version":1,"nranks":2,
//!  "entries":[{"op":"AllReduce","bucket":26,"dtype":"float","alpha":0.86,"use_pcie":true,
//!              "fast_bw":301.5,"pcie_bw":48.2,"calls":50}]}
//! ```
//! A file is used only if it is whole and valid: the format tag and [`FORMAT_VERSION`] match,
//! it was learned on a domain of the same `nranks`, and every entry names a known op and dtype
//! with alpha in `0..=1` and finite, non-negative bandwidths. Anything else (stale, corrupt,
//! unreadable) is ignored with a warning — a warm start is an optimisation, never an error.
//! Saving writes a temporary file and renames it, so a crash never leaves half a file.

use std::path::Path;

use ampccl_runtime::{DataType, Error, Result};
use serde::{Deserialize, Serialize};

use super::key::{MpOp, OpKey};
use super::param::{ParamCache, ParamValue};

/// Format tag of the file.
pub const FORMAT: &str = "ampccl-multipath-params";
/// Version of the file layout; other versions are ignored.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    version: u32,
    nranks: usize,
    entries: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    op: String,
    bucket: u8,
    dtype: String,
    alpha: f32,
    use_pcie: bool,
    fast_bw: f32,
    pcie_bw: f32,
    calls: u32,
}

/// Saves `params`, learned on a domain of `nranks` ranks, to `path`.
pub fn save(path: &Path, nranks: usize, params: &ParamCache) -> Result<()> {
    let entries = params
        .sorted()
        .into_iter()
        .map(|(k, p)| Entry {
            op: k.op.name().to_string(),
            bucket: k.bucket,
            dtype: k.dtype.name().to_string(),
            alpha: p.alpha,
            use_pcie: p.use_pcie,
            fast_bw: p.fast_bw,
            pcie_bw: p.pcie_bw,
            calls: p.calls,
        })
        .collect();
    let file = File {
        format: FORMAT.to_string(),
        version: FORMAT_VERSION,
        nranks,
        entries,
    };
    let text = serde_json::to_string_pretty(&file)
        .map_err(|e| Error::Internal(format!("parameter file: {e}")))?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| Error::system(tmp.display(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::system(path.display(), e))
}

/// The table saved at `path` for a domain of `nranks` ranks; `None` (with a warning) when the
/// file is stale or corrupt, `None` quietly when there is no file.
pub fn load(path: &Path, nranks: usize) -> Option<ParamCache> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(
                "AMPCCL_PARAM_FILE {}: unreadable, ignored: {e}",
                path.display()
            );
            return None;
        }
    };
    match parse(&text, nranks) {
        Ok(c) => Some(c),
        Err(why) => {
            tracing::warn!("AMPCCL_PARAM_FILE {}: {why}; ignored", path.display());
            None
        }
    }
}

/// Parses and validates a file's text.
fn parse(text: &str, nranks: usize) -> std::result::Result<ParamCache, String> {
    let f: File = serde_json::from_str(text).map_err(|e| format!("corrupt ({e})"))?;
    if f.format != FORMAT {
        return Err(format!("not a parameter file (format {:?})", f.format));
    }
    if f.version != FORMAT_VERSION {
        return Err(format!(
            "format version {} (this build reads {FORMAT_VERSION})",
            f.version
        ));
    }
    if f.nranks != nranks {
        return Err(format!(
            "learned with {} ranks, this domain has {nranks}",
            f.nranks
        ));
    }
    let mut c = ParamCache::new();
    for (i, e) in f.entries.iter().enumerate() {
        let op = MpOp::parse(&e.op).ok_or_else(|| format!("entry {i}: unknown op {:?}", e.op))?;
        let dtype = DataType::parse(&e.dtype)
            .ok_or_else(|| format!("entry {i}: unknown dtype {:?}", e.dtype))?;
        if e.bucket > 64 {
            return Err(format!("entry {i}: size bucket {} out of range", e.bucket));
        }
        let p = ParamValue {
            alpha: e.alpha,
            use_pcie: e.use_pcie,
            fast_bw: e.fast_bw,
            pcie_bw: e.pcie_bw,
            calls: e.calls,
        };
        if !p.is_valid() {
            return Err(format!("entry {i}: values out of range ({p:?})"));
        }
        c.insert(
            OpKey {
                op,
                bucket: e.bucket,
                dtype,
            },
            p,
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ParamCache {
        let mut c = ParamCache::new();
        let k = |op, bucket, dtype| OpKey { op, bucket, dtype };
        c.insert(
            k(MpOp::AllReduce, 26, DataType::F32),
            ParamValue {
                fast_bw: 301.5,
                pcie_bw: 48.25,
                calls: 50,
                ..ParamValue::split(0.8625)
            },
        );
        c.insert(
            k(MpOp::AllGather, 20, DataType::Bf16),
            ParamValue::FAST_ONLY,
        );
        c
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ampccl-params-{}-{name}.json", std::process::id()))
    }

    #[test]
    fn round_trip() {
        let path = tmp("rt");
        save(&path, 4, &table()).expect("save");
        let back = load(&path, 4).expect("load");
        assert_eq!(back.sorted(), table().sorted());
        assert!(load(&path, 2).is_none(), "other nranks");
        std::fs::remove_file(&path).expect("cleanup");
        assert!(load(&path, 4).is_none(), "missing file");
    }

    #[test]
    fn corrupt_or_stale_files_are_refused() {
        let good = serde_json::to_string(&File {
            format: FORMAT.into(),
            version: FORMAT_VERSION,
            nranks: 2,
            entries: vec![Entry {
                op: "AllReduce".into(),
                bucket: 20,
                dtype: "float".into(),
                alpha: 0.9,
                use_pcie: true,
                fast_bw: 1.0,
                pcie_bw: 1.0,
                calls: 1,
            }],
        })
        .expect("json");
        assert_eq!(parse(&good, 2).map(|c| c.len()), Ok(1));
        let bad = [
            good.replace("\"version\":1", "\"version\":2"),
            good.replace(FORMAT, "something-else"),
            good.replace("\"alpha\":0.9", "\"alpha\":1.5"),
            good.replace("\"alpha\":0.9", "\"alpha\":null"),
            good.replace("\"fast_bw\":1.0", "\"fast_bw\":-1.0"),
            good.replace("AllReduce", "AllToAll"),
            good.replace("float", "float128"),
            good.replace("\"bucket\":20", "\"bucket\":65"),
            good[..good.len() / 2].to_string(),
            "garbage".to_string(),
        ];
        for b in &bad {
            assert!(parse(b, 2).is_err(), "accepted {b}");
        }
        let path = tmp("corrupt");
        std::fs::write(&path, &bad[8]).expect("write");
        assert!(load(&path, 2).is_none());
        std::fs::remove_file(&path).expect("cleanup");
    }
}
