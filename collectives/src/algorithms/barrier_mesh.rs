//! `BarrierMesh`: every rank acks every peer, then waits for an ack from every peer — one
//! round, `P - 1` acks each way per rank, no data.
//!
//! # One round is enough, also back to back
//!
//! Acks are counted, never reset: `tx_ack` to `q` adds one to `q`'s counter of acks from us,
//! and the `k`-th `rx_ack` from `q` issued on a link (counting from the link's creation)
//! completes only once that counter reaches `k` (generation counting, wrapping compare).
//!
//! *Claim*: no rank leaves barrier `n` before every rank has entered it.
//! Let rank `r` complete its `rx_ack` from `q` of barrier `n`. Every operation on the link
//! `q → r` that uses acks is issued in the same order on both ranks (the rule for every
//! operation of a communicator), and each pairs one `tx_ack` on one side with one `rx_ack` on
//! the other (barriers, each direction, are the only users). So if `r`'s barrier-`n` wait is
//! its `k`-th `rx_ack` from `q`, exactly `k - 1` acks precede `q`'s barrier-`n` ack, and the
//! counter reaches `k` only through it — an ack of barrier `n - 1` is already consumed by an
//! earlier wait and cannot satisfy this one. `q` issues that ack when its stream reaches
//! barrier `n`, i.e. after `q` entered it. Hence `r` leaves only after every `q` entered. ∎
//!
//! A second round (or a dissemination barrier's log rounds) is needed only with flags that are
//! set and cleared — there, a fast rank's flag for barrier `n + 1` can be cleared by a slow
//! rank still finishing barrier `n`, or be mistaken for barrier `n`'s. Counters never lose or
//! confuse a generation: a rank racing ahead to barrier `n + 1` can only raise the counters to
//! `k + 1`, which no wait of barrier `n` looks for differently, and its own barrier-`n + 1`
//! waits need the peers' `(k + 1)`-th acks, sent only once they enter barrier `n + 1`.
//! Tested with 100 barriers back to back on 4 ranks (`threads_p2p::barrier_back_to_back`).

use ampccl_runtime::Result;

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, MAIN};

/// The registry name of [`BarrierMesh`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "BarrierMesh";

pub struct BarrierMesh;

impl Executor for BarrierMesh {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::mesh(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let peers = || (1..p.world).map(|d| (p.rank + d) % p.world);
        for q in peers() {
            res.tasks.tx_ack(MAIN, q)?;
        }
        for q in peers() {
            res.tasks.rx_ack(MAIN, q)?;
        }
        Ok(())
    }
}
