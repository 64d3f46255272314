"""costmodel and autotune import without torch, megatron or vllm (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "megatron", "vllm", "transformer_engine")


def _modules_after(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_costmodel_and_autotune_leave_torch_out():
    mods = _modules_after(
        "import grpo_tune.costmodel, grpo_tune.costmodel.memory, grpo_tune.costmodel.estimate, grpo_tune.autotune, "
        "grpo_tune.cli.main, grpo_tune.cli.estimate"
    )
    heavy = [m for m in mods if m.split(".")[0] in HEAVY]
    assert heavy == [], heavy
    assert "grpo_tune.cli.estimate" in mods  # the check is not vacuous


def test_estimate_command_runs_without_torch():
    code = (
        "from grpo_tune.cli.main import main\n"
        "rc = main(['estimate', '--model', 'tiny', '--gpus', '2', '--tp', '2', '--hardware', 'cpu', '--json',\n"
        "           '--prompt-len', '64', '--response-len', '64'])\n"
        "assert rc == 0, rc"
    )
    mods = _modules_after(code)
    assert not [m for m in mods if m.split(".")[0] in HEAVY]
    assert "grpo_tune.costmodel.memory" in mods
