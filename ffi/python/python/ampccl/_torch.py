"""The ``ampccl`` backend of torch.distributed, for CPU tensors.

Registered through the ``torch.distributed.backends`` entry point (``register``), so
``dist.init_process_group("ampccl")`` or ``"cpu:ampccl,cuda:nccl"`` needs no import. Each
process group gets its own communicator: rank 0 of the group makes a unique id and passes it
through the group's store (no port of the launcher's is bound), and the group's timeout
becomes the communicator's.

A call hands tensor addresses to ``ampccl._native.Comm.run_addr`` (torch tensors export no
buffer). A synchronous call (``asyncOp`` false) runs to completion in the backend method with
the GIL released and returns a finished work. An asynchronous one is queued, and the backend's
completion thread waits for its requests in issue order (the order in which a communicator
completes them), copies results out of staging tensors where the call needed one, then
completes the work and its future: futures complete without anyone waiting (DDP chains its
gradient division onto them). Works hold their tensors until then.

torch keeps only the C++ half of a Python backend, so every backend stays referenced from
``_alive`` until its ``shutdown``.
"""

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import ReduceOp

from ampccl import _native
from ampccl._comm import (
    _ALLGATHER,
    _ALLREDUCE,
    _ALLTOALL,
    _BARRIER,
    _BROADCAST,
    _RECV,
    _REDUCE,
    _REDUCESCATTER,
    _SEND,
    DTYPES,
)

_DTYPES = {getattr(torch, name): code for name, code in DTYPES.items() if hasattr(torch, name)}
# Moved (never reduced) as bytes.
_BYTES = {torch.bool: DTYPES["uint8"]}
_OPS = {
    ReduceOp.RedOpType.SUM: 0,
    ReduceOp.RedOpType.PRODUCT: 1,
    ReduceOp.RedOpType.MAX: 2,
    ReduceOp.RedOpType.MIN: 3,
    ReduceOp.RedOpType.AVG: 4,
}
_UID_KEY = "ampccl/unique_id"

_alive = set()


def _check(t):
    if not t.is_cpu:
        raise ValueError(f"ampccl: the ampccl backend takes CPU tensors, got one on {t.device}")
    if not t.is_contiguous():
        raise ValueError("ampccl: tensors must be contiguous")


def _dtype(t, reduces):
    _check(t)
    code = _DTYPES.get(t.dtype)
    if code is None and not reduces:
        code = _BYTES.get(t.dtype)
    if code is None:
        what = "reduces" if reduces else "moves"
        raise TypeError(
            f"ampccl: {t.dtype} is not a type the ampccl backend {what} "
            f"(int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64)"
        )
    return code


def _op(reduce_op):
    code = _OPS.get(reduce_op.op)
    if code is None:
        raise ValueError(
            f"ampccl: reduction {reduce_op.op} is not supported (SUM PRODUCT MIN MAX AVG)"
        )
    return code


def _timeout_s(t):
    """Seconds of a timedelta, or None for torch's "unset" (non-positive) value."""
    s = t.total_seconds() if isinstance(t, timedelta) else None
    return s if s and s > 0 else None


class _Work(dist._Work):
    """An operation's work: done at once (synchronous calls), or pending until the
    completion thread finishes it (only those carry the synchronization, which costs
    microseconds to create)."""

    def __init__(self, result, reqs=(), keep=(), after=None, timeout=None):
        super().__init__()
        self._result = result
        self._error = None
        self._done = None
        if reqs or after is not None:
            self._reqs, self._keep, self._after = reqs, keep, after
            self._timeout = timeout
            self._future = None
            self._lock = threading.Lock()
            self._done = threading.Event()

    def _complete(self):
        """Waits for the requests (completion thread only), then finishes the work."""
        try:
            for r in self._reqs:
                r.wait()
            if self._after is not None:
                self._after()
        except Exception as e:  # noqa: BLE001 - handed to the waiter and the future
            self._error = e
        self._reqs, self._keep = (), ()
        with self._lock:
            self._done.set()
            fut = self._future
        if fut is not None:
            self._settle(fut)

    def _settle(self, fut):
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)

    def wait(self, timeout=None):
        if self._done is not None:
            limit = _timeout_s(timeout) or self._timeout
            if not self._done.wait(limit):
                raise RuntimeError(f"ampccl: operation not complete after {limit} s (timeout)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done is None or self._done.is_set()

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def get_future(self):
        fut = torch.futures.Future()
        if self._done is not None:
            with self._lock:
                if not self._done.is_set():
                    self._future = fut
                    return fut
        self._settle(fut)
        return fut


class _Completer:
    """The thread that completes a backend's asynchronous works in issue order."""

    def __init__(self):
        self._q = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ampccl-completer", daemon=True)
        self._thread.start()

    def _loop(self):
        while (w := self._q.get()) is not None:
            w._complete()

    def add(self, work):
        self._q.put(work)

    def stop(self):
        self._q.put(None)
        self._thread.join()


class AmpcclBackend(_C10dBackend):
    """A torch.distributed backend over one ampccl communicator (see the module docs)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._timeout = _timeout_s(timeout)
        if rank == 0:
            uid = _native.unique_id()
            store.set(_UID_KEY, uid)
        else:
            uid = bytes(store.get(_UID_KEY))
        self._c = _native.Comm.init(uid, rank, size, self._timeout)
        self._options = _C10dBackend.Options("ampccl", timeout=timeout)
        self._completer = _Completer()
        self._seq = 0
        self._coalesced = None
        _alive.add(self)

    def getBackendName(self):
        return "ampccl"

    # Properties the C++ half asks the Python half for (the defaults would ask back).

    @property
    def options(self):
        return self._options

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return True

    def start_coalescing(self):
        """Sends and receives from here to `end_coalescing` are issued there, as one group
        (batch_isend_irecv's exchanges would deadlock one by one)."""
        self._coalesced = []

    def end_coalescing(self):
        ops, self._coalesced = self._coalesced, None
        return self._group(ops, _P2P, [t for _, t, _ in ops], [t for _, t, _ in ops])

    def _set_sequence_number_for_group(self):
        self._seq = 0

    def _get_sequence_number_for_group(self):
        return self._seq

    def _work(self, result, reqs, keep, after, opts):
        """The work of a call whose requests `reqs` (asynchronous) or none (done) it issued.
        Collectives count in the group's sequence number (which DETAIL debug mode compares
        across ranks); point-to-point calls, which pass `_P2P` options, do not."""
        if opts is not _P2P:
            self._seq += 1
        if not reqs and after is None:
            return _Work(result)
        w = _Work(result, reqs, keep, after, _timeout_s(opts.timeout) or self._timeout)
        self._completer.add(w)
        return w

    def _call(self, kind, dt, count, send, recv, opts, result, op=0, root=0, after=None):
        """One operation from tensor `send` into tensor `recv` (None: no such operand)."""
        nb = opts.asyncOp or after is not None
        s = (send.data_ptr(), send.nbytes) if send is not None else (0, 0)
        r = (recv.data_ptr(), recv.nbytes) if recv is not None else (0, 0)
        req = self._c.run_addr(kind, dt, count, *s, *r, op, root, nb)
        if after is not None and not opts.asyncOp:
            req.wait()
            after()
            return self._work(result, (), (), None, opts)
        return self._work(result, (req,) if req else (), (send, recv), after, opts)

    def _group(self, ops, opts, result, keep):
        """Sends and receives `(kind, tensor, peer)` run together."""
        spec = [(k, _dtype(t, False), t.numel(), p, t.data_ptr(), t.nbytes) for k, t, p in ops]
        req = self._c.group_addr(spec, opts.asyncOp)
        return self._work(result, (req,) if req else (), keep, None, opts)

    # Collectives.

    def allreduce(self, tensors, opts):
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        return self._call(
            _ALLREDUCE, _dtype(t, True), t.numel(), t, t, opts, tensors, _op(opts.reduceOp)
        )

    def allreduce_coalesced(self, tensors, opts):
        dt = {_dtype(t, True) for t in tensors}
        if len(dt) != 1:
            raise TypeError("ampccl: coalesced tensors must share one dtype")
        flat = torch.cat([t.view(-1) for t in tensors])

        def unflatten():
            at = 0
            for t in tensors:
                t.view(-1).copy_(flat[at : at + t.numel()])
                at += t.numel()

        return self._call(
            _ALLREDUCE,
            dt.pop(),
            flat.numel(),
            flat,
            flat,
            opts,
            tensors,
            _op(opts.reduceOp),
            after=unflatten,
        )

    def broadcast(self, tensors, opts):
        t = tensors[opts.rootTensor]
        return self._call(
            _BROADCAST, _dtype(t, False), t.numel(), t, t, opts, tensors, root=opts.rootRank
        )

    def reduce(self, tensors, opts):
        t = tensors[opts.rootTensor]
        return self._call(
            _REDUCE,
            _dtype(t, True),
            t.numel(),
            t,
            t,
            opts,
            tensors,
            _op(opts.reduceOp),
            opts.rootRank,
        )

    def _allgather_base(self, output, input, opts):
        return self._call(
            _ALLGATHER, _dtype(input, False), input.numel(), input, output, opts, [output]
        )

    all_gather_single = _allgather_base

    def allgather(self, output_lists, inputs, opts):
        if len(inputs) != 1:
            raise ValueError("ampccl: allgather takes one input tensor per process")
        inp, outs = inputs[0], output_lists[0]
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)

        def scatter_out():
            for o, part in zip(outs, flat.chunk(self.size())):
                o.view(-1).copy_(part)

        return self._call(
            _ALLGATHER,
            _dtype(inp, False),
            inp.numel(),
            inp,
            flat,
            opts,
            output_lists,
            after=scatter_out,
        )

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self._work(outputs, (), (), None, opts)

    def _reduce_scatter_base(self, output, input, opts):
        return self._call(
            _REDUCESCATTER,
            _dtype(output, True),
            output.numel(),
            input,
            output,
            opts,
            [output],
            _op(opts.reduceOp),
        )

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs, input_lists, opts):
        if len(outputs) != 1:
            raise ValueError("ampccl: reduce_scatter takes one output tensor per process")
        out = outputs[0]
        flat = torch.cat([t.reshape(-1) for t in input_lists[0]])
        return self._call(
            _REDUCESCATTER,
            _dtype(out, True),
            out.numel(),
            flat,
            out,
            opts,
            outputs,
            _op(opts.reduceOp),
        )

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self._work(outputs, (), (), None, opts)

    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        n = self.size()
        if not output_splits and not input_splits:
            return self._call(
                _ALLTOALL, _dtype(input, False), input.numel() // n, input, output, opts, [output]
            )
        # Uneven: one send and one receive a peer, of whole rows of the first dimension.
        in_row = input[0].numel() if input.dim() and input.shape[0] else 1
        out_row = output[0].numel() if output.dim() and output.shape[0] else 1
        ins = list(input_splits) or [input.shape[0] // n] * n
        outs = list(output_splits) or [output.shape[0] // n] * n
        fi, fo = input.view(-1), output.view(-1)
        ops, a, b = [], 0, 0
        for peer in range(n):
            ops.append((_SEND, fi[a : a + ins[peer] * in_row], peer))
            ops.append((_RECV, fo[b : b + outs[peer] * out_row], peer))
            a, b = a + ins[peer] * in_row, b + outs[peer] * out_row
        return self._group(ops, opts, [output], (input, output))

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts):
        ops = []
        for peer in range(self.size()):
            ops.append((_SEND, inputs[peer], peer))
            ops.append((_RECV, outputs[peer], peer))
        return self._group(ops, opts, outputs, (inputs, outputs))

    def gather(self, output_lists, inputs, opts):
        root, inp = opts.rootRank, inputs[0]
        if self.rank() != root:
            return self._group([(_SEND, inp, root)], opts, [], (inp,))
        outs = output_lists[0]
        ops = [(_RECV, outs[p], p) for p in range(self.size()) if p != root]
        outs[root].copy_(inp)
        return self._group(ops, opts, output_lists, (inp, outs))

    def scatter(self, outputs, input_lists, opts):
        root, out = opts.rootRank, outputs[0]
        if self.rank() != root:
            return self._group([(_RECV, out, root)], opts, outputs, (out,))
        ins = input_lists[0]
        ops = [(_SEND, ins[p], p) for p in range(self.size()) if p != root]
        out.copy_(ins[root])
        return self._group(ops, opts, outputs, (ins, out))

    def barrier(self, opts):
        req = self._c.run_addr(_BARRIER, 1, 0, 0, 0, 0, 0, 0, 0, opts.asyncOp)
        return self._work([], (req,) if req else (), (), None, opts)

    # Point to point (always asynchronous in torch: isend/irecv, or send/recv that wait).

    def send(self, tensors, dst, tag=0):
        t = tensors[0]
        if self._coalesced is not None:
            self._coalesced.append((_SEND, t, dst))
            return _Work(tensors)
        req = self._c.run_addr(
            _SEND, _dtype(t, False), t.numel(), t.data_ptr(), t.nbytes, 0, 0, 0, dst, True
        )
        return self._work(tensors, (req,), (t,), None, _P2P)

    def recv(self, tensors, src, tag=0):
        t = tensors[0]
        if self._coalesced is not None:
            self._coalesced.append((_RECV, t, src))
            return _Work(tensors)
        req = self._c.run_addr(
            _RECV, _dtype(t, False), t.numel(), 0, 0, t.data_ptr(), t.nbytes, 0, src, True
        )
        return self._work(tensors, (req,), (t,), None, _P2P)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError(
            "ampccl: receiving from any source is not supported; name the source rank"
        )

    def shutdown(self):
        if self in _alive:
            _alive.discard(self)
            self._completer.stop()
            self._c = None

    def abort(self):
        if self._c is not None:
            self._c.abort()
        self.shutdown()


class _P2POptions:
    """Options of point-to-point calls, which torch passes none of."""

    asyncOp = True
    timeout = None


_P2P = _P2POptions()


def _create(store, rank, size, timeout):
    return AmpcclBackend(store, rank, size, timeout)


def register():
    """The entry point: registers the backend as ``ampccl`` for CPU tensors."""
    if "AMPCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("ampccl", _create, devices=["cpu"])
