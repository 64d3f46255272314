"""Bounds on absurd numbers (core/bounds.py): every integer option of every command, and every count a verl launch
or a NeMo-RL recipe states, at 2**63 gets a coded answer within a second (in-process). Before, `search --gpus
1000000000000000000` (and a launch with trainer.nnodes=125000000000000000, a recipe with num_nodes or
num_prompts_per_step at 2**63) walked divisors for minutes or tuned and wrote the value."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from grpo_tune.cli.main import _int_options, main
from grpo_tune.core import bounds

ROOT = Path(__file__).resolve().parent.parent
BIG = str(2**63)
OPTIONS = sorted(
    (path, opt)
    for path, opts in _int_options().items()
    for opt, param in opts.items()
    if opt.startswith("--") and path and param not in bounds.OWN_CHECK
)
"""Every integer option of every command but the few with a sharper check of their own (--top, --warmup, --seq-len:
tests/test_hostile_input.py times them)."""


def _answer(capsys, argv: list[str]) -> tuple[int, str, float]:
    """Exit code, stderr and seconds of ``main(argv)``, timed on a second call (the first imports modules)."""
    main(argv)
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(argv)
    dt = time.monotonic() - t0
    return rc, capsys.readouterr().err, dt


def test_the_sweep_covers_the_flags_of_the_issue():
    have = {(p[0], o) for p, o in OPTIONS}
    for pair in [("search", "--gpus"), ("search", "--gbs"), ("search", "--prompts"), ("estimate", "--gpus")]:
        assert pair in have
    assert len(OPTIONS) > 60


@pytest.mark.parametrize("path,opt", OPTIONS, ids=[f"{' '.join(p)} {o}" for p, o in OPTIONS])
def test_every_integer_option_at_2_63_is_refused_at_its_bound_within_a_second(capsys, path, opt):
    rc, err, dt = _answer(capsys, [*path, opt, BIG])
    assert rc == 2 and "[BAD_CONFIG]" in err and "bound of" in err and "hint:" in err, err
    assert dt < 1.0


def test_a_value_at_the_bound_passes_the_bound():
    bounds.check("gpus", bounds.MAX_GPUS, bounds.MAX_GPUS)
    with pytest.raises(bounds.ConfigError):
        bounds.check("gpus", bounds.MAX_GPUS + 1, bounds.MAX_GPUS)


def test_search_at_the_gpu_bound_answers_quickly(capsys):
    rc, err, dt = _answer(capsys, ["search", "-m", "7b", "-g", str(bounds.MAX_GPUS), "--no-emit"])
    assert rc == 2 and "[INVALID_DEGREES]" in err and dt < 10  # the walk is short at the bound (about 1.5 s)


VERL = ROOT / "examples/verl-upstream/qwen2-7b-math-megatron.sh"
VERL_KEYS = [
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
]


@pytest.mark.parametrize("key", VERL_KEYS)
def test_a_verl_launch_count_at_2_63_is_refused_within_a_second(tmp_path, capsys, key):
    text = VERL.read_text()
    new, k = re.subn(re.escape(key) + r"=\d+", f"{key}={BIG}", text)
    assert k == 1
    p = tmp_path / "launch.sh"
    p.write_text(new)
    rc, err, dt = _answer(capsys, ["tune", str(p), "--no-emit"])
    assert rc == 2 and re.search(r"\[(BAD_CONFIG|INVALID_DEGREES)\]", err), err
    assert dt < 1.0
    rc, err, dt = _answer(capsys, ["diagnose", str(p)])  # diagnose holds the launch to the same bounds
    assert rc == 2 and "[BAD_CONFIG]" in err and key in err and "bound" in err and dt < 1.0, err


RECIPE = ROOT / "examples/nemo-rl-upstream/grpo-qwen3-30ba3b-4n8g.yaml"
RECIPE_KEYS = [
    "num_prompts_per_step",
    "num_generations_per_prompt",
    "train_global_batch_size",
    "train_micro_batch_size",
    "logprob_batch_size",
    "max_total_sequence_length",
    "tensor_model_parallel_size",
    "gpus_per_node",
    "num_nodes",
]


@pytest.mark.parametrize("key", RECIPE_KEYS)
def test_a_nemo_rl_recipe_count_at_2_63_is_refused_within_a_second(tmp_path, capsys, key):
    new, k = re.subn(rf"(\n\s*{key}): \d+", rf"\1: {BIG}", RECIPE.read_text(), count=1)
    assert k == 1
    p = tmp_path / "recipe.yaml"
    p.write_text(new)
    rc, err, dt = _answer(capsys, ["tune", str(p), "--no-emit"])
    assert rc == 2 and re.search(r"\[(BAD_CONFIG|INVALID_DEGREES)\]", err), err
    assert dt < 1.0
    if key in ("num_nodes", "num_prompts_per_step", "num_generations_per_prompt", "train_global_batch_size"):
        assert key in err  # the recipe's own key is named, not a derived count
    rc, err, dt = _answer(capsys, ["diagnose", str(p)])  # diagnose holds the recipe to the same bounds
    assert rc == 2 and "[BAD_CONFIG]" in err and "bound" in err and dt < 1.0, err  # (or a key interpolated from it)


def test_num_prompts_per_step_at_2_63_is_named_and_bounded(tmp_path, capsys):
    p = tmp_path / "recipe.yaml"
    p.write_text(RECIPE.read_text().replace("num_prompts_per_step: 64", f"num_prompts_per_step: {BIG}"))
    rc, err, _ = _answer(capsys, ["tune", str(p), "--out", str(tmp_path / "runs")])
    assert rc == 2 and "num_prompts_per_step" in err and "16,777,216" in err
    assert not (tmp_path / "runs").exists()
