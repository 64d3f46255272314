"""`search --refine` when no trial completes exits 2 (TRIAL_FAILED) with the first trial's reason (it exited 0);
refine's run folder is staged as search's folders are (a kill while it was written left 3 of its 6 files)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, str(ROOT / "tests" / "refine_standin.py")]
TINY = ["search", "-m", "tiny", "--hardware", "cpu", "-g", "4", "--prompts", "8", "--n", "4", "--prompt-len", "16"]
TINY += ["--response-len", "16", "--mini-batch", "8"]


def test_refine_with_no_completed_trial_exits_2_with_the_first_reason(tmp_path, capsys, monkeypatch):
    from grpo_tune.autotune.refine import runner

    monkeypatch.setattr(runner, "PROFILE_CMD", STANDIN)
    monkeypatch.setenv("REFINE_STANDIN_CRASH_TP", "any")  # every trial crashes
    out = tmp_path / "runs"
    rc = main([*TINY, "--refine", "--trials", "2", "--trial-steps", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "[TRIAL_FAILED] no profiling trial completed (2 tried)" in err, err
    assert "trial 0:" in err and "simulated crash" in err and "trials/0000/profile.log" in err
    assert len(list(out.glob("*/best.yaml"))) == 1  # the search's folder stays, for a rerun to resume


def _boom(*a, **k):
    raise KeyboardInterrupt  # a kill while the report is written


def test_refines_run_folder_appears_whole(tmp_path, capsys, monkeypatch):
    from grpo_tune.rundir import report

    monkeypatch.setattr(report, "write_report", _boom)
    out = tmp_path / "runs"
    assert main([*TINY, "--refine", "--trials", "1", "--out", str(out)]) == 130  # the CLI's answer to Ctrl-C
    assert not out.exists() or not [p for p in out.iterdir()], list(out.rglob("*"))  # no folder, no partial sibling


def test_an_existing_run_folder_keeps_its_files_until_all_new_ones_are_written(tmp_path, monkeypatch):
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.jobs.inputs import plan_inputs
    from grpo_tune.rundir import emit as E
    from grpo_tune.rundir import report

    m, hw, cl, wl = plan_inputs(model="tiny", hardware="cpu", gpus=4, gpus_per_node=None, workload="grpo", prompts=8,
                                n=4, prompt_len=16, response_len=16, mini_batch=8, ppo_epochs=1, kl=True, seq_len=64,
                                gbs=8)  # fmt: skip
    res = search(m, hw, cl, wl)
    d = tmp_path / "study"
    first = E.emit_staged(res.ranked[0], d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert set(before) == {p.name for p in first.values()}
    monkeypatch.setattr(report, "write_report", _boom)
    with pytest.raises(KeyboardInterrupt):
        E.emit_staged(res.ranked[1], d)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # untouched, no stage left behind
    monkeypatch.undo()
    second = E.emit_staged(res.ranked[1], d)
    assert set(second) == set(first) and (d / "best.yaml").read_bytes() != before["best.yaml"]
    assert not list(d.glob(".stage.*"))
