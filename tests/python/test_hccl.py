"""The hccl package: argument checks and errors in one process, the collectives and failures
on several ranks (through hccl-run)."""
import asyncio
import os

import numpy as np
import pytest

import hccl
import hccl.aio
from conftest import launch


@pytest.fixture(scope="module")
def comm():
    c = hccl.Comm(1, hccl.get_unique_id(), 0)
    yield c
    c.destroy()


def test_version_and_unique_id():
    assert hccl.__version__.count(".") == 2
    uid = hccl.get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == hccl.UNIQUE_ID_BYTES
    text = hccl.unique_id_to_string(uid)
    assert hccl.unique_id_from_string(text) == uid
    with pytest.raises(hccl.InvalidArgumentError):
        hccl.unique_id_from_string("not hex")


def test_errors_carry_code_and_message(comm):
    x = np.ones(8, np.float32)
    with pytest.raises(hccl.InvalidArgumentError) as e:
        comm.all_reduce(x, op="xor")
    assert e.value.code == hccl.Result.INVALID_ARGUMENT
    assert "op" in e.value.message and "'xor'" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, hccl.Error)
    with pytest.raises(hccl.InvalidArgumentError, match="root 1 is not a rank"):
        comm.broadcast(x, root=1)
    with pytest.raises(hccl.InvalidArgumentError, match="recvbuf holds 4 elements, expected 8"):
        comm.all_reduce(x, np.zeros(4, np.float32))
    with pytest.raises(hccl.InvalidArgumentError, match="different dtypes"):
        comm.all_reduce(x, np.zeros(8, np.float64))
    with pytest.raises(hccl.InvalidArgumentError, match="not a writable"):
        comm.all_reduce(b"12345678")
    with pytest.raises(hccl.InvalidArgumentError, match="not a dtype hccl has"):
        comm.all_reduce(np.ones(4, np.int16))
    with pytest.raises(hccl.InvalidArgumentError, match="not contiguous|C-contiguous"):
        comm.all_reduce(np.ones((4, 4), np.float32)[:, 1])
    with pytest.raises(hccl.InvalidArgumentError, match="lies outside"):
        comm.all_to_allv(x, [9], [0], np.zeros(8, np.float32), [8], [0])
    with pytest.raises(TypeError):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(hccl.InvalidArgumentError, match=r"sendcounts\[0\]: expected a non-negative"):
        comm.all_to_allv(x, [-1], [0], np.zeros(8, np.float32), [8], [0])

    # A value whose conversion fails for another reason than its value raises that, not a
    # made-up InvalidArgumentError.
    class Unprintable:
        def __str__(self):
            raise RuntimeError("cannot print")

    with pytest.raises(RuntimeError, match="cannot print"):
        comm.all_reduce(x, dtype=Unprintable())
    with pytest.raises(hccl.InvalidArgumentError, match="dtype: expected one of"):
        comm.all_reduce(x, dtype=object())
    assert issubclass(hccl.TimeoutError, TimeoutError)
    assert hccl.error_string(5)


def test_from_the_library(comm):
    # Errors the C library itself reports keep its message.
    with pytest.raises(hccl.InvalidArgumentError) as e:
        hccl.Comm(0, hccl.get_unique_id(), 0)
    assert e.value.code == hccl.Result.INVALID_ARGUMENT and e.value.message


def test_use_after_destroy():
    c = hccl.Comm(1, hccl.get_unique_id(), 0)
    assert (c.rank, c.nranks) == (0, 1)
    c.destroy()
    assert c.closed
    with pytest.raises(hccl.InvalidUsageError, match="destroyed"):
        c.all_reduce(np.ones(2))
    c.destroy()  # twice is fine


def test_one_rank_forms(comm):
    x = np.arange(10, dtype=np.float64)
    assert comm.all_reduce(x) is x
    req = comm.all_reduce_async(x, op="max")
    assert req.wait() is x and req.done and req.test()
    bf = np.array([0x3F80, 0x4000], np.uint16)  # bfloat16 1.0, 2.0
    comm.all_reduce(bf, dtype="bfloat16")
    assert bf.tolist() == [0x3F80, 0x4000]
    empty = np.zeros(0, np.float32)
    assert comm.all_reduce_async(empty).wait() is empty
    with comm.split(0) as sub:
        assert sub.nranks == 1
    assert comm.split(hccl.SPLIT_NOCOLOR) is None
    assert comm.async_error() is None
    assert isinstance(comm.dump_state(), str)


def test_torch_tensors(comm):
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool):
        t = torch.ones(5, dtype=dt)
        assert comm.all_reduce(t) is t
        assert t.tolist() == torch.ones(5, dtype=dt).tolist()
    with pytest.raises(hccl.InvalidArgumentError, match="not contiguous"):
        comm.all_reduce(torch.ones(4, 4)[:, 1])
    with pytest.raises(hccl.InvalidArgumentError, match="sparse"):
        comm.all_reduce(torch.ones(4).to_sparse())
    with pytest.raises(hccl.InvalidArgumentError, match="not supported"):
        comm.all_reduce(torch.ones(4, dtype=torch.int16))


def test_aio_one_rank(comm):
    async def main():
        xs = [np.full(8, k, np.int32) for k in range(50)]
        out = await asyncio.gather(*(comm.all_reduce_async(x) for x in xs))
        assert all(a is b for a, b in zip(out, xs))
        return await comm.barrier_async()

    assert asyncio.run(main()) is None


@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives(n):
    r = launch(n, "collectives.py", timeout=120)
    for rank in range(n):
        assert "collectives ok" in r.lines(rank), r.out


def test_collectives_tcp():
    r = launch(3, "collectives.py", env={"HCCL_LINKS": "tcp"}, timeout=120)
    assert all("collectives ok" in r.lines(k) for k in range(3)), r.out


def test_mismatch_raises_invalid_usage():
    r = launch(3, "failures.py", "mismatch", env={"HCCL_CHECK": "1"})
    lines = [l for k in range(3) for l in r.lines(k) if l.startswith("rank %d: " % k)]
    assert len(lines) == 3, r.out
    assert any("InvalidUsageError code 2" in l and "allreduce" in l and "broadcast" in l
               for l in lines), r.out
    assert all(" code " in l for l in lines), r.out


def test_exec_timeout_raises_timeout_error(tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    r = launch(2, "failures.py", "timeout", fifo, env={"HCCL_EXEC_TIMEOUT": "1"})
    assert any(l.startswith("rank 0: TimeoutError code 5") and "exec timeout" in l
               for l in r.lines(0)), r.out
    assert any(l.startswith("rank 1: ") and " code " in l for l in r.lines(1)), r.out


def test_killed_peer_raises_on_every_survivor():
    r = launch(3, "failures.py", "kill", env={"HCCL_RUN_GRACE_S": "20"}, check=False)
    assert r.rc != 0 and "killed by signal 9" in r.out, r.out
    for k in range(2):
        line = [l for l in r.lines(k) if l.startswith("rank %d: RemoteError code 4" % k)]
        assert line, r.out
        # within seconds, never a hang
        assert float(line[0].split(" after ")[1].split(" s")[0]) < 10, line
