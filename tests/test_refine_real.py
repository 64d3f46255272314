"""`grpo-tune search --refine` end to end with the real trainer (`grpo-tune profile`, torchrun, gloo).

Real trials of the tiny model on 2 CPU ranks. The search is killed (SIGKILL) while its second
trial runs; the same command then resumes (the first trial kept, the killed one marked FAIL and
its plan profiled again), and a third run profiles nothing anew.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CMD = (
    "search --model tiny --gpus 2 --hardware cpu --prompts 4 --n 2 --prompt-len 8 --response-len 8 --mini-batch 4"
    " --refine --trials 2 --trial-steps 2 --trial-timeout 400 --json"
).split()


def _argv(tmp: Path) -> list[str]:
    return [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *CMD, "--out", str(tmp / "runs")]


def _run(tmp: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(_argv(tmp), cwd=tmp, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads(r.stdout)


@pytest.mark.slow
def test_refine_with_real_trials_kill_and_resume(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(_argv(tmp_path), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    logs = []
    while time.time() < deadline and p.poll() is None:
        logs = list((tmp_path / "runs").glob("*/trials/0001/profile.log"))
        if logs and logs[0].stat().st_size > 0:
            break
        time.sleep(0.2)
    assert logs and p.poll() is None, "the second trial never started"
    time.sleep(2.0)  # inside the trial: torchrun is starting the ranks
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (logs[0].parent / "profile.json").exists()

    r, doc = _run(tmp_path)
    assert "requeued interrupted plan" in r.stderr and "resuming study" in r.stderr
    ref = doc["refine"]
    run_dir = Path(doc["run_dir"])
    by_no = {t["number"]: t for t in ref["trials"]}
    assert by_no[0]["state"] == "COMPLETE"  # kept from the killed run
    assert by_no[1]["state"] == "FAIL" and by_no[1]["reason"].startswith("interrupted")
    rerun = [t for t in ref["trials"] if t["number"] > 1 and t["plan"] == by_no[1]["plan"] and t["ran"]]
    assert len(rerun) == 1
    ran = [t for t in ref["trials"] if t["ran"]]
    assert len(ran) == 2
    done = [t for t in ran if t["state"] == "COMPLETE"]
    assert done, [t["reason"] for t in ran]
    for t in done:  # figures from the real profile JSON
        assert t["measured_step_s"] > 0 and t["measured_tokens_per_s"] > 0 and t["peak_memory_bytes"] > 0
        assert set(t["measured_phases_s"]) >= {"rollout", "update"}
        prof = json.loads((run_dir / "trials" / f"{t['number']:04d}" / "profile.json").read_text())
        assert prof["status"] == "ok" and prof["world_size"] == 2
        assert t["measured_tokens_per_s"] == pytest.approx(prof["tokens_per_s"])
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    w = max(done, key=lambda t: t["measured_tokens_per_s"])
    assert best["measured"]["trial"] == w["number"]
    assert best["measured"]["tokens_per_s"] == pytest.approx(w["measured_tokens_per_s"])
    assert best["strategy"]["tp"] == w["strategy"]["tp"] and best["strategy"]["pp"] == w["strategy"]["pp"]
    report = (run_dir / "report.md").read_text()
    assert "## Refinement (real profiling runs)" in report and "optuna-dashboard sqlite:///" in report
    assert (run_dir / "refine_history.png").stat().st_size > 1000
    assert (run_dir / "refine_scatter.png").stat().st_size > 1000
    assert "Spearman" in r.stderr and "winner: trial" in r.stderr
    assert "noise: " in r.stderr and ref["noise"]["threshold"] > 0  # the spread, or the assumed figure when none
    assert "winner vs runner-up" in r.stderr or len({t["plan"] for t in done}) == 1
    if len(done) == 2:
        cal = json.loads((run_dir / "calibration.json").read_text())
        assert cal["version"] == 1 and cal["hardware"] == "cpu" and cal["fit"]["after"]["n"] == 2
        # the fit minimises log residuals of step and phase times (not the step's MAPE): its cost falls
        assert cal["fit"]["cost"] <= cal["fit"]["cost_before"] + 1e-12

    # the same command again: resumes, keeps both trials, profiles nothing
    mtimes = {p: p.stat().st_mtime for p in (run_dir / "trials").glob("*/profile.json")}
    r2, doc2 = _run(tmp_path)
    assert "resuming study" in r2.stderr
    ran2 = [t for t in doc2["refine"]["trials"] if t["ran"]]
    assert [(t["number"], t["measured_step_s"]) for t in ran2] == [(t["number"], t["measured_step_s"]) for t in ran]
    assert {p: p.stat().st_mtime for p in (run_dir / "trials").glob("*/profile.json")} == mtimes
