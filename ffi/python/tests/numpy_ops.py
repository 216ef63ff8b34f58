"""The ampccl package on numpy buffers, under any launcher (ampccl-run -n N): every operation,
type and reduction, in and out of place, blocking and not, counts 0, 1, primes and not
divisible by the number of ranks; objects; split; and the errors bad input raises.

Prints "numpy-ok rank=R world=N" at the end.
"""

import numpy as np

import ampccl

c = ampccl.COMM_WORLD
rank, world = c.rank, c.size

TYPES = "int8 uint8 int32 uint32 int64 uint64 float16 float32 float64 bfloat16".split()
REDUCE = {
    ampccl.SUM: lambda xs: np.sum(xs, axis=0),
    ampccl.PROD: lambda xs: np.prod(xs, axis=0),
    ampccl.MAX: lambda xs: np.max(xs, axis=0),
    ampccl.MIN: lambda xs: np.min(xs, axis=0),
}
COUNTS = [0, 1, 7, 13, 1009, 4 * world + 1]


def value(r, n, t):
    """Rank r's values of type t: small integers, so every reduction is exact. bfloat16
    travels as its 16-bit words (numpy has no bfloat16 without ml_dtypes)."""
    v = ((np.arange(n) + r) % 3 + 1).astype(np.float32)
    if t == "bfloat16":
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(t)


def real(a, t):
    """Values of a buffer of type t as float64 (bfloat16 words widened)."""
    if t == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def spec(a, t):
    return [a, "bfloat16"] if t == "bfloat16" else a


def expect(got, want, t, what):
    assert np.array_equal(real(got, t), want), f"{what} {t}: {got[:6]} != {want[:6]}"


def inputs(n, t):
    return [real(value(r, n, t), t) for r in range(world)]


for t in TYPES:
    for n in COUNTS:
        for op, f in REDUCE.items():
            want = f(inputs(n, t))
            out = np.empty_like(value(rank, n, t))
            c.Allreduce(spec(value(rank, n, t), t), spec(out, t), op)
            expect(out, want, t, f"Allreduce {op} {n}")
            buf = value(rank, n, t)
            c.Allreduce(ampccl.IN_PLACE, spec(buf, t), op)
            expect(buf, want, t, f"Allreduce in place {op} {n}")
            buf = value(rank, n, t)
            c.Iallreduce(ampccl.IN_PLACE, spec(buf, t), op).wait()
            expect(buf, want, t, f"Iallreduce {op} {n}")
        if t.startswith("float") or t == "bfloat16":
            out = np.empty_like(value(rank, n, t))
            c.Allreduce(spec(value(rank, n, t), t), spec(out, t), ampccl.AVG)
            want = np.sum(inputs(n, t), axis=0) / world
            assert np.allclose(real(out, t), want, rtol=1e-2), f"AVG {t} {n}"
        # Allgather, out of place and in place (this rank's block of the output is the input).
        want = np.concatenate(inputs(n, t))
        out = np.empty(n * world, dtype=value(0, 0, t).dtype)
        c.Allgather(spec(value(rank, n, t), t), spec(out, t))
        expect(out, want, t, "Allgather")
        buf = np.zeros_like(out)
        buf[rank * n : (rank + 1) * n] = value(rank, n, t)
        c.Iallgather(ampccl.IN_PLACE, spec(buf, t)).wait()
        expect(buf, want, t, "Iallgather in place")
        # Reduce-scatter: out of place, and in place (the result is this rank's block).
        full = [value(rank + j, n, t) for j in range(world)]
        want = np.sum([real(value(r + rank, n, t), t) for r in range(world)], axis=0)
        out = np.empty_like(value(rank, n, t))
        c.Reduce_scatter_block(spec(np.concatenate(full), t), spec(out, t))
        expect(out, want, t, "Reduce_scatter_block")
        buf = np.concatenate(full)
        c.Reduce_scatter_block(ampccl.IN_PLACE, spec(buf, t))
        expect(buf[rank * n : (rank + 1) * n], want, t, "Reduce_scatter_block in place")
        # Broadcast and reduce from every root.
        for root in range(world):
            buf = value(rank, n, t)
            c.Bcast(spec(buf, t), root)
            expect(buf, real(value(root, n, t), t), t, "Bcast")
            out = np.empty_like(buf) if rank == root else None
            c.Reduce(
                spec(value(rank, n, t), t), None if out is None else spec(out, t), ampccl.MAX, root
            )
            if rank == root:
                expect(out, np.max(inputs(n, t), axis=0), t, "Reduce")
        # All-to-all: block j of the input goes to rank j.
        send = np.concatenate([value(10 * rank + j, n, t) for j in range(world)])
        out = np.empty_like(send)
        c.Ialltoall(spec(send, t), spec(out, t)).wait()
        want = np.concatenate([real(value(10 * j + rank, n, t), t) for j in range(world)])
        expect(out, want, t, "Alltoall")

# Sends and receives around the ring, issued together.
right, left = (rank + 1) % world, (rank - 1) % world
for n in [0, 1, 1009, 300000]:
    got = np.empty(n, dtype=np.float64)
    c.Sendrecv(np.full(n, rank, dtype=np.float64), right, got, left)
    assert np.all(got == left), f"ring of {n}"
    got[:] = -1
    c.Group(
        [("send", np.full(n, rank, dtype=np.float64), right), ("recv", got, left)], nonblocking=True
    ).wait()
    assert np.all(got == left), f"group ring of {n}"
if world > 1:
    if rank == 0:
        c.Send(np.arange(5, dtype=np.int32), 1)
    elif rank == 1:
        got = np.empty(5, dtype=np.int32)
        c.Recv(got, 0)
        assert np.array_equal(got, np.arange(5)), got
c.Barrier()
req = c.Ibarrier()
req.wait()
assert req.test()

# numpy's own bfloat16 (ml_dtypes), which exports no buffer: it travels as 16-bit words.
import ml_dtypes  # noqa: E402

h = np.full(5, rank + 1.5, dtype=ml_dtypes.bfloat16)
c.Allreduce(ampccl.IN_PLACE, h)
assert h.dtype == ml_dtypes.bfloat16 and np.all(
    h.astype(np.float32) == sum(r + 1.5 for r in range(world))
), h

# Other buffer kinds: bytearray, memoryview, DLPack.


class OnlyDLPack:
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


b = bytearray([rank + 1] * 3)
c.Allreduce(ampccl.IN_PLACE, memoryview(b))
assert list(b) == [world * (world + 1) // 2] * 3, list(b)
a = np.full(4, rank + 1.0, dtype=np.float32)
c.Allreduce(ampccl.IN_PLACE, OnlyDLPack(a))
assert np.all(a == world * (world + 1) / 2), a

# Objects.
assert c.bcast({"from": rank}, root=world - 1) == {"from": world - 1}
assert c.allgather(("r", rank)) == [("r", r) for r in range(world)]
assert c.allreduce(rank + 1) == world * (world + 1) // 2
assert c.allreduce([rank], op=lambda x, y: x + y) == list(range(world))
assert c.allreduce(float(rank), op=ampccl.AVG) == (world - 1) / 2
assert c.reduce(rank, op=ampccl.MAX, root=0) == (world - 1 if rank == 0 else None)
assert c.gather(rank * 2, root=0) == ([2 * r for r in range(world)] if rank == 0 else None)
assert c.scatter([f"x{r}" for r in range(world)] if rank == 0 else None, root=0) == f"x{rank}"
assert c.alltoall([(rank, j) for j in range(world)]) == [(j, rank) for j in range(world)]
if world > 1:
    if rank == 0:
        c.send({"big": list(range(1000))}, 1)
    elif rank == 1:
        assert c.recv(0) == {"big": list(range(1000))}

# Split: even and odd ranks, ordered by descending rank.
sub = c.Split(rank % 2, -rank)
members = [r for r in range(world) if r % 2 == rank % 2]
assert sub.size == len(members) and sub.rank == sorted(members, reverse=True).index(rank)
assert sub.allgather(rank) == sorted(members, reverse=True)
rest = c.Split(-1 if rank == 0 else 0)
assert (rest is None) == (rank == 0) and (rest is None or rest.size == world - 1)


# Errors: a clear Python exception, and the communicator still works afterwards.
def raises(kind, f, words):
    try:
        f()
    except kind as e:
        assert all(w in str(e) for w in words), f"{e!r} does not name {words}"
    else:
        raise AssertionError(f"no {kind.__name__} for {words}")


f32 = np.ones(4, dtype=np.float32)
raises(
    ampccl.AmpcclError,
    lambda: c.Allreduce(f32, np.empty(3, dtype=np.float32)),
    ["output buffer", "needs 16"],
)
raises(
    TypeError,
    lambda: c.Allreduce(np.ones(2, dtype=np.int16), np.empty(2, dtype=np.int16)),
    ["not of a type"],
)
raises(
    TypeError,
    lambda: c.Allreduce(np.ones(2, dtype=np.complex64), np.empty(2, dtype=np.complex64)),
    ["not of a type"],
)
raises(ValueError, lambda: c.Allreduce(f32, np.empty(4, dtype=np.float64)), ["input holds float"])
raises(
    ValueError, lambda: c.Allreduce(ampccl.IN_PLACE, np.ones(4)[::-1][::2]), ["not C-contiguous"]
)
ro = np.ones(4)
ro.flags.writeable = False
raises(ValueError, lambda: c.Allreduce(np.ones(4), ro), ["read-only"])
raises(ampccl.AmpcclError, lambda: c.Bcast(f32, root=world), ["root", "not a rank"])
raises(ValueError, lambda: c.Allreduce(f32, f32, op=9), ["reduction 9"])
raises(TypeError, lambda: c.Allreduce(object(), f32), ["does not export a buffer"])
raises(ValueError, lambda: c.Allgather(ampccl.IN_PLACE, np.ones(world * 3 + 1)), ["equal blocks"])
raises(TypeError, lambda: c.Allreduce([f32, "complex"], f32), ["not an ampccl data type"])
c.Allreduce(ampccl.IN_PLACE, f32)
assert np.all(f32 == world)

print(f"numpy-ok rank={rank} world={world}")
