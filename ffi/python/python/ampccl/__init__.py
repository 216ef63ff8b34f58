"""ampccl for Python: collectives on numpy arrays and other buffers, mpi4py-shaped.

``ampccl.COMM_WORLD`` joins the job its launcher started (torchrun, mpirun, ``ampccl-run``,
``AMPCCL_UNIQUE_ID``) on first use. Uppercase methods work on buffers (buffer protocol or
DLPack; ``[buf, "bfloat16"]`` names a type the buffer's format cannot), the ``I`` variants
return a request (``wait``, ``test``), lowercase methods move picklable objects. Errors of the
library raise ``ampccl.AmpcclError`` with its message.

``import torch.distributed as dist; dist.init_process_group("ampccl")`` uses the package as a
torch.distributed backend for CPU tensors (registered through an entry point; see
``ampccl._torch``).
"""

from ampccl._native import AmpcclError, Request, unique_id
from ampccl._comm import AVG, IN_PLACE, MAX, MIN, PROD, SUM, Comm

__all__ = [
    "AVG",
    "AmpcclError",
    "COMM_WORLD",
    "Comm",
    "IN_PLACE",
    "MAX",
    "MIN",
    "PROD",
    "Request",
    "SUM",
    "unique_id",
]

_world = None


def __getattr__(name):
    # COMM_WORLD is created on first use: importing the package (as torch's entry point
    # does) joins no job.
    global _world
    if name == "COMM_WORLD":
        if _world is None:
            _world = Comm.from_env()
        return _world
    raise AttributeError(f"module 'ampccl' has no attribute {name!r}")
