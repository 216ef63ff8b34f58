//! Which launcher started this process, and how the unique id reaches every rank under it.
//!
//! [`Source::detect`] looks at the environment in this order (`AMPCCL_RENDEZVOUS` =
//! `unique-id`, `tcpstore`, `master` or `pmi` forces one):
//! 1. `AMPCCL_UNIQUE_ID`: the id is given (`ampccl-run`, or a user who ships it).
//! 2. `TORCHELASTIC_USE_AGENT_STORE=True` with `MASTER_ADDR`/`MASTER_PORT` (torchrun): the
//!    agent's `TCPStore` holds `MASTER_PORT`. Rank 0 makes an id, its root on an ephemeral port
//!    of the interface that routes to the store, and sets its hex under
//!    `ampccl/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/<n>/unique_id`; the others
//!    wait for that key and get it (module [`super::tcpstore`]). `<n>` counts the rendezvous of
//!    this process (the first `from_env` is 0), so a restarted elastic run and a second
//!    communicator each read a fresh id, never a stale one.
//! 3. `MASTER_ADDR` (anything else torchrun-like): rank 0 hosts the root on `MASTER_PORT`.
//! 4. `PMI_FD` (Intel MPI / MPICH `mpirun`, `srun --mpi=pmi2`): the PMI-1 session of module
//!    [`super::pmi`]; rank 0 puts the id's hex as `ampccl-uid-<n>`, all enter a barrier, the
//!    others get it. Rank 0's root listens on loopback when `MPI_LOCALNRANKS` says all ranks
//!    share its host, else on its first non-loopback address (IPv4 first).
//! 5. Open MPI (`OMPI_COMM_WORLD_SIZE`) or Slurm (`SLURM_PROCID`) without one of the above:
//!    an error saying what to set (Open MPI's PMIx needs its own library; `srun` offers PMI
//!    with `--mpi=pmi2`).
//!
//! In every exchange `AMPCCL_BOOTSTRAP_ADDR` or `AMPCCL_SOCKET_IFNAME` (see
//! [`super::UniqueId::generate`]) override where rank 0's root listens. When rank 0 cannot make
//! the id it publishes `failed: <why>` instead, so the others fail at once with that reason.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
#[cfg(not(test))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use super::pmi::Pmi;
use super::tcpstore::StoreClient;
use super::unique_id::UniqueId;
use super::{env, ifname};

/// The variables that steer how ranks find each other ([`Source::detect`] and the sources'
/// own settings): what a process that starts ranks itself (a test, a launcher inside a job)
/// clears so that its own job's settings do not leak into theirs.
pub const RENDEZVOUS_VARS: &[&str] = &[
    "AMPCCL_UNIQUE_ID",
    "AMPCCL_RANK",
    "AMPCCL_WORLD_SIZE",
    "AMPCCL_LOCAL_RANK",
    "AMPCCL_RENDEZVOUS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PMI_FD",
    "PMI_RANK",
    "PMI_SIZE",
    "TORCHELASTIC_USE_AGENT_STORE",
];

/// How this process's ranks find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `AMPCCL_UNIQUE_ID` is set.
    UniqueId,
    /// torchrun's agent store at `MASTER_ADDR:MASTER_PORT`.
    TcpStore,
    /// `MASTER_ADDR`/`MASTER_PORT`, rank 0 hosting the root there.
    Master,
    /// PMI-1 on `PMI_FD`.
    Pmi,
}

impl Source {
    /// Picks the source from the environment (see the module documentation).
    pub fn detect(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Source> {
        let set = |k: &str| lookup(k).is_some_and(|v| !v.trim().is_empty());
        if let Some(v) = lookup("AMPCCL_RENDEZVOUS").filter(|v| !v.trim().is_empty()) {
            return match v.trim() {
                "unique-id" => Ok(Source::UniqueId),
                "tcpstore" => Ok(Source::TcpStore),
                "master" => Ok(Source::Master),
                "pmi" => Ok(Source::Pmi),
                _ => Err(Error::InvalidArgument(format!(
                    "AMPCCL_RENDEZVOUS={v:?}: expected unique-id, tcpstore, master or pmi"
                ))),
            };
        }
        let agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"));
        Ok(if set("AMPCCL_UNIQUE_ID") {
            Source::UniqueId
        } else if agent_store && set("MASTER_ADDR") {
            Source::TcpStore
        } else if set("MASTER_ADDR") {
            Source::Master
        } else if set("PMI_FD") {
            Source::Pmi
        } else if set("OMPI_COMM_WORLD_SIZE") {
            return Err(Error::InvalidArgument(
                "started by Open MPI's mpirun, which offers no rendezvous ampccl can use (its \
                 PMIx needs Open MPI's own library): pass MASTER_ADDR (an address of rank 0's \
                 host) and MASTER_PORT (a free port there), e.g. `mpirun -x MASTER_ADDR=host0 \
                 -x MASTER_PORT=29500 ...`, or AMPCCL_UNIQUE_ID; the ranks come from \
                 OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE"
                    .into(),
            ));
        } else if set("SLURM_PROCID") {
            return Err(Error::InvalidArgument(
                "started by srun without PMI (PMI_FD is not set): run `srun --mpi=pmi2 ...`, or \
                 set MASTER_ADDR and MASTER_PORT (rank 0 hosts the rendezvous there)"
                    .into(),
            ));
        } else {
            return Err(Error::InvalidArgument(
                "no launcher found: MASTER_ADDR is not set (nor AMPCCL_UNIQUE_ID, PMI_FD or \
                 torchrun's variables); start the ranks with `ampccl-run -n N prog`, torchrun or \
                 an MPICH-family mpirun, or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE"
                    .into(),
            ));
        })
    }
}

/// The `<n>` of this rendezvous: how many rendezvous through a store or PMI this process made
/// before. Tests play ranks as threads of one process: there each thread counts its own.
fn next_generation() -> u64 {
    #[cfg(test)]
    {
        thread_local!(static GEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
        GEN.with(|g| g.replace(g.get() + 1))
    }
    #[cfg(not(test))]
    {
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        GENERATION.fetch_add(1, Ordering::Relaxed)
    }
}

/// Where rank 0's root listens: `AMPCCL_BOOTSTRAP_ADDR`, else the `AMPCCL_SOCKET_IFNAME`
/// interface, else `default`.
fn root_bind(default: IpAddr) -> Result<SocketAddr> {
    let lookup = |k: &str| std::env::var(k).ok();
    if lookup("AMPCCL_BOOTSTRAP_ADDR").is_some_and(|v| !v.trim().is_empty()) {
        return env::bootstrap_addr_from(&lookup);
    }
    if let Some(f) = ifname::from_env()? {
        return Ok(SocketAddr::new(f.pick(&ifname::interfaces()?)?, 0));
    }
    Ok(SocketAddr::new(default, 0))
}

fn make_id(default: IpAddr, timeout: Duration) -> Result<UniqueId> {
    Ok(UniqueId::generate_with(root_bind(default)?, timeout)?.0)
}

/// The value rank 0 publishes: the id's hex, or `failed: <why>`.
fn publish_value(id: &Result<UniqueId>) -> String {
    match id {
        Ok(id) => id.to_hex(),
        Err(e) => format!("failed: {e}"),
    }
}

fn parse_published(v: &str, via: &str) -> Result<UniqueId> {
    if let Some(why) = v.strip_prefix("failed") {
        return Err(Error::Remote(format!(
            "rank 0 could not make the unique id{}",
            why.replace('_', " ")
        )));
    }
    UniqueId::from_hex(v)
        .map_err(|e| Error::Remote(format!("the unique id rank 0 published through {via}: {e}")))
}

/// The id through torchrun's store at `host:port`, keys under `scope`.
pub(crate) fn via_tcpstore(
    host: &str,
    port: u16,
    scope: &str,
    rank: usize,
    timeout: Duration,
) -> Result<UniqueId> {
    let deadline = Instant::now() + timeout;
    let n = next_generation();
    let key = format!("{scope}/{n}/unique_id");
    let mut store = StoreClient::connect(host, port, deadline)?;
    if rank == 0 {
        let ip = store.local_ip()?;
        let id = make_id(ip, timeout);
        store.set(&key, publish_value(&id).as_bytes(), deadline)?;
        return id;
    }
    store.wait(&[&key], deadline).map_err(|e| match e {
        Error::Timeout(_) => Error::Timeout(format!(
            "rank {rank}: rank 0 did not publish the unique id in torchrun's TCPStore \
             {host}:{port} (key {key:?}) within {timeout:?}"
        )),
        e => e,
    })?;
    let v = store.get(&key, deadline)?;
    parse_published(&String::from_utf8_lossy(&v), "torchrun's TCPStore")
}

/// The process's PMI session: opened on first use, kept (PMI is initialized once per process).
static PMI: Mutex<Option<std::result::Result<Pmi, String>>> = Mutex::new(None);

/// Ends the PMI session at process exit: hydra takes a process that exits without
/// `finalize` for a crashed one and kills the rest of the job.
extern "C" fn finalize_pmi_at_exit() {
    // `try_lock`: a thread that exits the process while another holds the lock must not hang.
    if let Ok(mut guard) = PMI.try_lock()
        && let Some(Ok(pmi)) = guard.take()
        && let Err(e) = pmi.finalize(Instant::now() + Duration::from_secs(10))
    {
        tracing::warn!("PMI finalize at exit: {e}");
    }
}

/// Takes ownership of the descriptor `PMI_FD` names.
fn pmi_stream(fd_var: &str) -> Result<UnixStream> {
    let bad = || {
        Error::InvalidArgument(format!(
            "PMI_FD={fd_var:?} is not an open file descriptor of this process"
        ))
    };
    let fd: i32 = fd_var.trim().parse().map_err(|_| bad())?;
    // SAFETY: F_GETFD only reads the descriptor flags of `fd` (any integer is allowed).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if fd < 0 || flags < 0 {
        return Err(bad());
    }
    // SAFETY: as above; setting FD_CLOEXEC keeps the launcher's socket out of our children.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: the launcher gave this process the open descriptor `fd` (checked above) for PMI;
    // nothing else in the process owns it (a program that speaks PMI itself through MPI must
    // not use `from_env`, see module `pmi`), and it is taken once: the session is kept in `PMI`.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The id through the launcher's PMI-1 KVS.
/// `fd` is `PMI_FD`'s value, `local_world` `MPI_LOCALNRANKS`'s.
pub(crate) fn via_pmi(
    fd: &str,
    local_world: Option<usize>,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<UniqueId> {
    let deadline = Instant::now() + timeout;
    let mut guard = PMI.lock().unwrap_or_else(|p| p.into_inner());
    let session = guard.get_or_insert_with(|| {
        let pmi = pmi_stream(fd)
            .and_then(|s| Pmi::init(s, deadline))
            .map_err(|e| e.to_string())?;
        // SAFETY: registers a plain `extern "C"` function without state; it runs once, at
        // exit, and never unwinds (it returns on every error).
        unsafe { libc::atexit(finalize_pmi_at_exit) };
        Ok(pmi)
    });
    let pmi = session
        .as_mut()
        .map_err(|e| Error::InvalidUsage(format!("PMI session: {e}")))?;
    let key = format!("ampccl-uid-{}", next_generation());
    let mut made = None;
    if rank == 0 {
        let ip = if local_world == Some(world) {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            first_external_ip()?
        };
        let id = make_id(ip, timeout);
        pmi.put(&key, &pmi_value(&publish_value(&id)), deadline)?;
        made = Some(id);
    }
    pmi.barrier(deadline).map_err(|e| match e {
        Error::Timeout(_) => Error::Timeout(format!(
            "rank {rank}: the PMI barrier did not complete within {timeout:?} (a rank of the \
             {world} did not reach its init)"
        )),
        e => e,
    })?;
    match made {
        Some(id) => id,
        None => parse_published(&pmi.get(&key, deadline)?, "PMI"),
    }
}

/// `v` as a PMI value: no spaces, `=` or control characters (a failure's reason, shortened).
fn pmi_value(v: &str) -> String {
    v.chars()
        .take(256)
        .map(|c| {
            if c.is_ascii_graphic() && c != '=' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// This host's first non-loopback address, IPv4 first; loopback if there is none.
fn first_external_ip() -> Result<IpAddr> {
    let ifaces = ifname::interfaces()?;
    let usable = |v4: bool| {
        ifaces
            .iter()
            .map(|(_, ip)| *ip)
            .find(|ip| !ip.is_loopback() && ip.is_ipv4() == v4 && !is_link_local(ip))
    };
    Ok(usable(true)
        .or_else(|| usable(false))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn detect(vars: &[(&str, &str)]) -> Result<Source> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Source::detect(&move |k: &str| map.get(k).cloned())
    }

    #[test]
    fn launchers_are_told_apart() {
        let torchrun = [
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert_eq!(detect(&torchrun).unwrap(), Source::TcpStore);
        // Without the agent store rank 0 hosts MASTER_PORT, as before torchrun had one.
        assert_eq!(detect(&torchrun[..3]).unwrap(), Source::Master);
        let mut forced = torchrun.to_vec();
        forced.push(("AMPCCL_RENDEZVOUS", "master"));
        assert_eq!(detect(&forced).unwrap(), Source::Master);
        let mut with_id = torchrun.to_vec();
        with_id.push(("AMPCCL_UNIQUE_ID", "00"));
        assert_eq!(detect(&with_id).unwrap(), Source::UniqueId);
        let hydra = [("PMI_FD", "11"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")];
        assert_eq!(detect(&hydra).unwrap(), Source::Pmi);
        assert!(matches!(detect(&[("AMPCCL_RENDEZVOUS", "carrier-pigeon")]),
            Err(Error::InvalidArgument(m)) if m.contains("AMPCCL_RENDEZVOUS")));
        let ompi = [("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "0")];
        assert!(matches!(detect(&ompi), Err(Error::InvalidArgument(m))
            if m.contains("Open MPI") && m.contains("MASTER_ADDR")));
        let mut ompi_master = ompi.to_vec();
        ompi_master.push(("MASTER_ADDR", "h"));
        assert_eq!(detect(&ompi_master).unwrap(), Source::Master);
        assert!(
            matches!(detect(&[("SLURM_PROCID", "0")]), Err(Error::InvalidArgument(m))
            if m.contains("--mpi=pmi2"))
        );
        assert!(matches!(detect(&[]), Err(Error::InvalidArgument(m))
            if m.contains("ampccl-run") && m.contains("MASTER_ADDR")));
    }

    #[test]
    fn published_values_round_trip_and_failures_name_rank_0() {
        let id = UniqueId::new("127.0.0.1:9".parse().unwrap(), 5);
        assert_eq!(parse_published(&publish_value(&Ok(id)), "x").unwrap(), id);
        let failed = pmi_value(&publish_value(&Err(Error::System("bind: a=b ü".into()))));
        assert!(
            failed.bytes().all(|b| b.is_ascii_graphic() && b != b'='),
            "{failed}"
        );
        let e = parse_published(&failed, "PMI").unwrap_err().to_string();
        assert!(
            e.contains("rank 0 could not make the unique id") && e.contains("bind"),
            "{e}"
        );
        assert!(matches!(parse_published("zz", "PMI"), Err(Error::Remote(m)) if m.contains("PMI")));
        assert!(matches!(pmi_stream("nope"), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            pmi_stream("1000000"),
            Err(Error::InvalidArgument(_))
        ));
    }
}
