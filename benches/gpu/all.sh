#!/usr/bin/env bash
# Everything the tables in docs/GPU.md come from, on N local GPUs, in one run:
# correctness (NCCL-only vs preload), the host-side PCIe ceiling, busbw of NCCL alone vs the
# preload with default settings and with static splits, and the controller's convergence.
#   cargo build --release -p ampccl-preload
#   benches/gpu/all.sh N "ALPHA1 ALPHA2"        (OUT=dir for logs; default ./gpu-out)
set -u
N=${1:?number of GPUs}; ALPHAS=${2:-0.9 0.95}
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=240 bash "$HERE/preload.sh" "$N" check > "$OUT/check-summary.txt" 2>&1
python "$HERE/pcie_ceiling.py" --gpus "$N" > "$OUT/ceiling.txt" 2>&1
settings=("AMPCCL_ENABLE=0" "AMPCCL_REPORT=1")
for a in $ALPHAS; do settings+=("AMPCCL_ALPHA=$a"); done
BENCH_ARGS="--ops allreduce,allgather --min-bytes 1048576 --max-bytes 1073741824 --factor 4 --repeats 9" \
  bash "$HERE/sweep_env.sh" "$N" "${settings[@]}" > "$OUT/bench-summary.txt" 2>&1
LD_PRELOAD=$LIB AMPCCL_LOG=ampccl::split=debug AMPCCL_REPORT=1 timeout 240 \
  python -m torch.distributed.run --standalone --nproc_per_node="$N" "$HERE/collectives.py" \
  --mode converge --calls 100 --out "$OUT/converge" > "$OUT/converge.log" 2>&1
python "$HERE/plot_converge.py" "$OUT/converge.json" "$OUT/converge.log" "$OUT/converge$N" > /dev/null 2>&1
grep "^check:" "$OUT/check-summary.txt"
cat "$OUT/ceiling.txt"
tail -n 14 "$OUT/bench-summary.txt"
grep "calls 1-10" "$OUT/converge.log"
grep -A 8 "multipath: controller" "$OUT/converge.log" | head -n 8
# Keep what comes back small: the summaries, the convergence CSV and plot, and one archive of
# every log (the device tool returns a limited number of files).
rm -f "$OUT"/*.rank*.json "$OUT"/s[0-9]*.json "$OUT"/nccl.json "$OUT"/converge.json
(cd "$OUT" && tar czf logs.tgz ./*.log ./*.txt && rm -f ./*.log ./check-nccl* ./check-preload*)
