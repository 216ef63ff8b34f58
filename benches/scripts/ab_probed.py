#!/usr/bin/env python3
"""A/B of two ampccl-perf builds or settings, alternated in one run, the host probed around each pair.

    python3 benches/scripts/ab_probed.py ROUNDS "ENV_A" "ENV_B" [ampccl-perf args...]

Runs `ampccl-perf -g $G` (G default 2) with ENV_A, then with ENV_B (space-separated K=V, e.g.
"AMPCCL_SHM_CMA=0"; "X=1" for none), ROUNDS times; binaries $PERF_A and $PERF_B (default: the
build compare_peers.py uses). Before and after each pair compare_peers.py's host probe
(benches/scripts/handoff_probe.c) runs: pairs during a slow spell are reported apart. Prints per
size the median [min] time in us, out of place and in place, of A and B.
"""
import collections, os, statistics, subprocess, sys

from compare_peers import SPELL_US, HostProbe, perf_exe


def run(exe, settings, ranks, args):
    """{bytes: (out-of-place us, in-place us)} of one ampccl-perf run under `settings`."""
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in settings.split()))
    out = subprocess.run([exe, "-g", ranks] + args, capture_output=True, text=True, env=env, check=True).stdout
    rows = (l.split() for l in out.splitlines())
    return {int(f[0]): (float(f[5]), float(f[9])) for f in rows if len(f) >= 10 and f[0].isdigit()}


def main():
    rounds, a, b, args = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    ranks = os.environ.get("G", "2")
    exe_a, exe_b = os.environ.get("PERF_A", perf_exe()), os.environ.get("PERF_B", perf_exe())
    probe = HostProbe()
    times = {"clean": collections.defaultdict(list), "spell": collections.defaultdict(list)}
    for _ in range(rounds):
        before = probe.us()
        ra, rb = run(exe_a, a, ranks, args), run(exe_b, b, ranks, args)
        kind = "clean" if max(before, probe.us()) < SPELL_US else "spell"
        for size in ra:
            times[kind][(size, "A")].append(ra[size])
            times[kind][(size, "B")].append(rb[size])
    spells = len(next(iter(times["spell"].values()), []))
    print(f"A = {a}  B = {b}; {rounds - spells} clean pairs, {spells} in a spell (median [min], us)")
    cell = lambda xs: f"{statistics.median(xs):8.1f} [{min(xs):.0f}]"
    for kind, d in times.items():
        if not d:
            continue
        print(kind)
        print(f"{'bytes':>10} {'A out':>15} {'B out':>15} {'A in':>15} {'B in':>15}")
        for size in sorted({k[0] for k in d}):
            pa, pb = d[(size, "A")], d[(size, "B")]
            cols = [cell([x[i] for x in p]) for i in (0, 1) for p in (pa, pb)]
            print(f"{size:>10} {cols[0]:>15} {cols[1]:>15} {cols[2]:>15} {cols[3]:>15}")


if __name__ == "__main__":
    main()
