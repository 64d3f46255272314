"""`grpo-tune compare`: best plan per hardware, cost per million tokens, PNG, coded rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_tune.cli.options import MIN_HEADROOM_DEFAULT

from grpo_tune.jobs.compare import usd_per_million_tokens
from grpo_tune.autotune.search.driver import search
from grpo_tune.costmodel.results import tokens_per_s_per_gpu
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.costmodel.lengths import assumed_means
from grpo_tune.core.strategy import Cluster, Workload

CLI = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()"]


def test_cost_per_million_tokens_by_hand():
    # $3.60/GPU-h = $0.001/GPU-s; at 1000 tokens/s/GPU a million tokens take 1000 GPU-s = $1.00.
    assert usd_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert usd_per_million_tokens(None, 1000.0) is None
    assert usd_per_million_tokens(2.0, 0.0) is None


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    p = subprocess.run(
        [*CLI, "compare", "--model", "7b", "--gpus", "8", "--hardware", "h100,a100,cpu", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), out


def test_rows_per_hardware(compared):
    doc, out = compared
    rows = {r["hardware"]: r for r in doc["rows"]}
    assert set(rows) == {"h100-sxm-80gb", "a100-sxm-80gb", "cpu"}
    h100, a100 = rows["h100-sxm-80gb"], rows["a100-sxm-80gb"]
    assert h100["fits"] and a100["fits"]
    # H100 has 3.2x the bf16 FLOP/s and 1.6x the HBM bandwidth of A100: its best plan is faster.
    assert h100["step_s"] < a100["step_s"]
    # $ per million tokens by hand: the profile's $/GPU-h over 3600 s/h x tokens/s/GPU, x 1e6.
    hw = load_hardware("h100")
    assert h100["price_per_gpu_hour_usd"] == hw.price_per_gpu_hour_usd
    assert h100["usd_per_million_tokens"] == pytest.approx(
        hw.price_per_gpu_hour_usd / 3600.0 / h100["tokens_per_s_per_gpu"] * 1e6, rel=1e-9
    )
    # capacity is the profile's HBM less what no tensor can use; headroom is what the peak phase leaves of it.
    assert h100["capacity_bytes"] == pytest.approx(hw.hbm_bytes - hw.reserved_memory_bytes, abs=1)
    assert 0 <= h100["headroom_bytes"] == pytest.approx(h100["capacity_bytes"] - h100["peak_bytes"], abs=1)
    # the row is the same plan a direct search picks
    best = search(
        load_model("7b"),
        load_hardware("h100"),
        Cluster(gpus=8),
        Workload(**assumed_means({}, prompt_len=1024, response_len=1024)),  # the CLI's assumed means
        top=1,
        min_headroom=MIN_HEADROOM_DEFAULT,
    ).best
    assert h100["headroom_bytes"] >= MIN_HEADROOM_DEFAULT * load_hardware("h100").hbm_bytes
    assert h100["tokens_per_s_per_gpu"] == pytest.approx(tokens_per_s_per_gpu(best))
    assert h100["peak_bytes"] == pytest.approx(best.peak_bytes, abs=1)
    # 7B cannot be trained on the 2-core CPU profile: a coded row, not a crash
    assert rows["cpu"]["fits"] is False and rows["cpu"]["error"]["code"] == "NO_FEASIBLE_PLAN"
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "compare.json").read_text())["rows"] == doc["rows"]


def test_unknown_hardware_exit_2(tmp_path):
    p = subprocess.run(
        [*CLI, "compare", "--model", "7b", "--gpus", "8", "--hardware", "h100,h1000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "[UNKNOWN_HARDWARE]" in p.stderr and "Traceback" not in p.stderr


def test_text_states_the_lengths_and_fits_80_columns(tmp_path):
    """compare priced every row on assumed mean lengths without saying so, and cut profile names at 80 columns."""
    p = subprocess.run(
        [*CLI, "compare", "--model", "7b", "--gpus", "8", "--hardware", "h100,a100", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "prompt <= 1024 (mean 205) + response <= 1024 (mean 205) tokens" in text
    assert "Lengths: assumed mean = 20% of the max" in text and "--lengths FILE" in text
    table = p.stdout.split("Best plan per hardware", 1)[1].split("profile:", 1)[0]
    assert "…" not in table and all(len(ln) <= 80 for ln in table.splitlines())


def test_each_row_says_how_its_profile_was_obtained_and_flags_close_calls():
    """compare's rows carry the profile's provenance and its class's cross-validated band; a less-known
    profile faster than a better-known one by less than its band is noted as not told apart."""
    from grpo_tune.validate.grpo import BAND_PCT
    from grpo_tune.jobs.compare import _flag_within_band

    rows = [
        {
            "hardware": "a",
            "fits": True,
            "provenance": "fitted",
            "band_pct": BAND_PCT["fitted"],
            "tokens_per_s_per_gpu": 100.0,
        },
        {
            "hardware": "b",
            "fits": True,
            "provenance": "spec-only",
            "band_pct": BAND_PCT["spec-only"],
            "tokens_per_s_per_gpu": 100.0 * (1 + 0.5 * BAND_PCT["spec-only"] / 100),  # faster by half its band
        },
        {"hardware": "c", "fits": True, "provenance": "transferred", "band_pct": 10.0, "tokens_per_s_per_gpu": 150.0},
    ]
    assert BAND_PCT["spec-only"] > 10.0
    _flag_within_band(rows)
    assert "not told apart" in rows[1]["note"] and "a (fitted)" in rows[1]["note"]  # inside its spec-only band
    assert "note" not in rows[2] and "note" not in rows[0]  # +50% > its 10% band; the fitted one is the reference
    assert BAND_PCT["fitted"] <= BAND_PCT["transferred"] <= BAND_PCT["spec-only"]
