//! Multipath tunables, read from the environment in one place and logged once at init.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `AMPCCL_SPLIT_CONTROLLER` | `bw` | split controller: `bw`, `tcp`, `dcqcn`, `static`, `static:<alpha>` (the older name `AMPCCL_ALGO` is accepted, with a deprecation warning) |
//! | `AMPCCL_PARAM_FILE` | (none) | learned table: loaded at init if valid, saved at destroy |
//! | `AMPCCL_REPORT` | 0 | `1`: print the learned table ([`mod@super::report`]) at exit |

use std::path::PathBuf;

use ampccl_runtime::{Error, Result};

use super::controller::{self, Controller};

/// Multipath configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MpConfig {
    /// Controller spec, valid for [`controller::by_name`].
    pub algo: String,
    pub param_file: Option<PathBuf>,
    pub report: bool,
}

impl Default for MpConfig {
    fn default() -> Self {
        MpConfig {
            algo: controller::DEFAULT.to_string(),
            param_file: None,
            report: false,
        }
    }
}

/// The variable that names the split controller.
pub const CONTROLLER_VAR: &str = "AMPCCL_SPLIT_CONTROLLER";
/// Its former name, which clashed with the native library's `AMPCCL_ALGO_<OP>`.
const DEPRECATED_CONTROLLER_VAR: &str = "AMPCCL_ALGO";

/// The controller spec and the variable it came from: [`CONTROLLER_VAR`], else the deprecated
/// name (logged once).
fn controller_spec(get: &impl Fn(&str) -> Option<String>) -> Option<(String, &'static str)> {
    let set = |k: &'static str| get(k).filter(|s| !s.trim().is_empty()).map(|v| (v, k));
    set(CONTROLLER_VAR).or_else(|| {
        let old = set(DEPRECATED_CONTROLLER_VAR)?;
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::warn!("{DEPRECATED_CONTROLLER_VAR} is deprecated for the split controller; use {CONTROLLER_VAR}")
        });
        Some(old)
    })
}

impl MpConfig {
    /// Defaults overridden by the environment.
    pub fn from_env() -> Result<MpConfig> {
        MpConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`MpConfig::from_env`] with a custom lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<MpConfig> {
        let mut c = MpConfig::default();
        if let Some((a, var)) = controller_spec(&get) {
            if controller::by_name(&a).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "{var}={a:?}: expected bw, tcp, dcqcn, static or static:<alpha in 0..=1>"
                )));
            }
            c.algo = a.trim().to_string();
        }
        c.param_file = get("AMPCCL_PARAM_FILE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        c.report = match get("AMPCCL_REPORT").as_deref().map(str::trim) {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(Error::InvalidArgument(format!(
                    "AMPCCL_REPORT={v:?}: expected 0 or 1"
                )));
            }
        };
        tracing::debug!(?c, "multipath config");
        Ok(c)
    }

    /// A fresh controller of the configured kind.
    pub fn controller(&self) -> Box<dyn Controller> {
        controller::by_name(&self.algo).unwrap_or_else(|| Box::new(controller::bw::Bw::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_rejects_garbage() {
        let c = MpConfig::from_lookup(|k| match k {
            "AMPCCL_SPLIT_CONTROLLER" => Some("static:0.8".into()),
            "AMPCCL_PARAM_FILE" => Some("/tmp/p.json".into()),
            "AMPCCL_REPORT" => Some("1".into()),
            _ => None,
        })
        .expect("config");
        assert_eq!(c.controller().name(), "static");
        assert_eq!(c.param_file, Some(PathBuf::from("/tmp/p.json")));
        assert!(c.report);
        let d = MpConfig::from_lookup(|_| None).expect("defaults");
        assert_eq!((d.controller().name(), d.report), ("bw", false));
        let bad = MpConfig::from_lookup(|k| (k == CONTROLLER_VAR).then(|| "cubic".into()));
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("AMPCCL_SPLIT_CONTROLLER")
        );
    }

    #[test]
    fn the_deprecated_name_still_works_and_the_new_one_wins() {
        let old = MpConfig::from_lookup(|k| (k == "AMPCCL_ALGO").then(|| "tcp".into()));
        assert_eq!(old.expect("config").controller().name(), "tcp");
        let both = MpConfig::from_lookup(|k| match k {
            "AMPCCL_ALGO" => Some("tcp".into()),
            "AMPCCL_SPLIT_CONTROLLER" => Some("dcqcn".into()),
            _ => None,
        });
        assert_eq!(both.expect("config").controller().name(), "dcqcn");
        let bad = MpConfig::from_lookup(|k| (k == "AMPCCL_ALGO").then(|| "cubic".into()));
        assert!(bad.unwrap_err().to_string().contains("AMPCCL_ALGO="));
    }
}
