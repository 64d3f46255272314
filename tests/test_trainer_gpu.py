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
    from grpo_tune.core.strategy import Strategy
    from grpo_tune.trainer.optim import optimizer_offload_kwargs

    s = Strategy.of(cpu_optimizer=0.5, overlap_cpu_optimizer=True, precision_aware_optimizer=True)
    with caplog.at_level(logging.WARNING, logger="grpo_tune.trainer.optim"):
        assert optimizer_offload_kwargs(s, cuda=False) == {}
    assert "no-op on CPU" in caplog.text and "cpu_optimizer" in caplog.text
    assert optimizer_offload_kwargs(s, cuda=True) == {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 0.5,
        "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": True,
    }
    assert importlib.util.find_spec("grpo_tune.trainer.engine") is not None


def task_thd(spec: dict) -> dict:
    """Token-budget log-probs with THD packing (TE) vs the padded fixed-mbs pass, one GPU."""
    import torch

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from trainer_harness import run_config

    parallel.init_distributed()
    cfg = run_config("tiny", {}, 1, dtype="bf16")
    parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
    eng = Engine(cfg)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, cfg.model.vocab, (8, 24), generator=g)
    lengths = torch.tensor([24, 9, 17, 12, 24, 5, 20, 14])
    ref, _ = eng.logprobs(tokens, micro_batch_size=8)
    thd, _ = eng.logprobs(tokens, micro_batch_size=8, max_tokens=48, lengths=lengths)
    mask = torch.arange(23)[None] < (lengths[:, None] - 1)
    parallel.destroy()
    return {"thd": eng.thd_packing, "max_abs_diff": float(((ref - thd).abs() * mask).max())}


@pytest.mark.gpu
def test_thd_packing_matches_padded_logprobs():
    """GPU with TransformerEngine: packed (THD) token-budget log-probs equal the padded pass's on
    every real position (bf16 tolerance)."""
    if not _cuda():
        pytest.skip("needs CUDA")
    pytest.importorskip("transformer_engine")
    from trainer_harness import torchrun_json

    r = torchrun_json("test_trainer_gpu:task_thd", nproc=1, spec={}, timeout=240)
    assert r["thd"] and r["max_abs_diff"] < 0.05, r
