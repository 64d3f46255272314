"""--lengths: statistics from a dataset (chars/token estimate without a tokenizer) or a run's log."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.autotune.calibrate.lengths import CHARS_PER_TOKEN, read_lengths
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


def test_verl_console_log_gives_the_lengths_of_its_jsonl_twin():
    """verl's console writes numpy scalars as pprint does (``response_length/mean:np.float64(410.88)``): read as
    numbers, so the console log of a run gives the means its file logger's JSONL gives (it gave none)."""
    from pathlib import Path

    fix = Path(__file__).parent / "fixtures" / "verl_logs"
    for run in ("run_a", "run_b", "run_c"):
        con = read_lengths(str(fix / f"{run}.console.log"), model=None, prompt_len=1024, response_len=4096)
        js = read_lengths(str(fix / f"{run}.jsonl"), model=None, prompt_len=1024, response_len=4096)
        assert con["response_len_mean"] == js["response_len_mean"] and con["prompt_len_mean"] == js["prompt_len_mean"]
        assert "(run metrics, 12 steps)" in con["lengths_source"]


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


def test_the_assumed_mean_fraction_is_the_median_of_the_published_runs():
    """The default mean/max is not a guess: it is the median over the published Megatron GRPO rows that state a
    mean response length (profiles/data/published_grpo.csv), to 0.01."""
    import csv
    import statistics
    from pathlib import Path

    from grpo_tune.costmodel.lengths import ASSUMED_MEAN_FRACTION

    path = Path(__file__).resolve().parents[1] / "grpo_tune/profiles/data/published_grpo.csv"
    rows = list(csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#")))
    ratios = [
        int(r["response_len_mean"]) / int(r["response_len"])
        for r in rows
        if r["backend"] == "megatron" and r["response_len_mean"] and r.get("response_len_mean_assumed") != "true"
    ]
    assert len(ratios) >= 5
    assert ASSUMED_MEAN_FRACTION == pytest.approx(statistics.median(ratios), abs=0.01)


def test_no_mean_given_assumes_a_stated_distribution_not_the_worst_case():
    """Without a mean the workload used to be the worst case (mean = max) without a word; now each missing mean
    is 20% of its max, and lengths_source says so and how to replace it."""
    sizes = dict(prompts=64, n=4, prompt_len=1024, response_len=2048, mini_batch=16, seq_len=4096, gbs=64)
    _, _, _, wl = grpo_inputs("7b", "h100", 8, **sizes)
    assert (wl.prompt_len_mean, wl.response_len_mean) == (205, 410)
    src = wl.lengths_source or ""
    assert src.startswith("assumed") and "--lengths FILE" in src and "--response-len-mean" in src
    # a given mean is kept and not called assumed; the other one still is
    _, _, _, wl = grpo_inputs("7b", "h100", 8, **sizes, response_len_mean=2048)
    assert (wl.prompt_len_mean, wl.response_len_mean) == (205, 2048)
    assert "max for prompts," in (wl.lengths_source or "") and "responses" not in (wl.lengths_source or "")
    _, _, _, wl = grpo_inputs("7b", "h100", 8, **sizes, response_len_mean=300, prompt_len_mean=100)
    assert wl.lengths_source is None and (wl.prompt_len_mean, wl.response_len_mean) == (100, 300)


def test_search_states_the_assumed_lengths_in_table_report_and_best_yaml(tmp_path, capsys):
    from grpo_tune.cli.main import main
    from grpo_tune.core.config import load

    assert main(["search", "--model", "7b", "--gpus", "8", "--top", "2", "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "prompt <= 1024 (mean 205) + response <= 1024 (mean 205) tokens" in out
    assert "Lengths: assumed mean = 20% of the max" in out and "--lengths FILE" in out
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    report = (run / "report.md").read_text()
    assert "(mean 205)" in report and "- lengths: assumed mean = 20% of the max" in report
    assert "- response-length shape (assumed): 1% truncated at the cap" in report  # the shape is stated too
    text = (run / "best.yaml").read_text()
    assert text.splitlines()[1].startswith("# lengths: assumed mean = 20% of the max")
    wl = load(run / "best.yaml").workload
    assert (wl.prompt_len_mean, wl.response_len_mean) == (205, 205) and "--response-len-mean" in wl.lengths_source


def test_tune_assumes_the_same_lengths_for_a_launch():
    """A verl launch states only max_prompt_length / max_response_length: tune prices the assumed means too."""
    from pathlib import Path

    from grpo_tune.frameworks import read_plan

    root = Path(__file__).resolve().parents[1]
    wl = read_plan(root / "examples/qwen2-7b-grpo-megatron.sh").workload
    assert wl.response_len_mean == round(0.2 * wl.response_len) and wl.prompt_len_mean == round(0.2 * wl.prompt_len)
    assert (wl.lengths_source or "").startswith("assumed")
    wl = read_plan(root / "examples/qwen2-7b-grpo-megatron.sh", response_len_mean=700).workload
    assert wl.response_len_mean == 700


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(64, 32768), frac=st.floats(0.03, 0.97))
def test_the_truncated_share_keeps_the_mean(cap, frac):
    """The assumed distribution puts CLIP_FRACTION (at most half the mean / max) at the cap and keeps the
    given mean: the integral of its survival over [0, cap] is the mean (midpoint rule, 4,000 points), and
    just below the cap the survival is the truncated share plus the body's own share there."""
    from grpo_tune.costmodel.lengths import CLIP_FRACTION

    mean = frac * cap
    d = dist(float(cap), mean)
    p = min(CLIP_FRACTION, frac / 2)
    assert d.clip == pytest.approx(p)
    k = 4000
    integral = sum(d.survival((i + 0.5) * cap / k) for i in range(k)) * cap / k
    assert integral == pytest.approx(mean, rel=2e-3)
    eps = 1e-9  # just below the cap: the truncated share and what the body still holds there
    assert d.survival(cap * (1 - eps)) == pytest.approx(p + (1 - p) * eps**d.b, rel=1e-6)
    assert d.survival(cap) == 0.0
    assert d.quantile(1 - p / 2) == cap  # the top p of responses sit at the cap


def test_a_batch_of_thousands_drains_to_the_cap():
    """With 1% truncated, the longest of 2,048 responses is the cap (1 - 0.99^2048 > 1 - 1e-8), where the
    Beta body alone would end at ~3,318 of a 3,840 cap (NeMo-RL's Llama-3.1-8B row: mean 795)."""
    d = dist(3840.0, 795.0)
    assert d.expected_max(2048) == pytest.approx(3840.0, rel=1e-6)
    b = 3840 / 795 - 1  # no truncated share: the body's own 2048/2049 quantile
    assert 3840 * (1 - (1 / 2049) ** (1 / b)) == pytest.approx(3318, abs=5)
    assert d.expected_max(1) == 795.0
