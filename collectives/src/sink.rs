//! The framework's [`TaskSink`]: resolves [`Mem`] positions to pointers (bounds-checked) and
//! enqueues runtime tasks on the operation's streams.

use std::sync::Arc;

pub(crate) use ampccl_runtime::mem::Region;
use ampccl_runtime::notify::Notify;
use ampccl_runtime::stream::Stream;
use ampccl_runtime::task::{CopyTo, Task};
use ampccl_runtime::{DataType, Error, ReduceOp, Result};
use ampccl_transport::link::Link;

use crate::resource::{BufKind, Mem, NotifyId, SharedUser, StreamId, TaskSink};

/// Enqueues an operation's tasks.
pub(crate) struct StreamSink<'a> {
    pub main: &'a Stream,
    pub sides: &'a [Stream],
    pub notifies: &'a [Notify],
    /// Links by peer rank (built for the peers the executor requested).
    pub links: &'a [Option<Arc<Link>>],
    /// Indexed by `BufKind as usize`.
    pub regions: [Region; 5],
    /// Which user buffers peers map.
    pub shared_user: SharedUser,
    pub tag: u32,
}

impl StreamSink<'_> {
    fn stream(&self, s: StreamId) -> Result<&Stream> {
        match s {
            0 => Ok(self.main),
            _ => self
                .sides
                .get(s - 1)
                .ok_or_else(|| bug(format!("stream {s} was not requested"))),
        }
    }

    fn ptr(&self, m: Mem, len: usize) -> Result<*mut u8> {
        let r = self.regions[m.buf as usize];
        r.at(m.off, len).ok_or_else(|| {
            bug(format!(
                "{m:?}+{len} out of bounds (buffer holds {} bytes)",
                r.len
            ))
        })
    }

    fn link(&self, peer: usize) -> Result<&Arc<Link>> {
        self.links
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| bug(format!("no link to rank {peer} was requested")))
    }

    fn notify(&self, n: NotifyId) -> Result<&Notify> {
        self.notifies
            .get(n)
            .ok_or_else(|| bug(format!("notify {n} was not requested")))
    }

    /// A `Copy` task; none for an empty copy or one onto itself.
    fn copy_task(&self, s: StreamId, dst: Mem, src: Mem, len: usize, to: CopyTo) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (dst, src) = (self.ptr(dst, len)?, self.ptr(src, len)?);
        if std::ptr::eq(dst, src) {
            return Ok(());
        }
        self.push(s, Task::Copy { dst, src, len, to })
    }

    /// A `Reduce` task of `count` elements (`out`: into an output, streaming); none when empty.
    fn reduce_task(
        &self,
        s: StreamId,
        (dtype, op): (DataType, ReduceOp),
        (dst, a, b): (Mem, Mem, Mem),
        count: usize,
        out: bool,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let n = count * dtype.size();
        let t = Task::Reduce {
            dtype,
            op,
            dst: self.ptr(dst, n)?,
            a: self.ptr(a, n)?,
            b: self.ptr(b, n)?,
            count,
            out,
        };
        self.push(s, t)
    }

    fn push(&self, s: StreamId, t: Task) -> Result<()> {
        let st = self.stream(s)?;
        // SAFETY: every pointer in `t` was resolved by `ptr` inside a region the caller of the
        // operation guaranteed valid until the operation's event completes.
        unsafe { st.enqueue(t) };
        Ok(())
    }
}

/// Whether `n`-byte ranges at `x` and `y` overlap.
fn overlap(x: *const u8, y: *const u8, n: usize) -> bool {
    (x as usize).abs_diff(y as usize) < n
}

fn bug(msg: String) -> Error {
    Error::Internal(format!("executor bug: {msg}"))
}

impl TaskSink for StreamSink<'_> {
    fn copy_to(&mut self, s: StreamId, dst: Mem, src: Mem, len: usize, to: CopyTo) -> Result<()> {
        self.copy_task(s, dst, src, len, to)
    }

    fn copy_tee(
        &mut self,
        s: StreamId,
        dsts: [(Mem, CopyTo); 2],
        src: Mem,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let from = self.ptr(src, len)?;
        let [a, b] = [self.ptr(dsts[0].0, len)?, self.ptr(dsts[1].0, len)?];
        if std::ptr::eq(a, from) {
            return self.copy_task(s, dsts[1].0, src, len, dsts[1].1);
        }
        if std::ptr::eq(b, from) {
            return self.copy_task(s, dsts[0].0, src, len, dsts[0].1);
        }
        if overlap(a, b, len) {
            return Err(bug(format!("tee into overlapping {dsts:?}+{len}")));
        }
        let dsts = [(a, dsts[0].1), (b, dsts[1].1)];
        self.push(
            s,
            Task::Tee {
                dsts,
                src: from,
                len,
            },
        )
    }

    fn reduce_to(
        &mut self,
        s: StreamId,
        dtype: DataType,
        op: ReduceOp,
        operands: (Mem, Mem, Mem),
        count: usize,
        out: bool,
    ) -> Result<()> {
        self.reduce_task(s, (dtype, op), operands, count, out)
    }

    fn reduce_tee(
        &mut self,
        s: StreamId,
        (dtype, op): (DataType, ReduceOp),
        (dst, a, b): (Mem, Mem, Mem),
        count: usize,
        also: (Mem, CopyTo),
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let n = count * dtype.size();
        let [dst, a, b, to] = [dst, a, b, also.0].map(|m| self.ptr(m, n));
        let (dst, a, b, to) = (dst?, a?, b?, to?);
        if overlap(dst, to, n) || [a, b].into_iter().any(|p| p != to && overlap(p, to, n)) {
            return Err(bug(format!(
                "reduction copied onto an operand ({also:?}+{n})"
            )));
        }
        let t = Task::ReduceTee {
            dtype,
            op,
            dst,
            also: (to, also.1),
            a,
            b,
            count,
        };
        self.push(s, t)
    }

    fn finish_avg(
        &mut self,
        s: StreamId,
        dtype: DataType,
        dst: Mem,
        count: usize,
        n: usize,
    ) -> Result<()> {
        if count == 0 || n == 1 {
            return Ok(());
        }
        let dst = self.ptr(dst, count * dtype.size())?;
        self.push(
            s,
            Task::FinishAvg {
                dtype,
                dst,
                count,
                n,
            },
        )
    }

    fn record(&mut self, s: StreamId, n: NotifyId) -> Result<()> {
        let t = Task::Record(self.notify(n)?.clone());
        self.push(s, t)
    }

    fn wait(&mut self, s: StreamId, n: NotifyId) -> Result<()> {
        let notify = self.notify(n)?.clone();
        self.stream(s)?;
        let target = notify.next_wait();
        self.push(s, Task::Wait { notify, target })
    }

    fn tx_ack(&mut self, s: StreamId, peer: usize) -> Result<()> {
        self.link(peer)?.tx_ack(self.stream(s)?);
        Ok(())
    }

    fn rx_ack(&mut self, s: StreamId, peer: usize) -> Result<()> {
        self.link(peer)?.rx_ack(self.stream(s)?);
        Ok(())
    }

    fn tx_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()> {
        let p = self.ptr(src, len)?;
        // SAFETY: `p` is valid until the operation completes (see `push`).
        unsafe { self.link(peer)?.tx_async(self.stream(s)?, p, len, self.tag) };
        Ok(())
    }

    fn rx_async(&mut self, s: StreamId, peer: usize, dst: Mem, len: usize) -> Result<()> {
        let link = self.link(peer)?;
        if !self.shared_user.reaches(dst.buf) && !link.receives_into_user_memory() {
            return Err(bug(format!(
                "receive into {:?}, which peers cannot write",
                dst.buf
            )));
        }
        let p = self.ptr(dst, len)?;
        // SAFETY: as for `tx_async`.
        unsafe { link.rx_async(self.stream(s)?, p, len, self.tag) };
        Ok(())
    }

    fn offer_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()> {
        let link = self.link(peer)?;
        if !self.shared_user.reaches(src.buf) && !link.receives_into_user_memory() {
            return Err(bug(format!(
                "offer of {:?}, which peers cannot read",
                src.buf
            )));
        }
        let p = self.ptr(src, len)?;
        // SAFETY: as for `tx_async`.
        unsafe { link.offer_async(self.stream(s)?, p, len, self.tag) };
        Ok(())
    }

    fn read_async(
        &mut self,
        s: StreamId,
        peer: usize,
        dst: Mem,
        len: usize,
        to: CopyTo,
    ) -> Result<()> {
        let p = self.ptr(dst, len)?;
        // SAFETY: as for `tx_async`.
        unsafe {
            self.link(peer)?
                .read_async(self.stream(s)?, p, len, to, self.tag)
        };
        Ok(())
    }

    fn offer_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()> {
        self.link(peer)?.offer_wait_done(self.stream(s)?, len);
        Ok(())
    }

    fn tx_wait_done(&mut self, s: StreamId, peer: usize) -> Result<()> {
        self.link(peer)?.tx_wait_done(self.stream(s)?);
        Ok(())
    }

    fn rx_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()> {
        self.link(peer)?.rx_wait_done(self.stream(s)?, len);
        Ok(())
    }
}

/// Index of each buffer kind in [`StreamSink::regions`].
pub(crate) const fn slot(b: BufKind) -> usize {
    b as usize
}
