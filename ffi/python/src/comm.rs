//! `Comm`: a communicator for Python. Every call goes to the communicator's default stream, so
//! blocking and nonblocking calls run in issue order. A blocking call runs as the Rust API's
//! blocking calls do (`Communicator::run_sized`: a single-stream operation on an idle
//! communicator runs on the calling thread, without waking the engine), with the GIL released;
//! a nonblocking one is queued for the engine (`Communicator::enqueue_sized`) and returns a
//! request.
//!
//! Two forms: `run` takes objects exporting the buffer protocol (counts follow from their
//! lengths, the data type from their format); `run_addr` takes addresses with byte lengths
//! and an explicit count, for the torch backend, whose tensors export no buffer.

use std::time::Duration;

use ampccl::op::OpKind;
use ampccl::registry::Registry;
use ampccl::{Communicator, Config, DataType, OpSpec, ReduceOp, SizedOp, UniqueId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::Operand;
use crate::py_err;
use crate::request::Request;

/// A communicator (see the module documentation). Thread-safe; calls from several threads
/// are ordered by issue time and must come in the same order on every rank.
#[pyclass(frozen, module = "ampccl._native")]
pub struct Comm {
    comm: Communicator,
}

fn kind(k: usize) -> PyResult<OpKind> {
    OpKind::ALL
        .get(k)
        .copied()
        .ok_or_else(|| PyValueError::new_err(format!("operation kind {k} is not one of 0..9")))
}

fn dtype(t: i32) -> PyResult<DataType> {
    DataType::from_raw(t)
        .ok_or_else(|| PyValueError::new_err(format!("data type {t} is not one of 0..10")))
}

fn reduce_op(o: i32) -> PyResult<ReduceOp> {
    ReduceOp::from_raw(o).ok_or_else(|| {
        PyValueError::new_err(format!(
            "reduction {o} is not one of SUM PROD MAX MIN AVG (0..5)"
        ))
    })
}

/// One operand's part of an operation: address and byte length (null and 0 for none).
#[derive(Clone, Copy)]
struct Span {
    ptr: *mut u8,
    len: usize,
}

const NONE: Span = Span {
    ptr: std::ptr::null_mut(),
    len: 0,
};

impl Span {
    fn of(o: &Operand) -> Span {
        Span {
            ptr: o.ptr,
            len: o.bytes,
        }
    }
    /// The `n`-byte block at byte `at` of this span (an in-place operand inside the other).
    fn block(self, at: usize, n: usize) -> Span {
        Span {
            ptr: self.ptr.wrapping_add(at),
            len: n.min(self.len.saturating_sub(at)),
        }
    }
}

impl Comm {
    /// Submits `ops` (one operation, or sends and receives issued together); blocking unless
    /// `nonblocking` (then the request holds `bufs`).
    ///
    /// # Safety
    /// The ops' regions must stay valid for their lengths (outputs for exclusive writes) until
    /// the operation completes: until this returns when blocking, else while the request,
    /// which holds `bufs`, is pending (or as the caller of `run_addr` promises).
    unsafe fn submit(
        &self,
        py: Python<'_>,
        ops: &[SizedOp],
        bufs: Vec<Operand>,
        nonblocking: bool,
    ) -> PyResult<Option<Request>> {
        if !nonblocking {
            let ops = Blocking(ops);
            // SAFETY: forwarded from the caller; the operation is complete when this returns.
            py.detach(move || unsafe { ops.run(&self.comm) })
                .map_err(py_err)?;
            drop(bufs);
            return Ok(None);
        }
        let stream = self.comm.default_stream();
        // SAFETY: forwarded from the caller.
        let ev = unsafe { self.comm.enqueue_sized(stream, ops) }.map_err(py_err)?;
        stream.kick();
        Ok(Some(Request::new(
            ev,
            bufs.into_iter().map(|o| o.buf).collect(),
        )))
    }
}

/// The operations of a blocking call, handed to the same thread's GIL-free section.
struct Blocking<'a>(&'a [SizedOp]);

// SAFETY: the addresses are only dereferenced by the library during `run_sized`, which the
// thread that owns the buffers (and holds their exports) waits for; nothing outlives it.
unsafe impl Send for Blocking<'_> {}

impl Blocking<'_> {
    /// # Safety
    /// As `Communicator::run_sized`.
    unsafe fn run(&self, comm: &Communicator) -> ampccl::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { comm.run_sized(self.0) }
    }
}

fn sized(spec: OpSpec, input: Span, output: Span) -> SizedOp {
    SizedOp {
        spec,
        send: input.ptr,
        send_len: input.len,
        recv: output.ptr,
        recv_len: output.len,
    }
}

#[pymethods]
impl Comm {
    /// Joins the job its launcher started (torchrun, mpirun, `ampccl-run`, `AMPCCL_UNIQUE_ID`,
    /// `MASTER_ADDR`/`RANK`/`WORLD_SIZE`), as `Communicator::from_env`.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Comm> {
        let comm = py.detach(Communicator::from_env).map_err(py_err)?;
        Ok(Comm { comm })
    }

    /// Joins the communicator of `size` ranks named by unique id `id` (bytes) as `rank`;
    /// `timeout_s` replaces `AMPCCL_TIMEOUT_S` for its rendezvous and operations.
    #[staticmethod]
    #[pyo3(signature = (id, rank, size, timeout_s = None))]
    fn init(
        py: Python<'_>,
        id: &[u8],
        rank: usize,
        size: usize,
        timeout_s: Option<f64>,
    ) -> PyResult<Comm> {
        let id = UniqueId::from_bytes(id).map_err(py_err)?;
        let mut config = Config::from_env().map_err(py_err)?;
        if let Some(t) = timeout_s {
            config.timeout = Duration::try_from_secs_f64(t)
                .map_err(|_| PyValueError::new_err(format!("timeout {t} s is not a duration")))?;
        }
        let comm = py
            .detach(|| Communicator::init_with(&id, rank, size, config, Registry::builtin()))
            .map_err(py_err)?;
        Ok(Comm { comm })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    #[getter]
    fn size(&self) -> usize {
        self.comm.world()
    }

    #[getter]
    fn local_rank(&self) -> usize {
        self.comm.local_rank()
    }

    /// The transport provider connecting the ranks (`shm`, `tcp`).
    #[getter]
    fn transport(&self) -> &'static str {
        self.comm.transport_name()
    }

    /// Sub-communicator of the ranks passing the same `color`, ordered by `key` then rank;
    /// `None` for a negative color. Collective.
    fn split(&self, py: Python<'_>, color: i32, key: i32) -> PyResult<Option<Comm>> {
        let sub = py.detach(|| self.comm.split(color, key)).map_err(py_err)?;
        Ok(sub.map(|comm| Comm { comm }))
    }

    /// Fails queued and running operations and tells the peers (`ncclCommAbort`).
    fn abort(&self) {
        self.comm.abort();
    }

    /// The first error this communicator met, as its message, or `None`.
    fn async_error(&self) -> Option<String> {
        self.comm.async_error().map(|e| e.to_string())
    }

    /// Operation `kind` (index of `OpKind::ALL`) on buffer-protocol objects. `send` `None`:
    /// in place in `recv` at NCCL's positions (allgather: this rank's block of `recv` is the
    /// input; reduce-scatter: the result lands in this rank's block of `recv`). Counts follow
    /// from the lengths (allgather, reduce, allreduce, sends: the input's; reduce-scatter,
    /// receives, broadcast: the output's; all-to-all: the input's over the ranks). `dtype`
    /// overrides the type the buffers' format names. Returns a request when `nonblocking`.
    #[pyo3(signature = (kind, send, recv, op = 0, root = 0, dtype = None, nonblocking = false))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        kind: usize,
        send: Option<&Bound<'_, PyAny>>,
        recv: Option<&Bound<'_, PyAny>>,
        op: i32,
        root: usize,
        dtype: Option<i32>,
        nonblocking: bool,
    ) -> PyResult<Option<Request>> {
        let k = self::kind(kind)?;
        let forced = dtype.map(self::dtype).transpose()?;
        let input = send
            .map(|b| Operand::get(b, "input", false, forced))
            .transpose()?;
        let writes = !matches!(k, OpKind::Send | OpKind::Barrier);
        let output = recv
            .map(|b| Operand::get(b, "output", writes, forced))
            .transpose()?;
        let t = match (&input, &output) {
            (Some(i), Some(o)) if i.dtype != o.dtype => {
                return Err(PyValueError::new_err(format!(
                    "input holds {} but output {}",
                    i.dtype.name(),
                    o.dtype.name()
                )));
            }
            (Some(b), _) | (None, Some(b)) => b.dtype,
            (None, None) => DataType::U8,
        };
        let world = self.comm.world();
        let e = t.size();
        let (n_in, n_out) = (
            input.as_ref().map_or(0, Operand::count),
            output.as_ref().map_or(0, Operand::count),
        );
        let whole = |n: usize| {
            if n.is_multiple_of(world) {
                Ok(n / world)
            } else {
                Err(PyValueError::new_err(format!(
                    "buffer of {n} elements does not split into {world} equal blocks"
                )))
            }
        };
        let (si, so) = (
            input.as_ref().map_or(NONE, Span::of),
            output.as_ref().map_or(NONE, Span::of),
        );
        let in_place = input.is_none();
        let rank = self.comm.rank();
        let (count, si, so) = match k {
            OpKind::AllReduce | OpKind::Reduce | OpKind::Broadcast if in_place => (n_out, so, so),
            OpKind::AllReduce | OpKind::Reduce | OpKind::Send => (n_in, si, so),
            OpKind::Broadcast | OpKind::Recv => (n_out, si, so),
            OpKind::AllGather if in_place => {
                let n = whole(n_out)?;
                (n, so.block(rank * n * e, n * e), so)
            }
            OpKind::AllGather => (n_in, si, so),
            OpKind::ReduceScatter if in_place => {
                let n = whole(n_out)?;
                (n, so, so.block(rank * n * e, n * e))
            }
            OpKind::ReduceScatter => (n_out, si, so),
            OpKind::AllToAll if in_place => (whole(n_out)?, so, so),
            OpKind::AllToAll => (whole(n_in)?, si, so),
            OpKind::Barrier => (0, NONE, NONE),
        };
        let spec = OpSpec::new(k, count, t).op(reduce_op(op)?).root(root);
        let bufs = input.into_iter().chain(output).collect();
        // SAFETY: the spans lie in the exported buffers `bufs`, which `submit` keeps until the
        // operation completes (the exports keep the objects alive and, for numpy, unresized).
        unsafe { self.submit(py, &[sized(spec, si, so)], bufs, nonblocking) }
    }

    /// Operation `kind` of `count` elements of `dtype` on memory at addresses `send`/`recv`
    /// of `send_len`/`recv_len` bytes (0 and 0 for none), for ampccl's torch backend: the
    /// caller keeps that memory alive and untouched until the call returns, or for a
    /// nonblocking call until its request completes (the backend holds the tensors).
    #[pyo3(signature = (kind, dtype, count, send, send_len, recv, recv_len, op = 0, root = 0, nonblocking = false))]
    #[allow(clippy::too_many_arguments)]
    fn run_addr(
        &self,
        py: Python<'_>,
        kind: usize,
        dtype: i32,
        count: usize,
        send: usize,
        send_len: usize,
        recv: usize,
        recv_len: usize,
        op: i32,
        root: usize,
        nonblocking: bool,
    ) -> PyResult<Option<Request>> {
        let spec = OpSpec::new(self::kind(kind)?, count, self::dtype(dtype)?)
            .op(reduce_op(op)?)
            .root(root);
        let op = sized(spec, span(send, send_len), span(recv, recv_len));
        // SAFETY: the caller's promise above (the torch backend passes tensors it holds).
        unsafe { self.submit(py, &[op], Vec::new(), nonblocking) }
    }

    /// Sends and receives on buffer-protocol objects run together (as a group, so exchanges
    /// that would deadlock one by one work): each `(kind, buffer, peer)` with kind Send or
    /// Recv; `dtype` as for `run`.
    #[pyo3(signature = (ops, dtype = None, nonblocking = false))]
    fn group(
        &self,
        py: Python<'_>,
        ops: Vec<(usize, Bound<'_, PyAny>, usize)>,
        dtype: Option<i32>,
        nonblocking: bool,
    ) -> PyResult<Option<Request>> {
        let forced = dtype.map(self::dtype).transpose()?;
        let mut bufs = Vec::with_capacity(ops.len());
        let mut sized = Vec::with_capacity(ops.len());
        for (k, obj, peer) in &ops {
            let k = kind(*k)?;
            let o = Operand::get(obj, "group", k == OpKind::Recv, forced)?;
            sized.push(p2p(k, o.dtype, o.count(), *peer, Span::of(&o))?);
            bufs.push(o);
        }
        if sized.is_empty() {
            return Ok(None);
        }
        // SAFETY: the spans lie in the exported buffers `bufs`, held as in `run`.
        unsafe { self.submit(py, &sized, bufs, nonblocking) }
    }

    /// As `group` on memory as `run_addr`'s: each `(kind, dtype, count, peer, addr, len)`.
    #[pyo3(signature = (ops, nonblocking = false))]
    fn group_addr(
        &self,
        py: Python<'_>,
        ops: Vec<(usize, i32, usize, usize, usize, usize)>,
        nonblocking: bool,
    ) -> PyResult<Option<Request>> {
        let ops = ops
            .into_iter()
            .map(|(k, t, count, peer, addr, len)| {
                p2p(kind(k)?, dtype(t)?, count, peer, span(addr, len))
            })
            .collect::<PyResult<Vec<_>>>()?;
        if ops.is_empty() {
            return Ok(None);
        }
        // SAFETY: the caller's promise (as for `run_addr`).
        unsafe { self.submit(py, &ops, Vec::new(), nonblocking) }
    }
}

/// A send of `span` to `peer`, or a receive into it from `peer`, for a group.
fn p2p(k: OpKind, t: DataType, count: usize, peer: usize, span: Span) -> PyResult<SizedOp> {
    let spec = OpSpec::new(k, count, t).root(peer);
    match k {
        OpKind::Send => Ok(sized(spec, span, NONE)),
        OpKind::Recv => Ok(sized(spec, NONE, span)),
        _ => Err(PyValueError::new_err(format!(
            "a group holds sends and receives, not {}",
            k.name()
        ))),
    }
}

/// Memory at address `a` of `len` bytes (from Python).
fn span(a: usize, len: usize) -> Span {
    Span {
        ptr: a as *mut u8,
        len,
    }
}
