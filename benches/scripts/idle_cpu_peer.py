#!/usr/bin/env python3
"""idle_cpu.c's measurement for a CPU peer: the CPU time of a rank with nothing to do, and of
one blocked in an allreduce whose last rank comes a second late, under Open MPI (mpi4py) or
Gloo (torch.distributed). Rank 0 prints the same line as idle_cpu.c.

    mpiexec -n 2 python idle_cpu_peer.py --backend mpi
    torchrun --standalone --nproc-per-node 2 idle_cpu_peer.py --backend gloo

($PEERS_HOME/ompi/bin/ and $PEERS_HOME/torch/bin/ hold both launchers and their Pythons, as
benches/peers/install.sh leaves them.)
"""
import argparse
import resource
import statistics
import time

IDLE_S, ROUNDS, LATE_S = 3, 5, 1.0


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Mpi:
    def __init__(self):
        from mpi4py import MPI
        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()

    def allreduce(self, x):
        return self.comm.allreduce(x, op=self.mpi.SUM)


class Gloo:
    def __init__(self):
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def allreduce(self, x):
        t = self.torch.tensor([x], dtype=self.torch.float64)
        self.dist.all_reduce(t)
        return t.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("mpi", "gloo"), required=True)
    b = (Mpi if ap.parse_args().backend == "mpi" else Gloo)()
    b.allreduce(0.0)
    c0, t0 = cpu_s(), time.monotonic()
    time.sleep(IDLE_S)
    idle = (cpu_s() - c0) / (time.monotonic() - t0)
    wait_cpu = wait_wall = 0.0
    wake = []
    for _ in range(ROUNDS):
        b.allreduce(0.0)  # line up
        if b.rank == b.world - 1:
            time.sleep(LATE_S)
            b.allreduce(time.monotonic())
        else:
            c, t = cpu_s(), time.monotonic()
            late_call = b.allreduce(0.0)
            end = time.monotonic()
            wait_cpu += cpu_s() - c
            wait_wall += end - t
            wake.append(end - late_call)
    if b.rank == 0:
        print(f"idle: {idle * 100:.2f} % of a core; waiting for a peer {LATE_S * 1000:.0f} ms late: "
              f"{wait_cpu / wait_wall * 100:.2f} % of a core, returned "
              f"{statistics.median(wake) * 1e6:.0f} us after its call (median of {ROUNDS})")


if __name__ == "__main__":
    main()
