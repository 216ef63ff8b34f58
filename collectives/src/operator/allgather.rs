//! AllGather operator: mesh (every rank writes to every peer at once, the source documents' example) while the whole output fits the CCL buffer and messages are small; ring otherwise.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

/// Largest per-rank message sent with the mesh algorithm.
pub const MESH_MAX_BYTES: usize = 64 * 1024;

pub struct AllGatherOperator;

impl Operator for AllGatherOperator {
    fn select_alg(&self, p: &OpParam, ctx: &SelectCtx) -> (&'static str, u64) {
        let bytes = p.count * p.elem();
        if bytes <= MESH_MAX_BYTES && bytes * p.world <= ctx.ccl_size {
            ("AllGatherMesh", 0)
        } else {
            ("AllGatherRing", 0)
        }
    }
}
