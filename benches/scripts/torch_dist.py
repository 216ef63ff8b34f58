"""torch.distributed with the ampccl backend against Gloo, in one job: all_reduce,
all_gather_into_tensor, reduce_scatter_tensor and broadcast of CPU float32 tensors, and a DDP
training step, on a group of each backend, the two alternating within every round.

Run it as the ranks of any launcher that sets torchrun's variables (it joins with env://):

    torchrun --standalone --nproc-per-node 2 benches/scripts/torch_dist.py
    target/release/ampccl-hosts -k 2 -- ~/.cache/ampccl-peers/torch/bin/python benches/scripts/torch_dist.py

with the ampccl wheel installed (or on PYTHONPATH) in torch's environment. Rank 0 prints a
markdown table: the median over rounds of each backend's mean time per call (rank 0's clock),
and ampccl's speed-up. Bytes are the largest buffer of a call (allgather's output,
reduce-scatter's input), as nccl-tests counts them. At 8 B it also times ampccl's own numpy
API (`Comm.Allreduce` in place) on the same ranks: what torch.distributed adds to it.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_bench import parse_size  # noqa: E402


def label(n):
    for unit, b in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= b and n % b == 0:
            return f"{n // b} {unit}"
    return f"{n} B"


def iterations(nbytes):
    return max(5, min(1000, (1 << 27) // nbytes))


def make_call(op, nbytes, world, group):
    """A no-argument call of `op` on `group` moving `nbytes` (the largest buffer)."""
    n = max(1, nbytes // 4)
    if op == "all_reduce":
        t = torch.ones(n)
        return lambda: dist.all_reduce(t, group=group)
    if op == "broadcast":
        t = torch.ones(n)
        return lambda: dist.broadcast(t, group_src=0, group=group)
    block = max(1, n // world)
    if op == "all_gather_into_tensor":
        out, inp = torch.empty(block * world), torch.ones(block)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter_tensor":
        out, inp = torch.empty(block), torch.ones(block * world)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    raise ValueError(op)


def time_call(call, iters, barrier):
    """Mean seconds per call over `iters`, after a warm-up."""
    for _ in range(max(2, iters // 10)):
        call()
    barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t) / iters


def ddp_step(group, features, steps):
    """Mean seconds per DDP training step (forward, backward with gradient allreduce,
    optimizer) of a 2-layer MLP whose gradients are `4 * (2 * features^2 + 2 * features)`
    bytes."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.Linear(features, features))
    model = nn.parallel.DistributedDataParallel(net, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, features), torch.randn(32, features)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return lambda: time_call(step, steps, lambda: dist.barrier(group=group))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8,1K,64K,1M,8M,64M")
    ap.add_argument(
        "--ops", default="all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast"
    )
    ap.add_argument("--ddp-features", type=int, default=1024, help="0: no DDP step")
    ap.add_argument("--ddp-steps", type=int, default=20)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ampccl": dist.new_group(backend="ampccl"), "gloo": dist.new_group(backend="gloo")}

    import ampccl  # the numpy API on the same ranks, for the 8-byte comparison

    uid = [ampccl.unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = ampccl.Comm.init(uid[0], rank, world)
    a8 = np.ones(1, dtype=np.float64)

    cases = [(op, parse_size(s)) for op in a.ops.split(",") for s in a.sizes.split(",")]
    calls = {(b, op, n): make_call(op, n, world, g) for b, g in groups.items() for op, n in cases}
    results = {key: [] for key in calls}
    numpy_8b = []
    ddp = {}
    if a.ddp_features:
        ddp = {b: ddp_step(g, a.ddp_features, a.ddp_steps) for b, g in groups.items()}
    ddp_times = {b: [] for b in ddp}
    for r in range(a.rounds):
        order = ["ampccl", "gloo"] if r % 2 == 0 else ["gloo", "ampccl"]
        for op, n in cases:
            for b in order:
                g = groups[b]
                results[(b, op, n)].append(
                    time_call(calls[(b, op, n)], iterations(n), lambda: dist.barrier(group=g))
                )
        numpy_8b.append(time_call(lambda: comm.Allreduce(ampccl.IN_PLACE, a8), 1000, comm.Barrier))
        for b in order if ddp else []:
            ddp_times[b].append(ddp[b]())
    if rank != 0:
        return
    us = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    print(f"{world} ranks, {a.rounds} rounds, median of each round's mean time per call")
    print()
    print("| op | bytes | ampccl | Gloo | × Gloo |")
    print("|---|---:|---:|---:|---:|")
    for op, n in cases:
        x, y = us(results[("ampccl", op, n)]), us(results[("gloo", op, n)])
        print(f"| {op} | {label(n)} | {x:.1f} µs | {y:.1f} µs | {y / x:.1f}× |")
    print()
    print(f"8-byte allreduce through ampccl's numpy API: {us(numpy_8b):.2f} µs")
    if ddp:
        params = 2 * a.ddp_features * a.ddp_features + 2 * a.ddp_features
        x, y = us(ddp_times["ampccl"]) / 1e3, us(ddp_times["gloo"]) / 1e3
        print(
            f"DDP step ({params * 4 / (1 << 20):.1f} MiB of gradients): ampccl {x:.2f} ms, "
            f"Gloo {y:.2f} ms ({y / x:.2f}×)"
        )


if __name__ == "__main__":
    main()
