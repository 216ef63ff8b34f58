#!/usr/bin/env python3
"""Side-by-side sweep: ampccl-perf vs Intel MPI's IMB-MPI1, alternated in one run.

Runs both ROUNDS times (A, B, A, B, ...), 2 ranks (or NRANKS), f32 (sum), 8 B .. 64 MiB, and
prints a markdown table of the medians: time (us) and algbw (GB/s) of each, and the ratio.
Needs benches/peers/install.sh (Intel MPI under $PEERS_HOME, default ~/.cache/ampccl-peers)
and a release build of ampccl-perf.

    python3 benches/scripts/compare_impi.py [--rounds 5] [--ranks 2] [--op allreduce]

--op: allreduce, allgather, reducescatter, broadcast. Sizes are nccl-tests' (the larger buffer:
the gathered output of allgather, the input of reducescatter); IMB's Allgather message is one
rank's block, so its rows are matched at `size / ranks`.
"""
import argparse, os, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


IMB = {"allreduce": "Allreduce", "allgather": "Allgather", "reducescatter": "Reduce_scatter",
       "broadcast": "Bcast"}


# ampccl-perf's sizes in two parts, like IMB's iteration counts: up to 1 MiB 200 iterations (IMB's
# -iter) after 300 warm-up calls, above it 40 after 10. IMB's 8-byte row comes after its 0-4 B
# rows, about 800 calls into the job; the warm-up gives ampccl's first rows the same standing.
# (On 4 oversubscribed ranks the first ~250 calls of a job run 3-4x slower than later ones.)
AMPCCL_PARTS = [("8", "1M", "200", "300"), ("2M", "64M", "40", "10")]


def run_ampccl(ranks, op):
    exe = os.path.join(ROOT, "target", "release", "ampccl-perf")
    res = {}
    for lo, hi, iters, warmup in AMPCCL_PARTS:
        out = subprocess.run([exe, "-o", op, "-g", str(ranks), "-b", lo, "-e", hi, "-f", "2", "-n", iters, "-w", warmup],
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            f = line.split()
            if f and not line.startswith("#") and len(f) >= 13:
                res[int(f[0])] = float(f[5])  # out-of-place time (us), as IMB measures
    return res


def run_impi(ranks, op):
    peers = os.environ.get("PEERS_HOME", os.path.expanduser("~/.cache/ampccl-peers"))
    impi = os.path.join(peers, "impi")
    env = dict(os.environ, PATH=f"{impi}/bin:" + os.environ["PATH"], LD_LIBRARY_PATH=f"{impi}/lib", I_MPI_ROOT=impi)
    out = subprocess.run(["mpirun", "-n", str(ranks), "IMB-MPI1", IMB[op], "-msglog", "0:26", "-iter", "200", "-time", "20"],
                         check=True, capture_output=True, text=True, env=env).stdout
    per_rank = ranks if op == "allgather" else 1
    res = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0].isdigit() and int(f[0]) > 0:
            res[int(f[0]) * per_rank] = float(f[4])  # t_avg (us), keyed by nccl-tests size
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--op", default="allreduce", choices=sorted(IMB))
    a = ap.parse_args()
    amp, imp = [], []
    for i in range(a.rounds):
        print(f"round {i + 1}/{a.rounds}", file=sys.stderr)
        amp.append(run_ampccl(a.ranks, a.op))
        imp.append(run_impi(a.ranks, a.op))
    sizes = sorted(set(amp[0]) & set(imp[0]))
    print(f"{a.ranks} ranks, f32 {a.op}, medians of {a.rounds} alternated runs\n")
    print("| bytes | ampccl (us) | Intel MPI (us) | ampccl algbw (GB/s) | Intel MPI algbw (GB/s) | ampccl / Intel MPI speed |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        ta = statistics.median(r[s] for r in amp)
        ti = statistics.median(r[s] for r in imp)
        print(f"| {s} | {ta:.2f} | {ti:.2f} | {s / ta / 1e3:.2f} | {s / ti / 1e3:.2f} | {ti / ta:.2f}x |")


if __name__ == "__main__":
    main()
