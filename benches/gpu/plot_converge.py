"""Alpha and busbw over calls from a `collectives.py --mode converge` run.

  python benches/gpu/plot_converge.py OUT/converge2.json OUT/converge2.log OUT/converge2

Reads the per-call busbw (JSON) and the split the preload decided for each call (the
`ampccl::split` debug lines of rank 0 in the log, AMPCCL_LOG=ampccl::split=debug), writes PREFIX.csv (op, bytes, call, alpha,
busbw) and, when matplotlib is installed, PREFIX.png (one panel per op and size).
"""
import json, re, sys

data = json.load(open(sys.argv[1]))
decisions = {}  # (op, bytes) -> [alpha per split-worthy call, in order]
pat = re.compile(r"rank=0 call=\d+ op=\"?(\w+)\"? bytes=(\d+) alpha=([0-9.]+) pcie=(\w+)")
names = {"AllReduce": "allreduce", "AllGather": "allgather"}
for line in open(sys.argv[2], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    if "decision" not in line:
        continue
    m = pat.search(line)
    if m:
        op, nbytes, alpha, pcie = names.get(m.group(1), m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4)
        decisions.setdefault((op, nbytes), []).append(alpha if pcie == "true" else 1.0)
rows = []
for key in sorted({(r["op"], r["bytes"]) for r in data["rows"]}):
    calls = [r for r in data["rows"] if (r["op"], r["bytes"]) == key]
    alphas = decisions.get(key, [])
    # The decisions of a size include the barrier-free calls only; align from the end.
    alphas = alphas[-len(calls):] if len(alphas) >= len(calls) else [float("nan")] * (len(calls) - len(alphas)) + alphas
    for r, a in zip(calls, alphas):
        rows.append((key[0], key[1], r["call"], a, r["busbw"]))
with open(sys.argv[3] + ".csv", "w") as f:
    f.write("op,bytes,call,alpha,busbw\n")
    for r in rows:
        f.write(",".join(str(x) for x in r) + "\n")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not installed: wrote", sys.argv[3] + ".csv")
    sys.exit(0)
keys = sorted({(r[0], r[1]) for r in rows})
fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.6 * len(keys)), squeeze=False)
for ax, key in zip(axes[:, 0], keys):
    rs = [r for r in rows if (r[0], r[1]) == key]
    ax.plot([r[2] for r in rs], [r[4] for r in rs], color="tab:blue", label="busbw")
    ax.set_ylabel("busbw GB/s")
    ax2 = ax.twinx()
    ax2.plot([r[2] for r in rs], [r[3] for r in rs], color="tab:red", label="alpha")
    ax2.set_ylabel("alpha (NCCL share)")
    ax.set_title(f"{key[0]} {key[1] >> 20} MiB, {data['world']} GPUs")
axes[-1, 0].set_xlabel("call")
fig.tight_layout()
fig.savefig(sys.argv[3] + ".png", dpi=90)
print("wrote", sys.argv[3] + ".png")
