"""Allreduce sweep through mpi4py (f32 sum, 8 B to 64 MiB in steps of 4x), printed with
nccl-tests' columns: time per call, algbw = bytes / time, busbw = algbw * 2(n-1)/n.

    mpiexec -n 2 python benches/peers/mpi_allreduce.py      (benches/peers/run.sh does this)

Each size: 3 warm-up calls, a check of the result, then about 256 MiB worth of calls (5 to 200);
the time is the slowest rank's mean.
"""
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
if rank == 0:
    print(MPI.Get_library_version().splitlines()[0])
    print(f"{'bytes':>12} {'time_us':>10} {'algbw_GB/s':>11} {'busbw_GB/s':>11} ok")
size = 8
while size <= 1 << 26:
    src = np.full(size // 4, rank + 1, dtype=np.float32)
    dst = np.empty_like(src)
    iters = max(5, min(200, (1 << 28) // size))
    for _ in range(3):
        comm.Allreduce(src, dst, op=MPI.SUM)
    ok = bool(np.all(dst == n * (n + 1) / 2))
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce(src, dst, op=MPI.SUM)
    per_call = comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)
    if rank == 0:
        alg = size / per_call / 1e9
        print(f"{size:>12} {per_call * 1e6:>10.2f} {alg:>11.3f} {alg * 2 * (n - 1) / n:>11.3f} {ok}")
    size *= 4
