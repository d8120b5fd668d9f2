"""DistributedDataParallel on the "hostccl" backend: a small MLP on synthetic data.

    build/tools/hccl-run -n 4 /usr/bin/python3 examples/python/ddp_train.py
    torchrun --nproc-per-node 4 examples/python/ddp_train.py

Under torchrun the process group takes torchrun's store (env://). Under hccl-run, rank 0
serves a c10d TCPStore on the address hccl-run gave the job (HCCL_COMM_ID), which nothing
else uses then: hostccl makes its own rendezvous through the store. Prints the loss and, on
rank 0, a checksum of the parameters that every rank must share.
"""
import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import hccl.torch  # noqa: F401  registers "hostccl"


def init(backend, timeout):
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=n,
                                timeout=timeout)
    else:
        host, port = os.environ["HCCL_COMM_ID"].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), n, rank == 0, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=n, timeout=timeout)
    return rank, n


def mlp(width, depth, classes=10, inputs=64):
    layers, d = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, classes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="hostccl")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=1.0)
    ap.add_argument("--save", help="write the final parameters (rank 0) to this file")
    ap.add_argument("--times", help="write each step's time (seconds, rank 0) to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, n = init(args.backend, timedelta(seconds=120))

    torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
    model = nn.parallel.DistributedDataParallel(mlp(args.width, args.depth),
                                                bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print("step %d loss %.4f" % (step, loss.item()), flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    same = all(torch.equal(everyone[0], e) for e in everyone)
    if rank == 0:
        print("ddp_train: %s, %d ranks, %d steps, %d parameters, checksum %.6f, identical on "
              "every rank: %s" % (args.backend, n, args.steps, flat.numel(),
                                  flat.double().sum().item(), same), flush=True)
        if args.save:
            torch.save(flat, args.save)
        if args.times:
            with open(args.times, "w") as f:
                f.write("\n".join("%.9f" % t for t in times) + "\n")
    dist.destroy_process_group()
    if not same:
        raise SystemExit("parameters differ across ranks")


if __name__ == "__main__":
    main()
