#!/usr/bin/env bash
# One complete GPU run on a 4-GPU host: correctness on 4 GPUs, default settings vs
# NCCL alone on 2 (GPUs 0-1) and 4 GPUs (alternating runs), and the controller's convergence
# on both, with its plots. Prints the check verdict, the two ratio tables and the convergence
# lines; everything else goes to $OUT (default ./gpu-out).
#   benches/gpu/final.sh [RUNS2] [RUNS4]
set -u
R2=${1:-3}; R4=${2:-2}
source "$(dirname "$0")/common.sh"
OUT=$OUT/check4 STEP_TIMEOUT=240 bash "$HERE/preload.sh" 4 check > "$OUT/check4.txt" 2>&1
grep "^check:" "$OUT/check4.txt"; rm -rf "$OUT/check4"
converge() { # N
  LD_PRELOAD=$LIB AMPCCL_LOG=ampccl::split=debug AMPCCL_REPORT=1 timeout 240 \
    python -m torch.distributed.run --standalone --nproc_per_node="$1" "$HERE/collectives.py" \
    --mode converge --calls 100 --out "/tmp/converge$1" > "/tmp/converge$1.log" 2>&1
  python "$HERE/plot_converge.py" "/tmp/converge$1.json" "/tmp/converge$1.log" "$OUT/converge$1" > /dev/null 2>&1
  grep "calls 1-10" "/tmp/converge$1.log"; grep -A 5 "multipath: controller" "/tmp/converge$1.log" | head -n 5
}
(export CUDA_VISIBLE_DEVICES=0,1; OUT=$OUT/d2 bash "$HERE/default_vs_nccl.sh" 2 "$R2"; converge 2)
OUT=$OUT/d4 bash "$HERE/default_vs_nccl.sh" 4 "$R4"; converge 4
rm -f "$OUT"/*.csv
