"""Failures across ranks, each survivor printing what it saw:
  mismatch        rank 0 all_reduce, the others broadcast (HCCL_CHECK=1): InvalidUsageError
  timeout FIFO    rank 1 joins only after rank 0 timed out (told through FIFO): TimeoutError
  kill            the last rank dies by SIGKILL between all_reduces: RemoteError, quickly
"""
import os
import signal
import sys
import time

import numpy as np

import hccl

mode = sys.argv[1]
comm = hccl.Comm.from_env()
rank, n = comm.rank, comm.nranks
x = np.ones(1024, np.float32)


def report(exc, t0):
    print("rank %d: %s code %d after %.1f s: %s"
          % (rank, type(exc).__name__, exc.code, time.monotonic() - t0, exc.message), flush=True)


t0 = time.monotonic()
if mode == "mismatch":
    try:
        if rank == 0:
            comm.all_reduce(x)
        else:
            comm.broadcast(x, root=0)
        print("rank %d: no error" % rank)
    except hccl.Error as e:
        report(e, t0)
    comm.abort()
elif mode == "timeout":
    fifo = sys.argv[2]
    try:
        if rank == 0:
            try:
                comm.all_reduce(x)
            finally:
                with open(fifo, "w") as f:
                    f.write("go\n")
        else:
            with open(fifo) as f:
                f.read()
            comm.all_reduce(x)
        print("rank %d: no error" % rank)
    except hccl.Error as e:
        report(e, t0)
    comm.abort()
elif mode == "kill":
    comm.all_reduce(x)
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        while True:
            comm.all_reduce(x)
    except hccl.Error as e:
        report(e, t0)
    comm.abort()
