#!/usr/bin/env python3
"""Alternates ampccl-perf runs of several builds or settings in one run and prints the median
time per size (out of place, µs) of each, with the ratio to the first.

  ab_binaries.py ROUNDS 'NAME=ENV... BINARY' ... -- AMPCCL_PERF_ARGS

Each variant is `NAME=` followed by optional `KEY=VALUE` settings and the ampccl-perf binary,
e.g. `base=/tmp/base/ampccl-perf` or `tcp=AMPCCL_SHM_DISABLE=1 target/release/ampccl-perf`.
The variants run one after the other in every round (A, B, C, A, B, C, ...), so a slow spell
of the shared host hits all of them alike; medians over rounds are quoted.
"""
import os
import statistics
import subprocess
import sys


def parse(out):
    """{bytes: out-of-place µs} from ampccl-perf's table."""
    times = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0].isdigit():
            times[int(f[0])] = float(f[5])
    return times


def main():
    args = sys.argv[1:]
    rounds = int(args[0])
    sep = args.index("--")
    variants = []
    for spec in args[1:sep]:
        name, rest = spec.split("=", 1)
        words = rest.split()
        env = dict(w.split("=", 1) for w in words[:-1])
        variants.append((name, env, words[-1]))
    perf_args = args[sep + 1:]
    results = {name: {} for name, _, _ in variants}
    for _ in range(rounds):
        for name, env, binary in variants:
            out = subprocess.run([binary] + perf_args, env={**os.environ, **env},
                                 capture_output=True, text=True, timeout=600).stdout
            for size, t in parse(out).items():
                results[name].setdefault(size, []).append(t)
    first = variants[0][0]
    names = [n for n, _, _ in variants]
    print("bytes," + ",".join(f"{n}_us" for n in names) + "," +
          ",".join(f"{n}/{first}" for n in names[1:]))
    for size in sorted(results[first]):
        med = [statistics.median(results[n].get(size, [float("nan")])) for n in names]
        ratios = [m / med[0] for m in med[1:]]
        print(f"{size}," + ",".join(f"{m:.2f}" for m in med) + "," +
              ",".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
