//! The offline verifier (like HCCL's `hccl_verifier`): checks an executor's task graph for a
//! whole communicator without running any transport.
//!
//! ```text
//! per rank: calc_res_request ─► orchestrate into a recording TaskSink (bounds, ids, links,
//!           alignment, peer-writable receives: `record`)
//!   ─► simulate all ranks' streams together on symbolic memory (`sim`: notifies by
//!      generation, receiver-driven link matching, deadlock detection, balance of link and
//!      notify counters)
//!   ─► race check over vector clocks (`race`) ─► per-OpKind semantic check (`check`)
//! ```
//!
//! Memory holds symbolic values ([`value::Val`]): every input element is a unique symbol and
//! reductions build multisets of them, so a wrong block, a missing or doubled contribution,
//! a forgotten average or uninitialised data all show up exactly. Simulation is at element
//! granularity (element size from the operation's dtype); byte offsets must be aligned.
//!
//! - [`verify`]: every rank of `param.world` runs one executor;
//! - [`verify_jobs`]: any mix per rank (ranks may sit out), e.g. [`verify_send_recv`];
//! - [`verify_entry`] / [`verify_registry`] / [`selected`]: by registry entry or by the
//!   operator's choice (Send/Recv entries are paired with the registry's counterpart).

use std::cell::Cell;

use ampccl_runtime::Error;

use ampccl_transport::topology::Topology;

use crate::executor::{Executor, SelectCtx};
use crate::op::{OpKind, OpParam};
use crate::operator;
use crate::registry::{Entry, Registry};
use crate::resource::{AlgResourceResponse, SharedUser};

mod check;
mod race;
mod record;
mod sim;
pub mod value;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_buggy_executors;

use record::{Layout, Recorder};
use sim::{RankSim, Sim};
use value::Val;

/// What the simulated communicator offers the executors.
#[derive(Clone, Copy, Debug)]
pub struct VerifyConfig {
    /// Bytes of each CCL buffer (`CclIn`, `CclOut`); small values force chunking.
    pub ccl_size: usize,
    /// Whether receives may target user memory (`rx_async` into `UserOut`/`Scratch`).
    pub user_mem_links: bool,
    /// Ranks whose user buffers lie in shared user memory (bit `r` for rank `r`, see
    /// [`AlgResourceResponse::shared_user`]).
    pub shared_ranks: u64,
    /// Outstanding receives per direction (the link FIFO depth).
    pub fifo_depth: usize,
    /// Where the receive slots in `CclIn` start (earlier calls of a communicator move it, see
    /// [`crate::steps::window`]).
    pub window_cursor: usize,
    /// Ranks per host, hosts filled in rank order (`usize::MAX`: all on one host); algorithms
    /// may treat links to other hosts differently ([`AlgResourceResponse::topology`]).
    pub ranks_per_host: usize,
}

impl VerifyConfig {
    /// Rank `rank`'s view of the hosts of a `world`-rank communicator.
    fn topology(&self, world: usize, rank: usize) -> Topology {
        let host_ids: Vec<u64> = (0..world)
            .map(|r| (r / self.ranks_per_host.max(1)) as u64)
            .collect();
        Topology::new(&host_ids, rank)
    }
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            ccl_size: 16 << 10,
            user_mem_links: false,
            shared_ranks: 0,
            fifo_depth: 256,
            window_cursor: 0,
            ranks_per_host: usize::MAX,
        }
    }
}

/// Why the recording sink refused a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    OutOfBounds,
    /// Offset or length not a multiple of the element size.
    Misaligned,
    UnknownStream,
    UnknownNotify,
    /// A task with a peer no transport request named.
    NoLink,
    /// A receive into (or an offer of) memory peers cannot write (read) without user-memory
    /// links.
    NotPeerAccessible,
    /// A write into the user input.
    ReadOnly,
    /// Partially overlapping operands.
    Overlap,
    /// A reduce or average in another dtype/op than the operation's.
    TypeMismatch,
}

/// A verification failure.
#[derive(Clone, Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("invalid verification setup: {0}")]
    Setup(String),
    #[error("rank {rank}: bad resource request: {msg}")]
    Resource { rank: usize, msg: String },
    #[error("rank {rank}: {kind:?}: {task}: {msg}")]
    Rejected {
        rank: usize,
        kind: Reject,
        task: String,
        msg: String,
    },
    #[error("rank {rank}: orchestrate failed: {error}")]
    Executor { rank: usize, error: Error },
    #[error("deadlock; stuck tasks:\n  {}", stuck.join("\n  "))]
    Deadlock { stuck: Vec<String> },
    #[error("length mismatch: {0}")]
    LengthMismatch(String),
    /// A send meeting an offer, a read meeting a receive, or a wait-done of the other kind.
    #[error("transfer mismatch: {0}")]
    WayMismatch(String),
    #[error("unbalanced link/notify operations: {0}")]
    Unbalanced(String),
    #[error("data race on rank {rank} {mem} bytes {bytes:?}: {first} / {second}")]
    Race {
        rank: usize,
        mem: &'static str,
        bytes: (usize, usize),
        first: String,
        second: String,
    },
    #[error("rank {rank}: wrong result: {msg}")]
    WrongResult { rank: usize, msg: String },
}

impl VerifyError {
    /// The executor needs more CCL buffer than offered: an algorithm used beyond its limits
    /// (possible only by forcing it, the operator would not select it).
    pub fn exceeds_ccl(&self) -> bool {
        matches!(self, VerifyError::Rejected { kind: Reject::OutOfBounds, msg, .. }
            if msg.contains("CclIn") || msg.contains("CclOut"))
    }

    /// The executor refused the configuration as outside its domain (e.g. `AllReducePair` on
    /// more than 2 ranks): a clear error for a forced algorithm, never a selected one.
    pub fn not_applicable(&self) -> bool {
        matches!(
            self,
            VerifyError::Executor {
                error: Error::InvalidArgument(_),
                ..
            }
        )
    }
}

/// Statistics of a successful verification.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub world: usize,
    /// Tasks per rank (all streams).
    pub tasks_per_rank: Vec<usize>,
    pub tasks: usize,
    pub transfers: usize,
    pub bytes_moved: usize,
    /// Memory accesses checked for races.
    pub accesses: usize,
}

/// What one rank runs.
#[derive(Clone, Copy)]
pub struct RankJob<'a> {
    pub exec: &'a dyn Executor,
    /// `rank` must be the job's index; `world` the number of jobs.
    pub param: OpParam,
}

/// Verifies `exec` running `param` on every rank `0..param.world` (`param.rank` is ignored).
pub fn verify(
    exec: &dyn Executor,
    param: &OpParam,
    cfg: &VerifyConfig,
) -> Result<Report, VerifyError> {
    let jobs: Vec<_> = (0..param.world)
        .map(|rank| {
            Some(RankJob {
                exec,
                param: OpParam { rank, ..*param },
            })
        })
        .collect();
    verify_jobs(&jobs, cfg)
}

/// Verifies a point-to-point pair: `sender` runs `send` (kind Send, root = `receiver`),
/// `receiver` runs `recv` (kind Recv, root = `sender`), the other ranks of `param.world` idle.
pub fn verify_send_recv(
    send: &dyn Executor,
    recv: &dyn Executor,
    param: &OpParam,
    sender: usize,
    receiver: usize,
    cfg: &VerifyConfig,
) -> Result<Report, VerifyError> {
    if sender == receiver || sender.max(receiver) >= param.world {
        return Err(VerifyError::Setup(format!(
            "send/recv pair {sender} -> {receiver} in a world of {}",
            param.world
        )));
    }
    let mut jobs: Vec<Option<RankJob<'_>>> = vec![None; param.world];
    jobs[sender] = Some(RankJob {
        exec: send,
        param: OpParam {
            kind: OpKind::Send,
            rank: sender,
            root: receiver,
            in_place: false,
            ..*param
        },
    });
    jobs[receiver] = Some(RankJob {
        exec: recv,
        param: OpParam {
            kind: OpKind::Recv,
            rank: receiver,
            root: sender,
            in_place: false,
            ..*param
        },
    });
    verify_jobs(&jobs, cfg)
}

/// The operator's choice for `param` under `cfg`.
pub fn selection(param: &OpParam, cfg: &VerifyConfig) -> &'static str {
    let topology = cfg.topology(param.world, param.rank);
    let ctx = SelectCtx {
        ccl_size: cfg.ccl_size,
        user_mem_links: cfg.user_mem_links,
        oversubscribed: false,
        cache_bytes: 0,
        topology: &topology,
    };
    operator::for_kind(param.kind).select_alg(param, &ctx).0
}

/// Whether the operator would select `entry` for `param` under `cfg`.
pub fn selected(entry: &Entry, param: &OpParam, cfg: &VerifyConfig) -> bool {
    entry.kind == param.kind && selection(param, cfg) == entry.name
}

/// Verifies a registry entry on `param` (`param.kind` must be the entry's kind). A Send entry
/// runs on `param.rank` toward `param.root` paired with the Recv algorithm the operator
/// selects from `registry`; a Recv entry likewise receives on `param.rank` from `param.root`.
pub fn verify_entry(
    registry: &Registry,
    entry: &Entry,
    param: &OpParam,
    cfg: &VerifyConfig,
) -> Result<Report, VerifyError> {
    if entry.kind != param.kind {
        return Err(VerifyError::Setup(format!(
            "{} runs {}, not {}",
            entry.name,
            entry.kind.name(),
            param.kind.name()
        )));
    }
    let other = |kind: OpKind| {
        let p = OpParam { kind, ..*param };
        let name = selection(&p, cfg);
        registry
            .get(name)
            .filter(|e| e.kind == kind)
            .ok_or_else(|| VerifyError::Setup(format!("no {} algorithm {name:?}", kind.name())))
    };
    match entry.kind {
        OpKind::Send => {
            let recv = other(OpKind::Recv)?;
            let (s, r) = (param.rank, param.root);
            verify_send_recv(&*entry.executor, &*recv.executor, param, s, r, cfg)
        }
        OpKind::Recv => {
            let send = other(OpKind::Send)?;
            let (s, r) = (param.root, param.rank);
            verify_send_recv(&*send.executor, &*entry.executor, param, s, r, cfg)
        }
        _ => verify(&*entry.executor, param, cfg),
    }
}

/// Verifies what the operator selects from `registry` for `param`; returns its name too.
pub fn verify_registry(
    registry: &Registry,
    param: &OpParam,
    cfg: &VerifyConfig,
) -> Result<(&'static str, Report), VerifyError> {
    let name = selection(param, cfg);
    let entry = registry
        .get(name)
        .ok_or_else(|| VerifyError::Setup(format!("operator selected unregistered {name:?}")))?;
    Ok((entry.name, verify_entry(registry, entry, param, cfg)?))
}

/// Verifies one job per rank (`None`: the rank takes no part).
pub fn verify_jobs(
    jobs: &[Option<RankJob<'_>>],
    cfg: &VerifyConfig,
) -> Result<Report, VerifyError> {
    let world = jobs.len();
    if !(1..=64).contains(&world) {
        return Err(VerifyError::Setup(format!(
            "world of {world} ranks (1..=64)"
        )));
    }
    if cfg.ccl_size == 0 {
        return Err(VerifyError::Setup("ccl_size 0".into()));
    }
    let mut ranks = Vec::with_capacity(world);
    let mut params = Vec::with_capacity(world);
    for (r, job) in jobs.iter().enumerate() {
        let Some(job) = job else {
            ranks.push(None);
            params.push(None);
            continue;
        };
        let p = job.param;
        if p.rank != r || p.world != world || p.root >= world {
            return Err(VerifyError::Setup(format!(
                "job {r}: {} with rank {} root {} in world {} (of {world} jobs)",
                p.describe(),
                p.rank,
                p.root,
                p.world
            )));
        }
        ranks.push(Some(record(job, cfg)?));
        params.push(Some(p));
    }
    let mut sim = Sim::new(ranks, cfg.fifo_depth);
    sim.run()?;
    race::check(&sim)?;
    check::check(&sim, &params)?;
    let tasks_per_rank: Vec<usize> = sim
        .ranks
        .iter()
        .map(|r| {
            r.as_ref()
                .map_or(0, |r| r.streams.iter().map(Vec::len).sum())
        })
        .collect();
    Ok(Report {
        world,
        tasks: tasks_per_rank.iter().sum(),
        tasks_per_rank,
        transfers: sim.done.len(),
        bytes_moved: sim.bytes_moved,
        accesses: sim.accesses.len(),
    })
}

/// Asks one rank's executor for its resources and records its tasks.
fn record(job: &RankJob<'_>, cfg: &VerifyConfig) -> Result<RankSim, VerifyError> {
    let (p, r) = (job.param, job.param.rank);
    let req = job.exec.calc_res_request(&p);
    let mut linked = vec![false; p.world];
    for peer in req.peers() {
        if peer >= p.world || peer == r {
            return Err(VerifyError::Resource {
                rank: r,
                msg: format!("link to rank {peer} (world {})", p.world),
            });
        }
        linked[peer] = true;
    }
    let layout = Layout::new(&p, cfg.ccl_size, req.scratch_mem_size);
    let shared = cfg.shared_ranks >> r & 1 != 0;
    let shared_user = SharedUser {
        input: shared,
        output: shared,
    };
    let mut rec = Recorder::new(
        p,
        &layout,
        req.stream_num,
        req.notify_num,
        linked,
        (cfg.user_mem_links, shared_user),
    );
    let cursor = Cell::new(cfg.window_cursor);
    let topology = cfg.topology(p.world, r);
    let result = job.exec.orchestrate(
        &p,
        &mut AlgResourceResponse {
            ccl_in_size: cfg.ccl_size,
            ccl_out_size: cfg.ccl_size,
            scratch_size: req.scratch_mem_size,
            stream_num: req.stream_num,
            notify_num: req.notify_num,
            user_mem_links: cfg.user_mem_links,
            shared_user,
            cache_bytes: 0,
            topology: &topology,
            ccl_in_cursor: &cursor,
            tasks: &mut rec,
        },
    );
    if let Some(e) = rec.rejected.take() {
        return Err(e);
    }
    result.map_err(|error| VerifyError::Executor { rank: r, error })?;
    let streams = std::mem::take(&mut rec.streams);
    drop(rec);
    // Initial memory: the input's symbols; everything else uninitialised.
    let e = layout.elem;
    let mut mems: Vec<Vec<Val>> = layout
        .mem_bytes
        .iter()
        .map(|&b| vec![Val::Garbage; b.div_ceil(e)])
        .collect();
    let base = layout.base[0] / e;
    for i in 0..p.input_bytes() / e {
        mems[layout.mem[0]][base + i] = Val::input(r, i);
    }
    Ok(RankSim {
        layout,
        streams,
        notify_num: req.notify_num,
        mems,
    })
}
