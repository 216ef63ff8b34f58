//! `AllReduceOneShot`: the latency algorithm. Every rank writes its whole input into a slot of
//! every peer's CCL input buffer, then reduces the `P` contributions in rank order — one round
//! of messages, and bitwise identical results on every rank (same order of operations).
//! Needs `P * bytes` of CCL buffer; the operator selects it only for small messages.

use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};

pub struct AllReduceOneShot;

impl Executor for AllReduceOneShot {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::mesh(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let (n, e, world, me) = (p.count, p.elem(), p.world, p.rank);
        let nb = n * e;
        if n == 0 {
            return Ok(());
        }
        let slot = |r: usize| Mem::of(BufKind::CclIn).add(r * nb);
        let out = Mem::of(BufKind::UserOut);
        if world == 1 {
            if !p.in_place {
                res.tasks.copy(MAIN, out, Mem::of(BufKind::UserIn), nb)?;
            }
            return Ok(());
        }
        // Our own contribution is read straight from the input, unless the reduction chain
        // would overwrite it before reading it (in place, more than two ranks): then it goes
        // to our slot first. Either way every rank reduces in rank order, so the results are
        // bitwise identical.
        let own = if p.in_place && world > 2 {
            res.tasks
                .copy(MAIN, slot(me), Mem::of(BufKind::UserIn), nb)?;
            slot(me)
        } else {
            Mem::of(BufKind::UserIn)
        };
        let part = |r: usize| if r == me { own } else { slot(r) };
        let peers = || (1..world).map(|d| (me + d) % world);
        for q in peers() {
            res.tasks.rx_async(MAIN, q, slot(q), nb)?;
        }
        for q in peers() {
            res.tasks.tx_async(MAIN, q, own, nb)?;
        }
        for q in peers() {
            res.tasks.rx_wait_done(MAIN, q, nb)?;
            res.tasks.tx_wait_done(MAIN, q)?;
        }
        res.tasks
            .reduce(MAIN, p.dtype, p.op, out, part(0), part(1), n)?;
        for q in 2..world {
            res.tasks
                .reduce(MAIN, p.dtype, p.op, out, out, part(q), n)?;
        }
        if p.op == ReduceOp::Avg {
            res.tasks.finish_avg(MAIN, p.dtype, out, n, world)?;
        }
        Ok(())
    }
}
