//! The PCIe path: collectives between the GPUs of one host through pinned shared host memory,
//! driven entirely by CUDA streams (no host thread takes part once the work is enqueued).
//!
//! Each rank has two side streams. An operation is cut into chunks, and each chunk takes one
//! or more rounds (allreduce on more than 2 GPUs: two); every round is a pipeline step `g`,
//! numbered across all operations of the domain, identically on every rank, in the order
//! [`crate::schedule::steps`] gives (staging slot `g % slots`; loom-checked):
//!
//! ```text
//! send stream:  wait consumed[q] >= g+1-slots (all q ≠ me), and consumed[me] >= after+1 for a
//!               later round  → D2H my pieces into my slot → ready[me] = g+1
//! recv stream:  wait ready[p] >= g+1 (every p, me included)  → H2D peers' pieces
//!               (into the output, or into scratch + reduction kernel) → consumed[me] = g+1
//! ```
//! Flags are 32-bit words in the shared area, written with `cuStreamWriteValue32` and waited on
//! with `cuStreamWaitValue32` — cross-process notifies that no host thread services. Waiting for
//! `ready[me]` as well makes in-place operations safe (a rank's output never overwrites input
//! before it has been staged). Reductions run on the GPU in rank order, so every rank computes
//! bit-identical results.
//!
//! Joins: both side streams first wait for an event recorded on the user's stream (inputs
//! ready, earlier readers of the output done); [`PcieRank::join`] makes the user's stream wait
//! for both side streams, so later work sees the result without any host synchronisation.
//!
//! One file per collective describes which pieces each rank stages and what it does with its
//! peers' pieces: [`allreduce`], [`allgather`], [`reducescatter`], [`broadcast`], [`reduce`].

mod allgather;
mod allreduce;
mod broadcast;
pub mod layout;
mod reduce;
mod reducescatter;
mod timing;

use std::sync::Arc;

use ampccl_runtime::cuda::{
    CudaEvent, CudaStream, Device, DeviceBuffer, HostRegistration, ReduceKernels, StreamRef,
};
use ampccl_runtime::{DataType, ReduceOp};

pub use layout::{HeaderRef, Layout, RankStatus};
use timing::TimingRing;
pub use timing::{CallTiming, Timed};

use crate::schedule::{self, ChunkFlags, Flag};
use crate::{Error, Result};

/// Which collective, with its root where it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcieKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast { root: usize },
    Reduce { root: usize },
}

/// The PCIe part of one collective call. Buffers are device addresses of the user's buffers,
/// exactly as given to NCCL; the part covers elements `start..start + len` of every block.
#[derive(Clone, Copy, Debug)]
pub struct PcieOp {
    pub kind: PcieKind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub send: u64,
    pub recv: u64,
    /// Elements per rank block: allgather's send count, reduce-scatter's receive count, the
    /// count of the others.
    pub block: usize,
    /// First element of the PCIe part within each block.
    pub start: usize,
    /// Elements of the PCIe part per block.
    pub len: usize,
}

/// The shared host area of one domain, registered with the driver. One per process and
/// domain; every local rank's [`PcieRank`] uses it.
pub struct HostArea {
    base: *mut u8,
    layout: Layout,
    reg: HostRegistration,
}

// SAFETY: the area is a pointer into a shared mapping that outlives it (the owner keeps the
// segment), accessed only by GPUs and through atomics.
unsafe impl Send for HostArea {}
// SAFETY: as above.
unsafe impl Sync for HostArea {}

impl HostArea {
    /// Registers `layout.total()` bytes at `base` (a device context must be current).
    ///
    /// # Safety
    /// `base` must be a page-aligned shared mapping of at least `layout.total()` bytes that
    /// stays mapped while this value lives.
    pub unsafe fn register(base: *mut u8, layout: Layout) -> Result<HostArea> {
        // SAFETY: forwarded from the caller.
        let reg = unsafe { HostRegistration::new(base, layout.total()) }?;
        Ok(HostArea { base, layout, reg })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn flag(&self, off: usize) -> u64 {
        self.reg.device_addr(off)
    }

    fn slot(&self, slot: usize, writer: usize) -> *mut u8 {
        self.base.wrapping_add(self.layout.slot_off(slot, writer))
    }
}

/// One rank's PCIe resources: its device, side streams, join events, scratch and kernels.
pub struct PcieRank {
    rank: usize,
    nranks: usize,
    area: Arc<HostArea>,
    next_step: u64,
    /// Fault injection: the next [`PcieRank::enqueue`] fails after this many steps.
    fault_after: Option<usize>,
    res: std::mem::ManuallyDrop<Resources>,
    device: Device,
}

/// The CUDA objects of a rank, released in its device's context (see `Drop for PcieRank`).
struct Resources {
    send: CudaStream,
    recv: CudaStream,
    before: CudaEvent,
    send_done: CudaEvent,
    recv_done: CudaEvent,
    scratch: DeviceBuffer,
    kernels: ReduceKernels,
    timing: TimingRing,
}

impl Drop for PcieRank {
    fn drop(&mut self) {
        let _ctx = self.device.enter();
        // Work still queued may use the scratch buffer and the kernels: let it finish.
        self.wait_idle();
        // SAFETY: dropped exactly once, here; the context is current when it could be entered
        // (otherwise the driver is gone and releasing is moot).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.res) };
    }
}

impl PcieRank {
    /// Creates the resources of `rank` (of `nranks`) on device `ordinal`.
    pub fn new(area: Arc<HostArea>, ordinal: i32, rank: usize, nranks: usize) -> Result<PcieRank> {
        if nranks != area.layout.nranks
            || rank >= nranks
            || nranks > ampccl_runtime::cuda::MAX_SOURCES
        {
            return Err(Error::InvalidArgument(format!(
                "PCIe rank {rank} of {nranks} (area for at most {}, at most {} GPUs)",
                area.layout.nranks,
                ampccl_runtime::cuda::MAX_SOURCES
            )));
        }
        let device = Device::new(ordinal)?;
        let ctx = device.enter()?;
        let res = Resources {
            send: CudaStream::new()?,
            recv: CudaStream::new()?,
            before: CudaEvent::new(false)?,
            send_done: CudaEvent::new(false)?,
            recv_done: CudaEvent::new(false)?,
            scratch: DeviceBuffer::new((nranks - 1).max(1) * area.layout.slot_bytes)?,
            kernels: ReduceKernels::load(&device)?,
            timing: TimingRing::new()?,
        };
        drop(ctx);
        Ok(PcieRank {
            rank,
            nranks,
            next_step: 0,
            fault_after: None,
            area,
            res: std::mem::ManuallyDrop::new(res),
            device,
        })
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copies `bytes` between device buffers on the user's stream `user` (the part of an
    /// out-of-place allgather that stays on this GPU).
    ///
    /// # Safety
    /// Both ranges must be device memory valid until `user` passes the copy.
    pub unsafe fn copy_on(&self, user: StreamRef, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        let _ctx = self.device.enter()?;
        // SAFETY: forwarded from the caller.
        unsafe { user.copy_dtod(dst, src, bytes) }
    }

    /// Makes the first [`PcieRank::enqueue`] of more than `steps` pipeline steps fail after
    /// enqueuing `steps` of them, as a driver error in the middle of a pipeline would (testing
    /// the failure path on GPUs).
    pub fn inject_fault_after(&mut self, steps: usize) {
        self.fault_after = Some(steps);
    }

    /// Releases this rank's flags in stream order: after everything enqueued so far, the send
    /// stream sets `ready[me]` and the receive stream `consumed[me]` to `value` (see
    /// [`schedule::released`]), so no later write of this rank's own steps can move them back.
    /// After it, this rank must enqueue no more steps.
    pub fn release_flags(&self, value: u32) -> Result<()> {
        let _ctx = self.device.enter()?;
        let l = &self.area.layout;
        // SAFETY: both flags lie in the registered area.
        unsafe {
            self.res
                .send
                .handle()
                .write_flag(self.area.flag(l.ready_off(self.rank)), value)?;
            self.res
                .recv
                .handle()
                .write_flag(self.area.flag(l.consumed_off(self.rank)), value)
        }
    }

    /// Blocks until the side streams have run everything enqueued so far.
    pub fn wait_idle(&self) {
        if let Ok(_ctx) = self.device.enter() {
            let _ = self.res.send.handle().synchronize();
            let _ = self.res.recv.handle().synchronize();
        }
    }

    /// Whether `user` is being captured into a CUDA graph.
    pub fn capturing(&self, user: StreamRef) -> Result<bool> {
        let _ctx = self.device.enter()?;
        user.is_capturing()
    }

    /// Starts the PCIe part `op` of a call whose inputs are ready at the current end of
    /// `user`: checks `op`, then makes the side streams wait for `user`'s current end. NCCL's
    /// part goes on `user` after this (so the side streams do not wait for it), and
    /// [`PcieRank::enqueue`] follows with the returned [`Forked`] — NCCL's kernels start while
    /// the host still enqueues the PCIe pipeline. No pipeline work is enqueued when this fails.
    pub fn fork(&mut self, op: &PcieOp, user: StreamRef, timed: Option<Timed>) -> Result<Forked> {
        if let PcieKind::Broadcast { root } | PcieKind::Reduce { root } = op.kind
            && root >= self.nranks
        {
            return Err(Error::InvalidArgument(format!(
                "root {root} of {} ranks",
                self.nranks
            )));
        }
        let plan = ChunkPlan::new(op, self.nranks, self.area.layout.slot_bytes)?;
        let _ctx = self.device.enter()?;
        user.record(&self.res.before)?;
        self.res.send.handle().wait_event(&self.res.before)?;
        self.res.recv.handle().wait_event(&self.res.before)?;
        if let Some(t) = timed {
            self.res.timing.pcie_start(t, self.res.send.handle())?;
        }
        Ok(Forked { plan, timed })
    }

    /// Enqueues the pipeline of the PCIe part `op` that [`PcieRank::fork`] started.
    /// [`PcieRank::join`] must follow (at once, or after `ncclGroupEnd`).
    ///
    /// # Safety
    /// The buffers named by `op` must be device memory of the sizes the collective implies,
    /// valid until the user's stream passes the join.
    pub unsafe fn enqueue(&mut self, op: &PcieOp, forked: Forked) -> Result<()> {
        let Forked { plan, timed } = forked;
        let _ctx = self.device.enter()?;
        let algo = algorithm(op.kind);
        let steps = schedule::steps(self.next_step, plan.chunks, algo.rounds(self.nranks));
        // Advance first: whatever happens below, this rank's step numbering stays the peers'.
        self.next_step += steps.len() as u64;
        for (i, step) in steps.into_iter().enumerate() {
            if self.fault_after == Some(i) {
                self.fault_after = None;
                return Err(Error::System(format!(
                    "injected fault after {i} pipeline steps"
                )));
            }
            let mut x = ChunkCtx {
                rank: self,
                op,
                g: step.g,
                after: step.after,
                round: step.round,
                range: plan.range(step.chunk),
                piece_bytes: plan.piece_bytes,
            };
            // SAFETY: forwarded from the caller; the staging memory is the registered area.
            unsafe {
                x.begin_send()?;
                algo.send(&mut x)?;
                x.end_send()?;
                x.begin_recv()?;
                algo.recv(&mut x)?;
                x.end_recv()?;
            }
        }
        if let Some(t) = timed {
            self.res.timing.pcie_end(t, self.res.recv.handle())?;
        }
        Ok(())
    }

    /// Starts timing a call tagged `tag` on `user` (before anything of the call is enqueued;
    /// `split`: the call has a PCIe part, enqueued with the returned [`Timed`]); completed
    /// timings of earlier calls found on the way go to `done`. `None` when no timing slot is
    /// free (the call then runs untimed).
    pub fn time_call(
        &mut self,
        user: StreamRef,
        tag: u64,
        split: bool,
        done: &mut Vec<CallTiming>,
    ) -> Option<Timed> {
        let _ctx = self.device.enter().ok()?;
        self.res.timing.begin(user, tag, split, done)
    }

    /// Marks the end of NCCL's part of a timed call on `user`.
    pub fn time_fast_end(&self, t: Timed, user: StreamRef) -> Result<()> {
        let _ctx = self.device.enter()?;
        self.res.timing.fast_end(t, user)
    }

    /// Moves the timings of every completed call to `done` (never blocks).
    pub fn poll_timings(&mut self, done: &mut Vec<CallTiming>) {
        if let Ok(_ctx) = self.device.enter() {
            self.res.timing.poll(done);
        }
    }

    /// Makes `user` wait for everything enqueued on the side streams so far. Applying it after
    /// more calls were enqueued (end of a group) is fine: it then waits for those as well.
    pub fn join(&self, user: StreamRef) -> Result<()> {
        let _ctx = self.device.enter()?;
        self.res.send.handle().record(&self.res.send_done)?;
        self.res.recv.handle().record(&self.res.recv_done)?;
        user.wait_event(&self.res.send_done)?;
        user.wait_event(&self.res.recv_done)
    }
}

/// A PCIe part whose side streams are forked off the user's stream, ready to be enqueued.
#[must_use = "a forked PCIe part must be enqueued: the peers wait for its chunks"]
pub struct Forked {
    plan: ChunkPlan,
    timed: Option<Timed>,
}

/// How an operation is cut into pipeline chunks.
struct ChunkPlan {
    chunks: usize,
    chunk_elems: usize,
    piece_bytes: usize,
    start: usize,
    len: usize,
}

impl ChunkPlan {
    fn new(op: &PcieOp, nranks: usize, slot_bytes: usize) -> Result<ChunkPlan> {
        let es = op.dtype.size();
        let algo = algorithm(op.kind);
        let pieces = algo.pieces(nranks);
        let piece_bytes = (slot_bytes / pieces) / 256 * 256;
        let chunk_elems = piece_bytes / es * algo.parts(nranks);
        if chunk_elems == 0 {
            return Err(Error::InvalidArgument(format!(
                "PCIe chunk of {slot_bytes} bytes cannot hold {pieces} pieces"
            )));
        }
        if op.start + op.len > op.block {
            return Err(Error::InvalidArgument(format!(
                "PCIe part {}..{} outside a block of {}",
                op.start,
                op.start + op.len,
                op.block
            )));
        }
        Ok(ChunkPlan {
            chunks: op.len.div_ceil(chunk_elems),
            chunk_elems,
            piece_bytes,
            start: op.start,
            len: op.len,
        })
    }

    fn range(&self, c: usize) -> Chunk {
        let first = self.start + c * self.chunk_elems;
        Chunk {
            first,
            elems: self.chunk_elems.min(self.start + self.len - first),
        }
    }
}

/// Elements `first..first + elems` of each block.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    first: usize,
    elems: usize,
}

/// What one collective does per chunk (one implementation per file).
trait PcieAlgorithm: Sync {
    /// Pieces each writer stages per chunk (its slot is split evenly between them).
    fn pieces(&self, nranks: usize) -> usize;
    /// Parts each block's chunk is cut into ([`ChunkCtx::part`]), each at most a piece long.
    fn parts(&self, _nranks: usize) -> usize {
        1
    }
    /// Rounds per chunk ([`ChunkCtx::round`]; see [`schedule::steps`]).
    fn rounds(&self, _nranks: usize) -> usize {
        1
    }
    /// Stages this rank's pieces ([`ChunkCtx::put`]).
    ///
    /// # Safety
    /// The op's buffers are valid (see [`PcieRank::enqueue`]).
    unsafe fn send(&self, x: &mut ChunkCtx) -> Result<()>;
    /// Consumes the peers' pieces ([`ChunkCtx::fetch`], [`ChunkCtx::reduce`], ...).
    ///
    /// # Safety
    /// As [`PcieAlgorithm::send`].
    unsafe fn recv(&self, x: &mut ChunkCtx) -> Result<()>;
}

fn algorithm(kind: PcieKind) -> &'static dyn PcieAlgorithm {
    match kind {
        PcieKind::AllReduce => &allreduce::AllReducePcie,
        PcieKind::AllGather => &allgather::AllGatherPcie,
        PcieKind::ReduceScatter => &reducescatter::ReduceScatterPcie,
        PcieKind::Broadcast { .. } => &broadcast::BroadcastPcie,
        PcieKind::Reduce { .. } => &reduce::ReducePcie,
    }
}

/// The steps an algorithm composes for one round of one chunk.
#[derive(Clone, Copy)]
struct ChunkCtx<'a> {
    rank: &'a PcieRank,
    op: &'a PcieOp,
    g: u64,
    after: Option<u64>,
    round: usize,
    range: Chunk,
    piece_bytes: usize,
}

impl ChunkCtx<'_> {
    /// Part `q` of `parts` of the chunk: equal runs of whole 256-byte units (the last ones
    /// may be shorter or empty), so that every rank cuts the chunk the same way.
    fn part(&self, q: usize, parts: usize) -> Self {
        let unit = (256 / self.op.dtype.size()).max(1);
        let per = self.range.elems.div_ceil(parts).div_ceil(unit) * unit;
        let lo = (q * per).min(self.range.elems);
        let hi = ((q + 1) * per).min(self.range.elems);
        Self {
            range: Chunk {
                first: self.range.first + lo,
                elems: hi - lo,
            },
            ..*self
        }
    }

    fn me(&self) -> usize {
        self.rank.rank
    }

    fn nranks(&self) -> usize {
        self.rank.nranks
    }

    /// The root of a rooted collective (0 for the others).
    fn root(&self) -> usize {
        match self.op.kind {
            PcieKind::Broadcast { root } | PcieKind::Reduce { root } => root,
            _ => 0,
        }
    }

    fn bytes(&self) -> usize {
        self.range.elems * self.op.dtype.size()
    }

    /// Device address of element `first` of the chunk in block `block` of a buffer at `base`.
    fn at(&self, base: u64, block: usize) -> u64 {
        base + ((block * self.op.block + self.range.first) * self.op.dtype.size()) as u64
    }

    /// The flag schedule of this chunk.
    fn flags(&self) -> ChunkFlags {
        ChunkFlags {
            g: self.g,
            me: self.me(),
            nranks: self.nranks(),
            slots: self.rank.area.layout.slots,
            after: self.after,
        }
    }

    fn slot(&self) -> usize {
        self.flags().slot()
    }

    /// Device address of a flag.
    fn flag(&self, f: Flag) -> u64 {
        let l = &self.rank.area.layout;
        self.rank.area.flag(match f {
            Flag::Ready(r) => l.ready_off(r),
            Flag::Consumed(r) => l.consumed_off(r),
        })
    }

    unsafe fn begin_send(&mut self) -> Result<()> {
        for (f, v) in self.flags().send_waits() {
            // SAFETY: the flag lies in the registered area.
            unsafe { self.rank.res.send.handle().wait_flag(self.flag(f), v) }?;
        }
        Ok(())
    }

    unsafe fn end_send(&mut self) -> Result<()> {
        let (f, v) = self.flags().send_signal();
        // SAFETY: the flag lies in the registered area.
        unsafe { self.rank.res.send.handle().write_flag(self.flag(f), v) }
    }

    unsafe fn begin_recv(&mut self) -> Result<()> {
        for (f, v) in self.flags().recv_waits() {
            // SAFETY: the flag lies in the registered area.
            unsafe { self.rank.res.recv.handle().wait_flag(self.flag(f), v) }?;
        }
        Ok(())
    }

    unsafe fn end_recv(&mut self) -> Result<()> {
        let (f, v) = self.flags().recv_signal();
        // SAFETY: the flag lies in the registered area.
        unsafe { self.rank.res.recv.handle().write_flag(self.flag(f), v) }
    }

    fn piece_ptr(&self, writer: usize, piece: usize) -> *mut u8 {
        self.rank
            .area
            .slot(self.slot(), writer)
            .wrapping_add(piece * self.piece_bytes)
    }

    /// Stages the chunk of device memory at `src` as this rank's piece `piece`.
    unsafe fn put(&self, piece: usize, src: u64) -> Result<()> {
        if self.bytes() == 0 {
            return Ok(());
        }
        // SAFETY: the piece lies in this rank's slot of the registered area; the caller
        // guarantees `src`.
        unsafe {
            self.rank.res.send.handle().copy_dtoh(
                self.piece_ptr(self.me(), piece),
                src,
                self.bytes(),
            )
        }
    }

    /// Copies `writer`'s staged piece `piece` to device memory at `dst`.
    unsafe fn fetch(&self, writer: usize, piece: usize, dst: u64) -> Result<()> {
        if self.bytes() == 0 {
            return Ok(());
        }
        // SAFETY: as `put`, directions swapped.
        unsafe {
            self.rank
                .res
                .recv
                .handle()
                .copy_htod(dst, self.piece_ptr(writer, piece), self.bytes())
        }
    }

    /// Copies the chunk between device buffers on the receive stream.
    unsafe fn copy_local(&self, dst: u64, src: u64) -> Result<()> {
        if dst == src {
            return Ok(());
        }
        // SAFETY: the caller guarantees both ranges.
        unsafe {
            self.rank
                .res
                .recv
                .handle()
                .copy_dtod(dst, src, self.bytes())
        }
    }

    /// Device address of scratch area `i` (`i < nranks - 1`), one piece long.
    fn scratch(&self, i: usize) -> u64 {
        self.rank.res.scratch.addr() + (i * self.piece_bytes) as u64
    }

    /// Fetches every peer's piece `piece` into scratch and reduces them with this rank's own
    /// data at `own` into `out`, in rank order.
    unsafe fn fetch_and_reduce(&self, piece: usize, own: u64, out: u64) -> Result<()> {
        let mut srcs = [0u64; ampccl_runtime::cuda::MAX_SOURCES];
        let mut next_scratch = 0;
        for (p, src) in srcs.iter_mut().enumerate().take(self.nranks()) {
            if p == self.me() {
                *src = own;
            } else {
                *src = self.scratch(next_scratch);
                next_scratch += 1;
                // SAFETY: scratch holds nranks - 1 pieces.
                unsafe { self.fetch(p, piece, *src) }?;
            }
        }
        // SAFETY: every source is a chunk of device memory; `out` is guaranteed by the caller.
        unsafe {
            self.rank.res.kernels.launch(
                self.rank.res.recv.handle(),
                self.op.dtype,
                self.op.op,
                out,
                &srcs[..self.nranks()],
                self.range.elems,
            )
        }
    }
}
