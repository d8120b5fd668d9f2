"""torch.distributed on the "hostccl" backend: every op against a reference, every dtype,
the op mapping, futures, and the errors. Rendezvous through a FileStore (argv[1]).
Prints "torch ops ok"."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import hccl.torch  # noqa: F401  registers "hostccl"

rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.FileStore(sys.argv[1], n)
dist.init_process_group("hostccl", store=store, rank=rank, world_size=n,
                        timeout=timedelta(seconds=60))
assert dist.get_backend() == "hostccl"
pg = dist.group.WORLD
R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]


def inp(r, dt, k=13, prod=False):
    v = (torch.arange(k) * 7 + r * 3) % 5 + 1
    if prod:
        v = 1 + (torch.arange(k) + r) % 2
    if dt == torch.bool:
        return (torch.arange(k) + r) % 3 == 0
    return v.to(dt)


def expect(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError("%s: got %s want %s" % (what, got.tolist(), want.tolist()))


for dt in DTYPES:
    for op, name in [(R.SUM, "sum"), (R.PRODUCT, "prod"), (R.MIN, "min"), (R.MAX, "max"),
                     (R.AVG, "avg")]:
        if dt == torch.bool and op == R.AVG:
            continue
        xs = [inp(r, dt, prod=op == R.PRODUCT).double() for r in range(n)]
        st = torch.stack(xs)
        want = {"sum": st.sum(0), "prod": st.prod(0), "min": st.min(0)[0], "max": st.max(0)[0],
                "avg": st.sum(0) / n}[name]
        if name == "avg" and not dt.is_floating_point:
            want = torch.trunc(want)
        if dt == torch.bool:
            want = (st.max(0)[0] if name in ("sum", "max") else st.min(0)[0]).bool()
        want = want.to(dt)
        t = inp(rank, dt, prod=op == R.PRODUCT)
        dist.all_reduce(t, op=op)
        expect(t, want, "all_reduce %s %s" % (dt, name))
        t = inp(rank, dt, prod=op == R.PRODUCT)
        dist.reduce(t, dst=n - 1, op=op)
        if rank == n - 1:
            expect(t, want, "reduce %s %s" % (dt, name))
    # broadcast, all_gather (list and base), reduce_scatter (list and base), all_to_all
    t = inp(rank, dt)
    dist.broadcast(t, src=n - 1)
    expect(t, inp(n - 1, dt), "broadcast %s" % dt)
    outs = [torch.zeros(13, dtype=dt) for _ in range(n)]
    dist.all_gather(outs, inp(rank, dt))
    for r in range(n):
        expect(outs[r], inp(r, dt), "all_gather %s" % dt)
    flat = torch.zeros(13 * n, dtype=dt)
    dist._all_gather_base(flat, inp(rank, dt))
    expect(flat, torch.cat([inp(r, dt) for r in range(n)]), "_all_gather_base %s" % dt)
    if dt != torch.bool:
        out = torch.zeros(13, dtype=dt)
        dist.reduce_scatter(out, [inp(rank, dt) for _ in range(n)])
        expect(out, (inp(0, dt).double() * 0 + sum(inp(r, dt).double() for r in range(n))).to(dt),
               "reduce_scatter %s" % dt)
        dist._reduce_scatter_base(out, torch.cat([inp(rank, dt)] * n))
        expect(out, sum(inp(r, dt).double() for r in range(n)).to(dt), "_reduce_scatter_base %s" % dt)
    src = torch.arange(n * 3).to(dt) if dt != torch.bool else torch.arange(n * 3) % 2 == 0
    dst = torch.zeros_like(src)
    dist.all_to_all_single(dst, src)
    expect(dst, torch.cat([src[rank * 3:(rank + 1) * 3]] * n), "all_to_all_single %s" % dt)

# uneven all_to_all_single: rank i sends j+1 rows to rank j
send = torch.cat([torch.full((j + 1, 2), float(rank * 10 + j)) for j in range(n)])
recv = torch.zeros((rank + 1) * n, 2)
dist.all_to_all_single(recv, send, [rank + 1] * n, [j + 1 for j in range(n)])
expect(recv, torch.cat([torch.full((rank + 1, 2), float(i * 10 + rank)) for i in range(n)]),
       "all_to_all_single splits")
outs = [torch.zeros(i + 1) for i in range(n)]
dist.all_to_all(outs, [torch.full((rank + 1,), float(rank)) for _ in range(n)])
for i in range(n):
    expect(outs[i], torch.full((i + 1,), float(i)), "all_to_all")
# allreduce_coalesced, send/recv, barrier, futures
ts = [torch.ones(3) * rank, torch.ones(2, 2) * rank]
dist.all_reduce_coalesced(ts)
expect(ts[1], torch.ones(2, 2) * (n * (n - 1) / 2), "all_reduce_coalesced")
if rank == 0:
    dist.send(torch.arange(5.0), dst=n - 1)
elif rank == n - 1:
    t = torch.zeros(5)
    dist.recv(t, src=0)
    expect(t, torch.arange(5.0), "send/recv")
dist.barrier()
works = [dist.all_reduce(torch.ones(100) * k, async_op=True) for k in range(20)]
futs = [w.get_future() for w in works]
vals = torch.futures.wait_all(futs)
for k, v in enumerate(vals):
    expect(v[0], torch.ones(100) * k * n, "future %d" % k)
fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
expect(fut.wait(), torch.ones(4) * 2 * n, "future.then")
dist.all_reduce(torch.zeros(0))  # zero-size

# errors: a clear one for what hccl cannot do
for bad, exc, what in [
    (lambda: dist.all_reduce(torch.ones(4), op=R.BAND), NotImplementedError, "BAND"),
    (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), TypeError, "int16"),
    (lambda: dist.all_reduce(torch.ones(4).to_sparse()), (ValueError, RuntimeError), "sparse"),
    (lambda: dist.all_reduce(torch.ones(4, 4)[:, 1]), ValueError, "contiguous"),
]:
    try:
        bad()
        raise AssertionError("no error for " + what)
    except exc as e:
        assert "hostccl" in str(e) or what == "sparse", (what, str(e))
dist.barrier()
dist.destroy_process_group()
print("torch ops ok", flush=True)
