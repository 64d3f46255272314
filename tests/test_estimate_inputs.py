"""Inputs search/estimate must refuse or flag before pricing a plan (fix pass 1):
batches DP cannot split, sequences longer than the model's positions."""

from __future__ import annotations

import json

import pytest

from grpo_tune.cli.main import main


def _run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_reports_batch_divisibility(capsys):
    # 1024 prompts x n=5 = 5120 sequences and a 256 x 5 mini-batch do not split over dp=3
    rc, out, _ = _run(capsys, "estimate", "--model", "7b", "--gpus", "3", "--json")
    assert rc == 0
    codes = [v["code"] for v in json.loads(out)["violations"]]
    assert "BATCH_DIVISIBILITY" in codes
    rc, out, _ = _run(capsys, "estimate", "--model", "7b", "--gpus", "3")
    assert rc == 0 and "BATCH_DIVISIBILITY" in out and "dp=3" in out


def test_estimate_divisible_batch_has_no_divisibility_violation(capsys):
    rc, out, _ = _run(capsys, "estimate", "--model", "7b", "--gpus", "8", "--json")
    assert rc == 0
    assert "BATCH_DIVISIBILITY" not in {v["code"] for v in json.loads(out)["violations"]}


@pytest.mark.parametrize("cmd", ["estimate", "search"])
def test_sequence_longer_than_positions_refused(capsys, cmd):
    # qwen2.5-math-7b holds 4096 positions (HF max_position_embeddings); 1024 + 4096 does not fit
    rc, out, err = _run(
        capsys, cmd, "--model", "qwen2.5-math-7b", "--gpus", "8", "--prompt-len", "1024", "--response-len", "4096"
    )
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("[BAD_CONFIG]") and "5120" in lines[0] and "4096" in lines[0]
    assert lines[1].startswith("hint:") and "Traceback" not in err


def test_sequence_at_positions_accepted(capsys):
    rc, _, err = _run(
        capsys,
        "estimate",
        "--model",
        "qwen2.5-math-7b",
        "--gpus",
        "8",
        "--prompt-len",
        "1024",
        "--response-len",
        "3072",
        "--json",
    )
    assert rc == 0, err


def _update_parts(**strategy):
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel.estimate import estimate

    e = estimate(
        model=load_model("7b"),
        hardware=load_hardware("h100"),
        cluster=Cluster(gpus=8),
        strategy=Strategy.of(tp=2, **strategy),
        workload=Workload(),
    )
    return e.memory["update"].parts, e.memory["old_logprob"].parts


def test_sleeping_vllm_keeps_its_cuda_graphs_in_the_training_phases():
    """vLLM's sleep frees weights and KV cache, not the captured CUDA graphs' pool
    (vllm-project/vllm#56373): the training phases carry it unless vLLM runs eager."""
    from grpo_tune.costmodel.memory import CUDA_GRAPH_BYTES

    upd, olp = _update_parts()
    assert upd["vllm_cuda_graphs"] == olp["vllm_cuda_graphs"] == CUDA_GRAPH_BYTES
    upd, _ = _update_parts(enforce_eager=True)
    assert "vllm_cuda_graphs" not in upd
    upd, _ = _update_parts(free_cache_engine=False)  # vLLM stays awake: its whole budget is resident
    assert "vllm_cuda_graphs" not in upd and upd["vllm_resident"] > CUDA_GRAPH_BYTES
