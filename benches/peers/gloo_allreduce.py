"""Allreduce sweep through torch.distributed's Gloo backend on the CPU (f32 sum, 8 B to 64 MiB in
steps of 4x), printed with nccl-tests' columns: time per call, algbw = bytes / time,
busbw = algbw * 2(n-1)/n.

    torchrun --standalone --nproc-per-node 2 benches/peers/gloo_allreduce.py   (run.sh does this)

Each size: 3 warm-up calls, a check of the result, then about 256 MiB worth of calls (5 to 200);
the time is the slowest rank's mean.
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
if rank == 0:
    print("torch", torch.__version__)
    print(f"{'bytes':>12} {'time_us':>10} {'algbw_GB/s':>11} {'busbw_GB/s':>11} ok")
size = 8
while size <= 1 << 26:
    x = torch.full((size // 4,), float(rank + 1))
    iters = max(5, min(200, (1 << 28) // size))
    for _ in range(3):
        dist.all_reduce(x)
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    ok = bool((x == n * (n + 1) / 2).all())
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    per_call = torch.tensor([(time.perf_counter() - start) / iters])
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    if rank == 0:
        alg = size / per_call.item() / 1e9
        print(f"{size:>12} {per_call.item() * 1e6:>10.2f} {alg:>11.3f} {alg * 2 * (n - 1) / n:>11.3f} {ok}")
    size *= 4
dist.destroy_process_group()
