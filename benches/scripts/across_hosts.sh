#!/bin/bash
# The cross-host allreduce table of docs/PERFORMANCE.md: ROUNDS alternated rounds (default 3)
# of the TCP ceiling between two emulated hosts and ampccl's 2-host allreduce (one rank per
# host). Needs root (network namespaces) and a release build:
#   cargo build --release -p ampccl-benches -p ampccl-tests
#   benches/scripts/across_hosts.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/../.."
bin=${CARGO_TARGET_DIR:-target}/release
for _ in $(seq "${1:-3}"); do
  "$bin/ampccl-hosts" --ceiling --mib 1024
  "$bin/ampccl-hosts" -k 2 -- "$bin/ampccl-perf" -b 8 -e 8 -n 200 -w 20 | grep -E '^ +[0-9]'
  "$bin/ampccl-hosts" -k 2 -- "$bin/ampccl-perf" -b 1M -e 64M -f 4 -n 10 -w 2 | grep -E '^ +[0-9]'
done
