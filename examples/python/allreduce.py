"""The hccl package in a few lines: an AllReduce of a NumPy array, checked.

    build/tools/hccl-run -n 4 /usr/bin/python3 examples/python/allreduce.py
"""
import time

import numpy as np

import hccl

with hccl.Comm.from_env() as comm:
    n = 1 << 20
    x = np.full(n, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(x)  # in place, op="sum"
    want = comm.nranks * (comm.nranks + 1) / 2
    ok = bool(np.all(x == want))
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        comm.all_reduce(x)
    dt = (time.perf_counter() - t0) / reps
    if comm.rank == 0:
        print("allreduce.py: %d ranks, %d floats: result %s, %.1f us per AllReduce, %.2f GB/s "
              "busbw" % (comm.nranks, n, "correct" if ok else "WRONG", dt * 1e6,
                         2 * (comm.nranks - 1) / comm.nranks * x.nbytes / dt / 1e9))
    if not ok:
        raise SystemExit(1)
