"""hccl from Python: collectives over host memory on any C-contiguous buffer.

    import hccl, numpy as np
    comm = hccl.Comm.from_env()              # under hccl-run, torchrun, mpirun or srun
    x = np.ones(1024, dtype=np.float32)
    comm.all_reduce(x)                       # in place, op="sum"
    req = comm.all_reduce_async(x, op="max") # a Request: wait(), test(), or await it
    req.wait()

Every collective of the C API is a method of Comm, blocking and *_async; the dtype comes
from the buffer (numpy arrays, bytearray, memoryview, CPU torch tensors), or dtype=...
(e.g. "bfloat16" over a uint16 array). Failures raise hccl.Error subclasses with .code and
.message (the text of hcclGetLastError). hccl.aio awaits requests in asyncio; hccl.torch
registers the torch.distributed backend "hostccl".
"""
import enum as _enum

from ._hccl import (  # noqa: F401
    AbortedError,
    Comm,
    Error,
    InProgressError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    RemoteError,
    Request,
    SystemCallError,
    TimeoutError,
    UnsupportedError,
    AVG,
    MAX,
    MIN,
    PROD,
    SUM,
    INT8,
    UINT8,
    INT32,
    UINT32,
    INT64,
    UINT64,
    FLOAT16,
    BFLOAT16,
    FLOAT32,
    FLOAT64,
    SPLIT_NOCOLOR,
    UNIQUE_ID_BYTES,
    error_string,
    get_unique_id,
    get_version,
    unique_id_from_string,
    unique_id_to_string,
)


class Result(_enum.IntEnum):
    """hcclResult_t; Error.code compares equal to these."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    INVALID_USAGE = 2
    SYSTEM_ERROR = 3
    REMOTE_ERROR = 4
    TIMEOUT = 5
    IN_PROGRESS = 6
    ABORTED = 7
    UNSUPPORTED = 8
    INTERNAL_ERROR = 9


_v = get_version()
__version__ = "%d.%d.%d" % (_v // 10000, _v // 100 % 100, _v % 100)
del _v
