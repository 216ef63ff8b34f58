"""One rank of the Python ctypes client of libampccl.so (launched by ffi/tests/c_client.rs
with AMPCCL_LIB, AMPCCL_UNIQUE_ID (hex), RANK, WORLD_SIZE): allreduce, allgather, broadcast,
grouped send/recv on a stream, and the error codes. Standard library only."""

import ctypes as C
import os
import sys
from array import array

SUCCESS, INVALID_ARGUMENT, IN_PROGRESS = 0, 4, 7
INT32, FLOAT32, FLOAT64 = 2, 7, 8
SUM, MAX = 0, 2

lib = C.CDLL(os.environ["AMPCCL_LIB"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 128)]


vp, cp = C.c_void_p, C.c_char_p
lib.ampcclGetErrorString.restype = cp
lib.ampcclGetLastError.restype = cp
lib.ampcclGetLastError.argtypes = [vp]
lib.ampcclUniqueIdFromString.argtypes = [cp, C.POINTER(UniqueId)]
lib.ampcclCommInitRank.argtypes = [C.POINTER(vp), C.c_int, UniqueId, C.c_int]
for name, extra in [
    ("ampcclAllReduce", [vp, vp, C.c_size_t, C.c_int, C.c_int]),
    ("ampcclAllGather", [vp, vp, C.c_size_t, C.c_int]),
    ("ampcclBroadcast", [vp, vp, C.c_size_t, C.c_int, C.c_int]),
    ("ampcclSend", [vp, C.c_size_t, C.c_int, C.c_int]),
    ("ampcclRecv", [vp, C.c_size_t, C.c_int, C.c_int]),
]:
    getattr(lib, name).argtypes = extra + [vp, vp]
for name in ["ampcclStreamSynchronize", "ampcclStreamQuery", "ampcclStreamDestroy",
             "ampcclCommDestroy", "ampcclCommSynchronize"]:
    getattr(lib, name).argtypes = [vp]


def check(r, what):
    if r != SUCCESS:
        err = lib.ampcclGetLastError(None).decode()
        sys.exit(f"rank {rank}: {what} -> {r} ({lib.ampcclGetErrorString(r).decode()}): {err}")


def addr(a):
    return a.buffer_info()[0]


uid = UniqueId()
check(lib.ampcclUniqueIdFromString(os.environ["AMPCCL_UNIQUE_ID"].encode(), C.byref(uid)),
      "UniqueIdFromString")
comm = vp()
check(lib.ampcclCommInitRank(C.byref(comm), world, uid, rank), "CommInitRank")
stream = vp()
check(lib.ampcclStreamCreate(C.byref(stream)), "StreamCreate")

n = 1000
send = array("f", [rank + i for i in range(n)])
recv = array("f", [0.0] * n)
check(lib.ampcclAllReduce(addr(send), addr(recv), n, FLOAT32, SUM, comm, stream), "AllReduce")
check(lib.ampcclStreamSynchronize(stream), "StreamSynchronize")
assert all(recv[i] == world * (world - 1) / 2 + world * i for i in range(n)), "allreduce"
check(lib.ampcclStreamQuery(stream), "StreamQuery")

mine = array("i", [rank * 100 + i for i in range(7)])
every = array("i", [0] * (7 * world))
check(lib.ampcclAllGather(addr(mine), addr(every), 7, INT32, comm, None), "AllGather")
check(lib.ampcclCommSynchronize(comm), "CommSynchronize")
assert list(every) == [r * 100 + i for r in range(world) for i in range(7)], "allgather"

buf = array("d", [3.5 * i if rank == 0 else 0.0 for i in range(33)])
check(lib.ampcclBroadcast(addr(buf), addr(buf), 33, FLOAT64, 0, comm, stream), "Broadcast")
check(lib.ampcclStreamSynchronize(stream), "StreamSynchronize")
assert list(buf) == [3.5 * i for i in range(33)], "broadcast"

nxt, prv = (rank + 1) % world, (rank - 1) % world
out, inc = array("i", [rank] * 5), array("i", [-1] * 5)
check(lib.ampcclGroupStart(), "GroupStart")
check(lib.ampcclSend(addr(out), 5, INT32, nxt, comm, stream), "Send")
check(lib.ampcclRecv(addr(inc), 5, INT32, prv, comm, stream), "Recv")
check(lib.ampcclGroupEnd(), "GroupEnd")
check(lib.ampcclStreamSynchronize(stream), "StreamSynchronize")
assert list(inc) == [prv] * 5, "send/recv"

r = lib.ampcclAllReduce(None, addr(recv), n, FLOAT32, SUM, comm, stream)
assert r == INVALID_ARGUMENT and b"null" in lib.ampcclGetLastError(None), r
r = lib.ampcclAllReduce(addr(send), addr(recv), n, 99, SUM, comm, stream)
assert r == INVALID_ARGUMENT and b"datatype 99" in lib.ampcclGetLastError(None), r
assert lib.ampcclGetErrorString(IN_PROGRESS) == b"operation in progress"

check(lib.ampcclStreamDestroy(stream), "StreamDestroy")
check(lib.ampcclCommDestroy(comm), "CommDestroy")
print(f"rank {rank} of {world}: Python client passed")
