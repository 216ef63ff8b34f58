//! `Communicator`: a group of ranks and everything an operation needs (HCCL's framework
//! steps): validate → operator selects `(algorithm, new_tag)` → resources by tag (created from
//! the executor's request on first use, then cached) → executor orchestrates onto streams. A
//! call of the same shape as the latest one reuses its plan (algorithm, resources, fingerprint).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ampccl_runtime::engine::{DEFAULT_SPIN, Engine};
use ampccl_runtime::stream::{Event, Stream};
use ampccl_runtime::{Error, Result};
use ampccl_transport::bootstrap::{Bootstrap, UniqueId};
use ampccl_transport::link::Link;
use ampccl_transport::topology::Topology;
use ampccl_transport::transport::{self, Transport, TransportConfig};

use crate::config::{self, Config};
use crate::executor::SelectCtx;
use crate::op::{OpKind, OpParam};
use crate::operator;
use crate::registry::Registry;
use crate::resource::{AlgResourceResponse, BufKind, SharedUser};
use crate::sink::{Region, StreamSink, slot};

mod cache;
mod group;
mod host;

use cache::PlanCache;
use group::plan;
use host::{HostFacts, host_facts};

pub(crate) struct CommInner {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) boot: Bootstrap,
    pub(crate) transport: Arc<dyn Transport>,
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
    /// Collectives orchestrated so far: every rank runs them in one order, so the count names
    /// the same operation on every rank (point-to-point calls do not count; see
    /// [`OpParam::to_record`]). Changed only by `orchestrate`, which submissions serialize.
    collectives: AtomicU64,
    /// Where the next call's first receive slot in `CclIn` starts (see
    /// [`crate::steps::window`]); read and written by `orchestrate` under `link_table`'s lock.
    window_cursor: AtomicUsize,
    failure: Arc<Failure>,
    /// What the local ranks agreed on about their host at init.
    host: HostFacts,
    /// Which ranks share a host.
    topology: Topology,
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

    /// Joins the job the launcher started: `AMPCCL_UNIQUE_ID` + `RANK`/`WORLD_SIZE`
    /// (`ampccl-run`), torchrun (through its agent's TCPStore at `MASTER_ADDR:MASTER_PORT`),
    /// `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE` (rank 0 hosts the rendezvous), or an
    /// MPICH-family `mpirun` / `srun --mpi=pmi2` (PMI-1 on `PMI_FD`); see
    /// `ampccl_transport::bootstrap::Source` for the order and the errors.
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
        let transport = transport::connect(
            &boot,
            &TransportConfig {
                window: 2 * config.buffsize,
                fifo_depth: config.fifo_depth,
                allow_cma: config.allow_cma,
                forced: config.transport.clone(),
                shm_disable: config.shm_disable,
            },
        )?;
        transport.set_op_formatter(OpParam::describe_record);
        let engine = Engine::new(transport.doorbell(), config.timeout);
        // The transport's held-back small frames go out once the engine has had nothing to do
        // for a while, or before it sleeps, when its receiving thread takes the connections
        // back. (A weak reference: the communicator, not its engine, owns the transport.)
        if transport.holds_frames_back() {
            let flushed = Arc::downgrade(&transport);
            engine.set_idle_hook(Box::new(move |sleeping| {
                if let Some(t) = flushed.upgrade() {
                    if sleeping {
                        t.driver_sleeps();
                    } else {
                        t.flush();
                    }
                }
            }));
        }
        // Spinning only pays when every local rank has a core of its own: otherwise a spinning
        // rank delays the peer that shares its core.
        let topology = boot.topology();
        let host = host_facts(&boot, &topology, config.cache_bytes)?;
        let default_spin = if host.oversubscribed {
            Duration::ZERO
        } else {
            DEFAULT_SPIN
        };
        engine.set_spin(config.spin.unwrap_or(default_spin));
        let default_stream = engine.stream();
        if rank == 0 {
            tracing::info!("communicator of {world} ranks: {config:?}");
        }
        // Any failure the engine sees (a task's error, its own timeouts; also where nobody
        // looks at the result, as with the C ABI's streams) marks the communicator failed.
        // The hook holds no communicator: the engine's own thread may run it, and must not
        // drop the engine it runs on.
        let failure = Arc::new(Failure {
            rank,
            failed: AtomicBool::new(false),
        });
        let (marks, told) = (failure.clone(), Arc::downgrade(&transport));
        engine.set_abort_hook(Box::new(move |e| {
            if let Some(t) = told.upgrade() {
                marks.mark(&*t, &e.to_string(), true);
            }
        }));
        Ok(Communicator {
            inner: Arc::new(CommInner {
                rank,
                world,
                boot,
                transport,
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
                collectives: AtomicU64::new(0),
                window_cursor: AtomicUsize::new(0),
                failure,
                host,
                topology,
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

    /// This rank's index among the ranks of its host: the launcher's (`LOCAL_RANK`,
    /// `MPI_LOCALRANKID`, ...) when it set one, else the number of lower ranks on this host.
    pub fn local_rank(&self) -> usize {
        self.inner.boot.local_rank()
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

    /// Whether the transport moves data straight between user buffers (cross-memory attach
    /// between local ranks, or TCP) rather than through the communicator's window.
    pub fn uses_cross_memory_attach(&self) -> bool {
        self.inner.transport.user_mem_links()
    }

    /// Which ranks share a host.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// The name of the transport provider that connects the ranks (`shm`, `tcp`).
    pub fn transport_name(&self) -> &'static str {
        self.inner.transport.name()
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
        self.inner.mark_failed("aborted by the application", false);
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
    /// `wait`: when the caller waits for the event. [`Wait::Now`]: one call of a single-stream
    /// algorithm on an idle communicator runs on this thread at once (the stream made inline),
    /// without queueing its tasks for the engine: the same tasks and messages, less overhead
    /// (what a small message's latency is made of). [`Wait::Soon`]: such a call's tasks are
    /// parked on the stream for the waiter to run the same way (see `ampccl_runtime::park`).
    ///
    /// # Safety
    /// The calls' regions must stay valid (inputs for reads, outputs for exclusive writes)
    /// until the returned event completes.
    pub(crate) unsafe fn submit(
        &self,
        stream: &Stream,
        calls: &mut [Call],
        wait: Wait,
    ) -> Result<Event> {
        let c = &*self.inner;
        if let Some(e) = c.engine.abort_reason() {
            return Err(e);
        }
        if c.failure.failed.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(
                "the communicator failed earlier (see the first error); abort and recreate it"
                    .into(),
            ));
        }
        for call in calls.iter_mut() {
            operator::for_kind(call.p.kind).validate(&call.p)?;
        }
        for call in calls.iter_mut() {
            call.p.seq = c.seq.fetch_add(1, Ordering::Relaxed);
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
                // Parked work of the previous operation must run for this one to start.
                ps.unpark();
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
            let wait = if prior.is_none() { wait } else { Wait::Later };
            c.orchestrate(stream, &calls[0], wait)
        } else {
            // A group that cannot be planned is refused before anything is queued: the
            // communicator stays usable.
            let jobs = plan(c.rank, calls)?;
            c.run_group(stream, calls, &jobs, after_prior)
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

/// When the caller of [`Communicator::submit`] waits for the operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Wait {
    /// At once, on this thread (a blocking call).
    Now,
    /// Probably soon, on this thread (the C ABI: enqueue, then synchronize).
    Soon,
    /// Maybe never (futures): the engine runs it.
    Later,
}

/// A validated operation: its parameters and buffers.
pub(crate) struct Call {
    pub p: OpParam,
    pub input: Region,
    pub output: Region,
}

impl CommInner {
    /// Selects, fetches resources and orchestrates one call onto `stream`; `wait`: when the
    /// caller waits for it, `Now` or `Soon` only if nothing of this communicator runs before
    /// it, so that a single-stream algorithm may run inline or parked (see `submit`).
    fn orchestrate(&self, stream: &Stream, call: &Call, wait: Wait) -> Result<()> {
        let p = &call.p;
        if p.kind == OpKind::Send && p.root == self.rank {
            return Err(Error::InvalidArgument(
                "a send to this rank itself needs a group with the matching recv".into(),
            ));
        }
        let ctx = SelectCtx {
            ccl_size: self.config.buffsize,
            user_mem_links: self.transport.user_mem_links(),
            oversubscribed: self.host.oversubscribed,
            cache_bytes: self.host.cache_bytes,
            topology: &self.topology,
        };
        let plan = self.plan(p, &ctx)?;
        let (entry, res) = (self.registry.at(plan.entry), &plan.res);
        let (window, _) = self.transport.window();
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
        let shared = |r: Region| r.len > 0 && self.transport.is_shared_user_memory(r.ptr, r.len);
        let shared_user = SharedUser {
            input: shared(call.input),
            output: shared(call.output),
        };
        let collective = (!p.kind.is_p2p()).then(|| {
            let n = self.collectives.load(Ordering::Relaxed);
            self.collectives.store(n + 1, Ordering::Relaxed);
            n
        });
        self.transport
            .set_op(&p.to_record(plan.fingerprint, collective));
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
            topology: &self.topology,
            ccl_in_cursor: &cursor,
            tasks: &mut sink,
        };
        // A task of an inline (or parked) stream runs to completion before the next one
        // starts, so only an algorithm whose tasks all go to this one stream may run so.
        let single = res.sides.is_empty() && res.notifies.is_empty();
        let _inline = (wait == Wait::Now && single)
            .then(|| stream.inline_while_idle())
            .flatten();
        let _parked = (wait == Wait::Soon && single)
            .then(|| stream.park_while_idle())
            .flatten();
        entry.executor.orchestrate(p, &mut resp)?;
        self.window_cursor.store(cursor.get(), Ordering::Relaxed);
        drop(links);
        Ok(())
    }

    /// Marks the communicator failed and tells the peers.
    pub(crate) fn fail(&self, msg: &str) {
        self.mark_failed(msg, true);
    }

    /// Marks the communicator failed and tells the peers; `log`: say so at error level (an
    /// application's own abort is no error of the library's and is only logged at `info`).
    fn mark_failed(&self, msg: &str, log: bool) {
        self.failure.mark(&*self.transport, msg, log);
    }
}

/// Whether a communicator failed: shared by the communicator and its engine's abort hook.
struct Failure {
    rank: usize,
    failed: AtomicBool,
}

impl Failure {
    /// Marks the communicator failed; the first call logs `msg` (at error level if `log`)
    /// and has `transport` tell the peers and close what they could still write into.
    fn mark(&self, transport: &dyn Transport, msg: &str, log: bool) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            if log {
                tracing::error!("rank {}: {msg}", self.rank);
            } else {
                tracing::info!("rank {}: {msg}", self.rank);
            }
            transport.mark_failed(msg);
        }
    }
}
