#!/usr/bin/env bash
# A PCIe part that fails in the middle of a split call must not hang any rank: rank 1's first
# split allreduce fails after 3 pipeline steps (AMPCCL_INJECT_FAULT). The failing rank gives
# NCCL its part all the same and releases the peers' waits in stream order, so the failed call
# completes on every rank (a device-wide synchronize returns); ncclCommGetAsyncError reports
# the failure (ncclUnhandledCudaError on rank 1, ncclRemoteError on the others), and PyTorch's
# watchdog then ends every process, as after any asynchronous NCCL error (it may abort NCCL
# first, so later calls need not complete). PASS: the failed call completed on every rank,
# every rank's watchdog saw its error, and the job ended inside the time limit.
#   benches/gpu/fault.sh N
set -u
N=${1:?number of GPUs}
source "$(dirname "$0")/common.sh"
start=$(date +%s)
LD_PRELOAD=$LIB AMPCCL_INJECT_FAULT=1:3 AMPCCL_ALPHA=0.5 AMPCCL_MIN_MSG_SIZE=4096 \
  AMPCCL_CHUNK_SIZE=256K timeout "${FAULT_TIMEOUT:-180}" \
  python -m torch.distributed.run --standalone --nproc_per_node="$N" "$HERE/collectives.py" \
  --mode fault --calls 8 --max-bytes 67108864 --out "$OUT/fault" > "$OUT/fault.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
log=$OUT/fault.log
# Every call is split-worthy here, so ampccl's call index is the script's.
k=$(sed -n 's/.*the PCIe part of call \([0-9]*\) failed.*/\1/p' "$log" | head -n 1)
echo "fault: rank 1's PCIe part failed in call ${k:-none}"
# -o: the ranks' lines can interleave in the shared log.
completed=$(grep -o "fault: rank [0-9]* call ${k:-x} done" "$log" | sort -u | wc -l)
seen=0
for r in $(seq 0 $((N - 1))); do
  want="remote process exited"; [ "$r" = 1 ] && want="unhandled cuda error"
  if grep -q "^\[rank$r\].*raised the following async exception: NCCL error: $want" "$log"; then
    seen=$((seen + 1)); echo "fault: rank $r reported \"$want\""
  fi
done
if [ "$rc" != 124 ] && [ -n "$k" ] && [ "$completed" = "$N" ] && [ "$seen" = "$N" ]; then
  echo "fault: PASS, call $k completed on $N of $N ranks, all saw the error, job ended in ${took} s (rc $rc)"
else
  echo "fault: FAIL (rc $rc after ${took} s; call ${k:-none} completed on $completed, errors seen $seen of $N)"
  exit 1
fi
