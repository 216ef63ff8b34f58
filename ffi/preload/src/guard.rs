//! Per-thread state of the interposer: the re-entry guard, the group nesting depth and the
//! work deferred to the outermost `ncclGroupEnd`, and the panic boundary of every hook.
//!
//! NCCL calls some of its own public functions (`ncclCommInitAll` runs `ncclGroupStart` and
//! `ncclCommInitRank`...); with the interposer first in the symbol order those calls come back
//! here. While a real NCCL function runs on a thread ([`call_real`]), every hook on that thread
//! is a plain pass-through.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::nccl::{self, NcclResult};

thread_local! {
    static IN_REAL: Cell<u32> = const { Cell::new(0) };
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// Work that must wait for the outermost `ncclGroupEnd`.
pub enum Deferred {
    /// A communicator created inside the group: set up its PCIe path once NCCL has made it.
    Setup(nccl::Comm),
    /// The user stream of a split call must wait for the call's PCIe part (after NCCL's part
    /// has been enqueued, so that the two overlap).
    Join(nccl::Comm, nccl::Stream),
}

/// Whether a real NCCL function is running on this thread (hooks must pass through).
pub fn reentered() -> bool {
    IN_REAL.with(|c| c.get() > 0)
}

/// Runs `f`, a call into the real NCCL, with the re-entry guard up.
pub fn call_real<R>(f: impl FnOnce() -> R) -> R {
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            IN_REAL.with(|c| c.set(c.get() - 1));
        }
    }
    IN_REAL.with(|c| c.set(c.get() + 1));
    let _down = Down;
    f()
}

/// Whether this thread is inside `ncclGroupStart` / `ncclGroupEnd`.
pub fn in_group() -> bool {
    GROUP_DEPTH.with(|c| c.get() > 0)
}

/// Counts an `ncclGroupStart`.
pub fn group_enter() {
    GROUP_DEPTH.with(|c| c.set(c.get() + 1));
}

/// Counts an `ncclGroupEnd`; returns the deferred work when it closed the outermost group.
pub fn group_leave() -> Vec<Deferred> {
    let depth = GROUP_DEPTH.with(|c| {
        let d = c.get().saturating_sub(1);
        c.set(d);
        d
    });
    if depth == 0 {
        DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()))
    } else {
        Vec::new()
    }
}

/// Defers `work` to the outermost `ncclGroupEnd`.
pub fn defer(work: Deferred) {
    DEFERRED.with(|d| d.borrow_mut().push(work));
}

/// The panic boundary of a hook: a panic becomes `ncclInternalError` and a log line.
pub fn boundary(name: &str, f: impl FnOnce() -> NcclResult) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!("ampccl preload: panic in {name}: {msg}");
            nccl::INTERNAL_ERROR
        }
    }
}
