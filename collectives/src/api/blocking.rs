//! Blocking calls on slices: each checks its buffers, enqueues on the communicator's default
//! stream and waits, driving progress on the calling thread.

use ampccl_runtime::{DataType, Element, ReduceOp, Result};

use super::call::{OpSpec, make_call};
use super::{rd, wr};
use crate::comm::{Call, Communicator, Wait};
use crate::op::OpKind;
use crate::sink::Region;

impl Communicator {
    fn run(&self, spec: OpSpec, input: Region, output: Region) -> Result<()> {
        let mut call = [make_call(self, spec, input, output)?];
        // SAFETY: the regions come from borrows that outlive the wait below; if the wait fails
        // the communicator aborts, which drops every queued task.
        let ev = unsafe { self.submit(self.default_stream(), &mut call, Wait::Now)? };
        self.finish(ev.wait())
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
        let ev = unsafe { self.submit(self.default_stream(), &mut g.calls, Wait::Now)? };
        self.finish(ev.wait())
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
