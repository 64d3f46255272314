"""Offload between phases. GPU: memory really leaves the device and the next step is unchanged.
CPU: a no-op that says so. Run the GPU part with `pytest -m gpu tests/test_trainer_loop_offload.py`."""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from grpo_tune.core.config import RunConfig, TrainerOptions
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload


def _cfg(offload=("param", "grad", "optimizer"), dtype="bf16"):
    return RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("h100" if torch.cuda.is_available() else "cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(offload=tuple(offload), mbs=4),
        workload=Workload(prompts=2, n=4, prompt_len=8, response_len=4, mini_batch=2, dtype=dtype),
        trainer=TrainerOptions(lr=1e-3),
    )


class _Fake:
    chunks: list = []
    optimizer = None


def test_offload_on_cpu_is_a_no_op_that_says_so(caplog, monkeypatch):
    from grpo_tune.trainer.offload import Offloader

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="grpo_tune.trainer.offload"):
        off = Offloader(_Fake(), ("param", "optimizer"))
    assert not off.active
    assert "no-op on CPU" in caplog.text and "param,optimizer" in caplog.text
    off.offload()
    off.reload()
    assert not off.offloaded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offload_frees_device_memory_and_keeps_training_exact():
    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.offload import Offloader

    cfg = _cfg()
    parallel.init(cfg)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 128, (8, 12), generator=g)
    mask = torch.ones(8, 11)

    def loss_fn(lp, ent, mb):
        return -(lp * mb["mask"]).sum() / mb["mask"].sum(), {}

    losses = []
    for use in (False, True):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()  # what the previous engine left (nothing, after the gc below)
        eng = Engine(cfg)
        eng.train_step({"tokens": tokens, "mask": mask}, loss_fn, micro_batch_size=4)  # creates optimizer state
        off = Offloader(eng, cfg.strategy.memory.offload)
        if use:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            off.offload()
            after = torch.cuda.memory_allocated()
            # this engine's own state (params, grads, optimizer) must mostly leave the device
            assert before - after > 0.5 * (before - base), (base, before, after)
            off.reload()
        m = eng.train_step({"tokens": tokens, "mask": mask}, loss_fn, micro_batch_size=4)
        losses.append(m["loss"])
        del eng, off  # the Offloader holds its engine: drop both, then collect megatron's reference cycles
        gc.collect()
        torch.cuda.empty_cache()
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
