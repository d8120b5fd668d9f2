"""examples/python, each run as a user would, with its output checked."""
import os

from conftest import HERE, launch

EX = os.path.join(HERE, "..", "..", "examples", "python")


def test_allreduce_example():
    r = launch(3, os.path.join(EX, "allreduce.py"))
    assert any("result correct" in l for l in r.lines(0)), r.out


def test_asyncio_example():
    r = launch(3, os.path.join(EX, "asyncio_loop.py"))
    for k in range(3):
        line = [l for l in r.lines(k) if l.startswith("asyncio_loop: rank %d:" % k)]
        assert line and "160 collectives awaited and correct, 20 socket echoes" in line[0], r.out
