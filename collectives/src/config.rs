//! Tunables, read from the environment once per communicator and logged at init. Each is
//! range-checked: a value that does not parse or lies outside its range fails initialization
//! with an `InvalidArgument` that names the variable and the accepted range. The same holds
//! for every tuned parameter ([`crate::params`], docs/TUNING.md), checked here too.
//!
//! | variable | default | range | meaning |
//! |---|---|---|---|
//! | `AMPCCL_TIMEOUT_S` | 300 | (0, 1e6] s | longest wait for a peer before an operation fails |
//! | `AMPCCL_BUFFSIZE` | 4M | [4K, 1G] bytes | bytes of each CCL buffer (input and output) per rank |
//! | `AMPCCL_SHM_CMA` | 1 | 0 or 1 | use cross-memory attach when the kernel permits |
//! | `AMPCCL_TRANSPORT` | (probe) | `shm`, `ofi`, `tcp` | the transport provider (default: shared memory on one host, TCP across hosts; `ofi`: libfabric's RMA) |
//! | `AMPCCL_OFI_PROVIDER` | (first suitable) | a libfabric provider name | the libfabric provider of `ofi` (like `FI_PROVIDER`); set, it also selects `ofi` |
//! | `AMPCCL_SHM_DISABLE` | 0 | 0 or 1 | `1`: ranks of one host talk over the network provider too |
//! | `AMPCCL_SOCKET_IFNAME` | (the interface that routes to the root) | NCCL's syntax: `eth,ib`, `^docker,lo`, `=eth0` | the interface ranks listen on (read by the bootstrap, like `NCCL_SOCKET_IFNAME`) |
//! | `AMPCCL_HOSTID` | (hostname + boot id) | any text | the host identity ranks compare to tell hosts apart (read by the bootstrap, like `NCCL_HOSTID`) |
//! | `AMPCCL_ALGO_<OP>` | (select) | an algorithm name | force an algorithm, e.g. `AMPCCL_ALGO_ALLREDUCE=AllReduceRing` |
//! | `AMPCCL_SPIN_US` | 5, or 0 when a host has more ranks than CPUs | [0, 100000] µs | how long an idle rank busy-waits before yielding its core |
//! | `AMPCCL_CACHE_BYTES` | (sysfs) | [0, 1T] bytes, 0: sysfs | bytes of the last-level cache algorithms assume (where sysfs is wrong or absent) |
//! | `AMPCCL_LOG` | `warn` | filter | log filter (`tracing` env-filter syntax) |
//!
//! Byte sizes accept the suffixes `K`, `M` and `G` (powers of 1024).

use std::collections::HashMap;
use std::time::Duration;

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{Error, Result};
use ampccl_transport::bootstrap::parse_timeout_s;

use crate::op::OpKind;

/// `AMPCCL_BUFFSIZE` (parsed as a [`Param`]; read per communicator through the lookup).
static BUFFSIZE: Param = Param::new(
    "BUFFSIZE",
    4 << 20,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "bytes of each CCL buffer per rank",
);

/// `AMPCCL_CACHE_BYTES`; 0: read the size from sysfs.
static CACHE_BYTES: Param = Param::new(
    "CACHE_BYTES",
    0,
    (0, 1 << 40),
    Unit::Bytes,
    "bytes of the last-level cache algorithms assume (0: from sysfs)",
);

/// Longest `AMPCCL_SPIN_US` accepted: spinning longer than a scheduler tick buys nothing.
pub const SPIN_US_MAX: f64 = 100_000.0;

/// Communicator configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub timeout: Duration,
    /// Bytes of each CCL buffer.
    pub buffsize: usize,
    pub allow_cma: bool,
    /// The network provider between ranks of one host too (`AMPCCL_SHM_DISABLE`).
    pub shm_disable: bool,
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
            timeout: ampccl_transport::bootstrap::DEFAULT_TIMEOUT,
            buffsize: BUFFSIZE.default as usize,
            allow_cma: true,
            shm_disable: false,
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

    /// As [`Config::from_env`] with a custom lookup (tests). Also checks every tuned
    /// parameter's variable ([`crate::params`]) through the lookup.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = set("AMPCCL_TIMEOUT_S") {
            c.timeout = parse_timeout_s(&v)?;
        }
        if let Some(b) = BUFFSIZE.parse(set("AMPCCL_BUFFSIZE").as_deref())? {
            c.buffsize = b as usize;
        }
        if let Some(v) = set("AMPCCL_SPIN_US") {
            let us = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| (0.0..=SPIN_US_MAX).contains(x))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "AMPCCL_SPIN_US={v:?}: expected microseconds in [0, {SPIN_US_MAX}]"
                    ))
                })?;
            c.spin = Some(Duration::from_nanos((us * 1e3).round() as u64));
        }
        if let Some(b) = CACHE_BYTES.parse(set("AMPCCL_CACHE_BYTES").as_deref())? {
            c.cache_bytes = (b > 0).then_some(b as usize);
        }
        let flag = |k: &str| -> Result<Option<bool>> {
            match set(k).as_deref().map(str::trim) {
                None => Ok(None),
                Some("0") => Ok(Some(false)),
                Some("1") => Ok(Some(true)),
                Some(v) => Err(Error::InvalidArgument(format!(
                    "{k}={v:?}: expected 0 or 1"
                ))),
            }
        };
        if let Some(cma) = flag("AMPCCL_SHM_CMA")? {
            c.allow_cma = cma;
        }
        c.shm_disable = flag("AMPCCL_SHM_DISABLE")?.unwrap_or(false);
        for p in crate::params() {
            p.parse(get(&p.var()).as_deref())?;
        }
        // Read by the `ofi` provider once it opens; checked here, before the bootstrap.
        ampccl_transport::ofi::parse_wait(set("AMPCCL_OFI_WAIT").as_deref())?;
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
        assert!(c.allow_cma);
        assert_eq!(c.buffsize, 65536);
        assert_eq!(
            c.forced.get(&OpKind::AllReduce).map(String::as_str),
            Some("AllReduceRing")
        );
    }

    /// The error of a configuration with only `var=value` set.
    fn err(var: &str, value: &str) -> String {
        match Config::from_lookup(|k| (k == var).then(|| value.into())) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{var}={value:?}: expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn an_unknown_ofi_wait_mode_is_named() {
        let m = err("AMPCCL_OFI_WAIT", "spin");
        assert!(
            m.contains("AMPCCL_OFI_WAIT") && m.contains("fd or poll"),
            "{m}"
        );
        assert!(Config::from_lookup(|k| (k == "AMPCCL_OFI_WAIT").then(|| "poll".into())).is_ok());
    }

    #[test]
    fn every_knob_is_range_checked_and_named() {
        let cases: [(&str, &[&str], &str); 5] = [
            (
                "AMPCCL_TIMEOUT_S",
                &["1e19", "-1", "nan", "inf", "0", "soon"],
                "(0, 1000000]",
            ),
            (
                "AMPCCL_BUFFSIZE",
                &["1e19", "-1", "nan", "12", "2G", "lots"],
                "[4096, 1073741824]",
            ),
            (
                "AMPCCL_SPIN_US",
                &["1e19", "-1", "nan", "inf", "100001", "fast"],
                "[0, 100000]",
            ),
            (
                "AMPCCL_CACHE_BYTES",
                &["1e19", "-1", "nan", "2000G", "big"],
                "[0, 1099511627776]",
            ),
            (
                "AMPCCL_SHM_CMA",
                &["1e19", "-1", "nan", "yes", "2"],
                "0 or 1",
            ),
        ];
        for (var, bad, range) in cases {
            for v in bad {
                let m = err(var, v);
                assert!(m.contains(var) && m.contains(range), "{var}={v}: {m}");
            }
        }
        let ok = |var: &str, v: &str| {
            Config::from_lookup(|k| (k == var).then(|| v.into()))
                .unwrap_or_else(|e| panic!("{var}={v}: {e}"))
        };
        assert_eq!(
            ok("AMPCCL_TIMEOUT_S", "1e6").timeout,
            Duration::from_secs(1_000_000)
        );
        assert_eq!(ok("AMPCCL_BUFFSIZE", "8M").buffsize, 8 << 20);
        assert_eq!(ok("AMPCCL_SPIN_US", "0").spin, Some(Duration::ZERO));
        assert_eq!(
            ok("AMPCCL_SPIN_US", "2.5").spin,
            Some(Duration::from_nanos(2500))
        );
        assert_eq!(ok("AMPCCL_CACHE_BYTES", "32M").cache_bytes, Some(32 << 20));
        assert_eq!(ok("AMPCCL_CACHE_BYTES", "0").cache_bytes, None);
        assert!(!ok("AMPCCL_SHM_CMA", "0").allow_cma);
        assert!(ok("AMPCCL_SHM_CMA", " 1 ").allow_cma);
    }

    #[test]
    fn tuned_parameters_are_checked_through_the_lookup() {
        for p in crate::params() {
            let var = p.var();
            let m = err(&var, "garbage");
            assert!(
                m.contains(&var) && m.contains(&format!("[{}, {}]", p.min, p.max)),
                "{m}"
            );
            if p.max < u64::MAX {
                let above = (p.max + 1).to_string();
                assert!(err(&var, &above).contains(&var));
            }
            if p.min > 0 {
                let below = (p.min - 1).to_string();
                assert!(err(&var, &below).contains(&var));
            }
            let good = p.default.to_string();
            Config::from_lookup(|k| (k == var).then(|| good.clone()))
                .unwrap_or_else(|e| panic!("{var}={good}: {e}"));
        }
        let c = Config::from_lookup(|k| (k == "AMPCCL_ALLGATHER_MESH_MAX").then(|| "32K".into()))
            .unwrap();
        assert_eq!(c.buffsize, 4 << 20);
        let m = err("AMPCCL_CHAIN_PIPELINE_DEPTH", "0");
        assert!(
            m.contains("AMPCCL_CHAIN_PIPELINE_DEPTH") && m.contains("[1, 4096]"),
            "{m}"
        );
    }
}
