"""GPU-only trainer checks (``pytest -m gpu``), the same functions benchmarks/gpu_checks.py runs
on a GPU machine without pytest: the hybrid CPU optimizer lowers GPU memory by the cost model's
figure (within 15%), bf16 tracks fp32 at world size 1, and ``profile`` reports the CUDA
allocator's per-phase peaks on a 0.5B model. On CPU these skip; the CPU no-op is checked here too."""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _cuda() -> bool:
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.parametrize("check", ["cpu_optimizer", "bf16", "profile"])
def test_gpu_check(check, tmp_path):
    if not _cuda():
        pytest.skip("needs CUDA")
    import gpu_checks

    r = gpu_checks.CHECKS[check](tmp_path)
    assert r["ok"], r


def test_cpu_optimizer_is_a_stated_no_op_on_cpu(caplog):
    pytest.importorskip("megatron.core")
    from core.strategy import Strategy
    from trainer.engine import optimizer_offload_kwargs

    s = Strategy(cpu_optimizer=0.5, overlap_cpu_optimizer=True, precision_aware_optimizer=True)
    with caplog.at_level(logging.WARNING, logger="trainer.engine"):
        assert optimizer_offload_kwargs(s, cuda=False) == {}
    assert "no-op on CPU" in caplog.text and "cpu_optimizer" in caplog.text
    assert optimizer_offload_kwargs(s, cuda=True) == {
        "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": True}
    assert importlib.util.find_spec("trainer.engine") is not None
