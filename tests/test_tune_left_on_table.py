"""tune says what it left on the table (issue 38): it keeps the launch's engine knobs (fixed micro-batches, vLLM's
settings), so both qwen2-7b launches tuned to 84-85 s per step while `search` on the same workload and GPUs finds
72.9 s with dynamic batching; tune now prints that plan, the knobs it differs in and the command that gets it, when
the gain is beyond the model's stated error. Since issue 36c (the drain integrated at the CUDA-graph cliff) the
qwen2-7b gain is 11.88%, inside the stated 11.9%: the Qwen3-30B-A3B launch (eager vLLM at max_num_seqs 256) carries
the feature's checks, and the qwen2-7b launch checks that nothing is said inside the error."""

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
MOE = ROOT / "examples" / "verl-upstream" / "qwen3moe-30b-megatron-96gb.sh"


def _json(*argv: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    import grpo_tune.jobs.tune as J

    assert J.LOOK_FURTHER  # module-scoped: runs before the per-test switch, with tune's default
    return _json("tune", str(MOE), "--hardware", "h100", "--out", str(tmp_path_factory.mktemp("runs")))


def test_the_suite_switch_is_on_here():
    import grpo_tune.jobs.tune as J

    assert J.LOOK_FURTHER


def test_tune_names_the_faster_plan_it_left_and_the_knobs_it_kept(tuned):
    left = tuned["left_on_table"]
    assert left is not None
    # the Qwen3-30B-A3B launch on H100 keeps vLLM's max_num_seqs 256 and eager decode: 1,288.5 s a step; search's
    # plan on the same workload runs CUDA graphs at max_num_seqs 1,024: 816.8 s
    assert tuned["best"]["step_s"] == pytest.approx(1288.5, abs=1.0)
    assert left["step_s"] == pytest.approx(816.8, abs=1.0)
    assert left["tuned_step_s"] == pytest.approx(tuned["best"]["step_s"], rel=1e-3)
    assert left["step_s"] < left["tuned_step_s"] * (1 - STATED_ERROR_PCT / 100)
    assert "vLLM enforce_eager True -> False" in left["knobs"] and "vLLM max_num_seqs 256 -> 1024" in left["knobs"]
    assert left["strategy"]["enforce_eager"] is False


def test_the_qwen2_launch_is_now_within_the_stated_error(tmp_path):
    """The qwen2-7b launch (issue 38's case) tunes to 87.9 s with its fixed micro-batches; search's plan with dynamic
    batching was 77.0 s (72.9 before the slowest-rank term, 70.1 before the controller's moves), 12.4% faster. Since
    the drain is integrated at the CUDA-graph cliff (issue 36c: its first tokens, above 512 running sequences, run
    eager) it is 77.48 s, 11.88% faster: inside the model's stated error (11.9%), so tune no longer names it."""
    d = _json("tune", str(QWEN2), "--hardware", "h100", "--out", str(tmp_path / "t"))
    assert d["best"]["step_s"] == pytest.approx(87.9, abs=0.5)
    assert d["left_on_table"] is None
    cmd = (
        "search --model qwen2-7b --gpus 8 --gpus-per-node 8 --hardware h100-sxm-80gb --framework verl --prompts 1024 "
        "--n 5 --mini-batch 256 --ppo-epochs 1 --prompt-len 1024 --response-len 1024 --prompt-len-mean 205 "
        "--response-len-mean 205 --kl --no-emit"
    )
    found = _json(*cmd.split())["best"]["time"]["step_s"]
    assert found == pytest.approx(77.48, abs=0.05)
    assert found >= d["best"]["step_s"] * (1 - STATED_ERROR_PCT / 100)


def test_the_command_it_prints_finds_that_plan(tuned):
    cmd = shlex.split(tuned["left_on_table"]["command"])
    assert cmd[0] == "grpo-tune" and cmd[1] == "search"
    got = _json(*cmd[1:], "--no-emit")
    assert got["best"]["time"]["step_s"] == pytest.approx(tuned["left_on_table"]["step_s"], rel=1e-3)


def test_the_text_output_says_it(capsys, tmp_path):
    assert main(["tune", str(MOE), "--hardware", "h100", "--no-emit"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "left on the table:" in text and "grpo-tune search --model qwen3-30b-a3b --gpus 8" in text


def test_nothing_is_said_when_the_launch_already_runs_searchs_plan(tuned, tmp_path):
    """search's own launch for that workload, tuned: nothing faster beyond the model's error is left."""
    cmd = shlex.split(tuned["left_on_table"]["command"])
    found = _json(*cmd[1:], "--out", str(tmp_path / "s"))
    d = _json("tune", found["files"]["verl"], "--hardware", "h100", "--out", str(tmp_path / "t"))
    assert d["left_on_table"] is None
