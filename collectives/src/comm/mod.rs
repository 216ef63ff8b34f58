//! `Communicator`: a group of ranks and everything an operation needs (HCCL's framework
//! steps): validate → operator selects `(algorithm, new_tag)` → resources by tag (created from
//! the executor's request on first use, then cached) → executor orchestrates onto streams. A
//! call of the same shape as the latest one reuses its plan (algorithm, resources, fingerprint).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ampccl_runtime::engine::{DEFAULT_SPIN, Engine};
use ampccl_runtime::mem::HostBuffer;
use ampccl_runtime::notify::Notify;
use ampccl_runtime::stream::{Event, Stream};
use ampccl_runtime::task::{CopyTo, Task};
use ampccl_runtime::{DataType, Error, ReduceOp, Result};
use ampccl_transport::bootstrap::{Bootstrap, UniqueId};
use ampccl_transport::link::Link;
use ampccl_transport::probe;
use ampccl_transport::shm::{self, ShmConfig, ShmDevice};

use crate::config::{self, Config};
use crate::executor::{Operator, SelectCtx};
use crate::fasthash::FastMap;
use crate::op::{OpKind, OpParam};
use crate::operator;
use crate::registry::{Entry, Registry};
use crate::resource::{AlgResourceResponse, BufKind, SharedUser};
use crate::sink::{Region, StreamSink, slot};

mod plan;

use plan::{Job, plan};

/// Resources of one `(algorithm, new_tag)`, created once and reused.
struct Resources {
    sides: Vec<Stream>,
    notifies: Vec<Notify>,
    scratch: HostBuffer,
}

/// Resources by algorithm and tag, and the latest call's plan.
#[derive(Default)]
struct PlanCache {
    resources: FastMap<(&'static str, u64), Arc<Resources>>,
    /// A loop of calls of one shape (a training step's) skips selection and both lookups:
    /// about 25 ns of a 140 ns 1-rank allreduce.
    last: Option<Plan>,
}

/// What a call runs: the algorithm, its resources and the call's fingerprint.
#[derive(Clone)]
struct Plan {
    shape: Shape,
    /// The algorithm's position in the registry.
    entry: usize,
    res: Arc<Resources>,
    fingerprint: u32,
}

/// What a plan depends on besides the communicator (whose rank, size, configuration and
/// host facts are fixed): everything of the call but its sequence number.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    kind: OpKind,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    in_place: bool,
}

impl Shape {
    fn of(p: &OpParam) -> Shape {
        Shape {
            kind: p.kind,
            count: p.count,
            dtype: p.dtype,
            op: p.op,
            root: p.root,
            in_place: p.in_place,
        }
    }
}

pub(crate) struct CommInner {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) boot: Bootstrap,
    pub(crate) dev: Arc<ShmDevice>,
    pub(crate) engine: Engine,
    pub(crate) default_stream: Stream,
    pub(crate) config: Config,
    registry: Registry,
    links: Vec<OnceLock<Arc<Link>>>,
    link_table: Mutex<Vec<Option<Arc<Link>>>>,
    cache: Mutex<PlanCache>,
    /// Completion of the latest operation and its stream (operations of a communicator run in
    /// issue order, whatever stream they are on: they share the CCL buffers and links).
    last: Mutex<Option<(Stream, Event)>>,
    /// Streams of group members (grown on demand).
    group_streams: Mutex<Vec<Stream>>,
    seq: AtomicU64,
    /// Where the next call's first receive slot in `CclIn` starts (see
    /// [`crate::steps::window`]); read and written by `orchestrate` under `link_table`'s lock.
    window_cursor: AtomicUsize,
    failed: AtomicBool,
    /// What the local ranks agreed on about their host at init.
    host: HostFacts,
    splits: AtomicU64,
}

/// A communicator: the ranks of one group and the resources to run collectives among them.
///
/// Cheap to clone (shared handle). All methods are thread-safe; operations issued from
/// several threads are ordered by issue time and must be issued in the same order on every
/// rank, as with NCCL.
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<CommInner>,
}

/// Bootstrap tag of communicator setup and split exchanges.
const TAG_SPLIT: u64 = 0x5350_4c00_0000_0000;
/// Bootstrap tag of the host facts gathered at init (see [`host_facts`]).
const TAG_HOST: u64 = 0x4350_5500_0000_0000;

impl Communicator {
    /// Joins the communicator of `world` ranks named by `id` as `rank` (like
    /// `ncclCommInitRank`), with configuration from the environment.
    pub fn init(id: &UniqueId, rank: usize, world: usize) -> Result<Communicator> {
        Communicator::init_with(id, rank, world, Config::from_env()?, Registry::builtin())
    }

    /// As [`Communicator::init`] with explicit configuration and algorithms.
    pub fn init_with(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: Config,
        registry: Registry,
    ) -> Result<Communicator> {
        config::init_logging();
        let boot = Bootstrap::init(id, rank, world, config.timeout)?;
        Communicator::from_bootstrap(boot, config, registry)
    }

    /// Joins using `AMPCCL_UNIQUE_ID` + `RANK`/`WORLD_SIZE`, or torchrun's `MASTER_ADDR`,
    /// `MASTER_PORT`, `RANK`, `WORLD_SIZE`.
    pub fn from_env() -> Result<Communicator> {
        config::init_logging();
        let config = Config::from_env()?;
        let boot = Bootstrap::from_env(config.timeout)?;
        Communicator::from_bootstrap(boot, config, Registry::builtin())
    }

    /// Builds the communicator over an established bootstrap.
    pub fn from_bootstrap(
        boot: Bootstrap,
        config: Config,
        registry: Registry,
    ) -> Result<Communicator> {
        let (rank, world) = (boot.rank(), boot.world());
        probe::select(&boot, config.transport.as_deref())?;
        let shm_cfg = ShmConfig {
            window: 2 * config.buffsize,
            depth: config.fifo_depth,
            allow_cma: config.allow_cma,
        };
        let dev = shm::connect(&boot, &shm_cfg)?;
        dev.set_op_formatter(OpParam::describe_record);
        let engine = Engine::new(dev.doorbell(), config.timeout);
        // Spinning only pays when every local rank has a core of its own: otherwise a spinning
        // rank delays the peer that shares its core.
        let host = host_facts(&boot, config.cache_bytes)?;
        let default_spin = if host.oversubscribed {
            Duration::ZERO
        } else {
            DEFAULT_SPIN
        };
        engine.set_spin(config.spin.unwrap_or(default_spin));
        let health_dev = dev.clone();
        engine.set_health_check(Box::new(move || health_dev.check_peers_failed()));
        let default_stream = engine.stream();
        if rank == 0 {
            tracing::info!("communicator of {world} ranks: {config:?}");
        }
        Ok(Communicator {
            inner: Arc::new(CommInner {
                rank,
                world,
                boot,
                dev,
                engine,
                default_stream,
                config,
                registry,
                links: (0..world).map(|_| OnceLock::new()).collect(),
                link_table: Mutex::new(vec![None; world]),
                cache: Mutex::new(PlanCache::default()),
                last: Mutex::new(None),
                group_streams: Mutex::new(Vec::new()),
                seq: AtomicU64::new(0),
                window_cursor: AtomicUsize::new(0),
                failed: AtomicBool::new(false),
                host,
                splits: AtomicU64::new(0),
            }),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.inner.world
    }

    /// The stream operations use when none is given.
    pub fn default_stream(&self) -> &Stream {
        &self.inner.default_stream
    }

    /// A new stream for this communicator's operations.
    pub fn stream(&self) -> Stream {
        self.inner.engine.stream()
    }

    /// The algorithms this communicator can run.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Whether the shared-memory transport writes straight into peers' user buffers
    /// (cross-memory attach) rather than through bounce buffers.
    pub fn uses_cross_memory_attach(&self) -> bool {
        self.inner.dev.uses_cma()
    }

    /// The first error this communicator met, if any (like `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.inner.engine.abort_reason() {
            return Some(e);
        }
        let last = self.inner.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .and_then(|(_, ev)| ev.status())
            .and_then(|r| r.err())
    }

    /// Stops everything: queued and running operations fail with `Aborted`, peers are told
    /// this rank failed (their waits on it end with an error), and no later operation runs.
    pub fn abort(&self) {
        self.inner.fail("aborted by the application");
        self.inner
            .engine
            .abort(Error::Aborted("communicator aborted".into()));
    }

    /// Waits for every issued operation, then releases this handle (the resources go when
    /// the last clone is dropped).
    pub fn destroy(self) -> Result<()> {
        let last = self
            .inner
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match last {
            Some((_, ev)) => ev.wait(),
            None => Ok(()),
        }
    }

    /// Splits into sub-communicators (like `ncclCommSplit`): ranks passing the same `color`
    /// form one, ordered by `key` then by rank here. A negative color (NCCL's
    /// `NCCL_SPLIT_NOCOLOR`) joins none and returns `None`. Collective over this communicator.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let n = self.inner.splits.fetch_add(1, Ordering::Relaxed);
        let mut mine = Vec::with_capacity(8);
        mine.extend_from_slice(&color.to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = self.inner.boot.allgather(TAG_SPLIT | n, &mine)?;
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = Vec::new();
        for (r, m) in all.iter().enumerate() {
            let (Some(c), Some(k)) = (m.get(0..4), m.get(4..8)) else {
                return Err(Error::Remote(format!(
                    "rank {r} sent a malformed split record"
                )));
            };
            if i32::from_le_bytes(c.try_into().unwrap()) == color {
                members.push((i32::from_le_bytes(k.try_into().unwrap()), r));
            }
        }
        members.sort();
        let ranks: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
        let sub = self.inner.boot.subgroup(&ranks, (n << 32) | color as u64)?;
        Communicator::from_bootstrap(sub, self.inner.config.clone(), self.inner.registry.clone())
            .map(Some)
    }

    /// Enqueues `calls` on `stream` and returns the completion event of all of them. One call
    /// runs on `stream` itself; several (a group) run concurrently on the communicator's group
    /// streams, joined back into `stream`. Either way they start after the previous operation
    /// of this communicator.
    ///
    /// `blocking`: the caller waits for the event right away. Then one call of a single-stream
    /// algorithm on an idle communicator runs on this thread at once (the stream made inline),
    /// without queueing its tasks for the engine: the same tasks and messages, less overhead
    /// (what a small message's latency is made of).
    ///
    /// # Safety
    /// The calls' regions must stay valid (inputs for reads, outputs for exclusive writes)
    /// until the returned event completes.
    pub(crate) unsafe fn submit(
        &self,
        stream: &Stream,
        calls: &mut [Call],
        blocking: bool,
    ) -> Result<Event> {
        let c = &*self.inner;
        if let Some(e) = c.engine.abort_reason() {
            return Err(e);
        }
        if c.failed.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(
                "the communicator failed earlier (see the first error); abort and recreate it"
                    .into(),
            ));
        }
        for call in calls.iter_mut() {
            call.p.seq = c.seq.fetch_add(1, Ordering::Relaxed);
            operator::for_kind(call.p.kind).validate(&call.p)?;
        }
        let mut last = c.last.lock().unwrap_or_else(|e| e.into_inner());
        let prior = last
            .as_ref()
            .filter(|(_, ev)| !ev.is_done())
            .map(|(s, ev)| (s.clone(), ev.clone()));
        let after_prior = |s: &Stream| {
            if let Some((ps, ev)) = &prior
                && !ps.same_as(s)
            {
                s.wait_event(ev);
            }
        };
        let to_self = |call: &Call| {
            matches!(call.p.kind, OpKind::Send | OpKind::Recv) && call.p.root == c.rank
        };
        let result = if let [call] = &calls[..]
            && !to_self(call)
        {
            // The common case, without planning (and without allocating).
            after_prior(stream);
            c.orchestrate(stream, &calls[0], blocking && prior.is_none())
        } else {
            let jobs = plan(c.rank, calls)?;
            // Without cross-memory attach every receive lands in the one CCL input buffer, so
            // the group's receives take turns on one stream (sends, which read user memory,
            // still run concurrently; a receive waits only for its matching send, which waits
            // only for that receive: no cycle). With it they land in user memory directly.
            let serial_recv = !c.dev.uses_cma();
            let mut lanes = Vec::with_capacity(jobs.len());
            let (mut n, mut recv_lane) = (0, None);
            for job in &jobs {
                let is_recv = matches!(*job, Job::Call(i) if calls[i].p.kind == OpKind::Recv);
                let lane = match recv_lane {
                    Some(l) if serial_recv && is_recv => l,
                    _ => {
                        n += 1;
                        if serial_recv && is_recv {
                            recv_lane = Some(n - 1);
                        }
                        n - 1
                    }
                };
                lanes.push(lane);
            }
            let mut streams = c.group_streams.lock().unwrap_or_else(|e| e.into_inner());
            while streams.len() < n {
                streams.push(c.engine.stream());
            }
            for s in &streams[..n] {
                after_prior(s);
            }
            let mut r = Ok(());
            for (&job, &lane) in jobs.iter().zip(&lanes) {
                r = c.run_job(&streams[lane], calls, job);
                if r.is_err() {
                    break;
                }
            }
            for s in &streams[..n] {
                stream.wait_event(&s.record());
            }
            r
        };
        if let Err(e) = result {
            // Part of the operation may be queued: the ranks are out of step now.
            c.fail(&e.to_string());
            c.engine.abort(e.clone());
            return Err(e);
        }
        let ev = stream.record();
        if ev.is_done() {
            // Ran inline (or had nothing to do): nothing later needs to wait for it.
            if last.is_some() {
                *last = None;
            }
        } else {
            *last = Some((stream.clone(), ev.clone()));
        }
        Ok(ev)
    }
}

/// A validated operation: its parameters and buffers.
pub(crate) struct Call {
    pub p: OpParam,
    pub input: Region,
    pub output: Region,
}

impl CommInner {
    /// The plan of a call: the latest call's again if `p` has its shape, else selected anew.
    fn plan(&self, p: &OpParam, ctx: &SelectCtx) -> Result<Plan> {
        let shape = Shape::of(p);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plan) = cache.last.as_ref().filter(|l| l.shape == shape) {
            return Ok(plan.clone());
        }
        let (entry, new_tag) = self.select(p, operator::for_kind(p.kind), ctx)?;
        let res = self.resources(&mut cache.resources, self.registry.at(entry), new_tag, p)?;
        let plan = Plan {
            shape,
            entry,
            res,
            fingerprint: p.fingerprint(),
        };
        cache.last = Some(plan.clone());
        Ok(plan)
    }

    /// The algorithm for `p` (its registry position) and its resource tag.
    fn select(&self, p: &OpParam, op: &dyn Operator, ctx: &SelectCtx) -> Result<(usize, u64)> {
        if let Some(name) = self.config.forced.get(&p.kind) {
            let i = self.registry.position(name).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "AMPCCL_ALGO_{}={name}: no such algorithm (registered:\n{})",
                    p.kind.name().to_uppercase(),
                    self.registry
                ))
            })?;
            let e = self.registry.at(i);
            if e.kind != p.kind {
                return Err(Error::InvalidArgument(format!(
                    "algorithm {name} runs {}, not {}",
                    e.kind.name(),
                    p.kind.name()
                )));
            }
            return Ok((i, 0));
        }
        let (name, tag) = op.select_alg(p, ctx);
        let i = self.registry.position(name).ok_or_else(|| {
            Error::Internal(format!("operator selected unregistered algorithm {name}"))
        })?;
        Ok((i, tag))
    }

    /// Queues one job onto `stream` (the caller, `submit`, guarantees the calls' regions stay
    /// valid until the stream gets past it).
    fn run_job(&self, stream: &Stream, calls: &[Call], job: Job) -> Result<()> {
        match job {
            Job::Call(i) => self.orchestrate(stream, &calls[i], false),
            Job::SelfCopy { send, recv } => {
                let (src, dst) = (calls[send].input, calls[recv].output);
                if src.len > 0 && src.ptr != dst.ptr {
                    // SAFETY: both regions hold `src.len` bytes (checked by `plan`) and stay
                    // valid until the operation completes (the contract of `submit`); the
                    // typed API borrows them as `&[T]` and `&mut [T]`, so they do not overlap.
                    unsafe {
                        stream.enqueue(Task::Copy {
                            dst: dst.ptr,
                            src: src.ptr,
                            len: src.len,
                            to: CopyTo::Local,
                        })
                    };
                }
                Ok(())
            }
        }
    }

    /// Selects, fetches resources and orchestrates one call onto `stream`; `may_inline`: the
    /// caller waits for it at once and nothing of this communicator runs before it, so a
    /// single-stream algorithm may run inline (see `submit`).
    fn orchestrate(&self, stream: &Stream, call: &Call, may_inline: bool) -> Result<()> {
        let p = &call.p;
        if p.kind == OpKind::Send && p.root == self.rank {
            return Err(Error::InvalidArgument(
                "a send to this rank itself needs a group with the matching recv".into(),
            ));
        }
        let ctx = SelectCtx {
            ccl_size: self.config.buffsize,
            user_mem_links: self.dev.uses_cma(),
            oversubscribed: self.host.oversubscribed,
            cache_bytes: self.host.cache_bytes,
        };
        let plan = self.plan(p, &ctx)?;
        let (entry, res) = (self.registry.at(plan.entry), &plan.res);
        let (window, _) = self.dev.window();
        let b = self.config.buffsize;
        let mut regions = [Region::EMPTY; 5];
        regions[slot(BufKind::UserIn)] = call.input;
        regions[slot(BufKind::UserOut)] = call.output;
        regions[slot(BufKind::CclIn)] = Region {
            ptr: window,
            len: b,
        };
        // SAFETY: the window holds two buffers of `b` bytes.
        regions[slot(BufKind::CclOut)] = Region {
            ptr: unsafe { window.add(b) },
            len: b,
        };
        regions[slot(BufKind::Scratch)] = res.scratch.region();
        let shared = |r: Region| r.len > 0 && shm::shared::find(r.ptr, r.len).is_some();
        let shared_user = SharedUser {
            input: shared(call.input),
            output: shared(call.output),
        };
        self.dev.set_op(&p.to_record());
        let links = self.link_table.lock().unwrap_or_else(|e| e.into_inner());
        let mut sink = StreamSink {
            main: stream,
            sides: &res.sides,
            notifies: &res.notifies,
            links: &links,
            regions,
            shared_user,
            tag: plan.fingerprint,
        };
        let cursor = Cell::new(self.window_cursor.load(Ordering::Relaxed));
        let mut resp = AlgResourceResponse {
            ccl_in_size: b,
            ccl_out_size: b,
            scratch_size: res.scratch.len(),
            stream_num: res.sides.len(),
            notify_num: res.notifies.len(),
            user_mem_links: ctx.user_mem_links,
            shared_user,
            cache_bytes: ctx.cache_bytes,
            ccl_in_cursor: &cursor,
            tasks: &mut sink,
        };
        // A task of an inline stream runs to completion before the next is issued, so only
        // an algorithm whose tasks all go to this one stream may run inline.
        let _inline = (may_inline && res.sides.is_empty() && res.notifies.is_empty())
            .then(|| stream.inline_while_idle())
            .flatten();
        entry.executor.orchestrate(p, &mut resp)?;
        self.window_cursor.store(cursor.get(), Ordering::Relaxed);
        drop(links);
        Ok(())
    }

    /// The resources of `entry` for `new_tag`, made at its first use.
    fn resources(
        &self,
        cache: &mut FastMap<(&'static str, u64), Arc<Resources>>,
        entry: &Entry,
        new_tag: u64,
        p: &OpParam,
    ) -> Result<Arc<Resources>> {
        let key = (entry.name, new_tag);
        if let Some(r) = cache.get(&key) {
            return Ok(r.clone());
        }
        let req = entry.executor.calc_res_request(p);
        for peer in req.peers() {
            if peer >= self.world || peer == self.rank {
                return Err(Error::Internal(format!(
                    "algorithm {} requested a link to rank {peer} (world {}, rank {})",
                    entry.name, self.world, self.rank
                )));
            }
            let link = self.links[peer]
                .get_or_init(|| Link::new(self.dev.clone(), peer))
                .clone();
            self.link_table.lock().unwrap_or_else(|e| e.into_inner())[peer] = Some(link);
        }
        let r = Arc::new(Resources {
            sides: (0..req.stream_num).map(|_| self.engine.stream()).collect(),
            notifies: (0..req.notify_num).map(|_| self.engine.notify()).collect(),
            scratch: HostBuffer::zeroed(req.scratch_mem_size),
        });
        tracing::debug!("resources for {} tag {new_tag}: {req:?}", entry.name);
        cache.insert(key, r.clone());
        Ok(r)
    }

    /// Marks the communicator failed and tells the peers.
    pub(crate) fn fail(&self, msg: &str) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!("rank {}: {msg}", self.rank);
            self.dev.mark_failed(msg);
        }
    }
}

/// What the ranks on this host agree on about it (every local rank computes the same, so
/// their algorithm choices agree).
#[derive(Clone, Copy, Debug)]
struct HostFacts {
    /// Whether this host runs more ranks of the communicator than the CPUs they may run on
    /// together: the union of the local ranks' affinity masks. Each rank's own mask is not
    /// enough: ranks pinned one per CPU (as MPI launchers and `ampccl-perf -g` pin them) each
    /// see one CPU, yet none shares its core. See [`SelectCtx::oversubscribed`].
    oversubscribed: bool,
    /// See [`SelectCtx::cache_bytes`].
    cache_bytes: usize,
}

/// Gathers every rank's CPU set and last-level cache size (`cache_bytes`, else sysfs's); the
/// local ones decide.
fn host_facts(boot: &Bootstrap, cache_bytes: Option<usize>) -> Result<HostFacts> {
    let cache = cache_bytes.unwrap_or_else(last_level_cache_bytes);
    let mut mine = (cache as u64).to_le_bytes().to_vec();
    mine.extend(cpu_mask());
    let all = boot.allgather(TAG_HOST, &mine)?;
    let here = boot.host_id();
    let local: Vec<(u64, &[u8])> = all
        .iter()
        .zip(boot.host_ids())
        .filter(|(_, h)| **h == here)
        .map(|(m, _)| {
            let (cache, mask) = m.split_at(8.min(m.len()));
            (cache.try_into().map_or(0, u64::from_le_bytes), mask)
        })
        .collect();
    let masks: Vec<&[u8]> = local.iter().map(|(_, m)| *m).collect();
    Ok(HostFacts {
        oversubscribed: local.len() > cpus_in_union(&masks),
        cache_bytes: local.iter().map(|(c, _)| *c).min().unwrap_or(0) as usize,
    })
}

/// Size of the last (highest-level) cache of CPU 0, from sysfs; 0 if it cannot be read.
fn last_level_cache_bytes() -> usize {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let level: u32 = read(path.join("level"))?.trim().parse().ok()?;
            Some((level, parse_cache_size(&read(path.join("size"))?)?))
        })
        .max()
        .map_or(0, |(_, bytes)| bytes)
}

/// A sysfs cache size (`32768K`, `4M`, `512`) in bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last()? {
        (i, 'K') => (&s[..i], 1 << 10),
        (i, 'M') => (&s[..i], 1 << 20),
        (i, 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(unit)
}

/// The CPUs this thread may run on, as a bitmap (bit `c % 8` of byte `c / 8`); when the mask
/// cannot be read, as many CPUs as `available_parallelism` counts.
fn cpu_mask() -> Vec<u8> {
    use rustix::thread::{CpuSet, sched_getaffinity};
    let mut bits = vec![0u8; CpuSet::MAX_CPU.div_ceil(8)];
    match sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .for_each(|c| bits[c / 8] |= 1 << (c % 8)),
        Err(_) => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n.min(CpuSet::MAX_CPU)).for_each(|c| bits[c / 8] |= 1 << (c % 8));
        }
    }
    bits
}

/// Number of CPUs in the union of bitmaps (at least 1).
fn cpus_in_union(masks: &[&[u8]]) -> usize {
    let len = masks.iter().map(|m| m.len()).max().unwrap_or(0);
    let n: u32 = (0..len)
        .map(|i| {
            masks
                .iter()
                .fold(0u8, |acc, m| acc | m.get(i).copied().unwrap_or(0))
                .count_ones()
        })
        .sum();
    (n as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_ranks_count_the_union_of_their_cpus() {
        let (cpu0, cpu1, both) = ([0b01u8], [0b10u8], [0b11u8]);
        // Two ranks pinned to CPUs 0 and 1: two CPUs, not oversubscribed.
        assert_eq!(cpus_in_union(&[&cpu0, &cpu1]), 2);
        // Both pinned to CPU 0, or unpinned on a 2-CPU host.
        assert_eq!(cpus_in_union(&[&cpu0, &cpu0]), 1);
        assert_eq!(cpus_in_union(&[&both, &both, &both]), 2);
        // Masks of different lengths; an empty set still counts one CPU.
        assert_eq!(cpus_in_union(&[&[0u8, 0b1000_0000], &cpu1]), 2);
        assert_eq!(cpus_in_union(&[&[]]), 1);
        assert!(cpu_mask().iter().any(|b| *b != 0));
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("4M"), Some(4 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("x12K"), None);
    }
}
