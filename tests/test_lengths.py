"""--lengths: statistics from a dataset (chars/token estimate without a tokenizer) or a run's log."""

from __future__ import annotations

import json

import pytest

from grpo_tune.autotune.lengths import CHARS_PER_TOKEN, read_lengths
from _inputs import grpo_inputs
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.costmodel.lengths import dist, quantiles_from_samples


def test_dataset_prompts_are_counted(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        {"prompt": "x" * 400, "response": "y" * 800},
        {"prompt": [{"role": "user", "content": "z" * 800}], "response": "w" * 1600},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = read_lengths(str(p), model=None, prompt_len=1024, response_len=1024)
    assert got["prompt_len_mean"] == round((400 + 800) / CHARS_PER_TOKEN / 2)
    assert got["response_len_mean"] == round((200 + 400) / 2)
    assert len(got["response_len_quantiles"]) == 20 and max(got["response_len_quantiles"]) <= 400
    assert "characters per token" in got["lengths_source"]


def test_verl_console_and_jsonl_logs(tmp_path):
    con = tmp_path / "verl.log"
    con.write_text(
        "step:1 - response_length/mean:500.0 - response_length/max:1024.0 - prompt_length/mean:100.0\n"
        "step:2 - response_length/mean:700.0 - prompt_length/mean:120.0\n"
    )
    got = read_lengths(str(con), model=None, prompt_len=512, response_len=2048)
    assert got["response_len_mean"] == 600 and got["prompt_len_mean"] == 110
    js = tmp_path / "verl.jsonl"
    js.write_text(json.dumps({"step": 1, "data": {"response_length/mean": 300.0, "prompt_length/mean": 50.0}}) + "\n")
    assert read_lengths(str(js), model=None, prompt_len=512, response_len=2048)["response_len_mean"] == 300


def test_lengths_reach_the_workload_and_best_yaml(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": "a" * (40 * k), "response": "b" * (80 * k)}) for k in range(1, 50)))
    sizes = dict(prompts=64, n=4, prompt_len=1024, response_len=1024, mini_batch=16, seq_len=4096, gbs=64)
    _, _, _, wl = grpo_inputs("7b", "h100", 8, **sizes, lengths=str(p))
    assert wl.response_len_quantiles and wl.lengths_source and wl.prompt_len_mean < 1024
    d = wl.to_dict()
    assert isinstance(d["response_len_quantiles"], list)
    from grpo_tune.core.strategy import Workload

    assert Workload.from_dict(d) == wl  # what best.yaml records loads back


def test_missing_file_is_coded():
    with pytest.raises(GrpoTuneError) as ei:
        read_lengths("/nonexistent.jsonl", model=None, prompt_len=1, response_len=1)
    assert ei.value.code == "BAD_CONFIG"


def test_histogram_replaces_the_assumed_distribution():
    """A measured histogram sets the tail: the expected longest of N comes from its quantiles."""
    lengths = [100] * 95 + [2000] * 5
    q = quantiles_from_samples(lengths)
    measured = dist(4096, sum(lengths) / 100, q)
    assumed = dist(4096, sum(lengths) / 100)
    assert measured.expected_max(64) != pytest.approx(assumed.expected_max(64))
    assert measured.survival(1000) == pytest.approx(0.05, abs=0.03)
