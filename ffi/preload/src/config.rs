//! Settings of the interposer, read once from the environment and logged at the first
//! communicator.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `AMPCCL_ENABLE` | `1` | `0`: every call goes straight to NCCL |
//! | `AMPCCL_ENABLE_PCIE` | `1` | `0`: keep the bookkeeping, never split |
//! | `AMPCCL_SPLIT_CONTROLLER` | `bw` | split controller: `bw`, `tcp`, `dcqcn`, `static`, `static:<alpha>` (formerly `AMPCCL_ALGO`, still accepted) |
//! | `AMPCCL_ALPHA` | unset | a static split: fraction of each call's bytes carried by NCCL (same as `AMPCCL_SPLIT_CONTROLLER=static:<alpha>`) |
//! | `AMPCCL_PARAM_FILE` | unset | learned table saved at destroy, loaded at init |
//! | `AMPCCL_MIN_MSG_SIZE` | `256M` | calls moving fewer bytes are not split (on 2×H200 the PCIe path's fixed costs outweigh its bandwidth below this) |
//! | `AMPCCL_MIN_CHUNK_SIZE` | `1M` | PCIe parts smaller than this are not worth it |
//! | `AMPCCL_ALIGN` | `4096` | the PCIe part is a multiple of this many bytes |
//! | `AMPCCL_CHUNK_SIZE` | `4M` | pipeline chunk (staging slot) per rank |
//! | `AMPCCL_SLOTS` | `4` | staging slots per rank (pipeline depth) |
//! | `AMPCCL_REPORT` | `0` | `1`: print each communicator's timed calls (split and NCCL-alone rows) at destroy |
//! | `AMPCCL_LOG` | `warn` | log filter |
//! | `AMPCCL_INJECT_FAULT` | unset | testing, `<rank>:<steps>`: the first split call's PCIe part on that rank of each communicator fails after that many pipeline steps |

use std::sync::OnceLock;

use ampccl_runtime::param::{Param, Unit};

use ampccl_multipath::config::{CONTROLLER_VAR, MpConfig};
use ampccl_multipath::planner::PlannerRules;

/// The interposer's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub pcie: bool,
    /// Controller, parameter file, report.
    pub mp: MpConfig,
    pub rules: PlannerRules,
    pub chunk_bytes: usize,
    pub slots: usize,
    /// `AMPCCL_INJECT_FAULT`: (rank, pipeline steps).
    pub fault: Option<(usize, usize)>,
}

/// Whether the interposer is on (`AMPCCL_ENABLE`, read once; cheap afterwards).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| enable_from(|k| std::env::var(k).ok()))
}

/// `AMPCCL_ENABLE` (0 or 1) from a variable lookup.
fn enable_from(get: impl Fn(&str) -> Option<String>) -> bool {
    static ENABLE: Param = Param::new(
        "ENABLE",
        1,
        (0, 1),
        Unit::Count,
        "0: pass every call through",
    );
    knob(&ENABLE, &get) == 1
}

/// The settings (read once).
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        ampccl_runtime::log::init_logging();
        let s = Settings::from_lookup(|k| std::env::var(k).ok());
        tracing::info!(?s, "ampccl preload settings");
        s
    })
}

/// The interposer's numeric knobs, range-checked like the library's tuned parameters (a value
/// outside the range is logged with the range and the default kept: the interposer never
/// makes an NCCL program fail).
static CHUNK_SIZE: Param = Param::new(
    "CHUNK_SIZE",
    4 << 20,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "pipeline chunk (staging slot) per rank",
);
static MIN_MSG_SIZE: Param = Param::new(
    "MIN_MSG_SIZE",
    256 << 20,
    (0, 1 << 50),
    Unit::Bytes,
    "calls moving fewer bytes are not split",
);
static ALIGN: Param = Param::new(
    "ALIGN",
    4096,
    (1, 1 << 30),
    Unit::Bytes,
    "the PCIe part is a multiple of this many bytes",
);
static MIN_CHUNK_SIZE: Param = Param::new(
    "MIN_CHUNK_SIZE",
    1 << 20,
    (0, 1 << 50),
    Unit::Bytes,
    "PCIe parts smaller than this stay on NCCL",
);
static SLOTS: Param = Param::new("SLOTS", 4, (2, 64), Unit::Count, "staging slots per rank");
static ENABLE_PCIE: Param = Param::new("ENABLE_PCIE", 1, (0, 1), Unit::Count, "0: never split");

/// `p`'s value from `get`, or its default with a warning that names the accepted range.
fn knob(p: &Param, get: &impl Fn(&str) -> Option<String>) -> u64 {
    p.parse(get(&p.var()).as_deref())
        .unwrap_or_else(|e| {
            tracing::warn!("{e}; using the default {}", p.default);
            None
        })
        .unwrap_or(p.default)
}

impl Settings {
    /// Settings from a variable lookup; values that do not parse or lie outside their range
    /// fall back to the default with a warning.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Settings {
        let bytes = |p: &Param| knob(p, &get) as usize;
        Settings {
            pcie: knob(&ENABLE_PCIE, &get) == 1,
            mp: multipath(&get),
            rules: PlannerRules {
                min_msg_bytes: bytes(&MIN_MSG_SIZE),
                align_bytes: bytes(&ALIGN),
                min_pcie_bytes: bytes(&MIN_CHUNK_SIZE),
            },
            chunk_bytes: bytes(&CHUNK_SIZE).next_multiple_of(4096),
            slots: bytes(&SLOTS),
            fault: get("AMPCCL_INJECT_FAULT").and_then(|v| {
                let parsed = v
                    .split_once(':')
                    .and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
                if parsed.is_none() {
                    tracing::warn!("AMPCCL_INJECT_FAULT={v:?}: expected <rank>:<steps>; ignored");
                }
                parsed
            }),
        }
    }
}

/// The multipath settings; `AMPCCL_ALPHA` selects the static controller with that split.
fn multipath(get: &impl Fn(&str) -> Option<String>) -> MpConfig {
    let mut mp = MpConfig::from_lookup(get).unwrap_or_else(|e| {
        tracing::warn!("{e}; using the default controller");
        let controller_vars = [CONTROLLER_VAR, "AMPCCL_ALGO"];
        MpConfig::from_lookup(|k| (!controller_vars.contains(&k)).then(|| get(k)).flatten())
            .unwrap_or_default()
    });
    if let Some(v) = get("AMPCCL_ALPHA") {
        match v.trim().parse::<f64>() {
            Ok(a) if (0.0..=1.0).contains(&a) => mp.algo = format!("static:{a}"),
            _ => tracing::warn!("AMPCCL_ALPHA={v:?} is not a number in 0..=1; ignored"),
        }
    }
    mp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let s = Settings::from_lookup(|_| None);
        assert!(enable_from(|_| None) && s.pcie);
        assert_eq!(s.mp.algo, "bw");
        assert_eq!(s.chunk_bytes, 4 << 20);
        assert_eq!(s.rules.min_msg_bytes, 256 << 20, "the documented default");
        let env = |k: &str| match k {
            "AMPCCL_ENABLE" => Some("0".to_string()),
            "AMPCCL_ALPHA" => Some("0.5".into()),
            "AMPCCL_MIN_MSG_SIZE" => Some("1M".into()),
            "AMPCCL_CHUNK_SIZE" => Some("5000".into()),
            "AMPCCL_SLOTS" => Some("3".into()),
            "AMPCCL_INJECT_FAULT" => Some("1:3".into()),
            _ => None,
        };
        let s = Settings::from_lookup(env);
        assert!(!enable_from(env));
        assert_eq!(s.mp.algo, "static:0.5");
        assert_eq!(s.rules.min_msg_bytes, 1 << 20);
        assert_eq!(s.chunk_bytes, 8192, "rounded up to pages");
        assert_eq!(s.slots, 3);
        assert_eq!(
            (Settings::from_lookup(|_| None).fault, s.fault),
            (None, Some((1, 3)))
        );
        // Out of range or garbage: the default (with a warning naming the range).
        for (k, v) in [
            ("AMPCCL_SLOTS", "1"),
            ("AMPCCL_SLOTS", "1e9"),
            ("AMPCCL_CHUNK_SIZE", "1T"),
            ("AMPCCL_CHUNK_SIZE", "-4"),
            ("AMPCCL_ENABLE_PCIE", "yes"),
        ] {
            let s = Settings::from_lookup(|key| (key == k).then(|| v.to_string()));
            assert_eq!(s, Settings::from_lookup(|_| None), "{k}={v}");
        }
        assert!(enable_from(|k| (k == "AMPCCL_ENABLE").then(|| "2".into())));
        let fault = Settings::from_lookup(|k| (k == "AMPCCL_INJECT_FAULT").then(|| "x".into()));
        assert_eq!(fault.fault, None, "unparsable: ignored");
        let bad = Settings::from_lookup(|k| (k == "AMPCCL_ALPHA").then(|| "2".to_string()));
        assert_eq!(bad.mp.algo, "bw");
        let algo = Settings::from_lookup(|k| (k == CONTROLLER_VAR).then(|| "nonsense".to_string()));
        assert_eq!(
            algo.mp.algo, "bw",
            "a bad controller name falls back to the default"
        );
    }
}
