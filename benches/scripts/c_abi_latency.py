#!/usr/bin/env python3
"""Time per call of collectives through the C ABI (c_abi_latency.c) next to the Rust blocking
call (ampccl-perf), 2 local ranks, in one run: every round runs each library build in each
mode and size, then ampccl-perf at each size, one after the other, so a slow spell of the
shared host hits all of them alike; medians over rounds are quoted.

  c_abi_latency.py [--rounds R] [--iters N] [--modes sync,two,...] [--sizes 8,1M,64M]
                   [--perf target/release/ampccl-perf] [NAME=LIBDIR ...]

Each NAME=LIBDIR is a directory holding a libampccl.so (default: new=target/release); the C
program is compiled once (cc -O2, against ffi/include) and each run loads the variant's library
through LD_LIBRARY_PATH. Modes are those of c_abi_latency.c (sync, event, comm, two,
twocomm); two and twocomm issue two allreduces per iteration. Iterations per size: N up to
1 GiB moved, at least 10.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def iters_for(n, b):
    return max(10, min(n, (1 << 30) // b))


def run(cmd, env=None):
    r = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def c_time(exe, lib, mode, b, n):
    out = run([exe, "-g", "2", "-b", str(b), "-n", str(n), "-w", str(max(5, n // 10)), "-m",
               mode], {"LD_LIBRARY_PATH": lib})
    for w in out.split():
        if w.startswith("us="):
            return float(w[3:])
    sys.exit(f"no time in {out!r}")


def perf_time(perf, b, n):
    out = run([perf, "-g", "2", "-b", str(b), "-e", str(b), "-n", str(n), "-w",
               str(max(5, n // 10)), "-c", "0"])
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and int(f[0]) == b:
            return float(f[5])
    sys.exit(f"no time in {out!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=100000)
    ap.add_argument("--modes", default="sync")
    ap.add_argument("--sizes", default="8")
    ap.add_argument("--perf", default=os.path.join(ROOT, "target/release/ampccl-perf"))
    ap.add_argument("libs", nargs="*")
    a = ap.parse_args()
    libs = [tuple(v.split("=", 1)) for v in a.libs] or [("new", os.path.join(ROOT,
                                                                               "target/release"))]
    exe = "/tmp/c_abi_latency"
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "c_abi_latency.c"), "-I",
                    os.path.join(ROOT, "ffi/include"), "-L", libs[0][1], "-lampccl"], check=True)
    modes = a.modes.split(",")
    sizes = [size(s) for s in a.sizes.split(",")]
    times = {}
    for _ in range(a.rounds):
        for b in sizes:
            n = iters_for(a.iters, b)
            for name, lib in libs:
                for m in modes:
                    times.setdefault((name, m, b), []).append(c_time(exe, lib, m, b, n))
            times.setdefault(("rust", "blocking", b), []).append(perf_time(a.perf, b, n))
    print("bytes,mode," + ",".join(f"{n}_us" for n, _ in libs) + ",rust_us," +
          ",".join(f"{n}/rust" for n, _ in libs) +
          "".join(f",{n}/{libs[0][0]}" for n, _ in libs[1:]))
    for b in sizes:
        rust = statistics.median(times[("rust", "blocking", b)])
        for m in modes:
            med = [statistics.median(times[(n, m, b)]) for n, _ in libs]
            print(f"{b},{m}," + ",".join(f"{t:.3f}" for t in med) + f",{rust:.3f}," +
                  ",".join(f"{t / rust:.2f}" for t in med) +
                  "".join(f",{t / med[0]:.2f}" for t in med[1:]))


if __name__ == "__main__":
    main()
