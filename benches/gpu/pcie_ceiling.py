"""Host-side ceiling of the PCIe path: copy bandwidth between GPUs and pinned host memory,
one GPU alone and all GPUs at once, one direction and both directions at once.

  python benches/gpu/pcie_ceiling.py [--gpus N] [--mib 256] [--reps 5]

Every GPU copies `--mib` MiB per direction per repetition on its own streams (D2H on one, H2D on
another); the figure per GPU is bytes / (time of the slowest stream), median of the repetitions.
"""
import argparse, statistics

import torch


def run(gpus, directions, nbytes, reps):
    n = nbytes // 4
    bufs = []
    for g in gpus:
        with torch.cuda.device(g):
            bufs.append({
                "dev_src": torch.ones(n, device=f"cuda:{g}"),
                "dev_dst": torch.empty(n, device=f"cuda:{g}"),
                "host_src": torch.ones(n, pin_memory=True),
                "host_dst": torch.empty(n, pin_memory=True),
                "s": {d: torch.cuda.Stream(device=g) for d in directions},
            })
    results = []
    for _ in range(reps + 1):
        for g in gpus:
            torch.cuda.synchronize(g)
        events = []
        for g, b in zip(gpus, bufs):
            for d in directions:
                s = b["s"][d]
                with torch.cuda.stream(s):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record(s)
                    if d == "d2h":
                        b["host_dst"].copy_(b["dev_src"], non_blocking=True)
                    else:
                        b["dev_dst"].copy_(b["host_src"], non_blocking=True)
                    e1.record(s)
                    events.append((g, d, e0, e1))
        for g in gpus:
            torch.cuda.synchronize(g)
        results.append({(g, d): nbytes / (e0.elapsed_time(e1) * 1e-3) / 1e9 for g, d, e0, e1 in events})
    results = results[1:]
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    nbytes = a.mib << 20
    print(f"{'case':>28} | per-GPU GB/s (D2H / H2D)            | total GB/s")
    for gpus in ([0], list(range(a.gpus))):
        for dirs in (["d2h"], ["h2d"], ["d2h", "h2d"]):
            r = run(gpus, dirs, nbytes, a.reps)
            per = "  ".join(f"g{g}:" + "/".join(f"{r[(g, d)]:.1f}" for d in dirs) for g in gpus)
            print(f"{str(len(gpus)) + ' GPU(s) ' + '+'.join(dirs):>28} | {per:<35} | {sum(r.values()):.1f}")


if __name__ == "__main__":
    main()
