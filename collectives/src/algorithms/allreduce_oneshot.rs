//! `AllReduceOneShot`: the latency algorithm. Every rank writes its whole input into a slot of
//! every peer's CCL input buffer, then reduces the `P` contributions in rank order — one round
//! of messages, and bitwise identical results on every rank (same order of operations).
//! Needs `P * bytes` of CCL buffer; the operator selects it only for small messages.
//!
//! From [`ROTATE_MIN`] bytes the slots rotate through the window from call to call
//! ([`Window`]) instead of staying at fixed offsets, where every call's writes landed on the
//! lines the receiving core had just read. µs out of place / in place, 2 ranks, 3 alternated
//! runs each (session 16, `ampccl-perf -g 2 -o allreduce -b 8K -e 256K -f 2 -n 2000 -w 200`,
//! and `-b 512K -e 2M -n 300 -w 50`, the fixed offsets set by a temporary variable), fixed vs
//! rotating: 16 KiB 3.0/2.9 vs 2.0–2.3/1.8–2.0, 64 KiB 10.8–11.6/10.4–11.4 vs 5.8–7.2/5.4–6.0,
//! 128 KiB 21.6–24.3/20.4–23.1 vs 10.0–11.1/9.2–10.2, 512 KiB 46.8–47.9/52.5–53.8 vs
//! 31.3–31.6/28.3–29.0; 1 MiB alike. 3 ranks (`-g 3 -b 1K -e 64K -f 4`, 2 runs): 16 KiB
//! 11.7–12.0/12.6–12.7 vs 9.8–10.0/10.8–11.0, 64 KiB 29.3–29.6/30.5–34.4 vs 20.9–21.1/23.6–23.8.

use ampccl_runtime::{ReduceOp, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::window::Window;

/// Inputs from this many bytes are received in rotating slots. Below it the few lines of a
/// fixed slot stay cached between calls, and the hand-off costs less than fetching lines the
/// rotation has not touched for thousands of calls. µs out of place / in place, 2 ranks, 3
/// alternated runs (session 16, `ampccl-perf -g 2 -o allreduce -b 512 -e 8K -f 2 -n 50000 -w
/// 3000`), fixed vs rotating: 8 B 0.38–0.39 vs 0.40 (`-b 8 -e 8 -n 300000`), 1 KiB 0.55/0.55
/// vs 0.58–0.62/0.57–0.61, 2 KiB 0.60–0.63/0.59–0.61 vs 0.68–0.70/0.68–0.71, 4 KiB alike,
/// 8 KiB 1.46–1.49/1.32–1.36 vs 1.09–1.13/1.02–1.06.
pub const ROTATE_MIN: usize = 8 << 10;

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
        let window = (nb >= ROTATE_MIN && world * nb <= res.ccl_in_size)
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
