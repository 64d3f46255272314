"""`grpo-tune validate --grpo`: the GRPO step against published verl / NeMo-RL runs.

The shipped rows pass the stated tolerance on the held-out rows (15% step-time MAPE); corrupting
the published figures of held-out rows makes it fail (exit 1); a malformed file is a coded error;
the fit never reads a held-out row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_tune.autotune.validate_grpo as vg
from grpo_tune.core.errors import GrpoTuneError

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "validate", "--grpo", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_shipped_rows_pass_on_the_held_out_rows():
    rep = vg.run_grpo()
    assert rep["passed"], rep["mape_pct"]
    hold = rep["mape_pct"]["holdout"]
    assert hold["step_s"] <= vg.TOLERANCE_PCT
    assert hold["gen_s"] is not None and hold["train_s"] is not None  # per-phase MAPE is reported
    scored = [r for r in rep["rows"] if r["split"] != "excluded"]
    assert {r["split"] for r in scored} == {"fit", "holdout"}
    assert all(r["source"] for r in rep["rows"])


def test_cli_prints_phases_and_passes():
    p = cli()
    assert p.returncode == 0, p.stderr
    assert "held-out step MAPE" in p.stdout and "pass" in p.stdout
    for phase in ("gen", "train", "logprob", "refit"):
        assert f" {phase} " in p.stdout


def corrupted(tmp_path: Path, factor: float) -> Path:
    """The shipped file with every held-out row's published step and phases multiplied by ``factor``."""
    lines = (ROOT / "grpo_tune/profiles/data/published_grpo.csv").read_text().splitlines()
    import csv
    import io

    body = [ln for ln in lines if not ln.startswith("#")]
    reader = list(csv.DictReader(io.StringIO("\n".join(body))))
    for r in reader:
        if r["split"] == "holdout":
            for k in ("step_s", *vg.PHASES):
                if r[k]:
                    r[k] = str(float(r[k]) * factor)
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(reader[0]))
    w.writeheader()
    w.writerows(reader)
    path = tmp_path / "grpo.csv"
    path.write_text(out.getvalue())
    return path


def test_corrupted_rows_fail(tmp_path):
    path = corrupted(tmp_path, 2.0)
    rep = vg.run_grpo(path=path)
    assert not rep["passed"] and rep["mape_pct"]["holdout"]["step_s"] > 30
    p = cli("--data", str(path), "--json")
    assert p.returncode == 1
    assert json.loads(p.stdout)["passed"] is False


def test_fit_never_reads_held_out_rows(tmp_path):
    base = vg.fit(vg.load_grpo_rows())
    assert vg.fit(vg.load_grpo_rows(corrupted(tmp_path, 3.0))) == base


def test_refit_lands_on_the_shipped_parameters():
    from grpo_tune.core.specs import load_hardware

    got = vg.fit(vg.load_grpo_rows())
    eff = load_hardware("h100").efficiency
    for k, v in got.items():
        assert v == pytest.approx(getattr(eff, k), rel=0.02, abs=1e-4), k


def test_malformed_rows_are_coded_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,split\nx,fit\n")
    with pytest.raises(GrpoTuneError) as ei:
        vg.load_grpo_rows(bad)
    assert ei.value.code == "BAD_CONFIG"
    text = (ROOT / "grpo_tune/profiles/data/published_grpo.csv").read_text().replace(",holdout,", ",heldout,", 1)
    bad.write_text(text)
    with pytest.raises(GrpoTuneError):
        vg.load_grpo_rows(bad)


def test_stated_error_is_the_held_out_mape():
    assert vg.STATED_ERROR_PCT == pytest.approx(vg.run_grpo()["mape_pct"]["holdout"]["step_s"], abs=0.05)


def test_report_says_why_the_winner_wins_and_flags_close_plans(tmp_path):
    from grpo_tune.autotune.report import runner_ups, why_winner, write_report
    from grpo_tune.autotune.search import search
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload

    res = search(load_model("7b"), load_hardware("h100"), Cluster(gpus=8), Workload(), top=5)
    others = runner_ups(res.ranked)
    assert others and all(o.strategy != res.best.strategy for o in others)
    lines = why_winner(res.best, others, 100.0)  # everything "within error": the --refine advice appears
    assert any("--refine" in ln for ln in lines)
    assert any("rollout" in ln or "update" in ln for ln in lines)  # the gap is split by phase
    assert not any("--refine" in ln for ln in why_winner(res.best, others, 0.0))
    write_report(tmp_path, res.best, ranked=res.ranked, pareto=res.pareto)
    text = (tmp_path / "report.md").read_text()
    assert "## Why the winner" in text and "stated error" in text
