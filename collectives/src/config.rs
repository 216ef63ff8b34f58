//! Tunables, read from the environment once per communicator and logged at init.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `AMPCCL_TIMEOUT_S` | 300 | longest wait for a peer before an operation fails |
//! | `AMPCCL_BUFFSIZE` | 4194304 | bytes of each CCL buffer (input and output) per rank |
//! | `AMPCCL_SHM_CMA` | 1 | use cross-memory attach when the kernel permits |
//! | `AMPCCL_TRANSPORT` | (probe) | force a transport provider (`shm`) |
//! | `AMPCCL_ALGO_<OP>` | (select) | force an algorithm, e.g. `AMPCCL_ALGO_ALLREDUCE=AllReduceRing` |
//! | `AMPCCL_SPIN_US` | 5, or 0 when a host has more ranks than CPUs | µs an idle rank busy-waits before yielding its core |
//! | `AMPCCL_CACHE_BYTES` | (sysfs) | bytes of the last-level cache algorithms assume (where sysfs is wrong or absent) |
//! | `AMPCCL_LOG` | `warn` | log filter (`tracing` env-filter syntax) |

use std::collections::HashMap;
use std::time::Duration;

use ampccl_runtime::{Error, Result};

use crate::op::OpKind;

/// Communicator configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub timeout: Duration,
    /// Bytes of each CCL buffer.
    pub buffsize: usize,
    pub allow_cma: bool,
    pub transport: Option<String>,
    /// Forced algorithm per operation kind.
    pub forced: HashMap<OpKind, String>,
    /// Clear-to-send FIFO depth.
    pub fifo_depth: usize,
    /// Busy-wait before yielding; `None`: decided from ranks per host and CPUs.
    pub spin: Option<Duration>,
    /// Bytes of the last-level cache; `None`: read from sysfs.
    pub cache_bytes: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            buffsize: 4 << 20,
            allow_cma: true,
            transport: None,
            forced: HashMap::new(),
            fifo_depth: 256,
            spin: None,
            cache_bytes: None,
        }
    }
}

impl Config {
    /// Defaults overridden by the `AMPCCL_*` environment variables.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`] with a custom lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let num = |k: &str| -> Result<Option<f64>> {
            get(k)
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x > 0.0)
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!("{k}={v:?} is not a positive number"))
                        })
                })
                .transpose()
        };
        if let Some(s) = num("AMPCCL_TIMEOUT_S")? {
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(b) = num("AMPCCL_BUFFSIZE")? {
            let b = b as usize;
            if !(4096..=1 << 30).contains(&b) {
                return Err(Error::InvalidArgument(format!(
                    "AMPCCL_BUFFSIZE={b} must be between 4096 and 1 GiB"
                )));
            }
            c.buffsize = b;
        }
        if let Some(v) = get("AMPCCL_SPIN_US") {
            let us = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0);
            let us = us.ok_or_else(|| {
                Error::InvalidArgument(format!("AMPCCL_SPIN_US={v:?} is not a number >= 0"))
            })?;
            c.spin = Some(Duration::from_secs_f64(us / 1e6));
        }
        if let Some(b) = num("AMPCCL_CACHE_BYTES")? {
            c.cache_bytes = Some(b as usize);
        }
        if let Some(v) = get("AMPCCL_SHM_CMA") {
            c.allow_cma = v.trim() != "0";
        }
        c.transport = get("AMPCCL_TRANSPORT").filter(|s| !s.is_empty());
        for kind in OpKind::ALL {
            if let Some(v) = get(&format!("AMPCCL_ALGO_{}", kind.name().to_uppercase())) {
                c.forced.insert(kind, v);
            }
        }
        Ok(c)
    }
}

pub use ampccl_runtime::log::init_logging;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_rejects_garbage() {
        let c = Config::from_lookup(|k| match k {
            "AMPCCL_TIMEOUT_S" => Some("2.5".into()),
            "AMPCCL_BUFFSIZE" => Some("65536".into()),
            "AMPCCL_ALGO_ALLREDUCE" => Some("AllReduceRing".into()),
            "AMPCCL_CACHE_BYTES" => Some("65536".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.cache_bytes, Some(65536));
        assert_eq!(c.buffsize, 65536);
        assert_eq!(
            c.forced.get(&OpKind::AllReduce).map(String::as_str),
            Some("AllReduceRing")
        );
        assert!(Config::from_lookup(|k| (k == "AMPCCL_TIMEOUT_S").then(|| "soon".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "AMPCCL_BUFFSIZE").then(|| "12".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "AMPCCL_CACHE_BYTES").then(|| "-1".into())).is_err());
    }
}
