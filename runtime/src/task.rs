//! The task vocabulary of streams: what an executor can ask a stream to do.
//!
//! Tasks are plain data (no allocation per task except host callbacks) and are polled, never
//! blocked on: a task that cannot finish yet returns `Pending` and the engine polls other
//! streams. Link operations are implemented by transports through [`LinkDriver`].

use std::fmt;
use std::task::Poll;

use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use crate::notify::Notify;
use crate::reduce;
use std::sync::Arc;

/// One of HCCL's link primitives, with the sequence number assigned when it was enqueued.
#[derive(Debug, Clone, Copy)]
pub enum LinkOp {
    /// Tell the peer we are ready (one generation of the peer's ack counter).
    TxAck { seq: u32 },
    /// Wait for the peer's ack number `seq`.
    RxAck { seq: u32 },
    /// Send `len` bytes from `src` into the buffer the peer posted with its `RxAsync` number
    /// `seq` (waits for the peer's clear-to-send). `tag` must equal the receiver's.
    TxAsync {
        seq: u32,
        src: *const u8,
        len: usize,
        tag: u32,
    },
    /// Post a clear-to-send for `len` bytes into `dst` (a registered window of ours, or any
    /// memory when the transport can write user memory).
    RxAsync {
        seq: u32,
        dst: *mut u8,
        len: usize,
        tag: u32,
    },
    /// Wait until send number `seq` has left our buffer (or read number `seq` has landed).
    TxWaitDone { seq: u32 },
    /// Wait until receive number `seq` has landed; it must carry exactly `len` bytes.
    RxWaitDone { seq: u32, len: usize },
    /// Offer `len` bytes at `src` for the peer to read: a receive, numbered like `RxAsync`,
    /// whose buffer the peer reads instead of writing (its `Read` number `seq`).
    Offer {
        seq: u32,
        src: *const u8,
        len: usize,
        tag: u32,
    },
    /// Read `len` bytes into `dst` from the memory the peer offered with its `Offer` number
    /// `seq`: a send, numbered like `TxAsync`, with the data flowing the other way, stored for
    /// who reads it next (`to`, where the device copies it). Completes with `TxWaitDone`.
    Read {
        seq: u32,
        dst: *mut u8,
        len: usize,
        to: CopyTo,
        tag: u32,
    },
    /// Wait until the peer has read offer number `seq`, which must be `len` bytes.
    OfferWaitDone { seq: u32, len: usize },
}

/// Transport side of link tasks.
pub trait LinkDriver: Send + Sync {
    /// Advances `op`; `Ready` when it is complete.
    fn poll_op(&self, op: &mut LinkOp) -> Poll<Result<()>>;
    /// Called by the engine while `op` has been pending for a while: report a dead peer, or a
    /// peer whose operation cannot match this one.
    fn check_health(&self, op: &LinkOp) -> Result<()>;
    /// Human-readable peer description for error messages ("rank 3 (pid 1234)").
    fn peer_desc(&self) -> String;
}

/// Something that completes, with a result: what [`Task::WaitEvent`] waits for.
pub trait Completion: Send + Sync {
    /// `None` while pending, else the result.
    fn status(&self) -> Option<Result<()>>;
}

/// A host callback task: polled until it returns `Ready`.
pub type Callback = Box<dyn FnMut() -> Poll<Result<()>> + Send>;

pub use crate::copy::CopyTo;

/// One unit of stream work.
pub enum Task {
    /// `len` bytes from `src` to `dst` (non-overlapping), stored for who reads them next.
    Copy {
        dst: *mut u8,
        src: *const u8,
        len: usize,
        to: CopyTo,
    },
    /// `len` bytes from `src` to both destinations (disjoint from it and from each other),
    /// each stored for who reads it next, the source read once ([`crate::copy::tee`]).
    Tee {
        dsts: [(*mut u8, CopyTo); 2],
        src: *const u8,
        len: usize,
    },
    /// `dst[i] = a[i] op b[i]` over `count` elements (`dst` may equal `a` or `b`).
    Reduce {
        dtype: DataType,
        op: ReduceOp,
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        count: usize,
        /// Into an operation's output that is not read again soon
        /// ([`crate::reduce::reduce_out`]: streaming stores).
        out: bool,
    },
    /// As `Reduce` (not `out`), and the result copied to `also` as well, stored for who reads
    /// it next, while each block of it is in the cache ([`reduce::reduce_tee`]).
    ReduceTee {
        dtype: DataType,
        op: ReduceOp,
        dst: *mut u8,
        also: (*mut u8, CopyTo),
        a: *const u8,
        b: *const u8,
        count: usize,
    },
    /// `dst[i] /= n`, the end of `Avg`.
    FinishAvg {
        dtype: DataType,
        dst: *mut u8,
        count: usize,
        n: usize,
    },
    /// Record one generation of a notify.
    Record(Notify),
    /// Wait until a notify reaches generation `target` (from [`Notify::next_wait`]).
    Wait { notify: Notify, target: u32 },
    /// Wait until a point in another stream of the same engine has completed (an event of
    /// [`crate::stream`]).
    WaitEvent(Box<dyn Completion>),
    /// A link primitive.
    Link {
        link: Arc<dyn LinkDriver>,
        op: LinkOp,
    },
    /// Arbitrary host work.
    Callback(Callback),
}

// SAFETY: the raw pointers in tasks refer to memory the enqueuer guaranteed valid until the task
// completes (`Stream::enqueue` is unsafe for that reason); moving a task to the driving thread
// does not change that.
unsafe impl Send for Task {}

impl Task {
    /// Runs or advances the task.
    pub(crate) fn poll(&mut self) -> Poll<Result<()>> {
        match self {
            Task::Copy { dst, src, len, to } => {
                // SAFETY: valid, non-overlapping by the enqueue contract.
                unsafe { crate::copy::copy_to(*to, *dst, *src, *len) };
                Poll::Ready(Ok(()))
            }
            Task::Tee { dsts, src, len } => {
                // SAFETY: valid, non-overlapping by the enqueue contract.
                unsafe { crate::copy::tee(*dsts, *src, *len) };
                Poll::Ready(Ok(()))
            }
            Task::Reduce {
                dtype,
                op,
                dst,
                a,
                b,
                count,
                out,
            } => {
                let f = if *out {
                    reduce::reduce_out
                } else {
                    reduce::reduce
                };
                // SAFETY: valid and aligned by the enqueue contract.
                unsafe { f(*dtype, *op, *dst, *a, *b, *count) };
                Poll::Ready(Ok(()))
            }
            Task::ReduceTee {
                dtype,
                op,
                dst,
                also,
                a,
                b,
                count,
            } => {
                // SAFETY: valid, aligned and disjoint by the enqueue contract.
                unsafe { reduce::reduce_tee(*dtype, *op, *dst, *also, *a, *b, *count) };
                Poll::Ready(Ok(()))
            }
            Task::FinishAvg {
                dtype,
                dst,
                count,
                n,
            } => {
                // SAFETY: valid and aligned by the enqueue contract.
                unsafe { reduce::finish_avg(*dtype, *dst, *count, *n) };
                Poll::Ready(Ok(()))
            }
            Task::Record(n) => {
                n.record();
                Poll::Ready(Ok(()))
            }
            Task::Wait { notify, target } => {
                if notify.reached(*target) {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            Task::WaitEvent(ev) => match ev.status() {
                None => Poll::Pending,
                Some(r) => Poll::Ready(r),
            },
            Task::Link { link, op } => link.poll_op(op),
            Task::Callback(f) => f(),
        }
    }

    /// Reports a dead peer or similar while the task is stuck.
    pub(crate) fn check_health(&self) -> Result<()> {
        match self {
            Task::Link { link, op } => link.check_health(op),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Task::Copy { len, to, .. } => write!(f, "copy of {len} bytes ({to:?})"),
            Task::Tee { dsts, len, .. } => {
                write!(f, "tee of {len} bytes ({:?}, {:?})", dsts[0].1, dsts[1].1)
            }
            Task::Reduce {
                dtype, op, count, ..
            } => {
                write!(f, "{} reduction of {count} {}", op.name(), dtype.name())
            }
            Task::ReduceTee {
                dtype, op, count, ..
            } => {
                let (op, ty) = (op.name(), dtype.name());
                write!(f, "{op} reduction of {count} {ty}, copied on")
            }
            Task::FinishAvg { count, .. } => write!(f, "average of {count} elements"),
            Task::Record(_) => write!(f, "notify record"),
            Task::Wait { target, .. } => write!(f, "notify wait (generation {target})"),
            Task::WaitEvent(_) => write!(f, "wait for an event of another stream"),
            Task::Link { link, op } => write!(f, "{op:?} with {}", link.peer_desc()),
            Task::Callback(_) => write!(f, "host callback"),
        }
    }
}
