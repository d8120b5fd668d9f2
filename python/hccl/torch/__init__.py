"""The torch.distributed backend "hostccl": importing this module registers it.

    import torch.distributed as dist
    import hccl.torch  # noqa: F401
    dist.init_process_group("hostccl", store=store, rank=rank, world_size=n)  # or init_method

The rendezvous goes through the c10d store the process group is given (rank 0 puts an hccl
unique id there), never through MASTER_ADDR:MASTER_PORT themselves; the group's timeout is
hccl's exec timeout. Named "hostccl" because Ascend's and Habana's plugins use "hccl".
"""
import atexit

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as _dist

from . import _C

BACKEND = "hostccl"


def _create(store, rank, world_size, timeout):
    return _C.create(store, rank, world_size, timeout)


# torch 2.x: register_backend(BACKEND, _create, devices=["cpu"]) (see docs/python.md).
if BACKEND.upper() not in getattr(_dist.Backend, "_plugins", {}):
    _dist.Backend.register_backend(BACKEND, _create)

# Process groups alive at exit are freed late in the interpreter's shutdown, when a thread can
# no longer take the GIL to drop a tensor: stop the backends' completion threads before.
atexit.register(_C._shutdown)
