//! The executor interface (one implementation per algorithm) and the operator interface (one
//! per collective).

use ampccl_runtime::Result;

use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};

/// An algorithm: says what it needs, then orchestrates tasks over what it got.
///
/// Implement this outside the crate and add it with
/// [`Registry::register`](crate::registry::Registry::register) to run your own algorithm; see
/// `examples/custom_executor.rs`.
pub trait Executor: Send + Sync {
    /// Resources for `param`. The framework caches the result under the operator's
    /// `(algorithm, new_tag)` and does not ask again, so the request may depend only on what
    /// the `new_tag` encodes (an operator whose executor needs size-dependent scratch puts the
    /// size class into the tag).
    fn calc_res_request(&self, param: &OpParam) -> AlgResourceRequest;
    /// Submits the operation's tasks.
    fn orchestrate(&self, param: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()>;
}

/// What an operator may consult when selecting an algorithm.
#[derive(Clone, Copy, Debug)]
pub struct SelectCtx {
    /// Bytes of each CCL buffer.
    pub ccl_size: usize,
    /// Peers can receive straight into user memory.
    pub user_mem_links: bool,
    /// More ranks on this host than CPUs: every step that waits for a peer costs a context
    /// switch, so algorithms with fewer steps win for longer.
    pub oversubscribed: bool,
    /// Bytes of this host's last-level cache (the least any local rank reported at init), 0 if
    /// unknown: algorithms whose copies pay for missing it can step aside beyond it.
    pub cache_bytes: usize,
}

impl SelectCtx {
    /// Whether `bytes` fit 1/`share` of the last-level cache; `None` when its size is unknown
    /// (each operator then decides by size alone).
    pub fn fits_cache_share(&self, bytes: usize, share: usize) -> Option<bool> {
        (self.cache_bytes != 0).then(|| bytes <= self.cache_bytes / share)
    }
}

/// One per collective: validates and selects the algorithm.
pub trait Operator: Send + Sync {
    /// Collective-specific checks beyond the framework's generic ones.
    fn validate(&self, _param: &OpParam) -> Result<()> {
        Ok(())
    }
    /// `(algorithm name, new_tag)`: the executor to run and the key of its resources.
    fn select_alg(&self, param: &OpParam, ctx: &SelectCtx) -> (&'static str, u64);
}
