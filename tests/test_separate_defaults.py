"""Issue 36: a separate rollout pool priced without a memory fraction takes the framework's own for that mode (verl
0.9.1: rollout.gpu_memory_utilization 0.5, which its fully-async standalone fraction falls back to; NeMo-RL 0.7.0:
0.8, its async performance recipes'), not the colocated 0.6, and the output says so."""

from __future__ import annotations

import json

import pytest

from grpo_tune.cli.main import main

BASE = ["estimate", "--model", "qwen2.5-7b", "--gpus", "16", "--placement", "separate", "--rollout-gpus", "8"]


@pytest.mark.parametrize(("fw", "frac"), [("verl", 0.5), ("nemo-rl", 0.8)])
def test_separate_pool_memory_default_is_the_frameworks(capsys, fw, frac):
    assert main([*BASE, "--staleness", "1", "--framework", fw, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"]["gpu_memory_utilization"] == frac
    assert f"gpu_memory_utilization {frac}: the framework's default for a separate pool" in d["rollout_memory_default"]
    assert main([*BASE, "--staleness", "1", "--framework", fw]) == 0
    assert "the framework's default for a separate pool" in " ".join(capsys.readouterr().out.split())


def test_a_set_fraction_is_kept_and_colocated_is_unchanged(capsys):
    assert main([*BASE, "--staleness", "1", "--gpu-memory-utilization", "0.7", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"]["gpu_memory_utilization"] == 0.7 and "rollout_memory_default" not in d
    assert main(["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"]["gpu_memory_utilization"] == 0.6 and "rollout_memory_default" not in d


def test_verl_default_is_the_wheels():
    """The 0.5 is verl 0.9.1's own rollout default (its config snapshot, read from the wheel) and its fully-async
    standalone fraction is null (falls back to it)."""
    from grpo_tune import frameworks as F
    from grpo_tune.frameworks.verl import snapshot

    v = F.separate_memory(("verl",))[0]
    base = json.loads(snapshot.SNAPSHOT.read_text())["keys"]
    assert base["actor_rollout_ref.rollout.gpu_memory_utilization"] == v
    fa = json.loads((snapshot.DATA_DIR / "verl-0.9.1-fully-async-keys.json").read_text())["keys"]
    assert fa["actor_rollout_ref.rollout.standalone_gpu_memory_utilization"] is None


@pytest.mark.parametrize(("fw", "frac"), [("verl", 0.6), ("nemo-rl", 0.8)])
def test_search_ties_take_the_frameworks_separate_fraction(capsys, fw, frac):
    """search --placement separate: where every vLLM memory fraction of the grid (0.6 .. 0.9) prices the same
    generation (Qwen2.5-1.5B, 256 sequences on 2 rollout GPUs: max_num_seqs binds, not the KV cache), the plan takes
    the grid value nearest the framework's own for a separate pool (verl 0.5 -> 0.6, NeMo-RL 0.8), not the smallest;
    both price the same step."""
    args = ["search", "--model", "qwen2.5-1.5b", "--gpus", "8", "--placement", "separate", "--rollout-gpus", "2"]
    args += ["--staleness", "1", "--prompts", "64", "--n", "4", "--mini-batch", "16", "--no-emit", "--json"]
    assert main([*args, "--framework", fw]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["strategy"]["gpu_memory_utilization"] == frac
    assert d["best"]["placement"]["concurrency_bound"] == "max_num_seqs"
