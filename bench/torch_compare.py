#!/usr/bin/env python3
"""torch.distributed on "hostccl" next to Gloo, interleaved in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_compare.py [--quick]

BENCH_HCCL_BUILD names another build directory than build/ (its tools/hccl-run and
tools/hccl-perf; PYTHONPATH picks the package).

For each rank count (2, 4) and link set (shm: the default; tcp: HCCL_LINKS=tcp) it starts the
ranks through build/tools/hccl-run; each rank makes a Gloo group and a hostccl group and
times all_reduce (float32) on both, alternating, size by size, repetition by repetition;
then a DDP step of a ~3M-parameter MLP (bucket_cap_mb=1, OMP_NUM_THREADS=1) on each, with
the share of the step spent in communication. Over tcp a third row, "floor", times only the
bytes a ring AllReduce moves (each rank sends 2(n-1)/n of the buffer to the next rank over a
loopback TCP socket and receives as much from the previous one, no sums), interleaved with the
other two: what any AllReduce that sends those bytes over TCP costs on this machine at least.
Last, the binding's own cost: comm.all_reduce of 8 bytes from Python next to hccl-perf's 8
bytes. Results (JSON lines and a summary) go
to bench/results/torch-<time>/.
"""
import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BENCH_HCCL_BUILD", os.path.join(ROOT, "build"))
SIZES = [8] + [64 << 10 << (2 * k) for k in range(6)]  # 8 B, 64 KiB .. 64 MiB


FLOOR_PIECE = 512 << 10  # bytes per send or receive call, as the ring's chunks


def ring_sockets(store, rank, n):
    """Loopback TCP sockets to the next rank and from the previous one, non-blocking."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    store.set("floor%d" % rank, str(lsock.getsockname()[1]))
    nxt = socket.create_connection(("127.0.0.1", int(store.get("floor%d" % ((rank + 1) % n)))))
    prv, _ = lsock.accept()
    lsock.close()
    for s in (nxt, prv):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
    return nxt, prv


def ring_bytes(nxt, prv, buf, total):
    """Send total bytes of buf (round and round) to nxt while receiving as many from prv."""
    view, size = memoryview(buf), len(buf)
    sent = got = 0
    poller = select.poll()
    poller.register(nxt, select.POLLOUT)
    poller.register(prv, select.POLLIN)
    while sent < total or got < total:
        for fd, ev in poller.poll():
            if fd == nxt.fileno() and ev & select.POLLOUT:
                o = sent % size
                sent += nxt.send(view[o:o + min(FLOOR_PIECE, total - sent, size - o)])
                if sent == total:
                    poller.unregister(nxt)
            elif fd == prv.fileno() and ev & (select.POLLIN | select.POLLHUP):
                o = got % size
                k = prv.recv_into(view[o:o + min(FLOOR_PIECE, total - got, size - o)])
                if k == 0:
                    raise RuntimeError("floor: the previous rank closed its socket")
                got += k
                if got == total:
                    poller.unregister(prv)


def rank_main(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import hccl.torch  # noqa: F401

    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["HCCL_COMM_ID"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), n, rank == 0, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    groups = {"gloo": dist.group.WORLD, "hostccl": dist.new_group(backend="hostccl")}
    floor = ring_sockets(store, rank, n) if os.environ.get("HCCL_LINKS") == "tcp" else None
    def emit(r):
        # As it goes, so that a run cut short still leaves what it measured.
        if rank == 0:
            r["nranks"] = n
            r["links"] = os.environ.get("HCCL_LINKS", "shm,tcp (default)")
            print("RESULT " + json.dumps(r), flush=True)

    def timed(fn, iters):
        dist.barrier(group=groups["gloo"])
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    for size in args.sizes:
        x = torch.ones(max(1, size // 4))
        iters = max(10, min(200, int(2e8 // max(size, 1) // 50)))
        for rep in range(args.reps):
            for name in ("hostccl", "gloo") if rep % 2 == 0 else ("gloo", "hostccl"):
                g = groups[name]
                dist.all_reduce(x, group=g)  # warm
                t = timed(lambda: dist.all_reduce(x, group=g), iters)
                emit({"kind": "allreduce", "backend": name, "bytes": size, "rep": rep,
                            "us": t * 1e6,
                            "busbw_GBps": 2 * (n - 1) / n * size / t / 1e9})
            if floor and n > 1 and size >= (1 << 20):
                buf = bytearray(x.numel() * 4)
                total = 2 * (n - 1) * (len(buf) // n)
                ring_bytes(*floor, buf, total)  # warm
                t = timed(lambda: ring_bytes(*floor, buf, total), iters)
                emit({"kind": "allreduce", "backend": "floor", "bytes": size, "rep": rep,
                      "us": t * 1e6, "busbw_GBps": 2 * (n - 1) / n * size / t / 1e9})

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 768), nn.ReLU(), nn.Linear(768, 10))

    for rep in range(args.reps if args.ddp_steps else 0):
        for name in ("hostccl", "gloo") if rep % 2 == 0 else ("gloo", "hostccl"):
            model = nn.parallel.DistributedDataParallel(mlp(), process_group=groups[name],
                                                        bucket_cap_mb=1)
            params = sum(p.numel() for p in model.parameters())
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(32, 1024), torch.randint(0, 10, (32,))
            steps, comm_t = [], []
            grads = [p.grad for p in model.parameters()]
            for s in range(args.ddp_steps + 5):
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps.append(time.perf_counter() - t0)
                # Communication alone: the same gradients' buckets all-reduced back to back.
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                buckets = flat.split(1 << 18)
                t0 = time.perf_counter()
                ws = [dist.all_reduce(b, group=groups[name], async_op=True) for b in buckets]
                for w in ws:
                    w.wait()
                comm_t.append(time.perf_counter() - t0)
            steps, comm_t = steps[5:], comm_t[5:]
            q = statistics.quantiles(steps, n=10)
            emit({"kind": "ddp", "backend": name, "rep": rep, "params": params,
                        "median_ms": statistics.median(steps) * 1e3, "p90_ms": q[8] * 1e3,
                        "comm_share": statistics.median(comm_t) / statistics.median(steps)})
            del grads
    for s in floor or ():
        s.close()
    dist.destroy_process_group(groups["hostccl"])
    dist.destroy_process_group()


def binding_main(args):
    import numpy as np

    import hccl

    with hccl.Comm.from_env() as comm:
        x = np.ones(2, np.float32)
        for _ in range(2000):
            comm.all_reduce(x)
        best = []
        for _ in range(args.reps):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(20000):
                comm.all_reduce(x)
            best.append((time.perf_counter() - t0) / 20000 * 1e6)
        if comm.rank == 0:
            print("RESULT " + json.dumps({"kind": "binding", "nranks": comm.nranks,
                                          "us_per_8B_allreduce": best}), flush=True)


def run(n, extra_env, argv, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra_env)
    cmd = [os.path.join(BUILD, "tools", "hccl-run"), "-n", str(n), "--timeout", str(timeout),
           "--tag-output", sys.executable, os.path.abspath(__file__)] + argv
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    res, log = [], []
    for line in p.stdout:
        log.append(line)
        if "RESULT " in line:
            res.append(json.loads(line.split("RESULT ", 1)[1]))
            print(line.rstrip(), file=sys.stderr, flush=True)
    if p.wait() != 0:
        print("".join(log[-50:]), file=sys.stderr)
    return res, "".join(log)


def summarize(results):
    lines = []
    ar = {}
    for r in results:
        if r["kind"] == "allreduce":
            ar.setdefault((r["nranks"], r["links"], r["bytes"], r["backend"]), []).append(r["us"])
    for (n, links, size, be) in sorted(k for k in ar if k[3] == "hostccl"):
        h = statistics.median(ar[(n, links, size, "hostccl")])
        g = statistics.median(ar.get((n, links, size, "gloo"), [float("nan")]))
        line = ("allreduce n=%d links=%-18s %9d B: hostccl %10.1f us  gloo %10.1f us  "
                "gloo/hostccl %.1fx" % (n, links, size, h, g, g / h))
        if (n, links, size, "floor") in ar:
            f = statistics.median(ar[(n, links, size, "floor")])
            line += "  floor %.1f us: gloo/floor %.1fx" % (f, g / f)
        lines.append(line)
    dd = {}
    for r in results:
        if r["kind"] == "ddp":
            dd.setdefault((r["nranks"], r["links"], r["backend"]), []).append(r)
    for (n, links, be), rs in sorted(dd.items()):
        lines.append("ddp n=%d links=%s %-8s (%d params): median %.1f ms  p90 %.1f ms  comm "
                     "share %.0f%%" % (n, links, be, rs[0]["params"],
                                      statistics.median(r["median_ms"] for r in rs),
                                      statistics.median(r["p90_ms"] for r in rs),
                                      100 * statistics.median(r["comm_share"] for r in rs)))
    for r in results:
        if r["kind"] == "binding":
            lines.append("binding n=%d: comm.all_reduce 8 B from Python: %s us (reps)"
                         % (r["nranks"], ", ".join("%.2f" % v for v in r["us_per_8B_allreduce"])))
        if r["kind"] == "hccl-perf":
            lines.append("hccl-perf n=%d 8 B:\n%s" % (r["nranks"], r["output"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--binding", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--links", default="shm,tcp")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--ddp-steps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="2 ranks, few sizes, 30 DDP steps")
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.rank:
        return rank_main(args)
    if args.binding:
        return binding_main(args)
    if args.quick:
        args.ranks, args.links, args.ddp_steps = "2", "shm", 30
        args.sizes = [8, 64 << 10, 4 << 20]
    outdir = os.path.join(ROOT, "bench", "results", time.strftime("torch-%Y%m%d-%H%M%S"))
    os.makedirs(outdir, exist_ok=True)
    results = []
    base = ["--reps", str(args.reps), "--sizes", ",".join(map(str, args.sizes)),
            "--ddp-steps", str(args.ddp_steps)]
    for n in [int(x) for x in args.ranks.split(",")]:
        for links in args.links.split(","):
            env = {} if links == "shm" else {"HCCL_LINKS": "tcp"}
            res, log = run(n, env, ["--rank"] + base, 3000)
            results += res
            open(os.path.join(outdir, "log-%d-%s.txt" % (n, links)), "w").write(log)
        res, _ = run(n, {}, ["--binding", "--reps", str(args.reps)], 600)
        results += res
        perf = subprocess.run([os.path.join(BUILD, "tools", "hccl-run"), "-n", str(n),
                               "--timeout", "300", os.path.join(BUILD, "tools", "hccl-perf"),
                               "-C", "allreduce", "-b", "8", "-e", "8", "-d", "float32", "-z", "1"],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        results.append({"kind": "hccl-perf", "nranks": n, "output": perf.stdout.strip()})
    with open(os.path.join(outdir, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    text = summarize(results)
    open(os.path.join(outdir, "summary.txt"), "w").write(text + "\n")
    print(text)
    print("results in", outdir)


if __name__ == "__main__":
    main()
