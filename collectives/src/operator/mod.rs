//! Operators, one per collective: validation beyond the generic checks, and algorithm
//! selection by size and world size (thresholds from measurements, see docs/PERFORMANCE.md).

use crate::executor::Operator;
use crate::op::OpKind;

pub mod allreduce;

/// The operator for `kind`.
pub fn for_kind(kind: OpKind) -> &'static dyn Operator {
    match kind {
        OpKind::AllReduce => &allreduce::AllReduceOperator,
        _ => unimplemented!(),
    }
}
