//! AllToAll operator: pairwise exchange. In place is refused on more than one rank: every
//! block of the buffer is both sent and overwritten, and no algorithm here stages it.

use ampccl_runtime::{Error, Result};

use crate::algorithms::alltoall_pairwise;
use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct AllToAllOperator;

impl Operator for AllToAllOperator {
    fn validate(&self, p: &OpParam) -> Result<()> {
        if p.in_place && p.world > 1 {
            return Err(Error::InvalidArgument(
                "in-place AllToAll is not supported: pass distinct send and receive buffers".into(),
            ));
        }
        Ok(())
    }

    fn select_alg(&self, _p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        (alltoall_pairwise::NAME, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use ampccl_runtime::{DataType, ReduceOp};

    #[test]
    fn in_place_refused_on_several_ranks_only() {
        let p = OpParam {
            kind: OpKind::AllToAll,
            count: 4,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
            rank: 0,
            world: 2,
            in_place: true,
            seq: 0,
        };
        assert!(AllToAllOperator.validate(&p).is_err());
        assert!(
            AllToAllOperator
                .validate(&OpParam { world: 1, ..p })
                .is_ok()
        );
        assert!(
            AllToAllOperator
                .validate(&OpParam {
                    in_place: false,
                    ..p
                })
                .is_ok()
        );
    }
}
