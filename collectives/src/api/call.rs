//! Describing an operation ([`OpSpec`]), building and checking a call from it
//! (`make_call`: sizes, roots, alignment, in-place positions), and the raw entry points the C
//! ABI uses ([`RawOp`], [`Communicator::enqueue_raw`]) and those of bindings whose buffers carry
//! their lengths ([`SizedOp`], [`Communicator::enqueue_sized`], [`Communicator::run_sized`]).

use ampccl_runtime::stream::{Event, Stream};
use ampccl_runtime::{DataType, Element, Error, ReduceOp, Result};

use crate::comm::{Call, Communicator, Wait};
use crate::op::{OpKind, OpParam};
use crate::sink::Region;

/// What an operation is, apart from its buffers (NCCL's count conventions, see [`OpParam`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpec {
    pub kind: OpKind,
    pub count: usize,
    pub dtype: DataType,
    /// Reduction (reducing kinds only).
    pub op: ReduceOp,
    /// Root (Broadcast, Reduce) or peer (Send, Recv).
    pub root: usize,
}

impl OpSpec {
    /// `kind` over `count` elements of `dtype`, reduction `Sum`, root 0.
    pub fn new(kind: OpKind, count: usize, dtype: DataType) -> OpSpec {
        OpSpec {
            kind,
            count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
        }
    }
    /// With reduction `op`.
    pub fn op(self, op: ReduceOp) -> OpSpec {
        OpSpec { op, ..self }
    }
    /// With root (or peer) `root`.
    pub fn root(self, root: usize) -> OpSpec {
        OpSpec { root, ..self }
    }
    pub(crate) fn of<T: Element>(kind: OpKind, count: usize) -> OpSpec {
        OpSpec::new(kind, count, T::DTYPE)
    }
}

/// The end of the user address space that any buffer must lie below: 2^57 on 64-bit targets
/// (Linux's limit with 5-level page tables; 2^47 with 4 levels). A count whose byte size is
/// valid arithmetic but lies beyond it (a negative count cast to `size_t`) is refused at the
/// call rather than queueing work for memory that cannot exist.
const MAX_BYTES: usize = if usize::BITS >= 64 {
    1 << 57
} else {
    isize::MAX as usize
};

/// Builds and checks a call (shared by the typed API and the raw one).
///
/// `input`/`output` are byte regions; a region is in place when it starts at NCCL's in-place
/// position inside the other (AllGather: `input == output + rank * count`; ReduceScatter:
/// `output == input + rank * count`; others: equal). Any other overlap is refused.
pub(crate) fn make_call(
    comm: &Communicator,
    s: OpSpec,
    input: Region,
    output: Region,
) -> Result<Call> {
    let (rank, world) = (comm.rank(), comm.world());
    let OpSpec {
        kind,
        count,
        dtype,
        op,
        root,
    } = s;
    let e = dtype.size();
    if kind.has_root() && root >= world {
        let what = if matches!(kind, OpKind::Send | OpKind::Recv) {
            "peer"
        } else {
            "root"
        };
        return Err(Error::InvalidArgument(format!(
            "{what} {root} is not a rank of this communicator (size {world})"
        )));
    }
    let bytes = |n: Option<usize>| n.and_then(|n| n.checked_mul(e)).filter(|&b| b <= MAX_BYTES);
    let in_need = bytes(kind.input_count(count, world));
    let out_need = bytes(kind.output_count(count, world));
    let (Some(in_need), Some(out_need)) = (in_need, out_need) else {
        return Err(Error::InvalidArgument(format!(
            "count {count} of {} on {world} ranks exceeds the address space (a negative count \
             cast to an unsigned one?)",
            dtype.name()
        )));
    };
    // Broadcast's input matters on the root only, Reduce's output on the root only.
    let in_need = if kind == OpKind::Broadcast && rank != root {
        0
    } else {
        in_need
    };
    let out_need = if kind == OpKind::Reduce && rank != root {
        0
    } else {
        out_need
    };
    for (name, r, need) in [("input", input, in_need), ("output", output, out_need)] {
        if need > 0 && r.ptr.is_null() {
            return Err(Error::InvalidArgument(format!("{name} buffer is null")));
        }
        if (r.ptr as usize)
            .checked_add(need)
            .is_none_or(|end| end > MAX_BYTES)
        {
            return Err(Error::InvalidArgument(format!(
                "{name} buffer at {:p} of {need} bytes ends beyond the address space",
                r.ptr
            )));
        }
        if r.len < need {
            return Err(Error::InvalidArgument(format!(
                "{name} buffer holds {} bytes, {} of {count} x {} on {world} ranks needs {need}",
                r.len,
                kind.name(),
                dtype.name()
            )));
        }
        if need > 0 && !(r.ptr as usize).is_multiple_of(e) {
            return Err(Error::InvalidArgument(format!(
                "{name} buffer is not aligned to {}",
                dtype.name()
            )));
        }
    }
    let input = Region {
        ptr: input.ptr,
        len: in_need,
    };
    let output = Region {
        ptr: output.ptr,
        len: out_need,
    };
    let in_place_at = match kind {
        OpKind::AllGather => output.ptr.wrapping_add(rank * count * e) == input.ptr,
        OpKind::ReduceScatter => input.ptr.wrapping_add(rank * count * e) == output.ptr,
        _ => input.ptr == output.ptr,
    };
    let in_place = in_place_at && in_need > 0 && out_need > 0;
    let (a, b) = (input.ptr as usize, output.ptr as usize);
    let overlap = in_need > 0 && out_need > 0 && a < b + out_need && b < a + in_need;
    if overlap && !in_place {
        return Err(Error::InvalidArgument(format!(
            "input and output overlap without being in place (for {} the in-place input is {})",
            kind.name(),
            match kind {
                OpKind::AllGather => "output + rank * count",
                OpKind::ReduceScatter => "the output is input + rank * count",
                _ => "the output itself",
            }
        )));
    }
    let p = OpParam {
        kind,
        count,
        dtype,
        op,
        root,
        rank,
        world,
        in_place,
        seq: 0,
    };
    Ok(Call { p, input, output })
}

/// A region of unknown length (C callers give no lengths): empty when `ptr` is null.
fn unbounded(ptr: *mut u8) -> Region {
    Region {
        ptr,
        len: if ptr.is_null() { 0 } else { usize::MAX },
    }
}

/// One operation with C-style buffers: element counts and raw pointers (for the C ABI).
#[derive(Clone, Copy, Debug)]
pub struct RawOp {
    pub spec: OpSpec,
    /// Input (may be null where the operation reads none, e.g. `Recv`, non-root `Broadcast`).
    pub send: *const u8,
    /// Output (may be null where the operation writes none, e.g. `Send`, non-root `Reduce`).
    pub recv: *mut u8,
}

/// One operation with buffers of known byte lengths (see [`Communicator::enqueue_sized`]).
#[derive(Clone, Copy, Debug)]
pub struct SizedOp {
    pub spec: OpSpec,
    /// Input and its length in bytes (null and 0 where the operation reads none).
    pub send: *const u8,
    pub send_len: usize,
    /// Output and its length in bytes (null and 0 where the operation writes none).
    pub recv: *mut u8,
    pub recv_len: usize,
}

impl Communicator {
    /// Enqueues `ops` (one operation, or several issued as a group) on `stream` and returns
    /// their completion event, without waiting (the C ABI's entry point).
    ///
    /// # Safety
    /// Each pointer must be valid for the operation's input (reads) or output (exclusive
    /// writes) size, as NCCL's count conventions define it, until the event completes.
    pub unsafe fn enqueue_raw(&self, stream: &Stream, ops: &[RawOp]) -> Result<Event> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_raw_with(stream, ops, Wait::Later) }
    }

    /// As [`Communicator::enqueue_raw`], for a caller that will probably wait for the event
    /// soon on this thread: a single operation of a single-stream algorithm on an idle
    /// communicator is then *parked* on `stream` ([`Stream::has_parked`] says so afterwards)
    /// for the waiter to run on its thread ([`Event::wait`]); it needs no
    /// [`Stream::kick`], and runs on the engine within a few milliseconds if nobody waits.
    ///
    /// # Safety
    /// As [`Communicator::enqueue_raw`].
    pub unsafe fn enqueue_raw_for_waiter(&self, stream: &Stream, ops: &[RawOp]) -> Result<Event> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_raw_with(stream, ops, Wait::Soon) }
    }

    /// # Safety
    /// As [`Communicator::enqueue_raw`].
    unsafe fn enqueue_raw_with(&self, stream: &Stream, ops: &[RawOp], wait: Wait) -> Result<Event> {
        let call = |o: &RawOp| {
            make_call(
                self,
                o.spec,
                unbounded(o.send as *mut u8),
                unbounded(o.recv),
            )
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_calls(stream, ops, call, wait) }
    }

    /// As [`Communicator::enqueue_raw`] for buffers of known lengths, which are checked like
    /// the typed API's slices: a buffer too short for the operation is refused with the typed
    /// API's message (for bindings whose buffers carry their sizes, such as Python's).
    ///
    /// # Safety
    /// Each region must be valid for its length (inputs for reads, outputs for exclusive
    /// writes) until the event completes.
    pub unsafe fn enqueue_sized(&self, stream: &Stream, ops: &[SizedOp]) -> Result<Event> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_calls(stream, ops, |o| self.sized_call(o), Wait::Later) }
    }

    /// Runs `ops` (one operation, or a group) to completion as the typed blocking calls do: a
    /// single-stream operation on an idle communicator runs on the calling thread at once.
    /// Buffers are checked as by [`Communicator::enqueue_sized`].
    ///
    /// # Safety
    /// Each region must be valid for its length (inputs for reads, outputs for exclusive
    /// writes) until this returns.
    pub unsafe fn run_sized(&self, ops: &[SizedOp]) -> Result<()> {
        // SAFETY: forwarded from the caller, who keeps the regions until we return, after
        // the wait.
        let ev = unsafe {
            self.enqueue_calls(
                self.default_stream(),
                ops,
                |o| self.sized_call(o),
                Wait::Now,
            )?
        };
        self.finish(ev.wait())
    }

    fn sized_call(&self, o: &SizedOp) -> Result<Call> {
        let input = Region {
            ptr: o.send as *mut u8,
            len: o.send_len,
        };
        let output = Region {
            ptr: o.recv,
            len: o.recv_len,
        };
        make_call(self, o.spec, input, output)
    }

    /// Builds a call of each op and submits them (one operation, or a group).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_raw`], for the regions `call` makes.
    unsafe fn enqueue_calls<O>(
        &self,
        stream: &Stream,
        ops: &[O],
        call: impl Fn(&O) -> Result<Call>,
        wait: Wait,
    ) -> Result<Event> {
        if let [op] = ops {
            // SAFETY: forwarded from the caller.
            return unsafe { self.submit(stream, &mut [call(op)?], wait) };
        }
        let mut calls = ops.iter().map(call).collect::<Result<Vec<_>>>()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.submit(stream, &mut calls, wait) }
    }

    /// Checks `op` as [`Communicator::enqueue_raw`] would (arguments only; nothing is queued),
    /// so that a caller deferring the submission (the C ABI's groups) reports argument errors
    /// at the call that made them.
    pub fn check_raw(&self, op: &RawOp) -> Result<()> {
        let call = make_call(
            self,
            op.spec,
            unbounded(op.send as *mut u8),
            unbounded(op.recv),
        )?;
        crate::operator::for_kind(call.p.kind).validate(&call.p)
    }

    /// Marks the communicator failed when an operation failed while running.
    pub(crate) fn finish(&self, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            self.inner.fail(&e.to_string());
            self.inner.engine.abort(e.clone());
        }
        r
    }

    pub(crate) fn per_rank(&self, len: usize) -> Result<usize> {
        if !len.is_multiple_of(self.world()) {
            return Err(Error::InvalidArgument(format!(
                "buffer of {len} elements does not split into {} equal blocks",
                self.world()
            )));
        }
        Ok(len / self.world())
    }
}
