"""Separate rollout and training pools in the trainer (trainer/separate.py): real torchrun jobs on CPU.

A 2 + 2 process run at staleness 1 trains on samples at most one policy version old, logs the weight
version per step and finite losses, and corrects off-policy samples with truncated importance weights;
a staleness-0 separate run (2 rollout + 2 training processes) reproduces the colocated run's losses
(2 processes training and sampling) on the same seed, also when the training pool streams the step's
mini-batches (``placement.stream``) and starts updating before the last one is generated.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer_harness import train_run

REWARD = f"{Path(__file__).resolve().parent / '_placement_reward.py'}:reward"


def _cfg(
    tmp: Path,
    *,
    separate: bool,
    staleness: int = 0,
    steps: int = 3,
    sync_interval: int = 1,
    recompute_logprobs: bool = True,
    checkpoint_every: int | None = None,
    stream: bool = False,
    mini_batch: int = 4,
    response_len: int = 6,
    mbs: int = 8,
    max_num_seqs: int = 256,
):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    gpus = 4 if separate else 2
    return RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus),
        strategy=Strategy.of(mbs=mbs, recompute="none", rollout_tp=1, max_num_seqs=max_num_seqs),
        workload=Workload(
            prompts=8, n=4, prompt_len=8, response_len=response_len, mini_batch=mini_batch, kl=False, dtype="fp32"
        ),
        trainer=TrainerOptions(
            steps=steps,
            lr=3e-3,
            dataset="synthetic",
            reward=REWARD,
            out_dir=str(tmp / "run"),
            checkpoint_every=steps if checkpoint_every is None else checkpoint_every,
            rollout_engine="megatron",
        ),
        placement=Placement(
            mode="separate",
            rollout_gpus=2,
            staleness=staleness,
            sync_interval=sync_interval,
            recompute_logprobs=recompute_logprobs,
            stream=stream,
        )
        if separate
        else Placement(),
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


@pytest.mark.slow
def test_sync_every_two_updates_then_resume_replays_the_run(tmp_path):
    # staleness 2, weights to the rollout pool after every 2nd update: batch s uses version 2 * ceil((s - 2) / 2)
    full = train_run(
        _cfg(tmp_path / "a", separate=True, staleness=2, sync_interval=2, steps=4), tmp_path / "a", timeout=420
    )
    assert [r["weight_version"] for r in full] == [0, 1, 2, 3]
    assert [r["sample_version"] for r in full] == [0, 0, 0, 2]
    assert [r["sample_age"] for r in full] == [0, 1, 2, 1]  # never more than the staleness
    assert [r["rollout_version"] for r in full] == [0, 2, 2, 2]  # version 2 is the only one sent after the start
    assert all(r["sync_interval"] == 2 for r in full)
    assert all(math.isfinite(r["loss"]) for r in full) and any(abs(r["loss"]) > 0 for r in full)
    # the same run killed after 2 steps (its checkpoint) and resumed: the rollout pool's next batches are
    # generated with version 0 again (kept in the checkpoint), so steps 3 and 4 replay the uninterrupted run
    b = tmp_path / "b"
    first = train_run(_cfg(b, separate=True, staleness=2, sync_interval=2, steps=2), b, timeout=420)
    assert [r["step"] for r in first] == [1, 2]
    rows = train_run(_cfg(b, separate=True, staleness=2, sync_interval=2, steps=4), b, timeout=420)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["sample_version"] for r in rows] == [0, 0, 0, 2]
    for a, r in zip(full, rows):
        assert r["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-6)
        assert r["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert r["is_weight_mean"] == pytest.approx(a["is_weight_mean"], abs=1e-6)


@pytest.mark.slow
def test_rollout_logprobs_as_the_old_ones_skip_the_old_pass(tmp_path):
    # recompute_logprobs false (verl's bypass_mode): the PPO ratio is taken against the behaviour policy
    rows = train_run(
        _cfg(tmp_path, separate=True, staleness=1, steps=3, recompute_logprobs=False), tmp_path, timeout=420
    )
    assert [r["sample_age"] for r in rows] == [0, 1, 1]
    assert all(r["old_logprob_micro_batches"] == 0 and r["phases_s"]["old_logprob"] == 0 for r in rows)
    assert all(r["is_weight_mean"] == 1.0 and r["is_truncated_frac"] == 0.0 for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows) and any(abs(r["loss"]) > 0 for r in rows)


@pytest.mark.slow
def test_streamed_step_updates_before_the_last_group_and_matches_colocated(tmp_path):
    # 4 mini-batches of 2 prompt groups (8 sequences); the rollout pool's 2 replicas hold 4 sequences each at once,
    # so it samples the step in 4 waves of one mini-batch and queues each as it is done; the training pool trains it
    kw = dict(mini_batch=2, response_len=12, mbs=4, max_num_seqs=4)
    sep = train_run(
        _cfg(tmp_path / "sep", separate=True, stream=True, recompute_logprobs=False, **kw),
        tmp_path / "sep",
        timeout=420,
    )
    col = train_run(_cfg(tmp_path / "col", separate=False, **kw), tmp_path / "col", timeout=420)
    assert [r["sample_age"] for r in sep] == [0, 0, 0]  # on-policy: every group of step t from the weights after t-1
    for r in sep:
        ev = r["stream_events"]
        assert r["stream"] is True and r["stream_units"] == 4 and [e["unit"] for e in ev] == [0, 1, 2, 3]
        assert [e["wave"] for e in ev] == [0, 1, 2, 3]
        # (a) the first mini-batch's update starts before the last mini-batch is generated (both clocks: time.time())
        assert ev[0]["update_start_s"] < ev[-1]["ready_s"] == pytest.approx(r["stream_gen_end_s"])
        assert all(e["ready_s"] <= e["got_s"] <= e["update_start_s"] <= e["update_end_s"] for e in ev)
        assert r["stream_overlap_s"] > 0 and 0 < r["stream_first_wait_s"] < r["step_s"]
        assert r["old_logprob_micro_batches"] == 0  # the rollout's log-probs are the old ones
    # (b) the streamed losses are the colocated run's (same seed, data order and plan)
    assert any(abs(r["loss"]) > 1e-6 for r in col)
    for a, b in zip(sep, col):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["response_len"] == b["response_len"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["pg_loss"] == pytest.approx(b["pg_loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


@pytest.mark.slow
def test_streamed_step_with_recomputed_old_logprobs_weighs_the_later_mini_batches(tmp_path):
    # recompute_logprobs true: mini-batch k's old log-probs come from the weights after k updates of the step (as
    # verl's fully-async trainer computes them), corrected to the rollout's by truncated importance weights
    rows = train_run(
        _cfg(tmp_path, separate=True, stream=True, steps=2, mini_batch=2, response_len=12, mbs=4), tmp_path, timeout=420
    )
    assert [r["sample_age"] for r in rows] == [0, 0] and all(r["stream_units"] == 4 for r in rows)
    # the whole batch fits the pool's replicas at once (max_num_seqs 256): one sampling call, every mini-batch
    # queued when it ends (as the cost model prices a batch that runs at once); the passes still go per mini-batch
    assert all([e["wave"] for e in r["stream_events"]] == [0, 0, 0, 0] for r in rows)
    assert all(r["old_logprob_micro_batches"] > 0 and r["phases_s"]["old_logprob"] > 0 for r in rows)
    # the first mini-batch is on-policy (weight 1); the updates before the later ones move their weights off 1
    assert all(abs(r["is_weight_mean"] - 1.0) > 1e-4 and r["is_weight_mean"] <= 2.0 for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows)
