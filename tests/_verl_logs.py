"""The ``grpo-tune calibrate`` run on the committed verl logs (tests/fixtures/verl_logs) that several tests share."""

from __future__ import annotations

from pathlib import Path

from grpo_tune.cli.main import main


def calibrate_from_fixture_logs(fix: Path, out: Path) -> int:
    """Fit a calibration file from run_a/run_b and their launch scripts; the CLI's exit code."""
    argv = ["calibrate"]
    for run in ("a", "b"):
        argv += ["--from-log", str(fix / f"run_{run}.jsonl")]
    for run in ("a", "b"):
        argv += ["--launch", str(fix / f"launch_{run}.txt")]
    return main([*argv, "--out", str(out)])
