"""The mpi4py-shaped communicator over ``ampccl._native.Comm``.

Buffers go to the native module as they are (it reads the buffer protocol); this layer only
maps arguments: ``IN_PLACE``, ``[buf, dtype]`` specifications, DLPack objects (viewed through
numpy) and numpy's bfloat16 (ml_dtypes), which exports no buffer and travels as 16-bit words.
Lowercase methods pickle objects and move the bytes with the buffer calls: a length first,
then the payload.
"""

import functools
import operator
import pickle

import numpy as np

from ampccl import _native

# Operation kinds, in the order of the library's OpKind::ALL.
(
    _ALLREDUCE,
    _ALLGATHER,
    _REDUCESCATTER,
    _BROADCAST,
    _REDUCE,
    _ALLTOALL,
    _SEND,
    _RECV,
    _BARRIER,
) = range(9)

SUM, PROD, MAX, MIN, AVG = range(5)

# The library's data types by numpy name, in the order of its DataType.
DTYPES = {
    name: code
    for code, name in enumerate(
        "int8 uint8 int32 uint32 int64 uint64 float16 float32 float64 bfloat16".split()
    )
}
_BF16 = DTYPES["bfloat16"]


class _InPlace:
    """The ``sendbuf`` that makes an operation work in place in ``recvbuf``."""

    def __repr__(self):
        return "ampccl.IN_PLACE"


IN_PLACE = _InPlace()


def _dtype_code(t):
    name = t if isinstance(t, str) else np.dtype(t).name
    try:
        return DTYPES[name]
    except KeyError:
        raise TypeError(f"{name} is not an ampccl data type ({' '.join(DTYPES)})") from None


def _spec(buf):
    """``(object exporting a buffer, data type code or None)`` for a buffer argument."""
    if type(buf) is np.ndarray:
        if buf.dtype.name == "bfloat16":
            return buf.view(np.uint16), _BF16
        return buf, None
    if isinstance(buf, (list, tuple)):
        if len(buf) != 2:
            raise TypeError("a buffer specification is [buffer, dtype]")
        obj, _ = _spec(buf[0])
        return obj, _dtype_code(buf[1])
    if hasattr(buf, "__dlpack__") and not isinstance(buf, (bytes, bytearray, memoryview)):
        try:
            return _spec(np.from_dlpack(buf))
        except (TypeError, RuntimeError, BufferError) as e:
            raise TypeError(f"buffer through DLPack: {e}") from e
    return buf, None


def _reducer(op):
    if callable(op):
        return op
    table = {SUM: operator.add, PROD: operator.mul, MAX: max, MIN: min}
    if op in table:
        return table[op]
    if op == AVG:
        return None
    raise ValueError(f"reduction {op!r} is not SUM PROD MAX MIN AVG or a callable")


class Comm:
    """A communicator (see the package documentation)."""

    __slots__ = ("_c",)

    def __init__(self, native):
        self._c = native

    @classmethod
    def from_env(cls):
        """Joins the job the launcher started."""
        return cls(_native.Comm.from_env())

    @classmethod
    def init(cls, uid, rank, size, timeout=None):
        """Joins the communicator of ``size`` ranks named by ``uid`` (``ampccl.unique_id()``)
        as ``rank``; ``timeout`` in seconds (default ``AMPCCL_TIMEOUT_S``)."""
        return cls(_native.Comm.init(bytes(uid), rank, size, timeout))

    @property
    def rank(self):
        return self._c.rank

    @property
    def size(self):
        return self._c.size

    @property
    def local_rank(self):
        return self._c.local_rank

    @property
    def transport(self):
        return self._c.transport

    def Get_rank(self):
        return self._c.rank

    def Get_size(self):
        return self._c.size

    def Split(self, color=0, key=0):
        """Sub-communicator of the ranks of equal ``color`` (ordered by ``key``, then rank);
        ``None`` for a negative color. Collective."""
        sub = self._c.split(color, key)
        return None if sub is None else Comm(sub)

    split = Split

    def Abort(self):
        self._c.abort()

    def _run(self, kind, sendbuf, recvbuf, op=SUM, root=0, nonblocking=False):
        send = None if sendbuf is IN_PLACE or sendbuf is None else _spec(sendbuf)
        recv = None if recvbuf is None else _spec(recvbuf)
        if send is None and recv is None:
            raise ValueError("no buffer: pass a send and a receive buffer, or IN_PLACE and one")
        dtype = next((s[1] for s in (send, recv) if s is not None and s[1] is not None), None)
        return self._c.run(
            kind,
            None if send is None else send[0],
            None if recv is None else recv[0],
            op,
            root,
            dtype,
            nonblocking,
        )

    # Buffers. Operations, sends and receives included, run one after the other in the order
    # they were issued (as NCCL's); a send and a receive that depend on each other go together
    # through Sendrecv or Group.
    # In place (``IN_PLACE`` as the send buffer) follows NCCL: allgather's input is
    # this rank's block of ``recvbuf``, reduce-scatter's result lands in it.

    def Allreduce(self, sendbuf, recvbuf, op=SUM):
        self._run(_ALLREDUCE, sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM):
        return self._run(_ALLREDUCE, sendbuf, recvbuf, op, nonblocking=True)

    def Allgather(self, sendbuf, recvbuf):
        self._run(_ALLGATHER, sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf):
        return self._run(_ALLGATHER, sendbuf, recvbuf, nonblocking=True)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        self._run(_REDUCESCATTER, sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        return self._run(_REDUCESCATTER, sendbuf, recvbuf, op, nonblocking=True)

    def Bcast(self, buf, root=0):
        self._run(_BROADCAST, IN_PLACE, buf, root=root)

    def Ibcast(self, buf, root=0):
        return self._run(_BROADCAST, IN_PLACE, buf, root=root, nonblocking=True)

    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0):
        """``recvbuf`` matters on ``root`` only (others may pass ``None``)."""
        self._run(_REDUCE, sendbuf, recvbuf, op, root)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root=0):
        return self._run(_REDUCE, sendbuf, recvbuf, op, root, nonblocking=True)

    def Alltoall(self, sendbuf, recvbuf):
        self._run(_ALLTOALL, sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf):
        return self._run(_ALLTOALL, sendbuf, recvbuf, nonblocking=True)

    def Send(self, buf, dest):
        self._run(_SEND, buf, None, root=dest)

    def Isend(self, buf, dest):
        return self._run(_SEND, buf, None, root=dest, nonblocking=True)

    def Recv(self, buf, source):
        self._run(_RECV, None, buf, root=source)

    def Irecv(self, buf, source):
        return self._run(_RECV, None, buf, root=source, nonblocking=True)

    def Sendrecv(self, sendbuf, dest, recvbuf, source):
        """Sends ``sendbuf`` to ``dest`` and receives ``recvbuf`` from ``source`` together."""
        self._group([(_SEND, sendbuf, dest), (_RECV, recvbuf, source)], False)

    def Isendrecv(self, sendbuf, dest, recvbuf, source):
        return self._group([(_SEND, sendbuf, dest), (_RECV, recvbuf, source)], True)

    def Group(self, ops, nonblocking=False):
        """Runs sends and receives together: ``ops`` of ``("send", buf, dest)`` and
        ``("recv", buf, source)``; a request when ``nonblocking``."""
        kinds = {"send": _SEND, "recv": _RECV}
        try:
            ops = [(kinds[k], b, p) for k, b, p in ops]
        except KeyError as e:
            raise ValueError(f"a group holds 'send' and 'recv' operations, not {e}") from None
        return self._group(ops, nonblocking)

    def _group(self, ops, nonblocking):
        specs = [(k, _spec(b), p) for k, b, p in ops]
        dtype = next((s[1] for _, s, _ in specs if s[1] is not None), None)
        return self._c.group([(k, s[0], p) for k, s, p in specs], dtype, nonblocking)

    def Barrier(self):
        self._c.run(_BARRIER, None, None)

    def Ibarrier(self):
        return self._c.run(_BARRIER, None, None, nonblocking=True)

    # Picklable objects.

    def barrier(self):
        self.Barrier()

    def bcast(self, obj, root=0):
        data = pickle.dumps(obj) if self.rank == root else b""
        n = np.array([len(data)], dtype=np.int64)
        self.Bcast(n, root)
        buf = bytearray(data) if self.rank == root else bytearray(int(n[0]))
        self.Bcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf)

    def allgather(self, obj):
        data = pickle.dumps(obj)
        lens = np.empty(self.size, dtype=np.int64)
        self.Allgather(np.array([len(data)], dtype=np.int64), lens)
        width = int(lens.max())
        out = bytearray(width * self.size)
        self.Allgather(data.ljust(width, b"\0"), out)
        return [pickle.loads(out[i * width : i * width + int(n)]) for i, n in enumerate(lens)]

    def gather(self, obj, root=0):
        objs = self.allgather(obj)
        return objs if self.rank == root else None

    def scatter(self, objs, root=0):
        if self.rank == root and (objs is None or len(objs) != self.size):
            raise ValueError(f"scatter needs a sequence of {self.size} objects on the root")
        return self.bcast(objs, root)[self.rank]

    def alltoall(self, objs):
        if objs is None or len(objs) != self.size:
            raise ValueError(f"alltoall needs a sequence of {self.size} objects")
        return [row[self.rank] for row in self.allgather(list(objs))]

    def allreduce(self, obj, op=SUM):
        f = _reducer(op)
        objs = self.allgather(obj)
        if f is None:
            return functools.reduce(operator.add, objs) / self.size
        return functools.reduce(f, objs)

    def reduce(self, obj, op=SUM, root=0):
        r = self.allreduce(obj, op)
        return r if self.rank == root else None

    def send(self, obj, dest):
        data = pickle.dumps(obj)
        self.Send(np.array([len(data)], dtype=np.int64), dest)
        self.Send(data, dest)

    def recv(self, source):
        n = np.empty(1, dtype=np.int64)
        self.Recv(n, source)
        buf = bytearray(int(n[0]))
        self.Recv(buf, source)
        return pickle.loads(buf)
