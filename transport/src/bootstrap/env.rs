//! Configuration from the environment: [`EnvConfig`] (unique-id or torchrun style, see the
//! [module documentation](super)), `AMPCCL_TIMEOUT_S` and `AMPCCL_BOOTSTRAP_ADDR`.
//!
//! Everything reads variables through a lookup closure (`|k| std::env::var(k).ok()` in
//! production) so that tests never touch the process-global environment.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use ampccl_runtime::{Error, Result};

use super::launcher::{self, Source};
use super::unique_id::{Token, UniqueId};
use super::{DEFAULT_TIMEOUT, MAX_RANKS, TIMEOUT_MAX_S, root, wire};

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

/// Variables that name the job, looked for in this order; the first one set (and, for
/// `TORCHELASTIC_RUN_ID`, not torchrun's default `none`) keys the derived token of `MASTER_ADDR`
/// mode. Each is the same on every rank of one job and differs between jobs:
/// `AMPCCL_TOKEN` (set by the user), `TORCHELASTIC_RUN_ID` (torchrun's `--rdzv-id`, a fresh
/// UUID with `--standalone`), `SLURM_JOB_ID` (Slurm), `PMIX_NAMESPACE` (PMIx launchers: Open
/// MPI 5 / PRRTE, Slurm with `--mpi=pmix`), `OMPI_MCA_orte_hnp_uri` (Open MPI up to 4: the job
/// family of `mpirun`), `LSB_JOBID` (LSF), `PBS_JOBID` (PBS / Torque), `FLUX_JOB_ID` (Flux).
pub const JOB_ID_VARS: &[&str] = &[
    "AMPCCL_TOKEN",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_hnp_uri",
    "LSB_JOBID",
    "PBS_JOBID",
    "FLUX_JOB_ID",
];

/// The first of [`JOB_ID_VARS`] that is set: (name, value).
fn job_id(lookup: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    JOB_ID_VARS.iter().find_map(|&name| {
        var(lookup, name)
            // torchrun's default `--rdzv-id`: the same for every job.
            .filter(|v| !(name == "TORCHELASTIC_RUN_ID" && v == "none"))
            .map(|v| (name, v))
    })
}

/// How [`Bootstrap::from_env`](super::Bootstrap::from_env) finds the rendezvous (see
/// [`Source::detect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// `AMPCCL_UNIQUE_ID` was set.
    UniqueId(UniqueId),
    /// torchrun's agent store at `addr:port`; the id travels under keys below `scope`
    /// (`ampccl/<run id>/<restart count>`).
    TcpStore {
        addr: String,
        port: u16,
        scope: String,
    },
    /// PMI-1 on the descriptor `fd` (`PMI_FD`); `local_world` is `MPI_LOCALNRANKS`.
    Pmi {
        fd: String,
        local_world: Option<usize>,
    },
    /// torchrun style; rank 0 hosts the root on `addr:port`.
    Master {
        addr: String,
        port: u16,
        token: Token,
        /// Which of [`JOB_ID_VARS`] keyed the token, if any.
        job_id_from: Option<&'static str>,
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
        let source = Source::detect(lookup)?;
        // Under PMI the launcher's numbering wins over a RANK the shell may carry.
        let (rank_vars, world_vars): (&[&str], &[&str]) = match source {
            Source::Pmi => (
                &["AMPCCL_RANK", "PMI_RANK"],
                &["AMPCCL_WORLD_SIZE", "PMI_SIZE"],
            ),
            _ => (
                &["AMPCCL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"],
                &[
                    "AMPCCL_WORLD_SIZE",
                    "WORLD_SIZE",
                    "OMPI_COMM_WORLD_SIZE",
                    "PMI_SIZE",
                ],
            ),
        };
        let rank: usize = required(lookup, rank_vars)?;
        let world: usize = required(lookup, world_vars)?;
        if world == 0 || world > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "environment variable WORLD_SIZE (or AMPCCL_WORLD_SIZE) = {world} is out of \
                 range (1..={MAX_RANKS})"
            )));
        }
        let local_rank = num_var(lookup, LOCAL_RANK_VARS)?;
        let rendezvous = match source {
            Source::UniqueId => {
                let hex = var(lookup, "AMPCCL_UNIQUE_ID").unwrap_or_default();
                let id = UniqueId::from_hex(&hex).map_err(|e| {
                    Error::InvalidArgument(format!("environment variable AMPCCL_UNIQUE_ID: {e}"))
                })?;
                Rendezvous::UniqueId(id)
            }
            Source::TcpStore => Rendezvous::TcpStore {
                addr: var(lookup, "MASTER_ADDR").ok_or_else(|| {
                    Error::InvalidArgument(
                        "environment variable MASTER_ADDR (torchrun's store) is not set".into(),
                    )
                })?,
                port: required(lookup, &["MASTER_PORT"])?,
                scope: format!(
                    "ampccl/{}/{}",
                    var(lookup, "TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into()),
                    var(lookup, "TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into())
                ),
            },
            Source::Pmi => Rendezvous::Pmi {
                fd: var(lookup, "PMI_FD").unwrap_or_default(),
                local_world: num_var(lookup, &["MPI_LOCALNRANKS"])?,
            },
            Source::Master => Self::master(lookup, world)?,
        };
        Ok(EnvConfig {
            rank,
            world,
            local_rank,
            rendezvous,
        })
    }

    /// The `MASTER_ADDR` rendezvous, its token derived from the job (module documentation).
    fn master(lookup: &dyn Fn(&str) -> Option<String>, world: usize) -> Result<Rendezvous> {
        let addr = var(lookup, "MASTER_ADDR").ok_or_else(|| {
            Error::InvalidArgument(
                "environment variable MASTER_ADDR is not set (nor AMPCCL_UNIQUE_ID)".into(),
            )
        })?;
        let port: u16 = required(lookup, &["MASTER_PORT"])?;
        let job = job_id(lookup);
        let secret = job.as_ref().map_or("", |(_, v)| v.as_str());
        let token = wire::fnv1a128(&[
            b"ampccl-bootstrap-v1",
            addr.as_bytes(),
            port.to_string().as_bytes(),
            world.to_string().as_bytes(),
            secret.as_bytes(),
        ]);
        Ok(Rendezvous::Master {
            addr,
            port,
            token,
            job_id_from: job.map(|(name, _)| name),
        })
    }
}

/// Where the local rank comes from, first set wins: ampccl's own, torchrun's and `ampccl-run`'s,
/// Intel MPI / MPICH hydra's, PMI's, Open MPI's, Slurm's. Without any, the bootstrap counts the
/// lower ranks on the same host.
pub const LOCAL_RANK_VARS: &[&str] = &[
    "AMPCCL_LOCAL_RANK",
    "LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
];

impl EnvConfig {
    /// The id to join: the given one, or in `Master` mode the root address `MASTER_ADDR:MASTER_PORT`
    /// with the derived token. Rank 0 in `Master` mode also binds the root on that address (the
    /// one `MASTER_ADDR` resolves to, not the wildcard) and starts its thread, which lives at
    /// most `timeout`.
    pub fn unique_id(&self, timeout: Duration) -> Result<UniqueId> {
        log_source_once(self);
        match &self.rendezvous {
            Rendezvous::UniqueId(id) => Ok(*id),
            Rendezvous::TcpStore { addr, port, scope } => {
                launcher::via_tcpstore(addr, *port, scope, self.rank, timeout)
            }
            Rendezvous::Pmi { fd, local_world } => {
                launcher::via_pmi(fd, *local_world, self.rank, self.world, timeout)
            }
            Rendezvous::Master {
                addr,
                port,
                token,
                job_id_from,
            } => {
                let target = (addr.as_str(), *port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "environment variable MASTER_ADDR={addr:?} does not resolve"
                        ))
                    })?;
                log_job_id_once(self.rank, *job_id_from);
                if self.rank == 0 {
                    let listener = bind_master(addr, target)?;
                    drop(root::spawn_root(listener, *token, timeout)?);
                }
                Ok(UniqueId::new(target, *token))
            }
        }
    }

    /// What keys the rendezvous token, for error messages (`MASTER_ADDR` mode).
    pub(crate) fn token_origin(&self) -> Option<String> {
        let Rendezvous::Master {
            addr,
            port,
            job_id_from,
            ..
        } = &self.rendezvous
        else {
            return None;
        };
        let job = match job_id_from {
            Some(name) => format!("the job id in {name}"),
            None => {
                "no job id (none of AMPCCL_TOKEN, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ... is set)"
                    .into()
            }
        };
        Some(format!(
            "this rank's token comes from MASTER_ADDR={addr}, MASTER_PORT={port}, WORLD_SIZE={} \
             and {job}",
            self.world
        ))
    }
}

/// Says once per process where the rendezvous comes from.
fn log_source_once(cfg: &EnvConfig) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let what = match &cfg.rendezvous {
        Rendezvous::UniqueId(id) => format!("the unique id in AMPCCL_UNIQUE_ID ({id:?})"),
        Rendezvous::TcpStore { addr, port, scope } => {
            format!("torchrun's TCPStore at {addr}:{port} (keys under {scope})")
        }
        Rendezvous::Pmi { fd, .. } => format!("the launcher's PMI-1 on PMI_FD={fd}"),
        Rendezvous::Master { addr, port, .. } => {
            format!("MASTER_ADDR:MASTER_PORT {addr}:{port} (rank 0 hosts the root there)")
        }
    };
    ONCE.call_once(|| {
        tracing::info!(
            rank = cfg.rank,
            world = cfg.world,
            "bootstrap: rendezvous through {what}"
        );
    });
}

/// Says once per process whether a job id keys the `MASTER_ADDR` rendezvous token: without one,
/// two jobs that reuse `MASTER_ADDR:MASTER_PORT` with the same world size could mix.
fn log_job_id_once(rank: usize, job_id_from: Option<&'static str>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match job_id_from {
        Some(name) => tracing::debug!(rank, "bootstrap: rendezvous token keyed by {name}"),
        None if rank == 0 => tracing::warn!(
            "bootstrap: no job id for the MASTER_ADDR rendezvous (none of {} is set): ranks of \
             two jobs reusing MASTER_ADDR:MASTER_PORT would be told apart only by WORLD_SIZE; \
             set AMPCCL_TOKEN to a value unique to the job on every rank",
            JOB_ID_VARS.join(", ")
        ),
        None => tracing::info!(
            rank,
            "bootstrap: no job id for the MASTER_ADDR rendezvous: ranks of two jobs reusing \
             MASTER_ADDR:MASTER_PORT would be told apart only by WORLD_SIZE"
        ),
    });
}

/// Binds the root of `MASTER_ADDR` mode on `target`, the address `MASTER_ADDR` resolved to.
fn bind_master(addr: &str, target: SocketAddr) -> Result<TcpListener> {
    if target.ip().is_loopback() && addr.parse::<IpAddr>().is_err() && addr != "localhost" {
        tracing::warn!(
            "bootstrap: MASTER_ADDR={addr} resolves to the loopback address {} on rank 0's \
             host: the rendezvous root listens there only, so ranks on other hosts cannot reach \
             it; set MASTER_ADDR to an address of rank 0's host that they can reach",
            target.ip()
        );
    }
    TcpListener::bind(target).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => Error::InvalidUsage(format!(
            "bootstrap root: MASTER_ADDR:MASTER_PORT {target} is already in use (another job's \
             rendezvous root, or another program); a second job needs its own MASTER_PORT"
        )),
        std::io::ErrorKind::AddrNotAvailable => Error::InvalidUsage(format!(
            "bootstrap root: MASTER_ADDR={addr} resolves to {}, which is not an address of this \
             host; rank 0 hosts the rendezvous root, so MASTER_ADDR must name rank 0's host",
            target.ip()
        )),
        _ => Error::system(format!("bootstrap root: bind {target} (MASTER_ADDR)"), e),
    })
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
