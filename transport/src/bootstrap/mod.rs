//! Bootstrap: out-of-band rendezvous and a small TCP mesh between the ranks of a job, used to
//! exchange connection information before the data transports exist (NCCL's `bootstrap.cc`).
//!
//! Ways in (module `launcher` says which one [`Bootstrap::from_env`] takes, and in what order):
//! * **Launchers**: torchrun, whose agent holds `MASTER_PORT` with a PyTorch `TCPStore` (module
//!   [`tcpstore`]), and MPICH-family `mpirun` / `srun --mpi=pmi2`, which offer PMI-1 on
//!   `PMI_FD` (module [`pmi`]): rank 0 makes a unique id and publishes it there, the others read
//!   it, and everyone continues as with a unique id below.
//! * **Unique id** (NCCL style): one process calls [`UniqueId::generate`] (binds a root and starts
//!   its thread), ships the id to every rank, and each rank calls [`Bootstrap::init`]. With
//!   [`Bootstrap::from_env`], the id travels as 256 hex characters in `AMPCCL_UNIQUE_ID`, with the
//!   rank in `AMPCCL_RANK` (or `RANK`) and the world size in `AMPCCL_WORLD_SIZE` (or
//!   `WORLD_SIZE`).
//! * **torchrun style**: `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE` (`LOCAL_RANK` kept
//!   for [`Bootstrap::local_rank`]). Rank 0 runs the root on the address `MASTER_ADDR` resolves
//!   to (not the wildcard address), at `MASTER_PORT`; everyone (rank 0 too) connects to
//!   `MASTER_ADDR:MASTER_PORT`. A port already taken (say by another job's root) fails rank 0
//!   with [`Error::InvalidUsage`] saying so. The token cannot be distributed, so it is derived:
//!   the 128-bit FNV-1a of `"ampccl-bootstrap-v1"`, `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`
//!   (numbers in decimal) and the job id: the first of [`JOB_ID_VARS`] that is set
//!   (`AMPCCL_TOKEN`, torchrun's `TORCHELASTIC_RUN_ID` unless it is torchrun's default `none`,
//!   Slurm's `SLURM_JOB_ID`, PMIx's `PMIX_NAMESPACE`, Open MPI's `OMPI_MCA_orte_hnp_uri`, LSF's
//!   `LSB_JOBID`, PBS's `PBS_JOBID`, Flux's `FLUX_JOB_ID`), else the empty string, in which
//!   case rank 0 warns once that two jobs reusing `MASTER_ADDR:MASTER_PORT` would be told apart
//!   only by their world size.
//!
//! # What the token protects
//!
//! Every hello to the root and every mesh handshake carries the token; a connection with
//! another token is refused (the root tells the rank why: [`Error::InvalidUsage`] mentioning
//! "wrong token" and, in `MASTER_ADDR` mode, what this rank's token is made of). With a unique
//! id the token is 128 random bits; in `MASTER_ADDR` mode it is keyed by the launcher's job id.
//! It keeps **accidental** joins apart: a rank of another job, or of an earlier run of the same
//! script, that reaches a root or a rank's mesh listener by reusing an address and port never
//! joins this communicator. It is **not a security boundary**: anyone who can read a rank's
//! environment or `AMPCCL_UNIQUE_ID` (any process of the same user, `/proc/<pid>/environ`) can
//! derive or copy it, the derived token of `MASTER_ADDR` mode is only as unpredictable as the
//! job id, and the bootstrap traffic is neither encrypted nor authenticated beyond it. Run jobs
//! on networks their users trust.
//!
//! # Bounds and failures
//!
//! Nothing a connection says sizes an allocation or a thread before it is checked: world sizes
//! are at most [`MAX_RANKS`] (a rank asking for more fails with [`Error::InvalidArgument`]
//! before connecting, and the root refuses such a hello), the root keeps joined ranks in a map
//! that grows only with ranks holding the token, one thread reads all hellos (and one loop, in
//! the initializing thread, all mesh handshakes), with a short deadline each and a bounded
//! number waiting at once, so silent or stray connections neither stall nor exhaust init.
//! Message lengths are bounded (1 GiB) and a receive buffer grows with the bytes that arrive.
//!
//! Each rank connects to the root (retrying until the timeout, as the root may not be up yet),
//! sends its listen address, host id and pid, receives everyone's, and builds a full TCP mesh
//! (module `mesh`). While it waits for the root, the root tells it who has joined; every
//! [`PROGRESS_LOG_EVERY`] it logs a warning saying who has joined and who is missing, and a
//! timeout names the missing ranks. Once the table is exchanged, a peer on the same host (same
//! PID namespace) whose process exits is noticed within a fraction of a second (`kill(pid, 0)`
//! and `/proc/<pid>/stat`, so zombies count as dead) in mesh building and in every later wait of
//! the handle, and a peer elsewhere by its connection closing: init or the call fails at once
//! with [`Error::Remote`] naming the dead rank.
//!
//! The [`Bootstrap`] handle then offers blocking tagged send/recv, allgather, barrier,
//! broadcast and subgroups. Every blocking call is bounded by the handle's timeout (the one given
//! at init) and fails with [`Error::Timeout`] naming the peer; a peer that closed its connection
//! or died gives [`Error::Remote`] naming it.
//!
//! The default timeout is `AMPCCL_TIMEOUT_S` (seconds, default 300; see [`timeout_from_env`]).

mod env;
pub mod ifname;
mod launcher;
mod link;
mod mesh;
pub mod pmi;
mod root;
pub mod tcpstore;
mod unique_id;
mod wire;
pub(crate) use wire::poll_readable;

#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ampccl_runtime::{Error, Result};

use crate::topology::Topology;

pub use env::{
    EnvConfig, JOB_ID_VARS, LOCAL_RANK_VARS, Rendezvous, parse_timeout_s, timeout_from_env,
};
pub use launcher::{RENDEZVOUS_VARS, Source};
use link::{KIND_ALLGATHER, KIND_BARRIER, KIND_BROADCAST, KIND_P2P, Key, Link};
pub use root::RootReport;
pub use unique_id::{Token, UNIQUE_ID_BYTES, UniqueId};

/// Largest world size the bootstrap accepts (a rank asking for more fails with
/// [`Error::InvalidArgument`] before connecting; a root refuses a hello that claims more). The
/// same bound as the multipath parameter store's.
pub const MAX_RANKS: usize = 1 << 16;
/// While init waits (for the root's table, or for peers to connect), a line this often says who
/// has joined and who is missing.
pub const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

#[cfg(test)]
thread_local! {
    /// Tests: a shorter [`PROGRESS_LOG_EVERY`] for waits on this thread.
    static TEST_LOG_EVERY: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// The period of the progress lines of waits on this thread.
fn log_every() -> Duration {
    #[cfg(test)]
    if let Some(d) = TEST_LOG_EVERY.with(std::cell::Cell::get) {
        return d;
    }
    PROGRESS_LOG_EVERY
}

/// "rank 3", "ranks 0-2, 7", "ranks 0-31 and 90 more" for sorted `ranks`, the first of `total`.
fn rank_list(ranks: &[usize], total: usize) -> String {
    if total == 0 {
        return "none".into();
    }
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        runs.push(match j - i {
            0 => ranks[i].to_string(),
            1 => format!("{}, {}", ranks[i], ranks[j]),
            _ => format!("{}-{}", ranks[i], ranks[j]),
        });
        i = j + 1;
    }
    let mut out = format!(
        "{} {}",
        if total == 1 { "rank" } else { "ranks" },
        runs.join(", ")
    );
    if total > ranks.len() {
        out += &format!(" and {} more", total - ranks.len());
    }
    out
}

/// Timeout used when `AMPCCL_TIMEOUT_S` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest `AMPCCL_TIMEOUT_S` accepted, in seconds (about 11.6 days): deadlines are
/// `Instant::now() + timeout`, which must not overflow.
pub const TIMEOUT_MAX_S: f64 = 1e6;
/// Below this size an allgather sends inline; above, from a helper thread (so that two ranks
/// writing big payloads to each other cannot both block with full socket buffers).
const INLINE_SEND_BYTES: usize = 16 * 1024;

struct Shared {
    /// Indexed by global rank; the own entry is a loopback.
    links: Vec<Link>,
}

/// A rank's handle on the bootstrap mesh (or on a subgroup of it). `Send + Sync`; concurrent
/// calls with different tags are fine. Cloning shares the connections; they close when the last
/// handle (including subgroups) is dropped.
#[derive(Clone)]
pub struct Bootstrap {
    shared: Arc<Shared>,
    /// Global rank of each member, indexed by rank in this handle.
    members: Arc<[usize]>,
    rank: usize,
    space: u64,
    host_ids: Arc<[u64]>,
    pids: Arc<[u32]>,
    local_rank: usize,
    /// The address this rank listens on (the interface that routes to the root).
    local_ip: IpAddr,
    timeout: Duration,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("world", &self.members.len())
            .field("members", &self.members)
            .field("space", &self.space)
            .finish_non_exhaustive()
    }
}

impl Bootstrap {
    /// Joins the rendezvous of `id` as `rank` of `world` and builds the mesh. `timeout` bounds
    /// the whole init and, afterwards, every blocking call of the handle.
    pub fn init(id: &UniqueId, rank: usize, world: usize, timeout: Duration) -> Result<Bootstrap> {
        Bootstrap::init_with(id, rank, world, timeout, None)
    }

    fn init_with(
        id: &UniqueId,
        rank: usize,
        world: usize,
        timeout: Duration,
        local_rank: Option<usize>,
    ) -> Result<Bootstrap> {
        if world == 0 || world > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: world size {world} is out of range (1..={MAX_RANKS})"
            )));
        }
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: rank {rank} is not in a world of {world}"
            )));
        }
        id.validate()?;
        let filter = ifname::from_env()?;
        let deadline = Instant::now() + timeout;
        let root_addr = id.root_addr()?;
        let stream = root::connect_root(root_addr, rank, deadline)?;
        // Listen on the interface `AMPCCL_SOCKET_IFNAME` names, else on the one that routes to
        // the root: reachable by the others.
        let ip = match filter {
            Some(f) => f.pick(&ifname::interfaces()?)?,
            None => stream
                .local_addr()
                .map_err(|e| Error::system("bootstrap: local_addr", e))?
                .ip(),
        };
        let listener = if world > 1 {
            Some(
                TcpListener::bind((ip, 0))
                    .map_err(|e| Error::system(format!("bootstrap: bind {ip}"), e))?,
            )
        } else {
            None
        };
        let addr = match &listener {
            Some(l) => l
                .local_addr()
                .map_err(|e| Error::system("bootstrap: local_addr", e))?,
            None => SocketAddr::new(ip, 0),
        };
        let me = root::PeerInfo {
            addr,
            host_id: wire::host_id(),
            pid: std::process::id(),
            pid_ns: wire::pid_namespace(),
        };
        let table = root::exchange(stream, id.token(), rank, world, me, deadline)?;
        // From here on the ranks know each other's pids: a peer on this host (same PID
        // namespace) that dies is noticed at once, not at the timeout.
        let watch: Vec<Option<u32>> = table
            .iter()
            .map(|p| {
                let local = p.host_id == me.host_id && p.pid_ns == me.pid_ns && me.pid_ns != 0;
                (local && p.pid != me.pid).then_some(p.pid)
            })
            .collect();
        let links = match listener {
            None => vec![Link::loopback()],
            Some(listener) => {
                let addrs: Vec<SocketAddr> = table.iter().map(|p| p.addr).collect();
                let peers = mesh::Peers {
                    rank,
                    world,
                    token: id.token(),
                    addrs: &addrs,
                    watch: &watch,
                };
                mesh::build(listener, &peers, deadline)?
                    .into_iter()
                    .zip(&watch)
                    .map(|(c, &watch)| match c {
                        None => Ok(Link::loopback()),
                        Some(s) => Link::remote(s, watch)
                            .map_err(|e| Error::system("bootstrap: socket clone", e)),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let host_ids: Arc<[u64]> = table.iter().map(|p| p.host_id).collect();
        let local_rank = local_rank.unwrap_or_else(|| {
            host_ids[..rank]
                .iter()
                .filter(|&&h| h == host_ids[rank])
                .count()
        });
        tracing::debug!(rank, world, local_rank, "bootstrap mesh up");
        Ok(Bootstrap {
            shared: Arc::new(Shared { links }),
            members: (0..world).collect(),
            rank,
            space: 0,
            host_ids,
            pids: table.iter().map(|p| p.pid).collect(),
            local_rank,
            local_ip: ip,
            timeout,
        })
    }

    /// Fault injection for tests: joins the rendezvous of `id` as `rank` of `world` like
    /// [`Bootstrap::init`] (a bound listener, this process's real pid and host) and returns once
    /// the root has sent the address table, without building the mesh: the caller plays a rank
    /// that dies right after the table exchange.
    #[doc(hidden)]
    pub fn rendezvous_only(
        id: &UniqueId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<()> {
        id.validate()?;
        let deadline = Instant::now() + timeout;
        let stream = root::connect_root(id.root_addr()?, rank, deadline)?;
        let ip = stream
            .local_addr()
            .map_err(|e| Error::system("bootstrap: local_addr", e))?
            .ip();
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::system(format!("bootstrap: bind {ip}"), e))?;
        let me = root::PeerInfo {
            addr: listener
                .local_addr()
                .map_err(|e| Error::system("bootstrap: local_addr", e))?,
            host_id: wire::host_id(),
            pid: std::process::id(),
            pid_ns: wire::pid_namespace(),
        };
        root::exchange(stream, id.token(), rank, world, me, deadline).map(|_| ())
    }

    /// Initializes from the process environment (see the module documentation).
    pub fn from_env(timeout: Duration) -> Result<Bootstrap> {
        Bootstrap::from_lookup(|k| std::env::var(k).ok(), timeout)
    }

    /// [`Bootstrap::from_env`] reading variables through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        let cfg = EnvConfig::parse(lookup)?;
        Bootstrap::from_config(&cfg, timeout)
    }

    /// Initializes from a parsed [`EnvConfig`]; in `Master` mode rank 0 starts the root.
    pub fn from_config(cfg: &EnvConfig, timeout: Duration) -> Result<Bootstrap> {
        let (rank, world) = (cfg.rank, cfg.world);
        if world == 0 || world > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "WORLD_SIZE={world} is out of range (1..={MAX_RANKS})"
            )));
        }
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "RANK={rank} is not in a world of WORLD_SIZE={world}"
            )));
        }
        let id = cfg.unique_id(timeout)?;
        Bootstrap::init_with(&id, rank, world, timeout, cfg.local_rank).map_err(|e| match e {
            // Say what this rank's token is made of: the usual cause is a rank of another job
            // (or one launched differently) on the same MASTER_ADDR:MASTER_PORT.
            Error::InvalidUsage(m) if m.contains("wrong token") => match cfg.token_origin() {
                Some(origin) => Error::InvalidUsage(format!("{m}; {origin}")),
                None => Error::InvalidUsage(m),
            },
            e => e,
        })
    }

    /// This process's rank in this handle.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in this handle.
    pub fn world(&self) -> usize {
        self.members.len()
    }

    /// Rank on this host: `LOCAL_RANK` when initialized from an environment that sets it, else the
    /// number of lower (global) ranks with the same [`Bootstrap::host_id`].
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The address this rank's bootstrap listens on: the interface that routes to the root,
    /// which the other ranks reach; data transports listen there too.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// Which ranks of this handle share a host.
    pub fn topology(&self) -> Topology {
        Topology::new(&self.host_ids, self.rank)
    }

    /// Host id of this process (FNV-1a of hostname and kernel boot id).
    pub fn host_id(&self) -> u64 {
        self.host_ids[self.rank]
    }

    /// Host id of every rank of this handle.
    pub fn host_ids(&self) -> &[u64] {
        &self.host_ids
    }

    /// Process id of every rank of this handle.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Global rank (in the handle [`Bootstrap::init`] returned) of every rank of this handle.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Timeout of each blocking call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn link(&self, peer: usize) -> Result<(&Link, impl Fn() -> String + '_)> {
        let global = *self.members.get(peer).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "bootstrap: peer {peer} is not in a world of {}",
                self.world()
            ))
        })?;
        Ok((&self.shared.links[global], move || link::who(peer, global)))
    }

    fn key(&self, kind: u32, tag: u64) -> Key {
        Key {
            space: self.space,
            kind,
            tag,
        }
    }

    fn send_key(&self, peer: usize, key: Key, data: &[u8], deadline: Instant) -> Result<()> {
        let (link, who) = self.link(peer)?;
        link.send(key, data, deadline, &who)
    }

    fn recv_key(&self, peer: usize, key: Key, deadline: Instant) -> Result<Vec<u8>> {
        let (link, who) = self.link(peer)?;
        link.recv(key, deadline, &who)
    }

    /// Sends `data` to `peer` under `tag` (sending to oneself is allowed).
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.send_key(
            peer,
            self.key(KIND_P2P, tag),
            data,
            Instant::now() + self.timeout,
        )
    }

    /// Receives the oldest message from `peer` under `tag`; messages with other tags that arrive
    /// first are buffered for their own `recv`.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_key(peer, self.key(KIND_P2P, tag), Instant::now() + self.timeout)
    }

    fn gather(&self, key: Key, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (rank, world) = (self.rank, self.world());
        let deadline = Instant::now() + self.timeout;
        let send_all = || -> Result<()> {
            (1..world).try_for_each(|i| self.send_key((rank + i) % world, key, mine, deadline))
        };
        let recv_all = || -> Result<Vec<Vec<u8>>> {
            let mut out = vec![Vec::new(); world];
            out[rank] = mine.to_vec();
            for i in 1..world {
                let peer = (rank + world - i) % world;
                out[peer] = self.recv_key(peer, key, deadline)?;
            }
            Ok(out)
        };
        if world == 1 || mine.len() <= INLINE_SEND_BYTES {
            send_all()?;
            return recv_all();
        }
        std::thread::scope(|s| {
            let sender = std::thread::Builder::new()
                .name("ampccl-bootstrap-send".into())
                .spawn_scoped(s, send_all)
                .map_err(|e| Error::system("bootstrap: spawn sender thread", e))?;
            let received = recv_all();
            let sent = sender.join().unwrap_or_else(|_| {
                Err(Error::Internal("bootstrap sender thread panicked".into()))
            });
            let out = received?;
            sent.map(|()| out)
        })
    }

    /// Everyone's `mine` (sizes may differ), indexed by rank.
    pub fn allgather(&self, tag: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather(self.key(KIND_ALLGATHER, tag), mine)
    }

    /// Returns once every rank of this handle has entered the barrier with `tag`.
    pub fn barrier(&self, tag: u64) -> Result<()> {
        self.gather(self.key(KIND_BARRIER, tag), &[]).map(|_| ())
    }

    /// `root`'s `data` on every rank; `data` must be `Some` on `root` and is ignored elsewhere.
    pub fn broadcast(&self, tag: u64, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>> {
        let world = self.world();
        if root >= world {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not in a world of {world}"
            )));
        }
        let key = self.key(KIND_BROADCAST, tag);
        let deadline = Instant::now() + self.timeout;
        if self.rank != root {
            return self.recv_key(root, key, deadline);
        }
        let data = data
            .ok_or_else(|| Error::InvalidArgument("broadcast: the root must pass data".into()))?;
        for i in 1..world {
            self.send_key((root + i) % world, key, data, deadline)?;
        }
        Ok(data.to_vec())
    }

    /// A handle on the ranks `ranks` (numbered in this handle) sharing this handle's connections:
    /// its ranks are positions in `ranks`, and its tags live in a namespace derived from
    /// `tag_space`, so its messages never match this handle's or another subgroup's. Every member
    /// must call it with the same `ranks` and `tag_space`, and this rank must be in `ranks`.
    /// No communication happens here.
    pub fn subgroup(&self, ranks: &[usize], tag_space: u64) -> Result<Bootstrap> {
        let world = self.world();
        let bad = |why: String| {
            Err(Error::InvalidArgument(format!(
                "bootstrap subgroup {ranks:?}: {why}"
            )))
        };
        if let Some(&r) = ranks.iter().find(|&&r| r >= world) {
            return bad(format!("rank {r} is not in a world of {world}"));
        }
        let mut seen = vec![false; world];
        for &r in ranks {
            if std::mem::replace(&mut seen[r], true) {
                return bad(format!("rank {r} appears twice"));
            }
        }
        let Some(rank) = ranks.iter().position(|&r| r == self.rank) else {
            return bad(format!("does not contain this rank {}", self.rank));
        };
        Ok(Bootstrap {
            shared: self.shared.clone(),
            members: ranks.iter().map(|&r| self.members[r]).collect(),
            rank,
            space: wire::fnv1a64(&[
                b"subgroup",
                &self.space.to_le_bytes(),
                &tag_space.to_le_bytes(),
            ]),
            host_ids: ranks.iter().map(|&r| self.host_ids[r]).collect(),
            pids: ranks.iter().map(|&r| self.pids[r]).collect(),
            local_rank: self.local_rank,
            local_ip: self.local_ip,
            timeout: self.timeout,
        })
    }
}
