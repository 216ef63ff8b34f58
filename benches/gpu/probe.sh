#!/usr/bin/env bash
# Describes the GPU machine: GPUs and topology, the Python/PyTorch/NCCL install, where the CUDA
# libraries ampccl loads at run time live, and whether stream memory operations are supported.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
nvidia-smi topo -m | head -12
which python python3; python3 -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'
python3 - <<'PY'
import ctypes, os, glob, torch
torch.cuda.init()
for pat in ["libnccl.so*", "libnvrtc*", "libcudart.so*", "libcuda.so*"]:
    found = set()
    for root in ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", os.path.dirname(torch.__file__) + "/..", "/usr/local/lib"]:
        found.update(glob.glob(root + "/**/" + pat, recursive=True))
    print(pat, sorted(found)[:8])
maps = open("/proc/self/maps").read()
print("loaded:", sorted({l.split()[-1] for l in maps.splitlines() if "nccl" in l or "nvrtc" in l or "libcuda" in l or "cudart" in l}))
cu = ctypes.CDLL("libcuda.so.1")
v = ctypes.c_int(); cu.cuDriverGetVersion(ctypes.byref(v)); print("driver", v.value)
for attr, name in [(92, "CAN_USE_STREAM_MEM_OPS_V1"), (93, "CAN_USE_64_BIT_STREAM_MEM_OPS"), (94, "CAN_USE_STREAM_WAIT_VALUE_NOR"), (75,"CC major"), (76,"CC minor"), (98, "CAN_FLUSH_REMOTE_WRITES"), (99, "HOST_REGISTER_SUPPORTED")]:
    x = ctypes.c_int(-1); r = cu.cuDeviceGetAttribute(ctypes.byref(x), attr, 0); print(name, r, x.value)
PY
ls /dev/shm | head; df -h /dev/shm; nproc; free -g | head -2
