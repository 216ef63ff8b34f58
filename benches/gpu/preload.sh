#!/usr/bin/env bash
# NCCL-only vs LD_PRELOAD=libampccl_preload.so, in one run, on N local GPUs.
#   benches/gpu/preload.sh N [check] [bench ALPHAS...]
# Needs target/release/libampccl_preload.so (cargo build --release -p ampccl-preload).
# Writes logs and JSON to $OUT (default ./gpu-out); prints the comparison tables last.
set -u
N=${1:?number of GPUs}; shift
source "$(dirname "$0")/common.sh"
run() { # tag, preload(0/1), args...
  local tag=$1 pre=$2; shift 2
  local env=()
  [ "$pre" = 1 ] && env=(LD_PRELOAD="$LIB")
  timeout "${STEP_TIMEOUT:-240}" env "${env[@]}" python -m torch.distributed.run --standalone --nproc_per_node="$N" \
    "$HERE/collectives.py" --out "$OUT/$tag" "$@" > "$OUT/$tag.log" 2>&1
  local rc=$?
  echo "== $tag rc=$rc"; tail -n 4 "$OUT/$tag.log"
  return $rc
}
summary=()
while [ $# -gt 0 ]; do
  case $1 in
    check)
      shift
      # Small thresholds and chunks so that every size below is split and pipelines wrap.
      run check-nccl 0 --mode check
      AMPCCL_MIN_MSG_SIZE=4096 AMPCCL_MIN_CHUNK_SIZE=256 AMPCCL_ALIGN=256 AMPCCL_CHUNK_SIZE=64K AMPCCL_SLOTS=2 \
        AMPCCL_ALPHA=0.5 AMPCCL_REPORT=1 AMPCCL_LOG=${AMPCCL_LOG:-info} run check-preload 1 --mode check
      summary+=("python $HERE/compare.py check $OUT/check-nccl $OUT/check-preload")
      # Proof that the PCIe path carried part of the calls: rank 0's tally of split calls.
      summary+=("grep -A 16 -m 1 'timed calls, rank 0' $OUT/check-preload.log")
      ;;
    bench)
      shift
      files=("$OUT/bench-nccl.json")
      run bench-nccl 0 --mode bench ${BENCH_ARGS:-}
      while [ $# -gt 0 ] && [[ $1 =~ ^[0-9.]+$ ]]; do
        AMPCCL_ALPHA=$1 run "bench-a$1" 1 --mode bench ${BENCH_ARGS:-}
        files+=("$OUT/bench-a$1.json"); shift
      done
      summary+=("python $HERE/compare.py bench ${files[*]}")
      ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
echo; echo "######## summary ($N GPUs)"
for s in "${summary[@]}"; do eval "$s"; done
