"""hccl.aio: an asyncio loop that awaits collectives while it serves a timer and a socket.

    build/tools/hccl-run -n 4 /usr/bin/python3 examples/python/asyncio_loop.py

Each rank runs a small TCP echo server and a client talking to it, a periodic timer, and
a stream of AllReduces awaited in batches (asyncio.gather). The collectives complete through
the communicator's completion fd on the loop; nothing blocks the loop.
"""
import asyncio

import numpy as np

import hccl
import hccl.aio  # noqa: F401  (awaiting a Request uses it)


async def echo(reader, writer):
    while data := await reader.readline():
        writer.write(data)
        await writer.drain()
    writer.close()


async def main(comm):
    ticks = 0
    stop = asyncio.Event()

    async def timer():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t = asyncio.create_task(timer())

    echoes, rounds, batch = 0, 20, 8
    for r in range(rounds):
        bufs = [np.full(4096, comm.rank + r + k, np.float64) for k in range(batch)]
        writer.write(b"round %d\n" % r)
        results = await asyncio.gather(*(comm.all_reduce_async(b) for b in bufs))
        line = await reader.readline()
        echoes += line == b"round %d\n" % r
        for k, b in enumerate(results):
            want = comm.nranks * (r + k) + comm.nranks * (comm.nranks - 1) / 2
            assert np.all(b == want), (r, k, b[0], want)
    await comm.barrier_async()
    stop.set()
    await t
    writer.close()
    server.close()
    await server.wait_closed()
    return rounds * batch, echoes, ticks


with hccl.Comm.from_env() as comm:
    colls, echoes, ticks = asyncio.run(main(comm))
    print("asyncio_loop: rank %d: %d collectives awaited and correct, %d socket echoes, "
          "timer ran %d times" % (comm.rank, colls, echoes, ticks), flush=True)
