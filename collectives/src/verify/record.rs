//! The recording [`TaskSink`]: checks each submitted task like the framework's sink (bounds,
//! stream/notify ids, links, peer-writable receive buffers) plus what the verifier needs
//! (element alignment, read-only input, overlapping operands, the operation's dtype), and keeps
//! the tasks per stream with the sequence numbers the real link and notify counters would give
//! them at enqueue time.

use ampccl_runtime::{DataType, Error, ReduceOp, Result};

use super::{Reject, VerifyError};
use crate::op::{OpKind, OpParam};
use crate::resource::{BufKind, CopyTo, Mem, NotifyId, SharedUser, StreamId, TaskSink};

/// Names of the simulated memories (index = [`Layout::mem`]).
pub(crate) const MEM_NAMES: [&str; 5] = ["UserIn", "UserOut", "CclIn", "CclOut", "Scratch"];

/// Where each [`BufKind`] lives in a rank's simulated memories. In place, `UserIn` and
/// `UserOut` are one memory at NCCL's in-place offsets.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// Bytes of one element.
    pub elem: usize,
    /// Bytes each `BufKind` may address (index `BufKind as usize`).
    pub size: [usize; 5],
    /// Memory each `BufKind` lives in, and its byte offset there.
    pub mem: [usize; 5],
    pub base: [usize; 5],
    /// Bytes of each memory.
    pub mem_bytes: [usize; 5],
}

impl Layout {
    pub fn new(p: &OpParam, ccl: usize, scratch: usize) -> Layout {
        let (inb, outb) = (p.input_bytes(), p.output_bytes());
        let mut l = Layout {
            elem: p.elem(),
            size: [inb, outb, ccl, ccl, scratch],
            mem: [0, 1, 2, 3, 4],
            base: [0; 5],
            mem_bytes: [inb, outb, ccl, ccl, scratch],
        };
        if p.in_place {
            let shift = p.rank * p.count * p.elem();
            l.mem[1] = 0;
            l.mem_bytes[1] = 0;
            match p.kind {
                OpKind::AllGather => {
                    l.base[0] = shift;
                    l.mem_bytes[0] = outb.max(shift + inb);
                }
                OpKind::ReduceScatter => {
                    l.base[1] = shift;
                    l.mem_bytes[0] = inb.max(shift + outb);
                }
                _ => l.mem_bytes[0] = inb.max(outb),
            }
        }
        l
    }

    /// `(memory, first element, end element)` of `len` bytes at `m` (checked already).
    pub fn range(&self, m: Mem, len: usize) -> (usize, usize, usize) {
        let b = m.buf as usize;
        let start = (self.base[b] + m.off) / self.elem;
        (self.mem[b], start, start + len / self.elem)
    }
}

/// One recorded task. Sequence numbers are those the link counters give at enqueue time:
/// the n-th `tx_async` to a peer matches the peer's n-th `rx_async` from us.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Copy {
        dst: Mem,
        src: Mem,
        len: usize,
    },
    Reduce {
        dst: Mem,
        a: Mem,
        b: Mem,
        count: usize,
    },
    Avg {
        dst: Mem,
        count: usize,
        n: usize,
    },
    Record {
        n: NotifyId,
    },
    /// Waits until `target` records of `n` happened (generation counting).
    Wait {
        n: NotifyId,
        target: usize,
    },
    TxAck {
        peer: usize,
        seq: usize,
    },
    RxAck {
        peer: usize,
        seq: usize,
    },
    /// A send from `mem` (`tx_async`), or with `read` a read into `mem` (`read_async`).
    TxAsync {
        peer: usize,
        mem: Mem,
        len: usize,
        seq: usize,
        read: bool,
    },
    /// A receive into `mem` (`rx_async`), or with `read` an offer of `mem` (`offer_async`).
    RxAsync {
        peer: usize,
        mem: Mem,
        len: usize,
        seq: usize,
        read: bool,
    },
    TxWaitDone {
        peer: usize,
        seq: usize,
    },
    /// `rx_wait_done`, or with `read` `offer_wait_done`.
    RxWaitDone {
        peer: usize,
        len: usize,
        seq: usize,
        read: bool,
    },
}

/// `rank 1 stream 0 task #4: tx_async(...)`.
pub(crate) fn describe(rank: usize, stream: StreamId, index: usize, op: &Op) -> String {
    let m = |m: &Mem| format!("{:?}+{}", m.buf, m.off);
    let what = match op {
        Op::Copy { dst, src, len } => format!("copy({} <- {}, {len} B)", m(dst), m(src)),
        Op::Reduce { dst, a, b, count } => {
            format!("reduce({} <- {} op {}, {count} elems)", m(dst), m(a), m(b))
        }
        Op::Avg { dst, count, n } => format!("finish_avg({}, {count} elems, /{n})", m(dst)),
        Op::Record { n } => format!("record(notify {n})"),
        Op::Wait { n, target } => format!("wait(notify {n}, record #{target})"),
        Op::TxAck { peer, seq } => format!("tx_ack(to {peer}, #{seq})"),
        Op::RxAck { peer, seq } => format!("rx_ack(from {peer}, #{seq})"),
        Op::TxAsync {
            peer,
            mem,
            len,
            seq,
            read,
        } => {
            let name = if *read { "read_async" } else { "tx_async" };
            format!("{name}(to {peer} #{seq}, {}, {len} B)", m(mem))
        }
        Op::RxAsync {
            peer,
            mem,
            len,
            seq,
            read,
        } => {
            let name = if *read { "offer_async" } else { "rx_async" };
            format!("{name}(from {peer} #{seq}, {}, {len} B)", m(mem))
        }
        Op::TxWaitDone { peer, seq } => format!("tx_wait_done(to {peer} #{seq})"),
        Op::RxWaitDone {
            peer,
            len,
            seq,
            read,
        } => {
            let name = if *read {
                "offer_wait_done"
            } else {
                "rx_wait_done"
            };
            format!("{name}(from {peer} #{seq}, {len} B)")
        }
    };
    format!("rank {rank} stream {stream} task #{index}: {what}")
}

/// Per-peer enqueue counters.
#[derive(Clone, Default)]
struct PeerSeq {
    tx: usize,
    rx: usize,
    tx_done: usize,
    rx_done: usize,
    tx_ack: usize,
    rx_ack: usize,
}

/// Records one rank's tasks.
pub(crate) struct Recorder<'a> {
    pub rank: usize,
    pub param: OpParam,
    pub layout: &'a Layout,
    pub user_mem_links: bool,
    pub shared_user: SharedUser,
    /// Tasks per stream (`0` = main).
    pub streams: Vec<Vec<Op>>,
    pub notify_num: usize,
    /// Peers with a requested link.
    pub linked: Vec<bool>,
    waits: Vec<usize>,
    seq: Vec<PeerSeq>,
    /// The first rejection (the executor gets `Error::Internal` for it).
    pub rejected: Option<VerifyError>,
}

impl<'a> Recorder<'a> {
    pub fn new(
        param: OpParam,
        layout: &'a Layout,
        stream_num: usize,
        notify_num: usize,
        linked: Vec<bool>,
        (user_mem_links, shared_user): (bool, SharedUser),
    ) -> Recorder<'a> {
        Recorder {
            rank: param.rank,
            param,
            layout,
            user_mem_links,
            shared_user,
            streams: vec![Vec::new(); stream_num + 1],
            notify_num,
            waits: vec![0; notify_num],
            seq: vec![PeerSeq::default(); linked.len()],
            linked,
            rejected: None,
        }
    }

    fn reject(&mut self, s: StreamId, op: &Op, kind: Reject, msg: String) -> Error {
        let index = self.streams.get(s).map_or(0, Vec::len);
        let task = describe(self.rank, s, index, op);
        let e = Error::Internal(format!("executor bug: {task}: {msg}"));
        self.rejected.get_or_insert(VerifyError::Rejected {
            rank: self.rank,
            kind,
            task,
            msg,
        });
        e
    }

    fn stream(&mut self, s: StreamId, op: &Op) -> Result<()> {
        if s >= self.streams.len() {
            let msg = format!("stream {s} was not requested");
            return Err(self.reject(s, op, Reject::UnknownStream, msg));
        }
        Ok(())
    }

    fn link(&mut self, s: StreamId, op: &Op, peer: usize) -> Result<()> {
        if !self.linked.get(peer).copied().unwrap_or(false) {
            let msg = format!("no link to rank {peer} was requested");
            return Err(self.reject(s, op, Reject::NoLink, msg));
        }
        Ok(())
    }

    /// Bounds and element alignment of `len` bytes at `m`; `write` rejects the user input.
    fn mem(&mut self, s: StreamId, op: &Op, m: Mem, len: usize, write: bool) -> Result<()> {
        let size = self.layout.size[m.buf as usize];
        if m.off.checked_add(len).is_none_or(|end| end > size) {
            let msg = format!("{m:?}+{len} out of bounds (buffer holds {size} bytes)");
            return Err(self.reject(s, op, Reject::OutOfBounds, msg));
        }
        let e = self.layout.elem;
        if !m.off.is_multiple_of(e) || !len.is_multiple_of(e) {
            let msg = format!("{m:?}+{len} is not aligned to {e}-byte elements");
            return Err(self.reject(s, op, Reject::Misaligned, msg));
        }
        if write && m.buf == BufKind::UserIn {
            let msg = "writes the user input (read-only)".to_string();
            return Err(self.reject(s, op, Reject::ReadOnly, msg));
        }
        Ok(())
    }

    /// Rejects partially overlapping operands (identical ones are fine for reduce).
    /// Whether `len`-byte ranges at `x` and `y` share a byte.
    fn overlap(&self, x: Mem, y: Mem, len: usize) -> bool {
        let ((mx, ax, bx), (my, ay, by)) = (self.layout.range(x, len), self.layout.range(y, len));
        mx == my && ax < by && ay < bx
    }

    fn disjoint(&mut self, s: StreamId, op: &Op, x: Mem, y: Mem, len: usize) -> Result<()> {
        if self.overlap(x, y, len) && self.layout.range(x, len) != self.layout.range(y, len) {
            let msg = format!("operands {x:?} and {y:?} overlap partially");
            return Err(self.reject(s, op, Reject::Overlap, msg));
        }
        Ok(())
    }

    fn dtype(
        &mut self,
        s: StreamId,
        op: &Op,
        dtype: DataType,
        rop: Option<ReduceOp>,
    ) -> Result<()> {
        let p = self.param;
        let op_ok = rop.is_none_or(|o| o == p.op || (p.op == ReduceOp::Avg && o == ReduceOp::Sum));
        if dtype != p.dtype || !op_ok {
            let msg = format!(
                "uses {}/{:?}, the operation is {}/{}",
                dtype.name(),
                rop,
                p.dtype.name(),
                p.op.name()
            );
            return Err(self.reject(s, op, Reject::TypeMismatch, msg));
        }
        Ok(())
    }

    fn push(&mut self, s: StreamId, op: Op) -> Result<()> {
        self.stream(s, &op)?;
        self.streams[s].push(op);
        Ok(())
    }

    /// A send from `mem`, or (`read`) a read into it: a local read or write, the next send
    /// number.
    fn tx(&mut self, s: StreamId, peer: usize, mem: Mem, len: usize, read: bool) -> Result<()> {
        let mut op = Op::TxAsync {
            peer,
            mem,
            len,
            seq: 0,
            read,
        };
        self.mem(s, &op, mem, len, read)?;
        self.link(s, &op, peer)?;
        self.stream(s, &op)?;
        let next = &mut self.seq[peer].tx;
        if let Op::TxAsync { seq, .. } = &mut op {
            *seq = *next;
        }
        *next += 1;
        self.push(s, op)
    }

    /// A receive into `mem`, or (`read`) an offer of it: memory the peer writes or reads, the
    /// next receive number.
    fn rx(&mut self, s: StreamId, peer: usize, mem: Mem, len: usize, read: bool) -> Result<()> {
        let mut op = Op::RxAsync {
            peer,
            mem,
            len,
            seq: 0,
            read,
        };
        self.link(s, &op, peer)?;
        if !self.shared_user.reaches(mem.buf) && !self.user_mem_links {
            let msg = if read {
                format!("offer of {:?}, which peers cannot read", mem.buf)
            } else {
                format!("receive into {:?}, which peers cannot write", mem.buf)
            };
            return Err(self.reject(s, &op, Reject::NotPeerAccessible, msg));
        }
        self.mem(s, &op, mem, len, !read)?;
        self.stream(s, &op)?;
        let next = &mut self.seq[peer].rx;
        if let Op::RxAsync { seq, .. } = &mut op {
            *seq = *next;
        }
        *next += 1;
        self.push(s, op)
    }

    fn rx_done(&mut self, s: StreamId, peer: usize, len: usize, read: bool) -> Result<()> {
        let mut op = Op::RxWaitDone {
            peer,
            len,
            seq: 0,
            read,
        };
        self.link(s, &op, peer)?;
        self.stream(s, &op)?;
        let next = &mut self.seq[peer].rx_done;
        if let Op::RxWaitDone { seq, .. } = &mut op {
            *seq = *next;
        }
        *next += 1;
        self.push(s, op)
    }
}

impl TaskSink for Recorder<'_> {
    // How bytes and results are stored (`to`, `out`) does not change what the simulation sees.
    fn copy_to(&mut self, s: StreamId, dst: Mem, src: Mem, len: usize, _: CopyTo) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let op = Op::Copy { dst, src, len };
        self.mem(s, &op, dst, len, true)?;
        self.mem(s, &op, src, len, false)?;
        let same = self.layout.range(dst, len) == self.layout.range(src, len);
        if same {
            return Ok(()); // the real sink drops copies onto themselves (in place)
        }
        self.disjoint(s, &op, dst, src, len)?;
        self.push(s, op)
    }

    /// As the real sink: no copy into a destination that is the source; the two destinations
    /// must not overlap at all.
    fn copy_tee(
        &mut self,
        s: StreamId,
        dsts: [(Mem, CopyTo); 2],
        src: Mem,
        len: usize,
    ) -> Result<()> {
        let from = self.layout.range(src, len);
        let [(a, _), (b, _)] = dsts;
        let copies = [a, b].map(|m| self.layout.range(m, len) != from);
        if copies == [true, true] && self.overlap(a, b, len) {
            let op = Op::Copy { dst: b, src, len };
            let msg = format!("tee destinations {a:?} and {b:?} overlap");
            return Err(self.reject(s, &op, Reject::Overlap, msg));
        }
        for ((dst, to), copy) in dsts.into_iter().zip(copies) {
            if copy {
                self.copy_to(s, dst, src, len, to)?;
            }
        }
        Ok(())
    }

    /// As the real sink: the copy's destination overlaps neither `dst` nor, unless it is one of
    /// them, `a` or `b`.
    fn reduce_tee(
        &mut self,
        s: StreamId,
        (dtype, rop): (DataType, ReduceOp),
        (dst, a, b): (Mem, Mem, Mem),
        count: usize,
        also: (Mem, CopyTo),
    ) -> Result<()> {
        let n = count * dtype.size();
        let at = self.layout.range(also.0, n);
        for (m, may_be) in [(dst, false), (a, true), (b, true)] {
            let equal = self.layout.range(m, n) == at;
            if self.overlap(m, also.0, n) && !(may_be && equal) {
                let op = Op::Copy {
                    dst: also.0,
                    src: dst,
                    len: n,
                };
                let msg = format!("reduction copied onto its operand {m:?}");
                return Err(self.reject(s, &op, Reject::Overlap, msg));
            }
        }
        self.reduce_to(s, dtype, rop, (dst, a, b), count, false)?;
        self.copy_to(s, also.0, dst, n, also.1)
    }

    fn reduce_to(
        &mut self,
        s: StreamId,
        dtype: DataType,
        rop: ReduceOp,
        (dst, a, b): (Mem, Mem, Mem),
        count: usize,
        _: bool,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let op = Op::Reduce { dst, a, b, count };
        self.dtype(s, &op, dtype, Some(rop))?;
        let n = count * dtype.size();
        self.mem(s, &op, dst, n, true)?;
        self.mem(s, &op, a, n, false)?;
        self.mem(s, &op, b, n, false)?;
        self.disjoint(s, &op, dst, a, n)?;
        self.disjoint(s, &op, dst, b, n)?;
        self.push(s, op)
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
        let op = Op::Avg { dst, count, n };
        self.dtype(s, &op, dtype, None)?;
        self.mem(s, &op, dst, count * dtype.size(), true)?;
        self.push(s, op)
    }

    fn record(&mut self, s: StreamId, n: NotifyId) -> Result<()> {
        let op = Op::Record { n };
        if n >= self.notify_num {
            let msg = format!("notify {n} was not requested");
            return Err(self.reject(s, &op, Reject::UnknownNotify, msg));
        }
        self.push(s, op)
    }

    fn wait(&mut self, s: StreamId, n: NotifyId) -> Result<()> {
        let op = Op::Wait { n, target: 0 };
        if n >= self.notify_num {
            let msg = format!("notify {n} was not requested");
            return Err(self.reject(s, &op, Reject::UnknownNotify, msg));
        }
        self.stream(s, &op)?;
        self.waits[n] += 1;
        let target = self.waits[n];
        self.push(s, Op::Wait { n, target })
    }

    fn tx_ack(&mut self, s: StreamId, peer: usize) -> Result<()> {
        let op = Op::TxAck { peer, seq: 0 };
        self.link(s, &op, peer)?;
        self.stream(s, &op)?;
        let seq = &mut self.seq[peer].tx_ack;
        *seq += 1;
        let seq = *seq - 1;
        self.push(s, Op::TxAck { peer, seq })
    }

    fn rx_ack(&mut self, s: StreamId, peer: usize) -> Result<()> {
        let op = Op::RxAck { peer, seq: 0 };
        self.link(s, &op, peer)?;
        self.stream(s, &op)?;
        let seq = &mut self.seq[peer].rx_ack;
        *seq += 1;
        let seq = *seq - 1;
        self.push(s, Op::RxAck { peer, seq })
    }

    fn tx_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()> {
        self.tx(s, peer, src, len, false)
    }

    fn rx_async(&mut self, s: StreamId, peer: usize, dst: Mem, len: usize) -> Result<()> {
        self.rx(s, peer, dst, len, false)
    }

    fn offer_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()> {
        self.rx(s, peer, src, len, true)
    }

    fn read_async(
        &mut self,
        s: StreamId,
        peer: usize,
        dst: Mem,
        len: usize,
        _: CopyTo,
    ) -> Result<()> {
        self.tx(s, peer, dst, len, true)
    }

    fn tx_wait_done(&mut self, s: StreamId, peer: usize) -> Result<()> {
        let op = Op::TxWaitDone { peer, seq: 0 };
        self.link(s, &op, peer)?;
        self.stream(s, &op)?;
        let seq = &mut self.seq[peer].tx_done;
        *seq += 1;
        let seq = *seq - 1;
        self.push(s, Op::TxWaitDone { peer, seq })
    }

    fn rx_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()> {
        self.rx_done(s, peer, len, false)
    }

    fn offer_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()> {
        self.rx_done(s, peer, len, true)
    }
}
