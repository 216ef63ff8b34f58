#!/usr/bin/env bash
# A PCIe part that fails in the middle of a split call must not hang any rank: rank 1's first
# split allreduce fails after 3 pipeline steps (AMPCCL_INJECT_FAULT). The failing rank gives
# NCCL its part all the same and releases the peers' waits, so every rank's calls complete;
# ncclCommGetAsyncError reports the failure (ncclUnhandledCudaError on rank 1, ncclRemoteError
# on the others), which PyTorch's watchdog logs (TORCH_NCCL_ASYNC_ERROR_HANDLING=0: it only
# logs; by default it would end the processes, as after any asynchronous NCCL error).
# PASS: every rank finished all its calls and its watchdog saw its error, inside the time limit.
#   benches/gpu/fault.sh N
set -u
N=${1:?number of GPUs}
source "$(dirname "$0")/common.sh"
start=$(date +%s)
LD_PRELOAD=$LIB AMPCCL_INJECT_FAULT=1:3 AMPCCL_ALPHA=0.5 AMPCCL_MIN_MSG_SIZE=4096 \
  AMPCCL_CHUNK_SIZE=256K TORCH_NCCL_ASYNC_ERROR_HANDLING=0 timeout 120 \
  python -m torch.distributed.run --standalone --nproc_per_node="$N" "$HERE/collectives.py" \
  --mode fault --calls 8 --max-bytes 67108864 --out "$OUT/fault" > "$OUT/fault.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
log=$OUT/fault.log
grep -m 1 "injected fault" "$log" | cut -c1-200
# -o: the ranks' lines can interleave in the shared log.
finished=$(grep -o "fault: rank [0-9]* finished" "$log" | sort -u | wc -l)
seen=0
for r in $(seq 0 $((N - 1))); do
  want="remote process exited"; [ "$r" = 1 ] && want="unhandled cuda error"
  if grep -q "^\[rank$r\].*raised the following async exception: NCCL error: $want" "$log"; then
    seen=$((seen + 1)); echo "fault: rank $r reported \"$want\""
  fi
done
if [ "$rc" = 0 ] && [ "$finished" = "$N" ] && [ "$seen" = "$N" ]; then
  echo "fault: PASS, $N of $N ranks finished their calls and saw the error, in ${took} s"
else
  echo "fault: FAIL (rc $rc after ${took} s; finished $finished, errors seen $seen of $N)"
  exit 1
fi
