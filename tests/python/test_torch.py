"""torch.distributed on "hostccl": every op and dtype, futures and errors (ranks/torch_ops.py),
at 2 and 4 ranks, rendezvous through a FileStore."""
import pytest

from conftest import launch

pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 4])
def test_torch_ops(n, tmp_path):
    r = launch(n, "torch_ops.py", tmp_path / "store", env={"PYTHONWARNINGS": "ignore"},
               timeout=150)
    for k in range(n):
        assert "torch ops ok" in r.lines(k), r.out
