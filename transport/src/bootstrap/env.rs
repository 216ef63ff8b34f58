//! Configuration from the environment: [`EnvConfig`] (unique-id or torchrun style, see the
//! [module documentation](super)), `AMPCCL_TIMEOUT_S` and `AMPCCL_BOOTSTRAP_ADDR`.
//!
//! Everything reads variables through a lookup closure (`|k| std::env::var(k).ok()` in
//! production) so that tests never touch the process-global environment.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use ampccl_runtime::{Error, Result};

use super::unique_id::{Token, UniqueId};
use super::{DEFAULT_TIMEOUT, TIMEOUT_MAX_S, root, wire};

fn var(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn parse_num<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "environment variable {name}={value:?} is not a valid number"
        ))
    })
}

/// First of `names` that is set, parsed as a number.
fn num_var<T: std::str::FromStr>(
    lookup: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
) -> Result<Option<T>> {
    for name in names {
        if let Some(v) = var(lookup, name) {
            return parse_num(name, &v).map(Some);
        }
    }
    Ok(None)
}

fn required<T: std::str::FromStr>(
    lookup: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
) -> Result<T> {
    num_var(lookup, names)?.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "environment variable {} is not set",
            names.join(" or ")
        ))
    })
}

/// The bootstrap timeout from `AMPCCL_TIMEOUT_S` (seconds, fractional allowed), default 300 s.
pub fn timeout_from_env() -> Result<Duration> {
    timeout_from(&|k: &str| std::env::var(k).ok())
}

pub(crate) fn timeout_from(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Duration> {
    match var(lookup, "AMPCCL_TIMEOUT_S") {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => parse_timeout_s(&v),
    }
}

/// A value of `AMPCCL_TIMEOUT_S`: seconds in (0, [`TIMEOUT_MAX_S`]], fractional allowed.
pub fn parse_timeout_s(v: &str) -> Result<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= TIMEOUT_MAX_S)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "AMPCCL_TIMEOUT_S={v:?}: expected seconds in (0, {TIMEOUT_MAX_S}]"
            ))
        })
}

/// Root bind address for [`UniqueId::generate`]: `AMPCCL_BOOTSTRAP_ADDR` (an IP or `ip:port`),
/// else `127.0.0.1:0`.
pub(crate) fn bootstrap_addr_from(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SocketAddr> {
    let Some(v) = var(lookup, "AMPCCL_BOOTSTRAP_ADDR") else {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    };
    v.parse::<SocketAddr>()
        .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| {
            Error::InvalidArgument(format!(
                "environment variable AMPCCL_BOOTSTRAP_ADDR={v:?} is not an IP address or ip:port"
            ))
        })
}

/// How [`Bootstrap::from_env`](super::Bootstrap::from_env) finds the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// `AMPCCL_UNIQUE_ID` was set.
    UniqueId(UniqueId),
    /// torchrun style; rank 0 hosts the root on `port`.
    Master {
        addr: String,
        port: u16,
        token: Token,
    },
}

/// Parsed environment of [`Bootstrap::from_env`](super::Bootstrap::from_env).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvConfig {
    pub rank: usize,
    pub world: usize,
    /// `AMPCCL_LOCAL_RANK` or `LOCAL_RANK`, if set.
    pub local_rank: Option<usize>,
    pub rendezvous: Rendezvous,
}

impl EnvConfig {
    /// Reads the configuration through `lookup` (e.g. `|k| std::env::var(k).ok()`); a missing or
    /// invalid variable is an [`Error::InvalidArgument`] naming it.
    pub fn parse(lookup: impl Fn(&str) -> Option<String>) -> Result<EnvConfig> {
        let lookup: &dyn Fn(&str) -> Option<String> = &lookup;
        let rank: usize = required(lookup, &["AMPCCL_RANK", "RANK"])?;
        let world: usize = required(lookup, &["AMPCCL_WORLD_SIZE", "WORLD_SIZE"])?;
        let local_rank = num_var(lookup, &["AMPCCL_LOCAL_RANK", "LOCAL_RANK"])?;
        let rendezvous = if let Some(hex) = var(lookup, "AMPCCL_UNIQUE_ID") {
            let id = UniqueId::from_hex(&hex).map_err(|e| {
                Error::InvalidArgument(format!("environment variable AMPCCL_UNIQUE_ID: {e}"))
            })?;
            Rendezvous::UniqueId(id)
        } else {
            let addr = var(lookup, "MASTER_ADDR").ok_or_else(|| {
                Error::InvalidArgument(
                    "environment variable MASTER_ADDR is not set (nor AMPCCL_UNIQUE_ID)".into(),
                )
            })?;
            let port: u16 = required(lookup, &["MASTER_PORT"])?;
            let secret = var(lookup, "AMPCCL_TOKEN")
                .or_else(|| var(lookup, "TORCHELASTIC_RUN_ID"))
                .unwrap_or_default();
            let token = wire::fnv1a128(&[
                b"ampccl-bootstrap-v1",
                addr.as_bytes(),
                port.to_string().as_bytes(),
                world.to_string().as_bytes(),
                secret.as_bytes(),
            ]);
            Rendezvous::Master { addr, port, token }
        };
        Ok(EnvConfig {
            rank,
            world,
            local_rank,
            rendezvous,
        })
    }
}

impl EnvConfig {
    /// The id to join: the given one, or in `Master` mode the root address `MASTER_ADDR:MASTER_PORT`
    /// with the derived token. Rank 0 in `Master` mode also binds the root (on the wildcard address
    /// of `MASTER_ADDR`'s family) and starts its thread, which lives at most `timeout`.
    pub fn unique_id(&self, timeout: Duration) -> Result<UniqueId> {
        match &self.rendezvous {
            Rendezvous::UniqueId(id) => Ok(*id),
            Rendezvous::Master { addr, port, token } => {
                let target = (addr.as_str(), *port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "environment variable MASTER_ADDR={addr:?} does not resolve"
                        ))
                    })?;
                if self.rank == 0 {
                    let any = match target.ip() {
                        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    };
                    let listener = TcpListener::bind((any, *port)).map_err(|e| {
                        Error::system(format!("bootstrap root: bind MASTER_PORT {port}"), e)
                    })?;
                    drop(root::spawn_root(listener, *token, timeout)?);
                }
                Ok(UniqueId::new(target, *token))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;
    use crate::bootstrap::Bootstrap;

    const T: Duration = Duration::from_secs(20);

    fn localhost() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    fn free_port() -> u16 {
        TcpListener::bind(localhost())
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn env(vars: &[(&str, String)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn from_env_master_mode() {
        let port = free_port().to_string();
        let world = 3;
        let results: Vec<(usize, usize, Vec<Vec<u8>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let lookup = env(&[
                        ("MASTER_ADDR", "127.0.0.1".into()),
                        ("MASTER_PORT", port.clone()),
                        ("RANK", rank.to_string()),
                        ("WORLD_SIZE", world.to_string()),
                        ("LOCAL_RANK", (10 + rank).to_string()),
                    ]);
                    s.spawn(move || {
                        let bs = Bootstrap::from_lookup(lookup, T).unwrap();
                        let all = bs
                            .allgather(0, &vec![bs.rank() as u8; bs.rank() + 1])
                            .unwrap();
                        (bs.rank(), bs.local_rank(), all)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (r, local, all)) in results.into_iter().enumerate() {
            assert_eq!((r, local), (rank, 10 + rank));
            assert_eq!(
                all,
                (0..world).map(|i| vec![i as u8; i + 1]).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn env_config_parsing() {
        let base = |extra: &[(&str, &str)]| {
            let mut v: Vec<(&str, String)> = vec![
                ("MASTER_ADDR", "10.0.0.1".into()),
                ("MASTER_PORT", "29500".into()),
                ("RANK", "1".into()),
                ("WORLD_SIZE", "4".into()),
            ];
            for (k, val) in extra {
                v.retain(|(kk, _)| kk != k);
                if !val.is_empty() {
                    v.push((k, val.to_string()));
                }
            }
            EnvConfig::parse(env(&v))
        };
        let cfg = base(&[]).unwrap();
        assert_eq!((cfg.rank, cfg.world, cfg.local_rank), (1, 4, None));
        let Rendezvous::Master { token, .. } = cfg.rendezvous.clone() else {
            panic!()
        };
        let Rendezvous::Master { token: t2, .. } =
            base(&[("AMPCCL_TOKEN", "job7")]).unwrap().rendezvous
        else {
            panic!()
        };
        assert_ne!(token, t2);
        assert_eq!(base(&[]).unwrap(), cfg, "token is deterministic");
        let err_names = |extra: &[(&str, &str)], name: &str| match base(extra) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(name), "{m} should name {name}"),
            other => panic!("expected InvalidArgument naming {name}, got {other:?}"),
        };
        err_names(&[("MASTER_ADDR", "")], "MASTER_ADDR");
        err_names(&[("MASTER_PORT", "")], "MASTER_PORT");
        err_names(&[("MASTER_PORT", "99999")], "MASTER_PORT");
        err_names(&[("RANK", "")], "RANK");
        err_names(&[("RANK", "one")], "RANK");
        err_names(&[("WORLD_SIZE", "")], "WORLD_SIZE");
        err_names(&[("LOCAL_RANK", "-1")], "LOCAL_RANK");
        err_names(&[("AMPCCL_UNIQUE_ID", "abcd")], "AMPCCL_UNIQUE_ID");
        // The AMPCCL_ variables win; a unique id replaces MASTER_*.
        let id = UniqueId::new("127.0.0.1:5".parse().unwrap(), 99);
        let cfg = base(&[
            ("AMPCCL_UNIQUE_ID", &id.to_hex()),
            ("AMPCCL_RANK", "3"),
            ("MASTER_ADDR", ""),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.rendezvous), (3, Rendezvous::UniqueId(id)));
        let bad = base(&[("RANK", "4")]).unwrap();
        assert!(matches!(
            Bootstrap::from_config(&bad, T),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "0".into())])),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "1.5".into())])).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(timeout_from(&env(&[])).unwrap(), DEFAULT_TIMEOUT);
        for bad in ["1e19", "-1", "nan", "inf", "soon", "1000001"] {
            let e = timeout_from(&env(&[("AMPCCL_TIMEOUT_S", bad.into())]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("AMPCCL_TIMEOUT_S") && e.contains("(0, 1000000]"),
                "{e}"
            );
        }
        assert_eq!(
            timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "1e6".into())])).unwrap(),
            Duration::from_secs(1_000_000)
        );
        assert!(bootstrap_addr_from(&env(&[("AMPCCL_BOOTSTRAP_ADDR", "nope".into())])).is_err());
        assert_eq!(
            bootstrap_addr_from(&env(&[("AMPCCL_BOOTSTRAP_ADDR", "::1".into())])).unwrap(),
            "[::1]:0".parse().unwrap()
        );
    }

    #[test]
    fn from_env_unique_id_mode() {
        let (id, _root) = UniqueId::generate_with(localhost(), T).unwrap();
        let hex = id.to_hex();
        let ranks: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let lookup = env(&[
                        ("AMPCCL_UNIQUE_ID", hex.clone()),
                        ("AMPCCL_RANK", r.to_string()),
                        ("RANK", "7".into()),
                        ("WORLD_SIZE", "2".into()),
                    ]);
                    s.spawn(move || Bootstrap::from_lookup(lookup, T).unwrap().rank())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(ranks, [0, 1]);
    }
}
