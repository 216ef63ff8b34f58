"""The ampccl torch.distributed backend under torchrun: every operation against values each
rank can compute, errors for what the backend refuses, a new group, asynchronous works and
futures, and DDP (with and without a comm hook) matching a single-process reference.

Run: torchrun --nproc-per-node N torch_backend.py; prints "torch-ok rank=R world=N" at the end.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("ampccl")  # no import of ampccl: the entry point loads it
rank, world = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "ampccl", dist.get_backend()

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
OPS = {
    dist.ReduceOp.SUM: lambda xs: sum(xs[1:], xs[0]),
    dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0),
    dist.ReduceOp.MAX: lambda xs: torch.stack(xs).amax(0),
    dist.ReduceOp.MIN: lambda xs: torch.stack(xs).amin(0),
}


def value(r, n, dtype):
    """Rank r's input of n elements: small values whose products stay exact."""
    return ((torch.arange(n) + r) % 3 + 1).to(dtype)


def check(got, want, what):
    assert torch.equal(got, want.to(got.dtype)), f"{what}: {got[:8]} != {want[:8]}"


def all_inputs(n, dtype):
    return [value(r, n, dtype) for r in range(world)]


# Allreduce: every type and reduction, counts 0, 1, primes, not divisible by the world size.
for dtype in FLOATS + INTS:
    for n in [0, 1, 7, 1009, 4099]:
        for op, f in OPS.items():
            t = value(rank, n, dtype)
            dist.all_reduce(t, op=op)
            check(t, f(all_inputs(n, dtype)), f"all_reduce {dtype} {n} {op}")
        if dtype.is_floating_point:
            t = value(rank, n, dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            want = sum(x.double() for x in all_inputs(n, dtype)) / world
            assert torch.allclose(t.double(), want, rtol=1e-2), f"avg {dtype} {n}"

for n in [1, 13, 1000]:
    # Broadcast, reduce, from each root.
    for root in range(world):
        t = value(rank, n, torch.float32)
        dist.broadcast(t, src=root)
        check(t, value(root, n, torch.float32), f"broadcast root {root}")
        t = value(rank, n, torch.int32)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            check(t, OPS[dist.ReduceOp.SUM](all_inputs(n, torch.int32)), "reduce")
    # Allgather, list and into one tensor.
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_gather(outs, value(rank, n, torch.float32))
    for r, o in enumerate(outs):
        check(o, value(r, n, torch.float32), "all_gather list")
    out = torch.empty(n * world, dtype=torch.float64)
    dist.all_gather_into_tensor(out, value(rank, n, torch.float64))
    check(out, torch.cat(all_inputs(n, torch.float64)), "all_gather_into_tensor")
    # Reduce-scatter, list and tensor.
    full = [value(rank + j, n, torch.float32) for j in range(world)]
    out = torch.empty(n)
    dist.reduce_scatter(out, full)
    check(out, sum(value(r + rank, n, torch.float32) for r in range(world)), "reduce_scatter")
    out = torch.empty(n, dtype=torch.int64)
    dist.reduce_scatter_tensor(
        out, torch.cat([value(rank + j, n, torch.int64) for j in range(world)])
    )
    check(out, sum(value(r + rank, n, torch.int64) for r in range(world)), "reduce_scatter_tensor")
    # All-to-all: even, uneven splits, lists.
    inp = torch.cat([torch.full((n,), 10.0 * rank + j) for j in range(world)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    check(
        out,
        torch.cat([torch.full((n,), 10.0 * j + rank) for j in range(world)]),
        "all_to_all_single",
    )
    ins = [j + 1 for j in range(world)]  # rank sends j+1 rows to rank j
    outs = [rank + 1] * world
    inp = torch.cat([torch.full((ins[j], 2), 10.0 * rank + j) for j in range(world)])
    out = torch.empty(sum(outs), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins)
    check(
        out, torch.cat([torch.full((rank + 1, 2), 10.0 * j + rank) for j in range(world)]), "uneven"
    )
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((n,), 10.0 * rank + j) for j in range(world)])
    for j, o in enumerate(outs):
        check(o, torch.full((n,), 10.0 * j + rank), "all_to_all list")
    # Gather and scatter.
    g = [torch.empty(n) for _ in range(world)] if rank == 0 else None
    dist.gather(value(rank, n, torch.float32), g, dst=0)
    if rank == 0:
        for r, o in enumerate(g):
            check(o, value(r, n, torch.float32), "gather")
    out = torch.empty(n)
    dist.scatter(out, all_inputs(n, torch.float32) if rank == 0 else None, src=0)
    check(out, value(rank, n, torch.float32), "scatter")

# Coalesced allreduce, send/recv around a ring, barrier.
ts = [value(rank, 5, torch.float32), value(rank, 3, torch.float32)]
dist.all_reduce_coalesced(ts)
check(ts[0], OPS[dist.ReduceOp.SUM](all_inputs(5, torch.float32)), "coalesced")
right, left = (rank + 1) % world, (rank - 1) % world
got = torch.empty(9)
reqs = dist.batch_isend_irecv(
    [
        dist.P2POp(dist.isend, value(rank, 9, torch.float32), right),
        dist.P2POp(dist.irecv, got, left),
    ]
)
for r in reqs:
    r.wait()
check(got, value(left, 9, torch.float32), "isend/irecv")
if rank == 0:
    dist.send(torch.arange(4.0), 1)
elif rank == 1:
    t = torch.empty(4)
    dist.recv(t, 0)
    check(t, torch.arange(4.0), "send/recv")
dist.barrier()

# Asynchronous works and futures that complete on their own.
t = value(rank, 100000, torch.float32)
fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
w = dist.all_gather_into_tensor(
    out := torch.empty(7 * world), value(rank, 7, torch.float32), async_op=True
)
check(fut.wait(), 2 * OPS[dist.ReduceOp.SUM](all_inputs(100000, torch.float32)), "future")
w.wait()
check(out, torch.cat(all_inputs(7, torch.float32)), "async all_gather")

# Complex tensors: torch views them as real pairs for a sum (the backend sees float32).
t = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
dist.all_reduce(t)
check(t, torch.full((3,), complex(world * (world - 1) / 2, world)), "complex sum")

# What the backend refuses raises a clear error.
for what, call in [
    ("BAND", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)),
    ("int16", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16))),
    ("PREMUL_SUM", lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))),
]:
    try:
        call()
    except (RuntimeError, ValueError, TypeError) as e:
        assert "ampccl" in str(e) or "not supported" in str(e), f"{what}: {e}"
    else:
        raise AssertionError(f"{what} did not raise")

# A group of the even ranks (new_group: its own communicator through its own store prefix).
evens = list(range(0, world, 2))
g = dist.new_group(evens)
if rank in evens:
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=g)
    check(t, torch.full((3,), float(sum(evens))), "new_group all_reduce")


# DDP: a small model on rank-specific data matches one process running all ranks' data.
def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def batch(r, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def train(net, data, steps):
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        x, y = data(step)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net


def fp16_hook(state, bucket):
    t = bucket.buffer().to(torch.float16).div_(world)
    fut = dist.all_reduce(t, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


ref = train(
    model(), lambda s: tuple(torch.cat(p) for p in zip(*(batch(r, s) for r in range(world)))), 5
)
for hook in [None, fp16_hook]:
    ddp = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.01)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    train(ddp, lambda s: batch(rank, s), 5)
    tol = 1e-5 if hook is None else 1e-2
    for a, b in zip(ddp.module.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=tol), f"DDP ({hook}) differs from the reference"

dist.destroy_process_group()
print(
    f"torch-ok rank={rank} world={world} debug={os.environ.get('TORCH_DISTRIBUTED_DEBUG', 'OFF')}"
)
