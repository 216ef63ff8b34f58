//! Broadcast operator: on 2 ranks the pair, in which root and receiver share the copying
//! ([`crate::algorithms::broadcast_pair`]); otherwise the pipelined chain from the root (why the
//! chain beats the alternatives there: [`crate::algorithms::broadcast_chain`]).
//!
//! The pair is chosen whether or not the buffers are shared user memory (each rank knows only
//! its own, and both must run the same algorithm), and at every size: with both cores copying,
//! it beats the chain in place at every size, and out of place too since the root stages each
//! pull chunk and copies it into its output in one pass ([`copy_tee`]). The comparison that
//! decided it is in docs/TUNING.md ("Choices without a parameter").
//!
//! [`copy_tee`]: crate::resource::TaskSink::copy_tee

use crate::algorithms::{broadcast_chain, broadcast_pair};
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        if p.world == 2 {
            (broadcast_pair::NAME, 0)
        } else {
            (broadcast_chain::NAME, 0)
        }
    }
}
