#!/usr/bin/env bash
# Do calls below AMPCCL_MIN_MSG_SIZE stay untouched? On N GPUs at 16 and 64 MiB: the calls
# NCCL itself sees (its init/tuning log: a split call shows up as a smaller NCCL call) with the
# preload passing through and with default settings, then busbw per setting.
#   benches/gpu/unsplit_diag.sh N            (OUT=dir for logs; default ./gpu-out)
set -u
N=${1:?number of GPUs}
source "$(dirname "$0")/common.sh"
one() { # tag, env... : one 64 MiB allreduce bench run
  local tag=$1; shift
  timeout 120 env "$@" python -m torch.distributed.run --standalone --nproc_per_node="$N" \
    "$HERE/collectives.py" --mode bench --out "$OUT/$tag" --ops allreduce \
    --min-bytes 67108864 --max-bytes 67108864 --repeats 5 > "$OUT/$tag.log" 2>&1
  echo "== $tag rc=$?"
}
# 1. NCCL's own view of the communicator, pass-through vs default.
for s in off on; do
  e=(LD_PRELOAD="$LIB" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV)
  [ $s = off ] && e+=(AMPCCL_ENABLE=0)
  one "dbg-$s" "${e[@]}"
  grep -h "NCCL INFO" "$OUT/dbg-$s.log" | sed -E 's/^[^ ]+ +[^ ]+ +//; s/0x[0-9a-f]+/X/g; s/[0-9]+\.[0-9]+ ?(ms|s)//g' \
    | sort | uniq -c > "$OUT/dbg-$s.txt"
done
echo "### NCCL log lines that differ (off < > on)"; diff "$OUT/dbg-off.txt" "$OUT/dbg-on.txt" | head -40
# 2. busbw: pass-through, default, PCIe off, default again (16 and 64 MiB).
BENCH_ARGS="--ops allreduce,allgather --min-bytes 16777216 --max-bytes 67108864 --factor 4 --repeats 9" \
  bash "$HERE/sweep_env.sh" "$N" AMPCCL_ENABLE=0 AMPCCL_REPORT=1 AMPCCL_ENABLE_PCIE=0 AMPCCL_REPORT=1 \
  > "$OUT/sweep.txt" 2>&1
tail -n 8 "$OUT/sweep.txt"
rm -f "$OUT"/*.rank*.json
