"""`grpo-tune validate --grpo`: the GRPO step against published verl / NeMo-RL runs.

The report cross-validates (leave-one-out) the step and each phase, overall, per GPU type and per
framework, and exits 1 when the cross-validated step MAPE is above the tolerance; corrupting the
published figures makes it fail; a malformed file is a coded error; a left-out row never enters
its own refit; a parameter fewer than two rows move keeps its prior."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_tune.validate.grpo as vg
from grpo_tune.cli.validate import _short
from grpo_tune.core.errors import GrpoTuneError

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "validate", "--grpo", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
        timeout=300,
    )


def test_report_cross_validates_step_and_phases_by_group():
    rep = vg.run_grpo()
    cv = rep["mape_pct"]["cv"]
    assert cv["step_s"] is not None and cv["gen_s"] is not None and cv["train_s"] is not None
    assert rep["passed"] == (cv["step_s"] <= vg.TOLERANCE_PCT)
    groups = rep["cv_groups"]["step_s"]
    assert "gpu:h100" in groups and "framework:nemo-rl" in groups and "framework:verl" in groups
    scored = [r for r in rep["rows"] if r["split"] != "excluded"]
    assert scored and all("cv_error_pct" in r for r in scored)
    assert all(r["source"] for r in rep["rows"])
    # no parameter is fitted that fewer than two rows move; the report names the rows that move each
    assert set(rep["movers"]) == {f"{p.on}:{p.key}" for p in vg.PRIORS}


def test_cli_prints_phases_cv_and_movers():
    p = cli("--tolerance", "1000")
    assert p.returncode == 0, p.stderr
    assert "cross-validated step MAPE" in p.stdout and "pass" in p.stdout
    assert "leave one configuration out" in p.stdout and "rows move it" in p.stdout
    assert "fitted parameters" in p.stdout and "distinct configurations" in p.stdout
    for phase in ("gen", "train", "logprob", "refit"):
        assert f" {phase} " in p.stdout
    # fits 80 columns with no cell cut: only row ids are shortened (in the middle), never a figure
    assert max(len(line) for line in p.stdout.splitlines()) <= 80
    assert not re.search(r"…(\s|$)", p.stdout, re.M), "a cell was cut at its end"
    rows = [r["id"] for r in vg.run_grpo()["rows"]]
    pairs_csv = (ROOT / "grpo_tune/profiles/data/published_placement_pairs.csv").read_text().splitlines()
    pairs = [ln.split(",", 1)[0] for ln in pairs_csv if ln and not ln.startswith("#")][1:]
    ratios_csv = (ROOT / "grpo_tune/profiles/data/published_rollout_ratios.csv").read_text().splitlines()
    ratios = [ln.split(",", 1)[0] for ln in ratios_csv if ln and not ln.startswith("#")][1:]
    for ids, width in ((rows, 32), (pairs, 24), (ratios, 24)):  # the widths the step, pair and ratio tables print
        cut = [_short(i, width) for i in ids]
        assert len(set(cut)) == len(ids) and max(map(len, cut)) <= width
    assert cli().returncode == (0 if vg.run_grpo()["passed"] else 1)


def corrupted(tmp_path: Path, factor: float) -> Path:
    """The shipped file with every held-out row's published step and phases multiplied by ``factor``."""
    lines = (ROOT / "grpo_tune/profiles/data/published_grpo.csv").read_text().splitlines()
    import csv
    import io

    body = [ln for ln in lines if not ln.startswith("#")]
    reader = list(csv.DictReader(io.StringIO("\n".join(body))))
    for r in reader:
        if r["split"] != "excluded":
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
    assert not rep["passed"] and rep["mape_pct"]["cv"]["step_s"] > 2 * vg.TOLERANCE_PCT
    p = cli("--data", str(path), "--json")
    assert p.returncode == 1
    assert json.loads(p.stdout)["passed"] is False


def test_leave_one_out_never_reads_the_left_out_row(tmp_path):
    """Row i's cross-validated prediction is refitted without its configuration: corrupting only its published
    figures changes its error, not its prediction, nor the prediction of a rerun of the same configuration (the
    same fold); it does move the refits of the other configurations."""
    rows = vg.load_grpo_rows()
    base = vg.cross_validate(rows)
    target = next(r for r in rows if r.id == "nemorl03_llama8b_mcore")
    rerun = next(r for r in rows if r.id == "nemorl03_llama8b_mcore_rerun959")
    assert vg.config_of(target) == vg.config_of(rerun)  # NeMo-RL issue #959's rerun of the blog's recipe
    bad = [
        vg.GrpoRow(r.id, r.split, r.raw, {k: 3 * v for k, v in r.published.items()}) if r.id == target.id else r
        for r in rows
    ]
    got = vg.cross_validate(bad)
    for k, e in base[target.id].items():
        pred = target.published[k] * (1 + e / 100)
        assert 3 * target.published[k] * (1 + got[target.id][k] / 100) == pytest.approx(pred, rel=1e-6), k
    assert got[rerun.id] == pytest.approx(base[rerun.id], rel=1e-9)  # held out with it: never refitted on it
    others = [r.id for r in rows if r.id in base and vg.config_of(r) != vg.config_of(target)]
    assert any(got[i] != base[i] for i in others)  # the corrupted row does move the other folds' refits


def test_report_counts_parameters_against_distinct_configurations():
    rep = vg.run_grpo()
    c = rep["counts"]
    rows = [r for r in vg.load_grpo_rows() if r.split != "excluded"]
    assert c["scored_rows"] == len(rows) and c["configs"] == len({vg.config_of(r) for r in rows}) < len(rows)
    assert c["fitted_parameters"] == sum(1 for p in vg.PRIORS if len(rep["movers"][f"{p.on}:{p.key}"]) >= 2)
    # the two verl rows whose mean response length is solved from their own old log-prob time count as parameters
    assert c["self_solved_rows"] == [r.id for r in rows if (r.raw.get("calibrates") or "").strip()]
    assert c["self_solved_means"] == 2
    assert rep["cv_method"] == "refit, leave one configuration out"


def test_refit_lands_on_the_shipped_parameters():
    got = vg.fit(vg.load_grpo_rows())
    for p in vg.PRIORS:
        v = got[f"{p.on}:{p.key}"]
        assert p.lo <= v <= p.hi
        assert v == pytest.approx(vg.shipped(p), rel=0.03, abs=1e-5), (p.on, p.key)


def test_parameters_moved_by_one_row_stay_at_their_prior():
    rows = [r for r in vg.load_grpo_rows() if r.split != "excluded"]
    mv = vg.movers(rows)
    got = vg.fit(rows)
    lone = [p for p in vg.PRIORS if len(mv[p]) < 2]
    assert lone  # the shipped rows leave some parameters unpinned (verl's MoE overhead among them)
    for p in lone:
        assert got[f"{p.on}:{p.key}"] == pytest.approx(p.value)


def test_bands_are_the_cross_validated_errors():
    rep = vg.run_grpo()
    for k, v in vg.BAND_PCT.items():
        assert v == pytest.approx(rep["bands"][k], abs=0.1), k


def test_malformed_rows_are_coded_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,split\nx,fit\n")
    with pytest.raises(GrpoTuneError) as ei:
        vg.load_grpo_rows(bad)
    assert ei.value.code == "BAD_CONFIG"
    text = (ROOT / "grpo_tune/profiles/data/published_grpo.csv").read_text().replace(",scored,", ",heldout,", 1)
    bad.write_text(text)
    with pytest.raises(GrpoTuneError):
        vg.load_grpo_rows(bad)


def test_stated_error_is_the_cross_validated_mape():
    assert vg.STATED_ERROR_PCT == pytest.approx(vg.run_grpo()["mape_pct"]["cv"]["step_s"], abs=0.05)


def test_report_says_why_the_winner_wins_and_flags_close_plans(tmp_path):
    from grpo_tune.rundir.report import runner_ups, why_winner, write_report
    from grpo_tune.autotune.search.driver import search
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


def _row(rid: str) -> vg.GrpoRow:
    return {r.id: r for r in vg.load_grpo_rows()}[rid]


def test_refit_only_separate_row_scores_the_cross_pool_sync():
    """A refit-only row with separate pools is priced by the placement model: its refit_s is the
    cross-pool sync (export + broadcast of the whole bf16 model over the nodes' NICs + copies + per-tensor and
    per-bucket costs), and raising the stack's per-tensor cost raises it by hf_tensors x the rise."""
    from grpo_tune.costmodel.timing_base import model_consts

    row = _row("verl_ckpt_engine_qwen3_30ba3b_on")
    assert set(row.published) == {"refit_s"}
    pred, est = vg.predict(row)
    f = est.placement
    assert f["mode"] == "separate" and f["rollout_gpus"] == 16 and not f["shared_nodes"]
    assert pred["refit_s"] == pytest.approx(f["sync_s"], rel=1e-12)
    # the whole model (bf16) over an H20 node's eight NICs (8 x 50 GB/s, under NVLink's 450) x comm_efficiency,
    # in 4 GiB buckets
    m = est.model
    nbytes = model_consts(m)["total_params"] * 2
    assert f["sync"]["transfer_s"] == pytest.approx(nbytes / (400e9 * 0.8), rel=0.01)
    hw = vg._hw(row, None)
    bumped = hw.with_efficiency(sync_tensor_overhead_s=hw.efficiency.sync_tensor_overhead_s + 1e-4)
    pred2, _ = vg.predict(row, bumped)
    assert pred2["refit_s"] - pred["refit_s"] == pytest.approx(model_consts(m)["hf_tensors"] * 1e-4, rel=1e-6)


def test_calibrating_figure_is_kept_out_of_the_score(tmp_path):
    """A figure named in ``calibrates`` set the row's assumed mean: it is not scored (or the row would
    score itself), and naming a figure the row does not publish is a coded error."""
    row = _row("verl_onestep_qwen25math7b_mcore_colocate")
    assert "old_lp_s" not in row.published and row.raw["old_lp_s"] == "119"
    assert {"step_s", "gen_s", "train_s"} <= set(row.published)
    text = (ROOT / "grpo_tune/profiles/data/published_grpo.csv").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text(text.replace(",false,old_lp_s,true,", ",false,refit_s,true,", 1))
    with pytest.raises(GrpoTuneError) as ei:
        vg.load_grpo_rows(bad)
    assert ei.value.code == "BAD_CONFIG" and "calibrates" in str(ei.value)


def test_gen_of_an_older_verl_row_includes_the_weight_sync():
    """verl timed the wake-up, weight update and sleep inside timing_s/gen before its update_weights timer:
    such a row's predicted gen is the rollout plus the weight sync; without the flag, the rollout alone."""
    import dataclasses

    row = _row("verl_onestep_qwen25math7b_mcore_colocate")
    assert row.raw["gen_includes_refit"] == "true"
    pred, est = vg.predict(row)
    t = est.time
    assert pred["gen_s"] == pytest.approx(t["rollout"] + t["weight_sync"], rel=1e-12)
    plain = dataclasses.replace(row, raw={**row.raw, "gen_includes_refit": ""})
    assert vg.predict(plain)[0]["gen_s"] == pytest.approx(t["rollout"], rel=1e-12)


def test_verl_flops_of_an_mla_model_by_hand():
    """verl's _estimate_deepseek_v3_flops for one sequence of 1,000 tokens of DeepSeek-V3, by hand:
    per-layer weights (MLA projections, 256-expert router, 8 routed + 1 shared experts), 3 dense layers,
    embedding + head; 6 x N x tokens + 3 x s^2 x layers x (192 + 128) x 128."""
    from grpo_tune.core.specs import load_model
    from grpo_tune.core.strategy import Workload

    m = load_model("deepseek-v3")
    wl = Workload(
        prompts=1, n=1, mini_batch=1, prompt_len=500, response_len=500, prompt_len_mean=500, response_len_mean=500
    )
    h = 7168
    attn = h * 1536 + 128 * 192 * 1536 + h * (512 + 64) + 128 * (192 - 64 + 128) * 512 + 128 * 128 * h
    moe = h * 256 + h * 2048 * 9 * 3 + attn
    n = moe * 58 + (h * 18432 * 3 + attn) * 3 + 2 * 129280 * h
    want = 6 * n * 1000 + 3 * 1000 * 1000 * 61 * 320 * 128
    assert vg.verl_flops(m, wl) == pytest.approx(want, rel=1e-12)
