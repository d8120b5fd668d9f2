"""Shared by the Python tests: starting ranks through hccl-run, with a hard time bound.

ctest sets HCCL_RUN (the launcher) and PYTHONPATH (build/python); run by hand:
    HCCL_RUN=build/tools/hccl-run PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def hccl_run_path():
    path = os.environ.get("HCCL_RUN")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("HCCL_RUN (the path of build/tools/hccl-run) is not set")
    return path


class Ranks:
    def __init__(self, rc, out):
        self.rc = rc
        self.out = out

    def lines(self, rank):
        tag = "[%d]: " % rank
        return [l[len(tag):] for l in self.out.splitlines() if l.startswith(tag)]


def launch(n, script, *args, env=None, timeout=60, check=True):
    """Runs tests/python/ranks/<script> (or the script at that path) on n ranks; returns their tagged output.

    hccl-run's own --timeout ends every rank (and reports their state) before ours does, so
    no process outlives the test."""
    cmd = [hccl_run_path(), "-n", str(n), "--timeout", str(timeout), "--tag-output",
           sys.executable, os.path.join(HERE, "ranks", str(script))] + [str(a) for a in args]
    e = dict(os.environ)
    e.setdefault("HCCL_CONNECT_TIMEOUT", "60")
    e["OMP_NUM_THREADS"] = "1"
    if env:
        e.update(env)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e,
                       timeout=timeout + 30, text=True)
    r = Ranks(p.returncode, p.stdout)
    if check and p.returncode != 0:
        pytest.fail("%s on %d ranks exited %d:\n%s" % (script, n, p.returncode, p.stdout))
    return r


@pytest.fixture
def ranks():
    return launch
