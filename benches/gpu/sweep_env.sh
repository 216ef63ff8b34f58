#!/usr/bin/env bash
# Benchmarks the preloaded collectives under several settings, one torchrun per setting, then
# prints one table with a column per setting (the first column is NCCL alone).
#   benches/gpu/sweep_env.sh N "ENV=.. ENV=.." "ENV=.." ...
# BENCH_ARGS is passed to collectives.py (default: allreduce,allgather at 256 MiB and 1 GiB).
set -u
N=${1:?number of GPUs}; shift
source "$(dirname "$0")/common.sh"
ARGS=${BENCH_ARGS:---ops allreduce,allgather --min-bytes 268435456 --max-bytes 1073741824 --factor 4}
bench() { # tag, env...
  local tag=$1; shift
  timeout "${STEP_TIMEOUT:-200}" env "$@" python -m torch.distributed.run --standalone --nproc_per_node="$N" \
    "$HERE/collectives.py" --mode bench --out "$OUT/$tag" $ARGS > "$OUT/$tag.log" 2>&1
  echo "== $tag rc=$? ($*)"
}
bench nccl AMPCCL_NONE=1
files=("$OUT/nccl.json")
i=0
for setting in "$@"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  bench "s$i" LD_PRELOAD="$LIB" $setting
  # Label the column with the setting.
  python - "$OUT/s$i.json" "$setting" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["alpha"] = sys.argv[2].replace("AMPCCL_", ""); json.dump(d, open(sys.argv[1], "w"))
PY
  files+=("$OUT/s$i.json")
done
echo "######## $N GPUs"
python "$HERE/compare.py" bench "${files[@]}"
