"""Separate rollout and training pools in the trainer (trainer/separate.py): real torchrun jobs on CPU.

A 2 + 2 process run at staleness 1 trains on samples at most one policy version old, logs the weight
version per step and finite losses, and corrects off-policy samples with truncated importance weights;
a staleness-0 separate run (2 rollout + 2 training processes) reproduces the colocated run's losses
(2 processes training and sampling) on the same seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer_harness import train_run

REWARD = f"{Path(__file__).resolve().parent / '_placement_reward.py'}:reward"


def _cfg(tmp: Path, *, separate: bool, staleness: int = 0, steps: int = 3):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    gpus = 4 if separate else 2
    return RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus),
        strategy=Strategy.of(mbs=8, recompute="none", rollout_tp=1),
        workload=Workload(prompts=8, n=4, prompt_len=8, response_len=6, mini_batch=4, kl=False, dtype="fp32"),
        trainer=TrainerOptions(
            steps=steps,
            lr=3e-3,
            dataset="synthetic",
            reward=REWARD,
            out_dir=str(tmp / "run"),
            checkpoint_every=steps,
            rollout_engine="megatron",
        ),
        placement=Placement(mode="separate", rollout_gpus=2, staleness=staleness) if separate else Placement(),
    )


@pytest.mark.slow
def test_two_plus_two_at_staleness_one(tmp_path):
    rows = train_run(_cfg(tmp_path, separate=True, staleness=1, steps=4), tmp_path, timeout=420)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["weight_version"] for r in rows] == [0, 1, 2, 3]
    # batch s is generated with version max(0, s - 1): at most one version old, and one-step-off after the first
    assert [r["sample_version"] for r in rows] == [0, 0, 1, 2]
    assert all(0 <= r["sample_age"] <= 1 for r in rows)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["pg_loss"]) for r in rows)
    assert any(abs(r["loss"]) > 0 for r in rows)  # the dense reward gives the groups advantages
    # on-policy samples weigh 1; a stale batch's importance weights move off 1 (and stay truncated at 2)
    assert rows[0]["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    stale = [r for r in rows if r["sample_age"] == 1 and r["step"] > 2]
    assert stale and any(abs(r["is_weight_mean"] - 1.0) > 1e-4 for r in stale)
    assert all(r["is_weight_mean"] <= 2.0 and r["is_weight_max"] > 0 for r in rows)
    assert all(r["phases_s"]["weight_sync"] >= 0 for r in rows)


@pytest.mark.slow
def test_staleness_zero_separate_matches_colocated(tmp_path):
    sep = train_run(_cfg(tmp_path / "sep", separate=True, staleness=0), tmp_path / "sep", timeout=420)
    col = train_run(_cfg(tmp_path / "col", separate=False), tmp_path / "col", timeout=420)
    assert [r["sample_age"] for r in sep] == [0, 0, 0]
    assert [r["weight_version"] for r in sep] == [r["sample_version"] for r in sep] == [0, 1, 2]
    assert any(abs(r["loss"]) > 1e-6 for r in col)  # a comparison of non-zero losses
    for a, b in zip(sep, col):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["pg_loss"] == pytest.approx(b["pg_loss"], abs=1e-5)
