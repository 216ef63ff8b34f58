#!/usr/bin/env python3
"""One rank of a CPU peer's sweep, printing ampccl-perf's CSV format (rank 0, stdout).

Run under Open MPI (mpi4py) or Gloo (torch.distributed); compare_peers.py launches it:

    mpiexec -n 2 python peer_bench.py --backend mpi  --op allreduce --sizes 8,64K,1M
    torchrun --standalone --nproc-per-node 2 peer_bench.py --backend gloo --op allgather

f32, sum. Sizes are nccl-tests' (the larger buffer: allgather's gathered output,
reducescatter's input). Per size: warm-up, barrier, timed loop; the time is the slowest rank's
mean; algbw = bytes / time, busbw = algbw * (allreduce 2(n-1)/n, allgather and reducescatter
(n-1)/n, broadcast 1). Each rank is pinned to one CPU (rank modulo the allowed CPUs), as
ampccl-perf -g and the MPI launchers do. The result of the last call is checked (#wrong).
"""
import argparse, os, sys, time

HEADER = "collective,ranks,bytes,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong"
BUS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
       "reducescatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def pin(rank):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def iterations(size):
    """About 256 MiB moved per size, 20..1000 calls; a quarter of that (at least 5) warm-up."""
    n = max(20, min(1000, (256 << 20) // size))
    return n, max(5, n // 4)


class Mpi:
    def __init__(self):
        import numpy as np
        from mpi4py import MPI
        self.np, self.MPI, self.c = np, MPI, MPI.COMM_WORLD
        self.rank, self.n = self.c.Get_rank(), self.c.Get_size()

    def buffers(self, op, cnt_in, cnt_out):
        np = self.np
        return np.full(cnt_in, self.rank + 1, dtype=np.float32), np.zeros(cnt_out, dtype=np.float32)

    def call(self, op, s, d):
        c, SUM = self.c, self.MPI.SUM
        if op == "allreduce": c.Allreduce(s, d, op=SUM)
        elif op == "allgather": c.Allgather(s, d)
        elif op == "reducescatter": c.Reduce_scatter_block(s, d, op=SUM)
        else: c.Bcast(s, root=0)

    def barrier(self): self.c.Barrier()
    def close(self): pass
    def max(self, v): return self.c.allreduce(v, op=self.MPI.MAX)
    def sum(self, v): return self.c.allreduce(v, op=self.MPI.SUM)
    def values(self, t): return [float(x) for x in t]


class Gloo:
    def __init__(self):
        import torch, torch.distributed as dist
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")
        self.rank, self.n = dist.get_rank(), dist.get_world_size()

    def buffers(self, op, cnt_in, cnt_out):
        t = self.torch
        return t.full((cnt_in,), float(self.rank + 1)), t.zeros(cnt_out)

    def call(self, op, s, d):
        dist = self.dist
        if op == "allreduce":  # out of place, as MPI and ampccl-perf's "out" columns
            d.copy_(s); dist.all_reduce(d)
        elif op == "allgather": dist.all_gather_into_tensor(d, s)
        elif op == "reducescatter": dist.reduce_scatter_tensor(d, s)
        else: dist.broadcast(s, src=0)

    def barrier(self): self.dist.barrier()
    def close(self): self.dist.destroy_process_group()

    def _red(self, v, op):
        x = self.torch.tensor([float(v)], dtype=self.torch.float64)
        self.dist.all_reduce(x, op=op)
        return x.item()

    def max(self, v): return self._red(v, self.dist.ReduceOp.MAX)
    def sum(self, v): return int(self._red(v, self.dist.ReduceOp.SUM))
    def values(self, t): return t.tolist()


def expected(op, n, rank, cnt_out):
    if op in ("allreduce", "reducescatter"): return [n * (n + 1) / 2] * cnt_out
    if op == "allgather":
        blk = cnt_out // n
        return [float(r + 1) for r in range(n) for _ in range(blk)]
    return [1.0] * cnt_out  # broadcast from rank 0: its input, 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["mpi", "gloo"], required=True)
    ap.add_argument("--op", choices=sorted(BUS), default="allreduce")
    ap.add_argument("--sizes", default="8,64K,1M,16M,64M")
    ap.add_argument("--no-pin", action="store_true", help="leave CPU affinity alone")
    a = ap.parse_args()
    b = Mpi() if a.backend == "mpi" else Gloo()
    if not a.no_pin:
        pin(b.rank)
    n = b.n
    if b.rank == 0:
        print(HEADER)
    for size in (parse_size(s) for s in a.sizes.split(",")):
        total = size // 4
        cin, cout = {"allgather": (total // n, total // n * n),
                     "reducescatter": (total // n * n, total // n)}.get(a.op, (total, total))
        s, d = b.buffers(a.op, cin, cout)
        iters, warm = iterations(size)
        for _ in range(warm):
            b.call(a.op, s, d)
        b.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            b.call(a.op, s, d)
        dt = b.max((time.perf_counter() - t0) / iters)
        got = b.values(s if a.op == "broadcast" else d)
        bad = sum(1 for g, w in zip(got, expected(a.op, n, b.rank, cout)) if g != w)
        wrong = b.sum(bad)
        nbytes = max(cin, cout) * 4
        alg = nbytes / dt / 1e9
        if b.rank == 0:
            print(f"{a.op},{n},{nbytes},{max(cin, cout)},float,{'none' if a.op in ('allgather', 'broadcast') else 'sum'},"
                  f"{0 if a.op == 'broadcast' else -1},{'in' if a.op == 'broadcast' else 'out'},"
                  f"{dt * 1e6:.3f},{alg:.4f},{alg * BUS[a.op](n):.4f},{wrong}")
            sys.stdout.flush()
    b.close()


if __name__ == "__main__":
    main()
