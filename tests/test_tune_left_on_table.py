"""tune says what it left on the table (issue 38): it keeps the launch's engine knobs (fixed micro-batches, vLLM's
settings), so both qwen2-7b launches tuned to 84-85 s per step while `search` on the same workload and GPUs finds
72.9 s with dynamic batching; tune now prints that plan, the knobs it differs in and the command that gets it, when
the gain is beyond the model's stated error."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.validate.grpo import STATED_ERROR_PCT

pytestmark = pytest.mark.left_on_table

ROOT = Path(__file__).resolve().parent.parent
QWEN2 = ROOT / "examples" / "verl-upstream" / "qwen2-7b-math-megatron.sh"


def _json(*argv: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    import grpo_tune.jobs.tune as J

    assert J.LOOK_FURTHER  # module-scoped: runs before the per-test switch, with tune's default
    return _json("tune", str(QWEN2), "--hardware", "h100", "--out", str(tmp_path_factory.mktemp("runs")))


def test_the_suite_switch_is_on_here():
    import grpo_tune.jobs.tune as J

    assert J.LOOK_FURTHER


def test_tune_names_the_faster_plan_it_left_and_the_knobs_it_kept(tuned):
    left = tuned["left_on_table"]
    assert left is not None
    # what tune reaches with the launch's knobs (84.2 before the slowest-rank term, 80.9 before the controller's
    # batch moves and the verl refit with them, docs/placement.md)
    assert tuned["best"]["step_s"] == pytest.approx(87.9, abs=0.5)
    # search's plan on the same workload (72.9 before the slowest-rank term, 70.1 before the controller's moves)
    assert left["step_s"] == pytest.approx(77.0, abs=0.5)
    assert left["tuned_step_s"] == pytest.approx(tuned["best"]["step_s"], rel=1e-3)
    assert left["step_s"] < left["tuned_step_s"] * (1 - STATED_ERROR_PCT / 100)
    assert any(k.startswith("dynamic batching") for k in left["knobs"])
    assert left["strategy"]["max_tokens_per_gpu"] is not None


def test_the_command_it_prints_finds_that_plan(tuned):
    cmd = shlex.split(tuned["left_on_table"]["command"])
    assert cmd[0] == "grpo-tune" and cmd[1] == "search"
    got = _json(*cmd[1:], "--no-emit")
    assert got["best"]["time"]["step_s"] == pytest.approx(tuned["left_on_table"]["step_s"], rel=1e-3)


def test_the_text_output_says_it(capsys, tmp_path):
    assert main(["tune", str(QWEN2), "--hardware", "h100", "--no-emit"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "left on the table:" in text and "grpo-tune search --model qwen2-7b --gpus 8" in text


def test_nothing_is_said_when_the_launch_already_runs_searchs_plan(tuned, tmp_path):
    """search's own launch for that workload, tuned: nothing faster beyond the model's error is left."""
    cmd = shlex.split(tuned["left_on_table"]["command"])
    found = _json(*cmd[1:], "--out", str(tmp_path / "s"))
    d = _json("tune", found["files"]["verl"], "--hardware", "h100", "--out", str(tmp_path / "t"))
    assert d["left_on_table"] is None
