#!/usr/bin/env bash
# "Never slower than NCCL alone": default settings against NCCL alone on N GPUs, RUNS runs each,
# alternating (pass-through, default, ...), every size from 1 MiB to 1 GiB; prints per size the
# median busbw ratio of the default runs and of the pass-through runs to NCCL alone.
#   benches/gpu/default_vs_nccl.sh N [RUNS]     (OUT=dir for logs; default ./gpu-out;
#                                                BENCH_ARGS overrides the sizes and ops)
set -u
N=${1:?number of GPUs}; RUNS=${2:-3}
source "$(dirname "$0")/common.sh"
settings=()
for _ in $(seq "$RUNS"); do settings+=("AMPCCL_ENABLE=0" "AMPCCL_REPORT=1"); done
BENCH_ARGS=${BENCH_ARGS:-"--ops allreduce,allgather --min-bytes 1048576 --max-bytes 1073741824 --factor 4 --repeats 9"} \
  bash "$HERE/sweep_env.sh" "$N" "${settings[@]}" > "$OUT/default-vs-nccl.txt" 2>&1
python - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
base = {(r["op"], r["bytes"]): r["busbw"] for r in json.load(open(f"{out}/nccl.json"))["rows"]}
cols = {"pass-through": [], "default": []}
for i in range(1, 2 * runs + 1):
    rows = {(r["op"], r["bytes"]): r["busbw"] for r in json.load(open(f"{out}/s{i}.json"))["rows"]}
    cols["pass-through" if i % 2 else "default"].append(rows)
print(f"{'op':>10} {'bytes':>11} | NCCL busbw | default: median (runs)        | pass-through: median (runs)")
for k, b in base.items():
    line = f"{k[0]:>10} {k[1]:>11} | {b:>10.1f}"
    for name in ["default", "pass-through"]:
        r = [c[k] / b for c in cols[name]]
        line += f" | {statistics.median(r):.3f} ({' '.join(f'{x:.3f}' for x in r)})"
    print(line)
PY
(cd "$OUT" && tar czf dvn-logs.tgz ./*.log ./*.json && rm -f ./*.log ./*.json)
