# Sourced by the GPU scripts (run from the repository root): the settings every run keeps
# (NVLink multicast off), the log directory $OUT (default ./gpu-out), the scripts' folder
# $HERE and the preload library $LIB (cargo build --release -p ampccl-preload).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
HERE=$(dirname "${BASH_SOURCE[0]}")
LIB=$(realpath target/release/libampccl_preload.so)
