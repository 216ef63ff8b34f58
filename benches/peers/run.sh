#!/usr/bin/env bash
# A quick look at the installed CPU peers alone: each one's 2-rank (or NRANKS) f32 sum
# allreduce from 8 B to 64 MiB, one table per peer. Install them first with
# benches/peers/install.sh. For figures to quote, compare against ampccl in one alternated run
# with benches/scripts/compare_peers.py instead (see docs/PERFORMANCE.md).
#
#   benches/peers/run.sh [NRANKS]
set -uo pipefail

home=${PEERS_HOME:-$HOME/.cache/ampccl-peers}
n=${1:-2}
here=$(cd "$(dirname "$0")" && pwd)

if [ -x "$home/impi/bin/IMB-MPI1" ]; then
  echo "=== Intel MPI, IMB-MPI1 Allreduce (f32 sum; compare t_avg)"
  PATH=$home/impi/bin:$PATH LD_LIBRARY_PATH=$home/impi/lib I_MPI_ROOT=$home/impi \
    mpirun -n "$n" IMB-MPI1 Allreduce -msglog 3:26 -iter 200 -time 20 2>&1 | grep -vE "^#|^$" | tail -26
fi
if [ -x "$home/ompi/bin/mpiexec" ]; then
  echo "=== Open MPI, through mpi4py"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$home/ompi/bin/mpiexec" --oversubscribe -n "$n" "$home/ompi/bin/python" "$here/mpi_allreduce.py" 2>&1 | tail -14
fi
if [ -x "$home/torch/bin/torchrun" ]; then
  echo "=== Gloo, through torch.distributed"
  "$home/torch/bin/torchrun" --standalone --nproc-per-node "$n" "$here/gloo_allreduce.py" 2>&1 \
    | grep -vE "^W|Warn|\*\*\*" | tail -14
fi
