"""tune never splices a new value into one the shell or OmegaConf computes at run time.

With ``ppo_micro_batch_size_per_gpu=`echo 4``` in a launch, tune wrote ``...=5 4``` (the stray backticks paired
up and 15 overrides vanished); with ``$(...)`` the tuned launch was a syntax error; an OmegaConf
``'${oc.env:...}'`` was rewritten, and diagnose advised double quotes, which bash then expands and fails on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "qwen2-7b-grpo-megatron.sh"

A = "actor_rollout_ref."
DYNAMIC = {  # literal value in the example -> the same key computed at run time
    A + "actor.ppo_micro_batch_size_per_gpu=4": A + "actor.ppo_micro_batch_size_per_gpu=`echo 4`",
    A + "rollout.gpu_memory_utilization=0.6": A + "rollout.gpu_memory_utilization=$(echo 0.6)",
    A + "actor.megatron.param_offload=True": A + "actor.megatron.param_offload=$OFFLOAD",
    A + "ref.megatron.param_offload=True": A + "ref.megatron.param_offload='${oc.env:OFF,True}'",
}


def _launch(tmp: Path) -> Path:
    text = EXAMPLE.read_text()
    for a, b in DYNAMIC.items():
        assert a in text, a
        text = text.replace(a, b)
    text = text.replace("\npython3", "\nOFFLOAD=True\npython3", 1)
    p = tmp / "run.sh"
    p.write_text(text)
    return p


def test_tune_leaves_values_computed_at_run_time_byte_for_byte_and_says_what_to_set(tmp_path):
    launch = _launch(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grpo_tune.cli.main import run; run()",
            "tune",
            str(launch),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    tuned = next(tmp_path.glob("*/tuned.sh"))
    assert subprocess.run(["bash", "-n", str(tuned)]).returncode == 0
    src, out = launch.read_text().splitlines(), tuned.read_text().splitlines()
    for dyn in DYNAMIC.values():
        assert any(dyn in ln for ln in out), f"{dyn} was rewritten"
    for ln in out:
        if ln not in src:  # every line tune wrote holds only literal values
            assert "`" not in ln and "$" not in ln, ln
    assert "value computed at run time" in r.stderr and "set it yourself to" in r.stderr, r.stderr


def test_diagnose_advice_for_an_omegaconf_interpolation_keeps_the_single_quotes(tmp_path):
    from grpo_tune.frameworks.verl.diagnose import diagnose_path

    launch = _launch(tmp_path)
    found = [f for f in diagnose_path(launch).findings if "OmegaConf interpolation" in f.message]
    assert found and "keep the single quotes" in found[0].hint
    assert "double quotes (" not in found[0].hint
