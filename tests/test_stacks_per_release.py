"""Issue 36 item 5: each NeMo-RL release has its own stack parameters, `--framework nemo-rl` prices the stack of the
release its recipe is written for (0.7.0) and says so in text and --json, and v0.3's micro-batch overhead (its fit
on the 30 ms bound of its prior) does not carry into a later stack."""

from __future__ import annotations

import json

import pytest

from grpo_tune.core.stacks import load_stack
from grpo_tune.frameworks.nemo_rl.read import STACK
from grpo_tune.frameworks.nemo_rl.snapshot import RELEASE
from grpo_tune.validate.grpo import PRIORS


def _prior(key: str, on: str = "stack:nemo-rl-v0.3"):
    return next(p for p in PRIORS if p.key == key and p.on == on)


def test_nemo_rl_prices_the_release_its_recipe_targets():
    st = load_stack(STACK)
    assert st.release == RELEASE == "0.7.0" and st.framework == "nemo-rl"
    assert load_stack("nemo-rl").name == st.name  # the framework's alias follows the release it emits for
    assert load_stack("nemo-rl-v0.3").release == "v0.3.0"


def test_v0_3_bound_fit_does_not_carry():
    v03 = load_stack("nemo-rl-v0.3").params
    p = _prior("micro_batch_overhead_s")
    assert v03["micro_batch_overhead_s"] == pytest.approx(p.hi)  # v0.3's fit sits on its prior's upper bound
    for later in ("nemo-rl-0.7.0", "nemo-rl-main-2026-08"):
        got = load_stack(later).params["micro_batch_overhead_s"]
        assert got == pytest.approx(p.value), later  # the prior, not v0.3's bound
        assert got < v03["micro_batch_overhead_s"]


def test_every_later_value_says_where_it_comes_from():
    """Each parameter line of the 0.7.0 and main stacks carries a comment (a prior, a carried fit or a config
    value), and every stack parameter v0.3 sets is set explicitly (none silently falls back)."""
    from grpo_tune.core.stacks import STACKS_DIR

    v03 = set(load_stack("nemo-rl-v0.3").params)
    for name in ("nemo-rl-0.7.0", "nemo-rl-main-2026-08"):
        text = (STACKS_DIR / f"{name}.toml").read_text()
        tables = text.split("[params]", 1)[1].split("\n[")  # [params], then the [engine] table
        params = [ln for t in tables for ln in t.strip().splitlines()[(0 if t is tables[0] else 1) :]]
        assert params and all("#" in line for line in params if line.strip()), name
        assert v03 <= set(load_stack(name).params), name


def test_search_and_estimate_say_which_stack(capsys):
    from grpo_tune.cli.main import main

    base = ["--model", "qwen2.5-7b", "--gpus", "8", "--framework", "nemo-rl"]
    assert main(["estimate", *base, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["stack"]
    assert got == {
        "name": "nemo-rl-0.7.0",
        "framework": "nemo-rl",
        "release": "0.7.0",
        "provenance": "spec-only",
        "chosen_by": "--framework nemo-rl",
    }
    assert main(["estimate", *base]) == 0
    out = capsys.readouterr().out
    assert "Stack: nemo-rl-0.7.0 (nemo-rl 0.7.0, spec-only), chosen by --framework nemo-rl" in " ".join(out.split())
    assert main(["search", *base, "--no-emit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"]["name"] == "nemo-rl-0.7.0"
    # --stack wins over the framework's release, and says so
    assert main(["estimate", *base, "--stack", "nemo-rl-v0.3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["stack"]
    assert got["name"] == "nemo-rl-v0.3" and got["chosen_by"] == "--stack"
