//! The plan cache: resources by `(algorithm, new_tag)`, made from the executor's request at
//! their first use and reused after (HCCL's resource reuse by tag), and the plans of the
//! latest calls of a few distinct shapes, which a loop of calls (a training step's, a
//! ping-pong's send and receive) takes again without selection or lookups.

use std::sync::Arc;

use ampccl_runtime::mem::HostBuffer;
use ampccl_runtime::notify::Notify;
use ampccl_runtime::stream::Stream;
use ampccl_runtime::{DataType, Error, ReduceOp, Result};
use ampccl_transport::link::Link;

use super::CommInner;
use crate::executor::{Operator, SelectCtx};
use crate::fasthash::FastMap;
use crate::op::{OpKind, OpParam};
use crate::operator;
use crate::registry::Entry;

/// Resources of one `(algorithm, new_tag)`, created once and reused.
pub(super) struct Resources {
    pub(super) sides: Vec<Stream>,
    pub(super) notifies: Vec<Notify>,
    pub(super) scratch: HostBuffer,
}

/// How many plans of distinct shapes [`PlanCache`] keeps: a loop alternating up to this many
/// shapes finds each call's plan without selection.
const RECENT: usize = 4;

/// Resources by algorithm and tag, and the plans of the latest calls.
#[derive(Default)]
pub(super) struct PlanCache {
    resources: FastMap<(&'static str, u64), Arc<Resources>>,
    /// The plans of the latest [`RECENT`] calls of distinct shapes, newest first.
    recent: Vec<Plan>,
}

/// What a call runs: the algorithm, its resources and the call's fingerprint.
#[derive(Clone)]
pub(super) struct Plan {
    shape: Shape,
    /// The algorithm's position in the registry.
    pub(super) entry: usize,
    pub(super) res: Arc<Resources>,
    pub(super) fingerprint: u32,
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

impl CommInner {
    /// The plan of a call: a recent call's again if `p` has its shape, else selected anew.
    pub(super) fn plan(&self, p: &OpParam, ctx: &SelectCtx) -> Result<Plan> {
        let shape = Shape::of(p);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plan) = cache.recent.iter().find(|l| l.shape == shape) {
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
        cache.recent.truncate(RECENT - 1);
        cache.recent.insert(0, plan.clone());
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
                .get_or_init(|| Link::new(self.transport.clone(), peer))
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
}
