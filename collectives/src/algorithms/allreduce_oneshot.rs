//! `AllReduceOneShot`: the latency algorithm. Every rank writes its whole input into a slot of
//! every peer's CCL input buffer, then reduces the `P` contributions in rank order — one round
//! of messages, and bitwise identical results on every rank (same order of operations).
//! Needs `P * bytes` of CCL buffer; the operator selects it only for small messages.
//!
//! From [`ROTATE_MIN`] bytes the slots rotate through the window from call to call
//! ([`Window`]) instead of staying at fixed offsets, where every call's writes landed on the
//! lines the receiving core had just read (each write then first takes the line back from
//! that core).

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::window::Window;

/// Inputs from this many bytes are received in rotating slots. Below it the few lines of a
/// fixed slot stay cached between calls, and the hand-off costs less than fetching lines the
/// rotation has not touched for thousands of calls. Measured value: docs/TUNING.md.
pub static ROTATE_MIN: Param = Param::new(
    "ALLREDUCE_ONESHOT_ROTATE_MIN",
    8 << 10,
    (0, u64::MAX),
    Unit::Bytes,
    "one-shot allreduce inputs from this size land in rotating window slots, smaller ones at fixed offsets",
);

/// The registry name of [`AllReduceOneShot`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "AllReduceOneShot";

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
        // Slot `r` receives rank `r`'s input: rotating from `ROTATE_MIN` bytes where the window
        // holds `world` slots (slots lie whole cache lines apart), else at fixed offsets (which
        // the sink refuses where even those exceed the buffer: the operator never selects that).
        let window = (nb >= ROTATE_MIN.bytes() && world * nb <= res.ccl_in_size)
            .then(|| Window::new(res, nb))
            .filter(|w| w.holds(world));
        let slot = |r: usize| match &window {
            Some(w) => w.slot(r),
            None => Mem::of(BufKind::CclIn).add(r * nb),
        };
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
