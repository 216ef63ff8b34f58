//! The typed native API: blocking calls on slices, asynchronous calls on owned buffers
//! (futures for any executor), explicit streams, and groups of sends/receives.
//!
//! Buffer sizes follow NCCL's count conventions and are checked against each other; the
//! counts must also agree across ranks, which every transfer verifies (a mismatch fails the
//! operation on every rank instead of hanging).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ampccl_runtime::stream::{Event, Stream};
use ampccl_runtime::{DataType, Element, Error, ReduceOp, Result};

use crate::comm::{Call, Communicator};
use crate::op::{OpKind, OpParam};
use crate::sink::Region;

/// Owned memory whose address does not change when the owner moves (heap-backed), so it can
/// be handed to an asynchronous operation.
///
/// # Safety
/// `as_mut_ptr` must return the same address for the value's whole life, valid for `len`
/// elements.
pub unsafe trait StableBuf: Send + 'static {
    type Elem: Element;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn as_mut_ptr(&mut self) -> *mut Self::Elem;
}

// SAFETY: a Vec's heap buffer does not move when the Vec moves (no reallocation through this API).
unsafe impl<T: Element> StableBuf for Vec<T> {
    type Elem = T;
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn as_mut_ptr(&mut self) -> *mut T {
        Vec::as_mut_ptr(self)
    }
}

// SAFETY: as for Vec.
unsafe impl<T: Element> StableBuf for Box<[T]> {
    type Elem = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn as_mut_ptr(&mut self) -> *mut T {
        <[T]>::as_mut_ptr(self)
    }
}

fn rd<T>(s: &[T]) -> Region {
    Region {
        ptr: s.as_ptr() as *mut u8,
        len: size_of_val(s),
    }
}

fn wr<T>(s: &mut [T]) -> Region {
    Region {
        ptr: s.as_mut_ptr().cast(),
        len: size_of_val(s),
    }
}

fn owned<B: StableBuf>(b: &mut B) -> Region {
    Region {
        ptr: b.as_mut_ptr().cast(),
        len: b.len() * size_of::<B::Elem>(),
    }
}

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
    fn of<T: Element>(kind: OpKind, count: usize) -> OpSpec {
        OpSpec::new(kind, count, T::DTYPE)
    }
}

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
    let in_need = kind.input_count(count, world).checked_mul(e);
    let out_need = kind.output_count(count, world).checked_mul(e);
    let (Some(in_need), Some(out_need)) = (in_need, out_need) else {
        return Err(Error::InvalidArgument(format!(
            "count {count} overflows the address space"
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

impl Communicator {
    fn run(&self, spec: OpSpec, input: Region, output: Region) -> Result<()> {
        let mut call = [make_call(self, spec, input, output)?];
        // SAFETY: the regions come from borrows that outlive the wait below; if the wait fails
        // the communicator aborts, which drops every queued task.
        let ev = unsafe { self.submit(self.default_stream(), &mut call)? };
        self.finish(ev.wait())
    }

    /// Enqueues `ops` (one operation, or several issued as a group) on `stream` and returns
    /// their completion event, without waiting (the C ABI's entry point).
    ///
    /// # Safety
    /// Each pointer must be valid for the operation's input (reads) or output (exclusive
    /// writes) size, as NCCL's count conventions define it, until the event completes.
    pub unsafe fn enqueue_raw(&self, stream: &Stream, ops: &[RawOp]) -> Result<Event> {
        let mut calls = ops
            .iter()
            .map(|o| {
                make_call(
                    self,
                    o.spec,
                    unbounded(o.send as *mut u8),
                    unbounded(o.recv),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.submit(stream, &mut calls) }
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

    /// `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::AllReduce, send.len()).op(op),
            rd(send),
            wr(recv),
        )
    }

    /// In-place [`Communicator::all_reduce`].
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let r = wr(buf);
        self.run(OpSpec::of::<T>(OpKind::AllReduce, buf.len()).op(op), r, r)
    }

    /// `recv = concat over ranks of send` (`recv.len() == send.len() * world`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::AllGather, send.len()),
            rd(send),
            wr(recv),
        )
    }

    /// In-place allgather: this rank's block is `buf[rank * n..][..n]`, `n = buf.len() / world`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.per_rank(buf.len())?;
        let input = rd(&buf[self.rank() * n..][..n]);
        self.run(OpSpec::of::<T>(OpKind::AllGather, n), input, wr(buf))
    }

    /// `recv = block rank of (op over ranks of send)` (`send.len() == recv.len() * world`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::ReduceScatter, recv.len()).op(op),
            rd(send),
            wr(recv),
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank * n..][..n]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.per_rank(buf.len())?;
        let out = rd(&buf[self.rank() * n..][..n]);
        self.run(
            OpSpec::of::<T>(OpKind::ReduceScatter, n).op(op),
            wr(buf),
            out,
        )
    }

    /// `buf` of `root` to every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let r = wr(buf);
        self.run(
            OpSpec::of::<T>(OpKind::Broadcast, buf.len()).root(root),
            r,
            r,
        )
    }

    /// Out-of-place broadcast: `send` matters on `root` only (others may pass `&[]`).
    pub fn broadcast_from<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::Broadcast, recv.len()).root(root),
            rd(send),
            wr(recv),
        )
    }

    /// `recv` on `root` = op over ranks of `send`; other ranks may pass `&mut []` as `recv`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let spec = OpSpec::of::<T>(OpKind::Reduce, send.len())
            .op(op)
            .root(root);
        self.run(spec, rd(send), wr(recv))
    }

    /// In-place reduce (the result replaces `buf` on `root`; other ranks' `buf` is unchanged).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let r = wr(buf);
        self.run(
            OpSpec::of::<T>(OpKind::Reduce, buf.len()).op(op).root(root),
            r,
            r,
        )
    }

    /// Block `j` of `send` goes to rank `j`; block `j` of `recv` comes from rank `j`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.per_rank(send.len())?;
        self.run(OpSpec::of::<T>(OpKind::AllToAll, n), rd(send), wr(recv))
    }

    /// Sends `buf` to `peer` (matched with `peer`'s `recv` in issue order).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::Send, buf.len()).root(peer),
            rd(buf),
            Region::EMPTY,
        )
    }

    /// Receives exactly `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run(
            OpSpec::of::<T>(OpKind::Recv, buf.len()).root(peer),
            Region::EMPTY,
            wr(buf),
        )
    }

    /// Blocks until every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.run(
            OpSpec::new(OpKind::Barrier, 0, DataType::U8),
            Region::EMPTY,
            Region::EMPTY,
        )
    }

    /// Runs the sends and receives `f` adds to the group concurrently (like
    /// `ncclGroupStart`/`ncclGroupEnd`), so exchanges that would deadlock one by one work.
    pub fn group<'b>(&'b self, f: impl FnOnce(&mut Group<'b>) -> Result<()>) -> Result<()> {
        let mut g = Group {
            comm: self,
            calls: Vec::new(),
        };
        f(&mut g)?;
        if g.calls.is_empty() {
            return Ok(());
        }
        // SAFETY: the buffers are borrowed for 'b, which outlives this call, and we wait.
        let ev = unsafe { self.submit(self.default_stream(), &mut g.calls)? };
        self.finish(ev.wait())
    }

    fn per_rank(&self, len: usize) -> Result<usize> {
        if !len.is_multiple_of(self.world()) {
            return Err(Error::InvalidArgument(format!(
                "buffer of {len} elements does not split into {} equal blocks",
                self.world()
            )));
        }
        Ok(len / self.world())
    }

    /// Asynchronous operations on `stream` (use [`Communicator::default_stream`] for the
    /// default one).
    pub fn on<'c>(&'c self, stream: &Stream) -> OnStream<'c> {
        OnStream {
            comm: self,
            stream: stream.clone(),
        }
    }
}

/// Sends and receives issued together (see [`Communicator::group`]).
pub struct Group<'b> {
    comm: &'b Communicator,
    calls: Vec<Call>,
}

impl<'b> Group<'b> {
    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'b [T], peer: usize) -> Result<()> {
        let spec = OpSpec::of::<T>(OpKind::Send, buf.len()).root(peer);
        self.calls
            .push(make_call(self.comm, spec, rd(buf), Region::EMPTY)?);
        Ok(())
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'b mut [T], peer: usize) -> Result<()> {
        let spec = OpSpec::of::<T>(OpKind::Recv, buf.len()).root(peer);
        self.calls
            .push(make_call(self.comm, spec, Region::EMPTY, wr(buf))?);
        Ok(())
    }
}

/// Asynchronous operations enqueued on one stream. Each returns an [`OpFuture`] that yields the
/// buffers back when the operation completes; several may be enqueued before awaiting any.
pub struct OnStream<'c> {
    comm: &'c Communicator,
    stream: Stream,
}

impl OnStream<'_> {
    fn start<B: Send + 'static>(
        &self,
        spec: OpSpec,
        i: Region,
        o: Region,
        bufs: B,
    ) -> Result<OpFuture<B>> {
        let mut call = [make_call(self.comm, spec, i, o)?];
        // SAFETY: the regions point into `bufs`' heap memory, which `OpFuture` owns until the
        // event completes (its Drop waits for completion; leaking it leaks the memory too).
        let ev = unsafe { self.comm.submit(&self.stream, &mut call)? };
        self.stream.kick();
        Ok(OpFuture {
            comm: self.comm.clone(),
            event: ev,
            bufs: Some(bufs),
        })
    }

    /// In-place allreduce of `buf`.
    pub fn all_reduce<B: StableBuf>(&self, mut buf: B, op: ReduceOp) -> Result<OpFuture<B>> {
        let r = owned(&mut buf);
        self.start(
            OpSpec::of::<B::Elem>(OpKind::AllReduce, buf.len()).op(op),
            r,
            r,
            buf,
        )
    }

    /// Out-of-place allgather.
    pub fn all_gather<S, R>(&self, mut send: S, mut recv: R) -> Result<OpFuture<(S, R)>>
    where
        S: StableBuf,
        R: StableBuf<Elem = S::Elem>,
    {
        let (i, o) = (owned(&mut send), owned(&mut recv));
        self.start(
            OpSpec::of::<S::Elem>(OpKind::AllGather, send.len()),
            i,
            o,
            (send, recv),
        )
    }

    /// Out-of-place reduce-scatter.
    pub fn reduce_scatter<S, R>(
        &self,
        mut send: S,
        mut recv: R,
        op: ReduceOp,
    ) -> Result<OpFuture<(S, R)>>
    where
        S: StableBuf,
        R: StableBuf<Elem = S::Elem>,
    {
        let (i, o) = (owned(&mut send), owned(&mut recv));
        let spec = OpSpec::of::<S::Elem>(OpKind::ReduceScatter, recv.len()).op(op);
        self.start(spec, i, o, (send, recv))
    }

    /// In-place broadcast from `root`.
    pub fn broadcast<B: StableBuf>(&self, mut buf: B, root: usize) -> Result<OpFuture<B>> {
        let r = owned(&mut buf);
        self.start(
            OpSpec::of::<B::Elem>(OpKind::Broadcast, buf.len()).root(root),
            r,
            r,
            buf,
        )
    }

    /// In-place reduce to `root`.
    pub fn reduce<B: StableBuf>(
        &self,
        mut buf: B,
        op: ReduceOp,
        root: usize,
    ) -> Result<OpFuture<B>> {
        let r = owned(&mut buf);
        let spec = OpSpec::of::<B::Elem>(OpKind::Reduce, buf.len())
            .op(op)
            .root(root);
        self.start(spec, r, r, buf)
    }

    /// All-to-all.
    pub fn all_to_all<S, R>(&self, mut send: S, mut recv: R) -> Result<OpFuture<(S, R)>>
    where
        S: StableBuf,
        R: StableBuf<Elem = S::Elem>,
    {
        let n = self.comm.per_rank(send.len())?;
        let (i, o) = (owned(&mut send), owned(&mut recv));
        self.start(
            OpSpec::of::<S::Elem>(OpKind::AllToAll, n),
            i,
            o,
            (send, recv),
        )
    }

    /// Send to `peer`.
    pub fn send<B: StableBuf>(&self, mut buf: B, peer: usize) -> Result<OpFuture<B>> {
        let r = owned(&mut buf);
        let spec = OpSpec::of::<B::Elem>(OpKind::Send, buf.len()).root(peer);
        self.start(spec, r, Region::EMPTY, buf)
    }

    /// Receive from `peer`.
    pub fn recv<B: StableBuf>(&self, mut buf: B, peer: usize) -> Result<OpFuture<B>> {
        let r = owned(&mut buf);
        let spec = OpSpec::of::<B::Elem>(OpKind::Recv, buf.len()).root(peer);
        self.start(spec, Region::EMPTY, r, buf)
    }

    /// Event completing when everything enqueued on this stream so far has.
    pub fn event(&self) -> Event {
        self.stream.record()
    }
}

/// An operation in flight; resolves to its buffers. Dropping it before completion blocks until
/// the operation is done (the memory must stay valid while peers write into it).
pub struct OpFuture<B> {
    comm: Communicator,
    event: Event,
    bufs: Option<B>,
}

impl<B> OpFuture<B> {
    /// Blocks until complete.
    pub fn wait(mut self) -> Result<B> {
        let r = self.comm.finish(self.event.wait());
        let b = self.bufs.take().expect("buffers present until completion");
        r.map(|()| b)
    }
}

impl<B: Unpin> Future for OpFuture<B> {
    type Output = Result<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        let this = &mut *self;
        match Pin::new(&mut this.event).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                let r = this.comm.finish(r);
                let b = this.bufs.take().expect("polled after completion");
                Poll::Ready(r.map(|()| b))
            }
        }
    }
}

impl<B> Drop for OpFuture<B> {
    fn drop(&mut self) {
        if self.bufs.is_some() {
            let _ = self.comm.finish(self.event.wait());
        }
    }
}
