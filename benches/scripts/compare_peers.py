#!/usr/bin/env python3
"""Side-by-side: ampccl-perf vs Intel MPI (IMB-MPI1) vs Open MPI (mpi4py) vs Gloo (torch),
alternated in one run, medians written as one CSV per peer in ampccl-perf's CSV format.

    python3 benches/scripts/compare_peers.py --op allreduce --rounds 5 --out-dir DIR
    ampccl-perf plot --out cmp.png DIR/ampccl.csv DIR/intel-mpi.csv DIR/open-mpi.csv DIR/gloo.csv

Each round runs every peer once, in the order given by --peers (A, B, C, D, A, B, ...). Per
size the CSV holds the median time over the rounds (out-of-place; in place for broadcast, as
MPI_Bcast and torch broadcast are) and the algbw/busbw of that
time; a markdown table of the medians and of the speed ratios goes to stdout. f32 sum, sizes
are nccl-tests' (the larger buffer; IMB's Allgather rows are one rank's block, matched at
size / ranks). ampccl-perf, Open MPI and Gloo run the same iteration counts per size
(peer_bench.py's: about 256 MiB moved, 20..1000 calls, a quarter of it warm-up); IMB runs
`-iter 1000 -time 20` (its own policy below that) and its t_avg is taken. Peers come from
benches/peers/install.sh (--gloo for torch) under $PEERS_HOME (default
~/.cache/ampccl-peers); ampccl-perf from $AMPCCL_PERF, else $CARGO_TARGET_DIR/release, else
target/release.

Before and after each round the host is probed (benches/scripts/handoff_probe.c, built with cc):
a round during which the host was in one of its slow spells is run again (at most --rounds
times), so that every peer is measured outside them; --no-probe turns this off.

The peer `ceiling` (2 ranks only) is `ampccl-perf ceiling`: the same collective done by two
pinned threads of one process with the library's kernels, no transport — the host-memory
ceiling of any 2-rank implementation here. With it the table adds, per other peer X,
`2-thread ceiling / X`: the most any 2-rank implementation could gain over X on this machine;
`ampccl / 2-thread ceiling` is the fraction of the ceiling's speed ampccl reaches.

The peer `staged` (broadcast only) is `ampccl-perf ceiling --staged`: the root's thread writes
every byte into a ring the other thread copies out of, the ceiling of ranks whose user buffers
the peer cannot reach (heap buffers, ampccl-perf without `-R 1`); it gets the same columns.

The peer `shared` is ampccl-perf with `-R 1`: the user buffers in shared user memory
(`ampccl::SharedBuf`, `ampcclMemAlloc`), which peers write and read directly; its ratio columns
sit next to ampccl's.
"""
import argparse, csv, io, os, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from peer_bench import BUS, HEADER, iterations, parse_size  # noqa: E402

PEERS_HOME = os.environ.get("PEERS_HOME", os.path.expanduser("~/.cache/ampccl-peers"))
IMB = {"allreduce": "Allreduce", "allgather": "Allgather", "reducescatter": "Reduce_scatter",
       "broadcast": "Bcast"}
NAMES = {"ampccl": "ampccl", "shared": "ampccl-shared", "impi": "intel-mpi", "ompi": "open-mpi",
         "gloo": "gloo", "ceiling": "ceiling", "staged": "ceiling-staged"}
TITLES = {"ampccl": "ampccl", "shared": "ampccl shared", "impi": "Intel MPI", "ompi": "Open MPI",
          "gloo": "Gloo", "ceiling": "2-thread ceiling", "staged": "staged ceiling"}
# The ceilings (`ampccl-perf ceiling`, plain and `--staged`): each gets a column per other peer.
CEILINGS = ("ceiling", "staged")
# The ampccl runs that get ratio columns: heap buffers, and buffers in shared user memory
# (`ampccl-perf -R 1`, `ampccl::SharedBuf`, which peers write and read directly).
SUBJECTS = ("ampccl", "shared")


BUILDERS = ("rustc", "cc1", "cc1plus", "ld", "cargo", "clippy-driver", "rustdoc")


def builders():
    """Names of running compiler/linker processes (other people's builds on a shared box)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name in BUILDERS:
            found.append(name)
    return found


def wait_quiet(limit_s):
    """Waits (up to limit_s) until no build runs; returns what still runs."""
    deadline = time.time() + limit_s
    while (busy := builders()) and time.time() < deadline:
        time.sleep(5)
    return busy


SPELL_US = 60.0  # handoff_probe's plain time: 11-23 us normally, 155-223 us in a slow spell


class HostProbe:
    """benches/scripts/handoff_probe.c, built once: microseconds per 512 KiB hand-off between the
    two CPUs. The host has slow spells of tens of seconds in which these hand-offs take 10-15x
    longer (docs/PERFORMANCE.md, "How to measure"); rounds are run and kept only outside them."""

    def __init__(self):
        import tempfile
        self.exe = os.path.join(tempfile.mkdtemp(prefix="ampccl-probe-"), "handoff_probe")
        subprocess.run(["cc", "-O2", "-o", self.exe, os.path.join(HERE, "handoff_probe.c")], check=True)

    def us(self):
        return float(subprocess.run([self.exe], capture_output=True, text=True, check=True).stdout)

    def wait_normal(self, limit_s):
        """Waits (up to limit_s) until the host is out of a spell; returns the last reading."""
        deadline = time.time() + limit_s
        while (t := self.us()) > SPELL_US and time.time() < deadline:
            time.sleep(5)
        return t


def perf_exe():
    if "AMPCCL_PERF" in os.environ:
        return os.environ["AMPCCL_PERF"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "ampccl-perf")


def placement(op):
    """The ampccl rows that match the peers' calls: MPI_Bcast and torch's broadcast work in
    place (one buffer); IMB's and torch's allreduce, allgather and reduce-scatter do not."""
    return "in" if op == "broadcast" else "out"


def rows_of(text, op):
    """{bytes: row dict} of the rows of an ampccl-perf CSV text that match the peers' calls."""
    return {int(r["bytes"]): r for r in csv.DictReader(io.StringIO(text)) if r["placement"] == placement(op)}


def sh(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def run_perf(head, op, sizes):
    """ampccl-perf with the arguments `head` (ranks or subcommand), one run per size."""
    res = {}
    for s in sizes:
        n, w = iterations(s)
        out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ampccl-cmp-{os.getpid()}.csv")
        sh([perf_exe()] + head + ["-o", op, "-b", str(s), "-e", str(s), "-n", str(n),
                                  "-w", str(w), "--csv", out])
        with open(out) as f:
            res.update(rows_of(f.read(), op))
        os.remove(out)
    return {s: float(r["time_us"]) for s, r in res.items()}, {s: int(r["wrong"]) for s, r in res.items()}


def run_ampccl(op, ranks, sizes, shared=False):
    return run_perf(["-g", str(ranks)] + (["-R", "1"] if shared else []), op, sizes)


def run_ceiling(op, sizes, staged=False):
    return run_perf(["ceiling"] + (["--staged"] if staged else []), op, sizes)


def run_impi(op, ranks, sizes):
    impi = os.path.join(PEERS_HOME, "impi")
    env = dict(os.environ, PATH=f"{impi}/bin:" + os.environ["PATH"], LD_LIBRARY_PATH=f"{impi}/lib",
               I_MPI_ROOT=impi)
    out = sh(["mpirun", "-n", str(ranks), "IMB-MPI1", IMB[op], "-msglog", "0:26", "-iter", "1000",
              "-time", "20"], env)
    per_rank = ranks if op == "allgather" else 1
    res = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0].isdigit() and int(f[0]) > 0:
            res[int(f[0]) * per_rank] = float(f[4])  # t_avg (us), keyed by nccl-tests size
    return {s: res[s] for s in sizes if s in res}, {}


def run_bench(backend, op, ranks, sizes):
    script = os.path.join(HERE, "peer_bench.py")
    args = ["--backend", backend, "--op", op, "--sizes", ",".join(map(str, sizes))]
    if backend == "mpi":
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [f"{PEERS_HOME}/ompi/bin/mpiexec", "--oversubscribe", "-n", str(ranks),
               f"{PEERS_HOME}/ompi/bin/python", script] + args
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = [f"{PEERS_HOME}/torch/bin/torchrun", "--standalone", "--nproc-per-node", str(ranks),
               script] + args
    out = sh(cmd, env)
    text = out[out.index(HEADER):]
    rows = rows_of(text, op)
    return {s: float(r["time_us"]) for s, r in rows.items()}, {s: int(r["wrong"]) for s, r in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="allreduce", choices=sorted(IMB))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="8,64K,1M,16M,64M")
    ap.add_argument("--peers", default="ampccl,impi,ompi,gloo",
                    help="comma-separated, in run order: ampccl, shared (ampccl with -R 1), impi, "
                         "ompi, gloo, ceiling, staged (broadcast)")
    ap.add_argument("--out-dir", required=True, help="where <peer>.csv (median rows) go")
    ap.add_argument("--wait-quiet", type=int, default=600,
                    help="before each round, wait up to this many seconds for builds to end")
    ap.add_argument("--no-probe", action="store_true",
                    help="do not probe the host for slow spells (see HostProbe)")
    ap.add_argument("--wait-spell", type=int, default=600,
                    help="before each round, wait up to this many seconds for a slow spell to end")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    peers = a.peers.split(",")
    unknown = [p for p in peers if p not in NAMES]
    if unknown:
        sys.exit(f"unknown peers {unknown}; known: {', '.join(NAMES)}")
    if any(p in CEILINGS for p in peers) and a.ranks != 2:
        sys.exit("the ceiling peers model 2 ranks: use --ranks 2")
    if "staged" in peers and a.op != "broadcast":
        sys.exit("the staged ceiling is a broadcast's")
    runners = {"ampccl": lambda: run_ampccl(a.op, a.ranks, sizes),
               "shared": lambda: run_ampccl(a.op, a.ranks, sizes, shared=True),
               "impi": lambda: run_impi(a.op, a.ranks, sizes),
               "ompi": lambda: run_bench("mpi", a.op, a.ranks, sizes),
               "gloo": lambda: run_bench("gloo", a.op, a.ranks, sizes),
               "ceiling": lambda: run_ceiling(a.op, sizes),
               "staged": lambda: run_ceiling(a.op, sizes, staged=True)}
    times = {p: [] for p in peers}
    wrong = {p: {} for p in peers}
    noisy = 0
    probe = None if a.no_probe else HostProbe()
    spells, redone = 0, 0
    i = 0
    while i < a.rounds:
        busy = wait_quiet(a.wait_quiet)
        before = probe.wait_normal(a.wait_spell) if probe else None
        load = os.getloadavg()[0]
        print(f"round {i + 1}/{a.rounds}: load {load:.2f}, builds running: {busy or 'none'}"
              + (f", host probe {before:.1f} us" if probe else ""), file=sys.stderr)
        got = {}
        for p in peers:
            print(f"round {i + 1}/{a.rounds}: {TITLES[p]}", file=sys.stderr)
            got[p] = runners[p]()
        after = probe.us() if probe else None
        if probe and max(before, after) > SPELL_US:
            # A spell began (or never ended) during the round: every peer ran partly in it.
            spells += 1
            if redone < a.rounds:
                redone += 1
                print(f"round {i + 1}/{a.rounds}: host probe {before:.1f} / {after:.1f} us: "
                      "a slow spell, round run again", file=sys.stderr)
                continue
        for p, (t, w) in got.items():
            times[p].append(t)
            for s, v in w.items():
                wrong[p][s] = wrong[p].get(s, 0) + v
        noisy += bool(busy or builders())
        i += 1
    med = {p: {s: statistics.median(r[s] for r in times[p]) for s in sizes if all(s in r for r in times[p])}
           for p in peers}
    os.makedirs(a.out_dir, exist_ok=True)
    n, redop = a.ranks, "none" if a.op in ("allgather", "broadcast") else "sum"
    root = 0 if a.op == "broadcast" else -1
    for p in peers:
        with open(os.path.join(a.out_dir, NAMES[p] + ".csv"), "w") as f:
            f.write(HEADER + "\n")
            for s, t in sorted(med[p].items()):
                alg = s / t / 1e3
                f.write(f"{a.op},{n},{s},{s // 4},float,{redop},{root},{placement(a.op)},{t:.3f},{alg:.4f},"
                        f"{alg * BUS[a.op](n):.4f},{wrong[p].get(s, 0)}\n")
    print(f"{n} ranks, f32 {a.op}, time per call (us), medians of {a.rounds} alternated runs; "
          f"ratio = peer time / ampccl time; builds ran during {noisy} of the rounds"
          + (f"; host probe (handoff_probe.c) in a slow spell around {spells} round(s), "
             f"{redone} run again" if probe else "; host not probed") + "\n")
    if "ceiling" in peers:
        print("ampccl / 2-thread ceiling: the fraction of the ceiling's speed ampccl reaches; "
              "2-thread ceiling / X: the most any 2-rank implementation could gain over X\n")
    if "staged" in peers:
        print("staged ceiling / X: the most a 2-rank implementation whose user buffers the peer "
              "cannot reach (heap buffers) could gain over X\n")
    subjects = [p for p in SUBJECTS if p in peers]
    others = [p for p in peers if p not in SUBJECTS]
    # Peers the ceilings are compared with: neither an ampccl run (their own columns) nor a ceiling.
    bounded = [p for p in others if p not in CEILINGS]
    ceilings = [c for c in CEILINGS if c in peers]
    head = ["bytes"] + [f"{TITLES[p]} (us)" for p in peers]
    head += [f"{TITLES[a]} / {TITLES[p]}" for a in subjects for p in others]
    head += [f"{TITLES[c]} / {TITLES[p]}" for c in ceilings for p in bounded]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for s in sizes:
        cells = [str(s)] + [f"{med[p][s]:.2f}" if s in med[p] else "—" for p in peers]
        cells += [f"{med[p][s] / med[a][s]:.2f}x" if s in med[p] and s in med[a] else "—"
                  for a in subjects for p in others]
        cells += [f"{med[p][s] / med[c][s]:.2f}x" if s in med[p] and s in med[c] else "—"
                  for c in ceilings for p in bounded]
        print("| " + " | ".join(cells) + " |")
    bad = {p: w for p, w in wrong.items() if any(w.values())}
    if bad:
        print(f"\nWRONG RESULTS: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
