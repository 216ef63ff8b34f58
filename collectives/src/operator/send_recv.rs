//! Send and Recv operators: the chunked loop through the CCL buffer (HCCL's send/receive loop).

use crate::algorithms::{recv, send};
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct SendOperator;

impl Operator for SendOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (send::NAME, 0)
    }
}

pub struct RecvOperator;

impl Operator for RecvOperator {
    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (recv::NAME, 0)
    }
}
