//! Asynchronous calls: operations enqueued on an explicit stream take owned buffers
//! ([`StableBuf`]) and return an [`OpFuture`] that yields them back, under any executor.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ampccl_runtime::stream::{Event, Stream};
use ampccl_runtime::{Element, ReduceOp, Result};

use super::call::{OpSpec, make_call};
use crate::comm::{Communicator, Wait};
use crate::op::OpKind;
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

fn owned<B: StableBuf>(b: &mut B) -> Region {
    Region {
        ptr: b.as_mut_ptr().cast(),
        len: b.len() * size_of::<B::Elem>(),
    }
}

impl Communicator {
    /// Asynchronous operations on `stream` (use [`Communicator::default_stream`] for the
    /// default one).
    pub fn on<'c>(&'c self, stream: &Stream) -> OnStream<'c> {
        OnStream {
            comm: self,
            stream: stream.clone(),
        }
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
        let ev = unsafe { self.comm.submit(&self.stream, &mut call, Wait::Later)? };
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
