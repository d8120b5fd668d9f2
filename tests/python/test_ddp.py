"""DDP on "hostccl" (examples/python/ddp_train.py): after 50 steps the parameters are
bit-identical on every rank and within 1e-5 of the same run on Gloo."""
import os

import pytest

from conftest import HERE, launch

torch = pytest.importorskip("torch")
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "ddp_train.py")


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(n, tmp_path):
    out = {}
    for backend in ("hostccl", "gloo"):
        path = tmp_path / ("%s.pt" % backend)
        r = launch(n, EXAMPLE, "--backend", backend, "--steps", 50, "--save", path,
                   env={"PYTHONWARNINGS": "ignore"}, timeout=150)
        assert any("identical on every rank: True" in l for l in r.lines(0)), r.out
        out[backend] = torch.load(path)
    diff = (out["hostccl"] - out["gloo"]).abs().max().item()
    assert diff <= 1e-5, diff
