//! The executor interface (one implementation per algorithm) and the operator interface (one
//! per collective).

use ampccl_runtime::Result;
use ampccl_runtime::param::{Param, Unit};
use ampccl_transport::topology::Topology;

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
pub struct SelectCtx<'a> {
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
    /// Which ranks share a host.
    pub topology: &'a Topology,
}

impl SelectCtx<'_> {
    /// [`beyond_cache`] on this host.
    pub fn beyond_cache(&self, bytes: usize) -> bool {
        beyond_cache(self.cache_bytes, bytes)
    }
}

/// A call is beyond the cache once its largest user buffer exceeds 1/`CACHE_SHARE` of the
/// host's last-level cache: the ranks' buffers and windows share it. Where that is the case
/// algorithms that read or write each byte from memory fewer times (streaming stores, one
/// pass for two copies) win, and inside it they lose. Measured value: docs/TUNING.md.
pub static CACHE_SHARE: Param = Param::new(
    "BEYOND_CACHE_SHARE",
    4,
    (1, 64),
    Unit::Count,
    "a call is beyond the cache once its largest buffer exceeds 1/this of the last-level cache",
);

/// Bytes from which a call counts as beyond the cache when the cache's size is unknown (no
/// sysfs entry and no `AMPCCL_CACHE_BYTES`).
pub static MIN_BYTES_UNKNOWN_CACHE: Param = Param::new(
    "BEYOND_CACHE_UNKNOWN_MIN",
    16 << 20,
    (0, u64::MAX),
    Unit::Bytes,
    "where the cache size is unknown, calls from this size count as beyond the cache",
);

/// Whether a call whose largest user buffer holds `bytes` is beyond a last-level cache of
/// `cache_bytes` (0: unknown), see [`CACHE_SHARE`].
pub fn beyond_cache(cache_bytes: usize, bytes: usize) -> bool {
    if cache_bytes == 0 {
        bytes >= MIN_BYTES_UNKNOWN_CACHE.bytes()
    } else {
        bytes > cache_bytes / CACHE_SHARE.get() as usize
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
