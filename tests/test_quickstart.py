"""The CPU quick start, as the README gives it: search a plan for ``tiny`` on one CPU process, then
train the emitted best.yaml for 80 steps on the shipped synthetic task, and the reward rises.

What it showed on the 2-core development machine (seed 1234, the emitted defaults): mean reward 0.043
over steps 1-20 and 0.212 over steps 61-80, 38 s for the train command at load average 8.6. The test asserts
what the learning test does: the last 20 steps' mean beats the first 20's by 0.05 and by 2x, and the
run left TensorBoard events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUICK_SEARCH = (
    "search --model tiny --gpus 1 --hardware cpu --prompts 16 --n 8 --mini-batch 16 --no-kl "
    "--prompt-len 8 --prompt-len-mean 3 --response-len 4 --response-len-mean 4 --out runs/quick"
)
QUICK_TRAIN = "train --config {best} --steps 80"
WINDOW, MIN_GAIN, MIN_RATIO = 20, 0.05, 2.0


README_BEST = "runs/quick/tiny-1g-cpu-*/best.yaml"


def _readme_commands() -> list[str]:
    """The commands of the README's quick-start block (its first code block), continuation lines joined."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("## CPU quick start", 1)[1]
    block = section.split("```", 2)[1]
    return [" ".join(c.split()) for c in block.replace("\\\n", " ").strip().splitlines()]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_the_cpu_quick_start_trains_tiny_and_the_reward_rises(tmp_path):
    assert _readme_commands() == ["grpo-tune " + QUICK_SEARCH, "grpo-tune " + QUICK_TRAIN.format(best=README_BEST)]
    _cli(QUICK_SEARCH.split(), tmp_path)
    (best,) = (tmp_path / "runs" / "quick").glob("tiny-1g-cpu-*/best.yaml")
    _cli(QUICK_TRAIN.format(best=best.relative_to(tmp_path)).split(), tmp_path)
    run = best.parent / "train"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == list(range(1, 81))
    before = sum(x["reward_mean"] for x in rows[:WINDOW]) / WINDOW
    after = sum(x["reward_mean"] for x in rows[-WINDOW:]) / WINDOW
    print(f"mean reward: steps 1-{WINDOW} {before:.3f} -> steps {81 - WINDOW}-80 {after:.3f}")
    assert after >= before + MIN_GAIN and after >= MIN_RATIO * before, (before, after)
    assert any((run / "tensorboard").glob("events.out.tfevents.*"))
