"""The golden path: `grpo-tune search --model 7b --gpus 8 --out DIR` prints the table and writes
a run folder whose best.yaml loads, whose verl.sh and best.yaml diagnose clean; plus the coded
errors and the emitter that refine shares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tune.cli.options import MIN_HEADROOM_DEFAULT
import yaml

from grpo_tune.core.config import load
from grpo_tune.rundir.emit import emit, run_id
from grpo_tune.autotune.search.driver import search
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload

CLI = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _tiny_search():
    """The top 3 plans for tiny on 4 CPU ranks (a small GRPO workload)."""
    return search(
        load_model("tiny"),
        load_hardware("cpu"),
        Cluster(gpus=4, gpus_per_node=4),
        Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8),
        top=3,
    )


def _run(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    p = _run("search", "--model", "7b", "--gpus", "8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1
    return p, dirs[0]


def test_golden_path_writes_run_folder(golden):
    p, d = golden
    assert d.name.startswith("qwen2.5-7b-8g-h100-sxm-80gb-")
    for f in ("best.yaml", "verl.sh", "megatron_args.txt", "report.md", "step_breakdown.png", "pareto.png"):
        assert (d / f).stat().st_size > 0, f
    for png in ("step_breakdown.png", "pareto.png"):
        assert (d / png).read_bytes()[:8] == PNG_MAGIC
    assert os.access(d / "verl.sh", os.X_OK)
    assert "Top plans" in p.stdout and "tok/s" in p.stdout and "capacity" in p.stdout
    assert str(d) in p.stdout.replace("\n", "")


def test_best_yaml_loads_and_matches_the_table(golden):
    _, d = golden
    cfg = load(d / "best.yaml")
    s = cfg.strategy
    assert cfg.cluster.gpus == 8 and s.layout.tp * s.layout.pp * s.layout.cp * s.layout.dp == 8
    pred = cfg.predicted
    assert pred["fits"] is True and pred["peak_memory_bytes"] <= pred["capacity_bytes"]
    assert pred["step_s"] == pytest.approx(sum(pred["phases_s"].values()), rel=1e-6)
    assert set(pred["memory_bytes"]) >= {"rollout", "update"}
    assert cfg.trainer.out_dir == str(d / "train")
    # the winner is the same plan a library search ranks first
    res = search(
        load_model("7b"), load_hardware("h100"), Cluster(gpus=8), cfg.workload, top=1, min_headroom=MIN_HEADROOM_DEFAULT
    )
    from grpo_tune import frameworks as F
    from grpo_tune.autotune.search.defaults import with_defaults  # what the search job applies to it

    owner, defaults = F.search_defaults(("verl",))
    kept = with_defaults(res, pins={}, defaults=defaults, owner=owner, min_headroom=MIN_HEADROOM_DEFAULT)
    assert kept.best.strategy == s


def test_verl_and_megatron_exports_agree_with_plan(golden):
    _, d = golden
    cfg = load(d / "best.yaml")
    s = cfg.strategy
    sh = (d / "verl.sh").read_text()
    assert "verl.trainer.main_ppo" in sh
    assert f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={s.layout.tp}" in sh
    assert f"actor_rollout_ref.ref.megatron.tensor_model_parallel_size={s.layout.tp}" in sh
    assert f"actor_rollout_ref.rollout.tensor_model_parallel_size={s.rollout.rollout_tp}" in sh
    assert "actor_rollout_ref.rollout.n=5" in sh and "data.train_batch_size=1024" in sh
    args = (d / "megatron_args.txt").read_text()
    assert f"--tensor-model-parallel-size {s.layout.tp}" in args and f"--micro-batch-size {s.batching.mbs}" in args


def test_report_references_plots(golden):
    _, d = golden
    rep = (d / "report.md").read_text()
    assert "(step_breakdown.png)" in rep and "(pareto.png)" in rep
    assert "## Winner" in rep and "## Pareto front" in rep


@pytest.mark.parametrize("name", ["best.yaml", "verl.sh"])
def test_diagnose_finds_no_errors(golden, name):
    _, d = golden
    p = _run("diagnose", str(d / name), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert isinstance(doc["findings"], list) and doc["summary"]["world_size"] == 8
    assert not [f for f in doc["findings"] if f["severity"] == "error"]


def test_json_output(tmp_path):
    p = _run("search", "--model", "7b", "--gpus", "8", "--tp", "2", "--top", "3", "--json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["top"]) == 3 and all(e["strategy"]["tp"] == 2 for e in doc["top"])
    assert doc["best"]["fits"] is True and doc["stats"]["candidates"] > doc["stats"]["evaluated"]
    assert Path(doc["files"]["best"]).exists()


def test_no_feasible_plan_exit_2(tmp_path):
    p = _run("search", "--model", "llama-3.1-405b", "--gpus", "1", "--out", str(tmp_path))
    assert p.returncode == 2
    assert "[NO_FEASIBLE_PLAN]" in p.stderr and "hint:" in p.stderr and "Traceback" not in p.stderr
    assert not any(tmp_path.iterdir())


def test_bad_pin_exit_2(tmp_path):
    p = _run("search", "--model", "7b", "--gpus", "8", "--tp", "3", "--out", str(tmp_path))
    assert p.returncode == 2 and "[INVALID_DEGREES]" in p.stderr and "Traceback" not in p.stderr


def test_pretraining_search_ranks_but_writes_no_grpo_run_folder(tmp_path):
    """best.yaml and verl.sh are GRPO runs (train refuses workload.kind pretrain): a pretraining search is refused
    before it writes anything, and ranks with --no-emit, without a rollout knob in its plans or its notes."""
    base = ("search", "--model", "7b", "--gpus", "8", "--workload", "pretrain", "--gbs", "3", "--out", str(tmp_path))
    p = _run(*base)
    assert p.returncode == 2 and "[BAD_CONFIG]" in p.stderr and "--no-emit" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not any(tmp_path.iterdir())
    p = _run(*base, "--no-emit", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["top"] and not doc.get("files") and not any(tmp_path.iterdir())
    p = _run(*base, "--no-emit")
    assert p.returncode == 0 and "valid plans" in p.stdout, p.stderr
    assert "gpu_memory_utilization" not in p.stdout  # no rollout default "kept" for a step without a rollout


def test_emit_for_refine_adds_measured(tmp_path):
    """refine emits its winner through emit(est, dir, measured=...) exactly as search does."""
    res = _tiny_search()
    measured = {"step_s": 1.5, "tokens_per_s": 42.0}
    paths = emit(res.best, tmp_path / "r", measured=measured, search=res)
    assert {"best", "verl", "megatron_args", "report", "pareto_png", "breakdown_png"} <= set(paths)
    cfg = load(paths["best"])
    assert cfg.measured == measured and cfg.strategy == res.best.strategy
    raw = yaml.safe_load(paths["best"].read_text())
    assert raw["predicted"]["step_s"] == pytest.approx(res.best.time.step_s)
    assert "## Measured" in paths["report"].read_text()
    assert run_id(res.best).startswith("tiny-4g-cpu-")


def test_calibration_flag(tmp_path):
    from grpo_tune.autotune.calibrate.fit import save as save_cal

    cal = save_cal(tmp_path / "cal.json", params={"compute_efficiency_scale": 0.5}, hardware="h100-sxm-80gb")
    plain = json.loads(
        _run("search", "--model", "7b", "--gpus", "8", "--tp", "2", "--top", "1", "--json", "--no-emit").stdout
    )
    p = _run(
        "search",
        "--model",
        "7b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--top",
        "1",
        "--json",
        "--no-emit",
        "--calibration",
        str(cal),
    )
    assert p.returncode == 0, p.stderr
    slow = json.loads(p.stdout)
    assert slow["run_dir"] is None and slow["files"] == {}
    assert slow["best"]["time"]["step_s"] > 1.2 * plain["best"]["time"]["step_s"]
    bad = _run("search", "--model", "7b", "--gpus", "8", "--calibration", str(tmp_path / "missing.json"))
    assert bad.returncode == 2 and "[BAD_CONFIG]" in bad.stderr


def test_refine_reemit_keeps_search_tables(tmp_path):
    res = _tiny_search()
    d = tmp_path / "run"
    emit(res.best, d, search=res)
    winner = res.ranked[1]
    emit(winner, d, search=res, measured={"tokens_per_s": 10.0})  # what autotune.refine does
    rep = (d / "report.md").read_text()
    assert "## Top plans" in rep and "## Search" in rep and "## Measured" in rep
    assert load(d / "best.yaml").strategy == winner.strategy


def test_emit_keeps_no_state_between_calls(tmp_path):
    """emit writes what it is given: a second emit into the same folder without the search result
    shows no search tables (there used to be a module-global cache keyed by folder)."""
    import grpo_tune.rundir.emit as E

    res = _tiny_search()
    d = tmp_path / "run"
    emit(res.best, d, search=res)
    assert "## Search" in (d / "report.md").read_text()
    emit(res.best, d)
    assert "## Search" not in (d / "report.md").read_text()
    assert not [k for k, v in vars(E).items() if k.startswith("_") and isinstance(v, dict) and not k.startswith("__")]


def test_the_plan_table_fits_80_columns_with_whole_headers(tmp_path):
    """At COLUMNS=80 the headers were cut ("recompu…", "tok/s/G…"); a dense and a MoE search must both print
    their plan table within 80 columns, every header whole, and a token cap named as one (not "mbs 1")."""
    env = {**os.environ, "COLUMNS": "80"}
    for model, gpus in (("7b", "8"), ("qwen3-30b-a3b", "16")):
        p = subprocess.run(
            [*CLI, "search", "--model", model, "--gpus", gpus, "--no-emit"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        head = next(i for i, ln in enumerate(lines) if ln.startswith("Top plans"))
        end = next(i for i, ln in enumerate(lines) if ln.startswith("Per phase"))
        table = lines[head:end]
        assert all(len(ln) <= 80 for ln in table), max(table, key=len)
        assert "…" not in "\n".join(table)
        header = table[1]
        for col in ("degrees", "batch", "recompute", "offload", "rollout", "step s", "tok/s", "MFU"):
            assert col in header, col
        rows = [ln for ln in table if "│" in ln and ln.split("│")[0].strip().isdigit()]
        assert rows and all(" tok " in r or "mbs " in r for r in rows)
