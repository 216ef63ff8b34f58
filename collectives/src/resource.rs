//! Resource requests and responses between the framework and executors (HCCL's
//! `AlgResourceRequest` / `AlgResourceResponse`), and the task interface executors orchestrate
//! through.
//!
//! Executors never see raw pointers: they address memory as [`Mem`] (a buffer kind plus an
//! offset) and streams/notifies by index. The framework's sink resolves and bounds-checks them
//! and enqueues real runtime tasks; the offline verifier's sink records them instead.

use std::cell::Cell;

pub use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{DataType, ReduceOp, Result};
use ampccl_transport::topology::Topology;

/// The buffers an executor can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufKind {
    /// The user's input (read-only).
    UserIn,
    /// The user's output.
    UserOut,
    /// CCL input buffer: registered window bound to the communicator (peers write into it).
    CclIn,
    /// CCL output buffer: registered window bound to the communicator.
    CclOut,
    /// Private scratch of the size the executor requested.
    Scratch,
}

/// A position in one of the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mem {
    pub buf: BufKind,
    pub off: usize,
}

impl Mem {
    /// Start of `buf`.
    pub const fn of(buf: BufKind) -> Mem {
        Mem { buf, off: 0 }
    }

    /// `bytes` further on.
    pub const fn add(self, bytes: usize) -> Mem {
        Mem {
            buf: self.buf,
            off: self.off + bytes,
        }
    }

    /// True for the registered windows (memory a peer may write into).
    pub const fn is_window(self) -> bool {
        matches!(self.buf, BufKind::CclIn | BufKind::CclOut)
    }
}

/// Index of a stream in an operation: [`MAIN`] or `1..=stream_num` (the side streams).
pub type StreamId = usize;
/// Index of a notify in an operation: `0..notify_num`.
pub type NotifyId = usize;
/// The main stream (the stream the user called on).
pub const MAIN: StreamId = 0;

/// One link an algorithm needs (HCCL `TransportRequest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportRequest {
    /// Build this link (links are built on demand only where valid).
    pub is_valid: bool,
    pub local_rank: usize,
    pub remote_rank: usize,
    /// Memory the local side sends from / the remote side receives into.
    pub input_mem_type: BufKind,
    pub output_mem_type: BufKind,
}

/// Links of one sub-communicator of a level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubCommRequest {
    pub transport_requests: Vec<TransportRequest>,
    pub is_used_rdma: bool,
}

/// What an executor needs before it can orchestrate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgResourceRequest {
    /// Bytes of private scratch.
    pub scratch_mem_size: usize,
    /// Side streams besides the main stream.
    pub stream_num: usize,
    /// Notifies for main/side synchronisation.
    pub notify_num: usize,
    /// Per level (hierarchical algorithms), per sub-communicator, the links.
    pub op_transport: Vec<Vec<SubCommRequest>>,
}

impl AlgResourceRequest {
    /// One flat level whose only sub-communicator links `rank` to each of `peers`.
    pub fn with_peers(rank: usize, peers: impl IntoIterator<Item = usize>) -> AlgResourceRequest {
        let transport_requests = peers
            .into_iter()
            .filter(|&p| p != rank)
            .map(|p| TransportRequest {
                is_valid: true,
                local_rank: rank,
                remote_rank: p,
                input_mem_type: BufKind::CclIn,
                output_mem_type: BufKind::CclIn,
            })
            .collect();
        AlgResourceRequest {
            op_transport: vec![vec![SubCommRequest {
                transport_requests,
                is_used_rdma: false,
            }]],
            ..Default::default()
        }
    }

    /// Links to every other rank.
    pub fn mesh(rank: usize, world: usize) -> AlgResourceRequest {
        Self::with_peers(rank, 0..world)
    }

    /// Links to the ring neighbours.
    pub fn ring(rank: usize, world: usize) -> AlgResourceRequest {
        Self::with_peers(rank, [(rank + 1) % world, (rank + world - 1) % world])
    }

    /// Every remote rank some valid transport request names.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.op_transport
            .iter()
            .flatten()
            .flat_map(|s| &s.transport_requests)
            .filter(|t| t.is_valid)
            .map(|t| t.remote_rank)
    }
}

/// Where executors submit tasks. Every method checks its arguments (bounds, ids, links) and
/// fails with `Error::Internal` on an executor bug instead of touching wrong memory.
#[allow(clippy::too_many_arguments)] // `reduce` mirrors the task it enqueues
pub trait TaskSink {
    /// `len` bytes from `src` to `dst`, stored for who reads them next (`to`:
    /// [`CopyTo::Output`], an operation's output nothing reads again soon, streams from a
    /// smaller size; [`CopyTo::Peer`], a window a peer reads at once, picks the store kind by
    /// measuring). How the bytes are stored changes nothing else.
    fn copy_to(&mut self, s: StreamId, dst: Mem, src: Mem, len: usize, to: CopyTo) -> Result<()>;
    /// `len` bytes from `src` to both destinations, each stored for its reader as by
    /// [`TaskSink::copy_to`], the source read once: what the two copies would do, with one
    /// pass over the source. The destinations are disjoint; one of them may be `src` (in place:
    /// no copy there).
    fn copy_tee(
        &mut self,
        s: StreamId,
        dsts: [(Mem, CopyTo); 2],
        src: Mem,
        len: usize,
    ) -> Result<()>;
    /// [`TaskSink::copy_to`] for this rank ([`CopyTo::Local`]).
    fn copy(&mut self, s: StreamId, dst: Mem, src: Mem, len: usize) -> Result<()> {
        self.copy_to(s, dst, src, len, CopyTo::Local)
    }
    /// `dst = a op b` over `count` elements of `dtype`, `operands` = `(dst, a, b)` (`dst` may
    /// equal `a` or `b`); `out`:
    /// into the operation's output where nothing reads it again soon (a large operation's
    /// final pieces), streaming stores where `dst` is disjoint from `a` and `b`. How the result
    /// is stored changes nothing else.
    fn reduce_to(
        &mut self,
        s: StreamId,
        dtype: DataType,
        op: ReduceOp,
        operands: (Mem, Mem, Mem),
        count: usize,
        out: bool,
    ) -> Result<()>;
    /// [`TaskSink::reduce_to`] into `dst` (not streamed), and the result copied to `also.0`
    /// as well, stored as `also.1` says: what the reduction and a copy would do, the copy
    /// reading each block of the result while it is in the cache. `also.0` is disjoint from
    /// `dst`, and from `a` and `b` unless it is one of them (in place).
    fn reduce_tee(
        &mut self,
        s: StreamId,
        kind: (DataType, ReduceOp),
        operands: (Mem, Mem, Mem),
        count: usize,
        also: (Mem, CopyTo),
    ) -> Result<()>;
    /// [`TaskSink::reduce_to`], not streamed.
    fn reduce(
        &mut self,
        s: StreamId,
        dtype: DataType,
        op: ReduceOp,
        dst: Mem,
        a: Mem,
        b: Mem,
        count: usize,
    ) -> Result<()> {
        self.reduce_to(s, dtype, op, (dst, a, b), count, false)
    }
    /// `dst /= n` over `count` elements (the end of `Avg`).
    fn finish_avg(
        &mut self,
        s: StreamId,
        dtype: DataType,
        dst: Mem,
        count: usize,
        n: usize,
    ) -> Result<()>;
    /// Record notify `n` on stream `s`.
    fn record(&mut self, s: StreamId, n: NotifyId) -> Result<()>;
    /// Make stream `s` wait for the next record of notify `n`.
    fn wait(&mut self, s: StreamId, n: NotifyId) -> Result<()>;
    /// HCCL link primitives with `peer`.
    fn tx_ack(&mut self, s: StreamId, peer: usize) -> Result<()>;
    fn rx_ack(&mut self, s: StreamId, peer: usize) -> Result<()>;
    fn tx_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()>;
    fn rx_async(&mut self, s: StreamId, peer: usize, dst: Mem, len: usize) -> Result<()>;
    fn tx_wait_done(&mut self, s: StreamId, peer: usize) -> Result<()>;
    fn rx_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()>;
    /// Offers `len` bytes at `src` for `peer` to read with its matching `read_async`: numbered
    /// like a receive (the n-th receive or offer from `peer` meets `peer`'s n-th send or read
    /// to us), `src` peer-readable like a receive buffer and unmodified until
    /// `offer_wait_done`.
    fn offer_async(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()>;
    /// Reads `len` bytes into `dst` from `peer`'s matching offer: numbered like a send,
    /// completed with `tx_wait_done`; where this rank copies them, stored for who reads them
    /// next (`to`, as for [`TaskSink::copy_to`]).
    fn read_async(
        &mut self,
        s: StreamId,
        peer: usize,
        dst: Mem,
        len: usize,
        to: CopyTo,
    ) -> Result<()>;
    /// Completes the oldest outstanding offer to `peer` (read as `len` bytes).
    fn offer_wait_done(&mut self, s: StreamId, peer: usize, len: usize) -> Result<()>;
}

/// Which of a rank's user buffers peers map (see [`AlgResourceResponse::shared_user`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedUser {
    pub input: bool,
    pub output: bool,
}

impl SharedUser {
    /// Whether peers reach `b` with plain copies (the windows always; user buffers when
    /// shared).
    pub fn reaches(self, b: BufKind) -> bool {
        match b {
            BufKind::CclIn | BufKind::CclOut => true,
            BufKind::UserIn => self.input,
            BufKind::UserOut => self.output,
            BufKind::Scratch => false,
        }
    }
}

/// The resources handed to an executor's `orchestrate`.
pub struct AlgResourceResponse<'a> {
    /// Bytes of each CCL buffer (the chunk bound for data routed through them).
    pub ccl_in_size: usize,
    pub ccl_out_size: usize,
    pub scratch_size: usize,
    /// Side streams available (`1..=stream_num`) and notifies (`0..notify_num`).
    pub stream_num: usize,
    pub notify_num: usize,
    /// Whether peers can receive straight into user buffers (`rx_async` into `UserOut`).
    pub user_mem_links: bool,
    /// Which of this rank's user buffers lie in shared user memory that peers map
    /// ([`SharedMem`](ampccl_transport::shm::SharedMem)): a receive into one or an offer of
    /// one costs the peer a plain copy, as a window does. Each rank knows only its own; the
    /// peer's side of a transfer follows from what the clear-to-send names.
    pub shared_user: SharedUser,
    /// Bytes of the host's last-level cache (see [`crate::executor::SelectCtx::cache_bytes`]),
    /// 0 if unknown.
    pub cache_bytes: usize,
    /// Which ranks share a host.
    pub topology: &'a Topology,
    /// Where the next receive slot in `CclIn` starts (kept across calls, see
    /// [`crate::steps::window`]).
    pub ccl_in_cursor: &'a Cell<usize>,
    /// Where the tasks go.
    pub tasks: &'a mut dyn TaskSink,
}

impl AlgResourceResponse<'_> {
    /// [`crate::executor::beyond_cache`] on this host.
    pub fn beyond_cache(&self, bytes: usize) -> bool {
        crate::executor::beyond_cache(self.cache_bytes, bytes)
    }

    /// Whether data from `from` is best received straight into `buf` rather than into a
    /// window slot and copied there: where `buf` is shared user memory (the sender's copy is
    /// the only one), or where `from` is on another host and the link receives into any memory
    /// (the receiver's core copies every byte out of its socket wherever it lands, so a slot
    /// would only add a copy).
    pub fn lands_directly(&self, from: usize, buf: BufKind) -> bool {
        self.shared_user.reaches(buf) || self.lands_from_network(from)
    }

    /// The network half of [`AlgResourceResponse::lands_directly`]: `from` is on another host
    /// and the link receives into any memory.
    pub fn lands_from_network(&self, from: usize) -> bool {
        self.user_mem_links && !self.topology.is_local(from)
    }

    /// Whole sends/receives, for executors that do not split the primitives.
    pub fn send(&mut self, s: StreamId, peer: usize, src: Mem, len: usize) -> Result<()> {
        self.tasks.tx_async(s, peer, src, len)?;
        self.tasks.tx_wait_done(s, peer)
    }

    /// See [`AlgResourceResponse::send`].
    pub fn recv(&mut self, s: StreamId, peer: usize, dst: Mem, len: usize) -> Result<()> {
        self.tasks.rx_async(s, peer, dst, len)?;
        self.tasks.rx_wait_done(s, peer, len)
    }
}
