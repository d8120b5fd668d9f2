"""Every collective, for every dtype (and every op), against a NumPy reference; in place,
zero-size, non-blocking and awaited forms. Prints "collectives ok" when all passed."""
import asyncio

import numpy as np

import common
from common import DTYPES, OPS, check, from_storage, reduce_ref, to_storage, values

import hccl
import hccl.aio

comm = hccl.Comm.from_env()
rank, n = comm.rank, comm.nranks
N = 37  # not a multiple of anything


def inp(r, op, name, store, count=N):
    return to_storage(values(r, count, op, name), name, store)


def ref(op, name, store, count=N):
    return reduce_ref([from_storage(inp(r, op, name, store, count), name) for r in range(n)],
                      op, name)


for name, store, dt in DTYPES:
    kw = {"dtype": dt} if dt else {}
    for op in OPS:
        if name == "bool" and op == "avg":
            continue
        want = ref(op, name, store)
        # all_reduce: out of place, in place, async
        x = inp(rank, op, name, store)
        y = np.zeros_like(x)
        assert comm.all_reduce(x, y, op=op, **kw) is y
        check(from_storage(y, name), want, "all_reduce %s %s" % (name, op))
        comm.all_reduce(x, op=op, **kw)
        check(from_storage(x, name), want, "all_reduce in place %s %s" % (name, op))
        x = inp(rank, op, name, store)
        comm.all_reduce_async(x, op=op, **kw).wait()
        check(from_storage(x, name), want, "all_reduce_async %s %s" % (name, op))
        # reduce to the last rank; the others' recvbuf stays untouched
        x = inp(rank, op, name, store)
        y = np.full_like(x, 3)
        comm.reduce(x, y, op=op, root=n - 1, **kw)
        if rank == n - 1:
            check(from_storage(y, name), want, "reduce %s %s" % (name, op))
        else:
            check(y, np.full(N, 3, dtype=store), "reduce non-root %s %s" % (name, op))
        # reduce_scatter: block rank of the reduction of n blocks
        big = inp(rank, op, name, store, N * n)
        out = np.zeros(N, dtype=store)
        comm.reduce_scatter(big, out, op=op, **kw)
        check(from_storage(out, name), ref(op, name, store, N * n)[rank * N:(rank + 1) * N],
              "reduce_scatter %s %s" % (name, op))
        comm.reduce_scatter(big, op=op, **kw)  # in place into big's own block
        check(from_storage(big[rank * N:(rank + 1) * N], name),
              ref(op, name, store, N * n)[rank * N:(rank + 1) * N],
              "reduce_scatter in place %s %s" % (name, op))
    # broadcast from every root
    for root in range(n):
        x = inp(rank, "sum", name, store)
        comm.broadcast(x, root=root, **kw)
        check(x, inp(root, "sum", name, store), "broadcast %s root %d" % (name, root))
    # all_gather, out of place and in place
    x = inp(rank, "sum", name, store)
    out = np.zeros(N * n, dtype=store)
    comm.all_gather(x, out, **kw)
    want = np.concatenate([inp(r, "sum", name, store) for r in range(n)])
    check(out, want, "all_gather %s" % name)
    out = np.zeros(N * n, dtype=store)
    out[rank * N:(rank + 1) * N] = x
    comm.all_gather(None, out, **kw)
    check(out, want, "all_gather in place %s" % name)
    # all_to_all: block j of rank i is (i, j)
    send = np.concatenate([np.full(N, (rank * n + j) % 100, dtype=store) for j in range(n)])
    if name == "bool":
        send = send.astype(bool)
    recv = np.zeros_like(send)
    comm.all_to_all(send, recv, **kw)
    want = np.concatenate([np.full(N, (i * n + rank) % 100, dtype=store) for i in range(n)])
    check(recv, want.astype(recv.dtype), "all_to_all %s" % name)
    # all_to_allv: rank i sends j+1 elements to rank j
    scounts = [j + 1 for j in range(n)]
    sdispls = [sum(scounts[:j]) for j in range(n)]
    rcounts = [rank + 1] * n
    rdispls = [i * (rank + 1) for i in range(n)]
    send = np.concatenate([np.full(j + 1, (rank + j) % 50, dtype=store) for j in range(n)])
    recv = np.zeros(sum(rcounts), dtype=store)
    comm.all_to_allv(send, scounts, sdispls, recv, rcounts, rdispls, **kw)
    want = np.concatenate([np.full(rank + 1, (i + rank) % 50, dtype=store) for i in range(n)])
    check(recv, want, "all_to_allv %s" % name)

# send/recv around a ring, non-blocking so that nobody waits for itself
x = np.full(N, rank, np.float32)
y = np.zeros(N, np.float32)
reqs = [comm.send_async(x, (rank + 1) % n), comm.recv_async(y, (rank - 1) % n)]
for r in reqs:
    r.wait()
check(y, np.full(N, (rank - 1) % n), "send/recv")

# zero-size: every collective completes, on empty numpy arrays and bytearrays
e = np.zeros(0, np.float32)
comm.all_reduce(e)
comm.broadcast(bytearray(), root=0)
comm.all_gather(e, np.zeros(0, np.float32))
comm.reduce_scatter(e, np.zeros(0, np.float32))
comm.all_to_all(e, np.zeros(0, np.float32))
assert comm.all_reduce_async(e).wait() is e

# bytearray and memoryview
b = bytearray([rank + 1] * 5)
comm.all_reduce(b)
assert list(b) == [n * (n + 1) // 2] * 5, list(b)
m = memoryview(np.ones(4, np.int64))
comm.all_reduce(m, op="max")
assert m.tolist() == [1] * 4

# many requests at once, waited in reverse, then tested
xs = [np.full(100 + k, k + rank, np.float64) for k in range(32)]
reqs = [comm.all_reduce_async(x) for x in xs]
for r in reversed(reqs):
    r.wait()
for k, x in enumerate(xs):
    check(x, np.full(100 + k, n * k + n * (n - 1) / 2), "async %d" % k)
r = comm.barrier_async()
while not r.test():
    pass
assert r.done


# asyncio: many collectives awaited together
async def main():
    ys = [np.full(64, rank + k, np.int32) for k in range(20)]
    out = await asyncio.gather(*(comm.all_reduce_async(y) for y in ys))
    for k, y in enumerate(out):
        assert y is ys[k]
        check(y, np.full(64, n * k + n * (n - 1) // 2), "aio %d" % k)
    got = await hccl.aio.gather(comm.barrier_async(), comm.broadcast_async(ys[0], root=0))
    assert got[0] is None and got[1] is ys[0]


asyncio.run(main())
comm.destroy()
print("collectives ok")
