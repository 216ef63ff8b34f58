//! `ampcclGroupStart` / `ampcclGroupEnd`: thread-local, nestable (a depth counter, like NCCL).
//!
//! Inside a group, operations are checked at once (argument errors are returned by the call
//! itself) and collected; the outermost `ampcclGroupEnd` submits them: one batch per
//! communicator (run concurrently by the native library, so sends and receives that would
//! deadlock one by one work), all of a communicator's operations on the one stream they name
//! (naming two streams for one communicator is `ampcclInvalidUsage`, and then nothing of the
//! group runs). Inits issued inside a group (`ampcclCommInitRank` for several ranks from one
//! thread, NCCL's multi-device idiom) run on their own threads and are joined by the outermost
//! `ampcclGroupEnd` (unless their config is non-blocking: then it returns `ampcclInProgress`).

use std::cell::RefCell;
use std::sync::Arc;

use ampccl_native::{Communicator, Error, RawOp};

use crate::comm::CommShared;
use crate::error::FfiResult;
use crate::stream::{Batch, Ops, submit};
use crate::types::ampcclResult_t::{self, *};
use crate::types::ampcclStream_t;

/// One collected operation.
struct Pending {
    shared: Arc<CommShared>,
    comm: Communicator,
    stream: ampcclStream_t,
    op: RawOp,
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    ops: Vec<Pending>,
    /// Inits started inside the group, and whether each is blocking.
    inits: Vec<(Arc<CommShared>, bool)>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// True inside `ampcclGroupStart` ... `ampcclGroupEnd` on this thread.
pub(crate) fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Collects an operation (the caller checked `active()`).
pub(crate) fn push(shared: Arc<CommShared>, comm: Communicator, stream: ampcclStream_t, op: RawOp) {
    GROUP.with(|g| {
        g.borrow_mut().ops.push(Pending {
            shared,
            comm,
            stream,
            op,
        })
    });
}

/// Registers an init started inside the group.
pub(crate) fn add_init(shared: Arc<CommShared>, blocking: bool) {
    GROUP.with(|g| g.borrow_mut().inits.push((shared, blocking)));
}

/// `ampcclGroupStart`.
pub(crate) fn start() -> ampcclResult_t {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    ampcclSuccess
}

/// `ampcclGroupEnd`.
pub(crate) fn end() -> FfiResult<ampcclResult_t> {
    let (ops, inits) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::InvalidUsage(
                "ampcclGroupEnd without a matching ampcclGroupStart".into(),
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        Ok((std::mem::take(&mut g.ops), std::mem::take(&mut g.inits)))
    })?;
    let mut result = Ok(ampcclSuccess);
    let mut in_progress = false;
    for (shared, blocking) in inits {
        if !blocking {
            in_progress = true;
        } else if let Err(e) = shared.wait_init()
            && result.is_ok()
        {
            result = Err(e);
        }
    }
    result?;
    submit_all(ops)?;
    Ok(if in_progress {
        ampcclInProgress
    } else {
        ampcclSuccess
    })
}

/// Submits a group's operations: one batch per communicator, the batches of one stream
/// together.
fn submit_all(ops: Vec<Pending>) -> FfiResult {
    let mut batches: Vec<(ampcclStream_t, Batch)> = Vec::new();
    for p in ops {
        match batches
            .iter_mut()
            .find(|(_, b)| Arc::ptr_eq(&b.shared, &p.shared))
        {
            Some((s, b)) => {
                if *s != p.stream {
                    return Err(Error::InvalidUsage(
                        "operations of one communicator in one group must use the same stream"
                            .into(),
                    ));
                }
                b.ops.push(p.op);
            }
            None => batches.push((
                p.stream,
                Batch {
                    shared: p.shared,
                    comm: p.comm,
                    ops: Ops::One(p.op),
                },
            )),
        }
    }
    let mut first_err = None;
    while let Some((stream, _)) = batches.first() {
        let stream = *stream;
        let (mine, rest): (Vec<_>, Vec<_>) = batches.into_iter().partition(|(s, _)| *s == stream);
        batches = rest;
        let mine: Vec<Batch> = mine.into_iter().map(|(_, b)| b).collect();
        // SAFETY: `stream` was checked to be NULL or a live handle when each operation was
        // collected, and the caller keeps it alive until the group ends (NCCL's contract).
        if let Err(e) = unsafe { submit(stream, &mine) } {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}
